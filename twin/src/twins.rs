//! The device twins' decisions, as plain code: what the cloud's devices
//! and models, mappers' and applications' requests, and status writes do
//! to the twins of the devices bound to this node, and what is published
//! on MQTT because of them. Time comes in as an argument; nothing here
//! waits or sends. [`crate::devicetwin`] is the module around it: it loads
//! what metamanager holds, passes messages in, writes the statuses
//! [`TwinBook::take_writes`] gives and publishes what comes out.
//!
//! One concern: the twins' state machine; long because KubeEdge's twin
//! messages are many, not because it does several things.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use apis::devices::{Device, DeviceModel, DeviceStatus, Twin, TwinProperty};
use beehive::constants::resource_type;
use beehive::resource::EdgeResource;
use serde::Deserialize;
use serde_json::{Value, json};
use tracing::{debug, info, warn};

use crate::devicetwin::DeviceTwinCounts;
use crate::protocol::{
    self, DELETED, MemberDevice, MsgAttr, MsgTwin, Request, StateUpdate, TwinUpdate, TwinValue,
    TwinVersion, TypeMetadata, ValueMetadata, code,
};

/// A message for MQTT: topic and payload.
pub(crate) type Publish = (String, Value);

/// A device status to write through metamanager.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct StatusWrite {
    /// The device's id (its name).
    pub id: String,
    /// Its `devicestatus` resource.
    pub resource: EdgeResource,
    /// The status.
    pub status: Value,
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
#[derive(Debug, Default)]
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

/// The twins of the devices bound to one node.
#[derive(Debug)]
pub(crate) struct TwinBook {
    node: String,
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
    counts: DeviceTwinCounts,
}

impl TwinBook {
    /// No devices yet, for `node`.
    pub(crate) fn new(node: impl Into<String>) -> TwinBook {
        TwinBook {
            node: node.into(),
            devices: BTreeMap::new(),
            models: HashMap::new(),
            dirty: BTreeSet::new(),
            waiting: HashMap::new(),
            counts: DeviceTwinCounts::default(),
        }
    }

    /// What has been done so far.
    pub(crate) fn counts(&self) -> DeviceTwinCounts {
        self.counts
    }

    // ----- from the cloud -----

    pub(crate) fn model_changed(&mut self, object: &Value) {
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

    /// A model deleted.
    pub(crate) fn model_removed(&mut self, namespace: &str, name: &str) {
        self.models.remove(&(namespace.to_owned(), name.to_owned()));
    }

    /// Takes a device (new or changed) from the cloud: its twins' expected
    /// values follow the desired ones, and mappers hear of it.
    pub(crate) fn device_changed(
        &mut self,
        object: &Value,
        announce: bool,
        now: i64,
    ) -> Vec<Publish> {
        let mut out = Vec::new();
        let device = match Device::deserialize(object) {
            Ok(device) => device,
            Err(err) => {
                warn!(error = %err, "device unreadable");
                return out;
            }
        };
        let namespace = device
            .metadata
            .namespace
            .clone()
            .unwrap_or_else(|| "default".to_owned());
        let Some(name) = device.metadata.name.clone() else {
            warn!("device without a name");
            return out;
        };
        if device.spec.node_name.as_deref() != Some(self.node.as_str()) {
            warn!(device = %name, "device bound to another node ignored");
            return out;
        }
        if let Some(held) = self.devices.get(&name)
            && held.namespace != namespace
        {
            // Device ids on the MQTT topics are names, so a name is held once.
            warn!(device = %name, namespace, held = held.namespace, "a device of this name is held already; ignored");
            return out;
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
                    metadata: Some(ValueMetadata { timestamp: now }),
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
        self.counts.devices = self.devices.len();
        if !changes.is_empty() {
            self.dirty.insert(name.clone());
        }
        if !announce {
            return out;
        }
        if new {
            info!(device = %name, "device bound to this node");
            let topic = protocol::node_topic(&self.node, "membership/updated");
            let payload = json!({
                "event_id": event_id(),
                "timestamp": now,
                "added_devices": [member],
                "removed_devices": [],
            });
            out.push((topic, payload));
        } else {
            let payload = json!({
                "event_id": event_id(),
                "timestamp": now,
                "attributes": member.attributes,
            });
            out.push((protocol::device_topic(&name, "updated"), payload));
        }
        if !changes.is_empty() {
            self.counts.cloud_changes += 1;
            let current: BTreeMap<&String, &MsgTwin> = changes
                .iter()
                .filter_map(|(name, (_, after))| after.as_ref().map(|a| (name, a)))
                .collect();
            let payload = json!({
                "event_id": event_id(),
                "timestamp": now,
                "twin": current,
            });
            out.push((protocol::device_topic(&name, "twin/cloud_updated"), payload));
            out.extend(self.changes_published(&name, &changes, now));
        }
        out
    }

    pub(crate) fn device_removed(&mut self, resource: &EdgeResource, now: i64) -> Vec<Publish> {
        let held = self
            .devices
            .get(&resource.name)
            .is_some_and(|d| d.namespace == resource.namespace);
        if !held {
            return Vec::new();
        }
        let Some(entry) = self.devices.remove(&resource.name) else {
            return Vec::new();
        };
        self.dirty.remove(&resource.name);
        self.counts.devices = self.devices.len();
        info!(device = %resource.name, "device unbound from this node");
        let topic = protocol::node_topic(&self.node, "membership/updated");
        let payload = json!({
            "event_id": event_id(),
            "timestamp": now,
            "added_devices": [],
            "removed_devices": [entry.member()],
        });
        vec![(topic, payload)]
    }

    /// Publishes what changed on `twin/update/document` and, where an
    /// expected value changed and the actual one differs, on
    /// `twin/update/delta`.
    fn changes_published(
        &self,
        id: &str,
        changes: &BTreeMap<String, TwinChange>,
        now: i64,
    ) -> Vec<Publish> {
        let mut out = Vec::new();
        let document: BTreeMap<&String, Value> = changes
            .iter()
            .map(|(name, (last, current))| (name, json!({ "last": last, "current": current })))
            .collect();
        let payload = json!({
            "event_id": event_id(),
            "timestamp": now,
            "twin": document,
        });
        out.push((protocol::device_topic(id, "twin/update/document"), payload));
        let expected_changed = changes.values().any(|(last, current)| {
            last.as_ref().and_then(|l| l.expected.clone())
                != current.as_ref().and_then(|c| c.expected.clone())
        });
        let Some(entry) = self.devices.get(id) else {
            return out;
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
                "timestamp": now,
                "twin": twins,
                "delta": delta,
            });
            out.push((protocol::device_topic(id, "twin/update/delta"), payload));
        }
        out
    }

    // ----- at start-up -----

    /// The devices held: namespace and name.
    pub(crate) fn held(&self) -> Vec<(String, String)> {
        self.devices
            .values()
            .map(|d| (d.namespace.clone(), d.name.clone()))
            .collect()
    }

    /// Takes back a device's stored status; it is written (sent up) again.
    pub(crate) fn restore(&mut self, id: &str, status: &DeviceStatus) {
        if let Some(entry) = self.devices.get_mut(id) {
            entry.restore(status);
            self.dirty.insert(id.to_owned());
        }
    }

    // ----- from mappers and applications -----

    pub(crate) fn request(&mut self, topic: &str, payload: &Value, now: i64) -> Vec<Publish> {
        let Some(request) = Request::of(topic) else {
            debug!(topic, "not a request topic");
            return Vec::new();
        };
        let event = protocol::event_id_of(payload);
        let answer = match &request {
            Request::TwinUpdate(id) => self
                .update_twins(id, payload, now)
                .map(|result| Answer::AfterWrite(id.clone(), result)),
            Request::TwinGet(id) => self.twins_of(id, &event, now).map(Answer::Now),
            Request::StateUpdate(id) => self
                .update_state(id, payload, now)
                .map(|result| Answer::AfterWrite(id.clone(), result)),
            Request::MembershipGet(node) => self.membership(node, &event, now).map(Answer::Now),
            Request::Connected(id) | Request::Disconnected(id) => {
                let state = if matches!(request, Request::Connected(_)) {
                    "online"
                } else {
                    "offline"
                };
                let update = json!({ "state": state });
                if self.devices.contains_key(id) {
                    let _ = self.update_state(id, &update, now);
                }
                return Vec::new();
            }
        };
        let Some(result_topic) = request.result_topic() else {
            return Vec::new();
        };
        match answer {
            Ok(Answer::Now(result)) => vec![(result_topic, result)],
            Ok(Answer::AfterWrite(id, result)) => {
                self.counts.accepted += 1;
                self.waiting
                    .entry(id)
                    .or_default()
                    .answers
                    .push((result_topic, result));
                Vec::new()
            }
            Err((code, reason)) => {
                debug!(topic, code, %reason, "request refused");
                self.counts.refused += 1;
                vec![(result_topic, protocol::error_result(&event, code, &reason))]
            }
        }
    }

    /// Applies a `twin/update`: every twin in it is checked first, then all
    /// are applied; the result names the twins as they are now.
    fn update_twins(&mut self, id: &str, payload: &Value, now: i64) -> Result<Value, Refusal> {
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
                        .unwrap_or(now),
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
            "timestamp": now,
            "twin": result,
        }))
    }

    fn twins_of(&self, id: &str, event: &str, now: i64) -> Result<Value, Refusal> {
        let entry = self.devices.get(id).ok_or_else(|| not_bound(id))?;
        Ok(json!({
            "event_id": event,
            "timestamp": now,
            "twin": entry.twin_messages(),
        }))
    }

    fn update_state(&mut self, id: &str, payload: &Value, now: i64) -> Result<Value, Refusal> {
        let update: StateUpdate = read(payload)?;
        protocol::check_state_update(&update)?;
        let entry = self.devices.get_mut(id).ok_or_else(|| not_bound(id))?;
        if update.state == "online" {
            entry.last_online = Some(last_online(now));
        }
        if entry.state.as_deref() != Some(update.state.as_str()) || update.state == "online" {
            entry.state = Some(update.state.clone());
            self.dirty.insert(id.to_owned());
        }
        Ok(json!({
            "event_id": update.base.event_id,
            "timestamp": now,
            "device": { "state": entry.state, "last_online": entry.last_online },
        }))
    }

    fn membership(&self, node: &str, event: &str, now: i64) -> Result<Value, Refusal> {
        if node != self.node {
            return Err((
                code::NOT_FOUND,
                format!("this is node {}, not {node}", self.node),
            ));
        }
        let devices: Vec<MemberDevice> = self.devices.values().map(DeviceEntry::member).collect();
        Ok(json!({
            "event_id": event,
            "timestamp": now,
            "devices": devices,
        }))
    }

    // ----- status writes -----

    /// Requests that changed nothing wait for no write: their answers and
    /// changes, now.
    pub(crate) fn settle_idle(&mut self, now: i64) -> Vec<Publish> {
        let idle: Vec<String> = self
            .waiting
            .keys()
            .filter(|id| !self.dirty.contains(*id))
            .cloned()
            .collect();
        idle.into_iter()
            .flat_map(|id| self.committed(&id, now))
            .collect()
    }

    /// The statuses of every device reported on since the last writes.
    pub(crate) fn take_writes(&mut self) -> Vec<StatusWrite> {
        let dirty = std::mem::take(&mut self.dirty);
        dirty
            .into_iter()
            .filter_map(|id| {
                let entry = self.devices.get(&id)?;
                let status = match serde_json::to_value(entry.status()) {
                    Ok(status) => status,
                    Err(err) => {
                        warn!(device = %id, error = %err, "status unwritable");
                        return None;
                    }
                };
                let resource = EdgeResource::new(
                    entry.namespace.as_str(),
                    resource_type::DEVICE_STATUS,
                    entry.name.as_str(),
                );
                Some(StatusWrite {
                    id,
                    resource,
                    status,
                })
            })
            .collect()
    }

    /// A device's status write committed: what waited for it goes out, and
    /// edge applications hear what was sent up (`twin/edge_updated`).
    pub(crate) fn write_committed(&mut self, id: &str, now: i64) -> Vec<Publish> {
        self.counts.written += 1;
        let mut out = self.committed(id, now);
        out.extend(self.sent_up(id, now));
        out
    }

    /// A device's write is committed: what waited for it goes out.
    fn committed(&mut self, id: &str, now: i64) -> Vec<Publish> {
        let Some(waiting) = self.waiting.remove(id) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for changes in &waiting.changes {
            out.extend(self.changes_published(id, changes, now));
        }
        out.extend(waiting.answers);
        out
    }

    /// A device's write failed: after a few in a row, its waiting requests
    /// are answered with an error (the reports themselves stay, to be
    /// written later).
    pub(crate) fn write_failed(&mut self, id: &str, reason: &str) -> Vec<Publish> {
        self.counts.write_failures += 1;
        self.dirty.insert(id.to_owned());
        let Some(waiting) = self.waiting.get_mut(id) else {
            return Vec::new();
        };
        waiting.failures += 1;
        if waiting.failures < FAILED_WRITES {
            return Vec::new();
        }
        let answers = std::mem::take(&mut waiting.answers);
        waiting.failures = 0;
        let reason = format!("the edge could not store the report: {reason}");
        answers
            .into_iter()
            .map(|(topic, payload)| {
                let event = protocol::event_id_of(&payload);
                (
                    topic,
                    protocol::error_result(&event, code::INTERNAL, &reason),
                )
            })
            .collect()
    }

    /// Tells edge applications what was sent up (`twin/edge_updated`).
    fn sent_up(&self, id: &str, now: i64) -> Option<Publish> {
        let entry = self.devices.get(id)?;
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
            "timestamp": now,
            "twin": actual,
        });
        Some((protocol::device_topic(id, "twin/edge_updated"), payload))
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

/// `now` (milliseconds) as a device's `lastOnlineTime`, to the second.
fn last_online(now: i64) -> String {
    let at = jiff::Timestamp::from_millisecond(now).unwrap_or(jiff::Timestamp::UNIX_EPOCH);
    at.round(jiff::Unit::Second).unwrap_or(at).to_string()
}

#[cfg(test)]
mod tests;
