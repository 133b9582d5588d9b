//! The kubelet's `/metrics/resource` (Prometheus text) from a stats summary:\nwhat metrics-server reads.

use std::fmt::Write as _;

use super::Summary;

/// The Summary as the kubelet's `/metrics/resource` (Prometheus text):
/// what metrics-server reads.
pub fn resource_metrics(summary: &Summary) -> String {
    let mut out = String::new();
    let seconds = |nanos: u64| nanos as f64 / 1e9;
    let millis = |time: &str| {
        time.parse::<jiff::Timestamp>()
            .map(|t| t.as_millisecond())
            .ok()
    };
    let mut family =
        |name: &str, kind: &str, help: &str, samples: Vec<(String, f64, Option<i64>)>| {
            let _ = writeln!(out, "# HELP {name} {help}");
            let _ = writeln!(out, "# TYPE {name} {kind}");
            for (labels, value, at) in samples {
                match at {
                    Some(at) => {
                        let _ = writeln!(out, "{name}{labels} {value} {at}");
                    }
                    None => {
                        let _ = writeln!(out, "{name}{labels} {value}");
                    }
                }
            }
        };
    let node = &summary.node;
    family(
        "node_cpu_usage_seconds_total",
        "counter",
        "Cumulative cpu time consumed by the node in core-seconds",
        node.cpu
            .usage_core_nano_seconds
            .map(|v| vec![(String::new(), seconds(v), millis(&node.cpu.time))])
            .unwrap_or_default(),
    );
    family(
        "node_memory_working_set_bytes",
        "gauge",
        "Current working set of the node in bytes",
        node.memory
            .working_set_bytes
            .map(|v| vec![(String::new(), v as f64, millis(&node.memory.time))])
            .unwrap_or_default(),
    );
    let containers = || {
        summary.pods.iter().flat_map(|pod| {
            pod.containers.iter().map(move |c| {
                let labels = labels(&[
                    ("container", &c.name),
                    ("namespace", &pod.pod_ref.namespace),
                    ("pod", &pod.pod_ref.name),
                ]);
                (labels, c)
            })
        })
    };
    family(
        "container_cpu_usage_seconds_total",
        "counter",
        "Cumulative cpu time consumed by the container in core-seconds",
        containers()
            .filter_map(|(l, c)| {
                let cpu = c.cpu.as_ref()?;
                Some((l, seconds(cpu.usage_core_nano_seconds?), millis(&cpu.time)))
            })
            .collect(),
    );
    family(
        "container_memory_working_set_bytes",
        "gauge",
        "Current working set of the container in bytes",
        containers()
            .filter_map(|(l, c)| {
                let memory = c.memory.as_ref()?;
                Some((l, memory.working_set_bytes? as f64, millis(&memory.time)))
            })
            .collect(),
    );
    family(
        "container_start_time_seconds",
        "gauge",
        "Start time of the container since unix epoch in seconds",
        containers()
            .filter_map(|(l, c)| {
                let start = millis(&c.start_time)?;
                Some((
                    l,
                    start as f64 / 1000.0,
                    c.cpu.as_ref().and_then(|cpu| millis(&cpu.time)),
                ))
            })
            .collect(),
    );
    let pods = || {
        summary.pods.iter().map(|pod| {
            let labels = labels(&[
                ("namespace", &pod.pod_ref.namespace),
                ("pod", &pod.pod_ref.name),
            ]);
            (labels, pod)
        })
    };
    family(
        "pod_cpu_usage_seconds_total",
        "counter",
        "Cumulative cpu time consumed by the pod in core-seconds",
        pods()
            .filter_map(|(l, p)| {
                Some((
                    l,
                    seconds(p.cpu.usage_core_nano_seconds?),
                    millis(&p.cpu.time),
                ))
            })
            .collect(),
    );
    family(
        "pod_memory_working_set_bytes",
        "gauge",
        "Current working set of the pod in bytes",
        pods()
            .filter_map(|(l, p)| {
                Some((
                    l,
                    p.memory.working_set_bytes? as f64,
                    millis(&p.memory.time),
                ))
            })
            .collect(),
    );
    family(
        "scrape_error",
        "gauge",
        "1 if there was an error while getting container metrics, 0 otherwise",
        vec![(String::new(), 0.0, None)],
    );
    out
}

/// Prometheus labels, `{name="value",...}`, the values escaped.
pub(crate) fn labels(pairs: &[(&str, &str)]) -> String {
    let escaped = |value: &str| {
        value
            .replace('\\', "\\\\")
            .replace('"', "\\\"")
            .replace('\n', "\\n")
    };
    let inner: Vec<String> = pairs
        .iter()
        .map(|(name, value)| format!("{name}=\"{}\"", escaped(value)))
        .collect();
    format!("{{{}}}", inner.join(","))
}
