//! The accepting side: a queue of established links fed by an accept task.
//! Each handshake runs in its own task under a timeout, so a peer that
//! connects and stalls never holds up the others.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tracing::warn;

use crate::error::TransportError;
use crate::link::{Limits, Link};

/// Links accepted by one listener, and what it refused.
pub struct Listener {
    links: mpsc::Receiver<Link>,
    local_addr: String,
    counts: Arc<Counts>,
    accept_task: JoinHandle<()>,
    on_shutdown: Option<Box<dyn FnOnce() -> ShutdownFuture + Send>>,
}

type ShutdownFuture = std::pin::Pin<Box<dyn Future<Output = ()> + Send>>;

struct Counts {
    accepted: AtomicU64,
    rejected: watch::Sender<u64>,
}

impl Listener {
    pub(crate) fn new(
        local_addr: String,
        limits: &Limits,
        accept: impl FnOnce(AcceptQueue) -> JoinHandle<()>,
    ) -> Listener {
        let (queue, links) = mpsc::channel(128);
        let (rejected, _) = watch::channel(0);
        let counts = Arc::new(Counts {
            accepted: AtomicU64::new(0),
            rejected,
        });
        let accept_task = accept(AcceptQueue {
            links: queue,
            counts: counts.clone(),
            limits: *limits,
            local_addr: local_addr.clone(),
        });
        Listener {
            links,
            local_addr,
            counts,
            accept_task,
            on_shutdown: None,
        }
    }

    /// Runs `f` when the listener shuts down (QUIC closes its endpoint).
    #[cfg(any(feature = "quic", feature = "uds"))]
    pub(crate) fn on_shutdown(
        mut self,
        f: impl FnOnce() -> ShutdownFuture + Send + 'static,
    ) -> Self {
        self.on_shutdown = Some(Box::new(f));
        self
    }

    /// The next established link; `None` once the listener has stopped.
    pub async fn accept(&mut self) -> Option<Link> {
        self.links.recv().await
    }

    /// The address it listens on (`ip:port`, or the socket path).
    pub fn local_addr(&self) -> &str {
        &self.local_addr
    }

    /// Connections established so far.
    pub fn accepted(&self) -> u64 {
        self.counts.accepted.load(Ordering::Relaxed)
    }

    /// Connections refused so far (failed or timed-out handshakes, bad
    /// certificates, wrong protocol).
    pub fn rejected(&self) -> u64 {
        *self.counts.rejected.borrow()
    }

    /// Completes once at least `n` connections were refused.
    pub async fn wait_rejected(&self, n: u64) {
        let mut rejected = self.counts.rejected.subscribe();
        let _ = rejected.wait_for(|count| *count >= n).await;
    }

    /// Stops accepting and releases the address; links already accepted
    /// live on (QUIC: they are closed with the endpoint).
    pub async fn shutdown(mut self) {
        self.accept_task.abort();
        let _ = (&mut self.accept_task).await;
        if let Some(on_shutdown) = self.on_shutdown.take() {
            on_shutdown().await;
        }
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.accept_task.abort();
    }
}

/// Handed to a transport's accept task: runs handshakes, queues links.
pub(crate) struct AcceptQueue {
    links: mpsc::Sender<Link>,
    counts: Arc<Counts>,
    limits: Limits,
    local_addr: String,
}

impl AcceptQueue {
    /// The limits of this listener.
    pub(crate) fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Runs one handshake in its own task, bounded by the handshake timeout.
    pub(crate) fn handshake<F>(&self, remote: String, handshake: F)
    where
        F: Future<Output = Result<Link, TransportError>> + Send + 'static,
    {
        let links = self.links.clone();
        let counts = self.counts.clone();
        let timeout = self.limits.handshake_timeout;
        let listener = self.local_addr.clone();
        tokio::spawn(async move {
            let failure = match tokio::time::timeout(timeout, handshake).await {
                Ok(Ok(link)) => {
                    counts.accepted.fetch_add(1, Ordering::Relaxed);
                    let _ = links.send(link).await;
                    return;
                }
                Ok(Err(err)) => err,
                Err(_) => TransportError::Timeout {
                    what: "handshake",
                    after: timeout,
                },
            };
            warn!(%listener, %remote, error = %failure, "connection refused");
            counts.rejected.send_modify(|n| *n += 1);
        });
    }
}
