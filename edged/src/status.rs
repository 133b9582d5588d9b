//! A pod's status from what the runtime shows and what its [`PodBook`]
//! holds: a plain function, no call (the kubelet's
//! `generateAPIPodStatus`).
//!
//! - A container is `waiting` with edged's reason when edged holds it back
//!   (a back-off, a failed pull), else `running` or `terminated` as the
//!   runtime says, else `waiting` as `ContainerCreating`.
//! - Its restart count is its latest attempt; it is ready when it runs and
//!   its readiness (or startup) probe says so, or it has none.
//! - The phase: `Failed` when an init container failed, or every container
//!   exited and one failed, under `restartPolicy: Never`; `Succeeded` when
//!   every container exited 0 under a policy that is not `Always`;
//!   `Running` once initialized with a container started; else `Pending`.

use std::collections::HashMap;

use apis::k8s::{
    Container, ContainerState, ContainerStateRunning, ContainerStateTerminated,
    ContainerStateWaiting, ContainerStatus, PodCondition, PodSpec, PodStatus, Time,
};

use crate::actions::{PodBook, RestartPolicy};
use crate::cri::api;
use crate::observed::{Observed, RunState};

/// The pod's sandbox, as its status shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct SandboxInfo {
    /// The runtime's id.
    pub id: String,
    /// The pod's address on its network (empty: the node's).
    pub ip: String,
    /// When it was made, in CRI nanoseconds.
    pub created_at: i64,
}

impl SandboxInfo {
    /// Sandbox `id` as the runtime's status of it says.
    pub fn of(id: &str, status: api::PodSandboxStatus) -> Self {
        SandboxInfo {
            id: id.to_owned(),
            ip: status.network.map(|n| n.ip).unwrap_or_default(),
            created_at: status.created_at,
        }
    }
}

/// Where the pod runs, for its status.
#[derive(Debug, Clone, Copy)]
pub struct Placement<'a> {
    /// The pod's sandbox, once there is one.
    pub sandbox: Option<&'a SandboxInfo>,
    /// Why the sandbox could not be made, if it could not.
    pub sandbox_error: Option<&'a str>,
    /// The node's address.
    pub node_ip: &'a str,
}

/// The pod's status.
pub fn pod_status(
    spec: &PodSpec,
    observed: &HashMap<String, Observed>,
    book: &PodBook,
    placement: Placement<'_>,
) -> PodStatus {
    let status_of = |container: &Container| container_status(container, observed, book);
    let init_statuses: Vec<ContainerStatus> = spec
        .init_containers
        .iter()
        .flatten()
        .map(status_of)
        .collect();
    let statuses: Vec<ContainerStatus> = spec.containers.iter().map(status_of).collect();
    let initialized = init_statuses.iter().all(|s| exit_code(s) == Some(0));
    let policy = RestartPolicy::of(spec);
    let init_failed = policy == RestartPolicy::Never
        && init_statuses
            .iter()
            .any(|s| exit_code(s).is_some_and(|c| c != 0));
    let all_done = !statuses.is_empty() && statuses.iter().all(|s| exit_code(s).is_some());
    let any_failed = statuses
        .iter()
        .any(|s| exit_code(s).is_some_and(|c| c != 0));
    let phase = if init_failed || (policy == RestartPolicy::Never && all_done && any_failed) {
        "Failed"
    } else if policy != RestartPolicy::Always && all_done && !any_failed {
        "Succeeded"
    } else if initialized
        && statuses.iter().any(|s| {
            s.state
                .as_ref()
                .is_some_and(|st| st.running.is_some() || st.terminated.is_some())
        })
    {
        "Running"
    } else {
        "Pending"
    };
    let ready = !statuses.is_empty() && statuses.iter().all(|s| s.ready);
    let condition = |kind: &str, ok: bool| PodCondition {
        type_: kind.to_owned(),
        status: if ok { "True" } else { "False" }.to_owned(),
        ..Default::default()
    };
    let (ip, started) = match placement.sandbox {
        Some(sandbox) if sandbox.ip.is_empty() => {
            (placement.node_ip.to_owned(), time(sandbox.created_at))
        }
        Some(sandbox) => (sandbox.ip.clone(), time(sandbox.created_at)),
        None => (String::new(), None),
    };
    PodStatus {
        phase: Some(phase.to_owned()),
        conditions: Some(vec![
            condition("PodScheduled", true),
            condition("Initialized", initialized),
            condition("ContainersReady", ready),
            condition("Ready", ready),
        ]),
        pod_ip: Some(ip).filter(|ip| !ip.is_empty()),
        host_ip: Some(placement.node_ip.to_owned()).filter(|ip| !ip.is_empty()),
        start_time: started,
        container_statuses: Some(statuses),
        init_container_statuses: Some(init_statuses).filter(|s| !s.is_empty()),
        message: placement.sandbox_error.map(str::to_owned),
        ..Default::default()
    }
}

/// One container's status.
fn container_status(
    container: &Container,
    observed: &HashMap<String, Observed>,
    book: &PodBook,
) -> ContainerStatus {
    let latest = observed
        .get(&container.name)
        .and_then(|o| o.latest.as_ref());
    let state = match (latest, book.waiting(&container.name)) {
        (_, Some(waiting)) => ContainerState {
            waiting: Some(ContainerStateWaiting {
                reason: Some(waiting.reason.clone()),
                message: Some(waiting.message.clone()),
                ..Default::default()
            }),
            ..Default::default()
        },
        (Some(s), None) if s.state == RunState::Running => ContainerState {
            running: Some(ContainerStateRunning {
                started_at: time(s.started_at),
                ..Default::default()
            }),
            ..Default::default()
        },
        (Some(s), None) if s.state == RunState::Exited => {
            let reason = match (s.reason.is_empty(), s.exit_code) {
                (false, _) => s.reason.clone(),
                (true, 0) => "Completed".to_owned(),
                (true, _) => "Error".to_owned(),
            };
            ContainerState {
                terminated: Some(ContainerStateTerminated {
                    exit_code: s.exit_code,
                    reason: Some(reason),
                    message: Some(s.message.clone()).filter(|m| !m.is_empty()),
                    started_at: time(s.started_at),
                    finished_at: time(s.finished_at),
                    container_id: Some(format!("containerd://{}", s.id)),
                    ..Default::default()
                }),
                ..Default::default()
            }
        }
        _ => ContainerState {
            waiting: Some(ContainerStateWaiting {
                reason: Some("ContainerCreating".to_owned()),
                message: None,
                ..Default::default()
            }),
            ..Default::default()
        },
    };
    let probed = book
        .ready(&container.name)
        .unwrap_or(container.readiness_probe.is_none() && container.startup_probe.is_none());
    let running = state.running.is_some();
    ContainerStatus {
        name: container.name.clone(),
        image: container.image.clone().unwrap_or_default(),
        image_id: latest.map(|s| s.image_ref.clone()).unwrap_or_default(),
        container_id: latest.map(|s| format!("containerd://{}", s.id)),
        restart_count: latest.map_or(0, |s| i32::try_from(s.attempt).unwrap_or(i32::MAX)),
        ready: running && probed,
        started: Some(running),
        state: Some(state),
        ..Default::default()
    }
}

/// The exit code of a container that terminated.
fn exit_code(status: &ContainerStatus) -> Option<i32> {
    status
        .state
        .as_ref()
        .and_then(|st| st.terminated.as_ref())
        .map(|t| t.exit_code)
}

/// A CRI time (nanoseconds since the epoch) as a Kubernetes time.
pub fn time(nanos: i64) -> Option<Time> {
    if nanos <= 0 {
        return None;
    }
    let at = jiff::Timestamp::from_second(nanos / 1_000_000_000).ok()?;
    Some(Time(at))
}
