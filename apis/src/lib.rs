//! edgehive's object model, shared by the cloud and the edge.
//!
//! - [`kinds`]: the Kubernetes kinds edgehive carries between cloud and
//!   edge, their keys, and what references what (a pod its configmaps and
//!   secrets, a device its model);
//! - [`object`]: one object of those kinds as modules hand it to each
//!   other, its key and revision typed and read once;
//! - [`k8s`]: the Kubernetes objects (`core/v1`, `meta/v1`) as edgehive
//!   reads them, as its own serde types: the part it models, and every
//!   other field kept as it came;
//! - [`devices`]: KubeEdge's device CRDs (`devices.kubeedge.io/v1beta1`
//!   `Device` and `DeviceModel`), written from KubeEdge's public API
//!   definitions;
//! - [`twin`]: KubeEdge's device twin messages (twins, membership), which
//!   the edge's devicetwin publishes and the cloud answers a KubeEdge
//!   edge's twin sync in;
//! - [`selector`]: label selectors, as lists take them;
//! - [`access`]: what a request asks (verb, resource, namespace, name),
//!   and the review an edge asks of the cloud for an application's token;
//! - `manifest` (feature `kubernetes`): reading Kubernetes manifests (YAML
//!   or JSON, one object, several documents or a `List`), every object
//!   checked before any is used (the cloud's admin API applies them);
//! - [`tokens`]: service account tokens for pods' projected volumes:
//!   which a pod needs, the question an edge asks its cloud for one, the
//!   object the edge keeps it in, and when it is due again;
//! - [`api`]: the read side of a Kubernetes-shaped HTTP API (list, get,
//!   watch, `Status` errors), served by the edge's MetaServer and the
//!   cloud's admin API alike;
//! - [`discovery`]: `/version`, `/api`, `/apis` and each group version's
//!   resource list, built from [`Kind`], as kubectl asks them first;
//! - [`fields`]: field selectors (`metadata.name=web`), on the fields
//!   kube-apiserver allows for each kind;
//! - [`table`]: the columns kubectl's tables show for each kind, and
//!   `meta.k8s.io/v1` `Table`s of objects (served for `as=Table`, printed
//!   by edgehivectl);
//! - [`termination`]: the edge's word that a pod being deleted has
//!   stopped there, which finishes its graceful deletion;
//! - `defaults` and `schema` (feature `kubernetes`): the cloud's
//!   API-server defaulting, and its checks of objects against the whole
//!   Kubernetes schema.
//!
//! Only the cloud turns `kubernetes` on: it brings in k8s-openapi, which
//! the edge does without.

pub mod access;
pub mod api;
#[cfg(feature = "kubernetes")]
pub mod defaults;
pub mod devices;
pub mod discovery;
pub mod fields;
pub mod inventory;
pub mod k8s;
pub mod kinds;
#[cfg(feature = "kubernetes")]
pub mod manifest;
pub mod object;
pub mod references;
#[cfg(feature = "kubernetes")]
mod schema;
pub mod selector;
pub mod streams;
pub mod table;
pub mod termination;
pub mod tokens;
pub mod twin;

pub use kinds::{Kind, ObjectKey};
pub use object::Object;

/// The kubelet version an edgehive edge reports in its Node's
/// `nodeInfo.kubeletVersion` (kubectl's VERSION column): the Kubernetes
/// API it serves, then edgehive's own version, as KubeEdge reports
/// `v1.31.12-kubeedge-v1.23.0`.
pub const KUBELET_VERSION: &str = concat!("v1.34.0-edgehive-v", env!("CARGO_PKG_VERSION"));
