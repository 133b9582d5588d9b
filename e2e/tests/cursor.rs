//! Delivery cursors on a real three-member etcd cluster: what a KubeEdge
//! edge (scripted frame by frame over a real WebSocket) acknowledged at
//! one replica is written to etcd under that replica's claim, and the
//! replica that takes the node over sends it nothing it acknowledged.
#![cfg(feature = "etcd")]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use beehive::{Hive, HiveConfig};
use cloud::desired::{EtcdConfig, EtcdStore};
use cloud::edgecontroller::{Acked, ControllerCounts, DeliveryCursors};
use cloud::replicas::cursor::decode;
use cloud::replicas::{ClaimsConfig, CursorConfig, CursorWriter, EtcdClaims};
use cloud::{ControllerConfig, ControllerHandle, EdgeController};
use e2e::kubeedge::{KubeEdgeEdge, ack};
use etcd::testing::Cluster;
use hub::{AckSink, CloudEndpoint, CloudHub, CloudHubConfig, CloudHubHandle, Dialect, NodeClaims};
use serde_json::{Value, json};
use tokio::sync::watch;
use transports::testing::free_address;
use transports::tls::{self, DevPki};
use transports::{ListenOptions, TransportKind};

const NODE: &str = "ke-1";
const PODS: usize = 20;

/// One cloudcore replica on the shared etcd: desired state, claims,
/// delivery cursors (unless `cursors` is off), edgecontroller, and
/// cloudhub with a KubeEdge endpoint.
struct Replica {
    hive: Hive,
    hub: CloudHubHandle,
    controller: ControllerHandle,
    claims: EtcdClaims,
    cursors: Option<CursorWriter>,
    kubeedge_address: String,
    _dir: tempfile::TempDir,
}

impl Replica {
    async fn start(
        cluster: &Cluster,
        prefix: &str,
        name: &str,
        pki: &DevPki,
        cursors: bool,
    ) -> Replica {
        let dir = tempfile::tempdir().expect("dir");
        let mut config = EtcdConfig::new(cluster.endpoints());
        config.prefix = prefix.to_owned();
        let store = EtcdStore::connect(config).await.expect("the etcd store");
        let mut config = ClaimsConfig::new(cluster.endpoints(), name);
        config.prefix = prefix.to_owned();
        config.ttl = Duration::from_secs(3);
        config.rebalance = false;
        let claims = EtcdClaims::start(config).expect("claims");
        store.fence_with(claims.fencing());
        claims.catch_up_with(store.catching_up());
        let cursors = cursors.then(|| {
            let mut config = CursorConfig::new(cluster.endpoints());
            config.prefix = prefix.to_owned();
            let cursors = CursorWriter::start(config, claims.fencing()).expect("cursors");
            claims.before_release(cursors.before_release());
            cursors
        });
        let hive = Hive::new(name, HiveConfig::default());
        let controller = EdgeController::start(
            &hive,
            store.shared(),
            ControllerConfig {
                send_to_linked_only: true,
                cursors: cursors
                    .clone()
                    .map(|c| Arc::new(c) as Arc<dyn DeliveryCursors>),
                ..ControllerConfig::default()
            },
        )
        .expect("controller");
        let (chain, key) = pki.server("localhost").expect("server cert");
        let server_tls = tls::server_config(chain, key, Some(&[pki.root()])).expect("tls");
        let hub = CloudHub::start(
            &hive,
            CloudHubConfig {
                node_events: controller.node_events(),
                links: controller.node_links(),
                endpoints: vec![CloudEndpoint {
                    kind: TransportKind::WebSocket,
                    options: ListenOptions::new(free_address()).with_tls(server_tls),
                    trust_hello: false,
                    dialect: Dialect::KubeEdge,
                }],
                // The scripted edge sends no keepalives.
                keepalive: Duration::from_secs(600),
                kubeedge_resend_after: Duration::from_secs(600),
                store: Some(dir.path().join("queues.redb")),
                claims: Some(Arc::new(claims.clone())),
                acks: cursors.clone().map(|c| Arc::new(c) as Arc<dyn AckSink>),
                ..CloudHubConfig::default()
            },
        )
        .await
        .expect("cloudhub");
        let kubeedge_address = hub.addresses[0].1.clone();
        let mut counts = claims.counts();
        tokio::time::timeout(Duration::from_secs(10), counts.wait_for(|c| c.leases >= 1))
            .await
            .expect("a lease in time")
            .expect("claims running");
        Replica {
            hive,
            hub,
            controller,
            claims,
            cursors,
            kubeedge_address,
            _dir: dir,
        }
    }

    async fn counts(&self, what: &str, condition: impl FnMut(&ControllerCounts) -> bool) {
        let mut counts: watch::Receiver<ControllerCounts> = self.controller.counts.clone();
        tokio::time::timeout(Duration::from_secs(30), counts.wait_for(condition))
            .await
            .unwrap_or_else(|_| panic!("timed out waiting for {what}"))
            .expect("controller gone");
    }

    /// Frames cloudhub put on the wire so far.
    fn frames_sent(&self) -> u64 {
        hub::HubStats::get(&self.hub.stats.downstream_sent)
    }

    async fn shutdown(self) {
        let _ = self.hive.shutdown().await;
    }
}

fn pod(name: &str, configmap: &str) -> apis::Object {
    object(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"nodeName": NODE,
                 "containers": [{"name": "c", "image": "busybox:1.36"}],
                 "volumes": [{"name": "conf", "configMap": {"name": configmap}}]},
    }))
}

fn object(body: Value) -> apis::Object {
    apis::Object::new(body).expect("an object")
}

fn configmap(name: &str) -> apis::Object {
    object(json!({"apiVersion": "v1", "kind": "ConfigMap",
           "metadata": {"name": name, "namespace": "default"}, "data": {"k": "v"}}))
}

/// The node's cursor as etcd holds it.
async fn stored_cursor(cluster: &Cluster, prefix: &str) -> BTreeMap<String, Acked> {
    let key = format!("{prefix}/acked/{NODE}");
    let (entry, _) = cluster.client().get(key.as_bytes()).await.expect("get");
    entry.map(|e| decode(&e.value)).unwrap_or_default()
}

/// Receives `n` objects, acknowledges each; resource to version.
async fn receive_and_ack(edge: &mut KubeEdgeEdge, n: usize) -> BTreeMap<String, u64> {
    let mut got = BTreeMap::new();
    for i in 0..n {
        let frame = edge.recv(&format!("object {i} of {n}")).await;
        let resource = frame["route"]["resource"]
            .as_str()
            .expect("resource")
            .to_owned();
        let version = frame["header"]["resourceversion"]
            .as_str()
            .expect("a version")
            .parse()
            .expect("numeric");
        edge.send(ack(&frame)).await;
        got.insert(resource, version);
    }
    got
}

/// A node of `edge` moves from replica `a` to replica `b`: its link here
/// closes, `a` gives its claim up, the edge dials `b`; `b` has read the
/// cursor (or done without) once this returns.
async fn move_node(edge: KubeEdgeEdge, a: &Replica, b: &Replica, pki: &DevPki) -> KubeEdgeEdge {
    edge.link.sender.close().await;
    tokio::time::timeout(
        Duration::from_secs(10),
        a.claims.counts().wait_for(|c| c.held == 0),
    )
    .await
    .expect("a gives the node up")
    .expect("claims running");
    let edge = KubeEdgeEdge::dial_at(
        pki,
        &b.kubeedge_address,
        Some(NODE),
        &format!("system:node:{NODE}"),
    )
    .await;
    assert!(
        tokio::time::timeout(Duration::from_secs(10), async {
            while !b.claims.holds(NODE) {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await
        .is_ok(),
        "b serves the node"
    );
    edge
}

/// What a node moving between replicas is sent by the one taking it over,
/// with and without cursors: the edge acknowledges `PODS` pods and their
/// configmap at `a`, moves to `b`, which sends it what it sends; then a
/// pod applied at `b` arrives. The frames `b` sent before that pod.
async fn takeover(prefix: &str, cursors: bool) -> u64 {
    let cluster = Cluster::start(3).await;
    let pki = DevPki::new("cursor test CA").expect("CA");
    let a = Replica::start(&cluster, prefix, "a", &pki, cursors).await;
    let b = Replica::start(&cluster, prefix, "b", &pki, cursors).await;
    let mut objects = vec![configmap("conf")];
    objects.extend((0..PODS).map(|i| pod(&format!("web-{i:02}"), "conf")));
    a.controller.apply(objects).await.expect("applied");

    let mut edge = KubeEdgeEdge::dial_at(
        &pki,
        &a.kubeedge_address,
        Some(NODE),
        &format!("system:node:{NODE}"),
    )
    .await;
    let acked = receive_and_ack(&mut edge, PODS + 1).await;
    assert_eq!(acked.len(), PODS + 1, "{acked:?}");
    assert!(acked.contains_key("default/configmap/conf"));
    if cursors {
        // Every acknowledged version reads back from etcd, under a's claim.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let stored = stored_cursor(&cluster, prefix).await;
            let versions: BTreeMap<String, u64> =
                stored.iter().map(|(r, a)| (r.clone(), a.version)).collect();
            if versions == acked {
                let claims: std::collections::BTreeSet<i64> =
                    stored.values().map(|a| a.claim).collect();
                assert_eq!(claims.len(), 1, "one claim recorded it all: {stored:?}");
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the cursor never held what was acknowledged: {stored:?}, {acked:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let writes = a
            .cursors
            .as_ref()
            .expect("cursors")
            .counts()
            .borrow()
            .writes;
        assert!(writes >= 1, "{writes} writes");
        println!(
            "replica a wrote the cursor {writes} times for {} acknowledgements",
            PODS + 1
        );
    }

    let mut edge = move_node(edge, &a, &b, &pki).await;
    if cursors {
        b.counts("the cursor read", |c| c.cursors_read >= 1).await;
    } else {
        b.counts("everything sent again", |c| c.sent >= (PODS + 1) as u64)
            .await;
    }
    // What b sent on taking the node over comes first, then a pod applied
    // at b: it arrives.
    b.controller
        .apply(vec![pod("late", "conf")])
        .await
        .expect("applied at b");
    let mut resent = 0;
    loop {
        let frame = edge.recv("the pod applied at b").await;
        edge.send(ack(&frame)).await;
        if frame["route"]["resource"] == "default/pod/late" {
            assert_eq!(frame["route"]["operation"], "insert");
            break;
        }
        resent += 1;
    }
    assert_eq!(b.frames_sent(), resent + 1);
    println!(
        "cursors {cursors}: b sent {resent} frames on taking over a node that acknowledged {} objects",
        PODS + 1
    );
    edge.link.sender.close().await;
    a.shutdown().await;
    b.shutdown().await;
    resent
}

/// The replica that takes a KubeEdge node over resumes from what it
/// acknowledged: nothing is sent again, and what is applied afterwards
/// arrives.
#[actix::test]
async fn a_kubeedge_node_taken_over_is_sent_nothing_it_acknowledged() {
    let resent = takeover("/cursor", true).await;
    assert_eq!(resent, 0, "nothing acknowledged is sent again");
}

/// Without cursors (as before them), the replica that takes a KubeEdge
/// node over sends it everything again.
#[actix::test]
async fn without_a_cursor_a_kubeedge_node_taken_over_gets_everything_again() {
    let resent = takeover("/no-cursor", false).await;
    assert_eq!(resent, (PODS + 1) as u64);
}

/// A replica that dies (its lease ends) leaves what it wrote: the next
/// one sends only what was acknowledged after its last write.
#[actix::test]
async fn a_dead_replicas_cursor_is_taken_over_as_it_was_last_written() {
    let cluster = Cluster::start(3).await;
    let prefix = "/dead";
    let pki = DevPki::new("cursor test CA").expect("CA");
    let a = Replica::start(&cluster, prefix, "a", &pki, true).await;
    let b = Replica::start(&cluster, prefix, "b", &pki, true).await;
    let mut objects = vec![configmap("conf")];
    objects.extend((0..PODS).map(|i| pod(&format!("web-{i:02}"), "conf")));
    a.controller.apply(objects).await.expect("applied");
    let mut edge = KubeEdgeEdge::dial_at(
        &pki,
        &a.kubeedge_address,
        Some(NODE),
        &format!("system:node:{NODE}"),
    )
    .await;
    let acked = receive_and_ack(&mut edge, PODS + 1).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while stored_cursor(&cluster, prefix).await.len() < acked.len() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the cursor never caught up: {:?}, {:?}",
            a.cursors.as_ref().map(|c| c.counts().borrow().clone()),
            stored_cursor(&cluster, prefix).await
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // a's lease is revoked behind its back, as if it had ended; whatever
    // it would write now is fenced off.
    let etcd = cluster.client();
    let (claim, _) = etcd
        .get(format!("{prefix}/claims/{NODE}").as_bytes())
        .await
        .expect("get");
    let claim = claim.expect("a's claim");
    etcd.revoke(claim.lease).await.expect("revoke");
    let mut lost = a.claims.counts();
    tokio::time::timeout(Duration::from_secs(10), lost.wait_for(|c| c.lost >= 1))
        .await
        .expect("a notices")
        .expect("claims running");
    drop(edge);
    let mut edge = KubeEdgeEdge::dial_at(
        &pki,
        &b.kubeedge_address,
        Some(NODE),
        &format!("system:node:{NODE}"),
    )
    .await;
    b.counts("the cursor read", |c| c.cursors_read >= 1).await;
    assert_eq!(b.frames_sent(), 0, "nothing sent again");
    b.controller
        .apply(vec![pod("late", "conf")])
        .await
        .expect("applied at b");
    let frame = edge.recv("the pod applied at b").await;
    assert_eq!(frame["route"]["resource"], "default/pod/late", "{frame}");
    edge.link.sender.close().await;
    a.shutdown().await;
    b.shutdown().await;
}

/// etcd itself refuses a node's cursor from a replica that lost the node,
/// however late that replica learns it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_that_lost_a_node_cannot_write_its_cursor() {
    let cluster = Cluster::start(3).await;
    let prefix = "/fenced-cursor";
    let claims = |name: &str| {
        let mut config = ClaimsConfig::new(cluster.endpoints(), name);
        config.prefix = prefix.to_owned();
        config.ttl = Duration::from_secs(5);
        config.rebalance = false;
        EtcdClaims::start(config).expect("claims")
    };
    let writer = |claims: &EtcdClaims| {
        let mut config = CursorConfig::new(cluster.endpoints());
        config.prefix = prefix.to_owned();
        CursorWriter::start(config, claims.fencing()).expect("cursors")
    };
    let (a, b) = (claims("a"), claims("b"));
    for claims in [&a, &b] {
        tokio::time::timeout(
            Duration::from_secs(10),
            claims.counts().wait_for(|c| c.leases >= 1),
        )
        .await
        .expect("a lease")
        .expect("claims running");
    }
    let (a_cursor, b_cursor) = (writer(&a), writer(&b));
    // Not claimed: nothing is written.
    a_cursor.held(NODE, "default/pod/p1", "10");
    a_cursor.flush(NODE).await;
    assert!(stored_cursor(&cluster, prefix).await.is_empty());
    a.claim_now(NODE).await.expect("a claims");
    a_cursor.held(NODE, "default/pod/p1", "10");
    a_cursor.held(NODE, "default/pod/p2", "11");
    // Not an object the controller follows: not recorded.
    a_cursor.held(NODE, "default/serviceaccounttoken/t", "12");
    a_cursor.flush(NODE).await;
    let written = stored_cursor(&cluster, prefix).await;
    let writes = a_cursor.counts().borrow().writes;
    assert!(writes >= 1);
    assert_eq!(
        written
            .iter()
            .map(|(r, a)| (r.as_str(), a.version))
            .collect::<Vec<_>>(),
        [("default/pod/p1", 10), ("default/pod/p2", 11)]
    );

    // The claim goes behind a's back and b takes the node.
    let etcd = cluster.client();
    let key = format!("{prefix}/claims/{NODE}");
    let (claim, _) = etcd.get(key.as_bytes()).await.expect("get");
    let claim = claim.expect("a's claim");
    etcd.delete(&claim.key, claim.mod_revision)
        .await
        .expect("delete");
    b.claim_now(NODE).await.expect("b claims");
    assert!(a.holds(NODE), "a has not noticed");
    // a writes nothing of it now.
    a_cursor.gone(NODE, "default/pod/p1");
    a_cursor.held(NODE, "default/pod/p3", "20");
    a_cursor.flush(NODE).await;
    assert_eq!(stored_cursor(&cluster, prefix).await, written);
    assert!(a_cursor.counts().borrow().fenced >= 1);
    assert_eq!(a_cursor.counts().borrow().writes, writes);
    // b reads what a wrote under its claim, and writes on top of it.
    let read = b_cursor.read(NODE).await.expect("b reads the cursor");
    assert_eq!(read, written);
    b_cursor.held(NODE, "default/pod/p4", "30");
    b_cursor.flush(NODE).await;
    let stored = stored_cursor(&cluster, prefix).await;
    assert_eq!(stored.len(), 3, "{stored:?}");
    assert_ne!(
        stored["default/pod/p4"].claim,
        stored["default/pod/p1"].claim
    );
    assert_eq!(b_cursor.counts().borrow().writes, 1);
}

/// A node that comes back to a replica whose queue still holds objects for
/// it (sent there once, never acknowledged, older than what it holds now)
/// gets those only once etcd records them as unsure: then, whatever
/// becomes of this replica, the next one sends them again at their current
/// versions. Here this one does, and nothing else.
#[actix::test]
async fn objects_still_queued_where_a_node_returns_go_once_recorded_as_unsure() {
    let cluster = Cluster::start(3).await;
    let prefix = "/returns";
    let pki = DevPki::new("cursor test CA").expect("CA");
    let a = Replica::start(&cluster, prefix, "a", &pki, true).await;
    let b = Replica::start(&cluster, prefix, "b", &pki, true).await;
    let mut objects = vec![configmap("conf")];
    objects.extend((0..PODS).map(|i| pod(&format!("web-{i:02}"), "conf")));
    a.controller.apply(objects).await.expect("applied");
    let certified = format!("system:node:{NODE}");

    // At a, the edge acknowledges only the first 10 objects it gets.
    let mut edge = KubeEdgeEdge::dial_at(&pki, &a.kubeedge_address, Some(NODE), &certified).await;
    let mut unacked = Vec::new();
    for i in 0..=PODS {
        let frame = edge.recv("an object from a").await;
        match i < 10 {
            true => edge.send(ack(&frame)).await,
            false => unacked.push(
                frame["route"]["resource"]
                    .as_str()
                    .expect("resource")
                    .to_owned(),
            ),
        }
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while stored_cursor(&cluster, prefix).await.len() < 10 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "a's cursor never caught up"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // At b, it gets the 11 others, and acknowledges them.
    let mut edge = move_node(edge, &a, &b, &pki).await;
    b.counts("b's cursor read", |c| c.cursors_read >= 1).await;
    assert_eq!(b.frames_sent(), unacked.len() as u64);
    let from_b = receive_and_ack(&mut edge, unacked.len()).await;
    let mut resources: Vec<&String> = from_b.keys().collect();
    resources.sort();
    let mut expected: Vec<&String> = unacked.iter().collect();
    expected.sort();
    assert_eq!(resources, expected);
    // They change at b, and the edge gets the change: what a still
    // queues of them is older now.
    let changed: Vec<apis::Object> = unacked
        .iter()
        .map(|resource| {
            let name = resource.rsplit('/').next().expect("a name");
            let mut changed = pod(name, "conf");
            changed.edit(|o| o["spec"]["containers"][0]["image"] = json!("busybox:1.37"));
            changed
        })
        .collect();
    b.controller.apply(changed).await.expect("changed at b");
    let from_b = receive_and_ack(&mut edge, unacked.len()).await;

    // Back at a, whose queue still holds those 11 at a's versions.
    let edge_back = move_node(edge, &b, &a, &pki).await;
    let mut edge = edge_back;
    let first = edge.recv("the first object a sends again").await;

    let stored = stored_cursor(&cluster, prefix).await;
    for resource in &unacked {
        assert_eq!(
            stored[resource].version,
            Acked::UNSURE,
            "{resource} recorded as unsure before a sent it again: {stored:?}"
        );
    }
    edge.send(ack(&first)).await;
    // Each of the 11 goes again from a's queue, then at its current
    // version (a's cursor read finds them unsure, or held at the old
    // version); then a pod applied at a.
    let version = |frame: &Value| -> u64 {
        frame["header"]["resourceversion"]
            .as_str()
            .expect("a version")
            .parse()
            .expect("numeric")
    };
    let mut last: BTreeMap<String, u64> = BTreeMap::new();
    last.insert(
        first["route"]["resource"]
            .as_str()
            .expect("resource")
            .to_owned(),
        version(&first),
    );
    let mut frames = 1;
    a.counts("a's cursor read", |c| c.cursors_read >= 2).await;
    a.controller
        .apply(vec![pod("late", "conf")])
        .await
        .expect("applied at a");
    // Until the late pod and every one of the 11 at its current version
    // (b's) or above have come.
    let mut late = false;
    while !late
        || unacked
            .iter()
            .any(|r| last.get(r).is_none_or(|v| *v < from_b[r]))
    {
        let frame = edge.recv("an object a sends again").await;
        edge.send(ack(&frame)).await;
        let resource = frame["route"]["resource"]
            .as_str()
            .expect("resource")
            .to_owned();
        if resource == "default/pod/late" {
            late = true;
            continue;
        }
        let version = version(&frame);
        last.insert(resource, version);
        frames += 1;
    }
    println!(
        "a sent {frames} frames to the returning node for the {} still queued there",
        unacked.len()
    );
    // Each at most twice: as queued (unless a newer version replaced it
    // in the queue first), and at its current version.
    assert!(
        (unacked.len()..=2 * unacked.len()).contains(&frames),
        "{frames} frames"
    );
    let mut again: Vec<&String> = last.keys().collect();
    again.sort();
    assert_eq!(again, expected, "only what the queue held goes again");
    assert_eq!(
        a.frames_sent(),
        (PODS + 1 + frames + 1) as u64,
        "nothing else"
    );
    edge.link.sender.close().await;
    a.shutdown().await;
    b.shutdown().await;
}
