//! The node's and its pods' resource figures, as a kubelet serves them:
//! `/stats/summary` (the `stats/v1alpha1` Summary, JSON) and
//! `/metrics/resource` (Prometheus text, what metrics-server scrapes),
//! both from one [`Summary`]. Containers' figures come from CRI
//! `ListContainerStats`, the node's from `/proc`; CPU rates are worked out
//! from two cumulative samples ([`CpuRates`]) where the runtime gives none.

mod resource_metrics;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde::Serialize;
use tracing::debug;

use crate::cri::{Cri, CriError, api};
use crate::spec::{CONTAINER_NAME, NODE, POD_NAME, POD_NAMESPACE, POD_UID};

pub use resource_metrics::resource_metrics;

/// How often the figures are sampled (CPU rates are over this window).
pub const SAMPLE_EVERY: std::time::Duration = std::time::Duration::from_secs(10);

/// Why the figures could not be had.
#[derive(Debug, thiserror::Error)]
pub enum StatsError {
    /// The runtime did not answer.
    #[error(transparent)]
    Runtime(#[from] CriError),
    /// `/proc` did not read.
    #[error("{path}: {reason}")]
    Proc {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        reason: String,
    },
}

/// CPU usage rates from cumulative counters, per key (a container id, or
/// the node): the rate between a key's last two samples. Plain code: the
/// samples carry their time.
#[derive(Debug, Default)]
pub struct CpuRates {
    /// Per key: the base sample (time, cumulative) and the last rate.
    last: HashMap<String, (i64, u64, Option<u64>)>,
}

/// Samples closer than this to the base give the last rate, not a new one
/// (a rate over a few milliseconds says little).
const MIN_WINDOW_NANOS: i64 = 1_000_000_000;

impl CpuRates {
    /// `key`'s usage in nanocores between its previous sample and this one
    /// (`cumulative` nanoseconds of CPU at `at`, nanoseconds since the
    /// epoch); `None` for its first sample, or a counter that went back (a
    /// restarted container). A sample within a second of the previous, or
    /// older than it, gives the previous rate.
    pub fn rate(&mut self, key: &str, at: i64, cumulative: u64) -> Option<u64> {
        // Within a second of the base, or older than it (an earlier
        // sample handled late): the last rate, the base kept.
        if let Some((then, _, rate)) = self.last.get(key)
            && at.saturating_sub(*then) < MIN_WINDOW_NANOS
        {
            return *rate;
        }
        let previous = self.last.insert(key.to_owned(), (at, cumulative, None));
        let (then, used, _) = previous?;
        let elapsed = u64::try_from(at.checked_sub(then)?)
            .ok()
            .filter(|e| *e > 0)?;
        let spent = cumulative.checked_sub(used)?;
        // nanoseconds of CPU per second of time, in nanocores.
        let rate = ((u128::from(spent) * 1_000_000_000) / u128::from(elapsed)) as u64;
        if let Some(entry) = self.last.get_mut(key) {
            entry.2 = Some(rate);
        }
        Some(rate)
    }

    /// Forgets the keys not in `live` (containers gone).
    pub fn retain(&mut self, live: &HashSet<String>) {
        self.last.retain(|key, _| live.contains(key));
    }
}

/// `stats/v1alpha1` Summary.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Summary {
    /// The node.
    pub node: NodeStats,
    /// Its pods.
    pub pods: Vec<PodStats>,
}

/// The node's figures.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeStats {
    /// Its name.
    pub node_name: String,
    /// When it booted (RFC 3339).
    pub start_time: String,
    /// CPU.
    pub cpu: CpuStats,
    /// Memory.
    pub memory: MemoryStats,
    /// None here.
    pub system_containers: Vec<ContainerStats>,
}

/// A pod's figures: its containers', and their sums.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PodStats {
    /// Which pod.
    pub pod_ref: PodReference,
    /// When its first container was created (RFC 3339).
    pub start_time: String,
    /// Its running containers.
    pub containers: Vec<ContainerStats>,
    /// Their CPU, summed.
    pub cpu: CpuStats,
    /// Their memory, summed.
    pub memory: MemoryStats,
}

/// A pod, by name and uid.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PodReference {
    /// Its name.
    pub name: String,
    /// Its namespace.
    pub namespace: String,
    /// Its uid.
    pub uid: String,
}

/// A container's figures.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerStats {
    /// Its name in the pod.
    pub name: String,
    /// When it was created (RFC 3339).
    pub start_time: String,
    /// CPU, if the runtime gave it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu: Option<CpuStats>,
    /// Memory, if the runtime gave it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemoryStats>,
}

/// CPU figures.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CpuStats {
    /// When sampled (RFC 3339).
    pub time: String,
    /// Usage now, in billionths of a core.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage_nano_cores: Option<u64>,
    /// Usage since the start, in core-nanoseconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage_core_nano_seconds: Option<u64>,
}

/// Memory figures.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MemoryStats {
    /// When sampled (RFC 3339).
    pub time: String,
    /// Memory still available.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub available_bytes: Option<u64>,
    /// Memory in use, caches included.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage_bytes: Option<u64>,
    /// Memory in use that cannot be reclaimed at once (what `kubectl top`
    /// shows and eviction judges).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub working_set_bytes: Option<u64>,
    /// Anonymous memory.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rss_bytes: Option<u64>,
}

fn rfc3339(nanos: i64) -> String {
    jiff::Timestamp::from_nanosecond(i128::from(nanos))
        .unwrap_or(jiff::Timestamp::UNIX_EPOCH)
        .to_string()
}

fn now_nanos() -> i64 {
    i64::try_from(jiff::Timestamp::now().as_nanosecond()).unwrap_or(i64::MAX)
}

/// Collects the figures; keeps the CPU samples rates are worked out from.
pub struct StatsCollector {
    cri: Cri,
    node: String,
    proc_root: PathBuf,
    rates: Mutex<CpuRates>,
}

impl StatsCollector {
    /// Figures of node `node` and the containers `cri` runs.
    pub fn new(cri: Cri, node: String) -> Arc<StatsCollector> {
        Arc::new(StatsCollector {
            cri,
            node,
            proc_root: PathBuf::from("/proc"),
            rates: Mutex::new(CpuRates::default()),
        })
    }

    /// The Summary now.
    pub async fn summary(&self) -> Result<Summary, StatsError> {
        let mut runtime = self.cri.runtime.clone();
        // This node's containers only: a runtime may run another edged's
        // too (several nodes on one host share containerd).
        let ours = api::ContainerStatsFilter {
            label_selector: HashMap::from([(NODE.to_owned(), self.node.clone())]),
            ..api::ContainerStatsFilter::default()
        };
        let stats = runtime
            .list_container_stats(api::ListContainerStatsRequest { filter: Some(ours) })
            .await
            .map_err(CriError::call("ListContainerStats"))?
            .into_inner()
            .stats;
        let created: HashMap<String, i64> = runtime
            .list_containers(api::ListContainersRequest { filter: None })
            .await
            .map_err(CriError::call("ListContainers"))?
            .into_inner()
            .containers
            .into_iter()
            .map(|c| (c.id, c.created_at))
            .collect();
        let node = read_node(&self.proc_root)?;
        let now = now_nanos();
        let mut rates = self.rates.lock().unwrap_or_else(|p| p.into_inner());
        // By namespace, name and uid: a pod made again under its name is
        // another pod. With the earliest container start of each.
        let mut pods: BTreeMap<(String, String, String), (PodStats, i64)> = BTreeMap::new();
        let mut live = HashSet::from(["".to_owned()]);
        for stat in stats {
            let Some(attributes) = stat.attributes else {
                continue;
            };
            let label = |name: &str| attributes.labels.get(name).cloned().unwrap_or_default();
            let (namespace, pod, uid) = (label(POD_NAMESPACE), label(POD_NAME), label(POD_UID));
            if pod.is_empty() || label(NODE) != self.node {
                continue; // not this edged's
            }
            live.insert(attributes.id.clone());
            let cpu = stat.cpu.map(|cpu| {
                let cumulative = cpu.usage_core_nano_seconds.map(|v| v.value);
                let at = if cpu.timestamp > 0 {
                    cpu.timestamp
                } else {
                    now
                };
                let ours = cumulative.and_then(|c| rates.rate(&attributes.id, at, c));
                CpuStats {
                    time: rfc3339(at),
                    usage_nano_cores: cpu.usage_nano_cores.map(|v| v.value).or(ours),
                    usage_core_nano_seconds: cumulative,
                }
            });
            let memory = stat.memory.map(|memory| MemoryStats {
                time: rfc3339(if memory.timestamp > 0 {
                    memory.timestamp
                } else {
                    now
                }),
                available_bytes: memory.available_bytes.map(|v| v.value),
                usage_bytes: memory.usage_bytes.map(|v| v.value),
                working_set_bytes: memory.working_set_bytes.map(|v| v.value),
                rss_bytes: memory.rss_bytes.map(|v| v.value),
            });
            let start = created.get(&attributes.id).copied().unwrap_or(now);
            let container = ContainerStats {
                name: label(CONTAINER_NAME),
                start_time: rfc3339(start),
                cpu,
                memory,
            };
            let (entry, earliest) = pods
                .entry((namespace.clone(), pod.clone(), uid.clone()))
                .or_insert_with(|| {
                    let stats = PodStats {
                        pod_ref: PodReference {
                            name: pod,
                            namespace,
                            uid,
                        },
                        start_time: rfc3339(start),
                        containers: Vec::new(),
                        cpu: CpuStats::default(),
                        memory: MemoryStats::default(),
                    };
                    (stats, start)
                });
            if start < *earliest {
                *earliest = start;
                entry.start_time = rfc3339(start);
            }
            entry.containers.push(container);
        }
        let node_rate = rates.rate("", now, node.cpu_nanos);
        rates.retain(&live);
        drop(rates);
        let pods = pods
            .into_values()
            .map(|(mut pod, _)| {
                pod.containers.sort_by(|a, b| a.name.cmp(&b.name));
                pod.cpu = sum_cpu(&pod.containers, now);
                pod.memory = sum_memory(&pod.containers, now);
                pod
            })
            .collect();
        debug!("stats summary collected");
        Ok(Summary {
            node: NodeStats {
                node_name: self.node.clone(),
                start_time: rfc3339(node.boot_time_secs.saturating_mul(1_000_000_000)),
                cpu: CpuStats {
                    time: rfc3339(now),
                    usage_nano_cores: node_rate,
                    usage_core_nano_seconds: Some(node.cpu_nanos),
                },
                memory: MemoryStats {
                    time: rfc3339(now),
                    available_bytes: Some(node.available),
                    usage_bytes: Some(node.total.saturating_sub(node.free)),
                    working_set_bytes: Some(node.total.saturating_sub(node.available)),
                    rss_bytes: None,
                },
                system_containers: Vec::new(),
            },
            pods,
        })
    }
}

fn sum_cpu(containers: &[ContainerStats], now: i64) -> CpuStats {
    let sum = |pick: fn(&CpuStats) -> Option<u64>| {
        containers
            .iter()
            .map(|c| c.cpu.as_ref().and_then(pick))
            .try_fold(0u64, |total, v| Some(total.saturating_add(v?)))
    };
    CpuStats {
        time: rfc3339(now),
        usage_nano_cores: sum(|c| c.usage_nano_cores),
        usage_core_nano_seconds: sum(|c| c.usage_core_nano_seconds),
    }
}

fn sum_memory(containers: &[ContainerStats], now: i64) -> MemoryStats {
    let sum = |pick: fn(&MemoryStats) -> Option<u64>| {
        containers
            .iter()
            .map(|c| c.memory.as_ref().and_then(pick))
            .try_fold(0u64, |total, v| Some(total.saturating_add(v?)))
    };
    MemoryStats {
        time: rfc3339(now),
        available_bytes: None,
        usage_bytes: sum(|m| m.usage_bytes),
        working_set_bytes: sum(|m| m.working_set_bytes),
        rss_bytes: sum(|m| m.rss_bytes),
    }
}

/// The node's own figures from `/proc`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeFigures {
    /// CPU time spent busy (not idle, not waiting), all cores, in ns.
    pub cpu_nanos: u64,
    /// When it booted, seconds since the epoch.
    pub boot_time_secs: i64,
    /// Memory in all.
    pub total: u64,
    /// Memory available without swapping.
    pub available: u64,
    /// Memory unused.
    pub free: u64,
}

/// Reads [`NodeFigures`] from `proc` (`/proc`).
pub fn read_node(proc: &Path) -> Result<NodeFigures, StatsError> {
    let read = |name: &str| {
        let path = proc.join(name);
        std::fs::read_to_string(&path).map_err(|err| StatsError::Proc {
            path,
            reason: err.to_string(),
        })
    };
    let unreadable = |name: &str| StatsError::Proc {
        path: proc.join(name),
        reason: "unexpected contents".to_owned(),
    };
    let (cpu_nanos, boot_time_secs) =
        parse_stat(&read("stat")?).ok_or_else(|| unreadable("stat"))?;
    let (total, available, free) =
        parse_meminfo(&read("meminfo")?).ok_or_else(|| unreadable("meminfo"))?;
    Ok(NodeFigures {
        cpu_nanos,
        boot_time_secs,
        total,
        available,
        free,
    })
}

/// Busy CPU time in ns (ticks of 1/100 s: user, nice, system, irq,
/// softirq, steal) and the boot time, from `/proc/stat`.
fn parse_stat(text: &str) -> Option<(u64, i64)> {
    let mut busy = None;
    let mut boot = None;
    for line in text.lines() {
        let mut fields = line.split_ascii_whitespace();
        match fields.next() {
            Some("cpu") => {
                let ticks: Vec<u64> = fields.filter_map(|f| f.parse().ok()).collect();
                let at = |i: usize| ticks.get(i).copied().unwrap_or(0);
                // user nice system idle iowait irq softirq steal
                let spent = at(0) + at(1) + at(2) + at(5) + at(6) + at(7);
                busy = Some(spent.saturating_mul(10_000_000));
            }
            Some("btime") => boot = fields.next().and_then(|f| f.parse().ok()),
            _ => {}
        }
    }
    Some((busy?, boot?))
}

/// MemTotal, MemAvailable and MemFree in bytes, from `/proc/meminfo`.
fn parse_meminfo(text: &str) -> Option<(u64, u64, u64)> {
    let field = |name: &str| {
        text.lines()
            .find_map(|line| line.strip_prefix(name)?.strip_prefix(':'))
            .and_then(|rest| rest.split_ascii_whitespace().next()?.parse::<u64>().ok())
            .map(|kib| kib * 1024)
    };
    Some((
        field("MemTotal")?,
        field("MemAvailable")?,
        field("MemFree")?,
    ))
}

#[cfg(test)]
mod tests;
