//! `core/v1` `Node` and the status an edge reports of itself:
//! capacity, addresses, conditions and system info.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::{ApiVersion, KindName, ObjectMeta, Quantity, Time, core_kind, nullable};

/// A `Node`: a machine that runs pods. For the edge, the node it is itself.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Node {
    /// Always `v1`; checked when read.
    #[serde(default)]
    pub api_version: ApiVersion<Node>,
    /// Always `Node`; checked when read.
    #[serde(default)]
    pub kind: KindName<Node>,
    /// The node's name, labels and annotations.
    #[serde(default, deserialize_with = "nullable")]
    pub metadata: ObjectMeta,
    /// What was last reported about the node; edged reports its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<NodeStatus>,
    /// The fields edgehive does not model, kept as they came.
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

/// The state of a node as reported: resources, addresses, conditions and
/// machine facts.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeStatus {
    /// The addresses at which the node can be reached (host name, internal and
    /// external IPs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub addresses: Option<Vec<NodeAddress>>,
    /// The part of `capacity` that pods can be scheduled against, by resource
    /// name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocatable: Option<BTreeMap<String, Quantity>>,
    /// Everything the node has (`cpu`, `memory`, `pods`, ...), by resource
    /// name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity: Option<BTreeMap<String, Quantity>>,
    /// The node's conditions (`Ready` and the pressure conditions) as last
    /// seen.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conditions: Option<Vec<NodeCondition>>,
    /// Ids of the machine and versions of its software.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_info: Option<NodeSystemInfo>,
    /// The fields edgehive does not model, kept as they came.
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

/// One condition of a node, such as `Ready`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeCondition {
    /// When the condition was last reported, changed or not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_heartbeat_time: Option<Time>,
    /// When the condition's status last changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<Time>,
    /// Details of the last change, for people.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// A short machine-readable cause of the last change.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// `True` if the condition holds, `False` if not, `Unknown` if that cannot
    /// be told.
    #[serde(default, deserialize_with = "nullable")]
    pub status: String,
    /// Which condition this is: `Ready`, `MemoryPressure`, `DiskPressure`, ...
    #[serde(default, deserialize_with = "nullable")]
    pub type_: String,
    /// The fields edgehive does not model, kept as they came.
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

/// One address of a node, with what kind of address it is.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeAddress {
    /// The address itself: an IP or a host name.
    #[serde(default, deserialize_with = "nullable")]
    pub address: String,
    /// What kind of address: `Hostname`, `InternalIP`, `ExternalIP`,
    /// `InternalDNS` or `ExternalDNS`.
    #[serde(default, deserialize_with = "nullable")]
    pub type_: String,
    /// The fields edgehive does not model, kept as they came.
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

/// Ids of a node's machine and versions of its software, as edged reports them
/// for its own.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeSystemInfo {
    /// The CPU architecture, as Go names it (`amd64`, `arm64`, ...).
    #[serde(default, deserialize_with = "nullable")]
    pub architecture: String,
    /// An id that changes each time the machine boots.
    #[serde(rename = "bootID", default, deserialize_with = "nullable")]
    pub boot_id: String,
    /// The container runtime, as `name://version` (`containerd://1.7.2`).
    #[serde(default, deserialize_with = "nullable")]
    pub container_runtime_version: String,
    /// The kernel release, as `uname -r` prints it.
    #[serde(default, deserialize_with = "nullable")]
    pub kernel_version: String,
    /// Deprecated; left empty by edged.
    #[serde(default, deserialize_with = "nullable")]
    pub kube_proxy_version: String,
    /// The version of the node agent, in kubelet's form; edged gives its own.
    #[serde(default, deserialize_with = "nullable")]
    pub kubelet_version: String,
    /// The machine's id, from `/etc/machine-id`.
    #[serde(rename = "machineID", default, deserialize_with = "nullable")]
    pub machine_id: String,
    /// The operating system, as Go names it (`linux`, `windows`).
    #[serde(default, deserialize_with = "nullable")]
    pub operating_system: String,
    /// The OS distribution and release, from `/etc/os-release` (`Debian
    /// GNU/Linux 12 (bookworm)`).
    #[serde(default, deserialize_with = "nullable")]
    pub os_image: String,
    /// The hardware's UUID, as its firmware gives it.
    #[serde(rename = "systemUUID", default, deserialize_with = "nullable")]
    pub system_uuid: String,
    /// The fields edgehive does not model, kept as they came.
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}
core_kind!(Node, "Node", "NodeList");
