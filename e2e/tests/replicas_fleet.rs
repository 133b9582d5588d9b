//! A fleet under load on three cloudcore replicas: three etcd members,
//! replicas a, b and c as separate processes (one CA), 50 edges, and 1,000
//! pods (20 per node) streaming down through the three admin APIs, each
//! created and updated again and again (an annotation `gen`: "1", "2",
//! ...), creations and updates interleaved throughout. Mid-stream one
//! replica is SIGKILLed; in the other test each replica in turn is stopped
//! (SIGTERM) and started again on its data dir and addresses. Asserted:
//! every applied object (an apply answered with success) ends up at its
//! edge at the generation last applied; nothing an edge stored (and so
//! acknowledged) is ever deleted there; no pod's versions or generations
//! at an edge ever go backwards; and, for the kill, the killed replica's
//! edges are all linked to the others within a bound (see
//! [`FAILOVER_BOUND`]). The replicas' logs and the edges' are left in the
//! test's directory (printed at the end).
//!
//! The edges are embedded in this process, not 50 `edgecore` processes:
//! each is the edge code edgecore runs to take objects from the cloud (its
//! own `Hive`, an `EdgeStore` on its own redb file, `MetaManager`, and
//! `EdgeHub` over TLS with a certificate got by the real join, the other
//! replicas as `alternates`), without edged, devicetwin or the eventbus,
//! which play no part in delivery. One actix thread runs all 50, where 50
//! edgecores would be some 50 processes and hundreds of threads on this
//! two-core machine, next to six servers; and each store's change feed
//! shows every version the edge commits, in commit order, with no
//! MetaServer watch in between.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use beehive::{Hive, HiveConfig};
use etcd::testing::Cluster;
use hub::{EdgeHub, EdgeHubConfig};
use meta::{EdgeStore, MetaManager, StoreChange};
use support::{
    CloudcoreRun, Process, cloudcore_token, free_address, share_ca, tempfile_dir, until,
};
use transports::{DialOptions, TransportKind, tls};

mod support;

/// Edges in the fleet.
const NODES: usize = 50;
/// Pods bound to each edge.
const PODS_PER_NODE: usize = 20;
/// Pods per apply (one multi-document manifest).
const CHUNK: usize = 10;
/// Concurrent appliers, spread over the replicas.
const APPLIERS: usize = 6;
/// A dead replica's nodes wait this long for another.
const CLAIM_TTL_SECS: u64 = 3;
/// Replicas' and edges' keepalive interval.
const KEEPALIVE_SECS: u64 = 2;
/// From the kill to the last of the killed replica's edges linked again,
/// at worst: the claim's lease (3 s, renewed three times per TTL, so it
/// ends 2-3 s after the kill), and half a second for etcd to notice; then
/// the edge's reconnect backoff, which doubles from 0.2 s (jittered to
/// 50-100 %) on every failed dial, refusals included, going round the
/// replicas. Its dials come 0.1-0.2, 0.3-0.6, 0.7-1.4, 1.5-3 and 3.1-6.2 s
/// after the loss, to c, a, b (dead), c, a for one of b's edges: usually
/// one after the claim's end takes it (measured: 3-6 s). At worst the
/// fifth comes just before that end, the sixth goes to the dead replica up
/// to 6.4 s later, and the seventh comes up to 12.8 s after that. Plus an
/// allowance of 7 s for a loaded two-core machine.
const FAILOVER_BOUND: Duration =
    Duration::from_millis(CLAIM_TTL_SECS * 1000 + 500 + 6_400 + 12_800 + 7_000);
/// Where the replicas keep their claims.
const CLAIMS: &str = "/edgehive/claims/";

fn node_name(n: usize) -> String {
    format!("edge-{n:02}")
}

// ----- the replicas -----

/// One cloudcore replica: its data dir and addresses, which stay the same
/// across restarts, and its process while it runs.
struct Replica {
    name: &'static str,
    dir: String,
    hub: String,
    certs: String,
    admin: String,
    metrics: String,
    process: Option<Process>,
    /// Log lines of its processes so far (written out at the end).
    logs: Vec<String>,
}

impl Replica {
    fn new(name: &'static str, dir: String) -> Replica {
        Replica {
            name,
            dir,
            hub: free_address(),
            certs: free_address(),
            admin: free_address(),
            metrics: free_address(),
            process: None,
            logs: Vec::new(),
        }
    }

    fn start(&mut self, etcd: &str) {
        let (ttl, keepalive) = (CLAIM_TTL_SECS.to_string(), KEEPALIVE_SECS.to_string());
        let process = CloudcoreRun::new(&self.dir, &self.certs)
            .hub(&self.hub)
            .with("--admin", &self.admin)
            .flag("--admin-insecure")
            .with("--metrics", &self.metrics)
            .with("--keepalive-secs", &keepalive)
            .with("--etcd", etcd)
            .with("--replica", self.name)
            .with("--claim-ttl-secs", &ttl)
            .start();
        let ready = process.wait_for("certificate endpoints ready", Duration::from_secs(30));
        self.logs.push(ready);
        self.process = Some(process);
    }

    fn keep_logs(&mut self) {
        if let Some(process) = &self.process {
            self.logs.extend(process.take_lines());
        }
    }

    /// SIGTERM, and a clean exit.
    fn stop(&mut self) {
        self.keep_logs();
        self.process.take().expect("running").stop();
        self.logs.push("---- stopped (SIGTERM) ----".to_owned());
    }

    /// SIGKILL.
    fn kill(&mut self) {
        self.process.as_ref().expect("running").signal("-KILL");
        self.keep_logs();
        self.process = None;
        self.logs.push("---- killed (SIGKILL) ----".to_owned());
    }
}

/// Three etcd members, three replicas (one CA), a fleet of edges.
struct Setup {
    runtime: tokio::runtime::Runtime,
    /// Kept for its life: etcd stops when it is dropped.
    _cluster: Cluster,
    etcd: String,
    /// A client of the cluster, for reading claims.
    client: etcd::Etcd,
    replicas: Vec<Replica>,
    fleet: Option<Fleet>,
    dir: String,
}

impl Setup {
    fn start(name: &str) -> Setup {
        let dir = tempfile_dir(name);
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        let cluster = runtime.block_on(Cluster::start(3));
        let etcd = cluster.endpoints().join(",");
        let client = {
            let _within = runtime.enter();
            cluster.client()
        };
        let mut replicas: Vec<Replica> = ["a", "b", "c"]
            .into_iter()
            .map(|name| Replica::new(name, format!("{dir}/{name}")))
            .collect();
        // a makes the CA; b and c are given it.
        replicas[0].start(&etcd);
        for replica in &mut replicas[1..] {
            share_ca(&format!("{dir}/a"), &replica.dir);
            replica.start(&etcd);
        }
        let (ok, token, err) = cloudcore_token(&replicas[0].dir, None, &["--ttl-secs", "600"]);
        assert!(ok, "cloudcore token failed: {err}");
        let hubs = replicas.iter().map(|r| r.hub.clone()).collect();
        let started = Instant::now();
        let fleet = Fleet::start(hubs, replicas[0].certs.clone(), token, &dir);
        let setup = Setup {
            runtime,
            _cluster: cluster,
            etcd,
            client,
            replicas,
            fleet: Some(fleet),
            dir,
        };
        setup.wait_settled("the fleet linked");
        println!(
            "{NODES} edges joined and linked in {:?}; claims per replica: {:?}",
            started.elapsed(),
            setup.claims_per_replica()
        );
        setup
    }

    fn fleet(&self) -> &Fleet {
        self.fleet.as_ref().expect("the fleet runs")
    }

    /// Which replica claims each node, as etcd has it.
    fn claims(&self) -> BTreeMap<String, String> {
        let (entries, _) = self
            .runtime
            .block_on(self.client.list(CLAIMS.as_bytes()))
            .expect("claims listed");
        entries
            .into_iter()
            .map(|entry| {
                let key = String::from_utf8_lossy(&entry.key).into_owned();
                let node = key.strip_prefix(CLAIMS).unwrap_or(&key).to_owned();
                (node, String::from_utf8_lossy(&entry.value).into_owned())
            })
            .collect()
    }

    fn claims_per_replica(&self) -> BTreeMap<String, usize> {
        let mut counts = BTreeMap::new();
        for replica in self.claims().into_values() {
            *counts.entry(replica).or_default() += 1;
        }
        counts
    }

    /// Waits until every edge is linked and every node is claimed by a
    /// replica that runs.
    fn wait_settled(&self, what: &str) {
        let running: Vec<&str> = self
            .replicas
            .iter()
            .filter(|r| r.process.is_some())
            .map(|r| r.name)
            .collect();
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let unlinked = self.fleet().unlinked();
            let claims = self.claims();
            let unclaimed: Vec<String> = (0..NODES)
                .map(node_name)
                .filter(|node| {
                    claims
                        .get(node)
                        .is_none_or(|replica| !running.contains(&replica.as_str()))
                })
                .collect();
            if unlinked.is_empty() && unclaimed.is_empty() {
                return;
            }
            // Says which, so a failure can be followed in the logs.
            assert!(
                Instant::now() < deadline,
                "never: {what}; not linked: {unlinked:?}; not claimed by a running replica: {unclaimed:?} (claims: {claims:?})"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn admins(&self) -> Vec<String> {
        self.replicas.iter().map(|r| r.admin.clone()).collect()
    }

    /// Waits until every applied pod is at its edge at the generation last
    /// applied, then checks everything the edges stored.
    fn check(&self, applied: &BTreeMap<String, Applied>) {
        let fleet = self.fleet();
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let missing = fleet.missing(applied);
            if missing.is_empty() {
                break;
            }
            if Instant::now() > deadline {
                let claims = self.claims();
                let shown: Vec<String> = missing
                    .iter()
                    .take(30)
                    .map(|(node, line)| {
                        format!("{line} (node {node} claimed by {:?})", claims.get(node))
                    })
                    .collect();
                panic!(
                    "{} applied objects never reached their edges as applied:\n{}",
                    missing.len(),
                    shown.join("\n")
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let problems = fleet.problems(applied);
        assert!(
            problems.is_empty(),
            "{} problems at the edges:\n{}",
            problems.len(),
            problems.join("\n")
        );
    }

    /// The edges leave, then the replicas stop (each must exit cleanly on
    /// SIGTERM), then etcd.
    fn stop(mut self) {
        if let Some(fleet) = self.fleet.take() {
            fleet.stop();
        }
        for replica in &mut self.replicas {
            if replica.process.is_some() {
                replica.stop();
            }
        }
    }
}

impl Drop for Setup {
    /// The replicas' logs go to files in the test's directory, whatever
    /// the outcome.
    fn drop(&mut self) {
        for replica in &mut self.replicas {
            replica.keep_logs();
            let path = format!("{}/{}.log", self.dir, replica.name);
            let _ = std::fs::write(&path, replica.logs.join("\n"));
        }
        println!(
            "logs: {dir}/a.log, b.log, c.log (replicas), {dir}/edges.log",
            dir = self.dir
        );
    }
}

// ----- the edges -----

/// One version of a pod an edge committed: its resource version and
/// generation (`None`: deleted).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stored {
    version: u64,
    generation: Option<u64>,
}

/// What the edges did, as they did it.
#[derive(Default)]
struct Seen {
    /// Per node, per pod: every version committed, in commit order.
    pods: BTreeMap<String, BTreeMap<String, Vec<Stored>>>,
    /// Per node: when its link came up (true) or went down (false).
    links: BTreeMap<String, Vec<(Instant, bool)>>,
    /// Anything unexpected: a pod of another node, an unreadable version,
    /// a change feed that fell behind.
    troubles: Vec<String>,
}

impl Seen {
    fn record(&mut self, node: &str, change: &StoreChange) {
        let Some(pod) = change.resource.strip_prefix("default/pod/") else {
            return;
        };
        let Ok(version) = change.record.version.parse::<u64>() else {
            self.troubles.push(format!(
                "{node}: {pod} stored at version {:?}",
                change.record.version
            ));
            return;
        };
        let object = change
            .record
            .object
            .as_ref()
            .map(|object| object.decode::<serde_json::Value>().expect("json"));
        let generation = match &object {
            None => None,
            Some(object) => {
                if object["spec"]["nodeName"] != node {
                    self.troubles.push(format!(
                        "{node}: holds {pod} bound to {}",
                        object["spec"]["nodeName"]
                    ));
                }
                let generation = object["metadata"]["annotations"]["gen"]
                    .as_str()
                    .and_then(|g| g.parse().ok());
                if generation.is_none() {
                    self.troubles
                        .push(format!("{node}: {pod} stored without a gen: {object}"));
                    return;
                }
                generation
            }
        };
        self.pods
            .entry(node.to_owned())
            .or_default()
            .entry(pod.to_owned())
            .or_default()
            .push(Stored {
                version,
                generation,
            });
    }
}

/// The fleet's edges, on their own actix thread.
struct Fleet {
    nodes: Vec<String>,
    seen: Arc<Mutex<Seen>>,
    stores: Vec<(String, EdgeStore)>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Fleet {
    /// Joins `NODES` edges with `token` at `certs` and links them; edge
    /// `n` dials replica `n % 3` first, the others after it.
    fn start(hubs: Vec<String>, certs: String, token: String, dir: &str) -> Fleet {
        let nodes: Vec<String> = (0..NODES).map(node_name).collect();
        let seen = Arc::new(Mutex::new(Seen::default()));
        let (ready, stores) = std::sync::mpsc::channel();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let logs = std::fs::File::create(format!("{dir}/edges.log")).expect("edges.log");
        let dir = std::path::PathBuf::from(dir).join("edges");
        std::fs::create_dir_all(&dir).expect("edges' dir");
        let (thread_nodes, thread_seen) = (nodes.clone(), seen.clone());
        let thread = std::thread::Builder::new()
            .name("edges".to_owned())
            .spawn(move || {
                // The edges' own logs (info), to edges.log.
                let logs = tracing_subscriber::fmt()
                    .with_env_filter(tracing_subscriber::EnvFilter::new("info"))
                    .with_writer(Mutex::new(logs))
                    .with_ansi(false)
                    .finish();
                let _logs = tracing::subscriber::set_default(logs);
                actix::System::new().block_on(async move {
                    let joins = thread_nodes
                        .iter()
                        .map(|node| hub::certs::join(&certs, "localhost", &token, node));
                    let joined = futures_util::future::join_all(joins).await;
                    let mut edges = Vec::new();
                    for (n, (node, credentials)) in thread_nodes.iter().zip(joined).enumerate() {
                        let credentials = credentials.expect("joined");
                        let store =
                            EdgeStore::open(&dir.join(format!("{node}.redb"))).expect("store");
                        watch_store(node.clone(), &store, thread_seen.clone());
                        let hive = Hive::new(node.as_str(), HiveConfig::default());
                        MetaManager::start(&hive, store.clone()).expect("metamanager");
                        let order: Vec<String> = (0..hubs.len())
                            .map(|k| hubs[(n + k) % hubs.len()].clone())
                            .collect();
                        let identity = credentials.reloadable().expect("identity");
                        let roots = std::slice::from_ref(&credentials.ca);
                        let dial = DialOptions::new(&order[0], "localhost")
                            .with_tls(tls::client_config_reloadable(roots, identity).expect("tls"));
                        let config = EdgeHubConfig {
                            keepalive: Duration::from_secs(KEEPALIVE_SECS),
                            alternates: order[1..].to_vec(),
                            ..EdgeHubConfig::new(node.clone(), TransportKind::WebSocket, dial)
                        };
                        let handle = EdgeHub::start(&hive, config).expect("edgehub");
                        watch_link(node.clone(), handle.online.clone(), thread_seen.clone());
                        edges.push((hive, store, handle));
                    }
                    let stores = thread_nodes
                        .iter()
                        .cloned()
                        .zip(edges.iter().map(|(_, store, _)| store.clone()))
                        .collect::<Vec<_>>();
                    if ready.send(stores).is_err() {
                        return;
                    }
                    let _ = stopped.await;
                    for (hive, store, _) in edges {
                        let _ = hive.shutdown().await;
                        store.close().await;
                    }
                });
            })
            .expect("the edges' thread");
        let stores = stores.recv().expect("the edges started");
        Fleet {
            nodes,
            seen,
            stores,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    fn seen(&self) -> std::sync::MutexGuard<'_, Seen> {
        self.seen.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The nodes whose link is not up now.
    fn unlinked(&self) -> Vec<String> {
        let seen = self.seen();
        self.nodes
            .iter()
            .filter(|node| {
                !seen
                    .links
                    .get(*node)
                    .and_then(|links| links.last())
                    .is_some_and(|(_, up)| *up)
            })
            .cloned()
            .collect()
    }

    /// When `node`'s link first came up after `after`.
    fn linked_after(&self, node: &str, after: Instant) -> Option<Instant> {
        self.seen()
            .links
            .get(node)?
            .iter()
            .find(|(at, up)| *up && *at > after)
            .map(|(at, _)| *at)
    }

    /// Applied pods not (yet) at their edge at the generation applied, as
    /// (node, what).
    fn missing(&self, applied: &BTreeMap<String, Applied>) -> Vec<(String, String)> {
        let seen = self.seen();
        applied
            .iter()
            .filter_map(|(pod, applied)| {
                let history = seen.pods.get(&applied.node).and_then(|pods| pods.get(pod));
                let last = history.and_then(|h| h.last()).copied();
                (last.and_then(|s| s.generation) != Some(applied.generation)).then(|| {
                    (
                        applied.node.clone(),
                        format!(
                            "{pod}: applied at gen {}, the edge's versions (version, gen) {:?}",
                            applied.generation,
                            history
                                .map(|h| {
                                    h.iter()
                                        .map(|s| (s.version, s.generation))
                                        .collect::<Vec<_>>()
                                })
                                .unwrap_or_default()
                        ),
                    )
                })
            })
            .collect()
    }

    /// Everything wrong with what the edges stored: anything deleted (lost),
    /// any version or generation going backwards, pods nobody applied,
    /// and the stores themselves disagreeing with their change feeds.
    fn problems(&self, applied: &BTreeMap<String, Applied>) -> Vec<String> {
        let seen = self.seen();
        let mut problems = seen.troubles.clone();
        for (node, pods) in &seen.pods {
            for (pod, history) in pods {
                if !applied.contains_key(pod) {
                    problems.push(format!("{node}: holds {pod}, which nobody applied"));
                }
                for pair in history.windows(2) {
                    let (before, after) = (pair[0], pair[1]);
                    if after.version <= before.version || after.generation < before.generation {
                        problems.push(format!(
                            "{node}: {pod} went backwards: {before:?} then {after:?}"
                        ));
                    }
                }
                if history.iter().any(|s| s.generation.is_none()) {
                    problems.push(format!(
                        "{node}: {pod} deleted at the edge (acknowledged, then lost): {history:?}"
                    ));
                }
            }
        }
        for (node, store) in &self.stores {
            let held = store.list("default/pod/").expect("the edge's pods");
            let fed = seen.pods.get(node);
            let fed_live = fed.map_or(0, |pods| {
                pods.values()
                    .filter(|h| h.last().is_some_and(|s| s.generation.is_some()))
                    .count()
            });
            if held.len() != fed_live {
                problems.push(format!(
                    "{node}: holds {} pods, its change feed says {fed_live}",
                    held.len()
                ));
            }
            for (resource, record) in held {
                let pod = resource.trim_start_matches("default/pod/");
                let fed = fed.and_then(|p| p.get(pod)).and_then(|h| h.last());
                if fed.map(|s| s.version.to_string()) != Some(record.version.clone()) {
                    problems.push(format!(
                        "{node}: {pod} stored at version {} but fed {fed:?}",
                        record.version
                    ));
                }
            }
        }
        problems
    }

    fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            thread.join().expect("the edges' thread");
        }
    }
}

/// Records every version the store commits.
fn watch_store(node: String, store: &EdgeStore, seen: Arc<Mutex<Seen>>) {
    use tokio::sync::broadcast::error::RecvError;
    let mut changes = store.subscribe();
    actix::spawn(async move {
        loop {
            match changes.recv().await {
                Ok(change) => seen
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .record(&node, &change),
                Err(RecvError::Lagged(missed)) => seen
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .troubles
                    .push(format!("{node}: change feed missed {missed} changes")),
                Err(RecvError::Closed) => break,
            }
        }
    });
}

/// Records when the edge's link comes up and goes down.
fn watch_link(
    node: String,
    mut online: tokio::sync::watch::Receiver<bool>,
    seen: Arc<Mutex<Seen>>,
) {
    actix::spawn(async move {
        while online.changed().await.is_ok() {
            let up = *online.borrow_and_update();
            seen.lock()
                .unwrap_or_else(PoisonError::into_inner)
                .links
                .entry(node.clone())
                .or_default()
                .push((Instant::now(), up));
        }
    });
}

// ----- the stream of objects -----

/// The last generation of a pod whose apply succeeded.
#[derive(Debug, Clone)]
struct Applied {
    node: String,
    generation: u64,
}

/// Appliers putting pods through the replicas' admin APIs (generation 1
/// creates a pod, each later one updates it), creations and updates
/// interleaved, until told to stop and every pod is at generation 2 at
/// least.
struct Stream {
    shared: Shared,
    appliers: Vec<tokio::task::JoinHandle<()>>,
}

fn manifest(chunk: &[(String, String)], generation: u64) -> String {
    chunk
        .iter()
        .map(|(pod, node)| {
            format!(
                "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {pod}\n  annotations:\n    gen: \"{generation}\"\nspec:\n  nodeName: {node}\n  containers:\n  - name: c\n    image: 127.0.0.1:5000/busybox:latest\n    command: [sleep, '3600']\n"
            )
        })
        .collect::<Vec<_>>()
        .join("---\n")
}

impl Stream {
    fn start(runtime: &tokio::runtime::Runtime, admins: Vec<String>) -> Stream {
        // Pod k of every node, then pod k+1: a chunk spans ten nodes.
        let pods: Vec<(String, String)> = (0..PODS_PER_NODE)
            .flat_map(|k| (0..NODES).map(move |n| (format!("p{n:02}-{k:02}"), node_name(n))))
            .collect();
        let chunks: Vec<Vec<(String, String)>> = pods.chunks(CHUNK).map(<[_]>::to_vec).collect();
        let shared = Shared {
            admins,
            applied: Arc::default(),
            progress: Arc::default(),
            failures: Arc::default(),
            stop: Arc::default(),
        };
        let appliers = (0..APPLIERS)
            .map(|w| {
                let mine: Vec<Vec<(String, String)>> =
                    chunks.iter().skip(w).step_by(APPLIERS).cloned().collect();
                runtime.spawn(apply_interleaved(w, mine, shared.clone()))
            })
            .collect();
        Stream { shared, appliers }
    }

    fn progress(&self) -> usize {
        self.shared.progress.load(Ordering::Relaxed)
    }

    /// Waits until `count` pods have been applied in all.
    fn wait_progress(&self, count: usize) {
        until(&format!("{count} pods applied"), || {
            (self.progress() >= count).then_some(())
        });
    }

    /// Stops after the round under way (at least generation 2); what was
    /// applied, per pod.
    fn finish(self, runtime: &tokio::runtime::Runtime) -> BTreeMap<String, Applied> {
        self.shared.stop.store(true, Ordering::Relaxed);
        for applier in self.appliers {
            runtime
                .block_on(applier)
                .unwrap_or_else(|err| panic!("an applier failed: {err}"));
        }
        let failures = self
            .shared
            .failures
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let applied = self
            .shared
            .applied
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let lowest = applied.values().map(|a| a.generation).min().unwrap_or(0);
        let highest = applied.values().map(|a| a.generation).max().unwrap_or(0);
        println!(
            "stream: {} pods applied in all ({} objects, each at generation {lowest} to {highest}); {} applies failed and went again elsewhere{}",
            self.shared.progress.load(Ordering::Relaxed),
            applied.len(),
            failures.len(),
            failures
                .first()
                .map(|f| format!(", the first: {f}"))
                .unwrap_or_default()
        );
        assert_eq!(applied.len(), NODES * PODS_PER_NODE);
        applied
    }
}

/// What one applier shares with the test.
#[derive(Clone)]
struct Shared {
    admins: Vec<String>,
    applied: Arc<Mutex<BTreeMap<String, Applied>>>,
    progress: Arc<AtomicUsize>,
    failures: Arc<Mutex<Vec<String>>>,
    stop: Arc<AtomicBool>,
}

/// One applier: creations and updates interleaved from the start. Each
/// step creates its next chunk (while some are left), then updates the
/// chunk it applied longest ago to its next generation; once told to stop,
/// it creates what is left and updates only what is still at generation
/// 1, then returns. A pod's next generation is applied only once its
/// previous one was.
async fn apply_interleaved(w: usize, chunks: Vec<Vec<(String, String)>>, shared: Shared) {
    let mut target = w % shared.admins.len();
    // Per chunk created: its generation and the step of its last apply.
    let mut applied: Vec<(u64, usize)> = Vec::new();
    for step in 0.. {
        let stopping = shared.stop.load(Ordering::Relaxed);
        if applied.len() < chunks.len() {
            apply_chunk(&chunks[applied.len()], 1, &mut target, &shared).await;
            applied.push((1, step));
        }
        let all_created = applied.len() == chunks.len();
        let oldest = applied
            .iter_mut()
            .enumerate()
            .filter(|(_, (generation, _))| !stopping || *generation < 2)
            .min_by_key(|(_, (_, at))| *at);
        match oldest {
            Some((oldest, (generation, at))) => {
                *generation += 1;
                *at = step;
                apply_chunk(&chunks[oldest], *generation, &mut target, &shared).await;
            }
            None if all_created => return,
            None => {}
        }
    }
}

/// Applies `chunk` at `generation` through the replica at `target`, or
/// the next one if that fails (the replica dead, stopping, or without
/// etcd), unchanged, until one takes it; each apply moves `target` on.
async fn apply_chunk(
    chunk: &[(String, String)],
    generation: u64,
    target: &mut usize,
    shared: &Shared,
) {
    let body = manifest(chunk, generation);
    let admins = &shared.admins;
    let mut failed = 0usize;
    let first_try = Instant::now();
    loop {
        let admin = &admins[*target];
        *target = (*target + 1) % admins.len();
        match cloud::AdminClient::new(admin)
            .apply(body.clone().into_bytes())
            .await
        {
            Ok(answer) => {
                assert_eq!(answer.results.len(), chunk.len());
                for result in &answer.results {
                    assert!(
                        ["created", "configured", "unchanged"].contains(&result.result.as_str()),
                        "{result:?}"
                    );
                }
                break;
            }
            Err(err) => {
                failed += 1;
                shared
                    .failures
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push(format!("through {admin}: {err}"));
                assert!(
                    first_try.elapsed() < Duration::from_secs(60),
                    "no replica took an apply for a minute: {err}"
                );
                // Every replica refused in turn: a moment before the next
                // round of them.
                if failed.is_multiple_of(admins.len()) {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        }
    }
    let mut applied = shared
        .applied
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    for (pod, node) in chunk {
        applied.insert(
            pod.clone(),
            Applied {
                node: node.clone(),
                generation,
            },
        );
    }
    shared.progress.fetch_add(chunk.len(), Ordering::Relaxed);
}

// ----- the tests -----

#[test]
fn a_replica_killed_under_load_loses_nothing_and_its_edges_move_in_time() {
    let mut setup = Setup::start("fleet-kill");
    let stream = Stream::start(&setup.runtime, setup.admins());
    // A third of the pods created: b dies.
    stream.wait_progress(NODES * PODS_PER_NODE / 3);
    let victims: Vec<String> = setup
        .claims()
        .into_iter()
        .filter(|(_, replica)| replica == "b")
        .map(|(node, _)| node)
        .collect();
    assert!(!victims.is_empty(), "b serves some nodes");
    let applied_before = stream.progress();
    // Taken before the signal: the times measured from it are not short.
    let killed = Instant::now();
    setup.replicas[1].kill();

    let moved: Vec<(String, Duration)> = until("b's edges linked to a or c", || {
        victims
            .iter()
            .map(|node| {
                let at = setup.fleet().linked_after(node, killed)?;
                Some((node.clone(), at - killed))
            })
            .collect()
    });
    let (slowest, failover) = moved
        .iter()
        .max_by_key(|(_, took)| *took)
        .cloned()
        .expect("victims");
    let fastest = moved.iter().map(|(_, took)| *took).min().expect("victims");
    println!(
        "failover: b killed after {applied_before} pods applied; its {} edges linked again {fastest:?} to {failover:?} after (slowest: {slowest}); bound {FAILOVER_BOUND:?}",
        victims.len()
    );
    assert!(
        failover < FAILOVER_BOUND,
        "{slowest} linked again {failover:?} after the kill"
    );
    setup.wait_settled("every node claimed by a or c");
    println!(
        "claims per replica after the kill: {:?}",
        setup.claims_per_replica()
    );

    let applied = stream.finish(&setup.runtime);
    setup.check(&applied);
    setup.stop();
}

#[test]
fn a_rolling_restart_under_load_loses_nothing() {
    let mut setup = Setup::start("fleet-rolling");
    let stream = Stream::start(&setup.runtime, setup.admins());
    let mut mark = 0;
    for i in 0..setup.replicas.len() {
        // Objects keep coming: some more applied before each restart.
        mark += NODES * PODS_PER_NODE / 4;
        stream.wait_progress(mark);
        let name = setup.replicas[i].name;
        let served: Vec<String> = setup
            .claims()
            .into_iter()
            .filter(|(_, replica)| replica == name)
            .map(|(node, _)| node)
            .collect();
        let stopping = Instant::now();
        setup.replicas[i].stop();
        let stopped = stopping.elapsed();
        let etcd = setup.etcd.clone();
        setup.replicas[i].start(&etcd);
        let restarted = stopping.elapsed();
        setup.wait_settled(&format!("every edge linked again after {name}'s restart"));
        let moved = served
            .iter()
            .filter_map(|node| setup.fleet().linked_after(node, stopping))
            .map(|at| at - stopping)
            .max()
            .unwrap_or_default();
        println!(
            "{name} restarted after {} pods applied: stopped in {stopped:?}, serving again {restarted:?} after the SIGTERM; its {} edges linked elsewhere within {moved:?}; claims now {:?}",
            stream.progress(),
            served.len(),
            setup.claims_per_replica()
        );
    }
    let applied = stream.finish(&setup.runtime);
    setup.check(&applied);
    setup.stop();
}
