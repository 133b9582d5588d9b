//! Restart policies and shutdown order.

mod common;

use std::time::{Duration, Instant};

use beehive::{Error, Hive, HiveConfig, ModuleConfig, RestartOn, RestartPolicy};
use common::{Cleanup, Event, Probes, cmd, next, next_got, seq};

fn config_for(name: &str, policy: RestartOn, max_restarts: Option<u32>) -> HiveConfig {
    HiveConfig {
        modules: [(
            name.to_owned(),
            ModuleConfig {
                restart: RestartPolicy {
                    policy,
                    initial_backoff_ms: 20,
                    backoff_factor: 2.0,
                    max_backoff_ms: 60,
                    max_restarts,
                },
                flush_timeout_ms: 300,
                ..ModuleConfig::default()
            },
        )]
        .into(),
    }
}

async fn born(events: &mut tokio::sync::mpsc::UnboundedReceiver<Event>) -> usize {
    loop {
        if let Event::Born { instance, .. } = next(events).await {
            return instance;
        }
    }
}

#[actix::test]
async fn on_failure_restarts_a_failed_module_and_keeps_its_mailbox() {
    let (probes, mut events) = Probes::new();
    let hive = Hive::new("t", config_for("m", RestartOn::OnFailure, None));
    hive.start_module(probes.factory("m", "g", Cleanup::Quick))
        .expect("start");
    assert_eq!(born(&mut events).await, 1);
    hive.send("m", cmd("fail")).await.expect("send");
    // Sent while the module is down or backing off: they wait in the mailbox.
    for n in 0..5 {
        hive.send("m", seq(0, n))
            .await
            .expect("queued across the restart");
    }
    next_got(&mut events).await; // the fail command
    assert_eq!(born(&mut events).await, 2);
    for n in 0..5 {
        let (_, msg) = next_got(&mut events).await;
        assert_eq!(msg.content()["n"], n);
    }
    assert_eq!(hive.stats().restarts, 1);
    assert_eq!(hive.module("m").expect("info").restarts, 1);

    // A panic counts as a failure too.
    hive.send("m", cmd("panic")).await.expect("send");
    next_got(&mut events).await;
    assert_eq!(born(&mut events).await, 3);
    hive.send_sync("m", cmd("echo"), Duration::from_secs(5))
        .await
        .expect("the new instance answers");

    // A module that stops without an error stays stopped under OnFailure.
    hive.send("m", cmd("stop")).await.expect("send");
    next_got(&mut events).await;
    let stopped = hive
        .send_sync("m", cmd("echo"), Duration::from_secs(5))
        .await;
    assert!(
        matches!(stopped, Err(Error::ModuleStopped(_))),
        "{stopped:?}"
    );
    assert!(!hive.module("m").expect("info").running);
}

#[actix::test]
async fn never_leaves_a_failed_module_stopped() {
    let (probes, mut events) = Probes::new();
    let hive = Hive::new("t", config_for("m", RestartOn::Never, None));
    hive.start_module(probes.factory("m", "g", Cleanup::Quick))
        .expect("start");
    hive.send("m", cmd("fail")).await.expect("send");
    next_got(&mut events).await;
    let after = hive
        .send_sync("m", cmd("echo"), Duration::from_secs(5))
        .await;
    assert!(matches!(after, Err(Error::ModuleStopped(_))), "{after:?}");
    assert_eq!(hive.stats().restarts, 0);
    assert!(matches!(
        hive.send_to_group("g", cmd("x")).await,
        Err(Error::UnknownGroup(_))
    ));
}

#[actix::test]
async fn always_restarts_a_module_that_stopped_by_itself_with_growing_backoff_up_to_the_cap() {
    let (probes, mut events) = Probes::new();
    let hive = Hive::new("t", config_for("m", RestartOn::Always, Some(3)));
    hive.start_module(probes.factory("m", "g", Cleanup::Quick))
        .expect("start");
    born(&mut events).await;
    let policy = hive.config().module("m").restart;
    for restart in 0..3u32 {
        let stopped_at = Instant::now();
        hive.send("m", cmd("stop")).await.expect("send");
        next_got(&mut events).await;
        born(&mut events).await;
        // Only a lower bound: a busy machine may be slower, never faster.
        assert!(stopped_at.elapsed() >= policy.delay(restart));
    }
    // The fourth stop exceeds maxRestarts = 3.
    hive.send("m", cmd("stop")).await.expect("send");
    next_got(&mut events).await;
    // Whether the request reaches the mailbox before the supervisor gives
    // up or not, it fails at once as stopped, never by waiting out a timeout.
    let after = hive
        .send_sync("m", cmd("echo"), Duration::from_secs(30))
        .await;
    assert!(matches!(after, Err(Error::ModuleStopped(_))), "{after:?}");
    assert_eq!(hive.stats().restarts, 3);
}

#[actix::test]
async fn shutdown_drains_then_cleans_up_in_reverse_start_order() {
    let (probes, mut events) = Probes::new();
    let hive = Hive::new("t", HiveConfig::default());
    for name in ["first", "second", "third"] {
        hive.start_module(probes.factory(name, "g", Cleanup::Quick))
            .expect("start");
    }
    let open = probes.gate();
    hive.send("first", cmd("stall")).await.expect("send");
    for n in 0..100 {
        hive.send("first", seq(0, n)).await.expect("send");
    }
    // Release "first" from a task: shutdown reaches it last, and it must
    // still handle all 100 queued messages before its cleanup.
    open.send(()).expect("gate");
    let report = hive.shutdown().await;
    assert_eq!(report.stopped, ["third", "second", "first"]);
    assert!(report.timed_out.is_empty());

    let mut order = Vec::new();
    let mut handled_by_first = 0;
    while let Ok(event) = events.try_recv() {
        match event {
            Event::Got { module, msg } if module == "first" && msg.content().get("n").is_some() => {
                assert!(
                    !order.iter().any(|m| m == "first"),
                    "drained before its cleanup"
                );
                handled_by_first += 1;
            }
            Event::Cleaned { module } => order.push(module),
            _ => {}
        }
    }
    assert_eq!(handled_by_first, 100);
    assert_eq!(order, ["third", "second", "first"]);
    assert!(matches!(
        hive.send("first", cmd("x")).await,
        Err(Error::ModuleStopped(_))
    ));
}

#[actix::test]
async fn a_module_that_does_not_flush_in_time_does_not_hold_up_the_rest() {
    let (probes, mut events) = Probes::new();
    let hive = Hive::new("t", config_for("stuck", RestartOn::Always, None));
    hive.start_module(probes.factory("ok", "g", Cleanup::Quick))
        .expect("start");
    hive.start_module(probes.factory("stuck", "g", Cleanup::Hang))
        .expect("start");
    let report = hive.shutdown().await;
    assert_eq!(report.timed_out, ["stuck"]);
    assert_eq!(report.stopped, ["ok"]);
    let mut cleaned = Vec::new();
    while let Ok(event) = events.try_recv() {
        if let Event::Cleaned { module } = event {
            cleaned.push(module);
        }
    }
    assert_eq!(cleaned, ["stuck", "ok"]);
    assert_eq!(
        hive.stats().restarts,
        0,
        "shutdown never restarts, even under Always"
    );
}
