//! `core/v1` `ConfigMap` and `Secret`, whose keys pods read as files
//! and environment variables, and [`Object`], any other kind read only as
//! far as its metadata.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::{ApiVersion, KindName, ObjectMeta, core_kind, nullable};

/// ConfigMap holds configuration data for pods to consume.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ConfigMap {
    /// Always `v1`; checked when read.
    #[serde(default)]
    pub api_version: ApiVersion<ConfigMap>,
    /// Always `ConfigMap`; checked when read.
    #[serde(default)]
    pub kind: KindName<ConfigMap>,
    /// Data contains the configuration data.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<BTreeMap<String, String>>,
    /// Immutable, if set to true, ensures that data stored in the ConfigMap
    /// cannot be updated (only object metadata can be modified).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub immutable: Option<bool>,
    /// Standard object's metadata.
    #[serde(default, deserialize_with = "nullable")]
    pub metadata: ObjectMeta,
    /// The fields edgehive does not model, kept as they came.
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

/// Secret holds secret data of a certain type.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Secret {
    /// Always `v1`; checked when read.
    #[serde(default)]
    pub api_version: ApiVersion<Secret>,
    /// Always `Secret`; checked when read.
    #[serde(default)]
    pub kind: KindName<Secret>,
    /// Data contains the secret data, each value base64 as on the wire
    /// (not decoded here).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<BTreeMap<String, String>>,
    /// Immutable, if set to true, ensures that data stored in the Secret cannot
    /// be updated (only object metadata can be modified).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub immutable: Option<bool>,
    /// Standard object's metadata.
    #[serde(default, deserialize_with = "nullable")]
    pub metadata: ObjectMeta,
    /// stringData allows specifying non-binary secret data in string form.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub string_data: Option<BTreeMap<String, String>>,
    /// Used to facilitate programmatic handling of secret data.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub type_: Option<String>,
    /// The fields edgehive does not model, kept as they came.
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}
core_kind!(ConfigMap, "ConfigMap", "ConfigMapList");
core_kind!(Secret, "Secret", "SecretList");

/// An object of a kind not modelled here (`Service`, `Endpoints`):
/// its metadata, and every other field as it came.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Object {
    /// Standard object metadata.
    #[serde(default, deserialize_with = "nullable")]
    pub metadata: ObjectMeta,
    /// Every other field, `apiVersion` and `kind` among them.
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}
