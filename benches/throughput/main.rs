//! edgehive's benchmark harness: `cargo bench --bench throughput -- [GROUP] [--json] [--quick]`.
//!
//! Each scenario prints its figure next to a baseline measured in the same
//! run (raw channel, raw socket, direct CRI calls), as a table, and with
//! `--json` also as one JSON object per line:
//! `{"scenario", "metric", "value", "unit"}` (baselines as `<metric>_baseline`).
//! Numbers are printed, never asserted: these machines are shared and noisy.

mod api_writer;
mod beehive_bench;
mod cloudcore_memory;
mod controller_bench;
mod hub_bench;
mod meta_bench;
mod pods_bench;
mod replicas_bench;
mod report;
mod streams_bench;
mod transport_bench;
mod twin_bench;

use anyhow::Result;
use clap::Parser;

use report::Report;

/// The binaries' allocator (cmd/cloudcore/src/main.rs), for everything the
/// bench runs in its own process (the controller group's cloud and edge,
/// the hive, hub and meta groups) and in its child modes.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// Command line of the harness.
#[derive(Parser, Debug)]
#[command(about = "edgehive throughput, latency and scale benchmarks")]
struct Args {
    /// Scenario group to run: beehive, transport, hub, meta, pods, twin,
    /// controller, memory or streams; all if omitted.
    group: Option<String>,
    /// Transport to measure (ws, quic, uds); all three if omitted.
    #[arg(long)]
    kind: Option<transports::TransportKind>,
    /// Hub scenarios: native or kubeedge (the link's dialect); over ws both
    /// if omitted.
    #[arg(long)]
    dialect: Option<hub::Dialect>,
    /// Also print one JSON object per line.
    #[arg(long)]
    json: bool,
    /// Fewer iterations: a smoke run that shows every scenario works.
    #[arg(long)]
    quick: bool,
    /// Simulated nodes for the hub scenarios (repeatable); 1000 and 10000 if omitted.
    #[arg(long)]
    nodes: Vec<usize>,
    /// Hub scenarios: serve the nodes from this many cloudhub replicas
    /// claiming them in etcd (three members), beside one cloudhub without
    /// claims; 10000 nodes if --nodes is omitted (200 with --quick, where
    /// 3 replicas run besides the single-cloud scenarios).
    #[arg(long)]
    replicas: Option<usize>,
    /// The replicas scenario: the claims' lease TTL in seconds (how long a
    /// dead replica's nodes wait), as cloudcore's claimTtlSeconds.
    #[arg(long, default_value_t = 10)]
    claim_ttl_secs: u64,
    /// Child mode of the hub scenarios: the first node's index.
    #[arg(long, hide = true, default_value_t = 0)]
    first: usize,
    /// Child mode of the replicas scenario: the etcd endpoints.
    #[arg(long, hide = true)]
    etcd: Option<String>,
    /// Child mode of the hub scenarios: where the cloud listens.
    #[arg(long, hide = true)]
    address: Option<String>,
    /// Child mode of the hub scenarios: the nodes' certificates.
    #[arg(long, hide = true)]
    identities: Option<std::path::PathBuf>,
    /// Child mode of the meta memory scenario: which store to fill.
    #[arg(long, hide = true)]
    mode: Option<String>,
    /// Passed by `cargo bench`; ignored.
    #[arg(long, hide = true)]
    bench: bool,
}

/// How much work each scenario does.
#[derive(Clone, Copy, Debug)]
pub struct Scale {
    /// Messages per throughput run.
    pub messages: usize,
    /// Round trips per latency run.
    pub round_trips: usize,
    /// Repetitions; the median is reported.
    pub runs: usize,
}

const GROUPS: &[&str] = &[
    "beehive",
    "transport",
    "hub",
    "meta",
    "pods",
    "twin",
    "controller",
    "memory",
    "streams",
];

fn main() -> Result<()> {
    let args = Args::parse();
    if args.group.as_deref() == Some("__hub-nodes") {
        let kind = args.kind.unwrap_or(transports::TransportKind::UnixSocket);
        let address = args.address.as_deref().unwrap_or_default();
        let nodes = args.nodes.first().copied().unwrap_or(1);
        let dialect = args.dialect.unwrap_or_default();
        return hub_bench::child_main(
            kind,
            dialect,
            address,
            args.first,
            nodes,
            args.identities.as_deref(),
        );
    }
    if args.group.as_deref() == Some("__hub-replica") {
        let kind = args.kind.unwrap_or(transports::TransportKind::WebSocket);
        let identities = args
            .identities
            .as_deref()
            .ok_or_else(|| anyhow::anyhow!("--identities"))?;
        return replicas_bench::replica_main(
            kind,
            args.address.as_deref().unwrap_or("127.0.0.1:0"),
            args.etcd
                .as_deref()
                .map(|etcd| (etcd, std::time::Duration::from_secs(args.claim_ttl_secs))),
            args.mode.as_deref().unwrap_or("replica"),
            args.nodes.first().copied().unwrap_or(1),
            identities,
        );
    }
    if args.group.as_deref() == Some("__pod-watch") {
        return cloudcore_memory::kubernetes::watch_child(
            args.mode.as_deref().unwrap_or_default(),
            args.nodes.first().copied().unwrap_or(1),
        );
    }
    if args.group.as_deref() == Some("__meta-rss") {
        let path = args.address.as_deref().unwrap_or("meta-rss.redb");
        return meta_bench::rss_child(
            std::path::Path::new(path),
            args.mode.as_deref().unwrap_or("edgehive"),
        );
    }
    let scale = if args.quick {
        Scale {
            messages: 20_000,
            round_trips: 5_000,
            runs: 1,
        }
    } else {
        Scale {
            messages: 1_000_000,
            round_trips: 200_000,
            runs: 3,
        }
    };
    if args.group.as_deref() == Some("__hub-cloud") {
        let kind = args.kind.unwrap_or(transports::TransportKind::WebSocket);
        let nodes = args.nodes.first().copied().unwrap_or(1);
        return hub_bench::cloud_main(scale, kind, args.dialect.unwrap_or_default(), nodes);
    }
    let selected: Vec<&str> = match args.group.as_deref() {
        None | Some("all") => GROUPS.to_vec(),
        Some(group) if GROUPS.contains(&group) => vec![group],
        Some(other) => anyhow::bail!("unknown scenario group {other:?}; known: {GROUPS:?}"),
    };
    let mut report = Report::default();
    for group in selected {
        match group {
            "beehive" => beehive_bench::run(scale, &mut report)?,
            "transport" => {
                let kinds = match args.kind {
                    Some(kind) => vec![kind],
                    None => transports::TransportKind::ALL.to_vec(),
                };
                transport_bench::run(scale, &kinds, &mut report)?
            }
            "hub" => {
                let nodes = match (args.nodes.is_empty(), args.quick) {
                    (false, _) => args.nodes.clone(),
                    (true, true) => vec![200],
                    (true, false) => vec![1_000, 10_000],
                };
                let kind = args.kind.unwrap_or(transports::TransportKind::WebSocket);
                let dialects = match (args.dialect, kind) {
                    (Some(dialect), _) => vec![dialect],
                    (None, transports::TransportKind::WebSocket) => {
                        vec![hub::Dialect::Native, hub::Dialect::KubeEdge]
                    }
                    (None, _) => vec![hub::Dialect::Native],
                };
                let replicas = match (args.replicas, args.quick) {
                    (Some(replicas), _) => Some(replicas),
                    (None, true) => Some(3),
                    (None, false) => None,
                };
                let single = args.replicas.is_none();
                if single {
                    for dialect in dialects {
                        hub_bench::run(scale, kind, dialect, &nodes, args.quick, &mut report)?
                    }
                }
                if let Some(replicas) = replicas {
                    let nodes = match (args.nodes.is_empty(), args.quick) {
                        (false, _) => args.nodes.clone(),
                        (true, true) => vec![200],
                        (true, false) => vec![10_000],
                    };
                    let ttl = std::time::Duration::from_secs(args.claim_ttl_secs);
                    replicas_bench::run(kind, &nodes, replicas, ttl, &mut report)?
                }
            }
            "meta" => meta_bench::run(scale, &mut report)?,
            "pods" => pods_bench::run(scale, &mut report)?,
            "twin" => twin_bench::run(scale, &mut report)?,
            "controller" => controller_bench::run(scale, args.quick, &mut report)?,
            "memory" => cloudcore_memory::run(args.quick, &mut report)?,
            "streams" => streams_bench::run(scale, &mut report)?,
            _ => unreachable!("checked against GROUPS"),
        }
    }
    report.print_table();
    if args.json {
        report.print_json_lines()?;
    }
    Ok(())
}
