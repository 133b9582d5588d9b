//! edgehive's benchmark harness: `cargo bench --bench throughput -- [GROUP] [--json] [--quick]`.
//!
//! Each scenario prints its figure next to a baseline measured in the same
//! run (raw channel, raw socket, direct CRI calls), as a table, and with
//! `--json` also as one JSON object per line:
//! `{"scenario", "metric", "value", "unit"}` (baselines as `<metric>_baseline`).
//! Numbers are printed, never asserted: these machines are shared and noisy.

mod beehive_bench;
mod report;
mod transport_bench;

use anyhow::Result;
use clap::Parser;

use report::Report;

/// Command line of the harness.
#[derive(Parser, Debug)]
#[command(about = "edgehive throughput, latency and scale benchmarks")]
struct Args {
    /// Scenario group to run: beehive or transport; all if omitted.
    group: Option<String>,
    /// Transport to measure (ws, quic, uds); all three if omitted.
    #[arg(long)]
    kind: Option<transports::TransportKind>,
    /// Also print one JSON object per line.
    #[arg(long)]
    json: bool,
    /// Fewer iterations: a smoke run that shows every scenario works.
    #[arg(long)]
    quick: bool,
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

const GROUPS: &[&str] = &["beehive", "transport"];

fn main() -> Result<()> {
    let args = Args::parse();
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
            _ => unreachable!("checked against GROUPS"),
        }
    }
    report.print_table();
    if args.json {
        report.print_json_lines()?;
    }
    Ok(())
}
