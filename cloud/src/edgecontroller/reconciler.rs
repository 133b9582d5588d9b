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

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use k8s_openapi::api::core::v1::NodeCondition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde_json::json;

use apis::kinds::{Kind, ObjectKey, references};

use super::bound::{Bound, BoundObjects};
use crate::desired::{
    DesiredError, DesiredState, Object, WatchEvent, spec_digest, spec_revision, stub,
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
        object: Arc<Object>,
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
        object: Arc<Object>,
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
    fn read(&self, key: &ObjectKey) -> Result<Option<Object>, DesiredError>;
}

impl ObjectReader for Arc<dyn DesiredState> {
    fn read(&self, key: &ObjectKey) -> Result<Option<Object>, DesiredError> {
        self.get(key)
    }
}

impl ObjectReader for HashMap<ObjectKey, Object> {
    fn read(&self, key: &ObjectKey) -> Result<Option<Object>, DesiredError> {
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

/// The version a change at `revision` goes at to an object last sent at
/// `sent`: its own revision, unless a fresh one sent before is above it.
fn above(sent: u64, revision: u64) -> Version {
    match revision > sent {
        true => Version::Of(revision),
        false => Version::Fresh,
    }
}

fn uid_of(object: &Object) -> Option<String> {
    object.uid().map(str::to_owned)
}

fn node_of(object: &Object) -> Option<&str> {
    object.node_name()
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
        objects: Vec<Object>,
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
    pub fn list_item(&mut self, listing: &mut Listing, object: Object, reader: &dyn ObjectReader) {
        listing.keys.insert(object.key().clone());
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
        let ended: Vec<ObjectKey> = self
            .terminating
            .keys()
            .filter(|key| key.kind == kind && !listed.contains(key))
            .cloned()
            .collect();
        for key in ended {
            // As its deletion's event would: a KubeEdge kubelet told with
            // the pod marked deleted drops it, and what it used goes.
            let mut gone = stub(&key);
            gone.set_revision(revision);
            actions.extend(self.observe(kind, &WatchEvent::Deleted(gone), reader));
        }
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
            object.set_revision(revision);
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
    fn index(&mut self, kind: Kind, object: &Object) {
        let key = object.key().clone();
        match kind {
            Kind::Pod | Kind::Device if object.is_terminating() => {
                if let Some(node) = node_of(object) {
                    // What the node was told is not known: taken as a
                    // delete (brought in step when it links).
                    let ending = Ending {
                        node: node.to_owned(),
                        uid: uid_of(object),
                        sent: object.revision(),
                        withdrawn: true,
                    };
                    if kind == Kind::Pod {
                        let refs = references(&key, object.json());
                        self.bound
                            .hold_while_ending(key.clone(), node.to_owned(), refs);
                    }
                    self.terminating.insert(key, ending);
                }
            }
            Kind::Pod | Kind::Device => {
                if let Some(node) = node_of(object) {
                    let refs = references(&key, object.json());
                    let bound = Bound {
                        node: node.to_owned(),
                        uid: uid_of(object),
                        refs,
                        spec: spec_revision(object),
                        sent: spec_revision(object),
                        digest: spec_digest(object),
                    };
                    self.bound.insert(key, bound);
                }
            }
            Kind::ConfigMap | Kind::Secret | Kind::DeviceModel => {
                self.referenced
                    .insert(key, (spec_digest(object), spec_revision(object)));
            }
            _ => {}
        }
    }

    /// What each node holds, as far as can be known before it reports:
    /// what its objects reference.
    fn assume_held(&mut self) {
        let bound = self.bound.values().map(|bound| (&bound.node, &bound.refs));
        for (node, refs) in bound.chain(self.bound.ending()) {
            let node = self.nodes.entry(node.clone()).or_default();
            for reference in refs {
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
        let key = object.key().clone();
        let revision = event.revision();
        match (kind, event) {
            (Kind::Pod | Kind::Device, WatchEvent::Deleted(_)) => {
                self.early.remove(&key);
                let ending = self.terminating.remove(&key);
                let released = self.bound.release_ending(&key);
                let Some(bound) = self.bound.remove(&key) else {
                    // A graceful deletion ended: a node told with the
                    // object marked deleted (a KubeEdge kubelet) drops it
                    // now, as KubeEdge's cloud tells it; then what it used
                    // and nothing else there does goes.
                    let mut actions = match ending.filter(|ending| !ending.withdrawn) {
                        Some(ending) => vec![self.send(
                            &ending.node,
                            Op::Delete,
                            &key,
                            Arc::new(object.clone()),
                            above(ending.sent, revision),
                        )],
                        None => Vec::new(),
                    };
                    if let Some(node) = released {
                        actions.extend(self.refresh_node(&node, revision, reader));
                    }
                    return actions;
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
                let moved = self
                    .bound
                    .get(&key)
                    .is_some_and(|previous| node_of(object) != Some(previous.node.as_str()));
                let ended_elsewhere = !object.is_terminating()
                    && self
                        .terminating
                        .get(&key)
                        .is_some_and(|ending| node_of(object) != Some(ending.node.as_str()));
                if moved || ended_elsewhere {
                    // Deleted and created again (elsewhere, or not bound
                    // yet) while the watch was down: a node name is set
                    // once. It leaves its old node first (an ending one
                    // with what it used there).
                    let mut gone = stub(&key);
                    gone.set_revision(revision);
                    let mut actions = self.observe(kind, &WatchEvent::Deleted(gone), reader);
                    actions.extend(self.observe(kind, event, reader));
                    return actions;
                }
                let Some(node) = node_of(object).map(str::to_owned) else {
                    // Not bound yet: it waits for a scheduler.
                    return Vec::new();
                };
                if object.is_terminating() {
                    // Deleted gracefully: the node stops it. A pod's
                    // deletion is finished when its node says it stopped
                    // (`terminated`), a device's once its node holds it.
                    let first = !self.terminating.contains_key(&key);
                    let removed = self.bound.remove(&key);
                    if !first && removed.is_none() {
                        return Vec::new();
                    }
                    if key.kind == Kind::Pod {
                        // It runs until its node says it stopped: what it
                        // uses stays there until then.
                        let refs = match &removed {
                            Some(bound) => bound.refs.clone(),
                            None => references(&key, object.json()),
                        };
                        self.bound
                            .hold_while_ending(key.clone(), node.clone(), refs);
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
                // and so is a word about it. What it used on another node
                // goes there (on this one, the refresh below sees to it).
                self.terminating.remove(&key);
                let mut released = self
                    .bound
                    .release_ending(&key)
                    .filter(|released| *released != node)
                    .map(|released| self.refresh_node(&released, revision, reader))
                    .unwrap_or_default();
                if self.early.get(&key).is_some_and(|(said, uid)| {
                    *said != node || !same_pod(uid.as_deref(), uid_of(object).as_deref())
                }) {
                    self.early.remove(&key);
                }
                let digest = spec_digest(object);
                let previous = self.bound.get(&key);
                if previous.is_some_and(|p| p.digest == digest && p.node == node) {
                    // A status change: the node has the spec already.
                    return released;
                }
                let op = match previous {
                    Some(p) if p.node == node => Op::Update,
                    _ => Op::Insert,
                };
                let sent = match previous {
                    Some(p) if p.node == node => p.sent,
                    _ => 0,
                };
                let refs = references(&key, object.json());
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
                released.extend(self.membership(&key, before.as_deref(), Some(&node), &object));
                released.extend(self.refresh_node(&node, revision, reader));
                released.push(self.send(&node, op, &key, object, above(sent, revision)));
                released
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
                let digest = spec_digest(object);
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
        object: &Arc<Object>,
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
        object: Arc<Object>,
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
    pub fn rewritten(&mut self, key: &ObjectKey, object: &Object) {
        self.bound
            .note_rewritten(key, spec_digest(object), spec_revision(object));
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
        let mut desired: BTreeMap<String, (ObjectKey, Object, u64)> = BTreeMap::new();
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
                    object.edit(|body| body["metadata"]["uid"] = json!(uid));
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
                Ok(Some(object)) if object.is_terminating() => {
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
        let ordered: Vec<&(ObjectKey, Object, u64)> = desired
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
mod tests;
