//! The edge's object store on redb: every object the edge holds, keyed by
//! its resource (`<ns>/<type>/<name>`), with its resource version.
//!
//! Writes go to a writer thread that commits them in batches (one
//! transaction for everything waiting), and each write is confirmed only
//! after its commit: nothing blocks an actor thread, and nothing is
//! confirmed that a crash could lose. A deletion leaves a tombstone with its
//! version, so a late, older update cannot bring an object back.

use std::path::Path;

use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use serde::{Deserialize, Serialize};
use store::BatchWriter;
use tokio::sync::{broadcast, oneshot};
use tracing::error;

const OBJECTS: TableDefinition<&str, &[u8]> = TableDefinition::new("objects");

/// A failure of the edge store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// redb failed.
    #[error("edge store: {0}")]
    Redb(#[from] redb::Error),
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
    pub object: Option<serde_json::Value>,
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
fn supersedes(new: &str, held: &str) -> bool {
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
    writer: BatchWriter<Put>,
    changes: broadcast::Sender<StoreChange>,
}

impl EdgeStore {
    /// Opens (or creates) the store at `path` and starts its writer thread.
    pub fn open(path: &Path) -> Result<EdgeStore, StoreError> {
        let db = Database::create(path).map_err(redb::Error::from)?;
        let txn = db.begin_write().map_err(redb::Error::from)?;
        txn.open_table(OBJECTS).map_err(redb::Error::from)?;
        txn.commit().map_err(redb::Error::from)?;
        let (changes, _) = broadcast::channel(CHANGE_BACKLOG);
        let feed = changes.clone();
        let writer = BatchWriter::start(db, "edge-store", move |db, batch| {
            apply(db, batch, &feed);
        })
        .map_err(|e| StoreError::Redb(redb::Error::Io(e)))?;
        Ok(EdgeStore { writer, changes })
    }

    /// Stores `object` at `version` unless a newer version is held.
    /// Completes after the commit.
    pub async fn put(
        &self,
        resource: &str,
        version: &str,
        object: serde_json::Value,
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
        let submitted = self.writer.submit(Put {
            resource: resource.to_owned(),
            record,
            done,
        });
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

/// Applies a batch in one transaction (a write older than the version held
/// is stale and changes nothing), then confirms each write.
fn apply(db: &Database, batch: Vec<Put>, feed: &broadcast::Sender<StoreChange>) {
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
mod tests {
    use super::*;
    use serde_json::json;

    #[tokio::test]
    async fn newer_versions_win_and_tombstones_hold() {
        let dir = tempfile::tempdir().expect("dir");
        let store = EdgeStore::open(&dir.path().join("edge.redb")).expect("open");
        assert_eq!(
            store
                .put("default/pod/a", "2", json!({"v": 2}))
                .await
                .expect("put"),
            WriteOutcome::Applied
        );
        assert_eq!(
            store
                .put("default/pod/a", "1", json!({"v": 1}))
                .await
                .expect("put"),
            WriteOutcome::Stale
        );
        assert_eq!(
            store
                .put("default/pod/a", "2", json!({"v": 2}))
                .await
                .expect("put"),
            WriteOutcome::Stale
        );
        assert_eq!(
            store
                .get("default/pod/a")
                .expect("get")
                .and_then(|r| r.object),
            Some(json!({"v": 2}))
        );
        assert_eq!(
            store.delete("default/pod/a", "3").await.expect("delete"),
            WriteOutcome::Applied
        );
        assert_eq!(
            store
                .put("default/pod/a", "2", json!({"v": 2}))
                .await
                .expect("put"),
            WriteOutcome::Stale
        );
        assert!(
            store
                .get("default/pod/a")
                .expect("get")
                .is_some_and(|r| r.is_deleted())
        );
        store
            .put("default/pod/b", "1", json!(1))
            .await
            .expect("put");
        store
            .put("default/configmap/c", "1", json!(1))
            .await
            .expect("put");
        let pods = store.list("default/pod/").expect("list");
        assert_eq!(
            pods.iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>(),
            ["default/pod/b"]
        );
    }

    #[tokio::test]
    async fn committed_objects_survive_a_reopen() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("edge.redb");
        let store = EdgeStore::open(&path).expect("open");
        let writes: Vec<_> = (0..500)
            .map(|n| {
                let store = store.clone();
                tokio::spawn(
                    async move { store.put(&format!("default/pod/p{n}"), "1", json!(n)).await },
                )
            })
            .collect();
        for write in writes {
            write.await.expect("join").expect("committed");
        }
        store.close().await;
        let store = EdgeStore::open(&path).expect("reopen");
        assert_eq!(store.list("default/pod/").expect("list").len(), 500);
    }
}
