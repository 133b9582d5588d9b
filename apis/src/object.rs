//! [`Object`]: one Kubernetes object as the cloud's modules hand it to each
//! other, its identity typed and read once.
//!
//! Every kind edgehive carries passes through the same seams (the desired
//! state's reads, writes and watch events, the controller's applies, the
//! reconciler's sends), so the object there is dynamic, as kube-rs's
//! `DynamicObject` is: what every reader needs (its [`ObjectKey`], its
//! revision, its uid and node) is a typed field or accessor, and the rest
//! is the body, read through [`Object::json`] or decoded into the kind's
//! own type with [`Object::decode`]. An `Object` always names a known kind
//! and has a name: a body that does not is refused when it is made, once,
//! not at every reader.
//!
//! The body stays private, so how it is held may change without touching
//! the seams; [`Object::edit`] is the one way to change it, and keeps the
//! key and revision in step.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::kinds::{InvalidObject, Kind, ObjectKey};

/// A Kubernetes object of a [`Kind`] edgehive carries: its key and revision,
/// and its body.
#[derive(Debug, Clone, PartialEq)]
pub struct Object {
    key: ObjectKey,
    revision: u64,
    body: Value,
}

impl Object {
    /// `body` as an object: it must name a known `kind` and have a
    /// `metadata.name` (a namespaced kind's missing namespace is `default`,
    /// as an API server reads it).
    pub fn new(body: Value) -> Result<Object, InvalidObject> {
        let key = ObjectKey::of(&body).ok_or_else(|| InvalidObject {
            kind: body
                .get("kind")
                .and_then(Value::as_str)
                .and_then(Kind::from_name)
                .map_or("object", Kind::name),
            reason: "no known kind and metadata.name".to_owned(),
        })?;
        Ok(Object {
            revision: revision_of(&body),
            key,
            body,
        })
    }

    /// `body` as an object of `kind`, its `apiVersion` and `kind` filled in
    /// (an API server's list items come without them).
    pub fn of_kind(kind: Kind, mut body: Value) -> Result<Object, InvalidObject> {
        match body.as_object_mut() {
            Some(fields) => {
                fields.insert("apiVersion".to_owned(), kind.api_version().into());
                fields.insert("kind".to_owned(), kind.name().into());
            }
            None => {
                return Err(InvalidObject {
                    kind: kind.name(),
                    reason: "not a JSON object".to_owned(),
                });
            }
        }
        Object::new(body)
    }

    /// A minimal object naming `key` and nothing else: a withdrawal's or a
    /// deletion's, when the object itself is gone.
    pub fn stub(key: &ObjectKey) -> Object {
        let mut metadata = serde_json::Map::new();
        metadata.insert("name".to_owned(), key.name.clone().into());
        if key.kind.namespaced() {
            metadata.insert("namespace".to_owned(), key.namespace.clone().into());
        }
        Object {
            key: key.clone(),
            revision: 0,
            body: serde_json::json!({
                "apiVersion": key.kind.api_version(),
                "kind": key.kind.name(),
                "metadata": metadata,
            }),
        }
    }

    /// Which object this is.
    pub fn key(&self) -> &ObjectKey {
        &self.key
    }

    /// Its kind.
    pub fn kind(&self) -> Kind {
        self.key.kind
    }

    /// Its revision: `metadata.resourceVersion` as a number (0 if it has
    /// none, as an object not yet stored).
    pub fn revision(&self) -> u64 {
        self.revision
    }

    /// Its `metadata.uid`, once stored.
    pub fn uid(&self) -> Option<&str> {
        self.body.pointer("/metadata/uid").and_then(Value::as_str)
    }

    /// The node it is bound to (a pod's or device's `spec.nodeName`), if
    /// any.
    pub fn node_name(&self) -> Option<&str> {
        self.body
            .pointer("/spec/nodeName")
            .and_then(Value::as_str)
            .filter(|name| !name.is_empty())
    }

    /// Whether its deletion has been asked for
    /// (`metadata.deletionTimestamp` is set) and it waits for its node.
    pub fn is_terminating(&self) -> bool {
        self.body
            .pointer("/metadata/deletionTimestamp")
            .is_some_and(|t| !t.is_null())
    }

    /// The body, to read fields the accessors above do not give.
    pub fn json(&self) -> &Value {
        &self.body
    }

    /// The body, given up (for a wire codec or a client library).
    pub fn into_json(self) -> Value {
        self.body
    }

    /// The object as a message's content (its body, encoded once).
    pub fn content(&self) -> beehive::Content {
        crate::kinds::object_content(&self.body)
    }

    /// The body read as `T`: the kind's own type where a module works with
    /// it (a pod's spec, a device's twins).
    pub fn decode<T: DeserializeOwned>(&self) -> Result<T, InvalidObject> {
        T::deserialize(&self.body).map_err(|err| InvalidObject {
            kind: self.key.kind.name(),
            reason: err.to_string(),
        })
    }

    /// Changes the body with `change`, and reads the revision again. What
    /// names the object (`kind`, `metadata.name`, `metadata.namespace`)
    /// cannot change: where `change` altered it, the key's is written back.
    pub fn edit<R>(&mut self, change: impl FnOnce(&mut Value) -> R) -> R {
        let result = change(&mut self.body);
        if ObjectKey::of(&self.body).as_ref() != Some(&self.key) {
            self.write_key_back();
        }
        self.revision = revision_of(&self.body);
        result
    }

    /// Sets `metadata.resourceVersion`; 0 removes it (a write of the
    /// object is then unconditional, a create takes it as new).
    pub fn set_revision(&mut self, revision: u64) {
        self.edit(|body| match revision {
            0 => {
                if let Some(metadata) = body.get_mut("metadata").and_then(Value::as_object_mut) {
                    metadata.remove("resourceVersion");
                }
            }
            revision => set_metadata(body, "resourceVersion", revision.to_string().into()),
        });
    }

    fn write_key_back(&mut self) {
        let key = self.key.clone();
        if !self.body.is_object() {
            self.body = Value::Object(serde_json::Map::new());
        }
        self.body["kind"] = key.kind.name().into();
        self.body["apiVersion"] = key.kind.api_version().into();
        set_metadata(&mut self.body, "name", key.name.into());
        if key.kind.namespaced() {
            set_metadata(&mut self.body, "namespace", key.namespace.into());
        }
    }
}

fn set_metadata(body: &mut Value, field: &str, value: Value) {
    if !body.get("metadata").is_some_and(Value::is_object) {
        body["metadata"] = Value::Object(serde_json::Map::new());
    }
    body["metadata"][field] = value;
}

/// The revision of a body: its `metadata.resourceVersion` as a number (0 if
/// it has none).
pub fn revision_of(body: &Value) -> u64 {
    body.pointer("/metadata/resourceVersion")
        .and_then(Value::as_str)
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// `object["spec"]` reads the body's field, as on a `serde_json::Value`
/// (`null` where there is none); changes go through [`Object::edit`].
impl std::ops::Index<&str> for Object {
    type Output = Value;

    fn index(&self, field: &str) -> &Value {
        &self.body[field]
    }
}

/// The body as JSON text.
impl std::fmt::Display for Object {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.body.fmt(f)
    }
}

impl TryFrom<Value> for Object {
    type Error = InvalidObject;

    fn try_from(body: Value) -> Result<Object, InvalidObject> {
        Object::new(body)
    }
}

impl From<Object> for Value {
    fn from(object: Object) -> Value {
        object.body
    }
}

impl Serialize for Object {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.body.serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for Object {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Object, D::Error> {
        Object::new(Value::deserialize(deserializer)?).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod() -> Value {
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "namespace": "ns", "resourceVersion": "42", "uid": "u-1"},
            "spec": {"nodeName": "edge-1", "containers": [{"name": "c", "image": "busybox"}]},
        })
    }

    #[test]
    fn identity_is_read_once_from_the_body() {
        let object = Object::new(pod()).expect("a pod");
        assert_eq!(object.key(), &ObjectKey::new(Kind::Pod, "ns", "p"));
        assert_eq!(object.kind(), Kind::Pod);
        assert_eq!(object.revision(), 42);
        assert_eq!(object.uid(), Some("u-1"));
        assert_eq!(object.node_name(), Some("edge-1"));
        assert_eq!(object["spec"]["containers"][0]["image"], "busybox");
        assert!(object["status"].is_null());
        assert!(!object.is_terminating());
        assert_eq!(object.clone().into_json(), pod());
    }

    #[test]
    fn a_body_without_a_known_kind_or_name_is_refused() {
        assert!(Object::new(json!({"kind": "Pod", "metadata": {}})).is_err());
        assert!(Object::new(json!({"kind": "Widget", "metadata": {"name": "w"}})).is_err());
        assert!(Object::new(json!("text")).is_err());
        assert!(Object::of_kind(Kind::Pod, json!([1])).is_err());
        let listed = Object::of_kind(Kind::ConfigMap, json!({"metadata": {"name": "c"}}))
            .expect("a list item");
        assert_eq!(listed.json()["apiVersion"], "v1");
        assert_eq!(
            listed.key(),
            &ObjectKey::new(Kind::ConfigMap, "default", "c")
        );
    }

    #[test]
    fn an_edit_keeps_the_key_and_reads_the_revision_again() {
        let mut object = Object::new(pod()).expect("a pod");
        object.edit(|body| {
            body["metadata"]["resourceVersion"] = json!("43");
            body["metadata"]["name"] = json!("renamed");
            body["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
        });
        assert_eq!(object.revision(), 43);
        assert_eq!(object.json()["metadata"]["name"], "p");
        assert!(object.is_terminating());
        object.edit(|body| *body = json!(null));
        assert_eq!(object.key(), &ObjectKey::new(Kind::Pod, "ns", "p"));
        assert_eq!(object.revision(), 0);
        object.set_revision(7);
        assert_eq!(object.json()["metadata"]["resourceVersion"], "7");
        assert_eq!(object.revision(), 7);
        object.set_revision(0);
        assert!(object.json()["metadata"].get("resourceVersion").is_none());
        assert_eq!(object.revision(), 0);
    }

    #[test]
    fn a_stub_names_its_key_only() {
        let key = ObjectKey::new(Kind::Node, "", "edge-1");
        let stub = Object::stub(&key);
        assert_eq!(stub.key(), &key);
        assert_eq!(
            stub.json(),
            &json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "edge-1"}})
        );
        assert_eq!(Object::new(stub.json().clone()).expect("stub"), stub);
        let key = ObjectKey::new(Kind::ConfigMap, "ns", "c");
        assert_eq!(
            Object::stub(&key).json()["metadata"],
            json!({"name": "c", "namespace": "ns"})
        );
    }

    #[test]
    fn it_serializes_as_its_body_and_is_checked_when_read() {
        let object = Object::new(pod()).expect("a pod");
        let text = serde_json::to_string(&object).expect("serialize");
        assert_eq!(serde_json::from_str::<Value>(&text).expect("JSON"), pod());
        assert_eq!(
            serde_json::from_str::<Object>(&text).expect("object"),
            object
        );
        assert!(serde_json::from_value::<Object>(json!({"kind": "Pod"})).is_err());
    }
}
