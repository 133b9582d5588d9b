//! The edge's metadata.
//!
//! [`MetaManager`] keeps every object the edge holds in [`EdgeStore`]
//! (redb; writes batched on a thread of their own and confirmed only after
//! their commit), so the edge keeps running with the cloud gone, and
//! [`MetaServer`] serves those objects to local applications as a
//! Kubernetes-shaped API, to loopback peers, or, with [`access`]
//! (KubeEdge's `requireAuthorization`), to applications presenting a
//! service account token, limited to what that account may read.
//!
//! The cloud's half (the edgecontroller that sends what this stores) is the
//! `cloud` crate; the object model both share is the `apis` crate.

pub mod access;
pub mod metamanager;
pub mod metaserver;
pub mod store;
pub mod tombstones;

pub use apis::{Kind, ObjectKey};
pub use metamanager::{MetaManager, WriteAnswer};
pub use metaserver::{Authorization, MetaServer, MetaServerError, MetaServerHandle};
pub use store::{
    EdgeStore, PruneBatch, Record, StoreChange, StoreError, TombstoneCounts, WriteOutcome,
};
pub use tombstones::Watermark;
