//! Node lifecycle as other cloud modules see it: connect and disconnect
//! events, and a node gone long enough leaving memory but not the store.
#![cfg(all(feature = "cloudhub", feature = "edgehub"))]

mod common;

use std::path::Path;
use std::time::Duration;

use beehive::constants::group;
use beehive::{Hive, HiveConfig};
use common::{World, edge_config, eventually, get, pod, start_edge};
use hub::{CloudHub, CloudHubConfig, Dialect, NodeEvent, NodeEventKind};
use transports::TransportKind;

const KEEPALIVE: Duration = Duration::from_secs(5);

#[actix::test]
async fn connects_and_disconnects_are_node_events() {
    let world = World::new(TransportKind::WebSocket);
    let mut cloud = common::start_cloud(&world, &world.any_address(), None, KEEPALIVE).await;
    let edge = start_edge(
        edge_config(&world, "n1", Some("n1"), &cloud.address, KEEPALIVE),
        &world.path("edge.redb"),
    );
    let connected = tokio::time::timeout(Duration::from_secs(30), cloud.node_events.recv())
        .await
        .expect("event")
        .expect("open");
    assert_eq!(
        connected,
        NodeEvent {
            node: "n1".to_owned(),
            kind: NodeEventKind::Connected(Dialect::Native)
        }
    );
    edge.hive.shutdown().await;
    let gone = tokio::time::timeout(Duration::from_secs(30), cloud.node_events.recv())
        .await
        .expect("event")
        .expect("open");
    assert_eq!(
        gone,
        NodeEvent {
            node: "n1".to_owned(),
            kind: NodeEventKind::Disconnected
        }
    );
}

#[actix::test]
async fn a_long_gone_node_leaves_memory_and_gets_everything_when_it_returns() {
    let world = World::new(TransportKind::UnixSocket);
    let hive = Hive::new("cloud", HiveConfig::default());
    let address = world.any_address();
    let config = CloudHubConfig {
        endpoints: vec![world.endpoint(&address)],
        keepalive: KEEPALIVE,
        // Checked every second (a quarter of this, at least a second). Long
        // enough that all fifty are held before the first may go (a
        // shorter time could evict some mid-way, and 50 would never show).
        evict_after: Duration::from_secs(1),
        store: Some(world.path("cloud.redb")),
        ..CloudHubConfig::default()
    };
    let handle = CloudHub::start(&hive, config).await.expect("cloudhub");
    let stats = handle.stats.clone();
    for n in 0..50 {
        hive.send("cloudhub", pod("n1", &format!("p{n}"), 1))
            .await
            .expect("queued");
    }
    eventually(&stats.changes, "50 objects held", || {
        get(&stats.pending) == 50
    })
    .await;
    // n1 never came: its queue leaves memory (it stays in the store).
    eventually(&stats.changes, "queue evicted", || get(&stats.pending) == 0).await;

    let mut edge = start_edge(
        edge_config(&world, "n1", None, &handle.addresses[0].1, KEEPALIVE),
        Path::new(&world.path("edge.redb")),
    );
    let finals = (0..50).map(|n| (format!("default/pod/p{n}"), 1)).collect();
    common::await_applied(&mut edge.applied, &finals).await;
    eventually(&stats.changes, "all acknowledged", || {
        get(&stats.pending) == 0 && get(&stats.acked) == 50
    })
    .await;
}

#[actix::test]
async fn an_object_no_edge_module_takes_is_acknowledged_not_resent_forever() {
    let world = World::new(TransportKind::WebSocket);
    let cloud = common::start_cloud(&world, &world.any_address(), None, KEEPALIVE).await;
    let mut edge = start_edge(
        edge_config(&world, "n1", Some("n1"), &cloud.address, KEEPALIVE),
        &world.path("edge.redb"),
    );
    // A device twin for a node without a twin module, then a pod.
    let twin = beehive::Message::new()
        .build_router(
            "devicecontroller",
            group::TWIN,
            "node/n1/default/device/sensor",
            "update",
        )
        .with_resource_version("1");
    cloud.hive.send("cloudhub", twin).await.expect("queued");
    cloud
        .hive
        .send("cloudhub", pod("n1", "web", 1))
        .await
        .expect("queued");
    let applied = tokio::time::timeout(Duration::from_secs(30), edge.applied.recv())
        .await
        .expect("the pod still arrives")
        .expect("recorder");
    assert_eq!(applied.resource(), "default/pod/web");
    let (hub, stats) = (cloud.handle.stats.clone(), edge.handle.stats.clone());
    eventually(&hub.changes, "both acknowledged", || get(&hub.pending) == 0).await;
    assert_eq!(get(&stats.refused), 1);
    assert_eq!(get(&stats.connects), 1, "the link was never reset for it");
}
