//! `meta/v1`: object metadata, list metadata, the `Status` an API error
//! is, and the envelopes a list and a watch event put objects in.

use std::collections::BTreeMap;

use serde::ser::SerializeStruct;
use serde::{Deserialize, Serialize, Serializer};
use serde_json::{Map, Value};

use super::{ApiVersion, KindName, ListableResource, Resource, Time, nullable};

/// ObjectMeta is metadata that all persisted resources must have, which
/// includes all objects users must create.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectMeta {
    /// Annotations is an unstructured key value map stored with a resource that
    /// may be set by external tools to store and retrieve arbitrary metadata.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotations: Option<BTreeMap<String, String>>,
    /// CreationTimestamp is a timestamp representing the server time when this
    /// object was created.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub creation_timestamp: Option<Time>,
    /// Number of seconds allowed for this object to gracefully terminate before
    /// it will be removed from the system.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deletion_grace_period_seconds: Option<i64>,
    /// DeletionTimestamp is RFC 3339 date and time at which this resource will
    /// be deleted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deletion_timestamp: Option<Time>,
    /// Must be empty before the object is deleted from the registry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finalizers: Option<Vec<String>>,
    /// GenerateName is an optional prefix, used by the server, to generate a
    /// unique name ONLY IF the Name field has not been provided.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generate_name: Option<String>,
    /// A sequence number representing a specific generation of the desired
    /// state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<i64>,
    /// Map of string keys and values that can be used to organize and
    /// categorize (scope and select) objects.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub labels: Option<BTreeMap<String, String>>,
    /// Name must be unique within a namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Namespace defines the space within which each name must be unique.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// An opaque value that represents the internal version of this object that
    /// can be used by clients to determine when objects have changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource_version: Option<String>,
    /// UID is the unique in time and space value for this object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
    /// The fields edgehive does not model, kept as they came.
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

/// ListMeta describes metadata that synthetic resources must have, including
/// lists and various status objects.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ListMeta {
    /// continue may be set if the user set a limit on the number of items
    /// returned, and indicates that the server has more data available.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub continue_: Option<String>,
    /// remainingItemCount is the number of subsequent items in the list which
    /// are not included in this list response.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remaining_item_count: Option<i64>,
    /// String that identifies the server's internal version of this object that
    /// can be used by clients to determine when objects have changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource_version: Option<String>,
    /// Deprecated: selfLink is a legacy read-only field that is no longer
    /// populated by the system.
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
    /// A human-readable description of the status.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// List metadata (always written, usually empty).
    #[serde(default, deserialize_with = "nullable")]
    pub metadata: ListMeta,
    /// A machine-readable reason, e.g. `NotFound`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// `Success` or `Failure`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
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
