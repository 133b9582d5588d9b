//! `core/v1` `Pod` and its spec: containers (command, environment,
//! ports, resources, mounts), as edged turns them into CRI requests.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::{
    ApiVersion, KindName, ObjectMeta, PodStatus, Probe, Quantity, Volume, core_kind, nullable,
};
use super::{ObjectFieldSelector, ResourceFieldSelector};

/// A `Pod`: containers that run together on one node, and what edged runs.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Pod {
    /// Always `v1`; checked when read.
    #[serde(default)]
    pub api_version: ApiVersion<Pod>,
    /// Always `Pod`; checked when read.
    #[serde(default)]
    pub kind: KindName<Pod>,
    /// The pod's name, namespace, uid, labels and annotations.
    #[serde(default, deserialize_with = "nullable")]
    pub metadata: ObjectMeta,
    /// What is to run: the containers, volumes and settings edged acts on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec: Option<PodSpec>,
    /// What the pod is doing, as last reported; edged reports it for the pods
    /// it runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<PodStatus>,
    /// The fields edgehive does not model, kept as they came.
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

/// What a pod runs and how.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodSpec {
    /// The pod's containers, run side by side.
    #[serde(default, deserialize_with = "nullable")]
    pub containers: Vec<Container>,
    /// Whether the pod uses the node's network namespace rather than one of its
    /// own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_network: Option<bool>,
    /// The host name inside the pod; the pod's name if unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
    /// Secrets (in the pod's namespace) holding registry credentials for
    /// pulling the pod's images.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_pull_secrets: Option<Vec<LocalObjectReference>>,
    /// Containers run one after another, each until it succeeds, before
    /// `containers` start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub init_containers: Option<Vec<Container>>,
    /// The node the pod is bound to; edged runs the pods bound to its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_name: Option<String>,
    /// When an exited container is started again: `Always` (the default),
    /// `OnFailure` or `Never`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restart_policy: Option<String>,
    /// The service account the pod runs as; its tokens are the ones projected
    /// into the pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_account_name: Option<String>,
    /// Seconds a container has to stop after the stop signal before it is
    /// killed; 30 if unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub termination_grace_period_seconds: Option<i64>,
    /// The volumes the pod's containers can mount, by name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volumes: Option<Vec<Volume>>,
    /// The fields edgehive does not model, kept as they came.
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

/// Names an object in the same namespace.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LocalObjectReference {
    /// The object's name.
    #[serde(default, deserialize_with = "nullable")]
    pub name: String,
    /// The fields edgehive does not model, kept as they came.
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

/// One container of a pod: what edged asks the CRI runtime to create and start.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Container {
    /// Arguments to the command; the image's `CMD` if unset. `$(VAR)` is
    /// replaced by the container's variable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub args: Option<Vec<String>>,
    /// The command to run instead of the image's `ENTRYPOINT`; not run in a
    /// shell.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<Vec<String>>,
    /// Variables for the container's environment; they win over `env_from` on a
    /// clash.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env: Option<Vec<EnvVar>>,
    /// ConfigMaps and secrets whose every key becomes an environment variable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env_from: Option<Vec<EnvFromSource>>,
    /// The image edged pulls for this container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// When edged pulls the image: `Always`, `IfNotPresent` or `Never`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_pull_policy: Option<String>,
    /// The check that tells whether the container is alive; edged restarts the
    /// container when it fails.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub liveness_probe: Option<Probe>,
    /// The container's name: a DNS label, unique in the pod.
    #[serde(default, deserialize_with = "nullable")]
    pub name: String,
    /// The ports the container serves; informational, except for host port
    /// mappings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ports: Option<Vec<ContainerPort>>,
    /// The check that tells whether the container can take requests; while it
    /// fails, the pod is not ready.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub readiness_probe: Option<Probe>,
    /// The CPU, memory and other resources the container asks for and may use
    /// at most.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
    /// The check that tells whether the container has finished starting; the
    /// other probes wait until it passes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub startup_probe: Option<Probe>,
    /// Whether the runtime keeps a stdin buffer for the container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdin: Option<bool>,
    /// Whether the container's stdin is closed when the first attached client
    /// leaves.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdin_once: Option<bool>,
    /// Whether the container gets a terminal (`stdin` must be set too).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tty: Option<bool>,
    /// Where the pod's volumes appear inside the container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_mounts: Option<Vec<VolumeMount>>,
    /// The directory the command starts in; the image's own if unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub working_dir: Option<String>,
    /// The fields edgehive does not model, kept as they came.
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

/// One environment variable of a container.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EnvVar {
    /// The variable's name.
    #[serde(default, deserialize_with = "nullable")]
    pub name: String,
    /// The variable's value (`$(VAR_NAME)` references expanded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    /// Where the value comes from, when `value` is not given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value_from: Option<EnvVarSource>,
    /// The fields edgehive does not model, kept as they came.
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

/// Where an environment variable's value is read from: one of these is set.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EnvVarSource {
    /// A key of a ConfigMap in the pod's namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_map_key_ref: Option<ConfigMapKeySelector>,
    /// A field of the pod (`metadata.name`, `spec.nodeName`, `status.podIP`,
    /// ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field_ref: Option<ObjectFieldSelector>,
    /// A resource limit or request of the container (`limits.cpu`,
    /// `requests.memory`, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource_field_ref: Option<ResourceFieldSelector>,
    /// A key of one of the pod namespace's secrets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_key_ref: Option<SecretKeySelector>,
    /// The fields edgehive does not model, kept as they came.
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

/// Picks one key of a ConfigMap.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ConfigMapKeySelector {
    /// The key whose value is taken.
    #[serde(default, deserialize_with = "nullable")]
    pub key: String,
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

/// Picks one key of a secret.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SecretKeySelector {
    /// The key whose value is taken.
    #[serde(default, deserialize_with = "nullable")]
    pub key: String,
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

/// A ConfigMap or secret whose keys all become environment variables.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EnvFromSource {
    /// The ConfigMap to take variables from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_map_ref: Option<ConfigMapEnvSource>,
    /// A string put before the name of every variable taken from here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix: Option<String>,
    /// The secret to take variables from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_ref: Option<SecretEnvSource>,
    /// The fields edgehive does not model, kept as they came.
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

/// The ConfigMap an `env_from` entry reads.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ConfigMapEnvSource {
    /// The ConfigMap's name.
    #[serde(default, deserialize_with = "nullable")]
    pub name: String,
    /// If true, a missing ConfigMap is not an error.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub optional: Option<bool>,
    /// The fields edgehive does not model, kept as they came.
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

/// The secret an `env_from` entry reads.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SecretEnvSource {
    /// The secret's name.
    #[serde(default, deserialize_with = "nullable")]
    pub name: String,
    /// If true, a missing secret is not an error.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub optional: Option<bool>,
    /// The fields edgehive does not model, kept as they came.
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

/// A port a container listens on.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerPort {
    /// The port number inside the container, on the pod's IP.
    #[serde(default, deserialize_with = "nullable")]
    pub container_port: i32,
    /// The host address a `host_port` is bound on.
    #[serde(rename = "hostIP", default, skip_serializing_if = "Option::is_none")]
    pub host_ip: Option<String>,
    /// A port of the node passed through to `container_port`; with host
    /// networking, the same number.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_port: Option<i32>,
    /// A name for the port (an IANA service name, unique in the pod) by which
    /// probes and services can refer to it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// `TCP` (the default), `UDP` or `SCTP`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<String>,
    /// The fields edgehive does not model, kept as they came.
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

/// The compute resources a container asks for and is held to.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResourceRequirements {
    /// The most the container may use, by resource (`cpu`, `memory`, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<BTreeMap<String, Quantity>>,
    /// What the container is scheduled by and guaranteed, by resource; where
    /// unset, the same as `limits`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requests: Option<BTreeMap<String, Quantity>>,
    /// The fields edgehive does not model, kept as they came.
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

/// Where a pod volume appears in a container.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VolumeMount {
    /// The path in the container where the volume is mounted.
    #[serde(default, deserialize_with = "nullable")]
    pub mount_path: String,
    /// The name of the pod volume to mount.
    #[serde(default, deserialize_with = "nullable")]
    pub name: String,
    /// Whether the container sees the volume read-only; read-write if unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_only: Option<bool>,
    /// A path inside the volume to mount instead of its root.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sub_path: Option<String>,
    /// The fields edgehive does not model, kept as they came.
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}
core_kind!(Pod, "Pod", "PodList");
