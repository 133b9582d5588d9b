//! A link the cloud refuses on what its WebSocket upgrade request says
//! (its headers and its verified certificate) gets an HTTP error with a
//! reason, before anything is upgraded: no `101`, no WebSocket frame.
//! Real TLS, real certificates, a real WebSocket client and a raw one
//! that reads every byte the cloud sends.
#![cfg(all(feature = "cloudhub", feature = "edgehub"))]

mod common;

use std::sync::Arc;
use std::time::Duration;

use beehive::{Hive, HiveConfig};
use common::{World, eventually, get};
use hub::dialect::{KUBEEDGE_PROJECT_ID, NODE_ID_HEADER};
use hub::{CloudHub, CloudHubConfig, CloudHubHandle, Dialect};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use transports::tls::{self, Identity};
use transports::{DialOptions, Link, ListenOptions, TransportError, TransportKind};

/// A cloudhub with one WebSocket endpoint in `dialect`; `required`:
/// whether TLS insists on a client certificate (or lets clients without
/// one through, as the join endpoint does).
async fn cloud(world: &World, dialect: Dialect, required: bool) -> (Hive, CloudHubHandle) {
    let (chain, key) = world.pki.server("cloud").expect("server cert");
    let roots = [world.pki.root()];
    let tls = if required {
        tls::server_config(chain, key, Some(&roots[..]))
    } else {
        tls::server_config_optional_client_auth(chain, key, &roots)
    }
    .expect("tls");
    let endpoint = hub::CloudEndpoint {
        kind: TransportKind::WebSocket,
        options: ListenOptions::new(transports::testing::free_address()).with_tls(tls),
        trust_hello: false,
        dialect,
    };
    let hive = Hive::new("cloud", HiveConfig::default());
    let config = CloudHubConfig {
        endpoints: vec![endpoint],
        ..CloudHubConfig::default()
    };
    let handle = CloudHub::start(&hive, config).await.expect("cloudhub");
    (hive, handle)
}

fn client_tls(world: &World, certified: Option<&str>) -> Arc<tokio_rustls::rustls::ClientConfig> {
    let identity: Option<Identity> = certified.map(|cn| world.pki.client(cn).expect("client cert"));
    tls::client_config(&[world.pki.root()], identity).expect("tls")
}

/// KubeEdge's edgehub dialing as `node_id` with a certificate for
/// `certified`, through edgehive's WebSocket client.
async fn dial_kubeedge(
    world: &World,
    address: &str,
    node_id: &str,
    certified: &str,
) -> Result<Link, TransportError> {
    let options = Dialect::KubeEdge.dial_options(
        node_id,
        DialOptions::new(address, "localhost").with_tls(client_tls(world, Some(certified))),
    );
    TransportKind::WebSocket
        .transport()
        .expect("ws")
        .dial(&options)
        .await
}

/// Every byte the cloud sends to an upgrade request naming `node_id`,
/// from a certificate for `certified`, until it closes the connection.
async fn raw_upgrade(world: &World, address: &str, node_id: &str, certified: &str) -> String {
    let tcp = tokio::net::TcpStream::connect(address)
        .await
        .expect("connect");
    let name = tokio_rustls::rustls::pki_types::ServerName::try_from("localhost").expect("name");
    let mut stream = tokio_rustls::TlsConnector::from(client_tls(world, Some(certified)))
        .connect(name, tcp)
        .await
        .expect("TLS");
    let request = format!(
        "GET /{KUBEEDGE_PROJECT_ID}/{node_id}/events HTTP/1.1\r\n\
         Host: localhost\r\n\
         Connection: Upgrade\r\n\
         Upgrade: websocket\r\n\
         Sec-WebSocket-Version: 13\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\
         {NODE_ID_HEADER}: {node_id}\r\n\
         project_id: {KUBEEDGE_PROJECT_ID}\r\n\
         ConnectionUse: msg\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).await.expect("request");
    stream.flush().await.expect("flush");
    let mut received = Vec::new();
    let mut buffer = [0u8; 4096];
    let read_all = async {
        loop {
            // The cloud closes the connection after its answer (with or
            // without TLS's close_notify: either ends the reading).
            match stream.read(&mut buffer).await {
                Ok(0) | Err(_) => break,
                Ok(n) => received.extend_from_slice(&buffer[..n]),
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(30), read_all)
        .await
        .expect("the cloud never closed the connection");
    String::from_utf8(received).expect("an HTTP answer is text")
}

/// A certificate of the cloud's CA naming a group (an admin API user's,
/// a replica's) speaks for no node, even with a node's name as its common
/// name: over KubeEdge's WebSocket (refused before the upgrade) and in a
/// native link's hello.
#[actix::test]
async fn a_users_certificate_named_as_a_node_speaks_for_no_node() {
    for dialect in [Dialect::KubeEdge, Dialect::Native] {
        let world = World::new(TransportKind::WebSocket);
        let (_hive, handle) = cloud(&world, dialect, true).await;
        let address = handle.addresses[0].1.clone();
        let identity = world
            .pki
            .client_in_group("kube-2", "edgehive:viewers")
            .expect("a user's certificate");
        let tls = tls::client_config(&[world.pki.root()], Some(identity)).expect("tls");
        let options = dialect.dial_options(
            "kube-2",
            DialOptions::new(&address, "localhost").with_tls(tls),
        );
        let dialed = TransportKind::WebSocket
            .transport()
            .expect("ws")
            .dial(&options)
            .await;
        match (dialect, dialed) {
            (Dialect::KubeEdge, Err(TransportError::Refused { status, reason })) => {
                assert_eq!(status, 403);
                assert!(reason.contains("is not a node's"), "{reason}");
            }
            (Dialect::Native, Ok(mut link)) => {
                // The hello names kube-2; the cloud closes the link.
                link.sender
                    .send(&hub::protocol::hello("kube-2"))
                    .await
                    .expect("hello sent");
                let ended = tokio::time::timeout(Duration::from_secs(30), async {
                    while let Some(Ok(_)) = link.receiver.recv().await {}
                })
                .await;
                assert!(ended.is_ok(), "the link was not closed");
            }
            (dialect, other) => panic!("{dialect:?}: {:?}", other.map(|_| "a link")),
        }
        eventually(&handle.stats.changes, "the refusal counted", || {
            get(&handle.stats.refused_links) == 1
        })
        .await;
        assert_eq!(get(&handle.stats.sessions_opened), 0);
    }
}

#[actix::test]
async fn a_kubeedge_link_naming_another_node_gets_403_and_no_upgrade() {
    let world = World::new(TransportKind::WebSocket);
    let (_hive, handle) = cloud(&world, Dialect::KubeEdge, true).await;
    let address = handle.addresses[0].1.clone();
    let stats = handle.stats.clone();

    // What goes over the wire: the status line, a reason, then nothing
    // (not a frame) until the cloud closes the connection.
    let answer = raw_upgrade(&world, &address, "kube-2", "system:node:kube-3").await;
    let (head, body) = answer.split_once("\r\n\r\n").expect("a whole HTTP answer");
    assert!(head.starts_with("HTTP/1.1 403 Forbidden\r\n"), "{answer}");
    let length: usize = head
        .lines()
        .find_map(|line| line.strip_prefix("content-length: "))
        .expect("content-length")
        .parse()
        .expect("a length");
    assert_eq!(
        body,
        "certificate of node \"kube-3\" presented as node \"kube-2\"\n"
    );
    assert_eq!(body.len(), length, "bytes after the answer: {answer:?}");
    assert!(!head.to_ascii_lowercase().contains("upgrade"), "{answer}");

    // The same through a WebSocket client: refused, with the reason.
    let refused = dial_kubeedge(&world, &address, "kube-2", "system:node:kube-3").await;
    match refused {
        Err(TransportError::Refused { status, reason }) => {
            assert_eq!(status, 403);
            assert!(reason.contains("kube-3"), "{reason}");
        }
        other => panic!("not refused with a status: {:?}", other.map(|_| "a link")),
    }
    // A request without a node is malformed: 400.
    let answer = raw_upgrade(&world, &address, "../kube-2", "../kube-2").await;
    assert!(
        answer.starts_with("HTTP/1.1 400 Bad Request\r\n"),
        "{answer}"
    );
    assert_eq!(get(&stats.refused_links), 3);
    assert_eq!(get(&stats.sessions_opened), 0);

    // The node itself links.
    let link = dial_kubeedge(&world, &address, "kube-2", "system:node:kube-2")
        .await
        .expect("the right node links");
    eventually(&stats.changes, "kube-2's session", || {
        get(&stats.sessions_opened) == 1
    })
    .await;
    assert_eq!(get(&stats.refused_links), 3);
    link.sender.close().await;
}

/// edgehive's own edge, speaking KubeEdge's dialect with another node's
/// certificate: every dial is refused with the reason, none links.
#[actix::test]
async fn an_edge_in_kubeedges_dialect_with_another_nodes_certificate_never_links() {
    let world = World::new(TransportKind::WebSocket);
    let (_hive, handle) = cloud(&world, Dialect::KubeEdge, true).await;
    let config = hub::EdgeHubConfig {
        dialect: Dialect::KubeEdge,
        ..common::edge_config(
            &world,
            "kube-2",
            Some("system:node:kube-3"),
            &handle.addresses[0].1,
            Duration::from_secs(5),
        )
    };
    let edge = common::start_edge(config, &world.path("edge.redb"));
    let stats = edge.handle.stats.clone();
    eventually(&stats.changes, "three refused dials", || {
        get(&stats.dial_failures) >= 3
    })
    .await;
    assert_eq!(get(&stats.connects), 0);
    assert!(get(&handle.stats.refused_links) >= 3);
    assert_eq!(get(&handle.stats.sessions_opened), 0);
}

/// A native link is named in its hello, after the upgrade; one with no
/// certificate at all (where TLS does not insist on one) is refused before:
/// 401, the hello protocol untouched for everyone else.
#[actix::test]
async fn a_native_link_without_a_certificate_gets_401() {
    let world = World::new(TransportKind::WebSocket);
    let (_hive, handle) = cloud(&world, Dialect::Native, false).await;
    let address = &handle.addresses[0].1;
    let dial = |certified: Option<&str>| {
        DialOptions::new(address.as_str(), "localhost").with_tls(client_tls(&world, certified))
    };
    let ws = TransportKind::WebSocket.transport().expect("ws");
    match ws.dial(&dial(None)).await {
        Err(TransportError::Refused { status, reason }) => {
            assert_eq!((status, reason.as_str()), (401, "no client certificate"));
        }
        other => panic!("not refused with a status: {:?}", other.map(|_| "a link")),
    }
    // With a certificate it is upgraded, and its hello decides.
    let link = ws.dial(&dial(Some("n1"))).await.expect("upgraded");
    link.sender
        .send(&hub::protocol::hello("n1"))
        .await
        .expect("hello");
    let stats = handle.stats.clone();
    eventually(&stats.changes, "n1's session", || {
        get(&stats.sessions_opened) == 1
    })
    .await;
    assert_eq!(get(&stats.refused_links), 1);
    link.sender.close().await;
}
