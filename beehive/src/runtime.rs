//! How a module runs: its mailbox loop inside the actor, and the supervisor
//! that restarts it by its policy and answers shutdown.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context as TaskContext, Poll};
use std::time::Duration;

use actix::fut::{ActorFuture, ActorFutureExt};
use actix::{ActorContext, ActorState, AsyncContext, Context, ResponseActFuture};
use tokio::sync::{mpsc, oneshot};
use tracing::{Instrument, error, info, info_span, warn};

use crate::config::{Exit, ModuleConfig};
use crate::counts::HandledCounts;
use crate::hive::Hive;
use crate::mailbox::Inbox;
use crate::{Message, Module};

/// Messages handled per poll before the loop yields to other actors.
const BATCH: usize = 32;

/// A request to the supervisor of one module.
pub(crate) enum Control {
    /// Drain, clean up and stop for good; answered once the module is gone.
    Shutdown(oneshot::Sender<()>),
}

/// What the delivery loop hands back to the supervisor when its actor is gone.
struct Returned {
    mailbox: Inbox<Message>,
    exit: Exit,
}

/// The actor-side half of a module's mailbox: pulls messages into
/// [`Module::handle`] while the actor runs, and gives the mailbox back to the
/// supervisor when the actor's context is dropped, however it stopped.
struct DeliveryLoop {
    hive: Hive,
    /// Where the module's messages are counted.
    handled: Arc<HandledCounts>,
    mailbox: Option<Inbox<Message>>,
    shutdown: Option<oneshot::Receiver<()>>,
    /// A shutdown was requested: the mailbox is closed and drains.
    draining: bool,
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

impl DeliveryLoop {
    /// Handles the message the mailbox has ready; a returned error or a
    /// panic stops the module as failed, and a request that caused it gets
    /// an error at once.
    ///
    /// The message leaves the mailbox only inside the unwind guard, straight
    /// into `handle`: one taken out before and captured by the guard's
    /// closure was copied (216 bytes) twice more on its way.
    #[inline]
    fn deliver<M: Module>(&mut self, act: &mut M, ctx: &mut Context<M>) {
        let Some(mailbox) = self.mailbox.as_mut() else {
            return;
        };
        let Some(msg) = mailbox.peek_ready() else {
            return;
        };
        self.handled.count(msg.operation());
        let request = msg.is_sync().then(|| msg.id());
        let reason = match catch_unwind(AssertUnwindSafe(|| match mailbox.next_ready() {
            Some(msg) => act.handle(msg, ctx),
            None => Ok(()),
        })) {
            Ok(Ok(())) => return,
            Ok(Err(err)) => err.to_string(),
            Err(_) => "panicked".to_owned(),
        };
        error!(module = act.name(), %reason, "module failed");
        if let Some(id) = request {
            self.hive.fail_request(id, act.name(), &reason);
        }
        self.exit = Exit::Failed;
        ctx.stop();
    }

    /// The mailbox is closed and empty: run the module's cleanup, bounded.
    fn clean_up<M: Module>(&mut self, act: &mut M, ctx: &mut Context<M>) {
        self.exit = Exit::Shutdown;
        let cleanup: ResponseActFuture<M, ()> =
            match catch_unwind(AssertUnwindSafe(|| act.cleanup(ctx))) {
                Ok(cleanup) => cleanup,
                Err(_) => {
                    error!(module = act.name(), "cleanup panicked");
                    Box::pin(actix::fut::ready(()))
                }
            };
        let flush = cleanup.timeout(self.flush_timeout).map(
            |flushed, act: &mut M, ctx: &mut Context<M>| {
                if flushed.is_err() {
                    warn!(module = act.name(), "cleanup did not finish in time");
                }
                ctx.stop();
            },
        );
        ctx.wait(flush);
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
        if !this.draining
            && let Some(shutdown) = this.shutdown.as_mut()
            && Pin::new(shutdown).poll(task).is_ready()
        {
            this.shutdown = None;
            this.draining = true;
            if let Some(mailbox) = this.mailbox.as_mut() {
                // Senders now get an error; what is queued still drains.
                mailbox.close();
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
            match mailbox.poll_ready(task) {
                Poll::Ready(true) => this.deliver(act, ctx),
                Poll::Ready(false) if this.draining => {
                    // Closed and drained: clean up once, then stop.
                    this.draining = false;
                    this.clean_up(act, ctx);
                    return Poll::Pending;
                }
                Poll::Ready(false) => {
                    // Cleanup ran, yet the actor kept itself alive
                    // (`Actor::stopping` said Continue): stop it now.
                    ctx.stop();
                    return Poll::Ready(());
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
    hive: &Hive,
    mut module: M,
    mailbox: Inbox<Message>,
    flush_timeout: Duration,
) -> (oneshot::Sender<()>, oneshot::Receiver<Returned>) {
    let (shutdown_tx, shutdown_rx) = oneshot::channel();
    let (give_back, returned) = oneshot::channel();
    let mut delivery = DeliveryLoop {
        hive: hive.clone(),
        handled: hive.handled_counts(module.name()),
        mailbox: Some(mailbox),
        shutdown: Some(shutdown_rx),
        draining: false,
        flush_timeout,
        exit: Exit::Stopped,
        give_back: Some(give_back),
    };
    M::create(move |ctx| {
        if catch_unwind(AssertUnwindSafe(|| module.init(ctx))).is_err() {
            error!(module = module.name(), "init panicked");
            delivery.exit = Exit::Failed;
            ctx.stop();
        }
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
    mut mailbox: Inbox<Message>,
    mut control: mpsc::UnboundedReceiver<Control>,
    config: ModuleConfig,
) where
    M: Module,
    F: FnMut(&Hive) -> M + 'static,
{
    let span = info_span!("module", hive = hive.name(), module = %name);
    async move {
        // Shutdown requests, answered once the module is gone for good.
        let mut stopping: Vec<oneshot::Sender<()>> = Vec::new();
        let mut next = Some(first);
        let mut restarts: u32 = 0;
        loop {
            let module = match next.take() {
                Some(module) => module,
                None => match catch_unwind(AssertUnwindSafe(|| factory(&hive))) {
                    Ok(module) => module,
                    Err(_) => {
                        error!("module factory panicked; the module stays stopped");
                        break;
                    }
                },
            };
            let (shutdown, returned) =
                start_incarnation(&hive, module, mailbox, config.flush_timeout());
            let mut shutdown = Some(shutdown);
            let mut returned = std::pin::pin!(returned);
            let back = loop {
                tokio::select! {
                    biased;
                    Some(Control::Shutdown(done)) = control.recv() => {
                        stopping.push(done);
                        if let Some(shutdown) = shutdown.take() {
                            let _ = shutdown.send(());
                        }
                    }
                    back = &mut returned => break back,
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
            if !stopping.is_empty() || !config.restart.should_restart(exit, restarts) {
                info!(?exit, restarts, "module stopped for good");
                break;
            }
            let delay = config.restart.delay(restarts);
            warn!(?exit, restart = restarts + 1, ?delay, "restarting module");
            tokio::select! {
                biased;
                Some(Control::Shutdown(done)) = control.recv() => {
                    stopping.push(done);
                    break;
                }
                _ = tokio::time::sleep(delay) => {}
            }
            restarts += 1;
            hive.note_restart(&name);
        }
        hive.note_stopped(&name);
        // Whatever is still queued (a send is checked against the close
        // under the lock it pushes under, so nothing comes after) is
        // dropped and counted, and a queued request fails at once instead
        // of waiting out its timeout.
        mailbox.close();
        while let Some(msg) = mailbox.recv().await {
            hive.discard(&name, msg);
        }
        for done in stopping {
            let _ = done.send(());
        }
        // A shutdown that comes later finds the control channel closed.
    }
    .instrument(span)
    .await
}

/// Whether the current thread runs an actix System (modules need one).
pub(crate) fn in_actix_system() -> bool {
    actix::System::try_current().is_some()
}
