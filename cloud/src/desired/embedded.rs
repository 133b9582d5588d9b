//! The embedded desired-state backend: redb on the cloud's disk, the
//! zero-setup default.
//!
//! One revision counter for everything, as etcd has: every write and every
//! deletion takes the next revision, which becomes the object's
//! `metadata.resourceVersion`. Writes are batched into one transaction on a
//! thread of their own ([`store::BatchWriter`]), so no caller waits on a
//! commit it does not need. It behaves as kube-apiserver does for what an
//! edge sees: creates get a uid, a creation time and the API server's
//! defaults; a replace that changes nothing writes nothing; a pod's node is
//! immutable once set.
//!
//! Watches are served from a window of recent changes kept in memory (and
//! a broadcast of new ones): a watch from a revision older than the window
//! fails with [`DesiredError::Gone`] and the watcher lists again, as with
//! an API server's compacted history.

use std::path::Path;
use std::sync::Arc;

use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use serde_json::{Value, json};
use store::BatchWriter;
use tokio::sync::oneshot;
use tracing::error;

use apis::kinds::{Kind, ObjectKey};

use super::bound_node as node_name;
use super::feed::Feed;
use super::{
    DesiredError, DesiredState, Object, SPEC_REVISION, StoreFuture, WatchEvent, WatchStream,
    desired_body, object_of, revision_of, spec_revision_of,
};

const OBJECTS: TableDefinition<&str, &[u8]> = TableDefinition::new("objects");
const COUNTERS: TableDefinition<&str, u64> = TableDefinition::new("counters");
const REVISION: &str = "revision";

/// Changes of each kind kept in memory for watches to resume from.
const WINDOW: usize = 16 * 1024;

/// A write the writer thread applies.
enum Write {
    Create(Object, Reply<Object>),
    Replace {
        object: Object,
        status_only: bool,
        done: Reply<Object>,
    },
    Delete(ObjectKey, Reply<Option<Object>>),
    Bump(Reply<u64>),
}

type Reply<T> = oneshot::Sender<Result<T, DesiredError>>;

/// Sends a write's answer once its batch is committed (or failed: then
/// the commit's error).
type Answer = Box<dyn FnOnce(Option<&DesiredError>) + Send>;

/// The embedded desired-state store on redb.
#[derive(Clone)]
pub struct EmbeddedStore {
    writer: BatchWriter<Write>,
    feed: Arc<Feed>,
}

fn backend(err: impl Into<redb::Error>) -> DesiredError {
    DesiredError::Backend(err.into().to_string())
}

impl EmbeddedStore {
    /// Opens (or creates) the store at `path`.
    pub fn open(path: &Path) -> Result<Self, DesiredError> {
        let db =
            store::open_database(path).map_err(|err| DesiredError::Backend(err.to_string()))?;
        let txn = db.begin_write().map_err(backend)?;
        txn.open_table(OBJECTS).map_err(backend)?;
        let revision = {
            let mut counters = txn.open_table(COUNTERS).map_err(backend)?;
            let held = counters.get(REVISION).map_err(backend)?.map(|v| v.value());
            match held {
                Some(revision) => revision,
                None => {
                    // A new store starts from the clock (in microseconds),
                    // not from 0, so a cloud whose store was lost and
                    // re-created still issues revisions above what its
                    // nodes hold.
                    let first = super::clock_revision();
                    counters.insert(REVISION, first).map_err(backend)?;
                    first
                }
            }
        };
        txn.commit().map_err(backend)?;
        let feed = Arc::new(Feed::new(WINDOW, revision));
        let writer_feed = feed.clone();
        let writer = BatchWriter::start(db, "desired-store", move |db, batch| {
            apply(db, &writer_feed, batch)
        })
        .map_err(|err| DesiredError::Backend(err.to_string()))?;
        Ok(EmbeddedStore { writer, feed })
    }

    /// The store behind the trait, ready to share.
    pub fn shared(self) -> Arc<dyn DesiredState> {
        Arc::new(self)
    }

    /// Commits what is pending and releases the file (once every clone is
    /// gone too).
    pub async fn close(self) {
        self.writer.close().await;
    }

    fn submit<T: Send + 'static>(&self, write: impl FnOnce(Reply<T>) -> Write) -> StoreFuture<T> {
        let (done, committed) = oneshot::channel();
        let submitted = self.writer.submit(write(done));
        Box::pin(async move {
            if !submitted {
                return Err(DesiredError::Stopped);
            }
            committed.await.unwrap_or(Err(DesiredError::Stopped))
        })
    }
}

pub(super) fn storage_key(key: &ObjectKey) -> String {
    key.to_string()
}

fn decode(key: &str, bytes: &[u8]) -> Result<Value, DesiredError> {
    serde_json::from_slice(bytes).map_err(|err| DesiredError::Corrupt {
        key: key.to_owned(),
        reason: err.to_string(),
    })
}

fn decode_object(key: &str, bytes: &[u8]) -> Result<Object, DesiredError> {
    Object::new(decode(key, bytes)?).map_err(|err| DesiredError::Corrupt {
        key: key.to_owned(),
        reason: err.to_string(),
    })
}

impl DesiredState for EmbeddedStore {
    fn get(&self, key: &ObjectKey) -> Result<Option<Object>, DesiredError> {
        let txn = self.writer.db().begin_read().map_err(backend)?;
        let table = txn.open_table(OBJECTS).map_err(backend)?;
        let stored = storage_key(key);
        match table.get(stored.as_str()).map_err(backend)? {
            Some(bytes) => decode_object(&stored, bytes.value()).map(Some),
            None => Ok(None),
        }
    }

    fn list_each(
        &self,
        kind: Kind,
        namespace: Option<&str>,
        visit: &mut dyn FnMut(Object),
    ) -> Result<u64, DesiredError> {
        // One read transaction: the revision and the objects are of the
        // same moment.
        let txn = self.writer.db().begin_read().map_err(backend)?;
        let revision = txn
            .open_table(COUNTERS)
            .map_err(backend)?
            .get(REVISION)
            .map_err(backend)?
            .map_or(0, |v| v.value());
        let table = txn.open_table(OBJECTS).map_err(backend)?;
        let prefix = match namespace.filter(|_| kind.namespaced()) {
            Some(namespace) => format!("{}/{namespace}/", kind.plural()),
            None => format!("{}/", kind.plural()),
        };
        for entry in table.range(prefix.as_str()..).map_err(backend)? {
            let (key, value) = entry.map_err(backend)?;
            if !key.value().starts_with(&prefix) {
                break;
            }
            visit(decode_object(key.value(), value.value())?);
        }
        Ok(revision)
    }

    fn watch(&self, kind: Kind, since: u64) -> Result<WatchStream, DesiredError> {
        self.feed.watch(kind, since)
    }

    fn create(&self, object: Object) -> StoreFuture<Object> {
        self.submit(|done| Write::Create(object, done))
    }

    fn replace(&self, object: Object) -> StoreFuture<Object> {
        // A replace that changes nothing (a re-apply of the same manifest)
        // costs a read, as with an API server: no write transaction, no
        // wait behind other writes. What it is judged against may change
        // right after; then the replace came first.
        if let Ok(Some(existing)) = self.get(object.key())
            && with_spec(existing.json(), object.json().clone(), object.key())
                .is_ok_and(|same| &same == existing.json())
        {
            return Box::pin(async move { Ok(existing) });
        }
        self.submit(|done| Write::Replace {
            object,
            status_only: false,
            done,
        })
    }

    fn replace_status(&self, object: Object) -> StoreFuture<Object> {
        self.submit(|done| Write::Replace {
            object,
            status_only: true,
            done,
        })
    }

    fn delete(&self, key: &ObjectKey) -> StoreFuture<Option<Object>> {
        let key = key.clone();
        self.submit(|done| Write::Delete(key, done))
    }

    fn next_revision(&self) -> StoreFuture<u64> {
        self.submit(Write::Bump)
    }
}

fn now() -> String {
    let now = jiff::Timestamp::now();
    jiff::Timestamp::from_second(now.as_second())
        .unwrap_or(now)
        .to_string()
}

pub(super) fn set_revision(object: &mut Value, revision: u64) {
    if let Some(metadata) = object.get_mut("metadata").and_then(Value::as_object_mut) {
        metadata.insert(
            "resourceVersion".to_owned(),
            Value::String(revision.to_string()),
        );
    }
}

/// A write's answer and the change it made, decided inside the batch's
/// transaction.
struct Outcome<T> {
    answer: Result<T, DesiredError>,
    change: Option<(Kind, WatchEvent)>,
}

impl<T> Outcome<T> {
    fn refused(err: DesiredError) -> Self {
        Outcome {
            answer: Err(err),
            change: None,
        }
    }
}

/// What a create stores: the object with the API server's defaults, a
/// uid, a creation time and no status but what the server sets.
pub(super) fn created(mut object: Value, key: &ObjectKey) -> Result<Value, DesiredError> {
    let invalid = |reason: String| DesiredError::Invalid {
        key: key.to_string(),
        reason,
    };
    if !object.get("metadata").is_some_and(Value::is_object) {
        return Err(invalid("no metadata".to_owned()));
    }
    if let Some(map) = object.as_object_mut() {
        map.remove("status");
    }
    let metadata = &mut object["metadata"];
    if let Some(metadata) = metadata.as_object_mut() {
        metadata.remove("resourceVersion");
        if let Some(annotations) = metadata
            .get_mut("annotations")
            .and_then(Value::as_object_mut)
        {
            annotations.remove(SPEC_REVISION);
        }
    }
    metadata["uid"] = json!(beehive::Uuid::new_v4().to_string());
    metadata["creationTimestamp"] = json!(now());
    apis::defaults::apply(&mut object).map_err(|err| invalid(err.to_string()))?;
    Ok(object)
}

/// Applies a batch in one transaction, giving each change the next
/// revision, then answers every write and publishes the changes.
fn apply(db: &Database, feed: &Feed, batch: Vec<Write>) {
    let mut answers: Vec<Answer> = Vec::with_capacity(batch.len());
    let mut changes = Vec::new();
    let committed = (|| -> Result<(), redb::Error> {
        let txn = db.begin_write()?;
        {
            let mut counters = txn.open_table(COUNTERS)?;
            let mut revision = counters.get(REVISION)?.map_or(0, |v| v.value());
            let mut objects = txn.open_table(OBJECTS)?;
            for write in batch {
                match write {
                    Write::Create(object, done) => {
                        let outcome = (|| -> Result<Outcome<Object>, redb::Error> {
                            let key = object.key().clone();
                            let stored = storage_key(&key);
                            if objects.get(stored.as_str())?.is_some() {
                                return Ok(Outcome::refused(DesiredError::AlreadyExists {
                                    key: key.to_string(),
                                }));
                            }
                            let mut object = match created(object.into_json(), &key) {
                                Ok(object) => object,
                                Err(err) => return Ok(Outcome::refused(err)),
                            };
                            revision += 1;
                            set_revision(&mut object, revision);
                            let object = match object_of(object) {
                                Ok(object) => object,
                                Err(err) => return Ok(Outcome::refused(err)),
                            };
                            put(&mut objects, &stored, object.json())?;
                            Ok(Outcome {
                                change: Some((key.kind, WatchEvent::Added(object.clone()))),
                                answer: Ok(object),
                            })
                        })()?;
                        answers.push(answer_with(done, outcome.answer));
                        changes.extend(outcome.change);
                    }
                    Write::Replace {
                        object,
                        status_only,
                        done,
                    } => {
                        let outcome = (|| -> Result<Outcome<Object>, redb::Error> {
                            let key = object.key().clone();
                            let stored = storage_key(&key);
                            let existing = match objects.get(stored.as_str())? {
                                Some(bytes) => decode(&stored, bytes.value()),
                                None => Err(DesiredError::NotFound {
                                    key: key.to_string(),
                                }),
                            };
                            let existing = match existing {
                                Ok(existing) => existing,
                                Err(err) => return Ok(Outcome::refused(err)),
                            };
                            let replaced = match status_only {
                                true => with_status(&existing, object.json(), &key),
                                false => with_spec(&existing, object.into_json(), &key),
                            };
                            let mut replaced = match replaced {
                                Ok(replaced) => replaced,
                                Err(err) => return Ok(Outcome::refused(err)),
                            };
                            if replaced == existing {
                                // Nothing changed: nothing is written, as
                                // with an API server.
                                return Ok(Outcome {
                                    answer: object_of(existing),
                                    change: None,
                                });
                            }
                            revision += 1;
                            set_revision(&mut replaced, revision);
                            let replaced = match object_of(replaced) {
                                Ok(replaced) => replaced,
                                Err(err) => return Ok(Outcome::refused(err)),
                            };
                            put(&mut objects, &stored, replaced.json())?;
                            Ok(Outcome {
                                change: Some((key.kind, WatchEvent::Modified(replaced.clone()))),
                                answer: Ok(replaced),
                            })
                        })()?;
                        answers.push(answer_with(done, outcome.answer));
                        changes.extend(outcome.change);
                    }
                    Write::Delete(key, done) => {
                        let stored = storage_key(&key);
                        let removed = objects
                            .remove(stored.as_str())?
                            .map(|bytes| decode_object(&stored, bytes.value()));
                        let answer = match removed {
                            Some(Ok(mut object)) => {
                                revision += 1;
                                object.set_revision(revision);
                                changes.push((key.kind, WatchEvent::Deleted(object.clone())));
                                Ok(Some(object))
                            }
                            Some(Err(err)) => {
                                revision += 1;
                                Err(err)
                            }
                            None => Ok(None),
                        };
                        answers.push(answer_with(done, answer));
                    }
                    Write::Bump(done) => {
                        revision += 1;
                        answers.push(answer_with(done, Ok(revision)));
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
    if failure.is_none() {
        feed.publish(changes);
    }
    for answer in answers {
        answer(failure.as_ref());
    }
}

fn put(
    objects: &mut redb::Table<&str, &[u8]>,
    stored: &str,
    object: &Value,
) -> Result<(), redb::Error> {
    let bytes = serde_json::to_vec(object).map_err(|err| redb::Error::Io(err.into()))?;
    objects.insert(stored, bytes.as_slice())?;
    Ok(())
}

fn answer_with<T: Send + 'static>(done: Reply<T>, answer: Result<T, DesiredError>) -> Answer {
    Box::new(move |failure| {
        let _ = done.send(match failure {
            Some(err) => Err(err.clone()),
            None => answer,
        });
    })
}

/// Checks a write's precondition: the revision it was read at, if given.
fn precondition(existing: &Value, given: &Value, key: &ObjectKey) -> Result<(), DesiredError> {
    let expected = revision_of(given);
    let held = revision_of(existing);
    if expected != 0 && expected != held {
        return Err(DesiredError::Conflict {
            key: key.to_string(),
            reason: format!("written at revision {expected}, stored at {held}"),
        });
    }
    Ok(())
}

/// `existing` with the spec of `given` (its status, uid and creation time
/// kept), or why not.
pub(super) fn with_spec(
    existing: &Value,
    mut given: Value,
    key: &ObjectKey,
) -> Result<Value, DesiredError> {
    precondition(existing, &given, key)?;
    if key.kind.bound_to_node()
        && let Some(bound) = node_name(existing)
        && node_name(&given) != Some(bound)
    {
        return Err(DesiredError::Invalid {
            key: key.to_string(),
            reason: format!("spec.nodeName is immutable once set (bound to {bound})"),
        });
    }
    apis::defaults::apply(&mut given).map_err(|err| DesiredError::Invalid {
        key: key.to_string(),
        reason: err.to_string(),
    })?;
    if desired_body(&given) == desired_body(existing) {
        return Ok(existing.clone());
    }
    for field in ["uid", "creationTimestamp", "resourceVersion"] {
        match existing["metadata"].get(field) {
            Some(value) => given["metadata"][field] = value.clone(),
            None => {
                if let Some(metadata) = given["metadata"].as_object_mut() {
                    metadata.remove(field);
                }
            }
        }
    }
    if let Some(annotations) = given["metadata"]
        .get_mut("annotations")
        .and_then(Value::as_object_mut)
    {
        annotations.remove(SPEC_REVISION);
    }
    match existing.get("status") {
        Some(status) => given["status"] = status.clone(),
        None => {
            if let Some(map) = given.as_object_mut() {
                map.remove("status");
            }
        }
    }
    Ok(given)
}

/// `existing` with the status of `given`, its spec revision recorded, or
/// why not.
pub(super) fn with_status(
    existing: &Value,
    given: &Value,
    key: &ObjectKey,
) -> Result<Value, DesiredError> {
    precondition(existing, given, key)?;
    let Some(status) = given.get("status") else {
        return Err(DesiredError::Invalid {
            key: key.to_string(),
            reason: "a status write needs a status".to_owned(),
        });
    };
    if existing.get("status") == Some(status) {
        return Ok(existing.clone());
    }
    let mut object = existing.clone();
    // The new revision is the status's; the node keeps the spec's.
    let held = spec_revision_of(existing).to_string();
    if let Some(metadata) = object.get_mut("metadata").and_then(Value::as_object_mut) {
        let annotations = metadata.entry("annotations").or_insert_with(|| json!({}));
        if let Some(annotations) = annotations.as_object_mut() {
            annotations.insert(SPEC_REVISION.to_owned(), Value::String(held));
        }
    }
    object["status"] = status.clone();
    Ok(object)
}

#[cfg(test)]
mod tests;
