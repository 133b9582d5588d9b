//! KubeEdge's edges against an edgehive cloud: cloudhub's KubeEdge
//! endpoint (WebSocket, mutual TLS, JSON frames) and the edgecontroller.
//!
//! The first tests script a KubeEdge edgecore frame by frame: every frame
//! it sends is JSON in KubeEdge's exact message shape, written here from
//! KubeEdge's message model; every frame the cloud sends is read as JSON
//! and checked field by field. The last runs edgehive's own edge in
//! KubeEdge's dialect.

mod common;

use std::time::Duration;

use common::kubeedge::{
    KubeEdgeEdge, ack, answered, application, application_content, keepalive, request, watch_sync,
};
use common::{Cloud, Edge, configmap_yaml, next, pod_yaml};
use hub::Dialect;
use serde_json::{Value, json};

impl KubeEdgeEdge {
    /// Sends a request and returns the edgecontroller's answer to it.
    async fn ask_controller(&mut self, frame: Value, what: &str) -> Value {
        let answer = self.ask(frame, what).await;
        assert_eq!(answer["route"]["operation"], "response", "{what}: {answer}");
        assert_eq!(answer["route"]["source"], "edgecontroller", "{what}");
        answer
    }
}

/// Waits until cloudhub's counters satisfy `condition`.
async fn hub_counts(cloud: &Cloud, what: &str, condition: impl Fn(&hub::HubStats) -> bool) {
    let stats = cloud.hub.stats.clone();
    let held = stats
        .changes
        .wait_for(Duration::from_secs(30), || condition(&stats))
        .await;
    assert!(held, "timed out waiting for {what}");
}

fn count(counter: &std::sync::atomic::AtomicU64) -> u64 {
    hub::HubStats::get(counter)
}

async fn acked(cloud: &Cloud, n: u64) {
    hub_counts(cloud, &format!("{n} acks"), |s| count(&s.acked) >= n).await;
}

fn ready(node: &Value) -> Value {
    node["status"]["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == "Ready"))
        .map(|c| c["status"].clone())
        .unwrap_or(Value::Null)
}

#[actix::test]
async fn a_kubeedge_edge_registers_gets_its_pod_acks_it_and_reports_status() {
    let cloud = Cloud::start().await;
    // KubeEdge's edges ask for certificates named system:node:<node>.
    let mut edge = KubeEdgeEdge::dial(&cloud, Some("kube-1"), "system:node:kube-1").await;
    edge.send(keepalive()).await;

    // Registration: the cloud says nothing first, so the first frame it
    // sends is the answer, with the Node as stored.
    let answer = edge
        .ask_controller(
            request(
                "insert",
                "default/node/kube-1",
                json!({"apiVersion": "v1", "kind": "Node",
                       "metadata": {"name": "kube-1", "labels": {"site": "plant-7"}}}),
            ),
            "the registration's answer",
        )
        .await;
    // KubeEdge's cloud answers in group resource.
    assert_eq!(answer["route"]["group"], "resource");
    assert_eq!(answer["route"]["resource"], "default/node/kube-1");
    assert_eq!(answer["content"]["Err"], Value::Null);
    assert_eq!(answer["content"]["Object"]["metadata"]["name"], "kube-1");
    assert_eq!(
        answer["content"]["Object"]["metadata"]["labels"]["site"],
        "plant-7"
    );
    assert!(answer["header"].get("resourceversion").is_none());

    // Node status as a kubelet sends it: a strategic merge patch, as text.
    let patch = json!({"status": {
        "$setElementOrder/conditions": [{"type": "Ready"}],
        "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}],
        "nodeInfo": {"kubeletVersion": "v1.31.12-kubeedge-v1.23.0", "architecture": "amd64",
                     "bootID": "", "containerRuntimeVersion": "containerd://1.7", "kernelVersion": "",
                     "kubeProxyVersion": "", "machineID": "", "operatingSystem": "linux",
                     "osImage": "Debian", "systemUUID": ""},
        "addresses": [{"type": "InternalIP", "address": "192.0.2.21"}]}});
    let answer = edge
        .ask_controller(
            request(
                "patch",
                "default/nodepatch/kube-1",
                json!(patch.to_string()),
            ),
            "the node patch's answer",
        )
        .await;
    assert_eq!(answer["content"]["Err"], Value::Null, "{answer}");
    let node = &answer["content"]["Object"];
    assert_eq!(
        node["status"]["nodeInfo"]["kubeletVersion"],
        "v1.31.12-kubeedge-v1.23.0"
    );
    assert_eq!(ready(node), "True");
    let stored = cloud
        .client
        .get("/api/v1/nodes/kube-1")
        .await
        .expect("node");
    assert_eq!(stored["status"]["addresses"][0]["address"], "192.0.2.21");
    assert_eq!(stored["metadata"]["labels"]["site"], "plant-7");

    // The node lease: NotFound until the kubelet writes it.
    let lease = request("query", "kube-node-lease/lease/kube-1", Value::Null);
    let answer = edge.ask_controller(lease, "the lease query's answer").await;
    assert_eq!(answer["content"]["Err"]["ErrStatus"]["code"], 404);
    let lease = json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                       "metadata": {"name": "kube-1", "namespace": "kube-node-lease"},
                       "spec": {"holderIdentity": "kube-1", "leaseDurationSeconds": 40}});
    let answer = edge
        .ask_controller(
            request("insert", "kube-node-lease/lease/kube-1", lease),
            "the lease's answer",
        )
        .await;
    assert_eq!(
        answer["content"]["Object"]["spec"]["holderIdentity"],
        "kube-1"
    );

    // A pod and its configmap come down, each in KubeEdge's shape with a
    // version, each kept until acknowledged.
    cloud.apply(&configmap_yaml("conf", "v1")).await;
    cloud.apply(&pod_yaml("web", "kube-1", &["conf"])).await;
    let mut objects = Vec::new();
    for what in ["an object", "another object"] {
        let object = edge.recv(what).await;
        assert_eq!(object["route"]["source"], "edgecontroller");
        assert_eq!(object["route"]["group"], "resource");
        assert_eq!(object["route"]["operation"], "insert");
        assert!(object["header"]["resourceversion"].is_string(), "{object}");
        assert!(object["header"].get("parent_msg_id").is_none());
        objects.push(object);
    }
    let mut resources: Vec<&str> = objects
        .iter()
        .filter_map(|o| o["route"]["resource"].as_str())
        .collect();
    resources.sort();
    assert_eq!(resources, ["default/configmap/conf", "default/pod/web"]);
    let pod = objects
        .iter()
        .find(|o| o["route"]["resource"] == "default/pod/web")
        .expect("pod")
        .clone();
    assert_eq!(pod["content"]["spec"]["nodeName"], "kube-1");
    for object in &objects {
        edge.send(ack(object)).await;
    }
    acked(&cloud, 2).await;
    assert_eq!(count(&cloud.hub.stats.pending), 0);

    // Pod status as a kubelet sends it: a patch naming the pod's uid.
    let uid = pod["content"]["metadata"]["uid"].clone();
    let patch = json!({"metadata": {"uid": uid}, "status": {
        "$setElementOrder/conditions": [{"type": "Ready"}],
        "conditions": [{"type": "Ready", "status": "True"}],
        "phase": "Running", "podIP": "10.88.0.9",
        "containerStatuses": [{"name": "main", "ready": true, "restartCount": 0, "image": "busybox",
                               "imageID": "", "state": {"running": {}}}]}});
    let answer = edge
        .ask_controller(
            request("patch", "default/podpatch/web", json!(patch.to_string())),
            "the pod patch's answer",
        )
        .await;
    assert_eq!(answer["content"]["Err"], Value::Null, "{answer}");
    assert_eq!(answer["content"]["Object"]["status"]["phase"], "Running");
    let stored = cloud
        .client
        .get("/api/v1/namespaces/default/pods/web")
        .await
        .expect("pod");
    assert_eq!(stored["status"]["podIP"], "10.88.0.9");

    // KubeEdge's older wrapped pod status is taken too, and answered "OK".
    let legacy =
        json!({"UID": uid, "Name": "web", "Status": {"phase": "Running", "podIP": "10.88.0.10"}});
    let answer = edge
        .ask_controller(
            request("update", "default/podstatus/web", legacy),
            "the legacy status's answer",
        )
        .await;
    assert_eq!(answer["content"], "OK");

    // A query for the configmap its pod uses is answered with the object.
    let answer = edge
        .ask_controller(
            request("query", "default/configmap/conf", Value::Null),
            "the configmap",
        )
        .await;
    assert_eq!(answer["content"]["data"]["key"], "v1");

    // Nothing here may touch another node's objects.
    let answer = edge
        .ask_controller(
            request(
                "patch",
                "default/nodepatch/node-x",
                json!("{\"status\":{}}"),
            ),
            "a foreign node patch's answer",
        )
        .await;
    assert!(answer["content"]["Err"]["ErrStatus"]["message"].is_string());
    cloud.apply(&pod_yaml("other", "node-x", &[])).await;
    let patch = json!({"status": {"phase": "Failed"}}).to_string();
    let answer = edge
        .ask_controller(
            request("patch", "default/podpatch/other", json!(patch)),
            "a foreign pod patch's answer",
        )
        .await;
    assert!(
        answer["content"]["Err"]["ErrStatus"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("not bound")),
        "{answer}"
    );
    edge.link.sender.close().await;
    cloud.shutdown().await;
}

#[actix::test]
async fn a_kubeedge_link_is_refused_unless_node_id_matches_the_certificate() {
    let cloud = Cloud::start().await;
    let stats = cloud.hub.stats.clone();
    for (node_id, certified) in [
        (Some("kube-2"), "system:node:kube-3"),
        (None, "system:node:kube-2"),
        (Some("../kube-2"), "../kube-2"),
    ] {
        let refused = count(&stats.refused_links);
        let mut edge = KubeEdgeEdge::dial(&cloud, node_id, certified).await;
        // Closed by the cloud without a word.
        let closed = tokio::time::timeout(Duration::from_secs(30), edge.link.receiver.recv())
            .await
            .expect("the cloud never closed the link");
        assert!(!matches!(closed, Some(Ok(_))), "{node_id:?}: {closed:?}");
        hub_counts(&cloud, "the refusal", |s| count(&s.refused_links) > refused).await;
    }
    assert_eq!(count(&stats.sessions_opened), 0);
    cloud.shutdown().await;
}

/// edgehive's own edge, speaking KubeEdge's dialect: its node registers,
/// its pod arrives and is acknowledged after metamanager stored it, and
/// its statuses reach the cloud as patches.
#[actix::test]
async fn an_edgehive_edge_speaking_kubeedge_joins_and_reports() {
    let cloud = Cloud::start().await;
    let dir = tempfile::tempdir().expect("dir");
    let mut edge = Edge::start_speaking(&cloud, "kube-4", dir, Dialect::KubeEdge).await;
    cloud.apply(&pod_yaml("web", "kube-4", &[])).await;
    let got = next(&mut edge.edged, "the pod at kube-4").await;
    assert_eq!(got.resource(), "default/pod/web");
    acked(&cloud, 1).await;

    edge.report(
        "default/podstatus/web",
        json!({"phase": "Running", "podIP": "10.88.0.4"}),
    )
    .await;
    edge.report(
        "default/nodestatus/kube-4",
        json!({"nodeInfo": {"kubeletVersion": "edgehive", "architecture": "amd64", "bootID": "",
               "containerRuntimeVersion": "containerd", "kernelVersion": "", "kubeProxyVersion": "",
               "machineID": "", "operatingSystem": "linux", "osImage": "Debian", "systemUUID": ""}}),
    )
    .await;
    // Both went up as KubeEdge's patches, not edgehive's status updates.
    cloud.counts("both patches", |c| c.patches >= 2).await;
    let pod = cloud
        .client
        .get("/api/v1/namespaces/default/pods/web")
        .await
        .expect("pod");
    assert_eq!(pod["status"]["podIP"], "10.88.0.4");
    // A whole status replaces the last one: what it leaves out is gone.
    edge.report("default/podstatus/web", json!({"phase": "Succeeded"}))
        .await;
    cloud.counts("the third patch", |c| c.patches >= 3).await;
    let pod = cloud
        .client
        .get("/api/v1/namespaces/default/pods/web")
        .await
        .expect("pod");
    assert_eq!(pod["status"], json!({"phase": "Succeeded"}));
    let node = cloud
        .client
        .get("/api/v1/nodes/kube-4")
        .await
        .expect("node");
    // The registration's labels: only a KubeEdge-speaking edge sends them.
    assert_eq!(
        node["metadata"]["labels"]["kubernetes.io/hostname"],
        "kube-4"
    );
    assert_eq!(node["status"]["nodeInfo"]["kubeletVersion"], "edgehive");
    assert_eq!(ready(&node), "True");
    assert_eq!(count(&cloud.hub.stats.foreign_messages), 0);
    edge.shutdown().await;
    cloud.shutdown().await;
}

/// A KubeEdge edge queues at most 100 incoming messages and drops the
/// oldest beyond that, so no more than 64 objects are in flight to it;
/// each ack lets the next one go.
#[actix::test]
async fn a_kubeedge_node_gets_no_more_in_flight_than_its_queue_holds() {
    let cloud = Cloud::start_resending_after(Duration::from_millis(500)).await;
    let mut edge = KubeEdgeEdge::dial(&cloud, Some("kube-6"), "system:node:kube-6").await;
    let stats = cloud.hub.stats.clone();
    hub_counts(&cloud, "the session", |s| count(&s.connected) == 1).await;
    let sent_before = count(&stats.downstream_sent);
    for i in 0..100 {
        let object = beehive::Message::new()
            .build_router(
                "edgecontroller",
                "resource",
                format!("node/kube-6/default/configmap/cm-{i}"),
                "insert",
            )
            .with_resource_version("1")
            .with_content(json!({"kind": "ConfigMap", "metadata": {"name": format!("cm-{i}")}}));
        cloud.hive.send("cloudhub", object).await.expect("queued");
    }
    hub_counts(&cloud, "100 objects held", |s| count(&s.pending) == 100).await;
    let sent = count(&stats.downstream_sent) - sent_before;
    assert_eq!(sent - count(&stats.resent), 64);
    let first = edge.recv("the first object").await;
    edge.send(ack(&first)).await;
    hub_counts(&cloud, "an ack letting the next object go", |s| {
        count(&s.downstream_sent) - sent_before - count(&s.resent) >= 65
    })
    .await;
    // What the edge leaves unacknowledged (it may have dropped it) comes
    // again after the resend time (here 500 ms), the same version; what it
    // acknowledged does not.
    let mut sends = Vec::new();
    while sends.len() < 2 {
        let frame = edge.recv("cm-1, sent and sent again").await;
        assert_ne!(
            frame["header"]["msg_id"], first["header"]["msg_id"],
            "an acknowledged object came again"
        );
        if frame["route"]["resource"] == "default/configmap/cm-1" {
            sends.push(frame);
        }
    }
    assert_eq!(sends[0]["header"]["msg_id"], sends[1]["header"]["msg_id"]);
    assert!(count(&stats.resent) >= 1);
    edge.link.sender.close().await;
    cloud.shutdown().await;
}

/// A KubeEdge edge's MetaServer forwards its clients' requests to the
/// cloud and waits up to 10 s for each. A cloud on its own store has no
/// API server to ask: each is refused at once with a Kubernetes Status,
/// and the edge answers from its own store.
#[actix::test]
async fn a_kubeedge_metaserver_is_answered_at_once_without_an_api_server() {
    let cloud = Cloud::start().await;
    let mut edge = KubeEdgeEdge::dial(&cloud, Some("kube-4"), "system:node:kube-4").await;

    let list = application(
        "list",
        "/core/v1/services/default/null",
        json!({}),
        "kube-4",
    );
    let asked = list["content"]["ID"].clone();
    let answer = edge.ask(list, "the list's answer").await;
    assert_eq!(answer["route"]["resource"], "ignore/Application/ignore");
    let (app, body) = answered(&answer);
    assert_eq!(app["ID"], asked, "the edge's own application, answered");
    assert_eq!(app["Status"], "Rejected");
    assert_eq!(app["Error"]["ErrStatus"]["code"], 405);
    assert_eq!(app["Error"]["ErrStatus"]["reason"], "MethodNotAllowed");
    assert_eq!(body, Value::Null);

    // In another node's name: refused as such.
    let foreign = application("get", "/core/v1/secrets/default/s", json!({}), "kube-5");
    let (app, _) = answered(&edge.ask(foreign, "the foreign application's answer").await);
    assert_eq!(app["Error"]["ErrStatus"]["code"], 403);

    // Unreadable: refused, the link stays up.
    let mut garbled = application("get", "/core/v1/pods/default/p", json!({}), "kube-4");
    garbled["content"]["Option"] = json!("%%% not base64");
    let (app, _) = answered(&edge.ask(garbled, "the garbled application's answer").await);
    assert_eq!(app["Error"]["ErrStatus"]["code"], 400);

    // The edge's list of its watches: each one failed.
    let watch = application_content("watch", "/core/v1/services/null/null", json!({}), "kube-4");
    let sync = watch_sync(json!({ "w1": watch }));
    let answer = edge.ask(sync, "the watch list's answer").await;
    assert_eq!(answer["content"]["w1"]["Status"], "Rejected", "{answer}");

    let counts = cloud.center.counts.borrow().clone();
    assert_eq!(
        (counts.approved, counts.rejected, counts.watches),
        (0, 3, 0)
    );
    cloud.shutdown().await;
}
