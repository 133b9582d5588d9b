//! A pod's streams through the admin API, at the Kubernetes API's paths,
//! each through the pod's node link ([`crate::cloudstream::streams::PodStreams`]):
//! - `GET .../pods/{name}/log`: the container's log, streamed while
//!   `follow`;
//! - `GET .../pods/{name}/exec?command=..&stdin&stdout&stderr&tty` and
//!   `.../attach`: a WebSocket speaking Kubernetes' channel protocol
//!   (`v5.channel.k8s.io`, or `v4.channel.k8s.io`): one byte of channel
//!   before each binary message (0 stdin, 1 stdout, 2 stderr, 3 the
//!   outcome as a `Status`, 4 terminal resizes), and with v5 `[255, c]`
//!   closing input channel `c`;
//! - `GET .../pods/{name}/portforward?ports=P`: a WebSocket carrying one
//!   connection to port `P` of the pod, as Kubernetes' WebSocket
//!   port-forward does for one port: channel 0 its bytes both ways,
//!   channel 1 an error; the server's first message on each channel is
//!   the port (two bytes, little-endian).
//!
//! With replicas, a pod whose node another replica holds is asked of
//! that replica ([`crate::peers`]): its log relayed as it comes, its
//! WebSocket relayed frame by frame both ways, close included.

mod port_forward;

use ::stream::{Chunk, TunnelStream};
use actix_web::{HttpRequest, HttpResponse, web};
use apis::api::ApiError;
use apis::kinds::{Kind, ObjectKey};
use apis::streams::{Io, LogOptions, PodRef, StreamRequest, channel};
use futures_util::stream;
use port_forward::{CLOSE_CHANNEL, port_forward, session_close};
use serde_json::Value;

use crate::cloudstream::streams::PodStreams;
use crate::desired::Object;
use crate::peers::{PeerSocket, Peers, Route};

/// The WebSocket subprotocols of exec and attach, the preferred first.
pub const CHANNEL_PROTOCOLS: [&str; 2] = ["v5.channel.k8s.io", "v4.channel.k8s.io"];

/// The routes, when the admin API has streams.
pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.route(
        "/api/v1/namespaces/{namespace}/pods/{name}/log",
        web::get().to(log),
    )
    .route(
        "/api/v1/namespaces/{namespace}/pods/{name}/exec",
        web::get().to(exec),
    )
    .route(
        "/api/v1/namespaces/{namespace}/pods/{name}/attach",
        web::get().to(attach),
    )
    .route(
        "/api/v1/namespaces/{namespace}/pods/{name}/portforward",
        web::get().to(port_forward),
    );
}

/// The WebSocket subprotocols of a port-forward connection.
pub const PORT_FORWARD_PROTOCOLS: [&str; 2] = ["v4.channel.k8s.io", "portforward.k8s.io"];

/// The query's pairs, decoded.
pub(crate) fn query_pairs(request: &HttpRequest) -> Vec<(String, String)> {
    form_urlencoded::parse(request.query_string().as_bytes())
        .into_owned()
        .collect()
}

/// The container a request means: the one named, or the pod's only one.
pub(crate) fn container_of(pod: &Object, named: Option<&str>) -> Result<String, ApiError> {
    let names: Vec<&str> = pod
        .json()
        .pointer("/spec/containers")
        .and_then(Value::as_array)
        .map(|containers| {
            containers
                .iter()
                .filter_map(|c| c["name"].as_str())
                .collect()
        })
        .unwrap_or_default();
    let pod_name = &pod.key().name;
    match named.filter(|name| !name.is_empty()) {
        Some(name) if names.contains(&name) => Ok(name.to_owned()),
        Some(name) => Err(ApiError::BadRequest(format!(
            "container {name} is not valid for pod {pod_name}"
        ))),
        None => match names.as_slice() {
            [only] => Ok((*only).to_owned()),
            _ => Err(ApiError::BadRequest(format!(
                "a container name must be specified for pod {pod_name}, choose one of: {names:?}"
            ))),
        },
    }
}

/// The pod at `namespace`/`name`, as stored.
pub(crate) fn pod_of(
    streams: &PodStreams,
    namespace: &str,
    name: &str,
) -> Result<Object, ApiError> {
    let key = ObjectKey::new(Kind::Pod, namespace, name);
    streams
        .store()
        .get(&key)
        .map_err(|err| ApiError::Unavailable(err.to_string()))?
        .ok_or(ApiError::NotFound(key))
}

/// Bytes a stream carries on `wanted`, as a response body; a stream that
/// ends badly ends the body with an error (the client sees it cut).
pub(crate) fn body_of(
    stream: TunnelStream,
    wanted: u8,
) -> impl futures_util::Stream<Item = Result<bytes::Bytes, actix_web::Error>> {
    stream::unfold(Some(stream), move |stream| async move {
        let mut stream = stream?;
        loop {
            match stream.recv().await {
                Some(Ok(Chunk::Data(channel, bytes))) if channel == wanted => {
                    return Some((Ok(bytes), Some(stream)));
                }
                Some(Ok(_)) => continue,
                Some(Err(err)) => {
                    let error = actix_web::error::ErrorBadGateway(err.to_string());
                    return Some((Err(error), None));
                }
                None => return None,
            }
        }
    })
}

pub(crate) use crate::peers::forwarded;

/// The request's path and query, as a peer is asked it.
pub(crate) fn path_and_query(request: &HttpRequest) -> String {
    request
        .uri()
        .path_and_query()
        .map_or_else(|| request.path().to_owned(), |p| p.as_str().to_owned())
}

/// The peers, when `route` says to forward (it only does with peers).
fn peers_of(streams: &PodStreams) -> Result<&Peers, ApiError> {
    streams
        .peers()
        .ok_or_else(|| ApiError::Unavailable("no peers to forward to".to_owned()))
}

async fn log(
    request: HttpRequest,
    streams: web::Data<PodStreams>,
    path: web::Path<(String, String)>,
) -> Result<HttpResponse, actix_web::Error> {
    let http = request.clone();
    let (namespace, name) = path.into_inner();
    let pairs = query_pairs(&request);
    let options = LogOptions::from_query(pairs.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .map_err(|err| ApiError::BadRequest(err.to_string()))?;
    let pod = pod_of(&streams, &namespace, &name)?;
    let named = pairs
        .iter()
        .find(|(k, _)| k == "container")
        .map(|(_, v)| v.as_str());
    let container = container_of(&pod, named)?;
    let request = StreamRequest::Logs {
        pod: PodRef { namespace, name },
        container,
        options,
    };
    let to_node = request;
    let node = streams.node_of(&to_node)?;
    match streams.route(&node, forwarded(&http)).await {
        Route::Here => {}
        Route::Refuse(err) => return Err(err.into()),
        Route::Forward { replica, url } => {
            let peers = peers_of(&streams)?;
            let body = peers
                .stream(&node, &replica, &url, &path_and_query(&http))
                .await?;
            let body = futures_util::StreamExt::map(body, |chunk| {
                chunk.map_err(|err| actix_web::error::ErrorBadGateway(err.to_string()))
            });
            return Ok(HttpResponse::Ok()
                .content_type("text/plain")
                .streaming(body));
        }
    }
    let stream = streams.open_on(&node, &to_node).await?;
    Ok(HttpResponse::Ok()
        .content_type("text/plain")
        .streaming(body_of(stream, channel::STDOUT)))
}

/// Whether the query's flag `name` is on.
fn flag(pairs: &[(String, String)], name: &str) -> bool {
    pairs
        .iter()
        .any(|(k, v)| k == name && matches!(v.as_str(), "" | "1" | "true"))
}

fn io_of(pairs: &[(String, String)]) -> Result<Io, ApiError> {
    let io = Io {
        stdin: flag(pairs, "stdin"),
        stdout: flag(pairs, "stdout"),
        stderr: flag(pairs, "stderr"),
        tty: flag(pairs, "tty"),
    };
    if !(io.stdin || io.stdout || io.stderr) {
        return Err(ApiError::BadRequest(
            "you must specify at least 1 of stdin, stdout, stderr".to_owned(),
        ));
    }
    Ok(io)
}

async fn exec(
    request: HttpRequest,
    body: web::Payload,
    streams: web::Data<PodStreams>,
    path: web::Path<(String, String)>,
) -> Result<HttpResponse, actix_web::Error> {
    let (namespace, name) = path.into_inner();
    let pairs = query_pairs(&request);
    let command: Vec<String> = pairs
        .iter()
        .filter(|(k, _)| k == "command")
        .map(|(_, v)| v.clone())
        .collect();
    if command.is_empty() {
        return Err(
            ApiError::BadRequest("you must specify at least one command".to_owned()).into(),
        );
    }
    let io = io_of(&pairs)?;
    let pod = pod_of(&streams, &namespace, &name)?;
    let named = pairs
        .iter()
        .find(|(k, _)| k == "container")
        .map(|(_, v)| v.as_str());
    let container = container_of(&pod, named)?;
    let request_to_node = StreamRequest::Exec {
        pod: PodRef { namespace, name },
        container,
        command,
        io,
    };
    upgrade(&request, body, &streams, &request_to_node).await
}

async fn attach(
    request: HttpRequest,
    body: web::Payload,
    streams: web::Data<PodStreams>,
    path: web::Path<(String, String)>,
) -> Result<HttpResponse, actix_web::Error> {
    let (namespace, name) = path.into_inner();
    let pairs = query_pairs(&request);
    let io = io_of(&pairs)?;
    let pod = pod_of(&streams, &namespace, &name)?;
    let named = pairs
        .iter()
        .find(|(k, _)| k == "container")
        .map(|(_, v)| v.as_str());
    let container = container_of(&pod, named)?;
    let request_to_node = StreamRequest::Attach {
        pod: PodRef { namespace, name },
        container,
        io,
    };
    upgrade(&request, body, &streams, &request_to_node).await
}

/// Opens the node's stream (a refusal is the HTTP answer), then takes the
/// WebSocket and carries the channels both ways until either side ends.
async fn upgrade(
    request: &HttpRequest,
    body: web::Payload,
    streams: &PodStreams,
    to_node: &StreamRequest,
) -> Result<HttpResponse, actix_web::Error> {
    let node = streams.node_of(to_node)?;
    match streams.route(&node, forwarded(request)).await {
        Route::Here => {}
        Route::Refuse(err) => return Err(err.into()),
        Route::Forward { replica, url } => {
            let peers = peers_of(streams)?;
            return relay_upgrade(
                request,
                body,
                peers,
                [&node, &replica, &url],
                &CHANNEL_PROTOCOLS,
            )
            .await;
        }
    }
    let stream = streams.open_on(&node, to_node).await?;
    let (response, session, messages) =
        actix_ws::handle_with_protocols(request, body, &CHANNEL_PROTOCOLS)?;
    actix_web::rt::spawn(carry(stream, session, messages));
    Ok(response)
}

/// Opens the peer's WebSocket for the same request (its refusal is the
/// answer, as it gave it), then takes the client's with the protocol the
/// peer chose and relays every frame both ways until either side closes.
async fn relay_upgrade(
    request: &HttpRequest,
    body: web::Payload,
    peers: &Peers,
    [node, replica, url]: [&str; 3],
    protocols: &[&str],
) -> Result<HttpResponse, actix_web::Error> {
    let offered = request
        .headers()
        .get(actix_web::http::header::SEC_WEBSOCKET_PROTOCOL)
        .and_then(|value| value.to_str().ok());
    let (socket, chosen) = peers
        .websocket(node, replica, url, &path_and_query(request), offered)
        .await?;
    let chosen: Vec<&str> = match chosen.as_deref() {
        Some(chosen) => protocols.iter().copied().filter(|p| *p == chosen).collect(),
        None => protocols.to_vec(),
    };
    let (response, session, messages) = actix_ws::handle_with_protocols(request, body, &chosen)?;
    // Port-forward reports on channel 1, exec and attach on channel 3.
    let lost = match protocols == PORT_FORWARD_PROTOCOLS.as_slice() {
        true => port_forward_error,
        false => failure_status,
    };
    let lost = lost(&format!(
        "the connection to replica {replica}, which holds node {node}, was lost"
    ));
    actix_web::rt::spawn(relay(socket, session, messages, lost));
    Ok(response)
}

/// A port-forward's error frame (channel 1).
fn port_forward_error(message: &str) -> Vec<u8> {
    let mut frame = vec![1];
    frame.extend_from_slice(message.as_bytes());
    frame
}

/// An exec's or attach's outcome frame (channel 3): a Failure `Status`.
fn failure_status(message: &str) -> Vec<u8> {
    let status = serde_json::json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {},
        "status": "Failure", "message": message,
        "reason": "InternalError",
    });
    let mut frame = vec![channel::ERROR];
    frame.extend_from_slice(status.to_string().as_bytes());
    frame
}

/// Carries a client's WebSocket to a peer's and back, frame by frame; a
/// close from either side is passed on with its code and reason. A peer
/// connection that ends without one sends the client `lost` first (a
/// failure, not a silent end: as a node's link lost does).
async fn relay(
    socket: PeerSocket,
    session: actix_ws::Session,
    mut messages: actix_ws::MessageStream,
    lost: Vec<u8>,
) {
    use futures_util::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::Message as Frame;
    let (mut to_peer, mut from_peer) = socket.split();
    let mut replies = session.clone();
    // Input the peer no longer takes ends nothing: the exchange ends when
    // the peer's side does (its outcome still to come) or the client's.
    let from_client = async {
        let mut open = true;
        while let Some(Ok(message)) = messages.recv().await {
            match message {
                actix_ws::Message::Binary(bytes) if open => {
                    open = to_peer.send(Frame::Binary(bytes)).await.is_ok();
                }
                actix_ws::Message::Text(text) if open => {
                    open = to_peer.send(Frame::text(text.to_string())).await.is_ok();
                }
                actix_ws::Message::Ping(bytes) if replies.pong(&bytes).await.is_err() => break,
                actix_ws::Message::Close(reason) => {
                    let _ = to_peer.send(Frame::Close(reason.map(close_to_peer))).await;
                    break;
                }
                _ => {}
            }
        }
    };
    let mut session = session;
    let to_client = async {
        while let Some(Ok(message)) = from_peer.next().await {
            let sent = match message {
                Frame::Binary(bytes) => session.binary(bytes).await,
                Frame::Text(text) => session.text(text.to_string()).await,
                Frame::Close(frame) => return frame.map(close_to_client),
                _ => continue,
            };
            if sent.is_err() {
                return None;
            }
        }
        let _ = session.binary(lost).await;
        None
    };
    let close = tokio::select! {
        () = from_client => None,
        close = to_client => close,
    };
    let _ = replies
        .close(close.or(Some(actix_ws::CloseCode::Normal.into())))
        .await;
}

fn close_to_peer(
    reason: actix_ws::CloseReason,
) -> tokio_tungstenite::tungstenite::protocol::CloseFrame {
    tokio_tungstenite::tungstenite::protocol::CloseFrame {
        code: u16::from(reason.code).into(),
        reason: reason.description.unwrap_or_default().into(),
    }
}

fn close_to_client(
    frame: tokio_tungstenite::tungstenite::protocol::CloseFrame,
) -> actix_ws::CloseReason {
    actix_ws::CloseReason {
        code: u16::from(frame.code).into(),
        description: (!frame.reason.is_empty()).then(|| frame.reason.to_string()),
    }
}

async fn carry(
    mut stream: TunnelStream,
    session: actix_ws::Session,
    mut messages: actix_ws::MessageStream,
) {
    let writer = stream.writer();
    let mut replies = session.clone();
    // Input the node no longer takes (the command ended while the client
    // still wrote, or closed its stdin) ends nothing: the exchange ends
    // when the node's stream does, its outcome sent, or the client's.
    let from_client = async {
        let mut open = true;
        while let Some(Ok(message)) = messages.recv().await {
            let going_on = match message {
                actix_ws::Message::Binary(frame) if open && !frame.is_empty() => {
                    open = match frame[0] {
                        channel::STDIN | channel::RESIZE => {
                            writer.send(frame[0], frame.slice(1..)).await.is_ok()
                        }
                        // v5: the client closes an input channel.
                        CLOSE_CHANNEL if frame.len() > 1 => writer.end(frame[1]).await.is_ok(),
                        _ => true,
                    };
                    true
                }
                actix_ws::Message::Ping(bytes) => replies.pong(&bytes).await.is_ok(),
                actix_ws::Message::Close(_) => false,
                _ => true,
            };
            if !going_on {
                break;
            }
        }
    };
    let mut session = session;
    let to_client = async {
        while let Some(chunk) = stream.recv().await {
            match chunk {
                Ok(Chunk::Data(channel, bytes)) => {
                    let mut frame = Vec::with_capacity(bytes.len() + 1);
                    frame.push(channel);
                    frame.extend_from_slice(&bytes);
                    if session.binary(frame).await.is_err() {
                        return;
                    }
                }
                Ok(Chunk::End(_)) => {}
                Err(err) => {
                    // The outcome the client reads: a failure, not a hang.
                    let _ = session.binary(failure_status(&err.to_string())).await;
                    return;
                }
            }
        }
    };
    tokio::select! {
        () = from_client => {}
        () = to_client => {}
    }
    drop(stream);
    let _ = session_close(replies).await;
}
