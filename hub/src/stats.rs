//! Counters of a hub, read by tests, benchmarks and /metrics.

#[cfg(any(feature = "cloudhub", feature = "edgehub"))]
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::Notify;

/// Wakes whoever waits for a counter to reach a value.
#[derive(Debug, Default)]
pub struct Changes {
    notify: Notify,
}

impl Changes {
    #[cfg(any(feature = "cloudhub", feature = "edgehub"))]
    fn changed(&self) {
        self.notify.notify_waiters();
    }

    /// Waits until `condition` holds, re-checking after every count, at
    /// most `limit`; returns whether it holds.
    pub async fn wait_for(&self, limit: Duration, mut condition: impl FnMut() -> bool) -> bool {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let changed = self.notify.notified();
            if condition() {
                return true;
            }
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                return condition();
            }
        }
    }
}

#[cfg(feature = "cloudhub")]
/// Counters of cloudhub.
#[derive(Debug, Default)]
pub struct HubStats {
    /// Sessions established.
    pub sessions_opened: AtomicU64,
    /// Nodes connected now.
    pub connected: AtomicU64,
    /// Links refused: no hello, no or a mismatching certificate, bad name.
    pub refused_links: AtomicU64,
    /// Messages refused because they named another node.
    pub foreign_messages: AtomicU64,
    /// Objects put on the wire (resends included).
    pub downstream_sent: AtomicU64,
    /// Acks that settled an object.
    pub acked: AtomicU64,
    /// Acks for nothing in flight (duplicates, late).
    pub duplicate_acks: AtomicU64,
    /// Objects sent again because their ack was overdue (KubeEdge nodes).
    pub resent: AtomicU64,
    /// Messages from nodes passed to cloud modules.
    pub upstream: AtomicU64,
    /// Messages with nowhere to go (no node prefix, node offline for a
    /// one-shot message, no module for a group).
    pub unroutable: AtomicU64,
    /// Objects older than the version held, ignored.
    pub stale: AtomicU64,
    /// Objects refused because a node's queue was full.
    pub queue_full: AtomicU64,
    /// Links closed for silence.
    pub keepalive_timeouts: AtomicU64,
    /// Objects held in node queues, not yet acknowledged.
    pub pending: AtomicU64,
    /// Wakes waiters on every change.
    pub changes: Changes,
}

#[cfg(feature = "cloudhub")]
impl HubStats {
    pub(crate) fn set_pending(&self, n: u64) {
        self.pending.store(n, Ordering::Relaxed);
        self.changes.changed();
    }

    /// Adds one to `counter`.
    pub fn count(&self, counter: &AtomicU64) {
        self.add(counter, 1);
    }

    /// Adds `n` to `counter`.
    pub fn add(&self, counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
        self.changes.changed();
    }

    /// Reads `counter`.
    pub fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }

    pub(crate) fn set_connected(&self, n: usize) {
        self.connected.store(n as u64, Ordering::Relaxed);
        self.changes.changed();
    }
}

#[cfg(feature = "edgehub")]
/// Counters of edgehub.
#[derive(Debug, Default)]
pub struct EdgeHubStats {
    /// Links established (the first one included).
    pub connects: AtomicU64,
    /// Failed dial attempts.
    pub dial_failures: AtomicU64,
    /// Objects from the cloud passed to edge modules.
    pub downstream: AtomicU64,
    /// Acks sent after a module persisted an object.
    pub acks_sent: AtomicU64,
    /// Objects a module did not confirm in time (the link is reset so they come again).
    pub unconfirmed: AtomicU64,
    /// Objects refused for good on this edge (acknowledged, not applied).
    pub refused: AtomicU64,
    /// Messages sent up.
    pub upstream_sent: AtomicU64,
    /// Messages kept while offline (latest per object).
    pub offline_buffered: AtomicU64,
    /// Messages dropped from a full offline buffer.
    pub offline_dropped: AtomicU64,
    /// Links closed for silence.
    pub keepalive_timeouts: AtomicU64,
    /// Wakes waiters on every change.
    pub changes: Changes,
}

#[cfg(feature = "edgehub")]
impl EdgeHubStats {
    /// Adds one to `counter`.
    pub fn count(&self, counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
        self.changes.changed();
    }

    /// Reads `counter`.
    pub fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }
}
