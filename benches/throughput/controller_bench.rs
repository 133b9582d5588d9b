//! The `controller` group: the edgecontroller between a desired-state
//! write and the nodes' acknowledgements, each figure beside a baseline
//! measured in the same run.
//!
//! - **Embedded backend, one edge**: 1,000 pods bound to one real
//!   in-process edge (edgehub and metamanager on redb, linked to cloudhub
//!   over WebSocket with mutual TLS; cloudhub's queues persist in redb, as
//!   cloudcore's do). Timed from the first `DesiredState::create` (all
//!   1,000 submitted at once, as many API clients would) until cloudhub
//!   counts at least 1,000 acknowledgements, nothing is left unacknowledged
//!   and the edge's store holds every pod at the revision the desired
//!   state holds (so a controller that sends a pod twice is timed until
//!   the last); also through `ControllerHandle::apply` (the admin API's
//!   and `edgehivectl apply`'s path: one call with the 1,000 pods), and
//!   the messages the controller queued per pod. Baselines: raw redb
//!   writes of the same 1,000 stored objects (the bytes the store holds),
//!   one write transaction per object, and all in one transaction.
//! - **Embedded backend, fan-out**: one configmap used by one pod on each
//!   of N nodes (1,000; 100 with `--quick`), timed from the configmap's
//!   replace until cloudhub counts N more acknowledgements and holds
//!   nothing unacknowledged. The nodes are the hub bench's simulated nodes
//!   (one child process; each node its own WebSocket link with mutual
//!   TLS; they acknowledge every object and answer nothing else, so the
//!   controller's inventory questions time out), not full edges. Baseline:
//!   one message of the same size sent straight to cloudhub for each of
//!   the N nodes (no controller, no desired state), until every node has
//!   acknowledged it.
//! - **Kubernetes backend** (only with `EDGEHIVE_TEST_KUBECONFIG` naming
//!   a kubeconfig of a cluster the bench may write to, as the gated test
//!   suite's): the one-edge scenario with stock pods (admitted as usual,
//!   so with their service account token volume, and with the offline
//!   window's tolerations cloudcore's admission webhook gives them, so
//!   nothing is written back) created in a fresh
//!   namespace of that cluster by a bare client (kube-rs, 16 creates in
//!   flight, on a thread and a runtime of its own, as a user's client is a
//!   process of its own: see `api_writer`) and cloudcore's controller on
//!   `KubernetesStore`, timed from
//!   the first create until the edge is in step as above; then a label
//!   patch of each pod, timed the same way. Baselines: the API server's
//!   own create and patch rates for the same pods from the same bare
//!   client, in a second namespace, with no controller running. The
//!   requests cloudcore's client made to the API server meanwhile are
//!   counted by verb (a write per pod would show here). Where the cores
//!   went, per pod: the API server's and etcd's CPU (when they run on this
//!   machine), the writing client's, and the rest of this process's (the
//!   cloud and the edge), beside the API server's CPU per create with the
//!   bare client alone. A configmap used
//!   by a pod on the edge, patched 20 times, each timed from the PATCH
//!   call's start until the edge's store commits the new value, beside a
//!   bare kube-rs watch of it timed to its event (medians). Also the backend's memory per
//!   watched object: the growth of RSS (`/proc/self/statm`) of a fresh
//!   process (this binary again) while a `KubernetesStore` connects and
//!   lists, with N extra ~1 KiB configmaps (5,000; 500 with `--quick`)
//!   minus the same without them, divided by N, beside the objects'
//!   serialized (JSON) size as the store holds them. The node name and
//!   namespaces are unique per run; the namespaces, the Node and its
//!   Lease are deleted at the end.
//!
//! `EDGEHIVE_BENCH_LOG` (a tracing filter, such as `cloud=debug`) shows
//! what the cloud and the edge log meanwhile.
//!
//! One concern: the `controller` group, each of its scenarios beside the
//! baseline it is measured against, in both backends.

use std::future::Future;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, anyhow, bail};
use beehive::constants::{group, module, operation};
use beehive::{Hive, HiveConfig, Message};
use cloud::{ControllerConfig, ControllerHandle, DesiredState, EdgeController, EmbeddedStore};
use hub::{CloudEndpoint, CloudHub, CloudHubConfig, EdgeHub, EdgeHubConfig, HubStats};
use meta::{EdgeStore, Kind, MetaManager, ObjectKey};
use redb::{Database, TableDefinition};
use serde_json::{Value, json};
use transports::tls::{self, DevPki};
use transports::{DialOptions, ListenOptions, TransportKind};

use crate::Scale;
use crate::hub_bench::{ChildGuard, node_name as sim_node, write_identities};
use crate::report::{Report, median};

/// The environment variable naming the Kubernetes scenario's kubeconfig:
/// the same as the gated test suite's.
pub(crate) const KUBECONFIG_ENV: &str = "EDGEHIVE_TEST_KUBECONFIG";
/// The embedded scenario's edge.
const NODE: &str = "bench-edge";
/// How long any one wait may take before the run fails.
const WAIT: Duration = Duration::from_secs(300);
/// cloudhub's keepalive with the fan-out's simulated nodes, which send
/// theirs every third of a minute (the hub bench's); with real edges,
/// both ends keep their defaults.
const SIMULATED_KEEPALIVE: Duration = Duration::from_secs(60);
const RAW: TableDefinition<&str, &[u8]> = TableDefinition::new("objects");

/// How much work each scenario does.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Sizes {
    /// Pods bound to the one edge, per run.
    pods: usize,
    /// Nodes of the fan-out.
    fan_out: usize,
    /// Configmaps the Kubernetes backend lists for its memory figure.
    configmaps: usize,
    /// Repetitions; the median is reported.
    runs: usize,
}

pub fn run(scale: Scale, quick: bool, report: &mut Report) -> Result<()> {
    if let Ok(namespace) = std::env::var(kubernetes::RSS_CHILD) {
        return kubernetes::rss_child(&namespace);
    }
    let sizes = Sizes {
        pods: 1_000,
        fan_out: if quick { 100 } else { 1_000 },
        configmaps: if quick { 500 } else { 5_000 },
        runs: scale.runs,
    };
    if let Ok(filter) = std::env::var("EDGEHIVE_BENCH_LOG") {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .with_writer(std::io::stderr)
            .try_init();
    }
    let _ = rlimit::increase_nofile_limit(u64::MAX);
    let dir = tempfile::tempdir()?;
    actix::System::new().block_on(one_edge_embedded(sizes, dir.path(), report))?;
    actix::System::new().block_on(fan_out(sizes, dir.path(), report))?;
    let kubeconfig = std::env::var(KUBECONFIG_ENV)
        .ok()
        .filter(|path| !path.is_empty());
    match kubeconfig {
        None => skipped(
            report,
            "skipped: EDGEHIVE_TEST_KUBECONFIG (a real kube-apiserver) not set",
        ),
        Some(path) => {
            actix::System::new().block_on(kubernetes::run(sizes, Path::new(&path), report))?
        }
    }
    Ok(())
}

fn skipped(report: &mut Report, why: &str) {
    eprintln!("controller/k8s: {why}");
    report.plain("controller/k8s", why, f64::NAN, "-");
}

fn acked(stats: &HubStats) -> u64 {
    HubStats::get(&stats.acked)
}

/// Waits until cloudhub counts `target` acknowledgements in all and holds
/// nothing unacknowledged.
async fn wait_acked(stats: &HubStats, target: u64, what: &str) -> Result<()> {
    let done = || acked(stats) >= target && HubStats::get(&stats.pending) == 0;
    if stats.changes.wait_for(WAIT, done).await {
        return Ok(());
    }
    bail!(
        "{what}: {} of {target} acknowledgements, {} pending, after {WAIT:?}",
        acked(stats),
        HubStats::get(&stats.pending)
    )
}

/// The time from the start of `write` until cloudhub has `objects` more
/// acknowledgements; and what `write` returned.
async fn timed_to_ack<T>(
    stats: &HubStats,
    objects: usize,
    what: &str,
    write: impl Future<Output = Result<T>>,
) -> Result<(Duration, T)> {
    let before = acked(stats);
    let started = Instant::now();
    let written = write.await?;
    wait_acked(stats, before + objects as u64, what).await?;
    Ok((started.elapsed(), written))
}

fn per_second(objects: usize, took: Duration) -> f64 {
    objects as f64 / took.as_secs_f64()
}

/// Waits until `edge` holds every object of `keys` at (or above) the
/// revision the desired state holds now, and cloudhub has nothing left
/// unacknowledged: the edge is in step, whatever number of messages it
/// took (a controller may send an object more than once).
async fn wait_edge_in_step(
    cloud: &Cloud,
    store: &Arc<dyn DesiredState>,
    edge: &EdgeStore,
    keys: &[ObjectKey],
    what: &str,
) -> Result<()> {
    let stats = &cloud.stats;
    let deadline = Instant::now() + WAIT;
    let mut missing: Vec<&ObjectKey> = keys.iter().collect();
    loop {
        // Latest first: delivery follows creation, so a pass stops at the
        // first one missing and costs little until the end.
        while let Some(key) = missing.last() {
            let desired = store.get(key)?.map(|object| object.revision());
            let held = edge
                .get(&key.edge_resource().to_string())?
                .filter(|record| !record.is_deleted())
                .and_then(|record| record.version.parse::<u64>().ok());
            match (desired, held) {
                (Some(desired), Some(held)) if held >= desired => {
                    missing.pop();
                }
                _ => break,
            }
        }
        if missing.is_empty() && HubStats::get(&stats.pending) == 0 {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!(
                "{what}: the edge lacks {} of {} objects after {WAIT:?}",
                missing.len(),
                keys.len()
            );
        }
        // Until the next acknowledgement, or a moment.
        let seen = acked(stats);
        let _ = stats
            .changes
            .wait_for(Duration::from_millis(20), || acked(stats) != seen)
            .await;
    }
}

/// The time from the start of `write` until the edge is in step with the
/// desired state for `keys` (see [`wait_edge_in_step`]); what `write`
/// returned; and the messages the controller queued meanwhile.
async fn timed_to_edge<T>(
    cloud: &Cloud,
    store: &Arc<dyn DesiredState>,
    edge: &EdgeStore,
    keys: &[ObjectKey],
    what: &str,
    write: impl Future<Output = Result<T>>,
) -> Result<(Duration, T, u64)> {
    let sent_before = cloud.controller.counts.borrow().sent;
    let before = acked(&cloud.stats);
    let started = Instant::now();
    let written = write.await?;
    wait_acked(&cloud.stats, before + keys.len() as u64, what).await?;
    wait_edge_in_step(cloud, store, edge, keys, what).await?;
    let took = started.elapsed();
    Ok((
        took,
        written,
        cloud.controller.counts.borrow().sent - sent_before,
    ))
}

fn pod_keys(namespace: &str, names: &[String]) -> Vec<ObjectKey> {
    names
        .iter()
        .map(|name| ObjectKey::new(Kind::Pod, namespace, name.as_str()))
        .collect()
}

fn pod(name: &str, namespace: &str, node: &str, configmap: Option<&str>) -> Value {
    let mut pod = stock_pod(name, namespace, node);
    // The embedded store issues no tokens: none is asked for.
    pod["spec"]["automountServiceAccountToken"] = json!(false);
    if let Some(configmap) = configmap {
        pod["spec"]["volumes"] = json!([{"name": "config", "configMap": {"name": configmap}}]);
        pod["spec"]["containers"][0]["volumeMounts"] =
            json!([{"name": "config", "mountPath": "/config"}]);
    }
    pod
}

/// A pod as a user writes it: bound to `node`, its service account token
/// mounted as admission adds it.
pub(crate) fn stock_pod(name: &str, namespace: &str, node: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": {"app": "edgehive-bench"}},
        "spec": {
            "nodeName": node,
            "containers": [{"name": "main", "image": "127.0.0.1:5000/busybox:latest"}],
        },
    })
}

/// A stock pod as cloudcore's admission webhook lets it in: with the
/// tolerations of the offline window (a day) already, so cloudcore writes
/// nothing back. Both the bare client's pods and cloudcore's are these.
pub(crate) fn admitted_pod(name: &str, namespace: &str, node: &str) -> Value {
    let mut pod = stock_pod(name, namespace, node);
    pod["spec"]["tolerations"] = [
        "node.kubernetes.io/not-ready",
        "node.kubernetes.io/unreachable",
    ]
    .iter()
    .map(|key| {
        json!({"key": key, "operator": "Exists", "effect": "NoExecute",
                   "tolerationSeconds": 86400})
    })
    .collect();
    pod
}

/// `body` as the object the cloud's modules pass (the bench builds only
/// whole objects: a failure here is the bench's own bug).
fn object(body: Value) -> apis::Object {
    apis::Object::new(body).expect("the bench builds whole objects")
}

/// A configmap of about 1 KiB.
fn configmap(name: &str, namespace: &str, value: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": namespace},
        "data": {"value": value, "blob": "x".repeat(900)},
    })
}

/// A cloud: the edgecontroller on `store`, and cloudhub on WebSocket with
/// mutual TLS, its queues in redb.
struct Cloud {
    pki: DevPki,
    hive: Hive,
    controller: ControllerHandle,
    stats: Arc<HubStats>,
    address: String,
}

impl Cloud {
    async fn start(
        store: Arc<dyn DesiredState>,
        dir: &Path,
        name: &str,
        keepalive: Option<Duration>,
    ) -> Result<Cloud> {
        let pki = DevPki::new("controller bench CA")?;
        let hive = Hive::new("cloud", HiveConfig::default());
        let controller = EdgeController::start(&hive, store, ControllerConfig::default())?;
        let (chain, key) = pki.server("localhost")?;
        let options = ListenOptions::new("127.0.0.1:0").with_tls(tls::server_config(
            chain,
            key,
            Some(&[pki.root()]),
        )?);
        let hub = CloudHub::start(
            &hive,
            CloudHubConfig {
                node_events: controller.node_events(),
                links: controller.node_links(),
                endpoints: vec![CloudEndpoint {
                    kind: TransportKind::WebSocket,
                    options,
                    trust_hello: false,
                    dialect: hub::Dialect::Native,
                }],
                keepalive: keepalive.unwrap_or(CloudHubConfig::default().keepalive),
                store: Some(dir.join(format!("{name}-queues.redb"))),
                ..CloudHubConfig::default()
            },
        )
        .await?;
        Ok(Cloud {
            pki,
            hive,
            controller,
            stats: hub.stats.clone(),
            address: hub.addresses[0].1.clone(),
        })
    }

    async fn stop(self) {
        let _ = self.hive.shutdown().await;
    }
}

/// A real edge: edgehub and metamanager on redb.
struct Edge {
    hive: Hive,
    store: EdgeStore,
}

impl Edge {
    async fn start(cloud: &Cloud, node: &str, dir: &Path) -> Result<Edge> {
        let hive = Hive::new("edge", HiveConfig::default());
        let store = EdgeStore::open(&dir.join(format!("{node}.redb")))?;
        MetaManager::start(&hive, store.clone())?;
        let dial = DialOptions::new(&cloud.address, "localhost").with_tls(tls::client_config(
            &[cloud.pki.root()],
            Some(cloud.pki.client(node)?),
        )?);
        let hub = EdgeHub::start(
            &hive,
            EdgeHubConfig::new(node, TransportKind::WebSocket, dial),
        )?;
        let mut online = hub.online.clone();
        tokio::time::timeout(WAIT, online.wait_for(|up| *up))
            .await
            .context("the edge never connected")??;
        Ok(Edge { hive, store })
    }

    async fn stop(self) {
        let _ = self.hive.shutdown().await;
        self.store.close().await;
    }
}

/// Whether the stored Node says the controller has seen its link up.
fn node_ready(node: &Value) -> bool {
    node.pointer("/status/conditions")
        .and_then(Value::as_array)
        .is_some_and(|conditions| {
            conditions
                .iter()
                .any(|c| c["type"] == "Ready" && c["status"] == "True")
        })
}

/// Waits until the controller has written every one of `nodes` Ready
/// (its work on their connects is done), then a moment more for the
/// inventories they answer.
async fn wait_nodes_ready(store: &Arc<dyn DesiredState>, nodes: &[String]) -> Result<()> {
    let deadline = Instant::now() + WAIT;
    let mut waiting: Vec<&String> = nodes.iter().collect();
    while !waiting.is_empty() {
        if Instant::now() > deadline {
            bail!("{} nodes never became Ready", waiting.len());
        }
        let mut still = Vec::new();
        for node in waiting {
            let key = ObjectKey::new(Kind::Node, "", node.as_str());
            if !store
                .get(&key)?
                .as_ref()
                .is_some_and(|node| node_ready(node.json()))
            {
                still.push(node);
            }
        }
        waiting = still;
        if !waiting.is_empty() {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    Ok(())
}

/// Raw redb writes of `objects`: objects per second with one write
/// transaction each, and with one for all.
fn raw_redb(dir: &Path, run: usize, objects: &[(String, Vec<u8>)]) -> Result<(f64, f64)> {
    let each = {
        let path = dir.join(format!("raw-each-{run}.redb"));
        let db = Database::create(&path)?;
        let started = Instant::now();
        for (key, bytes) in objects {
            let txn = db.begin_write()?;
            txn.open_table(RAW)?
                .insert(key.as_str(), bytes.as_slice())?;
            txn.commit()?;
        }
        let rate = objects.len() as f64 / started.elapsed().as_secs_f64();
        drop(db);
        std::fs::remove_file(path)?;
        rate
    };
    let batch = {
        let path = dir.join(format!("raw-batch-{run}.redb"));
        let db = Database::create(&path)?;
        let started = Instant::now();
        let txn = db.begin_write()?;
        {
            let mut table = txn.open_table(RAW)?;
            for (key, bytes) in objects {
                table.insert(key.as_str(), bytes.as_slice())?;
            }
        }
        txn.commit()?;
        let rate = objects.len() as f64 / started.elapsed().as_secs_f64();
        drop(db);
        std::fs::remove_file(path)?;
        rate
    };
    Ok((each, batch))
}

/// Scenario 1 on the embedded backend.
async fn one_edge_embedded(sizes: Sizes, dir: &Path, report: &mut Report) -> Result<()> {
    let store = EmbeddedStore::open(&dir.join("desired.redb"))?.shared();
    let cloud = Cloud::start(store.clone(), dir, "one-edge", None).await?;
    let edge = Edge::start(&cloud, NODE, dir).await?;
    wait_nodes_ready(&store, &[NODE.to_owned()]).await?;
    let (mut created, mut applied, mut raw_each, mut raw_batch) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut messages = Vec::new();
    for run in 0..sizes.runs {
        let names: Vec<String> = (0..sizes.pods).map(|i| format!("c{run}-{i:05}")).collect();
        let pods: Vec<Value> = names
            .iter()
            .map(|name| pod(name, "default", NODE, None))
            .collect();
        let keys = pod_keys("default", &names);
        let (took, stored, sent) =
            timed_to_edge(&cloud, &store, &edge.store, &keys, "created pods", async {
                let writes: Vec<_> = pods
                    .into_iter()
                    .map(|pod| store.create(object(pod)))
                    .collect();
                Ok(futures_util::future::try_join_all(writes).await?)
            })
            .await?;
        created.push(per_second(sizes.pods, took));
        messages.push(sent as f64 / sizes.pods as f64);

        let objects: Vec<(String, Vec<u8>)> = stored
            .iter()
            .map(|object| Ok((object.key().to_string(), serde_json::to_vec(object)?)))
            .collect::<Result<_>>()?;
        let (each, batch) = raw_redb(dir, run, &objects)?;
        raw_each.push(each);
        raw_batch.push(batch);

        let names: Vec<String> = (0..sizes.pods).map(|i| format!("a{run}-{i:05}")).collect();
        let pods: Vec<Value> = names
            .iter()
            .map(|name| pod(name, "default", NODE, None))
            .collect();
        let keys = pod_keys("default", &names);
        let (took, _, _) =
            timed_to_edge(&cloud, &store, &edge.store, &keys, "applied pods", async {
                cloud
                    .controller
                    .apply(pods.into_iter().map(object).collect())
                    .await
                    .map_err(|err| anyhow!("apply: {err}"))
            })
            .await?;
        applied.push(per_second(sizes.pods, took));
    }
    edge.stop().await;
    cloud.stop().await;

    let scenario = format!("controller/embedded/{} pods", sizes.pods);
    let (each, batch) = (median(raw_each), median(raw_batch));
    let created = median(created);
    report.with_baseline(
        &scenario,
        "create→edge ack",
        created,
        "obj/s",
        each,
        "raw redb, 1 txn per object",
    );
    report.with_baseline(
        &scenario,
        "create→edge ack",
        created,
        "obj/s",
        batch,
        "raw redb, 1 txn for all",
    );
    report.with_baseline(
        &scenario,
        "apply()→edge ack",
        median(applied),
        "obj/s",
        each,
        "raw redb, 1 txn per object",
    );
    report.plain(&scenario, "msgs sent per pod", median(messages), "msg");
    Ok(())
}

/// The hub bench's name for simulated node `i`.
/// `nodes` simulated nodes (the hub bench's, one child process) linked to
/// `cloud`, once all are connected; they go when the guard is dropped.
async fn simulated_nodes(
    cloud: &Cloud,
    nodes: usize,
    dir: &Path,
    name: &str,
) -> Result<ChildGuard> {
    let identities = dir.join(format!("{name}-identities"));
    write_identities(&cloud.pki, nodes, &identities)?;
    let child = ChildGuard(
        Command::new(std::env::current_exe()?)
            .args([
                "__hub-nodes",
                "--kind",
                TransportKind::WebSocket.name(),
                "--dialect",
                &hub::Dialect::Native.to_string(),
                "--address",
                &cloud.address,
                "--nodes",
                &nodes.to_string(),
                "--identities",
            ])
            .arg(&identities)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .context("spawn the simulated nodes")?,
    );
    let stats = &cloud.stats;
    if !stats
        .changes
        .wait_for(WAIT, || HubStats::get(&stats.connected) == nodes as u64)
        .await
    {
        bail!(
            "{} of {nodes} simulated nodes connected",
            HubStats::get(&stats.connected)
        );
    }
    Ok(child)
}

/// Scenario 2: one configmap update fanned out to N simulated nodes.
async fn fan_out(sizes: Sizes, dir: &Path, report: &mut Report) -> Result<()> {
    let nodes = sizes.fan_out;
    let store = EmbeddedStore::open(&dir.join("fan-out-desired.redb"))?.shared();
    let cloud = Cloud::start(store.clone(), dir, "fan-out", Some(SIMULATED_KEEPALIVE)).await?;

    // The nodes first: what the controller finds in its first list it
    // leaves to each node's inventory, which simulated nodes never give.
    let started = Instant::now();
    let _nodes = simulated_nodes(&cloud, nodes, dir, "fan-out").await?;
    let stats = cloud.stats.clone();
    let names: Vec<String> = (0..nodes).map(sim_node).collect();
    wait_nodes_ready(&store, &names).await?;

    // The configmap, and a pod using it on each node: both go to each.
    let shared = store
        .create(object(configmap("shared", "default", "v0")))
        .await
        .context("the configmap")?;
    let shared = shared.content();
    let pods: Vec<_> = names
        .iter()
        .enumerate()
        .map(|(i, node)| {
            store.create(object(pod(
                &format!("fan-{i:05}"),
                "default",
                node,
                Some("shared"),
            )))
        })
        .collect();
    futures_util::future::try_join_all(pods).await?;
    wait_acked(&stats, 2 * nodes as u64, "the nodes' first objects").await?;
    eprintln!(
        "controller/fan-out: {nodes} simulated nodes connected and in step in {:.1} s",
        started.elapsed().as_secs_f64()
    );

    let (mut through_controller, mut straight) = (Vec::new(), Vec::new());
    for run in 0..sizes.runs {
        // The baseline: the same fan-out, straight to cloudhub.
        let (took, ()) = timed_to_ack(&stats, nodes, "straight fan-out", async {
            for node in &names {
                let msg = Message::new()
                    .build_router(
                        module::EDGECONTROLLER,
                        group::RESOURCE,
                        format!("node/{node}/default/configmap/fan-out-baseline"),
                        operation::UPDATE,
                    )
                    .with_resource_version((run + 1).to_string())
                    .with_content(shared.clone());
                cloud.hive.send(module::CLOUDHUB, msg).await?;
            }
            Ok(())
        })
        .await?;
        straight.push(took.as_secs_f64() * 1000.0);

        // The controller's: one replace of the configmap.
        let update = configmap("shared", "default", &format!("v{}", run + 1));
        let (took, _) = timed_to_ack(&stats, nodes, "configmap fan-out", async {
            Ok(store.replace(object(update)).await?)
        })
        .await?;
        through_controller.push(took.as_secs_f64() * 1000.0);
    }
    cloud.stop().await;

    report.with_baseline(
        &format!("controller/fan-out {nodes} sim"),
        "replace→all acked",
        median(through_controller),
        "ms",
        median(straight),
        "same msg straight to cloudhub",
    );
    Ok(())
}

pub(crate) mod kubernetes {
    //! Scenario 3: cloudcore's controller on a real kube-apiserver.

    use std::path::Path;
    use std::process::{Command, Stdio};
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use anyhow::{Context as _, Result, anyhow, bail};
    use cloud::DesiredState;
    use cloud::desired::{KubeAccess, KubernetesConfig, KubernetesStore};
    use futures_util::StreamExt;
    use k8s_openapi::api::coordination::v1::Lease;
    use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Node, Pod, ServiceAccount};
    use kube::api::{Api, DeleteParams, ListParams, PostParams};
    use meta::Kind;
    use serde_json::json;

    use super::{
        Cloud, Edge, KUBECONFIG_ENV, SIMULATED_KEEPALIVE, Sizes, WAIT, admitted_pod, configmap,
        median, per_second, pod, pod_keys, sim_node, simulated_nodes, timed_to_edge,
        wait_edge_in_step, wait_nodes_ready,
    };
    use crate::api_writer::{ApiWriter, CpuShares};
    use crate::hub_bench::rss_bytes;
    use crate::report::Report;

    /// Set (to the configmaps' namespace) in the memory child.
    pub const RSS_CHILD: &str = "EDGEHIVE_BENCH_CONTROLLER_RSS_NAMESPACE";
    /// The memory child's answer line.
    const RSS_LINE: &str = "controller-rss";
    /// Creates in flight at once, for the pods and the configmaps.
    const IN_FLIGHT: usize = 16;
    const NODE_LEASES: &str = "kube-node-lease";

    pub(crate) async fn client(kubeconfig: &Path) -> Result<kube::Client> {
        let file = kube::config::Kubeconfig::read_from(kubeconfig)
            .with_context(|| format!("kubeconfig {}", kubeconfig.display()))?;
        let config = kube::Config::from_custom_kubeconfig(file, &Default::default()).await?;
        Ok(kube::Client::try_from(config)?)
    }

    fn is_code(err: &kube::Error, code: u16) -> bool {
        matches!(err, kube::Error::Api(status) if status.code == code)
    }

    /// Runs every `create` (`IN_FLIGHT` at a time); how long they took.
    pub(crate) async fn create_all<T, F, Fut>(objects: Vec<T>, create: F) -> Result<Duration>
    where
        F: Fn(T) -> Fut,
        Fut: Future<Output = Result<(), kube::Error>>,
    {
        let started = Instant::now();
        let mut done =
            futures_util::stream::iter(objects.into_iter().map(create)).buffer_unordered(IN_FLIGHT);
        while let Some(created) = done.next().await {
            created?;
        }
        Ok(started.elapsed())
    }

    /// Creates `pods` through `api`, [`IN_FLIGHT`] at a time: how long
    /// until the API server had answered every create.
    pub(crate) async fn create_pods(api: &Api<Pod>, pods: Vec<Pod>) -> Result<Duration> {
        create_all(pods, |pod| {
            let api = api.clone();
            async move { api.create(&PostParams::default(), &pod).await.map(drop) }
        })
        .await
    }

    fn pods(names: &[String], namespace: &str, node: &str) -> Result<Vec<Pod>> {
        names
            .iter()
            .map(|name| Ok(serde_json::from_value(admitted_pod(name, namespace, node))?))
            .collect()
    }

    /// A label patch of each of `names` (`IN_FLIGHT` at a time); how long
    /// they took.
    pub(crate) async fn patch_all(
        api: &Api<Pod>,
        names: &[String],
        label: &str,
    ) -> Result<Duration> {
        let patch = kube::api::Patch::Merge(json!({"metadata": {"labels": {"round": label}}}));
        create_all(names.to_vec(), |name| {
            let (api, patch) = (api.clone(), patch.clone());
            async move {
                api.patch(&name, &kube::api::PatchParams::default(), &patch)
                    .await
                    .map(drop)
            }
        })
        .await
    }

    /// Creates `namespace`, and waits for its default service account
    /// (which admission requires of a pod), made here if no controller
    /// makes it.
    pub(crate) async fn namespace(client: &kube::Client, namespace: &str) -> Result<()> {
        let namespaces: Api<Namespace> = Api::all(client.clone());
        let object = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace},
        }))?;
        namespaces
            .create(&PostParams::default(), &object)
            .await
            .with_context(|| format!("namespace {namespace}"))?;
        let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), namespace);
        let deadline = Instant::now() + Duration::from_secs(10);
        while accounts.get_opt("default").await?.is_none() {
            if Instant::now() > deadline {
                let account = serde_json::from_value(json!({
                    "apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default"},
                }))?;
                match accounts.create(&PostParams::default(), &account).await {
                    Err(err) if !is_code(&err, 409) => return Err(err.into()),
                    _ => break,
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(())
    }

    /// A name unique to this run, for its namespaces and nodes:
    /// `<prefix>-<pid>-<seconds since the epoch>`.
    pub(crate) fn run_id(prefix: &str) -> String {
        let since_epoch = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        format!("{prefix}-{}-{}", std::process::id(), since_epoch.as_secs())
    }

    pub async fn run(sizes: Sizes, kubeconfig: &Path, report: &mut Report) -> Result<()> {
        let client = client(kubeconfig).await?;
        let id = run_id("edgehive-bench");
        let outcome = scenario(&client, kubeconfig, &id, sizes, report).await;
        let cleaned = cleanup(&client, &id, sizes.fan_out).await;
        outcome?;
        cleaned
    }

    /// A kubelet's requests per minute when nothing changes: a Lease
    /// renewal every 10 s, a node status every 5 minutes.
    const KUBELET_IDLE_PER_MINUTE: f64 = 6.0 + 0.2;

    /// The API server's cost of idle edge nodes: `fan_out` simulated nodes
    /// linked to a cloudcore in Kubernetes mode, every one Ready; then the
    /// requests cloudcore's client makes over whole rounds of Lease
    /// renewals (6; 2 with `--quick`), timed from the end of one round to
    /// the end of the last, per node and minute.
    async fn idle_nodes(
        client: &kube::Client,
        kubeconfig: &Path,
        id: &str,
        sizes: Sizes,
        report: &mut Report,
    ) -> Result<()> {
        let nodes = sizes.fan_out;
        let idle_namespace = format!("{id}-idle");
        namespace(client, &idle_namespace).await?;
        let dir = tempfile::tempdir()?;
        let mut config = KubernetesConfig::new(KubeAccess::Kubeconfig(kubeconfig.to_owned()));
        config.namespace = idle_namespace;
        let kubernetes = Arc::new(KubernetesStore::connect(config).await?);
        let requests = kubernetes.api_requests().clone();
        let store: Arc<dyn DesiredState> = kubernetes;
        let cloud =
            Cloud::start(store.clone(), dir.path(), "idle", Some(SIMULATED_KEEPALIVE)).await?;
        let measured = async {
            let _nodes = simulated_nodes(&cloud, nodes, dir.path(), "idle").await?;
            let names: Vec<String> = (0..nodes).map(sim_node).collect();
            wait_nodes_ready(&store, &names).await?;
            // Whole rounds of Lease renewals (one every 10 s per node): from
            // the end of one round to the end of another, timed, so the
            // window neither cuts a round nor catches part of one more.
            let rounds: u64 = if sizes.fan_out < 1_000 { 2 } else { 6 };
            let per_round = nodes as u64;
            let counts = cloud.controller.counts.clone();
            let renewed = counts.borrow().leases_renewed;
            let first = (renewed / per_round + 1) * per_round;
            let round_ends = |at: u64| {
                let mut counts = counts.clone();
                async move {
                    tokio::time::timeout(WAIT, counts.wait_for(|c| c.leases_renewed >= at))
                        .await
                        .map_err(|_| anyhow!("Lease renewals stalled before {at}"))?
                        .map_err(|_| anyhow!("the controller stopped"))?;
                    Ok::<_, anyhow::Error>(())
                }
            };
            round_ends(first).await?;
            let (before, started) = (requests.snapshot(), Instant::now());
            round_ends(first + rounds * per_round).await?;
            let window = started.elapsed();
            let made = requests_since(&before, &requests.snapshot());
            eprintln!(
                "controller/k8s: {nodes} idle nodes, {rounds} Lease rounds in {window:.1?}: \
                 cloudcore's requests {made:?}"
            );
            let total: u64 = made.iter().map(|(_, n)| n).sum();
            Ok::<_, anyhow::Error>(total as f64 / nodes as f64 / (window.as_secs_f64() / 60.0))
        }
        .await;
        cloud.stop().await;
        drop(store);
        let per_node = measured?;
        report.with_baseline(
            &format!("controller/k8s/{nodes} idle nodes"),
            "API requests per node",
            per_node,
            "req/min",
            KUBELET_IDLE_PER_MINUTE,
            "a kubelet's (Lease 10 s, status 5 min)",
        );
        Ok(())
    }

    async fn scenario(
        client: &kube::Client,
        kubeconfig: &Path,
        id: &str,
        sizes: Sizes,
        report: &mut Report,
    ) -> Result<()> {
        crate::cloudcore_memory::kubernetes::run(client, kubeconfig, id, sizes.pods, report)
            .await?;
        memory(client, kubeconfig, id, sizes, report).await?;
        idle_nodes(client, kubeconfig, id, sizes, report).await?;

        // The writing client: a thread of its own, as a user's client is a
        // process of its own (the cloud and edge below share this process).
        let writer = ApiWriter::start(kubeconfig).await?;
        // The baseline: the API server's create rate from a bare client,
        // no controller anywhere.
        let raw_namespace = format!("{id}-raw");
        namespace(client, &raw_namespace).await?;
        let raw_pods: Api<Pod> = Api::namespaced(client.clone(), &raw_namespace);
        let (mut raw, mut raw_patched) = (Vec::new(), Vec::new());
        let mut raw_api_cpu = Vec::new();
        for run in 0..sizes.runs {
            let names: Vec<String> = (0..sizes.pods).map(|i| format!("r{run}-{i:05}")).collect();
            let objects = pods(&names, &raw_namespace, id)?;
            let before = CpuShares::now()?;
            let created = writer.create(&raw_namespace, objects).await?;
            let cpu = CpuShares::now()?.since(&before);
            raw_api_cpu.extend(cpu.api_server.map(|s| s * 1000.0 / sizes.pods as f64));
            eprintln!(
                "controller/k8s: bare run {run}: CPU per create: {}",
                cpu.per_object(sizes.pods, created.cpu)
            );
            raw.push(per_second(sizes.pods, created.took));
            let patched = writer
                .label(&raw_namespace, &names, &format!("r{run}"))
                .await?;
            raw_patched.push(per_second(sizes.pods, patched.took));
        }
        // The same creates with one bare watch of them open (in a process
        // of its own, as cloudcore's would be): what any watcher costs the
        // API server, the ceiling for a controller on these cores.
        let mut raw_watched = Vec::new();
        {
            // It never sees the pods it waits for ("e-" names): it goes,
            // killed, when the runs are done.
            let _watch =
                crate::cloudcore_memory::kubernetes::BareWatch::start(&raw_namespace, usize::MAX)?;
            for run in 0..sizes.runs {
                let names: Vec<String> =
                    (0..sizes.pods).map(|i| format!("w{run}-{i:05}")).collect();
                let objects = pods(&names, &raw_namespace, id)?;
                let before = CpuShares::now()?;
                let created = writer.create(&raw_namespace, objects).await?;
                eprintln!(
                    "controller/k8s: bare run {run} with a bare watch: CPU per create: {}",
                    CpuShares::now()?
                        .since(&before)
                        .per_object(sizes.pods, created.cpu)
                );
                raw_watched.push(per_second(sizes.pods, created.took));
            }
        }
        eprintln!(
            "controller/k8s: the API server's creates from a bare client: {raw:.0?} per second; \
             with one bare watch open: {raw_watched:.0?}"
        );
        // Gone before the controller lists pods: they name its node too.
        raw_pods
            .delete_collection(&gone_now(), &ListParams::default())
            .await?;

        // The edge node, labelled as one, before the backend lists nodes.
        let nodes: Api<Node> = Api::all(client.clone());
        let node = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": id, "labels": {"node-role.kubernetes.io/edge": ""}},
        }))?;
        nodes.create(&PostParams::default(), &node).await?;
        let ctl_namespace = format!("{id}-ctl");
        namespace(client, &ctl_namespace).await?;

        let dir = tempfile::tempdir()?;
        let mut config = KubernetesConfig::new(KubeAccess::Kubeconfig(kubeconfig.to_owned()));
        // Its revision Lease goes with the namespace.
        config.namespace = ctl_namespace.clone();
        let kubernetes = Arc::new(KubernetesStore::connect(config).await?);
        let requests = kubernetes.api_requests().clone();
        let store: Arc<dyn DesiredState> = kubernetes;
        let cloud = Cloud::start(store.clone(), dir.path(), "kubernetes", None).await?;
        let edge = Edge::start(&cloud, id, dir.path()).await?;
        let measured = async {
            wait_nodes_ready(&store, &[id.to_owned()]).await?;
            // First, with nothing else under way.
            let latency =
                configmap_latency(client, &ctl_namespace, id, &cloud, &store, &edge).await?;
            let (mut rates, mut messages, mut patched) = (Vec::new(), Vec::new(), Vec::new());
            let mut lags = Vec::new();
            let mut writes = Vec::new();
            let (mut cloud_cpu, mut api_cpu) = (Vec::new(), Vec::new());
            for run in 0..sizes.runs {
                let asked_before = requests.snapshot();
                let names: Vec<String> =
                    (0..sizes.pods).map(|i| format!("c{run}-{i:05}")).collect();
                let objects = pods(&names, &ctl_namespace, id)?;
                let keys = pod_keys(&ctl_namespace, &names);
                let sent_before = cloud.controller.counts.borrow().sent;
                let cpu_before = CpuShares::now()?;
                let (took, (created, sent_by_then), sent) = timed_to_edge(
                    &cloud,
                    &store,
                    &edge.store,
                    &keys,
                    "pods from the API server",
                    async {
                        let created = writer.create(&ctl_namespace, objects).await?;
                        Ok((created, cloud.controller.counts.borrow().sent - sent_before))
                    },
                )
                .await?;
                let cpu = CpuShares::now()?.since(&cpu_before);
                cloud_cpu.push((cpu.bench - created.cpu) * 1000.0 / sizes.pods as f64);
                api_cpu.extend(cpu.api_server.map(|s| s * 1000.0 / sizes.pods as f64));
                eprintln!(
                    "controller/k8s: run {run}: the API server answered every create after \
                     {:.2?} ({sent_by_then} messages queued for the edge by then); \
                     the edge in step after {took:.2?} ({sent} messages); CPU per pod: {}",
                    created.took,
                    cpu.per_object(sizes.pods, created.cpu),
                );
                let created = created.took;
                rates.push(per_second(sizes.pods, took));
                lags.push(took.saturating_sub(created).as_secs_f64() * 1000.0);
                messages.push(sent as f64 / sizes.pods as f64);
                let written = writes_since(&asked_before, &requests.snapshot());
                eprintln!("controller/k8s: run {run}: cloudcore's writes to the API server meanwhile: {written:?}");
                writes.push(written.iter().map(|(_, n)| *n).sum::<u64>() as f64 / sizes.pods as f64);

                let (took, _, _) = timed_to_edge(
                    &cloud,
                    &store,
                    &edge.store,
                    &keys,
                    "label patches from the API server",
                    writer.label(&ctl_namespace, &names, &format!("c{run}")),
                )
                .await?;
                patched.push(per_second(sizes.pods, took));
            }
            let cpu = (cloud_cpu, api_cpu);
            Ok::<_, anyhow::Error>((rates, messages, patched, writes, lags, latency, cpu))
        }
        .await;
        edge.stop().await;
        cloud.stop().await;
        drop(store);
        let (rates, messages, patched, writes, lags, (to_edge, watched), (cloud_cpu, api_cpu)) =
            measured?;
        report.with_baseline(
            "controller/k8s/1 configmap",
            "configmap patch→edge",
            to_edge,
            "ms",
            watched,
            "API server watch latency, bare client",
        );
        let scenario = format!("controller/k8s/{} pods", sizes.pods);
        report.with_baseline(
            &scenario,
            "create→edge ack",
            median(rates.clone()),
            "obj/s",
            median(raw),
            "API server create, bare client",
        );
        report.with_baseline(
            &scenario,
            "create→edge ack",
            median(rates),
            "obj/s",
            median(raw_watched),
            "API server create, bare client, one bare watch",
        );
        report.with_baseline(
            &scenario,
            "label patch→edge",
            median(patched),
            "obj/s",
            median(raw_patched),
            "API server patch, bare client",
        );
        report.plain(&scenario, "msgs sent per pod", median(messages), "msg");
        // Past the API server's answer to the last create, how long until
        // the edge held every pod: what cloudcore adds at the end.
        report.plain(
            &scenario,
            "edge in step after last create",
            median(lags),
            "ms",
        );
        // What the cloud and the edge took from the cores the API server
        // needs: all of this process's CPU but the writing client's.
        report.plain(
            &scenario,
            "cloud+edge CPU per created pod",
            median(cloud_cpu),
            "ms",
        );
        // The API server's own cost per create, which the watch raises
        // (when it runs on this machine).
        if !api_cpu.is_empty() && !raw_api_cpu.is_empty() {
            report.with_baseline(
                &scenario,
                "API server CPU per create",
                median(api_cpu),
                "ms",
                median(raw_api_cpu),
                "the same, bare client",
            );
        }
        report.plain(
            &scenario,
            "API-server writes per pod",
            median(writes),
            "req",
        );
        Ok(())
    }

    /// Patches of one configmap timed to the edge and to a bare watch.
    const CONFIGMAP_PATCHES: usize = 20;

    /// A configmap used by a pod on the edge, patched
    /// [`CONFIGMAP_PATCHES`] times: each timed from the PATCH call's start
    /// until the edge's store has committed the new value (its change
    /// feed, no polling); the baseline, each of as many patches timed from
    /// the call's start until a bare kube-rs watch of the configmap
    /// delivers it. The patch and the wait run together, so a value that
    /// arrives before the API server's answer to the PATCH is timed when
    /// it arrives. Medians, in ms.
    async fn configmap_latency(
        client: &kube::Client,
        namespace: &str,
        node: &str,
        cloud: &Cloud,
        store: &Arc<dyn DesiredState>,
        edge: &Edge,
    ) -> Result<(f64, f64)> {
        const NAME: &str = "bench-conf";
        let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
        let object: ConfigMap = serde_json::from_value(configmap(NAME, namespace, "v0"))?;
        let created = configmaps.create(&PostParams::default(), &object).await?;
        let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
        let user: Pod = serde_json::from_value(pod("cm-user", namespace, node, Some(NAME)))?;
        pods.create(&PostParams::default(), &user).await?;
        let keys = [
            meta::ObjectKey::new(Kind::ConfigMap, namespace, NAME),
            meta::ObjectKey::new(Kind::Pod, namespace, "cm-user"),
        ];
        wait_edge_in_step(cloud, store, &edge.store, &keys, "the configmap's user").await?;
        let resource = keys[0].edge_resource().to_string();
        let patch = |value: String| {
            let configmaps = configmaps.clone();
            async move {
                let patch = kube::api::Patch::Merge(json!({"data": {"value": value}}));
                configmaps
                    .patch(NAME, &kube::api::PatchParams::default(), &patch)
                    .await
                    .context("configmap patch")
            }
        };
        let holds = |object: &serde_json::Value, value: &str| object["data"]["value"] == value;

        // The baseline: a bare watch from the version created.
        let version = created.metadata.resource_version.unwrap_or_default();
        let params = kube::api::WatchParams::default().fields(&format!("metadata.name={NAME}"));
        let mut watch = configmaps.watch(&params, &version).await?.boxed();
        let mut watched = Vec::new();
        for i in 0..CONFIGMAP_PATCHES {
            let value = format!("watch-{i}");
            let started = Instant::now();
            let seen = async {
                while let Some(event) = watch.next().await {
                    if let kube::api::WatchEvent::Modified(object) = event?
                        && holds(&serde_json::to_value(&object)?, &value)
                    {
                        return Ok(started.elapsed());
                    }
                }
                bail!("the configmap's watch ended")
            };
            let (patched, seen) = tokio::join!(patch(value.clone()), seen);
            patched?;
            watched.push(seen?.as_secs_f64() * 1000.0);
        }
        drop(watch);

        // Through cloudcore to the edge's store.
        let mut edged = Vec::new();
        for i in 0..CONFIGMAP_PATCHES {
            let value = format!("edge-{i}");
            let mut changes = edge.store.subscribe();
            let started = Instant::now();
            let held = async {
                loop {
                    let change = changes.recv().await.context("the edge's change feed")?;
                    if change.resource == resource
                        && change
                            .record
                            .object
                            .as_ref()
                            .and_then(|o| o.decode::<serde_json::Value>().ok())
                            .is_some_and(|o| holds(&o, &value))
                    {
                        return Ok::<_, anyhow::Error>(started.elapsed());
                    }
                }
            };
            let (patched, held) =
                tokio::join!(patch(value.clone()), tokio::time::timeout(WAIT, held));
            patched?;
            edged.push(
                held.context("the patch never reached the edge")??
                    .as_secs_f64()
                    * 1000.0,
            );
        }
        eprintln!(
            "controller/k8s: configmap patch→edge (ms) {edged:.1?}; API server watch {watched:.1?}"
        );
        Ok((median(edged), median(watched)))
    }

    /// cloudcore's requests to the API server between two snapshots of its
    /// request counts: ("verb resource", count).
    fn requests_since(
        before: &[(&'static str, String, u64)],
        after: &[(&'static str, String, u64)],
    ) -> Vec<(String, u64)> {
        after
            .iter()
            .filter_map(|(verb, resource, count)| {
                let was = before
                    .iter()
                    .find(|(v, r, _)| v == verb && r == resource)
                    .map_or(0, |(_, _, n)| *n);
                (count > &was).then(|| (format!("{verb} {resource}"), count - was))
            })
            .collect()
    }

    /// Of those, the writes (reads left out).
    fn writes_since(
        before: &[(&'static str, String, u64)],
        after: &[(&'static str, String, u64)],
    ) -> Vec<(String, u64)> {
        requests_since(before, after)
            .into_iter()
            .filter(|(request, _)| {
                !["get ", "list ", "watch "]
                    .iter()
                    .any(|read| request.starts_with(read))
            })
            .collect()
    }

    pub(crate) fn gone_now() -> DeleteParams {
        DeleteParams {
            grace_period_seconds: Some(0),
            ..DeleteParams::default()
        }
    }

    /// The backend's memory per listed configmap, from two fresh
    /// processes: one connecting before the configmaps exist, one after.
    async fn memory(
        client: &kube::Client,
        kubeconfig: &Path,
        id: &str,
        sizes: Sizes,
        report: &mut Report,
    ) -> Result<()> {
        let rss_namespace = format!("{id}-rss");
        namespace(client, &rss_namespace).await?;
        let (without, _, _) = rss_of_child(kubeconfig, &rss_namespace)?;
        let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), &rss_namespace);
        let objects: Vec<ConfigMap> = (0..sizes.configmaps)
            .map(|i| {
                let object = configmap(&format!("blob-{i:05}"), &rss_namespace, "v0");
                Ok(serde_json::from_value(object)?)
            })
            .collect::<Result<_>>()?;
        create_all(objects, |object| {
            let api = configmaps.clone();
            async move { api.create(&PostParams::default(), &object).await.map(drop) }
        })
        .await?;
        let (with, held, bytes) = rss_of_child(kubeconfig, &rss_namespace)?;
        if held != sizes.configmaps {
            bail!(
                "the backend listed {held} of {} configmaps",
                sizes.configmaps
            );
        }
        let scenario = format!("controller/k8s/{} configmaps", sizes.configmaps);
        report.with_baseline(
            &scenario,
            "RSS per object",
            with.saturating_sub(without) as f64 / held as f64 / 1024.0,
            "KiB",
            bytes as f64 / held as f64 / 1024.0,
            "its JSON as held",
        );
        report.plain(
            &scenario,
            "RSS, store synced",
            without as f64 / (1024.0 * 1024.0),
            "MiB",
        );
        Ok(())
    }

    /// Runs the memory child; its RSS growth, the configmaps of
    /// `namespace` it holds and their serialized bytes.
    fn rss_of_child(kubeconfig: &Path, namespace: &str) -> Result<(u64, usize, usize)> {
        let out = Command::new(std::env::current_exe()?)
            .arg("controller")
            .env(RSS_CHILD, namespace)
            .env(KUBECONFIG_ENV, kubeconfig)
            .stdin(Stdio::null())
            .stderr(Stdio::inherit())
            .output()
            .context("run the memory child")?;
        if !out.status.success() {
            bail!("the memory child failed ({})", out.status);
        }
        let stdout = String::from_utf8_lossy(&out.stdout);
        let line = stdout
            .lines()
            .find_map(|line| line.strip_prefix(RSS_LINE))
            .ok_or_else(|| anyhow!("no answer from the memory child: {stdout}"))?;
        let numbers: Vec<u64> = line
            .split_whitespace()
            .map(str::parse)
            .collect::<Result<_, _>>()?;
        match numbers[..] {
            [grown, held, bytes] => Ok((grown, held as usize, bytes as usize)),
            _ => bail!("unreadable answer from the memory child: {line}"),
        }
    }

    /// The memory child: RSS growth while a `KubernetesStore` connects
    /// (and lists every kind it watches), and what it holds of the
    /// configmaps in `namespace`.
    pub fn rss_child(namespace: &str) -> Result<()> {
        let kubeconfig = std::env::var(KUBECONFIG_ENV).context(KUBECONFIG_ENV)?;
        let namespace = namespace.to_owned();
        actix::System::new().block_on(async move {
            let before = rss_bytes();
            let mut config = KubernetesConfig::new(KubeAccess::Kubeconfig(kubeconfig.into()));
            config.namespace = namespace.clone();
            let store = KubernetesStore::connect(config).await?;
            let grown = rss_bytes().saturating_sub(before);
            let (objects, _) = store.list(Kind::ConfigMap, Some(&namespace))?;
            let blobs: Vec<_> = objects
                .iter()
                .filter(|o| o.key().name.starts_with("blob-"))
                .collect();
            let bytes: usize = blobs
                .iter()
                .map(|o| serde_json::to_vec(o).map(|v| v.len()))
                .sum::<Result<_, _>>()?;
            println!("{RSS_LINE} {grown} {} {bytes}", blobs.len());
            Ok(())
        })
    }

    /// Deletes what the run made: pods at once (no kubelet will finish a
    /// graceful deletion), the namespaces, the Node and its Lease.
    async fn cleanup(client: &kube::Client, id: &str, simulated: usize) -> Result<()> {
        let mut failures = Vec::new();
        let namespaces: Api<Namespace> = Api::all(client.clone());
        let names = ["ctl", "raw", "rss", "idle"].map(|suffix| format!("{id}-{suffix}"));
        for name in &names {
            let pods: Api<Pod> = Api::namespaced(client.clone(), name);
            if let Err(err) = pods
                .delete_collection(&gone_now(), &ListParams::default())
                .await
                && !is_code(&err, 404)
            {
                failures.push(format!("pods of {name}: {err}"));
            }
            if let Err(err) = namespaces.delete(name, &DeleteParams::default()).await
                && !is_code(&err, 404)
            {
                failures.push(format!("namespace {name}: {err}"));
            }
        }
        let leases: Api<Lease> = Api::namespaced(client.clone(), NODE_LEASES);
        if let Err(err) = leases.delete(id, &DeleteParams::default()).await
            && !is_code(&err, 404)
        {
            failures.push(format!("lease {id}: {err}"));
        }
        let nodes: Api<Node> = Api::all(client.clone());
        let simulated = (0..simulated).map(sim_node);
        for node in std::iter::once(id.to_owned()).chain(simulated) {
            if let Err(err) = nodes.delete(&node, &DeleteParams::default()).await
                && !is_code(&err, 404)
            {
                failures.push(format!("node {node}: {err}"));
            }
            if node != id
                && let Err(err) = leases.delete(&node, &DeleteParams::default()).await
                && !is_code(&err, 404)
            {
                failures.push(format!("lease {node}: {err}"));
            }
        }
        // The namespaces go once their contents have.
        let deadline = Instant::now() + Duration::from_secs(120);
        for name in &names {
            while namespaces.get_opt(name).await?.is_some() {
                if Instant::now() > deadline {
                    failures.push(format!("namespace {name} still terminating"));
                    break;
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        }
        if failures.is_empty() {
            Ok(())
        } else {
            bail!("cleanup of {id}: {}", failures.join("; "))
        }
    }
}
