//! beehive: edgehive's module runtime, KubeEdge's beehive on actix.
//!
//! A *hive* holds *modules*. Each module is an actix actor with a name and a
//! group; its mailbox is a bounded channel owned by the hive, so a sender
//! waits when a module falls behind, and the mailbox outlives restarts of the
//! module. Any actor or plain tokio task with a [`Hive`] handle uses the six
//! verbs of KubeEdge's beehive:
//!
//! | verb | what it does |
//! | --- | --- |
//! | [`Hive::send`] | to one module; waits for mailbox room; unknown module is an error |
//! | [`Hive::send_sync`] | to one module, waits for the response (`parent_id` = request id) or a timeout |
//! | [`Hive::send_resp`] | completes whichever request a response answers; late ones are counted |
//! | [`Hive::send_to_group`] | to every member of a group, in start order |
//! | [`Hive::send_to_group_sync`] | to every member, waits for all responses or names the missing |
//! | [`Hive::shutdown`] | stops modules in reverse start order, each drains and flushes |
//!
//! Order from one sender to one module is kept, also through groups. A
//! pending request is registered before its message leaves, so a response
//! can never arrive "too early" and be lost. Modules are enabled, sized and
//! given restart policies by [`HiveConfig`], like the `modules` section of
//! KubeEdge's config files. There is no global state: two hives (a cloud and
//! an edge) live side by side in one process.
//!
//! See [`Module`] for a complete example.

pub mod config;
pub mod constants;
pub mod content;
mod counts;
mod door;
mod error;
mod hive;
mod mailbox;
pub mod message;
mod module;
pub mod names;
pub mod resource;
mod runtime;

pub use config::{Exit, HiveConfig, ModuleConfig, RestartOn, RestartPolicy};
pub use content::{Content, Document};
pub use counts::HandledCounts;
pub use door::TaskDoor;
#[cfg(feature = "testing")]
pub use door::testing;
pub use error::Error;
pub use hive::{
    Hive, HiveStats, ModuleInfo, ResponseOutcome, Sending, ShutdownReport, StartOutcome,
};
pub use message::{Failure, Header, IntoRouteName, Message, MessageError, Router};
pub use module::{Module, ModuleError};
pub use smol_str::SmolStr;
pub use uuid::Uuid;
