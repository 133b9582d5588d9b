//! Tests of the parent module (`stats.rs`).

use super::*;

#[test]
fn rates_come_from_two_samples() {
    let mut rates = CpuRates::default();
    assert_eq!(rates.rate("c", 1_000_000_000, 5_000_000_000), None);
    // Half a core for two seconds: 1 s of CPU.
    assert_eq!(
        rates.rate("c", 3_000_000_000, 6_000_000_000),
        Some(500_000_000)
    );
    // A counter that went back (restarted): no rate, a new base.
    assert_eq!(rates.rate("c", 4_000_000_000, 10), None);
    assert_eq!(
        rates.rate("c", 5_000_000_000, 250_000_010),
        Some(250_000_000)
    );
    // Within a second of the last: the last rate, the base kept.
    assert_eq!(
        rates.rate("c", 5_500_000_000, 900_000_000),
        Some(250_000_000)
    );
    assert_eq!(
        rates.rate("c", 6_000_000_000, 750_000_010),
        Some(500_000_000)
    );
    rates.retain(&HashSet::new());
    assert_eq!(rates.rate("c", 7_000_000_000, 300_000_000), None);
}

#[test]
fn proc_files_read() {
    let stat = "cpu  100 5 50 1000 20 3 2 0 0 0\ncpu0 50 2 25 500 10 1 1 0 0 0\nbtime 1764000000\n";
    assert_eq!(parse_stat(stat), Some((160 * 10_000_000, 1_764_000_000)));
    let meminfo = "MemTotal:       16000 kB\nMemFree:         4000 kB\nMemAvailable:    9000 kB\n";
    assert_eq!(
        parse_meminfo(meminfo),
        Some((16000 * 1024, 9000 * 1024, 4000 * 1024))
    );
    assert_eq!(parse_meminfo("MemTotal: x kB\n"), None);
    let real = read_node(Path::new("/proc")).expect("this machine's /proc");
    assert!(
        real.total > real.available && real.cpu_nanos > 0,
        "{real:?}"
    );
}

fn sample() -> Summary {
    let time = "2026-11-26T10:00:00Z".to_owned();
    let container = |name: &str, cores: u64, bytes: u64| ContainerStats {
        name: name.to_owned(),
        start_time: "2026-11-26T09:00:00Z".to_owned(),
        cpu: Some(CpuStats {
            time: time.clone(),
            usage_nano_cores: Some(cores),
            usage_core_nano_seconds: Some(cores * 10),
        }),
        memory: Some(MemoryStats {
            time: time.clone(),
            working_set_bytes: Some(bytes),
            ..MemoryStats::default()
        }),
    };
    let containers = vec![container("a", 100, 1000), container("b", 50, 24)];
    Summary {
        node: NodeStats {
            node_name: "edge-1".to_owned(),
            start_time: time.clone(),
            cpu: CpuStats {
                time: time.clone(),
                usage_nano_cores: Some(7),
                usage_core_nano_seconds: Some(2_500_000_000),
            },
            memory: MemoryStats {
                time: time.clone(),
                working_set_bytes: Some(4096),
                ..MemoryStats::default()
            },
            system_containers: Vec::new(),
        },
        pods: vec![PodStats {
            pod_ref: PodReference {
                name: "web".to_owned(),
                namespace: "default".to_owned(),
                uid: "u".to_owned(),
            },
            start_time: time.clone(),
            cpu: sum_cpu(&containers, 0),
            memory: sum_memory(&containers, 0),
            containers,
        }],
    }
}

#[test]
fn pods_sum_their_containers() {
    let pod = &sample().pods[0];
    assert_eq!(pod.cpu.usage_nano_cores, Some(150));
    assert_eq!(pod.cpu.usage_core_nano_seconds, Some(1500));
    assert_eq!(pod.memory.working_set_bytes, Some(1024));
    assert_eq!(pod.memory.rss_bytes, None);
}

#[test]
fn resource_metrics_read_as_the_kubelets() {
    let text = resource_metrics(&sample());
    let at = "1795687200000";
    for line in [
        format!("node_cpu_usage_seconds_total 2.5 {at}"),
        format!("node_memory_working_set_bytes 4096 {at}"),
        format!(
            "container_cpu_usage_seconds_total{{container=\"a\",namespace=\"default\",pod=\"web\"}} 0.000001 {at}"
        ),
        format!(
            "container_memory_working_set_bytes{{container=\"b\",namespace=\"default\",pod=\"web\"}} 24 {at}"
        ),
        "pod_memory_working_set_bytes{namespace=\"default\",pod=\"web\"} 1024 0".to_owned(),
        "scrape_error 0".to_owned(),
    ] {
        assert!(text.lines().any(|l| l == line), "{line} not in\n{text}");
    }
    assert!(
        text.contains("# TYPE pod_cpu_usage_seconds_total counter"),
        "{text}"
    );
}

#[test]
fn label_values_are_escaped() {
    // A name from a runtime's label cannot add samples.
    assert_eq!(
        resource_metrics::labels(&[("pod", "a\"b\\c\nd"), ("namespace", "x")]),
        r#"{pod="a\"b\\c\nd",namespace="x"}"#
    );
}

#[test]
fn a_container_without_figures_has_none_in_the_json() {
    let mut summary = sample();
    summary.pods[0].containers[0].cpu = None;
    summary.pods[0].containers[0].memory = None;
    let json = serde_json::to_value(&summary).expect("json");
    let container = &json["pods"][0]["containers"][0];
    assert!(
        container.get("cpu").is_none() && container.get("memory").is_none(),
        "{container}"
    );
    // Never an empty time (Go's metav1.Time refuses it).
    assert!(!json.to_string().contains(r#""time":"""#), "{json}");
}

#[test]
fn the_summary_is_the_kubelets_json() {
    let json = serde_json::to_value(sample()).expect("json");
    assert_eq!(json["node"]["nodeName"], "edge-1");
    assert_eq!(json["pods"][0]["podRef"]["namespace"], "default");
    assert_eq!(json["pods"][0]["cpu"]["usageNanoCores"], 150);
    assert_eq!(
        json["pods"][0]["containers"][1]["memory"]["workingSetBytes"],
        24
    );
    assert!(json["node"]["memory"].get("rssBytes").is_none());
}
