//! Node identity over real TLS: a node without a certificate, a node using
//! another node's name, and a node asking for another node's messages are
//! all refused.
#![cfg(all(feature = "cloudhub", feature = "edgehub"))]

mod common;

use std::time::Duration;

use beehive::Message;
use beehive::constants::{group, module};
use common::{World, edge_config, eventually, get, pod, start_cloud, start_edge};
use transports::TransportKind;

const KEEPALIVE: Duration = Duration::from_secs(5);

async fn a_node_without_a_certificate_is_refused(kind: TransportKind) {
    let world = World::new(kind);
    let cloud = start_cloud(&world, &world.any_address(), None, KEEPALIVE).await;
    cloud
        .hive
        .send(module::CLOUDHUB, pod("n1", "secret-pod", 1))
        .await
        .expect("queued");
    let edge = start_edge(
        edge_config(&world, "n1", None, &cloud.address, KEEPALIVE),
        &world.path("edge.redb"),
    );
    let stats = edge.handle.stats.clone();
    // Several attempts, each refused by the cloud's TLS.
    eventually(&stats.changes, "three attempts", || {
        get(&stats.dial_failures) + get(&stats.connects) >= 3
    })
    .await;
    assert_eq!(get(&cloud.handle.stats.sessions_opened), 0);
    assert!(
        edge.store
            .get("default/pod/secret-pod")
            .expect("read")
            .is_none()
    );
}

async fn a_forged_node_name_is_refused(kind: TransportKind) {
    let world = World::new(kind);
    let cloud = start_cloud(&world, &world.any_address(), None, KEEPALIVE).await;
    cloud
        .hive
        .send(module::CLOUDHUB, pod("n2", "for-n2", 1))
        .await
        .expect("queued");
    // Certified as n1, claiming to be n2.
    let edge = start_edge(
        edge_config(&world, "n2", Some("n1"), &cloud.address, KEEPALIVE),
        &world.path("edge.redb"),
    );
    // A report waiting to go up: a refused link must not take it.
    let report =
        Message::new().build_router("edged", group::RESOURCE, "default/podstatus/kept", "update");
    edge.hive
        .send(module::EDGEHUB, report)
        .await
        .expect("queued");
    let hub = cloud.handle.stats.clone();
    eventually(&hub.changes, "two refusals", || {
        get(&hub.refused_links) >= 2
    })
    .await;
    assert_eq!(get(&hub.sessions_opened), 0);
    let stats = &edge.handle.stats;
    assert_eq!(get(&stats.upstream_sent), 0, "sent on a refused link");
    assert!(!*edge.handle.online.borrow());
    assert!(
        edge.store
            .get("default/pod/for-n2")
            .expect("read")
            .is_none()
    );
}

async fn a_node_cannot_send_or_receive_for_another(kind: TransportKind) {
    let world = World::new(kind);
    let mut cloud = start_cloud(&world, &world.any_address(), None, KEEPALIVE).await;
    cloud
        .hive
        .send(module::CLOUDHUB, pod("n2", "for-n2", 1))
        .await
        .expect("queued");
    cloud
        .hive
        .send(module::CLOUDHUB, pod("n1", "for-n1", 1))
        .await
        .expect("queued");
    let mut edge = start_edge(
        edge_config(&world, "n1", Some("n1"), &cloud.address, KEEPALIVE),
        &world.path("edge.redb"),
    );
    let applied = tokio::time::timeout(Duration::from_secs(30), edge.applied.recv())
        .await
        .expect("n1's object")
        .expect("recorder");
    assert_eq!(applied.resource(), "default/pod/for-n1");

    // Upstream: a status for n2 is refused; n1's own status arrives, prefixed.
    let forged = Message::new().build_router(
        "edged",
        group::RESOURCE,
        "node/n2/default/podstatus/x",
        "update",
    );
    let own =
        Message::new().build_router("edged", group::RESOURCE, "default/podstatus/y", "update");
    edge.hive.send(module::EDGEHUB, forged).await.expect("send");
    edge.hive.send(module::EDGEHUB, own).await.expect("send");
    let received = tokio::time::timeout(Duration::from_secs(30), cloud.upstream.recv())
        .await
        .expect("n1's status")
        .expect("recorder");
    assert_eq!(received.resource(), "node/n1/default/podstatus/y");
    let hub = cloud.handle.stats.clone();
    eventually(&hub.changes, "the forged status counted", || {
        get(&hub.foreign_messages) == 1
    })
    .await;
    assert!(
        cloud.upstream.try_recv().is_err(),
        "nothing for n2 got through"
    );
    assert!(
        edge.store
            .get("default/pod/for-n2")
            .expect("read")
            .is_none()
    );
    assert_eq!(get(&hub.pending), 1, "n2's object waits for n2");
}

mod ws {
    use transports::TransportKind::WebSocket as KIND;
    #[actix::test]
    async fn a_node_without_a_certificate_is_refused() {
        super::a_node_without_a_certificate_is_refused(KIND).await;
    }
    #[actix::test]
    async fn a_forged_node_name_is_refused() {
        super::a_forged_node_name_is_refused(KIND).await;
    }
    #[actix::test]
    async fn a_node_cannot_send_or_receive_for_another() {
        super::a_node_cannot_send_or_receive_for_another(KIND).await;
    }
}

mod quic {
    use transports::TransportKind::Quic as KIND;
    #[actix::test]
    async fn a_node_without_a_certificate_is_refused() {
        super::a_node_without_a_certificate_is_refused(KIND).await;
    }
    #[actix::test]
    async fn a_forged_node_name_is_refused() {
        super::a_forged_node_name_is_refused(KIND).await;
    }
    #[actix::test]
    async fn a_node_cannot_send_or_receive_for_another() {
        super::a_node_cannot_send_or_receive_for_another(KIND).await;
    }
}

// A Unix socket has no certificates: its file permissions decide who may
// connect, and the hello names the node. The rule on messages still holds.
mod uds {
    use transports::TransportKind::UnixSocket as KIND;
    #[actix::test]
    async fn a_node_cannot_send_or_receive_for_another() {
        super::a_node_cannot_send_or_receive_for_another(KIND).await;
    }
}
