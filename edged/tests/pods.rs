//! edged against the real containerd that `scripts/setup-containerd` runs:
//! pods arrive through a real metamanager on redb, run on containerd over
//! CRI, and their status is read back from what edged reported (the edge
//! store) and from containerd itself. Each test's node is a
//! [`TestNode`]: whatever the test leaves of its pods, also when it fails,
//! is removed when it ends.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use beehive::constants::{group, module, operation};
use beehive::{Hive, HiveConfig, Message};
use edged::cri::api;
use edged::testing::{TestNode, cri_socket};
use edged::tokens::TokenPolicy;
use edged::{Cri, Edged, EdgedConfig};
use meta::{EdgeStore, MetaManager, StoreChange};
use serde_json::{Value, json};
use tokio::sync::broadcast;

const WAIT: Duration = Duration::from_secs(60);

/// Test `what`'s node; declared before its edge, it is dropped (and the
/// node's pods removed) after the edge.
fn test_node(what: &str) -> TestNode {
    TestNode::new(cri_socket(), what)
}

/// An edge: metamanager on a store in `dir`, and edged.
struct Edge {
    hive: Hive,
    store: EdgeStore,
    changes: broadcast::Receiver<StoreChange>,
    root: PathBuf,
    /// edged's HTTP server.
    server: std::net::SocketAddr,
}

impl Edge {
    /// An edge for node `node` (an edged touches only its node's pods).
    async fn start(dir: &Path, node: &str) -> Edge {
        Edge::start_asking(dir, node, TokenPolicy::default()).await
    }

    /// An edge whose edged asks for service account tokens as `tokens`
    /// says.
    async fn start_asking(dir: &Path, node: &str, tokens: TokenPolicy) -> Edge {
        let hive = Hive::new("edge", HiveConfig::default());
        let store = EdgeStore::open(&dir.join("edge.redb")).expect("store");
        let changes = store.subscribe();
        MetaManager::start(&hive, store.clone()).expect("metamanager");
        let root = dir.join("edged");
        let config = EdgedConfig {
            relist_period: Duration::from_millis(200),
            backoff_initial: Duration::from_millis(300),
            backoff_max: Duration::from_secs(2),
            node_ip: "127.0.0.1".to_owned(),
            server_address: Some("127.0.0.1:0".to_owned()),
            tokens,
            ..EdgedConfig::new(node, cri_socket(), &root)
        };
        let handle = Edged::start(&hive, config)
            .await
            .unwrap_or_else(|err| panic!("{err}; run ./scripts/setup-containerd first"));
        Edge {
            hive,
            store,
            changes,
            root,
            server: handle.server_address.expect("a server"),
        }
    }

    /// Delivers a pod as the cloud would: through metamanager.
    async fn send(&self, op: &'static str, pod: &Value, version: u64) {
        let namespace = pod["metadata"]["namespace"].as_str().unwrap_or("default");
        let name = pod["metadata"]["name"].as_str().unwrap_or_default();
        let msg = Message::new()
            .build_router(
                module::EDGEHUB,
                group::RESOURCE,
                format!("{namespace}/pod/{name}"),
                op,
            )
            .with_resource_version(version.to_string())
            .with_content(beehive::Content::of(pod).expect("json"));
        let reply = self
            .hive
            .send_sync(module::METAMANAGER, msg, WAIT)
            .await
            .expect("stored");
        assert_eq!(reply.operation(), operation::RESPONSE, "{reply:?}");
    }

    /// Waits for a status of pod `name` that satisfies `wanted` (perhaps
    /// the one stored already).
    async fn status(&mut self, name: &str, what: &str, wanted: impl Fn(&Value) -> bool) -> Value {
        let resource = format!("default/podstatus/{name}");
        if let Some(status) = self
            .store
            .get(&resource)
            .ok()
            .flatten()
            .and_then(|r| r.object)
            .map(|object| object.decode::<Value>().expect("json"))
            && wanted(&status)
        {
            return status;
        }
        self.changed_status(name, what, wanted).await
    }

    /// Waits for a new status report of pod `name` that satisfies `wanted`.
    async fn changed_status(
        &mut self,
        name: &str,
        what: &str,
        wanted: impl Fn(&Value) -> bool,
    ) -> Value {
        let resource = format!("default/podstatus/{name}");
        let deadline = tokio::time::Instant::now() + WAIT;
        let mut last = Value::Null;
        loop {
            let change = tokio::time::timeout_at(deadline, self.changes.recv())
                .await
                .unwrap_or_else(|_| panic!("{name}: never {what}; last status {last:#}"))
                .expect("store changes");
            if change.resource != resource {
                continue;
            }
            if let Some(status) = change
                .record
                .object
                .map(|o| o.decode::<Value>().expect("json"))
            {
                if wanted(&status) {
                    return status;
                }
                last = status;
            }
        }
    }

    async fn stop(self) {
        let _ = self.hive.shutdown().await;
        self.store.close().await;
    }
}

fn pod(name: &str, uid: &str, command: &str, extra: Value) -> Value {
    let mut pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "uid": uid},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "main",
                "image": "127.0.0.1:5000/edgehive/busybox:latest",
                "imagePullPolicy": "IfNotPresent",
                "command": ["sh", "-c", command]
            }]
        }
    });
    if let (Some(spec), Some(extra)) = (pod["spec"].as_object_mut(), extra.as_object()) {
        for (key, value) in extra {
            spec.insert(key.clone(), value.clone());
        }
    }
    pod
}

fn unique(name: &str) -> String {
    format!("{name}-{}-{}", std::process::id(), fastrand_suffix())
}

fn fastrand_suffix() -> u32 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos())
}

fn main_container(status: &Value) -> &Value {
    &status["containerStatuses"][0]
}

fn running(status: &Value) -> bool {
    status["phase"] == "Running" && main_container(status)["state"]["running"].is_object()
}

/// Waits until `done` says so: for state containerd and the disk show only
/// when asked (containerd 1.6 has no CRI events).
async fn gone<F, Fut>(what: &str, mut done: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let waited = tokio::time::timeout(WAIT, async {
        while !done().await {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    assert!(waited.is_ok(), "never: {what}");
}

/// What containerd holds for a pod uid: sandboxes and containers.
async fn in_containerd(uid: &str) -> (usize, usize) {
    let cri = Cri::connect(&cri_socket()).await.expect("cri");
    let mut runtime = cri.runtime.clone();
    let selector = HashMap::from([(edged::spec::POD_UID.to_owned(), uid.to_owned())]);
    let sandboxes = runtime
        .list_pod_sandbox(api::ListPodSandboxRequest {
            filter: Some(api::PodSandboxFilter {
                label_selector: selector.clone(),
                ..Default::default()
            }),
        })
        .await
        .expect("list")
        .into_inner()
        .items
        .len();
    let containers = runtime
        .list_containers(api::ListContainersRequest {
            filter: Some(api::ContainerFilter {
                label_selector: selector,
                ..Default::default()
            }),
        })
        .await
        .expect("list")
        .into_inner()
        .containers
        .len();
    (sandboxes, containers)
}

#[actix::test]
async fn a_pod_runs_on_its_network_logs_and_is_removed_without_a_trace() {
    let node = test_node("pods-web");
    let dir = tempfile::tempdir().expect("dir");
    let mut edge = Edge::start(dir.path(), node.name()).await;
    let uid = unique("uid-web");
    let web = pod(
        "web",
        &uid,
        "echo hello from edged; exec httpd -f -p 8080 -h /",
        json!({}),
    );
    edge.send(operation::INSERT, &web, 1).await;

    let status = edge.status("web", "Running", running).await;
    let ip = status["podIP"].as_str().expect("a pod IP").to_owned();
    assert!(
        ip.starts_with("10.88."),
        "pod IP {ip} is not on the CNI bridge"
    );
    assert_eq!(main_container(&status)["restartCount"], 0);
    assert_eq!(status["conditions"][3]["type"], "Ready");
    assert_eq!(status["conditions"][3]["status"], "True");
    // Reachable from the host on its own address.
    let stream = tokio::time::timeout(WAIT, async {
        loop {
            match tokio::net::TcpStream::connect((ip.as_str(), 8080)).await {
                Ok(stream) => return stream,
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    })
    .await
    .expect("the pod's port answers");
    drop(stream);
    // Its output is in its log, in CRI's format.
    let log = edge.root.join("pods").join(&uid).join("logs/main/0.log");
    let text = tokio::time::timeout(WAIT, async {
        loop {
            let text = tokio::fs::read_to_string(&log).await.unwrap_or_default();
            if text.contains("hello from edged") {
                return text;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("the log has the output");
    assert!(text.contains(" stdout F hello from edged"), "{text}");
    // edged's own server: health, its pods, the container's log.
    assert_eq!(
        http_get(edge.server, "/healthz").await,
        (200, "ok".to_owned())
    );
    let (code, body) = http_get(edge.server, "/pods").await;
    let pods: Value = serde_json::from_str(&body).expect("json");
    assert_eq!((code, pods["kind"].as_str()), (200, Some("PodList")));
    assert_eq!(pods["items"][0]["status"]["podIP"], ip.as_str());
    let (code, log) = http_get(edge.server, "/containerLogs/default/web/main?tailLines=1").await;
    assert_eq!((code, log.as_str()), (200, "hello from edged\n"));
    assert_eq!(
        http_get(edge.server, "/containerLogs/default/nope/main")
            .await
            .0,
        404
    );
    assert_eq!(in_containerd(&uid).await, (1, 1));

    edge.send(operation::DELETE, &web, 2).await;
    gone("nothing left in containerd or on disk", || async {
        !(in_containerd(&uid).await != (0, 0) || edge.root.join("pods").join(&uid).exists())
    })
    .await;
    edge.stop().await;
}

#[actix::test]
async fn a_crashing_container_backs_off_and_its_restarts_count() {
    let node = test_node("pods-crash");
    let dir = tempfile::tempdir().expect("dir");
    let mut edge = Edge::start(dir.path(), node.name()).await;
    let uid = unique("uid-crash");
    let crash = pod(
        "crash",
        &uid,
        "echo about to fail; exit 3",
        json!({"hostNetwork": true}),
    );
    edge.send(operation::INSERT, &crash, 1).await;
    let status = edge
        .status("crash", "restarted twice", |s| {
            main_container(s)["restartCount"].as_i64() >= Some(2)
        })
        .await;
    assert_eq!(status["phase"], "Running", "{status:#}");
    let backing_off = edge
        .status("crash", "in CrashLoopBackOff", |s| {
            main_container(s)["state"]["waiting"]["reason"] == "CrashLoopBackOff"
        })
        .await;
    assert!(main_container(&backing_off)["restartCount"].as_i64() >= Some(2));
    // Only the latest dead container is kept.
    let (sandboxes, containers) = in_containerd(&uid).await;
    assert_eq!(sandboxes, 1);
    assert!(containers <= 2, "{containers} containers kept");

    // restartPolicy Never: it fails once and stays failed.
    let once_uid = unique("uid-once");
    let once = pod(
        "once",
        &once_uid,
        "exit 7",
        json!({"hostNetwork": true, "restartPolicy": "Never"}),
    );
    edge.send(operation::INSERT, &once, 1).await;
    let failed = edge
        .status("once", "Failed", |s| s["phase"] == "Failed")
        .await;
    assert_eq!(
        main_container(&failed)["state"]["terminated"]["exitCode"],
        7
    );
    assert_eq!(main_container(&failed)["restartCount"], 0);

    edge.send(operation::DELETE, &crash, 2).await;
    edge.send(operation::DELETE, &once, 2).await;
    gone("removed", || async {
        !(in_containerd(&uid).await != (0, 0) || in_containerd(&once_uid).await != (0, 0))
    })
    .await;
    edge.stop().await;
}

#[actix::test]
async fn a_restarted_edged_adopts_running_pods_and_removes_unknown_ones() {
    let node = test_node("pods-adopt");
    let dir = tempfile::tempdir().expect("dir");
    let mut edge = Edge::start(dir.path(), node.name()).await;
    let uid = unique("uid-keep");
    let keep = pod("keep", &uid, "sleep 3600", json!({"hostNetwork": true}));
    edge.send(operation::INSERT, &keep, 1).await;
    let before = edge.status("keep", "Running", running).await;
    let container = main_container(&before)["containerID"].clone();
    assert!(
        container
            .as_str()
            .is_some_and(|id| id.starts_with("containerd://"))
    );
    edge.stop().await;

    // A pod of this node's that runs in containerd but that the store no
    // longer has (deleted while edged was down).
    let stray_uid = unique("uid-stray");
    let cri = Cri::connect(&cri_socket()).await.expect("cri");
    let mut runtime = cri.runtime.clone();
    runtime
        .run_pod_sandbox(api::RunPodSandboxRequest {
            config: Some(api::PodSandboxConfig {
                metadata: Some(api::PodSandboxMetadata {
                    name: "stray".to_owned(),
                    uid: stray_uid.clone(),
                    namespace: "default".to_owned(),
                    attempt: 0,
                }),
                labels: HashMap::from([
                    (edged::spec::NODE.to_owned(), node.name().to_owned()),
                    (edged::spec::POD_UID.to_owned(), stray_uid.clone()),
                ]),
                linux: Some(api::LinuxPodSandboxConfig {
                    security_context: Some(api::LinuxSandboxSecurityContext {
                        namespace_options: Some(api::NamespaceOption {
                            network: api::NamespaceMode::Node as i32,
                            ..Default::default()
                        }),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            runtime_handler: String::new(),
        })
        .await
        .expect("stray sandbox");
    assert_eq!(in_containerd(&stray_uid).await, (1, 0));

    // edged comes back with no cloud: its pods come from the store.
    let mut edge = Edge::start(dir.path(), node.name()).await;
    let after = edge
        .changed_status("keep", "reported again", |s| {
            running(s) && main_container(s)["containerID"] == container
        })
        .await;
    assert_eq!(main_container(&after)["restartCount"], 0, "{after:#}");
    gone("the unknown pod was removed", || async {
        in_containerd(&stray_uid).await == (0, 0)
    })
    .await;
    assert_eq!(in_containerd(&uid).await, (1, 1));

    edge.send(operation::DELETE, &keep, 2).await;
    gone("removed", || async { in_containerd(&uid).await == (0, 0) }).await;
    edge.stop().await;
}

/// Runs `cmd` in a container and returns its stdout.
async fn exec(container_id: &str, cmd: &[&str]) -> String {
    let cri = Cri::connect(&cri_socket()).await.expect("cri");
    let mut runtime = cri.runtime.clone();
    let answer = runtime
        .exec_sync(api::ExecSyncRequest {
            container_id: container_id.trim_start_matches("containerd://").to_owned(),
            cmd: cmd.iter().map(|s| (*s).to_owned()).collect(),
            timeout: 10,
        })
        .await
        .expect("exec")
        .into_inner();
    assert_eq!(
        answer.exit_code,
        0,
        "{}",
        String::from_utf8_lossy(&answer.stderr)
    );
    String::from_utf8_lossy(&answer.stdout).into_owned()
}

fn condition(status: &Value, kind: &str) -> String {
    status["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == kind))
        .and_then(|c| c["status"].as_str())
        .unwrap_or("")
        .to_owned()
}

#[actix::test]
async fn configmap_and_secret_volumes_are_read_inside_the_container() {
    let node = test_node("pods-volumes");
    let dir = tempfile::tempdir().expect("dir");
    let mut edge = Edge::start(dir.path(), node.name()).await;
    let configmap = json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "settings", "namespace": "default"}, "data": {"greeting": "hello from a volume"}});
    let secret = json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "token", "namespace": "default"}, "data": {"token": "czNjcjN0"}});
    for (kind, object) in [("configmap", &configmap), ("secret", &secret)] {
        let msg = Message::new()
            .build_router(
                module::EDGEHUB,
                group::RESOURCE,
                format!(
                    "default/{kind}/{}",
                    object["metadata"]["name"].as_str().unwrap_or("")
                ),
                operation::INSERT,
            )
            .with_resource_version("1")
            .with_content(beehive::Content::of(&object).expect("json"));
        edge.hive
            .send_sync(module::METAMANAGER, msg, WAIT)
            .await
            .expect("stored");
    }
    let uid = unique("uid-vol");
    let with_volumes = pod(
        "vol",
        &uid,
        "sleep 3600",
        json!({
            "hostNetwork": true,
            "volumes": [
                {"name": "settings", "configMap": {"name": "settings"}},
                {"name": "token", "secret": {"secretName": "token"}},
                {"name": "scratch", "emptyDir": {}}
            ]
        }),
    );
    let mut with_volumes = with_volumes;
    with_volumes["spec"]["containers"][0]["volumeMounts"] = json!([
        {"name": "settings", "mountPath": "/etc/settings"},
        {"name": "token", "mountPath": "/var/run/token"},
        {"name": "scratch", "mountPath": "/scratch"}
    ]);
    edge.send(operation::INSERT, &with_volumes, 1).await;
    let status = edge.status("vol", "Running", running).await;
    let id = main_container(&status)["containerID"]
        .as_str()
        .expect("id")
        .to_owned();
    assert_eq!(
        exec(&id, &["cat", "/etc/settings/greeting"]).await,
        "hello from a volume"
    );
    assert_eq!(exec(&id, &["cat", "/var/run/token/token"]).await, "s3cr3t");
    exec(&id, &["sh", "-c", "echo written > /scratch/file"]).await;
    assert!(
        edge.root
            .join("pods")
            .join(&uid)
            .join("volumes/empty-dir/scratch/file")
            .exists()
    );

    edge.send(operation::DELETE, &with_volumes, 2).await;
    gone("removed, volumes too", || async {
        !(in_containerd(&uid).await != (0, 0) || edge.root.join("pods").join(&uid).exists())
    })
    .await;
    edge.stop().await;
}

#[actix::test]
async fn probes_restart_a_dead_container_and_decide_readiness() {
    let node = test_node("pods-probes");
    let dir = tempfile::tempdir().expect("dir");
    let mut edge = Edge::start(dir.path(), node.name()).await;
    // Liveness: healthy for a moment, then not.
    let uid = unique("uid-live");
    let mut live = pod(
        "live",
        &uid,
        "touch /tmp/healthy; sleep 1; rm /tmp/healthy; sleep 3600",
        json!({"hostNetwork": true}),
    );
    live["spec"]["containers"][0]["livenessProbe"] = json!({
        "exec": {"command": ["test", "-f", "/tmp/healthy"]},
        "periodSeconds": 1, "failureThreshold": 1
    });
    edge.send(operation::INSERT, &live, 1).await;
    edge.status("live", "restarted by its liveness probe", |s| {
        main_container(s)["restartCount"].as_i64() >= Some(1)
    })
    .await;

    // Readiness: not ready until the file exists, ready while it does.
    let ready_uid = unique("uid-ready");
    let mut ready = pod(
        "ready",
        &ready_uid,
        "sleep 3600",
        json!({"hostNetwork": true}),
    );
    ready["spec"]["containers"][0]["readinessProbe"] = json!({
        "exec": {"command": ["test", "-f", "/tmp/ready"]},
        "periodSeconds": 1, "failureThreshold": 1
    });
    edge.send(operation::INSERT, &ready, 1).await;
    let status = edge
        .status("ready", "running, not ready", |s| {
            running(s) && condition(s, "Ready") == "False"
        })
        .await;
    let id = main_container(&status)["containerID"]
        .as_str()
        .expect("id")
        .to_owned();
    exec(&id, &["touch", "/tmp/ready"]).await;
    edge.status("ready", "Ready", |s| {
        condition(s, "Ready") == "True" && main_container(s)["ready"] == true
    })
    .await;
    exec(&id, &["rm", "/tmp/ready"]).await;
    let not_ready = edge
        .status("ready", "not Ready again", |s| {
            condition(s, "Ready") == "False"
        })
        .await;
    assert_eq!(
        main_container(&not_ready)["restartCount"],
        0,
        "readiness never restarts"
    );

    // An httpGet and a tcpSocket probe against a real server.
    let web_uid = unique("uid-httpget");
    let mut web = pod(
        "httpget",
        &web_uid,
        "mkdir -p /www && echo ok > /www/index.html && exec httpd -f -p 18080 -h /www",
        json!({}),
    );
    web["spec"]["containers"][0]["readinessProbe"] =
        json!({"httpGet": {"path": "/index.html", "port": 18080}, "periodSeconds": 1});
    web["spec"]["containers"][0]["livenessProbe"] =
        json!({"tcpSocket": {"port": 18080}, "periodSeconds": 1});
    edge.send(operation::INSERT, &web, 1).await;
    let status = edge
        .status("httpget", "Ready through httpGet", |s| {
            condition(s, "Ready") == "True"
        })
        .await;
    assert_eq!(main_container(&status)["restartCount"], 0);

    for (pod, uid) in [(&live, &uid), (&ready, &ready_uid), (&web, &web_uid)] {
        edge.send(operation::DELETE, pod, 2).await;
        gone("removed", || async { in_containerd(uid).await == (0, 0) }).await;
    }
    edge.stop().await;
}

/// One plain HTTP/1.0 exchange with the registry: status and body.
async fn registry(request: String, body: &[u8]) -> (u16, Vec<u8>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect("127.0.0.1:5000")
        .await
        .expect("registry");
    stream.write_all(request.as_bytes()).await.expect("write");
    stream.write_all(body).await.expect("write");
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).await.expect("read");
    let split = answer
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("head")
        + 4;
    let code = String::from_utf8_lossy(&answer[..split])
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .expect("status");
    (code, answer[split..].to_vec())
}

#[actix::test]
async fn a_missing_image_reports_errimagepull_and_recovers_once_it_appears() {
    let node = test_node("pods-late");
    let dir = tempfile::tempdir().expect("dir");
    let mut edge = Edge::start(dir.path(), node.name()).await;
    let tag = unique("late");
    let uid = unique("uid-late");
    let mut late = pod("late", &uid, "sleep 3600", json!({"hostNetwork": true}));
    late["spec"]["containers"][0]["image"] =
        json!(format!("127.0.0.1:5000/edgehive/busybox:{tag}"));
    edge.send(operation::INSERT, &late, 1).await;
    edge.status("late", "ErrImagePull", |s| {
        main_container(s)["state"]["waiting"]["reason"] == "ErrImagePull"
    })
    .await;
    edge.status("late", "ImagePullBackOff", |s| {
        main_container(s)["state"]["waiting"]["reason"] == "ImagePullBackOff"
    })
    .await;

    // The image appears: the same manifest under the new tag.
    let accept = "application/vnd.oci.image.manifest.v1+json";
    let (code, manifest) = registry(
        format!("GET /v2/edgehive/busybox/manifests/latest HTTP/1.0\r\nHost: 127.0.0.1:5000\r\nAccept: {accept}\r\n\r\n"),
        b"",
    )
    .await;
    assert_eq!(code, 200);
    let (code, _) = registry(
        format!(
            "PUT /v2/edgehive/busybox/manifests/{tag} HTTP/1.0\r\nHost: 127.0.0.1:5000\r\nContent-Type: {accept}\r\nContent-Length: {}\r\n\r\n",
            manifest.len()
        ),
        &manifest,
    )
    .await;
    assert_eq!(code, 201);
    edge.status("late", "Running once the image exists", running)
        .await;

    edge.send(operation::DELETE, &late, 2).await;
    gone("removed", || async { in_containerd(&uid).await == (0, 0) }).await;
    edge.stop().await;
}

/// One plain HTTP/1.0 GET: status and body.
async fn http_get(server: std::net::SocketAddr, path: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(server)
        .await
        .expect("server");
    let request = format!("GET {path} HTTP/1.0\r\nHost: {server}\r\n\r\n");
    stream.write_all(request.as_bytes()).await.expect("write");
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).await.expect("read");
    let text = String::from_utf8_lossy(&answer).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").expect("head");
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .expect("status");
    (code, body.to_owned())
}

/// Pushes an image of its own under `tag`: busybox's layer with a config
/// that differs, so it has an id no other test uses.
async fn push_distinct_image(tag: &str) {
    let accept = "application/vnd.oci.image.manifest.v1+json";
    let (_, manifest) = registry(
        format!("GET /v2/edgehive/busybox/manifests/latest HTTP/1.0\r\nHost: 127.0.0.1:5000\r\nAccept: {accept}\r\n\r\n"),
        b"",
    )
    .await;
    let mut manifest: Value = serde_json::from_slice(&manifest).expect("manifest");
    let config_digest = manifest["config"]["digest"]
        .as_str()
        .expect("config")
        .to_owned();
    let (_, config) = registry(
        format!("GET /v2/edgehive/busybox/blobs/{config_digest} HTTP/1.0\r\nHost: 127.0.0.1:5000\r\n\r\n"),
        b"",
    )
    .await;
    let mut config: Value = serde_json::from_slice(&config).expect("config");
    config["config"]["Labels"] = json!({"edgehive.io/test": tag});
    let config = serde_json::to_vec(&config).expect("json");
    let digest = ring::digest::digest(&ring::digest::SHA256, &config);
    let digest = format!(
        "sha256:{}",
        digest
            .as_ref()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    );
    let (code, head) = registry_head(
        "POST /v2/edgehive/busybox/blobs/uploads/ HTTP/1.0\r\nHost: 127.0.0.1:5000\r\nContent-Length: 0\r\n\r\n".to_owned(),
    )
    .await;
    assert_eq!(code, 202);
    let location = head
        .lines()
        .find_map(|l| {
            l.strip_prefix("Location: ")
                .or_else(|| l.strip_prefix("location: "))
        })
        .expect("location")
        .trim()
        .to_owned();
    let path = &location[location.find("/v2/").expect("path")..];
    let separator = if path.contains('?') { '&' } else { '?' };
    let (code, _) = registry(
        format!(
            "PUT {path}{separator}digest={digest} HTTP/1.0\r\nHost: 127.0.0.1:5000\r\nContent-Type: application/octet-stream\r\nContent-Length: {}\r\n\r\n",
            config.len()
        ),
        &config,
    )
    .await;
    assert_eq!(code, 201);
    manifest["config"]["digest"] = json!(digest);
    manifest["config"]["size"] = json!(config.len());
    let manifest = serde_json::to_vec(&manifest).expect("json");
    let (code, _) = registry(
        format!(
            "PUT /v2/edgehive/busybox/manifests/{tag} HTTP/1.0\r\nHost: 127.0.0.1:5000\r\nContent-Type: {accept}\r\nContent-Length: {}\r\n\r\n",
            manifest.len()
        ),
        &manifest,
    )
    .await;
    assert_eq!(code, 201);
}

/// Like `registry`, for the status and the head of the answer.
async fn registry_head(request: String) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect("127.0.0.1:5000")
        .await
        .expect("registry");
    stream.write_all(request.as_bytes()).await.expect("write");
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).await.expect("read");
    let text = String::from_utf8_lossy(&answer).into_owned();
    let head = text.split("\r\n\r\n").next().unwrap_or("").to_owned();
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .expect("status");
    (code, head)
}

#[actix::test]
async fn unused_images_are_collected_and_pinned_ones_kept() {
    let tag = unique("gc");
    push_distinct_image(&tag).await;
    let cri = Cri::connect(&cri_socket()).await.expect("cri");
    let reference = format!("127.0.0.1:5000/edgehive/busybox:{tag}");
    let mut images = cri.images.clone();
    let status = |image: &str| api::ImageStatusRequest {
        image: Some(api::ImageSpec {
            image: image.to_owned(),
            ..Default::default()
        }),
        verbose: false,
    };
    images
        .pull_image(api::PullImageRequest {
            image: Some(api::ImageSpec {
                image: reference.clone(),
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
        .expect("pull");
    assert!(
        images
            .image_status(status(&reference))
            .await
            .expect("status")
            .into_inner()
            .image
            .is_some()
    );
    // Other tests' images share this containerd: pin every other tag, so
    // only ours may go.
    let listed = images
        .list_images(api::ListImagesRequest { filter: None })
        .await
        .expect("list")
        .into_inner()
        .images;
    let pinned: Vec<String> = listed
        .into_iter()
        .flat_map(|image| image.repo_tags)
        .filter(|t| *t != reference)
        .collect();
    let policy = edged::gc::ImageGcPolicy {
        high_percent: 0,
        low_percent: 0,
        min_age: Duration::ZERO,
        pinned,
    };
    let mut collector = edged::gc::ImageCollector::default();
    let removed = collector.collect(&cri, &policy).await.expect("collect");
    assert_eq!(removed.len(), 1, "{removed:?}");
    assert!(
        images
            .image_status(status(&reference))
            .await
            .expect("status")
            .into_inner()
            .image
            .is_none(),
        "the unused image went"
    );
    let pause = "127.0.0.1:5000/edgehive/pause:latest";
    assert!(
        images
            .image_status(status(pause))
            .await
            .expect("status")
            .into_inner()
            .image
            .is_some(),
        "a pinned image stays"
    );
}

#[actix::test]
async fn init_containers_run_in_order_before_the_containers_and_startup_gates_readiness() {
    let node = test_node("pods-init");
    let dir = tempfile::tempdir().expect("dir");
    let mut edge = Edge::start(dir.path(), node.name()).await;
    let uid = unique("uid-init");
    let mut staged = pod(
        "staged",
        &uid,
        "cat /work/order; sleep 3600",
        json!({
            "hostNetwork": true,
            "volumes": [{"name": "work", "emptyDir": {}}],
            "initContainers": [
                {"name": "first", "image": "127.0.0.1:5000/edgehive/busybox:latest", "imagePullPolicy": "IfNotPresent",
                 "command": ["sh", "-c", "echo first >> /work/order"],
                 "volumeMounts": [{"name": "work", "mountPath": "/work"}]},
                {"name": "second", "image": "127.0.0.1:5000/edgehive/busybox:latest", "imagePullPolicy": "IfNotPresent",
                 "command": ["sh", "-c", "echo second >> /work/order"],
                 "volumeMounts": [{"name": "work", "mountPath": "/work"}]}
            ]
        }),
    );
    staged["spec"]["containers"][0]["volumeMounts"] =
        json!([{"name": "work", "mountPath": "/work"}]);
    // Startup passes once the file exists; until then the pod is not Ready.
    // Five minutes of failures allowed: the test, not the probe, decides
    // when the file appears, and a loaded machine may be slow to get there.
    staged["spec"]["containers"][0]["startupProbe"] = json!({
        "exec": {"command": ["test", "-f", "/tmp/started"]}, "periodSeconds": 1, "failureThreshold": 300
    });
    edge.send(operation::INSERT, &staged, 1).await;
    let status = edge
        .status("staged", "running, not yet started up", |s| {
            running(s) && condition(s, "Initialized") == "True" && condition(s, "Ready") == "False"
        })
        .await;
    let inits = status["initContainerStatuses"]
        .as_array()
        .expect("init statuses");
    assert!(
        inits
            .iter()
            .all(|i| i["state"]["terminated"]["exitCode"] == 0),
        "{status:#}"
    );
    let id = main_container(&status)["containerID"]
        .as_str()
        .expect("id")
        .to_owned();
    assert_eq!(exec(&id, &["cat", "/work/order"]).await, "first\nsecond\n");
    exec(&id, &["touch", "/tmp/started"]).await;
    edge.status("staged", "Ready after startup", |s| {
        condition(s, "Ready") == "True"
    })
    .await;

    edge.send(operation::DELETE, &staged, 2).await;
    gone("removed", || async { in_containerd(&uid).await == (0, 0) }).await;
    edge.stop().await;
}

#[actix::test]
async fn a_finished_pod_is_not_run_again_after_edged_restarts() {
    let node = test_node("pods-done");
    let dir = tempfile::tempdir().expect("dir");
    let mut edge = Edge::start(dir.path(), node.name()).await;
    let uid = unique("uid-done");
    let done = pod(
        "done",
        &uid,
        "exit 0",
        json!({"hostNetwork": true, "restartPolicy": "Never"}),
    );
    edge.send(operation::INSERT, &done, 1).await;
    edge.status("done", "Succeeded", |s| s["phase"] == "Succeeded")
        .await;
    edge.stop().await;
    // As after a reboot: the sandbox is stopped, its record kept.
    let cri = Cri::connect(&cri_socket()).await.expect("cri");
    for sandbox in cri
        .sandboxes(edged::spec::POD_UID, &uid)
        .await
        .expect("list")
    {
        let mut runtime = cri.runtime.clone();
        runtime
            .stop_pod_sandbox(api::StopPodSandboxRequest {
                pod_sandbox_id: sandbox.id,
            })
            .await
            .expect("stop");
    }
    let before = in_containerd(&uid).await;

    let edge = Edge::start(dir.path(), node.name()).await;
    // Another pod on the same edged is a marker: once it runs, edged has
    // long since synced "done".
    let mut edge = edge;
    let marker_uid = unique("uid-marker");
    let marker = pod(
        "marker",
        &marker_uid,
        "sleep 3600",
        json!({"hostNetwork": true}),
    );
    edge.send(operation::INSERT, &marker, 1).await;
    edge.status("marker", "Running", running).await;
    assert_eq!(
        in_containerd(&uid).await,
        before,
        "the finished pod was run again"
    );
    let stored = edge
        .store
        .get("default/podstatus/done")
        .expect("read")
        .and_then(|r| r.object)
        .map(|object| object.decode::<Value>().expect("json"))
        .expect("status");
    assert_eq!(stored["phase"], "Succeeded");

    for (pod, uid) in [(&done, &uid), (&marker, &marker_uid)] {
        edge.send(operation::DELETE, pod, 2).await;
        gone("removed", || async { in_containerd(uid).await == (0, 0) }).await;
    }
    edge.stop().await;
}

/// The cloud as edged's token questions meet it (standing in for
/// edgehub): it refuses while closed, as edgehub does with the cloud
/// unreachable; once opened it issues `token-1`, `token-2`, ..., the first
/// `short` of them expiring in 2 s, later ones in an hour.
struct TokenCloud {
    open: std::sync::Arc<std::sync::atomic::AtomicBool>,
    asked: std::sync::Arc<std::sync::Mutex<Vec<Message>>>,
}

impl TokenCloud {
    fn start(hive: &Hive, short: usize) -> TokenCloud {
        let (inbox, mut questions) = tokio::sync::mpsc::channel::<Message>(64);
        let door = beehive::TaskDoor::new(module::EDGEHUB, group::HUB, inbox, |msg| msg);
        hive.start_module(move |_| door.clone())
            .expect("the cloud's door");
        let cloud = TokenCloud {
            open: Default::default(),
            asked: Default::default(),
        };
        let (hive, open, asked) = (hive.clone(), cloud.open.clone(), cloud.asked.clone());
        actix::spawn(async move {
            let mut issued = 0;
            while let Some(msg) = questions.recv().await {
                // Status reports come this way too.
                if msg.operation() != operation::QUERY
                    || !msg.resource().contains("/serviceaccounttoken/")
                {
                    continue;
                }
                asked.lock().expect("asked").push(msg.clone());
                let answer = match open.load(std::sync::atomic::Ordering::Acquire) {
                    false => msg.error_response(module::EDGEHUB, "the cloud is unreachable"),
                    true => {
                        issued += 1;
                        let life = if issued <= short { 2 } else { 3600 };
                        let expires =
                            jiff::Timestamp::now() + jiff::SignedDuration::from_secs(life);
                        let mut content = msg.body::<Value>().expect("json");
                        content["status"] = json!({
                            "token": format!("token-{issued}"),
                            "expirationTimestamp": expires.to_string(),
                        });
                        msg.response(
                            module::EDGECONTROLLER,
                            beehive::Content::of(&content).expect("json"),
                        )
                    }
                };
                hive.send_resp(answer);
            }
        });
        cloud
    }

    fn open(&self) {
        self.open.store(true, std::sync::atomic::Ordering::Release);
    }

    fn asked(&self) -> Vec<Message> {
        self.asked.lock().expect("asked").clone()
    }
}

/// Waits until the file `path` in container `id` holds `wanted`.
async fn reads(id: &str, path: &str, wanted: &str) {
    let mut last = String::new();
    let waited = tokio::time::timeout(WAIT, async {
        loop {
            last = exec(id, &["cat", path]).await;
            if last == wanted {
                return;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
    .await;
    assert!(
        waited.is_ok(),
        "{path} never read {wanted:?} (last {last:?})"
    );
}

#[actix::test]
async fn a_pods_token_is_asked_of_the_cloud_kept_renewed_and_deleted_with_it() {
    let node = test_node("pods-token");
    let dir = tempfile::tempdir().expect("dir");
    let policy = TokenPolicy {
        retry_initial: Duration::from_millis(200),
        retry_max: Duration::from_secs(1),
        min_renewal: Duration::from_secs(1),
        ..TokenPolicy::default()
    };
    let mut edge = Edge::start_asking(dir.path(), node.name(), policy).await;
    let cloud = TokenCloud::start(&edge.hive, 1);
    let uid = unique("uid-token");
    let mut with_token = pod(
        "tok",
        &uid,
        "sleep 3600",
        json!({
            "hostNetwork": true,
            "serviceAccountName": "reader",
            "volumes": [{"name": "kube-api-access", "projected": {"sources": [
                {"serviceAccountToken": {"path": "token", "expirationSeconds": 600}},
            ]}}],
        }),
    );
    let mount = "/var/run/secrets/kubernetes.io/serviceaccount";
    with_token["spec"]["containers"][0]["volumeMounts"] =
        json!([{"name": "kube-api-access", "mountPath": mount}]);
    edge.send(operation::INSERT, &with_token, 1).await;

    // The cloud away: the pod waits for its token, as for a missing
    // configmap, and holds no other pod.
    let waiting = edge
        .status("tok", "waiting for its token", |s| {
            main_container(s)["state"]["waiting"]["reason"] == "CreateContainerConfigError"
        })
        .await;
    let message = main_container(&waiting)["state"]["waiting"]["message"].clone();
    assert!(
        message
            .as_str()
            .is_some_and(|m| m.contains("not issued yet")),
        "{waiting:#}"
    );
    let plain_uid = unique("uid-plain");
    let plain = pod(
        "plain",
        &plain_uid,
        "sleep 3600",
        json!({"hostNetwork": true}),
    );
    edge.send(operation::INSERT, &plain, 1).await;
    edge.status("plain", "Running", running).await;
    // Asked as a KubeEdge edge's kubelet asks, and asked again.
    gone("asked again", || async { cloud.asked().len() >= 2 }).await;
    let asked = cloud.asked();
    assert_eq!(asked[0].resource(), "default/serviceaccounttoken/reader");
    assert_eq!(asked[0].group(), group::RESOURCE);
    assert_eq!(
        asked[0].body::<serde_json::Value>().expect("json body")["spec"],
        json!({
            "audiences": [],
            "expirationSeconds": 600,
            "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": "tok", "uid": uid},
        })
    );

    // The cloud back: the pod starts with its token; the token, living
    // 2 s, is renewed, and the running container reads the new one.
    cloud.open();
    let status = edge.status("tok", "Running", running).await;
    let id = main_container(&status)["containerID"]
        .as_str()
        .expect("id")
        .to_owned();
    let file = format!("{mount}/token");
    reads(&id, &file, "token-2").await;
    // Kept in the edge store as the `serviceaccounttoken` object.
    let key = format!(
        "default/serviceaccounttoken/{}",
        edged::volumes::token_name("tok", "kube-api-access", 0)
    );
    let kept = edge
        .store
        .get(&key)
        .expect("store")
        .and_then(|record| record.object)
        .map(|object| object.decode::<Value>().expect("json"))
        .expect("the token kept");
    assert_eq!(kept["status"]["token"], "token-2");
    assert_eq!(kept["spec"]["boundObjectRef"]["uid"], json!(uid));
    edge.stop().await;

    // edged restarts with the cloud away: the token it kept is not due, so
    // nothing is asked, and a container started anew mounts it.
    let mut edge = Edge::start_asking(dir.path(), node.name(), policy).await;
    let cloud = TokenCloud::start(&edge.hive, 0);
    edge.changed_status("tok", "reported again", |s| {
        running(s) && main_container(s)["containerID"] == json!(id)
    })
    .await;
    let cri = Cri::connect(&cri_socket()).await.expect("cri");
    cri.runtime
        .clone()
        .stop_container(api::StopContainerRequest {
            container_id: id.trim_start_matches("containerd://").to_owned(),
            timeout: 0,
        })
        .await
        .expect("container stopped");
    let restarted = edge
        .changed_status("tok", "restarted", |s| {
            running(s) && main_container(s)["containerID"] != json!(id)
        })
        .await;
    let id = main_container(&restarted)["containerID"]
        .as_str()
        .expect("id")
        .to_owned();
    reads(&id, &file, "token-2").await;
    assert!(cloud.asked().is_empty(), "{:?}", cloud.asked());

    // Deleted with its pod.
    edge.send(operation::DELETE, &with_token, 2).await;
    edge.send(operation::DELETE, &plain, 2).await;
    gone("the token deleted with its pod", || async {
        edge.store
            .get(&key)
            .expect("store")
            .is_some_and(|record| record.is_deleted())
    })
    .await;
    for uid in [&uid, &plain_uid] {
        gone("removed", || async { in_containerd(uid).await == (0, 0) }).await;
    }
    edge.stop().await;
}
