//! Metadata: the edge `metamanager`, a redb store of every object the edge
//! holds that keeps the edge running with the cloud gone, and (arriving with
//! the meta issue) MetaServer and the cloud `edgecontroller`.
//!
//! [`EdgeStore`] batches writes into transactions on its own thread and
//! confirms each only after its commit; [`MetaManager`] is the beehive module
//! on top of it.

pub mod metamanager;
pub mod store;

pub use metamanager::MetaManager;
pub use store::{EdgeStore, Record, StoreError, WriteOutcome};
