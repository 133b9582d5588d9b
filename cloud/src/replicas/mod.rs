//! Several cloudcore replicas: each node is served by one replica at a
//! time, under a claim in etcd ([`EtcdClaims`], feature `etcd`) or in the
//! Kubernetes API server ([`leases::LeaseClaims`], feature `kubernetes`).
//! Both keep their rules in [`book::ClaimBook`].
//!
//! On etcd:
//! A replica holds one etcd lease and renews it a few times per TTL. It
//! claims a node when the node's link comes up: the key
//! `<prefix>/claims/<node>`, created under its lease only if absent,
//! naming the replica. Another replica's claim refuses the link (the edge
//! tries the cloud's next address); a replica that dies leaves its claims
//! to expire with its lease, after which any replica takes the nodes. A
//! replica that cannot renew its lease stops trusting it a margin before
//! it could end ([`book::ClaimBook`]) and closes those nodes' links, so no
//! two replicas ever serve one node. A link that ends gives its claim up
//! at once.

pub mod book;
#[cfg(feature = "kubernetes")]
pub mod leases;
#[cfg(feature = "kubernetes")]
pub mod observed;

use std::time::Instant;

use tokio::sync::mpsc;

#[cfg(feature = "etcd")]
use std::sync::{Arc, Mutex, PoisonError};
#[cfg(feature = "etcd")]
use std::time::Duration;

#[cfg(feature = "etcd")]
use etcd::{Etcd, Written};
#[cfg(feature = "etcd")]
use futures_util::future::BoxFuture;
#[cfg(feature = "etcd")]
use futures_util::stream::BoxStream;
#[cfg(feature = "etcd")]
use tokio::sync::watch;
#[cfg(feature = "etcd")]
use tokio::task::JoinHandle;
#[cfg(feature = "etcd")]
use tracing::{debug, info, warn};

#[cfg(feature = "etcd")]
use crate::backoff::Backoff;
#[cfg(feature = "etcd")]
use book::ClaimBook;

/// How a replica claims nodes.
#[cfg(feature = "etcd")]
#[derive(Debug, Clone)]
pub struct ClaimsConfig {
    /// The etcd members' client URLs.
    pub endpoints: Vec<String>,
    /// The key prefix (`/edgehive`): claims live under `<prefix>/claims/`.
    pub prefix: String,
    /// This replica's name, unique among the replicas.
    pub replica: String,
    /// The lease's time to live: how long a dead replica's nodes wait.
    pub ttl: Duration,
}

#[cfg(feature = "etcd")]
impl ClaimsConfig {
    /// Defaults: a 10 s lease under `/edgehive`.
    pub fn new(endpoints: Vec<String>, replica: impl Into<String>) -> ClaimsConfig {
        ClaimsConfig {
            endpoints,
            prefix: "/edgehive".to_owned(),
            replica: replica.into(),
            ttl: Duration::from_secs(10),
        }
    }
}

/// What a replica's claims have done.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClaimCounts {
    /// Nodes held now.
    pub held: usize,
    /// Claims taken.
    pub taken: u64,
    /// Claims refused (another replica held the node, or no lease).
    pub refused: u64,
    /// Claims lost (the lease ended or was no longer trusted).
    pub lost: u64,
    /// Leases granted (more than one: the replica lost the engine).
    pub leases: u64,
}

/// A replica's claims, kept in etcd.
#[cfg(feature = "etcd")]
#[derive(Clone)]
pub struct EtcdClaims {
    inner: Arc<Inner>,
}

#[cfg(feature = "etcd")]
struct Inner {
    etcd: Etcd,
    claims: String,
    replica: String,
    ttl: Duration,
    book: Mutex<ClaimBook>,
    losers: Mutex<Vec<mpsc::UnboundedSender<(String, u64)>>>,
    /// One lock per node: its claims and releases run one at a time, so a
    /// release's delete never overtakes the next claim.
    node_locks: Mutex<std::collections::HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    counts: watch::Sender<ClaimCounts>,
    keeper: Mutex<Option<JoinHandle<()>>>,
}

#[cfg(feature = "etcd")]
impl Inner {
    fn book(&self) -> std::sync::MutexGuard<'_, ClaimBook> {
        self.book.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn node_lock(&self, node: &str) -> Arc<tokio::sync::Mutex<()>> {
        self.node_locks
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(node.to_owned())
            .or_default()
            .clone()
    }

    /// Tells cloudhub (every subscriber) of claims lost.
    fn lose(&self, nodes: Vec<(String, u64)>) {
        if nodes.is_empty() {
            return;
        }
        warn!(
            count = nodes.len(),
            "claims lost: those nodes' links are closed"
        );
        let held = self.book().len();
        self.counts.send_modify(|c| {
            c.lost += nodes.len() as u64;
            c.held = held;
        });
        let mut losers = self.losers.lock().unwrap_or_else(PoisonError::into_inner);
        losers.retain(|loser| nodes.iter().all(|node| loser.send(node.clone()).is_ok()));
    }

    fn key(&self, node: &str) -> String {
        format!("{}{node}", self.claims)
    }
}

#[cfg(feature = "etcd")]
impl EtcdClaims {
    /// Connects to etcd and starts keeping a lease.
    pub fn start(config: ClaimsConfig) -> Result<EtcdClaims, etcd::EtcdError> {
        let etcd = Etcd::connect(&config.endpoints)?;
        let (counts, _) = watch::channel(ClaimCounts::default());
        let inner = Arc::new(Inner {
            etcd,
            claims: format!("{}/claims/", config.prefix.trim_end_matches('/')),
            replica: config.replica,
            ttl: config.ttl,
            book: Mutex::new(ClaimBook::new(config.ttl, config.ttl / 5)),
            losers: Mutex::new(Vec::new()),
            node_locks: Mutex::new(std::collections::HashMap::new()),
            counts,
            keeper: Mutex::new(None),
        });
        let keeper = tokio::spawn(keep_lease(Arc::downgrade(&inner)));
        *inner.keeper.lock().unwrap_or_else(PoisonError::into_inner) = Some(keeper);
        Ok(EtcdClaims { inner })
    }

    /// The counts, as they change.
    pub fn counts(&self) -> watch::Receiver<ClaimCounts> {
        self.inner.counts.subscribe()
    }

    /// Claims `node` for a new session of it: the claim's generation, or
    /// why this replica may not serve it.
    pub async fn claim_now(&self, node: &str) -> Result<u64, String> {
        let inner = &self.inner;
        let lock = inner.node_lock(node);
        let _one_at_a_time = lock.lock().await;
        let refused = |reason: String| {
            inner.counts.send_modify(|c| c.refused += 1);
            Err(reason)
        };
        let (lease, held) = {
            let book = inner.book();
            (book.lease(Instant::now()), book.revision(node))
        };
        let Some(lease) = lease else {
            return refused("this replica holds no trusted lease (etcd out of reach)".to_owned());
        };
        if let Some(revision) = held {
            // The node linked again: the claim is the new session's now.
            return Ok(inner.book().claimed(node, revision));
        }
        let key = inner.key(node);
        let written = inner
            .etcd
            .create(key.as_bytes(), inner.replica.clone().into_bytes(), lease)
            .await;
        let revision = match written {
            Ok(Written::Done(revision)) => revision,
            Ok(Written::Conflict(Some(entry)))
                if entry.value == inner.replica.as_bytes() && entry.lease == lease =>
            {
                entry.create_revision
            }
            Ok(Written::Conflict(Some(entry))) => {
                let holder = String::from_utf8_lossy(&entry.value).into_owned();
                return refused(format!("replica {holder} serves node {node}"));
            }
            Ok(Written::Conflict(None) | Written::Fenced) => {
                return refused(format!("the claim on {node} changed meanwhile"));
            }
            Err(err) => return refused(format!("etcd: {err}")),
        };
        // The lease may have been given up while etcd answered.
        let claimed = {
            let mut book = inner.book();
            let trusted = book.lease(Instant::now()) == Some(lease);
            trusted.then(|| (book.claimed(node, revision), book.len()))
        };
        let Some((generation, held)) = claimed else {
            let _ = inner.etcd.delete(key.as_bytes(), revision).await;
            return refused("the lease ended while claiming".to_owned());
        };
        debug!(node, revision, generation, "node claimed");
        inner.counts.send_modify(|c| {
            c.taken += 1;
            c.held = held;
        });
        Ok(generation)
    }

    /// What a write for `node` must hold (see `EtcdStore::fence_with`),
    /// once a claim or release of it under way is done: this replica's
    /// claim, if it holds one; if it holds none, that no replica does (a
    /// node that left this replica and linked nowhere yet is still marked
    /// disconnected, but not one another replica serves). `None` without a
    /// trusted lease: nothing is written.
    pub async fn fence(&self, node: &str) -> Option<(etcd::Fence, crate::desired::FenceHold)> {
        let lock = self.inner.node_lock(node);
        // Held until the write is made: no claim or release of the node
        // in between.
        let settled = lock.lock_owned().await;
        let book = self.inner.book();
        book.lease(Instant::now())?;
        let fence = etcd::Fence {
            key: self.inner.key(node).into_bytes(),
            // 0: the key must not exist.
            create_revision: book.revision(node).unwrap_or(0),
        };
        Some((fence, Box::new(settled)))
    }

    /// [`EtcdClaims::fence`] as the etcd store takes it.
    pub fn fencing(&self) -> crate::desired::FenceOf {
        let claims = self.clone();
        Arc::new(move |node: String| {
            let claims = claims.clone();
            Box::pin(async move { claims.fence(&node).await })
        })
    }

    /// The session of `generation` gave `node` up: its claim key is
    /// removed, unless a newer session of the node holds the claim.
    pub async fn release_now(&self, node: &str, generation: u64) {
        let inner = &self.inner;
        let lock = inner.node_lock(node);
        let _one_at_a_time = lock.lock().await;
        let (revision, held) = {
            let mut book = inner.book();
            (book.released(node, generation), book.len())
        };
        inner.counts.send_modify(|c| c.held = held);
        if let Some(revision) = revision
            && let Err(err) = inner
                .etcd
                .delete(inner.key(node).as_bytes(), revision)
                .await
        {
            debug!(node, error = %err, "claim not removed; it ends with the lease");
        }
    }

    /// Stops renewing and ends the lease now (a replica told to stop):
    /// every node it held may be claimed by another at once.
    pub async fn give_up(&self) {
        if let Some(keeper) = self
            .inner
            .keeper
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
        {
            keeper.abort();
        }
        let lease = self.inner.book().lease(Instant::now());
        let lost = self.inner.book().lease_gone();
        self.inner.lose(lost);
        if let Some(lease) = lease
            && let Err(err) = self.inner.etcd.revoke(lease).await
        {
            debug!(error = %err, "lease not revoked; it ends on its own");
        }
    }
}

#[cfg(feature = "etcd")]
impl hub::NodeClaims for EtcdClaims {
    fn claim(&self, node: &str) -> BoxFuture<'static, Result<u64, String>> {
        let (claims, node) = (self.clone(), node.to_owned());
        Box::pin(async move { claims.claim_now(&node).await })
    }

    fn release(&self, node: &str, generation: u64) {
        let (claims, node) = (self.clone(), node.to_owned());
        tokio::spawn(async move { claims.release_now(&node, generation).await });
    }

    fn holds(&self, node: &str) -> bool {
        let book = self.inner.book();
        book.lease(Instant::now()).is_some() && book.holds(node)
    }

    fn lost(&self) -> BoxStream<'static, (String, u64)> {
        let (sender, receiver) = mpsc::unbounded_channel();
        self.inner
            .losers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(sender);
        Box::pin(tokio_stream_from(receiver))
    }
}

fn tokio_stream_from(
    mut receiver: mpsc::UnboundedReceiver<(String, u64)>,
) -> impl futures_util::Stream<Item = (String, u64)> {
    futures_util::stream::poll_fn(move |cx| receiver.poll_recv(cx))
}

/// How long a renewal may take: a third of the TTL, and never past the
/// instant the lease stops being trusted (`trusted`, the book's).
fn renewal_deadline(trusted: Option<Instant>, ttl: std::time::Duration) -> tokio::time::Instant {
    let third = tokio::time::Instant::now() + ttl / 3;
    trusted.map_or(third, |until| {
        third.min(tokio::time::Instant::from_std(until))
    })
}

/// Keeps the replica's lease: granted, renewed three times per TTL; when
/// it is no longer trusted, its nodes are lost and a new one is granted.
#[cfg(feature = "etcd")]
async fn keep_lease(inner: std::sync::Weak<Inner>) {
    let Some(ttl) = inner.upgrade().map(|held| held.ttl) else {
        return;
    };
    let mut backoff = Backoff::new(Duration::from_millis(200), ttl / 3);
    loop {
        let Some(held) = inner.upgrade() else { return };
        let ttl = held.ttl;
        let check = (ttl / 10).max(Duration::from_millis(50));
        let lost = held.book().expire(Instant::now());
        held.lose(lost);
        let lease = held.book().lease(Instant::now());
        let asked = Instant::now();
        match lease {
            None => match tokio::time::timeout(ttl / 3, held.etcd.grant(ttl)).await {
                Ok(Ok(lease)) => {
                    let lost = held.book().granted(lease, asked);
                    held.lose(lost);
                    held.counts.send_modify(|c| c.leases += 1);
                    info!(replica = %held.replica, lease, "claims lease granted");
                    backoff.reset();
                }
                Ok(Err(err)) => {
                    debug!(error = %err, "no lease; trying again");
                    drop(held);
                    backoff.pause().await;
                    continue;
                }
                Err(_) => continue,
            },
            // A renewal is waited for no longer than the lease is trusted:
            // when trust ends, the nodes are given up on time, answer or not.
            Some(lease) => match tokio::time::timeout_at(
                {
                    let trusted = held.book().trusted_until();
                    renewal_deadline(trusted, ttl)
                },
                held.etcd.keep_alive(lease),
            )
            .await
            {
                Ok(Ok(Some(_))) => held.book().renewed(asked),
                Ok(Ok(None)) => {
                    warn!(lease, "etcd ended the claims lease");
                    let lost = held.book().lease_gone();
                    held.lose(lost);
                    continue;
                }
                Ok(Err(err)) => debug!(error = %err, "lease not renewed"),
                Err(_) => debug!("lease renewal timed out"),
            },
        }
        drop(held);
        // Until the next renewal, check trust often enough to give nodes
        // up in time.
        let next = Instant::now() + ttl / 3;
        while Instant::now() < next {
            tokio::time::sleep(check).await;
            let Some(held) = inner.upgrade() else { return };
            let lost = held.book().expire(Instant::now());
            held.lose(lost);
            if !held.book().has_lease() {
                break;
            }
        }
    }
}
