//! Delivery cursors in the replicas' engine: one record per node, written
//! by the replica that holds the node's claim, fenced by it as node status
//! is: a replica that lost the node writes nothing of it. On etcd
//! (`cursor_on_etcd`) a key `<prefix>/acked/<node>`, fenced in etcd's
//! transaction; on Kubernetes (`cursor_on_leases`) a ConfigMap
//! `edgehive-acked-<node>` in cloudcore's namespace, written only while
//! the node's claim Lease is held.
//!
//! cloudhub tells the writer ([`hub::AckSink`]) what KubeEdge nodes
//! acknowledge; the writer keeps it in memory ([`CursorBook`]) and writes
//! each node's cursor at most once a second while it changes, at once when
//! its session ends (before its claim is given up: see
//! [`CursorWriter::before_release`]), when a session begins with objects
//! still queued for the node (cloudhub sends them once they are recorded
//! as unsure: `AckSink::recorded`) and when the replica stops
//! ([`CursorWriter::flush_all`]). The controller reads a node's cursor
//! through it ([`DeliveryCursors`]): as the engine has it, with what this
//! replica saw since.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use apis::kinds::{Kind, ObjectKey};
use beehive::resource::EdgeResource;
use futures_util::future::BoxFuture;
use tokio::sync::{mpsc, oneshot, watch};
use tracing::{debug, warn};

use super::cursor::{Cursor, CursorBook, Outcome, Seen, Stored, Write, decode, encode};
use crate::edgecontroller::{Acked, DeliveryCursors};

/// How long one write (or read) of a cursor may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// Where a replica keeps the nodes' cursors: one record per node, with a
/// revision that grows with each write (0: no record), written only under
/// this replica's claim on the node.
pub(crate) trait CursorStore: Send + Sync + 'static {
    /// What holds this replica's claim on a node steady (no claim or
    /// release of it) while a write is made, and fences the write.
    type Claim: Send + 'static;

    /// A record larger than this is written empty (claiming nothing: the
    /// node gets everything again) rather than refused by the engine.
    const MAX_RECORD: usize;

    /// This replica's claim on `node` (its token, which only grows from
    /// one holder to the next, and what holds it), if it holds one.
    fn claim(&self, node: &str) -> impl Future<Output = Option<(i64, Self::Claim)>> + Send;

    /// `node`'s record: its revision and bytes.
    fn get(
        &self,
        node: &str,
    ) -> impl Future<Output = Result<(i64, Option<Vec<u8>>), String>> + Send;

    /// Writes `node`'s record over revision `at` (0: none may exist).
    fn put(
        &self,
        node: &str,
        value: Vec<u8>,
        at: i64,
        claim: &mut Self::Claim,
    ) -> impl Future<Output = Result<Put, String>> + Send;
}

/// What became of a [`CursorStore::put`].
pub(crate) enum Put {
    /// Written at this revision.
    Done(i64),
    /// The record was not at the revision given: as it is now.
    Conflict(i64, Option<Vec<u8>>),
    /// This replica's claim on the node is gone: nothing written.
    Fenced,
}

/// What the cursor writer has done.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CursorCounts {
    /// Cursors written to the engine.
    pub writes: u64,
    /// Writes refused by the fence, or not made: this replica did not
    /// hold the node.
    pub fenced: u64,
    /// Writes that failed (the engine out of reach), tried again later.
    pub failures: u64,
    /// Nodes whose cursor this replica keeps in memory.
    pub nodes: usize,
}

/// Told to a running claims keeper before it gives a node's claim up
/// (see [`EtcdClaims::before_release`](super::EtcdClaims::before_release)).
pub type BeforeRelease = Arc<dyn Fn(String) -> BoxFuture<'static, ()> + Send + Sync>;

enum Command {
    See {
        node: String,
        resource: String,
        seen: Seen,
    },
    End {
        node: String,
    },
    /// Answered once the node (every node: `None`) has nothing left to
    /// write.
    Flush {
        node: Option<String>,
        done: oneshot::Sender<()>,
    },
    Read {
        node: String,
        reply: oneshot::Sender<Result<Cursor, String>>,
    },
}

enum Done {
    Written {
        node: String,
        outcome: Outcome,
    },
    Read {
        node: String,
        read: Result<Stored, String>,
    },
}

struct Shared<S> {
    store: S,
    counts: Arc<watch::Sender<CursorCounts>>,
}

/// This replica's writer of delivery cursors (a handle: clones share it).
#[derive(Clone)]
pub struct CursorWriter {
    counts: Arc<watch::Sender<CursorCounts>>,
    commands: mpsc::UnboundedSender<Command>,
}

impl CursorWriter {
    /// Starts a writer keeping cursors in `store`, writing each node's at
    /// most once per `every` while it changes (inside a tokio runtime).
    pub(crate) fn with_store<S: CursorStore>(store: S, every: Duration) -> CursorWriter {
        let (counts, _) = watch::channel(CursorCounts::default());
        let counts = Arc::new(counts);
        let shared = Arc::new(Shared {
            store,
            counts: counts.clone(),
        });
        let (commands, receiver) = mpsc::unbounded_channel();
        tokio::spawn(run(shared, receiver, every));
        CursorWriter { counts, commands }
    }

    /// The counts, as they change.
    pub fn counts(&self) -> watch::Receiver<CursorCounts> {
        self.counts.subscribe()
    }

    /// Writes what `node` acknowledged now; done once written (or when
    /// it cannot be: this replica does not hold the node).
    pub async fn flush(&self, node: &str) {
        self.flushed(Some(node.to_owned())).await;
    }

    /// Writes every node's cursor now (a replica told to stop, before it
    /// gives its claims up).
    pub async fn flush_all(&self) {
        self.flushed(None).await;
    }

    async fn flushed(&self, node: Option<String>) {
        let (done, wait) = oneshot::channel();
        if self.commands.send(Command::Flush { node, done }).is_ok() {
            let _ = wait.await;
        }
    }

    /// For the claims' `before_release`: a node's cursor is written before
    /// its claim is given up, while the write is still this replica's.
    pub fn before_release(&self) -> BeforeRelease {
        let writer = self.clone();
        Arc::new(move |node: String| {
            let writer = writer.clone();
            Box::pin(async move { writer.flush(&node).await })
        })
    }

    fn send(&self, command: Command) {
        // The writer ends only with its last handle.
        let _ = self.commands.send(command);
    }

    fn see(&self, node: &str, resource: &str, seen: Seen) {
        if recorded(resource) {
            self.send(Command::See {
                node: node.to_owned(),
                resource: resource.to_owned(),
                seen,
            });
        }
    }
}

/// Whether `resource` is one the controller brings nodes in step on (a
/// pod, device, configmap, secret or device model): only those are
/// recorded (not tokens, nor anything else acknowledged).
fn recorded(resource: &str) -> bool {
    resource
        .parse::<EdgeResource>()
        .ok()
        .as_ref()
        .and_then(ObjectKey::from_edge_resource)
        .is_some_and(|key| {
            matches!(
                key.kind,
                Kind::Pod | Kind::Device | Kind::ConfigMap | Kind::Secret | Kind::DeviceModel
            )
        })
}

impl hub::AckSink for CursorWriter {
    fn held(&self, node: &str, resource: &str, version: &str) {
        match version.parse::<u64>() {
            Ok(version) if version != Acked::UNSURE => {
                self.see(node, resource, Seen::Held(version));
            }
            // Not a version the cursor can hold: whatever it was, it is
            // not known to be held.
            _ => self.see(node, resource, Seen::Unsure),
        }
    }

    fn unsure(&self, node: &str, resource: &str) {
        self.see(node, resource, Seen::Unsure);
    }

    fn gone(&self, node: &str, resource: &str) {
        self.see(node, resource, Seen::Gone);
    }

    fn recorded(&self, node: &str) -> BoxFuture<'static, ()> {
        let (writer, node) = (self.clone(), node.to_owned());
        Box::pin(async move { writer.flush(&node).await })
    }

    fn ended(&self, node: &str) {
        self.send(Command::End {
            node: node.to_owned(),
        });
    }
}

impl DeliveryCursors for CursorWriter {
    fn read(&self, node: &str) -> BoxFuture<'static, Result<Cursor, String>> {
        let (reply, answer) = oneshot::channel();
        self.send(Command::Read {
            node: node.to_owned(),
            reply,
        });
        Box::pin(async move {
            answer
                .await
                .unwrap_or_else(|_| Err("the cursor writer stopped".to_owned()))
        })
    }
}

/// The writer's task: takes commands in order, hands the due writes to
/// tasks of their own (one per node at a time), answers flushes and reads.
async fn run<S: CursorStore>(
    shared: Arc<Shared<S>>,
    mut commands: mpsc::UnboundedReceiver<Command>,
    every: Duration,
) {
    let (done_tx, mut done) = mpsc::unbounded_channel::<Done>();
    let mut book = CursorBook::new(every);
    let mut flushes: Vec<(Option<String>, oneshot::Sender<()>)> = Vec::new();
    let mut reads: HashMap<String, Vec<oneshot::Sender<Result<Cursor, String>>>> = HashMap::new();
    let mut tick = tokio::time::interval((every / 4).max(Duration::from_millis(20)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            command = commands.recv() => match command {
                None => break,
                Some(Command::See { node, resource, seen }) => book.see(&node, &resource, seen),
                Some(Command::End { node }) => book.end(&node),
                Some(Command::Flush { node, done }) => {
                    match &node {
                        Some(node) => book.flush(node),
                        None => book.flush_all(),
                    }
                    flushes.push((node, done));
                }
                Some(Command::Read { node, reply }) => match book.view(&node) {
                    Some(cursor) => {
                        let _ = reply.send(Ok(cursor));
                    }
                    None => {
                        let waiting = reads.entry(node.clone()).or_default();
                        waiting.push(reply);
                        if waiting.len() == 1 {
                            let (shared, done_tx) = (shared.clone(), done_tx.clone());
                            tokio::spawn(async move {
                                let read = read(&shared, &node).await;
                                let _ = done_tx.send(Done::Read { node, read });
                            });
                        }
                    }
                },
            },
            Some(finished) = done.recv() => match finished {
                Done::Written { node, outcome } => {
                    shared.counts.send_modify(|c| match &outcome {
                        Outcome::Written(_) => {}
                        Outcome::NotHeld => c.fenced += 1,
                        Outcome::Failed => c.failures += 1,
                    });
                    book.written(&node, outcome, Instant::now());
                }
                Done::Read { node, read } => {
                    let answer = match read {
                        Ok(stored) => {
                            book.read(&node, stored);
                            book.view(&node).ok_or_else(|| "not read".to_owned())
                        }
                        Err(reason) => Err(reason),
                    };
                    for reply in reads.remove(&node).unwrap_or_default() {
                        let _ = reply.send(answer.clone());
                    }
                }
            },
            _ = tick.tick() => {}
        }
        for due in book.due(Instant::now()) {
            let (shared, done_tx) = (shared.clone(), done_tx.clone());
            tokio::spawn(async move {
                let node = due.node.clone();
                let outcome = tokio::time::timeout(CALL_TIMEOUT, write(&shared, due))
                    .await
                    .unwrap_or(Outcome::Failed);
                let _ = done_tx.send(Done::Written { node, outcome });
            });
        }
        // A flush is answered by dropping its sender once done.
        flushes.retain(|(node, _)| match node {
            Some(node) => !book.settled(node),
            None => !book.all_settled(),
        });
        let nodes = book.len();
        shared.counts.send_if_modified(|c| {
            let changed = c.nodes != nodes;
            c.nodes = nodes;
            changed
        });
    }
    debug!("cursor writer stopped");
}

/// `node`'s cursor as the store has it, read under `claim`.
async fn stored<S: CursorStore>(store: &S, node: &str, claim: i64) -> Result<Stored, String> {
    let (revision, value) = store.get(node).await?;
    Ok(Stored {
        claim,
        revision,
        cursor: value.map(|value| decode(&value)).unwrap_or_default(),
    })
}

/// Reads `node`'s cursor, for a session of it here.
async fn read<S: CursorStore>(shared: &Shared<S>, node: &str) -> Result<Stored, String> {
    let Some((claim, hold)) = shared.store.claim(node).await else {
        return Err(format!("this replica holds no claim on {node}"));
    };
    drop(hold);
    tokio::time::timeout(CALL_TIMEOUT, stored(&shared.store, node, claim))
        .await
        .unwrap_or_else(|_| Err("the engine did not answer in time".to_owned()))
}

/// Writes a node's changes under its claim, which is held steady (no
/// claim or release of the node) until the write is made.
async fn write<S: CursorStore>(shared: &Shared<S>, due: Write) -> Outcome {
    let node = due.node.clone();
    let Some((claim, mut held)) = shared.store.claim(&node).await else {
        return Outcome::NotHeld;
    };
    let (mut base, changes) = due.under(claim);
    // A conflict is this replica's own write whose answer was lost (none
    // other may write while it holds the claim): read again and retry.
    for _ in 0..3 {
        let current = match base.take() {
            Some(current) => current,
            None => match stored(&shared.store, &node, claim).await {
                Ok(current) => current,
                Err(err) => {
                    debug!(%node, error = %err, "cursor not read; tried again later");
                    return Outcome::Failed;
                }
            },
        };
        let mut next = changes.applied_to(&current.cursor, claim);
        if next == current.cursor {
            return Outcome::Written(current);
        }
        let mut value = encode(&next);
        if value.len() > S::MAX_RECORD {
            warn!(%node, bytes = value.len(), "delivery cursor too large for the engine; written empty");
            next = Cursor::new();
            value = encode(&next);
        }
        let written = shared
            .store
            .put(&node, value, current.revision, &mut held)
            .await;
        match written {
            Ok(Put::Done(revision)) => {
                shared.counts.send_modify(|c| c.writes += 1);
                return Outcome::Written(Stored {
                    claim,
                    revision,
                    cursor: next,
                });
            }
            Ok(Put::Conflict(revision, value)) => {
                base = Some(Stored {
                    claim,
                    revision,
                    cursor: value.map(|value| decode(&value)).unwrap_or_default(),
                });
            }
            Ok(Put::Fenced) => {
                debug!(%node, "cursor not written: the claim on the node is another's now");
                return Outcome::NotHeld;
            }
            Err(err) => {
                debug!(%node, error = %err, "cursor not written; tried again later");
                return Outcome::Failed;
            }
        }
    }
    Outcome::Failed
}
