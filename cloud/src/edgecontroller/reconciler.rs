//! The edgecontroller's decisions, as a state machine with no I/O.
//!
//! [`Reconciler`] is fed what happens (watch events of the desired state,
//! nodes connecting and leaving, the inventories nodes report, the outcome
//! of each message it asked to send, time passing) and answers with
//! [`Action`]s for the controller to carry out. It decides:
//!
//! - which node gets which object: a pod or device goes to the node it is
//!   bound to; a configmap, secret or device model to every node running
//!   something that references it, and only there;
//! - what to withdraw: an object deleted, or no longer referenced by
//!   anything on a node, is deleted there;
//! - what a node lacks or holds in an old version, from the inventory it
//!   reports when it connects (or, for KubeEdge nodes, which report none,
//!   from what they acknowledged as a delivery cursor records it, or else
//!   by sending each of their objects again);
//! - a node's `Ready` condition, from its link and its own report;
//! - whose status reports are accepted: a node reports only for what is
//!   bound to it;
//! - when a graceful deletion of a pod is finished: when the node it is
//!   bound to says its containers stopped ([`Reconciler::terminated`]),
//!   as a kubelet's last delete does, never when the node merely holds
//!   the deletion.
//!
//! Objects it needs to read (what a node newly needs) come through
//! [`ObjectReader`]; the reads are the backend's local view, not I/O. Every
//! message carries a version the edge compares: an object's own revision,
//! or [`Version::Fresh`] where it must supersede whatever the node holds
//! (a withdrawal, or an object sent again after one).
//!
//! One concern: the edgecontroller's decisions, one state machine with no
//! I/O; long because it has many inputs (watches, links, inventories,
//! answers, time), not because it does several things.

use std::collections::hash_map::DefaultHasher;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use k8s_openapi::api::core::v1::NodeCondition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde_json::{Value, json};

use apis::kinds::{Kind, ObjectKey, references};

use super::bound::{Bound, BoundObjects};
use crate::desired::{
    DesiredError, DesiredState, WatchEvent, bound_node as node_of, desired_part, revision_of,
    spec_revision, stub,
};

/// What is done to an object at a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// The node gets it for the first time.
    Insert,
    /// The node gets a newer version.
    Update,
    /// The node drops it.
    Delete,
}

impl Op {
    /// beehive's operation for it.
    pub fn operation(self) -> &'static str {
        match self {
            Op::Insert => beehive::constants::operation::INSERT,
            Op::Update => beehive::constants::operation::UPDATE,
            Op::Delete => beehive::constants::operation::DELETE,
        }
    }
}

/// The version a message to a node carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    /// This revision.
    Of(u64),
    /// A revision above every one issued so far, taken when the message is
    /// sent (one per batch of actions).
    Fresh,
}

/// What a node acknowledged of one object, as its delivery cursor
/// records it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Acked {
    /// The version it holds at least, or [`Acked::UNSURE`].
    pub version: u64,
    /// The claim on the node (one replica's tenure of it) under which it
    /// was recorded. What one claim recorded is as of one moment of that
    /// replica; a later claim may have recorded more on top of it.
    pub claim: i64,
}

impl Acked {
    /// A message of the object was on its way (a deletion, or one queued
    /// before the node's session began): the node may hold any version of
    /// it, or none.
    pub const UNSURE: u64 = 0;
}

/// How a node talks to the cloud.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeDialect {
    /// edgehive's edgecore: reports its inventory when asked.
    Native,
    /// KubeEdge's edgecore: reports none.
    KubeEdge,
}

/// A full list of one kind under way ([`Reconciler::start_listing`]).
#[derive(Debug)]
pub struct Listing {
    kind: Kind,
    /// The kind's first list: objects are indexed, nothing is sent.
    first: bool,
    /// Every object listed so far.
    keys: BTreeSet<ObjectKey>,
    /// What the objects listed so far call for.
    actions: Vec<Action>,
}

/// Something for the controller to do.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Queue `object` for `node` with `op` at `version`, then report the
    /// outcome with [`Reconciler::sent`].
    Send {
        /// To which node.
        node: String,
        /// What to do there.
        op: Op,
        /// Which object.
        key: ObjectKey,
        /// Its content (a stub naming it, for a withdrawal of an object
        /// gone from the desired state).
        object: Arc<Value>,
        /// The version the node compares.
        version: Version,
    },
    /// Ask `node` what it holds, and hand the answer to
    /// [`Reconciler::inventory`].
    AskInventory {
        /// Which node.
        node: String,
    },
    /// Read what `node` (a KubeEdge node, which reports no inventory)
    /// acknowledged, its delivery cursor, and hand it to
    /// [`Reconciler::cursor`] with `session`.
    ReadCursor {
        /// Which node.
        node: String,
        /// Which of its links asks.
        session: u64,
    },
    /// Tell `node` (a KubeEdge node, linked) that `device` joined its
    /// devices (`joined`) or left them, before the device itself goes:
    /// its devicetwin learns of devices only so (KubeEdge's membership
    /// update). An edgehive node learns of them from the objects.
    Membership {
        /// Which node.
        node: String,
        /// Which device.
        device: ObjectKey,
        /// The device as observed (a stub naming it, if gone).
        object: Arc<Value>,
        /// Whether it joined the node's devices, or left them.
        joined: bool,
    },
    /// Write `node`'s Node object: its `Ready` condition changed.
    UpdateNode {
        /// Which node.
        node: String,
    },
    /// Remove `key` from the desired state for good: it was being deleted
    /// gracefully, and its node says it stopped (a pod's containers
    /// stopped and its sandbox is gone there), or holds the deletion (a
    /// device).
    FinishDeletion {
        /// Which object.
        key: ObjectKey,
        /// Its uid, so a new object of the same name is left alone.
        uid: Option<String>,
    },
}

/// Reads objects of the desired state.
pub trait ObjectReader {
    /// The object at `key`, if there is one.
    fn read(&self, key: &ObjectKey) -> Result<Option<Value>, DesiredError>;
}

impl ObjectReader for Arc<dyn DesiredState> {
    fn read(&self, key: &ObjectKey) -> Result<Option<Value>, DesiredError> {
        self.get(key)
    }
}

impl ObjectReader for HashMap<ObjectKey, Value> {
    fn read(&self, key: &ObjectKey) -> Result<Option<Value>, DesiredError> {
        Ok(self.get(key).cloned())
    }
}

/// A node as the reconciler sees it.
#[derive(Debug, Default)]
struct NodeState {
    /// Its dialect while its link is up.
    link: Option<NodeDialect>,
    /// Its dialect when its link was last up: how it is told of a pod's
    /// graceful deletion while away.
    dialect: Option<NodeDialect>,
    /// Referenced objects it holds, each with the version it was sent at.
    held: BTreeMap<ObjectKey, u64>,
    /// The highest version a referenced object was withdrawn from it at:
    /// one sent again at or below it would be taken for an old message.
    withdrawn: u64,
    /// A message could not be queued for it: bring it in step on the next
    /// retry while connected.
    out_of_step: bool,
    /// Since its inventory was asked for: the resources sent to it (in
    /// flight, so the inventory may lack them).
    asked: Option<BTreeSet<String>>,
    /// Inventories asked for and not answered yet: until the last answer,
    /// what was sent since the first was asked is in flight for each.
    asking: usize,
    /// Counts its links up and down: a cursor read answered in another
    /// is not this link's.
    session: u64,
    /// A cursor read under way: its session, and the resources sent to
    /// the node since it was asked for (in flight: the cursor may lack
    /// them).
    reading: Option<(u64, BTreeSet<String>)>,
    /// The `Ready` condition it last reported itself.
    reported_ready: Option<NodeCondition>,
}

impl NodeState {
    /// Its inventory is asked for.
    fn ask(&mut self) {
        self.asking += 1;
        self.asked.get_or_insert_with(BTreeSet::new);
    }
}

/// The edgecontroller's decisions (see the module docs).
#[derive(Debug, Default)]
pub struct Reconciler {
    bound: BoundObjects,
    /// Objects being deleted gracefully (a `deletionTimestamp` set).
    terminating: HashMap<ObjectKey, Ending>,
    /// Nodes' words that a pod stopped, come before the watch showed its
    /// deletion (another replica told the node; or the first list is not
    /// taken yet): the node and the uid it named. Taken when the
    /// deletion shows, dropped when the pod turns out otherwise.
    early: HashMap<ObjectKey, (String, Option<String>)>,
    /// Digests of referenced objects (configmaps, secrets, device models)
    /// and the revision of their last spec change.
    referenced: HashMap<ObjectKey, (u64, u64)>,
    nodes: HashMap<String, NodeState>,
    /// Kinds whose first list has been taken: until every kind is loaded,
    /// nothing a node holds is withdrawn (an empty view must not look like
    /// "nothing is desired").
    loaded: BTreeSet<Kind>,
    /// Whether what KubeEdge nodes acknowledged can be read (a delivery
    /// cursor per node): they are brought in step from it.
    cursors: bool,
}

/// An object being deleted gracefully.
#[derive(Debug, Clone)]
struct Ending {
    /// The node it was bound to.
    node: String,
    /// Its uid.
    uid: Option<String>,
    /// The highest version its deletion went to the node at.
    sent: u64,
    /// Whether the node was told with a delete (edgehive's edge: it drops
    /// the pod and says when it stopped), or else with the object marked
    /// deleted (a KubeEdge kubelet, which terminates it, says so with a
    /// delete of its own, and drops it when the object is gone).
    withdrawn: bool,
}

/// Words that a pod stopped kept before its deletion shows, at most.
const EARLY_WORDS: usize = 10_000;

/// What became of a node's word that a pod stopped
/// ([`Reconciler::terminated`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Termination {
    /// The pod's graceful deletion is finished: remove it from the
    /// desired state with `uid` as precondition.
    Finish {
        /// Which pod.
        key: ObjectKey,
        /// Its uid.
        uid: Option<String>,
    },
    /// Its deletion does not show here yet: the word is kept, and finishes
    /// the deletion when it shows.
    Kept,
    /// Nothing to finish: no such pod here (its deletion finished
    /// already), or another pod of that name.
    Gone,
    /// The pod is bound to another node: a node speaks for its own pods
    /// only.
    Refused(String),
}

/// Whether a word naming `said` is about the pod of uid `known`.
fn same_pod(said: Option<&str>, known: Option<&str>) -> bool {
    match (said, known) {
        (Some(said), Some(known)) => said == known,
        _ => true,
    }
}

/// The type of the Node condition that shows a node's link to the cloud.
pub const LINK_CONDITION: &str = "EdgeLink";

/// The kinds the reconciler follows.
pub const FOLLOWED: [Kind; 6] = [
    Kind::ConfigMap,
    Kind::Secret,
    Kind::DeviceModel,
    Kind::Pod,
    Kind::Device,
    Kind::Node,
];

fn digest(object: &Value) -> u64 {
    let mut hasher = DefaultHasher::new();
    desired_part(object).to_string().hash(&mut hasher);
    hasher.finish()
}

/// The version a change at `revision` goes at to an object last sent at
/// `sent`: its own revision, unless a fresh one sent before is above it.
fn above(sent: u64, revision: u64) -> Version {
    match revision > sent {
        true => Version::Of(revision),
        false => Version::Fresh,
    }
}

/// Whether `object` is being deleted gracefully.
fn terminating(object: &Value) -> bool {
    object
        .pointer("/metadata/deletionTimestamp")
        .is_some_and(|t| !t.is_null())
}

fn uid_of(object: &Value) -> Option<String> {
    object
        .pointer("/metadata/uid")
        .and_then(Value::as_str)
        .map(str::to_owned)
}

impl Reconciler {
    /// A reconciler that knows nothing yet.
    pub fn new() -> Self {
        Reconciler::default()
    }

    /// With `cursors`, a KubeEdge node is brought in step from what it
    /// acknowledged ([`Action::ReadCursor`], then [`Reconciler::cursor`])
    /// instead of being sent each of its objects again.
    pub fn with_cursors(mut self, cursors: bool) -> Self {
        self.cursors = cursors;
        self
    }

    /// Whether every followed kind has been listed.
    pub fn loaded(&self) -> bool {
        FOLLOWED.iter().all(|kind| self.loaded.contains(kind))
    }

    /// Pods and devices bound to nodes.
    pub fn bound_count(&self) -> usize {
        self.bound.len()
    }

    /// Takes a full list of `kind` at `revision`: on the first, builds the
    /// index (nodes are not connected yet, so nothing is sent); on a later
    /// one (after a watch could not resume), acts on every difference as
    /// on the watch events it stands for. The same as
    /// [`start_listing`](Self::start_listing), [`list_item`](Self::list_item)
    /// of each object and [`finish_listing`](Self::finish_listing).
    pub fn listed(
        &mut self,
        kind: Kind,
        objects: Vec<Value>,
        revision: u64,
        reader: &dyn ObjectReader,
    ) -> Vec<Action> {
        let mut listing = self.start_listing(kind);
        for object in objects {
            self.list_item(&mut listing, object, reader);
        }
        self.finish_listing(listing, revision, reader)
    }

    /// A full list of `kind` begins; its objects follow one at a time
    /// ([`list_item`](Self::list_item)), so a list of thousands is never
    /// held whole.
    pub fn start_listing(&self, kind: Kind) -> Listing {
        Listing {
            kind,
            first: !self.loaded.contains(&kind),
            keys: BTreeSet::new(),
            actions: Vec::new(),
        }
    }

    /// One object of the list under way: indexed on the first list, acted
    /// on as a change on a later one.
    pub fn list_item(&mut self, listing: &mut Listing, object: Value, reader: &dyn ObjectReader) {
        if let Some(key) = ObjectKey::of(&object) {
            listing.keys.insert(key);
        }
        if listing.first {
            self.index(listing.kind, &object);
        } else {
            let actions = self.observe(listing.kind, &WatchEvent::Modified(object), reader);
            listing.actions.extend(actions);
        }
    }

    /// The list is whole, at `revision`: what it did not hold is gone.
    pub fn finish_listing(
        &mut self,
        listing: Listing,
        revision: u64,
        reader: &dyn ObjectReader,
    ) -> Vec<Action> {
        let Listing {
            kind,
            first,
            keys: listed,
            mut actions,
        } = listing;
        self.loaded.insert(kind);
        if first {
            if kind.bound_to_node() {
                self.assume_held();
            }
            if kind == Kind::Pod {
                actions.extend(self.take_early_words());
            }
            if self.loaded() {
                // Nodes linked before every kind was listed (a list failed
                // at start) were brought in step against part of the
                // desired state: again, on the next retry.
                for state in self.nodes.values_mut().filter(|s| s.link.is_some()) {
                    state.out_of_step = true;
                }
            }
            return actions;
        }
        // Graceful deletions whose end the watch missed: the object is gone.
        self.terminating
            .retain(|key, _| key.kind != kind || listed.contains(key));
        self.early
            .retain(|key, _| key.kind != kind || listed.contains(key));
        let gone: Vec<ObjectKey> = match kind {
            Kind::Pod | Kind::Device => self
                .bound
                .keys()
                .filter(|key| key.kind == kind && !listed.contains(key))
                .cloned()
                .collect(),
            _ => self
                .referenced
                .keys()
                .filter(|key| key.kind == kind && !listed.contains(key))
                .cloned()
                .collect(),
        };
        for key in gone {
            let mut object = stub(&key);
            object["metadata"]["resourceVersion"] = json!(revision.to_string());
            actions.extend(self.observe(kind, &WatchEvent::Deleted(object), reader));
        }
        // One message per node and object, the last decided: the batch has
        // one fresh version, so none could supersede another of the same
        // object in it.
        let last: HashMap<(String, ObjectKey), usize> = actions
            .iter()
            .enumerate()
            .filter_map(|(index, action)| match action {
                Action::Send { node, key, .. } => Some(((node.clone(), key.clone()), index)),
                _ => None,
            })
            .collect();
        actions
            .into_iter()
            .enumerate()
            .filter(|(index, action)| match action {
                Action::Send { node, key, .. } => last[&(node.clone(), key.clone())] == *index,
                _ => true,
            })
            .map(|(_, action)| action)
            .collect()
    }

    /// A list that broke off (its source failed part way): what the objects
    /// listed so far call for, to be carried out all the same (each stands
    /// for an object as it is); the kind is listed again whole.
    pub fn abandon_listing(&self, listing: Listing) -> Vec<Action> {
        listing.actions
    }

    /// Indexes an object without sending anything (first list).
    fn index(&mut self, kind: Kind, object: &Value) {
        let Some(key) = ObjectKey::of(object) else {
            return;
        };
        match kind {
            Kind::Pod | Kind::Device if terminating(object) => {
                if let Some(node) = node_of(object) {
                    // What the node was told is not known: taken as a
                    // delete (brought in step when it links).
                    let ending = Ending {
                        node: node.to_owned(),
                        uid: uid_of(object),
                        sent: revision_of(object),
                        withdrawn: true,
                    };
                    self.terminating.insert(key, ending);
                }
            }
            Kind::Pod | Kind::Device => {
                if let Some(node) = node_of(object) {
                    let refs = references(&key, object);
                    let bound = Bound {
                        node: node.to_owned(),
                        uid: uid_of(object),
                        refs,
                        spec: spec_revision(object),
                        sent: spec_revision(object),
                        digest: digest(object),
                    };
                    self.bound.insert(key, bound);
                }
            }
            Kind::ConfigMap | Kind::Secret | Kind::DeviceModel => {
                self.referenced
                    .insert(key, (digest(object), spec_revision(object)));
            }
            _ => {}
        }
    }

    /// What each node holds, as far as can be known before it reports:
    /// what its objects reference.
    fn assume_held(&mut self) {
        for bound in self.bound.values() {
            let node = self.nodes.entry(bound.node.clone()).or_default();
            for reference in &bound.refs {
                if let Some((_, spec)) = self.referenced.get(reference) {
                    node.held.entry(reference.clone()).or_insert(*spec);
                }
            }
        }
    }

    /// Acts on one watch event of `kind`.
    pub fn observe(
        &mut self,
        kind: Kind,
        event: &WatchEvent,
        reader: &dyn ObjectReader,
    ) -> Vec<Action> {
        let object = event.object();
        let Some(key) = ObjectKey::of(object) else {
            return Vec::new();
        };
        let revision = event.revision();
        match (kind, event) {
            (Kind::Pod | Kind::Device, WatchEvent::Deleted(_)) => {
                self.early.remove(&key);
                let ending = self.terminating.remove(&key);
                let Some(bound) = self.bound.remove(&key) else {
                    // A graceful deletion ended: a node told with the
                    // object marked deleted (a KubeEdge kubelet) drops it
                    // now, as KubeEdge's cloud tells it.
                    return match ending.filter(|ending| !ending.withdrawn) {
                        Some(ending) => vec![self.send(
                            &ending.node,
                            Op::Delete,
                            &key,
                            Arc::new(object.clone()),
                            above(ending.sent, revision),
                        )],
                        None => Vec::new(),
                    };
                };
                let object = Arc::new(object.clone());
                let mut actions = self.membership(&key, Some(&bound.node), None, &object);
                actions.push(self.send(
                    &bound.node,
                    Op::Delete,
                    &key,
                    object,
                    above(bound.sent, revision),
                ));
                actions.extend(self.refresh_node(&bound.node, revision, reader));
                actions
            }
            (Kind::Pod | Kind::Device, _) => {
                if let Some(previous) = self.bound.get(&key)
                    && node_of(object) != Some(previous.node.as_str())
                {
                    // Deleted and created again (elsewhere, or not bound
                    // yet) while the watch was down: a node name is set
                    // once. It leaves its old node first.
                    let mut gone = stub(&key);
                    gone["metadata"]["resourceVersion"] = json!(revision.to_string());
                    let mut actions = self.observe(kind, &WatchEvent::Deleted(gone), reader);
                    actions.extend(self.observe(kind, event, reader));
                    return actions;
                }
                let Some(node) = node_of(object).map(str::to_owned) else {
                    // Not bound yet: it waits for a scheduler.
                    return Vec::new();
                };
                if terminating(object) {
                    // Deleted gracefully: the node stops it. A pod's
                    // deletion is finished when its node says it stopped
                    // (`terminated`), a device's once its node holds it.
                    let first = !self.terminating.contains_key(&key);
                    let removed = self.bound.remove(&key);
                    if !first && removed.is_none() {
                        return Vec::new();
                    }
                    let object = Arc::new(object.clone());
                    let left = removed.as_ref().map(|bound| bound.node.as_str());
                    let mut actions = self.membership(&key, left, None, &object);
                    let sent = removed.map_or(0, |bound| bound.sent);
                    // A KubeEdge kubelet terminates a pod marked deleted,
                    // and says so; on a delete it would only drop it.
                    let withdrawn = key.kind != Kind::Pod
                        || self.nodes.get(&node).and_then(|s| s.dialect)
                            != Some(NodeDialect::KubeEdge);
                    let op = match withdrawn {
                        true => Op::Delete,
                        false => Op::Update,
                    };
                    self.terminating.insert(
                        key.clone(),
                        Ending {
                            node: node.clone(),
                            uid: uid_of(object.as_ref()),
                            sent: sent.max(revision),
                            withdrawn,
                        },
                    );
                    actions.push(self.send(&node, op, &key, object, above(sent, revision)));
                    actions.extend(self.refresh_node(&node, revision, reader));
                    actions.extend(self.take_early_word(&key));
                    return actions;
                }
                // Not being deleted: an older object of that name is gone,
                // and so is a word about it.
                self.terminating.remove(&key);
                if self.early.get(&key).is_some_and(|(said, uid)| {
                    *said != node || !same_pod(uid.as_deref(), uid_of(object).as_deref())
                }) {
                    self.early.remove(&key);
                }
                let digest = digest(object);
                let previous = self.bound.get(&key);
                if previous.is_some_and(|p| p.digest == digest && p.node == node) {
                    // A status change: the node has the spec already.
                    return Vec::new();
                }
                let op = match previous {
                    Some(p) if p.node == node => Op::Update,
                    _ => Op::Insert,
                };
                let sent = match previous {
                    Some(p) if p.node == node => p.sent,
                    _ => 0,
                };
                let refs = references(&key, object);
                let before = previous.map(|p| p.node.clone());
                self.bound.insert(
                    key.clone(),
                    Bound {
                        node: node.clone(),
                        uid: uid_of(object),
                        refs,
                        spec: revision,
                        sent,
                        digest,
                    },
                );
                let object = Arc::new(object.clone());
                // Its node's devicetwin learns of it first (as KubeEdge's
                // cloud tells it), then what it references goes, so it
                // finds them at the edge, then itself.
                let mut actions = self.membership(&key, before.as_deref(), Some(&node), &object);
                actions.extend(self.refresh_node(&node, revision, reader));
                actions.push(self.send(&node, op, &key, object, above(sent, revision)));
                actions
            }
            (Kind::ConfigMap | Kind::Secret | Kind::DeviceModel, WatchEvent::Deleted(_)) => {
                self.referenced.remove(&key);
                let holders: Vec<String> = self
                    .nodes
                    .iter()
                    .filter(|(_, state)| state.held.contains_key(&key))
                    .map(|(node, _)| node.clone())
                    .collect();
                let object = Arc::new(object.clone());
                holders
                    .into_iter()
                    .map(|node| {
                        let version = self.version_at(&node, &key, revision);
                        self.send(&node, Op::Delete, &key, object.clone(), version)
                    })
                    .collect()
            }
            (Kind::ConfigMap | Kind::Secret | Kind::DeviceModel, _) => {
                let digest = digest(object);
                if self
                    .referenced
                    .get(&key)
                    .is_some_and(|(held, _)| *held == digest)
                {
                    return Vec::new();
                }
                self.referenced.insert(key.clone(), (digest, revision));
                let object = Arc::new(object.clone());
                // At a fresh version, which stands above every revision so
                // far, it goes as it is now: with this one's content, a
                // later change (its event yet to come) would look held.
                let mut current = None;
                self.bound
                    .nodes_wanting(&key)
                    .into_iter()
                    .map(|node| {
                        let held = self
                            .nodes
                            .get(&node)
                            .is_some_and(|s| s.held.contains_key(&key));
                        let op = if held { Op::Update } else { Op::Insert };
                        let version = self.version_at(&node, &key, revision);
                        let object = match version {
                            Version::Of(_) => object.clone(),
                            Version::Fresh => current
                                .get_or_insert_with(|| match reader.read(&key) {
                                    Ok(Some(now)) => Arc::new(now),
                                    _ => object.clone(),
                                })
                                .clone(),
                        };
                        self.send(&node, op, &key, object, version)
                    })
                    .collect()
            }
            (Kind::Node, WatchEvent::Deleted(_)) => {
                if let Some(state) = self.nodes.get_mut(&key.name) {
                    state.reported_ready = None;
                }
                Vec::new()
            }
            _ => Vec::new(),
        }
    }

    /// What a device's move from node `before` to node `after` (either
    /// none) changes in the membership of KubeEdge nodes linked now: it
    /// left the one and joined the other. A node not linked learns its
    /// devices when it links (its twin sync); an edgehive node, from the
    /// objects.
    fn membership(
        &self,
        key: &ObjectKey,
        before: Option<&str>,
        after: Option<&str>,
        object: &Arc<Value>,
    ) -> Vec<Action> {
        if key.kind != Kind::Device || before == after {
            return Vec::new();
        }
        let change = |node: &str, joined: bool| Action::Membership {
            node: node.to_owned(),
            device: key.clone(),
            object: object.clone(),
            joined,
        };
        let left = before
            .filter(|node| self.is_kubeedge(node))
            .map(|node| change(node, false));
        let joined = after
            .filter(|node| self.is_kubeedge(node))
            .map(|node| change(node, true));
        left.into_iter().chain(joined).collect()
    }

    /// Sends `node` the referenced objects it lacks and withdraws the ones
    /// nothing there references any more, at `revision` (the change that
    /// made the difference, above whatever the node holds of them).
    fn refresh_node(
        &mut self,
        node: &str,
        revision: u64,
        reader: &dyn ObjectReader,
    ) -> Vec<Action> {
        let held = self.nodes.get(node).map(|state| &state.held);
        let lacking: Vec<ObjectKey> = self
            .bound
            .wanted(node)
            .filter(|key| !held.is_some_and(|held| held.contains_key(*key)))
            .cloned()
            .collect();
        let unused: Vec<ObjectKey> = held
            .into_iter()
            .flat_map(BTreeMap::keys)
            .filter(|key| !self.bound.is_wanted(node, key))
            .cloned()
            .collect();
        let mut actions = Vec::new();
        for key in &lacking {
            match reader.read(key) {
                Ok(Some(object)) => {
                    let version = self.version_at(node, key, revision);
                    actions.push(self.send(node, Op::Insert, key, Arc::new(object), version));
                }
                // Sent when it is created.
                Ok(None) => {}
                Err(err) => {
                    tracing::warn!(%key, error = %err, "referenced object unreadable");
                    self.node(node).out_of_step = true;
                }
            }
        }
        for key in &unused {
            let object = reader.read(key).ok().flatten().unwrap_or_else(|| stub(key));
            let version = self.version_at(node, key, revision);
            actions.push(self.send(node, Op::Delete, key, Arc::new(object), version));
        }
        actions
    }

    /// The version a change at `revision` sends referenced `key` to
    /// `node` at: that revision, unless the node may hold the key, or its
    /// withdrawal, at or above it (it went with a pod, at a fresh version,
    /// or with a change of another kind handled first); then a fresh one,
    /// which supersedes it.
    fn version_at(&self, node: &str, key: &ObjectKey, revision: u64) -> Version {
        let state = self.nodes.get(node);
        let above = match state.and_then(|s| s.held.get(key)) {
            Some(held) => *held,
            None => state.map_or(0, |s| s.withdrawn),
        };
        match above >= revision {
            true => Version::Fresh,
            false => Version::Of(revision),
        }
    }

    fn node(&mut self, node: &str) -> &mut NodeState {
        self.nodes.entry(node.to_owned()).or_default()
    }

    /// A send, with what it changes in the reconciler's view of the node
    /// taken as done (a failure reported through [`Reconciler::sent`]
    /// marks the node for repair).
    fn send(
        &mut self,
        node: &str,
        op: Op,
        key: &ObjectKey,
        object: Arc<Value>,
        version: Version,
    ) -> Action {
        let state = self.node(node);
        if !key.kind.bound_to_node() {
            match (op, version) {
                (Op::Delete, version) => {
                    state.held.remove(key);
                    if let Version::Of(v) = version {
                        state.withdrawn = state.withdrawn.max(v);
                    }
                }
                (_, Version::Of(v)) => {
                    state.held.insert(key.clone(), v);
                }
                (_, Version::Fresh) => {
                    // The version is known once sent.
                    state.held.entry(key.clone()).or_insert(0);
                }
            }
        }
        if let Some(asked) = state.asked.as_mut() {
            asked.insert(key.edge_resource().to_string());
        }
        if let Some((_, sent)) = state.reading.as_mut() {
            sent.insert(key.edge_resource().to_string());
        }
        Action::Send {
            node: node.to_owned(),
            op,
            key: key.clone(),
            object,
            version,
        }
    }

    /// What became of a send: `version` is the one it went with
    /// (a [`Version::Fresh`] resolved), `queued` whether cloudhub took it.
    pub fn sent(&mut self, node: &str, op: Op, key: &ObjectKey, version: u64, queued: bool) {
        let state = self.node(node);
        if !queued {
            state.out_of_step = true;
            return;
        }
        if key.kind.bound_to_node() {
            self.bound.note_sent(key, version);
            if let Some(ending) = self.terminating.get_mut(key) {
                ending.sent = ending.sent.max(version);
            }
            return;
        }
        if op == Op::Delete {
            state.withdrawn = state.withdrawn.max(version);
        } else if let Some(held) = state.held.get_mut(key) {
            *held = (*held).max(version);
        }
    }

    /// The driver wrote `object` (the bound object at `key`, changed by
    /// the cloud itself, such as a pod's lengthened tolerations) and sends
    /// that instead of what was observed: its echo from the watch is then
    /// no change to send again.
    pub fn rewritten(&mut self, key: &ObjectKey, object: &Value) {
        self.bound
            .note_rewritten(key, digest(object), crate::desired::spec_revision(object));
    }

    /// `node` acknowledged the deletion of `key`: a device's graceful
    /// deletion is finished. A pod's is not: only its node's word that it
    /// stopped ([`Reconciler::terminated`]) finishes that.
    pub fn delivered(&mut self, node: &str, key: &ObjectKey) -> Vec<Action> {
        match self.terminating.get(key) {
            Some(ending) if ending.node == node && key.kind != Kind::Pod => {
                vec![Action::FinishDeletion {
                    key: key.clone(),
                    uid: ending.uid.clone(),
                }]
            }
            _ => Vec::new(),
        }
    }

    /// `node` says pod `key` (of `uid`, if it named one) stopped there:
    /// its containers stopped and its sandbox is gone, or it never ran
    /// there. Finishes the pod's graceful deletion if the pod is being
    /// deleted on that node; a node never speaks for another node's pod.
    pub fn terminated(&mut self, node: &str, key: &ObjectKey, uid: Option<&str>) -> Termination {
        if let Some(ending) = self.terminating.get(key) {
            if ending.node != node {
                return Termination::Refused(format!(
                    "{key} is bound to node {}, not {node}",
                    ending.node
                ));
            }
            if !same_pod(uid, ending.uid.as_deref()) {
                // An earlier pod of that name: its deletion finished.
                return Termination::Gone;
            }
            return Termination::Finish {
                key: key.clone(),
                uid: ending.uid.clone(),
            };
        }
        if let Some(bound) = self.bound.get(key) {
            if bound.node != node {
                return Termination::Refused(format!(
                    "{key} is bound to node {}, not {node}",
                    bound.node
                ));
            }
            if !same_pod(uid, bound.uid.as_deref()) {
                return Termination::Gone;
            }
            // Bound there, its deletion not seen here yet.
            self.early
                .insert(key.clone(), (node.to_owned(), uid.map(str::to_owned)));
            return Termination::Kept;
        }
        if !self.loaded.contains(&key.kind) && self.early.len() < EARLY_WORDS {
            self.early
                .insert(key.clone(), (node.to_owned(), uid.map(str::to_owned)));
            return Termination::Kept;
        }
        Termination::Gone
    }

    /// A finish the desired state did not take (it failed): `key`'s node
    /// is brought in step on the next retry, which tells it of the
    /// deletion again, and it says again that the pod stopped.
    pub fn unfinished(&mut self, key: &ObjectKey) {
        if let Some(node) = self.terminating.get(key).map(|e| e.node.clone()) {
            self.node(&node).out_of_step = true;
        }
    }

    /// The word kept for `key`, now that its deletion shows: it finishes
    /// the deletion if its node said so of this pod.
    fn take_early_word(&mut self, key: &ObjectKey) -> Option<Action> {
        let ending = self.terminating.get(key)?;
        let (node, uid) = self.early.remove(key)?;
        (node == ending.node && same_pod(uid.as_deref(), ending.uid.as_deref())).then(|| {
            Action::FinishDeletion {
                key: key.clone(),
                uid: ending.uid.clone(),
            }
        })
    }

    /// The words kept before pods were first listed: each finishes its
    /// pod's deletion, waits for it (the pod is bound to that node and not
    /// being deleted yet), or goes.
    fn take_early_words(&mut self) -> Vec<Action> {
        let keys: Vec<ObjectKey> = self.early.keys().cloned().collect();
        let mut actions = Vec::new();
        for key in keys {
            if self.terminating.contains_key(&key) {
                actions.extend(self.take_early_word(&key));
                continue;
            }
            let waits = match (self.early.get(&key), self.bound.get(&key)) {
                (Some((node, uid)), Some(bound)) => {
                    bound.node == *node && same_pod(uid.as_deref(), bound.uid.as_deref())
                }
                _ => false,
            };
            if !waits {
                self.early.remove(&key);
            }
        }
        actions
    }

    // ----- nodes' links -----

    /// `node`'s link came up.
    pub fn connected(
        &mut self,
        node: &str,
        dialect: NodeDialect,
        reader: &dyn ObjectReader,
    ) -> Vec<Action> {
        let state = self.node(node);
        state.link = Some(dialect);
        state.dialect = Some(dialect);
        state.session += 1;
        let mut actions = self.resync(node, reader);
        actions.push(Action::UpdateNode {
            node: node.to_owned(),
        });
        actions
    }

    /// `node`'s link went down. Its lease, if any, stays: a disconnect may
    /// arrive after the next session renewed it.
    pub fn disconnected(&mut self, node: &str) -> Vec<Action> {
        let state = self.node(node);
        state.link = None;
        state.session += 1;
        vec![Action::UpdateNode {
            node: node.to_owned(),
        }]
    }

    /// `node`'s link here went down, and another replica serves it: its
    /// link is down for this replica, and its Node is not this replica's
    /// to write.
    pub fn served_elsewhere(&mut self, node: &str) {
        let state = self.node(node);
        state.link = None;
        state.session += 1;
    }

    /// Whether `node`'s link is up.
    pub fn is_connected(&self, node: &str) -> bool {
        self.nodes.get(node).is_some_and(|s| s.link.is_some())
    }

    /// The nodes whose link is up.
    pub fn connected_nodes(&self) -> Vec<String> {
        self.nodes
            .iter()
            .filter(|(_, state)| state.link.is_some())
            .map(|(node, _)| node.clone())
            .collect()
    }

    /// Whether `node` speaks KubeEdge's dialect.
    pub fn is_kubeedge(&self, node: &str) -> bool {
        self.nodes
            .get(node)
            .is_some_and(|s| s.link == Some(NodeDialect::KubeEdge))
    }

    /// Brings the nodes that missed a message in step, if connected.
    pub fn retry(&mut self, reader: &dyn ObjectReader) -> Vec<Action> {
        let due: Vec<String> = self
            .nodes
            .iter()
            .filter(|(_, state)| state.out_of_step && state.link.is_some())
            .map(|(node, _)| node.clone())
            .collect();
        let mut actions = Vec::new();
        for node in due {
            self.node(&node).out_of_step = false;
            actions.extend(self.resync(&node, reader));
        }
        actions
    }

    /// Brings a node in step: an edgehive node is asked for its inventory.
    /// A KubeEdge node reports none: what it acknowledged is read from its
    /// delivery cursor, where there is one ([`Reconciler::cursor`]);
    /// otherwise it is assumed to hold what [`Reconciler::assumed`] says.
    fn resync(&mut self, node: &str, reader: &dyn ObjectReader) -> Vec<Action> {
        if !self.is_kubeedge(node) {
            self.node(node).ask();
            return vec![Action::AskInventory {
                node: node.to_owned(),
            }];
        }
        if self.cursors {
            // One read at a time: an earlier one's answer, if it comes, is
            // not taken.
            let state = self.node(node);
            state.reading = Some((state.session, BTreeSet::new()));
            return vec![Action::ReadCursor {
                node: node.to_owned(),
                session: state.session,
            }];
        }
        self.node(node).ask();
        let assumed = self.assumed(node);
        self.inventory(node, Ok(assumed), reader)
    }

    /// What a KubeEdge node is assumed to hold, not knowing better: its
    /// pods and devices at some version (each goes again at its own
    /// version, which it ignores if held) and none of the objects they use
    /// (each goes at a fresh version, which supersedes a withdrawal). Pods
    /// being deleted too, at no version: each goes again marked deleted,
    /// and its kubelet says when it stopped.
    fn assumed(&self, node: &str) -> BTreeMap<String, String> {
        self.bound
            .iter()
            .filter(|(_, bound)| bound.node == node)
            .map(|(key, _)| key)
            .chain(
                self.terminating
                    .iter()
                    .filter(|(_, ending)| ending.node == node)
                    .map(|(key, _)| key),
            )
            .map(|key| (key.edge_resource().to_string(), "0".to_owned()))
            .collect()
    }

    /// Brings KubeEdge node `node` in step from its delivery cursor (what
    /// it acknowledged), asked for with [`Action::ReadCursor`]. A cursor
    /// that could not be read counts as none: everything goes again, as
    /// [`Reconciler::assumed`] has it.
    ///
    /// A cursor may lag (what was acknowledged after it was last written
    /// is missing), never run ahead, so it is read as what the node holds
    /// at least, less what it may have dropped since:
    ///
    /// - its pods and devices: the version acknowledged, or (missing) some
    ///   version; each goes again at its own unless acknowledged at or
    ///   above it. The version one is desired at (its last spec change) is
    ///   above any deletion of an earlier one of its name that the cursor
    ///   may not show;
    /// - a configmap, secret or device model it uses: its own version may
    ///   predate a withdrawal the cursor does not show (the replica that
    ///   recorded it died before writing it). It counts as held only if
    ///   something on the node using it is held at its current version,
    ///   recorded under the same claim: a replica withdraws nothing from
    ///   a node while something there uses it, and a withdrawal it queued
    ///   before is recorded before that user's acknowledgement. Otherwise
    ///   it goes again at a fresh version;
    /// - one [`Acked::UNSURE`]: not held if desired (it goes again at a
    ///   fresh version), held if not (withdrawn again);
    /// - what is no longer desired: withdrawn.
    ///
    /// Only the answer to the last read asked for on the node's current
    /// link is taken; whatever was sent since it was asked for is in
    /// flight and left alone.
    pub fn cursor(
        &mut self,
        node: &str,
        session: u64,
        cursor: Result<BTreeMap<String, Acked>, String>,
        reader: &dyn ObjectReader,
    ) -> Vec<Action> {
        let state = self.node(node);
        let in_flight = match state.reading.take() {
            Some((asked, sent)) if asked == session && state.link.is_some() => sent,
            other => {
                state.reading = other;
                tracing::debug!(%node, session, "a cursor read of an earlier link ignored");
                return Vec::new();
            }
        };
        let inventory = match cursor {
            Ok(cursor) => self.held_by_cursor(node, &cursor, reader),
            Err(reason) => {
                tracing::info!(%node, %reason, "no delivery cursor; the node gets everything again");
                self.assumed(node)
            }
        };
        self.reconcile(node, inventory, in_flight, reader)
    }

    /// What `node` holds, as far as its delivery cursor tells (see
    /// [`Reconciler::cursor`]), as an inventory.
    fn held_by_cursor(
        &self,
        node: &str,
        cursor: &BTreeMap<String, Acked>,
        reader: &dyn ObjectReader,
    ) -> BTreeMap<String, String> {
        let mut held = self.assumed(node);
        let mine: HashMap<String, &Bound> = self
            .bound
            .iter()
            .filter(|(_, bound)| bound.node == node)
            .map(|(key, bound)| (key.edge_resource().to_string(), bound))
            .collect();
        // What it uses that exists (what is gone is withdrawn; what
        // cannot be read counts as there).
        let wanted: HashMap<String, ObjectKey> = self
            .bound
            .wanted(node)
            .filter(|key| !matches!(reader.read(key), Ok(None)))
            .map(|key| (key.edge_resource().to_string(), key.clone()))
            .collect();
        // Whether something on the node using `key` is held at its
        // current version, recorded under `claim`.
        let used_as_held = |key: &ObjectKey, claim: i64| {
            mine.iter().any(|(resource, bound)| {
                bound.refs.contains(key)
                    && cursor.get(resource).is_some_and(|acked| {
                        acked.claim == claim
                            && acked.version != Acked::UNSURE
                            && acked.version >= bound.spec
                    })
            })
        };
        for (resource, acked) in cursor {
            let desired = mine.contains_key(resource) || wanted.contains_key(resource);
            if acked.version == Acked::UNSURE {
                match desired {
                    true => held.remove(resource),
                    false => held.insert(resource.clone(), "0".to_owned()),
                };
                continue;
            }
            let trusted = match wanted.get(resource) {
                Some(key) if !mine.contains_key(resource) => used_as_held(key, acked.claim),
                _ => true,
            };
            if trusted {
                held.insert(resource.clone(), acked.version.to_string());
            }
        }
        held
    }

    /// Brings `node` in step from what it reports holding: what it lacks or
    /// holds in an older version is sent, what it should not hold is
    /// withdrawn. Whatever was sent to it since it was asked is in flight
    /// and left alone. This repairs what a cloud crash between the
    /// desired-state commit and the queue commit, or a failed send, left
    /// behind.
    pub fn inventory(
        &mut self,
        node: &str,
        inventory: Result<BTreeMap<String, String>, String>,
        reader: &dyn ObjectReader,
    ) -> Vec<Action> {
        let state = self.node(node);
        state.asking = state.asking.saturating_sub(1);
        let in_flight = match state.asking {
            0 => state.asked.take(),
            _ => state.asked.clone(),
        }
        .unwrap_or_default();
        let inventory = match inventory {
            Ok(inventory) => inventory,
            Err(reason) => {
                tracing::debug!(%node, %reason, "no inventory; trying again later");
                self.node(node).out_of_step = true;
                return Vec::new();
            }
        };
        self.reconcile(node, inventory, in_flight, reader)
    }

    /// Brings `node` in step from `inventory`, what it holds, leaving
    /// alone what is `in_flight` (see [`Reconciler::inventory`]).
    fn reconcile(
        &mut self,
        node: &str,
        inventory: BTreeMap<String, String>,
        in_flight: BTreeSet<String>,
        reader: &dyn ObjectReader,
    ) -> Vec<Action> {
        // What the node should hold, with the version it should hold.
        let mut desired: BTreeMap<String, (ObjectKey, Value, u64)> = BTreeMap::new();
        let mut keys: Vec<(ObjectKey, Option<u64>)> = self
            .bound
            .iter()
            .filter(|(_, bound)| bound.node == node)
            .map(|(key, bound)| (key.clone(), Some(bound.spec)))
            .collect();
        keys.extend(self.bound.wanted(node).map(|key| (key.clone(), None)));
        for (key, spec) in keys {
            match reader.read(&key) {
                // Deleted and created again, elsewhere or not bound yet
                // (its events still to come): not this node's.
                Ok(Some(object)) if key.kind.bound_to_node() && node_of(&object) != Some(node) => {}
                Ok(Some(object)) => {
                    let version = spec.unwrap_or_else(|| {
                        self.referenced
                            .get(&key)
                            .map_or_else(|| spec_revision(&object), |(_, spec)| *spec)
                    });
                    desired.insert(key.edge_resource().to_string(), (key, object, version));
                }
                Ok(None) => {}
                Err(err) => {
                    tracing::warn!(%key, error = %err, "unreadable; reconciliation postponed");
                    self.node(node).out_of_step = true;
                    return Vec::new();
                }
            }
        }
        let loaded = self.loaded();
        let mut actions = Vec::new();
        // Graceful deletions. A device's: one the node no longer holds is
        // finished, one it still holds goes again. A pod's node is told
        // again (it may have restarted, or said it stopped to a cloud that
        // lost the word), and says again when the pod stopped: edgehive's
        // edge gets the delete (it says so at once if nothing of the pod
        // runs), a KubeEdge kubelet the pod marked deleted, unless it
        // holds that already (it asks until answered).
        let kubeedge = self.is_kubeedge(node);
        let ending: Vec<(ObjectKey, Ending)> = self
            .terminating
            .iter()
            .filter(|(_, ending)| ending.node == node)
            .map(|(key, ending)| (key.clone(), ending.clone()))
            .collect();
        for (key, ending) in ending {
            let resource = key.edge_resource().to_string();
            if in_flight.contains(&resource) {
                continue;
            }
            let held = inventory
                .get(&resource)
                .map(|v| v.parse::<u64>().unwrap_or(0));
            if key.kind != Kind::Pod {
                match held {
                    None => actions.push(Action::FinishDeletion {
                        key,
                        uid: ending.uid,
                    }),
                    Some(_) => actions.push(self.send(
                        node,
                        Op::Delete,
                        &key,
                        Arc::new(stub(&key)),
                        Version::Fresh,
                    )),
                }
                continue;
            }
            if !kubeedge {
                let mut object = stub(&key);
                if let Some(uid) = &ending.uid {
                    object["metadata"]["uid"] = json!(uid);
                }
                if let Some(ending) = self.terminating.get_mut(&key) {
                    ending.withdrawn = true;
                }
                actions.push(self.send(node, Op::Delete, &key, Arc::new(object), Version::Fresh));
                continue;
            }
            if !ending.withdrawn && held.is_some_and(|held| held >= ending.sent) {
                continue;
            }
            match reader.read(&key) {
                Ok(Some(object)) if terminating(&object) => {
                    if let Some(ending) = self.terminating.get_mut(&key) {
                        ending.withdrawn = false;
                    }
                    let op = match held {
                        Some(_) => Op::Update,
                        None => Op::Insert,
                    };
                    actions.push(self.send(node, op, &key, Arc::new(object), Version::Fresh));
                }
                // Gone meanwhile (its event is still to come), or created
                // again: its events decide.
                Ok(_) => {}
                Err(err) => {
                    tracing::warn!(%key, error = %err, "unreadable; its deletion is told again later");
                    self.node(node).out_of_step = true;
                }
            }
        }
        for resource in inventory.keys() {
            if desired.contains_key(resource) || in_flight.contains(resource) || !loaded {
                continue;
            }
            if self
                .terminating
                .keys()
                .any(|key| key.edge_resource().to_string() == *resource)
            {
                continue;
            }
            let Some(key) = resource
                .parse()
                .ok()
                .as_ref()
                .and_then(ObjectKey::from_edge_resource)
            else {
                continue;
            };
            // Bound to this node in the desired state, its events not
            // handled here yet (a replica that just took the node over):
            // a withdrawal at a fresh revision would outrank the object's
            // own version when its event comes, and the edge would lose
            // it. Its event decides.
            if key.kind.bound_to_node()
                && matches!(reader.read(&key), Ok(Some(object)) if node_of(&object) == Some(node))
            {
                continue;
            }
            tracing::debug!(%node, %resource, "withdrawn: not desired any more");
            actions.push(self.send(node, Op::Delete, &key, Arc::new(stub(&key)), Version::Fresh));
        }
        // What is referenced first, so a pod finds its configmaps and
        // secrets, a device its model.
        let ordered: Vec<&(ObjectKey, Value, u64)> = desired
            .values()
            .filter(|(key, _, _)| !key.kind.bound_to_node())
            .chain(
                desired
                    .values()
                    .filter(|(key, _, _)| key.kind.bound_to_node()),
            )
            .collect();
        let mut held = BTreeMap::new();
        let mut sends = Vec::new();
        for (key, object, version) in ordered {
            let resource = key.edge_resource().to_string();
            let has = inventory
                .get(&resource)
                .map(|v| v.parse::<u64>().unwrap_or(0));
            if !key.kind.bound_to_node() {
                held.insert(key.clone(), has.unwrap_or(*version).max(*version));
            }
            if in_flight.contains(&resource) {
                continue;
            }
            match has {
                Some(has) if has >= *version => {}
                // Older there: this version supersedes it.
                Some(_) => sends.push((
                    Op::Update,
                    key.clone(),
                    object.clone(),
                    Version::Of(*version),
                )),
                // Missing (perhaps withdrawn at a later revision): a fresh
                // revision supersedes any tombstone.
                None => sends.push((Op::Insert, key.clone(), object.clone(), Version::Fresh)),
            }
        }
        // What it was sent and does not report is kept: in flight, or
        // soon withdrawn (a later change or deletion of it goes there too;
        // a withdrawal of what it lacks does no harm).
        let state = self.node(node);
        for (key, version) in std::mem::take(&mut state.held) {
            let resource = key.edge_resource().to_string();
            if in_flight.contains(&resource) || !inventory.contains_key(&resource) {
                let held = held.entry(key).or_insert(version);
                *held = (*held).max(version);
            }
        }
        state.held = held;
        for (op, key, object, version) in sends {
            actions.push(self.send(node, op, &key, Arc::new(object), version));
        }
        if !actions.is_empty() {
            tracing::info!(%node, changes = actions.len(), "node brought in step");
        }
        actions
    }

    // ----- what nodes say -----

    /// Whether `node` may report the status of `key`: only of what is
    /// bound to it.
    pub fn may_report(&self, node: &str, key: &ObjectKey) -> bool {
        self.bound.get(key).is_some_and(|bound| bound.node == node)
            || self
                .terminating
                .get(key)
                .is_some_and(|ending| ending.node == node)
    }

    /// Whether devices and device models have been listed.
    pub fn devices_listed(&self) -> bool {
        self.loaded.contains(&Kind::Device) && self.loaded.contains(&Kind::DeviceModel)
    }

    /// The devices bound to `node`, in key order; `None` until devices
    /// and their models are listed (an empty list then would say the node
    /// has none, and a KubeEdge edge told so removes every device it holds).
    pub fn devices_of(&self, node: &str) -> Option<Vec<ObjectKey>> {
        if !self.devices_listed() {
            return None;
        }
        let mut devices: Vec<ObjectKey> = self
            .bound
            .iter()
            .filter(|(key, bound)| key.kind == Kind::Device && bound.node == node)
            .map(|(key, _)| key.clone())
            .collect();
        devices.sort();
        Some(devices)
    }

    /// Whether `node` may read `key`: its pods and devices, what they
    /// reference, services and endpoints, and its own Node.
    pub fn entitled(&self, node: &str, key: &ObjectKey) -> bool {
        match key.kind {
            Kind::Pod | Kind::Device => self.may_report(node, key),
            Kind::ConfigMap | Kind::Secret | Kind::DeviceModel => self.bound.is_wanted(node, key),
            Kind::Service | Kind::Endpoints => true,
            Kind::Node => key.name == node,
        }
    }

    /// `node` reported its own `Ready` condition.
    pub fn reported_ready(&mut self, node: &str, condition: NodeCondition) {
        self.node(node).reported_ready = Some(condition);
    }

    /// `node`'s link as a condition of its own (`EdgeLink`) at `now`.
    pub fn link_condition(&self, node: &str, now: Time) -> NodeCondition {
        let (status, reason, message) = match self.is_connected(node) {
            true => ("True", "Connected", "the node's link to the cloud is up"),
            false => (
                "False",
                "Disconnected",
                "the node's link to the cloud is down",
            ),
        };
        NodeCondition {
            type_: LINK_CONDITION.to_owned(),
            status: status.to_owned(),
            reason: Some(reason.to_owned()),
            message: Some(message.to_owned()),
            last_heartbeat_time: Some(now.clone()),
            last_transition_time: Some(now),
        }
    }

    /// `node`'s `Ready` condition at `now`: Unknown while its link is down,
    /// else what it reports of itself (True until it reports).
    pub fn ready_condition(&self, node: &str, now: Time) -> NodeCondition {
        let state = self.nodes.get(node);
        let time = Some(now);
        if state.is_none_or(|s| s.link.is_none()) {
            return NodeCondition {
                type_: "Ready".to_owned(),
                status: "Unknown".to_owned(),
                reason: Some("EdgeLinkDown".to_owned()),
                message: Some("the node's link to the cloud is down".to_owned()),
                last_heartbeat_time: time.clone(),
                last_transition_time: time,
            };
        }
        match state.and_then(|s| s.reported_ready.as_ref()) {
            Some(reported) => NodeCondition {
                last_heartbeat_time: time,
                ..reported.clone()
            },
            None => NodeCondition {
                type_: "Ready".to_owned(),
                status: "True".to_owned(),
                reason: Some("EdgeConnected".to_owned()),
                message: Some("the node is linked to the cloud".to_owned()),
                last_heartbeat_time: time.clone(),
                last_transition_time: time,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;

    use super::*;
    use crate::desired::SPEC_REVISION;
    use Op::{Delete, Insert, Update};
    use Version::{Fresh, Of};

    const NS: &str = "default";

    /// The desired state as the reader sees it.
    type Store = HashMap<ObjectKey, Value>;

    /// A send, shortly: node, operation, `<type>/<name>`, version.
    type Sent = (String, Op, String, Version);

    fn cm(name: &str, rv: u64, data: &str) -> Value {
        json!({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": { "name": name, "namespace": NS, "resourceVersion": rv.to_string() },
            "data": { "key": data },
        })
    }

    fn pod(name: &str, node: Option<&str>, rv: u64, cms: &[&str], image: &str) -> Value {
        let volumes: Vec<Value> = cms
            .iter()
            .map(|cm| json!({ "name": format!("v-{cm}"), "configMap": { "name": cm } }))
            .collect();
        let mut pod = json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": { "name": name, "namespace": NS, "resourceVersion": rv.to_string() },
            "spec": {
                "volumes": volumes,
                "containers": [{ "name": "app", "image": image }],
            },
            "status": { "phase": "Pending" },
        });
        if let Some(node) = node {
            pod["spec"]["nodeName"] = json!(node);
        }
        pod
    }

    /// `object` at another resource version.
    fn revised(object: &Value, rv: u64) -> Value {
        let mut object = object.clone();
        object["metadata"]["resourceVersion"] = json!(rv.to_string());
        object
    }

    fn key(kind: Kind, name: &str) -> ObjectKey {
        ObjectKey::new(kind, NS, name)
    }

    fn store_of(objects: &[Value]) -> Store {
        objects
            .iter()
            .map(|object| (ObjectKey::of(object).expect("a key"), object.clone()))
            .collect()
    }

    /// The stored objects of `kind`, in key order.
    fn of_kind(store: &Store, kind: Kind) -> Vec<Value> {
        let mut objects: Vec<(&ObjectKey, &Value)> =
            store.iter().filter(|(key, _)| key.kind == kind).collect();
        objects.sort_by(|a, b| a.0.cmp(b.0));
        objects
            .into_iter()
            .map(|(_, object)| object.clone())
            .collect()
    }

    /// A reconciler that took its first list of every kind from `store`.
    fn loaded(store: &Store, revision: u64) -> Reconciler {
        let mut r = Reconciler::new();
        for kind in FOLLOWED {
            let actions = r.listed(kind, of_kind(store, kind), revision, store);
            assert!(actions.is_empty(), "a first list sends nothing");
        }
        assert!(r.loaded());
        r
    }

    /// Stores `object` and tells the reconciler (Added or Modified).
    fn put(r: &mut Reconciler, store: &mut Store, object: Value) -> Vec<Action> {
        let key = ObjectKey::of(&object).expect("a key");
        let event = match store.insert(key.clone(), object.clone()) {
            None => WatchEvent::Added(object),
            Some(_) => WatchEvent::Modified(object),
        };
        r.observe(key.kind, &event, store)
    }

    /// Removes an object at revision `rv` and tells the reconciler.
    fn remove(
        r: &mut Reconciler,
        store: &mut Store,
        kind: Kind,
        name: &str,
        rv: u64,
    ) -> Vec<Action> {
        let object = store.remove(&key(kind, name)).expect("stored");
        r.observe(kind, &WatchEvent::Deleted(revised(&object, rv)), store)
    }

    fn short(key: &ObjectKey) -> String {
        format!("{}/{}", key.kind.resource_type(), key.name)
    }

    fn sends(actions: &[Action]) -> Vec<Sent> {
        actions
            .iter()
            .filter_map(|action| match action {
                Action::Send {
                    node,
                    op,
                    key,
                    version,
                    ..
                } => Some((node.clone(), *op, short(key), *version)),
                _ => None,
            })
            .collect()
    }

    fn sorted(mut sent: Vec<Sent>) -> Vec<Sent> {
        sent.sort_by(|a, b| (&a.0, &a.2).cmp(&(&b.0, &b.2)));
        sent
    }

    fn s(node: &str, op: Op, what: &str, version: Version) -> Sent {
        (node.to_owned(), op, what.to_owned(), version)
    }

    fn ask(node: &str) -> Action {
        Action::AskInventory {
            node: node.to_owned(),
        }
    }

    fn update_node(node: &str) -> Action {
        Action::UpdateNode {
            node: node.to_owned(),
        }
    }

    /// Reports every send as queued, a fresh version resolved to `fresh`.
    fn ack(r: &mut Reconciler, actions: &[Action], fresh: u64) {
        for action in actions {
            if let Action::Send {
                node,
                op,
                key,
                version,
                ..
            } = action
            {
                let version = match version {
                    Of(version) => *version,
                    Fresh => fresh,
                };
                r.sent(node, *op, key, version, true);
            }
        }
    }

    fn inventory(held: &[(&str, u64)]) -> BTreeMap<String, String> {
        held.iter()
            .map(|(resource, version)| (format!("{NS}/{resource}"), version.to_string()))
            .collect()
    }

    /// What the edges hold: per node, per resource, the version and the
    /// object (none for a tombstone), as edges keep them: a message is
    /// applied only if its version is above the one held.
    #[derive(Debug, Default)]
    struct Edges {
        nodes: BTreeMap<String, BTreeMap<String, (u64, Option<Value>)>>,
    }

    impl Edges {
        fn apply(&mut self, node: &str, op: Op, key: &ObjectKey, object: &Value, version: u64) {
            let records = self.nodes.entry(node.to_owned()).or_default();
            let resource = key.edge_resource().to_string();
            if records
                .get(&resource)
                .is_some_and(|(held, _)| *held >= version)
            {
                return;
            }
            let object = (op != Delete).then(|| object.clone());
            records.insert(resource, (version, object));
        }

        /// Applies every send of `actions`, a fresh version as `fresh`.
        fn apply_all(&mut self, actions: &[Action], fresh: u64) {
            for action in actions {
                if let Action::Send {
                    node,
                    op,
                    key,
                    object,
                    version,
                } = action
                {
                    let version = match version {
                        Of(version) => *version,
                        Fresh => fresh,
                    };
                    self.apply(node, *op, key, object, version);
                }
            }
        }

        /// What `node` reports holding.
        fn inventory(&self, node: &str) -> BTreeMap<String, String> {
            self.live(node)
                .into_iter()
                .map(|(resource, (version, _))| (resource, version.to_string()))
                .collect()
        }

        /// The objects `node` holds, with their versions.
        fn live(&self, node: &str) -> BTreeMap<String, (u64, Value)> {
            self.nodes
                .get(node)
                .into_iter()
                .flatten()
                .filter_map(|(resource, (version, object))| {
                    object
                        .clone()
                        .map(|object| (resource.clone(), (*version, object)))
                })
                .collect()
        }

        /// The resources `node` holds, shortly (`<type>/<name>`).
        fn holds(&self, node: &str) -> Vec<String> {
            self.live(node)
                .into_keys()
                .map(|resource| resource.trim_start_matches("default/").to_owned())
                .collect()
        }
    }

    // ----- lists -----

    #[test]
    fn first_lists_build_the_index_and_send_nothing() {
        let store = store_of(&[
            cm("cm", 2, "a"),
            pod("web", Some("edge-1"), 3, &["cm"], "nginx"),
            pod("idle", None, 4, &["cm"], "nginx"),
        ]);
        let mut r = Reconciler::new();
        for kind in FOLLOWED {
            assert!(!r.loaded(), "{kind} not listed yet");
            let actions = r.listed(kind, of_kind(&store, kind), 4, &store);
            assert!(actions.is_empty(), "{kind}: {actions:?}");
        }
        assert!(r.loaded());
        assert_eq!(r.bound_count(), 1, "an unbound pod waits");
        assert!(r.may_report("edge-1", &key(Kind::Pod, "web")));
        assert!(r.entitled("edge-1", &key(Kind::ConfigMap, "cm")));
        assert!(!r.may_report("edge-1", &key(Kind::Pod, "idle")));
        // The node is taken to hold what its pods reference: a change of
        // it goes there as an update.
        let mut store = store;
        let actions = put(&mut r, &mut store, cm("cm", 5, "b"));
        assert_eq!(
            sends(&actions),
            [s("edge-1", Update, "configmap/cm", Of(5))]
        );
    }

    #[test]
    fn a_relist_that_breaks_off_withdraws_nothing_and_the_next_finishes_it() {
        let mut store = store_of(&[
            cm("a", 2, "a"),
            pod("p1", Some("edge-1"), 3, &["a"], "nginx"),
            pod("p2", Some("edge-1"), 4, &["a"], "nginx"),
        ]);
        let mut r = loaded(&store, 4);
        // While the watch is down: p1 changes, p2 goes, p3 comes.
        store.insert(
            key(Kind::Pod, "p1"),
            pod("p1", Some("edge-1"), 5, &["a"], "nginx:2"),
        );
        store.remove(&key(Kind::Pod, "p2"));
        store.insert(
            key(Kind::Pod, "p3"),
            pod("p3", Some("edge-1"), 6, &["a"], "nginx"),
        );
        // The list breaks off after its first object: that object's change
        // is carried out; p2 is not taken for gone on a partial list.
        let mut listing = r.start_listing(Kind::Pod);
        let first = of_kind(&store, Kind::Pod).into_iter().next().expect("p1");
        r.list_item(&mut listing, first, &store);
        let actions = r.abandon_listing(listing);
        assert_eq!(sends(&actions), [s("edge-1", Update, "pod/p1", Of(5))]);
        ack(&mut r, &actions, 0);
        assert!(r.may_report("edge-1", &key(Kind::Pod, "p2")));
        // Listed again whole, object by object: the rest.
        let mut listing = r.start_listing(Kind::Pod);
        for object in of_kind(&store, Kind::Pod) {
            r.list_item(&mut listing, object, &store);
        }
        let actions = r.finish_listing(listing, 7, &store);
        assert_eq!(
            sorted(sends(&actions)),
            [
                s("edge-1", Delete, "pod/p2", Of(7)),
                s("edge-1", Insert, "pod/p3", Of(6)),
            ]
        );
    }

    #[test]
    fn a_relist_acts_on_the_differences() {
        let mut store = store_of(&[
            cm("a", 2, "a"),
            cm("b", 3, "b"),
            pod("p1", Some("edge-1"), 4, &["a"], "nginx"),
            pod("p2", Some("edge-1"), 5, &["b"], "nginx"),
            pod("p3", Some("edge-2"), 6, &["a"], "nginx"),
        ]);
        let mut r = loaded(&store, 6);
        // While the watch is down: p2 goes, p3 changes, p4 comes, p1's
        // status changes.
        store.remove(&key(Kind::Pod, "p2"));
        store.insert(
            key(Kind::Pod, "p3"),
            pod("p3", Some("edge-2"), 8, &["a"], "nginx:2"),
        );
        store.insert(
            key(Kind::Pod, "p4"),
            pod("p4", Some("edge-2"), 9, &["b"], "nginx"),
        );
        let mut p1 = pod("p1", Some("edge-1"), 10, &["a"], "nginx");
        p1["status"]["phase"] = json!("Running");
        store.insert(key(Kind::Pod, "p1"), p1);
        let actions = r.listed(Kind::Pod, of_kind(&store, Kind::Pod), 10, &store);
        assert_eq!(
            sorted(sends(&actions)),
            [
                s("edge-1", Delete, "configmap/b", Of(10)),
                s("edge-1", Delete, "pod/p2", Of(10)),
                s("edge-2", Insert, "configmap/b", Of(9)),
                s("edge-2", Update, "pod/p3", Of(8)),
                s("edge-2", Insert, "pod/p4", Of(9)),
            ]
        );
        let position = |what: &str| sends(&actions).iter().position(|sent| sent.2 == what);
        assert!(position("configmap/b") < position("pod/p4"), "{actions:?}");
        ack(&mut r, &actions, 0);
        assert_eq!(r.bound_count(), 3);
        assert!(!r.may_report("edge-1", &key(Kind::Pod, "p2")));
        // Configmaps: a changes, b goes (edge-2 holds it for p4), c comes
        // (nobody uses it).
        store.insert(key(Kind::ConfigMap, "a"), cm("a", 11, "a2"));
        store.remove(&key(Kind::ConfigMap, "b"));
        store.insert(key(Kind::ConfigMap, "c"), cm("c", 13, "c"));
        let actions = r.listed(
            Kind::ConfigMap,
            of_kind(&store, Kind::ConfigMap),
            13,
            &store,
        );
        assert_eq!(
            sorted(sends(&actions)),
            [
                s("edge-1", Update, "configmap/a", Of(11)),
                s("edge-2", Update, "configmap/a", Of(11)),
                s("edge-2", Delete, "configmap/b", Of(13)),
            ]
        );
        // Nothing changed since: a third list sends nothing.
        ack(&mut r, &actions, 0);
        assert!(
            r.listed(Kind::Pod, of_kind(&store, Kind::Pod), 14, &store)
                .is_empty()
        );
        assert!(
            r.listed(
                Kind::ConfigMap,
                of_kind(&store, Kind::ConfigMap),
                14,
                &store
            )
            .is_empty()
        );
    }

    // ----- watch events -----

    #[test]
    fn a_bound_pod_takes_its_configmap_first_and_leaves_with_it() {
        let mut store = store_of(&[cm("cm", 2, "a")]);
        let mut r = loaded(&store, 2);
        let web = pod("web", Some("edge-1"), 3, &["cm"], "nginx:1");
        let actions = put(&mut r, &mut store, web.clone());
        assert_eq!(
            sends(&actions),
            [
                s("edge-1", Insert, "configmap/cm", Of(3)),
                s("edge-1", Insert, "pod/web", Of(3)),
            ]
        );
        let Action::Send { object, .. } = &actions[0] else {
            panic!("a send");
        };
        assert_eq!(**object, cm("cm", 2, "a"), "the configmap as stored");
        ack(&mut r, &actions, 0);
        // Only the status changes: the node has the spec.
        let mut running = revised(&web, 4);
        running["status"]["phase"] = json!("Running");
        assert!(put(&mut r, &mut store, running).is_empty());
        // The spec changes.
        let upgraded = pod("web", Some("edge-1"), 5, &["cm"], "nginx:2");
        let actions = put(&mut r, &mut store, upgraded);
        assert_eq!(sends(&actions), [s("edge-1", Update, "pod/web", Of(5))]);
        ack(&mut r, &actions, 0);
        // Deleted: the pod goes, and the configmap nothing uses any more.
        let actions = remove(&mut r, &mut store, Kind::Pod, "web", 6);
        assert_eq!(
            sends(&actions),
            [
                s("edge-1", Delete, "pod/web", Of(6)),
                s("edge-1", Delete, "configmap/cm", Of(6)),
            ]
        );
        assert_eq!(r.bound_count(), 0);
        assert!(!r.entitled("edge-1", &key(Kind::ConfigMap, "cm")));
        // Gone from the node: a change of it stays in the cloud.
        ack(&mut r, &actions, 0);
        assert!(put(&mut r, &mut store, cm("cm", 7, "b")).is_empty());
    }

    #[test]
    fn a_configmap_goes_to_the_nodes_that_use_it_and_only_there() {
        let mut store = store_of(&[cm("shared", 2, "a")]);
        let mut r = loaded(&store, 2);
        for (rv, node) in [(3, "edge-1"), (4, "edge-2")] {
            let actions = put(
                &mut r,
                &mut store,
                pod(&format!("app-{node}"), Some(node), rv, &["shared"], "nginx"),
            );
            assert_eq!(
                sends(&actions)[0],
                s(node, Insert, "configmap/shared", Of(rv))
            );
            ack(&mut r, &actions, 0);
        }
        let actions = put(
            &mut r,
            &mut store,
            pod("other", Some("edge-3"), 5, &[], "nginx"),
        );
        assert_eq!(sends(&actions), [s("edge-3", Insert, "pod/other", Of(5))]);
        // A change goes to both, not to edge-3.
        let actions = put(&mut r, &mut store, cm("shared", 6, "b"));
        assert_eq!(
            sorted(sends(&actions)),
            [
                s("edge-1", Update, "configmap/shared", Of(6)),
                s("edge-2", Update, "configmap/shared", Of(6)),
            ]
        );
        ack(&mut r, &actions, 0);
        // A new resource version with the same content: nothing to send.
        assert!(put(&mut r, &mut store, cm("shared", 7, "b")).is_empty());
        let mut labelled = cm("shared", 8, "b");
        labelled["metadata"]["uid"] = json!("0b6f");
        labelled["metadata"]["annotations"] = json!({ SPEC_REVISION: "6" });
        assert!(put(&mut r, &mut store, labelled).is_empty());
        // Deleted: both holders drop it.
        let actions = remove(&mut r, &mut store, Kind::ConfigMap, "shared", 9);
        assert_eq!(
            sorted(sends(&actions)),
            [
                s("edge-1", Delete, "configmap/shared", Of(9)),
                s("edge-2", Delete, "configmap/shared", Of(9)),
            ]
        );
        ack(&mut r, &actions, 0);
        // Created again: it goes to the nodes that use it, as new.
        let actions = put(&mut r, &mut store, cm("shared", 10, "c"));
        assert_eq!(
            sorted(sends(&actions)),
            [
                s("edge-1", Insert, "configmap/shared", Of(10)),
                s("edge-2", Insert, "configmap/shared", Of(10)),
            ]
        );
    }

    #[test]
    fn a_configmap_stays_while_a_pod_on_the_node_uses_it() {
        let mut store = store_of(&[cm("cm", 2, "a")]);
        let mut r = loaded(&store, 2);
        let actions = put(
            &mut r,
            &mut store,
            pod("a", Some("edge-1"), 3, &["cm"], "nginx"),
        );
        assert_eq!(sends(&actions).len(), 2);
        ack(&mut r, &actions, 0);
        let actions = put(
            &mut r,
            &mut store,
            pod("b", Some("edge-1"), 4, &["cm"], "nginx"),
        );
        assert_eq!(sends(&actions), [s("edge-1", Insert, "pod/b", Of(4))]);
        ack(&mut r, &actions, 0);
        let actions = remove(&mut r, &mut store, Kind::Pod, "a", 5);
        assert_eq!(sends(&actions), [s("edge-1", Delete, "pod/a", Of(5))]);
        ack(&mut r, &actions, 0);
        let actions = remove(&mut r, &mut store, Kind::Pod, "b", 6);
        assert_eq!(
            sends(&actions),
            [
                s("edge-1", Delete, "pod/b", Of(6)),
                s("edge-1", Delete, "configmap/cm", Of(6)),
            ]
        );
    }

    #[test]
    fn a_pod_no_longer_using_a_configmap_lets_it_go() {
        let mut store = store_of(&[cm("a", 2, "a"), cm("b", 3, "b")]);
        let mut r = loaded(&store, 3);
        let actions = put(
            &mut r,
            &mut store,
            pod("p", Some("edge-1"), 4, &["a"], "nginx"),
        );
        ack(&mut r, &actions, 0);
        let actions = put(
            &mut r,
            &mut store,
            pod("p", Some("edge-1"), 5, &["b"], "nginx"),
        );
        assert_eq!(
            sends(&actions),
            [
                s("edge-1", Insert, "configmap/b", Of(5)),
                s("edge-1", Delete, "configmap/a", Of(5)),
                s("edge-1", Update, "pod/p", Of(5)),
            ]
        );
    }

    #[test]
    fn an_unbound_pod_waits_for_its_node() {
        let mut store = store_of(&[cm("cm", 2, "a")]);
        let mut r = loaded(&store, 2);
        let actions = put(&mut r, &mut store, pod("later", None, 3, &["cm"], "nginx"));
        assert!(actions.is_empty());
        assert_eq!(r.bound_count(), 0);
        assert!(!r.may_report("edge-2", &key(Kind::Pod, "later")));
        let actions = put(
            &mut r,
            &mut store,
            pod("later", Some("edge-2"), 4, &["cm"], "nginx"),
        );
        assert_eq!(
            sends(&actions),
            [
                s("edge-2", Insert, "configmap/cm", Of(4)),
                s("edge-2", Insert, "pod/later", Of(4)),
            ]
        );
        assert!(r.may_report("edge-2", &key(Kind::Pod, "later")));
        // Deleted before it was ever bound: nothing to tell anyone.
        put(&mut r, &mut store, pod("never", None, 5, &[], "nginx"));
        assert!(remove(&mut r, &mut store, Kind::Pod, "never", 6).is_empty());
    }

    #[test]
    fn a_configmap_held_above_its_revision_is_updated_fresh() {
        let mut store = store_of(&[cm("cm", 2, "a")]);
        let mut r = loaded(&store, 2);
        let mut edges = Edges::default();
        // The pod goes at revision 10, its configmap with it.
        let actions = put(
            &mut r,
            &mut store,
            pod("web", Some("edge-1"), 10, &["cm"], "nginx"),
        );
        assert_eq!(
            sends(&actions)[0],
            s("edge-1", Insert, "configmap/cm", Of(10))
        );
        edges.apply_all(&actions, 0);
        ack(&mut r, &actions, 0);
        // A change at revision 9, handled after the pod's: at 9 the node
        // would take it for an old one.
        let actions = put(&mut r, &mut store, cm("cm", 9, "b"));
        assert_eq!(
            sends(&actions),
            [s("edge-1", Update, "configmap/cm", Fresh)]
        );
        edges.apply_all(&actions, 11);
        ack(&mut r, &actions, 11);
        assert_eq!(
            edges.live("edge-1")["default/configmap/cm"],
            (11, cm("cm", 9, "b"))
        );
        // Later changes go at their own revision, above the fresh one.
        let actions = put(&mut r, &mut store, cm("cm", 12, "c"));
        assert_eq!(
            sends(&actions),
            [s("edge-1", Update, "configmap/cm", Of(12))]
        );
        edges.apply_all(&actions, 0);
        assert_eq!(
            edges.live("edge-1")["default/configmap/cm"].1,
            cm("cm", 12, "c")
        );
    }

    #[test]
    fn devices_take_their_models() {
        let model = json!({
            "apiVersion": "devices.kubeedge.io/v1beta1",
            "kind": "DeviceModel",
            "metadata": { "name": "thermo", "namespace": NS, "resourceVersion": "2" },
            "spec": { "protocol": "modbus" },
        });
        let device = json!({
            "apiVersion": "devices.kubeedge.io/v1beta1",
            "kind": "Device",
            "metadata": { "name": "t1", "namespace": NS, "resourceVersion": "3" },
            "spec": { "nodeName": "edge-1", "deviceModelRef": { "name": "thermo" } },
        });
        let mut store = store_of(&[model]);
        let mut r = loaded(&store, 2);
        let actions = put(&mut r, &mut store, device);
        assert_eq!(
            sends(&actions),
            [
                s("edge-1", Insert, "devicemodel/thermo", Of(3)),
                s("edge-1", Insert, "device/t1", Of(3)),
            ]
        );
        assert!(r.may_report("edge-1", &key(Kind::Device, "t1")));
        assert!(r.entitled("edge-1", &key(Kind::DeviceModel, "thermo")));
        ack(&mut r, &actions, 0);
        let actions = remove(&mut r, &mut store, Kind::Device, "t1", 4);
        assert_eq!(
            sends(&actions),
            [
                s("edge-1", Delete, "device/t1", Of(4)),
                s("edge-1", Delete, "devicemodel/thermo", Of(4)),
            ]
        );
    }

    /// Each action as one line, in order: `+edge-1 device/t1` (joined a
    /// node's devices), `-edge-1 device/t1` (left), `edge-1 Insert
    /// device/t1` (sent).
    fn steps(actions: &[Action]) -> Vec<String> {
        actions
            .iter()
            .filter_map(|action| match action {
                Action::Membership {
                    node,
                    device,
                    joined,
                    object,
                } => {
                    assert_eq!(ObjectKey::of(object).as_ref(), Some(device));
                    let sign = if *joined { '+' } else { '-' };
                    Some(format!("{sign}{node} {}", short(device)))
                }
                Action::Send { node, op, key, .. } => Some(format!("{node} {op:?} {}", short(key))),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn a_kubeedge_nodes_twin_hears_of_devices_joining_and_leaving_first() {
        let model = json!({
            "apiVersion": "devices.kubeedge.io/v1beta1",
            "kind": "DeviceModel",
            "metadata": { "name": "thermo", "namespace": NS, "resourceVersion": "2" },
        });
        let device = |node: &str, rv: u64, extra: Value| {
            let mut device = json!({
                "apiVersion": "devices.kubeedge.io/v1beta1",
                "kind": "Device",
                "metadata": { "name": "t1", "namespace": NS, "resourceVersion": rv.to_string() },
                "spec": { "nodeName": node, "deviceModelRef": { "name": "thermo" }, "extra": extra },
            });
            if extra.is_null() {
                device["spec"]
                    .as_object_mut()
                    .map(|spec| spec.remove("extra"));
            }
            device
        };
        let mut store = store_of(&[model]);
        let mut r = loaded(&store, 2);
        r.connected("kube-1", NodeDialect::KubeEdge, &store);
        r.connected("kube-2", NodeDialect::KubeEdge, &store);
        r.connected("native", NodeDialect::Native, &store);

        // Bound to a KubeEdge node: its twin first, then the model, then
        // the device.
        let actions = put(&mut r, &mut store, device("kube-1", 3, Value::Null));
        assert_eq!(
            steps(&actions),
            [
                "+kube-1 device/t1",
                "kube-1 Insert devicemodel/thermo",
                "kube-1 Insert device/t1"
            ]
        );
        ack(&mut r, &actions, 0);
        // A spec change on the same node, or a status change: no news to
        // the twin.
        let actions = put(&mut r, &mut store, device("kube-1", 4, json!(1)));
        assert_eq!(steps(&actions), ["kube-1 Update device/t1"]);
        let mut reported = device("kube-1", 5, json!(1));
        reported["status"] = json!({"state": "online"});
        assert_eq!(
            steps(&put(&mut r, &mut store, reported)),
            Vec::<String>::new()
        );

        // Moved (deleted and created again while the watch was down):
        // it leaves the one, then joins the other.
        let actions = put(&mut r, &mut store, device("kube-2", 6, Value::Null));
        assert_eq!(
            steps(&actions),
            [
                "-kube-1 device/t1",
                "kube-1 Delete device/t1",
                "kube-1 Delete devicemodel/thermo",
                "+kube-2 device/t1",
                "kube-2 Insert devicemodel/thermo",
                "kube-2 Insert device/t1"
            ]
        );
        ack(&mut r, &actions, 7);
        // Deleted: the twin hears of it before the device goes.
        let actions = remove(&mut r, &mut store, Kind::Device, "t1", 8);
        assert_eq!(
            steps(&actions),
            [
                "-kube-2 device/t1",
                "kube-2 Delete device/t1",
                "kube-2 Delete devicemodel/thermo"
            ]
        );
        ack(&mut r, &actions, 0);

        // An edgehive node learns from the objects; a KubeEdge node not
        // linked, from its twin sync when it links.
        let actions = put(&mut r, &mut store, device("native", 9, Value::Null));
        assert!(steps(&actions).iter().all(|s| !s.starts_with(['+', '-'])));
        remove(&mut r, &mut store, Kind::Device, "t1", 10);
        r.disconnected("kube-1");
        let actions = put(&mut r, &mut store, device("kube-1", 11, Value::Null));
        assert!(steps(&actions).iter().all(|s| !s.starts_with(['+', '-'])));
        r.connected("kube-1", NodeDialect::KubeEdge, &store);

        // Deleted gracefully: it leaves the twin when its deletion goes.
        let mut going = device("kube-1", 12, Value::Null);
        going["metadata"]["deletionTimestamp"] = json!("2026-11-26T10:00:00Z");
        let actions = put(&mut r, &mut store, going.clone());
        assert_eq!(
            steps(&actions)[..2],
            ["-kube-1 device/t1", "kube-1 Delete device/t1"]
        );
        going["metadata"]["resourceVersion"] = json!("13");
        let again = put(&mut r, &mut store, going);
        assert!(steps(&again).iter().all(|s| !s.starts_with(['+', '-'])));
    }

    /// Carries out `actions` on `edges` and reports them sent, a fresh
    /// version resolved to `fresh`.
    fn deliver(r: &mut Reconciler, edges: &mut Edges, actions: &[Action], fresh: u64) {
        edges.apply_all(actions, fresh);
        ack(r, actions, fresh);
    }

    #[test]
    fn a_withdrawal_goes_above_what_the_node_holds() {
        let mut store = store_of(&[cm("cm", 2, "a")]);
        let mut r = loaded(&store, 2);
        let mut edges = Edges::default();
        let actions = put(
            &mut r,
            &mut store,
            pod("a", Some("edge-1"), 3, &["cm"], "nginx"),
        );
        deliver(&mut r, &mut edges, &actions, 0);
        assert_eq!(edges.holds("edge-1"), ["configmap/cm", "pod/a"]);
        // Pod a is deleted at 4, the configmap changed at 5, pod b (using
        // it too) created at 6. The controller takes configmaps first.
        let a = store.remove(&key(Kind::Pod, "a")).expect("stored");
        store.insert(key(Kind::ConfigMap, "cm"), cm("cm", 5, "b"));
        let b = pod("b", Some("edge-1"), 6, &["cm"], "nginx");
        store.insert(key(Kind::Pod, "b"), b.clone());
        let event = WatchEvent::Modified(cm("cm", 5, "b"));
        let actions = r.observe(Kind::ConfigMap, &event, &store);
        assert_eq!(
            sends(&actions),
            [s("edge-1", Update, "configmap/cm", Of(5))]
        );
        deliver(&mut r, &mut edges, &actions, 0);
        // The configmap is held at 5: its withdrawal at 4 would be taken
        // for an old message.
        let event = WatchEvent::Deleted(revised(&a, 4));
        let actions = r.observe(Kind::Pod, &event, &store);
        deliver(&mut r, &mut edges, &actions, 7);
        assert!(edges.holds("edge-1").is_empty(), "{edges:?}");
        // And it comes back with pod b, above its withdrawal.
        let actions = r.observe(Kind::Pod, &WatchEvent::Added(b), &store);
        deliver(&mut r, &mut edges, &actions, 8);
        assert_eq!(edges.holds("edge-1"), ["configmap/cm", "pod/b"]);
        assert_eq!(
            edges.live("edge-1")["default/configmap/cm"].1,
            cm("cm", 5, "b")
        );
    }

    #[test]
    fn a_withdrawal_goes_above_what_an_inventory_sent() {
        let mut store = store_of(&[cm("cm", 2, "a")]);
        let mut r = loaded(&store, 2);
        let mut edges = Edges::default();
        r.connected("edge-1", NodeDialect::Native, &store);
        assert!(
            r.inventory("edge-1", Ok(BTreeMap::new()), &store)
                .is_empty()
        );
        // The pod goes, its configmap does not (cloudhub did not take it).
        let actions = put(
            &mut r,
            &mut store,
            pod("a", Some("edge-1"), 3, &["cm"], "nginx"),
        );
        edges.apply_all(&actions[1..], 0);
        r.sent("edge-1", Insert, &key(Kind::ConfigMap, "cm"), 3, false);
        r.sent("edge-1", Insert, &key(Kind::Pod, "a"), 3, true);
        assert_eq!(r.retry(&store), [ask("edge-1")]);
        // The pod is deleted at 4; the inventory is answered before the
        // deletion is seen: the configmap goes, at a fresh version (5).
        let a = store.remove(&key(Kind::Pod, "a")).expect("stored");
        let actions = r.inventory("edge-1", Ok(edges.inventory("edge-1")), &store);
        deliver(&mut r, &mut edges, &actions, 5);
        assert_eq!(edges.holds("edge-1"), ["configmap/cm"]);
        // Then the deletion: the configmap must go too.
        let actions = r.observe(Kind::Pod, &WatchEvent::Deleted(revised(&a, 4)), &store);
        deliver(&mut r, &mut edges, &actions, 6);
        assert!(edges.holds("edge-1").is_empty(), "{edges:?}");
    }

    #[test]
    fn a_relist_hands_a_configmap_from_a_gone_pod_to_a_new_one() {
        let mut store = store_of(&[cm("cm", 2, "a")]);
        let mut r = loaded(&store, 2);
        let mut edges = Edges::default();
        let actions = put(
            &mut r,
            &mut store,
            pod("a", Some("edge-1"), 3, &["cm"], "nginx"),
        );
        deliver(&mut r, &mut edges, &actions, 0);
        // While the watch is down, a goes (4) and b comes (5), both using
        // the configmap.
        store.remove(&key(Kind::Pod, "a"));
        store.insert(
            key(Kind::Pod, "b"),
            pod("b", Some("edge-1"), 5, &["cm"], "nginx"),
        );
        let actions = r.listed(Kind::Pod, of_kind(&store, Kind::Pod), 5, &store);
        deliver(&mut r, &mut edges, &actions, 6);
        assert_eq!(
            edges.holds("edge-1"),
            ["configmap/cm", "pod/b"],
            "{actions:?}"
        );
    }

    #[test]
    fn a_relist_takes_a_pod_from_the_node_it_left() {
        let mut store = store_of(&[cm("cm", 2, "a")]);
        let mut r = loaded(&store, 2);
        let mut edges = Edges::default();
        for object in [
            pod("moved", Some("edge-1"), 3, &["cm"], "nginx"),
            pod("unbound", Some("edge-1"), 4, &[], "nginx"),
        ] {
            let actions = put(&mut r, &mut store, object);
            deliver(&mut r, &mut edges, &actions, 0);
        }
        assert_eq!(
            edges.holds("edge-1"),
            ["configmap/cm", "pod/moved", "pod/unbound"]
        );
        // While the watch is down, both are deleted and created again with
        // the same names: one on edge-2, one not bound yet.
        store.insert(
            key(Kind::Pod, "moved"),
            pod("moved", Some("edge-2"), 6, &["cm"], "nginx"),
        );
        store.insert(
            key(Kind::Pod, "unbound"),
            pod("unbound", None, 8, &[], "nginx"),
        );
        let actions = r.listed(Kind::Pod, of_kind(&store, Kind::Pod), 8, &store);
        deliver(&mut r, &mut edges, &actions, 9);
        assert!(edges.holds("edge-1").is_empty(), "{actions:?}");
        assert_eq!(edges.holds("edge-2"), ["configmap/cm", "pod/moved"]);
        assert!(!r.may_report("edge-1", &key(Kind::Pod, "moved")));
        assert!(!r.may_report("edge-1", &key(Kind::Pod, "unbound")));
        assert!(r.may_report("edge-2", &key(Kind::Pod, "moved")));
        for action in &actions {
            if let Action::Send { node, object, .. } = action
                && let Some(bound) = node_of(object)
            {
                assert_eq!(bound, node, "{action:?}");
            }
        }
    }

    #[test]
    fn nodes_linked_before_the_first_lists_are_brought_in_step_after() {
        let store = store_of(&[
            cm("a", 2, "a"),
            pod("p1", Some("edge-1"), 3, &["a"], "nginx"),
        ]);
        let mut r = Reconciler::new();
        // Pods could not be listed at start: the node links meanwhile.
        assert!(
            r.listed(Kind::ConfigMap, of_kind(&store, Kind::ConfigMap), 3, &store)
                .is_empty()
        );
        r.connected("edge-1", NodeDialect::Native, &store);
        assert!(
            r.inventory("edge-1", Ok(BTreeMap::new()), &store)
                .is_empty()
        );
        for kind in FOLLOWED {
            r.listed(kind, of_kind(&store, kind), 3, &store);
        }
        assert!(r.loaded());
        // The next retry asks it again, now that everything is known.
        assert_eq!(r.retry(&store), [ask("edge-1")]);
        let actions = r.inventory("edge-1", Ok(BTreeMap::new()), &store);
        assert_eq!(
            sends(&actions),
            [
                s("edge-1", Insert, "configmap/a", Fresh),
                s("edge-1", Insert, "pod/p1", Fresh),
            ]
        );
    }

    #[test]
    fn a_relist_sends_each_object_once_per_node() {
        // Pod b uses configmap x, which does not exist yet.
        let mut store = store_of(&[pod("b", Some("edge-1"), 3, &["x"], "nginx")]);
        let mut r = loaded(&store, 3);
        let mut edges = Edges::default();
        // While the pod watch is down: a comes (5), b stops using x (6).
        store.insert(
            key(Kind::Pod, "a"),
            pod("a", Some("edge-1"), 5, &[], "nginx"),
        );
        store.insert(
            key(Kind::Pod, "b"),
            pod("b", Some("edge-1"), 6, &[], "nginx"),
        );
        // The node links and holds something it should not: withdrawn at
        // a fresh version (7).
        r.connected("edge-1", NodeDialect::Native, &store);
        let zombie = [("configmap/zombie", 1), ("pod/b", 3)];
        edges.apply(
            "edge-1",
            Insert,
            &key(Kind::ConfigMap, "zombie"),
            &cm("zombie", 1, "z"),
            1,
        );
        let actions = r.inventory("edge-1", Ok(inventory(&zombie)), &store);
        assert_eq!(
            sends(&actions),
            [s("edge-1", Delete, "configmap/zombie", Fresh)]
        );
        deliver(&mut r, &mut edges, &actions, 7);
        // x is created (8), then the pods are listed again: a, taken first,
        // finds x wanted by b as it was; b then lets it go. Only the last
        // decision goes: nothing of x.
        store.insert(key(Kind::ConfigMap, "x"), cm("x", 8, "x"));
        let actions = r.listed(Kind::Pod, of_kind(&store, Kind::Pod), 8, &store);
        deliver(&mut r, &mut edges, &actions, 9);
        assert!(
            !edges.holds("edge-1").contains(&"configmap/x".to_owned()),
            "{actions:?}"
        );
        let x = sends(&actions)
            .into_iter()
            .filter(|sent| sent.2 == "configmap/x")
            .count();
        assert!(x <= 1, "{actions:?}");
    }

    #[test]
    fn a_fresh_update_carries_the_current_content() {
        let mut store = store_of(&[cm("cm", 2, "a")]);
        let mut r = loaded(&store, 2);
        let mut edges = Edges::default();
        r.connected("edge-1", NodeDialect::Native, &store);
        assert!(
            r.inventory("edge-1", Ok(BTreeMap::new()), &store)
                .is_empty()
        );
        // The configmap changes at 9 and 11; the pod using it, created at
        // 10, is handled first and takes it at 10.
        store.insert(key(Kind::ConfigMap, "cm"), cm("cm", 11, "c"));
        let actions = put(
            &mut r,
            &mut store,
            pod("web", Some("edge-1"), 10, &["cm"], "nginx"),
        );
        deliver(&mut r, &mut edges, &actions, 0);
        // The change at 9 goes fresh (12): as the configmap is now.
        let event = WatchEvent::Modified(cm("cm", 9, "b"));
        let actions = r.observe(Kind::ConfigMap, &event, &store);
        assert_eq!(
            sends(&actions),
            [s("edge-1", Update, "configmap/cm", Fresh)]
        );
        deliver(&mut r, &mut edges, &actions, 12);
        // The change at 11 goes fresh too (13), but is not queued.
        let event = WatchEvent::Modified(cm("cm", 11, "c"));
        let actions = r.observe(Kind::ConfigMap, &event, &store);
        assert_eq!(
            sends(&actions),
            [s("edge-1", Update, "configmap/cm", Fresh)]
        );
        r.sent("edge-1", Update, &key(Kind::ConfigMap, "cm"), 13, false);
        // The node reports it at 12, above its revision (11): in step, so
        // it must hold 11's content.
        assert_eq!(r.retry(&store), [ask("edge-1")]);
        let actions = r.inventory("edge-1", Ok(edges.inventory("edge-1")), &store);
        deliver(&mut r, &mut edges, &actions, 14);
        assert_eq!(
            edges.live("edge-1")["default/configmap/cm"].1,
            cm("cm", 11, "c")
        );
    }

    #[test]
    fn what_an_inventory_lacks_in_flight_stays_known_as_held() {
        let mut store = store_of(&[cm("cm", 2, "a")]);
        let mut r = loaded(&store, 2);
        let mut edges = Edges::default();
        r.connected("edge-1", NodeDialect::Native, &store);
        // Sent while the inventory is on its way.
        let actions = put(
            &mut r,
            &mut store,
            pod("web", Some("edge-1"), 3, &["cm"], "nginx"),
        );
        let held_before = edges.inventory("edge-1");
        deliver(&mut r, &mut edges, &actions, 0);
        // The configmap is deleted (4); the inventory, which lacks it,
        // comes before the deletion is seen.
        let gone = store.remove(&key(Kind::ConfigMap, "cm")).expect("stored");
        let actions = r.inventory("edge-1", Ok(held_before), &store);
        deliver(&mut r, &mut edges, &actions, 5);
        // The deletion goes to the node, which holds it.
        let event = WatchEvent::Deleted(revised(&gone, 4));
        let actions = r.observe(Kind::ConfigMap, &event, &store);
        assert_eq!(
            sends(&actions),
            [s("edge-1", Delete, "configmap/cm", Of(4))]
        );
        deliver(&mut r, &mut edges, &actions, 0);
        assert_eq!(edges.holds("edge-1"), ["pod/web"]);
    }

    #[test]
    fn an_inventory_sends_no_pod_bound_elsewhere_now() {
        let mut store = store_of(&[pod("web", Some("edge-1"), 2, &[], "nginx")]);
        let mut r = loaded(&store, 2);
        // Deleted (3) and created again on edge-2 (4), events not yet seen;
        // edge-1, which lost it, reports.
        store.insert(
            key(Kind::Pod, "web"),
            pod("web", Some("edge-2"), 4, &[], "nginx"),
        );
        r.connected("edge-1", NodeDialect::Native, &store);
        let actions = r.inventory("edge-1", Ok(BTreeMap::new()), &store);
        assert!(sends(&actions).is_empty(), "{actions:?}");
        // A KubeEdge node, assumed to hold it, is told to drop it.
        r.disconnected("edge-1");
        let actions = r.connected("edge-1", NodeDialect::KubeEdge, &store);
        assert_eq!(sends(&actions), [s("edge-1", Delete, "pod/web", Fresh)]);
    }

    /// A replica that has just taken a node over reads a pod bound to it
    /// whose event it has not handled yet: the node holds it (another
    /// replica sent it), and it is not withdrawn.
    #[test]
    fn an_inventory_keeps_a_pod_bound_here_whose_event_is_still_to_come() {
        let mut store = store_of(&[]);
        let mut r = loaded(&store, 1);
        store.insert(
            key(Kind::Pod, "web"),
            pod("web", Some("edge-1"), 5, &[], "nginx"),
        );
        r.connected("edge-1", NodeDialect::Native, &store);
        let held = inventory(&[("pod/web", 5)]);
        let actions = r.inventory("edge-1", Ok(held), &store);
        assert!(sends(&actions).is_empty(), "{actions:?}");
    }

    #[test]
    fn every_answer_leaves_alone_what_was_sent_since_the_first_ask() {
        let mut store = store_of(&[pod("web", Some("edge-1"), 2, &[], "nginx")]);
        let mut r = loaded(&store, 2);
        let mut edges = Edges::default();
        edges.apply(
            "edge-1",
            Insert,
            &key(Kind::Pod, "web"),
            &store[&key(Kind::Pod, "web")],
            2,
        );
        // Asked once; the node answers with what it holds then.
        assert_eq!(
            r.connected("edge-1", NodeDialect::Native, &store)[0],
            ask("edge-1")
        );
        let first = edges.inventory("edge-1");
        // The pod is deleted (3) and sent; then asked again (a failed send).
        let actions = remove(&mut r, &mut store, Kind::Pod, "web", 3);
        deliver(&mut r, &mut edges, &actions, 0);
        r.sent("edge-1", Delete, &key(Kind::Pod, "web"), 3, false);
        assert_eq!(r.retry(&store), [ask("edge-1")]);
        // Created again (4), its event not yet seen; the second answer
        // comes first, then the first, which still shows the old pod.
        store.insert(
            key(Kind::Pod, "web"),
            pod("web", Some("edge-1"), 4, &[], "nginx:2"),
        );
        let actions = r.inventory("edge-1", Ok(edges.inventory("edge-1")), &store);
        deliver(&mut r, &mut edges, &actions, 5);
        let actions = r.inventory("edge-1", Ok(first), &store);
        assert!(sends(&actions).is_empty(), "in flight: {actions:?}");
        deliver(&mut r, &mut edges, &actions, 6);
        let event = WatchEvent::Added(store[&key(Kind::Pod, "web")].clone());
        let actions = r.observe(Kind::Pod, &event, &store);
        deliver(&mut r, &mut edges, &actions, 0);
        assert_eq!(
            edges.live("edge-1")["default/pod/web"].1,
            pod("web", Some("edge-1"), 4, &[], "nginx:2")
        );
    }

    // ----- nodes' links and inventories -----

    #[test]
    fn a_native_node_is_brought_in_step_from_its_inventory() {
        let mut store = store_of(&[
            cm("a", 2, "a"),
            cm("b", 3, "b"),
            cm("c", 4, "c"),
            cm("d", 5, "d"),
            pod("p1", Some("edge-1"), 6, &["a"], "nginx"),
            pod("p2", Some("edge-1"), 7, &["b"], "nginx"),
            pod("p3", Some("edge-1"), 8, &["c"], "nginx"),
            pod("elsewhere", Some("edge-2"), 9, &["a"], "nginx"),
        ]);
        let mut r = loaded(&store, 9);
        assert!(!r.is_connected("edge-1"));
        let actions = r.connected("edge-1", NodeDialect::Native, &store);
        assert_eq!(actions, [ask("edge-1"), update_node("edge-1")]);
        assert!(r.is_connected("edge-1"));
        assert!(!r.is_kubeedge("edge-1"));
        // Sent while the inventory is on its way: in flight.
        let actions = put(
            &mut r,
            &mut store,
            pod("p4", Some("edge-1"), 10, &["d"], "nginx"),
        );
        assert_eq!(sends(&actions).len(), 2);
        ack(&mut r, &actions, 0);
        let held = inventory(&[
            ("pod/p1", 6),           // as desired
            ("pod/p2", 1),           // older
            ("configmap/a", 6),      // above its revision (went with p1)
            ("configmap/c", 1),      // older
            ("configmap/zombie", 3), // not desired
            ("pod/ghost", 2),        // not desired
        ]);
        let actions = r.inventory("edge-1", Ok(held), &store);
        assert_eq!(
            sends(&actions),
            [
                s("edge-1", Delete, "configmap/zombie", Fresh),
                s("edge-1", Delete, "pod/ghost", Fresh),
                s("edge-1", Insert, "configmap/b", Fresh),
                s("edge-1", Update, "configmap/c", Of(4)),
                s("edge-1", Update, "pod/p2", Of(7)),
                s("edge-1", Insert, "pod/p3", Fresh),
            ]
        );
        assert_eq!(actions.len(), 6);
        let Action::Send { object, .. } = &actions[1] else {
            panic!("a send");
        };
        assert_eq!(**object, stub(&key(Kind::Pod, "ghost")));
        ack(&mut r, &actions, 11);
        // What the node holds is known again: b went at 11, so a change
        // at 12 goes at 12; c is held at 4, so one at 13 goes at 13.
        let actions = put(&mut r, &mut store, cm("b", 12, "b2"));
        assert_eq!(
            sends(&actions),
            [s("edge-1", Update, "configmap/b", Of(12))]
        );
        let actions = put(&mut r, &mut store, cm("c", 13, "c2"));
        assert_eq!(
            sends(&actions),
            [s("edge-1", Update, "configmap/c", Of(13))]
        );
    }

    #[test]
    fn a_nodes_devices_are_known_only_once_devices_and_models_are_listed() {
        let device = |name: &str, node: &str| {
            json!({
                "apiVersion": "devices.kubeedge.io/v1beta1",
                "kind": "Device",
                "metadata": { "name": name, "namespace": NS, "resourceVersion": "3" },
                "spec": { "nodeName": node, "deviceModelRef": { "name": "thermo" } },
            })
        };
        let store = store_of(&[
            device("t2", "edge-1"),
            device("t1", "edge-1"),
            device("t3", "edge-2"),
            pod("p1", Some("edge-1"), 3, &[], "nginx"),
        ]);
        let mut r = Reconciler::new();
        assert_eq!(r.devices_of("edge-1"), None);
        r.listed(Kind::Device, of_kind(&store, Kind::Device), 3, &store);
        // Devices without their models' types are not the whole answer.
        assert_eq!(r.devices_of("edge-1"), None);
        r.listed(Kind::DeviceModel, Vec::new(), 3, &store);
        assert_eq!(
            r.devices_of("edge-1"),
            Some(vec![key(Kind::Device, "t1"), key(Kind::Device, "t2")])
        );
        assert_eq!(r.devices_of("edge-2"), Some(vec![key(Kind::Device, "t3")]));
        // Listed, a node with none has none.
        assert_eq!(r.devices_of("edge-3"), Some(Vec::new()));
    }

    #[test]
    fn nothing_is_withdrawn_before_every_kind_is_listed() {
        let store = store_of(&[
            cm("a", 2, "a"),
            pod("p1", Some("edge-1"), 3, &["a"], "nginx"),
        ]);
        let mut r = Reconciler::new();
        for kind in [Kind::ConfigMap, Kind::Pod] {
            assert!(r.listed(kind, of_kind(&store, kind), 3, &store).is_empty());
        }
        assert!(!r.loaded());
        let actions = r.connected("edge-1", NodeDialect::Native, &store);
        assert_eq!(actions, [ask("edge-1"), update_node("edge-1")]);
        let held = inventory(&[("configmap/zombie", 1), ("pod/ghost", 1)]);
        let actions = r.inventory("edge-1", Ok(held), &store);
        assert_eq!(
            sends(&actions),
            [
                s("edge-1", Insert, "configmap/a", Fresh),
                s("edge-1", Insert, "pod/p1", Fresh),
            ]
        );
    }

    #[test]
    fn a_kubeedge_node_gets_everything_again_without_being_asked() {
        let store = store_of(&[
            cm("a", 2, "a"),
            pod("p1", Some("edge-1"), 3, &["a"], "nginx"),
            pod("p2", Some("edge-1"), 4, &[], "nginx"),
            pod("p3", Some("edge-2"), 5, &["a"], "nginx"),
        ]);
        let mut r = loaded(&store, 5);
        let actions = r.connected("edge-1", NodeDialect::KubeEdge, &store);
        assert!(!actions.contains(&ask("edge-1")), "{actions:?}");
        assert_eq!(actions.last(), Some(&update_node("edge-1")));
        assert_eq!(
            sends(&actions),
            [
                s("edge-1", Insert, "configmap/a", Fresh),
                s("edge-1", Update, "pod/p1", Of(3)),
                s("edge-1", Update, "pod/p2", Of(4)),
            ]
        );
        assert!(r.is_kubeedge("edge-1"));
        ack(&mut r, &actions, 6);
        // A retry after a failed send sends it all again, unasked.
        r.sent("edge-1", Update, &key(Kind::Pod, "p1"), 3, false);
        let actions = r.retry(&store);
        assert_eq!(sends(&actions).len(), 3, "{actions:?}");
        assert!(!actions.contains(&ask("edge-1")));
    }

    fn read_cursor(node: &str, session: u64) -> Action {
        Action::ReadCursor {
            node: node.to_owned(),
            session,
        }
    }

    /// A reconciler with delivery cursors that took its first list of
    /// every kind from `store`.
    fn loaded_with_cursors(store: &Store, revision: u64) -> Reconciler {
        let mut r = Reconciler::new().with_cursors(true);
        for kind in FOLLOWED {
            assert!(
                r.listed(kind, of_kind(store, kind), revision, store)
                    .is_empty()
            );
        }
        r
    }

    fn cursor_of(acked: &[(&str, u64, i64)]) -> BTreeMap<String, Acked> {
        acked
            .iter()
            .map(|(resource, version, claim)| {
                (
                    format!("{NS}/{resource}"),
                    Acked {
                        version: *version,
                        claim: *claim,
                    },
                )
            })
            .collect()
    }

    #[test]
    fn a_kubeedge_node_with_a_cursor_is_sent_only_what_it_lacks() {
        let store = store_of(&[
            cm("a", 2, "a"),
            cm("b", 3, "b"),
            cm("c", 4, "c"),
            pod("p1", Some("edge-1"), 5, &["a"], "nginx"),
            pod("p2", Some("edge-1"), 6, &["b"], "nginx"),
            pod("p3", Some("edge-1"), 7, &["c"], "nginx"),
            pod("p4", Some("edge-1"), 8, &[], "nginx"),
            pod("p5", Some("edge-1"), 9, &[], "nginx"),
            pod("p6", Some("edge-1"), 10, &[], "nginx"),
        ]);
        let mut r = loaded_with_cursors(&store, 10);
        // Not assumed: the cursor is read first.
        let actions = r.connected("edge-1", NodeDialect::KubeEdge, &store);
        assert_eq!(actions, [read_cursor("edge-1", 1), update_node("edge-1")]);
        let cursor = cursor_of(&[
            ("pod/p1", 5, 40),         // held
            ("configmap/a", 2, 40),    // held: p1, which uses it, is held under claim 40
            ("pod/p2", 6, 40),         //
            ("configmap/b", 3, 30),    // recorded under another claim than p2: not sure
            ("pod/p3", 4, 40),         // older than its spec (7)
            ("configmap/c", 4, 40),    // p3, which uses it, is not held at its spec
            ("pod/p5", 0, 40),         // a message of it was on its way
            ("pod/p6", 11, 40),        // above its spec (sent at a fresh version)
            ("pod/ghost", 3, 30),      // not desired
            ("configmap/gone", 0, 40), // not desired, maybe held
        ]);
        let actions = r.cursor("edge-1", 1, Ok(cursor), &store);
        assert_eq!(
            sends(&actions),
            [
                s("edge-1", Delete, "configmap/gone", Fresh),
                s("edge-1", Delete, "pod/ghost", Fresh),
                s("edge-1", Insert, "configmap/b", Fresh),
                s("edge-1", Insert, "configmap/c", Fresh),
                s("edge-1", Update, "pod/p3", Of(7)),
                // Not in the cursor: acknowledged after it was written.
                s("edge-1", Update, "pod/p4", Of(8)),
                s("edge-1", Insert, "pod/p5", Fresh),
            ]
        );
        ack(&mut r, &actions, 12);
        // Everything acknowledged, under one claim: nothing goes.
        r.disconnected("edge-1");
        let actions = r.connected("edge-1", NodeDialect::KubeEdge, &store);
        assert_eq!(actions[0], read_cursor("edge-1", 3));
        let all = cursor_of(&[
            ("pod/p1", 5, 41),
            ("pod/p2", 6, 41),
            ("pod/p3", 7, 41),
            ("pod/p4", 8, 41),
            ("pod/p5", 12, 41),
            ("pod/p6", 11, 41),
            ("configmap/a", 2, 41),
            ("configmap/b", 12, 41),
            ("configmap/c", 12, 41),
        ]);
        let actions = r.cursor("edge-1", 3, Ok(all), &store);
        assert!(sends(&actions).is_empty(), "{actions:?}");
    }

    #[test]
    fn a_cursor_read_for_an_earlier_link_is_not_taken() {
        let mut store = store_of(&[pod("p1", Some("edge-1"), 2, &[], "nginx")]);
        let mut r = loaded_with_cursors(&store, 2);
        r.connected("edge-1", NodeDialect::KubeEdge, &store);
        // The node leaves and links again; meanwhile p2 is created and
        // sent nowhere (the node is not linked).
        r.served_elsewhere("edge-1");
        let actions = put(
            &mut r,
            &mut store,
            pod("p2", Some("edge-1"), 3, &[], "nginx"),
        );
        assert_eq!(sends(&actions).len(), 1);
        let actions = r.connected("edge-1", NodeDialect::KubeEdge, &store);
        assert_eq!(actions[0], read_cursor("edge-1", 3));
        // The first read's answer, late: not this link's.
        let late = cursor_of(&[("pod/p1", 2, 7)]);
        assert!(r.cursor("edge-1", 1, Ok(late.clone()), &store).is_empty());
        // This link's: p2, never sent on it, goes.
        let actions = r.cursor("edge-1", 3, Ok(late.clone()), &store);
        assert_eq!(sends(&actions), [s("edge-1", Update, "pod/p2", Of(3))]);
        // Answered once.
        assert!(r.cursor("edge-1", 3, Ok(late), &store).is_empty());
    }

    #[test]
    fn a_kubeedge_node_whose_cursor_cannot_be_read_gets_everything_again() {
        let store = store_of(&[
            cm("a", 2, "a"),
            pod("p1", Some("edge-1"), 3, &["a"], "nginx"),
            pod("p2", Some("edge-1"), 4, &[], "nginx"),
        ]);
        let mut r = loaded_with_cursors(&store, 4);
        assert_eq!(
            r.connected("edge-1", NodeDialect::KubeEdge, &store)[0],
            read_cursor("edge-1", 1)
        );
        // Sent while the cursor is read: left alone.
        let mut store = store;
        let actions = put(
            &mut r,
            &mut store,
            pod("p3", Some("edge-1"), 5, &[], "nginx"),
        );
        assert_eq!(sends(&actions), [s("edge-1", Insert, "pod/p3", Of(5))]);
        let actions = r.cursor("edge-1", 1, Err("etcd out of reach".to_owned()), &store);
        assert_eq!(
            sends(&actions),
            [
                s("edge-1", Insert, "configmap/a", Fresh),
                s("edge-1", Update, "pod/p1", Of(3)),
                s("edge-1", Update, "pod/p2", Of(4)),
            ]
        );
        // A native node is still asked; without cursors, a KubeEdge node
        // is assumed to hold its pods, as before.
        assert_eq!(
            r.connected("edge-2", NodeDialect::Native, &store)[0],
            ask("edge-2")
        );
        let mut plain = loaded(&store, 5);
        let actions = plain.connected("edge-1", NodeDialect::KubeEdge, &store);
        assert!(
            !actions
                .iter()
                .any(|a| matches!(a, Action::ReadCursor { .. }))
        );
        assert_eq!(sends(&actions).len(), 4);
    }

    #[test]
    fn a_kubeedge_kubelet_gets_its_pod_marked_deleted_again_until_it_says_it_stopped() {
        let mut ending = pod("p1", Some("edge-1"), 3, &[], "nginx");
        ending["metadata"]["deletionTimestamp"] = json!("2024-01-01T00:00:00Z");
        ending["metadata"]["uid"] = json!("u1");
        let store = store_of(&[ending, pod("p2", Some("edge-1"), 4, &[], "nginx")]);
        let mut r = loaded_with_cursors(&store, 4);
        r.connected("edge-1", NodeDialect::KubeEdge, &store);
        // Missing from the cursor: it goes again marked deleted (its
        // kubelet terminates it and says so), and nothing finishes it but
        // that word.
        let actions = r.cursor("edge-1", 1, Ok(cursor_of(&[("pod/p2", 4, 7)])), &store);
        assert_eq!(sends(&actions), [s("edge-1", Update, "pod/p1", Fresh)]);
        assert!(!finishes(&actions), "{actions:?}");
        let Some(Action::Send { object, .. }) = actions.first() else {
            panic!("{actions:?}");
        };
        assert!(terminating(object));
    }

    fn finishes(actions: &[Action]) -> bool {
        actions
            .iter()
            .any(|a| matches!(a, Action::FinishDeletion { .. }))
    }

    fn finish(name: &str, uid: &str) -> Termination {
        Termination::Finish {
            key: key(Kind::Pod, name),
            uid: Some(uid.to_owned()),
        }
    }

    /// `object` marked deleted at revision `rv`, with uid `uid`.
    fn deleting(object: &Value, rv: u64, uid: &str) -> Value {
        let mut object = revised(object, rv);
        object["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
        object["metadata"]["uid"] = json!(uid);
        object
    }

    /// A loaded reconciler with pod `p1` (uid `u1`) running on native
    /// node `edge-1`, in step.
    fn running_pod() -> (Reconciler, Store, Value) {
        let mut running = pod("p1", Some("edge-1"), 3, &[], "nginx");
        running["metadata"]["uid"] = json!("u1");
        let store = store_of(std::slice::from_ref(&running));
        let mut r = loaded(&store, 3);
        r.connected("edge-1", NodeDialect::Native, &store);
        let actions = r.inventory("edge-1", Ok(inventory(&[("pod/p1", 3)])), &store);
        assert!(actions.is_empty(), "in step: {actions:?}");
        (r, store, running)
    }

    #[test]
    fn a_graceful_deletion_ends_when_the_node_says_the_pod_stopped_not_when_it_holds_it() {
        let (mut r, mut store, running) = running_pod();
        let actions = put(&mut r, &mut store, deleting(&running, 5, "u1"));
        assert_eq!(sends(&actions), [s("edge-1", Delete, "pod/p1", Of(5))]);
        ack(&mut r, &actions, 0);
        // The node holds the deletion: its containers still run (for up
        // to their grace period), so nothing is finished.
        assert!(r.delivered("edge-1", &key(Kind::Pod, "p1")).is_empty());
        assert!(r.retry(&store).is_empty());
        // Its grace period ran out at the edge, which killed the
        // containers and said so: finished, with the uid as precondition.
        assert_eq!(
            r.terminated("edge-1", &key(Kind::Pod, "p1"), Some("u1")),
            finish("p1", "u1")
        );
        // Once gone, nothing more goes to a node told with a delete, and a
        // repeated word finishes nothing.
        assert!(remove(&mut r, &mut store, Kind::Pod, "p1", 6).is_empty());
        assert_eq!(
            r.terminated("edge-1", &key(Kind::Pod, "p1"), Some("u1")),
            Termination::Gone
        );
    }

    #[test]
    fn a_node_offline_at_delete_time_is_told_again_and_finishes_it_when_it_returns() {
        let (mut r, mut store, running) = running_pod();
        r.disconnected("edge-1");
        let actions = put(&mut r, &mut store, deleting(&running, 5, "u1"));
        assert_eq!(sends(&actions), [s("edge-1", Delete, "pod/p1", Of(5))]);
        // It returns (the queued delete may or may not have reached it):
        // told again, with the uid, and still not finished.
        r.connected("edge-1", NodeDialect::Native, &store);
        for held in [vec![("pod/p1", 3)], vec![]] {
            let actions = r.inventory("edge-1", Ok(inventory(&held)), &store);
            r.connected("edge-1", NodeDialect::Native, &store);
            assert_eq!(sends(&actions), [s("edge-1", Delete, "pod/p1", Fresh)]);
            assert!(!finishes(&actions));
            let Some(Action::Send { object, .. }) = actions.first() else {
                panic!("{actions:?}");
            };
            assert_eq!(object["metadata"]["uid"], "u1");
        }
        assert_eq!(
            r.terminated("edge-1", &key(Kind::Pod, "p1"), Some("u1")),
            finish("p1", "u1")
        );
    }

    #[test]
    fn a_pod_that_never_started_at_the_edge_finishes_at_its_word() {
        let mut fresh = pod("p1", Some("edge-1"), 3, &[], "nginx");
        fresh["metadata"]["uid"] = json!("u1");
        let mut store = Store::new();
        let mut r = loaded(&store, 2);
        r.connected("edge-1", NodeDialect::Native, &store);
        put(&mut r, &mut store, fresh.clone());
        // Deleted before the node took it: the delete goes, the edge
        // (nothing of it running) says so at once.
        let actions = put(&mut r, &mut store, deleting(&fresh, 4, "u1"));
        assert_eq!(sends(&actions), [s("edge-1", Delete, "pod/p1", Of(4))]);
        assert_eq!(
            r.terminated("edge-1", &key(Kind::Pod, "p1"), None),
            finish("p1", "u1"),
            "a word naming no uid is for whichever pod of that name is ending"
        );
    }

    #[test]
    fn an_edge_restarted_mid_termination_is_told_again() {
        let (mut r, mut store, running) = running_pod();
        let actions = put(&mut r, &mut store, deleting(&running, 5, "u1"));
        ack(&mut r, &actions, 0);
        // The edge restarts: it dropped the pod when told, tore down what
        // was left at start, and never said so. Its new link asks.
        r.disconnected("edge-1");
        assert_eq!(
            r.connected("edge-1", NodeDialect::Native, &store),
            [ask("edge-1"), update_node("edge-1")]
        );
        let actions = r.inventory("edge-1", Ok(inventory(&[])), &store);
        assert_eq!(sends(&actions), [s("edge-1", Delete, "pod/p1", Fresh)]);
        assert!(!finishes(&actions));
        assert_eq!(
            r.terminated("edge-1", &key(Kind::Pod, "p1"), Some("u1")),
            finish("p1", "u1")
        );
    }

    #[test]
    fn a_restarted_cloud_rebuilds_its_deletions_and_keeps_a_word_that_came_first() {
        let mut running = pod("p1", Some("edge-1"), 3, &[], "nginx");
        running["metadata"]["uid"] = json!("u1");
        let ending = deleting(&running, 5, "u1");
        // Restarted: the first list shows the deletion, the node links
        // and is told again (it may have said so to the cloud that died).
        let store = store_of(std::slice::from_ref(&ending));
        let mut r = loaded(&store, 5);
        r.connected("edge-1", NodeDialect::Native, &store);
        let actions = r.inventory("edge-1", Ok(inventory(&[])), &store);
        assert_eq!(sends(&actions), [s("edge-1", Delete, "pod/p1", Fresh)]);
        assert_eq!(
            r.terminated("edge-1", &key(Kind::Pod, "p1"), Some("u1")),
            finish("p1", "u1")
        );

        // A word before the first list (the node linked first): kept,
        // and taken by the list.
        let mut r = Reconciler::new();
        assert_eq!(
            r.terminated("edge-1", &key(Kind::Pod, "p1"), Some("u1")),
            Termination::Kept
        );
        let mut finished = Vec::new();
        for kind in FOLLOWED {
            finished.extend(r.listed(kind, of_kind(&store, kind), 5, &store));
        }
        assert_eq!(
            finished,
            [Action::FinishDeletion {
                key: key(Kind::Pod, "p1"),
                uid: Some("u1".to_owned())
            }]
        );

        // A word before the watch shows the deletion (another replica
        // told the node): kept, and the deletion finishes when it shows.
        let mut store = store_of(std::slice::from_ref(&running));
        let mut r = loaded(&store, 3);
        assert_eq!(
            r.terminated("edge-1", &key(Kind::Pod, "p1"), Some("u1")),
            Termination::Kept
        );
        let actions = put(&mut r, &mut store, ending.clone());
        assert_eq!(
            actions.last(),
            Some(&Action::FinishDeletion {
                key: key(Kind::Pod, "p1"),
                uid: Some("u1".to_owned())
            })
        );
        // One about an earlier pod of that name finishes nothing.
        let mut store = store_of(std::slice::from_ref(&running));
        let mut r = loaded(&store, 3);
        assert_eq!(
            r.terminated("edge-1", &key(Kind::Pod, "p1"), Some("u0")),
            Termination::Gone
        );
        assert!(!finishes(&put(&mut r, &mut store, ending)));
    }

    #[test]
    fn a_node_never_speaks_for_another_nodes_pod() {
        let (mut r, mut store, running) = running_pod();
        let p1 = key(Kind::Pod, "p1");
        // Running on edge-1: edge-2's word is refused, and not kept.
        assert!(matches!(
            r.terminated("edge-2", &p1, Some("u1")),
            Termination::Refused(_)
        ));
        let actions = put(&mut r, &mut store, deleting(&running, 5, "u1"));
        assert!(!finishes(&actions), "{actions:?}");
        // Being deleted on edge-1: still refused, and left to edge-1.
        assert!(matches!(
            r.terminated("edge-2", &p1, Some("u1")),
            Termination::Refused(_)
        ));
        assert_eq!(r.terminated("edge-1", &p1, Some("u1")), finish("p1", "u1"));
        // A pod nobody knows (its deletion finished) is nothing to finish.
        assert_eq!(
            r.terminated("edge-2", &key(Kind::Pod, "nope"), None),
            Termination::Gone
        );
    }

    #[test]
    fn a_kubeedge_node_is_told_with_the_pod_marked_deleted_and_drops_it_once_gone() {
        let mut running = pod("p1", Some("kube-1"), 3, &[], "nginx");
        running["metadata"]["uid"] = json!("u1");
        let mut store = store_of(std::slice::from_ref(&running));
        let mut r = loaded(&store, 3);
        r.connected("kube-1", NodeDialect::KubeEdge, &store);
        let actions = r.inventory("kube-1", Ok(inventory(&[("pod/p1", 3)])), &store);
        assert!(actions.is_empty(), "{actions:?}");
        // As KubeEdge's cloud does: an update with the deletionTimestamp,
        // which its kubelet terminates, then deletes with grace 0.
        let actions = put(&mut r, &mut store, deleting(&running, 5, "u1"));
        assert_eq!(sends(&actions), [s("kube-1", Update, "pod/p1", Of(5))]);
        ack(&mut r, &actions, 0);
        assert!(r.delivered("kube-1", &key(Kind::Pod, "p1")).is_empty());
        // It links again holding that: nothing to send (its kubelet asks
        // until it is answered).
        r.disconnected("kube-1");
        r.connected("kube-1", NodeDialect::KubeEdge, &store);
        let actions = r.inventory("kube-1", Ok(inventory(&[("pod/p1", 5)])), &store);
        assert!(actions.is_empty(), "{actions:?}");
        assert_eq!(
            r.terminated("kube-1", &key(Kind::Pod, "p1"), Some("u1")),
            finish("p1", "u1")
        );
        // Gone from the desired state: the node drops it now.
        let actions = remove(&mut r, &mut store, Kind::Pod, "p1", 6);
        assert_eq!(sends(&actions), [s("kube-1", Delete, "pod/p1", Of(6))]);
    }

    #[test]
    fn a_node_without_an_inventory_is_asked_again_while_connected() {
        let store = store_of(&[pod("p1", Some("edge-1"), 2, &[], "nginx")]);
        let mut r = loaded(&store, 2);
        r.connected("edge-1", NodeDialect::Native, &store);
        let actions = r.inventory("edge-1", Err("timed out".to_owned()), &store);
        assert!(actions.is_empty());
        assert_eq!(r.retry(&store), [ask("edge-1")]);
        assert!(r.retry(&store).is_empty(), "asked once");
        assert!(
            r.inventory("edge-1", Err("timed out".to_owned()), &store)
                .is_empty()
        );
        assert_eq!(r.disconnected("edge-1"), [update_node("edge-1")]);
        assert!(!r.is_connected("edge-1"));
        assert!(r.retry(&store).is_empty(), "not while disconnected");
        let actions = r.connected("edge-1", NodeDialect::Native, &store);
        assert_eq!(actions, [ask("edge-1"), update_node("edge-1")]);
        let actions = r.inventory("edge-1", Ok(inventory(&[("pod/p1", 2)])), &store);
        assert!(actions.is_empty(), "in step");
    }

    #[test]
    fn a_send_not_queued_brings_the_node_in_step_on_the_next_retry() {
        let mut store = store_of(&[cm("a", 2, "a")]);
        let mut r = loaded(&store, 2);
        r.connected("edge-1", NodeDialect::Native, &store);
        assert!(
            r.inventory("edge-1", Ok(BTreeMap::new()), &store)
                .is_empty()
        );
        assert!(r.retry(&store).is_empty(), "in step");
        let actions = put(
            &mut r,
            &mut store,
            pod("p1", Some("edge-1"), 3, &["a"], "nginx"),
        );
        assert_eq!(sends(&actions).len(), 2);
        r.sent("edge-1", Insert, &key(Kind::ConfigMap, "a"), 3, true);
        r.sent("edge-1", Insert, &key(Kind::Pod, "p1"), 3, false);
        assert_eq!(r.retry(&store), [ask("edge-1")]);
        assert!(r.retry(&store).is_empty());
        let actions = r.inventory("edge-1", Ok(inventory(&[("configmap/a", 3)])), &store);
        assert_eq!(sends(&actions), [s("edge-1", Insert, "pod/p1", Fresh)]);
        // A failure while disconnected waits for the link.
        r.disconnected("edge-1");
        r.sent("edge-1", Insert, &key(Kind::Pod, "p1"), 4, false);
        assert!(r.retry(&store).is_empty());
        assert_eq!(
            r.connected("edge-1", NodeDialect::Native, &store)[0],
            ask("edge-1")
        );
    }

    // ----- what nodes say -----

    #[test]
    fn a_node_reports_and_reads_only_what_is_its_own() {
        let device = json!({
            "apiVersion": "devices.kubeedge.io/v1beta1",
            "kind": "Device",
            "metadata": { "name": "t1", "namespace": NS, "resourceVersion": "6" },
            "spec": { "nodeName": "edge-1", "deviceModelRef": { "name": "thermo" } },
        });
        let store = store_of(&[
            cm("mine", 2, "a"),
            cm("theirs", 3, "b"),
            pod("p1", Some("edge-1"), 4, &["mine"], "nginx"),
            pod("p2", Some("edge-2"), 5, &["theirs"], "nginx"),
            device,
        ]);
        let r = loaded(&store, 6);
        assert!(r.may_report("edge-1", &key(Kind::Pod, "p1")));
        assert!(!r.may_report("edge-2", &key(Kind::Pod, "p1")));
        assert!(!r.may_report("edge-1", &key(Kind::Pod, "p2")));
        assert!(!r.may_report("edge-1", &key(Kind::Pod, "unknown")));
        assert!(r.may_report("edge-1", &key(Kind::Device, "t1")));
        assert!(!r.may_report("edge-2", &key(Kind::Device, "t1")));
        assert!(!r.may_report("edge-1", &key(Kind::ConfigMap, "mine")));
        let yes = [
            key(Kind::Pod, "p1"),
            key(Kind::Device, "t1"),
            key(Kind::ConfigMap, "mine"),
            key(Kind::DeviceModel, "thermo"),
            key(Kind::Service, "anything"),
            key(Kind::Endpoints, "anything"),
            ObjectKey::new(Kind::Node, "", "edge-1"),
        ];
        let no = [
            key(Kind::Pod, "p2"),
            key(Kind::ConfigMap, "theirs"),
            key(Kind::ConfigMap, "unused"),
            key(Kind::Secret, "unused"),
            ObjectKey::new(Kind::Node, "", "edge-2"),
        ];
        for key in yes {
            assert!(r.entitled("edge-1", &key), "{key}");
        }
        for key in no {
            assert!(!r.entitled("edge-1", &key), "{key}");
        }
    }

    #[test]
    fn the_ready_condition_follows_the_link_and_the_report() {
        let time = |second| Time(jiff::Timestamp::from_second(second).expect("a time"));
        let store = Store::new();
        let mut r = loaded(&store, 1);
        let down = r.ready_condition("edge-1", time(100));
        assert_eq!(
            (down.type_.as_str(), down.status.as_str()),
            ("Ready", "Unknown")
        );
        assert_eq!(down.reason.as_deref(), Some("EdgeLinkDown"));
        assert_eq!(down.last_heartbeat_time, Some(time(100)));
        r.connected("edge-1", NodeDialect::Native, &store);
        let up = r.ready_condition("edge-1", time(101));
        assert_eq!(up.status, "True");
        assert_eq!(up.reason.as_deref(), Some("EdgeConnected"));
        assert_eq!(up.last_heartbeat_time, Some(time(101)));
        let reported = NodeCondition {
            type_: "Ready".to_owned(),
            status: "False".to_owned(),
            reason: Some("KubeletNotReady".to_owned()),
            message: Some("container runtime is down".to_owned()),
            last_heartbeat_time: Some(time(50)),
            last_transition_time: Some(time(40)),
        };
        r.reported_ready("edge-1", reported.clone());
        let own = r.ready_condition("edge-1", time(102));
        assert_eq!(
            own,
            NodeCondition {
                last_heartbeat_time: Some(time(102)),
                ..reported.clone()
            }
        );
        // The link goes down: Unknown, whatever the node said.
        r.disconnected("edge-1");
        assert_eq!(r.ready_condition("edge-1", time(103)).status, "Unknown");
        // Back: its last report again.
        r.connected("edge-1", NodeDialect::Native, &store);
        assert_eq!(r.ready_condition("edge-1", time(104)).status, "False");
        // The Node deleted: its report goes with it.
        let node = json!({
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": { "name": "edge-1", "resourceVersion": "5" },
        });
        assert!(
            r.observe(Kind::Node, &WatchEvent::Deleted(node), &store)
                .is_empty()
        );
        assert_eq!(r.ready_condition("edge-1", time(105)).status, "True");
        // Another node is not linked.
        assert_eq!(r.ready_condition("edge-2", time(105)).status, "Unknown");
    }

    // ----- a random walk -----

    use crate::test_rng::Rng;

    const NODES: [&str; 3] = ["edge-1", "edge-2", "edge-3"];
    const CONFIGMAPS: usize = 5;
    const PODS: usize = 8;

    /// A desired state changing at random, a watch delivering its events
    /// late (each kind in order, kinds in any order), nodes linking and
    /// leaving, inventories answered late or not at all, and edges that
    /// keep what they are sent as edges do.
    struct Sim {
        seed: u64,
        rng: Rng,
        /// The last revision issued (by a write or a fresh version).
        revision: u64,
        store: Store,
        /// Events not yet handed to the reconciler.
        pending: BTreeMap<Kind, VecDeque<WatchEvent>>,
        /// The pods as the reconciler was told of them.
        observed: HashMap<ObjectKey, Value>,
        r: Reconciler,
        edges: Edges,
        linked: BTreeSet<String>,
        /// Inventories asked for: the node, and what it held when asked
        /// (or none: what it holds when answered).
        asks: Vec<(String, Option<BTreeMap<String, String>>)>,
        /// Whether cloudhub sometimes does not take a message, and
        /// inventories sometimes fail.
        failures: bool,
        /// Whether a message was not taken.
        failed: bool,
        /// Batches of actions carried out so far.
        batches: u64,
        log: Vec<String>,
    }

    impl Sim {
        fn new(seed: u64, failures: bool) -> Sim {
            let store = Store::new();
            Sim {
                seed,
                rng: Rng(seed),
                revision: 1,
                r: loaded(&store, 1),
                store,
                pending: BTreeMap::new(),
                observed: HashMap::new(),
                edges: Edges::default(),
                linked: BTreeSet::new(),
                asks: Vec::new(),
                failures,
                failed: false,
                batches: 0,
                log: Vec::new(),
            }
        }

        fn fail(&self, what: &str) -> ! {
            let recent = &self.log[self.log.len().saturating_sub(300)..];
            panic!(
                "seed {:#x}: {what}\n{}\n(seed {:#x}: {what})",
                self.seed,
                recent.join("\n"),
                self.seed
            );
        }

        /// A chance of `percent` for `what` in the current batch, the same
        /// whatever order the batch's actions come in (the reconciler's
        /// maps have no fixed order).
        fn roll(&self, what: impl Hash, percent: u64) -> bool {
            let mut hasher = DefaultHasher::new();
            (self.seed, self.batches, what).hash(&mut hasher);
            hasher.finish() % 100 < percent
        }

        fn random_node(&mut self) -> Option<String> {
            match self.rng.below(4) {
                0 => None,
                n => Some(NODES[n - 1].to_owned()),
            }
        }

        fn random_pod(&mut self, name: &str, node: Option<&str>) -> Value {
            let cms: Vec<String> = (0..CONFIGMAPS)
                .filter(|_| self.rng.percent(30))
                .map(|i| format!("cm-{i}"))
                .collect();
            let cms: Vec<&str> = cms.iter().map(String::as_str).collect();
            // Each spec its own, never one seen before.
            pod(name, node, 0, &cms, &format!("nginx:{}", self.revision))
        }

        /// Stores `object` at a new revision (its spec revision moves only
        /// if its desired part changes); its event waits for the watch.
        fn write(&mut self, mut object: Value) {
            let key = ObjectKey::of(&object).expect("a key");
            self.revision += 1;
            let spec = match self.store.get(&key) {
                Some(old) if desired_part(old) == desired_part(&object) => spec_revision(old),
                _ => self.revision,
            };
            object["metadata"]["resourceVersion"] = json!(self.revision.to_string());
            object["metadata"]["annotations"] = json!({ SPEC_REVISION: spec.to_string() });
            let event = match self.store.insert(key.clone(), object.clone()) {
                Some(_) => WatchEvent::Modified(object),
                None => WatchEvent::Added(object),
            };
            let object = event.object();
            let refs: Vec<String> = references(&key, object).iter().map(short).collect();
            self.log.push(format!(
                "{}: write {key} (spec {spec}) on {:?} using {refs:?}",
                self.revision,
                node_of(object)
            ));
            self.pending.entry(key.kind).or_default().push_back(event);
        }

        fn delete(&mut self, key: &ObjectKey) {
            if let Some(object) = self.store.remove(key) {
                self.revision += 1;
                self.log.push(format!("{}: delete {key}", self.revision));
                let event = WatchEvent::Deleted(revised(&object, self.revision));
                self.pending.entry(key.kind).or_default().push_back(event);
            }
        }

        fn step(&mut self) {
            match self.rng.below(100) {
                0..20 => {
                    // A new content, or the same one again.
                    let name = format!("cm-{}", self.rng.below(CONFIGMAPS));
                    let object = match self.store.get(&key(Kind::ConfigMap, &name)) {
                        Some(object) if self.rng.percent(30) => object.clone(),
                        _ => cm(&name, 0, &format!("data-{}", self.revision)),
                    };
                    self.write(object);
                }
                20..25 => {
                    let name = format!("cm-{}", self.rng.below(CONFIGMAPS));
                    self.delete(&key(Kind::ConfigMap, &name));
                }
                25..45 => {
                    let name = format!("pod-{}", self.rng.below(PODS));
                    let object = match self.store.get(&key(Kind::Pod, &name)).cloned() {
                        Some(mut object) if self.rng.percent(30) => {
                            object["status"]["phase"] = json!(format!("phase-{}", self.rng.next()));
                            object
                        }
                        Some(object) => {
                            // Bound once, bound for good.
                            let node = match node_of(&object) {
                                Some(node) => Some(node.to_owned()),
                                None => self.random_node(),
                            };
                            self.random_pod(&name, node.as_deref())
                        }
                        None => {
                            let node = self.random_node();
                            self.random_pod(&name, node.as_deref())
                        }
                    };
                    self.write(object);
                }
                45..52 => {
                    let name = format!("pod-{}", self.rng.below(PODS));
                    self.delete(&key(Kind::Pod, &name));
                }
                52..72 => {
                    let kinds: Vec<Kind> = self
                        .pending
                        .iter()
                        .filter(|(_, events)| !events.is_empty())
                        .map(|(kind, _)| *kind)
                        .collect();
                    if !kinds.is_empty() {
                        let kind = kinds[self.rng.below(kinds.len())];
                        self.deliver(kind);
                    }
                }
                72..77 => {
                    let node = NODES[self.rng.below(NODES.len())];
                    let actions = if self.linked.remove(node) {
                        self.log.push(format!("{node} disconnected"));
                        self.r.disconnected(node)
                    } else {
                        self.linked.insert(node.to_owned());
                        self.log.push(format!("{node} connected"));
                        self.r.connected(node, NodeDialect::Native, &self.store)
                    };
                    self.act(actions);
                }
                77..85 => {
                    if !self.asks.is_empty() {
                        let index = self.rng.below(self.asks.len());
                        self.answer(index);
                    }
                }
                85..90 => {
                    self.log.push("retry".to_owned());
                    let actions = self.r.retry(&self.store);
                    self.act(actions);
                }
                90..93 => {
                    let kind = [Kind::ConfigMap, Kind::Pod][self.rng.below(2)];
                    self.relist(kind);
                }
                _ => {
                    // What waits, as the controller takes it: configmaps
                    // first.
                    for kind in FOLLOWED {
                        while self.pending.get(&kind).is_some_and(|e| !e.is_empty()) {
                            self.deliver(kind);
                        }
                    }
                }
            }
        }

        fn deliver(&mut self, kind: Kind) {
            let Some(event) = self.pending.get_mut(&kind).and_then(VecDeque::pop_front) else {
                return;
            };
            let key = ObjectKey::of(event.object()).expect("a key");
            if kind == Kind::Pod {
                match &event {
                    WatchEvent::Deleted(_) => self.observed.remove(&key),
                    _ => self.observed.insert(key.clone(), event.object().clone()),
                };
            }
            self.log
                .push(format!("observe {key} at {}", event.revision()));
            let actions = self.r.observe(kind, &event, &self.store);
            self.act(actions);
        }

        fn relist(&mut self, kind: Kind) {
            self.pending.remove(&kind);
            let objects = of_kind(&self.store, kind);
            self.log.push(format!("relist {kind} at {}", self.revision));
            if kind == Kind::Pod {
                self.observed = store_of(&objects);
            }
            let actions = self.r.listed(kind, objects, self.revision, &self.store);
            self.act(actions);
        }

        fn answer(&mut self, index: usize) {
            let (node, held) = self.asks.remove(index);
            let lost = self.failures && self.roll(("inventory", &node), 10);
            let answer = match self.linked.contains(&node) && !lost {
                true => Ok(held.unwrap_or_else(|| self.edges.inventory(&node))),
                false => Err("no answer".to_owned()),
            };
            self.log.push(format!("inventory of {node}: {answer:?}"));
            let actions = self.r.inventory(&node, answer, &self.store);
            self.act(actions);
        }

        /// Carries out a batch of actions as the controller does: one
        /// fresh version for the batch, taken when first needed.
        fn act(&mut self, actions: Vec<Action>) {
            self.batches += 1;
            let mut fresh = None;
            for action in actions {
                match action {
                    Action::Send {
                        node,
                        op,
                        key,
                        object,
                        version,
                    } => {
                        self.check_send(&node, op, &key, &object);
                        let version = match (version, fresh) {
                            (Of(version), _) => version,
                            (Fresh, Some(fresh)) => fresh,
                            (Fresh, None) => {
                                self.revision += 1;
                                *fresh.insert(self.revision)
                            }
                        };
                        let queued = !(self.failures && self.roll(("send", &node, &key), 3));
                        self.log.push(format!(
                            "  {node} {op:?} {} at {version}{}",
                            short(&key),
                            if queued { "" } else { " NOT QUEUED" }
                        ));
                        match queued {
                            true => self.edges.apply(&node, op, &key, &object, version),
                            false => self.failed = true,
                        }
                        self.r.sent(&node, op, &key, version, queued);
                    }
                    Action::AskInventory { node } => {
                        let held = self
                            .roll(("ask", &node), 50)
                            .then(|| self.edges.inventory(&node));
                        self.log.push(format!("  ask {node}"));
                        self.asks.push((node, held));
                        // By node, in the order asked: the same whatever
                        // order the nodes were asked in.
                        self.asks.sort_by(|a, b| a.0.cmp(&b.0));
                    }
                    Action::ReadCursor { .. }
                    | Action::Membership { .. }
                    | Action::UpdateNode { .. }
                    | Action::FinishDeletion { .. } => {}
                }
            }
        }

        /// A pod goes only to its node; a configmap only to a node where
        /// a pod uses it.
        fn check_send(&self, node: &str, op: Op, key: &ObjectKey, object: &Value) {
            if key.kind == Kind::Pod {
                let bound = node_of(object);
                if bound.is_some_and(|bound| bound != node) || (op != Delete && bound.is_none()) {
                    self.fail(&format!(
                        "{op:?} of {key} bound to {bound:?} sent to {node}"
                    ));
                }
            }
            if key.kind == Kind::ConfigMap && op != Delete {
                let used = self.observed.iter().any(|(pod, object)| {
                    node_of(object) == Some(node) && references(pod, object).contains(key)
                });
                if !used {
                    self.fail(&format!(
                        "{op:?} of {key} sent to {node}, where no pod uses it"
                    ));
                }
            }
        }

        /// Hands over every event and answers every inventory asked for.
        fn drain(&mut self) {
            loop {
                let kinds: Vec<Kind> = self
                    .pending
                    .iter()
                    .filter(|(_, events)| !events.is_empty())
                    .map(|(kind, _)| *kind)
                    .collect();
                if !kinds.is_empty() {
                    let kind = kinds[self.rng.below(kinds.len())];
                    self.deliver(kind);
                } else if !self.asks.is_empty() {
                    let index = self.rng.below(self.asks.len());
                    self.answer(index);
                } else {
                    break;
                }
            }
        }

        /// Each node holds exactly its pods and the configmaps they use,
        /// each in its current spec; with `versions`, at a version at or
        /// above its spec revision (a configmap sent with a pod goes at
        /// the pod's revision, which may be below the configmap's own when
        /// its change was handled first: the next inventory updates it).
        fn check_nodes(&self, when: &str, versions: bool) {
            for node in NODES {
                let mut desired: BTreeMap<String, &Value> = BTreeMap::new();
                for (key, object) in &self.store {
                    if key.kind != Kind::Pod || node_of(object) != Some(node) {
                        continue;
                    }
                    desired.insert(key.edge_resource().to_string(), object);
                    for reference in references(key, object) {
                        if let Some(used) = self.store.get(&reference) {
                            desired.insert(reference.edge_resource().to_string(), used);
                        }
                    }
                }
                let held = self.edges.live(node);
                if !held.keys().eq(desired.keys()) {
                    self.fail(&format!(
                        "{when}: {node} holds {:?}, should hold {:?}",
                        held.keys().collect::<Vec<_>>(),
                        desired.keys().collect::<Vec<_>>()
                    ));
                }
                for (resource, object) in desired {
                    let (version, content) = &held[&resource];
                    if versions && *version < spec_revision(object) {
                        self.fail(&format!(
                            "{when}: {node} holds {resource} at {version}, below {}",
                            spec_revision(object)
                        ));
                    }
                    if desired_part(content) != desired_part(object) {
                        self.fail(&format!(
                            "{when}: {node} holds {resource} as {content}, not as {object}"
                        ));
                    }
                }
            }
        }
    }

    fn random_walk(seed: u64, failures: bool) {
        let mut sim = Sim::new(seed, failures);
        for _ in 0..400 {
            sim.step();
        }
        sim.drain();
        if !sim.failed {
            sim.check_nodes("once every event is handled", false);
        }
        // Every node links (again) and reports what it holds.
        sim.failures = false;
        for node in NODES {
            sim.linked.insert(node.to_owned());
            sim.log.push(format!("{node} connected"));
            let actions = sim.r.connected(node, NodeDialect::Native, &sim.store);
            sim.act(actions);
        }
        sim.drain();
        sim.check_nodes("once every node reported what it holds", true);
    }

    #[test]
    fn random_changes_leave_every_node_holding_what_it_should() {
        for seed in 1..=40u64 {
            random_walk(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15), false);
        }
    }

    #[test]
    fn random_changes_and_failures_are_repaired_by_inventories() {
        for seed in 1..=40u64 {
            random_walk(seed.wrapping_mul(0x2545_f491_4f6c_dd1d), true);
        }
    }
}
