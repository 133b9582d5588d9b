//! The module trait: what an actix actor implements to live in a hive.

use actix::{Actor, Context, ResponseActFuture};

use crate::Message;

/// Why a module gave up on a message; the module is stopped and its restart
/// policy decides what happens next.
#[derive(Debug, thiserror::Error)]
#[error("module failed: {reason}")]
pub struct ModuleError {
    /// What went wrong, for the log.
    pub reason: String,
    /// The underlying error, if any.
    #[source]
    pub source: Option<Box<dyn std::error::Error + Send + Sync>>,
}

impl ModuleError {
    /// A failure with a reason and no underlying error.
    pub fn new(reason: impl Into<String>) -> Self {
        ModuleError {
            reason: reason.into(),
            source: None,
        }
    }

    /// A failure caused by `source`.
    pub fn from_source(
        reason: impl Into<String>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        ModuleError {
            reason: reason.into(),
            source: Some(Box::new(source)),
        }
    }
}

/// A beehive module: an actix actor with a name and a group that handles
/// beehive messages from its mailbox, one at a time, in order.
///
/// The hive owns the mailbox (a bounded channel): it outlives restarts of the
/// module, so a restarted module finds the messages that were waiting.
/// Returning an error from [`Module::handle`] (or panicking in it) stops the
/// module as failed; the module's restart policy decides whether a fresh one
/// is started. A module that calls `ctx.wait(..)` in `handle` receives no
/// further message until the awaited future completes; that is how a module
/// applies backpressure.
///
/// ```
/// use actix::{Actor, Context};
/// use beehive::{Hive, HiveConfig, Message, Module, ModuleError};
///
/// struct Echo { hive: Hive }
/// impl Actor for Echo { type Context = Context<Self>; }
/// impl Module for Echo {
///     fn name(&self) -> &str { "echo" }
///     fn group(&self) -> &str { "demo" }
///     fn handle(&mut self, msg: Message, _ctx: &mut Context<Self>) -> Result<(), ModuleError> {
///         if msg.is_sync() {
///             self.hive.send_resp(msg.response("echo", msg.content().clone()));
///         }
///         Ok(())
///     }
/// }
///
/// actix::System::new().block_on(async {
///     let hive = Hive::new("doc", HiveConfig::default());
///     hive.start_module(|hive| Echo { hive: hive.clone() }).unwrap();
///     let ping = Message::new().with_content("ping");
///     let pong = hive.send_sync("echo", ping, std::time::Duration::from_secs(1)).await.unwrap();
///     assert_eq!(pong.content().as_text(), Some("ping"));
///     hive.shutdown().await;
/// });
/// ```
pub trait Module: Actor<Context = Context<Self>> {
    /// The module's name, unique within its hive; senders address it by it.
    fn name(&self) -> &str;

    /// The module's group; `send_to_group` reaches every member.
    fn group(&self) -> &str;

    /// Called once its mailbox is live, before the first message.
    fn init(&mut self, _ctx: &mut Context<Self>) {}

    /// Handles one message.
    fn handle(&mut self, msg: Message, ctx: &mut Context<Self>) -> Result<(), ModuleError>;

    /// Called on shutdown after the mailbox is drained: flush what must not
    /// be lost. The hive bounds it by the module's `flushTimeoutMs`.
    fn cleanup(&mut self, _ctx: &mut Context<Self>) -> ResponseActFuture<Self, ()> {
        Box::pin(actix::fut::ready(()))
    }
}
