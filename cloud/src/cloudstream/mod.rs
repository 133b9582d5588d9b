//! The kubelet API of edge nodes, served by cloudcore (Kubernetes mode):
//! kube-apiserver calls it for `kubectl logs`, `exec`, `attach`,
//! `port-forward` and a node's stats, as it calls a kubelet, and each call
//! goes through the node's link ([`crate::cloudstream::streams::PodStreams`]).
//!
//! - TLS, with a client certificate required and checked against the API
//!   server's kubelet-client CA; the certificate names the caller, and the
//!   API server decides what it may do ([`review`]), as a kubelet with
//!   webhook authorization asks.
//! - `/containerLogs/...` is a stream of the log's bytes; `/exec`,
//!   `/attach` and `/portForward` are HTTP upgrades passed to the node as
//!   made (SPDY/3.1 or WebSocket) and answered by its runtime's streaming
//!   server, so whichever protocol kube-apiserver speaks works.
//! - Edge nodes' `Node` objects name this server (their `InternalIP` and
//!   `daemonEndpoints.kubeletEndpoint.port`; see the controller's
//!   `KubeletEndpoint`), so the API server reaches it with no rule on its
//!   host. The path names the pod, and the pod its node; the node stats
//!   paths name no node, so the request's `Host` must (a Node address that
//!   is the node's own name, resolving here).
//! - KubeEdge edgecores (linked in KubeEdge's dialect, whose links carry
//!   no streams) are reached through their own edgestream tunnel to this
//!   cloud instead ([`edgestream`]).

pub mod edgestream;
pub mod endpoint;
pub mod metrics;
pub mod metrics_api;
pub mod route;
pub mod streams;

mod upgrade;

pub use endpoint::KubeletEndpoint;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use apis::api::ApiError;
use apis::streams::{StreamRequest, channel};
use bytes::Bytes;
use futures_util::future::BoxFuture;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use route::{KubeletRequest, RouteError};
use stream::Chunk;
use tokio::sync::watch;
use tracing::Instrument as _;
use tracing::{debug, info, info_span, warn};
use upgrade::{Opened, UpgradeRoute, through_edgestream, upgrade};

use crate::cloudstream::streams::PodStreams;
use crate::reviews::{Access, Authorizer, Caller};

/// Where the kubelet API listens by default: not the kubelet's 10250 (a
/// cloudcore on a host that runs a kubelet must not collide with it), nor
/// edged's 10350 or edgecore's metrics on 10351 (a cloud and an edge on one
/// host).
pub const DEFAULT_ADDRESS: &str = "0.0.0.0:10352";

/// The most bytes of the runtime's response head to an upgrade.
const MAX_HEAD: usize = 64 * 1024;

/// How long an authorization decision may take.
const DECISION_TIMEOUT: Duration = Duration::from_secs(10);

/// How long the node's runtime may take to answer an upgrade, and to
/// finish an answer that refuses it.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(20);

/// At most this many connections at once.
const MAX_CONNECTIONS: usize = 1024;

/// The body of every answer these servers give.
pub(crate) type Body = BoxBody<Bytes, std::io::Error>;

/// The kubelet API's settings.
pub struct KubeletApiConfig {
    /// host:port to listen on.
    pub address: String,
    /// TLS: this server's certificate, and client certificates required
    /// and verified against the API server's kubelet-client CA.
    pub tls: Arc<rustls::ServerConfig>,
    /// Who may do what.
    pub authorizer: Arc<dyn Authorizer>,
    /// KubeEdge edgecores' edgestream tunnels (served by
    /// [`edgestream::start`]), which their requests go through.
    pub edge_tunnels: edgestream::EdgeTunnels,
}

/// A running kubelet API.
pub struct KubeletApiHandle {
    /// The bound address.
    pub address: SocketAddr,
    stop: watch::Sender<bool>,
}

impl KubeletApiHandle {
    /// Stops taking connections (open streams end with their links).
    pub fn stop(&self) {
        let _ = self.stop.send(true);
    }
}

impl Drop for KubeletApiHandle {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Starts the kubelet API over `streams`.
pub async fn start(
    config: KubeletApiConfig,
    streams: PodStreams,
) -> std::io::Result<KubeletApiHandle> {
    let served = Arc::new(Served {
        streams,
        authorizer: config.authorizer,
        edge_tunnels: config.edge_tunnels,
    });
    let handler: Handler = Arc::new(move |request, caller, permit| {
        let served = served.clone();
        Box::pin(async move { serve(request, caller, &served, permit).await })
    });
    let handle = serve_tls(&config.address, config.tls, handler, "kubelet_api").await?;
    info!(address = %handle.address, "kubelet API for edge nodes listening");
    Ok(handle)
}

struct Served {
    streams: PodStreams,
    authorizer: Arc<dyn Authorizer>,
    edge_tunnels: edgestream::EdgeTunnels,
}

/// What answers a request: the request, the caller its client
/// certificate names, and the connection's permit (an upgraded session
/// keeps it).
pub(crate) type Handler = Arc<
    dyn Fn(Request<Incoming>, Option<Caller>, Permit) -> BoxFuture<'static, Response<Body>>
        + Send
        + Sync,
>;

/// Serves `handler` over TLS (HTTP/1.1, upgrades allowed) at `address`,
/// at most [`MAX_CONNECTIONS`] at once.
pub(crate) async fn serve_tls(
    address: &str,
    tls: Arc<rustls::ServerConfig>,
    handler: Handler,
    span: &'static str,
) -> std::io::Result<KubeletApiHandle> {
    let listener = tokio::net::TcpListener::bind(address)
        .await
        .map_err(apis::api::bind_error(address))?;
    let address = listener.local_addr()?;
    let (stop, stopped) = watch::channel(false);
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    tokio::spawn(accept(listener, acceptor, handler, stopped, span));
    Ok(KubeletApiHandle { address, stop })
}

async fn accept(
    listener: tokio::net::TcpListener,
    acceptor: tokio_rustls::TlsAcceptor,
    handler: Handler,
    mut stop: watch::Receiver<bool>,
    span: &'static str,
) {
    let connections = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = stop.wait_for(|stop| *stop) => return,
        };
        let (tcp, remote) = match accepted {
            Ok(accepted) => accepted,
            Err(err) => {
                warn!(error = %err, server = span, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let permit = tokio::select! {
            permit = connections.clone().acquire_owned() => permit,
            _ = stop.wait_for(|stop| *stop) => return,
        };
        let Ok(permit) = permit else {
            return;
        };
        // Held by the connection and by any session it upgrades to.
        let permit = Arc::new(permit);
        let (acceptor, handler) = (acceptor.clone(), handler.clone());
        tokio::spawn(
            async move {
                let handshake = tokio::time::timeout(Duration::from_secs(10), acceptor.accept(tcp));
                let tls = match handshake.await {
                    Ok(Ok(tls)) => tls,
                    Ok(Err(err)) => return debug!(error = %err, "TLS handshake refused"),
                    Err(_) => return debug!("TLS handshake took too long"),
                };
                // The verifier required a certificate signed by the CA.
                let caller = tls
                    .get_ref()
                    .1
                    .peer_certificates()
                    .and_then(|chain| chain.first())
                    .and_then(|leaf| Caller::from_certificate(leaf.as_ref()));
                let held = permit.clone();
                let service = hyper::service::service_fn(move |request| {
                    let answer = handler(request, caller.clone(), held.clone());
                    async move { Ok::<_, Infallible>(answer.await) }
                });
                let connection = hyper::server::conn::http1::Builder::new()
                    .timer(TokioTimer::new())
                    .header_read_timeout(Duration::from_secs(30))
                    .serve_connection(TokioIo::new(tls), service)
                    .with_upgrades();
                if let Err(err) = connection.await {
                    debug!(error = %err, "connection ended");
                }
                drop(permit);
            }
            .instrument(info_span!("tls_server", server = span, %remote)),
        );
    }
}

/// The cluster's CA as the `kube-root-ca.crt` ConfigMap publishes it in
/// `namespace` (PEM): on most clusters the CA that signed kube-apiserver's
/// kubelet client certificate too.
#[cfg(feature = "kubernetes")]
pub async fn cluster_ca(client: kube::Client, namespace: &str) -> Result<String, String> {
    use k8s_openapi::api::core::v1::ConfigMap;
    let maps: kube::Api<ConfigMap> = kube::Api::namespaced(client, namespace);
    let map = maps
        .get("kube-root-ca.crt")
        .await
        .map_err(|err| err.to_string())?;
    map.data
        .and_then(|data| data.get("ca.crt").cloned())
        .ok_or_else(|| "the ConfigMap has no ca.crt".to_owned())
}

/// A body of `bytes`, whole.
pub(crate) fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into())
        .map_err(|never: Infallible| match never {})
        .boxed()
}

/// A node's resource figures as the kubelet serves them: the Summary as
/// JSON, the resource metrics as Prometheus text.
fn stats_response(what: apis::streams::StatsKind, bytes: Bytes) -> Response<Body> {
    let kind = match what {
        apis::streams::StatsKind::Summary => "application/json",
        apis::streams::StatsKind::ResourceMetrics => "text/plain; version=0.0.4",
    };
    let mut response = Response::new(full(bytes));
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static(kind),
    );
    response
}

/// A Kubernetes `Status` failure with `code` and `message`, as JSON.
pub(crate) fn status(code: StatusCode, message: &str) -> Response<Body> {
    let reason = code
        .canonical_reason()
        .unwrap_or("Failure")
        .replace(' ', "");
    let body = serde_json::json!({
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code.as_u16(),
    });
    let mut response = Response::new(full(body.to_string()));
    *response.status_mut() = code;
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    response
}

fn api_error(err: &ApiError) -> Response<Body> {
    let code = err
        .status()
        .code
        .and_then(|code| u16::try_from(code).ok())
        .and_then(|code| StatusCode::from_u16(code).ok())
        .unwrap_or(StatusCode::SERVICE_UNAVAILABLE);
    status(code, &err.to_string())
}

/// A connection's place among the [`MAX_CONNECTIONS`].
pub(crate) type Permit = Arc<tokio::sync::OwnedSemaphorePermit>;

async fn serve(
    request: Request<Incoming>,
    caller: Option<Caller>,
    served: &Served,
    permit: Permit,
) -> Response<Body> {
    let method = request.method().as_str().to_owned();
    let path = request.uri().path().to_owned();
    let query: Vec<(String, String)> =
        form_urlencoded::parse(request.uri().query().unwrap_or("").as_bytes())
            .into_owned()
            .collect();
    let asked = match route::route(&method, &path, &query) {
        Ok(asked) => asked,
        Err(err @ RouteError::NotFound(_)) => {
            return status(StatusCode::NOT_FOUND, &err.to_string());
        }
        Err(err @ RouteError::Bad(_)) => return status(StatusCode::BAD_REQUEST, &err.to_string()),
        Err(err @ RouteError::Method(_)) => {
            return status(StatusCode::METHOD_NOT_ALLOWED, &err.to_string());
        }
    };
    let Some(caller) = caller else {
        return status(
            StatusCode::UNAUTHORIZED,
            "a client certificate with a common name is required",
        );
    };
    let node = match &asked {
        KubeletRequest::Healthz => return Response::new(full("ok")),
        KubeletRequest::Logs { pod, .. } | KubeletRequest::Upgrade { pod, .. } => {
            match served.streams.node_of_pod(pod) {
                Ok(node) => node,
                Err(err) => return api_error(&err),
            }
        }
        KubeletRequest::Stats(_) => match node_of_host(&request, served) {
            Some(node) => node,
            None => {
                return status(
                    StatusCode::BAD_REQUEST,
                    "node stats through the shared kubelet endpoint need a Host naming the node",
                );
            }
        },
    };
    let attributes = route::attributes(&method, &path);
    let access = Access::node(&attributes, &node);
    match decide(served.authorizer.as_ref(), &caller, &access).await {
        Ok(true) => {}
        Ok(false) => {
            let message = format!(
                "user={}, verb={}, resource=nodes, subresource={}, name={node}: forbidden",
                caller.user, attributes.verb, attributes.subresource
            );
            return status(StatusCode::FORBIDDEN, &message);
        }
        Err(reason) => return status(StatusCode::SERVICE_UNAVAILABLE, &reason),
    }
    debug!(user = %caller.user, %node, %path, "kubelet API request");
    let route = edgestream::stream_path(
        served.edge_tunnels.has(&node),
        served.streams.is_linked_kubeedge(&node),
    );
    match route {
        edgestream::StreamPath::Link => {}
        edgestream::StreamPath::KubeEdgeWithoutEdgeStream => {
            return status(
                StatusCode::SERVICE_UNAVAILABLE,
                &edgestream::without_edgestream(&node),
            );
        }
        edgestream::StreamPath::EdgeStream => {
            return match served.edge_tunnels.get(&node) {
                Some(session) => through_edgestream(request, asked, &session, permit).await,
                // Gone in between.
                None => status(
                    StatusCode::SERVICE_UNAVAILABLE,
                    &format!("node {node}'s edgestream tunnel was lost"),
                ),
            };
        }
    }
    match asked {
        KubeletRequest::Healthz => Response::new(full("ok")),
        KubeletRequest::Logs {
            pod,
            container,
            options,
        } => {
            let asked = StreamRequest::Logs {
                pod,
                container,
                options,
            };
            match served.streams.open_on(&node, &asked).await {
                Ok(stream) => streamed(Opened::Link(stream)),
                Err(err) => api_error(&err),
            }
        }
        KubeletRequest::Stats(what) => match served.streams.stats(&node, what).await {
            Ok(bytes) => stats_response(what, bytes),
            Err(err) => api_error(&err),
        },
        KubeletRequest::Upgrade { pod, target } => {
            let route = UpgradeRoute::Link(pod, target, &served.streams);
            upgrade(request, &node, route, permit).await
        }
    }
}

/// The authorizer's decision on `access` for `caller`, within
/// [`DECISION_TIMEOUT`] (`Err`: none could be had).
async fn decide(
    authorizer: &dyn Authorizer,
    caller: &Caller,
    access: &Access,
) -> Result<bool, String> {
    tokio::time::timeout(DECISION_TIMEOUT, authorizer.allowed(caller, access))
        .await
        .unwrap_or_else(|_| Err("no authorization decision in time".to_owned()))
}

/// The node a request's `Host` names, if one is linked here (or keeps
/// an edgestream tunnel here).
fn node_of_host(request: &Request<Incoming>, served: &Served) -> Option<String> {
    let host = request
        .headers()
        .get(hyper::header::HOST)
        .and_then(|h| h.to_str().ok())
        .or_else(|| request.uri().host())?;
    let name = host.rsplit_once(':').map_or(host, |(name, _)| name);
    (served.streams.is_linked(name) || served.edge_tunnels.has(name)).then(|| name.to_owned())
}

/// A stream's stdout as a response body.
fn streamed(stream: Opened) -> Response<Body> {
    let frames = futures_util::stream::unfold(Some(stream), |stream| async move {
        let mut stream = stream?;
        loop {
            match stream.recv().await {
                Some(Ok(Chunk::Data(channel::STDOUT, bytes))) => {
                    return Some((Ok(Frame::data(bytes)), Some(stream)));
                }
                // An error on the way: the body is cut, not ended as if whole.
                Some(Ok(Chunk::Data(channel::ERROR, bytes))) => {
                    let reason = String::from_utf8_lossy(&bytes).into_owned();
                    return Some((Err(std::io::Error::other(reason)), None));
                }
                Some(Ok(_)) => continue,
                Some(Err(err)) => return Some((Err(std::io::Error::other(err.to_string())), None)),
                None => return None,
            }
        }
    });
    let mut response = Response::new(BodyExt::boxed(StreamBody::new(frames)));
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("text/plain"),
    );
    response
}
