//! A link: one live connection carrying beehive messages both ways, owned by
//! a reader task and a writer task so that a slow peer in one direction
//! never blocks the other.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use beehive::Message;
use bytes::Bytes;
use tokio::sync::{mpsc, watch};
use tracing::{debug, warn};

use crate::error::{FrameError, TransportError};
use crate::frame::{self, DEFAULT_MAX_FRAME};

/// Which stream of a link a message travels on.
///
/// WebSocket and UDS carry both lanes on their one ordered stream. QUIC
/// carries [`Lane::Ordered`] on one long-lived stream and gives every
/// [`Lane::Independent`] message a stream of its own, so a slow large
/// message never holds back small ones (and has no order relative to them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Lane {
    /// In order with every other ordered message of this link.
    #[default]
    Ordered,
    /// On its own where the transport can; no order relative to others.
    Independent,
}

/// Who is at the other end, as the transport established it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PeerIdentity {
    /// The peer's address (`ip:port`, or `uds:uid=..,pid=..`).
    pub remote: String,
    /// The common name of the peer's TLS certificate, if it presented one.
    pub common_name: Option<String>,
    /// The peer's certificate chain (DER), leaf first; empty without TLS.
    pub certificates: Vec<Vec<u8>>,
}

/// Size limits, timeouts and queue depths of a listener or a dial.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest frame accepted or sent; larger input closes the connection
    /// before it is read.
    pub max_frame: usize,
    /// Time allowed to establish the socket.
    pub connect_timeout: Duration,
    /// Time allowed for the TLS / WebSocket / QUIC handshake.
    pub handshake_timeout: Duration,
    /// Messages queued for sending before `send` waits.
    pub send_queue: usize,
    /// Messages received and not yet taken before the link stops reading.
    pub recv_queue: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_frame: DEFAULT_MAX_FRAME,
            connect_timeout: Duration::from_secs(10),
            handshake_timeout: Duration::from_secs(10),
            send_queue: 1024,
            recv_queue: 1024,
        }
    }
}

pub(crate) enum Outgoing {
    Frame(Bytes, Lane),
    Close,
}

/// Shared by both halves: set once the link is closed, for any reason.
struct LinkState {
    closed: watch::Sender<bool>,
}

impl LinkState {
    fn close(&self) {
        self.closed.send_replace(true);
    }
}

/// One live connection: who is at the other end, and both directions.
pub struct Link {
    /// The peer as the transport established it.
    pub peer: PeerIdentity,
    /// Sends to the peer; cloneable.
    pub sender: LinkSender,
    /// Receives from the peer.
    pub receiver: LinkReceiver,
}

/// The sending half of a link. Cloneable; the link closes when `close` is
/// called, when the peer goes away, or when every sender and the receiver
/// are dropped.
#[derive(Clone)]
pub struct LinkSender {
    outgoing: mpsc::Sender<Outgoing>,
    max_frame: usize,
    state: Arc<LinkState>,
}

impl LinkSender {
    /// Sends a message on the ordered lane. Returns once it is queued for
    /// the socket; waits while the send queue is full.
    pub async fn send(&self, msg: &Message) -> Result<(), TransportError> {
        self.send_on(msg, Lane::Ordered).await
    }

    /// Sends a message on `lane`.
    pub async fn send_on(&self, msg: &Message, lane: Lane) -> Result<(), TransportError> {
        let frame = frame::encode(msg, self.max_frame)?;
        self.send_frame(frame, lane).await
    }

    /// Sends an already encoded frame payload (encode once, send to many).
    pub async fn send_frame(&self, frame: Bytes, lane: Lane) -> Result<(), TransportError> {
        if frame.len() > self.max_frame {
            return Err(FrameError::TooLarge {
                len: frame.len(),
                max: self.max_frame,
            }
            .into());
        }
        if self.is_closed() {
            return Err(TransportError::Closed);
        }
        self.outgoing
            .send(Outgoing::Frame(frame, lane))
            .await
            .map_err(|_| TransportError::Closed)
    }

    /// Closes the link after what is already queued has been written.
    pub async fn close(&self) {
        let _ = self.outgoing.send(Outgoing::Close).await;
        self.closed().await;
    }

    /// Whether the link is closed.
    pub fn is_closed(&self) -> bool {
        *self.state.closed.borrow()
    }

    /// Completes when the link is closed.
    pub async fn closed(&self) {
        let mut closed = self.state.closed.subscribe();
        let _ = closed.wait_for(|closed| *closed).await;
    }
}

/// The receiving half of a link.
pub struct LinkReceiver {
    incoming: mpsc::Receiver<Result<Message, TransportError>>,
    state: Arc<LinkState>,
}

impl LinkReceiver {
    /// The next message; `Some(Err(..))` once when the peer sent something
    /// unacceptable (the link is then closed); `None` once the link is closed.
    pub async fn recv(&mut self) -> Option<Result<Message, TransportError>> {
        self.incoming.recv().await
    }

    /// Whether the link is closed (messages may still wait to be received).
    pub fn is_closed(&self) -> bool {
        *self.state.closed.borrow()
    }
}

/// Where a link's reader gets frame payloads from. `next_frame` must be
/// cancel-safe: the reader also waits for the link to close.
pub(crate) trait FrameSource: Send + 'static {
    /// The next frame payload, or `Ok(None)` at a clean end of stream.
    fn next_frame(&mut self) -> impl Future<Output = Result<Option<Bytes>, TransportError>> + Send;
}

/// Where a link's writer puts frame payloads.
pub(crate) trait FrameSink: Send + 'static {
    /// Writes (or buffers) one frame.
    fn write_frame(
        &mut self,
        frame: Bytes,
        lane: Lane,
    ) -> impl Future<Output = Result<(), TransportError>> + Send;
    /// Pushes buffered frames to the peer.
    fn flush(&mut self) -> impl Future<Output = Result<(), TransportError>> + Send;
    /// Flushes and closes the connection gracefully.
    fn close(&mut self) -> impl Future<Output = ()> + Send;
}

/// Frames written before a flush, at most.
const WRITE_BATCH: usize = 256;

/// Starts the reader and writer tasks of a connection.
pub(crate) fn spawn_link<S: FrameSource, K: FrameSink>(
    peer: PeerIdentity,
    source: S,
    sink: K,
    limits: &Limits,
) -> Link {
    let (closed, _) = watch::channel(false);
    let state = Arc::new(LinkState { closed });
    let (outgoing, to_write) = mpsc::channel(limits.send_queue.max(1));
    let (delivered, incoming) = mpsc::channel(limits.recv_queue.max(1));
    tokio::spawn(read_loop(
        source,
        delivered,
        state.clone(),
        peer.remote.clone(),
    ));
    tokio::spawn(write_loop(
        sink,
        to_write,
        state.clone(),
        peer.remote.clone(),
    ));
    Link {
        peer,
        sender: LinkSender {
            outgoing,
            max_frame: limits.max_frame,
            state: state.clone(),
        },
        receiver: LinkReceiver { incoming, state },
    }
}

async fn read_loop<S: FrameSource>(
    mut source: S,
    deliver: mpsc::Sender<Result<Message, TransportError>>,
    state: Arc<LinkState>,
    peer: String,
) {
    let mut closed = state.closed.subscribe();
    loop {
        let next = tokio::select! {
            next = source.next_frame() => next,
            _ = closed.wait_for(|closed| *closed) => break,
            _ = deliver.closed() => break,
        };
        let failure =
            match next.and_then(|frame| Ok(frame.map(|f| frame::decode(&f)).transpose()?)) {
                Ok(Some(msg)) => {
                    if deliver.send(Ok(msg)).await.is_err() {
                        break;
                    }
                    continue;
                }
                Ok(None) => {
                    debug!(%peer, "peer closed the link");
                    break;
                }
                Err(failure) => failure,
            };
        warn!(%peer, error = %failure, "closing link");
        let _ = deliver.send(Err(failure)).await;
        break;
    }
    state.close();
}

async fn write_loop<K: FrameSink>(
    mut sink: K,
    mut to_write: mpsc::Receiver<Outgoing>,
    state: Arc<LinkState>,
    peer: String,
) {
    let mut closed = state.closed.subscribe();
    'link: loop {
        let first = tokio::select! {
            first = to_write.recv() => first,
            _ = closed.wait_for(|closed| *closed) => break 'link,
        };
        let mut next = first;
        let mut batch = 0;
        while let Some(out) = next.take() {
            match out {
                Outgoing::Close => break 'link,
                Outgoing::Frame(frame, lane) => {
                    if let Err(err) = sink.write_frame(frame, lane).await {
                        warn!(%peer, error = %err, "write failed, closing link");
                        break 'link;
                    }
                }
            }
            batch += 1;
            if batch < WRITE_BATCH {
                next = to_write.try_recv().ok();
            }
        }
        if batch == 0 {
            // Every sender is gone: nobody can use this link any more.
            break;
        }
        if let Err(err) = sink.flush().await {
            warn!(%peer, error = %err, "flush failed, closing link");
            break;
        }
    }
    sink.close().await;
    state.close();
}
