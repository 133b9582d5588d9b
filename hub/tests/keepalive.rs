//! Half-open links: a peer that stops talking without closing (as a frozen
//! process or a dead route leaves it) is dropped within two keepalive
//! intervals, on both sides.

mod common;

use std::time::{Duration, Instant};

use common::{World, edge_config, eventually, get, start_cloud, start_edge};
use transports::TransportKind;

const KEEPALIVE: Duration = Duration::from_millis(800);

/// Within two intervals, plus one quarter for a loaded machine's scheduling.
fn within_two_intervals(elapsed: Duration) -> bool {
    elapsed <= KEEPALIVE * 2 + KEEPALIVE / 4
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
    let stats = edge.handle.stats.clone();
    eventually(&stats.changes, "frozen cloud dropped", || {
        get(&stats.keepalive_timeouts) >= 1
    })
    .await;
    let elapsed = since.elapsed();
    assert!(within_two_intervals(elapsed), "took {elapsed:?}");
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
