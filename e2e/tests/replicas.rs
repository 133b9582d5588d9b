//! Two cloudcore replicas on one etcd cluster (three real members), as
//! separate processes: they share the desired state (what one's admin API
//! applies, the other's reads), an edge knows both addresses, and each
//! node is served by one replica at a time under a claim. When the
//! replica it is linked to is SIGKILLed, the edge goes on with the other
//! once the claim ends, keeping everything it acknowledged; a replica
//! frozen past its claim (SIGSTOP) gives the node up when it wakes and
//! writes nothing of it. The edge's pods are removed from containerd when
//! a test ends, passed or failed (its test node).

use std::time::Duration;

use edged::testing::TestNode;
use etcd::testing::Cluster;
use support::{
    Process, cloudcore_token, cri_socket, ctl, edgecore_join, free_address, join_node, share_ca,
    start_cloudcore, start_edgecore, tempfile_dir, test_node, until,
};

mod support;

/// A replica's process and its addresses.
struct Replica {
    process: Process,
    hub: String,
    admin: String,
    metrics: String,
}

/// A dead replica's nodes wait this long for another.
const CLAIM_TTL_SECS: u64 = 3;

fn replica(dir: &str, etcd: &str, name: &str, ttl_secs: u64) -> (Replica, String) {
    let (hub, certs, admin) = (free_address(), free_address(), free_address());
    let metrics = free_address();
    let ttl = ttl_secs.to_string();
    let process = start_cloudcore(
        dir,
        &hub,
        &certs,
        &[
            "--admin",
            &admin,
            "--admin-insecure",
            "--metrics",
            &metrics,
            "--keepalive-secs",
            "2",
            "--etcd",
            etcd,
            "--replica",
            name,
            "--claim-ttl-secs",
            &ttl,
        ],
    );
    process.wait_for("certificate endpoints ready", Duration::from_secs(30));
    (
        Replica {
            process,
            hub,
            admin,
            metrics,
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

/// Three etcd members, replicas a and b (one CA), and an edge that
/// knows both addresses, linked to a.
struct Ha {
    runtime: tokio::runtime::Runtime,
    cluster: Cluster,
    a: Replica,
    b: Replica,
    edge: Process,
    metaserver: String,
    dir: String,
    /// The edge's node, its own to each test (edged removes pods of its
    /// node it does not know). Last: dropped after the edge, it removes
    /// the node's pods.
    node: TestNode,
}

fn start_ha(name: &str) -> Ha {
    start_ha_with(name, CLAIM_TTL_SECS)
}

/// [`start_ha`] with claims that last `ttl_secs` when not given up.
fn start_ha_with(name: &str, ttl_secs: u64) -> Ha {
    // Declared first: if the start fails, dropped after the edge.
    let node = test_node(name);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let cluster = runtime.block_on(Cluster::start(3));
    let etcd = cluster.endpoints().join(",");
    let dir = tempfile_dir(name);
    let (a_dir, b_dir, edge_dir) = (
        format!("{dir}/a"),
        format!("{dir}/b"),
        format!("{dir}/edge"),
    );

    // Replica a makes the CA; replica b is given it (one CA for the cloud).
    let (a, certs) = replica(&a_dir, &etcd, "a", ttl_secs);
    share_ca(&a_dir, &b_dir);
    let (b, _) = replica(&b_dir, &etcd, "b", ttl_secs);

    join_node(&a_dir, &certs, node.name(), &edge_dir);
    let metaserver = free_address();
    let socket = cri_socket().display().to_string();
    let edge = start_edgecore(
        &edge_dir,
        &format!("{},{}", a.hub, b.hub),
        &[
            "--metaserver",
            &metaserver,
            "--keepalive-secs",
            "2",
            "--cri-socket",
            &socket,
        ],
    );
    a.process.wait_for(
        &format!("node connected node={node}"),
        Duration::from_secs(30),
    );
    edge.wait_for("metaserver ready", Duration::from_secs(30));
    Ha {
        runtime,
        cluster,
        a,
        b,
        edge,
        metaserver,
        dir,
        node,
    }
}

impl Ha {
    /// The names of the pods the edge holds.
    fn held(&self) -> Vec<String> {
        let edge_api = cloud::AdminClient::new(&self.metaserver);
        let held = self
            .runtime
            .block_on(edge_api.get("/api/v1/namespaces/default/pods"))
            .expect("the edge's pods");
        let mut held: Vec<String> = held["items"]
            .as_array()
            .expect("a list")
            .iter()
            .filter_map(|p| p["metadata"]["name"].as_str().map(str::to_owned))
            .collect();
        held.sort_unstable();
        held
    }

    /// Waits until the edge holds `name` (its own API, watched).
    fn arrives(
        &self,
        events: &mut futures_util::stream::BoxStream<
            'static,
            Result<serde_json::Value, cloud::admin_client::ClientError>,
        >,
        name: &str,
    ) {
        use futures_util::StreamExt;
        loop {
            let event = self
                .runtime
                .block_on(async {
                    tokio::time::timeout(Duration::from_secs(60), events.next()).await
                })
                .unwrap_or_else(|_| panic!("{name} at the edge in time"))
                .expect("the watch goes on")
                .expect("json");
            if event["object"]["metadata"]["name"] == name {
                return;
            }
        }
    }

    fn watch_edge(
        &self,
    ) -> futures_util::stream::BoxStream<
        'static,
        Result<serde_json::Value, cloud::admin_client::ClientError>,
    > {
        let edge_api = cloud::AdminClient::new(&self.metaserver);
        self.runtime
            .block_on(edge_api.watch("/api/v1/namespaces/default/pods"))
            .expect("watch the edge's pods")
    }

    /// Stops the edge, then both replicas (each must exit cleanly on
    /// SIGTERM), then etcd.
    fn stop(self) {
        let Ha {
            edge,
            a,
            b,
            cluster,
            ..
        } = self;
        edge.stop();
        a.process.stop();
        b.process.stop();
        drop(cluster);
    }

    /// The Ready condition of the node as the shared desired state has it.
    fn ready(&self, admin: &str) -> Option<String> {
        node_ready(admin, self.node.name())
    }
}

/// The Ready condition of `node`, read through `admin`.
fn node_ready(admin: &str, node: &str) -> Option<String> {
    let (ok, out, _) = ctl(admin, &["get", "node", node, "-o", "json"]);
    let node: serde_json::Value = ok.then(|| serde_json::from_str(&out).ok()).flatten()?;
    node["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == "Ready")?["status"]
        .as_str()
        .map(str::to_owned)
}

#[test]
fn replicas_share_the_desired_state_and_an_edge_fails_over_to_the_survivor() {
    let ha = start_ha("replicas-kill");
    let node = ha.node.name().to_owned();
    let mut events = ha.watch_edge();

    // Applied through a, read through b: one desired state.
    apply(&ha.a.admin, &ha.dir, "before", &pod("before", &node));
    ha.arrives(&mut events, "before");
    // b reads from its own mirror of etcd, as an API server reads from its
    // watch cache: it has a's write once its watch brought it (it failed
    // once, in a full run, when b was asked the moment the edge had it).
    until("replica b reads what a applied", || {
        let (ok, out, err) = ctl(&ha.b.admin, &["get", "pods"]);
        assert!(ok, "replica b lists pods: {err}");
        out.contains("before").then_some(())
    });

    // a dies; once its claim ends with its lease, the edge goes on with b.
    ha.a.process.signal("-KILL");
    let killed = std::time::Instant::now();
    ha.b.process.wait_for(
        &format!("node connected node={node}"),
        Duration::from_secs(60),
    );
    let failover = killed.elapsed();
    println!("failover: the edge linked to replica b {failover:?} after a was killed");
    // The claim's lease, then the edge's backoff (at most a few seconds
    // by then) and a generous allowance for a loaded machine.
    assert!(
        failover < Duration::from_secs(CLAIM_TTL_SECS + 15),
        "{failover:?}"
    );
    apply(&ha.b.admin, &ha.dir, "after", &pod("after", &node));
    ha.arrives(&mut events, "after");
    // Nothing the edge acknowledged from a is gone.
    assert_eq!(ha.held(), ["after", "before"]);
    assert_eq!(ha.ready(&ha.b.admin).as_deref(), Some("True"));
    // b's metrics say it holds the node now.
    let client = cloud::AdminClient::new(&ha.b.metrics);
    let (_, body) = ha
        .runtime
        .block_on(client.raw(hyper::Method::GET, "/metrics", None))
        .expect("metrics");
    let page = String::from_utf8_lossy(&body);
    assert!(page.contains("edgehive_replica_nodes_held 1"), "{page}");
    assert!(
        page.contains("edgehive_replica_claims_taken_total 1"),
        "{page}"
    );
    // etcd's latency, as b's lease renewals measure it.
    let renewals: u64 = page
        .lines()
        .find_map(|line| line.strip_prefix("edgehive_replica_engine_renewals_total "))
        .and_then(|value| value.trim().parse().ok())
        .unwrap_or(0);
    assert!(renewals > 0, "{page}");
    assert!(
        page.contains("edgehive_replica_engine_renewal_microseconds_total"),
        "{page}"
    );
    // b sent the edge what it lacked, not what it held already from a.
    assert!(page.contains("edgehive_cloudhub_acked_total 1\n"), "{page}");
    // An edgehive edge reports what it holds: no delivery cursor for it.
    assert!(
        page.contains("edgehive_replica_cursor_writes_total 0\n"),
        "{page}"
    );
    let Ha {
        edge, b, cluster, ..
    } = ha;
    // The edge goes away cleanly: b, which served it, marks its link down
    // (Ready Unknown, as the kubelet's node controller would), whether its
    // write comes before the claim is given up or after (then etcd checks
    // that no replica holds one).
    edge.stop();
    until("the node's link down in the shared state", || {
        (node_ready(&b.admin, &node).as_deref() == Some("Unknown")).then_some(())
    });
    b.process.stop();
    drop(cluster);
}

/// A replica frozen past its claim (SIGSTOP) loses the node to the other;
/// woken (SIGCONT), it gives the node up and says nothing of it.
#[test]
fn a_frozen_replica_loses_its_node_and_says_nothing_of_it_after() {
    let ha = start_ha("replicas-stop");
    let node = ha.node.name().to_owned();
    let mut events = ha.watch_edge();
    ha.a.process.signal("-STOP");
    ha.b.process.wait_for(
        &format!("node connected node={node}"),
        Duration::from_secs(60),
    );
    apply(
        &ha.b.admin,
        &ha.dir,
        "served-by-b",
        &pod("served-by-b", &node),
    );
    ha.arrives(&mut events, "served-by-b");

    ha.a.process.signal("-CONT");
    // a lets the node go: its lease is no longer trusted (claims lost),
    // or its dead link to the node ended first (the claim given up).
    let disconnected = format!("node disconnected node={node}");
    ha.a.process
        .wait_for_any(&["claims lost", &disconnected], Duration::from_secs(30));
    // What a's controller does next comes after its node events: a pod
    // applied through a reaches the edge (through b) only after them.
    apply(
        &ha.a.admin,
        &ha.dir,
        "after-wake",
        &pod("after-wake", &node),
    );
    ha.arrives(&mut events, "after-wake");
    assert_eq!(
        ha.ready(&ha.b.admin).as_deref(),
        Some("True"),
        "a wrote nothing of the node"
    );
    assert_eq!(ha.held(), ["after-wake", "served-by-b"]);
    ha.stop();
}

/// Two of three etcd members stopped: applies fail with a clear error, the
/// edge keeps what it has; when the quorum returns, everything resumes.
#[test]
fn without_etcds_quorum_applies_fail_and_the_edge_keeps_what_it_has() {
    let mut ha = start_ha("replicas-quorum");
    let node = ha.node.name().to_owned();
    let mut events = ha.watch_edge();
    apply(&ha.a.admin, &ha.dir, "kept", &pod("kept", &node));
    ha.arrives(&mut events, "kept");

    ha.cluster.kill(1);
    ha.cluster.kill(2);
    let path = format!("{}/refused.yaml", ha.dir);
    std::fs::write(&path, pod("refused", &node)).expect("manifest");
    let (ok, out, err) = ctl(&ha.a.admin, &["apply", "-f", &path]);
    assert!(!ok, "no apply without a quorum: {out}");
    assert!(err.contains("etcd"), "the error names etcd: {err}");
    println!("apply without a quorum: {}", err.trim());
    // The replicas give their nodes up (no trusted lease); the edge runs
    // on with what it holds.
    ha.a.process
        .wait_for("claims lost", Duration::from_secs(30));
    assert_eq!(ha.held(), ["kept"]);

    ha.cluster.restart(1);
    ha.cluster.restart(2);
    ha.runtime.block_on(ha.cluster.wait_ready());
    apply(&ha.a.admin, &ha.dir, "resumed", &pod("resumed", &node));
    ha.arrives(&mut events, "resumed");
    // The refused apply timed out in etcd: its outcome was unknown, and it
    // may have taken effect once the quorum returned (as with any etcd
    // client). What the edge held stays; what came after arrives.
    let held = ha.held();
    assert!(
        held.contains(&"kept".to_owned()) && held.contains(&"resumed".to_owned()),
        "{held:?}"
    );
    ha.stop();
}

/// A replica told to stop (SIGTERM) hands its node over before it exits:
/// the other serves the edge long before the claim's lease could end.
#[test]
fn a_replica_told_to_stop_hands_its_node_over() {
    // Only a hand-over lets b serve the node within a minute.
    let mut ha = start_ha_with("replicas-term", 60);
    let node = ha.node.name().to_owned();
    let mut events = ha.watch_edge();
    apply(&ha.a.admin, &ha.dir, "before", &pod("before", &node));
    ha.arrives(&mut events, "before");
    let stopping = std::time::Instant::now();
    ha.a.process.terminate();
    ha.a.process
        .wait_for("handing every node over", Duration::from_secs(5));
    ha.b.process.wait_for(
        &format!("node connected node={node}"),
        Duration::from_secs(30),
    );
    println!(
        "hand-over: the edge linked to replica b {:?} after a was told to stop",
        stopping.elapsed()
    );
    apply(&ha.b.admin, &ha.dir, "after", &pod("after", &node));
    ha.arrives(&mut events, "after");
    assert_eq!(ha.held(), ["after", "before"]);
    ha.stop();
}

/// A counter or gauge from a replica's `/metrics`.
fn metric(ha: &Ha, replica: &Replica, name: &str) -> u64 {
    let client = cloud::AdminClient::new(&replica.metrics);
    let (_, body) = ha
        .runtime
        .block_on(client.raw(hyper::Method::GET, "/metrics", None))
        .expect("metrics");
    String::from_utf8_lossy(&body)
        .lines()
        .find_map(|line| line.strip_prefix(&format!("{name} ")))
        .and_then(|value| value.trim().parse().ok())
        .unwrap_or(0)
}

/// One etcd member SIGKILLed, the one every client asks first: nothing is
/// interrupted. Applies go on, the edge stays linked, and the replicas
/// renew their leases on the other members without losing a claim.
#[test]
fn an_etcd_member_killed_interrupts_nothing() {
    let mut ha = start_ha("replicas-member");
    let node = ha.node.name().to_owned();
    let mut events = ha.watch_edge();
    ha.cluster.kill(0);
    apply(&ha.a.admin, &ha.dir, "during", &pod("during", &node));
    ha.arrives(&mut events, "during");
    let renewed = metric(&ha, &ha.a, "edgehive_replica_engine_renewals_total");
    until("three more renewals of a's lease", || {
        (metric(&ha, &ha.a, "edgehive_replica_engine_renewals_total") >= renewed + 3).then_some(())
    });
    assert_eq!(metric(&ha, &ha.a, "edgehive_replica_claims_lost_total"), 0);
    assert_eq!(metric(&ha, &ha.a, "edgehive_replica_nodes_held"), 1);
    assert_eq!(ha.held(), ["during"]);
    ha.stop();
}

/// A replica dies and its edge with it, before the edge could link to
/// the other: the Node, shown linked by the dead replica, is served by
/// none. Once the dead replica's claim has ended, the survivor marks it
/// unreachable (Ready Unknown, its link condition False), as the
/// kubelet's node controller marks a node that stopped reporting.
#[test]
fn a_node_left_by_a_dead_replica_that_never_links_again_is_marked_unreachable() {
    let ha = start_ha("replicas-orphan");
    let node = ha.node.name().to_owned();
    let mut events = ha.watch_edge();
    apply(&ha.a.admin, &ha.dir, "before", &pod("before", &node));
    ha.arrives(&mut events, "before");
    until("b sees the node Ready", || {
        (ha.ready(&ha.b.admin).as_deref() == Some("True")).then_some(())
    });
    let Ha {
        edge,
        a,
        b,
        cluster,
        runtime,
        ..
    } = ha;
    // a first (it cannot mark the link down), then the edge before a's
    // claim ends (b refuses it until then).
    a.process.signal("-KILL");
    edge.signal("-KILL");
    let killed = std::time::Instant::now();
    b.process.wait_for(
        &format!("node served by no replica marked unreachable node={node}"),
        Duration::from_secs(60),
    );
    println!(
        "orphan: node marked unreachable {:?} after its replica and edge were killed",
        killed.elapsed()
    );
    let (ok, out, err) = ctl(&b.admin, &["get", "node", &node, "-o", "json"]);
    assert!(ok, "{err}");
    let node: serde_json::Value = serde_json::from_str(&out).expect("json");
    let status_of = |kind: &str| {
        node["status"]["conditions"]
            .as_array()
            .and_then(|c| c.iter().find(|c| c["type"] == kind))
            .and_then(|c| c["status"].as_str())
            .map(str::to_owned)
    };
    assert_eq!(status_of("Ready").as_deref(), Some("Unknown"), "{out}");
    assert_eq!(status_of("EdgeLink").as_deref(), Some("False"), "{out}");
    b.process.stop();
    drop((cluster, runtime));
}

/// Join tokens live with the shared desired state: a single-use token
/// presented to both replicas at once joins once; a token revoked through
/// one replica is refused by the other; a node deleted through one has its
/// certificate refused by the other.
#[test]
fn tokens_and_revocations_hold_across_replicas() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let cluster = runtime.block_on(Cluster::start(1));
    let etcd = cluster.endpoints().join(",");
    let dir = tempfile_dir("replica-tokens");
    let (a_dir, b_dir) = (format!("{dir}/a"), format!("{dir}/b"));
    let (a, a_certs) = replica(&a_dir, &etcd, "a", CLAIM_TTL_SECS);
    share_ca(&a_dir, &b_dir);
    let (b, b_certs) = replica(&b_dir, &etcd, "b", CLAIM_TTL_SECS);

    // One single-use token, presented to a and to b at the same time.
    let (ok, single, err) = cloudcore_token(
        &a_dir,
        Some(&a.admin),
        &[
            "create",
            "--node",
            "edge-s",
            "--single-use",
            "--ttl-secs",
            "600",
        ],
    );
    assert!(ok, "{err}");
    let joins: Vec<_> = [(a_certs.clone(), "via-a"), (b_certs.clone(), "via-b")]
        .into_iter()
        .map(|(certs, name)| {
            let (single, edge_dir) = (single.clone(), format!("{dir}/{name}"));
            std::thread::spawn(move || (edgecore_join(&certs, &single, "edge-s", &edge_dir), name))
        })
        .collect();
    let results: Vec<((bool, String), &str)> = joins
        .into_iter()
        .map(|j| j.join().expect("a join"))
        .collect();
    let joined: Vec<&str> = results
        .iter()
        .filter(|((ok, _), _)| *ok)
        .map(|(_, n)| *n)
        .collect();
    assert_eq!(joined.len(), 1, "joined once: {results:?}");
    let refused = results
        .iter()
        .find(|((ok, _), _)| !ok)
        .expect("one refused");
    assert!(refused.0.1.contains("used already"), "{}", refused.0.1);
    let edge_dir = format!("{dir}/{}", joined[0]);

    // A token revoked through b is refused by a once a has heard of it.
    let (ok, revoked, _) = cloudcore_token(&a_dir, Some(&a.admin), &["create"]);
    assert!(ok);
    let (_, listed, _) = cloudcore_token(&a_dir, Some(&a.admin), &["list"]);
    let id = listed
        .lines()
        .find(|l| l.contains("<any>"))
        .and_then(|l| l.split_whitespace().next())
        .expect("the token's id")
        .to_owned();
    let (ok, out, err) = cloudcore_token(&b_dir, Some(&b.admin), &["delete", &id]);
    assert!(ok, "{err}");
    assert_eq!(out, format!("token {id} revoked"));
    until("a sees the revocation", || {
        let (_, listed, _) = cloudcore_token(&a_dir, Some(&a.admin), &["list"]);
        listed
            .lines()
            .any(|l| l.starts_with(&id) && l.ends_with("revoked"))
            .then_some(())
    });
    let (ok, err) = edgecore_join(&a_certs, &revoked, "edge-v", &format!("{dir}/v"));
    assert!(!ok);
    assert!(
        err.contains(&format!("join token {id} was revoked")),
        "{err}"
    );

    // edge-s's Node deleted through a: b refuses its certificate.
    let edge = start_edgecore(&edge_dir, &a.hub, &[]);
    a.process
        .wait_for("node connected node=edge-s", Duration::from_secs(30));
    until("edge-s's Node", || {
        let (ok, _, _) = ctl(&a.admin, &["get", "node", "edge-s"]);
        ok.then_some(())
    });
    edge.stop();
    let (ok, _, err) = ctl(&a.admin, &["delete", "node", "edge-s"]);
    assert!(ok, "{err}");
    until("b knows edge-s is revoked", || {
        let (_, listed, _) = cloudcore_token(&b_dir, Some(&b.admin), &["list"]);
        listed.contains("revoked node edge-s").then_some(())
    });
    let edge = start_edgecore(&edge_dir, &b.hub, &[]);
    let refused = b.process.wait_for("link refused", Duration::from_secs(30));
    assert!(refused.contains("node=edge-s"), "{refused}");
    assert!(refused.contains("was revoked"), "{refused}");
    drop(edge);
    drop(cluster);
}
