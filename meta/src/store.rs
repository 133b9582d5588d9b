//! The edge's object store on redb: every object the edge holds, keyed by
//! its resource (`<ns>/<type>/<name>`), with its resource version.
//!
//! Writes go to a writer thread that commits them in batches (one
//! transaction for everything waiting), and each write is confirmed only
//! after its commit: nothing blocks an actor thread, and nothing is
//! confirmed that a crash could lose. A deletion leaves a tombstone with its
//! version, so a late, older update cannot bring an object back; tombstones
//! the cloud's [`Watermark`] covers are pruned in batches on the same writer
//! thread ([`EdgeStore::prune_tombstones`]; the rule is in
//! [`crate::tombstones`]).

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use beehive::Content;
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use serde::{Deserialize, Serialize};
use store::BatchWriter;
use tokio::sync::{broadcast, oneshot, watch};
use tracing::{debug, error};

use crate::tombstones::Watermark;

const OBJECTS: TableDefinition<&str, &[u8]> = TableDefinition::new("objects");

/// A failure of the edge store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// redb failed.
    #[error("edge store: {0}")]
    Redb(#[from] redb::Error),
    /// The database file could not be opened.
    #[error("edge store: {0}")]
    Open(#[from] store::OpenError),
    /// A stored record could not be read back.
    #[error("edge store record unreadable: {0}")]
    Corrupt(String),
    /// The write was not committed.
    #[error("edge store write failed: {0}")]
    Write(String),
    /// The writer thread is gone.
    #[error("edge store stopped")]
    Stopped,
}

/// One stored object.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Record {
    /// Its resource version.
    pub version: String,
    /// The object (absent for a tombstone).
    pub object: Option<Content>,
}

impl Record {
    /// Whether this is a deletion's tombstone.
    pub fn is_deleted(&self) -> bool {
        self.object.is_none()
    }
}

/// What a write did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteOutcome {
    /// Stored (or deleted).
    Applied,
    /// Older than, or the same as, the version held: nothing changed.
    Stale,
}

/// Whether version `new` should replace `held`: numeric comparison when both
/// are numbers (as Kubernetes' are in practice), else the newer arrival wins.
pub fn supersedes(new: &str, held: &str) -> bool {
    match (new.parse::<u64>(), held.parse::<u64>()) {
        (Ok(new), Ok(held)) => new > held,
        _ => new != held,
    }
}

/// A write waiting for the writer thread.
struct Put {
    resource: String,
    record: Record,
    done: oneshot::Sender<Result<WriteOutcome, StoreError>>,
}

/// A prune of covered tombstones, at most `limit` of them.
struct Prune {
    watermark: Watermark,
    limit: usize,
    done: oneshot::Sender<Result<PruneBatch, StoreError>>,
}

/// What the writer thread is handed.
enum Op {
    Put(Put),
    Prune(Prune),
}

/// What one prune batch did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PruneBatch {
    /// Tombstones removed.
    pub pruned: usize,
    /// Whether covered tombstones are left (the batch was full).
    pub more: bool,
}

/// Tombstones removed in one write transaction at most, so that writes
/// waiting behind a prune wait for one small commit.
pub const PRUNE_BATCH: usize = 1024;

/// The store's tombstone counts.
#[derive(Debug)]
pub struct TombstoneCounts {
    held: AtomicU64,
    pruned: AtomicU64,
    /// Tombstones pruned so far, for those who wait for a sweep.
    swept: watch::Sender<u64>,
}

impl Default for TombstoneCounts {
    fn default() -> Self {
        TombstoneCounts {
            held: AtomicU64::new(0),
            pruned: AtomicU64::new(0),
            swept: watch::channel(0).0,
        }
    }
}

impl TombstoneCounts {
    /// Tombstones pruned since the store was opened, updated after each
    /// prune batch's commit.
    pub fn watch_pruned(&self) -> watch::Receiver<u64> {
        self.swept.subscribe()
    }

    /// Tombstones in the store now.
    pub fn held(&self) -> u64 {
        self.held.load(Ordering::Relaxed)
    }

    /// Tombstones pruned since the store was opened.
    pub fn pruned(&self) -> u64 {
        self.pruned.load(Ordering::Relaxed)
    }
}

/// A submitted write; completes after its commit.
pub struct Committed {
    committed: oneshot::Receiver<Result<WriteOutcome, StoreError>>,
}

impl std::future::Future for Committed {
    type Output = Result<WriteOutcome, StoreError>;
    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        std::pin::Pin::new(&mut self.committed)
            .poll(cx)
            .map(|done| done.unwrap_or(Err(StoreError::Stopped)))
    }
}

/// A committed change to one object, as watchers see it.
#[derive(Debug, Clone, PartialEq)]
pub struct StoreChange {
    /// The object's resource (`<ns>/<type>/<name>`).
    pub resource: String,
    /// The record now held (a tombstone for a deletion).
    pub record: Record,
    /// The record held before, if any (tombstones included).
    pub previous: Option<Record>,
}

/// Changes kept for a slow watcher before it is told it fell behind.
const CHANGE_BACKLOG: usize = 4096;

/// Handle to the edge store; cheap to clone.
#[derive(Clone)]
pub struct EdgeStore {
    writer: BatchWriter<Op>,
    changes: broadcast::Sender<StoreChange>,
    tombstones: Arc<TombstoneCounts>,
}

impl EdgeStore {
    /// Opens (or creates) the store at `path` and starts its writer thread.
    pub fn open(path: &Path) -> Result<EdgeStore, StoreError> {
        let db = store::open_database(path)?;
        let txn = db.begin_write().map_err(redb::Error::from)?;
        txn.open_table(OBJECTS).map_err(redb::Error::from)?;
        txn.commit().map_err(redb::Error::from)?;
        let tombstones = Arc::new(TombstoneCounts::default());
        tombstones
            .held
            .store(count_tombstones(&db)?, Ordering::Relaxed);
        let (changes, _) = broadcast::channel(CHANGE_BACKLOG);
        let feed = changes.clone();
        let counts = tombstones.clone();
        let writer = BatchWriter::start(db, "edge-store", move |db, batch| {
            apply(db, batch, &feed, &counts);
        })
        .map_err(|e| StoreError::Redb(redb::Error::Io(e)))?;
        Ok(EdgeStore {
            writer,
            changes,
            tombstones,
        })
    }

    /// Compacts the store's file (which redb never shrinks by itself) while
    /// no store has it open: freed pages go back to the file system.
    /// Returns whether anything was compacted.
    pub fn compact(path: &Path) -> Result<bool, StoreError> {
        let mut db = store::open_database(path)?;
        let mut compacted = false;
        while db
            .compact()
            .map_err(|e| StoreError::Redb(redb::Error::from(e)))?
        {
            compacted = true;
        }
        Ok(compacted)
    }

    /// The tombstone counts (held now, pruned since opening).
    pub fn tombstones(&self) -> &TombstoneCounts {
        &self.tombstones
    }

    /// Removes up to `limit` tombstones that `watermark` covers (see
    /// [`crate::tombstones`]), in one transaction on the writer thread,
    /// between write batches.
    pub async fn prune_batch(
        &self,
        watermark: &Watermark,
        limit: usize,
    ) -> Result<PruneBatch, StoreError> {
        let (done, pruned) = oneshot::channel();
        let submitted = self.writer.submit(Op::Prune(Prune {
            watermark: watermark.clone(),
            limit: limit.max(1),
            done,
        }));
        if !submitted {
            return Err(StoreError::Stopped);
        }
        pruned.await.unwrap_or(Err(StoreError::Stopped))
    }

    /// Removes every tombstone `watermark` covers, [`PRUNE_BATCH`] at a
    /// time (writes go in between); returns how many.
    pub async fn prune_tombstones(&self, watermark: &Watermark) -> Result<usize, StoreError> {
        let mut pruned = 0;
        loop {
            let batch = self.prune_batch(watermark, PRUNE_BATCH).await?;
            pruned += batch.pruned;
            if !batch.more {
                return Ok(pruned);
            }
        }
    }

    /// Stores `object` at `version` unless a newer version is held.
    /// Completes after the commit.
    pub async fn put(
        &self,
        resource: &str,
        version: &str,
        object: Content,
    ) -> Result<WriteOutcome, StoreError> {
        self.write(
            resource,
            Record {
                version: version.to_owned(),
                object: Some(object),
            },
        )
        .await
    }

    /// Deletes the object (leaving a tombstone at `version`) unless a newer
    /// version is held. Completes after the commit.
    pub async fn delete(&self, resource: &str, version: &str) -> Result<WriteOutcome, StoreError> {
        self.write(
            resource,
            Record {
                version: version.to_owned(),
                object: None,
            },
        )
        .await
    }

    async fn write(&self, resource: &str, record: Record) -> Result<WriteOutcome, StoreError> {
        self.submit(resource, record)?.await
    }

    /// Hands a write to the writer now and returns what completes after its
    /// commit. Writes submitted in order are applied and confirmed in order.
    pub fn submit(&self, resource: &str, record: Record) -> Result<Committed, StoreError> {
        let (done, committed) = oneshot::channel();
        let submitted = self.writer.submit(Op::Put(Put {
            resource: resource.to_owned(),
            record,
            done,
        }));
        if !submitted {
            return Err(StoreError::Stopped);
        }
        Ok(Committed { committed })
    }

    /// The record of one resource (tombstones included).
    pub fn get(&self, resource: &str) -> Result<Option<Record>, StoreError> {
        let txn = self.writer.db().begin_read().map_err(redb::Error::from)?;
        let table = txn.open_table(OBJECTS).map_err(redb::Error::from)?;
        let Some(value) = table.get(resource).map_err(redb::Error::from)? else {
            return Ok(None);
        };
        decode(value.value()).map(Some)
    }

    /// Live objects whose resource starts with `prefix` (e.g.
    /// `default/pod/`), with their versions.
    pub fn list(&self, prefix: &str) -> Result<Vec<(String, Record)>, StoreError> {
        self.scan(prefix, |_| true, false)
    }

    /// Live objects of one resource type, in one namespace or in all.
    pub fn list_type(
        &self,
        namespace: Option<&str>,
        resource_type: &str,
    ) -> Result<Vec<(String, Record)>, StoreError> {
        self.records_of_type(namespace, resource_type, false)
    }

    /// Records of one resource type, in one namespace or in all; with
    /// `tombstones`, deletions too.
    pub fn records_of_type(
        &self,
        namespace: Option<&str>,
        resource_type: &str,
        tombstones: bool,
    ) -> Result<Vec<(String, Record)>, StoreError> {
        match namespace {
            Some(namespace) => self.scan(
                &format!("{namespace}/{resource_type}/"),
                |_| true,
                tombstones,
            ),
            None => self.scan(
                "",
                |key| key.split('/').nth(1) == Some(resource_type),
                tombstones,
            ),
        }
    }

    fn scan(
        &self,
        prefix: &str,
        wanted: impl Fn(&str) -> bool,
        tombstones: bool,
    ) -> Result<Vec<(String, Record)>, StoreError> {
        let txn = self.writer.db().begin_read().map_err(redb::Error::from)?;
        let table = txn.open_table(OBJECTS).map_err(redb::Error::from)?;
        let mut out = Vec::new();
        for entry in table.range(prefix..).map_err(redb::Error::from)? {
            let (key, value) = entry.map_err(redb::Error::from)?;
            let key = key.value();
            if !key.starts_with(prefix) {
                break;
            }
            if !wanted(key) {
                continue;
            }
            let record = decode(value.value())?;
            if tombstones || !record.is_deleted() {
                out.push((key.to_owned(), record));
            }
        }
        Ok(out)
    }

    /// Committed changes from now on, in commit order. A receiver that
    /// falls more than a few thousand changes behind is told it lagged.
    pub fn subscribe(&self) -> broadcast::Receiver<StoreChange> {
        self.changes.subscribe()
    }

    /// Commits what is pending, stops the writer and releases the file
    /// once every other handle is gone too.
    pub async fn close(self) {
        self.writer.close().await;
    }
}

fn decode(bytes: &[u8]) -> Result<Record, StoreError> {
    rmp_serde::from_slice(bytes).map_err(|e| StoreError::Corrupt(e.to_string()))
}

fn count_tombstones(db: &Database) -> Result<u64, StoreError> {
    let txn = db.begin_read().map_err(redb::Error::from)?;
    let table = txn.open_table(OBJECTS).map_err(redb::Error::from)?;
    let mut held = 0;
    for entry in table.iter().map_err(redb::Error::from)? {
        let (_, value) = entry.map_err(redb::Error::from)?;
        if decode(value.value())?.is_deleted() {
            held += 1;
        }
    }
    Ok(held)
}

/// Applies a batch: runs of writes in one transaction each, prunes in
/// their own, in submission order.
fn apply(
    db: &Database,
    batch: Vec<Op>,
    feed: &broadcast::Sender<StoreChange>,
    counts: &TombstoneCounts,
) {
    let mut puts = Vec::new();
    for op in batch {
        match op {
            Op::Put(put) => puts.push(put),
            Op::Prune(prune) => {
                if !puts.is_empty() {
                    apply_puts(db, std::mem::take(&mut puts), feed, counts);
                }
                let outcome = apply_prune(db, &prune.watermark, prune.limit);
                match &outcome {
                    Ok(batch) => {
                        let pruned = batch.pruned as u64;
                        // Held first: whoever wakes on the sweep reads
                        // counts that already include it.
                        counts.held.fetch_sub(
                            pruned.min(counts.held.load(Ordering::Relaxed)),
                            Ordering::Relaxed,
                        );
                        let total = counts.pruned.fetch_add(pruned, Ordering::Relaxed) + pruned;
                        counts.swept.send_replace(total);
                        debug!(pruned, more = batch.more, "tombstones pruned");
                    }
                    Err(err) => error!(error = %err, "edge store prune failed"),
                }
                let _ = prune.done.send(outcome);
            }
        }
    }
    if !puts.is_empty() {
        apply_puts(db, puts, feed, counts);
    }
}

/// Removes up to `limit` covered tombstones in one transaction.
fn apply_prune(
    db: &Database,
    watermark: &Watermark,
    limit: usize,
) -> Result<PruneBatch, StoreError> {
    let txn = db.begin_write().map_err(redb::Error::from)?;
    let mut batch = PruneBatch {
        pruned: 0,
        more: false,
    };
    {
        let mut table = txn.open_table(OBJECTS).map_err(redb::Error::from)?;
        let mut covered = Vec::new();
        for entry in table.iter().map_err(redb::Error::from)? {
            let (key, value) = entry.map_err(redb::Error::from)?;
            // An unreadable record is left alone (never taken for a
            // tombstone).
            let Ok(record) = decode(value.value()) else {
                continue;
            };
            if record.is_deleted() && watermark.covers(key.value(), &record.version) {
                if covered.len() == limit {
                    batch.more = true;
                    break;
                }
                covered.push(key.value().to_owned());
            }
        }
        for key in &covered {
            table.remove(key.as_str()).map_err(redb::Error::from)?;
        }
        batch.pruned = covered.len();
    }
    txn.commit().map_err(redb::Error::from)?;
    Ok(batch)
}

/// Applies writes in one transaction (a write older than the version held
/// is stale and changes nothing), then confirms each write.
fn apply_puts(
    db: &Database,
    batch: Vec<Put>,
    feed: &broadcast::Sender<StoreChange>,
    counts: &TombstoneCounts,
) {
    let mut tombstones: i64 = 0;
    let mut waiting = Vec::with_capacity(batch.len());
    let mut changed = Vec::new();
    let committed = (|| -> Result<(), redb::Error> {
        let txn = db.begin_write()?;
        {
            let mut table = txn.open_table(OBJECTS)?;
            for Put {
                resource,
                record,
                done,
            } in batch
            {
                let held = match table.get(resource.as_str())? {
                    Some(value) => decode(value.value()).ok(),
                    None => None,
                };
                let fresh = held
                    .as_ref()
                    .is_none_or(|held| supersedes(&record.version, &held.version));
                if fresh {
                    match rmp_serde::to_vec_named(&record) {
                        Ok(bytes) => {
                            table.insert(resource.as_str(), bytes.as_slice())?;
                            let was = held.as_ref().is_some_and(Record::is_deleted);
                            tombstones += i64::from(record.is_deleted()) - i64::from(was);
                            // Kept whether or not anyone watches yet: a
                            // watcher may subscribe before this commit.
                            changed.push(StoreChange {
                                resource,
                                record,
                                previous: held,
                            });
                        }
                        Err(err) => {
                            let _ = done.send(Err(StoreError::Write(err.to_string())));
                            continue;
                        }
                    }
                }
                let outcome = if fresh {
                    WriteOutcome::Applied
                } else {
                    WriteOutcome::Stale
                };
                waiting.push((done, outcome));
            }
        }
        txn.commit()?;
        Ok(())
    })();
    match committed {
        Ok(()) => {
            if tombstones >= 0 {
                counts
                    .held
                    .fetch_add(tombstones.unsigned_abs(), Ordering::Relaxed);
            } else {
                counts
                    .held
                    .fetch_sub(tombstones.unsigned_abs(), Ordering::Relaxed);
            }
            if feed.receiver_count() > 0 {
                for change in changed {
                    let _ = feed.send(change);
                }
            }
            for (done, outcome) in waiting {
                let _ = done.send(Ok(outcome));
            }
        }
        Err(err) => {
            error!(error = %err, "edge store commit failed");
            for (done, _) in waiting {
                let _ = done.send(Err(StoreError::Write(err.to_string())));
            }
        }
    }
}

#[cfg(test)]
mod tests;
