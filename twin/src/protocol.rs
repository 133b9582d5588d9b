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

/// A refusal: KubeEdge's result code and the reason.
pub type Refusal = (u16, String);

/// What an MQTT payload carries into beehive: its JSON, or its text (bytes
/// that are not UTF-8 replaced) when it is not JSON.
pub fn content_of(payload: &[u8]) -> Value {
    serde_json::from_slice::<Value>(payload)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(payload).into_owned()))
}

/// A request's payload (as [`content_of`] made it) read as `T`; text that
/// was not JSON, or JSON of another shape, is a bad request.
pub fn read<T: serde::de::DeserializeOwned>(payload: &Value) -> Result<T, Refusal> {
    if let Value::String(text) = payload {
        let shown: String = text.chars().take(40).collect();
        return Err((
            code::BAD_REQUEST,
            format!("the payload is not JSON: {shown:?}"),
        ));
    }
    T::deserialize(payload).map_err(|err| (code::BAD_REQUEST, format!("unreadable payload: {err}")))
}

/// A twin update names at least one twin, each by a name that can stand
/// in a topic (not empty, no `/`, `+` or `#`).
pub fn check_twin_update(update: &TwinUpdate) -> Result<(), Refusal> {
    if update.twin.is_empty() {
        return Err((code::BAD_REQUEST, "the update names no twin".to_owned()));
    }
    for name in update.twin.keys() {
        if name.is_empty() || name.contains(['/', '+', '#']) {
            return Err((code::BAD_REQUEST, format!("{name:?} is not a twin name")));
        }
    }
    Ok(())
}

/// A state update's state is a short, non-empty string.
pub fn check_state_update(update: &StateUpdate) -> Result<(), Refusal> {
    if update.state.is_empty() || update.state.len() > 64 {
        return Err((
            code::BAD_REQUEST,
            "state must be a short, non-empty string".to_owned(),
        ));
    }
    Ok(())
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
    fn payloads_that_are_not_requests_are_bad_requests() {
        assert_eq!(
            content_of(b"{\"state\":\"online\"}"),
            json!({"state": "online"})
        );
        assert_eq!(content_of(b"on\xffline"), json!("on\u{fffd}line"));
        let refused = |payload: &[u8]| {
            read::<StateUpdate>(&content_of(payload))
                .and_then(|update| check_state_update(&update))
                .expect_err("refused")
                .0
        };
        assert_eq!(refused(b"online"), code::BAD_REQUEST);
        assert_eq!(refused(b"{\"state\": 3}"), code::BAD_REQUEST);
        assert_eq!(refused(b"{\"state\": \"\"}"), code::BAD_REQUEST);
        let update: TwinUpdate =
            read(&json!({"twin": {"a/b": {"actual": {"value": "1"}}}})).expect("reads");
        assert_eq!(
            check_twin_update(&update).map_err(|e| e.0),
            Err(code::BAD_REQUEST)
        );
        let update: TwinUpdate = read(&json!({"twin": {}})).expect("reads");
        assert_eq!(
            check_twin_update(&update).map_err(|e| e.0),
            Err(code::BAD_REQUEST)
        );
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
