//! The tunnels KubeEdge edgecores keep to this cloud, by node, and the
//! connections the kubelet API opens on them.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::mpsc;
use tracing::{debug, warn};

use super::codec::{self, EdgedRequest, Message, MessageType};

/// At most this many connections at once on one tunnel.
pub const MAX_CONNECTIONS: usize = 128;

/// Messages from the edge waiting for one connection's reader.
const CONNECTION_QUEUE: usize = 64;

/// How long the tunnel's reader waits for one connection's reader to take
/// a message before that connection is cut (it holds up every other).
const READER_PATIENCE: Duration = Duration::from_secs(10);

/// The most data the cloud puts in one message to the edge.
const CHUNK: usize = 32 * 1024;

/// Messages waiting to be written to the edge.
pub(crate) const OUTGOING_QUEUE: usize = 256;

/// Why a connection through a tunnel failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EdgeStreamError {
    /// No tunnel from this node.
    #[error("node {0} has no edgestream tunnel to this cloud")]
    NoTunnel(String),
    /// The tunnel holds [`MAX_CONNECTIONS`] already.
    #[error("node {0}'s edgestream tunnel holds {MAX_CONNECTIONS} connections already")]
    TooManyConnections(String),
    /// The tunnel ended (or the connection was cut) before the edge ended
    /// the connection.
    #[error("the edgestream tunnel to node {node} was lost: {reason}")]
    Lost {
        /// The node.
        node: String,
        /// Why.
        reason: String,
    },
}

/// What goes to the edge.
#[derive(Debug)]
pub(crate) enum Outgoing {
    /// A tunnel message, encoded.
    Message(Bytes),
    /// The answer to the edge's ping.
    Pong(Bytes),
    /// Closes the WebSocket.
    Close,
}

/// What a connection's reader gets from the tunnel's reader.
enum Incoming {
    Data(Bytes),
    Removed,
}

/// An open connection as the tunnel keeps it: its way in, and whether its
/// RemoveConnect went (KubeEdge's edge must get one only).
type OpenConnection = (mpsc::Sender<Incoming>, Arc<AtomicBool>);

/// One node's tunnel (the edge's WebSocket to the tunnel port).
pub struct TunnelSession {
    node: String,
    id: u64,
    outgoing: mpsc::Sender<Outgoing>,
    /// Each open connection's way in, and whether its RemoveConnect went.
    connections: Mutex<HashMap<u64, OpenConnection>>,
    next_id: AtomicU64,
    lost: Mutex<Option<String>>,
}

impl TunnelSession {
    pub(crate) fn new(node: &str, id: u64, outgoing: mpsc::Sender<Outgoing>) -> TunnelSession {
        TunnelSession {
            node: node.to_owned(),
            id,
            outgoing,
            connections: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
            lost: Mutex::new(None),
        }
    }

    /// The node whose tunnel this is.
    pub fn node(&self) -> &str {
        &self.node
    }

    fn connections(&self) -> std::sync::MutexGuard<'_, HashMap<u64, OpenConnection>> {
        self.connections
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn lost_reason(&self) -> Option<String> {
        self.lost
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn lost_error(&self, fallback: &str) -> EdgeStreamError {
        EdgeStreamError::Lost {
            node: self.node.clone(),
            reason: self.lost_reason().unwrap_or_else(|| fallback.to_owned()),
        }
    }

    /// Opens a connection of `kind` (an `XConnect` type) asking the edge
    /// to make `request` (its id is set here).
    pub async fn connect(
        self: &Arc<Self>,
        kind: MessageType,
        mut request: EdgedRequest,
    ) -> Result<EdgeConnection, EdgeStreamError> {
        let (sender, receiver) = mpsc::channel(CONNECTION_QUEUE);
        let removed = Arc::new(AtomicBool::new(false));
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        {
            // Checked with the connections held: `lose` takes the same lock
            // to clear them, so a connection is never added after a loss
            // (its opening would sit behind the close, its caller waiting).
            let mut connections = self.connections();
            if self.lost_reason().is_some() {
                drop(connections);
                return Err(self.lost_error("closed"));
            }
            if connections.len() >= MAX_CONNECTIONS {
                return Err(EdgeStreamError::TooManyConnections(self.node.clone()));
            }
            connections.insert(id, (sender, removed.clone()));
        }
        request.id = id;
        let connection = EdgeConnection {
            session: self.clone(),
            id,
            incoming: receiver,
            removed,
            ended: false,
        };
        let opening = Message::new(id, kind, request.to_json());
        self.send(Outgoing::Message(codec::encode(&opening)))
            .await?;
        debug!(node = %self.node, connection = id, ?kind, "edgestream connection opened");
        Ok(connection)
    }

    async fn send(&self, outgoing: Outgoing) -> Result<(), EdgeStreamError> {
        self.outgoing
            .send(outgoing)
            .await
            .map_err(|_| self.lost_error("closed"))
    }

    /// Hands a message from the edge to its connection.
    pub(crate) async fn dispatch(&self, message: Message) {
        let open = self.connections().get(&message.connect_id).cloned();
        let Some((sender, removed)) = open else {
            // A connection already ended here: what was in flight is dropped.
            debug!(node = %self.node, connection = message.connect_id, kind = ?message.kind, "a message for no open connection");
            return;
        };
        match message.kind {
            MessageType::Data => {
                match tokio::time::timeout(
                    READER_PATIENCE,
                    sender.send(Incoming::Data(message.data)),
                )
                .await
                {
                    Ok(Ok(())) => {}
                    // Its reader is gone: it ends itself.
                    Ok(Err(_)) => {}
                    Err(_) => {
                        warn!(node = %self.node, connection = message.connect_id, "a caller did not read for {READER_PATIENCE:?}: its connection is cut");
                        self.connections().remove(&message.connect_id);
                        // Once only: KubeEdge's edge waits on a second.
                        if !removed.swap(true, Ordering::AcqRel) {
                            let remove = Message::new(
                                message.connect_id,
                                MessageType::RemoveConnect,
                                Bytes::new(),
                            );
                            let _ = self
                                .outgoing
                                .try_send(Outgoing::Message(codec::encode(&remove)));
                        }
                    }
                }
            }
            MessageType::RemoveConnect => {
                self.connections().remove(&message.connect_id);
                // After what came before it; a reader that never takes it
                // sees the connection cut instead.
                let _ = tokio::time::timeout(READER_PATIENCE, sender.send(Incoming::Removed)).await;
            }
            other => {
                debug!(node = %self.node, kind = ?other, "an edge sent a message only the cloud sends: ignored");
            }
        }
    }

    /// The tunnel ended: every connection on it ends with an error.
    pub(crate) fn lose(&self, reason: &str) {
        let mut connections = self.connections();
        {
            let mut lost = self.lost.lock().unwrap_or_else(PoisonError::into_inner);
            if lost.is_none() {
                *lost = Some(reason.to_owned());
            }
        }
        connections.clear();
    }

    /// Closes the tunnel (its connections end with `reason`).
    pub(crate) fn close(&self, reason: &str) {
        self.lose(reason);
        let _ = self.outgoing.try_send(Outgoing::Close);
    }

    /// Connections open now.
    pub fn open_connections(&self) -> usize {
        self.connections().len()
    }
}

/// One connection through a tunnel: the edge's answer comes as data, in
/// order; the edge ends it (`None` from [`EdgeConnection::recv`]) or the
/// tunnel's end cuts it (an error). Dropping it ends it on the edge.
pub struct EdgeConnection {
    session: Arc<TunnelSession>,
    id: u64,
    incoming: mpsc::Receiver<Incoming>,
    /// The cloud sent RemoveConnect (once only: KubeEdge's edge stops a
    /// connection once per RemoveConnect and would wait for a second stop).
    removed: Arc<AtomicBool>,
    /// The edge ended it.
    ended: bool,
}

impl EdgeConnection {
    /// The next bytes from the edge; `None` once the edge ended the
    /// connection.
    pub async fn recv(&mut self) -> Option<Result<Bytes, EdgeStreamError>> {
        if self.ended {
            return None;
        }
        match self.incoming.recv().await {
            Some(Incoming::Data(bytes)) => Some(Ok(bytes)),
            Some(Incoming::Removed) => {
                self.ended = true;
                None
            }
            None => {
                self.ended = true;
                Some(Err(self.session.lost_error("the connection was cut")))
            }
        }
    }

    /// Where bytes to the edge go.
    pub fn writer(&self) -> EdgeWriter {
        EdgeWriter {
            session: self.session.clone(),
            id: self.id,
            removed: self.removed.clone(),
        }
    }

    /// Ends the connection.
    pub fn close(self) {}
}

impl Drop for EdgeConnection {
    fn drop(&mut self) {
        self.session.connections().remove(&self.id);
        if self.ended || self.removed.swap(true, Ordering::AcqRel) {
            return;
        }
        let remove = Message::new(self.id, MessageType::RemoveConnect, Bytes::new());
        let outgoing = Outgoing::Message(codec::encode(&remove));
        if let Err(mpsc::error::TrySendError::Full(outgoing)) =
            self.session.outgoing.try_send(outgoing)
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            let sender = self.session.outgoing.clone();
            runtime.spawn(async move {
                let _ = sender.send(outgoing).await;
            });
        }
    }
}

/// Writes to one connection's edge side.
#[derive(Clone)]
pub struct EdgeWriter {
    session: Arc<TunnelSession>,
    id: u64,
    removed: Arc<AtomicBool>,
}

impl EdgeWriter {
    /// Sends `bytes` to the edge (as Data messages of at most 32 KiB).
    pub async fn send(&self, bytes: Bytes) -> Result<(), EdgeStreamError> {
        if self.removed.load(Ordering::Acquire) {
            return Err(self.session.lost_error("the connection was ended"));
        }
        let mut rest = bytes;
        while !rest.is_empty() {
            let piece = rest.split_to(rest.len().min(CHUNK));
            let message = Message::new(self.id, MessageType::Data, piece);
            self.session
                .send(Outgoing::Message(codec::encode(&message)))
                .await?;
        }
        Ok(())
    }

    /// Ends the connection on the edge (KubeEdge has no half close: the
    /// edge stops it, and says so with its own RemoveConnect).
    pub async fn end(&self) -> Result<(), EdgeStreamError> {
        if self.removed.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        let message = Message::new(self.id, MessageType::RemoveConnect, Bytes::new());
        self.session
            .send(Outgoing::Message(codec::encode(&message)))
            .await
    }
}

/// The KubeEdge edgecores' tunnels to this cloud, by node (cloneable;
/// clones share them).
#[derive(Clone, Default)]
pub struct EdgeTunnels {
    by_node: Arc<Mutex<HashMap<String, Arc<TunnelSession>>>>,
    next_id: Arc<AtomicU64>,
}

impl EdgeTunnels {
    fn nodes(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<TunnelSession>>> {
        self.by_node.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A new session id.
    pub(crate) fn next_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// `session` is `node`'s tunnel from now on; an older one is closed.
    pub(crate) fn register(&self, session: Arc<TunnelSession>) {
        let old = self.nodes().insert(session.node.clone(), session);
        if let Some(old) = old {
            old.close("replaced by a newer tunnel from the node");
        }
    }

    /// `node`'s tunnel `id` ended (a newer one stays).
    pub(crate) fn unregister(&self, node: &str, id: u64) {
        let mut nodes = self.nodes();
        if nodes.get(node).is_some_and(|session| session.id == id) {
            nodes.remove(node);
        }
    }

    /// `node`'s tunnel, if it has one here.
    pub fn get(&self, node: &str) -> Option<Arc<TunnelSession>> {
        self.nodes().get(node).cloned()
    }

    /// Whether `node` has a tunnel here.
    pub fn has(&self, node: &str) -> bool {
        self.nodes().contains_key(node)
    }

    /// The nodes with a tunnel here.
    pub fn nodes_with_tunnel(&self) -> Vec<String> {
        self.nodes().keys().cloned().collect()
    }
}
