//! Errors of the hive's verbs.

use std::time::Duration;

use crate::Message;

/// What can go wrong when a message is sent through a hive.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No module of that name was ever started in this hive.
    #[error("no module named {0:?} in this hive")]
    UnknownModule(String),
    /// No module of that group is running in this hive.
    #[error("no module in group {0:?} in this hive")]
    UnknownGroup(String),
    /// The module stopped and will not be restarted (or the hive is shutting down).
    #[error("module {0:?} has stopped")]
    ModuleStopped(String),
    /// The module failed while handling this request.
    #[error("module {module:?} failed on this request: {reason}")]
    ModuleFailed {
        /// The module.
        module: String,
        /// Why it failed.
        reason: String,
    },
    /// A module of that name is already registered.
    #[error("a module named {0:?} is already registered")]
    DuplicateModule(String),
    /// `send` would wait: the mailbox is full (only from `try_send`).
    #[error("mailbox of module {0:?} is full")]
    MailboxFull(String),
    /// No response arrived within the timeout.
    #[error("no response from {destination:?} within {timeout:?}")]
    Timeout {
        /// The module or group that was asked.
        destination: String,
        /// The timeout that passed.
        timeout: Duration,
    },
    /// Some members of a group did not answer within the timeout.
    #[error("group {group:?}: no response from {missing:?} within the timeout")]
    GroupTimeout {
        /// The group that was asked.
        group: String,
        /// Members that did not answer.
        missing: Vec<String>,
        /// The responses that did arrive, by member.
        answered: Vec<(String, Message)>,
    },
    /// Modules can only be started inside a running actix System.
    #[error("modules must be started inside an actix System (#[actix::main] or System::new())")]
    NoActixSystem,
}
