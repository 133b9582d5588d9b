//! KubeEdge's wire format for beehive messages: one JSON object per
//! WebSocket frame,
//!
//! ```json
//! {"header": {"msg_id": "<uuid>", "parent_msg_id": "<uuid>", "timestamp": 1700000000000,
//!             "resourceversion": "42", "sync": true, "type": ""},
//!  "route": {"source": "edgecontroller", "destination": "", "group": "resource",
//!            "operation": "insert", "resource": "default/pod/web"},
//!  "content": {...}}
//! ```
//!
//! written from KubeEdge's public message model (empty fields are left
//! out, as Go's `omitempty` does). Go byte slices in `content` travel
//! base64-encoded: a string content that decodes from base64 to JSON is
//! read as that JSON. A link carries it when its options ask for
//! [`crate::Codec::KubeEdgeJson`]; the native edgehive link stays
//! MessagePack.

use beehive::{Content, Header, Message, Router, SmolStr};
use serde::{Deserialize, Serialize};

/// A frame that is not a KubeEdge message.
#[derive(Debug, thiserror::Error)]
pub enum KubeEdgeError {
    /// Larger than the limit; refused before it is parsed.
    #[error("frame of {size} bytes exceeds the {max} byte limit")]
    TooLarge {
        /// Its size.
        size: usize,
        /// The limit.
        max: usize,
    },
    /// Not JSON in KubeEdge's message shape.
    #[error("not a KubeEdge message: {0}")]
    Shape(String),
    /// A message id that is not a UUID.
    #[error("message id {0:?} is not a UUID")]
    Id(String),
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct WireHeader {
    msg_id: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    parent_msg_id: String,
    #[serde(default)]
    timestamp: i64,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    resourceversion: String,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    sync: bool,
    #[serde(default, rename = "type", skip_serializing_if = "String::is_empty")]
    message_type: String,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct WireRoute {
    #[serde(default, skip_serializing_if = "SmolStr::is_empty")]
    source: SmolStr,
    #[serde(default, skip_serializing_if = "SmolStr::is_empty")]
    destination: SmolStr,
    #[serde(default, skip_serializing_if = "SmolStr::is_empty")]
    group: SmolStr,
    #[serde(default, skip_serializing_if = "SmolStr::is_empty")]
    operation: SmolStr,
    #[serde(default, skip_serializing_if = "SmolStr::is_empty")]
    resource: SmolStr,
}

#[derive(Debug, Serialize, Deserialize)]
struct WireMessage {
    header: WireHeader,
    #[serde(default)]
    route: WireRoute,
    #[serde(default)]
    content: Content,
}

/// The JSON of `msg` as a KubeEdge peer expects it.
pub fn encode(msg: &Message) -> Vec<u8> {
    let wire = WireMessage {
        header: WireHeader {
            msg_id: msg.header.id.to_string(),
            parent_msg_id: msg
                .header
                .parent_id
                .map(|id| id.to_string())
                .unwrap_or_default(),
            timestamp: msg.header.timestamp,
            resourceversion: msg.header.resource_version.clone(),
            sync: msg.header.sync,
            message_type: String::new(),
        },
        route: WireRoute {
            source: msg.router.source.clone(),
            destination: msg.router.destination.clone(),
            group: msg.router.group.clone(),
            operation: msg.router.operation.clone(),
            resource: msg.router.resource.clone(),
        },
        content: msg.content.clone(),
    };
    serde_json::to_vec(&wire).unwrap_or_else(|err| {
        // Only a body JSON cannot say (a map with keys that are not
        // strings) gets here; the frame goes out empty and the peer drops it.
        tracing::warn!(id = %msg.header.id, error = %err, "a message KubeEdge's JSON cannot carry");
        Vec::new()
    })
}

/// Whether `frame` is a Go zero message: no id, no route, no content. A
/// KubeEdge edgecore sends one as it shuts down (its module's channel
/// closed under it); it carries nothing, so it is passed over rather than
/// taken as a garbled frame.
pub fn is_zero_message(frame: &[u8]) -> bool {
    let Ok(wire) = serde_json::from_slice::<WireMessage>(frame) else {
        return false;
    };
    let route = &wire.route;
    wire.header.msg_id.is_empty()
        && wire.header.parent_msg_id.is_empty()
        && [
            &route.source,
            &route.destination,
            &route.group,
            &route.operation,
            &route.resource,
        ]
        .iter()
        .all(|field| field.is_empty())
        && wire.content.is_empty()
}

/// Reads a KubeEdge message from one frame of at most `max` bytes.
pub fn decode(frame: &[u8], max: usize) -> Result<Message, KubeEdgeError> {
    if frame.len() > max {
        return Err(KubeEdgeError::TooLarge {
            size: frame.len(),
            max,
        });
    }
    let wire: WireMessage =
        serde_json::from_slice(frame).map_err(|err| KubeEdgeError::Shape(err.to_string()))?;
    let id = wire
        .header
        .msg_id
        .parse()
        .map_err(|_| KubeEdgeError::Id(wire.header.msg_id.clone()))?;
    let parent_id = match wire.header.parent_msg_id.as_str() {
        "" => None,
        parent => Some(
            parent
                .parse()
                .map_err(|_| KubeEdgeError::Id(parent.to_owned()))?,
        ),
    };
    Ok(Message {
        header: Header {
            id,
            parent_id,
            timestamp: wire.header.timestamp,
            resource_version: wire.header.resourceversion,
            sync: wire.header.sync,
        },
        router: Router {
            source: wire.route.source,
            destination: wire.route.destination,
            group: wire.route.group,
            operation: wire.route.operation,
            resource: wire.route.resource,
        },
        content: unwrap_bytes(wire.content),
    })
}

/// A Go byte slice arrives as a base64 string: when it decodes to a JSON
/// object or array, that JSON is the content.
fn unwrap_bytes(content: Content) -> Content {
    use base64::Engine as _;
    let Content::Text(text) = &content else {
        return content;
    };
    base64::engine::general_purpose::STANDARD
        .decode(text)
        .ok()
        .filter(|bytes| {
            let first = bytes.iter().find(|byte| !byte.is_ascii_whitespace());
            matches!(first, Some(b'{' | b'['))
        })
        .and_then(|bytes| serde_json::from_slice::<Content>(&bytes).ok())
        .unwrap_or(content)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    #[test]
    fn a_go_zero_message_is_told_from_a_garbled_one() {
        let zero = json!({
            "header": {"msg_id": "", "parent_msg_id": "", "timestamp": 0, "sync": false},
            "route": {"source": "", "group": "", "operation": "", "resource": ""},
            "content": null
        });
        assert!(is_zero_message(zero.to_string().as_bytes()));
        assert!(is_zero_message(br#"{"header":{"msg_id":""}}"#));
        // Anything with a route or content is a message, and an id that
        // is not a UUID still refuses it.
        let routed = json!({"header": {"msg_id": ""}, "route": {"operation": "keepalive"}});
        assert!(!is_zero_message(routed.to_string().as_bytes()));
        assert!(decode(routed.to_string().as_bytes(), 1 << 20).is_err());
        let content = json!({"header": {"msg_id": ""}, "content": "x"});
        assert!(!is_zero_message(content.to_string().as_bytes()));
        assert!(!is_zero_message(b"not json"));
    }

    /// A pod insert as KubeEdge's cloudhub sends it (written from the
    /// message model, not copied from a capture).
    fn golden_insert() -> Value {
        json!({
            "header": {
                "msg_id": "2f1c3e1a-6a43-4f7e-9d7c-4a3c2b1d0e9f",
                "timestamp": 1_700_000_000_123_i64,
                "resourceversion": "4711"
            },
            "route": {
                "source": "edgecontroller",
                "group": "resource",
                "operation": "insert",
                "resource": "default/pod/web"
            },
            "content": {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web"}}
        })
    }

    #[test]
    fn a_kubeedge_message_decodes_and_encodes_identically() {
        let golden = golden_insert();
        let bytes = serde_json::to_vec(&golden).expect("json");
        let msg = decode(&bytes, 1 << 20).expect("decodes");
        assert_eq!(msg.id().to_string(), "2f1c3e1a-6a43-4f7e-9d7c-4a3c2b1d0e9f");
        assert_eq!(msg.resource_version(), "4711");
        assert_eq!(msg.router.operation, "insert");
        assert_eq!(msg.resource(), "default/pod/web");
        assert!(!msg.is_sync());
        let back: Value = serde_json::from_slice(&encode(&msg)).expect("json");
        assert_eq!(back, golden);
    }

    #[test]
    fn an_ack_names_its_parent_and_a_keepalive_keeps_its_string() {
        let ack = json!({
            "header": {
                "msg_id": "7b0c9d8e-1f2a-4b3c-8d4e-5f6a7b8c9d0e",
                "parent_msg_id": "2f1c3e1a-6a43-4f7e-9d7c-4a3c2b1d0e9f",
                "timestamp": 1_700_000_000_456_i64,
                "sync": true
            },
            "route": {"source": "metaManager", "group": "resource", "operation": "response",
                      "resource": "default/pod/web"},
            "content": "OK"
        });
        let msg = decode(&serde_json::to_vec(&ack).expect("json"), 1 << 20).expect("decodes");
        assert_eq!(
            msg.parent_id().map(|p| p.to_string()).as_deref(),
            Some("2f1c3e1a-6a43-4f7e-9d7c-4a3c2b1d0e9f")
        );
        assert!(msg.is_sync());
        assert_eq!(
            msg.body::<serde_json::Value>().expect("json body"),
            json!("OK")
        );
        let back: Value = serde_json::from_slice(&encode(&msg)).expect("json");
        assert_eq!(back, ack);

        let keepalive = json!({
            "header": {"msg_id": "00000000-0000-4000-8000-000000000001", "timestamp": 1},
            "route": {"source": "websocket", "group": "resource", "resource": "node",
                      "operation": "keepalive"},
            "content": "ping"
        });
        let msg = decode(&serde_json::to_vec(&keepalive).expect("json"), 1 << 20).expect("decodes");
        assert_eq!(
            msg.body::<serde_json::Value>().expect("json body"),
            json!("ping")
        );
    }

    #[test]
    fn go_byte_slices_arrive_as_json() {
        use base64::Engine as _;
        let status = json!({"phase": "Running"});
        let encoded = base64::engine::general_purpose::STANDARD
            .encode(serde_json::to_vec(&status).expect("json"));
        let frame = json!({
            "header": {"msg_id": "00000000-0000-4000-8000-000000000002", "timestamp": 1},
            "route": {"source": "edged", "group": "meta", "operation": "update",
                      "resource": "default/podstatus/web"},
            "content": encoded
        });
        let msg = decode(&serde_json::to_vec(&frame).expect("json"), 1 << 20).expect("decodes");
        assert_eq!(msg.body::<serde_json::Value>().expect("json body"), status);
    }

    #[test]
    fn bad_frames_get_clear_errors() {
        assert!(matches!(
            decode(&[b' '; 100], 10),
            Err(KubeEdgeError::TooLarge { size: 100, max: 10 })
        ));
        assert!(matches!(
            decode(b"{not json", 1 << 20),
            Err(KubeEdgeError::Shape(_))
        ));
        let bad_id = json!({"header": {"msg_id": "42"}, "route": {}, "content": null});
        assert!(matches!(
            decode(&serde_json::to_vec(&bad_id).expect("json"), 1 << 20),
            Err(KubeEdgeError::Id(id)) if id == "42"
        ));
    }
}
