//! `core/v1` pod status: phase, conditions and container statuses, as
//! edged reports them.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::{Time, nullable};

/// What is known of a pod's state; edged reports it for the pods it runs.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodStatus {
    /// The pod's conditions (`PodScheduled`, `Initialized`, `ContainersReady`,
    /// `Ready`, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conditions: Option<Vec<PodCondition>>,
    /// One status for each container of the spec's `containers`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container_statuses: Option<Vec<ContainerStatus>>,
    /// The IP of the node the pod runs on.
    #[serde(rename = "hostIP", default, skip_serializing_if = "Option::is_none")]
    pub host_ip: Option<String>,
    /// One status for each init container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub init_container_statuses: Option<Vec<ContainerStatus>>,
    /// Why the pod is in its current state, for people.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Where the pod is in its life: `Pending`, `Running`, `Succeeded`,
    /// `Failed` or `Unknown`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// The pod's IP address, once it has one.
    #[serde(rename = "podIP", default, skip_serializing_if = "Option::is_none")]
    pub pod_ip: Option<String>,
    /// The pod's Quality of Service class (`Guaranteed`, `Burstable`,
    /// `BestEffort`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub qos_class: Option<String>,
    /// A short CamelCase cause of the current state (`Evicted`, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// When the node (edged, for us) took the pod on, before pulling any image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<Time>,
    /// The fields edgehive does not model, kept as they came.
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

/// One condition of a pod, such as `Ready`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodCondition {
    /// When the condition was last checked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_probe_time: Option<Time>,
    /// When the condition's status last changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<Time>,
    /// Details of the last change, for people.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// A one-word CamelCase cause of the last change.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// `True` if the condition holds, `False` if not, `Unknown` if that cannot
    /// be told.
    #[serde(default, deserialize_with = "nullable")]
    pub status: String,
    /// Which condition: `PodScheduled`, `Initialized`, `ContainersReady`,
    /// `Ready`, ...
    #[serde(default, deserialize_with = "nullable")]
    pub type_: String,
    /// The fields edgehive does not model, kept as they came.
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

/// What is known of one container of a pod.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerStatus {
    /// The runtime's id for the container, as `runtime://id`
    /// (`containerd://...`).
    #[serde(
        rename = "containerID",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub container_id: Option<String>,
    /// The image the container runs, as the runtime names it.
    #[serde(default, deserialize_with = "nullable")]
    pub image: String,
    /// The id (digest) of the image the container runs.
    #[serde(rename = "imageID", default, deserialize_with = "nullable")]
    pub image_id: String,
    /// How the container's previous run ended, if it has been restarted: the
    /// clue to a crash loop.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_state: Option<ContainerState>,
    /// The container's name, as in the pod's spec.
    #[serde(default, deserialize_with = "nullable")]
    pub name: String,
    /// Whether the container passes its readiness probe (or, without one, is
    /// running).
    #[serde(default, deserialize_with = "nullable")]
    pub ready: bool,
    /// How many times the container has been started again.
    #[serde(default, deserialize_with = "nullable")]
    pub restart_count: i32,
    /// Whether the container has passed its startup probe and run its
    /// `postStart` hook.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started: Option<bool>,
    /// What the container is doing now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<ContainerState>,
    /// The fields edgehive does not model, kept as they came.
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

/// The state a container is in: one of the three is set.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerState {
    /// Set while the container runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub running: Option<ContainerStateRunning>,
    /// Set once the container has exited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub terminated: Option<ContainerStateTerminated>,
    /// Set while the container cannot run yet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting: Option<ContainerStateWaiting>,
    /// The fields edgehive does not model, kept as they came.
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

/// A container that is running.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerStateRunning {
    /// When the container last started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<Time>,
    /// The fields edgehive does not model, kept as they came.
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

/// A container that has exited.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerStateTerminated {
    /// The runtime's id for the container, as `runtime://id`.
    #[serde(
        rename = "containerID",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub container_id: Option<String>,
    /// The code the container exited with.
    #[serde(default, deserialize_with = "nullable")]
    pub exit_code: i32,
    /// When the container exited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<Time>,
    /// What happened, for people.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// A short cause (`Completed`, `Error`, `OOMKilled`, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The signal that ended the container, if one did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
    /// When this run of the container started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<Time>,
    /// The fields edgehive does not model, kept as they came.
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

/// A container that does not run yet.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerStateWaiting {
    /// Why not, for people.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// A short cause (`ContainerCreating`, `ImagePullBackOff`,
    /// `CrashLoopBackOff`, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The fields edgehive does not model, kept as they came.
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}
