//! Many senders, many modules, plain tokio tasks on other threads: every
//! message arrives exactly once and in order per sender; no response is lost.

mod common;

use std::collections::HashMap;
use std::time::Duration;

use beehive::{Hive, HiveConfig, ModuleConfig};
use common::{Cleanup, Probes, cmd, next_got, seq};

const SENDERS: usize = 4;
const MODULES: usize = 3;
const PER_SENDER: usize = 2_000;

#[actix::test]
async fn every_message_arrives_exactly_once_in_sender_order() {
    let (probes, mut events) = Probes::new();
    let hive = Hive::new("t", HiveConfig::default());
    let names: Vec<String> = (0..MODULES).map(|m| format!("m{m}")).collect();
    for name in &names {
        hive.start_module(probes.factory(name, "all", Cleanup::Quick))
            .expect("start");
    }
    // Senders run on a separate multi-threaded runtime: the handle is Send.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let mut senders = Vec::new();
    for from in 0..SENDERS {
        let hive = hive.clone();
        let names = names.clone();
        senders.push(runtime.spawn(async move {
            for n in 0..PER_SENDER {
                // Alternate direct sends and group sends: both keep order.
                if n % 2 == 0 {
                    for name in &names {
                        hive.send(name, seq(from, n)).await.expect("send");
                    }
                } else {
                    hive.send_to_group("all", seq(from, n))
                        .await
                        .expect("group");
                }
            }
        }));
    }
    let total = SENDERS * MODULES * PER_SENDER;
    let mut last: HashMap<(String, u64), i64> = HashMap::new();
    let mut count: HashMap<String, usize> = HashMap::new();
    for _ in 0..total {
        let (module, msg) = next_got(&mut events).await;
        let from = msg.body::<serde_json::Value>().expect("json body")["from"]
            .as_u64()
            .expect("from");
        let n = msg.body::<serde_json::Value>().expect("json body")["n"]
            .as_u64()
            .expect("n") as i64;
        let previous = last.entry((module.clone(), from)).or_insert(-1);
        assert_eq!(
            n,
            *previous + 1,
            "{module} from {from}: none lost, none duplicated, in order"
        );
        *previous = n;
        *count.entry(module).or_default() += 1;
    }
    for sender in senders {
        sender.await.expect("sender task");
    }
    assert!(
        events.try_recv().is_err(),
        "nothing beyond the expected messages"
    );
    assert_eq!(count.len(), MODULES);
    assert!(count.values().all(|&c| c == SENDERS * PER_SENDER));
    runtime.shutdown_background();
}

/// A mailbox of one message and four senders on OS threads of their own:
/// sends find it full and wait for room (the path the default capacity
/// rarely reaches), and still every message arrives once, in each
/// sender's order.
#[actix::test]
async fn senders_waiting_on_a_tiny_mailbox_lose_nothing_and_keep_their_order() {
    const EACH: usize = 5_000;
    let (probes, mut events) = Probes::new();
    let mut config = HiveConfig::default();
    config.modules.insert(
        "tiny".to_owned(),
        ModuleConfig {
            mailbox_capacity: 1,
            ..ModuleConfig::default()
        },
    );
    let hive = Hive::new("t", config);
    hive.start_module(probes.factory("tiny", "g", Cleanup::Quick))
        .expect("start");
    let senders: Vec<_> = (0..SENDERS)
        .map(|from| {
            let hive = hive.clone();
            std::thread::spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .build()
                    .expect("runtime");
                runtime.block_on(async move {
                    let mut waited = 0;
                    for n in 0..EACH {
                        let sending = hive.send("tiny", seq(from, n));
                        if format!("{sending:?}").contains("waiting") {
                            waited += 1;
                        }
                        sending.await.expect("send");
                    }
                    waited
                })
            })
        })
        .collect();
    let mut next = [0_u64; SENDERS];
    for _ in 0..SENDERS * EACH {
        // next_got fails after 20 s without a message: a lost wake-up
        // fails the test instead of hanging it.
        let (module, msg) = next_got(&mut events).await;
        assert_eq!(module, "tiny");
        let body = msg.body::<serde_json::Value>().expect("json body");
        let from = body["from"].as_u64().expect("from") as usize;
        let n = body["n"].as_u64().expect("n");
        assert_eq!(
            n, next[from],
            "from {from}: none lost, none duplicated, in order"
        );
        next[from] += 1;
    }
    assert!(next.iter().all(|&n| n == EACH as u64));
    let mut waited = 0;
    for sender in senders {
        waited += sender.join().expect("sender thread");
    }
    assert!(
        events.try_recv().is_err(),
        "nothing beyond the expected messages"
    );
    assert!(waited > 0, "some sends found the mailbox full and waited");
    assert_eq!(hive.stats().dropped_messages, 0);
}

#[actix::test]
async fn concurrent_sync_requests_from_other_threads_lose_no_response() {
    let (probes, _events) = Probes::new();
    let hive = Hive::new("t", HiveConfig::default());
    hive.start_module(probes.factory("echo", "g", Cleanup::Quick))
        .expect("start");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let mut requesters = Vec::new();
    for _ in 0..8 {
        let hive = hive.clone();
        requesters.push(runtime.spawn(async move {
            let mut answered = 0;
            for _ in 0..2_500 {
                let request = cmd("echo");
                let id = request.id();
                let response = hive
                    .send_sync("echo", request, Duration::from_secs(30))
                    .await
                    .expect("every request is answered");
                assert_eq!(response.parent_id(), Some(id));
                answered += 1;
            }
            answered
        }));
    }
    let mut answered = 0;
    for requester in requesters {
        answered += requester.await.expect("requester");
    }
    assert_eq!(answered, 20_000);
    let stats = hive.stats();
    assert_eq!((stats.late_responses, stats.sync_timeouts), (0, 0));
    runtime.shutdown_background();
}
