//! WebSocket transport: wss (TLS 1.3, optional mutual TLS) or, when asked
//! for explicitly, plain ws. One binary WebSocket message per beehive
//! message, on one ordered stream; the WebSocket layer enforces the frame
//! limit from each frame's header, before reading its body.

use std::sync::Arc;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use futures_util::stream::{SplitSink, SplitStream};
use futures_util::{SinkExt, StreamExt};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::{TlsAcceptor, TlsConnector};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::error::CapacityError;
use tokio_tungstenite::tungstenite::handshake::server::{ErrorResponse, Request, Response};
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::{Error as WsError, Message as WsMessage, http};
use tracing::warn;

use crate::error::{FrameError, TransportError};
use crate::frame::Codec;
use crate::link::{FrameSink, FrameSource, Lane, Limits, Link, PeerIdentity, spawn_link};
use crate::listener::Listener;
use crate::tls;
use crate::{
    BoxFuture, DialOptions, ListenOptions, Transport, TransportKind, resolve, tcp_connect,
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

fn config(limits: &Limits) -> WebSocketConfig {
    // Small starting buffers: tungstenite's 128 KiB defaults would cost an
    // idle node session more than everything else together.
    WebSocketConfig::default()
        .read_buffer_size(8 * 1024)
        .write_buffer_size(16 * 1024)
        .max_message_size(Some(limits.max_frame))
        .max_frame_size(Some(limits.max_frame))
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

struct WsSource<S> {
    stream: SplitStream<WebSocketStream<S>>,
}

impl<S: AsyncRead + AsyncWrite + Unpin + Send + 'static> FrameSource for WsSource<S> {
    fn poll_frame(&mut self, cx: &mut Context<'_>) -> Poll<Result<Option<Bytes>, TransportError>> {
        loop {
            return Poll::Ready(match ready!(self.stream.poll_next_unpin(cx)) {
                Some(Ok(WsMessage::Binary(frame))) => Ok(Some(frame)),
                Some(Ok(WsMessage::Close(_))) | None => Ok(None),
                Some(Ok(WsMessage::Ping(_) | WsMessage::Pong(_) | WsMessage::Frame(_))) => continue,
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
}

impl<S: AsyncRead + AsyncWrite + Unpin + Send + 'static> FrameSink for WsSink<S> {
    async fn write_frame(&mut self, frame: Bytes, _lane: Lane) -> Result<(), TransportError> {
        self.sink
            .feed(WsMessage::Binary(frame))
            .await
            .map_err(ws_error)
    }

    async fn flush(&mut self) -> Result<(), TransportError> {
        self.sink.flush().await.map_err(ws_error)
    }

    async fn close(&mut self) {
        let _ = self.sink.close().await;
    }
}

fn into_link<S>(ws: WebSocketStream<S>, peer: PeerIdentity, limits: &Limits, codec: Codec) -> Link
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (sink, stream) = ws.split();
    spawn_link(peer, WsSource { stream }, WsSink { sink }, limits, codec)
}

async fn upgrade_server<S>(
    stream: S,
    mut peer: PeerIdentity,
    path: Arc<str>,
    limits: Limits,
    codec: Codec,
) -> Result<Link, TransportError>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    // The request's headers, kept for the link's peer identity.
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let keep = seen.clone();
    // tungstenite's callback signature, large error variant and all.
    #[allow(clippy::result_large_err)]
    let check_path =
        move |request: &Request, response: Response| -> Result<Response, ErrorResponse> {
            if request.uri().path() == &*path {
                let headers: Vec<(String, String)> = request
                    .headers()
                    .iter()
                    .filter_map(|(name, value)| {
                        Some((name.as_str().to_owned(), value.to_str().ok()?.to_owned()))
                    })
                    .take(crate::link::MAX_HEADERS)
                    .collect();
                if let Ok(mut kept) = keep.lock() {
                    *kept = headers;
                }
                Ok(response)
            } else {
                let mut refusal = ErrorResponse::new(Some(format!(
                    "no WebSocket endpoint at {}",
                    request.uri().path()
                )));
                *refusal.status_mut() = http::StatusCode::NOT_FOUND;
                Err(refusal)
            }
        };
    let ws =
        tokio_tungstenite::accept_hdr_async_with_config(stream, check_path, Some(config(&limits)))
            .await
            .map_err(ws_error)?;
    if let Ok(mut kept) = seen.lock() {
        peer.headers = std::mem::take(&mut *kept);
    }
    Ok(into_link(ws, peer, &limits, codec))
}

async fn upgrade_client<S>(
    stream: S,
    url: String,
    headers: &[(String, String)],
    peer: PeerIdentity,
    limits: Limits,
    codec: Codec,
) -> Result<Link, TransportError>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    let mut request = url.into_client_request().map_err(ws_error)?;
    for (name, value) in headers {
        let name = http::HeaderName::from_bytes(name.as_bytes())
            .map_err(|e| TransportError::Config(format!("header name {name:?}: {e}")))?;
        let value = http::HeaderValue::from_str(value)
            .map_err(|e| TransportError::Config(format!("header value {value:?}: {e}")))?;
        request.headers_mut().append(name, value);
    }
    let (ws, _response) =
        tokio_tungstenite::client_async_with_config(request, stream, Some(config(&limits)))
            .await
            .map_err(ws_error)?;
    Ok(into_link(ws, peer, &limits, codec))
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
                        let (acceptor, path, limits) =
                            (acceptor.clone(), path.clone(), *queue.limits());
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
                                    upgrade_server(stream, peer, path, limits, codec).await
                                }
                                None => {
                                    let peer = PeerIdentity {
                                        remote,
                                        ..PeerIdentity::default()
                                    };
                                    upgrade_server(tcp, peer, path, limits, codec).await
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
                        let url = format!("wss://{}{}", options.server_name, self.path);
                        upgrade_client(stream, url, &options.headers, peer, limits, options.codec)
                            .await
                    }
                    (None, true) => {
                        let peer = PeerIdentity {
                            remote,
                            ..PeerIdentity::default()
                        };
                        let url = format!("ws://{}{}", options.address, self.path);
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
