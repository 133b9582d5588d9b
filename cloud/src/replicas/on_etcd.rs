//! Claims in etcd.
//!
//! A replica holds one etcd lease and renews it a few times per TTL. It
//! claims a node when the node's link comes up: the key
//! `<prefix>/claims/<node>`, created under its lease only if absent,
//! naming the replica. Another replica's claim refuses the link (the edge
//! tries the cloud's next address); a replica that dies leaves its claims
//! to expire with its lease, after which any replica takes the nodes. A
//! replica that cannot renew its lease stops trusting it a margin before
//! it could end ([`ClaimBook`]) and closes those nodes' links, so no
//! two replicas ever serve one node. A link that ends gives its claim up
//! at once.
//!
//! Each replica also names itself under `<prefix>/replicas/`, under the
//! same lease, so every replica knows how many are up; one that holds more
//! than its share of the claimed nodes hands the surplus over a few at a
//! time ([`Share`]): a new replica takes its share, and the survivors of a
//! dead one even out again.
//!
//! One concern: node claims in etcd, with the tasks that keep this replica's
//! lease and even out the nodes; the rules are `book`'s and `share`'s.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use etcd::{Etcd, Written};
use futures_util::future::BoxFuture;
use futures_util::stream::BoxStream;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tracing::{debug, info, warn};

use super::book::ClaimBook;
use super::share::Share;
use super::{ClaimCounts, hand_over, renewal_deadline, tokio_stream_from};
use crate::backoff::Backoff;
use crate::desired::CatchUp;

/// Claims and releases a replica has in flight in etcd at once.
const IN_FLIGHT: usize = 32;

/// How a replica claims nodes.
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
    /// Whether this replica hands nodes over when it holds more than its
    /// share (a round every `ttl`).
    pub rebalance: bool,
    /// The URL its peers reach its admin API at (`crate::peers`),
    /// written as the value of `<prefix>/replicas/<replica>`; empty: none.
    pub advertise: String,
}

impl ClaimsConfig {
    /// Defaults: a 10 s lease under `/edgehive`.
    pub fn new(endpoints: Vec<String>, replica: impl Into<String>) -> ClaimsConfig {
        ClaimsConfig {
            endpoints,
            prefix: "/edgehive".to_owned(),
            replica: replica.into(),
            ttl: Duration::from_secs(10),
            rebalance: true,
            advertise: String::new(),
        }
    }
}

/// A replica's claims, kept in etcd.
#[derive(Clone)]
pub struct EtcdClaims {
    inner: Arc<Inner>,
}

struct Inner {
    etcd: Etcd,
    claims: String,
    /// `<prefix>/replicas/`: a key per replica up, under its lease.
    replicas: String,
    replica: String,
    /// This replica's admin API URL, for its peers.
    advertise: String,
    ttl: Duration,
    book: Mutex<ClaimBook>,
    share: Mutex<Share>,
    /// Waits until the desired state's mirror holds a revision.
    catch_up: std::sync::OnceLock<CatchUp>,
    /// Done before a node's claim is given up (its delivery cursor
    /// written, while the write is still this replica's).
    before_release: std::sync::OnceLock<super::BeforeRelease>,
    losers: Mutex<Vec<mpsc::UnboundedSender<(String, u64)>>>,
    /// One lock per node: its claims and releases run one at a time, so a
    /// release's delete never overtakes the next claim.
    node_locks: Mutex<std::collections::HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    counts: watch::Sender<ClaimCounts>,
    /// Claims and releases in flight at once: when thousands of nodes
    /// link at once (a failover), etcd gets them a few at a time, so its
    /// answers to lease renewals (every replica's) stay prompt.
    in_flight: tokio::sync::Semaphore,
    /// The rebalancer.
    rebalancer: Mutex<Option<JoinHandle<()>>>,
    /// Stops the lease keeper (on its own thread).
    stop_keeper: watch::Sender<bool>,
}

impl Inner {
    fn book(&self) -> std::sync::MutexGuard<'_, ClaimBook> {
        self.book.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn share(&self) -> std::sync::MutexGuard<'_, Share> {
        self.share.lock().unwrap_or_else(PoisonError::into_inner)
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
        self.share().clear();
        self.tell(&nodes);
    }

    /// Tells cloudhub (every subscriber) to close these nodes' sessions.
    fn tell(&self, nodes: &[(String, u64)]) {
        let mut losers = self.losers.lock().unwrap_or_else(PoisonError::into_inner);
        losers.retain(|loser| nodes.iter().all(|node| loser.send(node.clone()).is_ok()));
    }

    fn key(&self, node: &str) -> String {
        format!("{}{node}", self.claims)
    }
}

impl EtcdClaims {
    /// Connects to etcd and starts keeping a lease.
    pub fn start(config: ClaimsConfig) -> Result<EtcdClaims, etcd::EtcdError> {
        let etcd = Etcd::connect(&config.endpoints)?;
        let (counts, _) = watch::channel(ClaimCounts::default());
        let prefix = config.prefix.trim_end_matches('/');
        let inner = Arc::new(Inner {
            etcd,
            claims: format!("{prefix}/claims/"),
            replicas: format!("{prefix}/replicas/"),
            replica: config.replica,
            advertise: config.advertise,
            ttl: config.ttl,
            book: Mutex::new(ClaimBook::new(config.ttl, config.ttl / 5)),
            // A node handed over is refused here for two rounds; a quarter
            // of a fair share goes per round.
            share: Mutex::new(Share::new(config.ttl * 2, 0.25)),
            catch_up: std::sync::OnceLock::new(),
            before_release: std::sync::OnceLock::new(),
            losers: Mutex::new(Vec::new()),
            node_locks: Mutex::new(std::collections::HashMap::new()),
            counts,
            in_flight: tokio::sync::Semaphore::new(IN_FLIGHT),
            rebalancer: Mutex::new(None),
            stop_keeper: watch::Sender::new(false),
        });
        spawn_keeper(
            Arc::downgrade(&inner),
            config.endpoints,
            inner.stop_keeper.subscribe(),
        )
        .map_err(|err| etcd::EtcdError::Endpoint {
            endpoint: String::new(),
            reason: format!("the lease keeper's thread: {err}"),
        })?;
        if config.rebalance {
            let rebalancer = tokio::spawn(rebalance(Arc::downgrade(&inner)));
            *inner
                .rebalancer
                .lock()
                .unwrap_or_else(PoisonError::into_inner) = Some(rebalancer);
        }
        Ok(EtcdClaims { inner })
    }

    /// A node claimed here is served only once the desired state's mirror
    /// has caught up with the claim (`EtcdStore::catching_up`): then every
    /// apply answered before the claim, by any replica, is seen. Set once.
    pub fn catch_up_with(&self, catch_up: CatchUp) {
        let _ = self.inner.catch_up.set(catch_up);
    }

    /// `hook` is done (for a third of the TTL at most) before a node's
    /// claim is given up: what must be written under the claim, such as
    /// the node's delivery cursor ([`super::CursorWriter::before_release`]).
    /// Set once.
    pub fn before_release(&self, hook: super::BeforeRelease) {
        let _ = self.inner.before_release.set(hook);
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
        if inner.share().refuses(node, Instant::now()) {
            return refused(format!(
                "node {node} was handed over to another replica to even the replicas out"
            ));
        }
        if let Some(revision) = held {
            // The node linked again: the claim is the new session's now.
            return Ok(inner.book().claimed(node, revision));
        }
        let key = inner.key(node);
        let permit = inner.in_flight.acquire().await;
        let written = inner
            .etcd
            .create(key.as_bytes(), inner.replica.clone().into_bytes(), lease)
            .await;
        drop(permit);
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
        // Served only once this replica sees everything up to the claim.
        if let Some(catch_up) = inner.catch_up.get() {
            let caught_up = tokio::time::timeout(inner.ttl / 3, catch_up(revision)).await;
            if caught_up.is_err() {
                let _ = inner.book().released(node, generation);
                let _ = inner.etcd.delete(key.as_bytes(), revision).await;
                return refused(format!(
                    "the desired state here has not caught up with revision {revision}"
                ));
            }
        }
        // Still this session's claim, under a lease still trusted: while
        // it waited, the lease may have ended, or the claim been handed
        // over (the session would then start with no claim behind it).
        let current = {
            let book = inner.book();
            book.lease(Instant::now()) == Some(lease) && book.generation(node) == Some(generation)
        };
        if !current {
            return refused(format!(
                "the claim on {node} ended while it was being taken"
            ));
        }
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
        if let Some(hook) = inner.before_release.get() {
            let _ = tokio::time::timeout(inner.ttl / 3, hook(node.to_owned())).await;
        }
        let lock = inner.node_lock(node);
        let _one_at_a_time = lock.lock().await;
        let revision = inner.book().released(node, generation);
        if let Some(revision) = revision {
            let _permit = inner.in_flight.acquire().await;
            if let Err(err) = inner
                .etcd
                .delete(inner.key(node).as_bytes(), revision)
                .await
            {
                debug!(node, error = %err, "claim not removed; it ends with the lease");
            }
        }
        // Counted once the claim key is gone (as the Leases' claims do):
        // until then another replica still finds the node held, and a
        // count that dropped earlier told a watcher it could take the node
        // over when it could not yet (e2e::cursor's move_node saw that
        // under load: the next replica refused the node).
        let held = inner.book().len();
        inner.counts.send_modify(|c| c.held = held);
    }

    /// Stops renewing and ends the lease now (a replica told to stop):
    /// every node it held may be claimed by another at once.
    pub async fn give_up(&self) {
        self.inner.stop_keeper.send_replace(true);
        if let Some(rebalancer) = self
            .inner
            .rebalancer
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
        {
            rebalancer.abort();
        }
        let lease = self.inner.book().lease(Instant::now());
        let going = self.inner.book().lease_gone();
        if !going.is_empty() {
            info!(count = going.len(), "handing every node over");
        }
        self.inner.counts.send_modify(|c| {
            c.handed_over += going.len() as u64;
            c.held = 0;
        });
        self.inner.tell(&going);
        if let Some(lease) = lease
            && let Err(err) = self.inner.etcd.revoke(lease).await
        {
            debug!(error = %err, "lease not revoked; it ends on its own");
        }
    }
}

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

    fn unclaimed(&self, nodes: Vec<String>) -> BoxFuture<'static, Result<Vec<String>, String>> {
        let inner = self.inner.clone();
        Box::pin(async move {
            // A claim key lives exactly as long as its replica's lease.
            let claimed: std::collections::HashSet<Vec<u8>> = match nodes.len() {
                0 => return Ok(nodes),
                // A few nodes: their keys; many: every claim at once.
                1..=8 => {
                    let mut claimed = std::collections::HashSet::new();
                    for node in &nodes {
                        let key = inner.key(node).into_bytes();
                        let (entry, _) = inner.etcd.get(&key).await.map_err(|e| e.to_string())?;
                        if entry.is_some() {
                            claimed.insert(key);
                        }
                    }
                    claimed
                }
                _ => {
                    let (entries, _) = inner
                        .etcd
                        .list(inner.claims.as_bytes())
                        .await
                        .map_err(|e| e.to_string())?;
                    entries.into_iter().map(|entry| entry.key).collect()
                }
            };
            Ok(nodes
                .into_iter()
                .filter(|node| !claimed.contains(inner.key(node).as_bytes()))
                .collect())
        })
    }
}

/// The replica a claim's value names and the URL its record publishes
/// (`crate::peers`): who holds a node, and where it is asked.
impl crate::peers::PeerDirectory for EtcdClaims {
    fn holder(&self, node: &str) -> BoxFuture<'static, Result<Option<crate::peers::Peer>, String>> {
        let (inner, node) = (self.inner.clone(), node.to_owned());
        Box::pin(async move {
            let (claim, _) = inner
                .etcd
                .get(inner.key(&node).as_bytes())
                .await
                .map_err(|e| format!("etcd: {e}"))?;
            let Some(claim) = claim else { return Ok(None) };
            let replica = String::from_utf8_lossy(&claim.value).into_owned();
            let record = format!("{}{replica}", inner.replicas);
            let (record, _) = inner
                .etcd
                .get(record.as_bytes())
                .await
                .map_err(|e| format!("etcd: {e}"))?;
            let url = record
                .map(|entry| String::from_utf8_lossy(&entry.value).into_owned())
                .filter(|url| !url.is_empty());
            Ok(Some(crate::peers::Peer { replica, url }))
        })
    }

    fn replicas(&self) -> BoxFuture<'static, Result<Vec<crate::peers::Peer>, String>> {
        let inner = self.inner.clone();
        Box::pin(async move {
            let (entries, _) = inner
                .etcd
                .list(inner.replicas.as_bytes())
                .await
                .map_err(|e| format!("etcd: {e}"))?;
            Ok(entries
                .into_iter()
                .map(|entry| crate::peers::Peer {
                    replica: String::from_utf8_lossy(
                        entry
                            .key
                            .strip_prefix(inner.replicas.as_bytes())
                            .unwrap_or(&entry.key),
                    )
                    .into_owned(),
                    url: Some(String::from_utf8_lossy(&entry.value).into_owned())
                        .filter(|url| !url.is_empty()),
                })
                .collect())
        })
    }
}

/// Names this replica under `<prefix>/replicas/`, under `lease`: counted
/// among the replicas up while the lease lives; its value is the URL its
/// peers reach it at. Whether it was written.
async fn register(inner: &Inner, etcd: &Etcd, lease: i64) -> bool {
    let key = format!("{}{}", inner.replicas, inner.replica);
    let value = inner.advertise.clone().into_bytes();
    let written = tokio::time::timeout(inner.ttl / 3, etcd.put(key.as_bytes(), value, lease)).await;
    match written {
        Ok(Ok(_)) => true,
        Ok(Err(err)) => {
            debug!(error = %err, "replica not named in etcd yet; trying again");
            false
        }
        Err(_) => false,
    }
}

/// Evens the replicas out: a round every TTL (give or take a quarter, so
/// the replicas' rounds do not coincide), in which this replica counts
/// the replicas up and the nodes claimed, and hands over what it holds
/// beyond its share: each such node's link is closed and its claim given
/// up, and it is refused here for a while, so its edge links to another.
async fn rebalance(inner: std::sync::Weak<Inner>) {
    loop {
        let Some(ttl) = inner.upgrade().map(|held| held.ttl) else {
            return;
        };
        tokio::time::sleep(ttl.mul_f64(0.75 + fastrand::f64() * 0.5)).await;
        let Some(held) = inner.upgrade() else { return };
        if held.book().lease(Instant::now()).is_none() {
            continue;
        }
        let counted = tokio::time::timeout(ttl / 3, async {
            let replicas = held.etcd.count(held.replicas.as_bytes()).await?;
            let claimed = held.etcd.count(held.claims.as_bytes()).await?;
            Ok::<_, etcd::EtcdError>((replicas.0, claimed.0))
        })
        .await;
        let (replicas, claimed) = match counted {
            Ok(Ok((replicas, claimed))) => (
                usize::try_from(replicas).unwrap_or(0),
                usize::try_from(claimed).unwrap_or(0),
            ),
            Ok(Err(err)) => {
                debug!(error = %err, "replicas not counted; no rebalancing this round");
                continue;
            }
            Err(_) => continue,
        };
        let going = hand_over(
            &mut held.share(),
            &held.counts,
            held.book().held(),
            claimed,
            replicas,
        );
        if going.is_empty() {
            continue;
        }
        // Their links are closed first, then their claims given up: an
        // edge links elsewhere only once its link here has ended.
        held.tell(&going);
        let claims = EtcdClaims { inner: held };
        for (node, generation) in going {
            claims.release_now(&node, generation).await;
        }
    }
}

/// Runs [`keep_lease`] on a thread of its own, with a runtime and an etcd
/// client of its own, until `stop` or the claims are dropped: renewals
/// are never starved by the sessions' work on the replica's runtime (a
/// replica busy with thousands of links coming up would otherwise miss
/// its renewals and drop every node, which would then link again).
fn spawn_keeper(
    inner: std::sync::Weak<Inner>,
    endpoints: Vec<String>,
    mut stop: watch::Receiver<bool>,
) -> std::io::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    std::thread::Builder::new()
        .name("claims-keeper".to_owned())
        .spawn(move || {
            runtime.block_on(async move {
                let etcd = match Etcd::connect(&endpoints) {
                    Ok(etcd) => etcd,
                    Err(err) => {
                        warn!(error = %err, "the lease keeper cannot reach etcd");
                        return;
                    }
                };
                tokio::select! {
                    () = keep_lease(inner, etcd) => {}
                    _ = stop.wait_for(|stopped| *stopped) => {}
                }
            });
        })?;
    Ok(())
}

/// Keeps the replica's lease: granted, renewed three times per TTL; when
/// it is no longer trusted, its nodes are lost and a new one is granted.
async fn keep_lease(inner: std::sync::Weak<Inner>, etcd: Etcd) {
    let Some(ttl) = inner.upgrade().map(|held| held.ttl) else {
        return;
    };
    let mut backoff = Backoff::new(Duration::from_millis(200), ttl / 3);
    // Whether this replica's key is under the current lease.
    let mut registered = false;
    // The last lease held: revoked once a new one is granted (its claims
    // would otherwise keep the nodes from every replica, this one too,
    // until it ends).
    let mut previous: Option<i64> = None;
    loop {
        let Some(held) = inner.upgrade() else { return };
        let ttl = held.ttl;
        let check = (ttl / 10).max(Duration::from_millis(50));
        let lost = held.book().expire(Instant::now());
        held.lose(lost);
        let lease = held.book().lease(Instant::now());
        let asked = Instant::now();
        match lease {
            None => match tokio::time::timeout(ttl / 3, etcd.grant(ttl)).await {
                Ok(Ok(lease)) => {
                    let lost = held.book().granted(lease, asked);
                    held.lose(lost);
                    held.counts.send_modify(|c| c.leases += 1);
                    info!(replica = %held.replica, lease, "claims lease granted");
                    backoff.reset();
                    if let Some(old) = previous.replace(lease)
                        && old != lease
                        && !matches!(
                            tokio::time::timeout(ttl / 3, etcd.revoke(old)).await,
                            Ok(Ok(()))
                        )
                    {
                        debug!(lease = old, "the old lease not revoked; it ends on its own");
                    }
                    registered = register(&held, &etcd, lease).await;
                }
                Ok(Err(err)) => {
                    debug!(error = %err, "no lease; trying again");
                    drop(held);
                    backoff.pause().await;
                    continue;
                }
                Err(_) => {
                    etcd.prefer_next();
                    continue;
                }
            },
            // A renewal is waited for no longer than the lease is trusted:
            // when trust ends, the nodes are given up on time, answer or not.
            Some(lease) => {
                previous = Some(lease);
                // Several attempts fit in the trust window: one member
                // stalled costs one attempt, not the nodes.
                let trusted = held.book().trusted_until();
                let deadline =
                    renewal_deadline(trusted, ttl).min(tokio::time::Instant::now() + ttl / 6);
                let renewal = tokio::time::timeout_at(deadline, etcd.keep_alive(lease)).await;
                match renewal {
                    Ok(Ok(Some(_))) => {
                        held.book().renewed(asked);
                        held.counts.send_modify(|c| c.renewed(asked.elapsed()));
                        if !registered {
                            registered = register(&held, &etcd, lease).await;
                        }
                    }
                    Ok(Ok(None)) => {
                        warn!(lease, "etcd ended the claims lease");
                        let lost = held.book().lease_gone();
                        held.lose(lost);
                        continue;
                    }
                    Ok(Err(err)) => {
                        debug!(error = %err, "lease not renewed; trying again");
                        drop(held);
                        tokio::time::sleep(check).await;
                        continue;
                    }
                    Err(_) => {
                        debug!("lease renewal timed out; trying another member");
                        etcd.prefer_next();
                        continue;
                    }
                }
            }
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
