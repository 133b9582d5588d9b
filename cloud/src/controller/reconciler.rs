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
//!   by sending each of their objects again);
//! - a node's `Ready` condition, from its link and its own report;
//! - whose status reports are accepted: a node reports only for what is
//!   bound to it.
//!
//! Objects it needs to read (what a node newly needs) come through
//! [`ObjectReader`]; the reads are the backend's local view, not I/O. Every
//! message carries a version the edge compares: an object's own revision,
//! or [`Version::Fresh`] where it must supersede whatever the node holds
//! (a withdrawal, or an object sent again after one).

use std::collections::hash_map::DefaultHasher;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use k8s_openapi::api::core::v1::NodeCondition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde_json::{Value, json};

use apis::kinds::{Kind, ObjectKey, references};

use crate::desired::{DesiredError, DesiredState, WatchEvent, desired_part, spec_revision};

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

/// How a node talks to the cloud.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeDialect {
    /// edgehive's edgecore: reports its inventory when asked.
    Native,
    /// KubeEdge's edgecore: reports none.
    KubeEdge,
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
    /// Write `node`'s Node object: its `Ready` condition changed.
    UpdateNode {
        /// Which node.
        node: String,
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

/// A pod or device bound to a node.
#[derive(Debug, Clone)]
struct Bound {
    node: String,
    /// What it references.
    refs: BTreeSet<ObjectKey>,
    /// The revision of its last spec change: the version its node holds.
    spec: u64,
    /// A digest of its desired part, to tell a spec change from a status
    /// change.
    digest: u64,
}

/// A node as the reconciler sees it.
#[derive(Debug, Default)]
struct NodeState {
    /// Its dialect while its link is up.
    link: Option<NodeDialect>,
    /// Referenced objects it holds, each with the version it was sent at.
    held: BTreeMap<ObjectKey, u64>,
    /// A message could not be queued for it: bring it in step on the next
    /// retry while connected.
    out_of_step: bool,
    /// Since its inventory was asked for: the resources sent to it (in
    /// flight, so the inventory may lack them).
    asked: Option<BTreeSet<String>>,
    /// The `Ready` condition it last reported itself.
    reported_ready: Option<NodeCondition>,
}

/// The edgecontroller's decisions (see the module docs).
#[derive(Debug, Default)]
pub struct Reconciler {
    bound: HashMap<ObjectKey, Bound>,
    /// Digests of referenced objects (configmaps, secrets, device models)
    /// and the revision of their last spec change.
    referenced: HashMap<ObjectKey, (u64, u64)>,
    nodes: HashMap<String, NodeState>,
    /// Kinds whose first list has been taken: until every kind is loaded,
    /// nothing a node holds is withdrawn (an empty view must not look like
    /// "nothing is desired").
    loaded: BTreeSet<Kind>,
}

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

fn node_of(object: &Value) -> Option<&str> {
    object
        .pointer("/spec/nodeName")
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty())
}

/// A minimal object naming `key`, for a withdrawal of an object gone from
/// the desired state.
pub fn stub(key: &ObjectKey) -> Value {
    json!({
        "apiVersion": key.kind.api_version(),
        "kind": key.kind.name(),
        "metadata": { "name": key.name, "namespace": key.namespace },
    })
}

impl Reconciler {
    /// A reconciler that knows nothing yet.
    pub fn new() -> Self {
        Reconciler::default()
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
    /// on the watch events it stands for.
    pub fn listed(
        &mut self,
        kind: Kind,
        objects: Vec<Value>,
        revision: u64,
        reader: &dyn ObjectReader,
    ) -> Vec<Action> {
        let first = self.loaded.insert(kind);
        let listed: BTreeSet<ObjectKey> = objects.iter().filter_map(ObjectKey::of).collect();
        let mut actions = Vec::new();
        if !first {
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
        }
        for object in objects {
            if first {
                self.index(kind, &object);
            } else {
                actions.extend(self.observe(kind, &WatchEvent::Modified(object), reader));
            }
        }
        if first && kind.bound_to_node() {
            self.assume_held();
        }
        actions
    }

    /// Indexes an object without sending anything (first list).
    fn index(&mut self, kind: Kind, object: &Value) {
        let Some(key) = ObjectKey::of(object) else {
            return;
        };
        match kind {
            Kind::Pod | Kind::Device => {
                if let Some(node) = node_of(object) {
                    let refs = references(&key, object);
                    let bound = Bound {
                        node: node.to_owned(),
                        refs,
                        spec: spec_revision(object),
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
                let Some(bound) = self.bound.remove(&key) else {
                    return Vec::new();
                };
                let mut actions = vec![self.send(
                    &bound.node,
                    Op::Delete,
                    &key,
                    Arc::new(object.clone()),
                    Version::Of(revision),
                )];
                actions.extend(self.refresh_node(&bound.node, revision, reader));
                actions
            }
            (Kind::Pod | Kind::Device, _) => {
                let Some(node) = node_of(object).map(str::to_owned) else {
                    // Not bound yet: it waits for a scheduler.
                    return Vec::new();
                };
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
                let refs = references(&key, object);
                self.bound.insert(
                    key.clone(),
                    Bound {
                        node: node.clone(),
                        refs,
                        spec: revision,
                        digest,
                    },
                );
                // What it references first, so it finds them at the edge.
                let mut actions = self.refresh_node(&node, revision, reader);
                actions.push(self.send(
                    &node,
                    op,
                    &key,
                    Arc::new(object.clone()),
                    Version::Of(revision),
                ));
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
                        self.send(
                            &node,
                            Op::Delete,
                            &key,
                            object.clone(),
                            Version::Of(revision),
                        )
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
                self.nodes_wanting(&key)
                    .into_iter()
                    .map(|node| {
                        let held = self
                            .nodes
                            .get(&node)
                            .and_then(|s| s.held.get(&key))
                            .copied();
                        let (op, version) = match held {
                            // The node holds a version sent above this
                            // revision (it went with a pod): a fresh one
                            // supersedes it.
                            Some(sent) if sent >= revision => (Op::Update, Version::Fresh),
                            Some(_) => (Op::Update, Version::Of(revision)),
                            None => (Op::Insert, Version::Of(revision)),
                        };
                        self.send(&node, op, &key, object.clone(), version)
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

    /// The objects bound to `node` reference these.
    fn wanted(&self, node: &str) -> BTreeSet<ObjectKey> {
        self.bound
            .values()
            .filter(|bound| bound.node == node)
            .flat_map(|bound| bound.refs.iter().cloned())
            .collect()
    }

    fn nodes_wanting(&self, key: &ObjectKey) -> BTreeSet<String> {
        self.bound
            .values()
            .filter(|bound| bound.refs.contains(key))
            .map(|bound| bound.node.clone())
            .collect()
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
        let wanted = self.wanted(node);
        let held: BTreeSet<ObjectKey> = self
            .nodes
            .get(node)
            .map(|state| state.held.keys().cloned().collect())
            .unwrap_or_default();
        let mut actions = Vec::new();
        for key in wanted.difference(&held) {
            match reader.read(key) {
                Ok(Some(object)) => {
                    actions.push(self.send(
                        node,
                        Op::Insert,
                        key,
                        Arc::new(object),
                        Version::Of(revision),
                    ));
                }
                // Sent when it is created.
                Ok(None) => {}
                Err(err) => {
                    tracing::warn!(%key, error = %err, "referenced object unreadable");
                    self.node(node).out_of_step = true;
                }
            }
        }
        for key in held.difference(&wanted) {
            let object = reader.read(key).ok().flatten().unwrap_or_else(|| stub(key));
            actions.push(self.send(
                node,
                Op::Delete,
                key,
                Arc::new(object),
                Version::Of(revision),
            ));
        }
        actions
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
                (Op::Delete, _) => {
                    state.held.remove(key);
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
        if op != Op::Delete
            && !key.kind.bound_to_node()
            && let Some(held) = state.held.get_mut(key)
        {
            *held = (*held).max(version);
        }
    }

    // ----- nodes' links -----

    /// `node`'s link came up.
    pub fn connected(
        &mut self,
        node: &str,
        dialect: NodeDialect,
        reader: &dyn ObjectReader,
    ) -> Vec<Action> {
        self.node(node).link = Some(dialect);
        let mut actions = self.resync(node, reader);
        actions.push(Action::UpdateNode {
            node: node.to_owned(),
        });
        actions
    }

    /// `node`'s link went down. Its lease, if any, stays: a disconnect may
    /// arrive after the next session renewed it.
    pub fn disconnected(&mut self, node: &str) -> Vec<Action> {
        self.node(node).link = None;
        vec![Action::UpdateNode {
            node: node.to_owned(),
        }]
    }

    /// Whether `node`'s link is up.
    pub fn is_connected(&self, node: &str) -> bool {
        self.nodes.get(node).is_some_and(|s| s.link.is_some())
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

    /// Brings a node in step: an edgehive node is asked for its inventory;
    /// a KubeEdge node reports none, so it is assumed to hold its pods and
    /// devices at some version (each goes again at its own version, which
    /// it ignores if held) and none of the objects they use (each goes at a
    /// fresh version, which supersedes a withdrawal).
    fn resync(&mut self, node: &str, reader: &dyn ObjectReader) -> Vec<Action> {
        if !self.is_kubeedge(node) {
            self.node(node).asked = Some(BTreeSet::new());
            return vec![Action::AskInventory {
                node: node.to_owned(),
            }];
        }
        let assumed = self
            .bound
            .iter()
            .filter(|(_, bound)| bound.node == node)
            .map(|(key, _)| (key.edge_resource().to_string(), "0".to_owned()))
            .collect();
        self.node(node).asked = Some(BTreeSet::new());
        self.inventory(node, Ok(assumed), reader)
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
        let in_flight = self.node(node).asked.take().unwrap_or_default();
        let inventory = match inventory {
            Ok(inventory) => inventory,
            Err(reason) => {
                tracing::debug!(%node, %reason, "no inventory; trying again later");
                self.node(node).out_of_step = true;
                return Vec::new();
            }
        };
        // What the node should hold, with the version it should hold.
        let mut desired: BTreeMap<String, (ObjectKey, Value, u64)> = BTreeMap::new();
        let mut keys: Vec<(ObjectKey, Option<u64>)> = self
            .bound
            .iter()
            .filter(|(_, bound)| bound.node == node)
            .map(|(key, bound)| (key.clone(), Some(bound.spec)))
            .collect();
        keys.extend(self.wanted(node).into_iter().map(|key| (key, None)));
        for (key, spec) in keys {
            match reader.read(&key) {
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
        for resource in inventory.keys() {
            if desired.contains_key(resource) || in_flight.contains(resource) || !loaded {
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
        self.node(node).held = held;
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
    }

    /// Whether `node` may read `key`: its pods and devices, what they
    /// reference, services and endpoints, and its own Node.
    pub fn entitled(&self, node: &str, key: &ObjectKey) -> bool {
        match key.kind {
            Kind::Pod | Kind::Device => self.may_report(node, key),
            Kind::ConfigMap | Kind::Secret | Kind::DeviceModel => self.wanted(node).contains(key),
            Kind::Service | Kind::Endpoints => true,
            Kind::Node => key.name == node,
        }
    }

    /// `node` reported its own `Ready` condition.
    pub fn reported_ready(&mut self, node: &str, condition: NodeCondition) {
        self.node(node).reported_ready = Some(condition);
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
