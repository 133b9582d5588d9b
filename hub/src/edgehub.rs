//! edgehub: the edge node's one link to the cloud. It reconnects with
//! exponential backoff and jitter, routes cloud messages to the edge modules
//! by group, acknowledges an object only after the module that keeps it has
//! persisted it, and keeps what must not be lost while the cloud is gone.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use beehive::constants::{group, module, operation};
use beehive::{Hive, Message as HiveMessage, Module, ModuleError};
use tokio::sync::{Notify, watch};
use tracing::{debug, info, warn};
use transports::{DialOptions, Lane, Link, LinkSender, Received, TransportError, TransportKind};

use crate::dialect::Dialect;
use crate::protocol::{self, Kind};
use crate::stats::EdgeHubStats;

/// How edgehub runs.
#[derive(Clone)]
pub struct EdgeHubConfig {
    /// This node's name (must match its certificate's common name).
    pub node: String,
    /// Which transport to dial.
    pub transport: TransportKind,
    /// Where and how (address, TLS, limits).
    pub dial: DialOptions,
    /// Keepalive interval; a link silent for two intervals is closed.
    pub keepalive: Duration,
    /// First reconnect delay; doubles per failure, with jitter.
    pub reconnect_initial: Duration,
    /// Reconnect delays never exceed this.
    pub reconnect_max: Duration,
    /// Upstream messages kept while offline, latest per object.
    pub offline_buffer: usize,
    /// Time an edge module gets to persist an object before the link is
    /// reset (so the cloud sends it again).
    pub persist_timeout: Duration,
    /// How this edge talks to the cloud: edgehive's own dialect, or
    /// KubeEdge's (to a cloud endpoint that speaks it).
    pub dialect: Dialect,
    /// More addresses of the cloud (its other replicas), tried in turn
    /// after `dial.address` when a dial fails or a link is lost. A name
    /// resolving to several addresses is tried at each of them in turn.
    pub alternates: Vec<String>,
    /// Serves the streams the cloud opens inside the link (logs, exec,
    /// port-forward, ...); none: every stream is refused.
    pub streams: Option<Arc<dyn stream::StreamHandler>>,
}

impl EdgeHubConfig {
    /// Defaults for `node` dialing `dial` over `transport`.
    pub fn new(node: impl Into<String>, transport: TransportKind, dial: DialOptions) -> Self {
        EdgeHubConfig {
            node: node.into(),
            transport,
            dial,
            keepalive: Duration::from_secs(15),
            reconnect_initial: Duration::from_millis(200),
            reconnect_max: Duration::from_secs(30),
            offline_buffer: 10_000,
            persist_timeout: Duration::from_secs(30),
            dialect: Dialect::Native,
            alternates: Vec::new(),
            streams: None,
        }
    }

    /// The cloud's addresses, in the order they are tried.
    pub fn addresses(&self) -> Vec<String> {
        std::iter::once(self.dial.address.clone())
            .chain(self.alternates.iter().cloned())
            .collect()
    }

    /// The delay before reconnect attempt `attempt` (0-based): exponential,
    /// capped, with jitter in [50 %, 100 %] so that nodes do not return in
    /// lockstep after a cloud restart.
    pub fn backoff(&self, attempt: u32) -> Duration {
        let exp = self
            .reconnect_initial
            .saturating_mul(2u32.saturating_pow(attempt.min(20)));
        let capped = exp.min(self.reconnect_max);
        capped.mul_f64(0.5 + fastrand::f64() * 0.5)
    }
}

/// Upstream messages kept while offline: the latest per object and
/// operation, in first-seen order, bounded.
#[derive(Debug, Default)]
pub struct OfflineBuffer {
    max: usize,
    order: VecDeque<String>,
    latest: HashMap<String, HiveMessage>,
}

impl OfflineBuffer {
    /// A buffer for at most `max` objects.
    pub fn new(max: usize) -> Self {
        OfflineBuffer {
            max: max.max(1),
            ..Default::default()
        }
    }

    /// Keeps `msg`, replacing an older one for the same object; returns
    /// whether an old entry had to be dropped for room.
    pub fn push(&mut self, msg: HiveMessage) -> bool {
        let key = format!("{}|{}", msg.resource(), msg.operation());
        if let Some(slot) = self.latest.get_mut(&key) {
            *slot = msg;
            return false;
        }
        let mut dropped = false;
        if self.latest.len() >= self.max
            && let Some(oldest) = self.order.pop_front()
        {
            self.latest.remove(&oldest);
            dropped = true;
        }
        self.order.push_back(key.clone());
        self.latest.insert(key, msg);
        dropped
    }

    /// Takes the oldest kept message.
    pub fn pop(&mut self) -> Option<HiveMessage> {
        let key = self.order.pop_front()?;
        self.latest.remove(&key)
    }

    /// Puts a message back at the front (it could not be sent after all).
    pub fn unpop(&mut self, msg: HiveMessage) {
        let key = format!("{}|{}", msg.resource(), msg.operation());
        if !self.latest.contains_key(&key) {
            self.order.push_front(key.clone());
            self.latest.insert(key, msg);
        }
    }

    /// Messages kept.
    pub fn len(&self) -> usize {
        self.latest.len()
    }

    /// Whether nothing is kept.
    pub fn is_empty(&self) -> bool {
        self.latest.is_empty()
    }
}

/// The group of the edge modules that take a cloud message of `group`.
pub fn route(cloud_group: &str) -> &str {
    match cloud_group {
        group::RESOURCE | group::META => group::META,
        group::USER | group::BUS => group::BUS,
        other => other,
    }
}

/// What a running edgehub tells its owner.
#[derive(Clone)]
pub struct EdgeHubHandle {
    /// Counters.
    pub stats: Arc<EdgeHubStats>,
    /// Whether the link to the cloud is up now.
    pub online: watch::Receiver<bool>,
    cut: Arc<Notify>,
}

impl EdgeHubHandle {
    /// Drops the current link at once, without a goodbye, as a network
    /// failure would; edgehub then reconnects as usual. For fault injection.
    pub fn cut_link(&self) {
        self.cut.notify_one();
    }
}

/// The edgehub module.
pub struct EdgeHub {
    hive: Hive,
    config: Arc<EdgeHubConfig>,
    link: Option<(u64, LinkSender)>,
    offline: OfflineBuffer,
    stats: Arc<EdgeHubStats>,
    online: Arc<watch::Sender<bool>>,
    cut: Arc<Notify>,
    flush_scheduled: bool,
}

impl EdgeHub {
    /// Starts the edgehub module in `hive`; it connects in the background.
    pub fn start(hive: &Hive, config: EdgeHubConfig) -> Result<EdgeHubHandle, beehive::Error> {
        let stats = Arc::new(EdgeHubStats::default());
        let (online, watch_online) = watch::channel(false);
        let online = Arc::new(online);
        let config = Arc::new(config);
        let hub_stats = stats.clone();
        let cut = Arc::new(Notify::new());
        let hub_cut = cut.clone();
        hive.start_module(move |hive| EdgeHub {
            hive: hive.clone(),
            offline: OfflineBuffer::new(config.offline_buffer),
            config: config.clone(),
            link: None,
            stats: hub_stats.clone(),
            online: online.clone(),
            cut: hub_cut.clone(),
            flush_scheduled: false,
        })?;
        Ok(EdgeHubHandle {
            stats,
            online: watch_online,
            cut,
        })
    }

    /// Sends what waited offline, in order, while the link has room.
    fn flush_offline(&mut self, ctx: &mut Context<Self>) {
        let Some((_, sender)) = &self.link else {
            return;
        };
        let sender = sender.clone();
        while let Some(msg) = self.offline.pop() {
            match self.send_up(&sender, &msg) {
                Ok(()) => self.stats.count(&self.stats.upstream_sent),
                Err(TransportError::QueueFull) => {
                    self.offline.unpop(msg);
                    if !self.flush_scheduled {
                        self.flush_scheduled = true;
                        ctx.run_later(Duration::from_millis(5), |hub, ctx| {
                            hub.flush_scheduled = false;
                            hub.flush_offline(ctx);
                        });
                    }
                    return;
                }
                Err(TransportError::Frame(err)) => {
                    // Can never be sent: dropped, not left to block the rest.
                    warn!(error = %err, "message for the cloud refused");
                }
                Err(_) => {
                    // The link is going; LinkUp flushes again.
                    self.offline.unpop(msg);
                    return;
                }
            }
        }
    }

    /// Puts an edge module's message on the link, in the link's dialect.
    fn send_up(&self, sender: &LinkSender, msg: &HiveMessage) -> Result<(), TransportError> {
        match self.config.dialect {
            Dialect::Native => sender.try_send(msg, Lane::Ordered),
            dialect => sender.try_send(&dialect.upstream(msg.clone()), Lane::Ordered),
        }
    }

    fn keep_offline(&mut self, msg: HiveMessage) {
        self.stats.count(&self.stats.offline_buffered);
        if self.offline.push(msg) {
            self.stats.count(&self.stats.offline_dropped);
        }
    }
}

impl Actor for EdgeHub {
    type Context = Context<Self>;
}

impl Module for EdgeHub {
    fn name(&self) -> &str {
        module::EDGEHUB
    }

    fn group(&self) -> &str {
        group::HUB
    }

    fn init(&mut self, ctx: &mut Context<Self>) {
        actix::spawn(connect_loop(
            ctx.address(),
            self.hive.clone(),
            self.config.clone(),
            self.stats.clone(),
            self.cut.clone(),
        ));
    }

    /// A message from an edge module, for the cloud.
    fn handle(&mut self, msg: HiveMessage, ctx: &mut Context<Self>) -> Result<(), ModuleError> {
        if msg.operation() == operation::QUERY && msg.is_sync() {
            // A question is worth nothing later: it goes now, ahead of any
            // backlog, or is answered at once; it never waits offline.
            let sent = self
                .link
                .as_ref()
                .is_some_and(|(_, sender)| self.send_up(sender, &msg).is_ok());
            if sent {
                self.stats.count(&self.stats.upstream_sent);
            } else {
                self.hive
                    .send_resp(msg.error_response(module::EDGEHUB, "the cloud is unreachable"));
            }
            return Ok(());
        }
        // Behind anything still waiting, so the latest report goes up last.
        let Some((_, sender)) = self.link.as_ref().filter(|_| self.offline.is_empty()) else {
            self.keep_offline(msg);
            self.flush_offline(ctx);
            return Ok(());
        };
        match self.send_up(sender, &msg) {
            Ok(()) => self.stats.count(&self.stats.upstream_sent),
            Err(TransportError::Frame(err)) => warn!(error = %err, "message for the cloud refused"),
            Err(_) => {
                self.keep_offline(msg);
                self.flush_offline(ctx);
            }
        }
        Ok(())
    }

    fn cleanup(&mut self, _ctx: &mut Context<Self>) -> ResponseActFuture<Self, ()> {
        let link = self.link.take();
        Box::pin(
            async move {
                if let Some((_, sender)) = link {
                    sender.close().await;
                }
            }
            .into_actor(self),
        )
    }
}

/// The link is up.
#[derive(Message)]
#[rtype(result = "()")]
struct LinkUp {
    id: u64,
    sender: LinkSender,
}

/// The link is down.
#[derive(Message)]
#[rtype(result = "()")]
struct LinkDown {
    id: u64,
}

impl Handler<LinkUp> for EdgeHub {
    type Result = ();
    fn handle(&mut self, up: LinkUp, ctx: &mut Context<Self>) {
        self.link = Some((up.id, up.sender));
        self.online.send_replace(true);
        self.flush_offline(ctx);
    }
}

impl Handler<LinkDown> for EdgeHub {
    type Result = ();
    fn handle(&mut self, down: LinkDown, _: &mut Context<Self>) {
        if self.link.as_ref().is_some_and(|(id, _)| *id == down.id) {
            self.link = None;
            self.online.send_replace(false);
        }
    }
}

/// Dials, runs the link until it ends, waits, dials again; ends when the
/// edgehub module is gone.
async fn connect_loop(
    hub: Addr<EdgeHub>,
    hive: Hive,
    config: Arc<EdgeHubConfig>,
    stats: Arc<EdgeHubStats>,
    cut: Arc<Notify>,
) {
    let transport = match config.transport.transport() {
        Ok(transport) => transport,
        Err(err) => {
            warn!(error = %err, "edgehub cannot dial");
            return;
        }
    };
    let mut dial = config
        .dialect
        .dial_options(&config.node, config.dial.clone());
    let mut addresses = CloudAddresses::new(
        config.addresses(),
        config.transport != TransportKind::UnixSocket,
    );
    let mut attempt = 0u32;
    let mut id = 0u64;
    while hub.connected() {
        dial.address = addresses.next().await;
        match transport.dial(&dial).await {
            Ok(link) => {
                id += 1;
                stats.count(&stats.connects);
                info!(node = %config.node, address = %dial.address, "connected to the cloud");
                let up = Instant::now();
                run_link(link, id, &hub, &hive, &config, &stats, &cut).await;
                // A link refused at once (another replica serves this node)
                // is a failure too: the backoff grows.
                if up.elapsed() >= Duration::from_secs(1) {
                    attempt = 0;
                }
                hub.do_send(LinkDown { id });
                info!(node = %config.node, address = %dial.address, "link to the cloud lost");
            }
            // The cloud said no and why: a matter for whoever set the node up.
            Err(err @ TransportError::Refused { .. }) => {
                stats.count(&stats.dial_failures);
                warn!(error = %err, attempt, address = %dial.address, "the cloud refused the link");
            }
            Err(err) => {
                stats.count(&stats.dial_failures);
                debug!(error = %err, attempt, address = %dial.address, "dial failed");
            }
        }
        if !hub.connected() {
            break;
        }
        // The next replica, if there are several; the backoff grows per
        // failure as with one.
        let delay = config.backoff(attempt);
        attempt = attempt.saturating_add(1);
        tokio::time::sleep(delay).await;
    }
}

/// The cloud's addresses in the order they are dialled: each configured
/// address in turn, and a name resolving to several addresses (several
/// replicas behind one DNS name) as each of those in turn. A name is
/// resolved again each time its turn comes, so a changed record is
/// followed; one that does not resolve is dialled as given, for the
/// transport to say why.
struct CloudAddresses {
    configured: Vec<String>,
    /// Whether the addresses are `host:port` (not a socket's path).
    network: bool,
    next: usize,
    pending: VecDeque<String>,
    resolve: Resolver,
}

/// Resolves `host:port` to its addresses.
type Resolver =
    fn(
        String,
    ) -> futures_util::future::BoxFuture<'static, std::io::Result<Vec<std::net::SocketAddr>>>;

/// The system's resolver.
fn lookup(
    address: String,
) -> futures_util::future::BoxFuture<'static, std::io::Result<Vec<std::net::SocketAddr>>> {
    Box::pin(async move { Ok(tokio::net::lookup_host(address).await?.collect()) })
}

impl CloudAddresses {
    fn new(configured: Vec<String>, network: bool) -> CloudAddresses {
        CloudAddresses {
            configured,
            network,
            next: 0,
            pending: VecDeque::new(),
            resolve: lookup,
        }
    }

    async fn next(&mut self) -> String {
        if let Some(address) = self.pending.pop_front() {
            return address;
        }
        let Some(configured) = self
            .configured
            .get(self.next % self.configured.len().max(1))
        else {
            return String::new();
        };
        let configured = configured.clone();
        self.next = self.next.wrapping_add(1);
        if !self.network {
            return configured;
        }
        let resolved: Vec<String> = match (self.resolve)(configured.clone()).await {
            Ok(found) => {
                let mut found: Vec<String> = found.into_iter().map(|a| a.to_string()).collect();
                // One address once, whatever the resolver repeats.
                let mut seen = std::collections::HashSet::new();
                found.retain(|a| seen.insert(a.clone()));
                found
            }
            Err(err) => {
                debug!(address = %configured, error = %err, "cloud address not resolved");
                Vec::new()
            }
        };
        match resolved.len() {
            // One address (or none): dialled by its name, as given.
            0 | 1 => configured,
            _ => {
                debug!(address = %configured, addresses = ?resolved, "cloud name resolves to several addresses");
                self.pending.extend(resolved);
                self.pending.pop_front().unwrap_or(configured)
            }
        }
    }
}

async fn run_link(
    link: Link,
    id: u64,
    hub: &Addr<EdgeHub>,
    hive: &Hive,
    config: &Arc<EdgeHubConfig>,
    stats: &Arc<EdgeHubStats>,
    cut: &Notify,
) {
    let Link {
        sender,
        mut receiver,
        ..
    } = link;
    let dialect = config.dialect;
    let opener = dialect.opener(&config.node);
    if sender.send(&opener).await.is_err() {
        return;
    }
    // Up only once the cloud has accepted the opener (it answers at once);
    // a refused link must not take the offline backlog with it.
    let first = tokio::select! {
        first = tokio::time::timeout(config.keepalive * 7 / 4, receiver.recv()) => first,
        _ = cut.notified() => return,
    };
    let first = match first {
        Ok(Some(Ok(msg))) => msg,
        Ok(Some(Err(err))) => return warn!(error = %err, "link to the cloud failed"),
        Ok(None) => return warn!("the cloud closed the link after the hello (refused?)"),
        Err(_) => {
            // Silence, as a frozen cloud keeps it: a keepalive timeout.
            warn!("no answer from the cloud to the hello; closing the link");
            stats.count(&stats.keepalive_timeouts);
            return;
        }
    };
    hub.do_send(LinkUp {
        id,
        sender: sender.clone(),
    });
    if first.parent_id() == Some(opener.id()) {
        debug!(answer = %first.content(), "node registered");
    } else if protocol::kind(&first) == Kind::Payload {
        deliver(first, &sender, hive, config, stats).await;
    }
    // Streams the cloud opens inside the link; they end with it.
    let tunnel = stream::Tunnel::for_edge(sender.clone(), config.streams.clone());
    let _streams_end_with_the_link = tunnel.end_on_drop();
    let keepalive = config.keepalive;
    // A KubeEdge cloud sends no keepalives, but its WebSocket layer answers
    // pings: their pongs show the cloud process alive, where a frozen one
    // (its kernel still acknowledging) leaves the link silent.
    let probes = !dialect.cloud_keeps_alive() && sender.can_ping();
    let watched = dialect.cloud_keeps_alive() || probes;
    let mut pongs = receiver.pongs();
    let mut written = sender.written();
    let mut ticker = tokio::time::interval(keepalive / 4);
    let mut last_seen = Instant::now();
    let mut last_sent = Instant::now();
    loop {
        tokio::select! {
            next = receiver.recv_item() => {
                let msg = match next {
                    Some(Ok(Received::Message(msg))) => msg,
                    Some(Ok(Received::Raw(frame))) => {
                        tunnel.received(&frame);
                        last_seen = Instant::now();
                        continue;
                    }
                    Some(Err(err)) => {
                        warn!(error = %err, "link to the cloud failed");
                        break;
                    }
                    None => break,
                };
                if protocol::kind(&msg) == Kind::Payload {
                    deliver(msg, &sender, hive, config, stats).await;
                }
                // After delivering: time spent on it is ours, not the
                // cloud's silence.
                last_seen = Instant::now();
            }
            _ = cut.notified() => {
                // Gone at once: nothing flushed, nothing said.
                return;
            }
            _ = sender.closed() => {
                // Closed here (edgehub stopping): take nothing more from it.
                break;
            }
            _ = ticker.tick() => {
                let heard = receiver.pongs();
                if heard != pongs {
                    pongs = heard;
                    last_seen = Instant::now();
                }
                // A ping waits behind what is already on its way up; while
                // that backlog moves, the cloud's end is taking data. Once a
                // frozen cloud's buffers are full, it stops moving.
                let now_written = sender.written();
                if probes && now_written != written && sender.backlog() > 0 {
                    last_seen = Instant::now();
                }
                written = now_written;
                if watched && last_seen.elapsed() > keepalive * 7 / 4 {
                    warn!("nothing from the cloud, not even a pong; closing the link");
                    stats.count(&stats.keepalive_timeouts);
                    break;
                }
                if last_sent.elapsed() >= keepalive {
                    last_sent = Instant::now();
                    let _ = sender.try_send(&dialect.keepalive(), Lane::Ordered);
                    if probes {
                        let _ = sender.ping();
                    }
                }
            }
        }
    }
    let closing = sender.clone();
    actix::spawn(async move { closing.close().await });
}

/// What became of an object handed to the edge modules.
enum Confirmation {
    /// Stored: acknowledge.
    Persisted,
    /// Refused for good (no such module, a module said no): acknowledge and
    /// count, or the cloud would resend it forever.
    Refused(String),
    /// Not confirmed in time: the link is reset so it comes again.
    NotYet(String),
}

/// Hands a cloud message to the edge modules. An object is acknowledged
/// only once every module of its group has confirmed it (metamanager
/// confirms after its commit); a module that does not confirm resets the
/// link, so the cloud sends the object again.
async fn deliver(
    msg: HiveMessage,
    sender: &LinkSender,
    hive: &Hive,
    config: &Arc<EdgeHubConfig>,
    stats: &Arc<EdgeHubStats>,
) {
    stats.count(&stats.downstream);
    if crate::protocol::is_answer(hive, &msg) {
        hive.send_resp(msg);
        return;
    }
    let target = route(msg.group()).to_owned();
    if msg.operation() == operation::QUERY {
        // The cloud asks: the module that knows answers, and the answer
        // goes back up the link.
        let (hive, sender, timeout) = (hive.clone(), sender.clone(), config.persist_timeout);
        actix::spawn(async move {
            let mut answer = match hive.send_to_group_sync(&target, msg.clone(), timeout).await {
                Ok(mut answers) if !answers.is_empty() => answers.swap_remove(0).1,
                Ok(_) => msg.error_response(module::EDGEHUB, "nobody here answers that"),
                Err(err) => msg.error_response(module::EDGEHUB, err.to_string()),
            };
            // Group members answer copies with ids of their own; the cloud
            // waits for an answer to its question's id.
            answer.header.parent_id = Some(msg.id());
            if sender.try_send(&answer, Lane::Ordered).is_err() {
                debug!("answer to the cloud not sent");
            }
        });
        return;
    }
    if !protocol::needs_ack(&msg) {
        if let Err(err) = hive.send_to_group(&target, msg).await {
            debug!(error = %err, "cloud message not delivered");
        }
        return;
    }
    let ack = config.dialect.ack(&msg);
    let hive = hive.clone();
    let sender = sender.clone();
    let stats = stats.clone();
    let timeout = config.persist_timeout;
    actix::spawn(async move {
        let confirmed = match hive.send_to_group_sync(&target, msg, timeout).await {
            Ok(responses) => match responses
                .iter()
                .find(|(_, r)| r.operation() == operation::ERROR)
            {
                // Not stored, but it may be next time: do not acknowledge.
                Some((module, failure)) if failure.is_retryable() => {
                    Confirmation::NotYet(format!("{module}: {}", failure.content()))
                }
                // A module looked at it and said no: resending cannot help.
                Some((module, refusal)) => {
                    Confirmation::Refused(format!("{module}: {}", refusal.content()))
                }
                None => Confirmation::Persisted,
            },
            // No module of that group was ever started on this edge: nobody
            // here takes this kind of object. (A group whose modules have
            // stopped, as during shutdown, is not that: the object must come
            // again.)
            Err(err @ beehive::Error::UnknownGroup(_))
                if hive.modules().iter().all(|module| module.group != target) =>
            {
                Confirmation::Refused(err.to_string())
            }
            Err(err) => Confirmation::NotYet(err.to_string()),
        };
        match confirmed {
            Confirmation::Persisted | Confirmation::Refused(_) => {
                if let Confirmation::Refused(reason) = &confirmed {
                    warn!(%reason, "object refused by the edge; acknowledged so it is not resent forever");
                    stats.count(&stats.refused);
                }
                if sender.try_send(&ack, Lane::Ordered).is_ok() || sender.send(&ack).await.is_ok() {
                    stats.count(&stats.acks_sent);
                }
            }
            Confirmation::NotYet(reason) => {
                // Not stored in time: reset the link, the cloud sends it again.
                warn!(%reason, "object not confirmed in time; resetting the link");
                stats.count(&stats.unconfirmed);
                sender.close().await;
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(resource: &str, version: u64) -> HiveMessage {
        HiveMessage::new()
            .build_router("edged", "resource", resource, "update")
            .with_resource_version(version.to_string())
    }

    /// `cloud.example:10000` resolves to three replicas (one repeated),
    /// `gone.example` to nothing; anything else to itself.
    fn fake_resolver(
        address: String,
    ) -> futures_util::future::BoxFuture<'static, std::io::Result<Vec<std::net::SocketAddr>>> {
        Box::pin(async move {
            match address.as_str() {
                "cloud.example:10000" => Ok([
                    "127.0.0.2:10000",
                    "127.0.0.3:10000",
                    "127.0.0.2:10000",
                    "[::1]:10000",
                ]
                .iter()
                .filter_map(|a| a.parse().ok())
                .collect()),
                "gone.example:10000" => Err(std::io::Error::other("no such host")),
                other => Ok(other.parse().into_iter().collect()),
            }
        })
    }

    #[actix::test]
    async fn a_name_resolving_to_several_replicas_is_dialled_at_each_in_turn() {
        let configured = [
            "cloud.example:10000",
            "127.0.0.9:10001",
            "gone.example:10000",
        ];
        let mut addresses =
            CloudAddresses::new(configured.iter().map(|a| a.to_string()).collect(), true);
        addresses.resolve = fake_resolver;
        let mut dialled = Vec::new();
        for _ in 0..12 {
            dialled.push(addresses.next().await);
        }
        let round = [
            "127.0.0.2:10000",
            "127.0.0.3:10000",
            "[::1]:10000",
            "127.0.0.9:10001",
            // Unresolved: dialled as given, for the transport to say why.
            "gone.example:10000",
        ];
        let expected: Vec<&str> = round.iter().cycle().take(12).copied().collect();
        assert_eq!(dialled, expected);
    }

    #[actix::test]
    async fn socket_paths_are_not_resolved() {
        let mut addresses = CloudAddresses::new(vec!["/run/cloud.sock".to_owned()], false);
        addresses.resolve = fake_resolver;
        assert_eq!(addresses.next().await, "/run/cloud.sock");
        assert_eq!(addresses.next().await, "/run/cloud.sock");
    }

    #[test]
    fn the_offline_buffer_keeps_the_latest_per_object_in_order() {
        let mut buffer = OfflineBuffer::new(10);
        buffer.push(status("default/podstatus/a", 1));
        buffer.push(status("default/podstatus/b", 1));
        buffer.push(status("default/podstatus/a", 2));
        assert_eq!(buffer.len(), 2);
        let first = buffer.pop().expect("a");
        assert_eq!(
            (first.resource(), first.resource_version()),
            ("default/podstatus/a", "2")
        );
        assert_eq!(buffer.pop().expect("b").resource(), "default/podstatus/b");
        assert!(buffer.pop().is_none());
    }

    #[test]
    fn a_full_offline_buffer_drops_the_oldest() {
        let mut buffer = OfflineBuffer::new(2);
        assert!(!buffer.push(status("ns/t/a", 1)));
        assert!(!buffer.push(status("ns/t/b", 1)));
        assert!(buffer.push(status("ns/t/c", 1)));
        assert_eq!(buffer.pop().expect("b").resource(), "ns/t/b");
    }

    #[test]
    fn backoff_grows_is_capped_and_jittered() {
        let config = EdgeHubConfig {
            reconnect_initial: Duration::from_millis(100),
            reconnect_max: Duration::from_secs(2),
            ..EdgeHubConfig::new("n", TransportKind::UnixSocket, DialOptions::new("/x", "x"))
        };
        for attempt in 0..30 {
            let delay = config.backoff(attempt);
            let full = (Duration::from_millis(100) * 2u32.pow(attempt.min(20)))
                .min(Duration::from_secs(2));
            assert!(
                delay <= full && delay >= full / 2,
                "attempt {attempt}: {delay:?}"
            );
        }
    }

    #[test]
    fn cloud_groups_route_to_edge_modules() {
        assert_eq!(route("resource"), group::META);
        assert_eq!(route("user"), group::BUS);
        assert_eq!(route("twin"), group::TWIN);
    }
}
