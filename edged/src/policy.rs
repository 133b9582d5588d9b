//! The pod spec's policies as enums, defaulted as Kubernetes defaults
//! them: how an image is pulled, and what is restarted.

use apis::k8s::{Container, PodSpec};

/// How an image is pulled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PullPolicy {
    /// Every start.
    Always,
    /// When the runtime does not have it.
    IfNotPresent,
    /// Never: it must be there.
    Never,
}

impl PullPolicy {
    /// The container's policy, defaulted as Kubernetes does (`Always` for
    /// `:latest` or no tag).
    pub fn of(container: &Container) -> Self {
        match container.image_pull_policy.as_deref() {
            Some("Always") => PullPolicy::Always,
            Some("Never") => PullPolicy::Never,
            Some(_) => PullPolicy::IfNotPresent,
            None => {
                let image = container.image.as_deref().unwrap_or_default();
                let tagged = image.rsplit('/').next().unwrap_or("").contains(':');
                if image.ends_with(":latest") || !tagged {
                    PullPolicy::Always
                } else {
                    PullPolicy::IfNotPresent
                }
            }
        }
    }
}

/// The pod's `restartPolicy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RestartPolicy {
    /// Restart whatever exits (the default).
    Always,
    /// Restart what exits with an error.
    OnFailure,
    /// Never restart.
    Never,
}

impl RestartPolicy {
    /// The spec's policy (`Always` when unset or unknown).
    pub fn of(spec: &PodSpec) -> Self {
        match spec.restart_policy.as_deref() {
            Some("Never") => RestartPolicy::Never,
            Some("OnFailure") => RestartPolicy::OnFailure,
            _ => RestartPolicy::Always,
        }
    }

    /// Whether a container that exited with `exit_code` runs again (an init
    /// container that succeeded never does).
    pub fn restarts(self, exit_code: i32, init: bool) -> bool {
        match self {
            RestartPolicy::Never => false,
            RestartPolicy::OnFailure => exit_code != 0,
            RestartPolicy::Always => !init || exit_code != 0,
        }
    }
}
