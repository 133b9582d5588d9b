//! `core/v1` pod status: phase, conditions and container statuses, as
//! edged reports them.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::{Time, nullable};

/// PodStatus represents information about the status of a pod.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodStatus {
    /// Current service state of pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conditions: Option<Vec<PodCondition>>,
    /// Statuses of containers in this pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container_statuses: Option<Vec<ContainerStatus>>,
    /// hostIP holds the IP address of the host to which the pod is assigned.
    #[serde(rename = "hostIP", default, skip_serializing_if = "Option::is_none")]
    pub host_ip: Option<String>,
    /// Statuses of init containers in this pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub init_container_statuses: Option<Vec<ContainerStatus>>,
    /// A human readable message indicating details about why the pod is in this
    /// condition.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The phase of a Pod is a simple, high-level summary of where the Pod is
    /// in its lifecycle.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// podIP address allocated to the pod.
    #[serde(rename = "podIP", default, skip_serializing_if = "Option::is_none")]
    pub pod_ip: Option<String>,
    /// The pod's Quality of Service class (`Guaranteed`, `Burstable`,
    /// `BestEffort`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub qos_class: Option<String>,
    /// A brief CamelCase message indicating details about why the pod is in
    /// this state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// RFC 3339 date and time at which the object was acknowledged by the
    /// Kubelet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<Time>,
    /// The fields edgehive does not model, kept as they came.
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

/// PodCondition contains details for the current condition of this pod.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodCondition {
    /// Last time we probed the condition.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_probe_time: Option<Time>,
    /// Last time the condition transitioned from one status to another.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<Time>,
    /// Human-readable message indicating details about last transition.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Unique, one-word, CamelCase reason for the condition's last transition.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Status is the status of the condition.
    #[serde(default, deserialize_with = "nullable")]
    pub status: String,
    /// Type is the type of the condition.
    #[serde(default, deserialize_with = "nullable")]
    pub type_: String,
    /// The fields edgehive does not model, kept as they came.
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

/// ContainerStatus contains details for the current status of this container.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerStatus {
    /// ContainerID is the ID of the container in the format
    /// '\<type\>://\<container_id\>'.
    #[serde(
        rename = "containerID",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub container_id: Option<String>,
    /// Image is the name of container image that the container is running.
    #[serde(default, deserialize_with = "nullable")]
    pub image: String,
    /// ImageID is the image ID of the container's image.
    #[serde(rename = "imageID", default, deserialize_with = "nullable")]
    pub image_id: String,
    /// LastTerminationState holds the last termination state of the container
    /// to help debug container crashes and restarts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_state: Option<ContainerState>,
    /// Name is a DNS_LABEL representing the unique name of the container.
    #[serde(default, deserialize_with = "nullable")]
    pub name: String,
    /// Ready specifies whether the container is currently passing its readiness
    /// check.
    #[serde(default, deserialize_with = "nullable")]
    pub ready: bool,
    /// RestartCount holds the number of times the container has been restarted.
    #[serde(default, deserialize_with = "nullable")]
    pub restart_count: i32,
    /// Started indicates whether the container has finished its postStart
    /// lifecycle hook and passed its startup probe.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started: Option<bool>,
    /// State holds details about the container's current condition.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<ContainerState>,
    /// The fields edgehive does not model, kept as they came.
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

/// ContainerState holds a possible state of container.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerState {
    /// Details about a running container
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub running: Option<ContainerStateRunning>,
    /// Details about a terminated container
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub terminated: Option<ContainerStateTerminated>,
    /// Details about a waiting container
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting: Option<ContainerStateWaiting>,
    /// The fields edgehive does not model, kept as they came.
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

/// ContainerStateRunning is a running state of a container.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerStateRunning {
    /// Time at which the container was last (re-)started
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<Time>,
    /// The fields edgehive does not model, kept as they came.
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

/// ContainerStateTerminated is a terminated state of a container.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerStateTerminated {
    /// Container's ID in the format '\<type\>://\<container_id\>'
    #[serde(
        rename = "containerID",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub container_id: Option<String>,
    /// Exit status from the last termination of the container
    #[serde(default, deserialize_with = "nullable")]
    pub exit_code: i32,
    /// Time at which the container last terminated
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<Time>,
    /// Message regarding the last termination of the container
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// (brief) reason from the last termination of the container
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Signal from the last termination of the container
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
    /// Time at which previous execution of the container started
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<Time>,
    /// The fields edgehive does not model, kept as they came.
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

/// ContainerStateWaiting is a waiting state of a container.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerStateWaiting {
    /// Message regarding why the container is not yet running.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// (brief) reason the container is not yet running.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The fields edgehive does not model, kept as they came.
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}
