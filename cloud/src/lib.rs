//! edgehive's cloud control plane: everything between the desired state
//! and cloudhub's per-node queues.
//!
//! - [`controller`]: the edgecontroller (devices included: KubeEdge's
//!   devicecontroller is part of it here). It sends each node what it needs
//!   and nothing else, withdraws what a node should no longer hold, repairs
//!   a node's inventory when it connects, and takes the nodes' status.
//! - [`desired`]: the desired-state boundary and its backends.
//! - [`applications`]: the application center (KubeEdge's
//!   dynamiccontroller), which answers what a KubeEdge edge's MetaServer
//!   forwards: from the API server in the node's name, or refused at once.
//! - `replicas` (feature `etcd` or `kubernetes`): several cloudcores on
//!   one etcd or one Kubernetes cluster, each node served by one of them at
//!   a time under a claim (an etcd key, or a Lease).
//! - [`admission`]: the mutating admission webhook (Kubernetes mode;
//!   KubeEdge's `admission`): pods bound to edge nodes are created with
//!   their offline tolerations already lengthened.
//! - [`admin`]: the admin API that `edgehivectl` talks to (Kubernetes
//!   manifests in, objects out), its client and the manifest parser.
//!
//! The edge's half (metamanager, MetaServer, edged, devicetwin) lives in
//! other crates; nothing here imports them, so a cloud-only build compiles
//! no edge module.

pub mod admin;
pub mod admission;
pub mod applications;
mod backoff;
pub mod controller;
pub mod desired;
pub mod kubelet;
pub mod ledger;
pub mod peers;
#[cfg(any(feature = "etcd", feature = "kubernetes"))]
pub mod replicas;
pub mod streams;
#[cfg(test)]
mod test_rng;

pub use admin::{AdminApi, AdminApiHandle, AdminClient};
pub use applications::{ApplicationCenter, CenterConfig, CenterCounts, CenterHandle};
pub use controller::{
    Admitted, Applied, ControllerConfig, ControllerCounts, ControllerHandle, EdgeController,
    NodeHolders,
};
pub use desired::{DesiredError, DesiredState, EmbeddedStore};
