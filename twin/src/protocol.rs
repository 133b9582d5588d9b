//! KubeEdge's device MQTT protocol: the topics mappers and edge
//! applications use, and the JSON they carry (written from KubeEdge's
//! public documentation and API definitions).
//!
//! Every payload starts with `event_id` and `timestamp` (milliseconds).
//! A twin is `{expected, actual, optional, metadata: {type},
//! expected_version, actual_version}`, where each value is
//! `{value, metadata: {timestamp}}` and each version `{cloud, edge}`.
//! Failures are answered on the matching result topic as
//! `{event_id, timestamp, code, reason}`. The payloads' types are
//! [`apis::twin`]'s, shared with the cloud, which answers a KubeEdge
//! edge's twin sync in them.

use serde_json::Value;

pub use apis::twin::{
    BaseMessage, MemberDevice, MsgAttr, MsgTwin, StateUpdate, TwinUpdate, TwinValue, TwinVersion,
    TypeMetadata, ValueMetadata,
};

/// The prefix of every device topic.
pub const DEVICE_PREFIX: &str = "$hw/events/device/";
/// The prefix of every node topic.
pub const NODE_PREFIX: &str = "$hw/events/node/";

/// The metadata type that deletes a twin in an update.
pub const DELETED: &str = "deleted";

/// KubeEdge's result codes.
pub mod code {
    /// The request cannot be read or is not allowed.
    pub const BAD_REQUEST: u16 = 400;
    /// The device is not bound to this node.
    pub const NOT_FOUND: u16 = 404;
    /// The payload is larger than the bridge takes.
    pub const TOO_LARGE: u16 = 413;
    /// The node could not keep the change.
    pub const INTERNAL: u16 = 500;
}

/// What a message on an MQTT topic asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// `$hw/events/device/<id>/twin/update`: set actual or expected values.
    TwinUpdate(String),
    /// `$hw/events/device/<id>/twin/get`: read the twins.
    TwinGet(String),
    /// `$hw/events/device/<id>/state/update`: the device's state.
    StateUpdate(String),
    /// `$hw/events/node/<node>/membership/get`: the node's devices.
    MembershipGet(String),
    /// `$hw/events/connected/<id>`: the device came online.
    Connected(String),
    /// `$hw/events/disconnected/<id>`: the device went offline.
    Disconnected(String),
}

impl Request {
    /// What `topic` asks for, if it is a request topic.
    pub fn of(topic: &str) -> Option<Request> {
        if let Some(rest) = topic.strip_prefix(DEVICE_PREFIX) {
            let (id, action) = rest.split_once('/')?;
            if id.is_empty() {
                return None;
            }
            let id = id.to_owned();
            return match action {
                "twin/update" => Some(Request::TwinUpdate(id)),
                "twin/get" => Some(Request::TwinGet(id)),
                "state/update" => Some(Request::StateUpdate(id)),
                _ => None,
            };
        }
        if let Some(rest) = topic.strip_prefix(NODE_PREFIX) {
            let (node, action) = rest.split_once('/')?;
            return (action == "membership/get").then(|| Request::MembershipGet(node.to_owned()));
        }
        if let Some(id) = topic.strip_prefix("$hw/events/connected/") {
            return Some(Request::Connected(id.to_owned()));
        }
        if let Some(id) = topic.strip_prefix("$hw/events/disconnected/") {
            return Some(Request::Disconnected(id.to_owned()));
        }
        None
    }

    /// The topic its answer goes to, if it has one.
    pub fn result_topic(&self) -> Option<String> {
        match self {
            Request::TwinUpdate(id) => Some(device_topic(id, "twin/update/result")),
            Request::TwinGet(id) => Some(device_topic(id, "twin/get/result")),
            Request::StateUpdate(id) => Some(device_topic(id, "state/update/result")),
            Request::MembershipGet(node) => Some(node_topic(node, "membership/get/result")),
            Request::Connected(_) | Request::Disconnected(_) => None,
        }
    }
}

/// The result topic of a request published on `topic`, if it has one.
pub fn result_topic(topic: &str) -> Option<String> {
    Request::of(topic).and_then(|r| r.result_topic())
}

/// `$hw/events/device/<id>/<suffix>`.
pub fn device_topic(id: &str, suffix: &str) -> String {
    format!("{DEVICE_PREFIX}{id}/{suffix}")
}

/// `$hw/events/node/<node>/<suffix>`.
pub fn node_topic(node: &str, suffix: &str) -> String {
    format!("{NODE_PREFIX}{node}/{suffix}")
}

/// A failure on a result topic.
pub fn error_result(event_id: &str, code: u16, reason: &str) -> Value {
    serde_json::json!({
        "event_id": event_id,
        "timestamp": beehive::message::now_millis(),
        "code": code,
        "reason": reason,
    })
}

/// The `event_id` of a payload, if it has one, so even a refused request
/// can be matched with its result.
pub fn event_id_of(payload: &Value) -> String {
    payload
        .get("event_id")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn topics_map_to_requests_and_their_result_topics() {
        let update = Request::of("$hw/events/device/thermo-1/twin/update");
        assert_eq!(update, Some(Request::TwinUpdate("thermo-1".to_owned())));
        assert_eq!(
            result_topic("$hw/events/device/thermo-1/twin/update").as_deref(),
            Some("$hw/events/device/thermo-1/twin/update/result")
        );
        assert_eq!(
            result_topic("$hw/events/node/edge-1/membership/get").as_deref(),
            Some("$hw/events/node/edge-1/membership/get/result")
        );
        assert_eq!(
            Request::of("$hw/events/connected/thermo-1"),
            Some(Request::Connected("thermo-1".to_owned()))
        );
        assert_eq!(
            Request::of("$hw/events/device/thermo-1/twin/update/result"),
            None
        );
        assert_eq!(Request::of("$hw/events/device//twin/update"), None);
        assert_eq!(Request::of("$hw/events/upload/x"), None);
    }

    #[test]
    fn a_mapper_report_reads_in_kubeedge_shape() {
        let report: TwinUpdate = serde_json::from_value(json!({
            "event_id": "e1",
            "timestamp": 1_557_314_742_131_i64,
            "twin": { "temperature": { "actual": { "value": "21.5" }, "metadata": { "type": "float" } } }
        }))
        .expect("reads");
        assert_eq!(report.base.event_id, "e1");
        let twin = &report.twin["temperature"];
        assert_eq!(
            twin.actual.as_ref().and_then(|a| a.value.as_deref()),
            Some("21.5")
        );
        assert_eq!(
            twin.metadata.as_ref().map(|m| m.type_.as_str()),
            Some("float")
        );
        // KubeEdge's values are strings: a number is refused.
        assert!(
            serde_json::from_value::<TwinUpdate>(json!({
                "twin": { "temperature": { "actual": { "value": 21.5 } } }
            }))
            .is_err()
        );
    }

    #[test]
    fn versions_and_errors_are_written_in_kubeedge_shape() {
        let twin = MsgTwin {
            expected: Some(TwinValue {
                value: Some("20".to_owned()),
                metadata: Some(ValueMetadata { timestamp: 5 }),
            }),
            expected_version: Some(TwinVersion { cloud: 7, edge: 0 }),
            ..MsgTwin::default()
        };
        assert_eq!(
            serde_json::to_value(&twin).expect("writes"),
            json!({
                "expected": { "value": "20", "metadata": { "timestamp": 5 } },
                "expected_version": { "cloud": 7, "edge": 0 }
            })
        );
        let error = error_result("e2", code::NOT_FOUND, "no device x");
        assert_eq!(error["event_id"], "e2");
        assert_eq!(error["code"], 404);
        assert_eq!(error["reason"], "no device x");
    }
}
