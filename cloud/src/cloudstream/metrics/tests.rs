//! Tests of the parent module (`metrics.rs`).

use super::*;

fn summary() -> Value {
    json!({
        "node": {"nodeName": "edge-1", "cpu": {"time": "2026-11-26T10:00:00Z", "usageNanoCores": 250_000_000u64},
                 "memory": {"workingSetBytes": 2_097_152u64}},
        "pods": [
            {"podRef": {"name": "web", "namespace": "default", "uid": "u"},
             "cpu": {"time": "2026-11-26T10:00:00Z"},
             "containers": [{"name": "httpd", "cpu": {"usageNanoCores": 1_000_000u64}, "memory": {"workingSetBytes": 4096u64}}]},
            {"podRef": {"name": "new", "namespace": "default", "uid": "v"},
             "containers": [{"name": "c", "cpu": {}, "memory": {"workingSetBytes": 4096u64}}]},
            {"podRef": {"name": "db", "namespace": "prod", "uid": "w"},
             "containers": [{"name": "pg", "cpu": {"usageNanoCores": 5u64}, "memory": {"workingSetBytes": 1024u64}}]}
        ]
    })
}

#[test]
fn paths_read_as_queries_with_the_access_they_need() {
    let pod = MetricsQuery::from_path("/apis/metrics.k8s.io/v1beta1/namespaces/prod/pods/db");
    assert_eq!(
        pod,
        Some(MetricsQuery::Pod {
            namespace: "prod".to_owned(),
            name: "db".to_owned()
        })
    );
    let access = pod.map(|q| q.access()).expect("a query");
    assert_eq!(
        (access.verb, access.group, access.resource),
        ("get", "metrics.k8s.io", "pods")
    );
    assert_eq!(
        (access.namespace.as_str(), access.name.as_str()),
        ("prod", "db")
    );
    let listed = MetricsQuery::from_path("/apis/metrics.k8s.io/v1beta1/namespaces/prod/pods");
    assert_eq!(
        listed,
        Some(MetricsQuery::Pods {
            namespace: Some("prod".to_owned())
        })
    );
    let nodes = MetricsQuery::from_path("/apis/metrics.k8s.io/v1beta1/nodes/");
    let access = nodes.map(|q| q.access()).expect("a query");
    assert_eq!((access.verb, access.resource), ("list", "nodes"));
    assert_eq!(
        MetricsQuery::from_path("/apis/metrics.k8s.io/v1beta1/nodes/edge-1"),
        Some(MetricsQuery::Node("edge-1".to_owned()))
    );
    for refused in [
        "/apis/metrics.k8s.io/v1beta1/namespaces//pods",
        "/apis/metrics.k8s.io/v1beta1/nodes/edge-1/extra",
        "/apis/metrics.k8s.io/v1/nodes",
        "/api/v1/nodes",
    ] {
        assert_eq!(MetricsQuery::from_path(refused), None, "{refused}");
    }
}

/// A query asked of a peer is the query the peer reads.
#[test]
fn a_querys_path_reads_back_as_the_query() {
    for query in [
        MetricsQuery::Nodes,
        MetricsQuery::Node("edge-1".to_owned()),
        MetricsQuery::Pods { namespace: None },
        MetricsQuery::Pods {
            namespace: Some("prod".to_owned()),
        },
        MetricsQuery::Pod {
            namespace: "prod".to_owned(),
            name: "db".to_owned(),
        },
    ] {
        assert_eq!(MetricsQuery::from_path(&query.path()), Some(query));
    }
}

#[test]
fn a_nodes_summary_reads_as_metrics() {
    let node = node_metrics(&summary()).expect("metrics");
    assert_eq!(node["metadata"]["name"], "edge-1");
    assert_eq!(
        node["usage"],
        json!({"cpu": "250000000n", "memory": "2048Ki"})
    );
    assert_eq!(node_metrics(&json!({"node": {"nodeName": "x"}})), None);
}

#[test]
fn pods_with_rates_read_as_metrics_chosen_by_namespace() {
    let all = pod_metrics(&summary(), &|_, _| true);
    // "new" has no CPU rate yet (one sample): left out, as metrics-server does.
    let names: Vec<&str> = all
        .iter()
        .filter_map(|p| p["metadata"]["name"].as_str())
        .collect();
    assert_eq!(names, ["web", "db"]);
    assert_eq!(
        all[0]["containers"][0]["usage"],
        json!({"cpu": "1000000n", "memory": "4Ki"})
    );
    let prod = pod_metrics(&summary(), &|ns, _| ns == "prod");
    assert_eq!(prod.len(), 1);
    assert_eq!(prod[0]["metadata"]["namespace"], "prod");
}
