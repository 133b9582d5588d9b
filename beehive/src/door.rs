//! Modules whose work runs in a task of their own, behind a channel, and
//! modules that record what they get (for tests).

use actix::prelude::*;
use tokio::sync::{mpsc, oneshot};
use tracing::warn;

use crate::{Message, Module, ModuleError};

/// A module that hands each message, in order, to a task behind a bounded
/// channel, waiting while the task is busy (its mailbox then fills and
/// senders wait: backpressure). Optionally it stops that task when the
/// module stops, and waits until the task says it is done, so a hive's
/// shutdown also ends the task (and releases what it holds).
///
/// It is how a module keeps its state in one async task, in arrival order,
/// with every other input (an API's requests, timers) in the same queue.
pub struct TaskDoor<T: Send + 'static> {
    name: String,
    group: String,
    inbox: mpsc::Sender<T>,
    wrap: fn(Message) -> T,
    stop: Option<fn(oneshot::Sender<()>) -> T>,
}

impl<T: Send + 'static> Clone for TaskDoor<T> {
    fn clone(&self) -> Self {
        TaskDoor {
            name: self.name.clone(),
            group: self.group.clone(),
            inbox: self.inbox.clone(),
            wrap: self.wrap,
            stop: self.stop,
        }
    }
}

impl<T: Send + 'static> TaskDoor<T> {
    /// A module `name` in `group` that sends each message, made into a `T`
    /// by `wrap`, to `inbox`.
    pub fn new(
        name: impl Into<String>,
        group: impl Into<String>,
        inbox: mpsc::Sender<T>,
        wrap: fn(Message) -> T,
    ) -> Self {
        TaskDoor {
            name: name.into(),
            group: group.into(),
            inbox,
            wrap,
            stop: None,
        }
    }

    /// On stopping, the module sends `stop(done)` and waits for `done`.
    pub fn stopping_with(mut self, stop: fn(oneshot::Sender<()>) -> T) -> Self {
        self.stop = Some(stop);
        self
    }
}

impl<T: Send + 'static> Actor for TaskDoor<T> {
    type Context = Context<Self>;
}

impl<T: Send + 'static> Module for TaskDoor<T> {
    fn name(&self) -> &str {
        &self.name
    }

    fn group(&self) -> &str {
        &self.group
    }

    fn handle(&mut self, msg: Message, ctx: &mut Context<Self>) -> Result<(), ModuleError> {
        let inbox = self.inbox.clone();
        let input = (self.wrap)(msg);
        let name = self.name.clone();
        ctx.wait(
            async move {
                if inbox.send(input).await.is_err() {
                    warn!(module = %name, "its task has stopped; message dropped");
                }
            }
            .into_actor(self),
        );
        Ok(())
    }

    fn cleanup(&mut self, _: &mut Context<Self>) -> ResponseActFuture<Self, ()> {
        let stopping = self.stop.map(|stop| (stop, self.inbox.clone()));
        Box::pin(
            async move {
                if let Some((stop, inbox)) = stopping {
                    let (done, stopped) = oneshot::channel();
                    if inbox.send(stop(done)).await.is_ok() {
                        let _ = stopped.await;
                    }
                }
            }
            .into_actor(self),
        )
    }
}

/// Test support: a module that records every message it gets.
#[cfg(feature = "testing")]
pub mod testing {
    use super::*;
    use crate::Hive;

    /// Passes every message it gets to a channel.
    pub struct Recorder {
        name: String,
        group: String,
        seen: mpsc::UnboundedSender<Message>,
    }

    impl Actor for Recorder {
        type Context = Context<Self>;
    }

    impl Module for Recorder {
        fn name(&self) -> &str {
            &self.name
        }
        fn group(&self) -> &str {
            &self.group
        }
        fn handle(&mut self, msg: Message, _: &mut Context<Self>) -> Result<(), ModuleError> {
            let _ = self.seen.send(msg);
            Ok(())
        }
    }

    /// Starts a recorder `name` in `group`; what it gets comes out of the
    /// receiver. Panics if it cannot start (it is for tests).
    pub fn recorder(hive: &Hive, name: &str, group: &str) -> mpsc::UnboundedReceiver<Message> {
        let (seen, rx) = mpsc::unbounded_channel();
        let (name, group) = (name.to_owned(), group.to_owned());
        #[allow(clippy::expect_used)]
        hive.start_module(move |_| Recorder {
            name: name.clone(),
            group: group.clone(),
            seen: seen.clone(),
        })
        .expect("recorder");
        rx
    }
}
