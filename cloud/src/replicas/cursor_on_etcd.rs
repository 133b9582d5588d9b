//! Delivery cursors in etcd: one key per node, `<prefix>/acked/<node>`,
//! written by the replica that holds the node's claim, fenced by it, as
//! node status is ([`EtcdClaims::fencing`](super::EtcdClaims::fencing)):
//! a replica that lost the node writes nothing of it.
//!
//! cloudhub tells the writer ([`hub::AckSink`]) what KubeEdge nodes
//! acknowledge; the writer keeps it in memory ([`CursorBook`]) and writes
//! each node's cursor at most once a second while it changes, at once when
//! its session ends (before its claim is given up: see
//! [`CursorWriter::before_release`]), when a session begins with objects
//! still queued for the node (cloudhub sends them once they are recorded
//! as unsure: `AckSink::recorded`) and when the replica stops
//! ([`CursorWriter::flush_all`]). The controller reads a node's cursor
//! through it ([`DeliveryCursors`]): as etcd has it, with what this
//! replica saw since.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use apis::kinds::{Kind, ObjectKey};
use beehive::resource::EdgeResource;
use etcd::{Etcd, Written};
use futures_util::future::BoxFuture;
use tokio::sync::{mpsc, oneshot, watch};
use tracing::{debug, warn};

use super::cursor::{Cursor, CursorBook, Outcome, Seen, Stored, Write, decode, encode};
use crate::controller::{Acked, DeliveryCursors};
use crate::desired::FenceOf;

/// A cursor larger than this is written empty (claiming nothing: the node
/// gets everything again) rather than over etcd's request limit (1.5 MiB
/// by default).
const MAX_CURSOR: usize = 1 << 20;

/// How long one write (or read) of a cursor may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// Where the cursors live and how often they are written.
#[derive(Debug, Clone)]
pub struct CursorConfig {
    /// The etcd members' client URLs.
    pub endpoints: Vec<String>,
    /// The key prefix (`/edgehive`): cursors live under `<prefix>/acked/`.
    pub prefix: String,
    /// Each node's cursor is written at most once per this while it
    /// changes.
    pub every: Duration,
}

impl CursorConfig {
    /// Defaults: under `/edgehive`, once a second.
    pub fn new(endpoints: Vec<String>) -> CursorConfig {
        CursorConfig {
            endpoints,
            prefix: "/edgehive".to_owned(),
            every: Duration::from_secs(1),
        }
    }
}

/// What the cursor writer has done.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CursorCounts {
    /// Cursors written to etcd.
    pub writes: u64,
    /// Writes refused by etcd's fence, or not made: this replica did not
    /// hold the node.
    pub fenced: u64,
    /// Writes that failed (etcd out of reach), tried again later.
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

struct Shared {
    etcd: Etcd,
    /// `<prefix>/acked/`.
    keys: String,
    fence: OnceLock<FenceOf>,
    counts: watch::Sender<CursorCounts>,
}

impl Shared {
    fn key(&self, node: &str) -> String {
        format!("{}{node}", self.keys)
    }
}

/// This replica's writer of delivery cursors (a handle: clones share it).
#[derive(Clone)]
pub struct CursorWriter {
    shared: Arc<Shared>,
    commands: mpsc::UnboundedSender<Command>,
}

impl CursorWriter {
    /// Connects to etcd and starts the writer (inside a tokio runtime).
    /// Nothing is written before [`CursorWriter::fence_with`].
    pub fn start(config: CursorConfig) -> Result<CursorWriter, etcd::EtcdError> {
        let etcd = Etcd::connect(&config.endpoints)?;
        let (counts, _) = watch::channel(CursorCounts::default());
        let shared = Arc::new(Shared {
            etcd,
            keys: format!("{}/acked/", config.prefix.trim_end_matches('/')),
            fence: OnceLock::new(),
            counts,
        });
        let (commands, receiver) = mpsc::unbounded_channel();
        tokio::spawn(run(shared.clone(), receiver, config.every));
        Ok(CursorWriter { shared, commands })
    }

    /// What a write of a node's cursor must hold: this replica's claim on
    /// the node (`EtcdClaims::fencing`). Set once.
    pub fn fence_with(&self, fence_of: FenceOf) {
        let _ = self.shared.fence.set(fence_of);
    }

    /// The counts, as they change.
    pub fn counts(&self) -> watch::Receiver<CursorCounts> {
        self.shared.counts.subscribe()
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

    /// For `EtcdClaims::before_release`: a node's cursor is written before
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
async fn run(shared: Arc<Shared>, mut commands: mpsc::UnboundedReceiver<Command>, every: Duration) {
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

/// The claim this replica holds on `node` and what holds it steady, if
/// it holds one.
async fn claim_of(shared: &Shared, node: &str) -> Option<(etcd::Fence, crate::desired::FenceHold)> {
    let fence_of = shared.fence.get()?;
    let (fence, hold) = fence_of(node.to_owned()).await?;
    // 0: no replica holds it; then none may write its cursor.
    (fence.create_revision != 0).then_some((fence, hold))
}

/// `node`'s cursor as etcd has it, read under `claim`.
async fn stored(shared: &Shared, node: &str, claim: i64) -> Result<Stored, String> {
    let (entry, _) = shared
        .etcd
        .get(shared.key(node).as_bytes())
        .await
        .map_err(|err| err.to_string())?;
    Ok(Stored {
        claim,
        revision: entry.as_ref().map_or(0, |entry| entry.mod_revision),
        cursor: entry.map(|entry| decode(&entry.value)).unwrap_or_default(),
    })
}

/// Reads `node`'s cursor, for a session of it here.
async fn read(shared: &Shared, node: &str) -> Result<Stored, String> {
    let Some((fence, hold)) = claim_of(shared, node).await else {
        return Err(format!("this replica holds no claim on {node}"));
    };
    drop(hold);
    tokio::time::timeout(CALL_TIMEOUT, stored(shared, node, fence.create_revision))
        .await
        .unwrap_or_else(|_| Err("etcd did not answer in time".to_owned()))
}

/// Writes a node's changes under its claim, which is held steady (no
/// claim or release of the node) until the write is made.
async fn write(shared: &Shared, due: Write) -> Outcome {
    let node = due.node.clone();
    let Some((fence, _hold)) = claim_of(shared, &node).await else {
        return Outcome::NotHeld;
    };
    let claim = fence.create_revision;
    let key = shared.key(&node);
    let (mut base, changes) = due.under(claim);
    // A conflict is this replica's own write whose answer was lost (none
    // other may write while it holds the claim): read again and retry.
    for _ in 0..3 {
        let current = match base.take() {
            Some(current) => current,
            None => match stored(shared, &node, claim).await {
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
        if value.len() > MAX_CURSOR {
            warn!(%node, bytes = value.len(), "delivery cursor too large for etcd; written empty");
            next = Cursor::new();
            value = encode(&next);
        }
        let written = match current.revision {
            0 => {
                shared
                    .etcd
                    .create_fenced(key.as_bytes(), value, &fence)
                    .await
            }
            at => {
                shared
                    .etcd
                    .replace_fenced(key.as_bytes(), value, at, &fence)
                    .await
            }
        };
        match written {
            Ok(Written::Done(revision)) => {
                shared.counts.send_modify(|c| c.writes += 1);
                return Outcome::Written(Stored {
                    claim,
                    revision,
                    cursor: next,
                });
            }
            Ok(Written::Conflict(entry)) => {
                base = Some(Stored {
                    claim,
                    revision: entry.as_ref().map_or(0, |entry| entry.mod_revision),
                    cursor: entry.map(|entry| decode(&entry.value)).unwrap_or_default(),
                });
            }
            Ok(Written::Fenced) => {
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
