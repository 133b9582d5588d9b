//! The cloud's edgecontroller: it holds the desired state (through
//! [`DesiredStore`]), sends each node what it needs and nothing else, and
//! takes the nodes' status.
//!
//! Downstream: a pod with `spec.nodeName` goes to that node; a configmap or
//! secret goes to every node that runs a pod referencing it, and is
//! withdrawn from a node when no pod there references it any more;
//! deletions go down too. Every message carries a revision of the store as
//! its resource version, so the edge applies each once and in order.
//!
//! Upstream: pod status (only from the node the pod is bound to) and node
//! status land in the store; a node's `Ready` condition follows its link
//! (cloudhub's connect and keepalive events) and what the node reports.
//!
//! All of it runs in one task that takes, in arrival order, beehive
//! messages (through the `edgecontroller` module and a relay for node
//! events) and the admin API's requests, so every change to the desired
//! state is made by one writer, in one order.

pub mod kubeedge;

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use beehive::constants::{group, module, operation, resource_type};
use beehive::resource::{CloudResource, EdgeResource};
use beehive::{Hive, Message as HiveMessage, TaskDoor};
use k8s_openapi::api::core::v1::{NodeCondition, NodeStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::{mpsc, oneshot, watch};
use tracing::{debug, info, warn};

use apis::api::ApiError;
use apis::kinds::{Kind, ObjectKey, references, valid_name};

use crate::admin::manifest;
use crate::desired::{DesiredError, DesiredStore};
use kubeedge::Refusal;

/// How the controller runs.
#[derive(Debug, Clone)]
pub struct ControllerConfig {
    /// How long cloudhub may take to queue (and persist) one message for a
    /// node before the controller logs it as not sent.
    pub send_timeout: Duration,
    /// Requests waiting for the controller before callers wait for room.
    pub inbox: usize,
    /// How often nodes that missed a message are reconciled.
    pub retry_every: Duration,
}

impl Default for ControllerConfig {
    fn default() -> Self {
        ControllerConfig {
            send_timeout: Duration::from_secs(10),
            inbox: 1024,
            retry_every: Duration::from_secs(10),
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
}

/// What an apply did.
#[derive(Debug, Clone, PartialEq)]
pub enum Applied {
    /// A new object, as stored.
    Created(Value),
    /// A changed object, as stored.
    Configured(Value),
    /// Nothing changed; the object as held.
    Unchanged(Value),
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
    Apply(
        Vec<(ObjectKey, Value)>,
        oneshot::Sender<Result<Vec<Applied>, ApiError>>,
    ),
    Delete(ObjectKey, oneshot::Sender<Result<Option<Value>, ApiError>>),
    /// What a node reported holding, for its reconciliation.
    Inventory(String, Result<BTreeMap<String, String>, String>),
    /// Ends the task (dropping its store handle), then answers.
    Stop(oneshot::Sender<()>),
}

/// A handle to a running controller: apply and delete go through it, reads
/// go to the store.
#[derive(Clone)]
pub struct ControllerHandle {
    inbox: mpsc::Sender<Input>,
    store: Arc<dyn DesiredStore>,
    /// What the controller has done so far.
    pub counts: watch::Receiver<ControllerCounts>,
}

impl ControllerHandle {
    /// Creates or replaces objects (status is the nodes' to set and is
    /// kept) and sends each where it must go. Every object is checked first,
    /// against its kind and against what is stored; if one fails, none is
    /// applied.
    pub async fn apply(&self, objects: Vec<Value>) -> Result<Vec<(ObjectKey, Applied)>, ApiError> {
        let checked = objects
            .into_iter()
            .map(manifest::check)
            .collect::<Result<Vec<_>, _>>()?;
        let keys: Vec<ObjectKey> = checked.iter().map(|(key, _)| key.clone()).collect();
        let (done, result) = oneshot::channel();
        self.inbox
            .send(Input::Apply(checked, done))
            .await
            .map_err(|_| stopped())?;
        let applied = result.await.map_err(|_| stopped())??;
        Ok(keys.into_iter().zip(applied).collect())
    }

    /// Deletes an object; `None` if there was none.
    pub async fn delete(&self, key: ObjectKey) -> Result<Option<Value>, ApiError> {
        let (done, result) = oneshot::channel();
        self.inbox
            .send(Input::Delete(key, done))
            .await
            .map_err(|_| stopped())?;
        result.await.map_err(|_| stopped())?
    }

    /// The desired-state store, for reads.
    pub fn store(&self) -> &Arc<dyn DesiredStore> {
        &self.store
    }
}

fn stopped() -> ApiError {
    ApiError::Unavailable("the edgecontroller has stopped".to_owned())
}

fn unavailable(err: DesiredError) -> ApiError {
    ApiError::Unavailable(err.to_string())
}

/// The edgecontroller.
pub struct EdgeController;

impl EdgeController {
    /// Starts the controller on `store` in `hive` (inside an actix System):
    /// the `edgecontroller` module in the `resource` group, where nodes'
    /// messages arrive, and a relay in the `nodeevents` group for
    /// cloudhub's connect and disconnect events.
    pub fn start(
        hive: &Hive,
        store: Arc<dyn DesiredStore>,
        config: ControllerConfig,
    ) -> Result<ControllerHandle, beehive::Error> {
        let (inbox, requests) = mpsc::channel(config.inbox.max(1));
        let (counts_tx, counts) = watch::channel(ControllerCounts::default());
        let controller = Controller {
            hive: hive.clone(),
            store: store.clone(),
            config,
            inbox: inbox.clone(),
            bound: HashMap::new(),
            held: HashMap::new(),
            connected: HashSet::new(),
            kubeedge_nodes: HashSet::new(),
            leases: HashMap::new(),
            reported_ready: HashMap::new(),
            loaded: false,
            out_of_step: BTreeSet::new(),
            sent_since_asked: HashMap::new(),
            counts: counts_tx,
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
        let relay = TaskDoor::new(
            NODE_EVENT_RELAY,
            group::NODE_EVENTS,
            inbox.clone(),
            Input::Hive,
        );
        for door in [main, relay] {
            hive.start_module(move |_| door.clone())?;
        }
        Ok(ControllerHandle {
            inbox,
            store,
            counts,
        })
    }
}

/// Name of the module that relays cloudhub's node events to the controller.
pub const NODE_EVENT_RELAY: &str = "edgecontroller-nodeevents";

/// The controller's state, owned by its task.
struct Controller {
    hive: Hive,
    store: Arc<dyn DesiredStore>,
    config: ControllerConfig,
    /// Its own inbox, for answers that arrive from spawned tasks.
    inbox: mpsc::Sender<Input>,
    /// Objects bound to a node (pods, devices): the node and the objects
    /// each references.
    bound: HashMap<ObjectKey, (String, BTreeSet<ObjectKey>)>,
    /// Referenced objects (configmaps, secrets, device models) each node
    /// holds.
    held: HashMap<String, BTreeSet<ObjectKey>>,
    /// Nodes whose link is up.
    connected: HashSet<String>,
    /// Connected nodes that speak KubeEdge's dialect: they report no
    /// inventory, so each connect sends them everything they should hold.
    kubeedge_nodes: HashSet<String>,
    /// Each KubeEdge node's lease (kept in memory: it is renewed every
    /// few seconds).
    leases: HashMap<String, Value>,
    /// The `Ready` condition each node last reported itself.
    reported_ready: HashMap<String, NodeCondition>,
    /// Whether the desired state has been read since start.
    loaded: bool,
    /// Nodes a message could not be queued for: reconciled on the next
    /// retry tick while connected.
    out_of_step: BTreeSet<String>,
    /// For each node whose inventory has been asked for, the resources
    /// sent to it since (in flight, so its inventory may lack them).
    sent_since_asked: HashMap<String, BTreeSet<String>>,
    counts: watch::Sender<ControllerCounts>,
}

fn node_name(pod: &Value) -> Option<String> {
    pod.get("spec")
        .and_then(|s| s.get("nodeName"))
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty())
        .map(str::to_owned)
}

fn now() -> Time {
    let now = jiff::Timestamp::now();
    Time(jiff::Timestamp::from_second(now.as_second()).unwrap_or(now))
}

/// Annotation that keeps, across status writes (which give the object new
/// revisions), the revision of the last spec write: the version its node
/// holds.
pub const SPEC_REVISION: &str = "edgehive.io/spec-revision";

/// The revision a node holds of `object`: that of its last spec write.
fn spec_revision(object: &Value) -> u64 {
    object["metadata"]["annotations"][SPEC_REVISION]
        .as_str()
        .or_else(|| object["metadata"]["resourceVersion"].as_str())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// The part of an object a user sets: everything but status and the
/// metadata the system manages.
fn desired_part(object: &Value) -> Value {
    let mut object = object.clone();
    if let Some(map) = object.as_object_mut() {
        map.remove("status");
        if let Some(metadata) = map.get_mut("metadata").and_then(Value::as_object_mut) {
            let annotations = metadata
                .get_mut("annotations")
                .and_then(Value::as_object_mut);
            if let Some(annotations) = annotations {
                annotations.remove(SPEC_REVISION);
            }
            if metadata
                .get("annotations")
                .and_then(Value::as_object)
                .is_some_and(|a| a.is_empty())
            {
                metadata.remove("annotations");
            }
            for managed in [
                "resourceVersion",
                "uid",
                "creationTimestamp",
                "generation",
                "managedFields",
            ] {
                metadata.remove(managed);
            }
        }
    }
    object
}

impl Controller {
    async fn run(mut self, mut requests: mpsc::Receiver<Input>) {
        self.try_load().await;
        let mut retry = tokio::time::interval(self.config.retry_every);
        retry.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // An input taken while gathering status reports, handled next.
        let mut carried = None;
        loop {
            let input = match carried.take() {
                Some(input) => Some(input),
                None => tokio::select! {
                    input = requests.recv() => input,
                    _ = retry.tick() => {
                        self.try_load().await;
                        self.retry_out_of_step().await;
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
                        let mut reports = vec![first];
                        while reports.len() < STATUS_BATCH {
                            match requests.try_recv() {
                                Ok(Input::Hive(next)) => match StatusReport::of(next) {
                                    Ok(report) => reports.push(report),
                                    Err(other) => {
                                        carried = Some(Input::Hive(other));
                                        break;
                                    }
                                },
                                Ok(other) => {
                                    carried = Some(other);
                                    break;
                                }
                                Err(_) => break,
                            }
                        }
                        self.bound_statuses(reports).await;
                    }
                    Err(msg) => self.on_message(msg).await,
                },
                Input::Apply(objects, done) => {
                    let _ = done.send(self.apply_all(objects).await);
                }
                Input::Inventory(node, inventory) => self.reconcile(&node, inventory).await,
                Input::Delete(key, done) => {
                    let _ = done.send(self.delete(key).await);
                }
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

    /// Rebuilds what each node holds from the desired state, and marks
    /// every node's readiness unknown until its link comes up again.
    async fn load(&mut self) -> Result<(), DesiredError> {
        for kind in [Kind::Pod, Kind::Device] {
            let (objects, _) = self.store.list(kind, None)?;
            for object in &objects {
                let (Some(key), Some(node)) = (ObjectKey::of(object), node_name(object)) else {
                    continue;
                };
                let refs = references(&key, object);
                self.bound.insert(key, (node, refs));
            }
        }
        let nodes: BTreeSet<String> = self.bound.values().map(|(n, _)| n.clone()).collect();
        for node in nodes {
            let wanted = self.wanted(&node);
            let mut held = BTreeSet::new();
            for key in wanted {
                if self.store.get(&key)?.is_some() {
                    held.insert(key);
                }
            }
            self.held.insert(node, held);
        }
        let (nodes, _) = self.store.list(Kind::Node, None)?;
        for node in nodes {
            if let Some(key) = ObjectKey::of(&node) {
                self.update_node(&key.name, None).await;
            }
        }
        info!(bound = self.bound.len(), "edgecontroller ready");
        Ok(())
    }

    fn count(&self, change: impl FnOnce(&mut ControllerCounts)) {
        self.counts.send_modify(change);
    }

    // ----- the admin API's requests -----

    /// Checks every object against what is stored, then applies each.
    async fn apply_all(
        &mut self,
        objects: Vec<(ObjectKey, Value)>,
    ) -> Result<Vec<Applied>, ApiError> {
        for (key, object) in &objects {
            let existing = self.store.get(key).map_err(unavailable)?;
            if key.kind.bound_to_node()
                && let Some(bound) = existing.as_ref().and_then(node_name)
                && node_name(object).as_deref() != Some(bound.as_str())
            {
                return Err(ApiError::Invalid(format!(
                    "{key}: spec.nodeName is immutable once set (bound to {bound})"
                )));
            }
        }
        let mut applied = Vec::with_capacity(objects.len());
        for (key, object) in objects {
            applied.push(self.apply(key, object).await?);
        }
        Ok(applied)
    }

    async fn apply(&mut self, key: ObjectKey, mut object: Value) -> Result<Applied, ApiError> {
        // A spec write's own revision is what nodes will hold.
        if let Some(annotations) = object["metadata"]
            .get_mut("annotations")
            .and_then(Value::as_object_mut)
        {
            annotations.remove(SPEC_REVISION);
        }
        let existing = self.store.get(&key).map_err(unavailable)?;
        let created = existing.is_none();
        match &existing {
            Some(old) => {
                if desired_part(old) == desired_part(&object) {
                    return Ok(Applied::Unchanged(old.clone()));
                }
                // The system's metadata and the nodes' status stay.
                for field in ["uid", "creationTimestamp"] {
                    if let Some(value) = old["metadata"].get(field) {
                        object["metadata"][field] = value.clone();
                    }
                }
                if let Some(status) = old.get("status") {
                    object["status"] = status.clone();
                } else if let Some(map) = object.as_object_mut() {
                    map.remove("status");
                }
            }
            None => {
                object["metadata"]["uid"] = json!(uuid_v4());
                object["metadata"]["creationTimestamp"] = json!(now());
                if let Some(map) = object.as_object_mut() {
                    map.remove("status");
                }
                if key.kind == Kind::Pod {
                    object["status"] = json!({ "phase": "Pending" });
                }
            }
        }
        let (stored, revision) = self
            .store
            .put(key.clone(), object)
            .await
            .map_err(unavailable)?;
        self.send_after_write(
            &key,
            &stored,
            revision,
            created
                || existing
                    .as_ref()
                    .is_some_and(|old| node_name(old).is_none()),
        )
        .await;
        Ok(if created {
            Applied::Created(stored)
        } else {
            Applied::Configured(stored)
        })
    }

    /// Sends a written object where it must go. `new_to_nodes` says
    /// whether a pod reaches its node for the first time.
    async fn send_after_write(
        &mut self,
        key: &ObjectKey,
        stored: &Value,
        revision: u64,
        new_to_nodes: bool,
    ) {
        match key.kind {
            Kind::Pod | Kind::Device => {
                let Some(node) = node_name(stored) else {
                    // Not bound to a node: it waits (there is no scheduler).
                    return;
                };
                let refs = references(key, stored);
                self.bound.insert(key.clone(), (node.clone(), refs));
                let op = if new_to_nodes {
                    operation::INSERT
                } else {
                    operation::UPDATE
                };
                // Referenced objects first, so the pod finds them at the edge.
                self.refresh_node(&node, revision).await;
                self.send(&node, op, key, stored, revision).await;
            }
            Kind::ConfigMap | Kind::Secret | Kind::DeviceModel => {
                let nodes: Vec<String> = self.nodes_wanting(key).into_iter().collect();
                for node in nodes {
                    let holds = self.held.get(&node).is_some_and(|held| held.contains(key));
                    let op = if holds {
                        operation::UPDATE
                    } else {
                        operation::INSERT
                    };
                    if self.send(&node, op, key, stored, revision).await {
                        self.held.entry(node).or_default().insert(key.clone());
                    }
                }
            }
            Kind::Service | Kind::Endpoints | Kind::Node => {}
        }
    }

    async fn delete(&mut self, key: ObjectKey) -> Result<Option<Value>, ApiError> {
        let Some((removed, revision)) =
            self.store.delete(key.clone()).await.map_err(unavailable)?
        else {
            return Ok(None);
        };
        match key.kind {
            Kind::Pod | Kind::Device => {
                if let Some((node, _)) = self.bound.remove(&key) {
                    self.send(&node, operation::DELETE, &key, &removed, revision)
                        .await;
                    self.refresh_node(&node, revision).await;
                }
            }
            Kind::ConfigMap | Kind::Secret | Kind::DeviceModel => {
                let holders: Vec<String> = self
                    .held
                    .iter()
                    .filter(|(_, held)| held.contains(&key))
                    .map(|(node, _)| node.clone())
                    .collect();
                for node in holders {
                    if self
                        .send(&node, operation::DELETE, &key, &removed, revision)
                        .await
                        && let Some(held) = self.held.get_mut(&node)
                    {
                        held.remove(&key);
                    }
                }
            }
            Kind::Node => {
                self.reported_ready.remove(&key.name);
            }
            Kind::Service | Kind::Endpoints => {}
        }
        Ok(Some(removed))
    }

    // ----- what each node needs -----

    /// What the objects bound to `node` reference.
    fn wanted(&self, node: &str) -> BTreeSet<ObjectKey> {
        self.bound
            .values()
            .filter(|(bound, _)| bound == node)
            .flat_map(|(_, refs)| refs.iter().cloned())
            .collect()
    }

    fn nodes_wanting(&self, key: &ObjectKey) -> BTreeSet<String> {
        self.bound
            .values()
            .filter(|(_, refs)| refs.contains(key))
            .map(|(node, _)| node.clone())
            .collect()
    }

    /// Sends `node` the referenced objects it lacks and withdraws the ones
    /// no pod there references any more, at `revision`.
    async fn refresh_node(&mut self, node: &str, revision: u64) {
        let wanted = self.wanted(node);
        let held = self.held.get(node).cloned().unwrap_or_default();
        for key in wanted.difference(&held) {
            match self.store.get(key) {
                Ok(Some(object)) => {
                    if self
                        .send(node, operation::INSERT, key, &object, revision)
                        .await
                    {
                        self.held
                            .entry(node.to_owned())
                            .or_default()
                            .insert(key.clone());
                    }
                }
                Ok(None) => {} // Sent when it is created.
                Err(err) => warn!(%key, error = %err, "referenced object unreadable"),
            }
        }
        for key in held.difference(&wanted) {
            let object = self
                .store
                .get(key)
                .ok()
                .flatten()
                .unwrap_or_else(|| stub(key));
            if self
                .send(node, operation::DELETE, key, &object, revision)
                .await
                && let Some(held) = self.held.get_mut(node)
            {
                held.remove(key);
            }
        }
        if self.held.get(node).is_some_and(BTreeSet::is_empty) {
            self.held.remove(node);
        }
    }

    /// Queues `object` for `node` through cloudhub, which answers once the
    /// message is persisted in the node's queue; whether it was queued. A
    /// node that missed a message is reconciled later.
    async fn send(
        &mut self,
        node: &str,
        op: &str,
        key: &ObjectKey,
        object: &Value,
        revision: u64,
    ) -> bool {
        let resource = key.edge_resource().on_node(node).to_string();
        let msg = HiveMessage::new()
            .build_router(module::EDGECONTROLLER, group::RESOURCE, resource, op)
            .with_resource_version(revision.to_string())
            .with_content(object.clone());
        let refused = match self
            .hive
            .send_sync(module::CLOUDHUB, msg, self.config.send_timeout)
            .await
        {
            Ok(reply) if reply.operation() == operation::ERROR => Some(reply.content().to_string()),
            Ok(_) => None,
            Err(err) => Some(err.to_string()),
        };
        match refused {
            None => {
                debug!(%node, %key, op, revision, "sent to the node");
                self.count(|c| c.sent += 1);
                if let Some(sent) = self.sent_since_asked.get_mut(node) {
                    sent.insert(key.edge_resource().to_string());
                }
                true
            }
            Some(reason) => {
                warn!(%node, %key, op, %reason, "cloudhub did not take a message for a node");
                self.count(|c| c.send_failures += 1);
                self.out_of_step.insert(node.to_owned());
                false
            }
        }
    }

    // ----- keeping nodes in step -----

    /// Reads the desired state; until that succeeds, reconciliation
    /// withdraws nothing (an empty view must not look like "nothing is
    /// desired").
    async fn try_load(&mut self) {
        if self.loaded {
            return;
        }
        match self.load().await {
            Ok(()) => self.loaded = true,
            Err(err) => {
                warn!(error = %err, "edgecontroller could not read the desired state; trying again")
            }
        }
    }

    async fn retry_out_of_step(&mut self) {
        let due: Vec<String> = self
            .out_of_step
            .iter()
            .filter(|node| self.connected.contains(*node))
            .cloned()
            .collect();
        for node in due {
            self.out_of_step.remove(&node);
            self.resync(&node).await;
        }
    }

    /// Brings a node in step: an edgehive node is asked for its inventory;
    /// a KubeEdge node reports none, so it is assumed to hold its pods and
    /// devices at some version (each goes again at its own version, which
    /// it ignores if held) and none of the objects they use (each goes at a
    /// fresh version, which supersedes a withdrawal).
    async fn resync(&mut self, node: &str) {
        if !self.kubeedge_nodes.contains(node) {
            return self.ask_inventory(node);
        }
        let assumed = self
            .bound
            .iter()
            .filter(|(_, (bound, _))| bound == node)
            .map(|(key, _)| (key.edge_resource().to_string(), "0".to_owned()))
            .collect();
        self.reconcile(node, Ok(assumed)).await;
    }

    /// Asks `node` what it holds; the answer comes back as an
    /// [`Input::Inventory`].
    fn ask_inventory(&mut self, node: &str) {
        self.sent_since_asked
            .insert(node.to_owned(), BTreeSet::new());
        let query = HiveMessage::new().build_router(
            module::EDGECONTROLLER,
            group::RESOURCE,
            format!("node/{node}/{}", beehive::constants::INVENTORY),
            operation::QUERY,
        );
        let (hive, inbox, timeout) = (
            self.hive.clone(),
            self.inbox.clone(),
            self.config.send_timeout,
        );
        let node = node.to_owned();
        actix::spawn(async move {
            let inventory = match hive.send_sync(module::CLOUDHUB, query, timeout).await {
                Ok(answer) if answer.operation() != operation::ERROR => {
                    BTreeMap::<String, String>::deserialize(answer.content())
                        .map_err(|err| format!("unreadable inventory: {err}"))
                }
                Ok(answer) => Err(answer.content().to_string()),
                Err(err) => Err(err.to_string()),
            };
            let _ = inbox.send(Input::Inventory(node, inventory)).await;
        });
    }

    /// Brings `node` in step with the desired state from what it reports
    /// holding: what it lacks or holds in an older version is sent, what it
    /// should not hold is withdrawn. Whatever was sent to it since it was
    /// asked is in flight and left alone. This repairs what a cloud crash
    /// between the desired-state commit and the queue commit, or a failed
    /// send, left behind.
    async fn reconcile(&mut self, node: &str, inventory: Result<BTreeMap<String, String>, String>) {
        let in_flight = self.sent_since_asked.remove(node).unwrap_or_default();
        let inventory = match inventory {
            Ok(inventory) => inventory,
            Err(reason) => {
                debug!(%node, %reason, "no inventory; trying again later");
                self.out_of_step.insert(node.to_owned());
                return;
            }
        };
        let mut desired: BTreeMap<String, (ObjectKey, Value)> = BTreeMap::new();
        let mut keys: Vec<ObjectKey> = self
            .bound
            .iter()
            .filter(|(_, (bound, _))| bound == node)
            .map(|(key, _)| key.clone())
            .collect();
        keys.extend(self.wanted(node));
        for key in keys {
            match self.store.get(&key) {
                Ok(Some(object)) => {
                    desired.insert(key.edge_resource().to_string(), (key, object));
                }
                Ok(None) => {}
                Err(err) => {
                    warn!(%key, error = %err, "unreadable; reconciliation postponed");
                    self.out_of_step.insert(node.to_owned());
                    return;
                }
            }
        }
        let mut fresh = None;
        let mut changes = 0;
        for (resource, held_version) in &inventory {
            if desired.contains_key(resource) || in_flight.contains(resource) || !self.loaded {
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
            let Some(revision) = self.fresh_revision(&mut fresh).await else {
                self.out_of_step.insert(node.to_owned());
                return;
            };
            debug!(%node, %resource, held_version, "withdrawn: not desired any more");
            self.send(node, operation::DELETE, &key, &stub(&key), revision)
                .await;
            changes += 1;
        }
        let mut held = BTreeSet::new();
        // What is referenced first, so a pod finds its configmaps and
        // secrets, a device its model.
        let ordered = desired
            .iter()
            .filter(|(_, (key, _))| !key.kind.bound_to_node())
            .chain(
                desired
                    .iter()
                    .filter(|(_, (key, _))| key.kind.bound_to_node()),
            );
        for (resource, (key, object)) in ordered {
            if !key.kind.bound_to_node() {
                held.insert(key.clone());
            }
            if in_flight.contains(resource) {
                continue;
            }
            let version = spec_revision(object);
            let sent = match inventory
                .get(resource)
                .map(|v| v.parse::<u64>().unwrap_or(0))
            {
                Some(held) if held >= version => continue,
                // Older there: this version supersedes it.
                Some(_) => {
                    self.send(node, operation::UPDATE, key, object, version)
                        .await
                }
                // Missing (perhaps withdrawn at a later revision): a fresh
                // revision supersedes any tombstone.
                None => {
                    let Some(revision) = self.fresh_revision(&mut fresh).await else {
                        self.out_of_step.insert(node.to_owned());
                        return;
                    };
                    self.send(node, operation::INSERT, key, object, revision)
                        .await
                }
            };
            if !sent {
                held.remove(key);
            }
            changes += 1;
        }
        if changes > 0 {
            info!(%node, changes, "node brought in step");
        }
        if held.is_empty() {
            self.held.remove(node);
        } else {
            self.held.insert(node.to_owned(), held);
        }
    }

    /// One fresh revision per reconciliation, taken when first needed.
    async fn fresh_revision(&mut self, fresh: &mut Option<u64>) -> Option<u64> {
        if fresh.is_none() {
            match self.store.next_revision().await {
                Ok(revision) => *fresh = Some(revision),
                Err(err) => {
                    warn!(error = %err, "no revision; reconciliation postponed");
                    return None;
                }
            }
        }
        *fresh
    }

    // ----- what nodes say -----

    async fn on_message(&mut self, msg: HiveMessage) {
        if msg.group() == group::NODE_EVENTS {
            let Some(node) = msg.resource().strip_prefix("node/") else {
                return;
            };
            if !valid_name(node) {
                warn!(node, "node event for an invalid node name ignored");
                return;
            }
            let node = node.to_owned();
            self.count(|c| c.node_events += 1);
            match msg.operation() {
                operation::NODE_CONNECTED => {
                    self.connected.insert(node.clone());
                    if msg.content()["dialect"] == "kubeedge" {
                        self.kubeedge_nodes.insert(node.clone());
                    } else {
                        self.kubeedge_nodes.remove(&node);
                    }
                    self.resync(&node).await;
                }
                operation::NODE_DISCONNECTED => {
                    // The lease stays: a disconnect may reach here after
                    // the next session renewed it.
                    self.connected.remove(&node);
                }
                _ => return,
            }
            self.update_node(&node, None).await;
            return;
        }
        let Ok(resource) = msg.resource().parse::<CloudResource>() else {
            debug!(resource = msg.resource(), "message without a node; ignored");
            self.refuse_sync(&msg, "no node/<node>/ in the resource");
            return;
        };
        let node = resource.node.clone();
        let edge = resource.resource;
        match (msg.operation(), edge.resource_type.as_str()) {
            (_, resource_type::LEASE) => self.lease(&node, &edge, &msg),
            (operation::QUERY, _) => self.answer_query(&node, &edge, &msg),
            (operation::INSERT | operation::UPDATE, resource_type::NODE) => {
                let answer = match edge.name == node {
                    true => self.adopt_node(&node, msg.content()).await,
                    false => Err(Refusal::forbidden("a node registers only itself")),
                };
                self.answer_write(&msg, answer);
            }
            (operation::PATCH, resource_type::NODE_PATCH) => {
                let answer = self.patch_node(&node, &edge, msg.content()).await;
                self.answer_write(&msg, answer);
            }
            (
                operation::UPLOAD | operation::UPDATE | operation::INSERT | operation::PATCH,
                resource_type::NODE_STATUS,
            ) => {
                let status = kubeedge::status_of(msg.content());
                match self.node_status(&node, &edge, status).await {
                    Ok(()) => self.answer_node(&msg, json!("OK")),
                    Err(refusal) => self.refuse_sync(&msg, &refusal.message),
                }
            }
            (operation::PATCH, resource_type::POD_PATCH) => {
                // A readable one is a status report, taken with the others.
                let reason = kubeedge::patch_of(msg.content()).err();
                let reason = reason.unwrap_or_else(|| "unreadable patch".to_owned());
                self.answer_write(&msg, Err(Refusal::bad_request(reason)));
            }
            (op, kind) => {
                debug!(%node, op, kind, "not for the edgecontroller; ignored");
                self.refuse_sync(&msg, "the edgecontroller does not take this");
            }
        }
    }

    /// Refuses a request that waits for an answer: a node's goes back down
    /// its link, a cloud module's to it directly.
    fn refuse_sync(&self, msg: &HiveMessage, reason: &str) {
        if !msg.is_sync() {
            return;
        }
        let refusal = msg.error_response(module::EDGECONTROLLER, reason);
        if msg.resource().parse::<CloudResource>().is_ok() {
            self.send_to_node(refusal);
        } else {
            self.hive.send_resp(refusal);
        }
    }

    /// Answers a node's request that waits for an answer.
    fn answer_node(&self, msg: &HiveMessage, content: Value) {
        if msg.is_sync() {
            self.send_to_node(msg.response(module::EDGECONTROLLER, content));
        }
    }

    /// Answers a KubeEdge node's write with the stored object, or with a
    /// Kubernetes Status error.
    fn answer_write(&self, msg: &HiveMessage, written: Result<Value, Refusal>) {
        let content = match written {
            Ok(object) => kubeedge::object_answer(object),
            Err(refusal) => refusal.answer(),
        };
        self.answer_node(msg, content);
    }

    /// Sends an answer down to its node through cloudhub.
    fn send_to_node(&self, mut answer: HiveMessage) {
        // An answer is not an object to acknowledge.
        answer.header.resource_version.clear();
        answer.header.sync = false;
        let hive = self.hive.clone();
        actix::spawn(async move {
            if let Err(err) = hive.send(module::CLOUDHUB, answer).await {
                debug!(error = %err, "answer to a node not sent");
            }
        });
    }

    /// Takes what a node says of its own Node object (its registration, or
    /// a patch of it applied to the stored object): its labels,
    /// annotations and status. Returns the object as stored.
    async fn adopt_node(&mut self, node: &str, given: &Value) -> Result<Value, Refusal> {
        let key = ObjectKey::new(Kind::Node, "", node);
        match given.get("status").filter(|status| !status.is_null()) {
            Some(status) => {
                let what = EdgeResource::new("default", resource_type::NODE_STATUS, node);
                self.node_status(node, &what, status).await?;
            }
            None => self.update_node(node, None).await,
        }
        let mut object = self
            .store
            .get(&key)
            .map_err(|err| Refusal::internal(err.to_string()))?
            .ok_or_else(|| Refusal::internal(format!("node {node} not stored")))?;
        let before = object.clone();
        for field in ["labels", "annotations"] {
            let Some(given) = given
                .pointer(&format!("/metadata/{field}"))
                .and_then(Value::as_object)
            else {
                continue;
            };
            if let Some(held) = object["metadata"]
                .as_object_mut()
                .map(|metadata| metadata.entry(field).or_insert_with(|| json!({})))
                .and_then(Value::as_object_mut)
            {
                held.extend(given.iter().map(|(k, v)| (k.clone(), v.clone())));
            }
        }
        if object == before {
            return Ok(object);
        }
        self.store
            .put(key, object)
            .await
            .map(|(stored, _)| stored)
            .map_err(|err| Refusal::internal(err.to_string()))
    }

    /// Applies a KubeEdge node's patch of its own Node object.
    async fn patch_node(
        &mut self,
        node: &str,
        what: &EdgeResource,
        content: &Value,
    ) -> Result<Value, Refusal> {
        if what.name != node {
            return Err(Refusal::forbidden("a node patches only itself"));
        }
        let patch = kubeedge::patch_of(content).map_err(Refusal::bad_request)?;
        self.update_node(node, None).await;
        let key = ObjectKey::new(Kind::Node, "", node);
        let mut object = self
            .store
            .get(&key)
            .map_err(|err| Refusal::internal(err.to_string()))?
            .unwrap_or_default();
        kubeedge::strategic_merge(&mut object, &patch);
        let adopted = self.adopt_node(node, &object).await?;
        self.count(|c| c.patches += 1);
        Ok(adopted)
    }

    /// A KubeEdge node's lease: its own only, kept in memory, answered as
    /// a kubelet expects (NotFound before the first is written).
    fn lease(&mut self, node: &str, what: &EdgeResource, msg: &HiveMessage) {
        if what.name != node {
            let refusal = Refusal::forbidden("a node holds only its own lease");
            return self.answer_node(msg, refusal.answer());
        }
        let answer = match msg.operation() {
            operation::QUERY => match self.leases.get(node) {
                Some(lease) => kubeedge::object_answer(lease.clone()),
                None => {
                    Refusal::not_found(format!("leases.coordination.k8s.io {node:?} not found"))
                        .answer()
                }
            },
            operation::INSERT | operation::UPDATE => {
                let mut lease = msg.content().clone();
                let version = self
                    .leases
                    .get(node)
                    .and_then(|held| held.pointer("/metadata/resourceVersion"))
                    .and_then(Value::as_str)
                    .and_then(|v| v.parse::<u64>().ok())
                    .unwrap_or(0)
                    + 1;
                if let Some(metadata) = lease.get_mut("metadata").and_then(Value::as_object_mut) {
                    metadata.insert("resourceVersion".into(), json!(version.to_string()));
                }
                self.leases.insert(node.to_owned(), lease.clone());
                kubeedge::object_answer(lease)
            }
            other => Refusal::bad_request(format!("{other} of a lease")).answer(),
        };
        self.answer_node(msg, answer);
    }

    fn refuse_status(&self, node: &str, what: &EdgeResource, reason: &str) {
        warn!(%node, resource = %what, reason, "status refused");
        self.count(|c| c.status_refused += 1);
    }

    /// Stores the statuses nodes report of objects bound to them (pods,
    /// devices), all in one commit, the latest per object; a node never
    /// sets the status of another node's object.
    async fn bound_statuses(&mut self, reports: Vec<StatusReport>) {
        let mut order: Vec<ObjectKey> = Vec::new();
        let mut updated: HashMap<ObjectKey, (String, Value)> = HashMap::new();
        // Reports that wait for an answer (a KubeEdge edge's), with the
        // object they are about, or why they were refused.
        let mut waiting: Vec<(StatusReport, Result<ObjectKey, Refusal>)> = Vec::new();
        for report in reports {
            let key = ObjectKey::new(
                report.kind,
                report.what.namespace.as_str(),
                report.what.name.as_str(),
            );
            let base = match updated.get(&key) {
                Some((_, object)) => Ok(Some(object.clone())),
                None => self.store.get(&key),
            };
            let taken = match base {
                Ok(Some(object)) => report.status_for(&object).and_then(|status| {
                    self.with_status(report.kind, &report.node, object, &status)
                }),
                Ok(None) => Err(Refusal::not_found("no such object")),
                Err(err) => Err(Refusal::internal(err.to_string())),
            };
            let outcome = match taken {
                Ok(Some(object)) => {
                    if !updated.contains_key(&key) {
                        order.push(key.clone());
                    }
                    updated.insert(key.clone(), (report.node.clone(), object));
                    Ok(key)
                }
                Ok(None) => Ok(key),
                Err(refusal) => {
                    self.refuse_status(&report.node, &report.what, &refusal.message);
                    Err(refusal)
                }
            };
            if report.msg.is_sync() {
                waiting.push((report, outcome));
            }
        }
        let writes: Vec<_> = order
            .into_iter()
            .filter_map(|key| {
                let (node, object) = updated.remove(&key)?;
                let put = self.store.put(key.clone(), object);
                Some(async move { (key, node, put.await) })
            })
            .collect();
        let mut failed = HashSet::new();
        for (key, node, stored) in futures_util::future::join_all(writes).await {
            match stored {
                Ok(_) => self.count(|c| c.status_applied += 1),
                Err(err) => {
                    warn!(%node, error = %err, "status not stored");
                    failed.insert(key);
                }
            }
        }
        for (report, outcome) in waiting {
            let outcome = outcome.and_then(|key| match failed.contains(&key) {
                true => Err(Refusal::internal("the status could not be stored")),
                false => Ok(key),
            });
            match (&report.change, outcome) {
                (StatusChange::Patch(_), Ok(key)) => {
                    self.count(|c| c.patches += 1);
                    let object = match self.store.get(&key) {
                        Ok(Some(object)) => Ok(object),
                        Ok(None) => Err(Refusal::not_found("deleted meanwhile")),
                        Err(err) => Err(Refusal::internal(err.to_string())),
                    };
                    self.answer_write(&report.msg, object);
                }
                (StatusChange::Patch(_), Err(refusal)) => {
                    self.answer_write(&report.msg, Err(refusal));
                }
                (StatusChange::Replace(_), Ok(_)) => self.answer_node(&report.msg, json!("OK")),
                (StatusChange::Replace(_), Err(refusal)) => {
                    self.refuse_sync(&report.msg, &refusal.message)
                }
            }
        }
    }

    /// `object` with the status `node` reports if it changes anything
    /// (`None` if not), or why the node may not set it.
    fn with_status(
        &self,
        kind: Kind,
        node: &str,
        object: Value,
        status: &Value,
    ) -> Result<Option<Value>, Refusal> {
        if node_name(&object).as_deref() != Some(node) {
            return Err(Refusal::forbidden("the object is not bound to this node"));
        }
        kind.check_status(status)
            .map_err(|err| Refusal::invalid(err.to_string()))?;
        if object.get("status") == Some(status) {
            return Ok(None);
        }
        let mut object = object;
        // The new revision is the status's; the node keeps the spec's.
        let held = spec_revision(&object).to_string();
        if let Some(metadata) = object.get_mut("metadata").and_then(Value::as_object_mut) {
            let annotations = metadata.entry("annotations").or_insert_with(|| json!({}));
            if let Some(annotations) = annotations.as_object_mut() {
                annotations.insert(SPEC_REVISION.to_owned(), Value::String(held));
            }
        }
        object["status"] = status.clone();
        Ok(Some(object))
    }

    async fn node_status(
        &mut self,
        node: &str,
        what: &EdgeResource,
        status: &Value,
    ) -> Result<(), Refusal> {
        let refused = |refusal: Refusal| {
            self.refuse_status(node, what, &refusal.message);
            Err(refusal)
        };
        if what.name != node {
            return refused(Refusal::forbidden("a node reports only its own status"));
        }
        let Ok(reported) = NodeStatus::deserialize(status) else {
            return refused(Refusal::invalid("not a NodeStatus"));
        };
        if let Some(ready) = reported
            .conditions
            .iter()
            .flatten()
            .find(|c| c.type_ == "Ready")
        {
            self.reported_ready.insert(node.to_owned(), ready.clone());
        }
        self.update_node(node, Some(reported)).await;
        self.count(|c| c.status_applied += 1);
        Ok(())
    }

    /// Writes the node's object: its reported status if given, and its
    /// `Ready` condition from the link and the node's own report.
    async fn update_node(&mut self, node: &str, reported: Option<NodeStatus>) {
        let key = ObjectKey::new(Kind::Node, "", node);
        let existing = match self.store.get(&key) {
            Ok(existing) => existing,
            Err(err) => return warn!(%node, error = %err, "node unreadable"),
        };
        let mut object = existing.clone().unwrap_or_else(|| {
            json!({
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": node,
                    "uid": uuid_v4(),
                    "creationTimestamp": now(),
                    "labels": { "node-role.kubernetes.io/edge": "" },
                },
            })
        });
        let mut status = match reported {
            Some(reported) => reported,
            None => object
                .get("status")
                .and_then(|s| NodeStatus::deserialize(s).ok())
                .unwrap_or_default(),
        };
        let ready = self.ready_condition(node);
        let conditions = status.conditions.get_or_insert_with(Vec::new);
        let previous = conditions.iter().position(|c| c.type_ == "Ready");
        let ready = match previous.map(|i| conditions.remove(i)) {
            // The transition time moves only when the status does.
            Some(old) if old.status == ready.status => NodeCondition {
                last_transition_time: old.last_transition_time,
                ..ready
            },
            _ => ready,
        };
        conditions.insert(0, ready);
        match serde_json::to_value(&status) {
            Ok(status) => object["status"] = status,
            Err(err) => return warn!(%node, error = %err, "node status unwritable"),
        }
        if existing.as_ref() == Some(&object) {
            return;
        }
        if let Err(err) = self.store.put(key, object).await {
            warn!(%node, error = %err, "node not stored");
        }
    }

    fn ready_condition(&self, node: &str) -> NodeCondition {
        let time = Some(now());
        if !self.connected.contains(node) {
            return NodeCondition {
                type_: "Ready".to_owned(),
                status: "Unknown".to_owned(),
                reason: Some("EdgeLinkDown".to_owned()),
                message: Some("the node's link to the cloud is down".to_owned()),
                last_heartbeat_time: time.clone(),
                last_transition_time: time,
            };
        }
        match self.reported_ready.get(node) {
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

    /// Answers a node's query with an object it is entitled to: its pods,
    /// what they reference, services and endpoints, and its own Node.
    fn answer_query(&self, node: &str, what: &EdgeResource, msg: &HiveMessage) {
        self.count(|c| c.queries += 1);
        let entitled = ObjectKey::from_edge_resource(what).filter(|key| match key.kind {
            Kind::Pod | Kind::Device => self.bound.get(key).is_some_and(|(bound, _)| bound == node),
            Kind::ConfigMap | Kind::Secret | Kind::DeviceModel => self.wanted(node).contains(key),
            Kind::Service | Kind::Endpoints => true,
            Kind::Node => key.name == node,
        });
        let found = entitled.and_then(|key| self.store.get(&key).ok().flatten());
        if what.resource_type == resource_type::NODE && self.kubeedge_nodes.contains(node) {
            // A kubelet reads its Node as a write's answer: {Object, Err}.
            let answer = match found {
                Some(object) => kubeedge::object_answer(object),
                None => Refusal::not_found(format!("node {:?} not found", what.name)).answer(),
            };
            return self.send_to_node(msg.response(module::EDGECONTROLLER, answer));
        }
        self.send_to_node(match found {
            Some(object) => msg.response(module::EDGECONTROLLER, object),
            None => msg.error_response(
                module::EDGECONTROLLER,
                format!("{what} not found for node {node}"),
            ),
        });
    }
}

/// Status reports stored in one commit at most.
const STATUS_BATCH: usize = 512;

/// A node's status report of an object bound to it (a pod's or a
/// device's status), read once where the controller takes its inputs.
struct StatusReport {
    kind: Kind,
    node: String,
    what: EdgeResource,
    change: StatusChange,
    msg: HiveMessage,
}

/// What a status report does to the object's status.
enum StatusChange {
    /// Replaces it (edgehive's `podstatus`, KubeEdge's older wrapped one).
    Replace(Value),
    /// Patches the object (KubeEdge's `podpatch`); only its status and a
    /// required uid are taken.
    Patch(Value),
}

impl StatusReport {
    /// The report `msg` is, or `msg` back when it is none.
    // Both sides hold the message: boxing one would only add an allocation.
    #[allow(clippy::result_large_err)]
    fn of(msg: HiveMessage) -> Result<StatusReport, HiveMessage> {
        let status_operation = matches!(
            msg.operation(),
            operation::UPLOAD | operation::UPDATE | operation::INSERT | operation::PATCH
        );
        if !status_operation || msg.group() == group::NODE_EVENTS {
            return Err(msg);
        }
        let Ok(resource) = msg.resource().parse::<CloudResource>() else {
            return Err(msg);
        };
        let resource_type = resource.resource.resource_type.as_str();
        let (kind, change) =
            if resource_type == resource_type::POD_PATCH && msg.operation() == operation::PATCH {
                match kubeedge::patch_of(msg.content()) {
                    Ok(patch) => (Kind::Pod, StatusChange::Patch(patch)),
                    Err(_) => return Err(msg),
                }
            } else {
                let Some(kind) = [Kind::Pod, Kind::Device]
                    .into_iter()
                    .find(|k| k.status_type() == Some(resource_type))
                else {
                    return Err(msg);
                };
                let status = kubeedge::status_of(msg.content()).clone();
                (kind, StatusChange::Replace(status))
            };
        Ok(StatusReport {
            kind,
            node: resource.node,
            what: resource.resource,
            change,
            msg,
        })
    }

    /// The status `object` gets from this report, or why it gets none.
    fn status_for(&self, object: &Value) -> Result<Value, Refusal> {
        match &self.change {
            StatusChange::Replace(status) => Ok(status.clone()),
            StatusChange::Patch(patch) => {
                let uid = object.pointer("/metadata/uid").and_then(Value::as_str);
                if let Some(required) = kubeedge::required_uid(patch)
                    && uid.is_some_and(|uid| uid != required)
                {
                    return Err(Refusal::conflict(format!(
                        "the patch is for uid {required}, not {uid:?}"
                    )));
                }
                let mut status = object.get("status").cloned().unwrap_or(Value::Null);
                if let Some(patch) = patch.get("status") {
                    kubeedge::strategic_merge(&mut status, patch);
                }
                Ok(status)
            }
        }
    }
}

/// A minimal object naming `key`, for a deletion whose object is gone.
fn stub(key: &ObjectKey) -> Value {
    json!({
        "apiVersion": key.kind.api_version(),
        "kind": key.kind.name(),
        "metadata": { "name": key.name, "namespace": key.namespace },
    })
}

fn uuid_v4() -> String {
    beehive::Uuid::new_v4().to_string()
}
