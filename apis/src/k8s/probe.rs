//! `core/v1` probes: what edged runs to tell whether a container has
//! started, is alive and is ready (exec, httpGet, tcpSocket, gRPC).

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::{IntOrString, nullable};

/// A check edged runs on a container, by one of four means: a command, an HTTP
/// GET, a TCP connect or a gRPC health check.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Probe {
    /// Run a command in the container; exit status 0 passes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exec: Option<ExecAction>,
    /// How many failures in a row, after a pass, make the probe fail; 3 if
    /// unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_threshold: Option<i32>,
    /// Ask the container's gRPC health service.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grpc: Option<GRPCAction>,
    /// Send an HTTP GET; a status from 200 to 399 passes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http_get: Option<HTTPGetAction>,
    /// Seconds to wait after the container starts before the first check.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initial_delay_seconds: Option<i32>,
    /// Seconds between checks; 10 if unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub period_seconds: Option<i32>,
    /// How many passes in a row, after a failure, make the probe pass; 1 if
    /// unset, and always 1 for liveness and startup probes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub success_threshold: Option<i32>,
    /// Open a TCP connection; connecting passes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tcp_socket: Option<TCPSocketAction>,
    /// For liveness and startup probes: the grace period to stop the container
    /// with when the probe fails, in place of the pod's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub termination_grace_period_seconds: Option<i64>,
    /// Seconds a check may take before it counts as failed; 1 if unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_seconds: Option<i32>,
    /// The fields edgehive does not model, kept as they came.
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

/// A probe that runs a command in the container.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ExecAction {
    /// The command and its arguments, run as is (no shell) with `/` as working
    /// directory; exit status 0 is healthy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<Vec<String>>,
    /// The fields edgehive does not model, kept as they came.
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

/// A probe by HTTP GET.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HTTPGetAction {
    /// The host to connect to; the pod's IP if unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// Extra headers to send.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http_headers: Option<Vec<HTTPHeader>>,
    /// The path to ask for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// The container's port, by number or by name.
    #[serde(default, deserialize_with = "nullable")]
    pub port: IntOrString,
    /// `HTTP` (the default) or `HTTPS`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheme: Option<String>,
    /// The fields edgehive does not model, kept as they came.
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

/// A header an HTTP probe sends.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HTTPHeader {
    /// The header's name.
    #[serde(default, deserialize_with = "nullable")]
    pub name: String,
    /// The header's value.
    #[serde(default, deserialize_with = "nullable")]
    pub value: String,
    /// The fields edgehive does not model, kept as they came.
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

/// A probe that opens a TCP connection.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TCPSocketAction {
    /// The host to connect to; the pod's IP if unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// The container's port, by number or by name.
    #[serde(default, deserialize_with = "nullable")]
    pub port: IntOrString,
    /// The fields edgehive does not model, kept as they came.
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

/// A probe by gRPC health check.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GRPCAction {
    /// The port the container's gRPC server listens on.
    #[serde(default, deserialize_with = "nullable")]
    pub port: i32,
    /// The service to name in the gRPC `HealthCheckRequest` (gRPC's health
    /// checking protocol); the server's overall health if unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<String>,
    /// The fields edgehive does not model, kept as they came.
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}
