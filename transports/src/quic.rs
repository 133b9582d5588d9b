//! QUIC transport (RFC 9000, quinn), always TLS 1.3. The dialing side opens
//! one bidirectional stream for [`Lane::Ordered`] messages; every
//! [`Lane::Independent`] message gets a unidirectional stream of its own, so
//! a slow large message never holds back small ones. The frames of the
//! link's inner streams ([`Lane::Stream`]) share one more unidirectional
//! stream, opened on the first of them, at a lower priority than the rest.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use quinn::crypto::rustls::{QuicClientConfig, QuicServerConfig};
use quinn::{Connection, Endpoint, RecvStream, SendStream, VarInt};
use rustls::pki_types::CertificateDer;
use tokio::sync::Semaphore;
use tracing::{debug, warn};

use crate::error::{FrameError, TransportError};
use crate::frame::Codec;
use crate::frame::LENGTH_PREFIX;
use crate::link::{FrameSink, FrameSource, Lane, Limits, Link, spawn_link};
use crate::listener::Listener;
use crate::stream::{StreamSink, StreamSource, write_prefixed};
use crate::tls;
use crate::{BoxFuture, DialOptions, ListenOptions, PREAMBLE, Transport, TransportKind, resolve};

/// ALPN protocol id of the edgehive link.
pub const ALPN: &[u8] = b"edgehive/1";

/// Independent streams each side may have open at once; a sender with
/// more waits for one to finish.
const INDEPENDENT_STREAMS: u32 = 16;

/// Independent messages a link's writer hands off before it waits: four
/// times the streams that may be open, so a few slow ones do not stop it.
const OUTSTANDING_INDEPENDENT: usize = 4 * INDEPENDENT_STREAMS as usize;

/// How long a graceful close waits for the peer to take what was sent.
const CLOSE_GRACE: Duration = Duration::from_secs(2);

/// The QUIC transport. Dials share one client endpoint (one UDP socket) per
/// address family.
#[derive(Debug, Default)]
pub struct Quic {
    /// Idle time after which QUIC itself drops a silent connection
    /// (the hub's keepalive normally notices first).
    pub idle_timeout: Option<Duration>,
    /// The IPv4 and the IPv6 client endpoint, each bound on first use: an
    /// endpoint bound for one family cannot reach a peer of the other.
    client: Mutex<[Option<Endpoint>; 2]>,
}

/// Kernel buffer asked for on each QUIC UDP socket, each way. A cloud's one
/// socket takes every node's packets: at Linux's default of 208 KiB a burst
/// (thousands of nodes acknowledging a fan-out, or handshaking at once)
/// overflows it, and every dropped packet then waits for QUIC's loss
/// recovery (10,000 nodes: fan-out in 1.8 s with 32 MiB, 2.0-2.6 s and
/// 17,000 drops with 4 MiB). The kernel caps the request at
/// `net.core.rmem_max` and `net.core.wmem_max`; it costs memory only while
/// packets wait.
pub const UDP_BUFFER: usize = 32 * 1024 * 1024;

/// A UDP socket bound to `addr` with [`UDP_BUFFER`] asked for. `listening`
/// says whether a capped buffer deserves a warning (a cloud's socket) or
/// only a debug line (an edge's).
fn udp_socket(addr: SocketAddr, listening: bool) -> Result<std::net::UdpSocket, TransportError> {
    use socket2::{Domain, Protocol, Socket, Type};
    let socket = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))
        .map_err(|e| TransportError::io("UDP socket", e))?;
    // As quinn's own client endpoint: dual-stack where it can be. A
    // listener keeps the system's choice.
    if !listening
        && addr.is_ipv6()
        && let Err(err) = socket.set_only_v6(false)
    {
        debug!(error = %err, "UDP socket not dual-stack");
    }
    if let Err(err) = socket.set_recv_buffer_size(UDP_BUFFER) {
        debug!(error = %err, "UDP receive buffer not set");
    }
    if let Err(err) = socket.set_send_buffer_size(UDP_BUFFER) {
        debug!(error = %err, "UDP send buffer not set");
    }
    socket
        .bind(&addr.into())
        .map_err(|e| TransportError::io(format!("bind {addr}"), e))?;
    let reported = socket.recv_buffer_size().unwrap_or(0);
    // Linux reports twice what it grants (the rest is its bookkeeping).
    let granted = if cfg!(any(target_os = "linux", target_os = "android")) {
        reported / 2
    } else {
        reported
    };
    if granted < UDP_BUFFER / 2 {
        if listening {
            warn!(
                granted,
                wanted = UDP_BUFFER,
                "small UDP receive buffer: bursts from many nodes will be dropped \
                 and resent; raise net.core.rmem_max"
            );
        } else {
            debug!(granted, wanted = UDP_BUFFER, "UDP receive buffer capped");
        }
    }
    Ok(socket.into())
}

/// A quinn endpoint on a socket of [`udp_socket`].
fn endpoint(
    addr: SocketAddr,
    server: Option<quinn::ServerConfig>,
) -> Result<Endpoint, TransportError> {
    let socket = udp_socket(addr, server.is_some())?;
    let runtime = quinn::default_runtime()
        .ok_or_else(|| TransportError::Config("QUIC needs a tokio runtime".into()))?;
    Endpoint::new(quinn::EndpointConfig::default(), server, socket, runtime)
        .map_err(|e| TransportError::io(format!("QUIC endpoint on {addr}"), e))
}

fn quic_error(context: &str, err: impl std::fmt::Display) -> TransportError {
    TransportError::Quic(format!("{context}: {err}"))
}

fn transport_config(idle: Option<Duration>) -> Result<Arc<quinn::TransportConfig>, TransportError> {
    let mut config = quinn::TransportConfig::default();
    // Independent messages in flight at once, each way. quinn sets up the
    // state of every stream the peer may open when the connection starts
    // (64 cost an idle session 3 KiB); 16 large messages in flight keep
    // a link busy.
    config.max_concurrent_uni_streams(VarInt::from_u32(INDEPENDENT_STREAMS));
    config.max_concurrent_bidi_streams(VarInt::from_u32(1));
    // No unreliable datagrams on this link: no buffer for them.
    config.datagram_receive_buffer_size(None);
    let idle = idle.unwrap_or(Duration::from_secs(60));
    config.max_idle_timeout(Some(
        idle.try_into().map_err(|e| quic_error("idle timeout", e))?,
    ));
    Ok(Arc::new(config))
}

/// What the receiver waits for besides the ordered stream: the peer's next
/// independent stream (`None` once the connection is gone), or the one
/// frame of an independent stream being read.
enum Independent {
    Opened(Option<RecvStream>),
    /// A frame, and the stream to read the next one from.
    Frame(Result<Bytes, TransportError>, Option<RecvStream>),
    /// A stream ended after its last frame.
    Ended,
}

type IndependentFuture = Pin<Box<dyn Future<Output = Independent> + Send>>;

/// Frames from the ordered stream and from every independent stream,
/// merged as they come, all read in the receiver's own task: no hop per
/// frame, and no task or queue per link for streams that may never come
/// (an idle node session pays for neither). Independent streams are read
/// while the receiver waits for frames; one it is not taking holds the
/// peer back through QUIC's own flow control. Waiting for the next stream
/// sits in the same set as the reads, which is polled only when one of
/// them was woken: a frame on the ordered stream costs no look at quinn's
/// connection state. The link ends with the ordered stream.
struct QuicSource {
    ordered: StreamSource<RecvStream>,
    connection: Connection,
    independent: FuturesUnordered<IndependentFuture>,
}

fn accept_independent(connection: &Connection) -> IndependentFuture {
    let connection = connection.clone();
    Box::pin(async move { Independent::Opened(connection.accept_uni().await.ok()) })
}

impl FrameSource for QuicSource {
    fn poll_frame(&mut self, cx: &mut Context<'_>) -> Poll<Result<Option<Bytes>, TransportError>> {
        while let Poll::Ready(Some(next)) = self.independent.poll_next_unpin(cx) {
            match next {
                Independent::Frame(frame, more) => {
                    if let Some(recv) = more {
                        let max = self.ordered.max_frame();
                        self.independent
                            .push(Box::pin(read_independent(recv, max, false)));
                    }
                    return Poll::Ready(frame.map(Some));
                }
                Independent::Ended => {}
                Independent::Opened(Some(recv)) => {
                    let max = self.ordered.max_frame();
                    self.independent
                        .push(Box::pin(read_independent(recv, max, true)));
                    self.independent.push(accept_independent(&self.connection));
                }
                // The connection is gone; the ordered stream ends too.
                Independent::Opened(None) => {}
            }
        }
        self.ordered.poll_frame(cx)
    }
}

/// Reads the next frame of a unidirectional stream: an independent
/// message's one frame, or one of the inner streams' frames. A stream
/// that ends where a frame would start (not its `first`) ended cleanly.
async fn read_independent(mut recv: RecvStream, max: usize, first: bool) -> Independent {
    let mut header = [0u8; LENGTH_PREFIX];
    match recv.read_exact(&mut header).await {
        Ok(()) => {}
        Err(quinn::ReadExactError::FinishedEarly(0)) if !first => return Independent::Ended,
        Err(e) => return Independent::Frame(Err(quic_error("independent stream", e)), None),
    }
    let len = u32::from_be_bytes(header) as usize;
    if len > max {
        return Independent::Frame(Err(FrameError::TooLarge { len, max }.into()), None);
    }
    // Memory grows with what arrives, not with what the header claims: a
    // peer that sends a header and stalls holds no frame-sized buffer.
    let mut frame = bytes::BytesMut::new();
    while frame.len() < len {
        match recv.read_chunk(len - frame.len(), true).await {
            Ok(Some(chunk)) => frame.extend_from_slice(&chunk.bytes),
            Ok(None) => {
                let truncated = FrameError::Protocol("truncated independent stream".into());
                return Independent::Frame(Err(truncated.into()), None);
            }
            Err(e) => return Independent::Frame(Err(quic_error("independent stream", e)), None),
        }
    }
    Independent::Frame(Ok(frame.freeze()), Some(recv))
}

fn source(connection: Connection, ordered: RecvStream, limits: &Limits) -> QuicSource {
    let independent = FuturesUnordered::new();
    independent.push(accept_independent(&connection));
    QuicSource {
        ordered: StreamSource::new(ordered, limits.max_frame),
        connection,
        independent,
    }
}

struct QuicSink {
    connection: Connection,
    ordered: StreamSink<SendStream>,
    /// Independent messages handed off and not yet written: the writer
    /// waits only when [`OUTSTANDING_INDEPENDENT`] are, not whenever the
    /// peer has no stream free, so ordered messages are not held back by
    /// independent ones waiting for a stream.
    outstanding: Arc<Semaphore>,
    /// The inner streams' frames, to the task writing them on their QUIC
    /// stream (opened with the first). Unbounded: what an inner stream may
    /// have in flight is bounded by its own flow control, above the link.
    streams: Option<tokio::sync::mpsc::UnboundedSender<Bytes>>,
}

impl QuicSink {
    /// The channel to the inner streams' QUIC stream, started on first use.
    fn streams(&mut self) -> &tokio::sync::mpsc::UnboundedSender<Bytes> {
        let connection = self.connection.clone();
        self.streams.get_or_insert_with(|| {
            let (frames, mut queued) = tokio::sync::mpsc::unbounded_channel::<Bytes>();
            tokio::spawn(async move {
                let written = async {
                    let mut stream = connection
                        .open_uni()
                        .await
                        .map_err(|e| quic_error("open stream", e))?;
                    // Below the ordered stream (priority 0).
                    let _ = stream.set_priority(-1);
                    while let Some(frame) = queued.recv().await {
                        write_prefixed(&mut stream, &frame).await?;
                    }
                    let _ = stream.finish();
                    Ok::<_, TransportError>(())
                };
                if let Err(err) = written.await {
                    debug!(error = %err, "inner streams' QUIC stream failed");
                    connection.close(VarInt::from_u32(1), b"inner streams failed");
                }
            });
            frames
        })
    }
}

impl FrameSink for QuicSink {
    async fn write_frame(&mut self, frame: Bytes, lane: Lane) -> Result<(), TransportError> {
        match lane {
            Lane::Ordered => self.ordered.write_frame(frame, lane).await,
            Lane::Stream(_) => self
                .streams()
                .send(frame)
                .map_err(|_| TransportError::Closed),
            Lane::Independent => {
                if let Some(reason) = self.connection.close_reason() {
                    return Err(quic_error("open stream", reason));
                }
                let permit = self
                    .outstanding
                    .clone()
                    .acquire_owned()
                    .await
                    .map_err(|_| TransportError::Closed)?;
                // The stream proceeds on its own; the writer moves on.
                let connection = self.connection.clone();
                tokio::spawn(async move {
                    let _permit = permit;
                    let written = async {
                        let mut stream = connection
                            .open_uni()
                            .await
                            .map_err(|e| quic_error("open stream", e))?;
                        write_prefixed(&mut stream, &frame).await?;
                        let _ = stream.finish();
                        Ok::<_, TransportError>(())
                    };
                    if let Err(err) = written.await {
                        debug!(error = %err, "independent stream write failed");
                    }
                });
                Ok(())
            }
        }
    }

    async fn flush(&mut self) -> Result<(), TransportError> {
        self.ordered.flush().await
    }

    async fn close(&mut self) {
        self.ordered.close().await;
        let _ = tokio::time::timeout(CLOSE_GRACE, self.ordered_stopped()).await;
        self.connection.close(VarInt::from_u32(0), b"closed");
    }
}

impl QuicSink {
    /// Completes when the peer has read the ordered stream to its end.
    async fn ordered_stopped(&mut self) {
        let _ = self.ordered.get_mut().stopped().await;
    }
}

fn into_link(connection: Connection, send: SendStream, recv: RecvStream, limits: &Limits) -> Link {
    let chain = connection
        .peer_identity()
        .and_then(|any| any.downcast::<Vec<CertificateDer<'static>>>().ok());
    let peer = tls::identity(
        connection.remote_address().to_string(),
        chain.as_deref().map(Vec::as_slice),
    );
    let source = source(connection.clone(), recv, limits);
    let sink = QuicSink {
        connection,
        ordered: StreamSink::new(send),
        outstanding: Arc::new(Semaphore::new(OUTSTANDING_INDEPENDENT)),
        streams: None,
    };
    spawn_link(peer, source, sink, limits, Codec::MessagePack)
}

impl Quic {
    /// The shared client endpoint of `peer`'s address family, bound on
    /// first use.
    fn client_endpoint(&self, peer: SocketAddr) -> Result<Endpoint, TransportError> {
        let mut clients = self.client.lock().unwrap_or_else(PoisonError::into_inner);
        let client = &mut clients[usize::from(peer.is_ipv6())];
        if let Some(endpoint) = client.as_ref() {
            return Ok(endpoint.clone());
        }
        let bind: SocketAddr = if peer.is_ipv6() {
            (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
        } else {
            (std::net::Ipv4Addr::UNSPECIFIED, 0).into()
        };
        let endpoint = endpoint(bind, None)?;
        *client = Some(endpoint.clone());
        Ok(endpoint)
    }
}

impl Transport for Quic {
    fn kind(&self) -> TransportKind {
        TransportKind::Quic
    }

    fn listen<'a>(
        &'a self,
        options: &'a ListenOptions,
    ) -> BoxFuture<'a, Result<Listener, TransportError>> {
        Box::pin(async move {
            crate::native_codec_only(options.codec, "quic")?;
            let Some(tls) = options.tls.as_ref() else {
                return Err(TransportError::Config(
                    "QUIC always needs a TLS server configuration".into(),
                ));
            };
            let mut crypto = (**tls).clone();
            crypto.alpn_protocols = vec![ALPN.to_vec()];
            let crypto =
                QuicServerConfig::try_from(crypto).map_err(|e| quic_error("server TLS", e))?;
            let mut config = quinn::ServerConfig::with_crypto(Arc::new(crypto));
            config.transport_config(transport_config(self.idle_timeout)?);
            let addr = resolve(&options.address).await?;
            let endpoint = endpoint(addr, Some(config))?;
            let local = endpoint
                .local_addr()
                .map_err(|e| TransportError::io("local address", e))?
                .to_string();
            let accepting = endpoint.clone();
            let listener = Listener::new(local, &options.limits, move |queue| {
                tokio::spawn(async move {
                    while let Some(incoming) = accepting.accept().await {
                        let remote = incoming.remote_address().to_string();
                        let limits = *queue.limits();
                        queue.handshake(remote, async move {
                            let connection = incoming
                                .await
                                .map_err(|e| TransportError::Tls(e.to_string()))?;
                            let (send, mut recv) = connection
                                .accept_bi()
                                .await
                                .map_err(|e| quic_error("ordered stream", e))?;
                            let mut preamble = [0u8; 4];
                            recv.read_exact(&mut preamble)
                                .await
                                .map_err(|e| quic_error("preamble", e))?;
                            if preamble != PREAMBLE {
                                connection.close(VarInt::from_u32(1), b"protocol");
                                return Err(FrameError::Protocol(format!(
                                    "preamble {preamble:02x?}"
                                ))
                                .into());
                            }
                            Ok(into_link(connection, send, recv, &limits))
                        });
                    }
                    warn!("QUIC endpoint stopped accepting");
                })
            });
            Ok(listener.on_shutdown(move || {
                Box::pin(async move {
                    endpoint.close(VarInt::from_u32(0), b"listener shut down");
                    endpoint.wait_idle().await;
                    let local = endpoint.local_addr().ok();
                    drop(endpoint);
                    // quinn releases the UDP socket once the tasks of the
                    // closed connections have let go; return only when the
                    // address can be bound again, so a restart can reuse it.
                    if let Some(local) = local {
                        for _ in 0..200 {
                            if std::net::UdpSocket::bind(local).is_ok() {
                                break;
                            }
                            tokio::time::sleep(Duration::from_millis(10)).await;
                        }
                    }
                })
            }))
        })
    }

    fn dial<'a>(&'a self, options: &'a DialOptions) -> BoxFuture<'a, Result<Link, TransportError>> {
        Box::pin(async move {
            crate::native_codec_only(options.codec, "quic")?;
            let Some(tls) = options.tls.as_ref() else {
                return Err(TransportError::Config(
                    "QUIC always needs a TLS client configuration".into(),
                ));
            };
            let limits = options.limits;
            let mut crypto = (**tls).clone();
            crypto.alpn_protocols = vec![ALPN.to_vec()];
            let crypto =
                QuicClientConfig::try_from(crypto).map_err(|e| quic_error("client TLS", e))?;
            let mut config = quinn::ClientConfig::new(Arc::new(crypto));
            config.transport_config(transport_config(self.idle_timeout)?);
            let addr = resolve(&options.address).await?;
            let endpoint = self.client_endpoint(addr)?;
            let connecting = endpoint
                .connect_with(config, addr, &options.server_name)
                .map_err(|e| quic_error("connect", e))?;
            let handshake = async {
                let connection = connecting
                    .await
                    .map_err(|e| TransportError::Tls(e.to_string()))?;
                let (mut send, recv) = connection
                    .open_bi()
                    .await
                    .map_err(|e| quic_error("ordered stream", e))?;
                send.write_all(&PREAMBLE)
                    .await
                    .map_err(|e| quic_error("preamble", e))?;
                Ok::<_, TransportError>((connection, send, recv))
            };
            let (connection, send, recv) =
                tokio::time::timeout(limits.handshake_timeout, handshake)
                    .await
                    .map_err(|_| TransportError::Timeout {
                        what: "QUIC handshake",
                        after: limits.handshake_timeout,
                    })??;
            Ok(into_link(connection, send, recv, &limits))
        })
    }
}
