//! Errors of the transports, one enum per failure domain.

use std::time::Duration;

/// A frame that cannot be accepted.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    /// The frame is larger than the configured maximum; refused before
    /// its body was read or allocated.
    #[error("frame of {len} bytes exceeds the maximum of {max} bytes")]
    TooLarge {
        /// Announced or actual length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// The frame's bytes are not a beehive message.
    #[error("frame is not a valid message: {0}")]
    Decode(#[source] beehive::MessageError),
    /// The message could not be encoded.
    #[error("message could not be encoded: {0}")]
    Encode(#[source] beehive::MessageError),
    /// The stream ended in the middle of a frame.
    #[error("connection ended inside a frame ({got} of {expected} bytes)")]
    Truncated {
        /// Bytes received.
        got: usize,
        /// Bytes announced.
        expected: usize,
    },
    /// The peer does not speak this protocol (wrong preamble or frame type).
    #[error("peer does not speak the edgehive protocol: {0}")]
    Protocol(String),
    /// A frame of a foreign codec (KubeEdge's JSON) that is not a message.
    #[error("frame is not a valid message: {0}")]
    Foreign(String),
}

/// What can go wrong with a listener, a dial or a link.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    /// A socket operation failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// Connecting or a handshake took longer than allowed.
    #[error("{what} timed out after {after:?}")]
    Timeout {
        /// Connect, TLS handshake, WebSocket upgrade, ...
        what: &'static str,
        /// The limit that passed.
        after: Duration,
    },
    /// TLS set-up or handshake failed (bad or missing certificate, ...).
    #[error("TLS: {0}")]
    Tls(String),
    /// The WebSocket layer failed.
    #[error("WebSocket: {0}")]
    WebSocket(String),
    /// The other side answered the WebSocket upgrade request with an HTTP
    /// error instead of upgrading (see [`crate::Admission`]).
    #[error("link refused with HTTP {status}: {reason}")]
    Refused {
        /// The HTTP status.
        status: u16,
        /// The reason it gave (its response body, shortened).
        reason: String,
    },
    /// The QUIC layer failed.
    #[error("QUIC: {0}")]
    Quic(String),
    /// A frame was refused; the connection is closed.
    #[error(transparent)]
    Frame(#[from] FrameError),
    /// The options do not fit this transport.
    #[error("invalid transport configuration: {0}")]
    Config(String),
    /// The link is closed.
    #[error("link closed")]
    Closed,
    /// The send queue is full (only from `try_send_frame`).
    #[error("send queue full")]
    QueueFull,
}

impl TransportError {
    /// An I/O error with what was being done.
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        TransportError::Io {
            context: context.into(),
            source,
        }
    }
}
