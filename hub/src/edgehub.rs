//! edgehub: the edge node's one link to the cloud. It reconnects with
//! exponential backoff and jitter, routes cloud messages to the edge modules
//! by group, acknowledges an object only after the module that keeps it has
//! persisted it, and keeps what must not be lost while the cloud is gone.

mod link;

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use beehive::Message as HiveMessage;
use beehive::constants::{group, module, operation};
use beehive::{Hive, Module, ModuleError};
use link::connect_loop;
use tokio::sync::{Notify, watch};
use tracing::warn;
use transports::{DialOptions, Lane, LinkSender, TransportError, TransportKind};

use crate::dialect::Dialect;
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

#[cfg(test)]
mod tests {
    use super::*;

    fn status(resource: &str, version: u64) -> HiveMessage {
        HiveMessage::new()
            .build_router(
                "edged",
                "resource",
                beehive::SmolStr::new(resource),
                "update",
            )
            .with_resource_version(version.to_string())
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
