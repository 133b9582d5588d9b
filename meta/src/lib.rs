//! Metadata: the edge `metamanager` (a redb store of every object the edge
//! holds, edge autonomy, MetaServer) and the cloud `edgecontroller` (desired
//! state per node down, status up).
//!
//! Status: arrives with the meta issue; until then this crate only reserves its name.
