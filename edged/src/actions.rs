//! A pod's runtime decisions as a plain state machine (the kubelet calls
//! its version `computePodActions`): given the pod's spec, what the runtime
//! shows of its containers, what the probes said and the time, [`PodBook`]
//! returns the actions one sync takes and when to look again. It makes no
//! call: [`crate::worker::PodWorker`] is the I/O around it, and tells the
//! book how each start went.
//!
//! The rules, in the order a sync applies them (the worker first keeps
//! the newest ready sandbox or makes one, as [`sandbox_plan`] says):
//! - containers whose names the spec no longer has go;
//! - init containers one at a time, in order: the first that has not
//!   exited 0 is (re)started, and nothing after it runs or is probed; with
//!   `restartPolicy: Never` one that failed stops the pod there;
//! - then every container: dead ones beyond `max_dead_per_container` go
//!   (the latest is kept, for its logs); a running one with the same spec
//!   is left alone unless a probe says kill; a created one is started; one
//!   whose spec changed is replaced at once; one of unknown state is
//!   stopped and restarted; an exited one is restarted as
//!   `restartPolicy` says (always for a new spec), after a crash-loop
//!   back-off that doubles per restart up to `backoff_max` and is forgotten
//!   once twice that passed since the last restart;
//! - a start waits out the image-pull back-off of earlier failed pulls.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use apis::k8s::{Container, PodSpec};

use crate::config::EdgedConfig;
use crate::observed::{Observed, RunState, SandboxSeen, Seen};
pub use crate::policy::{PullPolicy, RestartPolicy};
use crate::probes::Verdict;
use crate::spec;

/// The timing and limits the rules use (from [`EdgedConfig`]).
#[derive(Debug, Clone)]
pub struct Limits {
    /// First crash-loop and image-pull back-off; doubles per failure.
    pub backoff_initial: Duration,
    /// The longest back-off.
    pub backoff_max: Duration,
    /// How often the runtime is listed anyway.
    pub relist_period: Duration,
    /// Dead containers kept per container name (at least the latest).
    pub max_dead_per_container: usize,
}

impl From<&EdgedConfig> for Limits {
    fn from(config: &EdgedConfig) -> Self {
        Limits {
            backoff_initial: config.backoff_initial,
            backoff_max: config.backoff_max,
            relist_period: config.relist_period,
            max_dead_per_container: config.max_dead_per_container,
        }
    }
}

/// One thing a sync does to the runtime, in the order given.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Stop the container with `grace` seconds, then remove it.
    Remove {
        /// The runtime's id.
        id: String,
        /// Seconds to stop in.
        grace: i64,
        /// Why it goes.
        why: Removal,
    },
    /// Start a container that was created but never started.
    StartCreated {
        /// The container's name.
        name: String,
        /// The runtime's id.
        id: String,
    },
    /// Stop a container a probe failed (the next sync restarts it as the
    /// policy says), or one of unknown state before its restart.
    Kill {
        /// The container's name.
        name: String,
        /// The runtime's id.
        id: String,
        /// Seconds to stop in.
        grace: i64,
        /// Why, from the probe.
        reason: String,
    },
    /// Pull the container's image as `pull` says, make the container as
    /// start `attempt` (the worker goes past the attempts whose logs are on
    /// disk) and start it.
    Start {
        /// The container's name.
        name: String,
        /// Whether it is an init container.
        init: bool,
        /// The proposed attempt.
        attempt: u32,
        /// How its image is pulled.
        pull: PullPolicy,
    },
}

/// Why a container is removed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Removal {
    /// Its name is no longer in the spec.
    Stray,
    /// A dead one beyond `max_dead_per_container`.
    Dead,
    /// Its spec changed: a new one replaces it.
    SpecChanged,
}

/// What one sync does, and when to sync again without a signal.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Plan {
    /// The actions, in order.
    pub actions: Vec<Action>,
    /// When to look again (a back-off's end, a probe due); `None`: only on
    /// a signal.
    pub wake: Option<Instant>,
}

impl Plan {
    fn wake_at(&mut self, at: Option<Instant>) {
        self.wake = earliest(self.wake, at);
    }
}

/// The earlier of two wake-ups.
pub fn earliest(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// Why a container is not running, for edged's own reasons (a pull that
/// failed, a config that cannot be made, a back-off): its status says
/// `waiting` with these.
#[derive(Debug, Clone, PartialEq)]
pub struct Waiting {
    /// Kubernetes' reason, e.g. `CrashLoopBackOff`.
    pub reason: String,
    /// Said to the user.
    pub message: String,
}

/// Failures of one kind (restarts, pulls) of one container, and when the
/// next may be tried. As the kubelet's back-off, it is forgotten once
/// twice the longest back-off passed since the last failure (the
/// container ran that long, or nothing was tried).
#[derive(Debug, Default, Clone, PartialEq)]
struct Backoff {
    failures: u32,
    /// When the last failure was counted, and until when the next waits.
    last: Option<(Instant, Instant)>,
}

impl Backoff {
    fn until(&self) -> Option<Instant> {
        self.last.map(|(_, until)| until)
    }

    fn ready(&self, now: Instant) -> bool {
        self.until().is_none_or(|until| until <= now)
    }

    fn fail(&mut self, now: Instant, limits: &Limits) {
        if self
            .last
            .is_some_and(|(at, _)| now.saturating_duration_since(at) > limits.backoff_max * 2)
        {
            self.failures = 0;
        }
        let delay = limits
            .backoff_initial
            .saturating_mul(2u32.saturating_pow(self.failures.min(16)))
            .min(limits.backoff_max);
        self.failures += 1;
        self.last = Some((now, now + delay));
    }
}

/// What a pod's sync remembers between passes: back-offs, the last attempt
/// started per container, why containers wait, and what the probes said of
/// readiness.
#[derive(Debug, Default, Clone)]
pub struct PodBook {
    waiting: HashMap<String, Waiting>,
    restarts: HashMap<String, Backoff>,
    pulls: HashMap<String, Backoff>,
    attempts: HashMap<String, u32>,
    ready: HashMap<String, bool>,
}

impl PodBook {
    /// Why `name` waits, if edged holds it back.
    pub fn waiting(&self, name: &str) -> Option<&Waiting> {
        self.waiting.get(name)
    }

    /// What the probes last said of `name`'s readiness (`None`: not probed
    /// since it started).
    pub fn ready(&self, name: &str) -> Option<bool> {
        self.ready.get(name).copied()
    }

    /// The containers whose probes are to run before [`PodBook::plan`]:
    /// those the plan visits (the first unfinished init container, or every
    /// container once the init containers succeeded) that run with their
    /// spec's hash.
    pub fn to_probe<'a>(
        spec: &'a PodSpec,
        observed: &'a HashMap<String, Observed>,
    ) -> Vec<(&'a Container, &'a Seen)> {
        visited(spec, observed)
            .into_iter()
            .filter_map(|(container, _)| {
                let latest = observed.get(&container.name)?.latest.as_ref()?;
                (latest.state == RunState::Running && same_spec(latest, container))
                    .then_some((container, latest))
            })
            .collect()
    }

    /// The actions of one sync of `spec`, given what the runtime shows, the
    /// probes' `verdicts` by container name, and the time `now`. `pod`
    /// names the pod in messages.
    pub fn plan(
        &mut self,
        pod: &str,
        spec: &PodSpec,
        mut observed: HashMap<String, Observed>,
        verdicts: &HashMap<String, Verdict>,
        now: Instant,
        limits: &Limits,
    ) -> Plan {
        let mut plan = Plan::default();
        let grace = grace(spec);
        // Containers of names no longer in the spec go.
        let mut strays: Vec<String> = observed
            .keys()
            .filter(|name| containers(spec).all(|(c, _)| c.name != **name))
            .cloned()
            .collect();
        strays.sort();
        for name in strays {
            if let Some(seen) = observed.remove(&name) {
                let ids = seen.latest.into_iter().map(|s| s.id).chain(seen.older);
                plan.actions.extend(ids.map(|id| Action::Remove {
                    id,
                    grace: 0,
                    why: Removal::Stray,
                }));
            }
        }
        let context = Context {
            pod,
            policy: RestartPolicy::of(spec),
            grace,
            now,
            limits,
        };
        for (container, init) in visited(spec, &observed) {
            let seen = observed.get(&container.name).cloned().unwrap_or_default();
            self.container(&mut plan, &context, container, seen, verdicts, init);
        }
        plan
    }

    /// Brings one container to what the spec wants.
    fn container(
        &mut self,
        plan: &mut Plan,
        context: &Context<'_>,
        container: &Container,
        seen: Observed,
        verdicts: &HashMap<String, Verdict>,
        init: bool,
    ) {
        let name = &container.name;
        // Dead containers beyond the limit go, oldest first; the latest is
        // always kept, for its logs.
        let keep = context.limits.max_dead_per_container.saturating_sub(1);
        let excess = seen.older.len().saturating_sub(keep);
        plan.actions
            .extend(seen.older[..excess].iter().map(|id| Action::Remove {
                id: id.clone(),
                grace: 0,
                why: Removal::Dead,
            }));
        let Some(latest) = seen.latest else {
            self.start(plan, context, container, init, 0);
            return;
        };
        let same = same_spec(&latest, container);
        match latest.state {
            RunState::Running if same => {
                self.waiting.remove(name);
                let Some(verdict) = verdicts.get(name) else {
                    return;
                };
                self.ready.insert(name.clone(), verdict.ready);
                match &verdict.kill {
                    Some(reason) => {
                        plan.actions.push(Action::Kill {
                            name: name.clone(),
                            id: latest.id,
                            grace: context.grace,
                            reason: reason.clone(),
                        });
                        // The next pass restarts it as the policy says.
                        plan.wake_at(Some(context.now));
                    }
                    None => plan.wake_at(verdict.next),
                }
            }
            RunState::Created if same => {
                plan.actions.push(Action::StartCreated {
                    name: name.clone(),
                    id: latest.id,
                });
            }
            RunState::Running | RunState::Created => {
                // Its spec changed: replaced at once.
                plan.actions.push(Action::Remove {
                    id: latest.id,
                    grace: context.grace,
                    why: Removal::SpecChanged,
                });
                self.start(plan, context, container, init, latest.attempt + 1);
            }
            RunState::Exited | RunState::Unknown => {
                // Exited: restarted as the policy says (always for a new
                // spec), after the crash-loop back-off. Of unknown state:
                // stopped, then always restarted (as the kubelet does).
                if latest.state == RunState::Unknown {
                    plan.actions.push(Action::Kill {
                        name: name.clone(),
                        id: latest.id.clone(),
                        grace: context.grace,
                        reason: "the runtime does not know its state".to_owned(),
                    });
                } else if same && !context.policy.restarts(latest.exit_code, init) {
                    self.waiting.remove(name);
                    return;
                }
                let backoff = self.restarts.entry(name.clone()).or_default();
                if !backoff.ready(context.now) {
                    let until = backoff.until();
                    self.waiting.insert(
                        name.clone(),
                        Waiting {
                            reason: "CrashLoopBackOff".to_owned(),
                            message: format!(
                                "back-off restarting failed container {name} in pod {}",
                                context.pod
                            ),
                        },
                    );
                    plan.wake_at(until);
                    return;
                }
                backoff.fail(context.now, context.limits);
                // Look again when the next restart would be allowed.
                plan.wake_at(backoff.until());
                // The old one stays, as the latest dead one, until the
                // limit of dead containers trims it on a later pass.
                self.start(plan, context, container, init, latest.attempt + 1);
            }
        }
    }

    /// A start of `container`, unless its image-pull back-off holds it.
    fn start(
        &mut self,
        plan: &mut Plan,
        context: &Context<'_>,
        container: &Container,
        init: bool,
        attempt: u32,
    ) {
        let name = &container.name;
        let pulls = self.pulls.get(name).cloned().unwrap_or_default();
        if !pulls.ready(context.now) {
            let image = container.image.as_deref().unwrap_or_default();
            self.waiting.insert(
                name.clone(),
                Waiting {
                    reason: "ImagePullBackOff".to_owned(),
                    message: format!("back-off pulling image {image:?}"),
                },
            );
            plan.wake_at(pulls.until());
            return;
        }
        plan.actions.push(Action::Start {
            name: name.clone(),
            init,
            attempt: self.attempt(name, attempt),
            pull: PullPolicy::of(container),
        });
    }

    /// The attempt to start `name` as: `proposed`, or past the last one
    /// started (attempts only grow, also across a lost container or
    /// sandbox, so restart counts and log files stay right).
    pub fn attempt(&self, name: &str, proposed: u32) -> u32 {
        proposed.max(self.attempts.get(name).map_or(0, |last| last + 1))
    }

    /// The image of `name` is there: its pull back-off ends, and what the
    /// probes said of the old container no longer holds.
    pub fn pulled(&mut self, name: &str) {
        self.pulls.remove(name);
        self.ready.remove(name);
    }

    /// The pull for `name` failed with `message`; when to look again (soon,
    /// to say it is backing off, and once the back-off ends).
    pub fn pull_failed(
        &mut self,
        name: &str,
        pull: PullPolicy,
        message: String,
        now: Instant,
        limits: &Limits,
    ) -> Instant {
        let backoff = self.pulls.entry(name.to_owned()).or_default();
        backoff.fail(now, limits);
        let reason = if pull == PullPolicy::Never {
            "ErrImageNeverPull"
        } else {
            "ErrImagePull"
        };
        let until = backoff.until();
        self.waiting.insert(
            name.to_owned(),
            Waiting {
                reason: reason.to_owned(),
                message,
            },
        );
        let soon = now + limits.relist_period.min(limits.backoff_initial / 2);
        until.map_or(soon, |until| until.min(soon))
    }

    /// `name` could not be made or started (`reason` as Kubernetes names
    /// it); when to try again.
    pub fn start_failed(
        &mut self,
        name: &str,
        reason: &str,
        message: String,
        now: Instant,
        limits: &Limits,
    ) -> Instant {
        self.waiting.insert(
            name.to_owned(),
            Waiting {
                reason: reason.to_owned(),
                message,
            },
        );
        now + limits.backoff_initial
    }

    /// `name` was created as `attempt`.
    pub fn created(&mut self, name: &str, attempt: u32) {
        self.attempts.insert(name.to_owned(), attempt);
    }

    /// `name` started.
    pub fn started(&mut self, name: &str) {
        self.waiting.remove(name);
    }
}

/// What every container's rules in one plan share.
struct Context<'a> {
    pod: &'a str,
    policy: RestartPolicy,
    grace: i64,
    now: Instant,
    limits: &'a Limits,
}

/// The spec's containers, init ones first, each with whether it is one.
pub fn containers(spec: &PodSpec) -> impl Iterator<Item = (&Container, bool)> {
    spec.init_containers
        .iter()
        .flatten()
        .map(|c| (c, true))
        .chain(spec.containers.iter().map(|c| (c, false)))
}

/// The containers one sync brings in line, in order: init containers up
/// to the first that has not exited 0 (none when one failed under
/// `restartPolicy: Never`: the pod stops there), or, once all of them
/// succeeded, every container.
fn visited<'a>(
    spec: &'a PodSpec,
    observed: &HashMap<String, Observed>,
) -> Vec<(&'a Container, bool)> {
    for init in spec.init_containers.iter().flatten() {
        let latest = observed.get(&init.name).and_then(|o| o.latest.as_ref());
        match latest.map(|s| (s.state, s.exit_code)) {
            Some((RunState::Exited, 0)) => continue,
            Some((RunState::Exited, _)) if RestartPolicy::of(spec) == RestartPolicy::Never => {
                return Vec::new();
            }
            _ => return vec![(init, true)],
        }
    }
    spec.containers.iter().map(|c| (c, false)).collect()
}

/// Whether `seen` was made from `container`'s spec as it is now.
fn same_spec(seen: &Seen, container: &Container) -> bool {
    seen.spec_hash.as_deref() == Some(spec::spec_hash(container).as_str())
}

/// The pod's termination grace period, in seconds (30 when unset).
pub fn grace(spec: &PodSpec) -> i64 {
    spec.termination_grace_period_seconds.unwrap_or(30)
}

/// What to do with a pod's sandboxes.
#[derive(Debug, Clone, PartialEq)]
pub enum SandboxPlan {
    /// Use `id`, the newest ready one; `remove` the others.
    Keep {
        /// The one kept.
        id: String,
        /// The others.
        remove: Vec<String>,
    },
    /// None is ready: `remove` them all and make one as `attempt`.
    Create {
        /// The next attempt.
        attempt: u32,
        /// Every one there is.
        remove: Vec<String>,
    },
}

/// The newest ready sandbox is kept; with none ready, all go and the next
/// attempt is made.
pub fn sandbox_plan(sandboxes: &[SandboxSeen]) -> SandboxPlan {
    let ready = sandboxes
        .iter()
        .filter(|s| s.ready)
        .max_by_key(|s| s.created_at);
    match ready {
        Some(kept) => SandboxPlan::Keep {
            id: kept.id.clone(),
            remove: sandboxes
                .iter()
                .filter(|s| s.id != kept.id)
                .map(|s| s.id.clone())
                .collect(),
        },
        None => SandboxPlan::Create {
            attempt: sandboxes.iter().map(|s| s.attempt + 1).max().unwrap_or(0),
            remove: sandboxes.iter().map(|s| s.id.clone()).collect(),
        },
    }
}

#[cfg(test)]
mod tests;
