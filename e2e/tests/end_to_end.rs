//! The whole system as a user runs it, once over each transport: cloudcore,
//! edgecore and edgehive-mapper as separate processes, containerd through
//! CRI (`scripts/setup-containerd`), the edge's embedded MQTT broker.
//!
//! A pod applied in the cloud runs on the edge and its status shows in the
//! cloud; the cloud is killed and the pod keeps running; edgecore restarts
//! while the cloud is down and keeps the same container (restart count
//! unchanged); the cloud comes back, the node is Ready again, the status
//! converges and nothing is re-created; a configmap update changes the file
//! inside the container; a device's desired value reaches the mapper and its
//! reported value the cloud, through MQTT; the pod's deletion leaves nothing
//! in containerd; an edge presenting another node's name is refused. The
//! same again with edgecore speaking KubeEdge's dialect. A failed run's
//! pod is removed from containerd when the test ends (its test node).

use std::path::PathBuf;
use std::time::Duration;

use edged::Cri;
use edged::cri::api;
use serde_json::Value;
use support::{
    CloudcoreRun, EdgecoreRun, Process, cri_socket, ctl, free_address, join_node, tempfile_dir,
    test_node, until,
};

mod support;

#[test]
fn over_websocket() {
    the_system_end_to_end("ws");
}

#[test]
fn over_quic() {
    the_system_end_to_end("quic");
}

#[test]
fn over_a_unix_socket() {
    the_system_end_to_end("uds");
}

/// edgecore speaking KubeEdge's dialect (JSON frames, `node_id` header, its
/// keepalives, acks and status patches) to cloudcore's KubeEdge endpoint.
#[test]
fn in_kubeedges_dialect() {
    the_system_end_to_end("kubeedge");
}

fn manifest(node: &str, greeting: &str) -> String {
    format!(
        "apiVersion: v1
kind: ConfigMap
metadata:
  name: web-conf
data:
  greeting: {greeting}
---
apiVersion: v1
kind: Pod
metadata:
  name: web
spec:
  nodeName: {node}
  terminationGracePeriodSeconds: 2
  containers:
  - name: web
    image: 127.0.0.1:5000/busybox:latest
    command: [sh, -c, \"trap 'exit 0' TERM; while true; do sleep 1; done\"]
    volumeMounts:
    - name: conf
      mountPath: /etc/web
  volumes:
  - name: conf
    configMap:
      name: web-conf
---
apiVersion: devices.kubeedge.io/v1beta1
kind: DeviceModel
metadata:
  name: thermometer
spec:
  properties:
  - name: temperature
    type: float
  - name: setpoint
    type: int
---
apiVersion: devices.kubeedge.io/v1beta1
kind: Device
metadata:
  name: thermo-{node}
spec:
  nodeName: {node}
  deviceModelRef:
    name: thermometer
  properties:
  - name: temperature
  - name: setpoint
    desired:
      value: \"21\"
"
    )
}

/// The pod as the cloud sees it.
fn cloud_pod(admin: &str) -> Option<Value> {
    let (ok, out, _) = ctl(admin, &["get", "pod", "web", "-o", "json"]);
    ok.then(|| serde_json::from_str(&out).ok()).flatten()
}

/// The containers containerd runs for the pod with `uid`: (id, attempt,
/// running).
fn containers(runtime: &tokio::runtime::Runtime, cri: &Cri, uid: &str) -> Vec<(String, u32, bool)> {
    let listed = runtime
        .block_on(cri.containers(edged::spec::POD_UID, uid, None))
        .expect("containerd answers");
    listed
        .into_iter()
        .map(|c| {
            let attempt = c.metadata.as_ref().map_or(0, |m| m.attempt);
            (
                c.id,
                attempt,
                c.state == api::ContainerState::ContainerRunning as i32,
            )
        })
        .collect()
}

fn exec(runtime: &tokio::runtime::Runtime, cri: &Cri, container: &str, cmd: &[&str]) -> String {
    let mut service = cri.runtime.clone();
    let out = runtime
        .block_on(service.exec_sync(api::ExecSyncRequest {
            container_id: container.to_owned(),
            cmd: cmd.iter().map(|s| (*s).to_owned()).collect(),
            timeout: 10,
        }))
        .expect("exec")
        .into_inner();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The cloud's view of a node: its Ready condition's status.
fn node_ready(admin: &str, node: &str) -> Option<String> {
    let (ok, out, _) = ctl(admin, &["get", "node", node, "-o", "json"]);
    let node: Value = ok.then(|| serde_json::from_str(&out).ok()).flatten()?;
    node["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == "Ready")?["status"]
        .as_str()
        .map(str::to_owned)
}

fn scrape(runtime: &tokio::runtime::Runtime, address: &str) -> String {
    let client = cloud::AdminClient::new(address);
    let (_, body) = runtime
        .block_on(client.raw(hyper::Method::GET, "/metrics", None))
        .expect("metrics");
    String::from_utf8_lossy(&body).into_owned()
}

fn the_system_end_to_end(transport: &str) {
    let mapper = env!("CARGO_BIN_EXE_e2e-mapper");
    // Declared first, dropped last: after the edge, its pods are removed.
    let node_guard = test_node(&format!("e2e-{transport}"));
    let node = node_guard.name().to_owned();
    let dir = tempfile_dir(&node);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let cri = runtime
        .block_on(Cri::connect(&cri_socket()))
        .expect("containerd (run ./scripts/setup-containerd)");

    let hub = match transport {
        "uds" => format!("{dir}/cloudhub.sock"),
        _ => free_address(),
    };
    let certs = free_address();
    let admin = free_address();
    let cloud_metrics = free_address();
    let metaserver = free_address();
    let broker = free_address();
    let edge_metrics = free_address();
    let edged_server = free_address();
    let (cloud_dir, edge_dir) = (format!("{dir}/cloud"), format!("{dir}/edge"));
    // KubeEdge's dialect runs over WebSocket, on the cloud's KubeEdge endpoint.
    let (cloud_flag, edge_transport) = match transport {
        "kubeedge" => ("--kubeedge-ws".to_owned(), "ws"),
        other => (format!("--{other}"), other),
    };
    let cloud_run = CloudcoreRun::new(&cloud_dir, &certs)
        .with(&cloud_flag, &hub)
        .with("--admin", &admin)
        .flag("--admin-insecure")
        .with("--metrics", &cloud_metrics)
        .with("--keepalive-secs", "2");
    let mut edge_run = EdgecoreRun::new(&edge_dir, &hub)
        .with("--transport", edge_transport)
        .with("--metaserver", &metaserver)
        .with("--edged-server", &edged_server)
        .with("--mqtt-broker", &broker)
        .with("--metrics", &edge_metrics)
        .with("--node-ip", "127.0.0.1")
        .with("--keepalive-secs", "2")
        .with("--cri-socket", &cri_socket().display().to_string());
    if transport == "uds" {
        edge_run = edge_run.with("--node", &node);
    }
    if transport == "kubeedge" {
        edge_run = edge_run.with("--dialect", "kubeedge");
    }

    let cloud = cloud_run.start();
    cloud.wait_for("certificate endpoints ready", Duration::from_secs(30));
    let join = |name: &str, data_dir: &str| join_node(&cloud_dir, &certs, name, data_dir);
    if transport != "uds" {
        join(&node, &edge_dir);
    }
    let edge = edge_run.start();
    cloud.wait_for(
        &format!("node connected node={node}"),
        Duration::from_secs(30),
    );
    edge.wait_for("metaserver ready", Duration::from_secs(30));

    // A pod applied in the cloud runs on the edge; the cloud sees it run.
    let file = format!("{dir}/web.yaml");
    std::fs::write(&file, manifest(&node, "hello")).expect("manifest");
    let (ok, _, err) = ctl(&admin, &["apply", "-f", &file]);
    assert!(ok, "{err}");
    let pod = until("the pod Running in the cloud's view", || {
        cloud_pod(&admin).filter(|p| p["status"]["phase"] == "Running")
    });
    let uid = pod["metadata"]["uid"].as_str().expect("uid").to_owned();
    let status = &pod["status"]["containerStatuses"][0];
    let container_id = status["containerID"]
        .as_str()
        .expect("container id")
        .to_owned();
    assert_eq!(status["restartCount"], 0);
    let running = containers(&runtime, &cri, &uid);
    assert_eq!(running.len(), 1, "{running:?}");
    let (id, attempt, up) = running[0].clone();
    assert!(
        up && container_id.ends_with(&id),
        "{container_id} vs {running:?}"
    );
    assert_eq!(
        exec(&runtime, &cri, &id, &["cat", "/etc/web/greeting"]),
        "hello"
    );

    // The cloud dies (SIGKILL): once the edge has noticed, the pod still
    // runs.
    drop(cloud);
    until("the edge noticing the cloud is gone", || {
        scrape(&runtime, &edge_metrics)
            .contains("edgehive_edgehub_connected 0\n")
            .then_some(())
    });
    assert_eq!(
        containers(&runtime, &cri, &uid),
        vec![(id.clone(), attempt, true)]
    );

    // edgecore restarts while the cloud is down: same container, same
    // attempt.
    edge.stop();
    let edge = edge_run.start();
    edge.wait_for("metaserver ready", Duration::from_secs(30));
    // The restarted edged's own live view (its HTTP server), not what
    // the store held from before.
    let edged_api = cloud::AdminClient::new(&edged_server);
    until(
        "the restarted edged running the pod in the same container",
        || {
            let pods = runtime.block_on(edged_api.get("/pods")).ok()?;
            let pod = pods["items"]
                .as_array()?
                .iter()
                .find(|p| p["metadata"]["name"] == "web")?;
            let status = &pod["status"]["containerStatuses"][0];
            (pod["status"]["phase"] == "Running"
                && status["containerID"] == container_id.as_str()
                && status["restartCount"] == 0
                && status["state"]["running"].is_object())
            .then_some(())
        },
    );
    assert_eq!(
        containers(&runtime, &cri, &uid),
        vec![(id.clone(), attempt, true)]
    );

    // The cloud comes back: the node is Ready, the status converges and
    // nothing was re-created.
    let cloud = cloud_run.start();
    cloud.wait_for(
        &format!("node connected node={node}"),
        Duration::from_secs(60),
    );
    until("the node Ready again", || {
        (node_ready(&admin, &node).as_deref() == Some("True")).then_some(())
    });
    until("reports from the edge reaching the new cloud", || {
        let page = scrape(&runtime, &cloud_metrics);
        let upstream = page.lines().find_map(|l| {
            l.strip_prefix("edgehive_cloudhub_upstream_total ")?
                .parse::<u64>()
                .ok()
        })?;
        (upstream >= 1).then_some(())
    });
    let pod = until("the pod's status converged", || {
        cloud_pod(&admin).filter(|p| {
            p["status"]["phase"] == "Running"
                && p["status"]["containerStatuses"][0]["containerID"] == container_id.as_str()
        })
    });
    assert_eq!(pod["status"]["containerStatuses"][0]["restartCount"], 0);
    assert_eq!(pod["metadata"]["uid"], uid.as_str());
    assert_eq!(
        containers(&runtime, &cri, &uid),
        vec![(id.clone(), attempt, true)]
    );

    // A configmap update changes the file inside the container.
    std::fs::write(&file, manifest(&node, "bonjour")).expect("manifest");
    let (ok, out, err) = ctl(&admin, &["apply", "-f", &file]);
    assert!(
        ok && out.contains("configmap/web-conf configured"),
        "{out}{err}"
    );
    until("the new value inside the container", || {
        (exec(&runtime, &cri, &id, &["cat", "/etc/web/greeting"]) == "bonjour").then_some(())
    });

    // A device twin round trip through MQTT: the mapper (its own process)
    // gets the desired setpoint and reports it and a temperature; the
    // cloud's device status shows both.
    let mapper = Process::start(
        mapper,
        &["--broker", &broker, "--node", &node, "--period-ms", "200"],
    );
    let device = format!("thermo-{node}");
    until("the device's reported values in the cloud", || {
        let (ok, out, _) = ctl(&admin, &["get", "device", &device, "-o", "json"]);
        let device: Value = ok.then(|| serde_json::from_str(&out).ok()).flatten()?;
        let twins = device["status"]["twins"].as_array()?;
        let reported = |name: &str| {
            twins
                .iter()
                .find(|t| t["propertyName"] == name)
                .and_then(|t| t["reported"]["value"].as_str())
                .map(str::to_owned)
        };
        (reported("setpoint").as_deref() == Some("21") && reported("temperature").is_some())
            .then_some(())
    });

    // An edge presenting another node's name is refused (over TLS the
    // name is the certificate's; a Unix socket trusts its file
    // permissions instead).
    if transport != "uds" {
        let metric = |name: &str| {
            scrape(&runtime, &cloud_metrics)
                .lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse::<u64>().ok())
        };
        let sessions = metric("edgehive_cloudhub_sessions_total").expect("sessions metric");
        let refused = metric("edgehive_cloudhub_refused_links_total").expect("refusals metric");
        let intruder_dir = format!("{dir}/intruder");
        join("intruder", &intruder_dir);
        forged_link(&intruder_dir, &hub, transport, &node);
        until("the forged link refused", || {
            (metric("edgehive_cloudhub_refused_links_total")? > refused).then_some(())
        });
        assert_eq!(
            metric("edgehive_cloudhub_sessions_total"),
            Some(sessions),
            "no session for the intruder"
        );
        let (ok, out, _) = ctl(&admin, &["get", "nodes"]);
        assert!(ok && !out.contains("intruder"), "{out}");
    }

    // Deleting the pod leaves nothing in containerd.
    let (ok, _, err) = ctl(&admin, &["delete", "pod", "web"]);
    assert!(ok, "{err}");
    until("the pod gone from containerd", || {
        let sandboxes = runtime
            .block_on(cri.sandboxes(edged::spec::POD_UID, &uid))
            .ok()?;
        (sandboxes.is_empty() && containers(&runtime, &cri, &uid).is_empty()).then_some(())
    });
    drop(mapper);
    edge.stop();
    cloud.stop();
}

/// Dials the cloud with the `intruder`'s certificate, claiming to be
/// `victim`, as edgehub would; returns once the attempt was made.
fn forged_link(intruder_dir: &str, hub: &str, transport: &str, victim: &str) {
    use hub::certs::NodeCredentials;
    use transports::{DialOptions, TransportKind, tls};
    let credentials = NodeCredentials::load(&PathBuf::from(intruder_dir).join("pki"))
        .expect("readable")
        .expect("joined");
    let (kind, dialect) = match transport {
        "kubeedge" => (TransportKind::WebSocket, hub::Dialect::KubeEdge),
        other => (other.parse().expect("transport"), hub::Dialect::Native),
    };
    let identity = credentials.reloadable().expect("identity");
    let dial = DialOptions::new(hub, "localhost").with_tls(
        tls::client_config_reloadable(std::slice::from_ref(&credentials.ca), identity)
            .expect("tls"),
    );
    actix::System::new().block_on(async move {
        let hive = beehive::Hive::new("intruder", beehive::HiveConfig::default());
        let config = hub::EdgeHubConfig {
            reconnect_initial: Duration::from_millis(50),
            dialect,
            ..hub::EdgeHubConfig::new(victim, kind, dial)
        };
        let handle = hub::EdgeHub::start(&hive, config).expect("edgehub");
        let stats = handle.stats.clone();
        // Two attempts made; none may succeed.
        let attempted = stats
            .changes
            .wait_for(Duration::from_secs(30), || {
                stats
                    .dial_failures
                    .load(std::sync::atomic::Ordering::Relaxed)
                    + stats.connects.load(std::sync::atomic::Ordering::Relaxed)
                    >= 2
            })
            .await;
        assert!(attempted, "the intruder never tried");
        let _ = hive.shutdown().await;
    });
}
