//! cloudcore, edgecore and edgehivectl as separate processes: join with a
//! token, connect with mutual TLS, a frozen edgecore (SIGSTOP) dropped by
//! the cloud within two keepalive intervals, reconnect after SIGCONT, clean
//! SIGTERM; a manifest applied with edgehivectl reaching the edge's
//! MetaServer, and its deletion too (the pod removed from containerd when
//! the test ends, passed or failed: its test node).

use std::time::{Duration, Instant};

use support::{
    CloudcoreRun, EdgecoreRun, Process, cri_socket, ctl, free_address, join_node, tempfile_dir,
    test_node, until,
};

mod support;

/// The keepalive interval where a frozen edge must be noticed quickly.
const KEEPALIVE_SECS: u64 = 2;
/// Elsewhere: long enough that a loaded machine's stalls never drop a link.
const CALM_KEEPALIVE_SECS: u64 = 10;

/// A cloud and a joined edge, each its own process.
struct Pair {
    cloud: Process,
    /// How cloudcore was started, to start it again.
    cloud_run: CloudcoreRun,
    edge: Process,
    admin: String,
    metaserver: String,
    /// Where each side serves /metrics.
    cloud_metrics: String,
    edge_metrics: String,
    dir: String,
}

fn start_pair(name: &str, node: &str, keepalive_secs: u64) -> Pair {
    let dir = tempfile_dir(name);
    let cloud_dir = format!("{dir}/cloud");
    let edge_dir = format!("{dir}/edge");
    let hub = free_address();
    let certs = free_address();
    let admin = free_address();
    let metaserver = free_address();
    let cloud_metrics = free_address();
    let edge_metrics = free_address();
    let keepalive = keepalive_secs.to_string();
    let socket = cri_socket().display().to_string();

    let cloud_run = CloudcoreRun::new(&cloud_dir, &certs)
        .hub(&hub)
        .with("--admin", &admin)
        .flag("--admin-insecure")
        .with("--metrics", &cloud_metrics)
        .with("--keepalive-secs", &keepalive);
    let cloud = cloud_run.start();
    cloud.wait_for("certificate endpoints ready", Duration::from_secs(30));
    join_node(&cloud_dir, &certs, node, &edge_dir);

    // From now on edgecore runs without the token.
    let edge = EdgecoreRun::new(&edge_dir, &hub)
        .with("--metaserver", &metaserver)
        .with("--metrics", &edge_metrics)
        .with("--keepalive-secs", &keepalive)
        .with("--cri-socket", &socket)
        .start();
    cloud.wait_for(
        &format!("node connected node={node}"),
        Duration::from_secs(30),
    );
    edge.wait_for("metaserver ready", Duration::from_secs(30));
    Pair {
        cloud,
        cloud_run,
        edge,
        admin,
        metaserver,
        cloud_metrics,
        edge_metrics,
        dir,
    }
}

#[test]
fn join_connect_and_a_frozen_edge_is_dropped_then_returns() {
    let Pair { cloud, edge, .. } = start_pair("frozen", "edge-frozen", KEEPALIVE_SECS);

    edge.signal("-STOP");
    let frozen = Instant::now();
    cloud.wait_for("no keepalive from the node", Duration::from_secs(30));
    let noticed = frozen.elapsed();
    assert!(
        // Two intervals, and two seconds for a loaded machine (the
        // default interval is 15 s).
        noticed <= Duration::from_secs(2 * KEEPALIVE_SECS + 2),
        "half-open link noticed after {noticed:?}"
    );
    edge.signal("-CONT");
    cloud.wait_for(
        "node connected node=edge-frozen session=2",
        Duration::from_secs(30),
    );

    edge.stop();
    cloud.stop();
}

#[test]
fn a_manifest_applied_with_edgehivectl_runs_on_the_edges_containerd() {
    use futures_util::StreamExt;
    // Declared first, dropped last: after the edge, its pods are removed.
    let node_guard = test_node("ctl");
    let node = node_guard.name();
    let pair = start_pair("ctl", node, CALM_KEEPALIVE_SECS);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    // Watch the edge's own API first, so the pod's arrival is an event.
    let metaserver = cloud::AdminClient::new(&pair.metaserver);
    let mut events = runtime
        .block_on(metaserver.watch("/api/v1/namespaces/default/pods"))
        .expect("watch");

    let manifest = format!("{}/web.yaml", pair.dir);
    std::fs::write(
        &manifest,
        format!("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: web-conf\ndata:\n  greeting: hello\n---\napiVersion: v1\nkind: Pod\nmetadata:\n  name: web\nspec:\n  nodeName: {node}\n  terminationGracePeriodSeconds: 5\n  containers:\n  - name: web\n    image: 127.0.0.1:5000/busybox:latest\n    command: [sh, -c, \"echo $greeting from the pod; trap 'exit 0' TERM; while true; do sleep 1; done\"]\n    envFrom:\n    - configMapRef:\n        name: web-conf\n"),
    )
    .expect("manifest");
    let (ok, out, err) = ctl(&pair.admin, &["apply", "-f", &manifest]);
    assert!(ok, "{err}");
    assert_eq!(out, "configmap/web-conf created\npod/web created\n");

    let next = |events: &mut futures_util::stream::BoxStream<'static, _>| {
        runtime
            .block_on(async { tokio::time::timeout(Duration::from_secs(30), events.next()).await })
            .expect("an event in time")
            .expect("the watch goes on")
    };
    let event: serde_json::Value = next(&mut events).expect("json");
    assert_eq!(event["type"], "ADDED");
    assert_eq!(event["object"]["spec"]["nodeName"], node);
    let cm = runtime
        .block_on(metaserver.get("/api/v1/namespaces/default/configmaps/web-conf"))
        .expect("the configmap came with the pod");
    assert_eq!(cm["data"]["greeting"], "hello");

    // The pod runs on containerd at the edge, and the cloud sees it run.
    let pod: serde_json::Value = until("the pod Running in the cloud's view", || {
        let (ok, out, _) = ctl(&pair.admin, &["get", "pod", "web", "-o", "json"]);
        let pod: serde_json::Value = serde_json::from_str(&out).ok()?;
        (ok && pod["status"]["phase"] == "Running").then_some(pod)
    });
    let ip = pod["status"]["podIP"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(ip.starts_with("10.88."), "pod IP {ip:?}");
    let uid = pod["metadata"]["uid"].as_str().expect("uid").to_owned();
    let log = format!("{}/edge/edged/pods/{uid}/logs/web/0.log", pair.dir);
    until(
        "the pod's output, with the configmap's value, in its log",
        || {
            std::fs::read_to_string(&log)
                .ok()
                .filter(|text| text.contains("stdout F hello from the pod"))
        },
    );
    let (ok, out, _) = ctl(&pair.admin, &["get", "pods", "-o", "wide"]);
    assert!(ok);
    let row = out.lines().nth(1).unwrap_or_default().to_owned();
    assert!(
        out.starts_with("NAME")
            && row.starts_with("web ")
            && row.contains("1/1")
            && row.contains("Running")
            && row.ends_with(node),
        "{out}"
    );
    // Both sides' metrics say so.
    let scrape = |address: &str| {
        let client = cloud::AdminClient::new(address);
        let (status, body) = runtime
            .block_on(client.raw(hyper::Method::GET, "/metrics", None))
            .expect("metrics");
        assert_eq!(status, 200);
        String::from_utf8(body.to_vec()).expect("text")
    };
    let cloud_page = scrape(&pair.cloud_metrics);
    for line in [
        "edgehive_cloudhub_nodes_connected 1\n",
        "edgehive_pods{phase=\"Running\"} 1\n",
        "edgehive_module_messages_total{module=\"edgecontroller\",operation=\"update\"}",
        "edgehive_cloudhub_acks_pending ",
    ] {
        assert!(cloud_page.contains(line), "{line:?} not in:\n{cloud_page}");
    }
    let edge_page = until("the edge's metrics show the pod Running", || {
        let page = scrape(&pair.edge_metrics);
        page.contains("edgehive_pods{phase=\"Running\"} 1\n")
            .then_some(page)
    });
    for line in [
        "edgehive_edgehub_connected 1\n",
        "edgehive_edgehub_reconnects_total 0\n",
        "edgehive_module_messages_total{module=\"metamanager\",operation=\"insert\"}",
        "edgehive_module_queue_depth{module=\"edged\"}",
    ] {
        assert!(edge_page.contains(line), "{line:?} not in:\n{edge_page}");
    }

    let (ok, out, _) = ctl(&pair.admin, &["get", "nodes"]);
    assert!(
        ok && out.contains(node) && out.contains("Ready") && out.contains("edgehive-"),
        "{out}"
    );
    let (ok, out, _) = ctl(&pair.admin, &["get", "cm", "-o", "yaml"]);
    assert!(
        ok && out.contains("kind: ConfigMapList") && out.contains("greeting: hello"),
        "{out}"
    );
    let (ok, out, _) = ctl(&pair.admin, &["describe", "pod", "web"]);
    assert!(
        ok && out.contains("Node:")
            && out.contains(node)
            && out.contains("State:")
            && out.contains("running"),
        "{out}"
    );

    // The server's refusal is shown as it is, and the exit status says so.
    let bad = format!("{}/bad.yaml", pair.dir);
    std::fs::write(&bad, "apiVersion: v1\nkind: Pod\nmetadata:\n  name: Bad\n").expect("bad");
    let (ok, _, err) = ctl(&pair.admin, &["apply", "-f", &bad]);
    assert!(!ok);
    assert!(
        err.starts_with("Error from server (Invalid):") && err.contains("metadata.name"),
        "{err}"
    );
    let (ok, _, err) = ctl(&pair.admin, &["get", "pod", "nope"]);
    assert!(!ok && err.contains("(NotFound)"), "{err}");

    let (ok, out, err) = ctl(&pair.admin, &["delete", "-f", &manifest]);
    assert!(ok, "{err}");
    assert_eq!(out, "configmap/web-conf deleted\npod/web deleted\n");
    // Status changes of the pod come as MODIFIED; then the deletion.
    let event: serde_json::Value = loop {
        let event: serde_json::Value = next(&mut events).expect("json");
        if event["type"] != "MODIFIED" {
            break event;
        }
    };
    assert_eq!(event["type"], "DELETED");
    assert_eq!(event["object"]["metadata"]["name"], "web");
    // edged tears the pod down: its directory goes last.
    let pod_dir = format!("{}/edge/edged/pods/{uid}", pair.dir);
    until("the pod torn down at the edge", || {
        (!std::path::Path::new(&pod_dir).exists()).then_some(())
    });

    pair.edge.stop();
    pair.cloud.stop();
}

/// The devices the edge's MetaServer holds in `default`.
fn held_devices(metaserver: &str) -> Option<std::collections::BTreeSet<String>> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(metaserver).ok()?;
    let request = "GET /apis/devices.kubeedge.io/v1beta1/namespaces/default/devices HTTP/1.0\r\nHost: edge\r\n\r\n";
    stream.write_all(request.as_bytes()).ok()?;
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    let body = answer.split_once("\r\n\r\n").map_or("", |(_, body)| body);
    let list: serde_json::Value = serde_json::from_str(body).ok()?;
    Some(
        list["items"]
            .as_array()?
            .iter()
            .filter_map(|d| d["metadata"]["name"].as_str().map(str::to_owned))
            .collect(),
    )
}

/// SIGTERM while applies stream in: the admin API stops taking requests
/// first, what it answered was queued for its node before cloudhub
/// stopped (no "cloudhub did not take a message" on the way down), and
/// every object answered 200 reaches the edge once cloudcore runs again.
#[test]
fn a_sigterm_during_a_write_storm_answers_only_what_was_queued() {
    let mut pair = start_pair("storm", "edge-storm", CALM_KEEPALIVE_SECS);
    let admin = pair.admin.clone();
    let (answered_tx, answered) = std::sync::mpsc::channel::<Result<String, String>>();
    let writer = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let client = cloud::AdminClient::new(&admin);
        for n in 0.. {
            let name = format!("storm-{n:05}");
            let manifest = format!(
                "apiVersion: devices.kubeedge.io/v1beta1\nkind: Device\nmetadata:\n  name: {name}\n  namespace: default\nspec:\n  nodeName: edge-storm\n  properties:\n  - name: value\n"
            );
            match runtime.block_on(client.apply(manifest.into_bytes())) {
                Ok(results) if results.results.len() == 1 => {
                    if answered_tx.send(Ok(name)).is_err() {
                        return;
                    }
                }
                Ok(results) => {
                    let _ = answered_tx.send(Err(format!("unexpected answer: {results:?}")));
                    return;
                }
                Err(err) => {
                    let _ = answered_tx.send(Err(err.to_string()));
                    return;
                }
            }
        }
    });
    // The storm under way, then SIGTERM in the middle of it.
    let mut applied = Vec::new();
    while applied.len() < 50 {
        match answered.recv_timeout(Duration::from_secs(30)) {
            Ok(Ok(name)) => applied.push(name),
            other => panic!("the storm stopped before SIGTERM: {other:?}"),
        }
    }
    pair.cloud.signal("-TERM");
    let refused = loop {
        match answered.recv_timeout(Duration::from_secs(30)) {
            Ok(Ok(name)) => applied.push(name),
            Ok(Err(reason)) => break reason,
            Err(err) => panic!("the writer never saw the cloud stop: {err}"),
        }
    };
    writer.join().expect("writer");
    pair.cloud.terminate();
    let lines = pair.cloud.take_lines();
    let dropped: Vec<&String> = lines
        .iter()
        .filter(|l| l.contains("did not take a message") || l.contains("stopped before queueing"))
        .collect();
    println!(
        "{} applies answered 200, then: {refused}; on the way down: {} messages refused",
        applied.len(),
        dropped.len()
    );
    assert!(dropped.is_empty(), "{dropped:#?}");

    // Started again: every object answered 200 reaches the edge.
    let cloud = pair.cloud_run.start();
    cloud.wait_for("node connected node=edge-storm", Duration::from_secs(60));
    let held = until("every answered device at the edge", || {
        let held = held_devices(&pair.metaserver)?;
        applied
            .iter()
            .all(|name| held.contains(name))
            .then_some(held)
    });
    assert!(held.len() >= applied.len());
    pair.cloud = cloud;
}
