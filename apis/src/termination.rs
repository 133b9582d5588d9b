//! The edge's word that a pod being deleted has stopped there: what lets
//! the cloud finish a graceful deletion, as a kubelet's last delete (grace
//! 0, the pod's uid as precondition) lets the API server drop the object.
//!
//! edgehive's edge sends [`PodTerminated`] once every container of the
//! pod has stopped and its sandbox is removed (or the pod never started
//! there), in edgehive's own form ([`PodTerminated::message`]):
//!
//! | route | value |
//! | --- | --- |
//! | source | `edged` |
//! | group | `resource` |
//! | resource | `<namespace>/pod/<name>` |
//! | operation | `delete` |
//! | content | `{"uid": "<the pod's uid>"}` |
//!
//! A KubeEdge edgecore says the same with its kubelet's status manager
//! deleting the pod through the MetaClient: group `meta`, source `edged`,
//! resource `<namespace>/pod/<name>`, operation `delete`, content the
//! `DeleteOptions` `{"gracePeriodSeconds": 0, "preconditions": {"uid":
//! ...}}` (older edges: the uid as a bare string). hub's KubeEdge dialect
//! turns one form into the other ([`PodTerminated::from_delete_options`],
//! [`PodTerminated::delete_options`]), so the cloud's modules only ever
//! see this one.
//!
//! ```
//! use apis::termination::PodTerminated;
//!
//! let stopped = PodTerminated::new("default", "web", Some("u-1".to_owned()));
//! let msg = stopped.message("edged");
//! assert_eq!(msg.resource(), "default/pod/web");
//! assert_eq!(PodTerminated::of("default", "web", &msg), Some(stopped));
//! ```

use beehive::constants::{group, operation, resource_type};
use beehive::{Content, IntoRouteName, Message};
use serde::{Deserialize, Serialize};

/// A pod's containers stopped and its sandbox is gone at the sending node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodTerminated {
    /// The pod's namespace.
    pub namespace: String,
    /// The pod's name.
    pub name: String,
    /// The pod's uid, so a new pod of the same name is never taken for it
    /// (`None`: the edge did not know it; the cloud then finishes the
    /// deletion of whichever pod of that name its node was deleting).
    pub uid: Option<String>,
}

/// The content of edgehive's form.
#[derive(Debug, Default, Serialize, Deserialize)]
struct Terminated {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    uid: Option<String>,
}

/// A kubelet's `DeleteOptions` as a KubeEdge edge sends them: grace 0 and
/// the pod's uid as precondition.
#[derive(Debug, Default, Serialize, Deserialize)]
struct DeleteOptions {
    #[serde(rename = "gracePeriodSeconds", default)]
    grace_period_seconds: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    preconditions: Option<Preconditions>,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct Preconditions {
    #[serde(default)]
    uid: Option<String>,
}

impl PodTerminated {
    /// The word for pod `namespace/name` of `uid`.
    pub fn new(namespace: impl Into<String>, name: impl Into<String>, uid: Option<String>) -> Self {
        PodTerminated {
            namespace: namespace.into(),
            name: name.into(),
            uid,
        }
    }

    /// Its resource at the edge: `<namespace>/pod/<name>`.
    pub fn resource(&self) -> String {
        format!("{}/{}/{}", self.namespace, resource_type::POD, self.name)
    }

    /// edgehive's form, sent by `source` (edged) up through edgehub.
    pub fn message(&self, source: impl IntoRouteName) -> Message {
        let body = Terminated {
            uid: self.uid.clone(),
        };
        Message::new()
            .build_router(source, group::RESOURCE, self.resource(), operation::DELETE)
            .with_content(Content::of(&body).expect("an optional string encodes"))
    }

    /// The word `msg` carries for pod `namespace/name` (its resource, as
    /// the receiver parsed it), if it is one: a `delete` of a pod in
    /// edgehive's form.
    pub fn of(namespace: &str, name: &str, msg: &Message) -> Option<PodTerminated> {
        if msg.operation() != operation::DELETE {
            return None;
        }
        let body = match msg.content() {
            Content::Empty => Terminated::default(),
            other => other.decode::<Terminated>().ok()?,
        };
        Some(PodTerminated::new(namespace, name, body.uid))
    }

    /// The content of a KubeEdge edge's delete: its kubelet's
    /// `DeleteOptions` (grace 0, the uid as precondition).
    pub fn delete_options(&self) -> Content {
        let options = DeleteOptions {
            grace_period_seconds: Some(0),
            preconditions: self.uid.clone().map(|uid| Preconditions { uid: Some(uid) }),
        };
        Content::of(&options).expect("a number and an optional string encode")
    }

    /// The uid a KubeEdge edge's delete names: the `DeleteOptions`'
    /// precondition (also as JSON text), or an older edge's bare uid.
    /// `Err` when the content is neither.
    pub fn uid_of_delete_options(content: &Content) -> Result<Option<String>, String> {
        let unreadable = || "a pod's delete carries DeleteOptions with a string uid".to_owned();
        let options = match content {
            Content::Empty => return Ok(None),
            Content::Text(text) => match serde_json::from_str::<serde_json::Value>(text) {
                Ok(options @ serde_json::Value::Object(_)) => {
                    DeleteOptions::deserialize(options).map_err(|_| unreadable())?
                }
                // An older edge: the uid alone.
                _ if !text.is_empty() => return Ok(Some(text.clone())),
                _ => return Ok(None),
            },
            Content::Document(document) if document.is_map() => document
                .decode::<DeleteOptions>()
                .map_err(|_| unreadable())?,
            Content::Document(_) => return Err(unreadable()),
        };
        Ok(options
            .preconditions
            .and_then(|preconditions| preconditions.uid))
    }

    /// The word a KubeEdge edge's delete of pod `namespace/name` with
    /// `content` (its `DeleteOptions`) stands for.
    pub fn from_delete_options(
        namespace: &str,
        name: &str,
        content: &Content,
    ) -> Result<PodTerminated, String> {
        Ok(PodTerminated::new(
            namespace,
            name,
            Self::uid_of_delete_options(content)?,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn doc(value: Value) -> Content {
        Content::of(&value).expect("encodable")
    }

    #[test]
    fn edgehives_form_round_trips() {
        let stopped = PodTerminated::new("ns", "web", Some("u-1".to_owned()));
        let msg = stopped.message("edged");
        assert_eq!(msg.group(), "resource");
        assert_eq!(msg.operation(), "delete");
        assert_eq!(
            msg.body::<serde_json::Value>().expect("json body"),
            json!({"uid": "u-1"})
        );
        assert_eq!(PodTerminated::of("ns", "web", &msg), Some(stopped));
        let unknown = PodTerminated::new("ns", "web", None);
        assert_eq!(
            PodTerminated::of("ns", "web", &unknown.message("edged")),
            Some(unknown)
        );
        let status = Message::new().build_router("edged", "resource", "ns/pod/web", "update");
        assert_eq!(PodTerminated::of("ns", "web", &status), None);
    }

    #[test]
    fn kubeedges_delete_options_name_the_uid() {
        let kubelet = json!({"gracePeriodSeconds": 0, "preconditions": {"uid": "u-1"}});
        let stopped =
            PodTerminated::from_delete_options("ns", "web", &doc(kubelet.clone())).expect("reads");
        assert_eq!(stopped.uid.as_deref(), Some("u-1"));
        assert_eq!(
            stopped.delete_options().decode::<Value>().expect("json"),
            kubelet
        );
        // As JSON text, and an older edge's bare uid.
        let text = Content::text(kubelet.to_string());
        assert_eq!(
            PodTerminated::uid_of_delete_options(&text),
            Ok(Some("u-1".to_owned()))
        );
        assert_eq!(
            PodTerminated::uid_of_delete_options(&Content::text("u-2")),
            Ok(Some("u-2".to_owned()))
        );
        assert_eq!(
            PodTerminated::uid_of_delete_options(&doc(json!({"gracePeriodSeconds": 0}))),
            Ok(None)
        );
        assert!(PodTerminated::uid_of_delete_options(&doc(json!([1]))).is_err());
        assert!(
            PodTerminated::uid_of_delete_options(&doc(json!({"preconditions": {"uid": 7}})))
                .is_err()
        );
    }
}
