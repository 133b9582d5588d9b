//! Streams that upgrade the connection (exec, attach, port-forward): the
//! request carried to the node, the runtime's response head answered as
//! this server's, then bytes both ways; for a KubeEdge edge, through its
//! edgestream tunnel.

use std::sync::Arc;

use apis::streams::{PodRef, StreamRequest, UpgradeTarget, channel, is_upgrade_header};
use bytes::{Bytes, BytesMut};
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use stream::{Chunk, StreamError, StreamWriter, TunnelStream};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tracing::Instrument as _;
use tracing::{debug, info_span};

use super::route::KubeletRequest;
use super::{
    ANSWER_TIMEOUT, Body, MAX_HEAD, Permit, api_error, edgestream, full, stats_response, status,
    streamed,
};
use crate::cloudstream::streams::PodStreams;

/// An upgrade carried to the node: its protocol headers go with the
/// request; the runtime's response head comes back first and is answered
/// as this server's, and from then on bytes pass both ways.
pub(crate) async fn upgrade(
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
pub(crate) async fn response_head(
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
pub(crate) async fn carry(
    caller: TokioIo<hyper::upgrade::Upgraded>,
    mut stream: Opened,
    first: Bytes,
) {
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
pub(crate) enum UpgradeRoute<'a> {
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
pub(crate) fn edged_request(
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
pub(crate) async fn through_edgestream(
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
pub(crate) const MAX_STATS: usize = 16 << 20;

/// A stream to a node: inside its link, or through its edgestream tunnel.
pub(crate) enum Opened {
    Link(TunnelStream),
    Edge(edgestream::EdgeConnection),
}

/// Why a stream to a node failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum OpenedError {
    #[error(transparent)]
    Link(#[from] StreamError),
    #[error(transparent)]
    Edge(#[from] edgestream::EdgeStreamError),
}

impl Opened {
    /// What comes next: an edge's bytes are stdout.
    pub(crate) async fn recv(&mut self) -> Option<Result<Chunk, OpenedError>> {
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

    pub(crate) fn writer(&self) -> OpenedWriter {
        match self {
            Opened::Link(stream) => OpenedWriter::Link(stream.writer()),
            Opened::Edge(connection) => OpenedWriter::Edge(connection.writer()),
        }
    }

    pub(crate) fn close(self) {
        match self {
            Opened::Link(stream) => stream.close(),
            Opened::Edge(connection) => connection.close(),
        }
    }
}

/// Where the caller's bytes go.
pub(crate) enum OpenedWriter {
    Link(StreamWriter),
    Edge(edgestream::EdgeWriter),
}

impl OpenedWriter {
    pub(crate) async fn send(&self, channel: u8, bytes: Bytes) -> Result<(), OpenedError> {
        match self {
            OpenedWriter::Link(writer) => Ok(writer.send(channel, bytes).await?),
            OpenedWriter::Edge(writer) => Ok(writer.send(bytes).await?),
        }
    }

    /// The caller sends no more: over a link the channel ends; KubeEdge
    /// has no half close, so the edge's connection is ended (it answers
    /// with its own end).
    pub(crate) async fn end(&self, channel: u8) -> Result<(), OpenedError> {
        match self {
            OpenedWriter::Link(writer) => Ok(writer.end(channel).await?),
            OpenedWriter::Edge(writer) => Ok(writer.end().await?),
        }
    }
}
