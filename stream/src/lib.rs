//! Streams inside a node's link: a container's log, a terminal, a
//! forwarded port, a metrics scrape, opened by the cloud, served by the
//! edge, many at once, each with its own flow control. KubeEdge's
//! `pkg/stream` and its tunnel, shared the same way: cloudstream (the
//! cloud's kubelet API) opens streams, edgestream (edged) serves them, and
//! the hubs only carry the tunnel on a node's link.
//!
//! - Frames are raw link frames ([`frame`]) on the link's inner-stream
//!   lane ([`transports::Lane::Stream`]): written only when no message
//!   waits, streams taking turns, so a large log or a stalled terminal
//!   never delays object delivery or keepalives.
//! - Each direction of a stream has a window ([`window`], 256 KiB): the
//!   sender waits for credit, which the receiver gives back as its
//!   consumer takes the bytes. A consumer that stops reading stops its
//!   stream's sender, and nothing else.
//! - Only the cloud opens streams; the edge answers each with accept or a
//!   refusal ([`StreamHandler`]), and refuses streams the cloud sent it
//!   in a role it does not have. A link that ends ends every stream on it,
//!   on both sides, with [`StreamError::LinkLost`].
//!
//! One concern: the tunnel that carries many streams over a node's link, on
//! the cloud's side and the edge's; its frames and windows are in `frame`
//! and `window`.

pub mod frame;
pub mod window;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::{Semaphore, mpsc, oneshot};
use tracing::debug;
use transports::{Lane, LinkSender};

use frame::Frame;
use window::ReceiveWindow;

/// What each side of a stream may have in flight, per direction.
pub const WINDOW: u32 = 256 * 1024;

/// The most bytes one DATA frame carries.
pub const MAX_DATA: usize = 32 * 1024;

/// Streams open at once on one link, at most (the edge refuses more).
pub const MAX_STREAMS: usize = 128;

/// Why a stream could not be opened, or ended badly.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StreamError {
    /// The node has no link to this cloud (or to this replica).
    #[error("node {0} is not linked to this cloud")]
    NotLinked(String),
    /// The node refused the stream.
    #[error("refused by the node: {0}")]
    Refused(String),
    /// The link the stream travelled on ended.
    #[error("the link to the node was lost")]
    LinkLost,
    /// The other side closed the stream with an error.
    #[error("{0}")]
    Closed(String),
    /// The node did not answer the opening in time.
    #[error("the node did not answer within {0:?}")]
    Timeout(Duration),
    /// The other side broke the stream's protocol (sent beyond its
    /// window, or a frame out of place).
    #[error("protocol: {0}")]
    Protocol(String),
}

/// What a stream's reader gets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Chunk {
    /// Bytes on a channel.
    Data(u8, Bytes),
    /// The other side sends no more on this channel.
    End(u8),
}

/// Serves the streams the cloud opens (the edge's side).
pub trait StreamHandler: Send + Sync + 'static {
    /// A stream was opened with `request`: accept it (and serve it) or
    /// refuse it, without blocking (spawn what takes time).
    fn open(&self, request: Bytes, stream: PendingStream);
}

/// What a stream's slot holds, shared by the tunnel and the stream.
struct Slot {
    id: u64,
    /// To the stream's reader.
    incoming: mpsc::UnboundedSender<Incoming>,
    /// The send window: bytes this side may still send.
    credit: Semaphore,
    window: Mutex<ReceiveWindow>,
    /// The cloud's opening, waiting for the node's answer.
    answer: Mutex<Option<oneshot::Sender<Result<(), StreamError>>>>,
}

enum Incoming {
    Chunk(Chunk),
    Closed(Result<(), StreamError>),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    Cloud,
    Edge,
}

/// The tunnel of one link, one side (cloneable: clones share it).
#[derive(Clone)]
pub struct Tunnel {
    inner: Arc<Inner>,
}

struct Inner {
    role: Role,
    sender: LinkSender,
    streams: Mutex<HashMap<u64, Arc<Slot>>>,
    next_id: AtomicU64,
    lost: AtomicBool,
    handler: Option<Arc<dyn StreamHandler>>,
    /// Streams opened (the cloud) or accepted (the edge) so far.
    opened: AtomicU64,
}

impl Inner {
    fn slots(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<Slot>>> {
        self.streams.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Queues a control frame; a full queue ends the stream (its peer
    /// would wait for it forever).
    fn control(&self, frame: Frame) {
        let id = frame.id();
        if self
            .sender
            .try_send_frame(frame.encode(), Lane::Stream(id))
            .is_err()
        {
            self.end(id, Err(StreamError::LinkLost), false);
        }
    }

    /// Ends stream `id` here: its reader learns `how`; the peer is told
    /// (`tell`) unless it ended it.
    fn end(&self, id: u64, how: Result<(), StreamError>, tell: bool) {
        let Some(slot) = self.slots().remove(&id) else {
            return;
        };
        slot.credit.close();
        if let Some(answer) = slot
            .answer
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
        {
            let _ = answer.send(Err(how.clone().err().unwrap_or(StreamError::Closed(
                "closed before it was answered".to_owned(),
            ))));
        }
        if tell {
            let reason = match &how {
                Ok(()) => String::new(),
                // The other side says what it is, from its own point of view.
                Err(StreamError::Refused(reason) | StreamError::Closed(reason)) => reason.clone(),
                Err(err) => err.to_string(),
            };
            let _ = self
                .sender
                .try_send_frame(Frame::Close { id, reason }.encode(), Lane::Stream(id));
        }
        let _ = slot.incoming.send(Incoming::Closed(how));
    }

    fn new_slot(&self, id: u64) -> (Arc<Slot>, mpsc::UnboundedReceiver<Incoming>) {
        let (incoming, receiver) = mpsc::unbounded_channel();
        let slot = Arc::new(Slot {
            id,
            incoming,
            credit: Semaphore::new(WINDOW as usize),
            window: Mutex::new(ReceiveWindow::new(WINDOW)),
            answer: Mutex::new(None),
        });
        (slot, receiver)
    }
}

impl Tunnel {
    /// The cloud's side of a link's tunnel: it opens streams.
    pub fn for_cloud(sender: LinkSender) -> Tunnel {
        Tunnel::new(Role::Cloud, sender, None)
    }

    /// The edge's side: `handler` serves the streams the cloud opens (none:
    /// every stream is refused).
    pub fn for_edge(sender: LinkSender, handler: Option<Arc<dyn StreamHandler>>) -> Tunnel {
        Tunnel::new(Role::Edge, sender, handler)
    }

    fn new(role: Role, sender: LinkSender, handler: Option<Arc<dyn StreamHandler>>) -> Tunnel {
        Tunnel {
            inner: Arc::new(Inner {
                role,
                sender,
                streams: Mutex::new(HashMap::new()),
                next_id: AtomicU64::new(1),
                lost: AtomicBool::new(false),
                handler,
                opened: AtomicU64::new(0),
            }),
        }
    }

    /// Streams open now.
    pub fn open_streams(&self) -> usize {
        self.inner.slots().len()
    }

    /// Streams opened (the cloud) or accepted (the edge) so far.
    pub fn opened(&self) -> u64 {
        self.inner.opened.load(Ordering::Relaxed)
    }

    /// Opens a stream carrying `request` to the node (the cloud's side),
    /// once the node accepts it (within `timeout`).
    pub async fn open(
        &self,
        request: Bytes,
        timeout: Duration,
    ) -> Result<TunnelStream, StreamError> {
        let inner = &self.inner;
        if inner.role != Role::Cloud {
            return Err(StreamError::Protocol(
                "only the cloud opens streams".to_owned(),
            ));
        }
        if inner.lost.load(Ordering::Acquire) {
            return Err(StreamError::LinkLost);
        }
        let id = inner.next_id.fetch_add(1, Ordering::Relaxed);
        let (slot, incoming) = inner.new_slot(id);
        let (answer, answered) = oneshot::channel();
        *slot.answer.lock().unwrap_or_else(PoisonError::into_inner) = Some(answer);
        inner.slots().insert(id, slot.clone());
        let stream = TunnelStream {
            tunnel: self.clone(),
            slot,
            incoming,
            done: false,
        };
        let sent = inner
            .sender
            .send_frame(Frame::Open { id, request }.encode(), Lane::Stream(id))
            .await;
        if sent.is_err() {
            inner.end(id, Err(StreamError::LinkLost), false);
            return Err(StreamError::LinkLost);
        }
        match tokio::time::timeout(timeout, answered).await {
            Ok(Ok(Ok(()))) => {
                inner.opened.fetch_add(1, Ordering::Relaxed);
                Ok(stream)
            }
            Ok(Ok(Err(err))) => Err(err),
            Ok(Err(_)) => Err(StreamError::LinkLost),
            Err(_) => {
                inner.end(id, Err(StreamError::Timeout(timeout)), true);
                Err(StreamError::Timeout(timeout))
            }
        }
    }

    /// A raw frame from the link: handled at once, never waiting.
    pub fn received(&self, raw: &Bytes) {
        let inner = &self.inner;
        let frame = match Frame::decode(raw) {
            Ok(frame) => frame,
            Err(err) => {
                // One bad frame: no stream can be trusted to be in step.
                debug!(error = %err, "bad tunnel frame; every stream of the link ends");
                return self.ended(StreamError::Protocol(err.to_string()));
            }
        };
        let id = frame.id();
        let slot = inner.slots().get(&id).cloned();
        match (frame, slot) {
            (Frame::Open { request, .. }, None) if inner.role == Role::Edge => {
                self.serve(id, request)
            }
            (Frame::Open { .. }, _) => {
                let reason = match inner.role {
                    Role::Cloud => "only the cloud opens streams",
                    Role::Edge => "a stream of that id is open",
                };
                inner.control(Frame::Close {
                    id,
                    reason: reason.to_owned(),
                });
            }
            (Frame::Accept { .. }, Some(slot)) if inner.role == Role::Cloud => {
                let answer = slot
                    .answer
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .take();
                if let Some(answer) = answer {
                    let _ = answer.send(Ok(()));
                }
            }
            (Frame::Data { bytes, channel, .. }, Some(slot)) => {
                let fits = slot
                    .window
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .received(bytes.len());
                match fits {
                    Ok(()) => {
                        let _ = slot
                            .incoming
                            .send(Incoming::Chunk(Chunk::Data(channel, bytes)));
                    }
                    Err(overrun) => {
                        inner.end(id, Err(StreamError::Protocol(overrun.to_string())), true)
                    }
                }
            }
            (Frame::End { channel, .. }, Some(slot)) => {
                let _ = slot.incoming.send(Incoming::Chunk(Chunk::End(channel)));
            }
            (Frame::Credit { bytes, .. }, Some(slot)) => {
                let total = slot.credit.available_permits() + bytes as usize;
                if total > WINDOW as usize {
                    inner.end(
                        id,
                        Err(StreamError::Protocol("credit beyond the window".to_owned())),
                        true,
                    );
                } else {
                    slot.credit.add_permits(bytes as usize);
                }
            }
            (Frame::Close { reason, .. }, Some(_)) => {
                let how = match reason.is_empty() {
                    true => Ok(()),
                    false => Err(match inner.role {
                        // The node's answer to an opening it refused.
                        Role::Cloud => StreamError::Refused(reason),
                        Role::Edge => StreamError::Closed(reason),
                    }),
                };
                inner.end(id, how, false);
            }
            // Frames of a stream already ended here (in flight when it
            // ended), or an answer out of place: nothing to do.
            (frame, _) => debug!(id, ?frame, "tunnel frame for no open stream ignored"),
        }
    }

    /// The edge's side: a stream the cloud opened.
    fn serve(&self, id: u64, request: Bytes) {
        let inner = &self.inner;
        let Some(handler) = inner.handler.clone() else {
            return inner.control(Frame::Close {
                id,
                reason: "this node serves no streams".to_owned(),
            });
        };
        if inner.slots().len() >= MAX_STREAMS {
            return inner.control(Frame::Close {
                id,
                reason: format!("too many streams open on this node's link ({MAX_STREAMS})"),
            });
        }
        let (slot, incoming) = inner.new_slot(id);
        inner.slots().insert(id, slot.clone());
        handler.open(
            request,
            PendingStream {
                stream: Some(TunnelStream {
                    tunnel: self.clone(),
                    slot,
                    incoming,
                    done: false,
                }),
            },
        );
    }

    /// The link ended: every stream on it ends with `why`.
    pub fn ended(&self, why: StreamError) {
        let inner = &self.inner;
        inner.lost.store(true, Ordering::Release);
        let ids: Vec<u64> = inner.slots().keys().copied().collect();
        for id in ids {
            inner.end(id, Err(why.clone()), false);
        }
    }

    /// The link ended: every stream on it ends with
    /// [`StreamError::LinkLost`].
    pub fn link_lost(&self) {
        self.ended(StreamError::LinkLost);
    }

    /// Ends every stream (as [`Tunnel::link_lost`]) when dropped: held by
    /// whatever reads the link, however it stops.
    pub fn end_on_drop(&self) -> EndOnDrop {
        EndOnDrop(self.clone())
    }
}

/// See [`Tunnel::end_on_drop`].
pub struct EndOnDrop(Tunnel);

impl Drop for EndOnDrop {
    fn drop(&mut self) {
        self.0.link_lost();
    }
}

/// A stream the cloud opened, not answered yet (the edge's side). Dropped
/// unanswered, it is refused.
pub struct PendingStream {
    stream: Option<TunnelStream>,
}

impl PendingStream {
    /// Serves it.
    pub fn accept(mut self) -> Result<TunnelStream, StreamError> {
        let stream = self
            .stream
            .take()
            .ok_or_else(|| StreamError::Protocol("answered twice".to_owned()))?;
        let inner = &stream.tunnel.inner;
        inner
            .sender
            .try_send_frame(
                Frame::Accept { id: stream.slot.id }.encode(),
                Lane::Stream(stream.slot.id),
            )
            .map_err(|_| StreamError::LinkLost)?;
        inner.opened.fetch_add(1, Ordering::Relaxed);
        Ok(stream)
    }

    /// Refuses it, saying why.
    pub fn refuse(mut self, reason: &str) {
        if let Some(mut stream) = self.stream.take() {
            stream.close_with(Err(StreamError::Refused(reason.to_owned())));
        }
    }
}

impl Drop for PendingStream {
    fn drop(&mut self) {
        if let Some(mut stream) = self.stream.take() {
            stream.close_with(Err(StreamError::Refused("not served".to_owned())));
        }
    }
}

/// One open stream: channels of bytes both ways. Reading takes `&mut`;
/// [`TunnelStream::writer`] gives a handle to write from another task.
pub struct TunnelStream {
    tunnel: Tunnel,
    slot: Arc<Slot>,
    incoming: mpsc::UnboundedReceiver<Incoming>,
    done: bool,
}

/// Writes to a stream (cloneable; the stream's reader is elsewhere).
#[derive(Clone)]
pub struct StreamWriter {
    tunnel: Tunnel,
    slot: Arc<Slot>,
}

impl StreamWriter {
    /// Sends `bytes` on `channel`, waiting for credit (the other side's
    /// consumer taking what came before).
    pub async fn send(&self, channel: u8, bytes: Bytes) -> Result<(), StreamError> {
        let id = self.slot.id;
        let mut rest = bytes;
        loop {
            let chunk = rest.split_to(rest.len().min(MAX_DATA));
            let permits = self
                .slot
                .credit
                .acquire_many(chunk.len() as u32)
                .await
                .map_err(|_| self.why_ended())?;
            permits.forget();
            let frame = Frame::Data {
                id,
                channel,
                bytes: chunk,
            };
            self.tunnel
                .inner
                .sender
                .send_frame(frame.encode(), Lane::Stream(id))
                .await
                .map_err(|_| StreamError::LinkLost)?;
            if rest.is_empty() {
                return Ok(());
            }
        }
    }

    /// Says that nothing more comes on `channel` (stdin's end of file).
    pub async fn end(&self, channel: u8) -> Result<(), StreamError> {
        if self.slot.credit.is_closed() {
            return Err(self.why_ended());
        }
        let id = self.slot.id;
        self.tunnel
            .inner
            .sender
            .send_frame(Frame::End { id, channel }.encode(), Lane::Stream(id))
            .await
            .map_err(|_| StreamError::LinkLost)
    }

    fn why_ended(&self) -> StreamError {
        match self.tunnel.inner.lost.load(Ordering::Acquire) {
            true => StreamError::LinkLost,
            false => StreamError::Closed("the stream is closed".to_owned()),
        }
    }
}

impl TunnelStream {
    /// A handle to write to this stream from another task.
    pub fn writer(&self) -> StreamWriter {
        StreamWriter {
            tunnel: self.tunnel.clone(),
            slot: self.slot.clone(),
        }
    }

    /// Sends `bytes` on `channel` (see [`StreamWriter::send`]).
    pub async fn send(&self, channel: u8, bytes: Bytes) -> Result<(), StreamError> {
        self.writer().send(channel, bytes).await
    }

    /// The next chunk; `None` once the stream ended cleanly; an error once
    /// if it ended otherwise (the link lost, the other side's error).
    pub async fn recv(&mut self) -> Option<Result<Chunk, StreamError>> {
        if self.done {
            return None;
        }
        match self.incoming.recv().await {
            Some(Incoming::Chunk(chunk)) => {
                if let Chunk::Data(_, bytes) = &chunk {
                    let grant = self
                        .slot
                        .window
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .taken(bytes.len());
                    if let Some(bytes) = grant {
                        self.tunnel.inner.control(Frame::Credit {
                            id: self.slot.id,
                            bytes,
                        });
                    }
                }
                Some(Ok(chunk))
            }
            Some(Incoming::Closed(how)) => {
                self.done = true;
                how.err().map(Err)
            }
            None => {
                self.done = true;
                Some(Err(StreamError::LinkLost))
            }
        }
    }

    /// Ends the stream cleanly (the other side reads its end).
    pub fn close(mut self) {
        self.close_with(Ok(()));
    }

    /// Ends the stream with an error the other side reads.
    pub fn fail(mut self, reason: &str) {
        self.close_with(Err(StreamError::Closed(reason.to_owned())));
    }

    fn close_with(&mut self, how: Result<(), StreamError>) {
        self.done = true;
        self.tunnel.inner.end(self.slot.id, how, true);
    }
}

impl Drop for TunnelStream {
    fn drop(&mut self) {
        // Ends it here and at the other side, if still open.
        self.tunnel.inner.end(self.slot.id, Ok(()), true);
    }
}

/// The tunnels of the nodes linked to this cloud (this replica), by node:
/// where the cloud opens streams to them (cloneable; clones share it).
#[derive(Clone, Default)]
pub struct NodeTunnels {
    by_node: Arc<Mutex<HashMap<String, (u64, Tunnel)>>>,
    /// Nodes linked in KubeEdge's dialect (no tunnel inside their link),
    /// by session.
    kubeedge: Arc<Mutex<HashMap<String, u64>>>,
}

impl NodeTunnels {
    fn nodes(&self) -> std::sync::MutexGuard<'_, HashMap<String, (u64, Tunnel)>> {
        self.by_node.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// `node`'s session `session` is up, with `tunnel` (cloudhub says so
    /// as sessions come and go).
    pub fn linked(&self, node: &str, session: u64, tunnel: Tunnel) {
        self.nodes().insert(node.to_owned(), (session, tunnel));
    }

    /// `node`'s session `session` is up in KubeEdge's dialect: its link
    /// carries no streams (a KubeEdge edgecore's streams come through its
    /// own edgestream tunnel, if it has one).
    pub fn linked_kubeedge(&self, node: &str, session: u64) {
        self.kubeedge_nodes().insert(node.to_owned(), session);
    }

    fn kubeedge_nodes(&self) -> std::sync::MutexGuard<'_, HashMap<String, u64>> {
        self.kubeedge.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether `node` is linked here in KubeEdge's dialect.
    pub fn is_linked_kubeedge(&self, node: &str) -> bool {
        self.kubeedge_nodes().contains_key(node)
    }

    /// `node`'s session `session` ended (a newer one stays): its streams
    /// end with it.
    pub fn unlinked(&self, node: &str, session: u64) {
        {
            let mut kubeedge = self.kubeedge_nodes();
            if kubeedge.get(node) == Some(&session) {
                kubeedge.remove(node);
            }
        }
        let ended = {
            let mut nodes = self.nodes();
            match nodes
                .get(node)
                .is_some_and(|(current, _)| *current == session)
            {
                true => nodes.remove(node),
                false => None,
            }
        };
        if let Some((_, tunnel)) = ended {
            tunnel.link_lost();
        }
    }

    /// Whether `node` is linked here.
    pub fn is_linked(&self, node: &str) -> bool {
        self.nodes().contains_key(node)
    }

    /// Opens a stream to `node` carrying `request`, once the node accepts
    /// it (within `timeout`).
    pub async fn open(
        &self,
        node: &str,
        request: Bytes,
        timeout: Duration,
    ) -> Result<TunnelStream, StreamError> {
        let tunnel = self.nodes().get(node).map(|(_, tunnel)| tunnel.clone());
        match tunnel {
            Some(tunnel) => tunnel.open(request, timeout).await,
            None => Err(StreamError::NotLinked(node.to_owned())),
        }
    }

    /// Streams open now, on every node's link.
    pub fn open_streams(&self) -> usize {
        self.nodes()
            .values()
            .map(|(_, tunnel)| tunnel.open_streams())
            .sum()
    }
}
