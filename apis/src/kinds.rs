//! The Kubernetes kinds edgehive carries between cloud and edge, and what
//! the rest of the crate needs to know of each: its URL plural, its beehive
//! resource type, whether it is namespaced, its `apiVersion`, and how its
//! lists and watch events are written (an object goes in them as stored,
//! once it reads as its kind's type in [`crate::k8s`] or
//! [`crate::devices`]; see [`Kind::carried`]).
//!
//! The checks against the whole Kubernetes schema (`Kind::check`,
//! `Kind::check_status`) are the cloud's, in `crate::schema`, with the
//! `kubernetes` feature.

use std::borrow::Cow;
use std::fmt;

use crate::devices::{Device, DeviceModel};
use crate::k8s::{self, ListMeta, Status, WatchEvent};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use beehive::constants::resource_type;
use beehive::resource::EdgeResource;

pub use crate::references::{pod_references, references};

/// A kind of Kubernetes object edgehive stores.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    /// `Pod`.
    Pod,
    /// `ConfigMap`.
    ConfigMap,
    /// `Secret`.
    Secret,
    /// `Service`.
    Service,
    /// `Endpoints`.
    Endpoints,
    /// `Node` (cluster-scoped).
    Node,
    /// KubeEdge's `Device` (`devices.kubeedge.io/v1beta1`).
    Device,
    /// KubeEdge's `DeviceModel` (`devices.kubeedge.io/v1beta1`).
    DeviceModel,
}

/// An object that is not a valid instance of its kind.
#[derive(Debug, thiserror::Error)]
#[error("not a valid {kind}: {reason}")]
pub struct InvalidObject {
    /// The kind it claimed to be.
    pub kind: &'static str,
    /// What is wrong.
    pub reason: String,
}

impl Kind {
    /// Every kind.
    pub const ALL: [Kind; 8] = [
        Kind::Pod,
        Kind::ConfigMap,
        Kind::Secret,
        Kind::Service,
        Kind::Endpoints,
        Kind::Node,
        Kind::Device,
        Kind::DeviceModel,
    ];

    /// The `kind` field, e.g. `Pod`.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Pod => "Pod",
            Kind::ConfigMap => "ConfigMap",
            Kind::Secret => "Secret",
            Kind::Service => "Service",
            Kind::Endpoints => "Endpoints",
            Kind::Node => "Node",
            Kind::Device => "Device",
            Kind::DeviceModel => "DeviceModel",
        }
    }

    /// The `kind` of its lists, e.g. `PodList`.
    pub fn list_name(self) -> &'static str {
        match self {
            Kind::Pod => "PodList",
            Kind::ConfigMap => "ConfigMapList",
            Kind::Secret => "SecretList",
            Kind::Service => "ServiceList",
            Kind::Endpoints => "EndpointsList",
            Kind::Node => "NodeList",
            Kind::Device => "DeviceList",
            Kind::DeviceModel => "DeviceModelList",
        }
    }

    /// The URL plural, e.g. `pods`.
    pub fn plural(self) -> &'static str {
        match self {
            Kind::Pod => "pods",
            Kind::ConfigMap => "configmaps",
            Kind::Secret => "secrets",
            Kind::Service => "services",
            Kind::Endpoints => "endpoints",
            Kind::Node => "nodes",
            Kind::Device => "devices",
            Kind::DeviceModel => "devicemodels",
        }
    }

    /// The beehive resource type, e.g. `pod`.
    pub fn resource_type(self) -> &'static str {
        match self {
            Kind::Pod => resource_type::POD,
            Kind::ConfigMap => resource_type::CONFIGMAP,
            Kind::Secret => resource_type::SECRET,
            Kind::Service => resource_type::SERVICE,
            Kind::Endpoints => resource_type::ENDPOINTS,
            Kind::Node => resource_type::NODE,
            Kind::Device => resource_type::DEVICE,
            Kind::DeviceModel => resource_type::DEVICE_MODEL,
        }
    }

    /// Its `apiVersion`, e.g. `v1`.
    pub fn api_version(self) -> &'static str {
        match self {
            Kind::Device | Kind::DeviceModel => crate::devices::API_VERSION,
            _ => "v1",
        }
    }

    /// The URL prefix its paths start with: `/api/v1` for the core kinds,
    /// `/apis/<group>/<version>` for the others, as Kubernetes serves them.
    pub fn api_prefix(self) -> &'static str {
        match self {
            Kind::Device | Kind::DeviceModel => DEVICES_PREFIX,
            _ => CORE_PREFIX,
        }
    }

    /// Whether objects of this kind are bound to one node by
    /// `spec.nodeName` (pods and devices), rather than sent to the nodes
    /// whose bound objects reference them.
    pub fn bound_to_node(self) -> bool {
        matches!(self, Kind::Pod | Kind::Device)
    }

    /// The resource type a node reports this kind's status under
    /// (`podstatus`, `devicestatus`), for kinds bound to a node.
    pub fn status_type(self) -> Option<&'static str> {
        match self {
            Kind::Pod => Some(resource_type::POD_STATUS),
            Kind::Device => Some(resource_type::DEVICE_STATUS),
            _ => None,
        }
    }

    /// Whether objects of this kind live in a namespace.
    pub fn namespaced(self) -> bool {
        self != Kind::Node
    }

    /// The kind whose `kind` field is `name`.
    pub fn from_name(name: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.name() == name)
    }

    /// The kind a user means by `word`: plural, singular, kind or kubectl's
    /// short name (`po`, `cm`, `svc`, `ep`, `no`), any case.
    pub fn from_user(word: &str) -> Option<Kind> {
        let word = word.to_ascii_lowercase();
        let short = match word.as_str() {
            "po" => Some(Kind::Pod),
            "cm" => Some(Kind::ConfigMap),
            "svc" => Some(Kind::Service),
            "ep" => Some(Kind::Endpoints),
            "no" => Some(Kind::Node),
            "dev" => Some(Kind::Device),
            "dm" => Some(Kind::DeviceModel),
            _ => None,
        };
        short.or_else(|| {
            Kind::ALL.into_iter().find(|k| {
                k.plural() == word || k.resource_type() == word || k.name().to_lowercase() == word
            })
        })
    }

    /// The kind whose URL plural is `plural`.
    pub fn from_plural(plural: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.plural() == plural)
    }

    /// The kind whose beehive resource type is `resource_type`.
    pub fn from_resource_type(resource_type: &str) -> Option<Kind> {
        Kind::ALL
            .into_iter()
            .find(|k| k.resource_type() == resource_type)
    }

    /// Checks that `object` reads as this kind's type in [`crate::k8s`]
    /// (or [`crate::devices`]): what lists and watch events ask of an
    /// object before they carry it. Fields those types do not model are
    /// not looked at (the cloud checks the whole schema when it takes an
    /// object in).
    pub fn readable(self, object: &Value) -> Result<(), InvalidObject> {
        match self {
            Kind::Pod => parse::<k8s::Pod>(self, object),
            Kind::ConfigMap => parse::<k8s::ConfigMap>(self, object),
            Kind::Secret => parse::<k8s::Secret>(self, object),
            Kind::Service | Kind::Endpoints => parse::<k8s::Object>(self, object),
            Kind::Node => parse::<k8s::Node>(self, object),
            Kind::Device => parse::<Device>(self, object),
            Kind::DeviceModel => parse::<DeviceModel>(self, object),
        }
    }

    /// `object` as a list or a watch event carries it, if it is
    /// [`readable`](Kind::readable). A core kind's object goes as it is
    /// stored, with its `apiVersion` and `kind` (added if it has none, as
    /// k8s-openapi's types always wrote them); a device or device model as
    /// its type in [`crate::devices`] writes it.
    pub fn carried(self, object: &Value) -> Result<Cow<'_, Value>, InvalidObject> {
        match self {
            Kind::Device => rewrite::<Device>(self, object).map(Cow::Owned),
            Kind::DeviceModel => rewrite::<DeviceModel>(self, object).map(Cow::Owned),
            _ => {
                self.readable(object)?;
                let has = |field: &str| object.get(field).is_some_and(|v| !v.is_null());
                if has("apiVersion") && has("kind") {
                    return Ok(Cow::Borrowed(object));
                }
                let mut object = object.clone();
                if let Some(fields) = object.as_object_mut() {
                    fields.insert("apiVersion".to_owned(), self.api_version().into());
                    fields.insert("kind".to_owned(), self.name().into());
                }
                Ok(Cow::Owned(object))
            }
        }
    }

    /// A Kubernetes list (`PodList`, ...) of `items` at `resource_version`,
    /// each as it is [`carried`](Kind::carried); an item that is not
    /// readable is left out.
    pub fn list(self, items: Vec<Value>, resource_version: String) -> Result<Value, InvalidObject> {
        // One unreadable object must not hide the others.
        let items: Vec<Value> = items
            .into_iter()
            .filter_map(|item| match self.carried(&item).map(rewritten) {
                // Carried as it is: the item itself, not a copy of it.
                Ok(None) => Some(item),
                Ok(Some(rewritten)) => Some(rewritten),
                Err(err) => {
                    tracing::warn!(error = %err, "object left out of a list");
                    None
                }
            })
            .collect();
        let metadata = ListMeta {
            resource_version: Some(resource_version),
            ..ListMeta::default()
        };
        Ok(serde_json::json!({
            "apiVersion": self.api_version(),
            "kind": self.list_name(),
            "items": items,
            "metadata": to_value(self, &metadata)?,
        }))
    }

    /// A Kubernetes watch event of `change` to `object`, as it is
    /// [`carried`](Kind::carried).
    pub fn watch_event(self, change: Change, object: &Value) -> Result<Value, InvalidObject> {
        let object = self.carried(object)?;
        let event = match change {
            Change::Added => WatchEvent::Added(object),
            Change::Modified => WatchEvent::Modified(object),
            Change::Deleted => WatchEvent::Deleted(object),
        };
        to_value(self, &event)
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The watch event that tells a watcher its watch has expired (410) and
/// it must list again, as Kubernetes does.
pub fn expired_event(message: &str) -> Value {
    let status = Status {
        code: Some(410),
        message: Some(message.to_owned()),
        reason: Some("Expired".to_owned()),
        status: Some("Failure".to_owned()),
        ..Status::default()
    };
    serde_json::to_value(WatchEvent::<Value>::ErrorStatus(status)).unwrap_or(Value::Null)
}

/// What [`Kind::carried`] made of an object, if not the object itself.
fn rewritten(carried: Cow<'_, Value>) -> Option<Value> {
    match carried {
        Cow::Borrowed(_) => None,
        Cow::Owned(rewritten) => Some(rewritten),
    }
}

/// `object` read as `T` and written back.
fn rewrite<T: DeserializeOwned + Serialize>(
    kind: Kind,
    object: &Value,
) -> Result<Value, InvalidObject> {
    to_value(kind, &read::<T>(kind, object)?)
}

/// Checks that `object` reads as `T` (this crate's types here, the whole
/// schema's in `schema`).
pub(crate) fn parse<T: DeserializeOwned>(kind: Kind, object: &Value) -> Result<(), InvalidObject> {
    read::<T>(kind, object).map(drop)
}

/// `object` read as `T`.
fn read<T: DeserializeOwned>(kind: Kind, object: &Value) -> Result<T, InvalidObject> {
    T::deserialize(object).map_err(|err| InvalidObject {
        kind: kind.name(),
        reason: err.to_string(),
    })
}

fn to_value<T: Serialize>(kind: Kind, value: &T) -> Result<Value, InvalidObject> {
    serde_json::to_value(value).map_err(|err| InvalidObject {
        kind: kind.name(),
        reason: err.to_string(),
    })
}

/// The URL prefix of the core kinds.
pub const CORE_PREFIX: &str = "/api/v1";

/// The URL prefix of KubeEdge's device kinds.
pub const DEVICES_PREFIX: &str = "/apis/devices.kubeedge.io/v1beta1";

/// A Kubernetes list of one kind written as JSON item by item: the same
/// JSON as [`Kind::list`] gives (each item as it is
/// [`carried`](Kind::carried), one that is not readable left out),
/// without the items ever held at once. The resource version comes last: a source knows
/// it once it has handed out every item.
#[derive(Debug)]
pub struct ListWriter {
    kind: Kind,
    out: Vec<u8>,
    items: usize,
}

impl ListWriter {
    /// An empty list of `kind`.
    pub fn new(kind: Kind) -> ListWriter {
        // Keys in sorted order, as a `Value` writes them.
        let mut out = br#"{"apiVersion":"#.to_vec();
        write_json(&mut out, kind.api_version());
        out.extend_from_slice(br#","items":["#);
        ListWriter {
            kind,
            out,
            items: 0,
        }
    }

    /// Adds `item`, or leaves it out (with a warning) if it does not read
    /// as this kind: one unreadable object must not hide the others.
    pub fn push(&mut self, item: &Value) {
        let kind = self.kind;
        let before = self.out.len();
        if self.items > 0 {
            self.out.push(b',');
        }
        let written = kind.carried(item).and_then(|item| {
            serde_json::to_writer(&mut self.out, &*item).map_err(|err| InvalidObject {
                kind: kind.name(),
                reason: err.to_string(),
            })
        });
        match written {
            Ok(()) => self.items += 1,
            Err(err) => {
                self.out.truncate(before);
                tracing::warn!(error = %err, "object left out of a list");
            }
        }
    }

    /// The items added so far.
    pub fn len(&self) -> usize {
        self.items
    }

    /// Whether no item was added.
    pub fn is_empty(&self) -> bool {
        self.items == 0
    }

    /// The list's JSON, current at `resource_version`.
    pub fn finish(mut self, resource_version: &str) -> Vec<u8> {
        self.out.extend_from_slice(br#"],"kind":"#);
        write_json(&mut self.out, self.kind.list_name());
        self.out
            .extend_from_slice(br#","metadata":{"resourceVersion":"#);
        write_json(&mut self.out, resource_version);
        self.out.extend_from_slice(b"}}");
        self.out
    }
}

/// `text` as a JSON string.
fn write_json(out: &mut Vec<u8>, text: &str) {
    // Writing a string into a Vec cannot fail.
    let _ = serde_json::to_writer(out, text);
}

/// What happened to a watched object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// It appeared.
    Added,
    /// It changed.
    Modified,
    /// It went away.
    Deleted,
}

/// Which object: kind, namespace (empty for cluster-scoped kinds) and name.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectKey {
    /// Its kind.
    pub kind: Kind,
    /// Its namespace; empty for a node.
    pub namespace: String,
    /// Its name.
    pub name: String,
}

/// The namespace the edge's resource strings use for cluster-scoped objects
/// (a resource string always has one).
pub const CLUSTER_NAMESPACE: &str = "default";

impl ObjectKey {
    /// A key from its parts; the namespace is dropped for cluster-scoped kinds.
    pub fn new(kind: Kind, namespace: impl Into<String>, name: impl Into<String>) -> Self {
        let namespace = if kind.namespaced() {
            namespace.into()
        } else {
            String::new()
        };
        ObjectKey {
            kind,
            namespace,
            name: name.into(),
        }
    }

    /// The key of `object`, read from its `kind` and `metadata`.
    pub fn of(object: &Value) -> Option<ObjectKey> {
        let kind = Kind::from_name(object.get("kind")?.as_str()?)?;
        let metadata = object.get("metadata")?;
        let name = metadata.get("name")?.as_str()?;
        let namespace = metadata
            .get("namespace")
            .and_then(Value::as_str)
            .unwrap_or("default");
        Some(ObjectKey::new(kind, namespace, name))
    }

    /// The edge-side resource of this object (`<ns>/<type>/<name>`).
    pub fn edge_resource(&self) -> EdgeResource {
        let namespace = if self.kind.namespaced() {
            self.namespace.as_str()
        } else {
            CLUSTER_NAMESPACE
        };
        EdgeResource::new(namespace, self.kind.resource_type(), self.name.as_str())
    }

    /// The key of an edge-side resource, if it names an object of a known kind.
    pub fn from_edge_resource(resource: &EdgeResource) -> Option<ObjectKey> {
        let kind = Kind::from_resource_type(&resource.resource_type)?;
        if resource.name.is_empty() {
            return None;
        }
        Some(ObjectKey::new(
            kind,
            resource.namespace.as_str(),
            resource.name.as_str(),
        ))
    }
}

impl fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.namespace.is_empty() {
            write!(f, "{}/{}", self.kind.plural(), self.name)
        } else {
            write!(f, "{}/{}/{}", self.kind.plural(), self.namespace, self.name)
        }
    }
}

/// A Kubernetes object as a message's content: the form in which objects
/// pass between modules, read back with [`beehive::Content::decode`] into
/// the kind the reading module works with.
pub fn object_content(object: &Value) -> beehive::Content {
    // A JSON value always encodes: its map keys are strings, its numbers
    // and strings MessagePack's own.
    beehive::Content::of(object).expect("a JSON value encodes")
}

/// The name of the `serviceaccounttoken` object that carries the token of
/// source `index` of projected volume `volume` of pod `pod`: the cloud
/// sends it under this name, edged looks it up by it.
pub fn token_name(pod: &str, volume: &str, index: usize) -> String {
    format!("{pod}.{volume}.{index}")
}

/// Whether `name` is a DNS-1123 subdomain, as Kubernetes requires of most
/// object names.
pub use beehive::names::valid_subdomain as valid_name;

/// Whether `label` is a DNS-1123 label, as Kubernetes requires of namespaces
/// and service names.
pub use beehive::names::valid_label;

#[cfg(test)]
mod tests;
