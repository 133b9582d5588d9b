//! Several cloudcore replicas on one Kubernetes cluster: each node is
//! served by one replica at a time, under a claim kept in the API server
//! as `coordination.k8s.io/v1` Leases in cloudcore's namespace.
//!
//! - **The replica's Lease**, `edgehive-replica-<replica>`, is its
//!   liveness (the etcd lease's part): `holderIdentity` the replica,
//!   `leaseDurationSeconds` the TTL, its `renewTime` renewed three times
//!   per TTL by a replace conditioned on the `resourceVersion` last
//!   written. Each incarnation of it is a new object (a new `uid`): one is
//!   made when the replica starts, and again whenever the replica stopped
//!   trusting the one before.
//! - **A node's claim**, `edgehive-claim-<node>`: `holderIdentity` the
//!   replica, and the annotation `edgehive.io/replica-lease-uid` naming the
//!   incarnation of the replica's Lease it was made under. A claim is
//!   written only when it is taken, taken over or given up, never renewed
//!   one by one: one renewal per TTL/3 keeps all of a replica's claims.
//!
//! A claim is free when the replica Lease it names is gone, is another
//! incarnation (another `uid`), or has ended. Whether another replica's
//! Lease has ended is judged as client-go's leader election judges it, by
//! this replica's own observation ([`super::observed`]): the Lease seen
//! at one `resourceVersion` for `leaseDurationSeconds` of local time,
//! never by comparing its `renewTime` with this machine's clock. The first
//! sight of a Lease therefore always refuses (the edge tries the cloud's
//! next address, and comes back). A free claim is taken over by a replace
//! conditioned on the `resourceVersion` read, so of two replicas taking
//! one node, one wins.
//!
//! A replica trusts its own Lease as it trusts an etcd lease
//! ([`super::book::ClaimBook`]): until a fifth of the TTL before the TTL
//! has passed since it asked for the last renewal that was answered; a
//! renewal is waited for no longer than that. So every other replica's
//! observation of an ended Lease comes after this replica stopped trusting
//! it, whatever the network did: a renewal that lands after another
//! replica saw the Lease unchanged for its whole duration was answered too
//! late to count.
//!
//! **Fencing.** The Kubernetes API has no transactions over several
//! objects, so unlike on etcd ([`super::EtcdClaims::fence`]) a node's
//! status write cannot require the claim: the holder's writes are fenced only
//! by the trust window. A replica stops writing a node's status when it
//! stops holding it ([`hub::NodeClaims::holds`]), which is before any
//! other replica can take the node; a replica paused (or a write delayed
//! in the network) past that point may still land one stale write. A
//! replica marks a node it does not hold unreachable only if no replica
//! holds it ([`hub::NodeClaims::unclaimed`]), by a write conditioned on
//! the Node's version read before it asked: never over the status a new
//! holder wrote. The
//! claim's `resourceVersion` is kept as its fencing token all the same
//! (the API server's resourceVersions are etcd revisions, numbers that
//! only grow; one that does not parse as a number is kept as 0).
//!
//! Caveats: a replica's Lease deleted by hand frees its nodes at once,
//! up to a renewal (TTL/3) before the replica notices and lets them go. A
//! restarted replica of the same name whose last process died without
//! giving up waits for that process's Lease to end (one TTL) before it
//! makes its own. Claim Leases of nodes that never link again stay in the
//! namespace (free, as the replica Lease they name is gone or another
//! incarnation).
//!
//! One concern: node claims kept as Leases in the API server, with the tasks
//! that renew this replica's Lease and even out the nodes; the rules they
//! follow are `book`'s and `share`'s.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::{Duration, Instant};

use futures_util::future::BoxFuture;
use futures_util::stream::BoxStream;
use kube::Client;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, PostParams, Preconditions};
use serde_json::{Value, json};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tracing::{Instrument, debug, info, info_span, warn};

use super::book::ClaimBook;
use super::observed::{Observations, Verdict};
use super::share::Share;
use super::{ClaimCounts, hand_over, renewal_deadline, tokio_stream_from};
use crate::backoff::Backoff;
use crate::desired::DesiredError;
use crate::desired::kubernetes::{
    backend, dynamic, ensure_namespace, lease_resource, micro_time, refused,
};

/// The prefix of a replica's Lease name (`edgehive-replica-<replica>`).
pub const REPLICA_LEASE_PREFIX: &str = "edgehive-replica-";

/// The prefix of a node's claim Lease name (`edgehive-claim-<node>`).
pub const CLAIM_LEASE_PREFIX: &str = "edgehive-claim-";

/// The claim Lease's annotation naming the `uid` of the replica Lease it
/// was made under.
pub const REPLICA_UID_ANNOTATION: &str = "edgehive.io/replica-lease-uid";

/// How a replica claims nodes in a Kubernetes cluster.
#[derive(Debug, Clone)]
pub struct LeaseClaimsConfig {
    /// cloudcore's namespace: the Leases live there (created if missing).
    pub namespace: String,
    /// This replica's name, unique among the replicas; it names the
    /// replica's Lease, so it must be lowercase letters, digits, `-` and
    /// `.` (a DNS subdomain).
    pub replica: String,
    /// The replica Lease's duration: how long a dead replica's nodes wait.
    /// Whole seconds (a Lease's `leaseDurationSeconds`); at least 1 s.
    pub ttl: Duration,
    /// The API client's configuration for the replica Lease's keeper, run
    /// on a thread of its own with a connection of its own, so a busy
    /// cloudcore (its runtime, its connection) never delays a renewal
    /// past the Lease's trust. `None`: the keeper shares the client given
    /// to [`LeaseClaims::start`] and its runtime.
    pub keeper_client: Option<kube::Config>,
    /// The URL its peers reach its admin API at (`crate::peers`), kept as
    /// the replica Lease's annotation `edgehive.io/admin-url`; empty: none.
    pub advertise: String,
}

impl LeaseClaimsConfig {
    /// Defaults: 10 s Leases in namespace `kubeedge`.
    pub fn new(replica: impl Into<String>) -> LeaseClaimsConfig {
        LeaseClaimsConfig {
            namespace: "kubeedge".to_owned(),
            replica: replica.into(),
            ttl: Duration::from_secs(10),
            keeper_client: None,
            advertise: String::new(),
        }
    }
}

/// Why the claims could not start.
#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    /// The replica's name cannot name its Lease.
    #[error("replica name {replica:?} cannot name a Lease: {reason}")]
    InvalidReplica {
        /// The name given.
        replica: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The TTL is not a whole number of seconds, at least one.
    #[error("the claims' TTL must be whole seconds, at least 1 s (got {0:?})")]
    InvalidTtl(Duration),
    /// The API server refused or could not be reached.
    #[error("the API server: {0}")]
    Api(#[from] DesiredError),
}

/// What a claim held by this replica is in the API server.
#[derive(Debug, Clone, PartialEq, Eq)]
struct ClaimRef {
    /// The claim Lease's `uid` and `resourceVersion` as written: a release
    /// deletes exactly that object, unchanged.
    uid: String,
    resource_version: String,
    /// The `resourceVersion` as a number (0 if it is not one).
    token: i64,
}

impl ClaimRef {
    fn of(lease: &DynamicObject) -> Result<ClaimRef, String> {
        let uid = lease.metadata.uid.clone().filter(|uid| !uid.is_empty());
        let resource_version = lease
            .metadata
            .resource_version
            .clone()
            .filter(|version| !version.is_empty());
        match (uid, resource_version) {
            (Some(uid), Some(resource_version)) => Ok(ClaimRef {
                token: resource_version.parse().unwrap_or(0),
                uid,
                resource_version,
            }),
            _ => Err("the API server answered a claim Lease with no uid or resourceVersion".into()),
        }
    }
}

/// One incarnation of this replica's Lease.
#[derive(Debug, Clone)]
struct Incarnation {
    /// Its number, as the book knows the lease.
    number: i64,
    uid: String,
    /// The Lease as last written (its `resourceVersion` the precondition
    /// of the next renewal).
    lease: Value,
}

/// What the replica knows, behind one lock never held across a request.
struct State {
    book: ClaimBook<ClaimRef>,
    own: Option<Incarnation>,
    /// The `uid` of this process's last incarnation that ended: its Lease
    /// is deleted without waiting for it to end.
    retired: Option<String>,
    incarnations: i64,
    observed: Observations,
}

impl State {
    /// The incarnation to claim under, if it is trusted at `now`.
    fn trusted(&self, now: Instant) -> Option<(i64, String)> {
        let number = self.book.lease(now)?;
        self.own
            .as_ref()
            .filter(|own| own.number == number)
            .map(|own| (own.number, own.uid.clone()))
    }

    /// The incarnation is over: every claim under it lost.
    fn incarnation_gone(&mut self) -> Vec<(String, u64)> {
        if let Some(own) = self.own.take() {
            self.retired = Some(own.uid);
        }
        self.book.lease_gone()
    }
}

/// A replica's claims, kept as Leases in the Kubernetes API server.
#[derive(Clone)]
pub struct LeaseClaims {
    inner: Arc<Inner>,
}

struct Inner {
    leases: Api<DynamicObject>,
    replica: String,
    /// This replica's admin API URL, for its peers.
    advertise: String,
    /// The replica Lease's name.
    lease_name: String,
    ttl: Duration,
    state: Mutex<State>,
    losers: Mutex<Vec<mpsc::UnboundedSender<(String, u64)>>>,
    /// One lock per node: its claims and releases run one at a time, so a
    /// release's delete never overtakes the next claim.
    node_locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    counts: watch::Sender<ClaimCounts>,
    keeper: Mutex<Option<JoinHandle<()>>>,
    /// Stops a keeper on its own thread.
    stop_keeper: watch::Sender<bool>,
    /// Done before a node's claim is given up (its delivery cursor
    /// written, while the write is still this replica's).
    before_release: std::sync::OnceLock<super::BeforeRelease>,
    /// How the replicas even out their nodes, as on etcd.
    share: Mutex<Share>,
    rebalancer: Mutex<Option<JoinHandle<()>>>,
}

/// An annotation of `lease`.
fn annotation<'a>(lease: &'a DynamicObject, name: &str) -> Option<&'a str> {
    lease
        .metadata
        .annotations
        .as_ref()?
        .get(name)
        .map(String::as_str)
        .filter(|value| !value.is_empty())
}

/// Whether `lease` was last renewed more than twice its duration before
/// `now` (a clock comparison: good enough for choosing which replicas to
/// ask for a list, never used for claims).
fn long_unrenewed(lease: &DynamicObject, now: jiff::Timestamp) -> bool {
    let renewed = lease
        .data
        .pointer("/spec/renewTime")
        .and_then(Value::as_str)
        .and_then(|time| time.parse::<jiff::Timestamp>().ok());
    let duration = declared_duration(lease);
    match (renewed, duration) {
        (Some(renewed), Some(duration)) => {
            let age = now.duration_since(renewed);
            age.as_secs() > 0 && age.unsigned_abs() > duration * 2
        }
        _ => false,
    }
}

/// The holder a claim Lease names and the URL its replica Lease publishes
/// (`crate::peers`). A claim whose replica Lease is gone or another
/// incarnation is held by nobody.
impl crate::peers::PeerDirectory for LeaseClaims {
    fn holder(&self, node: &str) -> BoxFuture<'static, Result<Option<crate::peers::Peer>, String>> {
        let (inner, node) = (self.inner.clone(), node.to_owned());
        Box::pin(async move {
            let Ok(claim_name) = claim_lease_name(&node) else {
                return Ok(None);
            };
            let api = |name: &str, err| format!("the API server: {}", refused(err, name));
            let Some(claim) = inner
                .leases
                .get_opt(&claim_name)
                .await
                .map_err(|err| api(&claim_name, err))?
            else {
                return Ok(None);
            };
            let holder = claim
                .data
                .pointer("/spec/holderIdentity")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned();
            let Ok(lease_name) = replica_lease_name(&holder) else {
                return Ok(None);
            };
            let Some(lease) = inner
                .leases
                .get_opt(&lease_name)
                .await
                .map_err(|err| api(&lease_name, err))?
            else {
                return Ok(None);
            };
            let named = annotation(&claim, REPLICA_UID_ANNOTATION);
            if named.is_none() || named != lease.metadata.uid.as_deref() {
                return Ok(None);
            }
            Ok(Some(crate::peers::Peer {
                replica: holder,
                url: annotation(&lease, crate::peers::ADDRESS_ANNOTATION).map(str::to_owned),
            }))
        })
    }

    fn replicas(&self) -> BoxFuture<'static, Result<Vec<crate::peers::Peer>, String>> {
        let inner = self.inner.clone();
        Box::pin(async move {
            let listed = inner
                .leases
                .list(&ListParams::default())
                .await
                .map_err(|err| format!("the API server: {err}"))?;
            Ok(listed
                .items
                .iter()
                .filter(|lease| {
                    lease
                        .metadata
                        .name
                        .as_deref()
                        .is_some_and(|name| name.starts_with(REPLICA_LEASE_PREFIX))
                })
                // Only whom to ask (never who holds what): a Lease left by
                // a replica that died is skipped once it is well past its
                // duration by this machine's clock.
                .filter(|lease| !long_unrenewed(lease, jiff::Timestamp::now()))
                .filter_map(|lease| {
                    let replica = lease.data.pointer("/spec/holderIdentity")?.as_str()?;
                    Some(crate::peers::Peer {
                        replica: replica.to_owned(),
                        url: annotation(lease, crate::peers::ADDRESS_ANNOTATION).map(str::to_owned),
                    })
                })
                .collect())
        })
    }
}

/// Whether `name` is a DNS subdomain (RFC 1123), as object names are.
pub(crate) fn dns_subdomain(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > 253 {
        return Err(format!("{} characters (1 to 253)", name.len()));
    }
    let allowed = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.';
    if let Some(c) = name.chars().find(|c| !allowed(*c)) {
        return Err(format!(
            "{c:?} is not a lowercase letter, digit, '-' or '.'"
        ));
    }
    let alphanumeric = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    if !alphanumeric(name.chars().next()) || !alphanumeric(name.chars().last()) {
        return Err("it must start and end with a letter or digit".to_owned());
    }
    if name
        .split('.')
        .any(|label| label.is_empty() || label.starts_with('-') || label.ends_with('-'))
    {
        return Err("each dot-separated part must start and end with a letter or digit".to_owned());
    }
    Ok(())
}

/// The name of `replica`'s Lease, if it can be one.
pub fn replica_lease_name(replica: &str) -> Result<String, String> {
    let name = format!("{REPLICA_LEASE_PREFIX}{replica}");
    dns_subdomain(&name).map(|()| name)
}

/// The name of `node`'s claim Lease, if it can be one.
pub fn claim_lease_name(node: &str) -> Result<String, String> {
    let name = format!("{CLAIM_LEASE_PREFIX}{node}");
    dns_subdomain(&name).map(|()| name)
}

/// The `leaseDurationSeconds` a Lease declares, if it declares one.
fn declared_duration(lease: &DynamicObject) -> Option<Duration> {
    lease
        .data
        .pointer("/spec/leaseDurationSeconds")
        .and_then(Value::as_u64)
        .filter(|seconds| *seconds > 0)
        .map(Duration::from_secs)
}

/// Whether an answer says the object is gone, or changed since read.
fn gone_or_changed(err: &DesiredError) -> bool {
    matches!(
        err,
        DesiredError::NotFound { .. } | DesiredError::Conflict { .. }
    )
}

/// A new Lease held by `holder` (`annotations`: none but these).
fn new_lease(name: &str, holder: &str, ttl: Duration, annotations: Option<Value>) -> Value {
    let now = micro_time();
    let mut lease = json!({
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": name},
        "spec": {
            "holderIdentity": holder,
            "leaseDurationSeconds": ttl.as_secs(),
            "acquireTime": now,
            "renewTime": now,
            "leaseTransitions": 0,
        },
    });
    if let Some(annotations) = annotations {
        lease["metadata"]["annotations"] = annotations;
    }
    lease
}

/// What making a new incarnation of the replica's Lease came to.
enum Incarnated {
    /// Made: asked for at that instant.
    Made {
        asked: Instant,
        uid: String,
        lease: Value,
    },
    /// The Lease of this name is another process's, and may be live for
    /// that long yet.
    Waiting(Duration),
}

impl Inner {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn node_lock(&self, node: &str) -> Arc<tokio::sync::Mutex<()>> {
        self.node_locks
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(node.to_owned())
            .or_default()
            .clone()
    }

    fn share(&self) -> MutexGuard<'_, Share> {
        self.share.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Tells cloudhub (every subscriber) to close these nodes' sessions.
    fn tell(&self, nodes: &[(String, u64)]) {
        let mut losers = self.losers.lock().unwrap_or_else(PoisonError::into_inner);
        losers.retain(|loser| nodes.iter().all(|node| loser.send(node.clone()).is_ok()));
    }

    /// Tells cloudhub (every subscriber) of claims lost.
    fn lose(&self, nodes: Vec<(String, u64)>) {
        if nodes.is_empty() {
            return;
        }
        warn!(
            replica = %self.replica,
            count = nodes.len(),
            "claims lost: those nodes' links are closed"
        );
        let held = self.state().book.len();
        self.counts.send_modify(|c| {
            c.lost += nodes.len() as u64;
            c.held = held;
        });
        self.share().clear();
        let mut losers = self.losers.lock().unwrap_or_else(PoisonError::into_inner);
        losers.retain(|loser| nodes.iter().all(|node| loser.send(node.clone()).is_ok()));
    }

    /// Takes `node`'s claim Lease `name` for the incarnation `uid`: made,
    /// found already this incarnation's, or taken over from a replica
    /// whose claim is free. Why not, otherwise.
    async fn take(&self, node: &str, name: &str, uid: &str) -> Result<ClaimRef, String> {
        let api = |err: DesiredError| format!("the API server: {err}");
        let annotations = json!({ REPLICA_UID_ANNOTATION: uid });
        let claim =
            dynamic(&new_lease(name, &self.replica, self.ttl, Some(annotations))).map_err(api)?;
        match self.leases.create(&PostParams::default(), &claim).await {
            Ok(created) => return ClaimRef::of(&created),
            Err(err) => match refused(err, name) {
                DesiredError::AlreadyExists { .. } => {}
                other => return Err(api(other)),
            },
        }
        let changed = || format!("the claim on {node} changed meanwhile");
        let Some(existing) = self
            .leases
            .get_opt(name)
            .await
            .map_err(|err| api(refused(err, name)))?
        else {
            return Err(changed());
        };
        let named = existing
            .metadata
            .annotations
            .as_ref()
            .and_then(|annotations| annotations.get(REPLICA_UID_ANNOTATION))
            .cloned();
        if named.as_deref() == Some(uid) {
            // Made under this incarnation (a create whose answer was lost,
            // a release that did not reach the API server).
            return ClaimRef::of(&existing);
        }
        let holder = existing
            .data
            .pointer("/spec/holderIdentity")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        let why = match holder.is_empty() {
            true => "it names no holder".to_owned(),
            false => self.holder(node, &holder, named.as_deref()).await?,
        };
        // Taken over, on condition that nobody wrote it since it was read.
        let mut lease = serde_json::to_value(&existing).map_err(|err| api(backend(err)))?;
        let now = micro_time();
        let transitions = lease
            .pointer("/spec/leaseTransitions")
            .and_then(Value::as_i64)
            .unwrap_or(0);
        lease["metadata"]["annotations"][REPLICA_UID_ANNOTATION] = json!(uid);
        lease["spec"]["holderIdentity"] = json!(self.replica);
        lease["spec"]["leaseDurationSeconds"] = json!(self.ttl.as_secs());
        lease["spec"]["acquireTime"] = json!(now);
        lease["spec"]["renewTime"] = json!(now);
        lease["spec"]["leaseTransitions"] = json!(transitions.saturating_add(1));
        let lease = dynamic(&lease).map_err(api)?;
        match self
            .leases
            .replace(name, &PostParams::default(), &lease)
            .await
        {
            Ok(replaced) => {
                info!(node, from = %holder, why = %why, "node's claim taken over");
                ClaimRef::of(&replaced)
            }
            Err(err) => match refused(err, name) {
                err if gone_or_changed(&err) => Err(changed()),
                other => Err(api(other)),
            },
        }
    }

    /// Whether the claim on `node` that `holder` made under its replica
    /// Lease `named` (that Lease's uid) is free: the Lease is gone, another
    /// incarnation, or seen unchanged for its whole duration. Why it is
    /// free; why not (who holds it) as the error.
    async fn holder(
        &self,
        node: &str,
        holder: &str,
        named: Option<&str>,
    ) -> Result<String, String> {
        let Ok(lease_name) = replica_lease_name(holder) else {
            return Ok(format!("{holder:?} names no replica Lease"));
        };
        let asked = Instant::now();
        let found = self
            .leases
            .get_opt(&lease_name)
            .await
            .map_err(|err| format!("the API server: {}", refused(err, &lease_name)))?;
        let answered = Instant::now();
        let Some(lease) = found else {
            self.state().observed.forget(&lease_name);
            return Ok(format!("replica {holder}'s Lease is gone"));
        };
        let current = lease.metadata.uid.as_deref();
        if named.is_some_and(|named| Some(named) != current) {
            return Ok(format!(
                "replica {holder}'s Lease is another incarnation than the claim's"
            ));
        }
        let duration = declared_duration(&lease).unwrap_or(self.ttl);
        let version = lease.metadata.resource_version.unwrap_or_default();
        let verdict =
            self.state()
                .observed
                .observe(&lease_name, &version, duration, asked, answered);
        match verdict {
            Verdict::Expired => Ok(format!(
                "replica {holder}'s Lease was not renewed for {duration:?}"
            )),
            Verdict::Live { left } => {
                debug!(node, holder, ?left, "claim held by a live replica");
                Err(format!("replica {holder} serves node {node}"))
            }
        }
    }

    /// Deletes `node`'s claim Lease if it is still exactly `claim`.
    async fn remove_claim(&self, node: &str, claim: &ClaimRef) {
        let Ok(name) = claim_lease_name(node) else {
            return;
        };
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: Some(claim.uid.clone()),
                resource_version: Some(claim.resource_version.clone()),
            }),
            ..DeleteParams::default()
        };
        let deleted = tokio::time::timeout(self.ttl, self.leases.delete(&name, &params)).await;
        match deleted {
            Ok(Ok(_)) => debug!(node, "claim given up"),
            Ok(Err(err)) => match refused(err, &name) {
                err if gone_or_changed(&err) => {
                    debug!(node, "claim already gone or taken: left as it is");
                }
                err => debug!(
                    node,
                    error = %err,
                    "claim not removed; free once this incarnation of the replica ends"
                ),
            },
            Err(_) => debug!(node, "claim removal timed out"),
        }
    }

    /// Makes a new incarnation of the replica's Lease: the instant it was
    /// asked for and the Lease; or how long an earlier process's Lease of
    /// this name may still be live.
    async fn incarnate(
        &self,
        leases: &Api<DynamicObject>,
        retired: Option<&str>,
    ) -> Result<Incarnated, DesiredError> {
        let name = &self.lease_name;
        let asked = Instant::now();
        let existing = leases
            .get_opt(name)
            .await
            .map_err(|err| refused(err, name))?;
        let answered = Instant::now();
        if let Some(existing) = existing {
            let uid = existing.metadata.uid.clone();
            let version = existing.metadata.resource_version.clone();
            let ours = retired.is_some() && uid.as_deref() == retired;
            if !ours {
                // Another process of this name made it: wait for it to end.
                let duration = declared_duration(&existing).unwrap_or(self.ttl);
                let verdict = self.state().observed.observe(
                    name,
                    version.as_deref().unwrap_or_default(),
                    duration,
                    asked,
                    answered,
                );
                if let Verdict::Live { left } = verdict {
                    return Ok(Incarnated::Waiting(left));
                }
            }
            let params = DeleteParams {
                preconditions: Some(Preconditions {
                    uid,
                    resource_version: version.filter(|_| !ours),
                }),
                ..DeleteParams::default()
            };
            match leases.delete(name, &params).await {
                Ok(_) => {}
                Err(err) => match refused(err, name) {
                    DesiredError::NotFound { .. } => {}
                    other => return Err(other),
                },
            }
            self.state().observed.forget(name);
        }
        let asked = Instant::now();
        let annotations = (!self.advertise.is_empty())
            .then(|| json!({ crate::peers::ADDRESS_ANNOTATION: self.advertise }));
        let lease = dynamic(&new_lease(name, &self.replica, self.ttl, annotations))?;
        let created = leases
            .create(&PostParams::default(), &lease)
            .await
            .map_err(|err| refused(err, name))?;
        let uid = created.metadata.uid.clone().ok_or_else(|| {
            DesiredError::Backend("the API server answered a replica Lease with no uid".to_owned())
        })?;
        let lease = serde_json::to_value(&created).map_err(backend)?;
        Ok(Incarnated::Made { asked, uid, lease })
    }
}

impl LeaseClaims {
    /// Starts keeping this replica's Lease on `client` (making the
    /// namespace if it is missing). Claims are refused until the Lease is
    /// made ([`ClaimCounts::leases`] counts them).
    pub async fn start(
        client: Client,
        config: LeaseClaimsConfig,
    ) -> Result<LeaseClaims, LeaseError> {
        let lease_name =
            replica_lease_name(&config.replica).map_err(|reason| LeaseError::InvalidReplica {
                replica: config.replica.clone(),
                reason,
            })?;
        if config.ttl < Duration::from_secs(1) || config.ttl.subsec_nanos() != 0 {
            return Err(LeaseError::InvalidTtl(config.ttl));
        }
        ensure_namespace(&client, &config.namespace).await?;
        let leases = Api::namespaced_with(client, &config.namespace, &lease_resource());
        let (counts, _) = watch::channel(ClaimCounts::default());
        let inner = Arc::new(Inner {
            leases,
            replica: config.replica,
            advertise: config.advertise,
            lease_name,
            ttl: config.ttl,
            state: Mutex::new(State {
                book: ClaimBook::new(config.ttl, config.ttl / 5),
                own: None,
                retired: None,
                incarnations: 0,
                observed: Observations::new(),
            }),
            losers: Mutex::new(Vec::new()),
            node_locks: Mutex::new(HashMap::new()),
            counts,
            keeper: Mutex::new(None),
            stop_keeper: watch::Sender::new(false),
            before_release: std::sync::OnceLock::new(),
            share: Mutex::new(Share::new(config.ttl * 2, 0.25)),
            rebalancer: Mutex::new(None),
        });
        let span = info_span!("replica_lease", replica = %inner.replica);
        match config.keeper_client {
            Some(client) => {
                spawn_keeper(&inner, client, config.namespace.clone(), span).map_err(|err| {
                    LeaseError::Api(DesiredError::Backend(format!(
                        "the Lease keeper's thread: {err}"
                    )))
                })?
            }
            None => {
                let leases = inner.leases.clone();
                let keeper =
                    tokio::spawn(keep_lease(Arc::downgrade(&inner), leases).instrument(span));
                *inner.keeper.lock().unwrap_or_else(PoisonError::into_inner) = Some(keeper);
            }
        }
        let rebalancer = tokio::spawn(rebalance(Arc::downgrade(&inner)));
        *inner
            .rebalancer
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(rebalancer);
        Ok(LeaseClaims { inner })
    }

    /// `hook` is done (for a third of the TTL at most) before a node's
    /// claim is given up: what must be written under the claim, such as
    /// the node's delivery cursor ([`super::CursorWriter::before_release`]).
    /// Set once.
    pub fn before_release(&self, hook: super::BeforeRelease) {
        let _ = self.inner.before_release.set(hook);
    }

    /// This replica's claim on `node`, if it holds one under a trusted
    /// Lease: the claim Lease's `resourceVersion` as a number (its token)
    /// and a guard that keeps the claim steady (no claim or release of
    /// the node here) until dropped. What is written under it is fenced
    /// by the trust window only (see the module's notes on fencing).
    pub async fn fence(&self, node: &str) -> Option<(i64, tokio::sync::OwnedMutexGuard<()>)> {
        let settled = self.inner.node_lock(node).lock_owned().await;
        let token = {
            let state = self.inner.state();
            state.trusted(Instant::now())?;
            state.book.revision(node)?.token
        };
        (token != 0).then_some((token, settled))
    }

    /// This replica's name.
    pub fn replica(&self) -> &str {
        &self.inner.replica
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
            debug!(node, reason, "claim refused");
            inner.counts.send_modify(|c| c.refused += 1);
            Err(reason)
        };
        let name = match claim_lease_name(node) {
            Ok(name) => name,
            Err(reason) => {
                return refused(format!(
                    "node name {node:?} cannot name a claim Lease: {reason}"
                ));
            }
        };
        let (trusted, held) = {
            let state = inner.state();
            (state.trusted(Instant::now()), state.book.revision(node))
        };
        let Some((number, uid)) = trusted else {
            return refused(
                "this replica holds no trusted Lease (the API server out of reach)".to_owned(),
            );
        };
        if inner.share().refuses(node, Instant::now()) {
            return refused(format!(
                "node {node} was handed over to another replica to even the replicas out"
            ));
        }
        if let Some(claim) = held {
            // The node linked again: the claim is the new session's now.
            return Ok(inner.state().book.claimed(node, claim));
        }
        let claim = match tokio::time::timeout(inner.ttl, inner.take(node, &name, &uid)).await {
            Ok(Ok(claim)) => claim,
            Ok(Err(reason)) => return refused(reason),
            Err(_) => {
                return refused(format!(
                    "the API server did not answer within {:?}",
                    inner.ttl
                ));
            }
        };
        // The Lease may have been lost or given up while the API server
        // answered.
        let claimed = {
            let mut state = inner.state();
            let trusted = state.trusted(Instant::now()).map(|(number, _)| number) == Some(number);
            trusted.then(|| (state.book.claimed(node, claim.clone()), state.book.len()))
        };
        let Some((generation, held)) = claimed else {
            inner.remove_claim(node, &claim).await;
            return refused("this replica's Lease ended while claiming".to_owned());
        };
        debug!(node, token = claim.token, generation, "node claimed");
        inner.counts.send_modify(|c| {
            c.taken += 1;
            c.held = held;
        });
        Ok(generation)
    }

    /// The session of `generation` gave `node` up: its claim Lease is
    /// deleted, unless a newer session of the node holds the claim, or the
    /// Lease changed since this replica wrote it (another replica took it).
    pub async fn release_now(&self, node: &str, generation: u64) {
        let inner = &self.inner;
        if let Some(hook) = inner.before_release.get() {
            let _ = tokio::time::timeout(inner.ttl / 3, hook(node.to_owned())).await;
        }
        let lock = inner.node_lock(node);
        let _one_at_a_time = lock.lock().await;
        let claim = inner.state().book.released(node, generation);
        if let Some(claim) = claim {
            inner.remove_claim(node, &claim).await;
        }
        // Counted once the claim Lease is gone: until then another replica
        // still finds the node held, and a count that dropped earlier told
        // a watcher it could take the node over when it could not yet.
        let held = inner.state().book.len();
        inner.counts.send_modify(|c| c.held = held);
    }

    /// Stops renewing, lets every node go and deletes the replica's Lease
    /// (a replica told to stop): every node it held may be claimed by
    /// another at once.
    pub async fn give_up(&self) {
        let inner = &self.inner;
        inner.stop_keeper.send_replace(true);
        for task in [&inner.keeper, &inner.rebalancer] {
            if let Some(task) = task.lock().unwrap_or_else(PoisonError::into_inner).take() {
                task.abort();
            }
        }
        let (own, lost) = {
            let mut state = inner.state();
            let own = state.own.clone();
            (own, state.incarnation_gone())
        };
        inner.lose(lost);
        let Some(own) = own else {
            return;
        };
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: Some(own.uid),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        let name = &inner.lease_name;
        match tokio::time::timeout(inner.ttl, inner.leases.delete(name, &params)).await {
            Ok(Ok(_)) => {
                info!(replica = %inner.replica, "replica Lease deleted: its nodes are free")
            }
            Ok(Err(err)) => match refused(err, name) {
                err if gone_or_changed(&err) => {}
                err => {
                    warn!(error = %err, "replica Lease not deleted; its nodes wait for it to end")
                }
            },
            Err(_) => warn!("replica Lease deletion timed out; its nodes wait for it to end"),
        }
    }
}

impl hub::NodeClaims for LeaseClaims {
    fn claim(&self, node: &str) -> BoxFuture<'static, Result<u64, String>> {
        let (claims, node) = (self.clone(), node.to_owned());
        Box::pin(async move { claims.claim_now(&node).await })
    }

    fn release(&self, node: &str, generation: u64) {
        let (claims, node) = (self.clone(), node.to_owned());
        tokio::spawn(async move { claims.release_now(&node, generation).await });
    }

    fn holds(&self, node: &str) -> bool {
        let state = self.inner.state();
        state.book.lease(Instant::now()).is_some() && state.book.holds(node)
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
        Box::pin(async move { inner.unclaimed(nodes).await })
    }
}

impl Inner {
    /// Of `nodes`, those whose claim Lease is missing or names an
    /// incarnation of a replica Lease that is not live (gone, replaced,
    /// or observed unrenewed for its duration; every replica is taken to
    /// run with this TTL). A replica Lease seen for the first time, and
    /// this replica's own, count as live.
    async fn unclaimed(&self, nodes: Vec<String>) -> Result<Vec<String>, String> {
        let asked = Instant::now();
        let listed =
            tokio::time::timeout(self.ttl, self.leases.list_metadata(&ListParams::default()))
                .await
                .map_err(|_| format!("the API server did not answer within {:?}", self.ttl))?
                .map_err(|err| format!("the API server: {err}"))?;
        let answered = Instant::now();
        let mut live = std::collections::HashSet::new();
        let mut claims = HashMap::new();
        {
            let mut state = self.state();
            for lease in &listed.items {
                let (Some(name), Some(uid)) = (&lease.metadata.name, &lease.metadata.uid) else {
                    continue;
                };
                if name.starts_with(CLAIM_LEASE_PREFIX) {
                    let named = lease
                        .metadata
                        .annotations
                        .as_ref()
                        .and_then(|a| a.get(REPLICA_UID_ANNOTATION))
                        .cloned()
                        .unwrap_or_default();
                    claims.insert(name.clone(), named);
                } else if *name == self.lease_name {
                    // Others may count it live until they see it end.
                    live.insert(uid.clone());
                } else if name.starts_with(REPLICA_LEASE_PREFIX) {
                    let version = lease.metadata.resource_version.as_deref().unwrap_or("");
                    let verdict = state
                        .observed
                        .observe(name, version, self.ttl, asked, answered);
                    if matches!(verdict, Verdict::Live { .. }) {
                        live.insert(uid.clone());
                    }
                }
            }
        }
        Ok(nodes
            .into_iter()
            .filter(|node| {
                let claim = claim_lease_name(node)
                    .ok()
                    .and_then(|name| claims.get(&name));
                claim.is_none_or(|named| !live.contains(named))
            })
            .collect())
    }
}

/// Renews the incarnation `own`: whether to renew again at once (the
/// renewal found the Lease written by an earlier renewal of its own that
/// answered late).
async fn renew(held: &Inner, leases: &Api<DynamicObject>, own: Incarnation) -> bool {
    let name = &held.lease_name;
    let mut lease = own.lease.clone();
    lease["spec"]["renewTime"] = json!(micro_time());
    let lease = match dynamic(&lease) {
        Ok(lease) => lease,
        Err(err) => {
            warn!(error = %err, "replica Lease unwritable");
            return false;
        }
    };
    let deadline = renewal_deadline(held.state().book.trusted_until(), held.ttl);
    let asked = Instant::now();
    let written = tokio::time::timeout_at(
        deadline,
        leases.replace(name, &PostParams::default(), &lease),
    )
    .await;
    let err = match written {
        Ok(Ok(written)) if written.metadata.uid.as_deref() == Some(own.uid.as_str()) => {
            let mut state = held.state();
            if let Some(current) = state
                .own
                .as_mut()
                .filter(|current| current.number == own.number)
                && let Ok(lease) = serde_json::to_value(&written)
            {
                current.lease = lease;
                state.book.renewed(asked);
            }
            drop(state);
            held.counts.send_modify(|c| c.renewed(asked.elapsed()));
            return false;
        }
        Ok(Ok(_)) => DesiredError::Conflict {
            key: name.clone(),
            reason: "another incarnation".to_owned(),
        },
        Ok(Err(err)) => refused(err, name),
        Err(_) => {
            debug!("replica Lease renewal timed out");
            return false;
        }
    };
    match err {
        DesiredError::NotFound { .. } => {
            warn!("the replica Lease was deleted: its claims are lost");
        }
        DesiredError::Conflict { .. } => {
            // Written since: by a renewal of this incarnation answered too
            // late (take its version and renew again), or another
            // incarnation is there.
            let read = tokio::time::timeout_at(deadline, leases.get_opt(name)).await;
            match read {
                Ok(Ok(Some(current)))
                    if current.metadata.uid.as_deref() == Some(own.uid.as_str()) =>
                {
                    let mut state = held.state();
                    if let Some(mine) = state.own.as_mut().filter(|mine| mine.number == own.number)
                        && let Ok(lease) = serde_json::to_value(&current)
                    {
                        mine.lease = lease;
                    }
                    return true;
                }
                Ok(Ok(_)) => warn!("the replica Lease was replaced: its claims are lost"),
                Ok(Err(err)) => {
                    debug!(error = %refused(err, name), "replica Lease not read");
                    return false;
                }
                Err(_) => return false,
            }
        }
        err => {
            debug!(error = %err, "replica Lease not renewed");
            return false;
        }
    }
    let lost = {
        let mut state = held.state();
        match state
            .own
            .as_ref()
            .is_some_and(|current| current.number == own.number)
        {
            true => state.incarnation_gone(),
            false => Vec::new(),
        }
    };
    held.lose(lost);
    false
}

/// Runs [`keep_lease`] on a thread of its own, with its own runtime and
/// its own API client made from `client`, until told to stop or the
/// claims are dropped.
fn spawn_keeper(
    inner: &Arc<Inner>,
    client: kube::Config,
    namespace: String,
    span: tracing::Span,
) -> std::io::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let (weak, mut stop) = (Arc::downgrade(inner), inner.stop_keeper.subscribe());
    std::thread::Builder::new()
        .name("lease-keeper".to_owned())
        .spawn(move || {
            runtime.block_on(
                async move {
                    // Made here: its connection's tasks run on this runtime.
                    let client = match Client::try_from(client) {
                        Ok(client) => client,
                        Err(err) => {
                            return warn!(error = %err, "the Lease keeper has no API client");
                        }
                    };
                    let leases = Api::namespaced_with(client, &namespace, &lease_resource());
                    tokio::select! {
                        () = keep_lease(weak, leases) => {}
                        _ = stop.wait_for(|stopped| *stopped) => {}
                    }
                }
                .instrument(span),
            );
        })?;
    Ok(())
}

/// Keeps the replica's Lease: made, renewed three times per TTL; when it
/// is no longer trusted, its nodes are lost and a new incarnation is made.
async fn keep_lease(inner: Weak<Inner>, leases: Api<DynamicObject>) {
    let Some(ttl) = inner.upgrade().map(|held| held.ttl) else {
        return;
    };
    let check = (ttl / 10).max(Duration::from_millis(50));
    let mut backoff = Backoff::new(Duration::from_millis(200), ttl / 3);
    loop {
        let Some(held) = inner.upgrade() else { return };
        let (lost, own, retired) = {
            let mut state = held.state();
            let lost = match state.book.expire(Instant::now()) {
                lost if state.book.has_lease() => lost,
                mut lost => {
                    lost.extend(state.incarnation_gone());
                    lost
                }
            };
            (lost, state.own.clone(), state.retired.clone())
        };
        held.lose(lost);
        match own {
            None => {
                match tokio::time::timeout(ttl / 3, held.incarnate(&leases, retired.as_deref()))
                    .await
                {
                    Ok(Ok(Incarnated::Made { asked, uid, lease })) => {
                        let lost = {
                            let mut state = held.state();
                            state.incarnations += 1;
                            let number = state.incarnations;
                            state.own = Some(Incarnation {
                                number,
                                uid: uid.clone(),
                                lease,
                            });
                            state.retired = None;
                            state.book.granted(number, asked)
                        };
                        held.lose(lost);
                        held.counts.send_modify(|c| c.leases += 1);
                        info!(lease = %held.lease_name, %uid, "replica Lease made");
                        backoff.reset();
                    }
                    Ok(Ok(Incarnated::Waiting(left))) => {
                        info!(
                            lease = %held.lease_name,
                            ?left,
                            "the replica Lease is another process's (an earlier one of this name?): waiting for it to end"
                        );
                        drop(held);
                        tokio::time::sleep(left.min(ttl / 3).max(check)).await;
                        continue;
                    }
                    Ok(Err(err)) => {
                        debug!(error = %err, "no replica Lease; trying again");
                        drop(held);
                        backoff.pause().await;
                        continue;
                    }
                    Err(_) => continue,
                }
            }
            Some(own) => {
                if renew(&held, &leases, own).await {
                    drop(held);
                    tokio::time::sleep(check).await;
                    continue;
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
            let lost = {
                let mut state = held.state();
                let mut lost = state.book.expire(Instant::now());
                if !state.book.has_lease() {
                    lost.extend(state.incarnation_gone());
                }
                lost
            };
            let ended = !lost.is_empty() || !held.state().book.has_lease();
            held.lose(lost);
            if ended {
                break;
            }
        }
    }
}

/// Evens the replicas out, as on etcd ([`Share`]): a round every TTL (give
/// or take a quarter), in which the namespace's Leases are listed (their
/// metadata only): the replicas up are the replica Leases not seen
/// unrenewed for a TTL (this replica's own observation, as for claims;
/// every replica is taken to run with the same TTL), the nodes claimed
/// the claim Leases. The surplus over this replica's share is handed
/// over: links closed, claims released, refused here for a while.
async fn rebalance(inner: Weak<Inner>) {
    loop {
        let Some(ttl) = inner.upgrade().map(|held| held.ttl) else {
            return;
        };
        tokio::time::sleep(ttl.mul_f64(0.75 + fastrand::f64() * 0.5)).await;
        let Some(held) = inner.upgrade() else { return };
        if held.state().trusted(Instant::now()).is_none() {
            continue;
        }
        let asked = Instant::now();
        let listed =
            tokio::time::timeout(ttl / 3, held.leases.list_metadata(&ListParams::default())).await;
        let listed = match listed {
            Ok(Ok(listed)) => listed,
            Ok(Err(err)) => {
                debug!(error = %err, "Leases not listed; no rebalancing this round");
                continue;
            }
            Err(_) => continue,
        };
        let answered = Instant::now();
        let (mut replicas, mut claimed) = (0usize, 0usize);
        {
            let mut state = held.state();
            for lease in &listed.items {
                let Some(name) = lease.metadata.name.as_deref() else {
                    continue;
                };
                if name.starts_with(CLAIM_LEASE_PREFIX) {
                    claimed += 1;
                } else if name == held.lease_name {
                    replicas += 1;
                } else if name.starts_with(REPLICA_LEASE_PREFIX) {
                    let version = lease.metadata.resource_version.as_deref().unwrap_or("");
                    let verdict = state.observed.observe(name, version, ttl, asked, answered);
                    if matches!(verdict, Verdict::Live { .. }) {
                        replicas += 1;
                    }
                }
            }
        }
        let going = hand_over(
            &mut held.share(),
            &held.counts,
            held.state().book.held(),
            claimed,
            replicas,
        );
        if going.is_empty() {
            continue;
        }
        held.tell(&going);
        let claims = LeaseClaims { inner: held };
        for (node, generation) in going {
            claims.release_now(&node, generation).await;
        }
    }
}

#[cfg(test)]
mod tests;
