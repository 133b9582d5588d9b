//! Reliable, resumable delivery over real sockets, every transport: the
//! link cut 200 times mid-stream, the cloud restarted, the edge restarted.
//! Every object's final version arrives, every acknowledged object is in the
//! edge's redb store, and no version is applied twice.
#![cfg(all(feature = "cloudhub", feature = "edgehub"))]

mod common;

use std::collections::HashMap;
use std::time::Duration;

use common::{World, await_applied, edge_config, eventually, get, pod, start_cloud, start_edge};
use transports::TransportKind;

const KEEPALIVE: Duration = Duration::from_secs(5);

fn finals(pods: usize, version: u64) -> HashMap<String, u64> {
    (0..pods)
        .map(|p| (format!("default/pod/p{p}"), version))
        .collect()
}

async fn assert_stored(store: &meta::EdgeStore, pods: usize, version: u64) {
    for p in 0..pods {
        let record = store
            .get(&format!("default/pod/p{p}"))
            .expect("read")
            .expect("stored");
        assert_eq!(record.version, version.to_string(), "p{p}");
    }
}

async fn stream_with_200_link_cuts(kind: TransportKind) {
    const PODS: usize = 250;
    let world = World::new(kind);
    let cloud = start_cloud(&world, &world.any_address(), None, KEEPALIVE).await;
    let mut edge = start_edge(
        edge_config(&world, "n1", Some("n1"), &cloud.address, KEEPALIVE),
        &world.path("edge.redb"),
    );

    let hive = cloud.hive.clone();
    let streaming = actix::spawn(async move {
        for version in 1..=4 {
            for p in 0..PODS {
                hive.send("cloudhub", pod("n1", &format!("p{p}"), version))
                    .await
                    .expect("send");
                if p % 16 == 0 {
                    // Let the link run between bursts, so cuts land mid-stream.
                    tokio::task::yield_now().await;
                }
            }
        }
    });
    let handle = edge.handle.clone();
    let cutter = actix::spawn(async move {
        let stats = handle.stats.clone();
        for cut in 0..200u64 {
            // The next link is up...
            stats
                .changes
                .wait_for(Duration::from_secs(30), || get(&stats.connects) > cut)
                .await;
            // ...and carried a few objects (or the stream is over): cut it.
            let target = get(&stats.downstream) + fastrand::u64(1..8);
            stats
                .changes
                .wait_for(Duration::from_millis(100), || {
                    get(&stats.downstream) >= target
                })
                .await;
            handle.cut_link();
        }
    });
    streaming.await.expect("stream");
    cutter.await.expect("cutter");
    await_applied(&mut edge.applied, &finals(PODS, 4)).await;
    assert_stored(&edge.store, PODS, 4).await;
    let hub = cloud.handle.stats.clone();
    eventually(&hub.changes, "every object acknowledged", || {
        get(&hub.pending) == 0
    })
    .await;
    assert!(
        get(&edge.handle.stats.connects) > 200,
        "the link was cut 200 times"
    );
}

async fn cloud_restart_mid_stream(kind: TransportKind) {
    const PODS: usize = 200;
    let world = World::new(kind);
    let queues = world.path("cloud.redb");
    let cloud = start_cloud(&world, &world.any_address(), Some(&queues), KEEPALIVE).await;
    let address = cloud.address.clone();
    let mut edge = start_edge(
        edge_config(&world, "n1", Some("n1"), &address, KEEPALIVE),
        &world.path("edge.redb"),
    );
    for version in 1..=2 {
        for p in 0..PODS {
            cloud
                .hive
                .send("cloudhub", pod("n1", &format!("p{p}"), version))
                .await
                .expect("send");
        }
    }
    // Down mid-stream: whatever is queued or in flight stays in the store.
    cloud.hive.shutdown().await;
    let cloud = start_cloud(&world, &address, Some(&queues), KEEPALIVE).await;
    for version in 3..=4 {
        for p in 0..PODS {
            cloud
                .hive
                .send("cloudhub", pod("n1", &format!("p{p}"), version))
                .await
                .expect("send");
        }
    }
    await_applied(&mut edge.applied, &finals(PODS, 4)).await;
    assert_stored(&edge.store, PODS, 4).await;
    let hub = cloud.handle.stats.clone();
    eventually(&hub.changes, "every object acknowledged", || {
        get(&hub.pending) == 0
    })
    .await;
}

async fn edge_restart_mid_stream(kind: TransportKind) {
    const PODS: usize = 200;
    let world = World::new(kind);
    let cloud = start_cloud(&world, &world.any_address(), None, KEEPALIVE).await;
    let config = edge_config(&world, "n1", Some("n1"), &cloud.address, KEEPALIVE);
    let store_path = world.path("edge.redb");
    let edge = start_edge(config.clone(), &store_path);
    for version in 1..=2 {
        for p in 0..PODS {
            cloud
                .hive
                .send("cloudhub", pod("n1", &format!("p{p}"), version))
                .await
                .expect("send");
        }
    }
    edge.hive.shutdown().await;
    edge.store.close().await;
    let mut edge = start_edge(config, &store_path);
    for version in 3..=4 {
        for p in 0..PODS {
            cloud
                .hive
                .send("cloudhub", pod("n1", &format!("p{p}"), version))
                .await
                .expect("send");
        }
    }
    await_applied(&mut edge.applied, &finals(PODS, 4)).await;
    assert_stored(&edge.store, PODS, 4).await;
    let hub = cloud.handle.stats.clone();
    eventually(&hub.changes, "every object acknowledged", || {
        get(&hub.pending) == 0
    })
    .await;
}

/// A cloud module that sends with `send_sync` is answered only once the
/// object is committed: a copy of the store file taken right after the
/// answer (as a crash would leave it) already holds the object.
#[actix::test]
async fn an_answered_object_is_already_on_disk() {
    let world = World::new(TransportKind::UnixSocket);
    let queues = world.path("cloud.redb");
    let cloud = start_cloud(&world, &world.any_address(), Some(&queues), KEEPALIVE).await;
    for n in 0..20 {
        let answer = cloud
            .hive
            .send_sync(
                "cloudhub",
                pod("n1", &format!("p{n}"), 1),
                Duration::from_secs(10),
            )
            .await
            .expect("answered");
        assert_eq!(answer.operation(), "response");
        assert_eq!(
            answer.body::<serde_json::Value>().expect("json body")["outcome"],
            "queued"
        );
    }
    let copy = world.path("copy.redb");
    std::fs::copy(&queues, &copy).expect("copy");
    let store = hub::store::QueueStore::open(&copy).expect("open the copy");
    let mut held: Vec<String> = store
        .load()
        .expect("load")
        .into_iter()
        .map(|(_, m)| m.resource().to_owned())
        .collect();
    held.sort();
    let mut expected: Vec<String> = (0..20).map(|n| format!("default/pod/p{n}")).collect();
    expected.sort();
    assert_eq!(held, expected);
}

macro_rules! per_transport {
    ($module:ident, $kind:expr) => {
        mod $module {
            #[actix::test]
            async fn stream_with_200_link_cuts() {
                super::stream_with_200_link_cuts($kind).await;
            }
            #[actix::test]
            async fn cloud_restart_mid_stream() {
                super::cloud_restart_mid_stream($kind).await;
            }
            #[actix::test]
            async fn edge_restart_mid_stream() {
                super::edge_restart_mid_stream($kind).await;
            }
        }
    };
}

per_transport!(ws, transports::TransportKind::WebSocket);
per_transport!(quic, transports::TransportKind::Quic);
per_transport!(uds, transports::TransportKind::UnixSocket);
