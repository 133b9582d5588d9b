//! What the runtime shows of one pod, in plain values the pod's rules
//! ([`crate::actions`]) read: its containers grouped by name, newest
//! attempt last, and its sandboxes.

use std::collections::HashMap;

use crate::cri::api;
use crate::spec::{CONTAINER_NAME, SPEC_HASH};

/// A container's state as the runtime reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunState {
    /// Created, not started.
    Created,
    /// Running.
    Running,
    /// Exited, with `exit_code`.
    Exited,
    /// The runtime does not know.
    Unknown,
}

/// What the runtime shows of one container.
#[derive(Debug, Clone, PartialEq)]
pub struct Seen {
    /// The runtime's id.
    pub id: String,
    /// Its state.
    pub state: RunState,
    /// Its exit code, once exited.
    pub exit_code: i32,
    /// Which start of this container name it is (0 for the first).
    pub attempt: u32,
    /// The hash of the spec it was made from ([`crate::spec::spec_hash`]).
    pub spec_hash: Option<String>,
    /// When it started, in CRI nanoseconds since the epoch (0: never).
    pub started_at: i64,
    /// When it finished, likewise.
    pub finished_at: i64,
    /// The runtime's reason for its exit, if it gave one.
    pub reason: String,
    /// The runtime's message for its exit.
    pub message: String,
    /// The image it runs, as resolved.
    pub image_ref: String,
}

impl Seen {
    /// What a CRI container status says.
    pub fn from_cri(status: &api::ContainerStatus) -> Self {
        let state = match api::ContainerState::try_from(status.state) {
            Ok(api::ContainerState::ContainerCreated) => RunState::Created,
            Ok(api::ContainerState::ContainerRunning) => RunState::Running,
            Ok(api::ContainerState::ContainerExited) => RunState::Exited,
            _ => RunState::Unknown,
        };
        Seen {
            id: status.id.clone(),
            state,
            exit_code: status.exit_code,
            attempt: status.metadata.as_ref().map_or(0, |m| m.attempt),
            spec_hash: status.labels.get(SPEC_HASH).cloned(),
            started_at: status.started_at,
            finished_at: status.finished_at,
            reason: status.reason.clone(),
            message: status.message.clone(),
            image_ref: status.image_ref.clone(),
        }
    }

    /// The container name edged labelled it with.
    pub fn name_of(status: &api::ContainerStatus) -> String {
        status
            .labels
            .get(CONTAINER_NAME)
            .cloned()
            .unwrap_or_default()
    }
}

/// The latest container of one name, and the ids of the ones before it
/// (oldest first).
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Observed {
    /// The highest attempt.
    pub latest: Option<Seen>,
    /// The others, oldest first.
    pub older: Vec<String>,
}

impl Observed {
    /// Groups a pod's containers by name, each group by attempt.
    pub fn group(containers: Vec<(String, Seen)>) -> HashMap<String, Observed> {
        let mut by_name: HashMap<String, Vec<Seen>> = HashMap::new();
        for (name, seen) in containers {
            by_name.entry(name).or_default().push(seen);
        }
        by_name
            .into_iter()
            .map(|(name, mut all)| {
                all.sort_by_key(|s| s.attempt);
                let latest = all.pop();
                let older = all.into_iter().map(|s| s.id).collect();
                (name, Observed { latest, older })
            })
            .collect()
    }
}

/// One of the pod's sandboxes, as the runtime shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct SandboxSeen {
    /// The runtime's id.
    pub id: String,
    /// Whether it is ready.
    pub ready: bool,
    /// When it was made (CRI nanoseconds).
    pub created_at: i64,
    /// Which start of the pod's sandbox it is.
    pub attempt: u32,
}
