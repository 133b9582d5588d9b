//! edged: the edge node agent. It runs the pods metamanager hands it on
//! containerd, through the Kubernetes CRI v1 gRPC API, and reports their
//! status and the node's.
//!
//! - [`cri`]: the CRI v1 client, generated without protoc.
//! - [`Edged`]: the module; a [`worker::PodWorker`] per pod, the PLEG, the
//!   node status, and the start-up reconciliation that adopts running
//!   containers after a restart.
//! - [`actions`]: a pod's decisions (sandbox, init order, restarts and
//!   back-off, probes' effects, pulls) as a plain state machine over what
//!   the runtime shows ([`observed`]); [`status`]: the pod's status from
//!   the same. The worker is the I/O around them.
//! - [`spec`]: a pod's spec as CRI configs; [`volumes`]: emptyDir,
//!   hostPath, configMap and secret volumes; [`probes`]: startup, liveness
//!   and readiness; [`gc`]: container and image garbage collection;
//!   [`server`]: `/healthz`, `/pods`, container logs and [`stats`] over
//!   HTTP; [`streams`]: the cloud's logs, exec, attach and port-forward
//!   ([`spdy`]: the runtime's SPDY side for exec and attach).
//! - `testing` (feature `testing`): test node names whose pods are removed
//!   when a test ends, and what tests left in containerd.

pub mod actions;
pub mod config;
pub mod cri;
pub mod gc;
pub mod logs;
pub mod module;
pub mod node;
pub mod observed;
pub mod policy;
pub mod probes;
pub mod server;
pub mod spdy;
pub mod spec;
pub mod stats;
pub mod status;
pub mod streams;
pub mod teardown;
#[cfg(feature = "testing")]
pub mod testing;
pub mod tokens;
pub mod volumes;
pub mod worker;

pub use config::EdgedConfig;
pub use cri::{Cri, CriError};
pub use module::{Edged, EdgedError, EdgedHandle};
