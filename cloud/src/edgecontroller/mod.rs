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
//! state reports, see [`twin_reports`](crate::devicecontroller::twin_reports); only from the device's node) and
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
//! This file is the task: its state and the loop that takes its inputs in
//! turn. Beside it, by concern: `handle` (the API's side: applies answered
//! once queued), `config` (how it runs, what it counts), `watches` (list,
//! watch, handled revisions), `sends` (the reconciler's actions carried
//! out, sends batched at cloudhub), `from_nodes` (what nodes say, sorted by
//! `requests`), `nodes` (a node's Node and Lease, nodes no replica holds;
//! their rules in `adoption` and `leases`), `answers` (what nodes' requests
//! are answered with), `status_reports` (statuses nodes report, batched for
//! the status writer).

mod adoption;
mod answers;
mod bound;
mod config;
pub mod eviction;
mod from_nodes;
mod handle;
pub mod kubeedge;
mod leases;
mod nodes;
pub mod reconciler;
mod requests;
mod sends;
mod status_reports;
pub mod status_writer;
mod status_writes;
mod toleration_writer;
mod watches;

pub use config::{ControllerConfig, ControllerCounts, DeliveryCursors, NodeHolders};
pub use handle::{Admitted, Applied, ControllerHandle, Handled};

pub(crate) use answers::send_to_node;
use requests::Read;
use status_reports::{STATUS_BATCH, StatusReport};

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use beehive::constants::{group, module};
use beehive::{Hive, Message as HiveMessage, TaskDoor};
use futures_util::StreamExt;
use hub::{NodeEvent, NodeEvents, NodeLinks};
use tokio::sync::{mpsc, oneshot, watch};
use tracing::{debug, info};

use crate::desired::DesiredState;
use leases::{LeaseBook, RenewalRounds};
pub use reconciler::Acked;
use reconciler::{FOLLOWED, Reconciler};
use status_writer::WriterConfig;
use status_writes::StatusWrites;
use toleration_writer::TolerationWriter;
use watches::Watches;

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
        Ok(ControllerHandle::new(
            store,
            handled,
            wait,
            counts,
            node_events,
            links,
        ))
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
                            if !self.watches.watching(kind) {
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

    fn count(&self, change: impl FnOnce(&mut ControllerCounts)) {
        self.counts.send_modify(change);
    }
}
