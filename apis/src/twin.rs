//! KubeEdge's device twin messages: the JSON its edge's devicetwin, its
//! mappers (over MQTT) and its cloud's devicecontroller exchange, written
//! from KubeEdge's public API definitions (`dttype` at the edge, the
//! devicecontroller's `types` in the cloud). edgehive's edge publishes
//! and reads them on its MQTT topics; its cloud answers a KubeEdge edge's
//! twin sync with a [`MembershipDetail`].
//!
//! Every payload starts with `event_id` and `timestamp` (milliseconds).
//! A twin is `{expected, actual, optional, metadata: {type},
//! expected_version, actual_version}`, where each value is
//! `{value, metadata: {timestamp}}` and each version `{cloud, edge}`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// A value and when it was set.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TwinValue {
    /// The value (KubeEdge's twins are strings).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    /// When it was set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<ValueMetadata>,
}

/// When a value was set.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ValueMetadata {
    /// Milliseconds since the epoch.
    #[serde(default)]
    pub timestamp: i64,
}

/// A twin's type.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TypeMetadata {
    /// `string`, `int`, ...; `deleted` in an update deletes the twin.
    #[serde(default, rename = "type")]
    pub type_: String,
}

/// How often a value changed on each side.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TwinVersion {
    /// Changes from the cloud (for an expected value, the cloud's revision
    /// of it; for an actual value, the expected revision it was reported
    /// against).
    #[serde(default)]
    pub cloud: u64,
    /// Changes made at the edge.
    #[serde(default)]
    pub edge: u64,
}

/// One twin, as published and as received (every field optional).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MsgTwin {
    /// The value wanted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected: Option<TwinValue>,
    /// The value the device has.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub actual: Option<TwinValue>,
    /// Whether the twin may be absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub optional: Option<bool>,
    /// Its type.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<TypeMetadata>,
    /// Versions of the expected value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected_version: Option<TwinVersion>,
    /// Versions of the actual value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub actual_version: Option<TwinVersion>,
}

/// A request's common part.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BaseMessage {
    /// The requester's id for it, echoed in the result.
    #[serde(default)]
    pub event_id: String,
    /// When it was sent.
    #[serde(default)]
    pub timestamp: i64,
}

/// `twin/update`: twins to change.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TwinUpdate {
    /// The common part.
    #[serde(flatten)]
    pub base: BaseMessage,
    /// Twins by property name.
    #[serde(default)]
    pub twin: BTreeMap<String, MsgTwin>,
}

/// `state/update`: the device's state.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateUpdate {
    /// The common part.
    #[serde(flatten)]
    pub base: BaseMessage,
    /// `online`, `offline`, ...
    #[serde(default)]
    pub state: String,
}

/// A device as membership messages describe it (KubeEdge's edge
/// `dttype.Device`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberDevice {
    /// Its id: on edgehive's MQTT topics the device's name; in KubeEdge's
    /// twin sync `<namespace>/<name>`.
    pub id: String,
    /// Its name.
    pub name: String,
    /// What it is (KubeEdge's cloud takes it from the `description`
    /// label).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Its state as last reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
    /// When it was last online (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_online: Option<String>,
    /// Its attributes: model and protocol.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub attributes: BTreeMap<String, MsgAttr>,
    /// Its twins.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub twin: BTreeMap<String, MsgTwin>,
}

/// A device attribute.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MsgAttr {
    /// Its value.
    pub value: String,
    /// Whether it may be absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub optional: Option<bool>,
    /// Its type.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<TypeMetadata>,
}

impl MsgAttr {
    /// An optional string attribute holding `value`.
    pub fn text(value: &str) -> MsgAttr {
        MsgAttr {
            value: value.to_owned(),
            optional: Some(true),
            metadata: Some(TypeMetadata {
                type_: "string".to_owned(),
            }),
        }
    }
}

/// The answer to a KubeEdge edge's twin sync (`membership/detail`): every
/// device bound to the node. The edge adds or updates each, and removes
/// every device it holds that is not listed: an empty list removes them
/// all.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MembershipDetail {
    /// The common part.
    #[serde(flatten)]
    pub base: BaseMessage,
    /// The node's devices (always written, `[]` when there are none).
    #[serde(default)]
    pub devices: Vec<MemberDevice>,
}

/// A membership change (KubeEdge's `MembershipUpdate`), cloud to edge:
/// devices bound to the node since the last, and devices no longer bound
/// to it. KubeEdge's cloud sends one per device event, naming each device
/// by id, name and description only.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MembershipUpdate {
    /// The common part.
    #[serde(flatten)]
    pub base: BaseMessage,
    /// Devices now bound to the node.
    #[serde(default)]
    pub added_devices: Vec<MemberDevice>,
    /// Devices no longer bound to it.
    #[serde(default)]
    pub removed_devices: Vec<MemberDevice>,
}

/// A device's state as a KubeEdge edge sends it up
/// (`device/<ns>/<name>/state/update`, KubeEdge's `DeviceMsg`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceStateReport {
    /// The common part.
    #[serde(flatten)]
    pub base: BaseMessage,
    /// The device's state.
    #[serde(default)]
    pub device: DeviceStateOf,
}

/// The device part of a [`DeviceStateReport`] (KubeEdge's
/// `DeviceCloudMsg`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceStateOf {
    /// The device's name.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    /// `online`, `offline`, `ok`, `unknown` or `unhealthy`.
    #[serde(default)]
    pub state: String,
    /// When it was last online (RFC 3339; empty unless online or ok).
    #[serde(default, rename = "lastOnlineTime")]
    pub last_online_time: String,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_membership_detail_is_written_in_kubeedges_shape() {
        let detail = MembershipDetail {
            base: BaseMessage {
                event_id: "e1".to_owned(),
                timestamp: 7,
            },
            devices: vec![MemberDevice {
                id: "default/thermo-1".to_owned(),
                name: "thermo-1".to_owned(),
                description: Some("hall".to_owned()),
                attributes: BTreeMap::from([("model".to_owned(), MsgAttr::text("thermometer"))]),
                ..MemberDevice::default()
            }],
        };
        assert_eq!(
            serde_json::to_value(&detail).expect("writes"),
            json!({"event_id": "e1", "timestamp": 7, "devices": [{
                "id": "default/thermo-1", "name": "thermo-1", "description": "hall",
                "attributes": {"model": {"value": "thermometer", "optional": true,
                                         "metadata": {"type": "string"}}}}]})
        );
        // None at all is still a list: KubeEdge's edge reads a missing
        // one the same, but says what it means.
        let none = MembershipDetail::default();
        assert_eq!(
            serde_json::to_value(&none).expect("writes"),
            json!({"event_id": "", "timestamp": 0, "devices": []})
        );
    }

    #[test]
    fn device_reports_and_membership_updates_read_and_write_kubeedges_keys() {
        let state: DeviceStateReport = serde_json::from_value(json!({
            "event_id": "e", "timestamp": 3,
            "device": {"name": "thermo-1", "state": "online", "lastOnlineTime": "2026-11-26T10:00:00Z"}}))
        .expect("reads");
        assert_eq!(state.device.state, "online");
        assert_eq!(state.device.last_online_time, "2026-11-26T10:00:00Z");
        let update = MembershipUpdate {
            base: BaseMessage {
                event_id: "e".to_owned(),
                timestamp: 4,
            },
            removed_devices: vec![MemberDevice {
                id: "default/t".to_owned(),
                name: "t".to_owned(),
                ..MemberDevice::default()
            }],
            ..MembershipUpdate::default()
        };
        assert_eq!(
            serde_json::to_value(&update).expect("writes"),
            json!({"event_id": "e", "timestamp": 4, "added_devices": [],
                   "removed_devices": [{"id": "default/t", "name": "t"}]})
        );
    }
}
