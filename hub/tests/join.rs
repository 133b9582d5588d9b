//! Joining over real HTTPS: a node gets its certificate with a join token,
//! stores it, and connects with mutual TLS from then on; bad, expired and
//! foreign tokens are refused, as is a man in the middle serving another CA;
//! a node renews its certificate for itself only; an expired certificate
//! is refused by cloudhub. Token restrictions (one node, single use,
//! revocation) hold, and a deleted node's certificate is refused by
//! cloudhub and for renewal until the node joins again.
#![cfg(all(feature = "cloudhub", feature = "edgehub"))]

mod common;

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use beehive::{Hive, HiveConfig};
use common::{eventually, get, pod, start_edge};
use hub::certs::{
    CertServer, CertServerConfig, CloudCa, JoinError, JoinLedger, MemoryLedger, NodeCredentials,
    TokenRecord, TokenSpec, https_request, join, renew, sha256_hex,
};
use hub::{CloudEndpoint, CloudHub, CloudHubConfig, EdgeHubConfig};
use hyper::StatusCode;
use transports::{DialOptions, ListenOptions, TransportKind, tls};

struct Cloud {
    ca: Arc<CloudCa>,
    ledger: MemoryLedger,
    certs: CertServer,
    hive: Hive,
    hub: hub::CloudHubHandle,
    _dir: tempfile::TempDir,
}

async fn cloud() -> Cloud {
    let dir = tempfile::tempdir().expect("dir");
    let ca = Arc::new(CloudCa::load_or_create(&dir.path().join("ca")).expect("CA"));
    let ledger = MemoryLedger::default();
    let certs = CertServer::start(
        ca.clone(),
        CertServerConfig::new(
            "127.0.0.1:0",
            vec!["localhost".into()],
            Duration::from_secs(3600),
        )
        .with_ledger(Arc::new(ledger.clone())),
    )
    .await
    .expect("certificate endpoints");
    let (chain, key) = ca
        .issue_server(&["localhost".into()], Duration::from_secs(3600))
        .expect("server certificate");
    let server_tls = tls::server_config(chain, key, Some(&[ca.root()])).expect("tls");
    let hive = Hive::new("cloud", HiveConfig::default());
    let hub = CloudHub::start(
        &hive,
        CloudHubConfig {
            endpoints: vec![
                CloudEndpoint {
                    kind: TransportKind::WebSocket,
                    options: ListenOptions::new("127.0.0.1:0").with_tls(server_tls.clone()),
                    trust_hello: false,
                    dialect: hub::Dialect::Native,
                },
                CloudEndpoint {
                    kind: TransportKind::WebSocket,
                    options: ListenOptions::new("127.0.0.1:0").with_tls(server_tls),
                    trust_hello: false,
                    dialect: hub::Dialect::KubeEdge,
                },
            ],
            revocations: Some(Arc::new(ledger.clone())),
            ..CloudHubConfig::default()
        },
    )
    .await
    .expect("cloudhub");
    Cloud {
        ca,
        ledger,
        certs,
        hive,
        hub,
        _dir: dir,
    }
}

fn edge_config(cloud: &Cloud, credentials: &NodeCredentials) -> EdgeHubConfig {
    let dial = DialOptions::new(&cloud.hub.addresses[0].1, "localhost")
        .with_tls(credentials.client_tls().expect("client tls"));
    EdgeHubConfig {
        reconnect_initial: Duration::from_millis(5),
        reconnect_max: Duration::from_millis(100),
        ..EdgeHubConfig::new(credentials.node.clone(), TransportKind::WebSocket, dial)
    }
}

#[actix::test]
async fn a_node_joins_with_a_token_and_then_starts_without_it() {
    let cloud = cloud().await;
    let address = cloud.certs.address.to_string();
    let token = cloud.ca.issue_token(Duration::from_secs(600));
    let joined = join(&address, "localhost", &token, "edge-7")
        .await
        .expect("joined");
    assert_eq!(
        tls::common_name(joined.cert.as_ref()).as_deref(),
        Some("edge-7")
    );

    // Stored, and loaded again as a restarted edge would: no token needed.
    let dir = tempfile::tempdir().expect("dir");
    joined.save(&dir.path().join("pki")).expect("save");
    let credentials = NodeCredentials::load(&dir.path().join("pki"))
        .expect("load")
        .expect("stored");
    assert_eq!(credentials.node, "edge-7");
    assert!(
        credentials.not_after().expect("validity") > SystemTime::now() + Duration::from_secs(3000)
    );

    cloud
        .hive
        .send("cloudhub", pod("edge-7", "web", 1))
        .await
        .expect("queued");
    let mut edge = start_edge(
        edge_config(&cloud, &credentials),
        &dir.path().join("edge.redb"),
    );
    let applied = tokio::time::timeout(Duration::from_secs(30), edge.applied.recv())
        .await
        .expect("delivered")
        .expect("recorder");
    assert_eq!(applied.resource(), "default/pod/web");
    assert_eq!(get(&cloud.hub.stats.sessions_opened), 1);
}

#[actix::test]
async fn bad_expired_and_foreign_tokens_are_refused() {
    let cloud = cloud().await;
    let address = cloud.certs.address.to_string();

    let expired = cloud.ca.issue_token(Duration::ZERO);
    match join(&address, "localhost", &expired, "edge-1").await {
        Err(JoinError::Refused { status, reason }) => {
            assert_eq!(status, StatusCode::UNAUTHORIZED);
            assert!(reason.contains("expired"), "{reason}");
        }
        other => panic!("expected a refusal, got {:?}", other.map(|c| c.node)),
    }

    // Right CA hash, forged signature.
    let valid = cloud.ca.issue_token(Duration::from_secs(600));
    let forged = format!("{}x", &valid[..valid.len() - 1]);
    assert!(matches!(
        join(&address, "localhost", &forged, "edge-1").await,
        Err(JoinError::Refused {
            status: StatusCode::UNAUTHORIZED,
            ..
        })
    ));
    assert!(matches!(
        join(&address, "localhost", "no-dot-at-all", "edge-1").await,
        Err(JoinError::BadToken(_))
    ));
    // Cut short, or pasted without its CA hash: named as malformed, not
    // taken for a CA that does not match.
    let (hash, jwt) = valid.split_once('.').expect("a token");
    for malformed in [
        format!("{hash}."),
        jwt.to_owned(),
        valid[..valid.len() / 2].to_owned(),
    ] {
        assert!(
            matches!(
                join(&address, "localhost", &malformed, "edge-1").await,
                Err(JoinError::BadToken(_))
            ),
            "{malformed:?}"
        );
    }
    assert!(matches!(
        join(&address, "localhost", &valid, "Bad/Name").await,
        Err(JoinError::BadNodeName(_))
    ));

    // A token from another cloud: the CA served here is not the one the
    // token vouches for, so the edge stops before sending anything.
    let other_dir = tempfile::tempdir().expect("dir");
    let other = CloudCa::load_or_create(other_dir.path()).expect("other CA");
    let foreign = other.issue_token(Duration::from_secs(600));
    assert!(matches!(
        join(&address, "localhost", &foreign, "edge-1").await,
        Err(JoinError::CaMismatch)
    ));
}

#[actix::test]
async fn a_node_renews_its_own_certificate_and_no_other() {
    let cloud = cloud().await;
    let address = cloud.certs.address.to_string();
    let token = cloud.ca.issue_token(Duration::from_secs(600));
    let first = join(&address, "localhost", &token, "edge-1")
        .await
        .expect("joined");
    let renewed = renew(&address, "localhost", &first).await.expect("renewed");
    assert_eq!(renewed.node, "edge-1");
    assert_ne!(renewed.cert, first.cert);
    assert_eq!(
        tls::common_name(renewed.cert.as_ref()).as_deref(),
        Some("edge-1")
    );

    // edge-1's certificate asking for a certificate of edge-2.
    let mut impostor = renewed.clone();
    impostor.node = "edge-2".into();
    assert!(matches!(
        renew(&address, "localhost", &impostor).await,
        Err(JoinError::Refused {
            status: StatusCode::FORBIDDEN,
            ..
        })
    ));
}

#[actix::test]
async fn an_expired_certificate_is_refused_by_cloudhub() {
    let cloud = cloud().await;
    let token = cloud.ca.issue_token(Duration::from_secs(600));
    let mut credentials = join(
        &cloud.certs.address.to_string(),
        "localhost",
        &token,
        "edge-1",
    )
    .await
    .expect("joined");
    // The same node, its certificate expired a minute ago.
    let key = rcgen::KeyPair::from_der_and_sign_algo(
        &rustls::pki_types::PrivateKeyDer::Pkcs8(credentials.key.secret_der().to_vec().into()),
        &rcgen::PKCS_ECDSA_P256_SHA256,
    )
    .expect("key");
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "edge-1");
    let csr = params.serialize_request(&key).expect("csr").der().to_vec();
    let (_, expired) = cloud
        .ca
        .sign_csr(
            &csr,
            SystemTime::now() - Duration::from_secs(60),
            None,
            None,
        )
        .expect("issued");
    credentials.cert = expired;
    let dir = tempfile::tempdir().expect("dir");
    let edge = start_edge(
        edge_config(&cloud, &credentials),
        &dir.path().join("edge.redb"),
    );
    let stats = edge.handle.stats.clone();
    eventually(&stats.changes, "three refused attempts", || {
        get(&stats.dial_failures) + get(&stats.connects) >= 3
    })
    .await;
    assert_eq!(get(&cloud.hub.stats.sessions_opened), 0);
}

#[actix::test]
async fn a_renewed_certificate_is_presented_on_the_next_link() {
    let cloud = cloud().await;
    let address = cloud.certs.address.to_string();
    let token = cloud.ca.issue_token(Duration::from_secs(600));
    let first = join(&address, "localhost", &token, "edge-1")
        .await
        .expect("joined");
    // Issued for an hour, five minutes back-dated: due after two thirds.
    let due = first
        .renew_at()
        .expect("due")
        .duration_since(SystemTime::now())
        .expect("future");
    assert!((2_290..=2_310).contains(&due.as_secs()), "{due:?}");

    // A listener that shows which certificate each client presents.
    let (chain, key) = cloud
        .ca
        .issue_server(&["localhost".into()], Duration::from_secs(3600))
        .expect("cert");
    let server_tls = tls::server_config(chain, key, Some(&[cloud.ca.root()])).expect("tls");
    let ws = TransportKind::WebSocket.transport().expect("ws");
    let mut listener = ws
        .listen(&ListenOptions::new("127.0.0.1:0").with_tls(server_tls))
        .await
        .expect("listen");
    let identity = first.reloadable().expect("identity");
    let dial = DialOptions::new(listener.local_addr(), "localhost").with_tls(
        tls::client_config_reloadable(std::slice::from_ref(&first.ca), identity.clone())
            .expect("tls"),
    );
    let _before = ws.dial(&dial).await.expect("dial");
    let seen = listener.accept().await.expect("link");
    assert_eq!(seen.peer.certificates[0], first.cert.as_ref());

    let renewed = renew(&address, "localhost", &first).await.expect("renewed");
    identity
        .replace(vec![renewed.cert.clone()], renewed.key.clone_key())
        .expect("replace");
    let _after = ws.dial(&dial).await.expect("dial");
    let seen = listener.accept().await.expect("link");
    assert_eq!(seen.peer.certificates[0], renewed.cert.as_ref());
    assert_eq!(seen.peer.common_name.as_deref(), Some("edge-1"));
}

/// A KubeEdge edgecore's join, request by request: `GET /ca.crt` without
/// trusting the server, the CA checked against the token's hash, then
/// `GET /edge.crt` with the JWT alone as the bearer, a `NodeName` header and
/// a DER CSR for `system:node:<node>` (organization `system:nodes`) from an
/// ECDSA P-256 key. The certificate it gets opens a session on the cloud's
/// KubeEdge endpoint under that node's `node_id`.
#[actix::test]
async fn a_kubeedge_edge_joins_as_keadm_does() {
    use hyper::Method;
    let cloud = cloud().await;
    let address = cloud.certs.address.to_string();
    let token = cloud.ca.issue_token(Duration::from_secs(600));
    let (ca_hash, jwt) = token.split_once('.').expect("hash.jwt");
    assert_eq!(jwt.split('.').count(), 3);

    let bootstrap = tls::bootstrap_client_config().expect("bootstrap tls");
    let (status, ca) = https_request(
        &address,
        "localhost",
        bootstrap,
        Method::GET,
        "/ca.crt",
        &[],
        Vec::new(),
    )
    .await
    .expect("ca.crt");
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        sha256_hex(&ca),
        ca_hash,
        "the token vouches for the CA served"
    );
    let ca = tls::CertificateDer::from(ca.to_vec());

    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).expect("key");
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
    params
        .distinguished_name
        .push(rcgen::DnType::OrganizationName, "system:nodes");
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "system:node:kube-9");
    let csr = params.serialize_request(&key).expect("csr").der().to_vec();
    let trusting = tls::client_config(std::slice::from_ref(&ca), None).expect("tls");
    let edge_crt = |headers: Vec<(&'static str, String)>, csr: Vec<u8>| {
        let trusting = trusting.clone();
        let address = address.clone();
        async move {
            let headers: Vec<(&str, &str)> =
                headers.iter().map(|(n, v)| (*n, v.as_str())).collect();
            https_request(
                &address,
                "localhost",
                trusting,
                Method::GET,
                "/edge.crt",
                &headers,
                csr,
            )
            .await
            .expect("edge.crt")
        }
    };
    let bearer = format!("Bearer {jwt}");

    // The NodeName header must name the CSR's node; a bad JWT is refused.
    let (status, _) = edge_crt(
        vec![
            ("Authorization", bearer.clone()),
            ("NodeName", "kube-8".into()),
        ],
        csr.clone(),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let (status, _) = edge_crt(
        vec![
            ("Authorization", format!("{bearer}x")),
            ("NodeName", "kube-9".into()),
        ],
        csr.clone(),
    )
    .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);

    let (status, cert) = edge_crt(
        vec![("Authorization", bearer), ("NodeName", "kube-9".into())],
        csr,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&cert));
    let cert = tls::CertificateDer::from(cert.to_vec());
    assert_eq!(
        tls::common_name(cert.as_ref()).as_deref(),
        Some("system:node:kube-9")
    );

    let identity = (
        vec![cert],
        tls::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
    );
    let options = hub::Dialect::KubeEdge.dial_options(
        "kube-9",
        DialOptions::new(&cloud.hub.addresses[1].1, "localhost")
            .with_tls(tls::client_config(&[ca], Some(identity)).expect("tls")),
    );
    let link = TransportKind::WebSocket
        .transport()
        .expect("ws")
        .dial(&options)
        .await
        .expect("dial");
    let stats = cloud.hub.stats.clone();
    assert!(
        stats
            .changes
            .wait_for(Duration::from_secs(30), || get(&stats.sessions_opened) == 1)
            .await,
        "no session for kube-9"
    );
    assert_eq!(get(&stats.refused_links), 0);
    link.sender.close().await;
}

/// A token as `cloudcore token create` makes one: issued and recorded.
async fn new_token(cloud: &Cloud, node: Option<&str>, single_use: bool) -> (String, String) {
    let (claims, token) = cloud.ca.issue_restricted_token(&TokenSpec {
        ttl: Duration::from_secs(600),
        node: node.map(str::to_owned),
        single_use,
    });
    let record = TokenRecord::issued(&claims).expect("an id");
    cloud.ledger.record(record).await.expect("recorded");
    (claims.id.expect("an id"), token)
}

fn refusal(joined: Result<NodeCredentials, JoinError>) -> (StatusCode, String) {
    match joined {
        Err(JoinError::Refused { status, reason }) => (status, reason),
        other => panic!("expected a refusal, got {:?}", other.map(|c| c.node)),
    }
}

#[actix::test]
async fn a_node_bound_token_joins_its_node_only() {
    let cloud = cloud().await;
    let address = cloud.certs.address.to_string();
    let (id, token) = new_token(&cloud, Some("edge-3"), false).await;
    let (status, reason) = refusal(join(&address, "localhost", &token, "edge-4").await);
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert!(
        reason.contains(r#"for node "edge-3", not "edge-4""#),
        "{reason}"
    );
    let joined = join(&address, "localhost", &token, "edge-3")
        .await
        .expect("its own node joins");
    assert_eq!(
        tls::common_name(joined.cert.as_ref()).as_deref(),
        Some("edge-3")
    );
    // Reusable: edge-3 joins again (a reinstall), the record unchanged.
    join(&address, "localhost", &token, "edge-3")
        .await
        .expect("joins again");
    let record = cloud.ledger.token(&id).expect("recorded");
    assert_eq!(record.node.as_deref(), Some("edge-3"));
    assert_eq!((record.used_by, record.revoked), (None, None));
}

#[actix::test]
async fn a_single_use_token_joins_once() {
    let cloud = cloud().await;
    let address = cloud.certs.address.to_string();
    let (id, token) = new_token(&cloud, None, true).await;
    join(&address, "localhost", &token, "edge-1")
        .await
        .expect("first use");
    let (status, reason) = refusal(join(&address, "localhost", &token, "edge-2").await);
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert!(reason.contains("used already"), "{reason}");
    assert!(reason.contains("edge-1"), "{reason}");
    assert_eq!(
        cloud
            .ledger
            .token(&id)
            .expect("recorded")
            .used_by
            .as_deref(),
        Some("edge-1")
    );

    // Eight joins at once with a fresh one: exactly one wins.
    let (id, token) = new_token(&cloud, None, true).await;
    let joins = (0..8).map(|i| {
        let (address, token) = (address.clone(), token.clone());
        tokio::spawn(async move {
            let node = format!("racer-{i}");
            (
                node.clone(),
                join(&address, "localhost", &token, &node).await,
            )
        })
    });
    let mut winners = Vec::new();
    for joined in futures_util::future::join_all(joins).await {
        let (node, joined) = joined.expect("task");
        match joined {
            Ok(credentials) => winners.push(credentials.node),
            Err(err) => {
                let (status, reason) = refusal(Err(err));
                assert_eq!(status, StatusCode::UNAUTHORIZED, "{node}: {reason}");
                assert!(reason.contains("used already"), "{node}: {reason}");
            }
        }
    }
    assert_eq!(winners.len(), 1, "{winners:?}");
    assert_eq!(
        cloud.ledger.token(&id).expect("recorded").used_by,
        Some(winners[0].clone())
    );
}

#[actix::test]
async fn a_revoked_token_is_refused() {
    let cloud = cloud().await;
    let address = cloud.certs.address.to_string();
    let (id, token) = new_token(&cloud, None, false).await;
    assert_eq!(
        cloud
            .ledger
            .revoke_token(id.clone(), 1, false)
            .await
            .expect("revoked"),
        hub::certs::ledger::Revoked::Now
    );
    let (status, reason) = refusal(join(&address, "localhost", &token, "edge-1").await);
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(reason, format!("join token {id} was revoked"));
    // A token issued before tokens were recorded is revoked by its id too.
    let (claims, unrecorded) = cloud.ca.issue_restricted_token(&TokenSpec {
        ttl: Duration::from_secs(600),
        ..TokenSpec::default()
    });
    let unrecorded_id = claims.id.expect("an id");
    cloud
        .ledger
        .revoke_token(unrecorded_id.clone(), 1, true)
        .await
        .expect("revoked");
    let (status, reason) = refusal(join(&address, "localhost", &unrecorded, "edge-1").await);
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert!(reason.contains(&unrecorded_id), "{reason}");
}

#[actix::test]
async fn a_deleted_nodes_certificate_is_refused_until_it_joins_again() {
    let cloud = cloud().await;
    let address = cloud.certs.address.to_string();
    let (_, token) = new_token(&cloud, None, false).await;
    let old = join(&address, "localhost", &token, "edge-5")
        .await
        .expect("joined");
    let stats = cloud.hub.stats.clone();
    let dir = tempfile::tempdir().expect("dir");
    {
        let _edge = start_edge(edge_config(&cloud, &old), &dir.path().join("a.redb"));
        eventually(&stats.changes, "a session", || {
            get(&stats.sessions_opened) == 1
        })
        .await;
    }

    // The Node is deleted: its certificates issued until now are revoked.
    let now = SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs();
    assert!(
        cloud
            .ledger
            .revoke_node("edge-5".into(), "uid-5".into(), now)
            .await
            .expect("revoked")
    );
    let refused_before = get(&stats.refused_links);
    let opened_before = get(&stats.sessions_opened);
    let edge = start_edge(edge_config(&cloud, &old), &dir.path().join("b.redb"));
    eventually(&stats.changes, "the revoked link refused", || {
        get(&stats.refused_links) >= refused_before + 2
    })
    .await;
    assert_eq!(get(&stats.sessions_opened), opened_before);
    drop(edge);
    let (status, reason) = refusal(renew(&address, "localhost", &old).await);
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert!(reason.contains("revoked"), "{reason}");

    // Joined again (a new token, the same second perhaps): served again.
    let (_, token) = new_token(&cloud, Some("edge-5"), true).await;
    let new = join(&address, "localhost", &token, "edge-5")
        .await
        .expect("joined again");
    assert!(!cloud.ledger.revocations().revoked(
        "edge-5",
        hub::certs::issued_at(new.cert.as_ref()).expect("issued")
    ));
    let renewed = renew(&address, "localhost", &new).await.expect("renewed");
    let _edge = start_edge(edge_config(&cloud, &renewed), &dir.path().join("c.redb"));
    eventually(&stats.changes, "a session again", || {
        get(&stats.sessions_opened) == opened_before + 1
    })
    .await;
}
