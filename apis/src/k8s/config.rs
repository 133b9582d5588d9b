//! `core/v1` `ConfigMap` and `Secret`, whose keys pods read as files
//! and environment variables, and [`Object`], any other kind read only as
//! far as its metadata.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::{ApiVersion, KindName, ObjectMeta, core_kind, nullable};

/// A `ConfigMap`: named pieces of plain configuration that pods take in as
/// files or environment variables.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ConfigMap {
    /// Always `v1`; checked when read.
    #[serde(default)]
    pub api_version: ApiVersion<ConfigMap>,
    /// Always `ConfigMap`; checked when read.
    #[serde(default)]
    pub kind: KindName<ConfigMap>,
    /// The values, by key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<BTreeMap<String, String>>,
    /// If true, `data` can no longer change; only the metadata can.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub immutable: Option<bool>,
    /// The ConfigMap's name, namespace, labels and other metadata.
    #[serde(default, deserialize_with = "nullable")]
    pub metadata: ObjectMeta,
    /// The fields edgehive does not model, kept as they came.
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

/// A `Secret`: credentials, keys or tokens that pods take in as files or
/// environment variables.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Secret {
    /// Always `v1`; checked when read.
    #[serde(default)]
    pub api_version: ApiVersion<Secret>,
    /// Always `Secret`; checked when read.
    #[serde(default)]
    pub kind: KindName<Secret>,
    /// The values, by key, each still base64 as on the wire (not decoded here).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<BTreeMap<String, String>>,
    /// If true, `data` can no longer change; only the metadata can.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub immutable: Option<bool>,
    /// The secret's name, namespace, labels and other metadata.
    #[serde(default, deserialize_with = "nullable")]
    pub metadata: ObjectMeta,
    /// Values given as plain text when writing; the API server folds them into
    /// `data` and never hands them back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub string_data: Option<BTreeMap<String, String>>,
    /// What sort of secret this is (`Opaque`, `kubernetes.io/dockerconfigjson`,
    /// ...); `Opaque` if unset.
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
    /// The object's name, namespace, labels and other metadata.
    #[serde(default, deserialize_with = "nullable")]
    pub metadata: ObjectMeta,
    /// Every other field, `apiVersion` and `kind` among them.
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}
