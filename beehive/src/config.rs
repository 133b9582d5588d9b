//! Hive configuration: which modules are enabled and how they are run,
//! shaped like the `modules` section of KubeEdge's config files.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Configuration of one hive.
///
/// ```
/// let yaml_as_json = serde_json::json!({
///     "modules": {
///         "edged": { "enable": false },
///         "metamanager": { "mailboxCapacity": 4096,
///                          "restart": { "policy": "onFailure", "maxRestarts": 5 } }
///     }
/// });
/// let config: beehive::HiveConfig = serde_json::from_value(yaml_as_json).unwrap();
/// assert!(!config.module("edged").enable);
/// assert_eq!(config.module("metamanager").mailbox_capacity, 4096);
/// assert!(config.module("twin").enable); // not named: defaults
/// ```
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HiveConfig {
    /// Per-module settings by module name; a module not named here runs
    /// with the defaults (enabled).
    #[serde(default)]
    pub modules: BTreeMap<String, ModuleConfig>,
}

impl HiveConfig {
    /// The settings for `name` (defaults if it is not configured).
    pub fn module(&self, name: &str) -> ModuleConfig {
        self.modules.get(name).cloned().unwrap_or_default()
    }
}

/// How one module is run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct ModuleConfig {
    /// Whether the module is started at all.
    pub enable: bool,
    /// Mailbox size: how many messages may wait for the module to take
    /// them; a sender waits when that many wait. The module takes all
    /// waiting messages at once, so during a burst up to twice this many
    /// exist (waiting, and taken but not yet handled).
    pub mailbox_capacity: usize,
    /// Time the module gets on shutdown to drain its mailbox and flush.
    pub flush_timeout_ms: u64,
    /// What happens when the module stops by itself.
    pub restart: RestartPolicy,
}

impl Default for ModuleConfig {
    fn default() -> Self {
        ModuleConfig {
            enable: true,
            mailbox_capacity: 1024,
            flush_timeout_ms: 5_000,
            restart: RestartPolicy::default(),
        }
    }
}

impl ModuleConfig {
    /// The flush timeout as a duration.
    pub fn flush_timeout(&self) -> Duration {
        Duration::from_millis(self.flush_timeout_ms)
    }
}

/// When a stopped module is started again (KubeEdge's module restart policy).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub enum RestartOn {
    /// Never restart.
    #[default]
    Never,
    /// Restart after a failure (an error from `handle`, or a panic).
    OnFailure,
    /// Restart whenever it stops, unless the hive is shutting down.
    Always,
}

/// How a module stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// It stopped by itself without an error.
    Stopped,
    /// It returned an error or panicked.
    Failed,
    /// The hive shut it down.
    Shutdown,
}

/// Restart policy with exponential backoff and a cap.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct RestartPolicy {
    /// When to restart.
    pub policy: RestartOn,
    /// Delay before the first restart.
    pub initial_backoff_ms: u64,
    /// Each further delay is the previous one times this factor.
    pub backoff_factor: f64,
    /// The delay never exceeds this.
    pub max_backoff_ms: u64,
    /// After this many restarts the module stays stopped (none: no limit).
    pub max_restarts: Option<u32>,
}

impl Default for RestartPolicy {
    fn default() -> Self {
        RestartPolicy {
            policy: RestartOn::Never,
            initial_backoff_ms: 100,
            backoff_factor: 2.0,
            max_backoff_ms: 30_000,
            max_restarts: None,
        }
    }
}

impl RestartPolicy {
    /// Whether a module that exited with `exit` after `restarts` restarts
    /// is started again.
    pub fn should_restart(&self, exit: Exit, restarts: u32) -> bool {
        if self.max_restarts.is_some_and(|max| restarts >= max) {
            return false;
        }
        match (self.policy, exit) {
            (_, Exit::Shutdown) | (RestartOn::Never, _) => false,
            (RestartOn::OnFailure, exit) => exit == Exit::Failed,
            (RestartOn::Always, _) => true,
        }
    }

    /// The delay before restart number `restarts + 1`.
    pub fn delay(&self, restarts: u32) -> Duration {
        let factor = if self.backoff_factor.is_finite() && self.backoff_factor >= 1.0 {
            self.backoff_factor
        } else {
            1.0
        };
        let exponent = i32::try_from(restarts).unwrap_or(i32::MAX);
        let millis = (self.initial_backoff_ms as f64) * factor.powi(exponent);
        let capped = millis.min(self.max_backoff_ms as f64).max(0.0);
        Duration::from_millis(capped as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(on: RestartOn) -> RestartPolicy {
        RestartPolicy {
            policy: on,
            ..RestartPolicy::default()
        }
    }

    #[test]
    fn restart_decisions_follow_the_policy() {
        use Exit::*;
        let table = [
            (RestartOn::Never, Stopped, false),
            (RestartOn::Never, Failed, false),
            (RestartOn::OnFailure, Stopped, false),
            (RestartOn::OnFailure, Failed, true),
            (RestartOn::Always, Stopped, true),
            (RestartOn::Always, Failed, true),
            (RestartOn::Always, Shutdown, false),
            (RestartOn::OnFailure, Shutdown, false),
        ];
        for (on, exit, expected) in table {
            assert_eq!(
                policy(on).should_restart(exit, 0),
                expected,
                "{on:?} {exit:?}"
            );
        }
    }

    #[test]
    fn max_restarts_caps_the_count() {
        let p = RestartPolicy {
            max_restarts: Some(2),
            ..policy(RestartOn::Always)
        };
        assert!(p.should_restart(Exit::Failed, 1));
        assert!(!p.should_restart(Exit::Failed, 2));
    }

    #[test]
    fn backoff_grows_and_is_capped() {
        let p = RestartPolicy {
            initial_backoff_ms: 100,
            backoff_factor: 2.0,
            max_backoff_ms: 1_000,
            ..policy(RestartOn::Always)
        };
        let delays: Vec<u64> = (0..6).map(|n| p.delay(n).as_millis() as u64).collect();
        assert_eq!(delays, [100, 200, 400, 800, 1000, 1000]);
        assert_eq!(p.delay(u32::MAX).as_millis(), 1000);
    }

    #[test]
    fn nonsense_factor_means_constant_backoff() {
        let p = RestartPolicy {
            backoff_factor: f64::NAN,
            ..RestartPolicy::default()
        };
        assert_eq!(p.delay(5), p.delay(0));
    }

    #[test]
    fn config_rejects_unknown_keys() {
        let err = serde_json::from_value::<HiveConfig>(serde_json::json!({
            "modules": {"edged": {"enabel": true}}
        }))
        .expect_err("typo must be refused");
        assert!(err.to_string().contains("enabel"), "{err}");
    }
}
