//! Metadata, both halves.
//!
//! Edge: [`MetaManager`] keeps every object the edge holds in [`EdgeStore`]
//! (redb; writes batched on a thread of their own and confirmed only after
//! their commit), so the edge keeps running with the cloud gone, and
//! [`MetaServer`] serves those objects to local applications as a
//! Kubernetes-shaped API.
//!
//! Cloud: [`controller::EdgeController`] holds the desired state behind
//! [`controller::DesiredStore`], sends each node what it needs and takes
//! its status; [`controller::AdminApi`] takes Kubernetes manifests.

pub mod api;
pub mod controller;
pub mod kinds;
pub mod metamanager;
pub mod metaserver;
pub mod store;

pub use kinds::{Kind, ObjectKey};
pub use metamanager::MetaManager;
pub use metaserver::{MetaServer, MetaServerHandle};
pub use store::{EdgeStore, Record, StoreChange, StoreError, WriteOutcome};
