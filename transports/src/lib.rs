//! Transports for edgehive: one trait, [`Transport`], for listening,
//! dialing and a framed, bidirectional [`Link`] that carries beehive
//! messages, implemented over WebSocket, QUIC and Unix domain sockets. The
//! hub is written once against it; which transport runs is configuration.
//!
//! | transport | feature | security | ordering |
//! | --- | --- | --- | --- |
//! | [`WebSocket`] | `ws` | TLS 1.3 (wss), mutual TLS optional; plain ws only with `allow_plaintext` | one ordered stream: all messages in send order |
//! | [`Quic`] | `quic` | always TLS 1.3, mutual TLS optional | [`Lane::Ordered`] messages in order; each [`Lane::Independent`] message on its own stream, unordered |
//! | [`UnixSocket`] | `uds` | socket file permissions; peer uid/pid | one ordered stream: all messages in send order |
//!
//! Every message travels as one MessagePack frame with a hard maximum size
//! ([`Limits::max_frame`], 16 MiB by default). A peer announcing a larger
//! frame, a truncated frame or bytes that are not a message close that one
//! connection with a clear error and a log line; the listener and every other
//! connection go on. Connect and handshake are bounded by timeouts; a peer
//! that vanishes without closing is left to the layer above (the hub's
//! keepalive), which closes the link with [`LinkSender::close`] or by
//! dropping it.
//!
//! ```no_run
//! # async fn demo() -> Result<(), transports::TransportError> {
//! use transports::{DialOptions, ListenOptions, TransportKind};
//! let uds = TransportKind::UnixSocket.transport()?;
//! let mut listener = uds.listen(&ListenOptions::new("/run/edgehive.sock")).await?;
//! let client = uds.dial(&DialOptions::new("/run/edgehive.sock", "localhost")).await?;
//! client.sender.send(&beehive::Message::new()).await?;
//! let mut server = listener.accept().await.expect("a link");
//! let received = server.receiver.recv().await;
//! # Ok(()) }
//! ```

// Built with no transport feature, the shared plumbing has no user.
#![cfg_attr(
    not(any(feature = "ws", feature = "quic", feature = "uds")),
    allow(dead_code)
)]

use std::future::Future;
use std::pin::Pin;

mod admission;
mod error;
pub mod frame;
pub mod kubeedge;
mod link;
mod listener;
#[cfg(any(feature = "quic", feature = "uds"))]
mod stream;
#[cfg(feature = "testing")]
pub mod testing;
#[cfg(feature = "tls")]
pub mod tls;

#[cfg(feature = "quic")]
mod quic;
#[cfg(feature = "uds")]
mod uds;
#[cfg(feature = "ws")]
mod ws;

pub use admission::{Admission, AdmissionCheck};
pub use error::{FrameError, TransportError};
pub use frame::Codec;
pub use link::{
    Lane, Limits, Link, LinkReceiver, LinkSender, MAX_HEADERS, PeerIdentity, RAW_FRAME_MARKER,
    Received,
};
pub use listener::Listener;
#[cfg(feature = "quic")]
pub use quic::{ALPN, Quic};
#[cfg(feature = "uds")]
pub use uds::UnixSocket;
#[cfg(feature = "ws")]
pub use ws::WebSocket;

/// A boxed future, so that [`Transport`] can be used as `dyn Transport`.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Four bytes a dialer sends first on byte-stream transports (UDS, QUIC's
/// ordered stream): a protocol check before any frame.
#[cfg(any(feature = "quic", feature = "uds"))]
pub(crate) const PREAMBLE: [u8; 4] = *b"EHV1";

/// One way of linking a cloud and an edge.
pub trait Transport: Send + Sync + 'static {
    /// Which transport this is.
    fn kind(&self) -> TransportKind;
    /// Starts listening; links arrive through [`Listener::accept`].
    fn listen<'a>(
        &'a self,
        options: &'a ListenOptions,
    ) -> BoxFuture<'a, Result<Listener, TransportError>>;
    /// Connects to a listener.
    fn dial<'a>(&'a self, options: &'a DialOptions) -> BoxFuture<'a, Result<Link, TransportError>>;
}

/// The transports edgehive knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TransportKind {
    /// WebSocket (`ws`).
    WebSocket,
    /// QUIC (`quic`).
    Quic,
    /// Unix domain socket (`uds`).
    UnixSocket,
}

impl TransportKind {
    /// Every kind, in a fixed order.
    pub const ALL: [TransportKind; 3] = [
        TransportKind::WebSocket,
        TransportKind::Quic,
        TransportKind::UnixSocket,
    ];

    /// The short name used in configuration: `ws`, `quic`, `uds`.
    pub fn name(self) -> &'static str {
        match self {
            TransportKind::WebSocket => "ws",
            TransportKind::Quic => "quic",
            TransportKind::UnixSocket => "uds",
        }
    }

    /// A transport of this kind with default settings, if this build has it.
    pub fn transport(self) -> Result<Box<dyn Transport>, TransportError> {
        match self {
            #[cfg(feature = "ws")]
            TransportKind::WebSocket => Ok(Box::new(WebSocket::default())),
            #[cfg(feature = "quic")]
            TransportKind::Quic => Ok(Box::new(Quic::default())),
            #[cfg(feature = "uds")]
            TransportKind::UnixSocket => Ok(Box::new(UnixSocket)),
            #[allow(unreachable_patterns)]
            other => Err(TransportError::Config(format!(
                "transport {} is not compiled in (cargo feature {:?})",
                other.name(),
                other.name()
            ))),
        }
    }
}

impl std::fmt::Display for TransportKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for TransportKind {
    type Err = TransportError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "ws" | "websocket" => Ok(TransportKind::WebSocket),
            "quic" => Ok(TransportKind::Quic),
            "uds" | "unix" => Ok(TransportKind::UnixSocket),
            other => Err(TransportError::Config(format!(
                "unknown transport {other:?}: expected ws, quic or uds"
            ))),
        }
    }
}

/// Where and how to listen.
#[derive(Clone)]
pub struct ListenOptions {
    /// `ip:port` (WebSocket, QUIC) or a socket path (UDS).
    pub address: String,
    /// Server TLS; required by QUIC, and by WebSocket unless plaintext is allowed.
    #[cfg(feature = "tls")]
    pub tls: Option<std::sync::Arc<rustls::ServerConfig>>,
    /// Accept plain WebSocket without TLS (loopback tests); off by default.
    pub allow_plaintext: bool,
    /// Frame size, timeouts, queues.
    pub limits: Limits,
    /// How messages become frames on the links accepted here.
    pub codec: Codec,
    /// Run on every WebSocket upgrade request before it is answered; a
    /// refusal answers it with an HTTP error instead of an upgrade (none:
    /// every request that reaches the path is upgraded). Other transports
    /// have no request and ignore it.
    pub admission: Option<AdmissionCheck>,
}

impl ListenOptions {
    /// Options with defaults: no TLS, plaintext refused, default limits.
    pub fn new(address: impl Into<String>) -> Self {
        ListenOptions {
            address: address.into(),
            #[cfg(feature = "tls")]
            tls: None,
            allow_plaintext: false,
            limits: Limits::default(),
            codec: Codec::default(),
            admission: None,
        }
    }

    /// With another codec (KubeEdge's JSON for KubeEdge peers).
    pub fn with_codec(mut self, codec: Codec) -> Self {
        self.codec = codec;
        self
    }

    /// With a check of every WebSocket upgrade request (see
    /// [`Admission`]).
    pub fn with_admission(mut self, check: AdmissionCheck) -> Self {
        self.admission = Some(check);
        self
    }

    /// With a server TLS configuration (see [`tls::server_config`]).
    #[cfg(feature = "tls")]
    pub fn with_tls(mut self, tls: std::sync::Arc<rustls::ServerConfig>) -> Self {
        self.tls = Some(tls);
        self
    }

    /// With other limits.
    pub fn with_limits(mut self, limits: Limits) -> Self {
        self.limits = limits;
        self
    }

    /// Whether TLS is configured.
    #[cfg(feature = "uds")]
    pub(crate) fn has_tls(&self) -> bool {
        #[cfg(feature = "tls")]
        return self.tls.is_some();
        #[cfg(not(feature = "tls"))]
        false
    }
}

/// Where and how to connect.
#[derive(Clone)]
pub struct DialOptions {
    /// `host:port` (WebSocket, QUIC) or a socket path (UDS).
    pub address: String,
    /// The name the server's certificate must carry.
    pub server_name: String,
    /// Client TLS (roots, and a client certificate for mutual TLS).
    #[cfg(feature = "tls")]
    pub tls: Option<std::sync::Arc<rustls::ClientConfig>>,
    /// Dial plain WebSocket without TLS (loopback tests); off by default.
    pub allow_plaintext: bool,
    /// Frame size, timeouts, queues.
    pub limits: Limits,
    /// Headers sent with a WebSocket upgrade request (other transports
    /// have none).
    pub headers: Vec<(String, String)>,
    /// The URL path of a WebSocket upgrade request, instead of the
    /// transport's own (KubeEdge's edges dial `/<project>/<node>/events`).
    pub path: Option<String>,
    /// How messages become frames on the dialed link.
    pub codec: Codec,
}

impl DialOptions {
    /// Options with defaults: no TLS, plaintext refused, default limits.
    pub fn new(address: impl Into<String>, server_name: impl Into<String>) -> Self {
        DialOptions {
            address: address.into(),
            server_name: server_name.into(),
            #[cfg(feature = "tls")]
            tls: None,
            allow_plaintext: false,
            limits: Limits::default(),
            headers: Vec::new(),
            path: None,
            codec: Codec::default(),
        }
    }

    /// With a WebSocket upgrade request to `path` (other transports have
    /// none).
    pub fn with_path(mut self, path: impl Into<String>) -> Self {
        self.path = Some(path.into());
        self
    }

    /// With another codec (KubeEdge's JSON to talk to KubeEdge).
    pub fn with_codec(mut self, codec: Codec) -> Self {
        self.codec = codec;
        self
    }

    /// With a header on the WebSocket upgrade request.
    pub fn with_header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// With a client TLS configuration (see [`tls::client_config`]).
    #[cfg(feature = "tls")]
    pub fn with_tls(mut self, tls: std::sync::Arc<rustls::ClientConfig>) -> Self {
        self.tls = Some(tls);
        self
    }

    /// With other limits.
    pub fn with_limits(mut self, limits: Limits) -> Self {
        self.limits = limits;
        self
    }

    /// Whether TLS is configured.
    #[cfg(feature = "uds")]
    pub(crate) fn has_tls(&self) -> bool {
        #[cfg(feature = "tls")]
        return self.tls.is_some();
        #[cfg(not(feature = "tls"))]
        false
    }
}

/// Refuses a codec other than edgehive's own on `transport` (KubeEdge's
/// JSON travels on WebSocket links only).
#[cfg(any(feature = "quic", feature = "uds"))]
pub(crate) fn native_codec_only(codec: Codec, transport: &str) -> Result<(), TransportError> {
    if codec == Codec::MessagePack {
        Ok(())
    } else {
        Err(TransportError::Config(format!(
            "{transport} links carry edgehive's own codec only; KubeEdge's JSON is for WebSocket"
        )))
    }
}

/// Refuses TLS settings for a transport that carries none.
#[cfg(feature = "uds")]
pub(crate) fn refuse_tls(has_tls: bool, transport: &str) -> Result<(), TransportError> {
    if has_tls {
        return Err(TransportError::Config(format!(
            "{transport} carries no TLS; protect its socket file instead"
        )));
    }
    Ok(())
}

/// Resolves `host:port` to the first address.
#[allow(dead_code)]
pub(crate) async fn resolve(address: &str) -> Result<std::net::SocketAddr, TransportError> {
    tokio::net::lookup_host(address)
        .await
        .map_err(|e| TransportError::io(format!("resolve {address}"), e))?
        .next()
        .ok_or_else(|| TransportError::Config(format!("{address} resolves to no address")))
}

/// Sets a TCP connection up for a link: Nagle off, and a peer that stops
/// answering given up after `limits.dead_peer_timeout`.
#[allow(dead_code)]
pub(crate) fn tune_tcp(stream: &tokio::net::TcpStream, limits: &Limits) {
    let _ = stream.set_nodelay(true);
    let timeout = limits.dead_peer_timeout;
    if timeout.is_zero() {
        return;
    }
    let socket = socket2::SockRef::from(stream);
    // Idle a third of the time, then probes a ninth apart. With
    // TCP_USER_TIMEOUT set, Linux gives up once the timeout has passed
    // since the peer last answered, so a silent peer goes after about the
    // timeout whether the link was idle or sending.
    let probe = (timeout / 9).max(std::time::Duration::from_secs(1));
    let keepalive = socket2::TcpKeepalive::new()
        .with_time((timeout / 3).max(std::time::Duration::from_secs(1)))
        .with_interval(probe)
        .with_retries(3);
    if let Err(err) = socket.set_tcp_keepalive(&keepalive) {
        tracing::debug!(error = %err, "TCP keepalive not set");
    }
    #[cfg(any(target_os = "linux", target_os = "android", target_os = "fuchsia"))]
    if let Err(err) = socket.set_tcp_user_timeout(Some(timeout)) {
        tracing::debug!(error = %err, "TCP user timeout not set");
    }
}

/// A TCP connection within the connect timeout, tuned by [`tune_tcp`].
#[allow(dead_code)]
pub(crate) async fn tcp_connect(
    addr: std::net::SocketAddr,
    limits: &Limits,
) -> Result<tokio::net::TcpStream, TransportError> {
    let stream = tokio::time::timeout(limits.connect_timeout, tokio::net::TcpStream::connect(addr))
        .await
        .map_err(|_| TransportError::Timeout {
            what: "connect",
            after: limits.connect_timeout,
        })?
        .map_err(|e| TransportError::io(format!("connect {addr}"), e))?;
    tune_tcp(&stream, limits);
    Ok(stream)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// Both ends of a link give up on a silent peer within the limit
    /// (what the kernel then does with it is the kernel's).
    #[cfg(target_os = "linux")]
    #[tokio::test]
    async fn tcp_links_give_up_on_a_silent_peer() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let limits = Limits {
            dead_peer_timeout: Duration::from_secs(18),
            ..Limits::default()
        };
        let dialed = tcp_connect(listener.local_addr().expect("addr"), &limits)
            .await
            .expect("connect");
        let socket = socket2::SockRef::from(&dialed);
        assert_eq!(
            socket.tcp_user_timeout().expect("read"),
            Some(Duration::from_secs(18))
        );
        assert!(socket.keepalive().expect("read"));
        assert_eq!(
            socket.tcp_keepalive_time().expect("read"),
            Duration::from_secs(6)
        );
        assert_eq!(
            socket.tcp_keepalive_interval().expect("read"),
            Duration::from_secs(2)
        );
        assert_eq!(socket.tcp_keepalive_retries().expect("read"), 3);
        assert!(dialed.nodelay().expect("read"));

        let untouched = Limits {
            dead_peer_timeout: Duration::ZERO,
            ..Limits::default()
        };
        let plain = tcp_connect(listener.local_addr().expect("addr"), &untouched)
            .await
            .expect("connect");
        assert_eq!(
            socket2::SockRef::from(&plain)
                .tcp_user_timeout()
                .expect("read"),
            None
        );
    }
}
