//! How a module runs: its mailbox loop inside the actor, and the supervisor
//! that restarts it by its policy.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::pin::Pin;
use std::task::{Context as TaskContext, Poll};
use std::time::Duration;

use actix::fut::{ActorFuture, ActorFutureExt};
use actix::{ActorContext, ActorState, AsyncContext, Context};
use tokio::sync::{mpsc, oneshot};
use tracing::{Instrument, error, info, info_span, warn};

use crate::config::{Exit, ModuleConfig};
use crate::hive::Hive;
use crate::{Message, Module};

/// Messages handled per poll before the loop yields to other actors.
const BATCH: usize = 32;

/// A request to the supervisor of one module.
pub(crate) enum Control {
    /// Drain, flush and stop; answer on the sender when done.
    Shutdown(oneshot::Sender<()>),
}

/// What the delivery loop hands back to the supervisor when its actor is gone.
struct Returned {
    mailbox: mpsc::Receiver<Message>,
    exit: Exit,
}

/// The actor-side half of a module's mailbox: pulls messages into
/// [`Module::handle`] while the actor runs, and gives the mailbox back to the
/// supervisor when the actor's context is dropped, however it stopped.
struct DeliveryLoop {
    mailbox: Option<mpsc::Receiver<Message>>,
    shutdown: Option<oneshot::Receiver<oneshot::Sender<()>>>,
    /// Set once a shutdown was requested: the mailbox is closed and drains.
    draining: Option<oneshot::Sender<()>>,
    flush_timeout: Duration,
    exit: Exit,
    give_back: Option<oneshot::Sender<Returned>>,
}

impl Drop for DeliveryLoop {
    fn drop(&mut self) {
        if let (Some(mailbox), Some(give_back)) = (self.mailbox.take(), self.give_back.take()) {
            let _ = give_back.send(Returned {
                mailbox,
                exit: self.exit,
            });
        }
    }
}

impl<M: Module> ActorFuture<M> for DeliveryLoop {
    type Output = ();

    fn poll(
        self: Pin<&mut Self>,
        act: &mut M,
        ctx: &mut Context<M>,
        task: &mut TaskContext<'_>,
    ) -> Poll<()> {
        let this = self.get_mut();
        if this.draining.is_none()
            && let Some(shutdown) = this.shutdown.as_mut()
            && let Poll::Ready(request) = Pin::new(shutdown).poll(task)
        {
            this.shutdown = None;
            if let Ok(done) = request {
                if let Some(mailbox) = this.mailbox.as_mut() {
                    // Senders now get an error; what is queued still drains.
                    mailbox.close();
                }
                this.draining = Some(done);
            }
        }
        for _ in 0..BATCH {
            // Never take a message the actor will not handle: a stopping or
            // waiting actor leaves it in the mailbox for the next one.
            if ctx.state() != ActorState::Running || ctx.waiting() {
                return Poll::Pending;
            }
            let Some(mailbox) = this.mailbox.as_mut() else {
                return Poll::Ready(());
            };
            match mailbox.poll_recv(task) {
                Poll::Ready(Some(msg)) => {
                    match catch_unwind(AssertUnwindSafe(|| act.handle(msg, ctx))) {
                        Ok(Ok(())) => {}
                        Ok(Err(err)) => {
                            error!(module = act.name(), error = %err, "module failed");
                            this.exit = Exit::Failed;
                            ctx.stop();
                        }
                        Err(_) => {
                            error!(module = act.name(), "module panicked");
                            this.exit = Exit::Failed;
                            ctx.stop();
                        }
                    }
                }
                Poll::Ready(None) => {
                    // Closed and drained: only a shutdown closes the mailbox.
                    if let Some(done) = this.draining.take() {
                        this.exit = Exit::Shutdown;
                        let flush = act.cleanup(ctx).timeout(this.flush_timeout).map(
                            move |flushed, act: &mut M, ctx: &mut Context<M>| {
                                if flushed.is_err() {
                                    warn!(module = act.name(), "cleanup did not finish in time");
                                }
                                ctx.stop();
                                let _ = done.send(());
                            },
                        );
                        ctx.wait(flush);
                    }
                    return Poll::Pending;
                }
                Poll::Pending => return Poll::Pending,
            }
        }
        task.waker().wake_by_ref();
        Poll::Pending
    }
}

/// Starts one incarnation of a module around `mailbox`.
fn start_incarnation<M: Module>(
    module: M,
    mailbox: mpsc::Receiver<Message>,
    flush_timeout: Duration,
) -> (
    oneshot::Sender<oneshot::Sender<()>>,
    oneshot::Receiver<Returned>,
) {
    let (shutdown_tx, shutdown_rx) = oneshot::channel();
    let (give_back, returned) = oneshot::channel();
    let delivery = DeliveryLoop {
        mailbox: Some(mailbox),
        shutdown: Some(shutdown_rx),
        draining: None,
        flush_timeout,
        exit: Exit::Stopped,
        give_back: Some(give_back),
    };
    M::create(move |ctx| {
        let mut module = module;
        module.init(ctx);
        ctx.spawn(delivery);
        module
    });
    (shutdown_tx, returned)
}

/// Runs a module, restarting it by its policy, until it stops for good or
/// the hive shuts it down. Runs as a local task on the actix arbiter.
pub(crate) async fn supervise<M, F>(
    hive: Hive,
    name: String,
    first: M,
    mut factory: F,
    mut mailbox: mpsc::Receiver<Message>,
    mut control: mpsc::UnboundedReceiver<Control>,
    config: ModuleConfig,
) where
    M: Module,
    F: FnMut(&Hive) -> M + 'static,
{
    let span = info_span!("module", hive = hive.name(), module = %name);
    async move {
        let mut next = Some(first);
        let mut restarts: u32 = 0;
        loop {
            let module = match next.take() {
                Some(module) => module,
                None => factory(&hive),
            };
            let (shutdown, returned) = start_incarnation(module, mailbox, config.flush_timeout());
            let mut shutdown = Some(shutdown);
            let mut returned = std::pin::pin!(returned);
            let back = loop {
                tokio::select! {
                    back = &mut returned => break back,
                    Some(Control::Shutdown(done)) = control.recv() => {
                        if let Some(shutdown) = shutdown.take()
                            && let Err(done) = shutdown.send(done) {
                            let _ = done.send(());
                        }
                    }
                }
            };
            let Ok(Returned {
                mailbox: back,
                exit,
            }) = back
            else {
                // The actor's context went away without handing the mailbox
                // back: the System is going down, nothing is left to do.
                return;
            };
            mailbox = back;
            if !config.restart.should_restart(exit, restarts) {
                info!(?exit, restarts, "module stopped for good");
                break;
            }
            let delay = config.restart.delay(restarts);
            restarts += 1;
            hive.note_restart(&name);
            warn!(?exit, restart = restarts, ?delay, "restarting module");
            tokio::select! {
                _ = tokio::time::sleep(delay) => {}
                Some(Control::Shutdown(done)) = control.recv() => {
                    let _ = done.send(());
                    break;
                }
            }
        }
        // Closing the mailbox makes every later send an error; dropping the
        // control channel tells a later shutdown that this one is done.
        hive.note_stopped(&name, mailbox);
    }
    .instrument(span)
    .await
}

/// Whether the current thread runs an actix System (modules need one).
pub(crate) fn in_actix_system() -> bool {
    actix::System::try_current().is_some()
}
