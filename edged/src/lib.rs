//! edged: the edge node agent that runs pods through the Kubernetes CRI v1
//! gRPC API against containerd, with probes, PLEG and node status.
//!
//! Built so far: the CRI v1 client ([`cri`]), generated without protoc.

pub mod cri;

pub use cri::{Cri, CriError};
