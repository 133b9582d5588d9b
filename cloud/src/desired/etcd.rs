//! The etcd desired-state backend: the desired state several cloudcore
//! replicas share (standalone mode, without Kubernetes).
//!
//! Each object is one key, `<prefix>/objects/<kind>/<namespace>/<name>`,
//! its JSON the value; its `metadata.resourceVersion` is the key's etcd
//! revision, which only grows across every key, as the edge needs. Writes
//! are etcd transactions on the revision the writer read, so replicas
//! never overwrite each other's changes; they behave as the embedded
//! store's (the same defaulting, spec and status rules). Every replica
//! keeps the whole desired state in memory from one watch of the prefix,
//! for the reads [`DesiredState`] serves without waiting, and for its
//! watches ([`Feed`]). When etcd has compacted the history a watch needs,
//! the replica lists again and its own watchers do too.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use etcd::{Change, Entry, Etcd, EtcdError, Written};
use futures_util::StreamExt;
use serde_json::Value;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{debug, warn};

use apis::kinds::{Kind, ObjectKey};

use crate::backoff::Backoff;

use super::embedded::{created, set_revision, with_spec, with_status};
use super::feed::Feed;
use super::packed::{ChangeKind, Packed, PackedEvent};
use super::{DesiredError, DesiredState, Object, StoreFuture, WatchStream, object_of};

/// Changes of each kind kept in memory for watches to resume from.
const WINDOW: usize = 16 * 1024;

/// How often a write retries when another replica wrote the same object
/// between its read and its write (only where the caller set no
/// precondition of its own).
const RETRIES: usize = 5;

/// What a write for a node must hold (this replica's claim on it, or that
/// none exists), once any claim or release of the node under way is done,
/// and a token that keeps further ones waiting until the write is done;
/// `None`: this replica may write nothing of it.
pub type FenceOf = Arc<
    dyn Fn(String) -> futures_util::future::BoxFuture<'static, Option<(etcd::Fence, FenceHold)>>
        + Send
        + Sync,
>;

/// Waits until a replica's mirror holds every change up to a revision
/// ([`EtcdStore::catching_up`]).
pub type CatchUp = Arc<dyn Fn(i64) -> futures_util::future::BoxFuture<'static, ()> + Send + Sync>;

/// Held while a fenced write is made: the fence cannot change meanwhile.
pub type FenceHold = Box<dyn std::any::Any + Send>;

/// Where the backend's etcd is, and where in it its keys live.
#[derive(Debug, Clone)]
pub struct EtcdConfig {
    /// The members' client URLs (`http://host:2379`).
    pub endpoints: Vec<String>,
    /// The key prefix (`/edgehive`).
    pub prefix: String,
}

impl EtcdConfig {
    /// Defaults for `endpoints`: prefix `/edgehive`.
    pub fn new(endpoints: Vec<String>) -> EtcdConfig {
        EtcdConfig {
            endpoints,
            prefix: "/edgehive".to_owned(),
        }
    }
}

/// What a replica holds of the desired state.
struct Mirror {
    objects: RwLock<HashMap<Kind, BTreeMap<ObjectKey, Packed>>>,
    /// The revision the mirror is current at: every change up to it is in.
    revision: watch::Sender<u64>,
    feed: Feed,
}

impl Mirror {
    fn objects(
        &self,
    ) -> std::sync::RwLockReadGuard<'_, HashMap<Kind, BTreeMap<ObjectKey, Packed>>> {
        self.objects.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn objects_mut(
        &self,
    ) -> std::sync::RwLockWriteGuard<'_, HashMap<Kind, BTreeMap<ObjectKey, Packed>>> {
        self.objects.write().unwrap_or_else(PoisonError::into_inner)
    }

    fn revision(&self) -> u64 {
        *self.revision.borrow()
    }

    fn set_revision(&self, revision: u64) {
        self.revision.send_if_modified(|held| {
            let newer = revision > *held;
            *held = (*held).max(revision);
            newer
        });
    }
}

/// The desired state in etcd.
pub struct EtcdStore {
    etcd: Etcd,
    /// With replicas: the claim a status write of a node's must hold.
    fence: std::sync::OnceLock<FenceOf>,
    objects: String,
    revision_key: String,
    mirror: Arc<Mirror>,
    follower: JoinHandle<()>,
}

impl Drop for EtcdStore {
    fn drop(&mut self) {
        self.follower.abort();
    }
}

fn unavailable(err: EtcdError) -> DesiredError {
    DesiredError::Backend(err.to_string())
}

fn revision(value: i64) -> u64 {
    u64::try_from(value).unwrap_or(0)
}

/// The object an entry holds, its revision set.
fn decode(entry: &Entry) -> Result<Object, DesiredError> {
    let corrupt = |reason: String| DesiredError::Corrupt {
        key: String::from_utf8_lossy(&entry.key).into_owned(),
        reason,
    };
    let mut object: Value =
        serde_json::from_slice(&entry.value).map_err(|err| corrupt(err.to_string()))?;
    set_revision(&mut object, revision(entry.mod_revision));
    Object::new(object).map_err(|err| corrupt(err.to_string()))
}

/// The bytes stored for `object` (its revision is the key's own).
fn encode(object: &Value) -> Vec<u8> {
    let mut object = object.clone();
    if let Some(metadata) = object.get_mut("metadata").and_then(Value::as_object_mut) {
        metadata.remove("resourceVersion");
    }
    object.to_string().into_bytes()
}

impl EtcdStore {
    /// Connects to etcd, lists the desired state and follows it.
    pub async fn connect(config: EtcdConfig) -> Result<EtcdStore, DesiredError> {
        let etcd = Etcd::connect(&config.endpoints).map_err(unavailable)?;
        let prefix = config.prefix.trim_end_matches('/');
        let objects = format!("{prefix}/objects/");
        let (listed, at) = etcd.list(objects.as_bytes()).await.map_err(unavailable)?;
        let mirror = Arc::new(Mirror {
            objects: RwLock::new(HashMap::new()),
            revision: watch::Sender::new(revision(at)),
            feed: Feed::new(WINDOW, revision(at)),
        });
        fill(&mirror, &listed);
        // The whole prefix is followed, not only the objects: the mirror's
        // revision then passes every write of the replicas' (a claim's
        // too), which `caught_up` waits for.
        let follower = tokio::spawn(follow(
            etcd.clone(),
            format!("{prefix}/"),
            objects.clone(),
            mirror.clone(),
            at,
        ));
        Ok(EtcdStore {
            etcd,
            fence: std::sync::OnceLock::new(),
            revision_key: format!("{prefix}/revision"),
            objects,
            mirror,
            follower,
        })
    }

    /// With several replicas: a node's status (its Node's, its pods') is
    /// written only under this replica's claim on the node, checked by etcd
    /// in the same transaction, so a replica that lost the node (however
    /// late it learns it) writes nothing of it. `fence_of` gives the claim
    /// to write under, or `None` where this replica holds none. Set once.
    pub fn fence_with(&self, fence_of: FenceOf) {
        let _ = self.fence.set(fence_of);
    }

    /// Waits, when called with a revision, until this replica's mirror
    /// holds every change up to it (of any key under the prefix): a
    /// replica that has just claimed a node at that revision then sees
    /// every apply answered before, whichever replica took it.
    pub fn catching_up(&self) -> CatchUp {
        let mirror = self.mirror.clone();
        Arc::new(move |at: i64| {
            let mut current = mirror.revision.subscribe();
            let wanted = revision(at);
            Box::pin(async move {
                // The sender lives as long as the mirror, held here.
                let _ = current.wait_for(|held| *held >= wanted).await;
            })
        })
    }

    /// The store as the controller takes it.
    pub fn shared(self) -> Arc<dyn DesiredState> {
        Arc::new(self)
    }

    fn key(&self, key: &ObjectKey) -> String {
        format!(
            "{}{}/{}/{}",
            self.objects,
            key.kind.plural(),
            if key.namespace.is_empty() {
                "-"
            } else {
                &key.namespace
            },
            key.name
        )
    }

    /// Reads `key` from etcd itself (not the mirror): what a write must be
    /// conditioned on.
    async fn read(etcd: &Etcd, stored: &str) -> Result<Option<(Object, i64)>, DesiredError> {
        let (entry, _) = etcd.get(stored.as_bytes()).await.map_err(unavailable)?;
        entry
            .map(|entry| decode(&entry).map(|object| (object, entry.mod_revision)))
            .transpose()
    }

    /// Writes what `change` makes of the stored object, on the revision it
    /// was read at; again if another replica wrote in between and the
    /// caller set no precondition.
    fn rewrite(
        &self,
        object: Object,
        change: fn(&Value, Value, &ObjectKey) -> Result<Value, DesiredError>,
        fenced: bool,
    ) -> StoreFuture<Object> {
        let etcd = self.etcd.clone();
        let key = object.key().clone();
        let stored = self.key(&key);
        // A node's status is written only by the replica that serves it.
        let node = match key.kind {
            Kind::Node => Some(key.name.clone()),
            kind if kind.bound_to_node() => object.node_name().map(str::to_owned),
            _ => None,
        };
        let fence_of = match (fenced, node) {
            (true, Some(node)) => self.fence.get().cloned().map(|f| (f, node)),
            _ => None,
        };
        Box::pin(async move {
            let (fence, _hold) = match fence_of {
                None => (None, None),
                Some((fence_of, node)) => match fence_of(node.clone()).await {
                    Some((fence, hold)) => (Some(fence), Some(hold)),
                    None => return Err(not_served(&key, &node)),
                },
            };
            let conditional = object.revision() != 0;
            for _ in 0..RETRIES {
                let Some((existing, at)) = Self::read(&etcd, &stored).await? else {
                    return Err(DesiredError::NotFound {
                        key: key.to_string(),
                    });
                };
                let written = change(existing.json(), object.json().clone(), &key)?;
                if &written == existing.json() {
                    return Ok(existing);
                }
                let outcome = match &fence {
                    Some(fence) => {
                        etcd.replace_fenced(stored.as_bytes(), encode(&written), at, fence)
                            .await
                    }
                    None => etcd.replace(stored.as_bytes(), encode(&written), at).await,
                };
                match outcome.map_err(unavailable)? {
                    Written::Done(at) => {
                        let mut written = written;
                        set_revision(&mut written, revision(at));
                        return object_of(written);
                    }
                    Written::Fenced => {
                        let node =
                            String::from_utf8_lossy(&fence.map(|f| f.key).unwrap_or_default())
                                .into_owned();
                        return Err(not_served(&key, &node));
                    }
                    Written::Conflict(_) if !conditional => continue,
                    Written::Conflict(_) => break,
                }
            }
            Err(DesiredError::Conflict {
                key: key.to_string(),
                reason: "written meanwhile by another replica".to_owned(),
            })
        })
    }
}

/// Why a status write was refused: this replica does not serve its node.
fn not_served(key: &ObjectKey, node: &str) -> DesiredError {
    DesiredError::Conflict {
        key: key.to_string(),
        reason: format!("this replica does not hold the claim on {node}"),
    }
}

/// Puts listed entries in the mirror (replacing what it held).
/// The kinds it put there.
fn fill(mirror: &Mirror, entries: &[Entry]) -> BTreeSet<Kind> {
    let mut by_kind: HashMap<Kind, BTreeMap<ObjectKey, Packed>> = HashMap::new();
    for entry in entries {
        match decode(entry).and_then(|object| Ok((Packed::pack(&object)?, object))) {
            Ok((packed, object)) => {
                let key = object.key().clone();
                by_kind.entry(key.kind).or_default().insert(key, packed);
            }
            Err(err) => warn!(error = %err, "unreadable object in etcd skipped"),
        }
    }
    let kinds = by_kind.keys().copied().collect();
    *mirror.objects_mut() = by_kind;
    kinds
}

/// Follows `prefix` from `at`: changes of the objects (under `objects`) go
/// into the mirror and out to its watchers, other keys only move the
/// mirror's revision on; a compacted history means listing again.
async fn follow(etcd: Etcd, prefix: String, objects: String, mirror: Arc<Mirror>, mut at: i64) {
    let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
    loop {
        let changes = match etcd.watch(prefix.as_bytes(), at + 1).await {
            Ok(changes) => changes,
            Err(err) => {
                debug!(error = %err, "etcd watch not started; trying again");
                backoff.pause().await;
                continue;
            }
        };
        backoff.reset();
        let mut changes = Box::pin(changes);
        while let Some(batch) = changes.next().await {
            match batch {
                Ok(batch) => {
                    if let Some(last) = apply(&mirror, batch) {
                        at = at.max(last);
                    }
                }
                Err(EtcdError::Compacted { revision: oldest }) => {
                    warn!(
                        oldest,
                        "etcd compacted the history the watch needs; listing again"
                    );
                    match etcd.list(objects.as_bytes()).await {
                        Ok((entries, listed_at)) => {
                            let kinds = fill(&mirror, &entries);
                            mirror.set_revision(revision(listed_at));
                            for kind in Kind::ALL.iter().copied().chain(kinds) {
                                mirror.feed.reset(kind, revision(listed_at));
                            }
                            at = listed_at;
                        }
                        Err(err) => debug!(error = %err, "etcd list failed; trying again"),
                    }
                    break;
                }
                Err(err) => {
                    debug!(error = %err, "etcd watch ended; watching again");
                    break;
                }
            }
        }
        // Not at full speed if it ends at once, again and again.
        backoff.pause().await;
    }
}

/// Applies one batch of etcd changes to the mirror and publishes them;
/// the revision of the last.
fn apply(mirror: &Mirror, batch: Vec<Change>) -> Option<i64> {
    let mut last = None;
    let mut events = Vec::new();
    {
        let mut objects = mirror.objects_mut();
        for change in batch {
            match change {
                Change::Put(entry) => {
                    last = Some(entry.mod_revision);
                    let Ok(object) = decode(&entry) else { continue };
                    let key = object.key().clone();
                    let Ok(packed) = Packed::pack(&object) else {
                        continue;
                    };
                    let of_kind = objects.entry(key.kind).or_default();
                    let change = match of_kind.insert(key.clone(), packed.clone()) {
                        None => ChangeKind::Added,
                        Some(_) => ChangeKind::Modified,
                    };
                    if let Ok(event) = PackedEvent::sharing(change, &object, packed) {
                        events.push((key.kind, event));
                    }
                }
                Change::Delete {
                    revision: at,
                    previous,
                    ..
                } => {
                    last = Some(at);
                    let Some(mut object) = previous.as_ref().and_then(|p| decode(p).ok()) else {
                        continue;
                    };
                    let key = object.key().clone();
                    if let Some(of_kind) = objects.get_mut(&key.kind) {
                        of_kind.remove(&key);
                    }
                    object.set_revision(revision(at));
                    if let Ok(event) = PackedEvent::new(ChangeKind::Deleted, &object) {
                        events.push((key.kind, event));
                    }
                }
            }
        }
    }
    if let Some(last) = last {
        mirror.set_revision(revision(last));
    }
    mirror.feed.publish_packed(events);
    last
}

impl DesiredState for EtcdStore {
    fn get(&self, key: &ObjectKey) -> Result<Option<Object>, DesiredError> {
        let packed = self
            .mirror
            .objects()
            .get(&key.kind)
            .and_then(|of_kind| of_kind.get(key).cloned());
        packed.map(|packed| packed.unpack()).transpose()
    }

    fn list_each(
        &self,
        kind: Kind,
        namespace: Option<&str>,
        visit: &mut dyn FnMut(Object),
    ) -> Result<u64, DesiredError> {
        let (packed, revision) = {
            let objects = self.mirror.objects();
            let packed: Vec<Packed> = objects
                .get(&kind)
                .into_iter()
                .flat_map(|of_kind| of_kind.iter())
                .filter(|(key, _)| {
                    namespace.is_none_or(|ns| !kind.namespaced() || key.namespace == ns)
                })
                .map(|(_, object)| object.clone())
                .collect();
            (packed, self.mirror.revision())
        };
        // Decoded one at a time, once the mirror is no longer locked.
        for object in packed {
            visit(object.unpack()?);
        }
        Ok(revision)
    }

    fn watch(&self, kind: Kind, since: u64) -> Result<WatchStream, DesiredError> {
        self.mirror.feed.watch(kind, since)
    }

    fn create(&self, object: Object) -> StoreFuture<Object> {
        let etcd = self.etcd.clone();
        let key = object.key().clone();
        let prepared =
            created(object.into_json(), &key).map(|object| (self.key(&key), key, object));
        Box::pin(async move {
            let (stored, key, mut object) = prepared?;
            match etcd
                .create(stored.as_bytes(), encode(&object), 0)
                .await
                .map_err(unavailable)?
            {
                Written::Done(at) => {
                    set_revision(&mut object, revision(at));
                    object_of(object)
                }
                Written::Conflict(_) | Written::Fenced => Err(DesiredError::AlreadyExists {
                    key: key.to_string(),
                }),
            }
        })
    }

    fn replace(&self, object: Object) -> StoreFuture<Object> {
        self.rewrite(object, with_spec, false)
    }

    fn replace_status(&self, object: Object) -> StoreFuture<Object> {
        self.rewrite(
            object,
            |existing, given, key| with_status(existing, &given, key),
            true,
        )
    }

    fn delete(&self, key: &ObjectKey) -> StoreFuture<Option<Object>> {
        let etcd = self.etcd.clone();
        let stored = self.key(key);
        let key = key.clone();
        Box::pin(async move {
            for _ in 0..RETRIES {
                let Some((mut existing, at)) = Self::read(&etcd, &stored).await? else {
                    return Ok(None);
                };
                match etcd
                    .delete(stored.as_bytes(), at)
                    .await
                    .map_err(unavailable)?
                {
                    Written::Done(at) => {
                        existing.set_revision(revision(at));
                        return Ok(Some(existing));
                    }
                    Written::Conflict(_) | Written::Fenced => continue,
                }
            }
            Err(DesiredError::Conflict {
                key: key.to_string(),
                reason: "written meanwhile by another replica".to_owned(),
            })
        })
    }

    fn next_revision(&self) -> StoreFuture<u64> {
        let etcd = self.etcd.clone();
        let counter = self.revision_key.clone();
        let catch_up = self.catching_up();
        Box::pin(async move {
            let at = etcd
                .put(counter.as_bytes(), Vec::new(), 0)
                .await
                .map_err(unavailable)?;
            // What is read next, to be sent at this revision, is current
            // as of it: an update committed before it (by any replica) is
            // never sent under a newer version than its own content.
            tokio::time::timeout(Duration::from_secs(10), catch_up(at))
                .await
                .map_err(|_| {
                    DesiredError::Backend(format!(
                        "this replica's mirror of etcd has not reached revision {at}"
                    ))
                })?;
            Ok(revision(at))
        })
    }
}
