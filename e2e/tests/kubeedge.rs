//! KubeEdge's edges against an edgehive cloud: cloudhub's KubeEdge
//! endpoint (WebSocket, mutual TLS, JSON frames) and the edgecontroller.
//!
//! The first tests script a KubeEdge edgecore frame by frame: every frame
//! it sends is JSON in KubeEdge's exact message shape, written here from
//! KubeEdge's message model; every frame the cloud sends is read as JSON
//! and checked field by field. The last runs edgehive's own edge in
//! KubeEdge's dialect.

use std::time::Duration;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use apis::kinds::{Kind, ObjectKey};
use cloud::desired::{StoreFuture, TokenRequest, WatchStream};
use cloud::{ControllerConfig, DesiredError, DesiredState, EmbeddedStore};
use e2e::kubeedge::{
    KubeEdgeEdge, ack, answered, application, application_content, keepalive, request,
    state_report, twin_report, twin_sync, watch_sync,
};
use e2e::{Backend, Cloud, Edge, configmap_yaml, next, pod_yaml};
use hub::Dialect;
use serde_json::{Value, json};

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
    for (node_id, certified, status) in [
        (Some("kube-2"), "system:node:kube-3", 403),
        (None, "system:node:kube-2", 400),
        (Some("../kube-2"), "../kube-2", 400),
    ] {
        let refused = count(&stats.refused_links);
        // Answered with an HTTP error and its reason, never upgraded.
        match KubeEdgeEdge::try_dial(&cloud, node_id, certified).await {
            Err(transports::TransportError::Refused {
                status: got,
                reason,
            }) => {
                assert_eq!(got, status, "{node_id:?}: {reason}");
            }
            Err(other) => panic!("{node_id:?}: {other}"),
            Ok(_) => panic!("{node_id:?}: upgraded"),
        }
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
    // The node's status, once the status writer wrote it (its patch is
    // counted when handed over).
    let node = cloud
        .get_until("/api/v1/nodes/kube-4", Duration::from_secs(30), |node| {
            node["status"]["nodeInfo"]["kubeletVersion"] == "edgehive"
        })
        .await;
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
            .with_content(
                beehive::Content::of(
                    &json!({"kind": "ConfigMap", "metadata": {"name": format!("cm-{i}")}}),
                )
                .expect("json body"),
            );
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

/// A model and three devices: two bound to kube-6, one to kube-7.
const DEVICES: &str = "apiVersion: devices.kubeedge.io/v1beta1
kind: DeviceModel
metadata: {name: thermometer, namespace: default}
spec:
  protocol: modbus
  properties:
  - {name: setpoint, type: int}
  - {name: temperature, type: float}
---
apiVersion: devices.kubeedge.io/v1beta1
kind: Device
metadata: {name: thermo-1, namespace: default, labels: {description: hall}}
spec:
  nodeName: kube-6
  deviceModelRef: {name: thermometer}
  protocol: {protocolName: modbus}
  properties:
  - name: setpoint
    desired: {value: '21'}
  - name: temperature
---
apiVersion: devices.kubeedge.io/v1beta1
kind: Device
metadata: {name: thermo-2, namespace: default}
spec:
  nodeName: kube-6
  deviceModelRef: {name: thermometer}
  protocol: {protocolName: modbus}
  properties:
  - name: setpoint
    desired: {value: '18'}
---
apiVersion: devices.kubeedge.io/v1beta1
kind: Device
metadata: {name: thermo-9, namespace: default}
spec:
  nodeName: kube-7
  deviceModelRef: {name: thermometer}
  properties:
  - name: setpoint
    desired: {value: '30'}
";

/// A KubeEdge edgecore's twin sync (on every connect; KubeEdge's own
/// cloud never answers it): the detail lists exactly the node's devices
/// with their desired values, then a confirm with the request as parent
/// stops the edge asking. A node cannot ask for another's.
#[actix::test]
async fn a_kubeedge_edges_twin_sync_gets_its_devices_then_a_confirm() {
    let cloud = Cloud::start().await;
    let applied = cloud.apply(DEVICES).await;
    assert_eq!(applied.len(), 4, "{applied:?}");
    // thermo-1's mapper reported before: its last value is the actual one.
    let store = cloud.controller.store().clone();
    let key = ObjectKey::new(Kind::Device, "default", "thermo-1");
    let mut thermo = store.get(&key).expect("read").expect("thermo-1");
    thermo.edit(|body| {
        body["status"] = json!({"state": "online", "lastOnlineTime": "2026-11-26T10:00:00Z",
            "twins": [{"propertyName": "temperature",
                       "reported": {"value": "19.5", "metadata": {"timestamp": "1700000000000"}}}]});
    });
    let thermo = store.replace_status(thermo).await.expect("status");
    let version: u64 = thermo["metadata"]["resourceVersion"]
        .as_str()
        .and_then(|v| v.parse().ok())
        .expect("a version");

    let mut edge = KubeEdgeEdge::dial(&cloud, Some("kube-6"), "system:node:kube-6").await;
    edge.send(keepalive()).await;
    // Asking for another node's devices is refused by cloudhub, unanswered.
    let mut foreign = twin_sync("kube-7", "foreign");
    foreign["route"]["resource"] = json!("node/kube-7/membership/detail");
    edge.send(foreign).await;
    let sync = twin_sync("kube-6", "ev-1");
    let request_id = sync["header"]["msg_id"].clone();
    edge.send(sync).await;

    let detail = edge.recv_twin("the membership detail").await;
    // No parent: the edge takes it as the result, not as a confirm.
    assert!(detail["header"].get("parent_msg_id").is_none(), "{detail}");
    assert!(
        detail["header"].get("resourceversion").is_none(),
        "{detail}"
    );
    assert_eq!(
        detail["route"],
        json!({"source": "devicecontroller", "group": "twin", "operation": "update",
               "resource": "membership/detail"})
    );
    let content = &detail["content"];
    assert_eq!(content["event_id"], "ev-1");
    let ids: Vec<&str> = content["devices"]
        .as_array()
        .expect("devices")
        .iter()
        .filter_map(|d| d["id"].as_str())
        .collect();
    assert_eq!(ids, ["default/thermo-1", "default/thermo-2"]);
    let (thermo_1, thermo_2) = (&content["devices"][0], &content["devices"][1]);
    assert_eq!(thermo_1["name"], "thermo-1");
    assert_eq!(thermo_1["description"], "hall");
    assert_eq!(thermo_1["state"], "online");
    assert_eq!(thermo_1["last_online"], "2026-11-26T10:00:00Z");
    assert_eq!(thermo_1["attributes"]["model"]["value"], "thermometer");
    assert_eq!(thermo_1["attributes"]["protocol"]["value"], "modbus");
    let versioned = json!({"cloud": version, "edge": 0});
    let setpoint = &thermo_1["twin"]["setpoint"];
    assert_eq!(setpoint["expected"]["value"], "21");
    assert_eq!(setpoint["metadata"], json!({"type": "int"}));
    assert_eq!(setpoint["optional"], false);
    assert_eq!(setpoint["expected_version"], versioned);
    assert!(setpoint.get("actual").is_none(), "{setpoint}");
    let temperature = &thermo_1["twin"]["temperature"];
    assert_eq!(
        temperature["actual"],
        json!({"value": "19.5", "metadata": {"timestamp": 1_700_000_000_000_i64}})
    );
    assert_eq!(temperature["actual_version"], versioned);
    assert_eq!(temperature["metadata"], json!({"type": "float"}));
    assert!(temperature.get("expected").is_none(), "{temperature}");
    assert_eq!(thermo_2["twin"]["setpoint"]["expected"]["value"], "18");
    assert!(thermo_2.get("description").is_none(), "{thermo_2}");

    let confirm = edge.recv_twin("the confirm").await;
    assert_eq!(confirm["header"]["parent_msg_id"], request_id, "{confirm}");
    assert_eq!(
        confirm["route"],
        json!({"source": "devicecontroller", "group": "twin", "operation": "response",
               "resource": "twin"})
    );
    assert_eq!(confirm["content"], "OK");
    // The foreign request was refused before the controller saw it.
    assert_eq!(count(&cloud.hub.stats.foreign_messages), 1);
    let counts = cloud.counts("the twin sync", |c| c.twin_syncs >= 1).await;
    assert_eq!(counts.twin_syncs, 1);
    edge.link.sender.close().await;
    cloud.shutdown().await;
}

/// A desired state whose devices cannot be listed until it is opened, as
/// a Kubernetes mirror before its first list.
struct DevicesNotListedYet {
    inner: Arc<dyn DesiredState>,
    open: Arc<AtomicBool>,
}

impl DesiredState for DevicesNotListedYet {
    fn get(&self, key: &ObjectKey) -> Result<Option<apis::Object>, DesiredError> {
        self.inner.get(key)
    }
    fn list_each(
        &self,
        kind: Kind,
        namespace: Option<&str>,
        visit: &mut dyn FnMut(apis::Object),
    ) -> Result<u64, DesiredError> {
        if kind == Kind::Device && !self.open.load(Ordering::Acquire) {
            return Err(DesiredError::Backend("devices not listed yet".to_owned()));
        }
        self.inner.list_each(kind, namespace, visit)
    }
    fn watch(&self, kind: Kind, since: u64) -> Result<WatchStream, DesiredError> {
        self.inner.watch(kind, since)
    }
    fn create(&self, object: apis::Object) -> StoreFuture<apis::Object> {
        self.inner.create(object)
    }
    fn replace(&self, object: apis::Object) -> StoreFuture<apis::Object> {
        self.inner.replace(object)
    }
    fn replace_status(&self, object: apis::Object) -> StoreFuture<apis::Object> {
        self.inner.replace_status(object)
    }
    fn delete(&self, key: &ObjectKey) -> StoreFuture<Option<apis::Object>> {
        self.inner.delete(key)
    }
    fn next_revision(&self) -> StoreFuture<u64> {
        self.inner.next_revision()
    }
    fn finish_deletion(&self, key: &ObjectKey, uid: Option<&str>) -> StoreFuture<()> {
        self.inner.finish_deletion(key, uid)
    }
    fn request_token(
        &self,
        request: TokenRequest,
    ) -> StoreFuture<apis::tokens::TokenRequestStatus> {
        self.inner.request_token(request)
    }
}

/// An empty list removes every device twin at a KubeEdge edge: a node
/// with no devices is told so only once the cloud has listed its devices,
/// never from a cache not loaded yet. Until then the request waits, and
/// is answered as soon as the list comes.
#[actix::test]
async fn a_twin_sync_is_answered_only_once_devices_are_listed() {
    let dir = tempfile::tempdir().expect("dir");
    let inner = EmbeddedStore::open(&dir.path().join("desired.redb"))
        .expect("store")
        .shared();
    let open = Arc::new(AtomicBool::new(false));
    let store = Arc::new(DevicesNotListedYet {
        inner,
        open: open.clone(),
    });
    let config = ControllerConfig {
        retry_every: Duration::from_millis(100),
        ..ControllerConfig::default()
    };
    let backend = Backend {
        store: Some(store),
        api: None,
    };
    let cloud = Cloud::start_backed_by_with(backend, config).await;
    let mut edge = KubeEdgeEdge::dial(&cloud, Some("kube-8"), "system:node:kube-8").await;
    let sync = twin_sync("kube-8", "ev-empty");
    let request_id = sync["header"]["msg_id"].clone();
    edge.send(sync).await;
    // The controller takes messages in order: once the lease query is
    // answered, the twin sync was taken, and left waiting.
    let lease = request("query", "kube-node-lease/lease/kube-8", Value::Null);
    let answer = edge.ask(lease, "the lease query's answer").await;
    assert_eq!(answer["content"]["Err"]["ErrStatus"]["code"], 404);
    let counts = *cloud.controller.counts.borrow();
    assert_eq!(counts.twin_syncs, 0);

    open.store(true, Ordering::Release);
    let detail = edge.recv_twin("the membership detail").await;
    assert_eq!(detail["route"]["resource"], "membership/detail");
    assert_eq!(detail["content"]["event_id"], "ev-empty");
    assert_eq!(detail["content"]["devices"], json!([]));
    let confirm = edge.recv_twin("the confirm").await;
    assert_eq!(confirm["header"]["parent_msg_id"], request_id, "{confirm}");
    assert_eq!(confirm["content"], "OK");
    edge.link.sender.close().await;
    cloud.shutdown().await;
}

/// A device bound to a KubeEdge node while it is linked: its devicetwin
/// hears of it (a membership update, as KubeEdge's cloud sends one) before
/// the model and the device come; deleted, it hears of that before the
/// device goes.
#[actix::test]
async fn a_kubeedge_edges_twin_hears_of_devices_bound_and_deleted_while_linked() {
    let cloud = Cloud::start().await;
    let mut edge = KubeEdgeEdge::dial(&cloud, Some("kube-6"), "system:node:kube-6").await;
    edge.send(keepalive()).await;
    // Once its twin sync is answered, the controller knows it linked.
    edge.send(twin_sync("kube-6", "ev-0")).await;
    let detail = edge.recv_twin("the membership detail").await;
    assert_eq!(detail["content"]["devices"], json!([]));
    edge.recv_twin("the confirm").await;

    let applied = cloud.apply(DEVICES).await;
    assert_eq!(applied.len(), 4, "{applied:?}");
    // In order: each device's membership update, then the model (once),
    // then the device.
    let mut seen = Vec::new();
    let mut updates = Vec::new();
    while seen.len() < 5 {
        let frame = edge.recv("membership updates and objects").await;
        let route = &frame["route"];
        if route["group"] == "twin" {
            assert_eq!(
                *route,
                json!({"source": "devicecontroller", "group": "twin", "operation": "update",
                       "resource": "membership"})
            );
            assert!(frame["header"].get("resourceversion").is_none(), "{frame}");
            assert!(frame["header"].get("parent_msg_id").is_none(), "{frame}");
            let content = frame["content"].clone();
            let id = content["added_devices"][0]["id"].as_str().expect("an id");
            seen.push(format!("+{id}"));
            updates.push(content);
        } else {
            // As KubeEdge's: its edge's metamanager passes devices and
            // models to its devicetwin only from the devicecontroller.
            assert_eq!(route["source"], "devicecontroller", "{frame}");
            seen.push(format!(
                "{} {}",
                route["operation"].as_str().unwrap_or_default(),
                route["resource"].as_str().unwrap_or_default()
            ));
            edge.send(ack(&frame)).await;
        }
    }
    assert_eq!(
        seen,
        [
            "+default/thermo-1",
            "insert default/devicemodel/thermometer",
            "insert default/device/thermo-1",
            "+default/thermo-2",
            "insert default/device/thermo-2",
        ]
    );
    for content in &updates {
        assert_eq!(
            content["event_id"].as_str().map(str::len),
            Some(36),
            "{content}"
        );
        assert!(
            content["timestamp"].as_i64().is_some_and(|t| t > 0),
            "{content}"
        );
    }
    assert_eq!(
        updates[0]["added_devices"],
        json!([{"id": "default/thermo-1", "name": "thermo-1", "description": "hall"}])
    );
    assert_eq!(updates[0]["removed_devices"], json!([]));
    assert_eq!(
        updates[1]["added_devices"],
        json!([{"id": "default/thermo-2", "name": "thermo-2"}])
    );
    acked(&cloud, 3).await;

    // thermo-9 is kube-7's: nothing of it comes here. Deleting thermo-1
    // tells the twin first.
    cloud
        .controller
        .delete(ObjectKey::new(Kind::Device, "default", "thermo-1"))
        .await
        .expect("deleted");
    let removal = edge.recv("the removal").await;
    assert_eq!(removal["route"]["resource"], "membership", "{removal}");
    assert_eq!(removal["content"]["added_devices"], json!([]));
    assert_eq!(
        removal["content"]["removed_devices"],
        json!([{"id": "default/thermo-1", "name": "thermo-1", "description": "hall"}])
    );
    let gone = edge.recv("the deletion").await;
    assert_eq!(
        (&gone["route"]["operation"], &gone["route"]["resource"]),
        (&json!("delete"), &json!("default/device/thermo-1")),
        "{gone}"
    );
    edge.send(ack(&gone)).await;
    let counts = cloud
        .counts("the membership updates", |c| c.memberships >= 3)
        .await;
    assert_eq!(counts.memberships, 3);
    edge.link.sender.close().await;
    cloud.shutdown().await;
}

/// The reports a KubeEdge edge's devicetwin sends of its devices (twins
/// changed at the edge, a device's state) land in the Devices' status and
/// are confirmed; a report of a device bound to another node is refused,
/// unconfirmed, and changes nothing.
#[actix::test]
async fn a_kubeedge_edges_device_reports_become_the_devices_status() {
    let cloud = Cloud::start().await;
    let applied = cloud.apply(DEVICES).await;
    assert_eq!(applied.len(), 4, "{applied:?}");
    let store = cloud.controller.store().clone();
    let read = |name: &str| {
        store
            .get(&ObjectKey::new(Kind::Device, "default", name))
            .expect("read")
            .expect("a device")
    };
    let mut edge = KubeEdgeEdge::dial(&cloud, Some("kube-6"), "system:node:kube-6").await;
    edge.send(keepalive()).await;

    let report = twin_report(
        "default",
        "thermo-1",
        json!({
            "temperature": {"actual": {"value": "19.5", "metadata": {"timestamp": 1_700_000_000_000_i64}},
                            "optional": false, "metadata": {"type": "float"},
                            "actual_version": {"cloud": 3, "edge": 1}},
            "setpoint": {"expected": {"value": "21", "metadata": {"timestamp": 1_700_000_000_001_i64}},
                         "optional": false, "metadata": {"type": "int"},
                         "expected_version": {"cloud": 3, "edge": 0}},
        }),
    );
    let report_id = report["header"]["msg_id"].clone();
    edge.send(report).await;
    let confirm = edge.recv_twin("the twin report's confirm").await;
    assert_eq!(confirm["header"]["parent_msg_id"], report_id, "{confirm}");
    assert_eq!(
        confirm["route"],
        json!({"source": "devicecontroller", "group": "twin", "operation": "response",
               "resource": "twin"})
    );
    assert_eq!(confirm["content"], "OK");
    let thermo = read("thermo-1");
    assert_eq!(
        thermo["status"]["twins"],
        // New twins in property name order.
        json!([
            {"propertyName": "setpoint",
             "observedDesired": {"value": "21", "metadata": {"timestamp": "1700000000001", "type": "int"}}},
            {"propertyName": "temperature",
             "reported": {"value": "19.5", "metadata": {"timestamp": "1700000000000", "type": "float"}}},
        ]),
        "{thermo}"
    );

    // thermo-9 is kube-7's: refused, unconfirmed, unchanged.
    let before = read("thermo-9");
    let foreign = twin_report(
        "default",
        "thermo-9",
        json!({
            "setpoint": {"actual": {"value": "99"}, "metadata": {"type": "int"}},
        }),
    );
    edge.send(foreign).await;
    let counts = cloud.counts("the refusal", |c| c.status_refused >= 1).await;
    assert_eq!(counts.device_reports, 1);
    assert_eq!(read("thermo-9"), before);
    assert!(before.json().get("status").is_none(), "{before}");

    // A state: the next confirm is the state's (none came for thermo-9's).
    let state = state_report("default", "thermo-1", "online", "2026-11-26T12:00:00Z");
    let state_id = state["header"]["msg_id"].clone();
    edge.send(state).await;
    let confirm = edge.recv_twin("the state report's confirm").await;
    assert_eq!(confirm["header"]["parent_msg_id"], state_id, "{confirm}");
    assert_eq!(confirm["content"], "OK");
    let thermo = read("thermo-1");
    assert_eq!(thermo["status"]["state"], "online", "{thermo}");
    assert_eq!(thermo["status"]["lastOnlineTime"], "2026-11-26T12:00:00Z");
    assert_eq!(thermo["status"]["twins"].as_array().map(Vec::len), Some(2));
    // Offline: no time, the last one stays.
    let state = state_report("default", "thermo-1", "offline", "");
    let state_id = state["header"]["msg_id"].clone();
    edge.send(state).await;
    let confirm = edge.recv_twin("the offline state's confirm").await;
    assert_eq!(confirm["header"]["parent_msg_id"], state_id, "{confirm}");
    let thermo = read("thermo-1");
    assert_eq!(thermo["status"]["state"], "offline");
    assert_eq!(thermo["status"]["lastOnlineTime"], "2026-11-26T12:00:00Z");
    let counts = cloud.counts("the reports", |c| c.device_reports >= 3).await;
    assert_eq!((counts.device_reports, counts.status_refused), (3, 1));
    edge.link.sender.close().await;
    cloud.shutdown().await;
}
