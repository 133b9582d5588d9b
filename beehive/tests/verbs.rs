//! The six verbs: delivery, errors, sync responses, groups, backpressure.

mod common;

use std::time::Duration;

use beehive::{Error, Hive, HiveConfig, Message, ModuleConfig, ResponseOutcome};
use common::{Cleanup, Event, Probes, cmd, next, next_got, seq};
use futures_util::FutureExt;
use serde_json::json;

fn n_of(msg: &Message) -> u64 {
    msg.body::<serde_json::Value>().expect("json body")["n"]
        .as_u64()
        .expect("n")
}

#[actix::test]
async fn send_delivers_in_order() {
    let (probes, mut events) = Probes::new();
    let hive = Hive::new("t", HiveConfig::default());
    hive.start_module(probes.factory("a", "g", Cleanup::Quick))
        .expect("start");
    for n in 0..1_000 {
        hive.send("a", seq(0, n)).await.expect("send");
    }
    for n in 0..1_000 {
        let (module, msg) = next_got(&mut events).await;
        assert_eq!(module, "a");
        assert_eq!(n_of(&msg), n);
    }
}

#[actix::test]
async fn unknown_destinations_are_errors() {
    let (probes, _events) = Probes::new();
    let hive = Hive::new("t", HiveConfig::default());
    hive.start_module(probes.factory("a", "g", Cleanup::Quick))
        .expect("start");
    assert!(matches!(
        hive.send("nobody", cmd("x")).await,
        Err(Error::UnknownModule(name)) if name == "nobody"
    ));
    assert!(matches!(
        hive.try_send("nobody", cmd("x")),
        Err(Error::UnknownModule(_))
    ));
    assert!(matches!(
        hive.send_sync("nobody", cmd("x"), Duration::from_secs(1))
            .await,
        Err(Error::UnknownModule(_))
    ));
    assert!(matches!(
        hive.send_to_group("nogroup", cmd("x")).await,
        Err(Error::UnknownGroup(group)) if group == "nogroup"
    ));
    assert!(matches!(
        hive.send_to_group_sync("nogroup", cmd("x"), Duration::from_secs(1))
            .await,
        Err(Error::UnknownGroup(_))
    ));
}

#[actix::test]
async fn send_sync_matches_the_response_by_parent_id() {
    let (probes, _events) = Probes::new();
    let hive = Hive::new("t", HiveConfig::default());
    hive.start_module(probes.factory("a", "g", Cleanup::Quick))
        .expect("start");
    let request = cmd("echo");
    let id = request.id();
    let response = hive
        .send_sync("a", request, Duration::from_secs(5))
        .await
        .expect("response");
    assert_eq!(response.parent_id(), Some(id));
    assert_eq!(
        response.body::<serde_json::Value>().expect("json body"),
        json!({"from": "a"})
    );
    assert_eq!(hive.stats().late_responses, 0);
    assert!(!hive.is_pending(id));
}

#[actix::test]
async fn send_sync_times_out_and_a_late_response_is_counted_and_dropped() {
    let (probes, mut events) = Probes::new();
    let hive = Hive::new("t", HiveConfig::default());
    hive.start_module(probes.factory("a", "g", Cleanup::Quick))
        .expect("start");
    let open = probes.gate();
    let request = cmd("respond-later");
    let id = request.id();
    let result = hive
        .send_sync("a", request, Duration::from_millis(50))
        .await;
    assert!(
        matches!(&result, Err(Error::Timeout { destination, .. }) if destination == "a"),
        "{result:?}"
    );
    assert!(
        !hive.is_pending(id),
        "a timed-out request leaves nothing pending"
    );
    assert_eq!(hive.stats().sync_timeouts, 1);
    next_got(&mut events).await;
    // Now let the module answer, after the requester gave up.
    open.send(()).expect("open gate");
    assert!(matches!(
        next(&mut events).await,
        Event::Responded {
            outcome: ResponseOutcome::Late
        }
    ));
    let probe = Message::new();
    assert_eq!(hive.stats().late_responses, 1);
    // A response nobody asked for is late too, and never panics.
    assert_eq!(
        hive.send_resp(probe.response("x", beehive::Content::Empty)),
        ResponseOutcome::Late
    );
    assert_eq!(hive.send_resp(Message::new()), ResponseOutcome::Late);
    assert_eq!(hive.stats().late_responses, 3);
}

#[actix::test]
async fn groups_reach_every_member_and_only_members() {
    let (probes, mut events) = Probes::new();
    let hive = Hive::new("t", HiveConfig::default());
    for name in ["m1", "m2", "m3"] {
        hive.start_module(probes.factory(name, "meta", Cleanup::Quick))
            .expect("start");
    }
    hive.start_module(probes.factory("other", "twin", Cleanup::Quick))
        .expect("start");
    for n in 0..100 {
        hive.send_to_group("meta", seq(0, n))
            .await
            .expect("group send");
    }
    let mut next_n = std::collections::HashMap::new();
    for _ in 0..300 {
        let (module, msg) = next_got(&mut events).await;
        assert_ne!(module, "other");
        let expected = next_n.entry(module.clone()).or_insert(0u64);
        assert_eq!(
            n_of(&msg),
            *expected,
            "order kept through the group for {module}"
        );
        *expected += 1;
    }
    assert_eq!(next_n.len(), 3);
    assert!(next_n.values().all(|&n| n == 100));
    assert!(events.try_recv().is_err(), "nothing beyond the 300 copies");
}

#[actix::test]
async fn group_sync_collects_every_answer_or_names_the_missing() {
    let (probes, _events) = Probes::new();
    let hive = Hive::new("t", HiveConfig::default());
    for name in ["m1", "m2", "m3"] {
        hive.start_module(probes.factory(name, "meta", Cleanup::Quick))
            .expect("start");
    }
    let answers = hive
        .send_to_group_sync("meta", cmd("echo"), Duration::from_secs(5))
        .await
        .expect("all answer");
    let names: Vec<_> = answers.iter().map(|(name, _)| name.as_str()).collect();
    assert_eq!(names, ["m1", "m2", "m3"]);
    for (name, response) in &answers {
        assert_eq!(
            response.body::<serde_json::Value>().expect("json body"),
            json!({ "from": name })
        );
    }

    hive.start_module(probes.factory("mute", "meta", Cleanup::Quick))
        .expect("start");
    // "silent" makes every member keep quiet; only m1..m3 answer "echo".
    let result = hive
        .send_to_group_sync("meta", cmd("silent"), Duration::from_millis(100))
        .await;
    match result {
        Err(Error::GroupTimeout {
            group,
            missing,
            answered,
        }) => {
            assert_eq!(group, "meta");
            assert_eq!(missing, ["m1", "m2", "m3", "mute"]);
            assert!(answered.is_empty());
        }
        other => panic!("expected a group timeout, got {other:?}"),
    }
}

#[actix::test]
async fn a_stalled_module_makes_senders_wait_instead_of_growing() {
    let (probes, mut events) = Probes::new();
    let config = HiveConfig {
        modules: [(
            "slow".to_owned(),
            ModuleConfig {
                mailbox_capacity: 8,
                ..ModuleConfig::default()
            },
        )]
        .into(),
    };
    let hive = Hive::new("t", config);
    hive.start_module(probes.factory("slow", "g", Cleanup::Quick))
        .expect("start");
    let open = probes.gate();
    hive.send("slow", cmd("stall")).await.expect("send");
    // The module took the stall command and now waits on its gate.
    next_got(&mut events).await;
    for n in 0..8 {
        hive.send("slow", seq(0, n))
            .await
            .expect("fills the mailbox");
    }
    let info = hive.module("slow").expect("info");
    assert_eq!((info.queued, info.capacity), (8, 8));
    assert!(matches!(
        hive.try_send("slow", seq(0, 8)),
        Err(Error::MailboxFull(_))
    ));
    let mut blocked = Box::pin(hive.send("slow", seq(0, 8)));
    assert!(
        (&mut blocked).now_or_never().is_none(),
        "a send into a full mailbox waits"
    );
    assert_eq!(hive.module("slow").expect("info").queued, 8);
    open.send(()).expect("open gate");
    blocked.await.expect("send completes once there is room");
    for n in 0..9 {
        let (_, msg) = next_got(&mut events).await;
        assert_eq!(n_of(&msg), n);
    }
}

#[actix::test]
async fn modules_disabled_by_config_do_not_start() {
    let (probes, mut events) = Probes::new();
    let config: HiveConfig =
        serde_json::from_value(json!({"modules": {"off": {"enable": false}}})).expect("config");
    let hive = Hive::new("t", config);
    assert_eq!(
        hive.start_module(probes.factory("off", "g", Cleanup::Quick))
            .expect("start"),
        beehive::StartOutcome::Disabled
    );
    assert!(matches!(
        hive.send("off", cmd("x")).await,
        Err(Error::UnknownModule(_))
    ));
    assert!(hive.modules().is_empty());
    // The factory was asked for the name, but no module ran.
    assert!(matches!(next(&mut events).await, Event::Born { .. }));
    assert!(events.try_recv().is_err());
}

#[actix::test]
async fn a_name_can_be_registered_once() {
    let (probes, _events) = Probes::new();
    let hive = Hive::new("t", HiveConfig::default());
    hive.start_module(probes.factory("a", "g", Cleanup::Quick))
        .expect("start");
    assert!(matches!(
        hive.start_module(probes.factory("a", "g", Cleanup::Quick)),
        Err(Error::DuplicateModule(name)) if name == "a"
    ));
}

#[actix::test]
async fn two_hives_in_one_process_share_nothing() {
    let (probes, mut events) = Probes::new();
    let cloud = Hive::new("cloud", HiveConfig::default());
    let edge = Hive::new("edge", HiveConfig::default());
    cloud
        .start_module(probes.factory("hub", "hub", Cleanup::Quick))
        .expect("start");
    edge.start_module(probes.factory("hub", "hub", Cleanup::Quick))
        .expect("start");
    cloud.send("hub", seq(1, 0)).await.expect("send");
    let (_, msg) = next_got(&mut events).await;
    assert_eq!(
        msg.body::<serde_json::Value>().expect("json body")["from"],
        json!(1)
    );
    assert!(events.try_recv().is_err(), "only one hive's module got it");
    // A response registered in one hive is unknown to the other.
    let request = cmd("respond-later");
    let open = probes.gate();
    let edge2 = edge.clone();
    let waiting = actix::spawn(async move {
        edge2
            .send_sync("hub", request, Duration::from_secs(10))
            .await
    });
    let (_, req) = next_got(&mut events).await;
    assert_eq!(
        cloud.send_resp(req.response("hub", "wrong hive")),
        ResponseOutcome::Late
    );
    open.send(()).expect("gate");
    let response = waiting
        .await
        .expect("join")
        .expect("edge gets its own response");
    assert_eq!(response.parent_id(), Some(req.id()));
    assert_eq!(edge.stats().late_responses, 0);
}

#[test]
fn starting_a_module_needs_an_actix_system() {
    let (probes, _events) = Probes::new();
    let hive = Hive::new("t", HiveConfig::default());
    assert!(matches!(
        hive.start_module(probes.factory("a", "g", Cleanup::Quick)),
        Err(Error::NoActixSystem)
    ));
}
