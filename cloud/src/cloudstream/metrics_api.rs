//! The resource metrics API (`metrics.k8s.io/v1beta1`) for kube-apiserver's
//! aggregation layer (Kubernetes mode): with an `APIService` naming this
//! server, `kubectl top` and HorizontalPodAutoscalers read edge pods'
//! figures through the API server, as they read metrics-server's.
//!
//! metrics-server cannot do it for edge nodes: it scrapes each Node's
//! address, and every edge Node names the same cloudcore (see
//! [`crate::cloudstream::KubeletEndpoint`]) on a path that names no node.
//! This server knows which nodes are linked here and asks each through its
//! link; the cluster's own nodes it reads from their kubelets through the
//! API server's node proxy ([`ClusterKubelets`]), so one APIService serves
//! both.
//!
//! - TLS with this cloudcore's certificate (the APIService's `caBundle` is
//!   cloudcore's CA), and a client certificate required: the front
//!   proxy's (kube-apiserver's `--proxy-client-cert-file`), signed by the
//!   request-header CA and named in its allowed names, both as the API
//!   server publishes them in `kube-system/extension-apiserver-authentication`.
//! - The user is the one the front proxy names (`X-Remote-User`,
//!   `X-Remote-Group`), and the API server decides
//!   ([`super::review`]): `get` or `list` on `metrics.k8s.io` `nodes` or
//!   `pods`, as metrics-server's delegated authorization asks.
//! - Discovery (`/apis/metrics.k8s.io/v1beta1`, what the APIService's
//!   availability check reads) and health paths are static, and open to
//!   any certificate the request-header CA signed.

use std::collections::BTreeMap;
use std::sync::Arc;

use hyper::body::Incoming;
use hyper::header::HeaderMap;
use hyper::{Request, Response, StatusCode};
use serde_json::{Value, json};
use tracing::{debug, info, warn};

use super::{Body, Handler, KubeletApiHandle, api_error, decide, full, status};
use crate::cloudstream::metrics::{GROUP_VERSION, MetricsQuery, ResourceMetrics};
use crate::reviews::{Authorizer, Caller};

/// Where the resource metrics API listens by default.
pub const DEFAULT_ADDRESS: &str = "0.0.0.0:10353";

/// The ConfigMap (in `kube-system`) where kube-apiserver publishes how its
/// front proxy authenticates.
pub const AUTHENTICATION_CONFIG_MAP: &str = "extension-apiserver-authentication";

/// The most kubelets asked at once through the API server.
#[cfg(feature = "kubernetes")]
const MAX_KUBELETS_AT_ONCE: usize = 16;

/// The resource metrics API's settings.
pub struct MetricsApiConfig {
    /// host:port to listen on.
    pub address: String,
    /// TLS: this server's certificate, and client certificates required
    /// and verified against the request-header CA.
    pub tls: Arc<rustls::ServerConfig>,
    /// How the front proxy names its user.
    pub front_proxy: FrontProxy,
    /// Who may do what.
    pub authorizer: Arc<dyn Authorizer>,
}

/// How kube-apiserver's front proxy names the user it forwards for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FrontProxy {
    /// The common names a proxy's certificate may carry (empty: any the
    /// request-header CA signed).
    pub allowed_names: Vec<String>,
    /// The headers naming the user, first present wins.
    pub username_headers: Vec<String>,
    /// The headers naming its groups, every value of each.
    pub group_headers: Vec<String>,
    /// The prefixes of headers carrying the user's extra (`X-Remote-Extra-`:
    /// `X-Remote-Extra-Scopes: a` is extra `scopes` = `a`).
    pub extra_prefixes: Vec<String>,
}

impl FrontProxy {
    /// The front proxy and its CA (PEM) from the data of
    /// [`AUTHENTICATION_CONFIG_MAP`].
    pub fn from_config_map(
        data: &BTreeMap<String, String>,
    ) -> Result<(FrontProxy, String), String> {
        let ca = data
            .get("requestheader-client-ca-file")
            .filter(|ca| !ca.trim().is_empty())
            .ok_or("no requestheader-client-ca-file: is the API server's aggregation layer set up (--requestheader-client-ca-file)?")?;
        let names = |key: &str| -> Result<Vec<String>, String> {
            match data.get(key) {
                None => Ok(Vec::new()),
                Some(text) => serde_json::from_str(text).map_err(|err| format!("{key}: {err}")),
            }
        };
        let front_proxy = FrontProxy {
            allowed_names: names("requestheader-allowed-names")?,
            username_headers: names("requestheader-username-headers")?,
            group_headers: names("requestheader-group-headers")?,
            extra_prefixes: names("requestheader-extra-headers-prefix")?,
        };
        if front_proxy.username_headers.is_empty() {
            return Err("no requestheader-username-headers".to_owned());
        }
        Ok((front_proxy, ca.clone()))
    }

    /// The user a request from `proxy` (its certificate's subject) names.
    pub fn caller(&self, proxy: Option<&Caller>, headers: &HeaderMap) -> Result<Caller, String> {
        let proxy = proxy.ok_or("a client certificate with a common name is required")?;
        if !self.allowed_names.is_empty() && !self.allowed_names.contains(&proxy.user) {
            return Err(format!(
                "{} is not an allowed front proxy (requestheader-allowed-names)",
                proxy.user
            ));
        }
        let user = self
            .username_headers
            .iter()
            .find_map(|name| {
                let value = headers.get(name.as_str())?.to_str().ok()?.trim();
                (!value.is_empty()).then(|| value.to_owned())
            })
            .ok_or("the front proxy named no user")?;
        let groups = self
            .group_headers
            .iter()
            .flat_map(|name| headers.get_all(name.as_str()))
            .filter_map(|value| value.to_str().ok())
            .map(str::to_owned)
            .collect();
        Ok(Caller {
            user,
            groups,
            extra: self.extra(headers),
        })
    }

    /// The user's extra, as kube-apiserver reads it: each header under a
    /// prefix names a key (the rest of its name, lower case, %-escapes
    /// undone), every value of it a value.
    fn extra(&self, headers: &HeaderMap) -> BTreeMap<String, Vec<String>> {
        let mut extra: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for prefix in &self.extra_prefixes {
            let prefix = prefix.to_ascii_lowercase();
            for (name, value) in headers {
                // Header names are lower case here (hyper's HeaderName).
                let Some(key) = name.as_str().strip_prefix(prefix.as_str()) else {
                    continue;
                };
                let Ok(key) = percent_encoding::percent_decode_str(key).decode_utf8() else {
                    continue;
                };
                if let (false, Ok(value)) = (key.is_empty(), value.to_str()) {
                    extra
                        .entry(key.to_lowercase())
                        .or_default()
                        .push(value.to_owned());
                }
            }
        }
        extra
    }
}

/// The front proxy's settings and CA (PEM) as the API server publishes
/// them.
#[cfg(feature = "kubernetes")]
pub async fn published_front_proxy(client: kube::Client) -> Result<(FrontProxy, String), String> {
    use k8s_openapi::api::core::v1::ConfigMap;
    let maps: kube::Api<ConfigMap> = kube::Api::namespaced(client, "kube-system");
    let map = maps
        .get(AUTHENTICATION_CONFIG_MAP)
        .await
        .map_err(|err| format!("kube-system/{AUTHENTICATION_CONFIG_MAP}: {err}"))?;
    FrontProxy::from_config_map(&map.data.unwrap_or_default())
}

/// Starts the resource metrics API over `metrics`.
pub async fn start(
    config: MetricsApiConfig,
    metrics: ResourceMetrics,
) -> std::io::Result<KubeletApiHandle> {
    let served = Arc::new(Served {
        metrics,
        front_proxy: config.front_proxy,
        authorizer: config.authorizer,
    });
    let handler: Handler = Arc::new(move |request, proxy, _permit| {
        let served = served.clone();
        Box::pin(async move { serve(request, proxy, &served).await })
    });
    let handle = super::serve_tls(&config.address, config.tls, handler, "metrics_api").await?;
    info!(address = %handle.address, "resource metrics API (metrics.k8s.io) listening");
    Ok(handle)
}

struct Served {
    metrics: ResourceMetrics,
    front_proxy: FrontProxy,
    authorizer: Arc<dyn Authorizer>,
}

/// What a path asks of this server.
#[derive(Debug, PartialEq, Eq)]
enum Asked {
    Health,
    Discovery(Value),
    Metrics(MetricsQuery),
}

fn asked(path: &str) -> Option<Asked> {
    let resources = json!([
        {"name": "nodes", "singularName": "", "namespaced": false, "kind": "NodeMetrics", "verbs": ["get", "list"]},
        {"name": "pods", "singularName": "", "namespaced": true, "kind": "PodMetrics", "verbs": ["get", "list"]},
    ]);
    let version = json!({"groupVersion": GROUP_VERSION, "version": "v1beta1"});
    let group = json!({
        "kind": "APIGroup", "apiVersion": "v1", "name": "metrics.k8s.io",
        "versions": [version], "preferredVersion": version,
    });
    Some(match path.trim_end_matches('/') {
        "/healthz" | "/livez" | "/readyz" => Asked::Health,
        "/apis" => Asked::Discovery(json!({
            "kind": "APIGroupList", "apiVersion": "v1", "groups": [group],
        })),
        "/apis/metrics.k8s.io" => Asked::Discovery(group),
        "/apis/metrics.k8s.io/v1beta1" => Asked::Discovery(json!({
            "kind": "APIResourceList", "apiVersion": "v1",
            "groupVersion": GROUP_VERSION, "resources": resources,
        })),
        _ => Asked::Metrics(MetricsQuery::from_path(path)?),
    })
}

fn json_response(value: &Value) -> Response<Body> {
    let mut response = Response::new(full(value.to_string()));
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    response
}

async fn serve(
    request: Request<Incoming>,
    proxy: Option<Caller>,
    served: &Served,
) -> Response<Body> {
    let path = request.uri().path().to_owned();
    if request.method() != hyper::Method::GET {
        return status(
            StatusCode::METHOD_NOT_ALLOWED,
            "the metrics API is read-only",
        );
    }
    let query = match asked(&path) {
        None => return status(StatusCode::NOT_FOUND, &format!("no such path: {path}")),
        Some(Asked::Health) => return Response::new(full("ok")),
        Some(Asked::Discovery(document)) => return json_response(&document),
        Some(Asked::Metrics(query)) => query,
    };
    let caller = match served.front_proxy.caller(proxy.as_ref(), request.headers()) {
        Ok(caller) => caller,
        Err(reason) => return status(StatusCode::UNAUTHORIZED, &reason),
    };
    let access = query.access();
    match decide(served.authorizer.as_ref(), &caller, &access).await {
        Ok(true) => {}
        Ok(false) => {
            let message = format!(
                "{} \"{}\" is forbidden: User \"{}\" cannot {} resource \"{}\" in API group \"metrics.k8s.io\"{}",
                access.resource,
                access.name,
                caller.user,
                access.verb,
                access.resource,
                match access.namespace.as_str() {
                    "" => String::new(),
                    namespace => format!(" in the namespace \"{namespace}\""),
                },
            );
            return status(StatusCode::FORBIDDEN, &message);
        }
        Err(reason) => {
            warn!(%reason, "no authorization decision");
            return status(
                StatusCode::SERVICE_UNAVAILABLE,
                "no authorization decision could be had; see cloudcore's log",
            );
        }
    }
    debug!(user = %caller.user, %path, "metrics API request");
    let selector =
        match crate::cloudstream::metrics::label_selector(request.uri().query().unwrap_or("")) {
            Ok(selector) => selector,
            Err(err) => return api_error(&err),
        };
    match served.metrics.answer(&query, selector.as_ref()).await {
        Ok(answer) => json_response(&answer),
        Err(err) => api_error(&err),
    }
}

/// The cluster's own nodes' kubelets, read through the API server's node
/// proxy (`/api/v1/nodes/{name}/proxy/stats/summary`): every Node not
/// labelled `node-role.kubernetes.io/edge`.
#[cfg(feature = "kubernetes")]
pub struct ClusterKubelets {
    client: kube::Client,
}

#[cfg(feature = "kubernetes")]
impl ClusterKubelets {
    /// The kubelets of the cluster `client` talks to.
    pub fn new(client: kube::Client) -> ClusterKubelets {
        ClusterKubelets { client }
    }

    async fn names(&self, only: Option<&str>) -> Vec<String> {
        use k8s_openapi::api::core::v1::Node;
        let nodes: kube::Api<Node> = kube::Api::all(self.client.clone());
        let listed = match only {
            Some(name) => nodes
                .get_opt(name)
                .await
                .map(|node| node.into_iter().collect()),
            None => nodes
                .list(&kube::api::ListParams::default().labels("!node-role.kubernetes.io/edge"))
                .await
                .map(|list| list.items),
        };
        let listed: Vec<Node> = listed.unwrap_or_else(|err| {
            warn!(error = %err, "the cluster's nodes could not be listed");
            Vec::new()
        });
        listed
            .into_iter()
            .filter(|node| {
                let labels = node.metadata.labels.as_ref();
                !labels.is_some_and(|l| l.contains_key("node-role.kubernetes.io/edge"))
            })
            .filter_map(|node| node.metadata.name)
            .collect()
    }

    async fn summary(&self, name: &str) -> Option<Value> {
        let path = format!("/api/v1/nodes/{name}/proxy/stats/summary?only_cpu_and_memory=true");
        let request = hyper::Request::get(path).body(Vec::new()).ok()?;
        let asked = tokio::time::timeout(
            crate::cloudstream::metrics::NODE_TIMEOUT,
            self.client.request_text(request),
        );
        match asked.await {
            Ok(Ok(text)) => serde_json::from_str(&text).ok(),
            Ok(Err(err)) => {
                debug!(node = name, error = %err, "a kubelet's stats could not be read");
                None
            }
            Err(_) => {
                debug!(node = name, "a kubelet's stats took too long");
                None
            }
        }
    }
}

#[cfg(feature = "kubernetes")]
impl crate::cloudstream::metrics::OtherKubelets for ClusterKubelets {
    fn summaries<'a>(
        &'a self,
        only: Option<&'a str>,
    ) -> futures_util::future::BoxFuture<'a, Vec<Value>> {
        Box::pin(async move {
            use futures_util::StreamExt;
            let listed =
                tokio::time::timeout(crate::cloudstream::metrics::NODE_TIMEOUT, self.names(only));
            let Ok(names) = listed.await else {
                warn!("the cluster's nodes were not listed in time");
                return Vec::new();
            };
            let asked: Vec<_> = names
                .into_iter()
                .map(|name| async move { self.summary(&name).await })
                .collect();
            futures_util::stream::iter(asked)
                .buffer_unordered(MAX_KUBELETS_AT_ONCE)
                .collect::<Vec<Option<Value>>>()
                .await
                .into_iter()
                .flatten()
                .collect()
        })
    }

    fn labels(
        &self,
        kind: apis::Kind,
    ) -> futures_util::future::BoxFuture<'_, std::collections::HashMap<(String, String), Value>>
    {
        use k8s_openapi::api::core::v1::{Node, Pod};
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
        Box::pin(async move {
            let params = kube::api::ListParams::default();
            let listing = async {
                let metadata: Result<Vec<ObjectMeta>, kube::Error> = match kind {
                    apis::Kind::Node => kube::Api::<Node>::all(self.client.clone())
                        .list_metadata(&params)
                        .await
                        .map(|list| list.items.into_iter().map(|o| o.metadata).collect()),
                    _ => kube::Api::<Pod>::all(self.client.clone())
                        .list_metadata(&params)
                        .await
                        .map(|list| list.items.into_iter().map(|o| o.metadata).collect()),
                };
                metadata
            };
            let listed = match tokio::time::timeout(
                crate::cloudstream::metrics::NODE_TIMEOUT,
                listing,
            )
            .await
            {
                Ok(Ok(listed)) => listed,
                Ok(Err(err)) => {
                    warn!(error = %err, "the cluster's labels could not be listed");
                    Vec::new()
                }
                Err(_) => {
                    warn!("the cluster's labels were not listed in time");
                    Vec::new()
                }
            };
            listed
                .into_iter()
                .map(|meta| {
                    let key = (
                        meta.namespace.unwrap_or_default(),
                        meta.name.unwrap_or_default(),
                    );
                    (key, json!(meta.labels.unwrap_or_default()))
                })
                .collect()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn published() -> BTreeMap<String, String> {
        [
            (
                "requestheader-client-ca-file",
                "-----BEGIN CERTIFICATE-----\n...",
            ),
            ("requestheader-allowed-names", r#"["front-proxy-client"]"#),
            ("requestheader-username-headers", r#"["X-Remote-User"]"#),
            ("requestheader-group-headers", r#"["X-Remote-Group"]"#),
            (
                "requestheader-extra-headers-prefix",
                r#"["X-Remote-Extra-"]"#,
            ),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
    }

    fn proxy(name: &str) -> Caller {
        Caller::new(name, Vec::new())
    }

    #[test]
    fn the_front_proxy_names_the_user_it_forwards_for() {
        let (front_proxy, ca) = FrontProxy::from_config_map(&published()).expect("reads");
        assert!(ca.starts_with("-----BEGIN CERTIFICATE-----"));
        assert_eq!(front_proxy.allowed_names, ["front-proxy-client"]);
        let mut headers = HeaderMap::new();
        headers.insert("x-remote-user", "alice".parse().expect("value"));
        headers.append("x-remote-group", "devs".parse().expect("value"));
        headers.append(
            "x-remote-group",
            "system:authenticated".parse().expect("value"),
        );
        let caller = front_proxy
            .caller(Some(&proxy("front-proxy-client")), &headers)
            .expect("a caller");
        assert_eq!(caller.user, "alice");
        assert_eq!(caller.groups, ["devs", "system:authenticated"]);
        assert!(caller.extra.is_empty());
        // Extra headers: the key lower case and unescaped, every value.
        headers.append("x-remote-extra-scopes", "view".parse().expect("value"));
        headers.append("x-remote-extra-scopes", "edit".parse().expect("value"));
        headers.append(
            "x-remote-extra-example.org%2fteam",
            "edge".parse().expect("value"),
        );
        let caller = front_proxy
            .caller(Some(&proxy("front-proxy-client")), &headers)
            .expect("a caller");
        assert_eq!(
            caller.extra,
            BTreeMap::from([
                ("example.org/team".to_owned(), vec!["edge".to_owned()]),
                (
                    "scopes".to_owned(),
                    vec!["view".to_owned(), "edit".to_owned()]
                ),
            ])
        );
        // Another certificate of the CA is no front proxy; none is none.
        let refused = front_proxy.caller(Some(&proxy("mallory")), &headers);
        assert!(
            refused
                .expect_err("refused")
                .contains("not an allowed front proxy")
        );
        assert!(front_proxy.caller(None, &headers).is_err());
        // A proxy naming nobody is refused, not taken as anonymous.
        let nobody = front_proxy.caller(Some(&proxy("front-proxy-client")), &HeaderMap::new());
        assert!(nobody.is_err());
    }

    #[test]
    fn a_cluster_without_the_aggregation_layer_says_so() {
        let mut data = published();
        data.remove("requestheader-client-ca-file");
        let err = FrontProxy::from_config_map(&data).expect_err("no CA");
        assert!(err.contains("--requestheader-client-ca-file"), "{err}");
        let mut data = published();
        data.insert(
            "requestheader-allowed-names".to_owned(),
            "front-proxy".to_owned(),
        );
        assert!(FrontProxy::from_config_map(&data).is_err());
    }

    #[test]
    fn paths_read_as_discovery_health_or_queries() {
        assert_eq!(asked("/healthz"), Some(Asked::Health));
        let Some(Asked::Discovery(list)) = asked("/apis/metrics.k8s.io/v1beta1") else {
            panic!("discovery");
        };
        assert_eq!(list["kind"], "APIResourceList");
        assert_eq!(list["resources"][1]["name"], "pods");
        assert_eq!(list["resources"][1]["namespaced"], true);
        assert_eq!(
            asked("/apis/metrics.k8s.io/v1beta1/namespaces/default/pods/web"),
            Some(Asked::Metrics(MetricsQuery::Pod {
                namespace: "default".to_owned(),
                name: "web".to_owned()
            }))
        );
        assert_eq!(
            asked("/apis/metrics.k8s.io/v1beta1/nodes"),
            Some(Asked::Metrics(MetricsQuery::Nodes))
        );
        assert_eq!(asked("/apis/metrics.k8s.io/v1beta1/secrets"), None);
        assert_eq!(asked("/api/v1/pods"), None);
    }
}
