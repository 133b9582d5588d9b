//! Two cloudcore replicas on one etcd cluster (three real members), as
//! separate processes: they share the desired state (what one's admin API
//! applies, the other's reads), an edge knows both addresses, and when the
//! replica it is linked to is SIGKILLed it goes on with the other, keeping
//! everything it acknowledged and getting what is applied next.
#![cfg(feature = "cli")]

use std::time::Duration;

use etcd::testing::Cluster;
use support::{Process, ctl, free_address, join_node, tempfile_dir};

mod support;

/// A replica's process and its addresses.
struct Replica {
    process: Process,
    hub: String,
    admin: String,
}

fn replica(dir: &str, etcd: &str) -> (Replica, String) {
    let (hub, certs, admin) = (free_address(), free_address(), free_address());
    let process = Process::start(
        env!("CARGO_BIN_EXE_cloudcore"),
        &[
            "--data-dir",
            dir,
            "run",
            "--ws",
            &hub,
            "--certs",
            &certs,
            "--admin",
            &admin,
            "--metrics",
            "off",
            "--keepalive-secs",
            "2",
            "--etcd",
            etcd,
        ],
    );
    process.wait_for("certificate endpoints ready", Duration::from_secs(30));
    (
        Replica {
            process,
            hub,
            admin,
        },
        certs,
    )
}

fn pod(name: &str, node: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  nodeName: {node}\n  containers:\n  - name: c\n    image: 127.0.0.1:5000/busybox:latest\n    command: [sleep, '3600']\n"
    )
}

/// Applies `manifest` through `admin`.
fn apply(admin: &str, dir: &str, name: &str, manifest: &str) {
    let path = format!("{dir}/{name}.yaml");
    std::fs::write(&path, manifest).expect("manifest");
    let (ok, out, err) = ctl(admin, &["apply", "-f", &path]);
    assert!(ok, "apply through {admin}: {err}");
    assert_eq!(out, format!("pod/{name} created\n"));
}

#[test]
fn replicas_share_the_desired_state_and_an_edge_fails_over_to_the_survivor() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let cluster = runtime.block_on(Cluster::start(3));
    let etcd = cluster.endpoints().join(",");
    let dir = tempfile_dir("replicas");
    let (a_dir, b_dir, edge_dir) = (
        format!("{dir}/a"),
        format!("{dir}/b"),
        format!("{dir}/edge"),
    );

    // Replica a makes the CA; replica b is given it (one CA for the cloud).
    let (a, certs) = replica(&a_dir, &etcd);
    std::fs::create_dir_all(&b_dir).expect("b's data dir");
    let copied = std::process::Command::new("cp")
        .args(["-r", &format!("{a_dir}/ca"), &format!("{b_dir}/ca")])
        .status()
        .expect("cp");
    assert!(copied.success());
    let (b, _) = replica(&b_dir, &etcd);

    let node = "edge-ha";
    join_node(&a_dir, &certs, node, &edge_dir);
    let metaserver = free_address();
    let edge = Process::start(
        env!("CARGO_BIN_EXE_edgecore"),
        &[
            "--data-dir",
            &edge_dir,
            "run",
            "--cloud",
            &format!("{},{}", a.hub, b.hub),
            "--metaserver",
            &metaserver,
            "--edged-server",
            "127.0.0.1:0",
            "--mqtt-broker",
            "127.0.0.1:0",
            "--metrics",
            "off",
            "--keepalive-secs",
            "2",
        ],
    );
    a.process.wait_for(
        &format!("node connected node={node}"),
        Duration::from_secs(30),
    );
    edge.wait_for("metaserver ready", Duration::from_secs(30));

    // Watch the edge's own API, so each pod's arrival is an event.
    let edge_api = cloud::AdminClient::new(&metaserver);
    let mut events = runtime
        .block_on(edge_api.watch("/api/v1/namespaces/default/pods"))
        .expect("watch the edge's pods");
    let mut arrived = |what: &str| -> String {
        use futures_util::StreamExt;
        let event = runtime
            .block_on(async { tokio::time::timeout(Duration::from_secs(60), events.next()).await })
            .unwrap_or_else(|_| panic!("{what} in time"))
            .expect("the watch goes on")
            .expect("json");
        event["object"]["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    };

    // Applied through a, read through b: one desired state.
    apply(&a.admin, &dir, "before", &pod("before", node));
    assert_eq!(arrived("the first pod at the edge"), "before");
    let (ok, out, _) = ctl(&b.admin, &["get", "pods"]);
    assert!(
        ok && out.contains("before"),
        "replica b reads what a applied: {out}"
    );

    // a dies; the edge goes on with b.
    a.process.signal("-KILL");
    b.process.wait_for(
        &format!("node connected node={node}"),
        Duration::from_secs(60),
    );
    apply(&b.admin, &dir, "after", &pod("after", node));
    let mut names = vec![arrived("the second pod at the edge")];
    while names.last().map(String::as_str) != Some("after") {
        // b brings the edge in step first (what it holds stays as it is).
        names.push(arrived("the second pod at the edge"));
    }
    // Nothing the edge acknowledged from a is gone.
    let held = runtime
        .block_on(edge_api.get("/api/v1/namespaces/default/pods"))
        .expect("the edge's pods");
    let mut held: Vec<&str> = held["items"]
        .as_array()
        .expect("a list")
        .iter()
        .filter_map(|p| p["metadata"]["name"].as_str())
        .collect();
    held.sort_unstable();
    assert_eq!(held, ["after", "before"]);

    edge.stop();
    b.process.stop();
    drop(cluster);
}
