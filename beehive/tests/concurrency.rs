//! Many senders, many modules, plain tokio tasks on other threads: every
//! message arrives exactly once and in order per sender; no response is lost.

mod common;

use std::collections::HashMap;
use std::time::Duration;

use beehive::{Hive, HiveConfig};
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
