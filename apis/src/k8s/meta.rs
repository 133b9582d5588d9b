//! `meta/v1`: object metadata, list metadata, the `Status` an API error
//! is, and the envelopes a list and a watch event put objects in.

use std::collections::BTreeMap;

use serde::ser::SerializeStruct;
use serde::{Deserialize, Serialize, Serializer};
use serde_json::{Map, Value};

use super::{ApiVersion, KindName, ListableResource, Resource, Time, nullable};

/// The metadata every stored object carries: who it is (name, namespace, uid),
/// its labels and annotations, and its version and deletion state.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectMeta {
    /// Free-form key/value notes that people and tools attach to the object;
    /// nothing selects by them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotations: Option<BTreeMap<String, String>>,
    /// When the API server stored the object for the first time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub creation_timestamp: Option<Time>,
    /// How many seconds the object is given to shut down once its deletion was
    /// asked for; edged uses it as a deleted pod's grace period.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deletion_grace_period_seconds: Option<i64>,
    /// Set once deletion has been asked for: the time by which the object
    /// should be gone. edged tears down a pod that has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deletion_timestamp: Option<Time>,
    /// Names of the parties whose cleanup must finish before the server really
    /// removes the object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finalizers: Option<Vec<String>>,
    /// A prefix the server turns into a unique name, used only when `name` is
    /// empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generate_name: Option<String>,
    /// A counter the server bumps each time the desired state (the spec)
    /// changes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<i64>,
    /// Key/value tags by which selectors (services, controllers, ...) pick
    /// objects.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub labels: Option<BTreeMap<String, String>>,
    /// The object's name, which no other object of its kind has in the same
    /// namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The namespace the object lives in; unset for cluster-wide kinds such as
    /// `Node`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// The server's version of the object: an opaque string that changes
    /// whenever the object does, and that watches and conditional updates refer
    /// to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource_version: Option<String>,
    /// The id the server gave the object, never reused: it tells apart objects
    /// that had the same name at different times.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
    /// The fields edgehive does not model, kept as they came.
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

/// The metadata of a list (and of a `Status`): its version and where a paged
/// list goes on.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ListMeta {
    /// Set when a limit cut the list short: the token to ask for the next page
    /// with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub continue_: Option<String>,
    /// How many items are left after this page of a paged list, when the server
    /// can tell.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remaining_item_count: Option<i64>,
    /// The server's version of the list, from which a watch can start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource_version: Option<String>,
    /// Deprecated; the server no longer fills it in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub self_link: Option<String>,
}
/// The outcome of an API call that returns no object, e.g. an error.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Status {
    /// Always `v1`.
    #[serde(default)]
    pub api_version: ApiVersion<Status>,
    /// Always `Status`.
    #[serde(default)]
    pub kind: KindName<Status>,
    /// The HTTP status code, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<i32>,
    /// Extended data about the reason, as the server gives it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub details: Option<Value>,
    /// What happened, in words for people.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// List metadata (always written, usually empty).
    #[serde(default, deserialize_with = "nullable")]
    pub metadata: ListMeta,
    /// A machine-readable reason, e.g. `NotFound`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// `Failure` for an error, `Success` otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
}

impl Status {
    /// A failure's Status: its HTTP `code`, Kubernetes' `reason`
    /// (`NotFound`, `Conflict`, ...) and what went wrong.
    pub fn failure(code: u16, reason: &str, message: &str) -> Status {
        Status {
            code: Some(i32::from(code)),
            message: Some(message.to_owned()),
            reason: Some(reason.to_owned()),
            status: Some("Failure".to_owned()),
            ..Status::default()
        }
    }
}

impl Resource for Status {
    const API_VERSION: &'static str = "v1";
    const KIND: &'static str = "Status";
}

/// A list of objects of kind `T` (`PodList`, ...), written as
/// Kubernetes writes one: `apiVersion`, `kind`, `items`, `metadata`.
#[derive(Debug, Clone, PartialEq)]
pub struct List<T> {
    /// The objects.
    pub items: Vec<T>,
    /// Its resource version, and where a paged list continues.
    pub metadata: ListMeta,
}

impl<T> Default for List<T> {
    fn default() -> Self {
        List {
            items: Vec::new(),
            metadata: ListMeta::default(),
        }
    }
}

impl<T: ListableResource + Serialize> Serialize for List<T> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut state = serializer.serialize_struct("List", 4)?;
        state.serialize_field("apiVersion", T::API_VERSION)?;
        state.serialize_field("kind", T::LIST_KIND)?;
        state.serialize_field("items", &self.items)?;
        state.serialize_field("metadata", &self.metadata)?;
        state.end()
    }
}

/// One event of a watch: `{"type": ..., "object": ...}`.
#[derive(Debug, Clone, PartialEq)]
pub enum WatchEvent<T> {
    /// `ADDED`.
    Added(T),
    /// `MODIFIED`.
    Modified(T),
    /// `DELETED`.
    Deleted(T),
    /// `ERROR`, e.g. an expired watch (410).
    ErrorStatus(Status),
}

impl<T: Serialize> Serialize for WatchEvent<T> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut state = serializer.serialize_struct("WatchEvent", 2)?;
        match self {
            WatchEvent::Added(object) => {
                state.serialize_field("type", "ADDED")?;
                state.serialize_field("object", object)?;
            }
            WatchEvent::Modified(object) => {
                state.serialize_field("type", "MODIFIED")?;
                state.serialize_field("object", object)?;
            }
            WatchEvent::Deleted(object) => {
                state.serialize_field("type", "DELETED")?;
                state.serialize_field("object", object)?;
            }
            WatchEvent::ErrorStatus(status) => {
                state.serialize_field("type", "ERROR")?;
                state.serialize_field("object", status)?;
            }
        }
        state.end()
    }
}
