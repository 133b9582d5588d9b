//! Storage helpers for edgehive's redb stores.
//!
//! [`BatchWriter`] runs a store's writes on a thread of its own, so that no
//! actor thread ever waits for a commit. Whatever is waiting when the thread
//! wakes is handed to the store's `apply` function in one batch, which
//! commits it in one transaction; that is where the throughput comes from.
//! Confirmations (oneshot senders inside the operations) are the store's
//! business: `apply` answers them after its commit.
//!
//! ```
//! use store::BatchWriter;
//! # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
//! let dir = tempfile::tempdir().unwrap();
//! let db = redb::Database::create(dir.path().join("demo.redb")).unwrap();
//! let writer = BatchWriter::start(db, "demo-writer", |_db: &redb::Database, batch: Vec<u32>| {
//!     assert!(!batch.is_empty()); // one transaction for the whole batch
//! })
//! .unwrap();
//! assert!(writer.submit(7));
//! writer.close().await; // applied, thread gone, file released
//! # });
//! ```

use std::sync::Arc;

use redb::Database;
use tokio::sync::{mpsc, oneshot};

/// Operations a batch holds at most.
const MAX_BATCH: usize = 4096;

/// The page cache each store keeps in memory, in bytes. redb's own default
/// is 1 GiB, kept as long as the process runs: every page a store ever
/// touched stays resident. Beyond this, pages are read again from the
/// file, which the kernel's page cache keeps (shared, and given back
/// under pressure), so little is lost.
pub const PAGE_CACHE_BYTES: usize = 4 * 1024 * 1024;

/// Why a database could not be opened; each names its file.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// Another process holds the file (redb locks it while open).
    #[error(
        "{path} is open in another process (another edgecore or cloudcore on this data \
         directory?)"
    )]
    InUse {
        /// The database file.
        path: std::path::PathBuf,
    },
    /// Anything else: no such directory, no permission, a corrupt file.
    #[error("{path}: {source}")]
    Other {
        /// The database file.
        path: std::path::PathBuf,
        /// What redb said.
        #[source]
        source: redb::DatabaseError,
    },
}

/// Opens (or creates) the redb database at `path` with edgehive's page
/// cache ([`PAGE_CACHE_BYTES`]).
pub fn open_database(path: impl AsRef<std::path::Path>) -> Result<Database, OpenError> {
    let path = path.as_ref();
    redb::Builder::new()
        .set_cache_size(PAGE_CACHE_BYTES)
        .create(path)
        .map_err(|source| match source {
            redb::DatabaseError::DatabaseAlreadyOpen => OpenError::InUse {
                path: path.to_owned(),
            },
            source => OpenError::Other {
                path: path.to_owned(),
                source,
            },
        })
}

enum Control<Op> {
    Op(Op),
    Close(oneshot::Sender<()>),
}

/// A writer thread that applies operations to a redb database in batches.
pub struct BatchWriter<Op> {
    ops: mpsc::UnboundedSender<Control<Op>>,
    db: Arc<Database>,
}

impl<Op> Clone for BatchWriter<Op> {
    fn clone(&self) -> Self {
        BatchWriter {
            ops: self.ops.clone(),
            db: self.db.clone(),
        }
    }
}

impl<Op: Send + 'static> BatchWriter<Op> {
    /// Starts a thread named `name` that hands batches of submitted
    /// operations to `apply`, in submission order.
    pub fn start(
        db: Database,
        name: &str,
        mut apply: impl FnMut(&Database, Vec<Op>) + Send + 'static,
    ) -> std::io::Result<Self> {
        let db = Arc::new(db);
        let (ops, mut rx) = mpsc::unbounded_channel::<Control<Op>>();
        let writer_db = db.clone();
        std::thread::Builder::new()
            .name(name.to_owned())
            .spawn(move || {
                let mut closed = None;
                while let Some(first) = rx.blocking_recv() {
                    let mut batch = Vec::new();
                    let mut next = Some(first);
                    while let Some(control) = next.take() {
                        match control {
                            Control::Op(op) => batch.push(op),
                            // Everything submitted before the close is applied.
                            Control::Close(done) => closed = Some(done),
                        }
                        if batch.len() < MAX_BATCH && closed.is_none() {
                            next = rx.try_recv().ok();
                        }
                    }
                    if !batch.is_empty() {
                        apply(&writer_db, batch);
                    }
                    if closed.is_some() {
                        break;
                    }
                }
                drop(rx);
                // The database handle goes before the closer hears back.
                drop(writer_db);
                if let Some(done) = closed {
                    let _ = done.send(());
                }
            })?;
        Ok(BatchWriter { ops, db })
    }

    /// Queues an operation; false if the writer has stopped.
    pub fn submit(&self, op: Op) -> bool {
        self.ops.send(Control::Op(op)).is_ok()
    }

    /// The database, for reads.
    pub fn db(&self) -> &Database {
        &self.db
    }

    /// Applies what was submitted, stops the thread, and releases the file
    /// once every other handle is gone too.
    pub async fn close(self) {
        let (done, closed) = oneshot::channel();
        if self.ops.send(Control::Close(done)).is_ok() {
            let _ = closed.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[test]
    fn a_database_that_cannot_open_names_its_file() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("held.redb");
        let _held = open_database(&path).expect("the first open");
        let err = open_database(&path).expect_err("held by the first");
        assert!(matches!(err, OpenError::InUse { .. }), "{err:?}");
        assert!(
            err.to_string().contains(&path.display().to_string()),
            "{err}"
        );
        let missing = dir.path().join("no-such-dir").join("x.redb");
        let err = open_database(&missing).expect_err("no directory");
        assert!(
            err.to_string().contains(&missing.display().to_string()),
            "{err}"
        );
    }

    #[tokio::test]
    async fn batches_keep_submission_order_and_close_releases_the_file() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("t.redb");
        let seen = Arc::new(Mutex::new(Vec::new()));
        let record = seen.clone();
        let writer = BatchWriter::start(
            Database::create(&path).expect("db"),
            "t",
            move |_, batch: Vec<u32>| {
                record.lock().expect("seen").extend(batch);
            },
        )
        .expect("start");
        for n in 0..10_000 {
            assert!(writer.submit(n));
        }
        writer.close().await;
        assert_eq!(*seen.lock().expect("seen"), (0..10_000).collect::<Vec<_>>());
        // Released: the file opens again at once.
        Database::create(&path).expect("reopen");
    }
}
