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

pub use endpoint::KubeletEndpoint;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use apis::api::ApiError;
use apis::streams::{PodRef, StreamRequest, UpgradeTarget, channel, is_upgrade_header};
use bytes::{Bytes, BytesMut};
use futures_util::future::BoxFuture;
use http_body_util::{BodyExt, Full, StreamBody, combinators::BoxBody};
use hyper::body::{Frame, Incoming};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use stream::{Chunk, StreamError, StreamWriter, TunnelStream};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::watch;
use tracing::{Instrument, debug, info, info_span, warn};

use crate::cloudstream::streams::PodStreams;
use crate::reviews::{Access, Authorizer, Caller};
use route::{KubeletRequest, RouteError};

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
    let listener = tokio::net::TcpListener::bind(address).await?;
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

/// An upgrade carried to the node: its protocol headers go with the
/// request; the runtime's response head comes back first and is answered
/// as this server's, and from then on bytes pass both ways.
async fn upgrade(
    mut request: Request<Incoming>,
    node: &str,
    route: UpgradeRoute<'_>,
    permit: Permit,
) -> Response<Body> {
    if !request.headers().contains_key(hyper::header::UPGRADE) {
        return status(
            StatusCode::BAD_REQUEST,
            "a streaming request must upgrade the connection (SPDY/3.1 or WebSocket)",
        );
    }
    let mut stream = match route {
        UpgradeRoute::Link(pod, target, streams) => {
            let headers: Vec<(String, String)> = request
                .headers()
                .iter()
                .filter(|(name, _)| is_upgrade_header(name.as_str()))
                .filter_map(|(name, value)| {
                    Some((name.as_str().to_owned(), value.to_str().ok()?.to_owned()))
                })
                .collect();
            let asked = StreamRequest::Upgrade {
                pod,
                target,
                method: request.method().as_str().to_owned(),
                headers,
            };
            match streams.open_on(node, &asked).await {
                Ok(stream) => Opened::Link(stream),
                Err(err) => return api_error(&err),
            }
        }
        UpgradeRoute::EdgeStream(session, kind) => {
            // As KubeEdge's cloud does: the request as made, every header.
            let edged = edged_request(&request, Some(request.method().as_str()));
            match session.connect(kind, edged).await {
                Ok(connection) => Opened::Edge(connection),
                Err(err) => return status(StatusCode::SERVICE_UNAVAILABLE, &err.to_string()),
            }
        }
    };
    let head = tokio::time::timeout(ANSWER_TIMEOUT, response_head(&mut stream)).await;
    let (code, reply_headers, rest) = match head {
        Ok(Ok(head)) => head,
        Ok(Err(reason)) => return status(StatusCode::BAD_GATEWAY, &reason),
        Err(_) => {
            return status(
                StatusCode::GATEWAY_TIMEOUT,
                "the node's runtime did not answer in time",
            );
        }
    };
    let length = reply_headers
        .iter()
        .find(|(name, _)| name.eq_ignore_ascii_case("content-length"))
        .and_then(|(_, value)| {
            std::str::from_utf8(value)
                .ok()?
                .trim()
                .parse::<usize>()
                .ok()
        });
    let mut response = Response::new(full(Bytes::new()));
    *response.status_mut() = code;
    for (name, value) in reply_headers {
        let lower = name.to_ascii_lowercase();
        if matches!(
            lower.as_str(),
            "content-length" | "transfer-encoding" | "date"
        ) {
            continue;
        }
        if let (Ok(name), Ok(value)) = (
            hyper::header::HeaderName::from_bytes(name.as_bytes()),
            hyper::header::HeaderValue::from_bytes(&value),
        ) {
            response.headers_mut().append(name, value);
        }
    }
    if code != StatusCode::SWITCHING_PROTOCOLS {
        // The runtime refused: its answer (as long as it says, bounded,
        // within the time) is ours; the runtime's connection then ends
        // with the stream.
        let wanted = length.unwrap_or(MAX_HEAD).min(MAX_HEAD);
        let mut body = BytesMut::from(&rest[..]);
        let read = async {
            while body.len() < wanted {
                match stream.recv().await {
                    Some(Ok(Chunk::Data(channel::STDOUT, bytes))) => body.extend_from_slice(&bytes),
                    Some(Ok(_)) => continue,
                    Some(Err(_)) | None => break,
                }
            }
        };
        let _ = tokio::time::timeout(ANSWER_TIMEOUT, read).await;
        body.truncate(wanted);
        stream.close();
        *response.body_mut() = full(body.freeze());
        return response;
    }
    let upgraded = hyper::upgrade::on(&mut request);
    tokio::spawn(
        async move {
            match upgraded.await {
                Ok(upgraded) => carry(TokioIo::new(upgraded), stream, rest).await,
                Err(err) => debug!(error = %err, "the caller's upgrade failed"),
            }
            drop(permit);
        }
        .instrument(info_span!("upgrade", node = %node)),
    );
    response
}

/// The runtime's response head: status, headers, and what came after it.
async fn response_head(
    stream: &mut Opened,
) -> Result<(StatusCode, Vec<(String, Vec<u8>)>, Bytes), String> {
    let mut head = BytesMut::new();
    loop {
        match stream.recv().await {
            Some(Ok(Chunk::Data(channel::STDOUT, bytes))) => head.extend_from_slice(&bytes),
            Some(Ok(_)) => continue,
            Some(Err(err)) => return Err(format!("the node's runtime: {err}")),
            None => return Err("the node's runtime did not answer".to_owned()),
        }
        let mut headers = [httparse::EMPTY_HEADER; 64];
        let mut response = httparse::Response::new(&mut headers);
        match response.parse(&head) {
            Ok(httparse::Status::Complete(length)) => {
                let code = response
                    .code
                    .and_then(|code| StatusCode::from_u16(code).ok())
                    .ok_or("the runtime's answer has no status")?;
                let headers = response
                    .headers
                    .iter()
                    .map(|h| (h.name.to_owned(), h.value.to_vec()))
                    .collect();
                let rest = head.split_off(length).freeze();
                return Ok((code, headers, rest));
            }
            Ok(httparse::Status::Partial) if head.len() <= MAX_HEAD => continue,
            Ok(httparse::Status::Partial) => {
                return Err("the runtime's answer head is too long".to_owned());
            }
            Err(err) => return Err(format!("the runtime's answer does not read: {err}")),
        }
    }
}

/// Bytes both ways between the caller's upgraded connection and the
/// stream, `first` (what followed the runtime's head) to the caller first.
async fn carry(caller: TokioIo<hyper::upgrade::Upgraded>, mut stream: Opened, first: Bytes) {
    let (mut from_caller, mut to_caller) = tokio::io::split(caller);
    let writer = stream.writer();
    let down = async {
        if !first.is_empty() && to_caller.write_all(&first).await.is_err() {
            return;
        }
        while let Some(Ok(chunk)) = stream.recv().await {
            if let Chunk::Data(channel::STDOUT, bytes) = chunk
                && to_caller.write_all(&bytes).await.is_err()
            {
                return;
            }
        }
        let _ = to_caller.shutdown().await;
    };
    let up = async {
        let mut buffer = vec![0u8; 32 * 1024];
        loop {
            match from_caller.read(&mut buffer).await {
                Ok(0) | Err(_) => {
                    let _ = writer.end(channel::STDIN).await;
                    // The runtime ends the stream once it is done.
                    return std::future::pending::<()>().await;
                }
                Ok(n) => {
                    if writer
                        .send(channel::STDIN, Bytes::copy_from_slice(&buffer[..n]))
                        .await
                        .is_err()
                    {
                        return;
                    }
                }
            }
        }
    };
    tokio::select! {
        () = down => {}
        () = up => {}
    }
}

/// Where an upgrade goes.
enum UpgradeRoute<'a> {
    /// Through the node's link: the pod, what of it, the streams.
    Link(PodRef, UpgradeTarget, &'a PodStreams),
    /// Through a KubeEdge edgecore's tunnel, as `ExecConnect` or
    /// `AttachConnect`.
    EdgeStream(
        Arc<edgestream::TunnelSession>,
        edgestream::codec::MessageType,
    ),
}

/// The request the edge is asked to make for `request`: its path and
/// query as sent, every header (as KubeEdge's cloud passes them).
fn edged_request(
    request: &Request<Incoming>,
    method: Option<&str>,
) -> edgestream::codec::EdgedRequest {
    // A body (logs, stats) is relayed as it comes, under this server's
    // own headers: asked uncompressed, whatever the caller accepts (an
    // explicit Accept-Encoding also turns off Go's transparent gzip on
    // the edge).
    let mut headers: Vec<(&str, &str)> = request
        .headers()
        .iter()
        .filter(|(name, _)| *name != hyper::header::ACCEPT_ENCODING)
        .filter_map(|(name, value)| Some((name.as_str(), value.to_str().ok()?)))
        .collect();
    if method.is_none() {
        headers.push(("accept-encoding", "identity"));
    }
    edgestream::codec::EdgedRequest::new(
        0,
        request.uri().path(),
        request.uri().query().unwrap_or(""),
        headers,
        method,
    )
}

/// A request for a KubeEdge edgecore's pod or node, through its tunnel.
async fn through_edgestream(
    request: Request<Incoming>,
    asked: KubeletRequest,
    session: &Arc<edgestream::TunnelSession>,
    permit: Permit,
) -> Response<Body> {
    use edgestream::codec::MessageType;
    let node = session.node().to_owned();
    match asked {
        KubeletRequest::Healthz => Response::new(full("ok")),
        KubeletRequest::Logs { .. } => {
            let edged = edged_request(&request, None);
            match session.connect(MessageType::LogsConnect, edged).await {
                Ok(connection) => streamed(Opened::Edge(connection)),
                Err(err) => status(StatusCode::SERVICE_UNAVAILABLE, &err.to_string()),
            }
        }
        KubeletRequest::Stats(what) => {
            let headers = edged_request(&request, None)
                .header
                .into_iter()
                .flat_map(|(name, values)| values.into_iter().map(move |v| (name.clone(), v)))
                .collect();
            // The edge says nothing when its kubelet refuses: bounded.
            let fetched = tokio::time::timeout(
                ANSWER_TIMEOUT,
                edgestream::fetch(session, request.uri().path(), headers, MAX_STATS),
            )
            .await
            .unwrap_or_else(|_| {
                Err(format!(
                    "no whole answer from the edge in {}s",
                    ANSWER_TIMEOUT.as_secs()
                ))
            });
            match fetched {
                Ok(bytes) => stats_response(what, bytes),
                Err(reason) => status(
                    StatusCode::SERVICE_UNAVAILABLE,
                    &format!("node {node}: {reason}"),
                ),
            }
        }
        KubeletRequest::Upgrade { target, .. } => {
            let kind = match target {
                UpgradeTarget::Exec { .. } => MessageType::ExecConnect,
                UpgradeTarget::Attach { .. } => MessageType::AttachConnect,
                _ => {
                    return status(
                        StatusCode::NOT_IMPLEMENTED,
                        &format!(
                            "node {node} is a KubeEdge edgecore: its edgestream tunnel carries logs, exec, attach and stats, not port-forward"
                        ),
                    );
                }
            };
            let route = UpgradeRoute::EdgeStream(session.clone(), kind);
            upgrade(request, &node, route, permit).await
        }
    }
}

/// The most bytes of one stats answer through a tunnel.
const MAX_STATS: usize = 16 << 20;

/// A stream to a node: inside its link, or through its edgestream tunnel.
enum Opened {
    Link(TunnelStream),
    Edge(edgestream::EdgeConnection),
}

/// Why a stream to a node failed.
#[derive(Debug, thiserror::Error)]
enum OpenedError {
    #[error(transparent)]
    Link(#[from] StreamError),
    #[error(transparent)]
    Edge(#[from] edgestream::EdgeStreamError),
}

impl Opened {
    /// What comes next: an edge's bytes are stdout.
    async fn recv(&mut self) -> Option<Result<Chunk, OpenedError>> {
        match self {
            Opened::Link(stream) => Some(stream.recv().await?.map_err(OpenedError::from)),
            Opened::Edge(connection) => Some(
                connection
                    .recv()
                    .await?
                    .map(|bytes| Chunk::Data(channel::STDOUT, bytes))
                    .map_err(OpenedError::from),
            ),
        }
    }

    fn writer(&self) -> OpenedWriter {
        match self {
            Opened::Link(stream) => OpenedWriter::Link(stream.writer()),
            Opened::Edge(connection) => OpenedWriter::Edge(connection.writer()),
        }
    }

    fn close(self) {
        match self {
            Opened::Link(stream) => stream.close(),
            Opened::Edge(connection) => connection.close(),
        }
    }
}

/// Where the caller's bytes go.
enum OpenedWriter {
    Link(StreamWriter),
    Edge(edgestream::EdgeWriter),
}

impl OpenedWriter {
    async fn send(&self, channel: u8, bytes: Bytes) -> Result<(), OpenedError> {
        match self {
            OpenedWriter::Link(writer) => Ok(writer.send(channel, bytes).await?),
            OpenedWriter::Edge(writer) => Ok(writer.send(bytes).await?),
        }
    }

    /// The caller sends no more: over a link the channel ends; KubeEdge
    /// has no half close, so the edge's connection is ended (it answers
    /// with its own end).
    async fn end(&self, channel: u8) -> Result<(), OpenedError> {
        match self {
            OpenedWriter::Link(writer) => Ok(writer.end(channel).await?),
            OpenedWriter::Edge(writer) => Ok(writer.end().await?),
        }
    }
}
