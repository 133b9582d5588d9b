//! devicetwin: the edge's device twins.
//!
//! Devices and device models arrive from the cloud through metamanager,
//! which has persisted them. The devices bound to this node are its
//! members, announced on `$hw/events/node/<node>/membership/updated`. Each
//! device property is a twin: the expected value comes from the cloud's
//! desired value (or an edge application), the actual value from the
//! device's mapper; both carry versions (`{cloud, edge}`). When the cloud
//! changes an expected value the mapper gets the difference on
//! `twin/update/delta`; what mappers report is gathered per device
//! (latest wins per property) and, every `report_period`, written as the
//! device's status through metamanager, which persists it and sends it up
//! (edgehub keeps it while the cloud is away). A mapper's update is
//! answered on its result topic once that write is committed, so an
//! answered report survives a crash.
//!
//! All of it runs in one task that takes the messages in arrival order,
//! so the twins have one writer.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use apis::devices::{Device, DeviceModel, DeviceStatus, Twin, TwinProperty};
use beehive::constants::{group, module, operation, resource_type};
use beehive::message::now_millis;
use beehive::resource::EdgeResource;
use beehive::{Hive, Message as HiveMessage, TaskDoor};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::{mpsc, oneshot, watch};
use tracing::{debug, info, warn};

use crate::TwinError;
use crate::protocol::{
    self, DELETED, MemberDevice, MsgAttr, MsgTwin, Request, StateUpdate, TwinUpdate, TwinValue,
    TwinVersion, TypeMetadata, ValueMetadata, code,
};

/// How devicetwin runs.
#[derive(Debug, Clone)]
pub struct DeviceTwinConfig {
    /// This node's name.
    pub node: String,
    /// How often reported changes are written and sent up; reports within
    /// one period go as one status per device.
    pub report_period: Duration,
    /// How long metamanager may take to answer.
    pub store_timeout: Duration,
}

impl DeviceTwinConfig {
    /// Defaults for `node`.
    pub fn new(node: impl Into<String>) -> Self {
        DeviceTwinConfig {
            node: node.into(),
            report_period: Duration::from_millis(100),
            store_timeout: Duration::from_secs(10),
        }
    }
}

/// What devicetwin has done, for tests and metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DeviceTwinCounts {
    /// Devices bound to this node.
    pub devices: usize,
    /// Twin and state updates accepted from mappers and applications.
    pub accepted: u64,
    /// Requests answered with an error.
    pub refused: u64,
    /// Device statuses written (and so sent up).
    pub written: u64,
    /// Device statuses metamanager did not take (tried again later).
    pub write_failures: u64,
    /// Changes of desired values from the cloud.
    pub cloud_changes: u64,
}

/// A running devicetwin.
#[derive(Clone)]
pub struct DeviceTwinHandle {
    /// What it has done so far.
    pub counts: watch::Receiver<DeviceTwinCounts>,
}

/// The devicetwin module.
pub struct DeviceTwin;

impl DeviceTwin {
    /// Starts devicetwin in `hive` (inside an actix System): the `twin`
    /// module, where metamanager passes devices and models and the
    /// eventbus passes MQTT requests. It first loads what metamanager
    /// holds.
    pub fn start(hive: &Hive, config: DeviceTwinConfig) -> Result<DeviceTwinHandle, TwinError> {
        let (inbox, requests) = mpsc::channel(4096);
        let (counts_tx, counts) = watch::channel(DeviceTwinCounts::default());
        let twins = Twins {
            hive: hive.clone(),
            config,
            devices: BTreeMap::new(),
            models: HashMap::new(),
            dirty: BTreeSet::new(),
            waiting: HashMap::new(),
            counts: counts_tx,
        };
        actix::spawn(twins.run(requests));
        let door = TaskDoor::new(module::DEVICETWIN, group::TWIN, inbox, |msg| {
            Input::Hive(Box::new(msg))
        })
        .stopping_with(Input::Stop);
        hive.start_module(move |_| door.clone())?;
        Ok(DeviceTwinHandle { counts })
    }
}

enum Input {
    Hive(Box<HiveMessage>),
    Stop(oneshot::Sender<()>),
}

/// One twin's state.
#[derive(Debug, Clone, Default, PartialEq)]
struct TwinState {
    expected: Option<TwinValue>,
    actual: Option<TwinValue>,
    optional: bool,
    type_: String,
    expected_version: TwinVersion,
    actual_version: TwinVersion,
    /// Whether the device's spec lists the property (a twin only a mapper
    /// reported stays when the spec changes).
    in_spec: bool,
    /// The cloud's desired value as last received: the expected value
    /// follows the cloud only when this changes, so an edge application's
    /// value stands until the cloud wants something new.
    cloud_desired: Option<String>,
}

impl TwinState {
    fn message(&self) -> MsgTwin {
        MsgTwin {
            expected: self.expected.clone(),
            actual: self.actual.clone(),
            optional: Some(self.optional),
            metadata: Some(TypeMetadata {
                type_: self.type_.clone(),
            }),
            expected_version: Some(self.expected_version),
            actual_version: Some(self.actual_version),
        }
    }

    /// The expected value, when the actual one differs from it.
    fn delta(&self) -> Option<String> {
        let expected = self.expected.as_ref()?.value.clone()?;
        let actual = self.actual.as_ref().and_then(|a| a.value.as_deref());
        (actual != Some(expected.as_str())).then_some(expected)
    }
}

/// A device bound to this node.
#[derive(Debug, Clone, Default)]
struct DeviceEntry {
    namespace: String,
    name: String,
    model: Option<String>,
    protocol: Option<String>,
    twins: BTreeMap<String, TwinState>,
    state: Option<String>,
    last_online: Option<String>,
}

impl DeviceEntry {
    fn member(&self) -> MemberDevice {
        let mut attributes = BTreeMap::new();
        if let Some(model) = &self.model {
            attributes.insert("model".to_owned(), MsgAttr::text(model));
        }
        if let Some(protocol) = &self.protocol {
            attributes.insert("protocol".to_owned(), MsgAttr::text(protocol));
        }
        MemberDevice {
            id: self.name.clone(),
            name: self.name.clone(),
            description: None,
            state: self.state.clone(),
            last_online: self.last_online.clone(),
            attributes,
            twin: self.twin_messages(),
        }
    }

    fn twin_messages(&self) -> BTreeMap<String, MsgTwin> {
        self.twins
            .iter()
            .map(|(name, twin)| (name.clone(), twin.message()))
            .collect()
    }

    /// The status the cloud gets: reported values and the expected value
    /// each was reported against, with their versions, and the state.
    fn status(&self) -> DeviceStatus {
        let property = |value: &TwinValue, version: TwinVersion, type_: Option<&str>| {
            let mut metadata = BTreeMap::from([
                (
                    "timestamp".to_owned(),
                    value
                        .metadata
                        .as_ref()
                        .map_or(0, |m| m.timestamp)
                        .to_string(),
                ),
                ("cloudVersion".to_owned(), version.cloud.to_string()),
                ("edgeVersion".to_owned(), version.edge.to_string()),
            ]);
            if let Some(type_) = type_ {
                metadata.insert("type".to_owned(), type_.to_owned());
            }
            TwinProperty {
                value: value.value.clone().unwrap_or_default(),
                metadata,
            }
        };
        let twins = self
            .twins
            .iter()
            .filter(|(_, t)| t.actual.is_some() || t.expected.is_some())
            .map(|(name, twin)| Twin {
                property_name: name.clone(),
                reported: twin
                    .actual
                    .as_ref()
                    .map(|v| property(v, twin.actual_version, Some(&twin.type_))),
                observed_desired: twin
                    .expected
                    .as_ref()
                    .map(|v| property(v, twin.expected_version, None)),
            })
            .collect();
        DeviceStatus {
            twins,
            state: self.state.clone(),
            last_online_time: self.last_online.clone(),
            // The user's, kept by the cloud across the node's reports.
            report_to_cloud: None,
            report_cycle: None,
        }
    }

    /// Takes back what a stored status says: reported values and their
    /// versions, the state, and an expected value set at the edge after
    /// the cloud's current one.
    fn restore(&mut self, status: &DeviceStatus) {
        let version = |p: &TwinProperty| TwinVersion {
            cloud: p
                .metadata
                .get("cloudVersion")
                .and_then(|v| v.parse().ok())
                .unwrap_or(0),
            edge: p
                .metadata
                .get("edgeVersion")
                .and_then(|v| v.parse().ok())
                .unwrap_or(0),
        };
        let value = |p: &TwinProperty| TwinValue {
            value: Some(p.value.clone()),
            metadata: Some(ValueMetadata {
                timestamp: p
                    .metadata
                    .get("timestamp")
                    .and_then(|t| t.parse().ok())
                    .unwrap_or(0),
            }),
        };
        for twin in &status.twins {
            let state = self
                .twins
                .entry(twin.property_name.clone())
                .or_insert_with(|| TwinState {
                    optional: true,
                    type_: "string".to_owned(),
                    ..TwinState::default()
                });
            if let Some(reported) = &twin.reported {
                state.actual = Some(value(reported));
                state.actual_version = version(reported);
                if let Some(type_) = reported.metadata.get("type") {
                    state.type_ = type_.clone();
                }
            }
            if let Some(observed) = &twin.observed_desired {
                let observed_version = version(observed);
                if observed_version.edge > 0
                    && observed_version.cloud == state.expected_version.cloud
                {
                    state.expected = Some(value(observed));
                    state.expected_version = observed_version;
                }
            }
        }
        self.state = status.state.clone();
        self.last_online = status.last_online_time.clone();
    }
}

/// A twin before and after a change (`None`: it did not exist).
type TwinChange = (Option<MsgTwin>, Option<MsgTwin>);

/// What waits for a device's next committed status write.
#[derive(Default)]
struct Waiting {
    /// Results to publish: topic, payload.
    answers: Vec<(String, Value)>,
    /// Changes to announce.
    changes: Vec<BTreeMap<String, TwinChange>>,
    /// Writes that failed since the last one that succeeded.
    failures: u32,
}

/// Failed writes after which the waiting requests are answered with an
/// error (the reports stay and are written later).
const FAILED_WRITES: u32 = 3;

/// Twins one device may have; more are refused (every twin is kept,
/// persisted and rewritten with each report).
const MAX_TWINS: usize = 256;

/// The twins' state, owned by devicetwin's task.
struct Twins {
    hive: Hive,
    config: DeviceTwinConfig,
    /// Devices bound to this node, by id (their name).
    devices: BTreeMap<String, DeviceEntry>,
    /// Device models, by namespace and name.
    models: HashMap<(String, String), DeviceModel>,
    /// Devices whose status changed since the last write.
    dirty: BTreeSet<String>,
    /// What waits for each device's next committed write: results to
    /// publish (topic, payload) and twin changes to announce (document,
    /// delta).
    waiting: HashMap<String, Waiting>,
    counts: watch::Sender<DeviceTwinCounts>,
}

impl Twins {
    async fn run(mut self, mut requests: mpsc::Receiver<Input>) {
        self.load().await;
        let mut tick = tokio::time::interval(self.config.report_period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                input = requests.recv() => match input {
                    Some(Input::Hive(msg)) => self.on_message(*msg).await,
                    Some(Input::Stop(done)) => {
                        self.write_reports().await;
                        let _ = done.send(());
                        break;
                    }
                    None => break,
                },
                _ = tick.tick() => self.write_reports().await,
            }
        }
        debug!("devicetwin stopped");
    }

    fn count(&self, change: impl FnOnce(&mut DeviceTwinCounts)) {
        self.counts.send_modify(change);
    }

    // ----- start-up -----

    /// Loads models, devices and their last statuses from metamanager, and
    /// sends every status up again (the cloud may have missed the last
    /// ones if the node restarted while offline).
    async fn load(&mut self) {
        for model in self.list(resource_type::DEVICE_MODEL).await {
            self.apply_model(&model);
        }
        for device in self.list(resource_type::DEVICE).await {
            self.apply_device(&device, false).await;
        }
        let held: Vec<(String, String)> = self
            .devices
            .values()
            .map(|d| (d.namespace.clone(), d.name.clone()))
            .collect();
        for (namespace, name) in held {
            let resource = EdgeResource::new(
                namespace.as_str(),
                resource_type::DEVICE_STATUS,
                name.as_str(),
            );
            let Some(status) = self.query(&resource.to_string()).await else {
                continue;
            };
            match DeviceStatus::deserialize(&status) {
                Ok(status) => {
                    if let Some(entry) = self.devices.get_mut(&name) {
                        entry.restore(&status);
                        self.dirty.insert(name);
                    }
                }
                Err(err) => warn!(device = %resource, error = %err, "stored status unreadable"),
            }
        }
        let devices = self.devices.len();
        self.count(|c| c.devices = devices);
        info!(devices, "devicetwin ready");
    }

    async fn list(&self, kind: &str) -> Vec<Value> {
        match self.query(&format!("*/{kind}")).await {
            Some(Value::Array(items)) => items,
            Some(other) => {
                warn!(kind, answer = %other, "metamanager did not list");
                Vec::new()
            }
            None => Vec::new(),
        }
    }

    /// What metamanager answers for `resource`; `None` when it holds
    /// nothing there.
    async fn query(&self, resource: &str) -> Option<Value> {
        let query = HiveMessage::new().build_router(
            module::DEVICETWIN,
            group::META,
            resource,
            operation::QUERY,
        );
        match self
            .hive
            .send_sync(module::METAMANAGER, query, self.config.store_timeout)
            .await
        {
            Ok(answer) if answer.operation() != operation::ERROR => Some(answer.content().clone()),
            Ok(answer) => {
                debug!(resource, answer = %answer.content(), "not held");
                None
            }
            Err(err) => {
                warn!(resource, error = %err, "metamanager did not answer");
                None
            }
        }
    }
}

impl Twins {
    async fn on_message(&mut self, msg: HiveMessage) {
        if msg.resource().starts_with("$hw/") {
            return self.on_request(&msg).await;
        }
        let Ok(resource) = msg.resource().parse::<EdgeResource>() else {
            return debug!(resource = msg.resource(), "not for devicetwin");
        };
        let deleted = msg.operation() == operation::DELETE;
        if matches!(
            resource.resource_type.as_str(),
            resource_type::DEVICE | resource_type::DEVICE_MODEL
        ) {
            // DMI mappers hear of it too, when DMI runs.
            match self.hive.try_send(crate::dmi::server::SOURCE, msg.clone()) {
                Ok(()) | Err(beehive::Error::UnknownModule(_)) => {}
                Err(err) => warn!(error = %err, "a device change not passed to DMI mappers"),
            }
        }
        match (resource.resource_type.as_str(), deleted) {
            (resource_type::DEVICE_MODEL, false) => self.apply_model(msg.content()),
            (resource_type::DEVICE_MODEL, true) => {
                self.models
                    .remove(&(resource.namespace.clone(), resource.name.clone()));
            }
            (resource_type::DEVICE, false) => self.apply_device(msg.content(), true).await,
            (resource_type::DEVICE, true) => self.remove_device(&resource).await,
            (other, _) => debug!(kind = other, "not for devicetwin"),
        }
    }

    // ----- from the cloud -----

    fn apply_model(&mut self, object: &Value) {
        match DeviceModel::deserialize(object) {
            Ok(model) => {
                let key = (
                    model
                        .metadata
                        .namespace
                        .clone()
                        .unwrap_or_else(|| "default".to_owned()),
                    model.metadata.name.clone().unwrap_or_default(),
                );
                // Twins take their types from the model.
                for entry in self.devices.values_mut() {
                    if entry.namespace == key.0 && entry.model.as_deref() == Some(key.1.as_str()) {
                        for (name, twin) in entry.twins.iter_mut() {
                            if twin.in_spec {
                                twin.type_ = Device::property_type(Some(&model), name);
                            }
                        }
                    }
                }
                self.models.insert(key, model);
            }
            Err(err) => warn!(error = %err, "device model unreadable"),
        }
    }

    /// Takes a device (new or changed) from the cloud: its twins' expected
    /// values follow the desired ones, and mappers hear of it.
    async fn apply_device(&mut self, object: &Value, announce: bool) {
        let device = match Device::deserialize(object) {
            Ok(device) => device,
            Err(err) => return warn!(error = %err, "device unreadable"),
        };
        let namespace = device
            .metadata
            .namespace
            .clone()
            .unwrap_or_else(|| "default".to_owned());
        let Some(name) = device.metadata.name.clone() else {
            return warn!("device without a name");
        };
        if device.spec.node_name.as_deref() != Some(self.config.node.as_str()) {
            warn!(device = %name, "device bound to another node ignored");
            return;
        }
        if let Some(held) = self.devices.get(&name)
            && held.namespace != namespace
        {
            // Device ids on the MQTT topics are names, so a name is held once.
            warn!(device = %name, namespace, held = held.namespace, "a device of this name is held already; ignored");
            return;
        }
        let revision: u64 = device
            .metadata
            .resource_version
            .as_deref()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let model_name = device
            .spec
            .device_model_ref
            .as_ref()
            .map(|r| r.name.clone());
        let model = model_name
            .as_ref()
            .and_then(|m| self.models.get(&(namespace.clone(), m.clone())));
        let new = !self.devices.contains_key(&name);
        let entry = self
            .devices
            .entry(name.clone())
            .or_insert_with(|| DeviceEntry {
                namespace: namespace.clone(),
                name: name.clone(),
                ..DeviceEntry::default()
            });
        entry.model = model_name.clone();
        entry.protocol = device
            .spec
            .protocol
            .as_ref()
            .and_then(|p| p.get("protocolName"))
            .and_then(Value::as_str)
            .map(str::to_owned);
        let mut changes: BTreeMap<String, TwinChange> = BTreeMap::new();
        let listed: BTreeSet<&str> = device
            .spec
            .properties
            .iter()
            .map(|p| p.name.as_str())
            .collect();
        for property in &device.spec.properties {
            let existed = entry.twins.contains_key(&property.name);
            let twin = entry.twins.entry(property.name.clone()).or_default();
            let before = existed.then(|| twin.message());
            twin.in_spec = true;
            twin.type_ = property
                .desired
                .as_ref()
                .and_then(|d| d.metadata.get("type").cloned())
                .unwrap_or_else(|| Device::property_type(model, &property.name));
            if let Some(desired) = &property.desired
                && twin.cloud_desired.as_deref() != Some(desired.value.as_str())
            {
                twin.cloud_desired = Some(desired.value.clone());
                twin.expected = Some(TwinValue {
                    value: Some(desired.value.clone()),
                    metadata: Some(ValueMetadata {
                        timestamp: now_millis(),
                    }),
                });
                twin.expected_version = TwinVersion {
                    cloud: revision,
                    edge: 0,
                };
            }
            let after = twin.message();
            if before.as_ref() != Some(&after) {
                changes.insert(property.name.clone(), (before, Some(after)));
            }
        }
        let dropped: Vec<String> = entry
            .twins
            .iter()
            .filter(|(name, twin)| twin.in_spec && !listed.contains(name.as_str()))
            .map(|(name, _)| name.clone())
            .collect();
        for twin in dropped {
            if let Some(old) = entry.twins.remove(&twin) {
                changes.insert(twin, (Some(old.message()), None));
            }
        }
        let member = entry.member();
        let devices = self.devices.len();
        self.count(|c| c.devices = devices);
        if !changes.is_empty() {
            self.dirty.insert(name.clone());
        }
        if !announce {
            return;
        }
        if new {
            info!(device = %name, "device bound to this node");
            let topic = protocol::node_topic(&self.config.node, "membership/updated");
            let payload = json!({
                "event_id": event_id(),
                "timestamp": now_millis(),
                "added_devices": [member],
                "removed_devices": [],
            });
            self.publish(topic, payload).await;
        } else {
            let payload = json!({
                "event_id": event_id(),
                "timestamp": now_millis(),
                "attributes": member.attributes,
            });
            self.publish(protocol::device_topic(&name, "updated"), payload)
                .await;
        }
        if !changes.is_empty() {
            self.count(|c| c.cloud_changes += 1);
            let current: BTreeMap<&String, &MsgTwin> = changes
                .iter()
                .filter_map(|(name, (_, after))| after.as_ref().map(|a| (name, a)))
                .collect();
            let payload = json!({
                "event_id": event_id(),
                "timestamp": now_millis(),
                "twin": current,
            });
            self.publish(protocol::device_topic(&name, "twin/cloud_updated"), payload)
                .await;
            self.publish_changes(&name, &changes).await;
        }
    }

    async fn remove_device(&mut self, resource: &EdgeResource) {
        let held = self
            .devices
            .get(&resource.name)
            .is_some_and(|d| d.namespace == resource.namespace);
        if !held {
            return;
        }
        let Some(entry) = self.devices.remove(&resource.name) else {
            return;
        };
        self.dirty.remove(&resource.name);
        let devices = self.devices.len();
        self.count(|c| c.devices = devices);
        info!(device = %resource.name, "device unbound from this node");
        let topic = protocol::node_topic(&self.config.node, "membership/updated");
        let payload = json!({
            "event_id": event_id(),
            "timestamp": now_millis(),
            "added_devices": [],
            "removed_devices": [entry.member()],
        });
        self.publish(topic, payload).await;
    }

    /// Publishes what changed on `twin/update/document` and, where an
    /// expected value changed and the actual one differs, on
    /// `twin/update/delta`.
    async fn publish_changes(&mut self, id: &str, changes: &BTreeMap<String, TwinChange>) {
        let document: BTreeMap<&String, Value> = changes
            .iter()
            .map(|(name, (last, current))| (name, json!({ "last": last, "current": current })))
            .collect();
        let payload = json!({
            "event_id": event_id(),
            "timestamp": now_millis(),
            "twin": document,
        });
        self.publish(protocol::device_topic(id, "twin/update/document"), payload)
            .await;
        let expected_changed = changes.values().any(|(last, current)| {
            last.as_ref().and_then(|l| l.expected.clone())
                != current.as_ref().and_then(|c| c.expected.clone())
        });
        let Some(entry) = self.devices.get(id) else {
            return;
        };
        let delta: BTreeMap<&String, String> = entry
            .twins
            .iter()
            .filter_map(|(name, twin)| twin.delta().map(|d| (name, d)))
            .collect();
        if expected_changed && !delta.is_empty() {
            let twins: BTreeMap<&String, MsgTwin> = delta
                .keys()
                .filter_map(|name| entry.twins.get(*name).map(|t| (*name, t.message())))
                .collect();
            let payload = json!({
                "event_id": event_id(),
                "timestamp": now_millis(),
                "twin": twins,
                "delta": delta,
            });
            self.publish(protocol::device_topic(id, "twin/update/delta"), payload)
                .await;
        }
    }

    // ----- from mappers and applications -----

    async fn on_request(&mut self, msg: &HiveMessage) {
        let Some(request) = Request::of(msg.resource()) else {
            return debug!(topic = msg.resource(), "not a request topic");
        };
        let payload = msg.content();
        let event = protocol::event_id_of(payload);
        let answer = match &request {
            Request::TwinUpdate(id) => self
                .update_twins(id, payload)
                .map(|result| Answer::AfterWrite(id.clone(), result)),
            Request::TwinGet(id) => self.twins_of(id, &event).map(Answer::Now),
            Request::StateUpdate(id) => self
                .update_state(id, payload)
                .map(|result| Answer::AfterWrite(id.clone(), result)),
            Request::MembershipGet(node) => self.membership(node, &event).map(Answer::Now),
            Request::Connected(id) | Request::Disconnected(id) => {
                let state = if matches!(request, Request::Connected(_)) {
                    "online"
                } else {
                    "offline"
                };
                let update = json!({ "state": state });
                if self.devices.contains_key(id) {
                    let _ = self.update_state(id, &update);
                }
                return;
            }
        };
        let Some(topic) = request.result_topic() else {
            return;
        };
        match answer {
            Ok(Answer::Now(result)) => self.publish(topic, result).await,
            Ok(Answer::AfterWrite(id, result)) => {
                self.count(|c| c.accepted += 1);
                self.waiting
                    .entry(id)
                    .or_default()
                    .answers
                    .push((topic, result));
            }
            Err((code, reason)) => {
                debug!(topic = msg.resource(), code, %reason, "request refused");
                self.count(|c| c.refused += 1);
                self.publish(topic, protocol::error_result(&event, code, &reason))
                    .await;
            }
        }
    }

    /// Applies a `twin/update`: every twin in it is checked first, then all
    /// are applied; the result names the twins as they are now.
    fn update_twins(&mut self, id: &str, payload: &Value) -> Result<Value, Refusal> {
        let update: TwinUpdate = read(payload)?;
        let entry = self.devices.get_mut(id).ok_or_else(|| not_bound(id))?;
        protocol::check_twin_update(&update)?;
        let new = update
            .twin
            .keys()
            .filter(|name| !entry.twins.contains_key(*name))
            .count();
        if entry.twins.len() + new > MAX_TWINS {
            return Err((
                code::BAD_REQUEST,
                format!("a device has at most {MAX_TWINS} twins"),
            ));
        }
        let mut changes: BTreeMap<String, TwinChange> = BTreeMap::new();
        let mut result: BTreeMap<String, Option<MsgTwin>> = BTreeMap::new();
        for (name, change) in update.twin {
            let deleting = change.metadata.as_ref().is_some_and(|m| m.type_ == DELETED);
            if deleting {
                if let Some(old) = entry.twins.remove(&name) {
                    changes.insert(name.clone(), (Some(old.message()), None));
                }
                result.insert(name, None);
                continue;
            }
            let existed = entry.twins.contains_key(&name);
            let twin = entry
                .twins
                .entry(name.clone())
                .or_insert_with(|| TwinState {
                    optional: true,
                    type_: "string".to_owned(),
                    ..TwinState::default()
                });
            let before = existed.then(|| twin.message());
            let stamp = |value: &TwinValue| TwinValue {
                value: value.value.clone(),
                metadata: Some(ValueMetadata {
                    timestamp: value
                        .metadata
                        .as_ref()
                        .map(|m| m.timestamp)
                        .filter(|t| *t > 0)
                        .unwrap_or_else(now_millis),
                }),
            };
            if let Some(actual) = change.actual.as_ref().filter(|a| a.value.is_some()) {
                twin.actual = Some(stamp(actual));
                twin.actual_version.edge += 1;
                twin.actual_version.cloud = twin.expected_version.cloud;
            }
            if let Some(expected) = change.expected.as_ref().filter(|e| e.value.is_some()) {
                twin.expected = Some(stamp(expected));
                twin.expected_version.edge += 1;
            }
            if let Some(metadata) = change.metadata.filter(|m| !m.type_.is_empty()) {
                twin.type_ = metadata.type_;
            }
            if let Some(optional) = change.optional {
                twin.optional = optional;
            }
            let after = twin.message();
            if before.as_ref() != Some(&after) {
                changes.insert(name.clone(), (before, Some(after.clone())));
            }
            result.insert(name, Some(after));
        }
        if !changes.is_empty() {
            self.dirty.insert(id.to_owned());
            self.waiting
                .entry(id.to_owned())
                .or_default()
                .changes
                .push(changes);
        }
        Ok(json!({
            "event_id": update.base.event_id,
            "timestamp": now_millis(),
            "twin": result,
        }))
    }

    fn twins_of(&self, id: &str, event: &str) -> Result<Value, Refusal> {
        let entry = self.devices.get(id).ok_or_else(|| not_bound(id))?;
        Ok(json!({
            "event_id": event,
            "timestamp": now_millis(),
            "twin": entry.twin_messages(),
        }))
    }

    fn update_state(&mut self, id: &str, payload: &Value) -> Result<Value, Refusal> {
        let update: StateUpdate = read(payload)?;
        protocol::check_state_update(&update)?;
        let entry = self.devices.get_mut(id).ok_or_else(|| not_bound(id))?;
        if update.state == "online" {
            entry.last_online = Some(
                jiff::Timestamp::now()
                    .round(jiff::Unit::Second)
                    .unwrap_or_else(|_| jiff::Timestamp::now())
                    .to_string(),
            );
        }
        if entry.state.as_deref() != Some(update.state.as_str()) || update.state == "online" {
            entry.state = Some(update.state.clone());
            self.dirty.insert(id.to_owned());
        }
        Ok(json!({
            "event_id": update.base.event_id,
            "timestamp": now_millis(),
            "device": { "state": entry.state, "last_online": entry.last_online },
        }))
    }

    fn membership(&self, node: &str, event: &str) -> Result<Value, Refusal> {
        if node != self.config.node {
            return Err((
                code::NOT_FOUND,
                format!("this is node {}, not {node}", self.config.node),
            ));
        }
        let devices: Vec<MemberDevice> = self.devices.values().map(DeviceEntry::member).collect();
        Ok(json!({
            "event_id": event,
            "timestamp": now_millis(),
            "devices": devices,
        }))
    }

    // ----- to the cloud and to MQTT -----

    /// Writes the status of every device reported on since the last
    /// write through metamanager (which persists it and sends it up); once
    /// a device's write is committed, its waiting requests are answered and
    /// its changes announced.
    async fn write_reports(&mut self) {
        // Requests that changed nothing have nothing to wait for.
        let idle: Vec<String> = self
            .waiting
            .keys()
            .filter(|id| !self.dirty.contains(*id))
            .cloned()
            .collect();
        for id in idle {
            self.committed(&id).await;
        }
        if self.dirty.is_empty() {
            return;
        }
        let dirty = std::mem::take(&mut self.dirty);
        let mut writes = Vec::new();
        for id in &dirty {
            let Some(entry) = self.devices.get(id) else {
                continue;
            };
            let status = match serde_json::to_value(entry.status()) {
                Ok(status) => status,
                Err(err) => {
                    warn!(device = %id, error = %err, "status unwritable");
                    continue;
                }
            };
            let resource = EdgeResource::new(
                entry.namespace.as_str(),
                resource_type::DEVICE_STATUS,
                entry.name.as_str(),
            );
            let msg = HiveMessage::new()
                .build_router(
                    module::DEVICETWIN,
                    group::META,
                    resource.to_string(),
                    operation::UPDATE,
                )
                .with_content(status);
            let hive = self.hive.clone();
            let timeout = self.config.store_timeout;
            writes.push(async move {
                let stored = match hive.send_sync(module::METAMANAGER, msg, timeout).await {
                    Ok(reply) if reply.operation() != operation::ERROR => Ok(()),
                    Ok(reply) => Err(reply.content().to_string()),
                    Err(err) => Err(err.to_string()),
                };
                (id.clone(), stored)
            });
        }
        for (id, stored) in futures_util::future::join_all(writes).await {
            match stored {
                Ok(()) => {
                    self.count(|c| c.written += 1);
                    self.committed(&id).await;
                    self.announce_sent_up(&id).await;
                }
                Err(reason) => {
                    warn!(device = %id, %reason, "device status not stored; trying again");
                    self.count(|c| c.write_failures += 1);
                    self.dirty.insert(id.clone());
                    self.write_failed(&id, &reason).await;
                }
            }
        }
    }

    /// A device's write is committed: what waited for it goes out.
    async fn committed(&mut self, id: &str) {
        let Some(waiting) = self.waiting.remove(id) else {
            return;
        };
        for changes in &waiting.changes {
            self.publish_changes(id, changes).await;
        }
        for (topic, payload) in waiting.answers {
            self.publish(topic, payload).await;
        }
    }

    /// A device's write failed: after a few in a row, its waiting requests
    /// are answered with an error (the reports themselves stay, to be
    /// written later).
    async fn write_failed(&mut self, id: &str, reason: &str) {
        let Some(waiting) = self.waiting.get_mut(id) else {
            return;
        };
        waiting.failures += 1;
        if waiting.failures < FAILED_WRITES {
            return;
        }
        let answers = std::mem::take(&mut waiting.answers);
        waiting.failures = 0;
        let reason = format!("the edge could not store the report: {reason}");
        for (topic, payload) in answers {
            let event = protocol::event_id_of(&payload);
            self.publish(
                topic,
                protocol::error_result(&event, code::INTERNAL, &reason),
            )
            .await;
        }
    }

    /// Tells edge applications what was sent up (`twin/edge_updated`).
    async fn announce_sent_up(&self, id: &str) {
        let Some(entry) = self.devices.get(id) else {
            return;
        };
        let actual: BTreeMap<&String, MsgTwin> = entry
            .twins
            .iter()
            .filter(|(_, t)| t.actual.is_some())
            .map(|(name, t)| {
                (
                    name,
                    MsgTwin {
                        actual: t.actual.clone(),
                        actual_version: Some(t.actual_version),
                        ..MsgTwin::default()
                    },
                )
            })
            .collect();
        let payload = json!({
            "event_id": event_id(),
            "timestamp": now_millis(),
            "twin": actual,
        });
        self.publish(protocol::device_topic(id, "twin/edge_updated"), payload)
            .await;
    }

    async fn publish(&self, topic: String, payload: Value) {
        let msg = HiveMessage::new()
            .build_router(module::DEVICETWIN, group::TWIN, topic, operation::PUBLISH)
            .with_content(payload);
        if let Err(err) = self.hive.send(module::EVENTBUS, msg).await {
            debug!(error = %err, "not published (no eventbus?)");
        }
    }
}

/// How a request is answered: at once, or after the next status write of
/// its device.
enum Answer {
    Now(Value),
    AfterWrite(String, Value),
}

use protocol::{Refusal, read};

fn not_bound(id: &str) -> Refusal {
    (
        code::NOT_FOUND,
        format!("device {id:?} is not bound to this node"),
    )
}

fn event_id() -> String {
    beehive::Uuid::new_v4().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value(v: &str, timestamp: i64) -> Option<TwinValue> {
        Some(TwinValue {
            value: Some(v.to_owned()),
            metadata: Some(ValueMetadata { timestamp }),
        })
    }

    #[test]
    fn a_stored_status_brings_back_reports_versions_and_state() {
        let mut held = DeviceEntry {
            namespace: "default".to_owned(),
            name: "thermo-1".to_owned(),
            state: Some("online".to_owned()),
            last_online: Some("2026-11-22T04:00:00Z".to_owned()),
            ..DeviceEntry::default()
        };
        held.twins.insert(
            "temperature".to_owned(),
            TwinState {
                actual: value("21.5", 7),
                actual_version: TwinVersion { cloud: 3, edge: 4 },
                type_: "float".to_owned(),
                in_spec: true,
                ..TwinState::default()
            },
        );
        // An expected value an edge application set after the cloud's.
        held.twins.insert(
            "setpoint".to_owned(),
            TwinState {
                expected: value("23", 9),
                expected_version: TwinVersion { cloud: 3, edge: 1 },
                type_: "int".to_owned(),
                in_spec: true,
                ..TwinState::default()
            },
        );
        let stored = serde_json::to_value(held.status()).expect("status");
        let status = DeviceStatus::deserialize(&stored).expect("reads");

        // After a restart: the device as the cloud sent it, then its status.
        let mut restarted = DeviceEntry::default();
        restarted.twins.insert(
            "setpoint".to_owned(),
            TwinState {
                expected: value("21", 1),
                expected_version: TwinVersion { cloud: 3, edge: 0 },
                ..TwinState::default()
            },
        );
        restarted.restore(&status);
        let temperature = &restarted.twins["temperature"];
        assert_eq!(temperature.actual, value("21.5", 7));
        assert_eq!(
            temperature.actual_version,
            TwinVersion { cloud: 3, edge: 4 }
        );
        assert_eq!(temperature.type_, "float");
        let setpoint = &restarted.twins["setpoint"];
        assert_eq!(setpoint.expected, value("23", 9));
        assert_eq!(setpoint.expected_version, TwinVersion { cloud: 3, edge: 1 });
        assert_eq!(restarted.state.as_deref(), Some("online"));

        // A newer desired value from the cloud wins over the edge's.
        let mut newer = DeviceEntry::default();
        newer.twins.insert(
            "setpoint".to_owned(),
            TwinState {
                expected: value("25", 10),
                expected_version: TwinVersion { cloud: 5, edge: 0 },
                ..TwinState::default()
            },
        );
        newer.restore(&status);
        assert_eq!(newer.twins["setpoint"].expected, value("25", 10));
    }

    #[test]
    fn a_delta_is_the_expected_value_where_the_actual_differs() {
        let mut twin = TwinState {
            expected: value("20", 1),
            ..TwinState::default()
        };
        assert_eq!(twin.delta().as_deref(), Some("20"));
        twin.actual = value("19", 2);
        assert_eq!(twin.delta().as_deref(), Some("20"));
        twin.actual = value("20", 3);
        assert_eq!(twin.delta(), None);
        twin.expected = None;
        assert_eq!(twin.delta(), None);
    }
}
