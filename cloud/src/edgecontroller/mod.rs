//! The cloud's edgecontroller: it watches the desired state (through
//! [`DesiredState`]), sends each node what it needs and nothing else, and
//! takes the nodes' status.
//!
//! Its decisions are [`reconciler::Reconciler`]'s, a state machine with no
//! I/O; this module is the I/O around it: the watches that feed it, the
//! messages it asks to send (through cloudhub, which answers once a message
//! is persisted in the node's queue), the inventories it asks nodes for,
//! and the writes of node and object status.
//!
//! Downstream: a pod with `spec.nodeName` goes to that node; a configmap or
//! secret goes to every node that runs a pod referencing it, and is
//! withdrawn from a node when no pod there references it any more;
//! deletions go down too. Every message carries a revision as its resource
//! version, so the edge applies each once and in order.
//!
//! Upstream: pod status (only from the node the pod is bound to), device
//! status (edgehive's `devicestatus`, a KubeEdge devicetwin's twin and
//! state reports, see [`twin_reports`]; only from the device's node) and
//! node status are written through the status door of the desired state; a
//! node's `Ready` condition follows its link (cloudhub's connect and
//! keepalive events) and what the node reports.
//!
//! All of it runs in one task that takes, in arrival order, watch events,
//! nodes' messages (through the `edgecontroller` beehive module), cloudhub's
//! typed node events ([`hub::NodeEvents`]), inventory answers and delivery
//! cursors (what KubeEdge nodes acknowledged, where replicas record it).
//! What it sends to nodes goes on cloudhub's [`hub::NodeLinks`].
//!
//! This file is the task and its sends; beside it, by concern: `nodes`
//! (a node's Node and Lease, nodes no replica holds; their rules in
//! `adoption` and `leases`), `answers` (what nodes' requests are answered
//! with), `status_reports` (statuses nodes report, batched for the status
//! writer).

mod adoption;
mod answers;
mod bound;
pub mod eviction;
pub mod kubeedge;
mod leases;
mod nodes;
pub mod reconciler;
mod requests;
mod status_reports;
pub mod status_writer;
mod toleration_writer;

use crate::cloudstream::KubeletEndpoint;
use crate::devicecontroller::twin_sync;
pub(crate) use answers::send_to_node;
use requests::{NodeRequest, Read};
use status_reports::{STATUS_BATCH, StatusReport};

use std::collections::{BTreeMap, HashMap, HashSet};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use beehive::constants::{group, module, operation, resource_type};
use beehive::resource::{CloudResource, EdgeResource};
use beehive::{Hive, Message as HiveMessage, TaskDoor};
use futures_util::{Stream, StreamExt};
use hub::{Dialect, NodeEvent, NodeEventKind, NodeEvents, NodeLinks, Outcome};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::{mpsc, oneshot, watch};
use tracing::{debug, info, warn};

use apis::api::ApiError;
use apis::devices::Device;
use apis::kinds::{Kind, ObjectKey, valid_name};
use apis::termination::PodTerminated;

use crate::desired::packed::Packed;
use crate::desired::{DesiredError, DesiredState, WatchEvent, WatchStream, revision_of};
use apis::manifest;
use kubeedge::Refusal;
use leases::{LeaseBook, RenewalRounds};
pub use reconciler::Acked;
use reconciler::{Action, FOLLOWED, NodeDialect, Op, Reconciler, Termination, Version};
use status_writer::{StatusWrites, Ticket, WriterConfig};
use toleration_writer::TolerationWriter;

/// How the controller runs.
#[derive(Debug, Clone)]
pub struct ControllerConfig {
    /// How long cloudhub may take to queue (and persist) one message for a
    /// node before the controller logs it as not sent.
    pub send_timeout: Duration,
    /// Requests waiting for the controller before callers wait for room.
    pub inbox: usize,
    /// How often nodes that missed a message are reconciled, and a watch
    /// that failed is started again.
    pub retry_every: Duration,
    /// How often connected nodes' heartbeat Leases are renewed (where the
    /// desired state keeps them: in Kubernetes, `kube-node-lease`), and
    /// how long each renewal holds.
    pub lease_every: Duration,
    /// How long a renewal holds (a kubelet's default: 40 s).
    pub lease_duration: Duration,
    /// Where the desired state evicts pods of NotReady nodes (Kubernetes):
    /// how long pods bound to an edge node whose link is down are kept
    /// before they may be evicted (`None`: never). See [`eviction`].
    pub offline_grace: Option<Duration>,
    /// With several replicas: send only to nodes linked to this replica.
    /// A node that links here is brought in step from its inventory, so it
    /// is sent what it lacks, not everything this replica would have
    /// queued while another served it. Off (one cloudcore), every node's
    /// queue is kept, linked or not, and delivered when it returns.
    pub send_to_linked_only: bool,
    /// Where what KubeEdge nodes acknowledged is recorded (a delivery
    /// cursor per node; replicas on etcd): a KubeEdge node that links here
    /// is sent what it lacks by that record, not everything again.
    pub cursors: Option<Arc<dyn DeliveryCursors>>,
    /// With several replicas: this replica's claims on nodes. A node's
    /// status is written as its holder only while this replica holds it;
    /// a node it does not hold is marked unreachable only when no replica
    /// holds it, and only if nobody wrote its Node since this replica read
    /// it (a write conditioned on that version), so a stale mark never
    /// overwrites the status the node's new holder wrote.
    pub claims: Option<Arc<dyn NodeHolders>>,
    /// With claims: how often Nodes shown linked but served by no replica
    /// (their replica died, and they did not link again) are looked for
    /// and marked unreachable.
    pub sweep_every: Duration,
    /// Kubernetes mode with the kubelet API on: the address and port
    /// written into the status of the nodes this controller serves, so
    /// kube-apiserver reaches their kubelet API here.
    pub kubelet_endpoint: Option<KubeletEndpoint>,
    /// Kubernetes mode: who service account tokens are and what they may
    /// read, for edges' MetaServers with `requireAuthorization`. `None`:
    /// every token is refused (no API server issues them).
    pub token_access: Option<crate::reviews::TokenAccess>,
    /// How status writes (pods', devices', nodes') are paced, off the
    /// delivery path (see [`status_writer`]). `None`: as the store needs,
    /// a kubelet's budget ([`WriterConfig::default`]) where it shares an
    /// API server's ([`DesiredState::shares_request_budget`]), unpaced
    /// ([`WriterConfig::unpaced`]) where it is local.
    pub status_writes: Option<WriterConfig>,
}

/// Where the controller reads what a node acknowledged: its delivery
/// cursor, resource (`<namespace>/<type>/<name>`) to what it holds.
pub trait DeliveryCursors: Send + Sync + 'static {
    /// `node`'s cursor, or why it cannot be read.
    fn read(
        &self,
        node: &str,
    ) -> futures_util::future::BoxFuture<'static, Result<BTreeMap<String, Acked>, String>>;
}

/// Which replica holds a node (replicas' claims, as `hub::NodeClaims`
/// keeps them), as the controller asks it.
pub trait NodeHolders: Send + Sync + 'static {
    /// Whether this replica holds `node` now.
    fn holds(&self, node: &str) -> bool;

    /// Of `nodes`, those no replica holds now, as the engine says.
    fn unclaimed(
        &self,
        nodes: Vec<String>,
    ) -> futures_util::future::BoxFuture<'static, Result<Vec<String>, String>>;
}

impl std::fmt::Debug for dyn NodeHolders {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("NodeHolders")
    }
}

impl std::fmt::Debug for dyn DeliveryCursors {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DeliveryCursors")
    }
}

impl Default for ControllerConfig {
    fn default() -> Self {
        ControllerConfig {
            send_timeout: Duration::from_secs(10),
            inbox: 1024,
            retry_every: Duration::from_secs(10),
            lease_every: Duration::from_secs(10),
            lease_duration: Duration::from_secs(40),
            offline_grace: Some(Duration::from_secs(24 * 3600)),
            send_to_linked_only: false,
            cursors: None,
            claims: None,
            sweep_every: Duration::from_secs(30),
            kubelet_endpoint: None,
            token_access: None,
            status_writes: None,
        }
    }
}

/// What the controller has done, for tests and metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ControllerCounts {
    /// Messages queued for nodes.
    pub sent: u64,
    /// Messages cloudhub did not take.
    pub send_failures: u64,
    /// Status reports stored.
    pub status_applied: u64,
    /// Status reports refused (a node speaking for another, unknown pods).
    pub status_refused: u64,
    /// Queries from nodes answered.
    pub queries: u64,
    /// Status patches (KubeEdge's `nodepatch`, `podpatch`) applied.
    pub patches: u64,
    /// Node link events seen.
    pub node_events: u64,
    /// Watch events of the desired state handled.
    pub watch_events: u64,
    /// Times a watch could not resume and its kind was listed again.
    pub relists: u64,
    /// Node heartbeat Leases renewed.
    pub leases_renewed: u64,
    /// Delivery cursor reads answered (KubeEdge nodes brought in step from
    /// what they acknowledged, or, if it could not be read, by sending
    /// everything again; an answer for an earlier link is counted, not
    /// taken).
    pub cursors_read: u64,
    /// KubeEdge nodes' twin syncs (`membership/detail`) answered.
    pub twin_syncs: u64,
    /// Membership updates (a device joined or left a KubeEdge node's
    /// devices) put on nodes' links.
    pub memberships: u64,
    /// KubeEdge nodes' device reports (`twin/edge_updated`,
    /// `state/update`) stored and confirmed.
    pub device_reports: u64,
    /// Batches of messages queued at cloudhub and awaited together.
    pub send_batches: u64,
    /// Messages in those batches (over `send_batches`: the mean size).
    pub batched_sends: u64,
    /// The largest batch so far.
    pub largest_send_batch: u64,
    /// Pods whose offline tolerations the controller wrote (admission had
    /// not lengthened them), off the delivery path.
    pub tolerations_written: u64,
    /// Status writes that landed (pods', devices', nodes'), off the
    /// delivery path.
    pub status_written: u64,
    /// Statuses replaced by a newer one of the same object before they
    /// were written.
    pub status_coalesced: u64,
    /// Status writes the API server answered 429 (Too Many Requests).
    pub status_throttled: u64,
    /// Status writes tried again (after a 429 or a failure).
    pub status_retried: u64,
    /// Statuses dropped (their object gone, or refused for good).
    pub status_dropped: u64,
}

/// What an apply did.
#[derive(Debug, Clone, PartialEq)]
pub enum Applied {
    /// A new object, stored at this revision.
    Created(u64),
    /// A changed object, stored at this revision.
    Configured(u64),
    /// Nothing changed; the revision held.
    Unchanged(u64),
}

impl Applied {
    /// kubectl's word for it.
    pub fn verb(&self) -> &'static str {
        match self {
            Applied::Created(_) => "created",
            Applied::Configured(_) => "configured",
            Applied::Unchanged(_) => "unchanged",
        }
    }
}

enum Input {
    Hive(HiveMessage),
    /// cloudhub's word about a node's link.
    Node(NodeEvent),
    /// What a node reported holding, for its reconciliation.
    Inventory(String, Result<BTreeMap<String, String>, String>),
    /// What a KubeEdge node acknowledged, for the reconciliation of one
    /// of its links (a session).
    Cursor(String, u64, Result<BTreeMap<String, Acked>, String>),
    /// Nodes no replica holds, each with the version of its Node read
    /// before the claims were: to mark unreachable if still at it.
    Unclaimed(Vec<(String, String)>),
    /// Ends the task (dropping its store handle), then answers.
    Stop(oneshot::Sender<()>),
}

/// The revision up to which the controller has handled each kind's
/// changes (sent what they meant to the nodes' queues).
pub type Handled = HashMap<Kind, u64>;

/// A handle to a running controller: applies and deletes go to the
/// desired state and are answered once the controller has queued what they
/// mean for the nodes; reads go to the desired state.
#[derive(Clone)]
pub struct ControllerHandle {
    store: Arc<dyn DesiredState>,
    handled: watch::Receiver<Handled>,
    /// How long an apply waits for the controller to queue its objects.
    wait: Duration,
    /// What the controller has done so far.
    pub counts: watch::Receiver<ControllerCounts>,
    /// Where cloudhub tells the controller of its nodes' links.
    node_events: NodeEvents,
    /// Where the controller hands cloudhub messages for nodes.
    links: NodeLinks,
}

/// An object checked for an apply, packed until it is written
/// ([`ControllerHandle::admit`]).
#[derive(Debug)]
pub struct Admitted {
    key: ObjectKey,
    packed: Packed,
}

/// How often an apply writes a spec again over a status written meanwhile.
const APPLY_ATTEMPTS: usize = 5;

fn refused(err: DesiredError) -> ApiError {
    match err {
        DesiredError::NotFound { key } => {
            ApiError::Conflict(format!("{key} was deleted meanwhile"))
        }
        DesiredError::AlreadyExists { key } => {
            ApiError::Conflict(format!("{key} was created meanwhile"))
        }
        DesiredError::Conflict { key, reason } => ApiError::Conflict(format!("{key}: {reason}")),
        DesiredError::Invalid { reason, .. } => ApiError::Invalid(reason),
        other => ApiError::Unavailable(other.to_string()),
    }
}

impl ControllerHandle {
    /// The channel the controller hears cloudhub's node events on: give it
    /// to cloudhub ([`hub::CloudHubConfig::node_events`]).
    pub fn node_events(&self) -> NodeEvents {
        self.node_events.clone()
    }

    /// The channel the controller (and whoever answers nodes beside it,
    /// as the application center) hands cloudhub messages for nodes on:
    /// give it to cloudhub ([`hub::CloudHubConfig::links`]).
    pub fn node_links(&self) -> NodeLinks {
        self.links.clone()
    }

    /// Creates or replaces objects (status is the nodes' to set and is
    /// kept), as `kubectl apply` does, and answers once the controller has
    /// queued each for the nodes it goes to. Every object is checked first,
    /// against its kind and, for kinds bound to a node, against the node
    /// it is stored with; if one fails, none is applied.
    pub async fn apply(&self, objects: Vec<Value>) -> Result<Vec<(ObjectKey, Applied)>, ApiError> {
        let mut admitted = Vec::with_capacity(objects.len());
        for object in objects {
            let (key, object) = manifest::check(object)?;
            admitted.push(self.admit(key, object)?);
        }
        self.apply_admitted(admitted).await
    }

    /// Checks `object` (at `key`, as [`manifest::check`] gave it) against
    /// what is stored where that decides something (a pod's or a device's
    /// node is immutable), and packs it until it is written: thousands of
    /// objects in one manifest are not held as trees while they wait.
    pub fn admit(&self, key: ObjectKey, object: Value) -> Result<Admitted, ApiError> {
        // Read only where it decides something: an unchanged re-apply of
        // thousands of configmaps is otherwise one more read of each.
        if key.kind.bound_to_node()
            && let Some(stored) = self.store.get(&key).map_err(refused)?
            && let Some(bound) = node_name(&stored)
            && node_name(&object).as_deref() != Some(bound.as_str())
        {
            return Err(ApiError::Invalid(format!(
                "{key}: spec.nodeName is immutable once set (bound to {bound})"
            )));
        }
        let packed = Packed::pack(&object).map_err(refused)?;
        Ok(Admitted { key, packed })
    }

    /// [`apply`](Self::apply) of objects already admitted: all of them, or
    /// none if one was refused on the way (the first refusal).
    pub async fn apply_admitted(
        &self,
        checked: Vec<Admitted>,
    ) -> Result<Vec<(ObjectKey, Applied)>, ApiError> {
        let mut applied = Vec::with_capacity(checked.len());
        let mut written = Vec::new();
        for Admitted { key, packed } in checked {
            let mut object = packed.unpack().map_err(refused)?;
            let stored = match self.store.get(&key).map_err(refused)? {
                None => {
                    let created = self.store.create(object).await.map_err(refused)?;
                    (Applied::Created(revision_of(&created)), created)
                }
                Some(old) => {
                    // Written only over what was read; a node's status
                    // written meanwhile makes a conflict, and the spec is
                    // written again over what is stored now.
                    let mut held = revision_of(&old);
                    drop(old);
                    let mut attempts = 0;
                    let stored = loop {
                        object["metadata"]["resourceVersion"] = json!(held.to_string());
                        match self.store.replace(object.clone()).await {
                            Err(DesiredError::Conflict { .. }) if attempts < APPLY_ATTEMPTS => {
                                attempts += 1;
                                match self.store.get(&key).map_err(refused)? {
                                    Some(now) => held = revision_of(&now),
                                    None => {
                                        return Err(ApiError::Conflict(format!(
                                            "{key} was deleted meanwhile"
                                        )));
                                    }
                                }
                            }
                            written => break written.map_err(refused)?,
                        }
                    };
                    let revision = revision_of(&stored);
                    match revision == held {
                        true => (Applied::Unchanged(revision), stored),
                        false => (Applied::Configured(revision), stored),
                    }
                }
            };
            let (outcome, stored) = stored;
            // Waited for only where the controller hears of it: a kind it
            // follows, and an object its desired state passes on (in
            // Kubernetes mode, not a pod on a node that is no edge node).
            if let Applied::Created(revision) | Applied::Configured(revision) = outcome
                && FOLLOWED.contains(&key.kind)
                && self.store.passes_on(&stored)
            {
                written.push((key.kind, revision));
            }
            applied.push((key, outcome));
        }
        self.handled(written).await?;
        Ok(applied)
    }

    /// Deletes an object; `None` if there was none. Answered once the
    /// controller has queued the deletion for the nodes that hold it.
    pub async fn delete(&self, key: ObjectKey) -> Result<Option<Value>, ApiError> {
        let removed = self.store.delete(&key).await.map_err(refused)?;
        if let Some(removed) = &removed
            && FOLLOWED.contains(&key.kind)
            && self.store.passes_on(removed)
        {
            self.handled(vec![(key.kind, revision_of(removed))]).await?;
        }
        Ok(removed)
    }

    /// Waits until the controller has handled every `(kind, revision)`;
    /// an error if it stopped first (the writes are stored, and reach
    /// their nodes when they link to a running cloud, but were not queued:
    /// never answered as if they were).
    async fn handled(&self, written: Vec<(Kind, u64)>) -> Result<(), ApiError> {
        if written.is_empty() {
            return Ok(());
        }
        let mut handled = self.handled.clone();
        let done = handled.wait_for(|handled| {
            written
                .iter()
                .all(|(kind, revision)| handled.get(kind).is_some_and(|h| h >= revision))
        });
        match tokio::time::timeout(self.wait, done).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(_)) => {
                warn!("the edgecontroller stopped before queueing a write");
                Err(ApiError::Unavailable(
                    "the cloud is stopping: stored, but not queued for its node; it is sent when the node links to a running cloud".to_owned(),
                ))
            }
            Err(_) => {
                warn!(
                    wait = ?self.wait,
                    "the edgecontroller has not yet queued a write; answered anyway"
                );
                Ok(())
            }
        }
    }

    /// The desired state, for reads.
    pub fn store(&self) -> &Arc<dyn DesiredState> {
        &self.store
    }
}

/// The edgecontroller.
pub struct EdgeController;

impl EdgeController {
    /// Starts the controller on `store` in `hive` (inside an actix System):
    /// the `edgecontroller` module in the `resource` group, where nodes'
    /// messages arrive; cloudhub's node events come on the handle's
    /// [`ControllerHandle::node_events`]. It lists every kind it follows
    /// before it takes any message, then watches them.
    pub fn start(
        hive: &Hive,
        store: Arc<dyn DesiredState>,
        config: ControllerConfig,
    ) -> Result<ControllerHandle, beehive::Error> {
        let (inbox, requests) = mpsc::channel(config.inbox.max(1));
        let (counts_tx, counts) = watch::channel(ControllerCounts::default());
        let counts_tx = Arc::new(counts_tx);
        let tolerations = TolerationWriter::start(store.clone(), &config, counts_tx.clone());
        let links = NodeLinks::default();
        let status = StatusWrites::start(
            store.clone(),
            links.clone(),
            config.status_writes.clone().unwrap_or_else(|| {
                if store.shares_request_budget() {
                    WriterConfig::default()
                } else {
                    WriterConfig::unpaced()
                }
            }),
            counts_tx.clone(),
        );
        let (handled_tx, handled) = watch::channel(Handled::new());
        let wait = config.send_timeout * 2;
        let reconciler = Reconciler::new().with_cursors(config.cursors.is_some());
        let (renewals_ended, rounds_ended) = mpsc::unbounded_channel();
        let controller = Controller {
            hive: hive.clone(),
            links: links.clone(),
            store: store.clone(),
            config,
            inbox: inbox.clone(),
            reconciler,
            leases: LeaseBook::default(),
            watches: Watches::default(),
            tolerations,
            status,
            renewals: RenewalRounds::default(),
            renewals_ended,
            rounds_ended,
            counts: counts_tx,
            handled: handled_tx,
            twin_syncs: HashMap::new(),
        };
        actix::spawn(controller.run(requests));
        // The controller's doors: nodes' messages arrive in the resource
        // group, cloudhub's node events through a relay; stopping the main
        // door ends the controller, so a hive's shutdown releases the store.
        let main = TaskDoor::new(
            module::EDGECONTROLLER,
            group::RESOURCE,
            inbox.clone(),
            Input::Hive,
        )
        .stopping_with(Input::Stop);
        hive.start_module(move |_| main.clone())?;
        let node_events = NodeEvents::default();
        let mut events = node_events.subscribe();
        actix::spawn(async move {
            while let Some(event) = events.recv().await {
                if inbox.send(Input::Node(event)).await.is_err() {
                    break;
                }
            }
        });
        Ok(ControllerHandle {
            node_events,
            links,
            store,
            handled,
            wait,
            counts,
        })
    }
}

/// The most watch events handled before what they call for is carried out.
const WATCH_BATCH: usize = 1024;

/// The most sends queued at cloudhub before their commits are awaited.
const SEND_BATCH: usize = 512;

/// Whether cloudhub took a message, once it has answered.
type Taken = futures_util::future::BoxFuture<'static, bool>;

/// Sends queued at cloudhub whose answers are awaited together: per send,
/// the node, operation, object and version, and its answer to come
/// (`None`: it never reached cloudhub).
#[derive(Default)]
struct SendBatch {
    sends: Vec<(String, Op, ObjectKey, u64, Option<Taken>)>,
}

/// The watches of the followed kinds, polled in [`FOLLOWED`]'s order, so
/// that of changes waiting at once, what is referenced (configmaps,
/// secrets, models) is handled before what references it.
#[derive(Default)]
struct Watches {
    streams: Vec<(Kind, WatchStream)>,
}

impl Stream for Watches {
    type Item = (Kind, Result<WatchEvent, DesiredError>);

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let mut ended = None;
        for (index, (kind, stream)) in self.streams.iter_mut().enumerate() {
            match stream.poll_next_unpin(cx) {
                Poll::Ready(Some(item)) => return Poll::Ready(Some((*kind, item))),
                Poll::Ready(None) => {
                    ended = Some(index);
                    break;
                }
                Poll::Pending => {}
            }
        }
        if let Some(index) = ended {
            let (kind, _) = self.streams.remove(index);
            // A watch that ends is started again from a fresh list.
            return Poll::Ready(Some((kind, Err(DesiredError::Gone { since: 0 }))));
        }
        // Never ends: a controller without watches waits for its inbox.
        Poll::Pending
    }
}

/// The controller's state, owned by its task.
struct Controller {
    hive: Hive,
    /// Messages for nodes go to cloudhub here.
    links: NodeLinks,
    store: Arc<dyn DesiredState>,
    config: ControllerConfig,
    /// Its own inbox, for answers that arrive from spawned tasks.
    inbox: mpsc::Sender<Input>,
    reconciler: Reconciler,
    /// Each KubeEdge node's own Lease, answered from memory.
    leases: LeaseBook,
    watches: Watches,
    /// Lengthens offline tolerations of pods admission did not, off the
    /// delivery path.
    tolerations: TolerationWriter,
    /// Writes statuses, coalesced and paced, off the delivery path.
    status: StatusWrites,
    /// When heartbeat Leases are renewed; each round's end comes back
    /// through `renewals_ended` (one round at a time: one end at most).
    renewals: RenewalRounds,
    renewals_ended: mpsc::UnboundedSender<u64>,
    rounds_ended: mpsc::UnboundedReceiver<u64>,
    counts: Arc<watch::Sender<ControllerCounts>>,
    handled: watch::Sender<Handled>,
    /// KubeEdge nodes' twin syncs waiting for devices and models to be
    /// listed, the latest per node.
    twin_syncs: HashMap<String, HiveMessage>,
}

fn node_name(pod: &Value) -> Option<String> {
    crate::desired::bound_node(pod).map(str::to_owned)
}

/// Whether cloudhub took object `key` (`op` at `version`) for `node`:
/// counted, and logged when not. The one place the controller reads a
/// [`hub::Outcome`] of an object.
fn taken(
    counts: &watch::Sender<ControllerCounts>,
    node: &str,
    (op, key, version): (Op, &EdgeResource, u64),
    outcome: Outcome,
) -> bool {
    match outcome {
        Ok(delivery) => {
            debug!(%node, %key, ?op, version, ?delivery, "sent to the node");
            counts.send_modify(|c| c.sent += 1);
            true
        }
        Err(refusal) => {
            warn!(%node, %key, ?op, %refusal, "cloudhub did not take a message for a node");
            counts.send_modify(|c| c.send_failures += 1);
            false
        }
    }
}

/// `object` without its resource version: a write of it is
/// unconditional.
fn unconditional(mut object: Value) -> Value {
    if let Some(metadata) = object["metadata"].as_object_mut() {
        metadata.remove("resourceVersion");
    }
    object
}

impl Controller {
    async fn run(mut self, mut requests: mpsc::Receiver<Input>) {
        let mut retry = tokio::time::interval(self.config.retry_every);
        retry.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        retry.tick().await;
        let mut leases = tokio::time::interval(self.config.lease_every);
        leases.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut sweep = tokio::time::interval(self.config.sweep_every);
        sweep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        for kind in FOLLOWED {
            self.list_and_watch(kind).await;
        }
        info!(
            bound = self.reconciler.bound_count(),
            "edgecontroller ready"
        );
        // An input taken while gathering status reports, handled next.
        let mut carried = None;
        loop {
            let input = match carried.take() {
                Some(input) => Some(input),
                None => tokio::select! {
                    biased;
                    // A renewal round's end before the next tick.
                    Some(round) = self.rounds_ended.recv() => {
                        self.renewals.ended(round);
                        continue;
                    }
                    // The timers first: under a steady flow of requests
                    // and watch events they would otherwise never be
                    // polled, and Leases would lapse.
                    _ = leases.tick() => {
                        self.renew_leases();
                        continue;
                    }
                    _ = sweep.tick(), if self.config.claims.is_some() => {
                        self.sweep_unclaimed();
                        continue;
                    }
                    input = requests.recv() => input,
                    Some((kind, event)) = self.watches.next() => {
                        self.on_watch(kind, event).await;
                        continue;
                    }
                    _ = retry.tick() => {
                        for kind in FOLLOWED {
                            if !self.watches.streams.iter().any(|(k, _)| *k == kind) {
                                self.list_and_watch(kind).await;
                            }
                        }
                        let actions = self.reconciler.retry(&self.store);
                        self.act(actions).await;
                        continue;
                    }
                },
            };
            let Some(input) = input else { break };
            match input {
                Input::Hive(msg) => match StatusReport::of(msg) {
                    Ok(first) => {
                        // Status reports waiting behind this one are stored
                        // with it, in one commit; anything else waits its
                        // turn.
                        let (reports, next) = requests::gather(
                            first,
                            STATUS_BATCH,
                            || requests.try_recv().ok(),
                            |input| match input {
                                Input::Hive(msg) => match StatusReport::of(msg) {
                                    Ok(report) => Read::Report(report),
                                    Err(msg) => Read::Other(Input::Hive(msg)),
                                },
                                other => Read::Other(other),
                            },
                        );
                        carried = next;
                        self.bound_statuses(reports);
                    }
                    Err(msg) => self.on_message(msg).await,
                },
                Input::Node(event) => self.on_node_event(event).await,
                Input::Inventory(node, inventory) => {
                    let actions = self.reconciler.inventory(&node, inventory, &self.store);
                    self.act(actions).await;
                }
                Input::Cursor(node, session, cursor) => {
                    let actions = self.reconciler.cursor(&node, session, cursor, &self.store);
                    self.act(actions).await;
                    self.count(|c| c.cursors_read += 1);
                }
                Input::Unclaimed(nodes) => self.mark_unclaimed(nodes).await,
                Input::Stop(done) => {
                    drop(self);
                    debug!("edgecontroller stopped");
                    let _ = done.send(());
                    return;
                }
            }
        }
        debug!("edgecontroller stopped");
    }

    /// Lists `kind`, hands the list to the reconciler, and watches `kind`
    /// from the list's revision; on failure, tried again on the next tick
    /// (until then nothing is withdrawn from nodes).
    async fn list_and_watch(&mut self, kind: Kind) {
        // Object by object into the reconciler: a relist of thousands of
        // pods (a watch that fell behind) is never decoded all at once.
        let mut listing = self.reconciler.start_listing(kind);
        let (reconciler, store) = (&mut self.reconciler, &self.store);
        let listed = store
            .list_each(kind, None, &mut |object| {
                reconciler.list_item(&mut listing, object, store)
            })
            .and_then(|revision| Ok((revision, self.store.watch(kind, revision)?)));
        match listed {
            Ok((revision, watch)) => {
                let actions = self
                    .reconciler
                    .finish_listing(listing, revision, &self.store);
                self.act(actions).await;
                self.watches.streams.retain(|(k, _)| *k != kind);
                self.watches.streams.push((kind, watch));
                self.watches
                    .streams
                    .sort_by_key(|(k, _)| FOLLOWED.iter().position(|f| f == k));
                self.mark_handled(kind, revision);
                if matches!(kind, Kind::Device | Kind::DeviceModel) {
                    self.answer_waiting_twin_syncs();
                }
            }
            Err(err) => {
                warn!(kind = kind.name(), error = %err, "desired state not listed; trying again");
                let actions = self.reconciler.abandon_listing(listing);
                self.act(actions).await;
            }
        }
    }

    /// Handles a watch event and every other one already waiting (up to
    /// [`WATCH_BATCH`]), then carries out what they call for at once: a
    /// burst of changes goes to cloudhub as one batch of sends.
    async fn on_watch(&mut self, kind: Kind, event: Result<WatchEvent, DesiredError>) {
        use futures_util::FutureExt;
        let mut next = Some((kind, event));
        let mut actions = Vec::new();
        let mut handled: Vec<(Kind, u64)> = Vec::new();
        let mut taken = 0;
        while let Some((kind, event)) = next.take() {
            match event {
                Ok(event) => {
                    taken += 1;
                    let revision = event.revision();
                    actions.extend(self.reconciler.observe(kind, &event, &self.store));
                    match handled.iter_mut().find(|(k, _)| *k == kind) {
                        Some((_, at)) => *at = (*at).max(revision),
                        None => handled.push((kind, revision)),
                    }
                }
                Err(err) => {
                    self.act(std::mem::take(&mut actions)).await;
                    for (kind, revision) in handled.drain(..) {
                        self.mark_handled(kind, revision);
                    }
                    debug!(kind = kind.name(), error = %err, "watch ended; listing again");
                    self.count(|c| c.relists += 1);
                    self.watches.streams.retain(|(k, _)| *k != kind);
                    self.list_and_watch(kind).await;
                }
            }
            if taken < WATCH_BATCH {
                next = self.watches.next().now_or_never().flatten();
            }
        }
        self.count(|c| c.watch_events += taken as u64);
        self.act(actions).await;
        for (kind, revision) in handled {
            self.mark_handled(kind, revision);
        }
    }

    fn mark_handled(&self, kind: Kind, revision: u64) {
        self.handled.send_if_modified(|handled| {
            let at = handled.entry(kind).or_default();
            let moved = revision > *at;
            *at = (*at).max(revision);
            moved
        });
    }

    fn count(&self, change: impl FnOnce(&mut ControllerCounts)) {
        self.counts.send_modify(change);
    }

    /// Carries out the reconciler's actions, in order; a fresh revision is
    /// taken once, when the first action needs one. Consecutive sends are
    /// queued at cloudhub one after another and their commits awaited
    /// together: a burst of changes becomes few queue transactions, and no
    /// send waits a commit for the one before it. Nothing on this path asks
    /// the API server anything per object (tokens are asked by the edge
    /// when it starts a pod; tolerations are lengthened at admission, or
    /// by the paced [`TolerationWriter`] off this path).
    async fn act(&mut self, actions: Vec<Action>) {
        let mut fresh = None;
        let mut batch = SendBatch::default();
        for action in actions {
            if !matches!(action, Action::Send { .. }) {
                // What follows a send waits until it is committed.
                self.settle(std::mem::take(&mut batch)).await;
            }
            match action {
                Action::Send {
                    node,
                    op,
                    key,
                    object,
                    version,
                } => {
                    if self.config.send_to_linked_only && !self.reconciler.is_connected(&node) {
                        // Another replica serves it, or none: it is brought
                        // in step when it links here.
                        continue;
                    }
                    let version = match version {
                        Version::Of(version) => version,
                        Version::Fresh => match fresh {
                            Some(version) => version,
                            None => match self.store.next_revision().await {
                                Ok(version) => *fresh.insert(version),
                                Err(err) => {
                                    warn!(error = %err, "no revision; the node is brought in step later");
                                    self.reconciler.sent(&node, op, &key, 0, false);
                                    continue;
                                }
                            },
                        },
                    };
                    if key.kind == Kind::Pod && op != Op::Delete {
                        self.tolerations.lengthen_if_needed(&key, &object);
                    }
                    let queued = self
                        .queue_resource(&node, op, &key.edge_resource(), &object, version)
                        .await;
                    batch.sends.push((node, op, key, version, queued));
                    if batch.sends.len() >= SEND_BATCH {
                        self.settle(std::mem::take(&mut batch)).await;
                    }
                }
                Action::Membership {
                    node,
                    device,
                    object,
                    joined,
                } => self.send_membership(&node, &device, &object, joined).await,
                Action::AskInventory { node } => self.ask_inventory(&node),
                Action::ReadCursor { node, session } => self.read_cursor(&node, session),
                Action::UpdateNode { node } => self.update_node(&node).await,
                Action::FinishDeletion { key, uid } => {
                    if let Err(refusal) = self.finish_deletion(&key, uid.as_deref()).await {
                        debug!(%key, %refusal, "deletion left for the next word");
                    }
                }
            }
        }
        self.settle(batch).await;
    }

    /// Awaits the commits of a batch of sends and tells the reconciler
    /// what became of each, in order.
    async fn settle(&mut self, batch: SendBatch) {
        if batch.sends.is_empty() {
            return;
        }
        let size = batch.sends.len() as u64;
        let outcomes = futures_util::future::join_all(batch.sends.into_iter().map(
            |(node, op, key, version, queued)| async move {
                let taken = match queued {
                    Some(answer) => answer.await,
                    None => false,
                };
                (node, op, key, version, taken)
            },
        ))
        .await;
        self.count(|c| {
            c.send_batches += 1;
            c.batched_sends += size;
            c.largest_send_batch = c.largest_send_batch.max(size);
        });
        for (node, op, key, version, taken) in outcomes {
            self.reconciler.sent(&node, op, &key, version, taken);
        }
    }

    /// Tells KubeEdge node `node` that `device` joined or left its
    /// devices (see [`twin_sync::membership_message`]), through cloudhub
    /// on the node's link, ahead of anything sent after it.
    async fn send_membership(&self, node: &str, device: &ObjectKey, object: &Value, joined: bool) {
        let update = twin_sync::membership_update(object, joined, beehive::message::now_millis());
        let msg = match twin_sync::membership_message(node, &update) {
            Ok(msg) => msg,
            Err(err) => {
                warn!(%node, %device, error = %err, "membership update not built");
                return;
            }
        };
        let sent = match self.links.deliver(msg, self.config.send_timeout).await {
            Ok(_) => true,
            Err(refusal) => {
                debug!(%node, %refusal, "cloudhub did not take a membership update");
                false
            }
        };
        match sent {
            true => {
                debug!(%node, %device, joined, "membership update sent");
                self.count(|c| c.memberships += 1);
            }
            // The link went down: its next twin sync lists the devices.
            false => debug!(%node, %device, joined, "membership update not sent"),
        }
    }

    /// Queues `object` for `node` through cloudhub (in the order of the
    /// calls); the answer, once cloudhub has persisted it or refused, is
    /// awaited apart: whether the node's queue took it. `None`: it never
    /// reached cloudhub.
    async fn queue_resource(
        &self,
        node: &str,
        op: Op,
        key: &EdgeResource,
        object: &Value,
        version: u64,
    ) -> Option<Taken> {
        let resource = key.on_node(node).to_string();
        // Devices and models come from the devicecontroller, as in
        // KubeEdge: a KubeEdge edge's metamanager hands an object to its
        // devicetwin (and so to the DMI mappers) only from that source.
        let source = match key.resource_type.as_str() {
            resource_type::DEVICE | resource_type::DEVICE_MODEL => module::DEVICECONTROLLER,
            _ => module::EDGECONTROLLER,
        };
        let msg = HiveMessage::new()
            .build_router(source, group::RESOURCE, resource, op.operation())
            .with_resource_version(version.to_string())
            .with_content(object.clone());
        let counts = self.counts.clone();
        match self.links.queue(msg, self.config.send_timeout).await {
            Ok(outcome) => {
                let (node, key) = (node.to_owned(), key.clone());
                Some(Box::pin(async move {
                    taken(&counts, &node, (op, &key, version), outcome.await)
                }))
            }
            Err(refusal) => {
                taken(&counts, node, (op, key, version), Err(refusal));
                None
            }
        }
    }

    /// Asks `node` what it holds; the answer comes back as an
    /// [`Input::Inventory`].
    ///
    /// The question carries the revision up to which each kind's changes
    /// are handled (`{"handled": {"pod": 42, ...}}`): this controller has
    /// seen every deletion of that kind at or below it, and sends an object
    /// of it again only where its view wants it on the node (at a version
    /// above the deletion, or a fresh one), so the node may drop its
    /// tombstones at or below it (see the meta crate's `tombstones` module).
    fn ask_inventory(&self, node: &str) {
        let handled: serde_json::Map<String, Value> = self
            .handled
            .borrow()
            .iter()
            .map(|(kind, revision)| (kind.resource_type().to_owned(), json!(revision)))
            .collect();
        let query = HiveMessage::new()
            .build_router(
                module::EDGECONTROLLER,
                group::RESOURCE,
                format!("node/{node}/{}", beehive::constants::INVENTORY),
                operation::QUERY,
            )
            .with_content(json!({ "handled": handled }));
        let (hive, inbox, timeout) = (
            self.hive.clone(),
            self.inbox.clone(),
            self.config.send_timeout,
        );
        let node = node.to_owned();
        actix::spawn(async move {
            let inventory = match hive.send_sync(module::CLOUDHUB, query, timeout).await {
                Ok(answer) => match answer.into_answer() {
                    Ok(answer) => BTreeMap::<String, String>::deserialize(answer.content())
                        .map_err(|err| format!("unreadable inventory: {err}")),
                    Err(refused) => Err(refused.reason),
                },
                Err(err) => Err(err.to_string()),
            };
            let _ = inbox.send(Input::Inventory(node, inventory)).await;
        });
    }

    /// Reads what KubeEdge node `node` acknowledged; the answer comes
    /// back as an [`Input::Cursor`].
    fn read_cursor(&self, node: &str, session: u64) {
        let (inbox, timeout) = (self.inbox.clone(), self.config.send_timeout);
        let read = self
            .config
            .cursors
            .as_ref()
            .map(|cursors| cursors.read(node));
        let node = node.to_owned();
        actix::spawn(async move {
            let cursor = match read {
                Some(read) => match tokio::time::timeout(timeout, read).await {
                    Ok(cursor) => cursor,
                    Err(_) => Err("timed out".to_owned()),
                },
                None => Err("no delivery cursors here".to_owned()),
            };
            let _ = inbox.send(Input::Cursor(node, session, cursor)).await;
        });
    }

    // ----- what nodes say -----

    /// A node linked or unlinked here, or holds a deletion.
    async fn on_node_event(&mut self, event: NodeEvent) {
        let NodeEvent { node, kind } = event;
        if !valid_name(&node) {
            warn!(%node, "node event for an invalid node name ignored");
            return;
        }
        let actions = match kind {
            NodeEventKind::Deleted(resource) => {
                let Some(key) = ObjectKey::from_edge_resource(&resource) else {
                    return;
                };
                self.reconciler.delivered(&node, &key)
            }
            NodeEventKind::Connected(dialect) => {
                self.count(|c| c.node_events += 1);
                let dialect = match dialect {
                    Dialect::KubeEdge => NodeDialect::KubeEdge,
                    Dialect::Native => NodeDialect::Native,
                };
                self.reconciler.connected(&node, dialect, &self.store)
            }
            // Served by another replica now: nothing to say of it here.
            NodeEventKind::ServedElsewhere => {
                self.count(|c| c.node_events += 1);
                self.twin_syncs.remove(&node);
                self.reconciler.served_elsewhere(&node);
                return;
            }
            NodeEventKind::Disconnected => {
                self.count(|c| c.node_events += 1);
                self.twin_syncs.remove(&node);
                self.reconciler.disconnected(&node)
            }
        };
        self.act(actions).await;
    }

    async fn on_message(&mut self, msg: HiveMessage) {
        let Ok(resource) = msg.resource().parse::<CloudResource>() else {
            debug!(resource = msg.resource(), "message without a node; ignored");
            self.refuse_sync(&msg, "no node/<node>/ in the resource");
            return;
        };
        let node = resource.node.clone();
        let edge = resource.resource;
        match NodeRequest::of(&node, &edge, msg.operation()) {
            NodeRequest::TwinSync => self.twin_sync(&node, msg),
            NodeRequest::Lease(request) => self.lease(&node, &edge, request, &msg),
            NodeRequest::Query => self.answer_query(&node, &edge, &msg),
            NodeRequest::RegisterNode => {
                let answer = self.adopt_node(&node, msg.content()).await;
                self.answer_node_write(&node, &msg, answer);
            }
            NodeRequest::ForeignNode => {
                let answer = Err(adoption::NodeRefused::RegistersAnother.into());
                self.answer_node_write(&node, &msg, answer);
            }
            NodeRequest::PatchNode => {
                let answer = self.patch_node(&node, &edge, msg.content()).await;
                self.answer_node_write(&node, &msg, answer);
            }
            NodeRequest::NodeStatus => {
                let status = kubeedge::status_of(msg.content());
                // Answered "OK" by the status writer once written.
                let ticket = msg.is_sync().then(|| Ticket::Replace(msg.clone()));
                if let Err(refusal) = self.node_status(&node, &edge, status, ticket).await {
                    self.refuse_sync(&msg, &refusal.message)
                }
            }
            NodeRequest::PodTerminated => {
                let answer = match PodTerminated::of(&edge.namespace, &edge.name, &msg) {
                    Some(stopped) => self.pod_terminated(&node, stopped).await,
                    None => Err(Refusal::bad_request("a pod's delete names its uid")),
                };
                match answer {
                    Ok(()) => self.answer_node(&msg, json!("OK")),
                    Err(refusal) => self.answer_node(&msg, kubeedge::status_error(&refusal)),
                }
            }
            NodeRequest::PodPatch => {
                // A readable one is a status report, taken with the others.
                let reason = kubeedge::patch_of(msg.content()).err();
                let reason = reason.unwrap_or_else(|| "unreadable patch".to_owned());
                self.answer_write(&msg, Err(Refusal::bad_request(reason)));
            }
            NodeRequest::Other => {
                debug!(%node, op = msg.operation(), kind = %edge.resource_type, "not for the edgecontroller; ignored");
                self.refuse_sync(&msg, "the edgecontroller does not take this");
            }
        }
    }

    /// Takes `node`'s word that a pod stopped there (edgehive's edge, or a
    /// KubeEdge kubelet's delete of its pod): a graceful deletion of that
    /// pod on that node is finished. `Ok` once the pod is gone (or was),
    /// the answer a KubeEdge kubelet takes as done.
    async fn pod_terminated(&mut self, node: &str, stopped: PodTerminated) -> Result<(), Refusal> {
        let key = ObjectKey::new(Kind::Pod, stopped.namespace.as_str(), stopped.name.as_str());
        match self
            .reconciler
            .terminated(node, &key, stopped.uid.as_deref())
        {
            Termination::Finish { key, uid } => self.finish_deletion(&key, uid.as_deref()).await,
            Termination::Gone => Ok(()),
            Termination::Kept => {
                debug!(%node, pod = %key, "stopped before its deletion shows here; kept");
                // A kubelet asks again; the word is kept meanwhile.
                Err(Refusal::conflict(format!(
                    "{key} is not seen being deleted yet"
                )))
            }
            Termination::Refused(reason) => {
                warn!(%node, pod = %key, %reason, "a node's word for a pod not bound to it refused");
                Err(Refusal::forbidden(reason))
            }
        }
    }

    /// Removes `key` from the desired state, its graceful deletion done
    /// (`uid` as precondition, so a new pod of that name stays). A failure
    /// has its node told of the deletion again on the next retry.
    async fn finish_deletion(&mut self, key: &ObjectKey, uid: Option<&str>) -> Result<(), Refusal> {
        match self.store.finish_deletion(key, uid).await {
            Ok(()) => {
                info!(%key, "deletion finished: its node says it stopped");
                Ok(())
            }
            Err(err) => {
                warn!(%key, error = %err, "deletion not finished");
                self.reconciler.unfinished(key);
                Err(Refusal::internal(err.to_string()))
            }
        }
    }
}
