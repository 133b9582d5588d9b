//! The hub links edge nodes to the cloud: `cloudhub` keeps one session per
//! node with a reliable, resumable downstream queue; `edgehub` keeps the one
//! link of an edge node alive and routes messages to the edge modules.
//!
//! Status: arrives with the hub issue; until then this crate only reserves its name.
