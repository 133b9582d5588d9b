//! WebSocket transport: wss (TLS 1.3, optional mutual TLS) or, when asked
//! for explicitly, plain ws, on one ordered stream; the WebSocket layer
//! enforces the frame limit from each frame's header, before reading its
//! body.
//!
//! With the MessagePack codec a binary WebSocket message carries one frame
//! as it is, or, when the writer has several small frames at once, a batch:
//! the byte [`BATCH_MARK`] (never the first byte of a MessagePack message),
//! then each frame as a 4-byte big-endian length and its bytes, at most
//! [`BATCH_BYTES`] (or the frame limit) in all. Batching spares every small
//! message a WebSocket frame, its mask and a TLS record of its own. With
//! KubeEdge's JSON codec each message is one WebSocket message, as its
//! peers expect, in a text message (gorilla's `WriteJSON` sends text);
//! either kind is taken from them.

mod handshake;

use std::sync::Arc;
use std::task::{Context, Poll, ready};

use bytes::BufMut as _;
use bytes::{Bytes, BytesMut};
use futures_util::stream::{SplitSink, SplitStream};
use futures_util::{SinkExt as _, StreamExt as _};
use handshake::{upgrade_client, upgrade_server};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::{TlsAcceptor, TlsConnector};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Error as WsError;
use tokio_tungstenite::tungstenite::Message as WsMessage;
use tokio_tungstenite::tungstenite::Utf8Bytes;
use tokio_tungstenite::tungstenite::error::CapacityError;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tracing::warn;

use crate::error::{FrameError, TransportError};
use crate::frame::Codec;
use crate::link::{FrameSink, FrameSource, Lane, Limits, Link, PeerIdentity, spawn_link};
use crate::listener::Listener;
use crate::{
    BoxFuture, DialOptions, ListenOptions, Transport, TransportKind, resolve, tcp_connect, tls,
};

/// The WebSocket transport. `path` is the URL path of the upgrade request.
#[derive(Debug, Clone)]
pub struct WebSocket {
    /// URL path the server accepts upgrades on, e.g. `/edgehive`.
    pub path: String,
}

impl Default for WebSocket {
    fn default() -> Self {
        WebSocket {
            path: "/edgehive".to_owned(),
        }
    }
}

fn config(limits: &Limits, codec: Codec) -> WebSocketConfig {
    // A peer batches up to its own limit or 64 KiB: a message that size is
    // taken even under a smaller limit here (each frame in it, and a lone
    // frame, is still held to this side's limit).
    let max_message = match codec {
        Codec::MessagePack => limits.max_frame.max(BATCH_BYTES + 5),
        Codec::KubeEdgeJson => limits.max_frame,
    };
    // A small read buffer: tungstenite's 128 KiB default, allocated up
    // front, would cost an idle node session more than everything else
    // together. The write threshold allocates nothing until written to; at
    // a batch's size it hands TLS whole batches (fewer, larger records and
    // writes; 64 KiB frames went 0.32-0.40 of raw TCP at 16 KiB, 0.44-0.51
    // at 64 KiB).
    WebSocketConfig::default()
        .read_buffer_size(8 * 1024)
        .write_buffer_size(64 * 1024)
        .max_message_size(Some(max_message))
        .max_frame_size(Some(max_message))
}

fn ws_error(err: WsError) -> TransportError {
    match err {
        WsError::Capacity(CapacityError::MessageTooLong { size, max_size }) => {
            FrameError::TooLarge {
                len: size,
                max: max_size,
            }
            .into()
        }
        other => TransportError::WebSocket(other.to_string()),
    }
}

/// First byte of a WebSocket message that carries a batch of frames: 0xc1
/// is the one byte MessagePack never uses.
pub const BATCH_MARK: u8 = 0xc1;

/// Largest batch a writer puts in one WebSocket message (less when the
/// frame limit is lower).
pub const BATCH_BYTES: usize = 64 * 1024;

/// The upgrade header by which both ends say they read batches; a side
/// batches only when the other said so, so an older peer is never sent
/// one.
pub const BATCH_HEADER: &str = "x-edgehive-batch";

/// Frames at least this large go in a message of their own, uncopied.
const ALONE: usize = 8 * 1024;

/// The frame of a batch message at `at` (where its length prefix starts),
/// as a slice of the message (no copy), checked against the limit, and
/// where the next one starts. A frame is never empty (no message is), so a
/// batch cannot make the reader do more work than its bytes.
fn next_in_batch(
    message: &Bytes,
    at: usize,
    max_frame: usize,
) -> Result<(Bytes, usize), FrameError> {
    let header = message
        .get(at..at.saturating_add(4))
        .ok_or_else(|| FrameError::Protocol("truncated batch".into()))?;
    let len = u32::from_be_bytes([header[0], header[1], header[2], header[3]]) as usize;
    let start = at + 4;
    if len > max_frame {
        return Err(FrameError::TooLarge {
            len,
            max: max_frame,
        });
    }
    if len == 0 {
        return Err(FrameError::Protocol("empty frame in a batch".into()));
    }
    if len > message.len() - start {
        return Err(FrameError::Protocol("truncated batch".into()));
    }
    Ok((message.slice(start..start + len), start + len))
}

struct WsSource<S> {
    stream: SplitStream<WebSocketStream<S>>,
    /// Whether batches may arrive (the MessagePack codec).
    batched: bool,
    max_frame: usize,
    /// The batch being read, and where its next frame starts.
    batch: Option<(Bytes, usize)>,
    /// Pongs received (answers to this side's pings).
    pongs: u64,
}

impl<S> WsSource<S> {
    /// The next frame of a batch from `at`; the rest is kept for later.
    fn take_from_batch(
        &mut self,
        message: Bytes,
        at: usize,
    ) -> Result<Option<Bytes>, TransportError> {
        let (frame, next) = next_in_batch(&message, at, self.max_frame)?;
        if next < message.len() {
            self.batch = Some((message, next));
        }
        Ok(Some(frame))
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin + Send + 'static> FrameSource for WsSource<S> {
    fn pongs(&self) -> u64 {
        self.pongs
    }

    fn poll_frame(&mut self, cx: &mut Context<'_>) -> Poll<Result<Option<Bytes>, TransportError>> {
        if let Some((message, at)) = self.batch.take() {
            return Poll::Ready(self.take_from_batch(message, at));
        }
        loop {
            return Poll::Ready(match ready!(self.stream.poll_next_unpin(cx)) {
                Some(Ok(WsMessage::Binary(message)))
                    if self.batched && message.first() == Some(&BATCH_MARK) =>
                {
                    self.take_from_batch(message, 1)
                }
                // The WebSocket limit allows a batch; a lone frame has its own.
                Some(Ok(WsMessage::Binary(frame))) if frame.len() > self.max_frame => {
                    Err(FrameError::TooLarge {
                        len: frame.len(),
                        max: self.max_frame,
                    }
                    .into())
                }
                Some(Ok(WsMessage::Binary(frame))) => Ok(Some(frame)),
                // KubeEdge's peers send their JSON as text.
                Some(Ok(WsMessage::Text(text))) if !self.batched => Ok(Some(Bytes::from(text))),
                Some(Ok(WsMessage::Close(_))) | None => Ok(None),
                Some(Ok(WsMessage::Pong(_))) => {
                    self.pongs += 1;
                    continue;
                }
                // tungstenite answers pings itself.
                Some(Ok(WsMessage::Ping(_) | WsMessage::Frame(_))) => continue,
                Some(Ok(WsMessage::Text(_))) => {
                    Err(FrameError::Protocol("text frame on a binary link".into()).into())
                }
                Some(Err(WsError::ConnectionClosed | WsError::AlreadyClosed)) => Ok(None),
                Some(Err(err)) => Err(ws_error(err)),
            });
        }
    }
}

struct WsSink<S> {
    sink: SplitSink<WebSocketStream<S>, WsMessage>,
    /// Largest batch; zero sends every frame alone (KubeEdge's codec).
    batch_bytes: usize,
    /// Frames go as text messages (KubeEdge's JSON), binary otherwise.
    text: bool,
    /// A small frame waiting: sent alone if no other joins it.
    first: Option<Bytes>,
    /// The batch being built, once a second small frame came.
    batch: BytesMut,
    /// Bytes (with length prefixes) of the small frames the writer still
    /// has for this sink in its current round: a batch is allocated at its
    /// final size at once, not grown by copying.
    coming: usize,
}

impl<S: AsyncRead + AsyncWrite + Unpin + Send + 'static> WsSink<S> {
    /// Sends what is waiting: a lone frame as it is, or the batch.
    async fn send_waiting(&mut self) -> Result<(), TransportError> {
        match self.first.take() {
            Some(frame) => self.send_alone(frame).await,
            None if !self.batch.is_empty() => {
                let batch = self.batch.split().freeze();
                self.sink
                    .feed(WsMessage::Binary(batch))
                    .await
                    .map_err(ws_error)
            }
            None => Ok(()),
        }
    }

    /// Sends one frame in a message of its own. A frame that starts like a
    /// batch (not MessagePack, so it will fail to decode) goes as a batch of
    /// one, so the peer decodes exactly what was sent.
    async fn send_alone(&mut self, frame: Bytes) -> Result<(), TransportError> {
        let message = if self.batch_bytes > 0 && frame.first() == Some(&BATCH_MARK) {
            let mut wrapped = BytesMut::with_capacity(5 + frame.len());
            wrapped.put_u8(BATCH_MARK);
            wrapped.put_u32(frame.len() as u32);
            wrapped.extend_from_slice(&frame);
            WsMessage::Binary(wrapped.freeze())
        } else if self.text {
            // JSON is UTF-8; anything else (a raw frame) goes as binary.
            match Utf8Bytes::try_from(frame.clone()) {
                Ok(text) => WsMessage::Text(text),
                Err(_) => WsMessage::Binary(frame),
            }
        } else {
            WsMessage::Binary(frame)
        };
        self.sink.feed(message).await.map_err(ws_error)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin + Send + 'static> FrameSink for WsSink<S> {
    const PINGS: bool = true;

    fn expect(&mut self, frames: &[(Bytes, Lane)]) {
        self.coming = frames
            .iter()
            .map(|(frame, _)| frame.len())
            .filter(|&len| len < ALONE)
            .map(|len| 4 + len)
            .sum();
    }

    async fn ping(&mut self) -> Result<(), TransportError> {
        self.sink
            .feed(WsMessage::Ping(Bytes::new()))
            .await
            .map_err(ws_error)
    }

    async fn write_frame(&mut self, frame: Bytes, _lane: Lane) -> Result<(), TransportError> {
        let len = frame.len();
        if len < ALONE {
            self.coming = self.coming.saturating_sub(4 + len);
        }
        if len >= ALONE || 5 + 2 * (4 + len) > self.batch_bytes {
            self.send_waiting().await?;
            return self.send_alone(frame).await;
        }
        let waiting = match &self.first {
            Some(first) => 1 + 4 + first.len(),
            None => self.batch.len(),
        };
        if waiting > 0 && waiting + 4 + len > self.batch_bytes {
            self.send_waiting().await?;
        }
        if self.batch.is_empty() && self.first.is_none() {
            self.first = Some(frame);
            return Ok(());
        }
        if let Some(first) = self.first.take() {
            self.batch.reserve(
                self.batch_bytes
                    .min(1 + 8 + first.len() + len + self.coming),
            );
            self.batch.put_u8(BATCH_MARK);
            self.batch.put_u32(first.len() as u32);
            self.batch.extend_from_slice(&first);
        }
        self.batch.put_u32(len as u32);
        self.batch.extend_from_slice(&frame);
        Ok(())
    }

    async fn flush(&mut self) -> Result<(), TransportError> {
        self.send_waiting().await?;
        self.sink.flush().await.map_err(ws_error)
    }

    async fn close(&mut self) {
        let _ = self.sink.close().await;
    }
}

/// The link over an upgraded connection; `peer_batches`: the peer said it
/// reads batches.
fn into_link<S>(
    ws: WebSocketStream<S>,
    peer: PeerIdentity,
    limits: &Limits,
    codec: Codec,
    peer_batches: bool,
) -> Link
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (sink, stream) = ws.split();
    let batched = codec == Codec::MessagePack;
    let source = WsSource {
        stream,
        batched,
        max_frame: limits.max_frame,
        batch: None,
        pongs: 0,
    };
    let sink = WsSink {
        sink,
        batch_bytes: if batched && peer_batches {
            BATCH_BYTES.min(limits.max_frame)
        } else {
            0
        },
        text: codec == Codec::KubeEdgeJson,
        first: None,
        batch: BytesMut::new(),
        coming: 0,
    };
    spawn_link(peer, source, sink, limits, codec)
}

impl Transport for WebSocket {
    fn kind(&self) -> TransportKind {
        TransportKind::WebSocket
    }

    fn listen<'a>(
        &'a self,
        options: &'a ListenOptions,
    ) -> BoxFuture<'a, Result<Listener, TransportError>> {
        Box::pin(async move {
            let acceptor = match (&options.tls, options.allow_plaintext) {
                (Some(config), _) => Some(TlsAcceptor::from(config.clone())),
                (None, true) => None,
                (None, false) => {
                    return Err(TransportError::Config(
                        "WebSocket without TLS must be allowed explicitly (allow_plaintext)".into(),
                    ));
                }
            };
            let socket = TcpListener::bind(&options.address)
                .await
                .map_err(|e| TransportError::io(format!("bind {}", options.address), e))?;
            let local = socket
                .local_addr()
                .map_err(|e| TransportError::io("local address", e))?
                .to_string();
            let path: Arc<str> = self.path.as_str().into();
            let codec = options.codec;
            let admission = options.admission.clone();
            Ok(Listener::new(local, &options.limits, move |queue| {
                tokio::spawn(async move {
                    loop {
                        let (tcp, remote) = match socket.accept().await {
                            Ok(accepted) => accepted,
                            Err(err) => {
                                warn!(error = %err, "ws accept failed");
                                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                                continue;
                            }
                        };
                        let remote = remote.to_string();
                        let (acceptor, path, limits, admission) = (
                            acceptor.clone(),
                            path.clone(),
                            *queue.limits(),
                            admission.clone(),
                        );
                        crate::tune_tcp(&tcp, &limits);
                        queue.handshake(remote.clone(), async move {
                            match acceptor {
                                Some(acceptor) => {
                                    let stream = acceptor
                                        .accept(tcp)
                                        .await
                                        .map_err(|e| TransportError::Tls(e.to_string()))?;
                                    let peer = tls::identity(
                                        remote,
                                        stream.get_ref().1.peer_certificates(),
                                    );
                                    upgrade_server(stream, peer, path, limits, codec, admission)
                                        .await
                                }
                                None => {
                                    let peer = PeerIdentity {
                                        remote,
                                        ..PeerIdentity::default()
                                    };
                                    upgrade_server(tcp, peer, path, limits, codec, admission).await
                                }
                            }
                        });
                    }
                })
            }))
        })
    }

    fn dial<'a>(&'a self, options: &'a DialOptions) -> BoxFuture<'a, Result<Link, TransportError>> {
        Box::pin(async move {
            let limits = options.limits;
            let path = options.path.as_deref().unwrap_or(&self.path);
            let addr = resolve(&options.address).await?;
            let tcp: TcpStream = tcp_connect(addr, &limits).await?;
            let remote = addr.to_string();
            let handshake = async {
                match (&options.tls, options.allow_plaintext) {
                    (Some(config), _) => {
                        let name = tls::server_name(&options.server_name)?;
                        let stream = TlsConnector::from(config.clone())
                            .connect(name, tcp)
                            .await
                            .map_err(|e| TransportError::Tls(e.to_string()))?;
                        let peer = tls::identity(remote, stream.get_ref().1.peer_certificates());
                        let url = format!("wss://{}{}", options.server_name, path);
                        upgrade_client(stream, url, &options.headers, peer, limits, options.codec)
                            .await
                    }
                    (None, true) => {
                        let peer = PeerIdentity {
                            remote,
                            ..PeerIdentity::default()
                        };
                        let url = format!("ws://{}{}", options.address, path);
                        upgrade_client(tcp, url, &options.headers, peer, limits, options.codec)
                            .await
                    }
                    (None, false) => Err(TransportError::Config(
                        "WebSocket without TLS must be allowed explicitly (allow_plaintext)".into(),
                    )),
                }
            };
            tokio::time::timeout(limits.handshake_timeout, handshake)
                .await
                .map_err(|_| TransportError::Timeout {
                    what: "WebSocket handshake",
                    after: limits.handshake_timeout,
                })?
        })
    }
}

#[cfg(test)]
mod tests {
    use tokio_tungstenite::tungstenite::http;

    use super::handshake::{MAX_REASON, refusal, refused};
    use super::*;

    fn batch(frames: &[&[u8]]) -> Bytes {
        let mut out = BytesMut::new();
        out.put_u8(BATCH_MARK);
        for frame in frames {
            out.put_u32(frame.len() as u32);
            out.extend_from_slice(frame);
        }
        out.freeze()
    }

    fn unbatch(message: &Bytes, max: usize) -> Result<Vec<Bytes>, FrameError> {
        let mut frames = Vec::new();
        let mut at = 1;
        loop {
            let (frame, next) = next_in_batch(message, at, max)?;
            frames.push(frame);
            if next == message.len() {
                return Ok(frames);
            }
            at = next;
        }
    }

    #[test]
    fn a_refusal_is_an_error_status_with_its_reason_as_the_body() {
        let answer = refusal(403, "certificate of node \"a\" presented as node \"b\"");
        assert_eq!(answer.status(), http::StatusCode::FORBIDDEN);
        let body = answer.body().clone().expect("a body");
        assert_eq!(
            answer.headers()[http::header::CONTENT_LENGTH],
            body.len().to_string().as_str()
        );
        assert_eq!(answer.headers()[http::header::CONNECTION], "close");
        // Whatever is not an error status would read as a success: 403.
        assert_eq!(refusal(101, "x").status(), http::StatusCode::FORBIDDEN);
        assert_eq!(refusal(200, "x").status(), http::StatusCode::FORBIDDEN);
        assert_eq!(refusal(42, "x").status(), http::StatusCode::FORBIDDEN);
        assert_eq!(
            refusal(503, "x").status(),
            http::StatusCode::SERVICE_UNAVAILABLE
        );
        // The dialer reads it back, shortened, or the status's own words.
        let read = refused(answer.status(), Some(body.as_bytes()));
        assert!(matches!(
            read,
            TransportError::Refused { status: 403, ref reason } if reason == "certificate of node \"a\" presented as node \"b\""
        ));
        let long = "x".repeat(10_000);
        assert!(matches!(
            refused(http::StatusCode::BAD_REQUEST, Some(long.as_bytes())),
            TransportError::Refused { status: 400, ref reason } if reason.len() == MAX_REASON
        ));
        assert!(matches!(
            refused(http::StatusCode::UNAUTHORIZED, None),
            TransportError::Refused { status: 401, ref reason } if reason == "Unauthorized"
        ));
    }

    #[test]
    fn a_batch_splits_into_its_frames_without_copies() {
        let message = batch(&[b"one", b"two", b"three"]);
        let frames = unbatch(&message, 16).expect("batch");
        assert_eq!(frames, [&b"one"[..], b"two", b"three"]);
        assert_eq!(frames[2].as_ptr(), message[message.len() - 5..].as_ptr());
    }

    #[test]
    fn bad_batches_are_refused() {
        assert!(matches!(
            unbatch(&batch(&[&[0u8; 17]]), 16),
            Err(FrameError::TooLarge { len: 17, max: 16 })
        ));
        // An empty frame would let a batch cost more than its bytes.
        assert!(matches!(
            unbatch(&batch(&[b"a", b""]), 16),
            Err(FrameError::Protocol(_))
        ));
        let mut truncated = batch(&[b"abcdef"]).to_vec();
        truncated.truncate(truncated.len() - 1);
        assert!(matches!(
            unbatch(&Bytes::from(truncated), 16),
            Err(FrameError::Protocol(_))
        ));
        assert!(unbatch(&Bytes::from_static(&[BATCH_MARK, 0, 0]), 16).is_err());
        assert!(unbatch(&Bytes::from_static(&[BATCH_MARK]), 16).is_err());
        // A length that overflows what follows is refused, not trusted.
        assert!(
            unbatch(
                &Bytes::from_static(&[BATCH_MARK, 0xff, 0xff, 0xff, 0xf0, 1]),
                usize::MAX
            )
            .is_err()
        );
    }
}
