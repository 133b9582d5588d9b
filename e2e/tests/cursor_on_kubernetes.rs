//! Delivery cursors on a real kube-apiserver, replicas on Leases: what a
//! KubeEdge edge (scripted frame by frame over a real WebSocket)
//! acknowledged at one replica is written to a ConfigMap under that
//! replica's claim Lease, and the replica that takes the node over sends
//! it nothing it acknowledged.
//!
//! Runs when `EDGEHIVE_TEST_KUBECONFIG` names a kubeconfig with rights on
//! namespaces, nodes, pods, configmaps and Leases (an admin's); says it
//! was skipped otherwise.
#![cfg(feature = "kubernetes")]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use beehive::{Hive, HiveConfig};
use cloud::desired::{KubeAccess, KubernetesConfig, KubernetesStore};
use cloud::edgecontroller::{ControllerCounts, DeliveryCursors};
use cloud::replicas::CursorWriter;
use cloud::replicas::cursor::decode;
use cloud::replicas::leases::{LeaseClaims, LeaseClaimsConfig};
use cloud::{ControllerConfig, ControllerHandle, EdgeController};
use e2e::kubeedge::{KubeEdgeEdge, ack};
use hub::{AckSink, CloudEndpoint, CloudHub, CloudHubConfig, CloudHubHandle, Dialect, NodeClaims};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use serde_json::{Value, json};
use tokio::sync::watch;
use transports::testing::free_address;
use transports::tls::{self, DevPki};
use transports::{ListenOptions, TransportKind};

const PODS: usize = 20;

fn kubeconfig(test: &str) -> Option<String> {
    match std::env::var("EDGEHIVE_TEST_KUBECONFIG") {
        Ok(path) if !path.is_empty() => Some(path),
        _ => {
            println!("{test}: skipped: EDGEHIVE_TEST_KUBECONFIG is not set (no kube-apiserver)");
            None
        }
    }
}

/// This run's namespace (claims, cursors and pods) and node, removed at
/// the end whatever happened.
struct Scope {
    namespace: String,
    node: String,
    kubeconfig: String,
}

impl Drop for Scope {
    fn drop(&mut self) {
        for (kind, name) in [("namespace", &self.namespace), ("node", &self.node)] {
            let _ = std::process::Command::new("kubectl")
                .args(["--kubeconfig", &self.kubeconfig, "delete", kind, name])
                .args(["--wait=false", "--ignore-not-found"])
                .output();
        }
    }
}

/// One cloudcore replica on the API server: desired state, Lease claims,
/// delivery cursors as ConfigMaps, edgecontroller, and cloudhub with a
/// KubeEdge endpoint.
struct Replica {
    hive: Hive,
    hub: CloudHubHandle,
    controller: ControllerHandle,
    claims: LeaseClaims,
    cursors: CursorWriter,
    kubeedge_address: String,
    _dir: tempfile::TempDir,
}

impl Replica {
    async fn start(scope: &Scope, name: &str, pki: &DevPki) -> Replica {
        let dir = tempfile::tempdir().expect("dir");
        let access = KubeAccess::Kubeconfig(scope.kubeconfig.clone().into());
        let mut config = KubernetesConfig::new(access.clone());
        config.namespace = scope.namespace.clone();
        let store = KubernetesStore::connect(config)
            .await
            .expect("the API server");
        let client = store.client().clone();
        let mut config = LeaseClaimsConfig::new(name);
        config.namespace = scope.namespace.clone();
        config.ttl = Duration::from_secs(3);
        config.keeper_client = Some(access.config().await.expect("kubeconfig"));
        let claims = LeaseClaims::start(client.clone(), config)
            .await
            .expect("claims");
        let cursors = CursorWriter::on_kubernetes(
            client,
            &scope.namespace,
            claims.clone(),
            Duration::from_secs(1),
        );
        claims.before_release(cursors.before_release());
        let hive = Hive::new(name, HiveConfig::default());
        let controller = EdgeController::start(
            &hive,
            store.shared(),
            ControllerConfig {
                send_to_linked_only: true,
                cursors: Some(Arc::new(cursors.clone()) as Arc<dyn DeliveryCursors>),
                claims: Some(Arc::new(claims.clone())),
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
                acks: Some(Arc::new(cursors.clone()) as Arc<dyn AckSink>),
                ..CloudHubConfig::default()
            },
        )
        .await
        .expect("cloudhub");
        let kubeedge_address = hub.addresses[0].1.clone();
        let mut counts = claims.counts();
        tokio::time::timeout(Duration::from_secs(10), counts.wait_for(|c| c.leases >= 1))
            .await
            .expect("a Lease in time")
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

/// A pod as cloudcore's admission webhook lets it in: with the offline
/// window's tolerations (a day) already. Without them the API server adds
/// its 300 s defaults and the controller lengthens them (a newer version of
/// every pod), which this test would count as objects sent again.
fn pod(namespace: &str, node: &str, name: &str) -> Value {
    let tolerations: Vec<Value> = [
        "node.kubernetes.io/not-ready",
        "node.kubernetes.io/unreachable",
    ]
    .iter()
    .map(|key| {
        json!({"key": key, "operator": "Exists", "effect": "NoExecute",
                   "tolerationSeconds": 86400})
    })
    .collect();
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"nodeName": node,
                 "automountServiceAccountToken": false,
                 "containers": [{"name": "c", "image": "busybox:1.36"}],
                 "tolerations": tolerations,
                 "volumes": [{"name": "conf", "configMap": {"name": "conf"}}]},
    })
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

/// The replica that takes a KubeEdge node over on Kubernetes Leases reads
/// its cursor from the ConfigMap the last holder wrote: nothing the node
/// acknowledged is sent again, and what is applied afterwards arrives.
#[actix::test]
async fn a_kubeedge_node_taken_over_on_leases_is_sent_nothing_it_acknowledged() {
    let test = "a_kubeedge_node_taken_over_on_leases_is_sent_nothing_it_acknowledged";
    let Some(kubeconfig) = kubeconfig(test) else {
        return;
    };
    let scope = Scope {
        namespace: format!("edgehive-cursor-{}", std::process::id()),
        node: format!("ke-cursor-{}", std::process::id()),
        kubeconfig,
    };
    let (namespace, node) = (scope.namespace.as_str(), scope.node.as_str());
    let pki = DevPki::new("cursor test CA").expect("CA");
    let a = Replica::start(&scope, "a", &pki).await;
    let b = Replica::start(&scope, "b", &pki).await;
    let mut objects = vec![json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "conf", "namespace": namespace}, "data": {"k": "v"}})];
    objects.extend((0..PODS).map(|i| pod(namespace, node, &format!("web-{i:02}"))));
    let objects = objects.into_iter().map(object).collect();
    a.controller.apply(objects).await.expect("applied");

    let identity = format!("system:node:{node}");
    let mut edge = KubeEdgeEdge::dial_at(&pki, &a.kubeedge_address, Some(node), &identity).await;
    let acked = receive_and_ack(&mut edge, PODS + 1).await;
    assert_eq!(acked.len(), PODS + 1, "{acked:?}");

    // Every acknowledged version reads back from the ConfigMap.
    let client = kube::Client::try_from(
        KubeAccess::Kubeconfig(scope.kubeconfig.clone().into())
            .config()
            .await
            .expect("kubeconfig"),
    )
    .expect("client");
    let maps: Api<ConfigMap> = Api::namespaced(client, namespace);
    let name = format!("edgehive-acked-{node}");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let stored = maps
            .get_opt(&name)
            .await
            .expect("read")
            .and_then(|map| map.data)
            .and_then(|data| data.get("cursor").map(|c| decode(c.as_bytes())))
            .unwrap_or_default();
        let versions: BTreeMap<String, u64> =
            stored.iter().map(|(r, a)| (r.clone(), a.version)).collect();
        if versions == acked {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the cursor never held what was acknowledged: {stored:?}, {acked:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let writes = a.cursors.counts().borrow().writes;
    assert!(writes >= 1, "{writes} writes");

    // The node moves to b.
    edge.link.sender.close().await;
    tokio::time::timeout(
        Duration::from_secs(10),
        a.claims.counts().wait_for(|c| c.held == 0),
    )
    .await
    .expect("a gives the node up")
    .expect("claims running");
    let mut edge = KubeEdgeEdge::dial_at(&pki, &b.kubeedge_address, Some(node), &identity).await;
    // Claimed once the edge's opener is taken: a state only a look shows.
    assert!(
        tokio::time::timeout(Duration::from_secs(10), async {
            while !b.claims.holds(node) {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await
        .is_ok(),
        "b serves the node"
    );
    b.counts("the cursor read", |c| c.cursors_read >= 1).await;
    b.controller
        .apply(vec![object(pod(namespace, node, "late"))])
        .await
        .expect("applied at b");
    let mut resent = 0;
    loop {
        let frame = edge.recv("the pod applied at b").await;
        edge.send(ack(&frame)).await;
        if frame["route"]["resource"] == format!("{namespace}/pod/late") {
            assert_eq!(frame["route"]["operation"], "insert");
            break;
        }
        resent += 1;
    }
    assert_eq!(b.frames_sent(), resent + 1);
    println!(
        "{test}: a wrote the cursor {writes} times; b sent {resent} frames on taking over a node that acknowledged {} objects",
        PODS + 1
    );
    assert_eq!(resent, 0, "nothing acknowledged is sent again");
    edge.link.sender.close().await;
    a.shutdown().await;
    b.shutdown().await;
}

fn object(body: serde_json::Value) -> apis::Object {
    apis::Object::new(body).expect("an object")
}
