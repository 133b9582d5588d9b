//! `hub --replicas N`: simulated nodes over N cloudhub replicas that claim
//! them in a real etcd cluster (three members), beside the same run on
//! one cloudhub without claims (one cloudcore on its embedded store).
//!
//! Each replica is a process of its own (this binary in a hidden mode): a
//! cloudhub with etcd claims, reporting its counters on stdout and taking
//! commands on stdin. The nodes run in one more process, each knowing
//! every replica's address. Measured: time for all nodes to be served,
//! the replicas' RSS per idle session, one update fanned out to every node
//! with every ack back (each replica sending to the nodes it holds), and
//! failover: one replica SIGKILLed, the time until all its nodes are
//! served by the others, beside the claims' lease TTL.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, anyhow, bail};
use beehive::{Hive, HiveConfig};
use hub::{CloudEndpoint, CloudHub, CloudHubConfig, Dialect, NodeClaims};
use transports::tls::{self, DevPki};
use transports::{ListenOptions, TransportKind};

use crate::hub_bench::{self, rss_bytes};
use crate::report::Report;

/// Nodes per simulated-nodes process (one process may hold 20,000 open
/// files here).
const NODES_PER_PROCESS: usize = 15_000;

/// How long any one phase may take before the run is called failed.
const PHASE_LIMIT: Duration = Duration::from_secs(600);

/// What a replica process last reported.
#[derive(Debug, Default, Clone, Copy)]
struct Stat {
    connected: u64,
    acked: u64,
    rss: u64,
    held: u64,
}

/// A replica process, its address, and its latest counters.
struct ReplicaProcess {
    child: Child,
    stdin: ChildStdin,
    address: String,
    stat: Arc<Mutex<Stat>>,
}

impl ReplicaProcess {
    fn stat(&self) -> Stat {
        *self
            .stat
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn command(&mut self, line: &str) -> Result<()> {
        writeln!(self.stdin, "{line}").context("a replica's stdin")
    }
}

impl Drop for ReplicaProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts replica `index`; returns once it listens.
fn start_replica(
    kind: TransportKind,
    index: usize,
    etcd: Option<(&str, Duration)>,
    nodes: usize,
    identity: &Path,
) -> Result<ReplicaProcess> {
    let mut command = Command::new(std::env::current_exe()?);
    command
        .args([
            "__hub-replica",
            "--kind",
            kind.name(),
            "--nodes",
            &nodes.to_string(),
            "--address",
            &format!("127.0.0.{}:0", index + 1),
            "--identities",
        ])
        .arg(identity)
        .args(["--mode", &format!("replica-{index}")])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    if let Some((etcd, ttl)) = etcd {
        command.args([
            "--etcd",
            etcd,
            "--claim-ttl-secs",
            &ttl.as_secs().to_string(),
        ]);
    }
    let mut child = command.spawn().context("spawn a replica")?;
    let stdin = child.stdin.take().ok_or_else(|| anyhow!("no stdin"))?;
    let stdout = child.stdout.take().ok_or_else(|| anyhow!("no stdout"))?;
    let mut lines = BufReader::new(stdout).lines();
    let address = loop {
        match lines.next() {
            Some(Ok(line)) => {
                if let Some(address) = line.strip_prefix("ready ") {
                    break address.to_owned();
                }
            }
            _ => bail!("replica {index} exited before it listened"),
        }
    };
    let stat = Arc::new(Mutex::new(Stat::default()));
    let updated = stat.clone();
    std::thread::spawn(move || {
        for line in lines.map_while(std::result::Result::ok) {
            let numbers: Vec<u64> = line
                .strip_prefix("stat ")
                .unwrap_or_default()
                .split(' ')
                .filter_map(|n| n.parse().ok())
                .collect();
            if let [connected, acked, rss, held] = numbers[..] {
                *updated
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner) = Stat {
                    connected,
                    acked,
                    rss,
                    held,
                };
            }
        }
    });
    Ok(ReplicaProcess {
        child,
        stdin,
        address,
        stat,
    })
}

/// Polls the replicas' counters until `done` holds of them.
fn wait_for(
    replicas: &[ReplicaProcess],
    what: &str,
    mut done: impl FnMut(&[Stat]) -> bool,
) -> Result<Duration> {
    let started = Instant::now();
    let mut reported = Instant::now();
    loop {
        let stats: Vec<Stat> = replicas.iter().map(ReplicaProcess::stat).collect();
        if done(&stats) {
            return Ok(started.elapsed());
        }
        if started.elapsed() > PHASE_LIMIT {
            bail!("{what} did not happen within {PHASE_LIMIT:?}: {stats:?}");
        }
        if reported.elapsed() > Duration::from_secs(5) {
            eprintln!("replicas: waiting for {what}: {stats:?}");
            reported = Instant::now();
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn connected(stats: &[Stat]) -> u64 {
    stats.iter().map(|s| s.connected).sum()
}

/// What one layout of replicas measured.
struct Measured {
    connect_all: Duration,
    rss_per_session_kib: f64,
    fan_out: Duration,
    /// Replicas only: (nodes moved, time until all served again).
    failover: Option<(u64, Duration)>,
    /// Nodes held per replica once all connected.
    spread: Vec<u64>,
}

/// One layout: `count` replicas (claims in `etcd` when given), `nodes`
/// nodes.
fn measure(
    kind: TransportKind,
    count: usize,
    etcd: Option<(&str, Duration)>,
    nodes: usize,
    node_identities: &Path,
    server_identity: &Path,
) -> Result<Measured> {
    let mut replicas = (0..count)
        .map(|i| start_replica(kind, i, etcd, nodes, server_identity))
        .collect::<Result<Vec<_>>>()?;
    // Each reports at once; its RSS before any session.
    wait_for(&replicas, "the replicas' first counters", |stats| {
        stats.iter().all(|s| s.rss > 0)
    })?;
    let rss_before: u64 = replicas.iter().map(|r| r.stat().rss).sum();
    let addresses: Vec<String> = replicas.iter().map(|r| r.address.clone()).collect();
    let started = Instant::now();
    // The nodes in several processes where one could not hold them all.
    let mut _node_processes = Vec::new();
    for first in (0..nodes).step_by(NODES_PER_PROCESS) {
        let mut command = Command::new(std::env::current_exe()?);
        command
            .args([
                "__hub-nodes",
                "--kind",
                kind.name(),
                "--dialect",
                &Dialect::Native.to_string(),
                "--address",
                &addresses.join(","),
                "--first",
                &first.to_string(),
                "--nodes",
                &NODES_PER_PROCESS.min(nodes - first).to_string(),
                "--identities",
            ])
            .arg(node_identities)
            .stdin(Stdio::null())
            .stdout(Stdio::null());
        _node_processes.push(hub_bench::ChildGuard(
            command.spawn().context("spawn the simulated nodes")?,
        ));
    }
    wait_for(&replicas, "every node served", |stats| {
        connected(stats) == nodes as u64
    })?;
    let connect_all = started.elapsed();
    let stats: Vec<Stat> = replicas.iter().map(ReplicaProcess::stat).collect();
    let rss_after: u64 = stats.iter().map(|s| s.rss).sum();
    let rss_per_session_kib = rss_after.saturating_sub(rss_before) as f64 / nodes as f64 / 1024.0;
    let spread = stats.iter().map(|s| s.held).collect();

    // One update to every node, each replica sending to those it holds.
    let acked_before: u64 = stats.iter().map(|s| s.acked).sum();
    let started = Instant::now();
    for replica in &mut replicas {
        replica.command("fanout")?;
    }
    wait_for(&replicas, "every fan-out ack", |stats| {
        stats.iter().map(|s| s.acked).sum::<u64>() >= acked_before + nodes as u64
    })?;
    let fan_out = started.elapsed();

    // One replica dies: until the others serve all its nodes.
    let failover = match count > 1 {
        false => None,
        true => {
            let moved = replicas[0].stat().connected;
            let mut dead = replicas.remove(0);
            let killed = Instant::now();
            dead.child.kill().context("kill -9 a replica")?;
            let _ = dead.child.wait();
            wait_for(&replicas, "the dead replica's nodes served", |stats| {
                connected(stats) == nodes as u64
            })?;
            Some((moved, killed.elapsed()))
        }
    };
    Ok(Measured {
        connect_all,
        rss_per_session_kib,
        fan_out,
        failover,
        spread,
    })
}

/// Runs the layout of `replicas` replicas and, as its baseline, one
/// replica without claims, for each node count; adds their rows.
pub fn run(
    kind: TransportKind,
    node_counts: &[usize],
    replicas: usize,
    claim_ttl: Duration,
    report: &mut Report,
) -> Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    let cluster = runtime.block_on(etcd::testing::Cluster::start(3));
    let endpoints = cluster.endpoints().join(",");
    let dir = std::env::temp_dir().join(format!("edgehive-replicas-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let result = (|| -> Result<()> {
        let pki = DevPki::new("edgehive bench CA")?;
        let server_identity = dir.join("server-identity");
        let (chain, key) = pki.server("localhost")?;
        hub_bench::write_identity_file(&server_identity, &pki.root(), &[(chain, key)])?;
        for &nodes in node_counts {
            let node_identities = dir.join(format!("identities-{nodes}"));
            hub_bench::write_identities(&pki, nodes, &node_identities)?;
            let scenario = format!("hub/{kind}/{nodes}/replicas-{replicas}");
            // One process holds at most 20,000 open files here: beyond
            // that, one cloudhub cannot serve them all, and there is no
            // baseline.
            let one = match nodes <= NODES_PER_PROCESS {
                true => {
                    eprintln!("{scenario}: one replica without claims (the baseline)");
                    Some(measure(
                        kind,
                        1,
                        None,
                        nodes,
                        &node_identities,
                        &server_identity,
                    )?)
                }
                false => None,
            };
            eprintln!("{scenario}: {replicas} replicas, claims in etcd (3 members)");
            let many = measure(
                kind,
                replicas,
                Some((&endpoints, claim_ttl)),
                nodes,
                &node_identities,
                &server_identity,
            )?;
            let rows = [
                (
                    "connect_all",
                    many.connect_all.as_secs_f64(),
                    one.as_ref().map(|one| one.connect_all.as_secs_f64()),
                    "s",
                ),
                (
                    "rss_per_session",
                    many.rss_per_session_kib,
                    one.as_ref().map(|one| one.rss_per_session_kib),
                    "KiB",
                ),
                (
                    "fan_out_all_acked",
                    many.fan_out.as_secs_f64() * 1000.0,
                    one.as_ref().map(|one| one.fan_out.as_secs_f64() * 1000.0),
                    "ms",
                ),
            ];
            for (metric, value, baseline, unit) in rows {
                match baseline {
                    Some(baseline) => report.with_baseline(
                        &scenario,
                        metric,
                        value,
                        unit,
                        baseline,
                        "one cloudhub, no claims",
                    ),
                    None => report.plain(&scenario, metric, value, unit),
                }
            }
            if let Some((moved, took)) = many.failover {
                report.with_baseline(
                    &scenario,
                    "failover_all_served",
                    took.as_secs_f64(),
                    "s",
                    claim_ttl.as_secs_f64(),
                    "the claims' lease TTL",
                );
                report.plain(&scenario, "failover_nodes_moved", moved as f64, "nodes");
            }
            let (least, most) = (
                many.spread.iter().min().copied().unwrap_or(0),
                many.spread.iter().max().copied().unwrap_or(0),
            );
            report.plain(&scenario, "nodes_held_least", least as f64, "nodes");
            report.plain(&scenario, "nodes_held_most", most as f64, "nodes");
        }
        Ok(())
    })();
    let _ = std::fs::remove_dir_all(&dir);
    drop(cluster);
    result
}

/// The replica process: a cloudhub (with claims in etcd when `etcd` is
/// given) listening on `address`; prints `ready ADDRESS`, then
/// `stat CONNECTED ACKED RSS HELD` as they change; on `fanout` from stdin,
/// sends one object to each of nodes `0..nodes` it holds.
pub fn replica_main(
    kind: TransportKind,
    address: &str,
    etcd: Option<(&str, Duration)>,
    name: &str,
    nodes: usize,
    identity: &Path,
) -> Result<()> {
    let _ = rlimit::increase_nofile_limit(u64::MAX);
    // Warnings (claims lost, handed over) to stderr, as cloudcore logs them.
    let _ = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .try_init();
    let (root, mut identities) = hub_bench::read_identities(identity)?;
    let (cert, key) = identities
        .pop()
        .ok_or_else(|| anyhow!("no server identity"))?;
    let server_tls = tls::server_config(vec![cert], key, Some(&[root]))?;
    let address = address.to_owned();
    let etcd = etcd.map(|(etcd, ttl)| (etcd.to_owned(), ttl));
    let name = name.to_owned();
    actix::System::new().block_on(async move {
        let claims = match etcd {
            Some((etcd, ttl)) => {
                let mut config = cloud::replicas::ClaimsConfig::new(
                    etcd.split(',').map(str::to_owned).collect(),
                    name,
                );
                config.prefix = "/edgehive-bench".to_owned();
                config.ttl = ttl;
                let claims = cloud::replicas::EtcdClaims::start(config)?;
                let mut counts = claims.counts();
                let leased = tokio::time::timeout(
                    Duration::from_secs(30),
                    counts.wait_for(|c| c.leases >= 1),
                )
                .await;
                if !matches!(leased, Ok(Ok(_))) {
                    bail!("no claims lease from etcd");
                }
                Some(claims)
            }
            None => None,
        };
        let hive = Hive::new("cloud", HiveConfig::default());
        let handle = CloudHub::start(
            &hive,
            CloudHubConfig {
                endpoints: vec![CloudEndpoint {
                    kind,
                    options: ListenOptions::new(address).with_tls(server_tls),
                    trust_hello: false,
                    dialect: Dialect::Native,
                }],
                keepalive: Duration::from_secs(60),
                claims: claims
                    .clone()
                    .map(|claims| Arc::new(claims) as Arc<dyn NodeClaims>),
                ..CloudHubConfig::default()
            },
        )
        .await?;
        println!("ready {}", handle.addresses[0].1);
        let stats = handle.stats.clone();
        let held_by = claims.clone();
        actix::spawn(async move {
            let mut last = None;
            loop {
                let held = held_by
                    .as_ref()
                    .map_or(hub_bench::get(&stats.connected), |claims| {
                        claims.counts().borrow().held as u64
                    });
                let now = (
                    hub_bench::get(&stats.connected),
                    hub_bench::get(&stats.acked),
                    rss_bytes(),
                    held,
                );
                if last != Some(now) {
                    println!("stat {} {} {} {}", now.0, now.1, now.2, now.3);
                    last = Some(now);
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        });
        let (commands, mut received) = tokio::sync::mpsc::unbounded_channel();
        std::thread::spawn(move || {
            for line in std::io::stdin()
                .lock()
                .lines()
                .map_while(std::result::Result::ok)
            {
                if commands.send(line).is_err() {
                    return;
                }
            }
        });
        let mut version = 1;
        // Until the parent closes stdin (or kills this process).
        while let Some(command) = received.recv().await {
            if command.trim() != "fanout" {
                continue;
            }
            version += 1;
            for i in 0..nodes {
                let node = hub_bench::node_name(i);
                if claims.as_ref().is_none_or(|claims| claims.holds(&node)) {
                    hive.send("cloudhub", hub_bench::object(&node, "fan-out", version))
                        .await?;
                }
            }
        }
        hive.shutdown().await;
        Ok(())
    })
}
