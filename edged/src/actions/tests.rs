//! The pod's rules, deterministic cases first, then a seeded simulator of a
//! runtime whose containers exit, pulls fail and specs change at random.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use apis::k8s::{Container, PodSpec};

use super::*;
use crate::status::{Placement, pod_status};

const POD: &str = "default/web";

fn limits() -> Limits {
    Limits {
        backoff_initial: Duration::from_secs(10),
        backoff_max: Duration::from_secs(300),
        relist_period: Duration::from_secs(1),
        max_dead_per_container: 1,
    }
}

fn container(name: &str, image: &str) -> Container {
    Container {
        name: name.to_owned(),
        image: Some(image.to_owned()),
        ..Default::default()
    }
}

fn pod_spec(init: &[&Container], containers: &[&Container], policy: &str) -> PodSpec {
    let owned = |all: &[&Container]| all.iter().map(|c| (*c).clone()).collect::<Vec<_>>();
    PodSpec {
        init_containers: Some(owned(init)).filter(|i| !i.is_empty()),
        containers: owned(containers),
        restart_policy: Some(policy.to_owned()),
        ..Default::default()
    }
}

/// A container of `of`'s spec as the runtime shows it.
fn seen(of: &Container, id: &str, state: RunState, exit_code: i32, attempt: u32) -> Seen {
    Seen {
        id: id.to_owned(),
        state,
        exit_code,
        attempt,
        spec_hash: Some(spec::spec_hash(of)),
        started_at: 1_700_000_000_000_000_000,
        finished_at: 0,
        reason: String::new(),
        message: String::new(),
        image_ref: String::new(),
    }
}

fn observed(containers: &[(&Container, Seen)]) -> HashMap<String, Observed> {
    Observed::group(
        containers
            .iter()
            .map(|(c, s)| (c.name.clone(), s.clone()))
            .collect(),
    )
}

fn plan(book: &mut PodBook, spec: &PodSpec, seen: HashMap<String, Observed>, now: Instant) -> Plan {
    book.plan(POD, spec, seen, &HashMap::new(), now, &limits())
}

fn start(name: &str, init: bool, attempt: u32) -> Action {
    Action::Start {
        name: name.to_owned(),
        init,
        attempt,
        pull: PullPolicy::IfNotPresent,
    }
}

#[test]
fn init_containers_run_one_at_a_time_before_the_containers() {
    let (first, second, app) = (
        container("first", "busybox:1"),
        container("second", "busybox:1"),
        container("app", "busybox:1"),
    );
    let spec = pod_spec(&[&first, &second], &[&app], "Always");
    let mut book = PodBook::default();
    let now = Instant::now();
    let fresh = plan(&mut book, &spec, HashMap::new(), now);
    assert_eq!(fresh.actions, vec![start("first", true, 0)]);

    let running = observed(&[(&first, seen(&first, "f0", RunState::Running, 0, 0))]);
    assert!(plan(&mut book, &spec, running, now).actions.is_empty());

    let done = observed(&[(&first, seen(&first, "f0", RunState::Exited, 0, 0))]);
    assert_eq!(
        plan(&mut book, &spec, done, now).actions,
        vec![start("second", true, 0)]
    );

    let both = observed(&[
        (&first, seen(&first, "f0", RunState::Exited, 0, 0)),
        (&second, seen(&second, "s0", RunState::Exited, 0, 0)),
    ]);
    assert_eq!(
        plan(&mut book, &spec, both, now).actions,
        vec![start("app", false, 0)]
    );
}

#[test]
fn a_failed_init_container_stops_a_never_pod_and_is_retried_otherwise() {
    let (init, app) = (
        container("init", "busybox:1"),
        container("app", "busybox:1"),
    );
    let failed = || observed(&[(&init, seen(&init, "i0", RunState::Exited, 1, 0))]);
    let now = Instant::now();

    let never = pod_spec(&[&init], &[&app], "Never");
    let stopped = plan(&mut PodBook::default(), &never, failed(), now);
    assert_eq!(stopped, Plan::default());

    let always = pod_spec(&[&init], &[&app], "Always");
    let retried = plan(&mut PodBook::default(), &always, failed(), now);
    assert_eq!(retried.actions, vec![start("init", true, 1)]);
    assert_eq!(retried.wake, Some(now + Duration::from_secs(10)));
}

#[test]
fn a_crashing_container_backs_off_doubling_then_waits_in_crash_loop_back_off() {
    let app = container("app", "busybox:1");
    let spec = pod_spec(&[], &[&app], "Always");
    let mut book = PodBook::default();
    let t0 = Instant::now();
    let crashed = |attempt| {
        observed(&[(
            &app,
            seen(&app, &format!("a{attempt}"), RunState::Exited, 1, attempt),
        )])
    };

    let first = plan(&mut book, &spec, crashed(0), t0);
    assert_eq!(first.actions, vec![start("app", false, 1)]);
    assert_eq!(first.wake, Some(t0 + Duration::from_secs(10)));

    let early = plan(&mut book, &spec, crashed(1), t0 + Duration::from_secs(3));
    assert!(early.actions.is_empty());
    assert_eq!(early.wake, Some(t0 + Duration::from_secs(10)));
    assert_eq!(
        book.waiting("app").map(|w| w.reason.as_str()),
        Some("CrashLoopBackOff")
    );

    let t1 = t0 + Duration::from_secs(10);
    let second = plan(&mut book, &spec, crashed(1), t1);
    assert_eq!(second.actions, vec![start("app", false, 2)]);
    assert_eq!(second.wake, Some(t1 + Duration::from_secs(20)));
}

#[test]
fn the_back_off_tops_out_and_is_forgotten_after_twice_the_longest() {
    let app = container("app", "busybox:1");
    let spec = pod_spec(&[], &[&app], "Always");
    let mut book = PodBook::default();
    let mut now = Instant::now();
    let mut delays = Vec::new();
    for attempt in 0..8 {
        let crashed = observed(&[(&app, seen(&app, "a", RunState::Exited, 1, attempt))]);
        let planned = plan(&mut book, &spec, crashed, now);
        assert_eq!(planned.actions.len(), 1, "attempt {attempt}");
        delays.push(planned.wake.map(|w| (w - now).as_secs()));
        now += Duration::from_secs(300);
    }
    let expected = [10, 20, 40, 80, 160, 300, 300, 300].map(Some);
    assert_eq!(delays, expected);
    // It ran for over twice the longest back-off since its last restart:
    // the next crash restarts it with the first delay again.
    now += Duration::from_secs(301);
    let crashed = observed(&[(&app, seen(&app, "b", RunState::Exited, 1, 8))]);
    let restarted = plan(&mut book, &spec, crashed, now);
    assert_eq!(restarted.wake, Some(now + Duration::from_secs(10)));
}

#[test]
fn a_created_container_is_started_or_replaced_if_its_spec_changed() {
    let old = container("app", "busybox:1");
    let new = container("app", "busybox:2");
    let created = || observed(&[(&old, seen(&old, "a0", RunState::Created, 0, 0))]);
    let now = Instant::now();
    let same = plan(
        &mut PodBook::default(),
        &pod_spec(&[], &[&old], "Always"),
        created(),
        now,
    );
    assert_eq!(
        same.actions,
        vec![Action::StartCreated {
            name: "app".to_owned(),
            id: "a0".to_owned()
        }]
    );
    let changed = plan(
        &mut PodBook::default(),
        &pod_spec(&[], &[&new], "Always"),
        created(),
        now,
    );
    assert_eq!(
        changed.actions,
        vec![
            Action::Remove {
                id: "a0".to_owned(),
                grace: 30,
                why: Removal::SpecChanged
            },
            start("app", false, 1)
        ]
    );
}

#[test]
fn containers_are_not_probed_while_an_init_container_reruns() {
    let (init, app) = (
        container("init", "busybox:2"),
        container("app", "busybox:1"),
    );
    let old_init = container("init", "busybox:1");
    let spec = pod_spec(&[&init], &[&app], "Always");
    let rerun = observed(&[
        (&old_init, seen(&old_init, "i0", RunState::Exited, 1, 0)),
        (&app, seen(&app, "a0", RunState::Running, 0, 0)),
    ]);
    assert!(PodBook::to_probe(&spec, &rerun).is_empty());
    let done = observed(&[
        (&init, seen(&init, "i1", RunState::Exited, 0, 1)),
        (&app, seen(&app, "a0", RunState::Running, 0, 0)),
    ]);
    let probed: Vec<&str> = PodBook::to_probe(&spec, &done)
        .into_iter()
        .map(|(c, _)| c.name.as_str())
        .collect();
    assert_eq!(probed, vec!["app"]);
}

#[test]
fn restart_policies_decide_what_runs_again() {
    let app = container("app", "busybox:1");
    let now = Instant::now();
    let exited = |code| observed(&[(&app, seen(&app, "a0", RunState::Exited, code, 0))]);
    let restarts = |policy: &str, code| {
        let spec = pod_spec(&[], &[&app], policy);
        !plan(&mut PodBook::default(), &spec, exited(code), now)
            .actions
            .is_empty()
    };
    assert!(restarts("Always", 0));
    assert!(restarts("Always", 1));
    assert!(!restarts("OnFailure", 0));
    assert!(restarts("OnFailure", 1));
    assert!(!restarts("Never", 0));
    assert!(!restarts("Never", 1));
}

#[test]
fn a_changed_spec_replaces_the_container_at_once_with_its_grace() {
    let old = container("app", "busybox:1");
    let new = container("app", "busybox:2");
    let mut spec = pod_spec(&[], &[&new], "Never");
    spec.termination_grace_period_seconds = Some(7);
    let running = observed(&[(&old, seen(&old, "a0", RunState::Running, 0, 0))]);
    let replaced = plan(&mut PodBook::default(), &spec, running, Instant::now());
    assert_eq!(
        replaced.actions,
        vec![
            Action::Remove {
                id: "a0".to_owned(),
                grace: 7,
                why: Removal::SpecChanged
            },
            start("app", false, 1),
        ]
    );
}

#[test]
fn probes_kill_a_container_or_say_whether_it_is_ready() {
    let app = container("app", "busybox:1");
    let spec = pod_spec(&[], &[&app], "Always");
    let running = || observed(&[(&app, seen(&app, "a0", RunState::Running, 0, 0))]);
    let now = Instant::now();
    let mut book = PodBook::default();
    let due = now + Duration::from_secs(5);
    let verdicts = HashMap::from([(
        "app".to_owned(),
        Verdict {
            ready: false,
            kill: None,
            next: Some(due),
        },
    )]);
    let probed = book.plan(POD, &spec, running(), &verdicts, now, &limits());
    assert_eq!(
        probed,
        Plan {
            actions: vec![],
            wake: Some(due)
        }
    );
    assert_eq!(book.ready("app"), Some(false));

    let verdicts = HashMap::from([(
        "app".to_owned(),
        Verdict {
            ready: false,
            kill: Some("liveness probe failed".to_owned()),
            next: None,
        },
    )]);
    let killed = book.plan(POD, &spec, running(), &verdicts, now, &limits());
    assert_eq!(
        killed.actions,
        vec![Action::Kill {
            name: "app".to_owned(),
            id: "a0".to_owned(),
            grace: 30,
            reason: "liveness probe failed".to_owned()
        }]
    );
    assert_eq!(killed.wake, Some(now));
}

#[test]
fn a_failed_pull_backs_off_then_is_tried_again() {
    let app = container("app", "registry.local/app:1");
    let spec = pod_spec(&[], &[&app], "Always");
    let mut book = PodBook::default();
    let now = Instant::now();
    assert_eq!(plan(&mut book, &spec, HashMap::new(), now).actions.len(), 1);
    let wake = book.pull_failed(
        "app",
        PullPolicy::IfNotPresent,
        "not found".to_owned(),
        now,
        &limits(),
    );
    assert_eq!(wake, now + Duration::from_secs(1));
    assert_eq!(
        book.waiting("app").map(|w| w.reason.as_str()),
        Some("ErrImagePull")
    );

    let held = plan(&mut book, &spec, HashMap::new(), wake);
    assert!(held.actions.is_empty());
    assert_eq!(held.wake, Some(now + Duration::from_secs(10)));
    assert_eq!(
        book.waiting("app").map(|w| w.reason.as_str()),
        Some("ImagePullBackOff")
    );

    let retried = plan(
        &mut book,
        &spec,
        HashMap::new(),
        now + Duration::from_secs(10),
    );
    assert_eq!(retried.actions.len(), 1);
    book.pulled("app");
    book.created("app", 0);
    book.started("app");
    assert_eq!(book.waiting("app"), None);
}

#[test]
fn dead_containers_beyond_the_limit_and_strays_go() {
    let app = container("app", "busybox:1");
    let gone = container("gone", "busybox:1");
    let spec = pod_spec(&[], &[&app], "Always");
    let seen_now = observed(&[
        (&app, seen(&app, "a0", RunState::Exited, 1, 0)),
        (&app, seen(&app, "a1", RunState::Exited, 1, 1)),
        (&app, seen(&app, "a2", RunState::Running, 0, 2)),
        (&gone, seen(&gone, "g0", RunState::Running, 0, 0)),
    ]);
    let planned = plan(&mut PodBook::default(), &spec, seen_now, Instant::now());
    let removed: Vec<&str> = planned
        .actions
        .iter()
        .filter_map(|a| match a {
            Action::Remove { id, .. } => Some(id.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(removed, vec!["g0", "a0", "a1"]);
}

#[test]
fn attempts_only_grow_across_a_lost_sandbox() {
    let app = container("app", "busybox:1");
    let spec = pod_spec(&[], &[&app], "Always");
    let mut book = PodBook::default();
    book.created("app", 4);
    let planned = plan(&mut book, &spec, HashMap::new(), Instant::now());
    assert_eq!(planned.actions, vec![start("app", false, 5)]);
}

#[test]
fn the_newest_ready_sandbox_is_kept_and_a_new_one_follows_the_highest_attempt() {
    let sandbox = |id: &str, ready, created_at, attempt| SandboxSeen {
        id: id.to_owned(),
        ready,
        created_at,
        attempt,
    };
    assert_eq!(
        sandbox_plan(&[
            sandbox("a", true, 1, 0),
            sandbox("b", true, 2, 1),
            sandbox("c", false, 3, 2)
        ]),
        SandboxPlan::Keep {
            id: "b".to_owned(),
            remove: vec!["a".to_owned(), "c".to_owned()]
        }
    );
    assert_eq!(
        sandbox_plan(&[sandbox("a", false, 1, 0), sandbox("c", false, 3, 2)]),
        SandboxPlan::Create {
            attempt: 3,
            remove: vec!["a".to_owned(), "c".to_owned()]
        }
    );
    assert_eq!(
        sandbox_plan(&[]),
        SandboxPlan::Create {
            attempt: 0,
            remove: vec![]
        }
    );
}

#[test]
fn the_status_follows_the_containers_and_the_policy() {
    let (init, app) = (
        container("init", "busybox:1"),
        container("app", "busybox:1"),
    );
    let placement = Placement {
        sandbox: None,
        sandbox_error: None,
        node_ip: "10.0.0.1",
    };
    let book = PodBook::default();
    let phase = |policy: &str, seen_now: &[(&Container, Seen)]| {
        let spec = pod_spec(&[&init], &[&app], policy);
        pod_status(&spec, &observed(seen_now), &book, placement)
            .phase
            .unwrap_or_default()
    };
    let init_done = (&init, seen(&init, "i0", RunState::Exited, 0, 0));
    assert_eq!(phase("Always", &[]), "Pending");
    assert_eq!(
        phase(
            "Never",
            &[(&init, seen(&init, "i0", RunState::Exited, 2, 0))]
        ),
        "Failed"
    );
    assert_eq!(
        phase(
            "Always",
            &[
                init_done.clone(),
                (&app, seen(&app, "a3", RunState::Running, 0, 3))
            ]
        ),
        "Running"
    );
    assert_eq!(
        phase(
            "OnFailure",
            &[
                init_done.clone(),
                (&app, seen(&app, "a0", RunState::Exited, 0, 0))
            ]
        ),
        "Succeeded"
    );
    assert_eq!(
        phase(
            "Never",
            &[
                init_done.clone(),
                (&app, seen(&app, "a0", RunState::Exited, 1, 0))
            ]
        ),
        "Failed"
    );
    let spec = pod_spec(&[&init], &[&app], "Always");
    let status = pod_status(
        &spec,
        &observed(&[init_done, (&app, seen(&app, "a3", RunState::Running, 0, 3))]),
        &book,
        placement,
    );
    let app_status = status.container_statuses.unwrap_or_default();
    assert_eq!(app_status[0].restart_count, 3);
    assert!(app_status[0].ready);
    assert_eq!(status.host_ip.as_deref(), Some("10.0.0.1"));
}

/// A runtime for the simulator: containers that exit at random.
struct Runtime {
    containers: Vec<SimContainer>,
    next_id: u32,
}

#[derive(Debug, Clone)]
struct SimContainer {
    name: String,
    seen: Seen,
}

impl Runtime {
    fn observed(&self) -> HashMap<String, Observed> {
        Observed::group(
            self.containers
                .iter()
                .map(|c| (c.name.clone(), c.seen.clone()))
                .collect(),
        )
    }

    fn find(&mut self, id: &str) -> Option<&mut SimContainer> {
        self.containers.iter_mut().find(|c| c.seen.id == id)
    }
}

/// What the simulator remembers to check the rules against.
#[derive(Default)]
struct History {
    /// The last attempt started per container name.
    attempts: HashMap<String, u32>,
    /// Per name: when it was last restarted after it exited, and how many
    /// such restarts came in a row (none more than twice the longest
    /// back-off apart).
    restarts: HashMap<String, (Instant, u32)>,
}

/// Whether the pod needs nothing of edged until the runtime changes (the
/// PLEG's signal): what runs, runs, and what exited stays exited.
fn settled(spec: &PodSpec, observed: &HashMap<String, Observed>) -> bool {
    let policy = RestartPolicy::of(spec);
    let latest = |c: &Container| observed.get(&c.name).and_then(|o| o.latest.clone());
    for init in spec.init_containers.iter().flatten() {
        match latest(init) {
            Some(s) if s.state == RunState::Exited && s.exit_code == 0 => {}
            Some(s) if s.state == RunState::Exited && policy == RestartPolicy::Never => {
                return true;
            }
            Some(s) if s.state == RunState::Running && same_spec(&s, init) => return true,
            _ => return false,
        }
    }
    spec.containers.iter().all(|c| match latest(c) {
        Some(s) if !same_spec(&s, c) => false,
        Some(s) if s.state == RunState::Running => true,
        Some(s) if s.state == RunState::Exited => !policy.restarts(s.exit_code, false),
        _ => false,
    })
}

/// Whether every init container of `spec` has exited 0.
fn initialized(spec: &PodSpec, observed: &HashMap<String, Observed>) -> bool {
    spec.init_containers.iter().flatten().all(|i| {
        let latest = observed.get(&i.name).and_then(|o| o.latest.as_ref());
        latest.is_some_and(|s| s.state == RunState::Exited && s.exit_code == 0)
    })
}

/// The world moves between syncs: containers exit (or vanish from the
/// runtime's knowledge), the spec changes an image or a container, and
/// now and then the sandbox goes with every container in it.
fn perturb(rng: &mut fastrand::Rng, spec: &mut PodSpec, runtime: &mut Runtime, added: &mut u32) {
    for c in &mut runtime.containers {
        if c.seen.state == RunState::Running && rng.u8(..10) < 3 {
            c.seen.state = if rng.u8(..20) == 0 {
                RunState::Unknown
            } else {
                RunState::Exited
            };
            c.seen.exit_code = i32::from(rng.bool());
        }
    }
    match rng.u8(..40) {
        0 | 1 => {
            let all: Vec<&mut Container> = spec
                .init_containers
                .iter_mut()
                .flatten()
                .chain(spec.containers.iter_mut())
                .collect();
            let len = all.len();
            if let Some(c) = all.into_iter().nth(rng.usize(..len)) {
                let images = ["busybox:2", "busybox:3", "busybox", "busybox:latest"];
                c.image = Some(images[rng.usize(..images.len())].to_owned());
            }
        }
        2 => {
            *added += 1;
            spec.containers
                .push(container(&format!("extra{added}"), "busybox:1"));
        }
        3 if spec.containers.len() > 1 => {
            spec.containers.remove(rng.usize(..spec.containers.len()));
        }
        _ => {}
    }
    if rng.u8(..50) == 0 {
        runtime.containers.clear();
    }
}

#[test]
fn a_seeded_random_runtime_keeps_every_rule() {
    for seed in 0..300u64 {
        let mut rng = fastrand::Rng::with_seed(seed);
        let limits = Limits {
            max_dead_per_container: rng.usize(1..4),
            ..limits()
        };
        let policy = ["Always", "OnFailure", "Never"][rng.usize(..3)];
        let inits: Vec<Container> = (0..rng.usize(..3))
            .map(|i| container(&format!("init{i}"), "busybox:1"))
            .collect();
        let apps: Vec<Container> = (0..rng.usize(1..4))
            .map(|i| container(&format!("app{i}"), "busybox:1"))
            .collect();
        let mut spec = pod_spec(
            &inits.iter().collect::<Vec<_>>(),
            &apps.iter().collect::<Vec<_>>(),
            policy,
        );
        let mut runtime = Runtime {
            containers: Vec::new(),
            next_id: 0,
        };
        let mut book = PodBook::default();
        let mut history = History::default();
        let mut added = 0;
        let mut now = Instant::now();
        let mut wake: Option<Instant> = None;
        for step in 0..300 {
            let at = format!("seed {seed} step {step}");
            // Time passes: to the wake-up asked for, or a random while.
            now = match wake.filter(|w| *w > now && rng.bool()) {
                Some(w) => w,
                None => now + Duration::from_millis(rng.u64(..25_000)),
            };
            perturb(&mut rng, &mut spec, &mut runtime, &mut added);
            let observed = runtime.observed();
            let to_probe = PodBook::to_probe(&spec, &observed);
            // Probed: the containers a sync visits, running as specified.
            for (c, seen) in &to_probe {
                assert!(
                    seen.state == RunState::Running && same_spec(seen, c),
                    "{at}"
                );
                if spec.containers.iter().any(|s| s.name == c.name) {
                    assert!(
                        initialized(&spec, &observed),
                        "{at}: {} probed early",
                        c.name
                    );
                }
            }
            let verdicts: HashMap<String, Verdict> = to_probe
                .iter()
                .map(|(c, _)| {
                    let verdict = Verdict {
                        ready: rng.bool(),
                        kill: (rng.u8(..20) == 0).then(|| "liveness".to_owned()),
                        next: rng.bool().then(|| now + Duration::from_secs(5)),
                    };
                    (c.name.clone(), verdict)
                })
                .collect();
            let planned = book.plan(POD, &spec, observed.clone(), &verdicts, now, &limits);
            // Every kill verdict kills, every probe due wakes the worker.
            for (name, verdict) in &verdicts {
                let killed = planned
                    .actions
                    .iter()
                    .any(|a| matches!(a, Action::Kill { name: n, .. } if n == name));
                assert_eq!(killed, verdict.kill.is_some(), "{at}: {name}");
                if let Some(next) = verdict.next {
                    assert!(
                        planned.wake.is_some_and(|w| w <= next),
                        "{at}: {name}'s probe"
                    );
                }
            }
            let acts = planned.actions.iter().any(|a| {
                matches!(
                    a,
                    Action::Start { .. } | Action::StartCreated { .. } | Action::Kill { .. }
                )
            });
            if !acts && !settled(&spec, &observed) {
                let w = planned
                    .wake
                    .unwrap_or_else(|| panic!("{at}: work left and no wake-up"));
                assert!(w <= now + limits.backoff_max, "{at}: wakes too late");
            }
            wake = planned.wake;
            for action in planned.actions {
                let woke = apply(
                    &at,
                    action,
                    Sim {
                        rng: &mut rng,
                        spec: &spec,
                        observed: &observed,
                        runtime: &mut runtime,
                        book: &mut book,
                        history: &mut history,
                        limits: &limits,
                        now,
                    },
                );
                wake = earliest(wake, woke);
            }
            // Strays are gone and dead containers stay bounded.
            for c in &runtime.containers {
                assert!(
                    containers(&spec).any(|(s, _)| s.name == c.name),
                    "{at}: stray {}",
                    c.name
                );
            }
            for (name, group) in runtime.observed() {
                let latest_dead = group.latest.is_some_and(|l| l.state != RunState::Running);
                let dead = group.older.len() + usize::from(latest_dead);
                assert!(
                    dead <= limits.max_dead_per_container + 1,
                    "{at}: {dead} dead {name}"
                );
            }
        }
    }
}

/// What one action of the simulator touches.
struct Sim<'a> {
    rng: &'a mut fastrand::Rng,
    spec: &'a PodSpec,
    observed: &'a HashMap<String, Observed>,
    runtime: &'a mut Runtime,
    book: &'a mut PodBook,
    history: &'a mut History,
    limits: &'a Limits,
    now: Instant,
}

/// Carries `action` out on the simulated runtime, checking the rules a
/// start must keep; when to look again, as the worker would say.
fn apply(at: &str, action: Action, sim: Sim<'_>) -> Option<Instant> {
    let Sim {
        rng,
        spec,
        observed,
        runtime,
        book,
        history,
        limits,
        now,
    } = sim;
    match action {
        Action::Remove { id, .. } => runtime.containers.retain(|c| c.seen.id != id),
        Action::StartCreated { name, id } => {
            if let Some(c) = runtime.find(&id) {
                c.seen.state = RunState::Running;
                book.started(&name);
            }
        }
        Action::Kill { id, .. } => {
            if let Some(c) = runtime.find(&id) {
                c.seen.state = RunState::Exited;
                c.seen.exit_code = 137;
            }
        }
        Action::Start {
            name,
            init,
            attempt,
            pull,
        } => {
            let (c, _) = containers(spec)
                .find(|(c, i)| c.name == name && *i == init)
                .unwrap_or_else(|| panic!("{at}: {name} is not in the spec"));
            let running = |r: &SimContainer| r.name == name && r.seen.state == RunState::Running;
            assert!(
                !runtime.containers.iter().any(running),
                "{at}: {name} started beside a running one"
            );
            if let Some(last) = history.attempts.get(&name) {
                assert!(
                    attempt > *last,
                    "{at}: {name} attempt {attempt} after {last}"
                );
            }
            if !init {
                assert!(
                    initialized(spec, observed),
                    "{at}: {name} before its init containers"
                );
            } else {
                // Init containers one at a time, in order.
                for earlier in spec.init_containers.iter().flatten() {
                    if earlier.name == name {
                        break;
                    }
                    let done = observed.get(&earlier.name).and_then(|o| o.latest.as_ref());
                    assert!(
                        done.is_some_and(|s| s.state == RunState::Exited && s.exit_code == 0),
                        "{at}: {name} before {}",
                        earlier.name
                    );
                }
            }
            let before = observed.get(&name).and_then(|o| o.latest.as_ref());
            let exited = |s: &&Seen| matches!(s.state, RunState::Exited | RunState::Unknown);
            if let Some(before) = before.filter(exited) {
                if same_spec(before, c) && before.state == RunState::Exited {
                    assert!(
                        RestartPolicy::of(spec).restarts(before.exit_code, init),
                        "{at}: {name} restarted against the policy"
                    );
                }
                // The crash-loop back-off: doubling, capped, forgotten after
                // twice the cap.
                let streak = match history.restarts.get(&name) {
                    Some((last, count)) if now - *last <= limits.backoff_max * 2 => {
                        let least = limits
                            .backoff_initial
                            .saturating_mul(2u32.pow((*count - 1).min(16)))
                            .min(limits.backoff_max);
                        assert!(
                            now - *last >= least,
                            "{at}: {name} restarted {:?} after the last, {count} in a row",
                            now - *last
                        );
                        count + 1
                    }
                    _ => 1,
                };
                history.restarts.insert(name.clone(), (now, streak));
            }
            let roll = rng.u8(..20);
            if roll < 3 {
                return Some(book.pull_failed(&name, pull, "no".to_owned(), now, limits));
            }
            book.pulled(&name);
            if roll < 5 {
                let reason = "CreateContainerError";
                return Some(book.start_failed(&name, reason, "no".to_owned(), now, limits));
            }
            history.attempts.insert(name.clone(), attempt);
            book.created(&name, attempt);
            runtime.next_id += 1;
            let mut made = seen(
                c,
                &format!("c{}", runtime.next_id),
                RunState::Running,
                0,
                attempt,
            );
            let woke = if roll < 6 {
                made.state = RunState::Created;
                let reason = "RunContainerError";
                Some(book.start_failed(&name, reason, "no".to_owned(), now, limits))
            } else {
                book.started(&name);
                None
            };
            runtime.containers.push(SimContainer { name, seen: made });
            return woke;
        }
    }
    None
}

#[test]
fn a_container_of_unknown_state_is_stopped_and_restarted_whatever_the_policy() {
    let init = container("init", "busybox:1");
    let app = container("app", "busybox:1");
    let spec = pod_spec(&[&init], &[&app], "Never");
    let unknown = observed(&[(&init, seen(&init, "i0", RunState::Unknown, 0, 0))]);
    let planned = plan(&mut PodBook::default(), &spec, unknown, Instant::now());
    assert_eq!(
        planned.actions,
        vec![
            Action::Kill {
                name: "init".to_owned(),
                id: "i0".to_owned(),
                grace: 30,
                reason: "the runtime does not know its state".to_owned()
            },
            start("init", true, 1)
        ]
    );
}
