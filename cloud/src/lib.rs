//! edgehive's cloud control plane: everything between the desired state
//! and cloudhub's per-node queues.
//!
//! Its top-level folders carry KubeEdge's module names, and use each
//! other in one direction only (tests/layering.rs checks it):
//!
//! - [`edgecontroller`]: sends each node what it needs and nothing else,
//!   withdraws what a node should no longer hold, repairs a node's
//!   inventory when it connects, and takes the nodes' status. Which devices
//!   a node holds is its reconciler's decision too.
//! - [`devicecontroller`]: KubeEdge's devicecontroller messages: the twin
//!   sync answered to a node's devicetwin, membership updates, and device
//!   reports taken into Device status (plain functions the edgecontroller
//!   calls).
//! - [`dynamiccontroller`]: the application center, which answers what a
//!   KubeEdge edge's MetaServer forwards: from the API server in the
//!   node's name, or refused at once.
//! - [`cloudstream`]: the kubelet API kube-apiserver calls for logs, exec,
//!   attach, port-forward and stats, the KubeEdge edges' stream tunnel
//!   (`edgestream`), pod streams through node links (`streams`) and the
//!   resource metrics read from them (`metrics`, `metrics_api`).
//! - [`desired`]: the desired-state boundary and its backends (embedded
//!   redb, Kubernetes, etcd).
//! - [`admin`]: the admin API that `edgehivectl` talks to (Kubernetes
//!   manifests in, objects out); [`admin_client`]: its client and
//!   kubeconfig files.
//! - [`admission`]: the mutating admission webhook (Kubernetes mode;
//!   KubeEdge's `admission`): pods bound to edge nodes are created with
//!   their offline tolerations already lengthened.
//! - [`reviews`]: who a caller is and what it may do, asked of the API
//!   server (TokenReview, SubjectAccessReview) or decided for nodes.
//! - `replicas` (feature `etcd` or `kubernetes`), [`peers`], [`ledger`]:
//!   several cloudcores on one etcd or one Kubernetes cluster, each node
//!   served by one of them at a time under a claim (an etcd key, or a
//!   Lease), forwarding to each other, sharing the join-token ledger.
//!
//! The edge's half (metamanager, MetaServer, edged, devicetwin) lives in
//! other crates; nothing here imports them, so a cloud-only build compiles
//! no edge module.

pub mod admin;
pub mod admin_client;
pub mod admission;
mod backoff;
pub mod cloudstream;
pub mod desired;
pub mod devicecontroller;
pub mod dynamiccontroller;
pub mod edgecontroller;
pub mod ledger;
pub mod peers;
#[cfg(any(feature = "etcd", feature = "kubernetes"))]
pub mod replicas;
pub mod reviews;
#[cfg(test)]
mod test_rng;

pub use admin::{AdminApi, AdminApiHandle};
pub use admin_client::AdminClient;
pub use desired::{DesiredError, DesiredState, EmbeddedStore};
pub use dynamiccontroller::{ApplicationCenter, CenterConfig, CenterCounts, CenterHandle};
pub use edgecontroller::{
    Admitted, Applied, ControllerConfig, ControllerCounts, ControllerHandle, EdgeController,
    NodeHolders,
};
