//! A KubeEdge edgecore's side of a link, scripted frame by frame: every
//! frame it sends is JSON in KubeEdge's exact message shape, written here
//! from KubeEdge's message model; every frame the cloud sends is read as
//! JSON.

use std::time::Duration;

use beehive::Uuid;
use cloud::dynamiccontroller::wire::Application;
use serde_json::{Value, json};
use transports::tls;
use transports::{DialOptions, Link, TransportKind};

use super::Cloud;

/// A KubeEdge edge's raw link: frames are JSON on the wire.
pub struct KubeEdgeEdge {
    pub link: Link,
}

impl KubeEdgeEdge {
    /// Sends a request and returns the edgecontroller's answer to it.
    pub async fn ask_controller(&mut self, frame: Value, what: &str) -> Value {
        let answer = self.ask(frame, what).await;
        assert_eq!(answer["route"]["operation"], "response", "{what}: {answer}");
        assert_eq!(answer["route"]["source"], "edgecontroller", "{what}");
        answer
    }

    /// Dials the cloud's KubeEdge endpoint as KubeEdge's edgehub does:
    /// `node_id`, `project_id` and `ConnectionUse` headers, a certificate
    /// whose common name is `certified`.
    pub async fn dial(cloud: &Cloud, node_id: Option<&str>, certified: &str) -> KubeEdgeEdge {
        KubeEdgeEdge::dial_at(&cloud.pki, &cloud.kubeedge_address, node_id, certified).await
    }

    /// Like [`KubeEdgeEdge::dial`], to a KubeEdge endpoint at `address`
    /// whose certificates `pki` issues.
    pub async fn dial_at(
        pki: &transports::tls::DevPki,
        address: &str,
        node_id: Option<&str>,
        certified: &str,
    ) -> KubeEdgeEdge {
        KubeEdgeEdge::try_dial_at(pki, address, node_id, certified)
            .await
            .expect("dial")
    }

    /// Like [`KubeEdgeEdge::dial`], or the cloud's refusal.
    pub async fn try_dial(
        cloud: &Cloud,
        node_id: Option<&str>,
        certified: &str,
    ) -> Result<KubeEdgeEdge, transports::TransportError> {
        KubeEdgeEdge::try_dial_at(&cloud.pki, &cloud.kubeedge_address, node_id, certified).await
    }

    /// Like [`KubeEdgeEdge::dial_at`], or the cloud's refusal.
    pub async fn try_dial_at(
        pki: &transports::tls::DevPki,
        address: &str,
        node_id: Option<&str>,
        certified: &str,
    ) -> Result<KubeEdgeEdge, transports::TransportError> {
        let identity = pki.client(certified).expect("client cert");
        let mut options = DialOptions::new(address, "localhost")
            .with_tls(tls::client_config(&[pki.root()], Some(identity)).expect("tls"))
            .with_codec(transports::Codec::KubeEdgeJson)
            // KubeEdge's edgehub upgrades at its own path.
            .with_path(format!(
                "/e632aba927ea4ac2b575ec1603d56f10/{}/events",
                node_id.unwrap_or("unnamed")
            ))
            .with_header("project_id", "e632aba927ea4ac2b575ec1603d56f10")
            .with_header("ConnectionUse", "msg");
        if let Some(node) = node_id {
            options = options.with_header("node_id", node);
        }
        let link = TransportKind::WebSocket
            .transport()
            .expect("ws")
            .dial(&options)
            .await?;
        Ok(KubeEdgeEdge { link })
    }

    /// Sends one frame, given as the JSON a KubeEdge edge writes.
    pub async fn send(&self, frame: Value) {
        let bytes = serde_json::to_vec(&frame).expect("json");
        let msg = transports::kubeedge::decode(&bytes, 1 << 20).expect("a KubeEdge frame");
        // What goes on the wire is that JSON again.
        let wire: Value =
            serde_json::from_slice(&transports::kubeedge::encode(&msg)).expect("json");
        assert_eq!(wire, frame);
        self.link.sender.send(&msg).await.expect("sent");
    }

    /// The next frame from the cloud, as JSON.
    pub async fn recv(&mut self, what: &str) -> Value {
        let msg = tokio::time::timeout(Duration::from_secs(30), self.link.receiver.recv())
            .await
            .unwrap_or_else(|_| panic!("timed out waiting for {what}"))
            .unwrap_or_else(|| panic!("link closed while waiting for {what}"))
            .unwrap_or_else(|err| panic!("link failed while waiting for {what}: {err}"));
        serde_json::from_slice(&transports::kubeedge::encode(&msg)).expect("json")
    }

    /// The next frame for the edge's devicetwin (group `twin`); objects
    /// that come first (pods, devices, models) are acknowledged as
    /// metamanager would and passed over.
    pub async fn recv_twin(&mut self, what: &str) -> Value {
        loop {
            let frame = self.recv(what).await;
            if frame["route"]["group"] == "twin" {
                return frame;
            }
            if frame["header"].get("resourceversion").is_some() {
                self.send(ack(&frame)).await;
            }
        }
    }

    /// Sends a request and returns the cloud's answer to it (the next
    /// frame, which must answer it).
    pub async fn ask(&mut self, frame: Value, what: &str) -> Value {
        let id = frame["header"]["msg_id"].clone();
        self.send(frame).await;
        let answer = self.recv(what).await;
        assert_eq!(answer["header"]["parent_msg_id"], id, "{what}: {answer}");
        answer
    }
}

pub fn id() -> String {
    Uuid::new_v4().to_string()
}

pub fn now() -> i64 {
    beehive::message::now_millis()
}

/// A request from the edge's edged, routed through its metamanager.
pub fn request(operation: &str, resource: &str, content: Value) -> Value {
    json!({
        "header": {"msg_id": id(), "timestamp": now()},
        "route": {"source": "edged", "group": "meta", "operation": operation, "resource": resource},
        "content": content,
    })
}

/// devicetwin's twin sync, as edgecore sends it on every connect: a `get`
/// of `membership/detail` whose content is JSON in a string (KubeEdge's
/// `dttype.GetDetailNode`), carrying `event_id`.
pub fn twin_sync(node: &str, event_id: &str) -> Value {
    let detail = json!({"event_type": "group_membership_event", "event_id": event_id,
                        "group_id": node, "operation": "detail", "timestamp": now()});
    json!({
        "header": {"msg_id": id(), "timestamp": now()},
        "route": {"source": "twin", "group": "resource", "operation": "get", "resource": "membership/detail"},
        "content": detail.to_string(),
    })
}

pub fn keepalive() -> Value {
    json!({
        "header": {"msg_id": id(), "timestamp": now()},
        "route": {"source": "websocket", "group": "resource", "operation": "keepalive", "resource": "node"},
        "content": "ping",
    })
}

/// metamanager's acknowledgement of a stored object.
pub fn ack(object: &Value) -> Value {
    json!({
        "header": {"msg_id": id(), "parent_msg_id": object["header"]["msg_id"], "timestamp": now()},
        "route": {"source": object["route"]["source"], "group": object["route"]["group"],
                  "operation": "response", "resource": object["route"]["resource"]},
        "content": "OK",
    })
}

/// An application from the edge's MetaServer (KubeEdge's
/// `metaserver.Application`, as Go's encoding/json writes it: byte fields
/// in base64), for `node`.
pub fn application_content(verb: &str, key: &str, option: Value, node: &str) -> Value {
    let digest = format!("{verb}{key}{option}{node}");
    let id = digest
        .bytes()
        .fold(0u64, |h, b| h.wrapping_mul(31).wrapping_add(b as u64));
    // Go writes byte fields in base64: the cloud's own codec of them.
    let encoded = Application {
        option: option.to_string().into_bytes(),
        ..Application::default()
    }
    .to_content()
    .decode::<Value>()
    .expect("json");
    json!({
        "ID": format!("{id:x}"),
        "Key": key, "Verb": verb, "Nodename": node, "Option": encoded["Option"],
        "ReqBody": null, "Subresource": "", "RespBody": null, "Status": "InApplying",
        "Reason": "", "Error": {"ErrStatus": {"metadata": {}}},
        "Timestamp": "0001-01-01T00:00:00Z",
    })
}

/// The message the MetaServer's agent sends an application in: route
/// `metaserver` → `dynamiccontroller`, resource and operation `null`.
pub fn application(verb: &str, key: &str, option: Value, node: &str) -> Value {
    json!({
        "header": {"msg_id": id(), "timestamp": now()},
        "route": {"source": "metaserver", "group": "dynamiccontroller", "operation": "null", "resource": "null"},
        "content": application_content(verb, key, option, node),
    })
}

/// The MetaServer's list of the watches it holds, by application id.
pub fn watch_sync(watches: Value) -> Value {
    json!({
        "header": {"msg_id": id(), "timestamp": now()},
        "route": {"source": "metaserver", "group": "dynamiccontroller", "operation": "null", "resource": "watchapp/sync"},
        "content": watches,
    })
}

/// The application a cloud's answer carries, with its response body
/// decoded (JSON, or `null`).
pub fn answered(answer: &Value) -> (Value, Value) {
    assert_eq!(
        answer["route"]["operation"], "applicationResponse",
        "{answer}"
    );
    assert_eq!(answer["route"]["source"], "dynamiccontroller", "{answer}");
    let app = answer["content"].clone();
    let bytes = Application::from_content(&beehive::Content::of(&app).expect("json"))
        .expect("an application")
        .response_body;
    let body = match bytes.is_empty() {
        true => Value::Null,
        false => serde_json::from_slice(&bytes)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned())),
    };
    (app, body)
}

/// devicetwin's report of twins changed at the edge (KubeEdge's
/// `DeviceTwinResult`, an object), for the cloud: `device/<ns>/<name>/twin/edge_updated`.
pub fn twin_report(namespace: &str, name: &str, twin: Value) -> Value {
    json!({
        "header": {"msg_id": id(), "timestamp": now()},
        "route": {"source": "twin", "group": "resource", "operation": "update",
                  "resource": format!("device/{namespace}/{name}/twin/edge_updated")},
        "content": {"event_id": "", "timestamp": now(), "twin": twin},
    })
}

/// devicetwin's report of a device's state (KubeEdge's `DeviceMsg`, JSON
/// in a string): `device/<ns>/<name>/state/update`.
pub fn state_report(namespace: &str, name: &str, state: &str, last_online: &str) -> Value {
    let content = json!({"event_id": id(), "timestamp": now(),
                         "device": {"name": name, "state": state, "lastOnlineTime": last_online}});
    json!({
        "header": {"msg_id": id(), "timestamp": now()},
        "route": {"source": "twin", "group": "resource", "operation": "update",
                  "resource": format!("device/{namespace}/{name}/state/update")},
        "content": content.to_string(),
    })
}
