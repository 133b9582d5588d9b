//! The cloud's edgecontroller and admin API against real edges: manifests
//! go in through HTTP, objects travel over a real WebSocket link with
//! mutual TLS, and each edge's metamanager stores what it gets.

use std::time::Duration;

use beehive::Message;
use beehive::constants::{group, module, operation};
use cloud::admin_client::ClientError;
use e2e::{Cloud, Edge, configmap_yaml, next, pod_yaml};
use serde_json::{Value, json};
use tokio::sync::mpsc::UnboundedReceiver;

/// What an edge's edged got: `op resource`.
fn seen(msg: &Message) -> String {
    format!("{} {}", msg.operation(), msg.resource())
}

/// Proves nothing else is waiting for `edge`: a pod of its own, applied
/// now, must be the next thing it gets.
async fn nothing_else_for(cloud: &Cloud, edge: &mut Edge, marker: &str) {
    cloud.apply(&pod_yaml(marker, &edge.node, &[])).await;
    let msg = next(&mut edge.edged, marker).await;
    assert_eq!(
        seen(&msg),
        format!("insert default/pod/{marker}"),
        "{} got something else first",
        edge.node
    );
}

async fn drain(rx: &mut UnboundedReceiver<Message>, n: usize, what: &str) -> Vec<String> {
    let mut out = Vec::new();
    for _ in 0..n {
        out.push(seen(&next(rx, what).await));
    }
    out.sort();
    out
}

#[actix::test]
async fn a_pod_reaches_exactly_its_node_and_its_status_comes_back() {
    let cloud = Cloud::start().await;
    let mut a = Edge::start(&cloud, "node-a").await;
    let mut b = Edge::start(&cloud, "node-b").await;

    let applied = cloud.apply(&pod_yaml("web", "node-a", &[])).await;
    assert_eq!(applied, ["Pod/web created"]);
    let got = next(&mut a.edged, "the pod at node-a").await;
    assert_eq!(seen(&got), "insert default/pod/web");
    assert_eq!(
        got.body::<serde_json::Value>().expect("json body")["spec"]["nodeName"],
        "node-a"
    );
    // Stored at the edge before edged heard of it.
    assert!(
        a.store
            .get("default/pod/web")
            .expect("read")
            .is_some_and(|r| !r.is_deleted())
    );
    nothing_else_for(&cloud, &mut b, "b-marker").await;
    assert!(b.store.get("default/pod/web").expect("read").is_none());

    // The same manifest again changes nothing and sends nothing.
    assert_eq!(
        cloud.apply(&pod_yaml("web", "node-a", &[])).await,
        ["Pod/web unchanged"]
    );

    // Status from node-a lands in the cloud and shows through the admin API.
    a.report(
        "default/podstatus/web",
        json!({"phase": "Running", "podIP": "10.88.0.7", "containerStatuses": [
            {"name": "main", "ready": true, "restartCount": 0, "image": "busybox", "imageID": "", "state": {"running": {}}}
        ]}),
    )
    .await;
    cloud
        .counts("pod status applied", |c| c.status_applied >= 1)
        .await;
    let pod = cloud
        .client
        .get("/api/v1/namespaces/default/pods/web")
        .await
        .expect("get");
    assert_eq!(pod["status"]["phase"], "Running");
    assert_eq!(pod["status"]["podIP"], "10.88.0.7");

    // node-b cannot speak for node-a's pod.
    b.report("default/podstatus/web", json!({"phase": "Failed"}))
        .await;
    cloud
        .counts("foreign status refused", |c| c.status_refused >= 1)
        .await;
    let pod = cloud
        .client
        .get("/api/v1/namespaces/default/pods/web")
        .await
        .expect("get");
    assert_eq!(pod["status"]["phase"], "Running");

    // Node status lands on the Node, which joined on connect and is Ready.
    a.report(
        "default/nodestatus/node-a",
        json!({"nodeInfo": {"kubeletVersion": "edgehive-0.1", "architecture": "amd64", "bootID": "", "containerRuntimeVersion": "containerd", "kernelVersion": "", "kubeProxyVersion": "", "machineID": "", "operatingSystem": "linux", "osImage": "Debian", "systemUUID": ""},
               "addresses": [{"type": "InternalIP", "address": "192.0.2.10"}]}),
    )
    .await;
    cloud
        .counts("node status applied", |c| c.status_applied >= 2)
        .await;
    let node = cloud
        .client
        .get("/api/v1/nodes/node-a")
        .await
        .expect("node");
    assert_eq!(node["status"]["nodeInfo"]["kubeletVersion"], "edgehive-0.1");
    assert_eq!(ready(&node), "True");
    let nodes = cloud.client.get("/api/v1/nodes").await.expect("nodes");
    assert_eq!(nodes["kind"], "NodeList");
    assert_eq!(nodes["items"].as_array().map(Vec::len), Some(2));

    // A node whose link goes down turns Unknown, once the status writer
    // wrote what the controller handed it at the disconnect.
    let events = cloud.controller.counts.borrow().node_events;
    b.shutdown().await;
    cloud
        .counts("node-b's disconnect", |c| c.node_events > events)
        .await;
    cloud
        .get_until("/api/v1/nodes/node-b", Duration::from_secs(30), |node| {
            ready(node) == "Unknown"
        })
        .await;

    // Deletion reaches the edge, which deletes its copy.
    cloud
        .client
        .delete("/api/v1/namespaces/default/pods/web")
        .await
        .expect("delete");
    let got = next(&mut a.edged, "the deletion").await;
    assert_eq!(seen(&got), "delete default/pod/web");
    assert!(
        a.store
            .get("default/pod/web")
            .expect("read")
            .is_some_and(|r| r.is_deleted())
    );
    let gone = cloud
        .client
        .get("/api/v1/namespaces/default/pods/web")
        .await;
    assert!(
        matches!(gone, Err(ClientError::Server { code: 404, .. })),
        "{gone:?}"
    );

    a.shutdown().await;
    cloud.shutdown().await;
}

fn ready(node: &Value) -> String {
    node["status"]["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == "Ready"))
        .and_then(|c| c["status"].as_str())
        .unwrap_or("")
        .to_owned()
}

#[actix::test]
async fn a_configmap_reaches_the_nodes_that_use_it_and_only_them() {
    let cloud = Cloud::start().await;
    let mut a = Edge::start(&cloud, "node-a").await;
    let mut b = Edge::start(&cloud, "node-b").await;
    let mut c = Edge::start(&cloud, "node-c").await;

    // Pods first: the configmap does not exist yet, so only pods go down.
    cloud.apply(&pod_yaml("app-a", "node-a", &["conf"])).await;
    cloud.apply(&pod_yaml("app-b", "node-b", &["conf"])).await;
    assert_eq!(
        seen(&next(&mut a.edged, "app-a").await),
        "insert default/pod/app-a"
    );
    assert_eq!(
        seen(&next(&mut b.edged, "app-b").await),
        "insert default/pod/app-b"
    );

    // Created: to both users.
    cloud.apply(&configmap_yaml("conf", "v1")).await;
    for edge in [&mut a, &mut b] {
        let got = next(&mut edge.edged, "the configmap").await;
        assert_eq!(seen(&got), "insert default/configmap/conf");
        assert_eq!(
            got.body::<serde_json::Value>().expect("json body")["data"]["key"],
            "v1"
        );
    }
    // Updated: to both again.
    cloud.apply(&configmap_yaml("conf", "v2")).await;
    for edge in [&mut a, &mut b] {
        let got = next(&mut edge.edged, "the update").await;
        assert_eq!(seen(&got), "update default/configmap/conf");
        assert_eq!(
            got.body::<serde_json::Value>().expect("json body")["data"]["key"],
            "v2"
        );
    }
    nothing_else_for(&cloud, &mut c, "c-marker").await;
    assert!(
        c.store
            .get("default/configmap/conf")
            .expect("read")
            .is_none()
    );

    // A pod that references an existing configmap brings it along, first.
    cloud.apply(&pod_yaml("app-c", "node-c", &["conf"])).await;
    assert_eq!(
        drain(&mut c.edged, 2, "app-c and its configmap").await,
        ["insert default/configmap/conf", "insert default/pod/app-c"]
    );

    // node-b's last user goes: the pod and the configmap are withdrawn.
    cloud
        .client
        .delete("/api/v1/namespaces/default/pods/app-b")
        .await
        .expect("delete");
    assert_eq!(
        drain(&mut b.edged, 2, "the withdrawal").await,
        ["delete default/configmap/conf", "delete default/pod/app-b"]
    );
    assert!(
        b.store
            .get("default/configmap/conf")
            .expect("read")
            .is_some_and(|r| r.is_deleted())
    );

    // Deleting the configmap reaches the nodes that still hold it.
    cloud
        .client
        .delete("/api/v1/namespaces/default/configmaps/conf")
        .await
        .expect("delete");
    for edge in [&mut a, &mut c] {
        assert_eq!(
            seen(&next(&mut edge.edged, "the deletion").await),
            "delete default/configmap/conf"
        );
    }
    // Re-created later: the users get it again (newer than the deletion).
    cloud.apply(&configmap_yaml("conf", "v3")).await;
    for edge in [&mut a, &mut c] {
        let got = next(&mut edge.edged, "the re-creation").await;
        assert_eq!(seen(&got), "insert default/configmap/conf");
        assert_eq!(
            got.body::<serde_json::Value>().expect("json body")["data"]["key"],
            "v3"
        );
    }
    nothing_else_for(&cloud, &mut b, "b-marker").await;

    for edge in [a, b, c] {
        edge.shutdown().await;
    }
    cloud.shutdown().await;
}

#[actix::test]
async fn malformed_manifests_are_refused_and_change_nothing() {
    let cloud = Cloud::start().await;
    let mut a = Edge::start(&cloud, "node-a").await;
    let good = pod_yaml("ok", "node-a", &[]);
    let cases: Vec<(String, u16, &str)> = vec![
        ("kind: Pod\nmetadata: [".to_owned(), 400, "document 1"),
        (format!("{good}---\napiVersion: v1\nkind: Pod\nmetadata: {{name: bad}}\nspec: {{containers: []}}\n"), 422, "spec.containers"),
        (format!("{good}---\napiVersion: apps/v1\nkind: Deployment\nmetadata: {{name: d}}\n"), 422, "Deployment"),
        (format!("{good}---\napiVersion: v1\nkind: ConfigMap\nmetadata: {{name: Bad_Name}}\n"), 422, "metadata.name"),
        ("{\"apiVersion\": \"v1\", \"kind\": \"Pod\", \"metadata\": {\"name\": \"x\"}, \"spec\": {\"containers\": \"no\"}}".to_owned(), 422, "Pod x"),
        (String::new(), 400, "no object"),
    ];
    for (manifest, code, reason) in cases {
        match cloud.client.apply(manifest.into_bytes()).await {
            Err(ClientError::Server {
                code: got, message, ..
            }) => {
                assert_eq!(got, code, "{message}");
                assert!(
                    message.contains(reason),
                    "{message:?} should say {reason:?}"
                );
            }
            other => panic!("expected a {code}, got {other:?}"),
        }
    }
    // An oversized manifest is refused as such.
    let huge = vec![b'#'; cloud::admin::MAX_MANIFEST_BYTES + 1];
    let (code, _) = cloud
        .client
        .raw(hyper::Method::POST, cloud::admin::APPLY_PATH, Some(huge))
        .await
        .expect("answer");
    assert_eq!(code, 413);

    // Nothing was stored and nothing went down.
    let pods = cloud.client.get("/api/v1/pods").await.expect("list");
    assert_eq!(pods["items"], json!([]));
    assert_eq!(cloud.controller.counts.borrow().sent, 0);

    // A pod cannot move to another node.
    cloud.apply(&good).await;
    assert_eq!(
        seen(&next(&mut a.edged, "the good pod").await),
        "insert default/pod/ok"
    );
    match cloud
        .client
        .apply(pod_yaml("ok", "node-b", &[]).into_bytes())
        .await
    {
        Err(ClientError::Server {
            code: 422, message, ..
        }) => assert!(message.contains("immutable"), "{message}"),
        other => panic!("expected a 422, got {other:?}"),
    }
    a.shutdown().await;
    cloud.shutdown().await;
}

#[actix::test]
async fn an_edge_asks_the_cloud_for_what_it_does_not_hold() {
    let cloud = Cloud::start().await;
    let a = Edge::start(&cloud, "node-a").await;
    cloud
        .apply("apiVersion: v1\nkind: Service\nmetadata: {name: shop}\nspec: {ports: [{port: 80}]}\n---\napiVersion: v1\nkind: Secret\nmetadata: {name: private}\n")
        .await;
    let query = |resource: &'static str| {
        Message::new().build_router(module::EDGED, group::META, resource, operation::QUERY)
    };
    let answer = a
        .hive
        .send_sync(
            module::METAMANAGER,
            query("default/service/shop"),
            Duration::from_secs(20),
        )
        .await
        .expect("answer");
    assert_eq!(answer.operation(), operation::RESPONSE, "{answer:?}");
    assert_eq!(
        answer.body::<serde_json::Value>().expect("json body")["metadata"]["name"],
        "shop"
    );
    // A secret no pod of this node uses is not this node's to read.
    let answer = a
        .hive
        .send_sync(
            module::METAMANAGER,
            query("default/secret/private"),
            Duration::from_secs(20),
        )
        .await
        .expect("answer");
    assert_eq!(answer.operation(), operation::ERROR, "{answer:?}");
    assert!(
        answer
            .content()
            .as_text()
            .unwrap_or("")
            .contains("not found"),
        "{answer:?}"
    );
    a.shutdown().await;
    cloud.shutdown().await;
}

#[actix::test]
async fn the_desired_state_survives_a_cloud_restart() {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("desired.redb");
    {
        let hive = beehive::Hive::new("cloud", beehive::HiveConfig::default());
        let store = cloud::EmbeddedStore::open(&path).expect("open");
        let controller =
            cloud::EdgeController::start(&hive, store.clone().shared(), Default::default())
                .expect("start");
        let object = serde_yaml_ng::from_str(&configmap_yaml("kept", "1")).expect("yaml");
        controller.apply(vec![object]).await.expect("applied");
        let _ = hive.shutdown().await;
        drop(controller);
        store.close().await;
    }
    let hive = beehive::Hive::new("cloud", beehive::HiveConfig::default());
    let store = cloud::EmbeddedStore::open(&path).expect("reopen");
    let controller =
        cloud::EdgeController::start(&hive, store.shared(), Default::default()).expect("start");
    let (items, _) = controller
        .store()
        .list(meta::Kind::ConfigMap, Some("default"))
        .expect("list");
    assert_eq!(items.len(), 1);
    assert_eq!(items[0]["data"]["key"], "1");
    let _ = hive.shutdown().await;
}

#[actix::test]
async fn a_connecting_node_is_brought_in_step_with_the_desired_state() {
    let cloud = Cloud::start().await;
    // What a node holds after the cloud lost track (say, a crash between
    // the desired-state commit and the queue commit): a pod the cloud no
    // longer has, and an old version of one it does.
    let dir = tempfile::tempdir().expect("dir");
    {
        let store = meta::EdgeStore::open(&dir.path().join("edge.redb")).expect("store");
        store
            .put(
                "default/pod/ghost",
                "1",
                apis::kinds::object_content(
                    &json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "ghost"}}),
                ),
            )
            .await
            .expect("put");
        store.close().await;
    }
    cloud.apply(&pod_yaml("kept", "node-a", &[])).await;
    let mut a = Edge::start_in(&cloud, "node-a", dir).await;
    let mut saw = Vec::new();
    while !saw.iter().any(|s| s == "delete default/pod/ghost") {
        saw.push(seen(&next(&mut a.edged, "the ghost's withdrawal").await));
    }
    assert!(
        saw.contains(&"insert default/pod/kept".to_owned()),
        "{saw:?}"
    );
    assert!(
        a.store
            .get("default/pod/ghost")
            .expect("read")
            .is_some_and(|r| r.is_deleted())
    );
    assert!(
        a.store
            .get("default/pod/kept")
            .expect("read")
            .is_some_and(|r| !r.is_deleted())
    );
    a.shutdown().await;
    cloud.shutdown().await;
}

#[actix::test]
async fn tombstones_go_once_the_clouds_watermark_covers_them() {
    let cloud = Cloud::start().await;
    let mut a = Edge::start(&cloud, "node-a").await;
    let names: Vec<String> = (0..20).map(|n| format!("churn-{n}")).collect();
    for name in &names {
        cloud.apply(&pod_yaml(name, "node-a", &[])).await;
    }
    for name in &names {
        cloud
            .client
            .delete(&format!("/api/v1/namespaces/default/pods/{name}"))
            .await
            .expect("delete");
    }
    let mut saw = 0;
    while saw < names.len() {
        if seen(&next(&mut a.edged, "the deletions").await).starts_with("delete ") {
            saw += 1;
        }
    }
    // Every message on the wire acknowledged (a deletion whose ack the
    // cut below lost would come again, as it should, and be held anew).
    let stats = cloud.hub.stats.clone();
    let load = |c: &std::sync::atomic::AtomicU64| c.load(std::sync::atomic::Ordering::Relaxed);
    assert!(
        stats
            .changes
            .wait_for(Duration::from_secs(30), || load(&stats.acked)
                + load(&stats.duplicate_acks)
                >= load(&stats.downstream_sent))
            .await,
        "acknowledgements"
    );
    assert_eq!(a.store.tombstones().held(), names.len() as u64);
    let tombstone = a
        .store
        .get("default/pod/churn-0")
        .expect("read")
        .expect("held");
    assert!(tombstone.is_deleted());
    // A later link: the cloud asks for the inventory with the revision it
    // has handled, which covers the deletions; the edge prunes them.
    let mut pruned = a.store.tombstones().watch_pruned();
    a.hub.cut_link();
    tokio::time::timeout(
        Duration::from_secs(30),
        pruned.wait_for(|n| *n >= names.len() as u64),
    )
    .await
    .expect("tombstones never pruned")
    .expect("store gone");
    assert_eq!(a.store.tombstones().held(), 0);
    assert!(a.store.get("default/pod/churn-0").expect("read").is_none());
    // A pod of a pruned name created again still reaches the node.
    cloud.apply(&pod_yaml("churn-0", "node-a", &[])).await;
    loop {
        if seen(&next(&mut a.edged, "the pod again").await) == "insert default/pod/churn-0" {
            break;
        }
    }
    assert!(
        a.store
            .get("default/pod/churn-0")
            .expect("read")
            .is_some_and(|r| !r.is_deleted()
                && r.version.parse::<u64>().unwrap_or(0)
                    > tombstone.version.parse::<u64>().unwrap_or(u64::MAX))
    );
    a.shutdown().await;
    cloud.shutdown().await;
}
