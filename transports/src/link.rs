//! A link: one live connection carrying beehive messages both ways. A
//! writer task owns the sending side (so a slow peer never blocks a sender
//! beyond the send queue, and frames are batched between flushes); the
//! receiving side is read directly by whoever calls `recv`.
//!
//! One concern: one link's two sides and the writer task between them;
//! nothing here knows what the messages say.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use beehive::Message;
use bytes::Bytes;
use crossbeam_utils::CachePadded;
use std::sync::{Mutex, PoisonError};

use tokio::sync::{Notify, watch};
use tracing::{debug, warn};

use crate::error::{FrameError, TransportError};
use crate::frame::{Codec, DEFAULT_MAX_FRAME};

/// Which stream of a link a message travels on.
///
/// WebSocket and UDS carry every lane on their one ordered stream. QUIC
/// carries [`Lane::Ordered`] on one long-lived stream and gives every
/// [`Lane::Independent`] message a stream of its own, so a slow large
/// message never holds back small ones (and has no order relative to them).
///
/// [`Lane::Stream`] frames belong to long-lived streams carried inside the
/// link (a container's log, a terminal): each stream's frames stay in
/// order; they are written only when no message of the other lanes waits,
/// the streams taking turns frame by frame, so no stream holds back the
/// link's messages (objects, acknowledgements, keepalives) or another
/// stream by more than the frame being written. QUIC carries them on a
/// QUIC stream of their own at a lower priority, so their bytes never hold
/// back the ordered stream in the network either.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Lane {
    /// In order with every other ordered message of this link.
    #[default]
    Ordered,
    /// On its own where the transport can; no order relative to others.
    Independent,
    /// A frame of the link's inner stream `id`: in order with that
    /// stream's frames, after whatever waits on the other lanes.
    Stream(u64),
}

/// The first byte of a frame that is not a message (a frame of an inner
/// stream, [`Lane::Stream`]): never the first byte of an encoded message
/// (`0xc1` is unused in MessagePack; JSON is text, and `0xc1` is never
/// UTF-8). [`LinkReceiver::recv_item`] hands such frames over undecoded.
pub const RAW_FRAME_MARKER: u8 = 0xc1;

/// What a link received: a message, or a raw frame (one starting with
/// [`RAW_FRAME_MARKER`]).
#[derive(Debug)]
pub enum Received {
    /// A message.
    Message(Message),
    /// A frame starting with [`RAW_FRAME_MARKER`], undecoded.
    Raw(Bytes),
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
    /// The headers of a WebSocket upgrade request (lower-case names, at
    /// most [`MAX_HEADERS`]), as the accepting side saw them; empty for
    /// other transports. KubeEdge's edges name themselves here
    /// (`node_id`).
    pub headers: Vec<(String, String)>,
}

/// Upgrade headers kept per link at most.
pub const MAX_HEADERS: usize = 64;

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
    /// A TCP peer that stops answering (its host gone, the network cut)
    /// is given up after about this long, so the link ends instead of
    /// hanging half-open: TCP keepalive probes while the link is idle,
    /// `TCP_USER_TIMEOUT` (Linux) bounding how long the peer may stay
    /// silent. It covers
    /// a peer that sends no keepalives of its own (a KubeEdge cloud).
    /// Zero leaves the kernel's defaults (hours).
    pub dead_peer_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_frame: DEFAULT_MAX_FRAME,
            connect_timeout: Duration::from_secs(10),
            handshake_timeout: Duration::from_secs(10),
            send_queue: 1024,
            dead_peer_timeout: Duration::from_secs(30),
        }
    }
}

/// Shared by both halves: set once the link is closed, for any reason.
struct LinkState {
    /// For waiting until the link closes.
    closed: watch::Sender<bool>,
    /// The same, for the per-frame check: a plain load, where borrowing
    /// the watch takes a lock every sender and the writer contend for.
    is_closed: AtomicBool,
}

impl LinkState {
    fn close(&self) {
        self.is_closed.store(true, Ordering::Release);
        self.closed.send_replace(true);
    }

    fn is_closed(&self) -> bool {
        self.is_closed.load(Ordering::Acquire)
    }
}

/// Frames waiting for the writer. Senders push under a short lock; the
/// writer swaps the whole batch out, so a frame costs one lock and a push.
///
/// The lock and the writer's per-frame counters sit on cache lines of
/// their own: sharing one, every counted frame took the line from the
/// sending core and every push took it back (8 % of a 256 B run's time
/// went to that lock).
struct Outbox {
    queue: CachePadded<Mutex<Queued>>,
    /// Wakes the writer when the queue becomes non-empty or closing.
    wake_writer: Notify,
    /// Wakes senders waiting for room.
    room: Notify,
    capacity: usize,
    /// What the writer looks at or counts per frame.
    writer: CachePadded<WriterSide>,
}

/// The writer's per-frame state.
#[derive(Default)]
struct WriterSide {
    /// A liveness probe is asked for (see [`LinkSender::ping`]). Outside
    /// the lock: the writer looks at it before every frame, so a ping goes
    /// ahead of whatever is still queued.
    ping: AtomicBool,
    /// Frames handed to the connection so far; only the writer stores it.
    written: AtomicU64,
}

impl Outbox {
    /// Takes a pending ping request.
    fn take_ping(&self) -> bool {
        let ping = &self.writer.ping;
        ping.load(Ordering::Relaxed) && ping.swap(false, Ordering::AcqRel)
    }
}

#[derive(Default)]
struct Queued {
    frames: Vec<(Bytes, Lane)>,
    /// Frames of inner streams, written when `frames` is empty.
    streams: StreamFrames,
    /// No more frames will come: close once these are written.
    closing: bool,
    /// Some sender waits for room.
    waiting: bool,
    /// Frames ever queued (see [`LinkSender::backlog`]).
    pushed: u64,
}

/// Frames of a link's inner streams waiting to be written: each stream's
/// in order, the streams taking turns (round robin by id).
#[derive(Default)]
struct StreamFrames {
    by_stream: std::collections::BTreeMap<u64, std::collections::VecDeque<Bytes>>,
    len: usize,
    /// The id whose turn is next (or the first one after it).
    next: u64,
}

impl StreamFrames {
    fn push(&mut self, id: u64, frame: Bytes) {
        self.by_stream.entry(id).or_default().push_back(frame);
        self.len += 1;
    }

    /// The next frame in turn.
    fn pop(&mut self) -> Option<(u64, Bytes)> {
        let id = match self.by_stream.range(self.next..).next() {
            Some((id, _)) => *id,
            None => *self.by_stream.keys().next()?,
        };
        let frames = self.by_stream.get_mut(&id)?;
        let frame = frames.pop_front()?;
        if frames.is_empty() {
            self.by_stream.remove(&id);
        }
        self.len -= 1;
        self.next = id.wrapping_add(1);
        Some((id, frame))
    }
}

impl Outbox {
    fn lock(&self) -> std::sync::MutexGuard<'_, Queued> {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn finish(&self) {
        self.lock().closing = true;
        self.wake_writer.notify_one();
    }
}

/// Closes the outbox when the last [`LinkSender`] clone is dropped.
struct SenderGuard {
    outbox: Arc<Outbox>,
}

impl Drop for SenderGuard {
    fn drop(&mut self) {
        self.outbox.finish();
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
/// called, when the peer goes away, when the receiver is dropped, or when
/// every sender is dropped (after what was queued has been written).
#[derive(Clone)]
pub struct LinkSender {
    outbox: Arc<SenderGuard>,
    max_frame: usize,
    codec: Codec,
    state: Arc<LinkState>,
    pings: bool,
}

impl LinkSender {
    /// Sends a message on the ordered lane. Returns once it is queued for
    /// the socket; waits while the send queue is full.
    pub async fn send(&self, msg: &Message) -> Result<(), TransportError> {
        self.send_on(msg, Lane::Ordered).await
    }

    /// Sends a message on `lane`.
    pub async fn send_on(&self, msg: &Message, lane: Lane) -> Result<(), TransportError> {
        let frame = self.codec.encode(msg, self.max_frame)?;
        self.send_frame(frame, lane).await
    }

    /// Sends an already encoded frame payload (encode once, send to many).
    pub async fn send_frame(&self, frame: Bytes, lane: Lane) -> Result<(), TransportError> {
        self.check_size(&frame)?;
        // Room, as nearly always: queued without setting up a wait.
        let Some(mut frame) = self.offer((frame, lane), None)? else {
            return Ok(());
        };
        loop {
            let room = self.outbox.outbox.room.notified();
            let mut room = std::pin::pin!(room);
            match self.offer(frame, Some(room.as_mut()))? {
                None => return Ok(()),
                Some(back) => frame = back,
            }
            tokio::select! {
                _ = &mut room => {}
                _ = self.closed() => return Err(TransportError::Closed),
            }
        }
    }

    /// Queues a message without waiting (encoded within this link's frame
    /// limit): [`TransportError::QueueFull`] when the send queue is full.
    pub fn try_send(&self, msg: &Message, lane: Lane) -> Result<(), TransportError> {
        let frame = self.codec.encode(msg, self.max_frame)?;
        self.try_send_frame(frame, lane)
    }

    /// Queues a frame without waiting: [`TransportError::QueueFull`] when the
    /// send queue is full (for callers that cannot wait, such as actors).
    pub fn try_send_frame(&self, frame: Bytes, lane: Lane) -> Result<(), TransportError> {
        self.check_size(&frame)?;
        match self.offer((frame, lane), None)? {
            None => Ok(()),
            Some(_) => Err(TransportError::QueueFull),
        }
    }

    fn check_size(&self, frame: &Bytes) -> Result<(), TransportError> {
        if frame.len() > self.max_frame {
            return Err(FrameError::TooLarge {
                len: frame.len(),
                max: self.max_frame,
            }
            .into());
        }
        Ok(())
    }

    /// Queues the frame if there is room, else hands it back. A given
    /// `room` waiter is enabled while the lock is held, so the writer's
    /// wake-up after taking the batch cannot be missed.
    fn offer(
        &self,
        frame: (Bytes, Lane),
        room: Option<std::pin::Pin<&mut tokio::sync::futures::Notified<'_>>>,
    ) -> Result<Option<(Bytes, Lane)>, TransportError> {
        let outbox = &self.outbox.outbox;
        let mut queued = outbox.lock();
        if queued.closing || self.is_closed() {
            return Err(TransportError::Closed);
        }
        let full = match frame.1 {
            Lane::Stream(_) => queued.streams.len >= outbox.capacity,
            _ => queued.frames.len() >= outbox.capacity,
        };
        if full {
            if let Some(room) = room {
                queued.waiting = true;
                room.enable();
            }
            return Ok(Some(frame));
        }
        match frame {
            (frame, Lane::Stream(id)) => queued.streams.push(id, frame),
            frame => queued.frames.push(frame),
        }
        queued.pushed += 1;
        let first = queued.frames.len() + queued.streams.len == 1;
        drop(queued);
        if first {
            outbox.wake_writer.notify_one();
        }
        Ok(None)
    }

    /// Whether this link can probe its peer with [`Self::ping`]: WebSocket
    /// links can (the peer's WebSocket layer answers a ping with a pong, even
    /// when its application sends nothing); QUIC and Unix sockets cannot.
    pub fn can_ping(&self) -> bool {
        self.pings
    }

    /// Asks the peer for a sign of life: a WebSocket ping, written next,
    /// ahead of the frames still queued (frames sent after it follow it).
    /// Its pong is counted by [`LinkReceiver::pongs`]. A peer whose process
    /// is frozen while its kernel still keeps the connection never answers.
    /// Does nothing on links that cannot ping.
    pub fn ping(&self) -> Result<(), TransportError> {
        if !self.pings {
            return Ok(());
        }
        if self.is_closed() {
            return Err(TransportError::Closed);
        }
        let outbox = &self.outbox.outbox;
        outbox.writer.ping.store(true, Ordering::Release);
        outbox.wake_writer.notify_one();
        Ok(())
    }

    /// The largest frame this link sends.
    pub fn max_frame(&self) -> usize {
        self.max_frame
    }

    /// Frames queued and not yet written (inner streams' included).
    pub fn queued(&self) -> usize {
        let queued = self.outbox.outbox.lock();
        queued.frames.len() + queued.streams.len
    }

    /// Frames handed to the connection so far. While a [`Self::backlog`]
    /// waits, its growth shows the peer's end taking data, which a ping
    /// stuck behind that backlog cannot.
    pub fn written(&self) -> u64 {
        self.outbox.outbox.writer.written.load(Ordering::Relaxed)
    }

    /// Frames sent or queued and not yet handed to the connection, the
    /// writer's current round included.
    pub fn backlog(&self) -> u64 {
        let outbox = &self.outbox.outbox;
        let pushed = outbox.lock().pushed;
        pushed.saturating_sub(outbox.writer.written.load(Ordering::Relaxed))
    }

    /// Closes the link after what is already queued has been written.
    pub async fn close(&self) {
        self.outbox.outbox.finish();
        self.closed().await;
    }

    /// Whether the link is closed.
    pub fn is_closed(&self) -> bool {
        self.state.is_closed()
    }

    /// Completes when the link is closed.
    pub async fn closed(&self) {
        let mut closed = self.state.closed.subscribe();
        let _ = closed.wait_for(|closed| *closed).await;
    }
}

/// The receiving half of a link. It reads the connection itself, in the
/// task that calls [`LinkReceiver::recv`]: no hop through another task, and
/// decoding runs beside the sending side's writer. `recv` is cancel-safe.
pub struct LinkReceiver {
    codec: Codec,
    source: Box<dyn FrameSource>,
    state: Arc<LinkState>,
    peer: String,
    ended: bool,
}

impl LinkReceiver {
    /// The next message; `Some(Err(..))` once when the peer sent something
    /// unacceptable (the link is then closed); `None` once the link is closed.
    pub async fn recv(&mut self) -> Option<Result<Message, TransportError>> {
        loop {
            let frame = match self.recv_frame().await? {
                Ok(frame) => frame,
                Err(err) => return Some(Err(err)),
            };
            match self.codec.decode(&frame) {
                Ok(msg) => return Some(Ok(msg)),
                Err(err) => {
                    if let Some(ended) = self.refuse(&frame, err) {
                        return Some(Err(ended));
                    }
                }
            }
        }
    }

    /// A frame that does not decode: passed over if it carries nothing
    /// ([`Codec::is_nothing`], judged only then, so a message is parsed
    /// once), else the link ends with `err`.
    fn refuse(&mut self, frame: &[u8], err: FrameError) -> Option<TransportError> {
        if self.codec.is_nothing(frame) {
            debug!(peer = %self.peer, "an empty message passed over (a KubeEdge peer shutting down sends one)");
            return None;
        }
        warn!(peer = %self.peer, error = %err, "closing link");
        self.end();
        Some(err.into())
    }

    /// The next message or raw frame (see [`RAW_FRAME_MARKER`]); the same
    /// end-of-link rules as [`Self::recv`].
    pub async fn recv_item(&mut self) -> Option<Result<Received, TransportError>> {
        loop {
            let frame = match self.recv_frame().await? {
                Ok(frame) => frame,
                Err(err) => return Some(Err(err)),
            };
            if frame.first() == Some(&RAW_FRAME_MARKER) {
                return Some(Ok(Received::Raw(frame)));
            }
            match self.codec.decode(&frame) {
                Ok(msg) => return Some(Ok(Received::Message(msg))),
                Err(err) => {
                    if let Some(ended) = self.refuse(&frame, err) {
                        return Some(Err(ended));
                    }
                }
            }
        }
    }

    /// The next frame payload, undecoded (for relaying without decoding, or
    /// a codec of the caller's own). Same end-of-link rules as [`Self::recv`].
    pub async fn recv_frame(&mut self) -> Option<Result<Bytes, TransportError>> {
        if self.ended {
            return None;
        }
        let next = std::future::poll_fn(|cx| self.source.poll_frame(cx)).await;
        match next {
            Ok(Some(frame)) => Some(Ok(frame)),
            Ok(None) => {
                debug!(peer = %self.peer, "peer closed the link");
                self.end();
                None
            }
            Err(err) => {
                warn!(peer = %self.peer, error = %err, "closing link");
                self.end();
                Some(Err(err))
            }
        }
    }

    /// Closes the link from the receiving side (e.g. the peer sent
    /// something unacceptable); later calls return `None`.
    pub fn end(&mut self) {
        self.ended = true;
        self.state.close();
    }

    /// Whether the link is closed (messages may still wait to be received).
    pub fn is_closed(&self) -> bool {
        self.state.is_closed()
    }

    /// Pongs received so far, answers to [`LinkSender::ping`]. They arrive
    /// while [`Self::recv`] is being awaited; zero on links that cannot ping.
    pub fn pongs(&self) -> u64 {
        self.source.pongs()
    }
}

impl Drop for LinkReceiver {
    fn drop(&mut self) {
        // Nobody reads any more: the writer closes the connection too.
        self.state.close();
    }
}

/// Where a link's receiver gets frame payloads from.
pub(crate) trait FrameSource: Send + 'static {
    /// The next frame payload, or `Ok(None)` at a clean end of stream.
    fn poll_frame(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<Option<Bytes>, TransportError>>;
    /// Pongs received so far (transports that have pings).
    fn pongs(&self) -> u64 {
        0
    }
}

/// Where a link's writer puts frame payloads.
pub(crate) trait FrameSink: Send + 'static {
    /// Whether [`Self::ping`] reaches the peer.
    const PINGS: bool = false;
    /// The writer is about to write `frames`, so a sink that copies them
    /// can size its buffer once.
    fn expect(&mut self, _frames: &[(Bytes, Lane)]) {}
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
    /// Sends a liveness probe, where the transport has one.
    fn ping(&mut self) -> impl Future<Output = Result<(), TransportError>> + Send {
        async { Ok(()) }
    }
}

/// Starts the writer task of a connection and hands out both halves.
pub(crate) fn spawn_link<S: FrameSource, K: FrameSink>(
    peer: PeerIdentity,
    source: S,
    sink: K,
    limits: &Limits,
    codec: Codec,
) -> Link {
    let (closed, _) = watch::channel(false);
    let state = Arc::new(LinkState {
        closed,
        is_closed: AtomicBool::new(false),
    });
    let outbox = Arc::new(Outbox {
        queue: CachePadded::new(Mutex::new(Queued::default())),
        wake_writer: Notify::new(),
        room: Notify::new(),
        capacity: limits.send_queue.max(1),
        writer: CachePadded::default(),
    });
    tokio::spawn(write_loop(
        sink,
        outbox.clone(),
        state.clone(),
        peer.remote.clone(),
    ));
    Link {
        sender: LinkSender {
            outbox: Arc::new(SenderGuard { outbox }),
            max_frame: limits.max_frame,
            codec,
            state: state.clone(),
            pings: K::PINGS,
        },
        receiver: LinkReceiver {
            codec,
            source: Box::new(source),
            state,
            peer: peer.remote.clone(),
            ended: false,
        },
        peer,
    }
}

async fn write_loop<K: FrameSink>(
    mut sink: K,
    outbox: Arc<Outbox>,
    state: Arc<LinkState>,
    peer: String,
) {
    let mut closed = state.closed.subscribe();
    let mut batch = Vec::new();
    loop {
        let closing = {
            let mut queued = outbox.lock();
            std::mem::swap(&mut queued.frames, &mut batch);
            // An inner stream's frame only when no message waits: one,
            // then the messages queued meanwhile go first.
            if batch.is_empty()
                && let Some((id, frame)) = queued.streams.pop()
            {
                batch.push((frame, Lane::Stream(id)));
            }
            if std::mem::take(&mut queued.waiting) {
                outbox.room.notify_waiters();
            }
            queued.closing
        };
        let ping = outbox.take_ping();
        if batch.is_empty() && !ping {
            if closing {
                break;
            }
            tokio::select! {
                _ = outbox.wake_writer.notified() => continue,
                _ = closed.wait_for(|closed| *closed) => break,
            }
        }
        sink.expect(&batch);
        let write = async {
            if ping {
                sink.ping().await?;
            }
            for (frame, lane) in batch.drain(..) {
                if outbox.take_ping() {
                    sink.ping().await?;
                }
                sink.write_frame(frame, lane).await?;
                // The only store: a plain one, no locked add per frame.
                let counter = &outbox.writer.written;
                counter.store(counter.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
            }
            sink.flush().await
        };
        // A peer that stops reading must not keep this task (and its
        // socket) once the link is closed for another reason.
        let written = tokio::select! {
            written = write => written,
            _ = closed.wait_for(|closed| *closed) => break,
        };
        if let Err(err) = written {
            warn!(%peer, error = %err, "write failed, closing link");
            break;
        }
    }
    batch.clear();
    outbox.lock().closing = true;
    outbox.room.notify_waiters();
    state.close();
    // Best effort: a peer that reads nothing gets no more than this.
    let _ = tokio::time::timeout(CLOSE_TIMEOUT, sink.close()).await;
}

/// How long a graceful close may take before the connection is dropped.
const CLOSE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);
