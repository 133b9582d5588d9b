//! The pod's rules, deterministic cases first, then a seeded simulator of a
//! runtime whose containers exit, pulls fail and specs change at random.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Container, PodSpec};

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

/// The wall clock a little after the containers' start.
fn wall() -> Duration {
    Duration::from_secs(1_700_000_060)
}

fn plan(book: &mut PodBook, spec: &PodSpec, seen: HashMap<String, Observed>, now: Instant) -> Plan {
    book.plan(
        POD,
        spec,
        seen,
        &HashMap::new(),
        Now {
            at: now,
            wall: wall(),
        },
        &limits(),
    )
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
fn the_back_off_tops_out_and_starts_over_after_a_long_run() {
    let app = container("app", "busybox:1");
    let spec = pod_spec(&[], &[&app], "Always");
    let mut book = PodBook::default();
    let mut now = Instant::now();
    for attempt in 0..10 {
        let crashed = observed(&[(&app, seen(&app, "a", RunState::Exited, 1, attempt))]);
        let planned = plan(&mut book, &spec, crashed, now);
        assert_eq!(planned.actions.len(), 1, "attempt {attempt}");
        let delay = planned.wake.map(|w| w - now);
        assert!(delay <= Some(Duration::from_secs(300)), "{delay:?}");
        now += Duration::from_secs(300);
    }
    // Running for over twice the longest back-off: the next crash restarts
    // at once with the first delay.
    let mut long = seen(&app, "b", RunState::Running, 0, 10);
    long.started_at = 1_699_999_000_000_000_000;
    plan(&mut book, &spec, observed(&[(&app, long)]), now);
    let crashed = observed(&[(&app, seen(&app, "b", RunState::Exited, 1, 10))]);
    let restarted = plan(&mut book, &spec, crashed, now);
    assert_eq!(restarted.wake, Some(now + Duration::from_secs(10)));
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
                grace: 7
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
    let probed = book.plan(
        POD,
        &spec,
        running(),
        &verdicts,
        Now {
            at: now,
            wall: wall(),
        },
        &limits(),
    );
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
    let killed = book.plan(
        POD,
        &spec,
        running(),
        &verdicts,
        Now {
            at: now,
            wall: wall(),
        },
        &limits(),
    );
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
    /// When each name was last restarted after it exited.
    restarted: HashMap<String, Instant>,
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

#[test]
fn a_seeded_random_runtime_keeps_every_rule() {
    let limits = limits();
    for seed in 0..300u64 {
        let mut rng = fastrand::Rng::with_seed(seed);
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
        let t0 = Instant::now();
        let mut now = t0;
        let mut wall = Duration::from_secs(1_700_000_000);
        for step in 0..300 {
            let at = format!("seed {seed} step {step}");
            // The world moves: time, exits, a spec change, a lost sandbox.
            let passed = Duration::from_millis(rng.u64(..25_000));
            now += passed;
            wall += passed;
            for c in &mut runtime.containers {
                if c.seen.state == RunState::Running && rng.u8(..10) < 3 {
                    c.seen.state = RunState::Exited;
                    c.seen.exit_code = i32::from(rng.bool());
                }
            }
            if rng.u8(..20) == 0 {
                let all = spec
                    .init_containers
                    .iter_mut()
                    .flatten()
                    .chain(spec.containers.iter_mut());
                let all: Vec<&mut Container> = all.collect();
                let len = all.len();
                if let Some(c) = all.into_iter().nth(rng.usize(..len)) {
                    c.image = Some(format!("busybox:{}", rng.u8(2..9)));
                }
            }
            if rng.u8(..50) == 0 {
                runtime.containers.clear();
            }
            let observed = runtime.observed();
            let verdicts: HashMap<String, Verdict> = PodBook::to_probe(&spec, &observed)
                .map(|(c, _)| {
                    let verdict = Verdict {
                        ready: rng.bool(),
                        kill: (rng.u8(..20) == 0).then(|| "liveness".to_owned()),
                        next: rng.bool().then(|| now + Duration::from_secs(5)),
                    };
                    (c.name.clone(), verdict)
                })
                .collect();
            let planned = book.plan(
                POD,
                &spec,
                observed.clone(),
                &verdicts,
                Now { at: now, wall },
                &limits,
            );
            let acts = planned.actions.iter().any(|a| {
                matches!(
                    a,
                    Action::Start { .. } | Action::StartCreated { .. } | Action::Kill { .. }
                )
            });
            if !acts && !settled(&spec, &observed) {
                let wake = planned
                    .wake
                    .unwrap_or_else(|| panic!("{at}: work left and no wake-up"));
                assert!(wake <= now + limits.backoff_max, "{at}: wakes too late");
            }
            let mut wake = planned.wake;
            for action in planned.actions {
                match action {
                    Action::Remove { id, .. } => runtime.containers.retain(|c| c.seen.id != id),
                    Action::StartCreated { id } => {
                        if let Some(c) = runtime.find(&id) {
                            c.seen.state = RunState::Running;
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
                        let (c, _) = containers(&spec)
                            .find(|(c, i)| c.name == name && *i == init)
                            .unwrap_or_else(|| panic!("{at}: {name} is not in the spec"));
                        let c = c.clone();
                        // Never two of one name running.
                        assert!(
                            !runtime
                                .containers
                                .iter()
                                .any(|r| r.name == name && r.seen.state == RunState::Running),
                            "{at}: {name} started beside a running one"
                        );
                        // Attempts only grow.
                        if let Some(last) = history.attempts.get(&name) {
                            assert!(
                                attempt > *last,
                                "{at}: {name} attempt {attempt} after {last}"
                            );
                        }
                        // Containers only once every init container succeeded.
                        if !init {
                            for i in spec.init_containers.iter().flatten() {
                                let done = observed.get(&i.name).and_then(|o| o.latest.as_ref());
                                assert!(
                                    done.is_some_and(
                                        |s| s.state == RunState::Exited && s.exit_code == 0
                                    ),
                                    "{at}: {name} started before {} succeeded",
                                    i.name
                                );
                            }
                        }
                        let before = observed.get(&name).and_then(|o| o.latest.as_ref());
                        if let Some(before) = before.filter(|s| s.state == RunState::Exited) {
                            // Restarts as the policy says, never in a tight loop.
                            if same_spec(before, &c) {
                                assert!(
                                    RestartPolicy::of(&spec).restarts(before.exit_code, init),
                                    "{at}: {name} restarted against the policy"
                                );
                            }
                            if let Some(last) = history.restarted.insert(name.clone(), now) {
                                assert!(
                                    now - last >= limits.backoff_initial,
                                    "{at}: {name} restarted {:?} after the last",
                                    now - last
                                );
                            }
                        }
                        let roll = rng.u8(..20);
                        if roll < 3 {
                            let woke = book.pull_failed(&name, pull, "no".to_owned(), now, &limits);
                            wake = earliest(wake, Some(woke));
                            continue;
                        }
                        book.pulled(&name);
                        if roll < 5 {
                            let woke = book.start_failed(
                                &name,
                                "CreateContainerError",
                                "no".to_owned(),
                                now,
                                &limits,
                            );
                            wake = earliest(wake, Some(woke));
                            continue;
                        }
                        history.attempts.insert(name.clone(), attempt);
                        book.created(&name, attempt);
                        runtime.next_id += 1;
                        let mut made = seen(
                            &c,
                            &format!("c{}", runtime.next_id),
                            RunState::Running,
                            0,
                            attempt,
                        );
                        made.started_at = i64::try_from(wall.as_nanos()).unwrap_or(i64::MAX);
                        if roll < 6 {
                            made.state = RunState::Created;
                            book.start_failed(
                                &name,
                                "RunContainerError",
                                "no".to_owned(),
                                now,
                                &limits,
                            );
                        } else {
                            book.started(&name);
                        }
                        runtime.containers.push(SimContainer { name, seen: made });
                    }
                }
            }
            let _ = wake;
            // Strays are gone and dead containers stay bounded.
            for c in &runtime.containers {
                assert!(
                    containers(&spec).any(|(s, _)| s.name == c.name),
                    "{at}: stray {}",
                    c.name
                );
            }
            for (name, group) in runtime.observed() {
                let dead = group.older.len()
                    + usize::from(group.latest.is_some_and(|l| l.state != RunState::Running));
                assert!(
                    dead <= limits.max_dead_per_container + 1,
                    "{at}: {dead} dead {name}"
                );
            }
            // The status's restart counts are the latest attempts.
            let observed = runtime.observed();
            let placement = Placement {
                sandbox: None,
                sandbox_error: None,
                node_ip: "",
            };
            let status = pod_status(&spec, &observed, &book, placement);
            for s in status.container_statuses.iter().flatten() {
                let attempt = observed
                    .get(&s.name)
                    .and_then(|o| o.latest.as_ref())
                    .map_or(0, |l| l.attempt);
                assert_eq!(
                    s.restart_count,
                    i32::try_from(attempt).unwrap_or(i32::MAX),
                    "{at}"
                );
            }
        }
    }
}
