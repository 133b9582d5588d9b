//! The resource metrics API (`metrics.k8s.io/v1beta1`, what `kubectl top`
//! reads) for the nodes linked to this cloud: each node's Summary, asked
//! through its link ([`crate::streams::PodStreams::stats`]), as
//! `NodeMetrics` and `PodMetrics`.
//!
//! - `GET /apis/metrics.k8s.io/v1beta1/nodes[/{name}]`
//! - `GET /apis/metrics.k8s.io/v1beta1/pods`,
//!   `GET /apis/metrics.k8s.io/v1beta1/namespaces/{ns}/pods[/{name}]`

use std::time::Duration;

use actix_web::{HttpResponse, web};
use apis::api::ApiError;
use apis::kinds::{Kind, ObjectKey};
use apis::streams::StatsKind;
use serde_json::{Value, json};

use crate::streams::PodStreams;

/// The API's group and version.
pub const GROUP_VERSION: &str = "metrics.k8s.io/v1beta1";

/// How long one node may take to answer.
const NODE_TIMEOUT: Duration = Duration::from_secs(10);

/// The routes.
pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.route("/apis/metrics.k8s.io/v1beta1/nodes", web::get().to(nodes))
        .route(
            "/apis/metrics.k8s.io/v1beta1/nodes/{name}",
            web::get().to(node),
        )
        .route("/apis/metrics.k8s.io/v1beta1/pods", web::get().to(all_pods))
        .route(
            "/apis/metrics.k8s.io/v1beta1/namespaces/{namespace}/pods",
            web::get().to(namespace_pods),
        )
        .route(
            "/apis/metrics.k8s.io/v1beta1/namespaces/{namespace}/pods/{name}",
            web::get().to(pod),
        );
}

/// A CPU quantity in nanocores.
fn cpu(nanocores: u64) -> String {
    format!("{nanocores}n")
}

/// A memory quantity in bytes, in KiB as metrics-server gives it.
fn memory(bytes: u64) -> String {
    format!("{}Ki", bytes / 1024)
}

fn number(value: &Value, pointer: &str) -> Option<u64> {
    value.pointer(pointer).and_then(Value::as_u64)
}

/// A Summary's node as `NodeMetrics`, if it has a CPU rate and memory.
pub fn node_metrics(summary: &Value) -> Option<Value> {
    let name = summary.pointer("/node/nodeName")?.as_str()?;
    let cores = number(summary, "/node/cpu/usageNanoCores")?;
    let bytes = number(summary, "/node/memory/workingSetBytes")?;
    Some(json!({
        "kind": "NodeMetrics",
        "apiVersion": GROUP_VERSION,
        "metadata": {"name": name, "labels": {}},
        "timestamp": summary.pointer("/node/cpu/time").cloned().unwrap_or(Value::Null),
        "window": "10s",
        "usage": {"cpu": cpu(cores), "memory": memory(bytes)},
    }))
}

/// A Summary's pods as `PodMetrics` (those with a CPU rate for every
/// container), with `keep` choosing by namespace and name.
pub fn pod_metrics(summary: &Value, keep: &dyn Fn(&str, &str) -> bool) -> Vec<Value> {
    let pods = summary.pointer("/pods").and_then(Value::as_array);
    pods.into_iter()
        .flatten()
        .filter_map(|pod| {
            let namespace = pod.pointer("/podRef/namespace")?.as_str()?;
            let name = pod.pointer("/podRef/name")?.as_str()?;
            if !keep(namespace, name) {
                return None;
            }
            let containers: Option<Vec<Value>> = pod
                .pointer("/containers")?
                .as_array()?
                .iter()
                .map(|c| {
                    Some(json!({
                        "name": c.get("name")?,
                        "usage": {
                            "cpu": cpu(number(c, "/cpu/usageNanoCores")?),
                            "memory": memory(number(c, "/memory/workingSetBytes")?),
                        },
                    }))
                })
                .collect();
            Some(json!({
                "kind": "PodMetrics",
                "apiVersion": GROUP_VERSION,
                "metadata": {"name": name, "namespace": namespace, "labels": {}},
                "timestamp": pod.pointer("/cpu/time").cloned().unwrap_or(Value::Null),
                "window": "10s",
                "containers": containers?,
            }))
        })
        .collect()
}

fn list(kind: &str, items: Vec<Value>) -> HttpResponse {
    HttpResponse::Ok().json(json!({
        "kind": kind,
        "apiVersion": GROUP_VERSION,
        "metadata": {},
        "items": items,
    }))
}

/// The Summaries of the nodes linked here (those that answer in time).
async fn summaries(streams: &PodStreams, only: Option<&str>) -> Result<Vec<Value>, ApiError> {
    let names: Vec<String> = match only {
        Some(name) => vec![name.to_owned()],
        None => {
            let (nodes, _) = streams
                .store()
                .list(Kind::Node, None)
                .map_err(|err| ApiError::Unavailable(err.to_string()))?;
            nodes
                .iter()
                .filter_map(|n| n.pointer("/metadata/name")?.as_str().map(str::to_owned))
                .filter(|name| streams.is_linked(name))
                .collect()
        }
    };
    let asked = names.iter().map(|name| async move {
        let answer =
            tokio::time::timeout(NODE_TIMEOUT, streams.stats(name, StatsKind::Summary)).await;
        match answer {
            Ok(Ok(bytes)) => serde_json::from_slice::<Value>(&bytes).map_err(|err| {
                ApiError::Unavailable(format!("node {name}'s stats do not read: {err}"))
            }),
            Ok(Err(err)) => Err(err),
            Err(_) => Err(ApiError::Unavailable(format!(
                "node {name} did not answer in time"
            ))),
        }
    });
    let answers = futures_util::future::join_all(asked).await;
    match only {
        // One node asked: its failure is the answer's.
        Some(_) => answers.into_iter().collect(),
        // Every node: those that answered.
        None => Ok(answers.into_iter().filter_map(Result::ok).collect()),
    }
}

async fn nodes(streams: web::Data<PodStreams>) -> Result<HttpResponse, ApiError> {
    let items = summaries(&streams, None)
        .await?
        .iter()
        .filter_map(node_metrics)
        .collect();
    Ok(list("NodeMetricsList", items))
}

async fn node(
    streams: web::Data<PodStreams>,
    name: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let name = name.into_inner();
    let not_found = || ApiError::NotFound(ObjectKey::new(Kind::Node, "", &name));
    if !streams.is_linked(&name) {
        return Err(not_found());
    }
    let summaries = summaries(&streams, Some(&name)).await?;
    let metrics = summaries
        .iter()
        .find_map(node_metrics)
        .ok_or_else(not_found)?;
    Ok(HttpResponse::Ok().json(metrics))
}

async fn all_pods(streams: web::Data<PodStreams>) -> Result<HttpResponse, ApiError> {
    let items = summaries(&streams, None)
        .await?
        .iter()
        .flat_map(|s| pod_metrics(s, &|_, _| true))
        .collect();
    Ok(list("PodMetricsList", items))
}

async fn namespace_pods(
    streams: web::Data<PodStreams>,
    namespace: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let namespace = namespace.into_inner();
    let items = summaries(&streams, None)
        .await?
        .iter()
        .flat_map(|s| pod_metrics(s, &|ns, _| ns == namespace))
        .collect();
    Ok(list("PodMetricsList", items))
}

async fn pod(
    streams: web::Data<PodStreams>,
    path: web::Path<(String, String)>,
) -> Result<HttpResponse, ApiError> {
    let (namespace, name) = path.into_inner();
    let key = ObjectKey::new(Kind::Pod, &namespace, &name);
    let node = streams.node_of_pod(&apis::streams::PodRef {
        namespace: namespace.clone(),
        name: name.clone(),
    })?;
    let summaries = summaries(&streams, Some(&node)).await?;
    let metrics = summaries
        .iter()
        .flat_map(|s| pod_metrics(s, &|ns, n| ns == namespace && n == name))
        .next()
        .ok_or(ApiError::NotFound(key))?;
    Ok(HttpResponse::Ok().json(metrics))
}

#[cfg(test)]
mod tests {
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
}
