//! Carrying out the reconciler's actions: objects queued at cloudhub in
//! batches whose commits are awaited together, membership updates, the
//! questions put to nodes (inventories) and to the delivery cursors, and
//! the Node updates and finished deletions it calls for (done by `nodes`
//! and `from_nodes`).

use apis::inventory::{Held, Watermark};
use apis::kinds::{Kind, ObjectKey};
use beehive::constants::{group, module, operation, resource_type};
use beehive::resource::EdgeResource;
use beehive::{Content, Message as HiveMessage};
use hub::Outcome;

use tokio::sync::watch;
use tracing::{debug, warn};

use super::reconciler::{Action, Op, Version};
use super::{Controller, ControllerCounts, Input};
use crate::desired::Object;
use crate::devicecontroller::twin_sync;

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

impl Controller {
    /// Carries out the reconciler's actions, in order; a fresh revision is
    /// taken once, when the first action needs one. Consecutive sends are
    /// queued at cloudhub one after another and their commits awaited
    /// together: a burst of changes becomes few queue transactions, and no
    /// send waits a commit for the one before it. Nothing on this path asks
    /// the API server anything per object (tokens are asked by the edge
    /// when it starts a pod; tolerations are lengthened at admission, or
    /// by the paced [`TolerationWriter`](super::toleration_writer::TolerationWriter) off this path).
    pub(super) async fn act(&mut self, actions: Vec<Action>) {
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
    async fn send_membership(&self, node: &str, device: &ObjectKey, object: &Object, joined: bool) {
        let update =
            twin_sync::membership_update(object.json(), joined, beehive::message::now_millis());
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
        object: &Object,
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
            .with_content(object.content());
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
        let watermark = Watermark::of(
            self.handled
                .borrow()
                .iter()
                .map(|(kind, revision)| (kind.resource_type(), *revision)),
        );
        let query = HiveMessage::new()
            .build_router(
                module::EDGECONTROLLER,
                group::RESOURCE,
                format!("node/{node}/{}", beehive::constants::INVENTORY),
                operation::QUERY,
            )
            .with_content(Content::of(&watermark).expect("names and numbers encode"));
        let (hive, inbox, timeout) = (
            self.hive.clone(),
            self.inbox.clone(),
            self.config.send_timeout,
        );
        let node = node.to_owned();
        actix::spawn(async move {
            let inventory = match hive.send_sync(module::CLOUDHUB, query, timeout).await {
                Ok(answer) => match answer.into_answer() {
                    Ok(answer) => answer
                        .body::<Held>()
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
}
