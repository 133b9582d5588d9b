//! What a KubeEdge edge sends up, and the answers it waits for.
//!
//! A KubeEdge edge (edged is a kubelet there) registers its Node with an
//! insert, reports node and pod status as patches (`nodepatch`,
//! `podpatch`: a strategic merge patch as JSON text), keeps a node lease,
//! and asks for configmaps and secrets. Each write is answered with
//! `{"Object": <the stored object>, "Err": null}`, or `Err` holding a
//! Kubernetes Status (`{"ErrStatus": {...}}`); older edges send
//! `nodestatus` / `podstatus` updates wrapped in `{"UID", "Name",
//! "Status"}` and get `"OK"`.

use apis::k8s::Status;
use beehive::Content;
use serde::Serialize;
use serde_json::Value;

/// The answer to a write: the object as stored.
pub fn object_answer(object: Value) -> Content {
    WriteAnswer {
        object: Some(object),
        err: None,
    }
    .content()
}

/// KubeEdge's answer to a node's write, as its edge reads it.
#[derive(Serialize)]
struct WriteAnswer {
    /// The object as stored, or `null`.
    #[serde(rename = "Object")]
    object: Option<Value>,
    /// Why not, or `null`.
    #[serde(rename = "Err")]
    err: Option<StatusError>,
}

/// A Go `StatusError`: the Kubernetes Status under `ErrStatus`.
#[derive(Serialize)]
struct StatusError {
    #[serde(rename = "ErrStatus")]
    err_status: Status,
}

impl WriteAnswer {
    fn content(&self) -> Content {
        Content::of(self).expect("an object and a Status encode")
    }
}

/// Why a node's write was refused, as a Kubernetes Status says it (so a
/// kubelet's `IsNotFound`, `IsConflict` and the like work).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// HTTP status code.
    pub code: u16,
    /// Kubernetes' reason (`NotFound`, `Conflict`, ...).
    pub reason: &'static str,
    /// What went wrong.
    pub message: String,
}

impl Refusal {
    /// 400: unreadable.
    pub fn bad_request(message: impl Into<String>) -> Refusal {
        Refusal::new(400, "BadRequest", message)
    }

    /// 403: not this node's to change.
    pub fn forbidden(message: impl Into<String>) -> Refusal {
        Refusal::new(403, "Forbidden", message)
    }

    /// 404: no such object.
    pub fn not_found(message: impl Into<String>) -> Refusal {
        Refusal::new(404, "NotFound", message)
    }

    /// 409: meant for another incarnation of the object.
    pub fn conflict(message: impl Into<String>) -> Refusal {
        Refusal::new(409, "Conflict", message)
    }

    /// 422: well-formed but not valid.
    pub fn invalid(message: impl Into<String>) -> Refusal {
        Refusal::new(422, "Invalid", message)
    }

    /// 500: the cloud failed.
    pub fn internal(message: impl Into<String>) -> Refusal {
        Refusal::new(500, "InternalError", message)
    }

    fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Refusal {
        Refusal {
            code,
            reason,
            message: message.into(),
        }
    }

    /// The answer a KubeEdge edge expects for it.
    pub fn answer(&self) -> Content {
        WriteAnswer {
            object: None,
            err: Some(self.status_error()),
        }
        .content()
    }

    /// It as a Go `StatusError`.
    fn status_error(&self) -> StatusError {
        StatusError {
            err_status: Status::failure(self.code, self.reason, &self.message),
        }
    }
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// The answer KubeEdge's cloud gives a request it refuses outside a write
/// (a kubelet's delete of its pod): the Kubernetes Status error itself.
pub fn status_error(refusal: &Refusal) -> Content {
    Content::of(&refusal.status_error()).expect("a Status encodes")
}

/// The patch a KubeEdge edge sent: JSON text in a string (a Go byte slice
/// arrives already decoded), or a JSON object.
pub fn patch_of(content: &Content) -> Result<Value, String> {
    let patch: Value = match content {
        Content::Text(text) => {
            serde_json::from_str(text).map_err(|err| format!("the patch is not JSON: {err}"))?
        }
        other => other.decode().map_err(|err| err.to_string())?,
    };
    if patch.is_object() {
        Ok(patch)
    } else {
        Err("a patch is a JSON object".to_owned())
    }
}

/// The status a status report carries: KubeEdge's older edges wrap it
/// (`{"UID", "Name", "Status"}`), edgehive's send it bare.
pub fn status_of(content: &Content) -> Value {
    let mut content: Value = content.decode().unwrap_or(Value::Null);
    let wrapped = content.get("UID").is_some() || content.get("Name").is_some();
    match content.get_mut("Status") {
        Some(status) if wrapped => status.take(),
        _ => content,
    }
}

/// The uid a patch requires of its object (a kubelet names the pod it
/// means, so a patch for a pod since re-created is refused).
pub fn required_uid(patch: &Value) -> Option<&str> {
    patch.pointer("/metadata/uid").and_then(Value::as_str)
}

/// Applies a strategic merge patch to `target`, as far as node and pod
/// status need: objects merge field by field, `null` deletes, lists of
/// objects Kubernetes merges by a key (conditions and addresses by `type`,
/// pod and host IPs by `ip`) merge item by
/// item (`$patch: delete` removes one), other lists (container statuses
/// among them, which Kubernetes keeps atomic) are replaced, `$patch:
/// replace` replaces a map, and order and retain-keys directives are
/// ignored.
pub fn strategic_merge(target: &mut Value, patch: &Value) {
    let Value::Object(fields) = patch else {
        *target = patch.clone();
        return;
    };
    if fields.get("$patch").and_then(Value::as_str) == Some("replace") {
        *target = Value::Object(Default::default());
    }
    if !target.is_object() {
        *target = Value::Object(Default::default());
    }
    let Value::Object(object) = target else {
        return;
    };
    for (name, value) in fields {
        if name.starts_with('$') {
            continue;
        }
        match (value, merge_key(name)) {
            (Value::Null, _) => {
                object.remove(name);
            }
            (Value::Array(items), Some(key)) => {
                merge_list(
                    object.entry(name.clone()).or_insert(Value::Null),
                    items,
                    key,
                );
            }
            (Value::Object(_), _) => {
                strategic_merge(object.entry(name.clone()).or_insert(Value::Null), value);
            }
            (other, _) => {
                object.insert(name.clone(), other.clone());
            }
        }
    }
}

/// The key Kubernetes merges a list field's items by.
fn merge_key(field: &str) -> Option<&'static str> {
    match field {
        "conditions" | "addresses" => Some("type"),
        "resourceClaimStatuses" => Some("name"),
        "podIPs" | "hostIPs" => Some("ip"),
        _ => None,
    }
}

fn merge_list(target: &mut Value, items: &[Value], key: &str) {
    if !target.is_array() {
        *target = Value::Array(Vec::new());
    }
    let Value::Array(list) = target else {
        return;
    };
    for item in items {
        let id = item.get(key);
        let position = id.and_then(|id| list.iter().position(|held| held.get(key) == Some(id)));
        if item.get("$patch").and_then(Value::as_str) == Some("delete") {
            if let Some(position) = position {
                list.remove(position);
            }
            continue;
        }
        match position {
            Some(position) => strategic_merge(&mut list[position], item),
            None => {
                let mut added = Value::Null;
                strategic_merge(&mut added, item);
                list.push(added);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use apis::kinds::object_content;
    use serde_json::json;

    #[test]
    fn a_kubelet_status_patch_merges_conditions_by_type() {
        let mut status = json!({
            "phase": "Pending",
            "conditions": [
                {"type": "Ready", "status": "False"},
                {"type": "PodScheduled", "status": "True"}
            ],
            "podIP": "10.0.0.9"
        });
        let patch = patch_of(&Content::text(
            r#"{"metadata":{"uid":"u-1"},"status":{"$setElementOrder/conditions":[{"type":"Ready"},{"type":"PodScheduled"}],
                "conditions":[{"type":"Ready","status":"True"}],"phase":"Running","podIP":null,
                "containerStatuses":[{"name":"main","ready":true,"state":{"running":{}}}]}}"#,
        ))
        .expect("patch");
        assert_eq!(required_uid(&patch), Some("u-1"));
        strategic_merge(&mut status, &patch["status"]);
        assert_eq!(
            status,
            json!({
                "phase": "Running",
                "conditions": [
                    {"type": "Ready", "status": "True"},
                    {"type": "PodScheduled", "status": "True"}
                ],
                "containerStatuses": [{"name": "main", "ready": true, "state": {"running": {}}}]
            })
        );
        // Container statuses are atomic: a new state replaces the old one.
        strategic_merge(
            &mut status,
            &json!({"containerStatuses": [{"name": "main", "ready": false,
                                           "state": {"waiting": {"reason": "CrashLoopBackOff"}}}]}),
        );
        assert_eq!(
            status["containerStatuses"],
            json!([{"name": "main", "ready": false, "state": {"waiting": {"reason": "CrashLoopBackOff"}}}])
        );
        strategic_merge(
            &mut status,
            &json!({"conditions": [{"type": "PodScheduled", "$patch": "delete"}]}),
        );
        assert_eq!(status["conditions"].as_array().map(Vec::len), Some(1));
        // A whole status replaced, as edgehive's edge sends it.
        strategic_merge(
            &mut status,
            &json!({"$patch": "replace", "phase": "Succeeded"}),
        );
        assert_eq!(status, json!({"phase": "Succeeded"}));
    }

    #[test]
    fn lists_without_a_merge_key_are_replaced() {
        let mut status = json!({"images": [{"names": ["a"]}, {"names": ["b"]}]});
        strategic_merge(&mut status, &json!({"images": [{"names": ["c"]}]}));
        assert_eq!(status, json!({"images": [{"names": ["c"]}]}));
    }

    #[test]
    fn wrapped_and_bare_statuses_read_alike() {
        let bare = object_content(&json!({"phase": "Running"}));
        let wrapped =
            object_content(&json!({"UID": "u-1", "Name": "web", "Status": {"phase": "Running"}}));
        assert_eq!(status_of(&bare), status_of(&wrapped));
        assert_eq!(status_of(&bare), json!({"phase": "Running"}));
        assert!(patch_of(&Content::text("[1]")).is_err());
        assert!(patch_of(&Content::text("{not json")).is_err());
        let answer = Refusal::not_found("gone")
            .answer()
            .decode::<Value>()
            .expect("json");
        assert_eq!(
            answer,
            json!({"Object": null, "Err": {"ErrStatus": {
                "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": "gone", "reason": "NotFound", "code": 404}}})
        );
        let stored = object_answer(json!({"kind": "Node"}))
            .decode::<Value>()
            .expect("json");
        assert_eq!(stored, json!({"Object": {"kind": "Node"}, "Err": null}));
    }
}
