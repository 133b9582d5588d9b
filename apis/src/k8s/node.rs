//! `core/v1` `Node` and the status an edge reports of itself:
//! capacity, addresses, conditions and system info.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::{ApiVersion, KindName, ObjectMeta, Quantity, Time, core_kind, nullable};

/// Node is a worker node in Kubernetes.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Node {
    /// Always `v1`; checked when read.
    #[serde(default)]
    pub api_version: ApiVersion<Node>,
    /// Always `Node`; checked when read.
    #[serde(default)]
    pub kind: KindName<Node>,
    /// Standard object's metadata.
    #[serde(default, deserialize_with = "nullable")]
    pub metadata: ObjectMeta,
    /// Most recently observed status of the node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<NodeStatus>,
    /// The fields edgehive does not model, kept as they came.
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

/// NodeStatus is information about the current status of a node.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeStatus {
    /// List of addresses reachable to the node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub addresses: Option<Vec<NodeAddress>>,
    /// Allocatable represents the resources of a node that are available for
    /// scheduling.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocatable: Option<BTreeMap<String, Quantity>>,
    /// Capacity represents the total resources of a node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity: Option<BTreeMap<String, Quantity>>,
    /// Conditions is an array of current observed node conditions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conditions: Option<Vec<NodeCondition>>,
    /// Set of ids/uuids to uniquely identify the node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_info: Option<NodeSystemInfo>,
    /// The fields edgehive does not model, kept as they came.
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

/// NodeCondition contains condition information for a node.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeCondition {
    /// Last time we got an update on a given condition.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_heartbeat_time: Option<Time>,
    /// Last time the condition transit from one status to another.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<Time>,
    /// Human readable message indicating details about last transition.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// (brief) reason for the condition's last transition.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Status of the condition, one of True, False, Unknown.
    #[serde(default, deserialize_with = "nullable")]
    pub status: String,
    /// Type of node condition.
    #[serde(default, deserialize_with = "nullable")]
    pub type_: String,
    /// The fields edgehive does not model, kept as they came.
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

/// NodeAddress contains information for the node's address.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeAddress {
    /// The node address.
    #[serde(default, deserialize_with = "nullable")]
    pub address: String,
    /// Node address type, one of Hostname, ExternalIP or InternalIP.
    #[serde(default, deserialize_with = "nullable")]
    pub type_: String,
    /// The fields edgehive does not model, kept as they came.
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

/// NodeSystemInfo is a set of ids/uuids to uniquely identify the node.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeSystemInfo {
    /// The Architecture reported by the node
    #[serde(default, deserialize_with = "nullable")]
    pub architecture: String,
    /// Boot ID reported by the node.
    #[serde(rename = "bootID", default, deserialize_with = "nullable")]
    pub boot_id: String,
    /// ContainerRuntime Version reported by the node through runtime remote API
    /// (e.g.
    #[serde(default, deserialize_with = "nullable")]
    pub container_runtime_version: String,
    /// Kernel Version reported by the node from 'uname -r' (e.g.
    #[serde(default, deserialize_with = "nullable")]
    pub kernel_version: String,
    /// Deprecated: KubeProxy Version reported by the node.
    #[serde(default, deserialize_with = "nullable")]
    pub kube_proxy_version: String,
    /// Kubelet Version reported by the node.
    #[serde(default, deserialize_with = "nullable")]
    pub kubelet_version: String,
    /// MachineID reported by the node.
    #[serde(rename = "machineID", default, deserialize_with = "nullable")]
    pub machine_id: String,
    /// The Operating System reported by the node
    #[serde(default, deserialize_with = "nullable")]
    pub operating_system: String,
    /// OS Image reported by the node from /etc/os-release (e.g.
    #[serde(default, deserialize_with = "nullable")]
    pub os_image: String,
    /// SystemUUID reported by the node.
    #[serde(rename = "systemUUID", default, deserialize_with = "nullable")]
    pub system_uuid: String,
    /// The fields edgehive does not model, kept as they came.
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}
core_kind!(Node, "Node", "NodeList");
