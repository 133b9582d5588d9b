//! `core/v1` pod volumes edged provides: emptyDir, hostPath, configMap,
//! secret, downward API and projected (with service account tokens). Other
//! sources are kept, unread, in [`Volume::rest`].

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::{Quantity, nullable};

/// A named volume of a pod, which its containers can mount; one source is set.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Volume {
    /// Files made from the keys of a ConfigMap.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_map: Option<ConfigMapVolumeSource>,
    /// Files holding facts about the pod (name, labels, annotations, ...).
    #[serde(
        rename = "downwardAPI",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub downward_api: Option<DownwardAPIVolumeSource>,
    /// An empty directory made for the pod and removed with it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub empty_dir: Option<EmptyDirVolumeSource>,
    /// A file or directory of the node itself, handed through to the
    /// containers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_path: Option<HostPathVolumeSource>,
    /// The volume's name, by which mounts refer to it.
    #[serde(default, deserialize_with = "nullable")]
    pub name: String,
    /// Several sources (ConfigMaps, secrets, pod facts, tokens) in one
    /// directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub projected: Option<ProjectedVolumeSource>,
    /// Files made from the keys of a secret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<SecretVolumeSource>,
    /// The fields edgehive does not model, kept as they came.
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

/// A volume of files made from a ConfigMap's keys.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ConfigMapVolumeSource {
    /// Permission bits for the files (0644 if unset), unless an item sets its
    /// own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_mode: Option<i32>,
    /// Which keys become which files; every key, as a file of its name, if
    /// unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub items: Option<Vec<KeyToPath>>,
    /// The ConfigMap's name.
    #[serde(default, deserialize_with = "nullable")]
    pub name: String,
    /// If true, a missing ConfigMap or key is not an error.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub optional: Option<bool>,
    /// The fields edgehive does not model, kept as they came.
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

/// A volume of files made from a secret's keys.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SecretVolumeSource {
    /// Permission bits for the files (0644 if unset), unless an item sets its
    /// own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_mode: Option<i32>,
    /// Which keys become which files; every key, as a file of its name, if
    /// unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub items: Option<Vec<KeyToPath>>,
    /// If true, a missing secret or key is not an error.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub optional: Option<bool>,
    /// The secret's name, in the pod's namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_name: Option<String>,
    /// The fields edgehive does not model, kept as they came.
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

/// An empty directory that lives as long as the pod.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EmptyDirVolumeSource {
    /// What holds the directory: `""` (the default) for the node's disk,
    /// `Memory` for a tmpfs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub medium: Option<String>,
    /// The most local storage the directory may take up.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size_limit: Option<Quantity>,
    /// The fields edgehive does not model, kept as they came.
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

/// A path on the node, mounted into the pod.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HostPathVolumeSource {
    /// The path on the node.
    #[serde(default, deserialize_with = "nullable")]
    pub path: String,
    /// The type of the host path (`Directory`, `DirectoryOrCreate`, ...); `""`
    /// if unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub type_: Option<String>,
    /// The fields edgehive does not model, kept as they came.
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

/// A volume that puts several sources together in one directory.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProjectedVolumeSource {
    /// Permission bits for the files (0644 if unset), unless an item sets its
    /// own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_mode: Option<i32>,
    /// The sources, each written into the directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sources: Option<Vec<VolumeProjection>>,
    /// The fields edgehive does not model, kept as they came.
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

/// One source of a projected volume; one field is set.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VolumeProjection {
    /// Keys of a ConfigMap.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_map: Option<ConfigMapProjection>,
    /// Facts about the pod.
    #[serde(
        rename = "downwardAPI",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub downward_api: Option<DownwardAPIProjection>,
    /// Keys of a secret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<SecretProjection>,
    /// A token for the pod's service account, as the cloud issued it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_account_token: Option<ServiceAccountTokenProjection>,
    /// The fields edgehive does not model, kept as they came.
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

/// ConfigMap keys as files of a projected volume.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ConfigMapProjection {
    /// Which keys become which files; every key, as a file of its name, if
    /// unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub items: Option<Vec<KeyToPath>>,
    /// The ConfigMap's name.
    #[serde(default, deserialize_with = "nullable")]
    pub name: String,
    /// If true, a missing ConfigMap or key is not an error.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub optional: Option<bool>,
    /// The fields edgehive does not model, kept as they came.
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

/// Secret keys as files of a projected volume.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SecretProjection {
    /// Which keys become which files; every key, as a file of its name, if
    /// unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub items: Option<Vec<KeyToPath>>,
    /// The secret's name.
    #[serde(default, deserialize_with = "nullable")]
    pub name: String,
    /// If true, a missing secret or key is not an error.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub optional: Option<bool>,
    /// The fields edgehive does not model, kept as they came.
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

/// Facts about the pod as files of a projected volume.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DownwardAPIProjection {
    /// The files, and what each one holds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub items: Option<Vec<DownwardAPIVolumeFile>>,
    /// The fields edgehive does not model, kept as they came.
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

/// A volume of files holding facts about the pod.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DownwardAPIVolumeSource {
    /// Permission bits for the files (0644 if unset), unless an item sets its
    /// own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_mode: Option<i32>,
    /// The files, and what each one holds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub items: Option<Vec<DownwardAPIVolumeFile>>,
    /// The fields edgehive does not model, kept as they came.
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

/// One file of a downward API volume, and the fact it holds.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DownwardAPIVolumeFile {
    /// The pod field to write: `metadata.name`, `metadata.namespace`,
    /// `metadata.uid`, `metadata.labels` or `metadata.annotations` (or one
    /// label or annotation).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field_ref: Option<ObjectFieldSelector>,
    /// Permission bits for this file (0 to 0777); the volume's default if
    /// unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<i32>,
    /// The file's path, relative to the volume's root.
    #[serde(default, deserialize_with = "nullable")]
    pub path: String,
    /// A container's limit or request to write (`limits.cpu`,
    /// `requests.memory`, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource_field_ref: Option<ResourceFieldSelector>,
    /// The fields edgehive does not model, kept as they came.
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

/// Points at a field of an object (for us, of the pod).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectFieldSelector {
    /// The API version the path is meant in; `v1` if unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_version: Option<String>,
    /// The field's path, such as `metadata.name`.
    #[serde(default, deserialize_with = "nullable")]
    pub field_path: String,
    /// The fields edgehive does not model, kept as they came.
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

/// Points at a resource limit or request of a container, and the unit to give
/// it in.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResourceFieldSelector {
    /// The container; needed in a volume, the variable's own container if unset
    /// in an environment variable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container_name: Option<String>,
    /// The unit the value is given in (`1m`, `1Mi`, ...); `1` if unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub divisor: Option<Quantity>,
    /// The limit or request to read: `limits.cpu`, `requests.memory`, ...
    #[serde(default, deserialize_with = "nullable")]
    pub resource: String,
    /// The fields edgehive does not model, kept as they came.
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

/// A service account token written into a projected volume.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ServiceAccountTokenProjection {
    /// Whom the token is meant for; the API server if unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audience: Option<String>,
    /// How long the token is asked to last (an hour if unset, ten minutes at
    /// least).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expiration_seconds: Option<i64>,
    /// The file the token goes into, relative to the mount point.
    #[serde(default, deserialize_with = "nullable")]
    pub path: String,
    /// The fields edgehive does not model, kept as they came.
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

/// Which file a key of a ConfigMap or secret becomes.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KeyToPath {
    /// The key to write.
    #[serde(default, deserialize_with = "nullable")]
    pub key: String,
    /// Permission bits for this file; the volume's default if unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<i32>,
    /// The file's path, relative to the volume's root (no `..`).
    #[serde(default, deserialize_with = "nullable")]
    pub path: String,
    /// The fields edgehive does not model, kept as they came.
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}
