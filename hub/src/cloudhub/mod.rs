//! cloudhub: listens on every configured transport, runs one `NodeSession`
//! actor per connected node, and keeps a reliable, coalescing, windowed and
//! persisted downstream queue per node.
//!
//! This file is the `CloudHub` actor: its configuration, the messages cloud
//! modules hand it for nodes ([`crate::NodeLinks`]) and their outcomes, and
//! the queues. Beside it: `session` (links coming in, the session actor)
//! and `lifecycle` (what sessions tell the hub).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use beehive::constants::{group, module, operation};
use beehive::resource::EdgeResource;
use beehive::{Content, Hive, Message as HiveMessage, Module, ModuleError};
use tokio::sync::{oneshot, watch};
use tracing::{debug, error, info, warn};
use transports::{
    Admission, AdmissionCheck, Lane, Link, LinkSender, Listener, PeerIdentity, Received,
    TransportError, TransportKind,
};

use crate::HubError;
use crate::admission::LinkRefusal;
use crate::dialect::Dialect;
use crate::events::{NodeEvent, NodeEventKind};
use crate::links::{Delivered, Delivery, Outcome, Refusal, ToNode};
use crate::protocol::{self, Hello, Kind};
use crate::queue::{AckOutcome, NodeQueue, PushOutcome};
use crate::stats::HubStats;
use crate::store::QueueStore;

mod config;
mod lifecycle;
mod session;
mod sessions;

pub use config::{CloudEndpoint, CloudHubConfig};

use lifecycle::{Acked, ClaimLost, NewSessionId, SessionDown, SessionUp};
use session::{accept_loop, admission};
use sessions::{Session, SessionBook};

/// What a running cloudhub tells its owner.
#[derive(Clone)]
pub struct CloudHubHandle {
    /// The bound address of each endpoint, in configuration order.
    pub addresses: Vec<(TransportKind, String)>,
    /// Counters.
    pub stats: Arc<HubStats>,
    /// Streams to the nodes linked here (logs, exec, port-forward, ...).
    pub streams: stream::NodeTunnels,
}

/// How often live links are checked against the revoked nodes.
const REVOCATION_CHECK: Duration = Duration::from_secs(1);

/// How long a session's queue waits at most for the record of what it
/// held at the start.
const RECORD_TIMEOUT: Duration = Duration::from_secs(5);

/// The cloudhub module.
pub struct CloudHub {
    hive: Hive,
    config: Arc<CloudHubConfig>,
    listeners: Vec<(CloudEndpoint, Listener)>,
    queues: HashMap<String, NodeQueue>,
    /// Which link is each node's, and since when the others are gone.
    book: SessionBook<LinkSender>,
    store: Option<QueueStore>,
    stats: Arc<HubStats>,
    pending_total: usize,
    /// Tells the accept loops to stop and release their addresses.
    stop_accepting: watch::Sender<bool>,
    accepting: Vec<tokio::task::JoinHandle<()>>,
    tunnels: stream::NodeTunnels,
}

/// Where the outcome of a message for a node goes.
enum Responder {
    /// Nobody waits.
    Nobody,
    /// A beehive `send_sync`, answered with this response.
    Hive(Box<HiveMessage>),
    /// A [`NodeLinks`](crate::NodeLinks) sender.
    Typed(oneshot::Sender<Outcome>),
}

impl Responder {
    /// Tells the outcome; through beehive, a delivery is
    /// `{"outcome": "queued"}` (and the like) and a refusal an `error`
    /// operation with its reason ([`Refusal::reply`]).
    fn answer(self, hive: &Hive, outcome: Outcome) {
        match self {
            Responder::Nobody => {}
            Responder::Typed(tx) => {
                let _ = tx.send(outcome);
            }
            Responder::Hive(reply) => {
                let reply = *reply;
                let reply = match outcome {
                    Ok(delivery) => reply.with_content(Delivered { outcome: delivery }.content()),
                    Err(refusal) => refusal.reply(reply),
                };
                let _ = hive.send_resp(reply);
            }
        }
    }
}

impl Handler<ToNode> for CloudHub {
    type Result = ();

    fn handle(&mut self, item: ToNode, ctx: &mut Context<Self>) {
        let responder = match item.outcome {
            Some(tx) => Responder::Typed(tx),
            None => Responder::Nobody,
        };
        self.for_node(item.msg, responder, ctx);
    }
}

impl CloudHub {
    /// Binds every endpoint, opens the queue store and starts the cloudhub
    /// module in `hive`. Fails if an address cannot be bound.
    pub async fn start(hive: &Hive, config: CloudHubConfig) -> Result<CloudHubHandle, HubError> {
        let mut listeners = Vec::new();
        let mut addresses = Vec::new();
        let stats = Arc::new(HubStats::default());
        for endpoint in &config.endpoints {
            let transport = endpoint.kind.transport()?;
            let options = endpoint
                .dialect
                .listen_options(endpoint.options.clone())
                .with_admission(admission(endpoint, stats.clone()));
            let listener = transport.listen(&options).await?;
            info!(kind = %endpoint.kind, dialect = %endpoint.dialect, address = listener.local_addr(), "cloudhub listening");
            addresses.push((endpoint.kind, listener.local_addr().to_owned()));
            listeners.push((endpoint.clone(), listener));
        }
        let store = match &config.store {
            Some(path) => Some(QueueStore::open(path)?),
            None => None,
        };
        let mut first = Some((listeners, store));
        let config = Arc::new(config);
        let hub_stats = stats.clone();
        let streams = config.streams.clone();
        let tunnels = streams.clone();
        hive.start_module(move |hive| {
            // The listeners and store go to the first instance; cloudhub
            // is not restarted (its sockets would be gone).
            let (listeners, store) = first.take().unwrap_or_default();
            CloudHub {
                hive: hive.clone(),
                config: config.clone(),
                listeners,
                queues: HashMap::new(),
                book: SessionBook::default(),
                store,
                stats: hub_stats.clone(),
                pending_total: 0,
                stop_accepting: watch::channel(false).0,
                accepting: Vec::new(),
                tunnels: tunnels.clone(),
            }
        })?;
        Ok(CloudHubHandle {
            addresses,
            stats,
            streams,
        })
    }

    fn queue(&mut self, node: &str) -> &mut NodeQueue {
        let (window, max) = (self.config.window, self.config.max_objects_per_node);
        self.queues
            .entry(node.to_owned())
            .or_insert_with(|| NodeQueue::new(window, max))
    }

    /// Publishes the number of objects held in memory, kept up to date
    /// from the queues' own lengths before and after each change.
    fn adjust_pending(&mut self, before: usize, after: usize) {
        self.pending_total = (self.pending_total + after).saturating_sub(before);
        self.stats.set_pending(self.pending_total as u64);
    }

    fn queue_len(&self, node: &str) -> usize {
        self.queues.get(node).map_or(0, NodeQueue::len)
    }

    /// Puts as much of `node`'s queue on the wire as its window allows.
    fn pump(&mut self, node: &str, ctx: &mut Context<Self>) {
        let Some(session) = self.book.ready(node) else {
            return;
        };
        let sender = session.sender.clone();
        let Some(queue) = self.queues.get_mut(node) else {
            return;
        };
        let mut batch = queue.next_batch().into_iter();
        let mut dropped = Vec::new();
        let mut retry = false;
        while let Some(msg) = batch.next() {
            // Within the session's own limit: endpoints may differ.
            match sender.try_send(&msg, Lane::Ordered) {
                Ok(()) => self.stats.count(&self.stats.downstream_sent),
                Err(TransportError::Frame(err)) => {
                    // It can never be sent: drop it rather than block the node.
                    warn!(%node, resource = msg.resource(), error = %err, "object cannot be sent; dropped");
                    if let AckOutcome::Delivered { resource, .. } = queue.ack(msg.id()) {
                        dropped.push(resource);
                    }
                }
                Err(err) => {
                    // No room (try again shortly) or the session is going away
                    // (its SessionDown resends): this message and the rest of
                    // the batch go back, in order.
                    retry = matches!(err, TransportError::QueueFull);
                    let unsent: Vec<_> = std::iter::once(msg).chain(batch.by_ref()).collect();
                    for msg in unsent.iter().rev() {
                        queue.requeue(msg.id());
                    }
                    break;
                }
            }
        }
        for resource in dropped {
            if let Some(store) = &self.store {
                store.remove(node, &resource);
            }
            self.pending_total = self.pending_total.saturating_sub(1);
            self.stats.set_pending(self.pending_total as u64);
        }
        if retry {
            let node = node.to_owned();
            ctx.run_later(Duration::from_millis(5), move |hub, ctx| {
                hub.pump(&node, ctx)
            });
        }
    }

    /// A message for a node. An object (it carries a resource version) is
    /// queued until the node acknowledges it, and its outcome is told once
    /// it is committed to the queue store, so a [`Delivery::Queued`]
    /// object survives a crash of the cloud. Anything else goes on the
    /// node's link now or never; a query sent through beehive is answered
    /// by the node, or refused here if it has no link.
    fn for_node(&mut self, msg: HiveMessage, responder: Responder, ctx: &mut Context<Self>) {
        let Some((node, mut msg)) = protocol::to_edge(msg) else {
            self.stats.count(&self.stats.unroutable);
            debug!("downstream message without node/<node>/ in its resource; dropped");
            responder.answer(&self.hive, Err(Refusal::NoNode));
            return;
        };
        msg.header.sync = false;
        if !protocol::needs_ack(&msg) {
            // Responses, events and queries: now or never.
            let sent = self
                .book
                .get(&node)
                .is_some_and(|session| session.sender.try_send(&msg, Lane::Ordered).is_ok());
            if !sent {
                self.stats.count(&self.stats.unroutable);
            }
            let answered_by_node =
                msg.operation() == operation::QUERY && matches!(responder, Responder::Hive(_));
            match sent {
                true if answered_by_node => {}
                true => responder.answer(&self.hive, Ok(Delivery::Sent)),
                false => responder.answer(&self.hive, Err(Refusal::NotLinked(node))),
            }
            return;
        }
        self.load_from_store(&node);
        let before = self.queue_len(&node);
        let pushed = self.queue(&node).push(msg.clone());
        match pushed {
            PushOutcome::Queued | PushOutcome::Coalesced => {
                if let Some(store) = &self.store {
                    store.put(&node, &msg);
                }
                if msg.operation() == operation::DELETE
                    && let Some(acks) = self.acks_of(&node)
                {
                    acks.unsure(&node, msg.resource());
                }
                let after = self.queue_len(&node);
                self.adjust_pending(before, after);
                if self.book.linked(&node) {
                    self.pump(&node, ctx);
                } else {
                    // Absent (perhaps never seen): the gone-long policy applies.
                    self.book.absent(&node, Instant::now());
                }
            }
            PushOutcome::Stale => self.stats.count(&self.stats.stale),
            PushOutcome::Full => {
                self.stats.count(&self.stats.queue_full);
                warn!(%node, "node queue full; object refused (the node needs a resync)");
            }
        }
        self.confirm(responder, &node, pushed);
    }

    /// Answers who waits for an object's outcome once it is durable.
    fn confirm(&self, responder: Responder, node: &str, pushed: PushOutcome) {
        if matches!(responder, Responder::Nobody) {
            return;
        }
        let outcome = match pushed {
            PushOutcome::Queued => Ok(Delivery::Queued),
            PushOutcome::Coalesced => Ok(Delivery::Coalesced),
            PushOutcome::Stale => Ok(Delivery::Stale),
            PushOutcome::Full => Err(Refusal::QueueFull(node.to_owned())),
        };
        let hive = self.hive.clone();
        let store = self.store.clone().filter(|_| outcome.is_ok());
        actix::spawn(async move {
            let outcome = match store {
                Some(store) => match store.flush().await {
                    Ok(()) => outcome,
                    Err(err) => Err(Refusal::NotDurable(err.to_string())),
                },
                None => outcome,
            };
            responder.answer(&hive, outcome);
        });
    }

    /// Tells the node events that `node`'s session here ended; `served`
    /// false when this replica no longer holds the node (another may serve
    /// it already: nothing is to be said of it from here).
    fn node_gone(&self, node: &str, served: bool) {
        let kind = match served {
            true => NodeEventKind::Disconnected,
            false => NodeEventKind::ServedElsewhere,
        };
        self.node_event(node, kind);
    }

    /// The sink told what `node` acknowledges: only for nodes that report
    /// no inventory (`None` also when none is configured). A node without
    /// a session here counts as one: it may be.
    fn acks_of(&self, node: &str) -> Option<&Arc<dyn crate::AckSink>> {
        let reports = self
            .book
            .get(node)
            .is_some_and(|session| session.dialect.reports_inventory());
        self.config.acks.as_ref().filter(|_| !reports)
    }

    /// Whether this replica holds `node` (always, without claims).
    fn holds(&self, node: &str) -> bool {
        self.config
            .claims
            .as_ref()
            .is_none_or(|claims| claims.holds(node))
    }

    fn node_event(&self, node: &str, kind: NodeEventKind) {
        // Nobody may be listening; that is fine.
        self.config.node_events.publish(NodeEvent {
            node: node.to_owned(),
            kind,
        });
    }

    /// Tells the node events that `node` acknowledged the deletion of
    /// `resource` (`<namespace>/<type>/<name>`).
    fn delivered(&self, node: &str, resource: &str) {
        match resource.parse::<EdgeResource>() {
            Ok(resource) => self.node_event(node, NodeEventKind::Deleted(resource)),
            Err(err) => {
                debug!(%node, resource, error = %err, "a deletion acknowledged for no object")
            }
        }
    }

    /// Sends again what nodes that may drop messages (KubeEdge's) left
    /// unacknowledged too long.
    fn resend_overdue(&mut self, ctx: &mut Context<Self>) {
        let now = Instant::now();
        let nodes: Vec<String> = self
            .book
            .iter()
            // A link still writing what it was given is slow, not lossy:
            // its objects are not overdue yet.
            .filter(|(_, session)| {
                session.dialect.resends_unacknowledged() && session.sender.queued() == 0
            })
            .map(|(node, _)| node.clone())
            .collect();
        for node in nodes {
            let overdue = self
                .queues
                .get_mut(&node)
                .map_or(0, |queue| queue.resend_overdue(now));
            if overdue > 0 {
                debug!(%node, overdue, "unacknowledged objects sent again");
                self.stats.add(&self.stats.resent, overdue as u64);
                self.pump(&node, ctx);
            }
        }
    }

    /// Closes the links of nodes whose certificate was revoked since
    /// they connected (their Node deleted): they are refused when they
    /// connect again.
    fn close_revoked(&mut self) {
        let Some(ledger) = &self.config.revocations else {
            return;
        };
        if !self.book.any_revocable() {
            return;
        }
        let revocations = ledger.revocations();
        for (node, sender) in self
            .book
            .revoked(|node, issued| revocations.revoked(node, issued))
        {
            warn!(%node, "the node's certificate was revoked (the node was deleted); its link is closed");
            let sender = sender.clone();
            actix::spawn(async move { sender.close().await });
        }
    }

    /// Drops the in-memory queues of nodes gone longer than `evict_after`.
    fn evict_gone(&mut self) {
        for node in self
            .book
            .gone_longer_than(self.config.evict_after, Instant::now())
        {
            if self.store.is_some() {
                // Still in the store; loaded again when the node returns.
                let before = self.queue_len(&node);
                self.queues.remove(&node);
                self.adjust_pending(before, 0);
                info!(%node, "queue of a long-gone node evicted from memory");
            }
        }
    }

    fn load_from_store(&mut self, node: &str) {
        let Some(store) = &self.store else { return };
        if self.queues.contains_key(node) {
            return;
        }
        match store.load_node(node) {
            Ok(objects) => {
                for msg in objects {
                    self.queue(node).push(msg);
                }
                let after = self.queue_len(node);
                self.adjust_pending(0, after);
            }
            Err(err) => warn!(%node, error = %err, "could not load the node's queue"),
        }
    }
}

impl Actor for CloudHub {
    type Context = Context<Self>;
}

impl Module for CloudHub {
    fn name(&self) -> &str {
        module::CLOUDHUB
    }

    fn group(&self) -> &str {
        group::HUB
    }

    fn init(&mut self, ctx: &mut Context<Self>) {
        if let Some(store) = &self.store {
            match store.load() {
                Ok(objects) => {
                    let count = objects.len();
                    for (node, msg) in objects {
                        self.queue(&node).push(msg);
                        self.book.absent(&node, Instant::now());
                    }
                    info!(objects = count, "downstream queues loaded");
                    let held: usize = self.queues.values().map(NodeQueue::len).sum();
                    self.adjust_pending(0, held);
                }
                Err(err) => warn!(error = %err, "could not load downstream queues"),
            }
        }
        for (endpoint, listener) in std::mem::take(&mut self.listeners) {
            self.accepting.push(actix::spawn(accept_loop(
                listener,
                endpoint,
                self.stop_accepting.subscribe(),
                ctx.address(),
                self.hive.clone(),
                self.config.clone(),
                self.stats.clone(),
            )));
        }
        // Only the first instance gets the channel from the cloud modules
        // (cloudhub is not restarted: its sockets and store would be gone).
        match self.config.links.take_inbox() {
            Some(inbox) => {
                ctx.add_message_stream(futures_util::stream::unfold(
                    inbox,
                    |mut inbox| async move { inbox.recv().await.map(|item| (item, inbox)) },
                ));
            }
            None => error!(
                "cloudhub started again: the cloud modules' channel went with the first instance, so nothing reaches nodes"
            ),
        }
        if let Some(claims) = &self.config.claims {
            ctx.add_message_stream(futures_util::StreamExt::map(
                claims.lost(),
                |(node, generation)| ClaimLost { node, generation },
            ));
        }
        let evict_every = (self.config.evict_after / 4).max(Duration::from_secs(1));
        ctx.run_interval(evict_every, |hub, _| hub.evict_gone());
        let resend_check = (self.config.kubeedge_resend_after / 4).max(Duration::from_millis(100));
        ctx.run_interval(resend_check, |hub, ctx| hub.resend_overdue(ctx));
        if self.config.revocations.is_some() {
            ctx.run_interval(REVOCATION_CHECK, |hub, _| hub.close_revoked());
        }
    }

    /// A message for a node through beehive; one sent with `send_sync` is
    /// answered as [`CloudHub::for_node`] says.
    fn handle(&mut self, msg: HiveMessage, ctx: &mut Context<Self>) -> Result<(), ModuleError> {
        let responder = match msg.is_sync() {
            true => Responder::Hive(Box::new(msg.response(module::CLOUDHUB, Content::Empty))),
            false => Responder::Nobody,
        };
        self.for_node(msg, responder, ctx);
        Ok(())
    }

    fn cleanup(&mut self, _ctx: &mut Context<Self>) -> ResponseActFuture<Self, ()> {
        let senders: Vec<LinkSender> = self.book.drain();
        let store = self.store.take();
        self.stop_accepting.send_replace(true);
        let accepting = std::mem::take(&mut self.accepting);
        Box::pin(
            async move {
                for accept in accepting {
                    let _ = accept.await;
                }
                for sender in senders {
                    sender.close().await;
                }
                if let Some(store) = store {
                    // Everything committed and the file released, so a new
                    // cloudhub (a restart) can open it at once.
                    store.close().await;
                }
            }
            .into_actor(self),
        )
    }
}
