//! cloudcore's memory, measured on the real `cloudcore` binary as a user
//! runs it: its resident set (`VmRSS` of `/proc/<pid>/status`) at each
//! step, each figure beside a baseline from the same run.
//!
//! `cargo bench --bench throughput -- memory`.
//!
//! - **Embedded store**: 3,000 configmaps of about 2.1 KiB (6.3 MB of JSON,
//!   the issue's "new user" case) applied through the admin API in one
//!   manifest, then applied again unchanged, then as many others of the
//!   same size in a second manifest, then all deleted. Baselines: the RSS
//!   of the same cloudcore before them (its fixed base) and the JSON size
//!   of what it then holds, for the first 3,000 and for the growth the
//!   second 3,000 cost (past the bounded caches the first filled); for
//!   the unchanged re-apply, a read of all of them through the same API.
//! - **Kubernetes** (with `EDGEHIVE_TEST_KUBECONFIG`): cloudcore in
//!   Kubernetes mode with one simulated node (the hub bench's nodes, which
//!   acknowledge every object; certificates from cloudcore's own CA),
//!   1,000 stock pods bound to it (created by a bare client with the
//!   offline tolerations cloudcore's admission webhook gives them, so
//!   nothing is written back), then a label patch of each; then ten rounds
//!   of create 1,000 / patch / delete, RSS after the first and the last.
//!   Then a fresh cloudcore and a real `edgecore` joined to it as a user
//!   joins one (edged off: only delivery), 1,000 stock pods to its node
//!   while a bare kube-rs watch of the same namespace runs in a process of
//!   its own: each process's CPU time per pod (`/proc/<pid>/stat`), the
//!   watch's as the baseline, and the edgecore's RSS before and after.
//!   Then a fresh cloudcore with 1,000 simulated nodes and 10 pods on each.
//!   Every step waits until cloudhub has every message acknowledged
//!   (`/metrics`: acknowledgements and nothing pending).
//!
//! KubeEdge's cloudcore is not run here (no binary of it may be built into
//! this project); its figure on the same work is quoted in
//! docs/kubernetes.md.
//!
//! One concern: the `memory` group, cloudcore and edgecore run as
//! processes and measured from outside (RSS, CPU time).

use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, anyhow, bail};
use hub::certs::CloudCa;
use serde_json::{Value, json};
use transports::testing::free_address;

use crate::hub_bench::ChildGuard;
use crate::report::Report;

/// How long any one wait may take.
const WAIT: Duration = Duration::from_secs(300);
const MIB: f64 = 1024.0 * 1024.0;

/// A running `cloudcore`, killed when dropped.
pub(crate) struct Cloudcore {
    child: Child,
    data: PathBuf,
    hub: String,
    certs: String,
    admin: String,
    metrics: String,
    ca: CloudCa,
}

impl Drop for Cloudcore {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Cloudcore {
    /// Starts cloudcore with its data in `dir/name`, on the API server of
    /// `kubeconfig` or its embedded store; once its endpoints are up.
    pub(crate) fn start(dir: &Path, name: &str, kubeconfig: Option<&Path>) -> Result<Cloudcore> {
        let data = dir.join(name);
        std::fs::create_dir_all(&data)?;
        // Made here, where cloudcore looks for its CA: the simulated nodes'
        // certificates come from it.
        let ca = CloudCa::load_or_create(&data.join("ca"))?;
        let (hub, certs, admin, metrics) = (
            free_address(),
            free_address(),
            free_address(),
            free_address(),
        );
        let log = std::fs::File::create(data.join("cloudcore.log"))?;
        let mut command = Command::new(env!("CARGO_BIN_EXE_bench-cloudcore"));
        command.arg("--data-dir").arg(&data).arg("run");
        if let Some(kubeconfig) = kubeconfig {
            command.arg("--kubeconfig").arg(kubeconfig);
        }
        command
            .args(["--ws", &hub, "--certs", &certs, "--admin", &admin])
            .args(["--admin-insecure", "--metrics", &metrics])
            .args(["--stream", "off", "--metrics-server", "off"])
            // The simulated nodes send a keepalive every 20 s.
            .args(["--keepalive-secs", "60"])
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        let child = command.spawn().context("start cloudcore")?;
        let cloudcore = Cloudcore {
            child,
            data,
            hub,
            certs,
            admin,
            metrics,
            ca,
        };
        cloudcore.wait_for_log("admin API ready")?;
        Ok(cloudcore)
    }

    fn wait_for_log(&self, line: &str) -> Result<()> {
        let path = self.data.join("cloudcore.log");
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let log = std::fs::read_to_string(&path).unwrap_or_default();
            if log.contains(line) {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("cloudcore never logged {line:?}; its log:\n{log}");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Its resident set, in bytes.
    pub(crate) fn rss(&self) -> Result<u64> {
        rss_of(self.child.id())
    }

    /// Its RSS in MiB, after a moment for what a step freed to be freed.
    fn settled_rss(&self) -> Result<f64> {
        std::thread::sleep(Duration::from_secs(2));
        Ok(self.rss()? as f64 / MIB)
    }

    /// A counter or gauge of its `/metrics` page (0 if absent).
    fn metric(&self, name: &str) -> Result<f64> {
        let (_, page) = http(&self.metrics, "GET", "/metrics", None)?;
        let page = String::from_utf8_lossy(&page);
        Ok(page
            .lines()
            .find_map(|line| line.strip_prefix(name)?.strip_prefix(' '))
            .and_then(|value| value.trim().parse().ok())
            .unwrap_or(0.0))
    }

    /// Waits until cloudhub counts `at_least` acknowledgements in all and
    /// has none pending (another process's state: asked every 200 ms).
    async fn wait_acked(&self, at_least: f64, what: &str) -> Result<()> {
        let deadline = Instant::now() + WAIT;
        loop {
            let acked = self.metric("edgehive_cloudhub_acked_total")?;
            let pending = self.metric("edgehive_cloudhub_acks_pending")?;
            if acked >= at_least && pending == 0.0 {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("{what}: {acked} of {at_least} acknowledged, {pending} pending");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    fn acked(&self) -> Result<f64> {
        self.metric("edgehive_cloudhub_acked_total")
    }

    /// A real `edgecore` of node `node`, joined with a token from this
    /// cloudcore as a user joins one, its data under `dir`, edged off (no
    /// containers: only delivery is measured); linked once cloudhub counts
    /// `linked` nodes.
    fn edgecore(&self, dir: &Path, node: &str, linked: usize) -> Result<ChildGuard> {
        let token = Command::new(env!("CARGO_BIN_EXE_bench-cloudcore"))
            .arg("--data-dir")
            .arg(&self.data)
            .args(["token", "--ttl-secs", "600"])
            .output()
            .context("cloudcore token")?;
        if !token.status.success() {
            bail!(
                "cloudcore token: {}",
                String::from_utf8_lossy(&token.stderr)
            );
        }
        let token = String::from_utf8_lossy(&token.stdout).trim().to_owned();
        let data = dir.join(format!("edge-{node}"));
        let joined = Command::new(env!("CARGO_BIN_EXE_bench-edgecore"))
            .arg("--data-dir")
            .arg(&data)
            .args([
                "join",
                "--certs",
                &self.certs,
                "--token",
                &token,
                "--node",
                node,
            ])
            .output()
            .context("edgecore join")?;
        if !joined.status.success() {
            bail!("edgecore join: {}", String::from_utf8_lossy(&joined.stderr));
        }
        let log = std::fs::File::create(dir.join(format!("edgecore-{node}.log")))?;
        let child = Command::new(env!("CARGO_BIN_EXE_bench-edgecore"))
            .arg("--data-dir")
            .arg(&data)
            .args(["run", "--cloud", &self.hub, "--transport", "ws"])
            .args(["--cri-socket", "off", "--metrics", "off"])
            .args([
                "--metaserver",
                &free_address(),
                "--edged-server",
                &free_address(),
            ])
            .args(["--mqtt-broker", &free_address()])
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("start edgecore")?;
        let edge = ChildGuard(child);
        self.wait_linked(linked, &format!("edgecore {node}"))?;
        Ok(edge)
    }

    /// Waits until cloudhub counts `count` nodes connected (another
    /// process's state: asked every 200 ms).
    fn wait_linked(&self, count: usize, what: &str) -> Result<()> {
        let deadline = Instant::now() + WAIT;
        while self.metric("edgehive_cloudhub_nodes_connected")? < count as f64 {
            if Instant::now() > deadline {
                bail!("{what}: not linked");
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        Ok(())
    }

    /// Starts `count` simulated nodes (`node-<first>`...), linked once
    /// all are connected.
    fn nodes(&self, first: usize, count: usize) -> Result<ChildGuard> {
        let identities = self.data.join(format!("identities-{first}"));
        let issued = (first..first + count)
            .map(|i| {
                self.ca.issue_client(
                    &crate::hub_bench::node_name(i),
                    hub::certs::NODES_GROUP,
                    Duration::from_secs(24 * 3600),
                )
            })
            .collect::<Result<Vec<_>, _>>()?;
        crate::hub_bench::write_identity_file(&identities, &self.ca.root(), &issued)?;
        let child = Command::new(std::env::current_exe()?)
            .args(["__hub-nodes", "--kind", "ws", "--dialect", "native"])
            .args(["--address", &self.hub, "--nodes", &count.to_string()])
            .args(["--first", &first.to_string(), "--identities"])
            .arg(&identities)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .context("spawn the simulated nodes")?;
        let nodes = ChildGuard(child);
        self.wait_linked(count, "the simulated nodes")?;
        Ok(nodes)
    }
}

/// The resident set of process `pid`, in bytes.
fn rss_of(pid: u32) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|kb| kb.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map(|kb| kb * 1024)
        .ok_or_else(|| anyhow!("no VmRSS in the status of process {pid}"))
}

/// The kernel's unit for a process's times in `/proc/<pid>/stat`
/// (`USER_HZ`, 100 on Linux's common architectures).
const USER_HZ: f64 = 100.0;

/// The CPU time process `pid` has spent so far, user and system, in
/// seconds (`utime` and `stime` of `/proc/<pid>/stat`).
pub(crate) fn cpu_seconds(pid: u32) -> Result<f64> {
    stat_cpu_seconds(Path::new(&format!("/proc/{pid}/stat")))
}

/// The CPU time, user and system, in seconds, of the process or thread
/// whose `stat` file is `path`.
pub(crate) fn stat_cpu_seconds(path: &Path) -> Result<f64> {
    let stat = std::fs::read_to_string(path)?;
    // After the command name, which may hold spaces: state is the first
    // field, utime the 12th and stime the 13th.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    let ticks = |index: usize| -> Result<f64> {
        fields
            .get(index)
            .and_then(|field| field.parse::<u64>().ok())
            .map(|ticks| ticks as f64)
            .ok_or_else(|| anyhow!("no CPU times in {}", path.display()))
    };
    Ok((ticks(11)? + ticks(12)?) / USER_HZ)
}

/// One HTTP/1.0 request: the status code and the body.
fn http(address: &str, method: &str, path: &str, body: Option<&[u8]>) -> Result<(u16, Vec<u8>)> {
    let mut tcp = TcpStream::connect(address).with_context(|| format!("connect {address}"))?;
    tcp.set_read_timeout(Some(WAIT))?;
    let body = body.unwrap_or_default();
    let head = format!(
        "{method} {path} HTTP/1.0\r\nHost: cloudcore\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n",
        body.len()
    );
    tcp.write_all(head.as_bytes())?;
    tcp.write_all(body)?;
    let mut answer = Vec::new();
    tcp.read_to_end(&mut answer)?;
    let split = answer
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| anyhow!("no HTTP answer from {address}{path}"))?;
    let status = String::from_utf8_lossy(&answer[..split])
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| anyhow!("no status from {address}{path}"))?;
    Ok((status, answer[split + 4..].to_vec()))
}

/// The `memory` group: the embedded half, then the Kubernetes half when
/// `EDGEHIVE_TEST_KUBECONFIG` names an API server (else it says it was
/// skipped).
pub fn run(quick: bool, report: &mut Report) -> Result<()> {
    embedded(if quick { 300 } else { 3_000 }, report)?;
    let Some(kubeconfig) = std::env::var(crate::controller_bench::KUBECONFIG_ENV)
        .ok()
        .filter(|path| !path.is_empty())
    else {
        let why = "skipped: EDGEHIVE_TEST_KUBECONFIG (a real kube-apiserver) not set";
        eprintln!("cloudcore/k8s: {why}");
        report.plain("cloudcore/k8s", why, f64::NAN, "-");
        return Ok(());
    };
    let kubeconfig = PathBuf::from(kubeconfig);
    let id = crate::controller_bench::kubernetes::run_id("edgehive-bench-mem");
    let pods = if quick { 100 } else { 1_000 };
    actix::System::new().block_on(async {
        let client = crate::controller_bench::kubernetes::client(&kubeconfig).await?;
        kubernetes::run(&client, &kubeconfig, &id, pods, report).await
    })
}

/// The configmaps cloudcore holds in `default`, listed through its read
/// API: how many, their JSON size (item by item, as stored), and how long
/// the list request took.
fn listed(cloud: &Cloudcore) -> Result<(usize, usize, Duration)> {
    let started = Instant::now();
    let (status, listed) = http(
        &cloud.admin,
        "GET",
        "/api/v1/namespaces/default/configmaps",
        None,
    )?;
    let took = started.elapsed();
    if status != 200 {
        bail!("list: {status}");
    }
    let listed: Value = serde_json::from_slice(&listed)?;
    let items = listed["items"].as_array().map_or(&[][..], Vec::as_slice);
    let bytes = items
        .iter()
        .map(|item| serde_json::to_vec(item).map(|bytes| bytes.len()))
        .sum::<Result<_, _>>()?;
    Ok((items.len(), bytes, took))
}

/// A configmap of about 2.1 KiB of JSON.
fn configmap(name: &str, namespace: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": namespace, "labels": {"app": "edgehive-bench"}},
        "data": {"config.yaml": format!("name: {name}\n{}", "setting: value-of-the-setting\n".repeat(64))},
    })
}

/// The embedded store: 3,000 configmaps applied, applied again unchanged,
/// deleted.
pub fn embedded(configmaps: usize, report: &mut Report) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let cloud = Cloudcore::start(dir.path(), "embedded", None)?;
    let base = cloud.settled_rss()?;
    let manifest_of = |prefix: &str| {
        let objects: Vec<Value> = (0..configmaps)
            .map(|i| configmap(&format!("{prefix}-{i:05}"), "default"))
            .collect();
        serde_json::to_vec(&json!({"apiVersion": "v1", "kind": "List", "items": objects}))
    };
    let (manifest, more) = (manifest_of("settings")?, manifest_of("more")?);
    let post = |path: &str, body: &[u8], what: &str| -> Result<Duration> {
        let started = Instant::now();
        let (status, answer) = http(&cloud.admin, "POST", path, Some(body))?;
        if status != 200 {
            bail!("{what}: {status} {}", String::from_utf8_lossy(&answer));
        }
        Ok(started.elapsed())
    };
    const APPLY: &str = "/apis/edgehive.io/v1/apply";
    const DELETE: &str = "/apis/edgehive.io/v1/delete";
    let created = post(APPLY, &manifest, "apply")?;
    let held = cloud.settled_rss()?;
    let (count, json_bytes, read) = listed(&cloud)?;
    if count < configmaps {
        bail!("the store holds {count} of {configmaps} configmaps");
    }
    let reapplied = post(APPLY, &manifest, "unchanged re-apply")?;
    let after_reapply = cloud.settled_rss()?;
    // As many again, of the same size: what holding more costs, past the
    // bounded caches (redb's pages, the change feed's window) the first
    // ones filled.
    post(APPLY, &more, "a second apply")?;
    let held_twice = cloud.settled_rss()?;
    let (count, all_json, _) = listed(&cloud)?;
    if count < 2 * configmaps {
        bail!("the store holds {count} of {} configmaps", 2 * configmaps);
    }
    let more_json = all_json - json_bytes;
    post(DELETE, &manifest, "delete")?;
    post(DELETE, &more, "delete of the second")?;
    let after_delete = cloud.settled_rss()?;
    eprintln!(
        "cloudcore/embedded: {configmaps} configmaps ({:.1} MB of JSON) applied in {created:.2?}, \
         re-applied unchanged in {reapplied:.2?}, listed in {read:.2?}; RSS {base:.1} MiB idle, \
         {held:.1} holding them, {after_reapply:.1} after the re-apply, {held_twice:.1} holding \
         twice as many, {after_delete:.1} after the deletion of all",
        json_bytes as f64 / 1e6
    );
    let scenario = format!("cloudcore/embedded {configmaps} configmaps");
    report.with_baseline(
        &scenario,
        "RSS over the idle base",
        held - base,
        "MiB",
        json_bytes as f64 / MIB,
        "their JSON as stored",
    );
    report.with_baseline(
        &scenario,
        "RSS for as many more",
        held_twice - after_reapply,
        "MiB",
        more_json as f64 / MIB,
        "their JSON as stored",
    );
    report.with_baseline(
        &scenario,
        "RSS holding them",
        held,
        "MiB",
        base,
        "idle cloudcore",
    );
    report.with_baseline(
        &scenario,
        "unchanged re-apply",
        reapplied.as_secs_f64() * 1000.0,
        "ms",
        read.as_secs_f64() * 1000.0,
        "a list of them (a read)",
    );
    report.with_baseline(
        &scenario,
        "RSS after deleting all",
        after_delete,
        "MiB",
        held_twice,
        "RSS holding twice as many",
    );
    Ok(())
}

pub mod kubernetes {
    //! The Kubernetes half: cloudcore in Kubernetes mode on the test
    //! suite's API server.

    use std::path::Path;
    use std::time::{Duration, Instant};

    use anyhow::{Result, bail};
    use k8s_openapi::api::coordination::v1::Lease;
    use k8s_openapi::api::core::v1::{Node, Pod};
    use kube::api::{Api, DeleteParams, ListParams};

    use super::{Cloudcore, WAIT};
    use crate::controller_bench::admitted_pod;
    use crate::controller_bench::kubernetes::{gone_now, patch_all};
    use crate::hub_bench::node_name;
    use crate::report::Report;

    /// The simulated nodes' numbers here, apart from other scenarios'.
    const FIRST_NODE: usize = 60_000;
    /// Rounds of the churn.
    const ROUNDS: usize = 10;

    /// Waits until the API server has the Node of each of `names`
    /// (cloudcore registers a node when it links): pods are
    /// bound to nodes that exist, as a scheduler binds them. A pod bound to
    /// a node that is no edge node yet is left out of cloudcore's watch and
    /// makes it list every pod again once the node joins.
    async fn registered(
        client: &kube::Client,
        names: impl IntoIterator<Item = String>,
    ) -> Result<()> {
        let nodes: Api<Node> = Api::all(client.clone());
        let wanted: std::collections::BTreeSet<String> = names.into_iter().collect();
        let count = wanted.len();
        let deadline = Instant::now() + WAIT;
        loop {
            let listed = nodes.list(&ListParams::default()).await?;
            let present = listed
                .items
                .iter()
                .filter_map(|node| node.metadata.name.as_ref())
                .filter(|name| wanted.contains(*name))
                .count();
            if present == count {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("{present} of {count} nodes registered");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// A stock pod as cloudcore's admission webhook lets it through: its
    /// offline tolerations already a day long (so cloudcore writes
    /// nothing back).
    fn pod(name: &str, namespace: &str, node: &str) -> Result<Pod> {
        Ok(serde_json::from_value(admitted_pod(name, namespace, node))?)
    }

    /// Creates a pod of each name, bound to the node beside it.
    async fn create_pods(
        api: &Api<Pod>,
        names: &[(String, String)],
        namespace: &str,
    ) -> Result<()> {
        let pods = names
            .iter()
            .map(|(name, node)| pod(name, namespace, node))
            .collect::<Result<Vec<_>>>()?;
        crate::controller_bench::kubernetes::create_pods(api, pods)
            .await
            .map(drop)
    }

    async fn patch_pods(api: &Api<Pod>, names: &[(String, String)], round: usize) -> Result<()> {
        let names: Vec<String> = names.iter().map(|(name, _)| name.clone()).collect();
        patch_all(api, &names, &round.to_string()).await.map(drop)
    }

    /// Every pod of `api`'s namespace, gone at once.
    async fn delete_all(api: &Api<Pod>) -> Result<()> {
        api.delete_collection(&gone_now(), &ListParams::default())
            .await?;
        Ok(())
    }

    /// Runs `step` and waits until `cloud` has `expected` more
    /// acknowledgements than before it.
    async fn acked_after(
        cloud: &Cloudcore,
        expected: usize,
        what: &str,
        step: impl std::future::Future<Output = Result<()>>,
    ) -> Result<()> {
        let before = cloud.acked()?;
        step.await?;
        cloud.wait_acked(before + expected as f64, what).await
    }

    /// Runs the Kubernetes half in namespaces `<id>-mem...`; cleans up.
    pub async fn run(
        client: &kube::Client,
        kubeconfig: &Path,
        id: &str,
        pods: usize,
        report: &mut Report,
    ) -> Result<()> {
        let outcome = measure(client, kubeconfig, id, pods, report).await;
        // A clean-up the API server could not finish (it times out when
        // loaded) is said, and loses none of the figures measured.
        if let Err(err) = cleanup(client, id, pods).await {
            eprintln!("cloudcore/k8s: {err}");
        }
        outcome
    }

    async fn measure(
        client: &kube::Client,
        kubeconfig: &Path,
        id: &str,
        pods: usize,
        report: &mut Report,
    ) -> Result<()> {
        let dir = tempfile::tempdir()?;
        let namespace = format!("{id}-mem");
        crate::controller_bench::kubernetes::namespace(client, &namespace).await?;
        let api: Api<Pod> = Api::namespaced(client.clone(), &namespace);

        // One node, 1,000 pods; their updates; then the churn.
        let cloud = Cloudcore::start(dir.path(), "one-node", Some(kubeconfig))?;
        let _node = cloud.nodes(FIRST_NODE, 1)?;
        registered(client, [node_name(FIRST_NODE)]).await?;
        let node = node_name(FIRST_NODE);
        let idle = cloud.settled_rss()?;
        let names: Vec<(String, String)> = (0..pods)
            .map(|i| (format!("m-{i:05}"), node.clone()))
            .collect();
        acked_after(
            &cloud,
            pods,
            "the pods",
            create_pods(&api, &names, &namespace),
        )
        .await?;
        let held = cloud.settled_rss()?;
        let json_bytes: usize = api
            .list(&ListParams::default())
            .await?
            .items
            .iter()
            .map(|pod| serde_json::to_vec(pod).map(|bytes| bytes.len()))
            .sum::<Result<_, _>>()?;
        acked_after(&cloud, pods, "the patches", patch_pods(&api, &names, 0)).await?;
        let updated = cloud.settled_rss()?;
        acked_after(&cloud, pods, "the deletions", delete_all(&api)).await?;

        let mut after_round = Vec::new();
        for round in 0..ROUNDS {
            let names: Vec<(String, String)> = (0..pods)
                .map(|i| (format!("r{round}-{i:05}"), node.clone()))
                .collect();
            acked_after(
                &cloud,
                pods,
                "a round's pods",
                create_pods(&api, &names, &namespace),
            )
            .await?;
            acked_after(
                &cloud,
                pods,
                "a round's patches",
                patch_pods(&api, &names, round),
            )
            .await?;
            acked_after(&cloud, pods, "a round's deletions", delete_all(&api)).await?;
            after_round.push(cloud.settled_rss()?);
            eprintln!(
                "cloudcore/k8s: churn round {round}: RSS {:.1} MiB",
                after_round[round]
            );
        }
        drop(cloud);

        let cpu = edge_cpu(client, kubeconfig, dir.path(), id, pods, &api, &namespace).await?;

        // 1,000 nodes, 10 pods each.
        let nodes = pods;
        let cloud = Cloudcore::start(dir.path(), "many-nodes", Some(kubeconfig))?;
        let _nodes = cloud.nodes(FIRST_NODE + 1, nodes)?;
        registered(client, (FIRST_NODE + 1..=FIRST_NODE + nodes).map(node_name)).await?;
        let nodes_idle = cloud.settled_rss()?;
        let names: Vec<(String, String)> = (0..nodes * 10)
            .map(|i| (format!("n-{i:05}"), node_name(FIRST_NODE + 1 + i % nodes)))
            .collect();
        acked_after(
            &cloud,
            names.len(),
            "the pods on 1,000 nodes",
            create_pods(&api, &names, &namespace),
        )
        .await?;
        let nodes_held = cloud.settled_rss()?;
        drop(cloud);

        eprintln!(
            "cloudcore/k8s: RSS {idle:.1} MiB idle with one node, {held:.1} with {pods} pods \
             ({:.1} MB of JSON as the API server returns them), {updated:.1} after their updates; \
             churn rounds {after_round:.1?}; {nodes_idle:.1} with {nodes} idle nodes, \
             {nodes_held:.1} with {} pods on them",
            json_bytes as f64 / 1e6,
            names.len()
        );
        let scenario = format!("cloudcore/k8s {pods} pods on 1 node");
        report.with_baseline(&scenario, "RSS", held, "MiB", idle, "idle, one node linked");
        report.with_baseline(
            &scenario,
            "RSS growth per pod",
            (held - idle) * 1024.0 / pods as f64,
            "KiB",
            json_bytes as f64 / 1024.0 / pods as f64,
            "the pod's JSON from the API server",
        );
        report.with_baseline(
            &scenario,
            "RSS after an update of each",
            updated,
            "MiB",
            held,
            "before",
        );
        cpu.report(pods, report);
        let (first, last) = (after_round[0], after_round[ROUNDS - 1]);
        report.with_baseline(
            &format!("cloudcore/k8s churn {pods} pods x {ROUNDS}"),
            "RSS after the last round",
            last,
            "MiB",
            first,
            "after the first round",
        );
        report.with_baseline(
            &format!("cloudcore/k8s {nodes} nodes x 10 pods"),
            "RSS",
            nodes_held,
            "MiB",
            nodes_idle,
            "the nodes linked, no pods",
        );
        Ok(())
    }

    /// The real edge node's name in run `id`.
    fn edge_node(id: &str) -> String {
        format!("{id}-edge")
    }

    /// CPU seconds spent while the pods went out, per process.
    struct EdgeCpu {
        edgecore: f64,
        cloudcore: f64,
        bare_watch: f64,
        edge_idle_rss: f64,
        edge_rss: f64,
    }

    impl EdgeCpu {
        fn report(&self, pods: usize, report: &mut Report) {
            let per_pod = |seconds: f64| seconds * 1000.0 / pods as f64;
            let scenario = format!("cloudcore/k8s {pods} pods to a real edgecore");
            let watch = "a bare kube-rs watch of the same pods";
            report.with_baseline(
                &scenario,
                "edgecore CPU per pod",
                per_pod(self.edgecore),
                "ms",
                per_pod(self.bare_watch),
                watch,
            );
            report.with_baseline(
                &scenario,
                "cloudcore CPU per pod",
                per_pod(self.cloudcore),
                "ms",
                per_pod(self.bare_watch),
                watch,
            );
            report.with_baseline(
                &scenario,
                "edgecore RSS",
                self.edge_rss,
                "MiB",
                self.edge_idle_rss,
                "the same edgecore before them",
            );
        }
    }

    /// A fresh cloudcore and a real `edgecore` (edged off) joined to it;
    /// `pods` stock pods bound to that node, created by a bare client
    /// while a bare kube-rs watch (this binary again, a process of its
    /// own) watches the same namespace: the CPU time each process spent
    /// from before the first create until the edge acknowledged the last
    /// pod and the watch had seen it.
    async fn edge_cpu(
        client: &kube::Client,
        kubeconfig: &Path,
        dir: &Path,
        id: &str,
        pods: usize,
        api: &Api<Pod>,
        namespace: &str,
    ) -> Result<EdgeCpu> {
        let cloud = Cloudcore::start(dir, "edge-cpu", Some(kubeconfig))?;
        let node = edge_node(id);
        let edge = cloud.edgecore(dir, &node, 1)?;
        registered(client, [node.clone()]).await?;
        let watch = BareWatch::start(namespace, pods)?;
        let edge_idle_rss = super::rss_of(edge.0.id())? as f64 / super::MIB;
        let before = (
            super::cpu_seconds(edge.0.id())?,
            super::cpu_seconds(cloud.child.id())?,
        );
        let names: Vec<(String, String)> = (0..pods)
            .map(|i| (format!("e-{i:05}"), node.clone()))
            .collect();
        acked_after(
            &cloud,
            pods,
            "the pods to a real edgecore",
            create_pods(api, &names, namespace),
        )
        .await?;
        let after = (
            super::cpu_seconds(edge.0.id())?,
            super::cpu_seconds(cloud.child.id())?,
        );
        let bare_watch = watch.finish()?;
        let edge_rss = super::rss_of(edge.0.id())? as f64 / super::MIB;
        acked_after(&cloud, pods, "their deletions", delete_all(api)).await?;
        drop(edge);
        drop(cloud);
        eprintln!(
            "cloudcore/k8s: {pods} pods to a real edgecore: CPU edgecore {:.2} s, cloudcore \
             {:.2} s, a bare watch {bare_watch:.2} s; edgecore RSS {edge_idle_rss:.1} → \
             {edge_rss:.1} MiB",
            after.0 - before.0,
            after.1 - before.1
        );
        Ok(EdgeCpu {
            edgecore: after.0 - before.0,
            cloudcore: after.1 - before.1,
            bare_watch,
            edge_idle_rss,
            edge_rss,
        })
    }

    /// The baseline's process: this binary again (`__pod-watch`), watching
    /// a namespace's pods until it has seen a number of them created.
    pub(crate) struct BareWatch {
        child: super::ChildGuard,
        lines: std::io::Lines<std::io::BufReader<std::process::ChildStdout>>,
        ready_at: f64,
    }

    impl BareWatch {
        /// Started, and watching once this returns.
        pub(crate) fn start(namespace: &str, pods: usize) -> Result<BareWatch> {
            use std::io::BufRead as _;
            let mut child = std::process::Command::new(std::env::current_exe()?)
                .args([
                    "__pod-watch",
                    "--mode",
                    namespace,
                    "--nodes",
                    &pods.to_string(),
                ])
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::piped())
                .spawn()?;
            let stdout = child
                .stdout
                .take()
                .ok_or_else(|| anyhow::anyhow!("the watch's stdout"))?;
            let mut watch = BareWatch {
                child: super::ChildGuard(child),
                lines: std::io::BufReader::new(stdout).lines(),
                ready_at: 0.0,
            };
            watch.ready_at = watch.said("watching")?;
            Ok(watch)
        }

        /// The CPU seconds it spent watching, once it has seen them all.
        fn finish(mut self) -> Result<f64> {
            let done_at = self.said("seen")?;
            let _ = self.child.0.wait();
            Ok(done_at - self.ready_at)
        }

        /// The CPU seconds it gave with its next line, which says `what`.
        fn said(&mut self, what: &str) -> Result<f64> {
            let line = self
                .lines
                .next()
                .ok_or_else(|| anyhow::anyhow!("the bare watch ended before saying {what:?}"))??;
            line.strip_prefix(what)
                .and_then(|rest| rest.trim().parse().ok())
                .ok_or_else(|| anyhow::anyhow!("the bare watch said {line:?}, not {what:?}"))
        }
    }

    /// `__pod-watch`: watches `namespace`'s pods (kubeconfig from
    /// `EDGEHIVE_TEST_KUBECONFIG`) until `count` named `e-...` were added;
    /// prints its CPU seconds once watching and once it saw them.
    pub fn watch_child(namespace: &str, count: usize) -> Result<()> {
        use futures_util::TryStreamExt as _;
        use kube::api::{WatchEvent, WatchParams};
        let kubeconfig = std::env::var(crate::controller_bench::KUBECONFIG_ENV)?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        runtime.block_on(async {
            let client =
                crate::controller_bench::kubernetes::client(Path::new(&kubeconfig)).await?;
            let api: Api<Pod> = Api::namespaced(client, namespace);
            // From the namespace's current version: what is created next.
            let from = api
                .list_metadata(&ListParams::default().limit(1))
                .await?
                .metadata
                .resource_version
                .unwrap_or_default();
            let stream = api.watch(&WatchParams::default(), &from).await?;
            let me = std::process::id();
            println!("watching {}", super::cpu_seconds(me)?);
            let mut stream = std::pin::pin!(stream);
            let mut seen = std::collections::HashSet::new();
            while seen.len() < count {
                match stream.try_next().await? {
                    Some(WatchEvent::Added(pod)) => {
                        if let Some(name) = pod.metadata.name.filter(|n| n.starts_with("e-")) {
                            seen.insert(name);
                        }
                    }
                    Some(WatchEvent::Error(status)) => bail!("the watch failed: {status:?}"),
                    Some(_) => {}
                    None => bail!("the watch ended after {} pods", seen.len()),
                }
            }
            println!("seen {}", super::cpu_seconds(me)?);
            Ok(())
        })
    }

    async fn cleanup(client: &kube::Client, id: &str, pods: usize) -> Result<()> {
        let namespace = format!("{id}-mem");
        let api: Api<Pod> = Api::namespaced(client.clone(), &namespace);
        let mut failures = Vec::new();
        if let Err(err) = delete_all(&api).await {
            failures.push(format!("pods: {err}"));
        }
        let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
        if let Err(err) = namespaces
            .delete(&namespace, &DeleteParams::default())
            .await
        {
            failures.push(format!("namespace: {err}"));
        }
        let nodes: Api<Node> = Api::all(client.clone());
        let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-node-lease");
        let names = (FIRST_NODE..=FIRST_NODE + pods)
            .map(node_name)
            .chain([edge_node(id)]);
        for name in names {
            let _ = nodes.delete(&name, &DeleteParams::default()).await;
            let _ = leases.delete(&name, &DeleteParams::default()).await;
        }
        if failures.is_empty() {
            Ok(())
        } else {
            bail!("cleanup of {namespace}: {}", failures.join("; "))
        }
    }
}
