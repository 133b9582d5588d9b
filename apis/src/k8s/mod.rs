//! Kubernetes objects as edgehive reads them: the part of `core/v1` and
//! `meta/v1` that the edge (and the cloud's shared code) actually reads or
//! writes, as plain serde types, so that neither side needs k8s-openapi to
//! hold a pod.
//!
//! Every type reads and writes the JSON Kubernetes does, field for field:
//! the same names, the same field order (alphabetical, as k8s-openapi
//! writes it), an unset optional field left out, a required one always
//! written and defaulted when missing or `null`. So a modelled field
//! round-trips to the bytes k8s-openapi wrote (`tests` compares the two).
//!
//! What is not modelled is not dropped: each object type keeps the fields
//! it does not know in `rest`, and writes them back after its own. A pod
//! that edged reads and hands on (to its `/pods`, to the token code, to the
//! hash that recognises a container's spec) keeps every field the cloud
//! gave it, including fields of a newer Kubernetes.
//!
//! A top-level kind ([`Pod`], [`Node`], [`ConfigMap`], [`Secret`]) always
//! writes its `apiVersion` and `kind` and refuses to read another's, as
//! k8s-openapi's types do; see [`ApiVersion`] and [`KindName`].
//!
//! ```
//! use apis::k8s::Pod;
//!
//! let pod: Pod = serde_json::from_value(serde_json::json!({
//!     "apiVersion": "v1", "kind": "Pod",
//!     "metadata": {"name": "web", "namespace": "shop"},
//!     "spec": {"containers": [{"name": "c", "image": "nginx"}],
//!              "affinity": {"nodeAffinity": {}}},
//! }))
//! .expect("a pod");
//! assert_eq!(pod.metadata.name.as_deref(), Some("web"));
//! // Not modelled, but kept:
//! let spec = pod.spec.as_ref().expect("spec");
//! assert!(spec.rest.contains_key("affinity"));
//! ```

use std::fmt;
use std::marker::PhantomData;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

mod config;
mod meta;
mod node;
mod pod;
mod pod_status;
mod probe;
mod values;
mod volume;

#[cfg(test)]
mod tests;

pub use config::{ConfigMap, Object, Secret};
pub use meta::{List, ListMeta, ObjectMeta, Status, WatchEvent};
pub use node::{Node, NodeAddress, NodeCondition, NodeStatus, NodeSystemInfo};
pub use pod::{
    ConfigMapEnvSource, ConfigMapKeySelector, Container, ContainerPort, EnvFromSource, EnvVar,
    EnvVarSource, LocalObjectReference, Pod, PodSpec, ResourceRequirements, SecretEnvSource,
    SecretKeySelector, VolumeMount,
};
pub use pod_status::{
    ContainerState, ContainerStateRunning, ContainerStateTerminated, ContainerStateWaiting,
    ContainerStatus, PodCondition, PodStatus,
};
pub use probe::{ExecAction, GRPCAction, HTTPGetAction, HTTPHeader, Probe, TCPSocketAction};
pub use values::{IntOrString, Quantity, Time};
pub use volume::{
    ConfigMapProjection, ConfigMapVolumeSource, DownwardAPIProjection, DownwardAPIVolumeFile,
    DownwardAPIVolumeSource, EmptyDirVolumeSource, HostPathVolumeSource, KeyToPath,
    ObjectFieldSelector, ProjectedVolumeSource, ResourceFieldSelector, SecretProjection,
    SecretVolumeSource, ServiceAccountTokenProjection, Volume, VolumeProjection,
};

/// A top-level Kubernetes kind: what its `apiVersion` and `kind` are.
pub trait Resource {
    /// `apiVersion`, e.g. `v1`.
    const API_VERSION: &'static str;
    /// `kind`, e.g. `Pod`.
    const KIND: &'static str;
}

/// A kind that has lists.
pub trait ListableResource: Resource {
    /// The `kind` of its list, e.g. `PodList`.
    const LIST_KIND: &'static str;
}

/// Implements [`Resource`] and [`ListableResource`] for a core kind.
macro_rules! core_kind {
    ($t:ty, $kind:literal, $list:literal) => {
        impl $crate::k8s::Resource for $t {
            const API_VERSION: &'static str = "v1";
            const KIND: &'static str = $kind;
        }

        impl $crate::k8s::ListableResource for $t {
            const LIST_KIND: &'static str = $list;
        }
    };
}
use core_kind;

/// The `apiVersion` field of kind `K`: always written as
/// `K::API_VERSION`; reading another value is an error (a missing one is
/// fine), as with k8s-openapi.
pub struct ApiVersion<K>(PhantomData<fn() -> K>);

/// The `kind` field of kind `K`: always written as `K::KIND`; reading
/// another value is an error (a missing one is fine).
pub struct KindName<K>(PhantomData<fn() -> K>);

/// Implements the plumbing of a field that stands for a constant.
macro_rules! constant_field {
    ($t:ident, $value:ident, $what:literal) => {
        impl<K> Default for $t<K> {
            fn default() -> Self {
                $t(PhantomData)
            }
        }

        impl<K> Clone for $t<K> {
            fn clone(&self) -> Self {
                *self
            }
        }

        impl<K> Copy for $t<K> {}

        impl<K> PartialEq for $t<K> {
            fn eq(&self, _: &Self) -> bool {
                true
            }
        }

        impl<K: Resource> fmt::Debug for $t<K> {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(K::$value)
            }
        }

        impl<K: Resource> Serialize for $t<K> {
            fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.serialize_str(K::$value)
            }
        }

        impl<'de, K: Resource> Deserialize<'de> for $t<K> {
            fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                let given = String::deserialize(deserializer)?;
                if given != K::$value {
                    return Err(serde::de::Error::invalid_value(
                        serde::de::Unexpected::Str(&given),
                        &concat!("the ", $what, " of this kind"),
                    ));
                }
                Ok($t(PhantomData))
            }
        }
    };
}

constant_field!(ApiVersion, API_VERSION, "apiVersion");
constant_field!(KindName, KIND, "kind");

/// Reads a required field as k8s-openapi does: missing or `null` is the
/// type's default.
pub(crate) fn nullable<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(deserializer)?.unwrap_or_default())
}
