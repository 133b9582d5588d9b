//! Persistence of the cloud's per-node queues in redb, so that a cloud
//! restart loses nothing. Writes are batched into one transaction by a
//! writer thread; nothing blocks an actor thread.

use std::path::Path;

use beehive::Message;
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use store::BatchWriter;
use tokio::sync::oneshot;
use tracing::error;

/// node \0 resource -> MessagePack message.
const DOWNSTREAM: TableDefinition<&str, &[u8]> = TableDefinition::new("downstream");

/// A failure of the queue store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// redb failed.
    #[error("queue store: {0}")]
    Redb(#[from] redb::Error),
    /// The database file could not be opened.
    #[error("queue store: {0}")]
    Open(#[from] store::OpenError),
    /// A stored message could not be read back.
    #[error("queue store holds an unreadable message: {0}")]
    Corrupt(#[from] beehive::MessageError),
    /// A batched write failed; what it held is not stored.
    #[error("queue store write failed: {0}")]
    Write(String),
    /// The writer thread is gone.
    #[error("queue store writer stopped")]
    Stopped,
}

fn key(node: &str, resource: &str) -> String {
    format!("{node}\0{resource}")
}

enum Op {
    Put { node: String, msg: Message },
    Remove { node: String, resource: String },
    Flush(oneshot::Sender<Result<(), StoreError>>),
}

/// Handle to the queue store; cheap to clone.
#[derive(Clone)]
pub struct QueueStore {
    writer: BatchWriter<Op>,
}

impl QueueStore {
    /// Opens (or creates) the store at `path` and starts its writer thread.
    pub fn open(path: &Path) -> Result<QueueStore, StoreError> {
        let db = store::open_database(path)?;
        let txn = db.begin_write().map_err(redb::Error::from)?;
        txn.open_table(DOWNSTREAM).map_err(redb::Error::from)?;
        txn.commit().map_err(redb::Error::from)?;
        let writer = BatchWriter::start(db, "hub-queue-store", apply)
            .map_err(|e| StoreError::Redb(redb::Error::Io(e)))?;
        Ok(QueueStore { writer })
    }

    /// Records the newest version of an object for `node`.
    pub fn put(&self, node: &str, msg: &Message) {
        self.writer.submit(Op::Put {
            node: node.to_owned(),
            msg: msg.clone(),
        });
    }

    /// Forgets an object `node` acknowledged.
    pub fn remove(&self, node: &str, resource: &str) {
        self.writer.submit(Op::Remove {
            node: node.to_owned(),
            resource: resource.to_owned(),
        });
    }

    /// Completes once everything sent before is committed.
    pub async fn flush(&self) -> Result<(), StoreError> {
        let (done, committed) = oneshot::channel();
        if !self.writer.submit(Op::Flush(done)) {
            return Err(StoreError::Stopped);
        }
        committed.await.map_err(|_| StoreError::Stopped)?
    }

    /// Commits what is pending, stops the writer and releases the file once
    /// every other handle is gone too.
    pub async fn close(self) {
        self.writer.close().await;
    }

    /// Every stored object of one node.
    pub fn load_node(&self, node: &str) -> Result<Vec<Message>, StoreError> {
        let txn = self.writer.db().begin_read().map_err(redb::Error::from)?;
        let table = txn.open_table(DOWNSTREAM).map_err(redb::Error::from)?;
        let start = format!("{node}\0");
        let end = format!("{node}\u{1}");
        let mut out = Vec::new();
        for entry in table
            .range(start.as_str()..end.as_str())
            .map_err(redb::Error::from)?
        {
            let (_, value) = entry.map_err(redb::Error::from)?;
            out.push(Message::from_bytes(value.value())?);
        }
        Ok(out)
    }

    /// Every stored object, by node.
    pub fn load(&self) -> Result<Vec<(String, Message)>, StoreError> {
        let txn = self.writer.db().begin_read().map_err(redb::Error::from)?;
        let table = txn.open_table(DOWNSTREAM).map_err(redb::Error::from)?;
        let mut out = Vec::new();
        for entry in table.iter().map_err(redb::Error::from)? {
            let (key, value) = entry.map_err(redb::Error::from)?;
            let node = key
                .value()
                .split('\0')
                .next()
                .unwrap_or_default()
                .to_owned();
            out.push((node, Message::from_bytes(value.value())?));
        }
        Ok(out)
    }
}

/// Commits a batch in one transaction, then answers the flushes in it.
fn apply(db: &Database, batch: Vec<Op>) {
    let committed = commit(db, &batch);
    if let Err(err) = &committed {
        error!(error = %err, "queue store write failed");
    }
    for op in batch {
        if let Op::Flush(done) = op {
            let _ = done.send(
                committed
                    .as_ref()
                    .map(|_| ())
                    .map_err(|e| StoreError::Write(e.to_string())),
            );
        }
    }
}

fn commit(db: &Database, batch: &[Op]) -> Result<(), redb::Error> {
    let txn = db.begin_write()?;
    {
        let mut table = txn.open_table(DOWNSTREAM)?;
        for op in batch {
            match op {
                Op::Put { node, msg } => {
                    // An object that cannot be encoded was refused before it was queued.
                    if let Ok(bytes) = msg.to_bytes() {
                        table.insert(key(node, msg.resource()).as_str(), bytes.as_slice())?;
                    }
                }
                Op::Remove { node, resource } => {
                    table.remove(key(node, resource).as_str())?;
                }
                Op::Flush(_) => {}
            }
        }
    }
    txn.commit()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn objects_survive_a_reopen_and_acks_remove_them() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("queues.redb");
        let a = Message::new()
            .build_router("ec", "resource", "default/pod/a", "insert")
            .with_resource_version("1");
        let b = Message::new()
            .build_router("ec", "resource", "default/pod/b", "insert")
            .with_resource_version("1");
        {
            let store = QueueStore::open(&path).expect("open");
            store.put("n1", &a);
            store.put("n2", &b);
            store.put("n1", &b);
            store.remove("n1", "default/pod/b");
            store.flush().await.expect("flush");
            store.close().await;
        }
        let store = QueueStore::open(&path).expect("reopen");
        let mut loaded = store.load().expect("load");
        loaded.sort_by(|x, y| x.0.cmp(&y.0));
        assert_eq!(loaded, [("n1".to_owned(), a), ("n2".to_owned(), b)]);
    }
}
