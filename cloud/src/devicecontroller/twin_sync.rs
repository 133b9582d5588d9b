//! KubeEdge's twin sync, answered.
//!
//! On every connect a KubeEdge edge's devicetwin asks the cloud for its
//! node's devices: a `get` of `membership/detail` from source `twin`,
//! content a JSON string `{"event_type": "group_membership_event",
//! "event_id", "group_id": <node>, "operation": "detail", "timestamp"}`.
//! It asks again every 60 s until a message whose parent is the request
//! reaches it. KubeEdge's own cloud never answers, so its edges ask
//! forever; edgehive's cloud answers with two messages, in this order:
//!
//! 1. the detail: source `devicecontroller`, group `twin`, resource
//!    `node/<node>/membership/detail`, no parent (the edge's devicetwin
//!    takes a message with a parent as a confirm only), content a
//!    [`MembershipDetail`] listing every device bound to the node. The
//!    edge adds or updates each and removes every other device it holds;
//! 2. the confirm: parent the request, source `devicecontroller`, group
//!    `twin`, resource `node/<node>/twin`, operation `response`, content
//!    `"OK"` (as KubeEdge's devicecontroller confirms a twin report), so
//!    the edge stops asking.
//!
//! Since an empty list removes every device twin at the edge, the
//! controller answers only once its devices and models are listed (see
//! [`super::reconciler::Reconciler::devices_of`]); until then the request
//! waits.
//!
//! Between syncs the edge's devicetwin hears of each change as KubeEdge's
//! cloud tells it: a device bound to the node (or moved to it) or gone
//! from it (deleted, or moved away) is announced by a membership update
//! ([`membership_message`]: source `devicecontroller`, group `twin`,
//! resource `node/<node>/membership`, operation `update`, content a
//! [`MembershipUpdate`] naming the device by id, name and description)
//! before the device itself goes down. The reconciler decides it
//! ([`super::reconciler::Action::Membership`]), for KubeEdge nodes linked
//! at the time only.
//!
//! Each device is KubeEdge's edge `Device`: id `<namespace>/<name>`, its
//! `description` label, its reported state and last time online, its
//! model and protocol as attributes, and a twin per property: `expected`
//! the desired value, `actual` the last reported one, typed by the model,
//! with versions as KubeEdge's cloud wrote them (`cloud` the device's
//! resource version, `edge` 0), so an edge that changed a value itself
//! since keeps its own.

use std::collections::BTreeMap;

use apis::devices::{Device, DeviceModel, TwinProperty};
use apis::twin::{
    BaseMessage, MemberDevice, MembershipDetail, MembershipUpdate, MsgAttr, MsgTwin, TwinValue,
    TwinVersion, TypeMetadata, ValueMetadata,
};
use beehive::constants::{group, module, operation, resource_type};
use beehive::message::MessageError;
use beehive::resource::EdgeResource;
use beehive::{Content, Message as HiveMessage, Uuid};
use serde::Deserialize;
use serde_json::Value;

/// The resource type of the twin sync (`membership/detail`).
pub const DETAIL: &str = "detail";

/// Whether `resource` (the edge's form of it) asks for the node's
/// devices: `membership/detail`.
pub fn is_detail_request(resource: &EdgeResource) -> bool {
    resource.namespace == resource_type::MEMBERSHIP
        && resource.resource_type == DETAIL
        && resource.name.is_empty()
}

/// The twin sync request's content (KubeEdge's `dttype.GetDetailNode`).
#[derive(Debug, Default, Deserialize)]
struct DetailRequest {
    #[serde(default)]
    event_id: String,
}

/// The `event_id` the request carries (its content is JSON as a string,
/// or JSON), to echo in the answer; a fresh one if it carries none.
pub fn event_id_of(content: &Content) -> String {
    let request = match content {
        Content::Text(text) => serde_json::from_str::<DetailRequest>(text).ok(),
        other => other.decode::<DetailRequest>().ok(),
    };
    request
        .map(|r| r.event_id)
        .filter(|id| !id.is_empty())
        .unwrap_or_else(|| Uuid::new_v4().to_string())
}

/// `device` as a KubeEdge edge's devicetwin holds it, its twins typed by
/// `model`, values stamped `now` (milliseconds) where the status carries
/// no time.
pub fn member(device: &Device, model: Option<&DeviceModel>, now: i64) -> MemberDevice {
    let namespace = device.metadata.namespace.as_deref().unwrap_or("default");
    let name = device.metadata.name.clone().unwrap_or_default();
    // KubeEdge parses the resource version as the twins' cloud version.
    let version = TwinVersion {
        cloud: device
            .metadata
            .resource_version
            .as_deref()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0),
        edge: 0,
    };
    let status = device.status.clone().unwrap_or_default();
    let reported = |property: &str| {
        status
            .twins
            .iter()
            .find(|t| t.property_name == property)
            .and_then(|t| t.reported.as_ref())
    };
    let value = |property: &TwinProperty| TwinValue {
        value: Some(property.value.clone()),
        metadata: Some(ValueMetadata {
            timestamp: property
                .metadata
                .get("timestamp")
                .and_then(|t| t.parse().ok())
                .unwrap_or(now),
        }),
    };
    let twin = device
        .spec
        .properties
        .iter()
        .map(|property| {
            let type_ = model
                .and_then(|m| m.spec.properties.iter().find(|p| p.name == property.name))
                .and_then(|p| p.type_.clone())
                .or_else(|| {
                    property
                        .desired
                        .as_ref()
                        .and_then(|d| d.metadata.get("type").cloned())
                })
                .unwrap_or_else(|| "string".to_owned());
            let expected = property.desired.as_ref().map(|desired| TwinValue {
                metadata: Some(ValueMetadata { timestamp: now }),
                ..value(desired)
            });
            // An actual value goes with its version, or KubeEdge's edge
            // refuses it (and fails on it, holding none).
            let actual = reported(&property.name).map(value);
            let twin = MsgTwin {
                expected_version: expected.as_ref().map(|_| version),
                actual_version: actual.as_ref().map(|_| version),
                expected,
                actual,
                optional: Some(false),
                metadata: Some(TypeMetadata { type_ }),
            };
            (property.name.clone(), twin)
        })
        .collect();
    let mut attributes = BTreeMap::new();
    if let Some(model) = &device.spec.device_model_ref {
        attributes.insert("model".to_owned(), MsgAttr::text(&model.name));
    }
    if let Some(protocol) = device
        .spec
        .protocol
        .as_ref()
        .and_then(|p| p["protocolName"].as_str())
    {
        attributes.insert("protocol".to_owned(), MsgAttr::text(protocol));
    }
    MemberDevice {
        id: format!("{namespace}/{name}"),
        name,
        description: device
            .metadata
            .labels
            .as_ref()
            .and_then(|labels| labels.get("description"))
            .cloned(),
        state: status.state.clone(),
        last_online: status.last_online_time.clone(),
        attributes,
        twin,
    }
}

/// The answer to `node`'s twin sync: `devices` (each with its model) are
/// what is bound to the node, listed by id; one bound elsewhere is left
/// out.
pub fn detail(
    node: &str,
    event_id: String,
    now: i64,
    devices: &[(Device, Option<DeviceModel>)],
) -> MembershipDetail {
    let mut members: Vec<MemberDevice> = devices
        .iter()
        .filter(|(device, _)| device.spec.node_name.as_deref() == Some(node))
        .map(|(device, model)| member(device, model.as_ref(), now))
        .collect();
    members.sort_by(|a, b| a.id.cmp(&b.id));
    MembershipDetail {
        base: BaseMessage {
            event_id,
            timestamp: now,
        },
        devices: members,
    }
}

/// The detail as the message for `node`: no parent, so the edge takes it
/// as the result of its request, not as a confirm.
pub fn detail_message(node: &str, detail: &MembershipDetail) -> Result<HiveMessage, MessageError> {
    HiveMessage::new()
        .build_router(
            module::DEVICECONTROLLER,
            group::TWIN,
            format!("node/{node}/{}/{DETAIL}", resource_type::MEMBERSHIP),
            operation::UPDATE,
        )
        .fill_body(detail)
}

/// A device as a membership update names it (as KubeEdge's cloud does):
/// id `<namespace>/<name>`, name, and its `description` label if any.
/// `object` may be a stub of a device gone.
pub fn named_member(object: &Value) -> MemberDevice {
    let metadata = &object["metadata"];
    let name = metadata["name"].as_str().unwrap_or_default();
    let namespace = metadata["namespace"].as_str().unwrap_or("default");
    MemberDevice {
        id: format!("{namespace}/{name}"),
        name: name.to_owned(),
        description: metadata
            .pointer("/labels/description")
            .and_then(Value::as_str)
            .map(str::to_owned),
        ..MemberDevice::default()
    }
}

/// The membership update telling a node's devicetwin that the device
/// `object` joined (`joined`) or left its devices.
pub fn membership_update(object: &Value, joined: bool, now: i64) -> MembershipUpdate {
    let device = vec![named_member(object)];
    let (added_devices, removed_devices) = match joined {
        true => (device, Vec::new()),
        false => (Vec::new(), device),
    };
    MembershipUpdate {
        base: BaseMessage {
            event_id: Uuid::new_v4().to_string(),
            timestamp: now,
        },
        added_devices,
        removed_devices,
    }
}

/// The update as the message for `node` (resource `membership`, which
/// KubeEdge's edge takes as a membership change). It carries no version:
/// KubeEdge's edge never acknowledges one (its cloud sends it without
/// asking for an ack), and one lost with the link is made good by the
/// twin sync on the next.
pub fn membership_message(
    node: &str,
    update: &MembershipUpdate,
) -> Result<HiveMessage, MessageError> {
    HiveMessage::new()
        .build_router(
            module::DEVICECONTROLLER,
            group::TWIN,
            format!("node/{node}/{}", resource_type::MEMBERSHIP),
            operation::UPDATE,
        )
        .fill_body(update)
}

/// The confirm of `request` for `node`, which stops the edge asking.
pub fn confirm_message(node: &str, request: &HiveMessage) -> HiveMessage {
    HiveMessage::new()
        .build_router(
            module::DEVICECONTROLLER,
            group::TWIN,
            format!("node/{node}/{}", resource_type::TWIN),
            operation::RESPONSE,
        )
        .with_parent(request.id())
        .with_content("OK")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn device(name: &str, node: &str, extra: Value) -> Device {
        let mut object = json!({
            "metadata": {"name": name, "namespace": "plant", "resourceVersion": "42"},
            "spec": {"nodeName": node, "deviceModelRef": {"name": "thermometer"},
                     "protocol": {"protocolName": "modbus"}},
        });
        merge(&mut object, extra);
        serde_json::from_value(object).expect("a device")
    }

    fn merge(into: &mut Value, from: Value) {
        match (into, from) {
            (Value::Object(into), Value::Object(from)) => {
                for (key, value) in from {
                    merge(into.entry(key).or_insert(Value::Null), value);
                }
            }
            (into, from) => *into = from,
        }
    }

    fn model() -> DeviceModel {
        serde_json::from_value(json!({
            "metadata": {"name": "thermometer", "namespace": "plant"},
            "spec": {"properties": [{"name": "setpoint", "type": "int"},
                                    {"name": "temperature", "type": "float"}]},
        }))
        .expect("a model")
    }

    #[test]
    fn a_device_goes_as_kubeedges_edge_holds_it() {
        let thermo = device(
            "thermo-1",
            "edge-1",
            json!({
                "metadata": {"labels": {"description": "hall"}},
                "spec": {"properties": [
                    {"name": "setpoint", "desired": {"value": "21"}},
                    {"name": "temperature"},
                    {"name": "mode", "desired": {"value": "eco", "metadata": {"type": "string"}}},
                ]},
                "status": {"state": "online", "lastOnlineTime": "2026-11-26T10:00:00Z",
                           "twins": [{"propertyName": "temperature",
                                      "reported": {"value": "19.5", "metadata": {"timestamp": "1700"}}}]},
            }),
        );
        let member = member(&thermo, Some(&model()), 5000);
        assert_eq!(
            serde_json::to_value(&member).expect("json"),
            json!({
                "id": "plant/thermo-1", "name": "thermo-1", "description": "hall",
                "state": "online", "last_online": "2026-11-26T10:00:00Z",
                "attributes": {
                    "model": {"value": "thermometer", "optional": true, "metadata": {"type": "string"}},
                    "protocol": {"value": "modbus", "optional": true, "metadata": {"type": "string"}},
                },
                "twin": {
                    "setpoint": {"expected": {"value": "21", "metadata": {"timestamp": 5000}},
                                 "optional": false, "metadata": {"type": "int"},
                                 "expected_version": {"cloud": 42, "edge": 0}},
                    "temperature": {"actual": {"value": "19.5", "metadata": {"timestamp": 1700}},
                                    "optional": false, "metadata": {"type": "float"},
                                    "actual_version": {"cloud": 42, "edge": 0}},
                    "mode": {"expected": {"value": "eco", "metadata": {"timestamp": 5000}},
                             "optional": false, "metadata": {"type": "string"},
                             "expected_version": {"cloud": 42, "edge": 0}},
                },
            })
        );
    }

    #[test]
    fn the_detail_lists_the_nodes_devices_only_by_id() {
        let devices = vec![
            (device("b", "edge-1", json!({})), Some(model())),
            (device("other", "edge-2", json!({})), Some(model())),
            (device("a", "edge-1", json!({})), None),
        ];
        let detail = detail("edge-1", "e1".to_owned(), 9, &devices);
        let ids: Vec<&str> = detail.devices.iter().map(|d| d.id.as_str()).collect();
        assert_eq!(ids, ["plant/a", "plant/b"]);
        assert_eq!(detail.base.event_id, "e1");
        assert_eq!(detail.base.timestamp, 9);
        // No devices is an empty list, written.
        let none = super::detail("edge-3", "e2".to_owned(), 9, &devices);
        assert!(none.devices.is_empty());
        assert_eq!(
            serde_json::to_value(&none).expect("json")["devices"],
            json!([])
        );
    }

    #[test]
    fn the_request_is_recognised_and_its_event_echoed() {
        let resource: EdgeResource = "membership/detail".parse().expect("resource");
        assert!(is_detail_request(&resource));
        for other in ["membership/update", "default/detail", "membership/detail/x"] {
            let resource: EdgeResource = other.parse().expect("resource");
            assert!(!is_detail_request(&resource), "{other}");
        }
        let content = Content::text(
            r#"{"event_type":"group_membership_event","event_id":"ev-1","group_id":"edge-1","operation":"detail","timestamp":1}"#,
        );
        assert_eq!(event_id_of(&content), "ev-1");
        let object = Content::of(&json!({"event_id": "ev-2"})).expect("json");
        assert_eq!(event_id_of(&object), "ev-2");
        // Unreadable or missing: a fresh id.
        assert_eq!(event_id_of(&Content::text("not json")).len(), 36);
        assert_eq!(event_id_of(&Content::Empty).len(), 36);
    }

    #[test]
    fn a_membership_update_names_the_device_as_kubeedges_cloud_does() {
        let thermo = json!({"metadata": {"name": "thermo-1", "namespace": "plant",
                                         "labels": {"description": "hall", "zone": "a"}},
                            "spec": {"nodeName": "edge-1"}});
        let added = membership_update(&thermo, true, 7);
        let message = membership_message("edge-1", &added).expect("message");
        assert_eq!(
            (
                message.source(),
                message.group(),
                message.resource(),
                message.operation()
            ),
            (
                "devicecontroller",
                "twin",
                "node/edge-1/membership",
                "update"
            )
        );
        // No version: it is not an object the edge acknowledges.
        assert!(message.resource_version().is_empty());
        assert_eq!(message.parent_id(), None);
        assert_eq!(
            message.body::<serde_json::Value>().expect("json body"),
            json!({"event_id": added.base.event_id, "timestamp": 7,
                    "added_devices": [{"id": "plant/thermo-1", "name": "thermo-1", "description": "hall"}],
                    "removed_devices": []})
        );
        // A device gone may be a stub: no labels, no namespace written.
        let removed = membership_update(&json!({"metadata": {"name": "t2"}}), false, 8);
        assert!(removed.added_devices.is_empty());
        assert_eq!(
            serde_json::to_value(&removed.removed_devices).expect("json"),
            json!([{"id": "default/t2", "name": "t2"}])
        );
        assert_ne!(removed.base.event_id, added.base.event_id);
    }

    #[test]
    fn the_answer_is_a_result_then_a_confirm() {
        let request = HiveMessage::new().build_router(
            "twin",
            "resource",
            "node/edge-1/membership/detail",
            "get",
        );
        let detail = detail("edge-1", "e".to_owned(), 1, &[]);
        let result = detail_message("edge-1", &detail).expect("message");
        assert_eq!(result.parent_id(), None);
        assert_eq!(
            (result.source(), result.group(), result.resource()),
            ("devicecontroller", "twin", "node/edge-1/membership/detail")
        );
        assert_eq!(
            result.body::<serde_json::Value>().expect("json body")["devices"],
            json!([])
        );
        assert!(result.resource_version().is_empty());
        let confirm = confirm_message("edge-1", &request);
        assert_eq!(confirm.parent_id(), Some(request.id()));
        assert_eq!(
            (
                confirm.source(),
                confirm.group(),
                confirm.resource(),
                confirm.operation()
            ),
            ("devicecontroller", "twin", "node/edge-1/twin", "response")
        );
        assert_eq!(
            confirm.body::<serde_json::Value>().expect("json body"),
            json!("OK")
        );
    }
}
