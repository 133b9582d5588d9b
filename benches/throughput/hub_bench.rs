//! `hub` scenarios: N simulated nodes against one cloudhub on this machine.
//!
//! The nodes run in a child process (this binary in a hidden mode), so the
//! cloud's RSS per idle node session is the cloud's own. Measured: time for
//! all N to connect, cloud RSS per idle session, time to fan one update out
//! to all nodes and get every ack back, and one node's sustained downstream
//! objects/s, next to the raw socket figure of the same family (the
//! transport benchmark's baseline) for frames of the same size.

use std::io::{Read, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, anyhow, bail};
use beehive::{Hive, HiveConfig, Message};
use hub::{CloudEndpoint, CloudHub, CloudHubConfig, Dialect, HubStats, protocol};
use transports::tls::{self, CertificateDer, DevPki, PrivateKeyDer};
use transports::{DialOptions, ListenOptions, TransportKind};

use crate::Scale;
use crate::report::Report;

const KEEPALIVE: Duration = Duration::from_secs(60);

/// Dials a simulated node makes before it gives up.
const DIAL_ATTEMPTS: u64 = 10;

pub(crate) fn rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map_or(0, |pages| pages * 4096)
}

pub(crate) fn object(node: &str, name: &str, version: u64) -> Message {
    Message::new()
        .build_router(
            "edgecontroller",
            "resource",
            format!("node/{node}/default/pod/{name}"),
            "update",
        )
        .with_resource_version(version.to_string())
        .with_content(
            beehive::Content::of(
                &serde_json::json!({"metadata": {"name": name}, "spec": {"nodeName": node}}),
            )
            .expect("json body"),
        )
}

pub(crate) fn node_name(i: usize) -> String {
    format!("node-{i:05}")
}

/// Writes the CA root and one client identity per node for the child.
pub(crate) fn write_identities(pki: &DevPki, nodes: usize, path: &Path) -> Result<()> {
    let identities = (0..nodes)
        .map(|i| pki.client(&node_name(i)))
        .collect::<Result<Vec<_>, _>>()?;
    write_identity_file(path, &pki.root(), &identities)
}

/// Writes `root` and each identity's leaf certificate and key, for a
/// child process to read with [`read_identities`].
pub(crate) fn write_identity_file(
    path: &Path,
    root: &CertificateDer<'static>,
    identities: &[(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)],
) -> Result<()> {
    let mut out = std::io::BufWriter::new(std::fs::File::create(path)?);
    let mut put = |bytes: &[u8]| -> std::io::Result<()> {
        out.write_all(&(bytes.len() as u32).to_be_bytes())?;
        out.write_all(bytes)
    };
    put(root.as_ref())?;
    for (chain, key) in identities {
        let leaf = chain.first().ok_or_else(|| anyhow!("an empty chain"))?;
        put(leaf.as_ref())?;
        put(key.secret_der())?;
    }
    out.flush()?;
    Ok(())
}

pub(crate) fn read_identities(
    path: &Path,
) -> Result<(
    CertificateDer<'static>,
    Vec<(CertificateDer<'static>, PrivateKeyDer<'static>)>,
)> {
    let mut bytes = Vec::new();
    std::fs::File::open(path)?.read_to_end(&mut bytes)?;
    let mut at = 0usize;
    let mut next = || -> Result<Vec<u8>> {
        let header = bytes
            .get(at..at + 4)
            .ok_or_else(|| anyhow!("identity file truncated"))?;
        let len = u32::from_be_bytes([header[0], header[1], header[2], header[3]]) as usize;
        let item = bytes
            .get(at + 4..at + 4 + len)
            .ok_or_else(|| anyhow!("identity file truncated"))?
            .to_vec();
        at += 4 + len;
        Ok(item)
    };
    let root = CertificateDer::from(next()?);
    let mut identities = Vec::new();
    loop {
        let Ok(cert) = next() else { break };
        let key = PrivateKeyDer::try_from(next()?).map_err(|e| anyhow!("key: {e}"))?;
        identities.push((CertificateDer::from(cert), key));
    }
    Ok((root, identities))
}

/// The child: `nodes` simulated edges that say hello, ack every object and
/// send keepalives, until killed: nodes `first..first + nodes`.
/// `addresses` are the cloud's (its replicas, comma-separated): node `i`
/// dials address `i mod count` first (as a name resolving to several
/// would spread them) and, when a dial fails or its link ends, another at
/// random, as edges behind a load balancer would.
pub fn child_main(
    kind: TransportKind,
    dialect: Dialect,
    addresses: &str,
    first: usize,
    nodes: usize,
    identities: Option<&Path>,
) -> Result<()> {
    let _ = rlimit::increase_nofile_limit(u64::MAX);
    let addresses: Arc<Vec<String>> = Arc::new(addresses.split(',').map(str::to_owned).collect());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let identities = match identities {
            Some(path) => Some(read_identities(path)?),
            None => None,
        };
        let (root, mut certs) = match identities {
            // Exactly `nodes` identities: those of nodes `first..`; else
            // from node 0 on.
            Some((root, certs)) => {
                let skipped = if certs.len() == nodes { first } else { 0 };
                let certs = (0..skipped).map(|_| None).chain(certs.into_iter().map(Some));
                (Some(root), certs.collect::<Vec<_>>())
            }
            None => (None, (0..first + nodes).map(|_| None).collect()),
        };
        let dialing = Arc::new(tokio::sync::Semaphore::new(64));
        for (i, cert) in certs.drain(..).enumerate().skip(first).take(nodes) {
            let mut dial = dialect.dial_options(&node_name(i), DialOptions::new("", "localhost"));
            if let (Some(root), Some((cert, key))) = (&root, cert) {
                dial = dial.with_tls(tls::client_config(std::slice::from_ref(root), Some((vec![cert], key)))?);
            }
            // Each node its own transport, as on a real fleet: over QUIC
            // that is its own endpoint (UDP socket), not one shared by all.
            let transport = kind.transport()?;
            let (dialing, addresses) = (dialing.clone(), addresses.clone());
            tokio::spawn(async move {
                let mut at = i % addresses.len();
                let mut failures: u64 = 0;
                loop {
                    dial.address = addresses[at].clone();
                    let permit = dialing.acquire().await;
                    let link = transport.dial(&dial).await;
                    let mut link = match link {
                        Ok(link) => link,
                        Err(err) => {
                            drop(permit);
                            // One cloud that keeps refusing dials: give up,
                            // as the single-cloud runs always did.
                            if addresses.len() == 1 && failures >= DIAL_ATTEMPTS {
                                eprintln!("node {i}: {err}");
                                return;
                            }
                            tracing::debug!(node = i, %err, failures, "dialling again");
                            failures += 1;
                            at = another(at, addresses.len());
                            // A cloud busy accepting thousands lets its
                            // backlog fill: dial again, a little later.
                            tokio::time::sleep(Duration::from_millis(50 * failures.min(40))).await;
                            continue;
                        }
                    };
                    if link.sender.send(&dialect.opener(&node_name(i))).await.is_err() {
                        continue;
                    }
                    drop(permit);
                    let linked = Instant::now();
                    let mut keepalive = tokio::time::interval(KEEPALIVE / 3);
                    loop {
                        tokio::select! {
                            next = link.receiver.recv() => {
                                let Some(Ok(msg)) = next else { break };
                                if protocol::kind(&msg) == protocol::Kind::Payload && protocol::needs_ack(&msg) {
                                    let ack = dialect.ack(&msg);
                                    if link.sender.send(&ack).await.is_err() {
                                        break;
                                    }
                                }
                            }
                            _ = keepalive.tick() => {
                                let _ = link.sender.send(&dialect.keepalive()).await;
                            }
                        }
                    }
                    // The link ended (the replica died, refused the node
                    // or handed it over): the next address, at once after
                    // a long link, backing off after short ones.
                    failures = match linked.elapsed() > Duration::from_secs(1) {
                        true => 0,
                        false => failures + 1,
                    };
                    at = another(at, addresses.len());
                    let pause = 50 * failures.min(40) + fastrand::u64(0..50);
                    tokio::time::sleep(Duration::from_millis(pause)).await;
                }
            });
        }
        std::future::pending::<()>().await;
        Ok(())
    })
}

/// An address other than `at` among `count`, at random (`at` if alone).
fn another(at: usize, count: usize) -> usize {
    match count {
        0 | 1 => at,
        _ => (at + 1 + fastrand::usize(0..count - 1)) % count,
    }
}

pub(crate) struct ChildGuard(pub(crate) Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn wait_until(
    stats: &HubStats,
    limit: Duration,
    what: &str,
    condition: impl FnMut() -> bool,
) -> Result<()> {
    if stats.changes.wait_for(limit, condition).await {
        Ok(())
    } else {
        Err(anyhow!("{what} did not happen within {limit:?}"))
    }
}

pub(crate) fn get(counter: &std::sync::atomic::AtomicU64) -> u64 {
    HubStats::get(counter)
}

/// Runs the hub scenarios for each node count, each in a fresh cloud
/// process (so memory freed by one run cannot flatter the next), and adds
/// their rows.
pub fn run(
    _scale: Scale,
    kind: TransportKind,
    dialect: Dialect,
    node_counts: &[usize],
    quick: bool,
    report: &mut Report,
) -> Result<()> {
    for &nodes in node_counts {
        let mut command = Command::new(std::env::current_exe()?);
        command.args([
            "__hub-cloud",
            "--kind",
            kind.name(),
            "--dialect",
            &dialect.to_string(),
            "--nodes",
            &nodes.to_string(),
        ]);
        if quick {
            command.arg("--quick");
        }
        let output = command
            .stderr(Stdio::inherit())
            .output()
            .context("run the cloud process")?;
        if !output.status.success() {
            bail!("hub run with {nodes} nodes failed ({})", output.status);
        }
        for line in String::from_utf8_lossy(&output.stdout).lines() {
            let row: serde_json::Value =
                serde_json::from_str(line).with_context(|| format!("row {line:?}"))?;
            report.add_json(&row)?;
        }
    }
    Ok(())
}

/// The cloud process of one run: prints its rows as JSON lines.
pub fn cloud_main(scale: Scale, kind: TransportKind, dialect: Dialect, nodes: usize) -> Result<()> {
    let _ = rlimit::increase_nofile_limit(u64::MAX);
    let dir = std::env::temp_dir().join(format!("edgehive-hub-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let mut report = Report::default();
    let result =
        actix::System::new().block_on(one_run(scale, kind, dialect, nodes, &dir, &mut report));
    let _ = std::fs::remove_dir_all(&dir);
    result.with_context(|| format!("hub with {nodes} nodes"))?;
    report.print_json_rows()
}

async fn one_run(
    scale: Scale,
    kind: TransportKind,
    dialect: Dialect,
    nodes: usize,
    dir: &Path,
    report: &mut Report,
) -> Result<()> {
    let scenario = match dialect {
        Dialect::Native => format!("hub/{kind}/{nodes}"),
        Dialect::KubeEdge => format!("hub/{kind}-kubeedge/{nodes}"),
    };
    let pki = DevPki::new("edgehive bench CA")?;
    let mut options = ListenOptions::new(match kind {
        TransportKind::UnixSocket => dir
            .join(format!("cloud-{nodes}.sock"))
            .to_string_lossy()
            .into_owned(),
        _ => "127.0.0.1:0".to_owned(),
    });
    let identities = dir.join(format!("identities-{nodes}"));
    if kind != TransportKind::UnixSocket {
        let (chain, key) = pki.server("cloud")?;
        options = options.with_tls(tls::server_config(chain, key, Some(&[pki.root()]))?);
        write_identities(&pki, nodes, &identities)?;
    }
    let hive = Hive::new("cloud", HiveConfig::default());
    let config = CloudHubConfig {
        endpoints: vec![CloudEndpoint {
            kind,
            options,
            trust_hello: kind == TransportKind::UnixSocket,
            dialect,
        }],
        keepalive: KEEPALIVE,
        ..CloudHubConfig::default()
    };
    let handle = CloudHub::start(&hive, config).await?;
    let stats = handle.stats.clone();
    let address = handle.addresses[0].1.clone();
    let rss_before = rss_bytes();

    let mut command = Command::new(std::env::current_exe()?);
    command
        .args([
            "__hub-nodes",
            "--kind",
            kind.name(),
            "--dialect",
            &dialect.to_string(),
            "--address",
            &address,
            "--nodes",
            &nodes.to_string(),
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null());
    if kind != TransportKind::UnixSocket {
        command.arg("--identities").arg(&identities);
    }
    let started = Instant::now();
    let _child = ChildGuard(command.spawn().context("spawn the simulated nodes")?);
    let progress = stats.clone();
    let progress_scenario = scenario.clone();
    let reporter = actix::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_secs(5)).await;
            eprintln!(
                "{progress_scenario}: {} connected",
                get(&progress.connected)
            );
        }
    });
    let connected = wait_until(
        &stats,
        Duration::from_secs(300),
        "all nodes connected",
        || get(&stats.connected) == nodes as u64,
    )
    .await;
    reporter.abort();
    connected?;
    let connect = started.elapsed();
    let rss_after = rss_bytes();
    report.plain(&scenario, "connect_all", connect.as_secs_f64(), "s");
    report.plain(
        &scenario,
        "rss_per_session",
        rss_after.saturating_sub(rss_before) as f64 / nodes as f64 / 1024.0,
        "KiB",
    );

    // One update fanned out to every node, all acks back.
    let acked_before = get(&stats.acked);
    let started = Instant::now();
    for i in 0..nodes {
        hive.send("cloudhub", object(&node_name(i), "fan-out", 1))
            .await?;
    }
    wait_until(
        &stats,
        Duration::from_secs(300),
        "every fan-out ack",
        || get(&stats.acked) >= acked_before + nodes as u64,
    )
    .await?;
    report.plain(
        &scenario,
        "fan_out_all_acked",
        started.elapsed().as_secs_f64() * 1000.0,
        "ms",
    );

    // One node's sustained downstream.
    let objects = scale.messages / 10;
    let sample = object(&node_name(0), "p-000000", 1);
    let frame_len = match dialect {
        Dialect::Native => sample.to_bytes()?.len(),
        Dialect::KubeEdge => transports::kubeedge::encode(&sample).len(),
    };
    let node0 = node_name(0);
    let started = Instant::now();
    let sender = hive.clone();
    actix::spawn(async move {
        for n in 0..objects {
            if sender
                .send("cloudhub", object(&node0, &format!("p-{n:06}"), 1))
                .await
                .is_err()
            {
                return;
            }
        }
    });
    let acked_before = get(&stats.acked);
    wait_until(
        &stats,
        Duration::from_secs(300),
        "one node's objects acked",
        || get(&stats.acked) >= acked_before + objects as u64 && get(&stats.pending) == 0,
    )
    .await?;
    let rate = objects as f64 / started.elapsed().as_secs_f64();
    let family = if kind == TransportKind::UnixSocket {
        "raw unix socket"
    } else {
        "raw tcp socket"
    };
    let frame = vec![7u8; frame_len];
    let raw = crate::transport_bench::raw_one_way_rate(kind, dir, &frame, objects).await?;
    report.with_baseline(
        &scenario,
        "one_node_downstream",
        rate,
        "objects/s",
        raw,
        family,
    );
    hive.shutdown().await;
    Ok(())
}
