//! The hive: the registry of modules and the six verbs of KubeEdge's beehive.
//!
//! One concern: the registry of modules and the verbs that act on it; long
//! because each verb has its own waiting and failure cases.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::task::Poll;
use std::time::Duration;

// The hive's maps are looked up on every send (a module's or group's name)
// and every response (a request's id): foldhash costs a tenth of the
// standard SipHash there. Every key is put in by the process itself (module
// and group names, the ids of its own requests; the network only looks up),
// and foldhash's maps are seeded at random all the same.
use foldhash::HashMap;
use tokio::sync::{mpsc, oneshot};
use tokio::time::{Instant, timeout_at};
use tracing::{debug, info, warn};
use uuid::Uuid;

use crate::config::HiveConfig;
use crate::counts::HandledCounts;
use crate::error::Error;
use crate::mailbox::{Mailbox, NoRoom, mailbox};
use crate::runtime::{Control, in_actix_system, supervise};
use crate::{Message, Module};

/// A handle to one hive: cheap to clone, `Send + Sync`, usable from any actor
/// and from any plain tokio task. Two hives in one process share nothing.
#[derive(Clone)]
pub struct Hive {
    inner: Arc<Inner>,
}

struct Inner {
    name: String,
    config: HiveConfig,
    registry: RwLock<Registry>,
    /// Requests waiting for a response, by request id. An entry exists
    /// before the request is sent, so no response can arrive too early.
    pending: Mutex<HashMap<Uuid, oneshot::Sender<Reply>>>,
    late_responses: AtomicU64,
    dropped_messages: AtomicU64,
    sync_timeouts: AtomicU64,
    restarts: AtomicU64,
}

/// What a waiting requester receives: the response, or why none will come.
type Reply = Result<Message, Error>;

#[derive(Default)]
struct Registry {
    modules: HashMap<String, Slot>,
    /// Running members of each group, in start order; shared so a group
    /// send takes one reference instead of copying the list.
    groups: HashMap<String, Arc<[Member]>>,
    start_order: Vec<String>,
}

/// A group member as a group send needs it.
#[derive(Clone)]
struct Member {
    name: String,
    mailbox: Mailbox<Message>,
}

impl Registry {
    /// Rebuilds the member list of `group` from the running modules.
    fn rebuild_group(&mut self, group: &str) {
        let members: Arc<[Member]> = self
            .start_order
            .iter()
            .filter_map(|name| {
                let slot = self.modules.get(name)?;
                (slot.running && slot.group == group).then(|| Member {
                    name: name.clone(),
                    mailbox: slot.mailbox.clone(),
                })
            })
            .collect();
        self.groups.insert(group.to_owned(), members);
    }
}

struct Slot {
    group: String,
    /// Messages it handled, by operation (kept across restarts).
    handled: Arc<HandledCounts>,
    mailbox: Mailbox<Message>,
    control: mpsc::UnboundedSender<Control>,
    flush_timeout: Duration,
    running: bool,
    restarts: u32,
}

/// Whether [`Hive::start_module`] started the module.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StartOutcome {
    /// The module runs.
    Running,
    /// The configuration disables it; it was not started.
    Disabled,
}

/// What [`Hive::send_resp`] did with a response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResponseOutcome {
    /// The waiting requester got it.
    Delivered,
    /// Nobody waits for it any more (timed out, or no such request): dropped and counted.
    Late,
}

/// Counters of one hive.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HiveStats {
    /// Responses that arrived after their requester gave up, dropped.
    pub late_responses: u64,
    /// `send_sync` calls that timed out.
    pub sync_timeouts: u64,
    /// Messages left in the mailbox of a module that stopped for good.
    pub dropped_messages: u64,
    /// Module restarts.
    pub restarts: u64,
}

/// State of one module, for status pages and metrics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModuleInfo {
    /// Module name.
    pub name: String,
    /// Module group.
    pub group: String,
    /// Whether it runs (or waits to be restarted).
    pub running: bool,
    /// Messages waiting in its mailbox, and those it took and has not
    /// handled yet: up to twice `capacity` during a burst.
    pub queued: usize,
    /// Mailbox capacity: how many may wait before senders do.
    pub capacity: usize,
    /// How often it was restarted.
    pub restarts: u32,
}

/// What [`Hive::shutdown`] did, in the order it did it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ShutdownReport {
    /// Modules that drained and flushed in time (reverse start order).
    pub stopped: Vec<String>,
    /// Modules that did not finish within their flush timeout.
    pub timed_out: Vec<String>,
}

/// Removes a pending request when its requester stops waiting, whatever the reason.
struct PendingGuard {
    hive: Hive,
    id: Uuid,
}

impl Drop for PendingGuard {
    fn drop(&mut self) {
        self.hive.pending().remove(&self.id);
    }
}

/// Why [`Hive::offer`] did not hand a message over.
enum Offered {
    /// No such module, or it stopped.
    Refused(Error),
    /// Its mailbox is full: the mailbox, and the message back.
    Full(Mailbox<Message>, Message),
}

/// A [`Hive::send`] under way: done at once when the mailbox had room,
/// else waiting for it.
#[must_use = "a send to a full mailbox waits only while awaited"]
pub struct Sending(SendingState);

enum SendingState {
    /// Taken or refused already; `None` once the outcome was returned.
    Done(Option<Result<(), Error>>),
    /// The mailbox was full: waits for room.
    Waiting(Pin<Box<dyn Future<Output = Result<(), Error>> + Send>>),
}

impl Sending {
    #[inline]
    fn done(outcome: Result<(), Error>) -> Sending {
        Sending(SendingState::Done(Some(outcome)))
    }
}

impl Future for Sending {
    type Output = Result<(), Error>;

    #[inline]
    fn poll(mut self: Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> Poll<Self::Output> {
        match &mut self.0 {
            // As any future: polling again after the outcome was taken is
            // the caller's bug (futures::future::Ready panics alike).
            SendingState::Done(outcome) => {
                Poll::Ready(outcome.take().expect("a send polled after it finished"))
            }
            SendingState::Waiting(waiting) => waiting.as_mut().poll(cx),
        }
    }
}

impl std::fmt::Debug for Sending {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = match self.0 {
            SendingState::Done(_) => "done",
            SendingState::Waiting(_) => "waiting for room",
        };
        f.debug_tuple("Sending").field(&state).finish()
    }
}

impl Hive {
    /// A new, empty hive. `name` labels its logs (e.g. "cloud", "edge").
    pub fn new(name: impl Into<String>, config: HiveConfig) -> Hive {
        Hive {
            inner: Arc::new(Inner {
                name: name.into(),
                config,
                registry: RwLock::new(Registry::default()),
                pending: Mutex::new(HashMap::default()),
                late_responses: AtomicU64::new(0),
                dropped_messages: AtomicU64::new(0),
                sync_timeouts: AtomicU64::new(0),
                restarts: AtomicU64::new(0),
            }),
        }
    }

    /// The hive's name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The hive's configuration.
    pub fn config(&self) -> &HiveConfig {
        &self.inner.config
    }

    #[inline]
    fn read(&self) -> RwLockReadGuard<'_, Registry> {
        self.inner
            .registry
            .read()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn write(&self) -> RwLockWriteGuard<'_, Registry> {
        self.inner
            .registry
            .write()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn pending(&self) -> MutexGuard<'_, HashMap<Uuid, oneshot::Sender<Reply>>> {
        self.inner
            .pending
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Starts a module made by `factory`, if the config enables it. The
    /// factory is called again for each restart. Must run inside an actix
    /// System; modules start in the order of these calls and shut down in
    /// the reverse order.
    pub fn start_module<M, F>(&self, mut factory: F) -> Result<StartOutcome, Error>
    where
        M: Module,
        F: FnMut(&Hive) -> M + 'static,
    {
        if !in_actix_system() {
            return Err(Error::NoActixSystem);
        }
        let module = factory(self);
        let name = module.name().to_owned();
        let group = module.group().to_owned();
        let config = self.inner.config.module(&name);
        if !config.enable {
            info!(hive = self.name(), module = %name, "module disabled by config");
            return Ok(StartOutcome::Disabled);
        }
        let (mailbox, inbox) = mailbox(config.mailbox_capacity);
        let (control, controls) = mpsc::unbounded_channel();
        {
            let mut registry = self.write();
            if registry.modules.get(&name).is_some_and(|slot| slot.running) {
                return Err(Error::DuplicateModule(name));
            }
            registry.start_order.retain(|n| n != &name);
            registry.start_order.push(name.clone());
            // Counters survive a module started again under its name.
            let (handled, restarts) = registry
                .modules
                .get(&name)
                .map(|slot| (slot.handled.clone(), slot.restarts))
                .unwrap_or_default();
            registry.modules.insert(
                name.clone(),
                Slot {
                    group: group.clone(),
                    handled,
                    mailbox,
                    control,
                    flush_timeout: config.flush_timeout(),
                    running: true,
                    restarts,
                },
            );
            registry.rebuild_group(&group);
        }
        info!(hive = self.name(), module = %name, "module started");
        actix::spawn(supervise(
            self.clone(),
            name,
            module,
            factory,
            inbox,
            controls,
            config,
        ));
        Ok(StartOutcome::Running)
    }

    pub(crate) fn note_restart(&self, name: &str) {
        self.inner.restarts.fetch_add(1, Ordering::Relaxed);
        if let Some(slot) = self.write().modules.get_mut(name) {
            slot.restarts += 1;
        }
    }

    /// Called by the supervisor when a module stopped for good: it leaves
    /// its group and later sends to it fail.
    pub(crate) fn note_stopped(&self, name: &str) {
        let mut registry = self.write();
        let Some(slot) = registry.modules.get_mut(name) else {
            return;
        };
        slot.running = false;
        let group = slot.group.clone();
        registry.rebuild_group(&group);
    }

    /// A message left in the mailbox of a module that stopped for good: a
    /// request fails at once, anything else is dropped and counted.
    pub(crate) fn discard(&self, name: &str, msg: Message) {
        let requester = msg
            .is_sync()
            .then(|| self.pending().remove(&msg.id()))
            .flatten();
        match requester {
            Some(requester) => {
                let _ = requester.send(Err(Error::ModuleStopped(name.to_owned())));
            }
            None => {
                warn!(
                    hive = self.name(),
                    module = name,
                    "message dropped: module stopped"
                );
                self.inner.dropped_messages.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// The request `id` made its module fail: its requester gets the error now.
    pub(crate) fn fail_request(&self, id: Uuid, module: &str, reason: &str) {
        if let Some(requester) = self.pending().remove(&id) {
            let _ = requester.send(Err(Error::ModuleFailed {
                module: module.to_owned(),
                reason: reason.to_owned(),
            }));
        }
    }

    /// Sends `msg` to the module `destination`. Waits while its mailbox is
    /// full; an unknown or stopped destination is an error.
    ///
    /// The message is offered to the mailbox at once, when `send` is
    /// called: a mailbox with room takes it without a future being built
    /// around it (the common case, and most of a send's cost otherwise), and
    /// only a full one leaves a [`Sending`] that waits for room.
    #[inline]
    pub fn send(&self, destination: &str, msg: Message) -> Sending {
        match self.offer(destination, msg) {
            Ok(()) => Sending::done(Ok(())),
            Err(Offered::Refused(err)) => Sending::done(Err(err)),
            Err(Offered::Full(mailbox, msg)) => {
                let destination = destination.to_owned();
                Sending(SendingState::Waiting(Box::pin(async move {
                    mailbox
                        .send(msg)
                        .await
                        .map_err(|_| Error::ModuleStopped(destination))
                })))
            }
        }
    }

    /// Sends without waiting: a full mailbox is [`Error::MailboxFull`].
    pub fn try_send(&self, destination: &str, msg: Message) -> Result<(), Error> {
        self.offer(destination, msg)
            .map_err(|offered| match offered {
                Offered::Refused(err) => err,
                Offered::Full(..) => Error::MailboxFull(destination.to_owned()),
            })
    }

    /// Offers `msg` to `destination`'s mailbox without waiting, for
    /// [`Hive::send`] and [`Hive::try_send`].
    #[allow(clippy::result_large_err)] // The error is the message handed back, whole.
    ///
    /// The mailbox is asked for room before the message moves: a taken
    /// message is copied once, into the queue, and only a full mailbox's
    /// refusal carries it back.
    #[inline]
    fn offer(&self, destination: &str, msg: Message) -> Result<(), Offered> {
        let registry = self.read();
        let Some(slot) = registry.modules.get(destination) else {
            return Err(Offered::Refused(Error::UnknownModule(
                destination.to_owned(),
            )));
        };
        match slot.mailbox.reserve(false) {
            Ok(room) => {
                room.push(msg);
                Ok(())
            }
            Err(NoRoom::Full) => Err(Offered::Full(slot.mailbox.clone(), msg)),
            Err(NoRoom::Closed) => Err(Offered::Refused(Error::ModuleStopped(
                destination.to_owned(),
            ))),
        }
    }

    /// Sends `msg` to `destination` and waits for the response whose
    /// `parent_id` is `msg`'s id, at most `timeout` (time spent waiting for
    /// mailbox room counts). A response that comes later is dropped and
    /// counted in [`HiveStats::late_responses`].
    pub async fn send_sync(
        &self,
        destination: &str,
        msg: Message,
        timeout: Duration,
    ) -> Result<Message, Error> {
        self.send_sync_queued(destination, msg, timeout)
            .await?
            .await
    }

    /// [`Hive::send_sync`] in two steps: returns once `msg` is in
    /// `destination`'s mailbox, with a future that waits for its response
    /// (within the same `timeout`, counted from now). Requests queued one
    /// after another arrive in that order, and their answers can be
    /// awaited together: a module that sends many requests to another does
    /// not wait a round trip for each.
    pub async fn send_sync_queued(
        &self,
        destination: &str,
        mut msg: Message,
        timeout: Duration,
    ) -> Result<impl Future<Output = Result<Message, Error>> + Send + 'static, Error> {
        let deadline = Instant::now() + timeout;
        msg.header.sync = true;
        let (response, guard) = self.expect_response(&mut msg);
        let hive = self.clone();
        let timed_out = move |destination: String| {
            hive.inner.sync_timeouts.fetch_add(1, Ordering::Relaxed);
            Error::Timeout {
                destination,
                timeout,
            }
        };
        match timeout_at(deadline, self.send(destination, msg)).await {
            Ok(sent) => sent?,
            Err(_) => return Err(timed_out(destination.to_owned())),
        }
        let destination = destination.to_owned();
        Ok(async move {
            await_response(response, guard, deadline)
                .await
                .unwrap_or_else(|| Err(timed_out(destination)))
        })
    }

    /// Registers interest in the response to `request`, before it leaves.
    /// A request whose id is already waiting (a message sent twice) gets a
    /// fresh id, so the two cannot take each other's response.
    fn expect_response(&self, request: &mut Message) -> (oneshot::Receiver<Reply>, PendingGuard) {
        let (tx, rx) = oneshot::channel();
        let mut pending = self.pending();
        while pending.contains_key(&request.header.id) {
            request.header.id = Uuid::new_v4();
        }
        pending.insert(request.header.id, tx);
        (
            rx,
            PendingGuard {
                hive: self.clone(),
                id: request.header.id,
            },
        )
    }

    /// Completes the pending request named by `response.parent_id` (any
    /// module, any requester). Never waits.
    #[allow(clippy::result_large_err)] // The error is the response handed back, whole.
    pub fn send_resp(&self, response: Message) -> ResponseOutcome {
        let waiting = response
            .parent_id()
            .and_then(|parent| self.pending().remove(&parent));
        match waiting.map(|requester| requester.send(Ok(response))) {
            Some(Ok(())) => ResponseOutcome::Delivered,
            _ => {
                self.inner.late_responses.fetch_add(1, Ordering::Relaxed);
                debug!(hive = self.name(), "late response dropped");
                ResponseOutcome::Late
            }
        }
    }

    /// Whether a request with this id still waits for its response; a hub
    /// uses this to tell responses from new messages.
    pub fn is_pending(&self, id: Uuid) -> bool {
        self.pending().contains_key(&id)
    }

    /// Running members of `group`, in start order.
    fn members(&self, group: &str) -> Result<Arc<[Member]>, Error> {
        match self.read().groups.get(group) {
            Some(members) if !members.is_empty() => Ok(Arc::clone(members)),
            _ => Err(Error::UnknownGroup(group.to_owned())),
        }
    }

    /// Sends a copy of `msg` to every running member of `group`, in start
    /// order, waiting for mailbox room like [`Hive::send`]. A member that
    /// stopped meanwhile is reported after the others got their copy.
    pub async fn send_to_group(&self, group: &str, msg: Message) -> Result<(), Error> {
        let mut first_error = None;
        for member in self.members(group)?.iter() {
            if member.mailbox.send(msg.clone()).await.is_err() {
                first_error.get_or_insert_with(|| Error::ModuleStopped(member.name.clone()));
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// Sends a copy of `msg` (each with its own id) to every member of
    /// `group` and waits for all their responses, at most `timeout` in all.
    /// Returns the responses by member, or [`Error::GroupTimeout`] naming
    /// those that did not answer.
    pub async fn send_to_group_sync(
        &self,
        group: &str,
        msg: Message,
        timeout: Duration,
    ) -> Result<Vec<(String, Message)>, Error> {
        let deadline = Instant::now() + timeout;
        let members = self.members(group)?;
        let mut waiting = Vec::with_capacity(members.len());
        for Member { name, mailbox } in members.iter().cloned() {
            let mut copy = msg.clone();
            copy.header.id = Uuid::new_v4();
            copy.header.sync = true;
            let (response, guard) = self.expect_response(&mut copy);
            let sent = matches!(timeout_at(deadline, mailbox.send(copy)).await, Ok(Ok(())));
            waiting.push((name, sent.then_some((response, guard))));
        }
        let mut answered = Vec::with_capacity(waiting.len());
        let mut missing = Vec::new();
        for (name, request) in waiting {
            let response = match request {
                Some((response, guard)) => await_response(response, guard, deadline).await,
                None => None,
            };
            match response {
                Some(Ok(response)) => answered.push((name, response)),
                Some(Err(_)) | None => missing.push(name),
            }
        }
        if missing.is_empty() {
            Ok(answered)
        } else {
            self.inner.sync_timeouts.fetch_add(1, Ordering::Relaxed);
            Err(Error::GroupTimeout {
                group: group.to_owned(),
                missing,
                answered,
            })
        }
    }

    /// Stops every module in the reverse of its start order. Each first
    /// drains its mailbox (new sends to it fail), then runs its cleanup
    /// within its `flushTimeoutMs`; shutdown waits at most twice that for a
    /// module (drain and cleanup) before it goes on to the next.
    pub async fn shutdown(&self) -> ShutdownReport {
        let order: Vec<(String, mpsc::UnboundedSender<Control>, Duration)> = {
            let registry = self.read();
            registry
                .start_order
                .iter()
                .rev()
                .filter_map(|name| {
                    let slot = registry.modules.get(name)?;
                    Some((name.clone(), slot.control.clone(), slot.flush_timeout))
                })
                .collect()
        };
        let mut report = ShutdownReport::default();
        for (name, control, flush_timeout) in order {
            self.stop_one(name, &control, flush_timeout, &mut report)
                .await;
        }
        info!(hive = self.name(), ?report, "hive shut down");
        report
    }

    /// Stops one module ahead of the others (it flushes first), for a
    /// process whose modules must stop in another order than the reverse
    /// of their start: what feeds the others goes first. A module already
    /// stopped, or unknown, is left as it is.
    pub async fn stop_module(&self, name: &str) -> ShutdownReport {
        let slot = {
            let registry = self.read();
            registry
                .modules
                .get(name)
                .map(|slot| (slot.control.clone(), slot.flush_timeout))
        };
        let mut report = ShutdownReport::default();
        if let Some((control, flush_timeout)) = slot {
            self.stop_one(name.to_owned(), &control, flush_timeout, &mut report)
                .await;
        }
        report
    }

    async fn stop_one(
        &self,
        name: String,
        control: &mpsc::UnboundedSender<Control>,
        flush_timeout: Duration,
        report: &mut ShutdownReport,
    ) {
        let (done, finished) = oneshot::channel();
        if control.send(Control::Shutdown(done)).is_err() {
            // Already stopped for good.
            return;
        }
        match tokio::time::timeout(flush_timeout * 2, finished).await {
            Ok(_) => report.stopped.push(name),
            Err(_) => {
                warn!(hive = self.name(), module = %name, "module did not stop within its flush timeout");
                report.timed_out.push(name);
            }
        }
    }

    /// Waits for SIGINT or SIGTERM, then shuts the hive down.
    pub async fn shutdown_on_signal(&self) -> std::io::Result<ShutdownReport> {
        Hive::signalled().await?;
        Ok(self.shutdown().await)
    }

    /// Waits for SIGINT or SIGTERM, for a process that has something to
    /// do before its hive stops (hand its work over).
    pub async fn signalled() -> std::io::Result<()> {
        use tokio::signal::unix::{SignalKind, signal};
        let mut interrupt = signal(SignalKind::interrupt())?;
        let mut terminate = signal(SignalKind::terminate())?;
        tokio::select! {
            _ = interrupt.recv() => info!("SIGINT"),
            _ = terminate.recv() => info!("SIGTERM"),
        }
        Ok(())
    }

    /// The hive's counters.
    pub fn stats(&self) -> HiveStats {
        HiveStats {
            late_responses: self.inner.late_responses.load(Ordering::Relaxed),
            dropped_messages: self.inner.dropped_messages.load(Ordering::Relaxed),
            sync_timeouts: self.inner.sync_timeouts.load(Ordering::Relaxed),
            restarts: self.inner.restarts.load(Ordering::Relaxed),
        }
    }

    /// Every module ever started, in start order.
    pub fn modules(&self) -> Vec<ModuleInfo> {
        let registry = self.read();
        registry
            .start_order
            .iter()
            .filter_map(|name| {
                let slot = registry.modules.get(name)?;
                Some(ModuleInfo {
                    name: name.clone(),
                    group: slot.group.clone(),
                    running: slot.running,
                    queued: slot.mailbox.queued(),
                    capacity: slot.mailbox.capacity(),
                    restarts: slot.restarts,
                })
            })
            .collect()
    }

    /// Messages each module handled, by operation: (module, operation,
    /// count), in start order, for metrics.
    pub fn handled(&self) -> Vec<(String, &'static str, u64)> {
        let registry = self.read();
        registry
            .start_order
            .iter()
            .filter_map(|name| Some((name, registry.modules.get(name)?)))
            .flat_map(|(name, slot)| {
                slot.handled
                    .snapshot()
                    .into_iter()
                    .map(move |(op, count)| (name.clone(), op, count))
            })
            .collect()
    }

    /// The counters module `name` counts its messages in.
    pub(crate) fn handled_counts(&self, name: &str) -> Arc<HandledCounts> {
        self.read()
            .modules
            .get(name)
            .map(|slot| slot.handled.clone())
            .unwrap_or_default()
    }

    /// The state of one module.
    pub fn module(&self, name: &str) -> Option<ModuleInfo> {
        self.modules().into_iter().find(|info| info.name == name)
    }
}

/// Waits for a registered response until `deadline`. On time-out the pending
/// entry is removed first, and a response that slipped in meanwhile is still
/// taken, so a response is either returned here or counted as late.
async fn await_response(
    mut response: oneshot::Receiver<Reply>,
    guard: PendingGuard,
    deadline: Instant,
) -> Option<Reply> {
    match timeout_at(deadline, &mut response).await {
        Ok(received) => received.ok(),
        Err(_) => {
            drop(guard);
            // A responder that already took the entry either sent before
            // this close (taken here) or fails after it (counted as late).
            response.close();
            response.try_recv().ok()
        }
    }
}
