//! The cloud's desired state, behind [`DesiredStore`]. The embedded default
//! is [`RedbDesiredStore`]; another backend (a Kubernetes API server) plugs
//! in through the same trait, so nothing above it knows about redb.
//!
//! A store keeps one revision counter for everything it holds, as etcd
//! does: every write and every deletion gets the next revision, and an
//! object's `metadata.resourceVersion` is the revision of its last write.
//! Revisions are what the edge compares, so they only ever grow.

use std::path::Path;
use std::sync::Arc;

use futures_util::future::BoxFuture;
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use serde_json::Value;
use store::BatchWriter;
use tokio::sync::oneshot;
use tracing::error;

use apis::kinds::{Kind, ObjectKey};

/// A failure of the desired-state store.
#[derive(Debug, Clone, thiserror::Error)]
pub enum DesiredError {
    /// The backend failed.
    #[error("desired-state store: {0}")]
    Backend(String),
    /// A stored object could not be read back.
    #[error("desired-state object {key} unreadable: {reason}")]
    Corrupt {
        /// Which object.
        key: String,
        /// Why.
        reason: String,
    },
    /// The store has stopped.
    #[error("desired-state store stopped")]
    Stopped,
}

/// What a store write completes with.
pub type StoreFuture<T> = BoxFuture<'static, Result<T, DesiredError>>;

/// Desired state: Kubernetes objects (as JSON) by key, with revisions.
pub trait DesiredStore: Send + Sync + 'static {
    /// The object at `key`.
    fn get(&self, key: &ObjectKey) -> Result<Option<Value>, DesiredError>;

    /// The objects of `kind`, in `namespace` or in all, and the revision
    /// the list is current at.
    fn list(&self, kind: Kind, namespace: Option<&str>) -> Result<(Vec<Value>, u64), DesiredError>;

    /// Stores `object` at `key` under the next revision, which it also
    /// writes into `metadata.resourceVersion`; completes after the commit
    /// with the stored object and its revision.
    fn put(&self, key: ObjectKey, object: Value) -> StoreFuture<(Value, u64)>;

    /// Removes the object at `key`; completes after the commit with the
    /// object removed and the revision of the removal, or `None` if there
    /// was none.
    fn delete(&self, key: ObjectKey) -> StoreFuture<Option<(Value, u64)>>;

    /// Takes the next revision without writing an object (for messages
    /// that must supersede whatever a node holds, such as a withdrawal).
    fn next_revision(&self) -> StoreFuture<u64>;
}

const OBJECTS: TableDefinition<&str, &[u8]> = TableDefinition::new("objects");
const COUNTERS: TableDefinition<&str, u64> = TableDefinition::new("counters");
const REVISION: &str = "revision";

enum Write {
    Put {
        key: ObjectKey,
        object: Value,
        done: oneshot::Sender<Result<(Value, u64), DesiredError>>,
    },
    Delete {
        key: ObjectKey,
        done: oneshot::Sender<Result<Option<(Value, u64)>, DesiredError>>,
    },
    Bump {
        done: oneshot::Sender<Result<u64, DesiredError>>,
    },
}

/// The embedded desired-state store on redb: writes are batched into one
/// transaction on a thread of their own, so the controller never waits on
/// a commit it does not need.
#[derive(Clone)]
pub struct RedbDesiredStore {
    writer: BatchWriter<Write>,
}

fn backend(err: impl Into<redb::Error>) -> DesiredError {
    DesiredError::Backend(err.into().to_string())
}

impl RedbDesiredStore {
    /// Opens (or creates) the store at `path`.
    pub fn open(path: &Path) -> Result<Self, DesiredError> {
        let db = Database::create(path).map_err(backend)?;
        let txn = db.begin_write().map_err(backend)?;
        txn.open_table(OBJECTS).map_err(backend)?;
        {
            let mut counters = txn.open_table(COUNTERS).map_err(backend)?;
            if counters.get(REVISION).map_err(backend)?.is_none() {
                // A new store starts from the clock (in microseconds), not
                // from 0, so a cloud whose store was lost and re-created
                // still issues revisions above what its nodes hold.
                counters
                    .insert(REVISION, first_revision())
                    .map_err(backend)?;
            }
        }
        txn.commit().map_err(backend)?;
        let writer = BatchWriter::start(db, "desired-store", apply)
            .map_err(|err| DesiredError::Backend(err.to_string()))?;
        Ok(RedbDesiredStore { writer })
    }

    /// The store behind the trait, ready to share.
    pub fn shared(self) -> Arc<dyn DesiredStore> {
        Arc::new(self)
    }

    /// Commits what is pending and releases the file (once every clone is
    /// gone too).
    pub async fn close(self) {
        self.writer.close().await;
    }

    fn revision(&self) -> Result<u64, DesiredError> {
        let txn = self.writer.db().begin_read().map_err(backend)?;
        let table = txn.open_table(COUNTERS).map_err(backend)?;
        Ok(table
            .get(REVISION)
            .map_err(backend)?
            .map_or(0, |v| v.value()))
    }
}

fn first_revision() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| {
            u64::try_from(since.as_micros()).unwrap_or(u64::MAX / 2)
        })
}

fn storage_key(key: &ObjectKey) -> String {
    key.to_string()
}

fn decode(key: &str, bytes: &[u8]) -> Result<Value, DesiredError> {
    serde_json::from_slice(bytes).map_err(|err| DesiredError::Corrupt {
        key: key.to_owned(),
        reason: err.to_string(),
    })
}

impl DesiredStore for RedbDesiredStore {
    fn get(&self, key: &ObjectKey) -> Result<Option<Value>, DesiredError> {
        let txn = self.writer.db().begin_read().map_err(backend)?;
        let table = txn.open_table(OBJECTS).map_err(backend)?;
        let stored = storage_key(key);
        match table.get(stored.as_str()).map_err(backend)? {
            Some(bytes) => decode(&stored, bytes.value()).map(Some),
            None => Ok(None),
        }
    }

    fn list(&self, kind: Kind, namespace: Option<&str>) -> Result<(Vec<Value>, u64), DesiredError> {
        // Revision first: the list is at least as new as the number says.
        let revision = self.revision()?;
        let txn = self.writer.db().begin_read().map_err(backend)?;
        let table = txn.open_table(OBJECTS).map_err(backend)?;
        let prefix = match namespace.filter(|_| kind.namespaced()) {
            Some(namespace) => format!("{}/{namespace}/", kind.plural()),
            None => format!("{}/", kind.plural()),
        };
        let mut objects = Vec::new();
        for entry in table.range(prefix.as_str()..).map_err(backend)? {
            let (key, value) = entry.map_err(backend)?;
            if !key.value().starts_with(&prefix) {
                break;
            }
            objects.push(decode(key.value(), value.value())?);
        }
        Ok((objects, revision))
    }

    fn put(&self, key: ObjectKey, object: Value) -> StoreFuture<(Value, u64)> {
        let (done, committed) = oneshot::channel();
        let submitted = self.writer.submit(Write::Put { key, object, done });
        Box::pin(async move {
            if !submitted {
                return Err(DesiredError::Stopped);
            }
            committed.await.unwrap_or(Err(DesiredError::Stopped))
        })
    }

    fn delete(&self, key: ObjectKey) -> StoreFuture<Option<(Value, u64)>> {
        let (done, committed) = oneshot::channel();
        let submitted = self.writer.submit(Write::Delete { key, done });
        Box::pin(async move {
            if !submitted {
                return Err(DesiredError::Stopped);
            }
            committed.await.unwrap_or(Err(DesiredError::Stopped))
        })
    }

    fn next_revision(&self) -> StoreFuture<u64> {
        let (done, committed) = oneshot::channel();
        let submitted = self.writer.submit(Write::Bump { done });
        Box::pin(async move {
            if !submitted {
                return Err(DesiredError::Stopped);
            }
            committed.await.unwrap_or(Err(DesiredError::Stopped))
        })
    }
}

/// A write's answer, sent once the batch is committed.
enum Answer {
    Put(
        oneshot::Sender<Result<(Value, u64), DesiredError>>,
        Result<(Value, u64), DesiredError>,
    ),
    Delete(
        oneshot::Sender<Result<Option<(Value, u64)>, DesiredError>>,
        Result<Option<(Value, u64)>, DesiredError>,
    ),
    Bump(oneshot::Sender<Result<u64, DesiredError>>, u64),
}

/// Applies a batch in one transaction, giving each write the next
/// revision, then answers every write.
fn apply(db: &Database, batch: Vec<Write>) {
    let mut answers = Vec::with_capacity(batch.len());
    let committed = (|| -> Result<(), redb::Error> {
        let txn = db.begin_write()?;
        {
            let mut counters = txn.open_table(COUNTERS)?;
            let mut revision = counters.get(REVISION)?.map_or(0, |v| v.value());
            let mut objects = txn.open_table(OBJECTS)?;
            for write in batch {
                match write {
                    Write::Put {
                        key,
                        mut object,
                        done,
                    } => {
                        revision += 1;
                        if let Some(metadata) =
                            object.get_mut("metadata").and_then(Value::as_object_mut)
                        {
                            metadata.insert(
                                "resourceVersion".to_owned(),
                                Value::String(revision.to_string()),
                            );
                        }
                        let answer = match serde_json::to_vec(&object) {
                            Ok(bytes) => {
                                objects.insert(storage_key(&key).as_str(), bytes.as_slice())?;
                                Ok((object, revision))
                            }
                            Err(err) => Err(DesiredError::Backend(err.to_string())),
                        };
                        answers.push(Answer::Put(done, answer));
                    }
                    Write::Delete { key, done } => {
                        let stored = storage_key(&key);
                        let removed = objects
                            .remove(stored.as_str())?
                            .map(|bytes| decode(&stored, bytes.value()));
                        let answer = match removed {
                            Some(Ok(object)) => {
                                revision += 1;
                                Ok(Some((object, revision)))
                            }
                            Some(Err(err)) => {
                                revision += 1;
                                Err(err)
                            }
                            None => Ok(None),
                        };
                        answers.push(Answer::Delete(done, answer));
                    }
                    Write::Bump { done } => {
                        revision += 1;
                        answers.push(Answer::Bump(done, revision));
                    }
                }
            }
            counters.insert(REVISION, revision)?;
        }
        txn.commit()?;
        Ok(())
    })();
    let failure = committed.err().map(|err| {
        error!(error = %err, "desired-state commit failed");
        DesiredError::Backend(err.to_string())
    });
    for answer in answers {
        match answer {
            Answer::Put(done, answer) => {
                let _ = done.send(match &failure {
                    Some(err) => Err(err.clone()),
                    None => answer,
                });
            }
            Answer::Delete(done, answer) => {
                let _ = done.send(match &failure {
                    Some(err) => Err(err.clone()),
                    None => answer,
                });
            }
            Answer::Bump(done, revision) => {
                let _ = done.send(match &failure {
                    Some(err) => Err(err.clone()),
                    None => Ok(revision),
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(name: &str) -> (ObjectKey, Value) {
        (
            ObjectKey::new(Kind::Pod, "default", name),
            json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"}}),
        )
    }

    #[tokio::test]
    async fn revisions_grow_across_writes_deletes_and_reopens() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("desired.redb");
        let store = RedbDesiredStore::open(&path).expect("open");
        let (a, object) = pod("a");
        let (stored, first) = store.put(a.clone(), object.clone()).await.expect("put");
        assert_eq!(stored["metadata"]["resourceVersion"], first.to_string());
        let (_, second) = store.put(a.clone(), object).await.expect("put");
        assert!(second > first);
        let (b, object) = pod("b");
        store.put(b.clone(), object).await.expect("put");
        let cm = ObjectKey::new(Kind::ConfigMap, "default", "a");
        store
            .put(
                cm.clone(),
                json!({"kind": "ConfigMap", "metadata": {"name": "a"}}),
            )
            .await
            .expect("put");
        let (pods, at) = store.list(Kind::Pod, Some("default")).expect("list");
        assert_eq!(pods.len(), 2);
        let (_, removal) = store
            .delete(a.clone())
            .await
            .expect("delete")
            .expect("held");
        assert!(removal > at);
        let bumped = store.next_revision().await.expect("bump");
        assert_eq!(bumped, removal + 1);
        assert!(store.delete(a.clone()).await.expect("delete").is_none());
        assert!(store.get(&a).expect("get").is_none());
        store.close().await;

        let store = RedbDesiredStore::open(&path).expect("reopen");
        let (pods, at) = store.list(Kind::Pod, None).expect("list");
        assert_eq!(pods.len(), 1);
        assert_eq!(at, bumped);
        let (_, next) = store.put(a, pod("a").1).await.expect("put");
        assert_eq!(next, bumped + 1);
        // A store made anew later starts above what the old one issued.
        let fresh = RedbDesiredStore::open(&dir.path().join("fresh.redb")).expect("fresh");
        let (_, first_of_fresh) = fresh.put(pod("z").0, pod("z").1).await.expect("put");
        assert!(first_of_fresh > first, "{first_of_fresh} <= {first}");
    }
}
