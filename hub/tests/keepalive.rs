//! Half-open links: a peer that stops talking without closing (as a frozen
//! process or a dead route leaves it) is dropped within two keepalive
//! intervals, on both sides.
#![cfg(all(feature = "cloudhub", feature = "edgehub"))]

mod common;

use std::time::{Duration, Instant};

use common::{World, edge_config, eventually, get, start_cloud, start_edge};
use transports::TransportKind;

/// Long enough that a second of slack still tells "two intervals" from
/// three.
const KEEPALIVE: Duration = Duration::from_millis(1600);

/// Within two intervals, plus a second for a loaded machine's scheduling.
fn within_two_intervals(elapsed: Duration) -> bool {
    elapsed <= KEEPALIVE * 2 + Duration::from_secs(1)
}

async fn a_frozen_edge_is_dropped_by_the_cloud(kind: TransportKind) {
    let world = World::new(kind);
    let cloud = start_cloud(&world, &world.any_address(), None, KEEPALIVE).await;
    let transport = kind.transport().expect("transport");
    // An edge that says hello and then nothing, never reading either.
    let frozen = transport
        .dial(&world.dial(&cloud.address, Some("n1")))
        .await
        .expect("dial");
    frozen
        .sender
        .send(&hub::protocol::hello("n1"))
        .await
        .expect("hello");
    let hub = cloud.handle.stats.clone();
    eventually(&hub.changes, "session up", || get(&hub.connected) == 1).await;
    let since = Instant::now();
    eventually(&hub.changes, "frozen edge dropped", || {
        get(&hub.keepalive_timeouts) == 1
    })
    .await;
    let elapsed = since.elapsed();
    assert!(within_two_intervals(elapsed), "took {elapsed:?}");
    eventually(&hub.changes, "session gone", || get(&hub.connected) == 0).await;
    drop(frozen);
}

/// Waits for `edge` to drop its link for silence, at most two intervals
/// after `since`.
async fn the_edge_drops_the_silent_cloud(edge: &common::Edge, since: Instant) {
    let stats = &edge.handle.stats;
    eventually(&stats.changes, "frozen cloud dropped", || {
        get(&stats.keepalive_timeouts) >= 1
    })
    .await;
    let elapsed = since.elapsed();
    assert!(within_two_intervals(elapsed), "took {elapsed:?}");
}

async fn a_frozen_cloud_is_dropped_by_the_edge(kind: TransportKind) {
    let world = World::new(kind);
    let transport = kind.transport().expect("transport");
    // A cloud that accepts, and then says nothing.
    let endpoint = world.endpoint(&world.any_address());
    let mut listener = transport.listen(&endpoint.options).await.expect("listen");
    let edge = start_edge(
        edge_config(&world, "n1", Some("n1"), listener.local_addr(), KEEPALIVE),
        &world.path("edge.redb"),
    );
    let frozen = listener.accept().await.expect("the edge dials");
    let since = Instant::now();
    the_edge_drops_the_silent_cloud(&edge, since).await;
    drop(frozen);
}

macro_rules! per_transport {
    ($module:ident, $kind:expr) => {
        mod $module {
            #[actix::test]
            async fn a_frozen_edge_is_dropped_by_the_cloud() {
                super::a_frozen_edge_is_dropped_by_the_cloud($kind).await;
            }
            #[actix::test]
            async fn a_frozen_cloud_is_dropped_by_the_edge() {
                super::a_frozen_cloud_is_dropped_by_the_edge($kind).await;
            }
        }
    };
}

per_transport!(ws, transports::TransportKind::WebSocket);
per_transport!(quic, transports::TransportKind::Quic);
per_transport!(uds, transports::TransportKind::UnixSocket);

/// A cloud in KubeEdge's dialect: it sends no keepalives of its own. It
/// takes the edge's link and answers its node registration.
async fn kubeedge_cloud_with_a_registered_edge(
    world: &World,
    keepalive: Duration,
) -> (transports::Listener, transports::Link, common::Edge) {
    let transport = world.kind.transport().expect("transport");
    let endpoint = world.endpoint(&world.any_address());
    let options = endpoint.options.with_codec(transports::Codec::KubeEdgeJson);
    let mut listener = transport.listen(&options).await.expect("listen");
    let config = hub::EdgeHubConfig {
        dialect: hub::Dialect::KubeEdge,
        ..edge_config(world, "n1", Some("n1"), listener.local_addr(), keepalive)
    };
    let edge = start_edge(config, &world.path("edge.redb"));
    let mut link = listener.accept().await.expect("the edge dials");
    let registration = link
        .receiver
        .recv()
        .await
        .expect("link open")
        .expect("the node's registration");
    let answer = registration.response(
        "edgecontroller",
        beehive::Content::of(
            &serde_json::json!({"Object": {"metadata": {"name": "n1"}}, "Err": null}),
        )
        .expect("json"),
    );
    link.sender.send(&answer).await.expect("answer");
    (listener, link, edge)
}

#[actix::test]
async fn a_frozen_kubeedge_cloud_is_dropped_by_an_edge_in_its_dialect() {
    let world = World::new(TransportKind::WebSocket);
    let (mut listener, frozen, edge) =
        kubeedge_cloud_with_a_registered_edge(&world, KEEPALIVE).await;
    // From here on nothing reads the link: the edge's pings go unanswered,
    // while the kernel still acknowledges every byte.
    let since = Instant::now();
    the_edge_drops_the_silent_cloud(&edge, since).await;
    let _again = listener.accept().await.expect("the edge dials again");
    drop(frozen);
}

#[actix::test]
async fn a_quiet_kubeedge_cloud_that_answers_pings_is_kept() {
    let world = World::new(TransportKind::WebSocket);
    // A longer interval: each pong must come within 7/4 of it, and a
    // loaded machine may hold this one thread back for a good part of one.
    let (_listener, mut quiet, edge) =
        kubeedge_cloud_with_a_registered_edge(&world, Duration::from_secs(2)).await;
    // The cloud sends nothing, but reads, so its WebSocket layer answers
    // the edge's pings. Three keepalive intervals pass, well beyond the
    // timeout, on the same link.
    let mut keepalives = 0;
    while keepalives < 3 {
        let msg = quiet
            .receiver
            .recv()
            .await
            .expect("the link stays up")
            .expect("a message from the edge");
        if msg.operation() == "keepalive" {
            keepalives += 1;
        }
    }
    assert_eq!(get(&edge.handle.stats.keepalive_timeouts), 0);
    assert_eq!(get(&edge.handle.stats.connects), 1, "one link all along");
}
