//! The tunnel port: KubeEdge edgecores' edgestream dials
//! `wss://<cloud>:<tunnelPort>/v1/kubeedge/connect` with its node
//! certificate and the headers `SessionHostNameOverride` (its node) and
//! `SessionInternalIP`; each WebSocket message is then one tunnel message
//! ([`super::codec`]).
//!
//! The WebSocket framing is actix-http's codec over the upgraded
//! connection: KubeEdge's edge sends its messages as WebSocket *text*
//! messages holding arbitrary bytes (log chunks cut anywhere, SPDY
//! frames), which a UTF-8-checking WebSocket reader would refuse.

use std::sync::Arc;
use std::time::Duration;

use actix_codec::{Decoder, Encoder};
use actix_http::ws;
use bytes::{Bytes, BytesMut};
use hyper::body::Incoming as Body;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;
use tracing::{Instrument, debug, info, info_span, warn};

use super::codec::{self, MAX_MESSAGE};
use super::session::{EdgeTunnels, OUTGOING_QUEUE, Outgoing, TunnelSession};
use crate::reviews::Caller;

/// The path KubeEdge's edge dials.
pub const CONNECT_PATH: &str = "/v1/kubeedge/connect";

/// The header naming the node (KubeEdge's `SessionHostNameOverride`).
pub const NODE_HEADER: &str = "SessionHostNameOverride";

/// The header naming the node's address (KubeEdge's `SessionInternalIP`).
pub const IP_HEADER: &str = "SessionInternalIP";

/// A tunnel with nothing from the edge for this long is closed: the edge
/// pings every 5 s.
pub const SILENCE_LIMIT: Duration = Duration::from_secs(30);

/// The most bytes one WebSocket frame may announce; refused before it
/// is read.
const MAX_FRAME: usize = MAX_MESSAGE;

/// Whether a tunnel request is refused, and how: `Ok(node)` the node it
/// may speak for. The node is the one its verified client certificate
/// names (`system:node:<node>` or `<node>`); a header naming another is
/// refused.
pub fn admit(
    method: &str,
    path: &str,
    named: Option<&str>,
    caller: Option<&Caller>,
) -> Result<String, (StatusCode, String)> {
    if path.trim_end_matches('/') != CONNECT_PATH {
        return Err((
            StatusCode::NOT_FOUND,
            format!("{path}: the edgestream tunnel is at {CONNECT_PATH}"),
        ));
    }
    if method != "GET" {
        return Err((
            StatusCode::METHOD_NOT_ALLOWED,
            format!("method {method} is not allowed here"),
        ));
    }
    let Some(named) = named.filter(|n| !n.is_empty()) else {
        return Err((
            StatusCode::BAD_REQUEST,
            format!("no {NODE_HEADER} header naming the node"),
        ));
    };
    let common_name = caller.map(|c| c.user.as_str());
    let groups = caller.map(|c| c.groups.as_slice()).unwrap_or_default();
    match hub::admission::check_identity(
        hub::Dialect::KubeEdge,
        false,
        Some(named),
        common_name,
        groups,
    ) {
        Ok(()) => Ok(named.to_owned()),
        Err(refusal) => Err((
            StatusCode::from_u16(refusal.status()).unwrap_or(StatusCode::FORBIDDEN),
            refusal.to_string(),
        )),
    }
}

/// Answers a tunnel request: refused, or upgraded and served as `node`'s
/// tunnel.
pub(crate) fn answer(
    mut request: Request<Body>,
    caller: Option<Caller>,
    tunnels: EdgeTunnels,
    permit: super::super::Permit,
) -> Response<super::super::Body> {
    let header = |name: &str| {
        request
            .headers()
            .get(name)
            .and_then(|value| value.to_str().ok())
            .map(str::to_owned)
    };
    let named = header(NODE_HEADER);
    let node = match admit(
        request.method().as_str(),
        request.uri().path(),
        named.as_deref(),
        caller.as_ref(),
    ) {
        Ok(node) => node,
        Err((code, reason)) => {
            warn!(named = ?named, caller = ?caller.as_ref().map(|c| &c.user), %reason, "edgestream tunnel refused");
            return plain(code, reason);
        }
    };
    let upgrade = header("upgrade").unwrap_or_default();
    let Some(key) =
        header("sec-websocket-key").filter(|_| upgrade.eq_ignore_ascii_case("websocket"))
    else {
        return plain(
            StatusCode::BAD_REQUEST,
            "a WebSocket upgrade is required".to_owned(),
        );
    };
    let address = header(IP_HEADER).unwrap_or_default();
    let accept = ws::hash_key(key.as_bytes());
    let upgraded = hyper::upgrade::on(&mut request);
    let span = info_span!("edgestream_tunnel", %node);
    tokio::spawn(
        async move {
            match upgraded.await {
                Ok(upgraded) => {
                    info!(internal_ip = %address, "a KubeEdge edgecore's edgestream tunnel is up");
                    serve(TokioIo::new(upgraded), &node, &tunnels).await;
                }
                Err(err) => debug!(error = %err, "the tunnel's upgrade failed"),
            }
            drop(permit);
        }
        .instrument(span),
    );
    let mut response = Response::new(super::super::full(Bytes::new()));
    *response.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let headers = response.headers_mut();
    headers.insert(
        hyper::header::UPGRADE,
        hyper::header::HeaderValue::from_static("websocket"),
    );
    headers.insert(
        hyper::header::CONNECTION,
        hyper::header::HeaderValue::from_static("Upgrade"),
    );
    if let Ok(accept) = hyper::header::HeaderValue::from_bytes(&accept) {
        headers.insert(hyper::header::SEC_WEBSOCKET_ACCEPT, accept);
    }
    response
}

fn plain(code: StatusCode, reason: String) -> Response<super::super::Body> {
    let mut response = Response::new(super::super::full(reason));
    *response.status_mut() = code;
    response
}

/// Why a tunnel ended.
#[derive(Debug, thiserror::Error)]
pub enum TunnelEnd {
    /// The connection ended or failed.
    #[error("the connection ended: {0}")]
    Io(String),
    /// The edge closed the WebSocket.
    #[error("the edge closed the tunnel")]
    Closed,
    /// Nothing from the edge for [`SILENCE_LIMIT`].
    #[error("nothing from the edge for {0:?}")]
    Silent(Duration),
    /// A frame that breaks WebSocket's rules (or is too large).
    #[error("WebSocket: {0}")]
    WebSocket(String),
    /// A message that does not read.
    #[error("a garbled message: {0}")]
    Garbled(#[from] codec::CodecError),
    /// The cloud's side closed it (a newer tunnel from the node took its
    /// place, or writing to the edge failed).
    #[error("closed by the cloud (a newer tunnel from the node, or writing to the edge failed)")]
    ClosedHere,
}

/// Serves `io` as `node`'s tunnel until it ends.
async fn serve<Io>(io: Io, node: &str, tunnels: &EdgeTunnels)
where
    Io: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + 'static,
{
    let (mut from_edge, mut to_edge) = tokio::io::split(io);
    let (outgoing, mut queued) = mpsc::channel::<Outgoing>(OUTGOING_QUEUE);
    let id = tunnels.next_id();
    let session = Arc::new(TunnelSession::new(node, id, outgoing.clone()));
    tunnels.register(session.clone());
    let (closed_tx, mut closed_rx) = tokio::sync::watch::channel(false);
    let mut writer = tokio::spawn(
        async move {
            let mut encoder = ws::Codec::new();
            let mut buffer = BytesMut::new();
            while let Some(next) = queued.recv().await {
                let (message, last) = match next {
                    // Binary: KubeEdge's edge reads any message type.
                    Outgoing::Message(bytes) => (ws::Message::Binary(bytes), false),
                    Outgoing::Pong(bytes) => (ws::Message::Pong(bytes), false),
                    Outgoing::Close => (ws::Message::Close(None), true),
                };
                buffer.clear();
                if encoder.encode(message, &mut buffer).is_err()
                    || to_edge.write_all(&buffer).await.is_err()
                {
                    break;
                }
                if last {
                    break;
                }
            }
            let _ = to_edge.shutdown().await;
            let _ = closed_tx.send(true);
        }
        .in_current_span(),
    );
    let mut decoder = ws::Codec::new().max_size(MAX_FRAME);
    let mut buffer = BytesMut::with_capacity(8 * 1024);
    // A message in continuation frames, as it comes.
    let mut partial: Option<BytesMut> = None;
    let end = loop {
        let frame = match decoder.decode(&mut buffer) {
            Ok(Some(frame)) => frame,
            Ok(None) => {
                let read = tokio::select! {
                    read = tokio::time::timeout(SILENCE_LIMIT, from_edge.read_buf(&mut buffer)) => read,
                    _ = closed_rx.wait_for(|closed| *closed) => break TunnelEnd::ClosedHere,
                };
                match read {
                    Ok(Ok(0)) => break TunnelEnd::Io("end of stream".to_owned()),
                    Ok(Ok(_)) => continue,
                    Ok(Err(err)) => break TunnelEnd::Io(err.to_string()),
                    Err(_) => break TunnelEnd::Silent(SILENCE_LIMIT),
                }
            }
            Err(err) => break TunnelEnd::WebSocket(err.to_string()),
        };
        let whole = match frame {
            ws::Frame::Text(bytes) | ws::Frame::Binary(bytes) => bytes,
            ws::Frame::Continuation(item) => match item {
                ws::Item::FirstText(bytes) | ws::Item::FirstBinary(bytes) => {
                    partial = Some(BytesMut::from(&bytes[..]));
                    continue;
                }
                ws::Item::Continue(bytes) => match continued(&mut partial, &bytes, false) {
                    Ok(_) => continue,
                    Err(end) => break end,
                },
                ws::Item::Last(bytes) => match continued(&mut partial, &bytes, true) {
                    Ok(Some(whole)) => whole,
                    Ok(None) => continue,
                    Err(end) => break end,
                },
            },
            ws::Frame::Ping(bytes) => {
                if outgoing.try_send(Outgoing::Pong(bytes)).is_err() {
                    debug!("a ping left unanswered: the queue to the edge is full");
                }
                continue;
            }
            ws::Frame::Pong(_) => continue,
            ws::Frame::Close(_) => break TunnelEnd::Closed,
        };
        match codec::decode(whole) {
            Ok(message) => {
                if message.kind == codec::MessageType::CloseConnect {
                    break TunnelEnd::Closed;
                }
                session.dispatch(message).await;
            }
            Err(err) => break TunnelEnd::Garbled(err),
        }
    };
    let reason = end.to_string();
    match end {
        TunnelEnd::ClosedHere | TunnelEnd::Closed | TunnelEnd::Io(_) => {
            info!(%reason, "edgestream tunnel ended");
        }
        _ => warn!(%reason, "edgestream tunnel closed"),
    }
    tunnels.unregister(node, id);
    session.close(&reason);
    drop(outgoing);
    if tokio::time::timeout(Duration::from_secs(1), &mut writer)
        .await
        .is_err()
    {
        writer.abort();
    }
}

/// Adds a continuation frame's `bytes` to the message in `partial`: the
/// whole message once `last`.
fn continued(
    partial: &mut Option<BytesMut>,
    bytes: &Bytes,
    last: bool,
) -> Result<Option<Bytes>, TunnelEnd> {
    let Some(mut so_far) = partial.take() else {
        return Err(TunnelEnd::WebSocket(
            "a continuation with no start".to_owned(),
        ));
    };
    if so_far.len() + bytes.len() > MAX_MESSAGE {
        return Err(TunnelEnd::Garbled(codec::CodecError::TooLarge {
            size: so_far.len() + bytes.len(),
            max: MAX_MESSAGE,
        }));
    }
    so_far.extend_from_slice(bytes);
    if last {
        return Ok(Some(so_far.freeze()));
    }
    *partial = Some(so_far);
    Ok(None)
}
