//! What a KubeEdge edge's devicetwin reports of its devices, taken into
//! their status.
//!
//! Its twin module sends two reports up (source `twin`, group `resource`,
//! operation `update`; cloudhub puts `node/<node>/` in front):
//!
//! - `device/<ns>/<name>/twin/edge_updated`: twins that changed at the
//!   edge, content (an object) `{"event_id", "timestamp", "twin": {"<prop>":
//!   {"expected": {"value", "metadata": {"timestamp"}}, "actual": {..},
//!   "optional", "metadata": {"type"}, "expected_version",
//!   "actual_version"}}}` (an [`apis::twin::TwinUpdate`]);
//! - `device/<ns>/<name>/state/update`: the device's state, content (JSON
//!   in a string) `{"event_id", "timestamp", "device": {"name", "state",
//!   "lastOnlineTime"}}` (an [`apis::twin::DeviceStateReport`]).
//!
//! As KubeEdge's devicecontroller does, a twin named like one of the
//! device's properties sets that property's twin in `status.twins`: the
//! actual value becomes `reported`, the expected one `observedDesired`,
//! each with metadata `timestamp` and `type`; other twins are passed over.
//! A state sets `status.state`, and `status.lastOnlineTime` when it
//! carries one. The edge keeps sending a report every 60 s until the
//! cloud confirms it ([`super::twin_sync::confirm_message`]).
//!
//! These are plain functions; the controller stores the status as it
//! stores every node's status report, only for a device bound to the
//! reporting node.

use std::collections::BTreeMap;

use apis::devices::{Device, Twin, TwinProperty};
use apis::kinds::valid_name;
use apis::twin::{DeviceStateReport, TwinUpdate, TwinValue};
use beehive::resource::EdgeResource;
use serde::de::DeserializeOwned;
use serde_json::Value;

/// What a device report says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReportKind {
    /// Twins changed at the edge (`twin/edge_updated`).
    Twins,
    /// The device's state (`state/update`).
    State,
}

/// A device report's resource, read: which device, and what it says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceReportOf {
    /// The device's namespace.
    pub namespace: String,
    /// The device's name.
    pub name: String,
    /// What the report says.
    pub kind: ReportKind,
}

/// The device report `resource` (the edge's form) is, if it is one:
/// `device/<ns>/<name>/twin/edge_updated` or `device/<ns>/<name>/state/update`.
pub fn device_report_of(resource: &EdgeResource) -> Option<DeviceReportOf> {
    if resource.namespace != beehive::constants::resource_type::DEVICE {
        return None;
    }
    let mut parts = resource.name.split('/');
    let (Some(name), Some(what), Some(how), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return None;
    };
    let kind = match (what, how) {
        ("twin", "edge_updated") => ReportKind::Twins,
        ("state", "update") => ReportKind::State,
        _ => return None,
    };
    let namespace = resource.resource_type.as_str();
    (valid_name(namespace) && valid_name(name)).then(|| DeviceReportOf {
        namespace: namespace.to_owned(),
        name: name.to_owned(),
        kind,
    })
}

/// A report's content: JSON in a string (as KubeEdge's edge sends a
/// state), or JSON.
fn content_of<T: DeserializeOwned>(content: &Value) -> Result<T, String> {
    let read = match content {
        Value::String(text) => serde_json::from_str(text),
        other => T::deserialize(other),
    };
    read.map_err(|err| format!("unreadable device report: {err}"))
}

/// The status `device` (the stored object) gets from a report of `kind`
/// with `content`: its status with the reported twins or state set, every
/// other field of it kept.
pub fn reported_status(kind: ReportKind, content: &Value, device: &Value) -> Result<Value, String> {
    let typed: Device = serde_json::from_value(device.clone())
        .map_err(|err| format!("the device is not readable: {err}"))?;
    let mut status = typed.status.unwrap_or_default();
    match kind {
        ReportKind::Twins => {
            let update: TwinUpdate = content_of(content)?;
            for (property, twin) in &update.twin {
                if !typed.spec.properties.iter().any(|p| &p.name == property) {
                    // KubeEdge's cloud takes twins of the device's
                    // properties only.
                    continue;
                }
                let type_ = twin.metadata.as_ref().map(|m| m.type_.as_str());
                let reported = twin.actual.as_ref().and_then(|v| property_of(v, type_));
                let observed = twin.expected.as_ref().and_then(|v| property_of(v, type_));
                if reported.is_none() && observed.is_none() {
                    continue;
                }
                let position = match status
                    .twins
                    .iter()
                    .position(|t| &t.property_name == property)
                {
                    Some(position) => position,
                    None => {
                        status.twins.push(Twin {
                            property_name: property.clone(),
                            ..Twin::default()
                        });
                        status.twins.len() - 1
                    }
                };
                let held = &mut status.twins[position];
                if reported.is_some() {
                    held.reported = reported;
                }
                if observed.is_some() {
                    held.observed_desired = observed;
                }
            }
        }
        ReportKind::State => {
            let report: DeviceStateReport = content_of(content)?;
            if report.device.state.is_empty() {
                return Err("a state report without a state".to_owned());
            }
            status.state = Some(report.device.state);
            // An empty time (the device is not online) leaves the last
            // one, as KubeEdge's merge patch leaves an omitted field.
            if !report.device.last_online_time.is_empty() {
                status.last_online_time = Some(report.device.last_online_time);
            }
        }
    }
    let written =
        serde_json::to_value(&status).map_err(|err| format!("status not written: {err}"))?;
    let mut merged = match device.get("status") {
        Some(Value::Object(held)) => held.clone(),
        _ => serde_json::Map::new(),
    };
    if let Value::Object(fields) = written {
        merged.extend(fields);
    }
    Ok(Value::Object(merged))
}

/// A twin value as a Device's status holds it: the value, with metadata
/// `timestamp` (milliseconds) and `type` where known; none without a value.
fn property_of(value: &TwinValue, type_: Option<&str>) -> Option<TwinProperty> {
    let mut metadata = BTreeMap::new();
    if let Some(at) = &value.metadata {
        metadata.insert("timestamp".to_owned(), at.timestamp.to_string());
    }
    if let Some(type_) = type_ {
        metadata.insert("type".to_owned(), type_.to_owned());
    }
    Some(TwinProperty {
        value: value.value.clone()?,
        metadata,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn resource(text: &str) -> EdgeResource {
        text.parse().expect("a resource")
    }

    #[test]
    fn device_reports_are_told_by_their_resource() {
        assert_eq!(
            device_report_of(&resource("device/plant/thermo-1/twin/edge_updated")),
            Some(DeviceReportOf {
                namespace: "plant".to_owned(),
                name: "thermo-1".to_owned(),
                kind: ReportKind::Twins,
            })
        );
        assert_eq!(
            device_report_of(&resource("device/plant/thermo-1/state/update")).map(|r| r.kind),
            Some(ReportKind::State)
        );
        for other in [
            "device/plant/thermo-1/twin/cloud_updated",
            "device/plant/thermo-1/twin/edge_updated/x",
            "device/plant/thermo-1",
            "plant/device/thermo-1",
            "device/Plant/thermo-1/state/update",
            "device/plant/../state/update",
            "membership/detail",
        ] {
            assert_eq!(device_report_of(&resource(other)), None, "{other}");
        }
    }

    fn thermo(status: Value) -> Value {
        json!({
            "apiVersion": "devices.kubeedge.io/v1beta1", "kind": "Device",
            "metadata": {"name": "thermo-1", "namespace": "plant"},
            "spec": {"nodeName": "edge-1", "properties": [{"name": "setpoint"}, {"name": "temperature"}]},
            "status": status,
        })
    }

    #[test]
    fn twins_of_the_devices_properties_become_its_status() {
        let device = thermo(json!({
            "state": "online", "reportToCloud": true,
            "twins": [{"propertyName": "temperature", "reported": {"value": "18"}}],
        }));
        let report = json!({"event_id": "", "timestamp": 5, "twin": {
            "temperature": {"actual": {"value": "19.5", "metadata": {"timestamp": 1700}},
                            "optional": false, "metadata": {"type": "float"},
                            "actual_version": {"cloud": 3, "edge": 1}},
            "setpoint": {"expected": {"value": "21", "metadata": {"timestamp": 1600}},
                         "actual": {"value": "20"}, "metadata": {"type": "int"}},
            "humidity": {"actual": {"value": "40"}},
        }});
        let status = reported_status(ReportKind::Twins, &report, &device).expect("taken");
        assert_eq!(
            status,
            json!({
                "state": "online", "reportToCloud": true,
                "twins": [
                    {"propertyName": "temperature",
                     "reported": {"value": "19.5", "metadata": {"timestamp": "1700", "type": "float"}}},
                    {"propertyName": "setpoint",
                     "reported": {"value": "20", "metadata": {"type": "int"}},
                     "observedDesired": {"value": "21", "metadata": {"timestamp": "1600", "type": "int"}}},
                ],
            })
        );
        // The same as JSON in a string.
        let text = Value::String(report.to_string());
        assert_eq!(
            reported_status(ReportKind::Twins, &text, &device),
            Ok(status)
        );
        assert!(reported_status(ReportKind::Twins, &json!("not json"), &device).is_err());
    }

    #[test]
    fn a_state_sets_the_state_and_the_time_it_carries() {
        let device = thermo(json!({"state": "online", "lastOnlineTime": "2026-11-26T10:00:00Z"}));
        let online = json!(
            r#"{"event_id":"e","timestamp":5,"device":{"name":"thermo-1","state":"online","lastOnlineTime":"2026-11-26T11:00:00Z"}}"#
        );
        assert_eq!(
            reported_status(ReportKind::State, &online, &device),
            Ok(json!({"state": "online", "lastOnlineTime": "2026-11-26T11:00:00Z"}))
        );
        let offline = json!({"event_id": "e", "timestamp": 6,
                             "device": {"name": "thermo-1", "state": "offline", "lastOnlineTime": ""}});
        assert_eq!(
            reported_status(ReportKind::State, &offline, &device),
            Ok(json!({"state": "offline", "lastOnlineTime": "2026-11-26T10:00:00Z"}))
        );
        // A device with no status yet gets one.
        let bare = thermo(Value::Null);
        assert_eq!(
            reported_status(ReportKind::State, &offline, &bare),
            Ok(json!({"state": "offline"}))
        );
        let stateless = json!({"device": {"name": "thermo-1"}});
        assert!(reported_status(ReportKind::State, &stateless, &device).is_err());
    }
}
