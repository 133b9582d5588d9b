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
        assert_eq!(msg.body::<serde_json::Value>().expect("json body")["n"], n);
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
    let (module, _) = next_got(&mut events).await;
    assert_eq!(module, "first", "first is now stalled on its gate");
    for n in 0..100 {
        hive.send("first", seq(0, n)).await.expect("send");
    }
    // Release "first" only once shutdown has cleaned up "second": shutdown
    // must then wait for its 100 queued messages before its cleanup.
    let watcher = actix::spawn(async move {
        let mut seen = Vec::new();
        loop {
            let event = next(&mut events).await;
            let second_done = matches!(&event, Event::Cleaned { module } if module == "second");
            seen.push(event);
            if second_done {
                let _ = open.send(());
                return (seen, events);
            }
        }
    });
    let report = hive.shutdown().await;
    assert_eq!(report.stopped, ["third", "second", "first"]);
    assert!(report.timed_out.is_empty());
    let (mut seen, mut events) = watcher.await.expect("watcher");
    while let Ok(event) = events.try_recv() {
        seen.push(event);
    }

    let mut order = Vec::new();
    let mut handled_by_first = 0;
    for event in seen {
        match event {
            Event::Got { module, msg } if module == "first" => {
                assert!(
                    !order.iter().any(|m| m == "first"),
                    "drained before its cleanup"
                );
                assert_eq!(
                    msg.body::<serde_json::Value>().expect("json body")["n"],
                    handled_by_first
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
    assert_eq!(hive.stats().dropped_messages, 0);
}

#[actix::test]
async fn a_module_that_does_not_finish_in_time_does_not_hold_up_the_rest() {
    let (probes, mut events) = Probes::new();
    let mut config = config_for("hang", RestartOn::Always, None);
    config
        .modules
        .extend(config_for("stalled", RestartOn::Always, None).modules);
    let hive = Hive::new("t", config);
    for (name, cleanup) in [
        ("ok", Cleanup::Quick),
        ("hang", Cleanup::Hang),
        ("stalled", Cleanup::Quick),
    ] {
        hive.start_module(probes.factory(name, "g", cleanup))
            .expect("start");
    }
    // "stalled" waits on a gate nobody opens: it can never drain.
    let _never_opened = probes.gate();
    hive.send("stalled", cmd("stall")).await.expect("send");
    hive.send("stalled", seq(0, 0)).await.expect("send");
    let report = hive.shutdown().await;
    assert_eq!(report.timed_out, ["stalled"], "drain never finished");
    // "hang"'s cleanup is cut off after its flush timeout; "ok" follows.
    assert_eq!(report.stopped, ["hang", "ok"]);
    let mut cleaned = Vec::new();
    while let Ok(event) = events.try_recv() {
        if let Event::Cleaned { module } = event {
            cleaned.push(module);
        }
    }
    assert_eq!(cleaned, ["hang", "ok"]);
    for name in ["hang", "ok"] {
        assert!(matches!(
            hive.send(name, cmd("x")).await,
            Err(Error::ModuleStopped(_))
        ));
    }
}

#[actix::test]
async fn a_module_that_stops_itself_while_draining_is_not_restarted() {
    let (probes, mut events) = Probes::new();
    let hive = Hive::new("t", config_for("m", RestartOn::Always, None));
    hive.start_module(probes.factory("m", "g", Cleanup::Quick))
        .expect("start");
    let open = probes.gate();
    hive.send("m", cmd("stall")).await.expect("send");
    next_got(&mut events).await;
    // Queued behind the stall: a stop, then two messages it never sees.
    hive.send("m", cmd("stop")).await.expect("send");
    hive.send("m", seq(0, 0)).await.expect("send");
    hive.send("m", seq(0, 1)).await.expect("send");
    // Whether the stop is handled before the shutdown request arrives or
    // while draining, the module must end up stopped, never restarted.
    let opener = actix::spawn(async move {
        let _ = open.send(());
    });
    let report = hive.shutdown().await;
    opener.await.expect("opener");
    assert_eq!(report.stopped, ["m"]);
    // The supervisor answers shutdown only after its final decision.
    assert_eq!(probes.births.load(std::sync::atomic::Ordering::SeqCst), 1);
    assert_eq!(hive.stats().restarts, 0);
    assert!(!hive.module("m").expect("info").running);
    assert_eq!(hive.stats().dropped_messages, 2);
}

#[actix::test]
async fn a_request_that_makes_its_module_fail_gets_the_failure_at_once() {
    let (probes, _events) = Probes::new();
    let hive = Hive::new("t", config_for("m", RestartOn::OnFailure, None));
    hive.start_module(probes.factory("m", "g", Cleanup::Quick))
        .expect("start");
    let result = hive
        .send_sync("m", cmd("fail"), Duration::from_secs(30))
        .await;
    assert!(
        matches!(&result, Err(Error::ModuleFailed { module, reason }) if module == "m" && reason.contains("told to fail")),
        "{result:?}"
    );
    let result = hive
        .send_sync("m", cmd("panic"), Duration::from_secs(30))
        .await;
    assert!(
        matches!(result, Err(Error::ModuleFailed { .. })),
        "{result:?}"
    );
    assert_eq!(hive.stats().sync_timeouts, 0);
}

#[actix::test]
async fn a_module_stopped_ahead_drains_first_and_the_rest_stop_in_reverse_order() {
    let (probes, mut events) = Probes::new();
    let hive = Hive::new("t", HiveConfig::default());
    for name in ["feeder", "middle", "hub"] {
        hive.start_module(probes.factory(name, "g", Cleanup::Quick))
            .expect("start");
    }
    for n in 0..50 {
        hive.send("feeder", seq(0, n)).await.expect("send");
    }
    // The feeder goes first (as cloudcore stops its edgecontroller before
    // cloudhub), with everything queued to it handled.
    let report = hive.stop_module("feeder").await;
    assert_eq!(report.stopped, ["feeder"]);
    let mut handled = 0;
    while let Ok(event) = events.try_recv() {
        if let Event::Got { module, .. } = event {
            assert_eq!(module, "feeder");
            handled += 1;
        }
    }
    assert_eq!(handled, 50, "drained before it stopped");
    let after = hive
        .send_sync("feeder", cmd("echo"), Duration::from_secs(5))
        .await;
    assert!(matches!(after, Err(Error::ModuleStopped(_))), "{after:?}");
    // The others still run, and stop in reverse start order; the feeder
    // is not stopped twice; an unknown module is nothing to stop.
    hive.send_sync("hub", cmd("echo"), Duration::from_secs(5))
        .await
        .expect("hub still answers");
    let report = hive.shutdown().await;
    assert_eq!(report.stopped, ["hub", "middle"]);
    assert!(hive.stop_module("nobody").await.stopped.is_empty());
}
