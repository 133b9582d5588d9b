//! edged: the edge node agent that runs pods through the Kubernetes CRI v1
//! gRPC API against containerd, with probes, PLEG and node status.
//!
//! Status: arrives with the edged issue; until then this crate only reserves its name.
