//! The resource metrics API (`metrics.k8s.io/v1beta1`, what `kubectl top`
//! reads) for the nodes linked to this cloud: each node's Summary, asked
//! through its link ([`crate::cloudstream::streams::PodStreams::stats`]), as
//! `NodeMetrics` and `PodMetrics` ([`ResourceMetrics`]). The admin API
//! serves it; in Kubernetes mode so does [`crate::cloudstream::metrics_api`]
//! for kube-apiserver's aggregation layer, with the cluster's own nodes
//! beside the edge's ([`OtherKubelets`]).
//!
//! - `GET /apis/metrics.k8s.io/v1beta1/nodes[/{name}]`
//! - `GET /apis/metrics.k8s.io/v1beta1/pods`,
//!   `GET /apis/metrics.k8s.io/v1beta1/namespaces/{ns}/pods[/{name}]`
//!
//! Lists take a `labelSelector` (`kubectl top pod -l app=web`, a
//! HorizontalPodAutoscaler's selector): the pods' and nodes' labels come
//! from the desired state, and for the cluster's own pods and nodes from
//! [`OtherKubelets::labels`].
//!
//! With replicas, the nodes another replica holds are asked of it
//! ([`crate::peers`]): a list is this replica's items and every other
//! replica's, each object once (selected here, by the shared desired
//! state's labels); one node or pod is answered by its holder. A request
//! a replica forwarded is answered from the nodes linked to the replica
//! it reaches only.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use actix_web::{HttpResponse, web};
use apis::api::ApiError;
use apis::kinds::{Kind, ObjectKey};
use apis::selector::LabelSelector;
use apis::streams::StatsKind;
use futures_util::future::BoxFuture;
use serde_json::{Value, json};

use crate::cloudstream::streams::PodStreams;
use crate::peers::{ForwardError, Route};
use crate::reviews::Access;

/// The API's group and version.
pub const GROUP_VERSION: &str = "metrics.k8s.io/v1beta1";

/// How long one node may take to answer.
pub(crate) const NODE_TIMEOUT: Duration = Duration::from_secs(10);

/// The routes, answered by the [`ResourceMetrics`] in the app's data.
pub fn routes(cfg: &mut web::ServiceConfig) {
    for path in [
        "/apis/metrics.k8s.io/v1beta1/nodes",
        "/apis/metrics.k8s.io/v1beta1/nodes/{name}",
        "/apis/metrics.k8s.io/v1beta1/pods",
        "/apis/metrics.k8s.io/v1beta1/namespaces/{namespace}/pods",
        "/apis/metrics.k8s.io/v1beta1/namespaces/{namespace}/pods/{name}",
    ] {
        cfg.route(path, web::get().to(answer));
    }
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

/// What a metrics API request asks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MetricsQuery {
    /// Every node's `NodeMetrics`.
    Nodes,
    /// One node's.
    Node(String),
    /// Every pod's `PodMetrics`, or a namespace's.
    Pods {
        /// The namespace (`None`: all).
        namespace: Option<String>,
    },
    /// One pod's.
    Pod {
        /// The pod's namespace.
        namespace: String,
        /// The pod's name.
        name: String,
    },
}

impl MetricsQuery {
    /// The query a path under `/apis/metrics.k8s.io/v1beta1/` asks.
    pub fn from_path(path: &str) -> Option<MetricsQuery> {
        let rest = path.strip_prefix("/apis/metrics.k8s.io/v1beta1/")?;
        let parts: Vec<&str> = rest.trim_end_matches('/').split('/').collect();
        let owned = |s: &str| (!s.is_empty()).then(|| s.to_owned());
        Some(match parts.as_slice() {
            ["nodes"] => MetricsQuery::Nodes,
            ["nodes", name] => MetricsQuery::Node(owned(name)?),
            ["pods"] => MetricsQuery::Pods { namespace: None },
            ["namespaces", namespace, "pods"] => MetricsQuery::Pods {
                namespace: Some(owned(namespace)?),
            },
            ["namespaces", namespace, "pods", name] => MetricsQuery::Pod {
                namespace: owned(namespace)?,
                name: owned(name)?,
            },
            _ => return None,
        })
    }

    /// The path asking this query (what [`MetricsQuery::from_path`] reads).
    pub fn path(&self) -> String {
        let base = "/apis/metrics.k8s.io/v1beta1";
        match self {
            MetricsQuery::Nodes => format!("{base}/nodes"),
            MetricsQuery::Node(name) => format!("{base}/nodes/{name}"),
            MetricsQuery::Pods { namespace: None } => format!("{base}/pods"),
            MetricsQuery::Pods {
                namespace: Some(namespace),
            } => format!("{base}/namespaces/{namespace}/pods"),
            MetricsQuery::Pod { namespace, name } => {
                format!("{base}/namespaces/{namespace}/pods/{name}")
            }
        }
    }

    /// What the caller needs to be allowed, as an aggregated API server
    /// asks: `get` or `list` on `metrics.k8s.io` `nodes` or `pods`.
    pub fn access(&self) -> Access {
        let (verb, resource, namespace, name) = match self {
            MetricsQuery::Nodes => ("list", "nodes", "", ""),
            MetricsQuery::Node(name) => ("get", "nodes", "", name.as_str()),
            MetricsQuery::Pods { namespace } => {
                ("list", "pods", namespace.as_deref().unwrap_or(""), "")
            }
            MetricsQuery::Pod { namespace, name } => {
                ("get", "pods", namespace.as_str(), name.as_str())
            }
        };
        Access {
            verb,
            group: "metrics.k8s.io",
            resource,
            subresource: "",
            namespace: namespace.to_owned(),
            name: name.to_owned(),
        }
    }
}

/// Kubelets not linked here whose Summaries count too: a cluster's own
/// nodes, read through the API server's node proxy.
pub trait OtherKubelets: Send + Sync {
    /// The Summaries of its nodes (`only`: that one's, if it is one of
    /// them), those that answer in time.
    fn summaries<'a>(&'a self, only: Option<&'a str>) -> BoxFuture<'a, Vec<Value>>;

    /// The labels of its objects of `kind` (pods or nodes), by namespace
    /// and name.
    fn labels(&self, kind: Kind) -> BoxFuture<'_, HashMap<(String, String), Value>>;
}

/// The labels of pods and nodes, for selecting metrics by them.
fn labels_of(object: &Value) -> Value {
    match &object["metadata"]["labels"] {
        Value::Object(labels) => Value::Object(labels.clone()),
        _ => json!({}),
    }
}

/// The resource metrics of the nodes linked here, and of `others` if
/// given: one piece for the admin API and the aggregated API.
#[derive(Clone)]
pub struct ResourceMetrics {
    streams: PodStreams,
    others: Option<Arc<dyn OtherKubelets>>,
}

impl ResourceMetrics {
    /// The metrics of the nodes `streams` reaches, and of `others`.
    pub fn new(streams: PodStreams, others: Option<Arc<dyn OtherKubelets>>) -> ResourceMetrics {
        ResourceMetrics { streams, others }
    }

    /// The answer to `query`: a metrics object or list (of those whose
    /// labels `selector` selects, if given).
    pub async fn answer(
        &self,
        query: &MetricsQuery,
        selector: Option<&LabelSelector>,
    ) -> Result<Value, ApiError> {
        self.answer_as(query, selector, false).await
    }

    /// [`ResourceMetrics::answer`]; `forwarded`: another replica asks, for
    /// the nodes linked here only (never forwarded again).
    pub async fn answer_as(
        &self,
        query: &MetricsQuery,
        selector: Option<&LabelSelector>,
        forwarded: bool,
    ) -> Result<Value, ApiError> {
        match query {
            MetricsQuery::Nodes => {
                let own = match forwarded {
                    true => linked(&self.streams, None).await?,
                    false => self.all().await?,
                };
                let items = own.iter().filter_map(node_metrics).collect();
                let items = self.with_peers(query, items, forwarded).await;
                let items = self.selected(Kind::Node, items, selector).await;
                Ok(list("NodeMetricsList", items))
            }
            MetricsQuery::Node(name) => {
                let key = ObjectKey::new(Kind::Node, "", name);
                if let Some(answer) = self.at_holder(name, query, &key, forwarded).await {
                    return answer;
                }
                let not_found = || ApiError::NotFound(key.clone());
                let summaries = if self.streams.is_linked(name) {
                    linked(&self.streams, Some(name)).await?
                } else if let Some(others) = &self.others {
                    others.summaries(Some(name)).await
                } else {
                    return Err(not_found());
                };
                summaries
                    .iter()
                    .find_map(node_metrics)
                    .ok_or_else(not_found)
            }
            MetricsQuery::Pods { namespace } => {
                let keep = |ns: &str, _: &str| namespace.as_deref().is_none_or(|n| n == ns);
                let own = match forwarded {
                    true => linked(&self.streams, None).await?,
                    false => self.all().await?,
                };
                let items = own.iter().flat_map(|s| pod_metrics(s, &keep)).collect();
                let items = self.with_peers(query, items, forwarded).await;
                let items = self.selected(Kind::Pod, items, selector).await;
                Ok(list("PodMetricsList", items))
            }
            MetricsQuery::Pod { namespace, name } => {
                let key = ObjectKey::new(Kind::Pod, namespace, name);
                let pod = apis::streams::PodRef {
                    namespace: namespace.clone(),
                    name: name.clone(),
                };
                // An edge pod's node is known; another's is found by asking.
                if let Ok(node) = self.streams.node_of_pod(&pod)
                    && let Some(answer) = self.at_holder(&node, query, &key, forwarded).await
                {
                    return answer;
                }
                let summaries = match self.streams.node_of_pod(&pod) {
                    // Linked here, or no other kubelets to ask: that node's
                    // answer (or why there is none: "not linked here").
                    Ok(node) if self.streams.is_linked(&node) || self.others.is_none() => {
                        linked(&self.streams, Some(&node)).await?
                    }
                    Ok(_) | Err(ApiError::NotFound(_)) => match &self.others {
                        Some(others) => others.summaries(None).await,
                        None => return Err(ApiError::NotFound(key)),
                    },
                    Err(err) => return Err(err),
                };
                summaries
                    .iter()
                    .flat_map(|s| pod_metrics(s, &|ns, n| ns == namespace && n == name))
                    .next()
                    .ok_or(ApiError::NotFound(key))
            }
        }
    }

    /// The answer of the replica holding `node`, when another one does
    /// (`None`: answered here). Its refusal is this answer's (`key`: the
    /// object asked for, when it says not found).
    async fn at_holder(
        &self,
        node: &str,
        query: &MetricsQuery,
        key: &ObjectKey,
        forwarded: bool,
    ) -> Option<Result<Value, ApiError>> {
        let peers = self.streams.peers()?;
        match self.streams.route(node, forwarded).await {
            Route::Here => None,
            Route::Refuse(err) => Some(Err(err)),
            Route::Forward { replica, url } => Some(
                peers
                    .get(node, &replica, &url, &query.path())
                    .await
                    .map_err(|err| api_error(err, key)),
            ),
        }
    }

    /// `items` and every other replica's answer to `query` (unless this
    /// is a forwarded request), each object once. A replica that does not
    /// answer is left out.
    async fn with_peers(
        &self,
        query: &MetricsQuery,
        items: Vec<Value>,
        forwarded: bool,
    ) -> Vec<Value> {
        let Some(peers) = self.streams.peers().filter(|_| !forwarded) else {
            return items;
        };
        let path = query.path();
        let others = peers.others().await;
        let asked = others.iter().map(|(replica, url)| {
            let path = &path;
            async move {
                match peers.get(replica, replica, url, path).await {
                    Ok(answer) => match answer.get("items") {
                        Some(Value::Array(items)) => items.clone(),
                        _ => Vec::new(),
                    },
                    Err(err) => {
                        tracing::warn!(%replica, error = %err, "a replica's metrics left out");
                        Vec::new()
                    }
                }
            }
        });
        let theirs = futures_util::future::join_all(asked).await;
        crate::peers::merge_items(items, theirs)
    }

    /// `items` (metrics of objects of `kind`) with their objects' labels,
    /// those `selector` selects; as they are without one.
    async fn selected(
        &self,
        kind: Kind,
        mut items: Vec<Value>,
        selector: Option<&LabelSelector>,
    ) -> Vec<Value> {
        let Some(selector) = selector.filter(|s| !s.is_empty()) else {
            return items;
        };
        let key_of = |item: &Value| {
            let metadata = &item["metadata"];
            (
                metadata["namespace"].as_str().unwrap_or("").to_owned(),
                metadata["name"].as_str().unwrap_or("").to_owned(),
            )
        };
        let mut unknown = false;
        for item in &mut items {
            let (namespace, name) = key_of(item);
            match self
                .streams
                .store()
                .get(&ObjectKey::new(kind, namespace, name))
            {
                Ok(Some(object)) => item["metadata"]["labels"] = labels_of(object.json()),
                _ => unknown = true,
            }
        }
        if unknown && let Some(others) = &self.others {
            let labels = others.labels(kind).await;
            for item in &mut items {
                if let Some(found) = labels.get(&key_of(item)) {
                    item["metadata"]["labels"] = found.clone();
                }
            }
        }
        items.retain(|item| selector.matches_object(item));
        items
    }

    /// Every node's Summary that answers.
    async fn all(&self) -> Result<Vec<Value>, ApiError> {
        let mut summaries = linked(&self.streams, None).await?;
        if let Some(others) = &self.others {
            let known: Vec<String> = summaries
                .iter()
                .filter_map(|s| s.pointer("/node/nodeName")?.as_str().map(str::to_owned))
                .collect();
            let more = others.summaries(None).await.into_iter().filter(|s| {
                s.pointer("/node/nodeName")
                    .and_then(Value::as_str)
                    .is_none_or(|name| !known.iter().any(|k| k == name))
            });
            summaries.extend(more);
        }
        Ok(summaries)
    }
}

/// A peer's refusal as this API's: not found stays not found.
fn api_error(err: ForwardError, key: &ObjectKey) -> ApiError {
    match err {
        ForwardError::Refused { code: 404, .. } => ApiError::NotFound(key.clone()),
        ForwardError::Refused {
            code: 400, message, ..
        } => ApiError::BadRequest(message),
        ForwardError::Refused {
            code: 403, message, ..
        } => ApiError::Forbidden(message),
        other => ApiError::Unavailable(other.to_string()),
    }
}

fn list(kind: &str, items: Vec<Value>) -> Value {
    json!({
        "kind": kind,
        "apiVersion": GROUP_VERSION,
        "metadata": {},
        "items": items,
    })
}

/// The Summaries of the nodes linked here (those that answer in time).
async fn linked(streams: &PodStreams, only: Option<&str>) -> Result<Vec<Value>, ApiError> {
    let names: Vec<String> = match only {
        Some(name) => vec![name.to_owned()],
        None => {
            let (nodes, _) = streams
                .store()
                .list(Kind::Node, None)
                .map_err(|err| ApiError::Unavailable(err.to_string()))?;
            nodes
                .into_iter()
                .map(|node| node.key().name.clone())
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

async fn answer(
    metrics: web::Data<ResourceMetrics>,
    request: actix_web::HttpRequest,
) -> Result<HttpResponse, ApiError> {
    let query = MetricsQuery::from_path(request.path())
        .ok_or_else(|| ApiError::BadRequest(format!("no such metrics: {}", request.path())))?;
    let selector = label_selector(request.query_string())?;
    let forwarded = crate::peers::forwarded(&request);
    Ok(HttpResponse::Ok().json(
        metrics
            .answer_as(&query, selector.as_ref(), forwarded)
            .await?,
    ))
}

/// The `labelSelector` of a query string, if there is one.
pub fn label_selector(query: &str) -> Result<Option<LabelSelector>, ApiError> {
    form_urlencoded::parse(query.as_bytes())
        .find(|(key, _)| key == "labelSelector")
        .map(|(_, text)| LabelSelector::parse(&text))
        .transpose()
        .map_err(|err| ApiError::BadRequest(err.to_string()))
}

#[cfg(test)]
mod tests;
