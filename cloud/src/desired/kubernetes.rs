//! The Kubernetes desired-state backend: a real kube-apiserver holds the
//! desired state, as it does for KubeEdge's cloudcore.
//!
//! [`KubernetesStore`] keeps one cluster-wide watch per kind (never one per
//! node) and a cache of what it watches, filtered in cloudcore: nodes
//! labelled `node-role.kubernetes.io/edge`, and only the pods bound to
//! them. Reads are served from that cache; the watches the edgecontroller
//! takes are fed from it through the same [`Feed`] the embedded backend
//! uses. Writes go to the API server: creates and replaces with the
//! object's `resourceVersion` as precondition, status through the status
//! subresource.
//!
//! Revisions are the API server's resource versions, which edgehive (like
//! KubeEdge's edge) reads as numbers: with etcd behind the API server they
//! are etcd's global revision, so they only grow, across every kind.
//! [`DesiredState::next_revision`] takes a fresh one by renewing a Lease of
//! cloudcore's own (`edgehive-revision` in cloudcore's namespace).
//!
//! One concern: the desired state held by a kube-apiserver (its watches, the
//! cache they feed, the writes); the small Lease and error helpers at the
//! end are here because `replicas::leases` shares them.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::Duration;

use futures_util::TryStreamExt;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, PostParams, WatchParams};
use kube::core::{ApiResource, WatchEvent as KubeEvent};
use kube::{Client, Config};
use serde_json::{Value, json};
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;
use tracing::{debug, info, warn};

use apis::kinds::{Kind, ObjectKey};

use super::api_requests::ApiRequests;
use super::feed::Feed;
use super::packed::{ChangeKind, Packed, PackedEvent};
use super::{
    DesiredError, DesiredState, Object, StoreFuture, WatchStream, object_of, revision_of, stub,
};

pub use super::EDGE_NODE_LABEL;

/// The kinds the backend watches.
pub const WATCHED: [Kind; 8] = [
    Kind::Node,
    Kind::ConfigMap,
    Kind::Secret,
    Kind::Service,
    Kind::Endpoints,
    Kind::DeviceModel,
    Kind::Pod,
    Kind::Device,
];

/// Changes of each kind kept for the edgecontroller's watches.
const WINDOW: usize = 16 * 1024;

/// Where the API server is and who cloudcore is to it.
#[derive(Debug, Clone)]
pub enum KubeAccess {
    /// A kubeconfig file (its current context).
    Kubeconfig(std::path::PathBuf),
    /// The service account of the pod cloudcore runs in.
    InCluster,
}

impl KubeAccess {
    /// The API client's configuration this access gives.
    pub async fn config(&self) -> Result<Config, DesiredError> {
        match self {
            KubeAccess::Kubeconfig(path) => {
                let kubeconfig = kube::config::Kubeconfig::read_from(path).map_err(|err| {
                    DesiredError::Backend(format!("kubeconfig {}: {err}", path.display()))
                })?;
                Config::from_custom_kubeconfig(kubeconfig, &Default::default())
                    .await
                    .map_err(|err| {
                        DesiredError::Backend(format!("kubeconfig {}: {err}", path.display()))
                    })
            }
            KubeAccess::InCluster => Config::incluster()
                .map_err(|err| DesiredError::Backend(format!("in-cluster config: {err}"))),
        }
    }

    /// An API client with this access.
    pub async fn client(&self) -> Result<Client, DesiredError> {
        Client::try_from(self.config().await?).map_err(backend)
    }

    /// An API client with this access whose requests are counted in
    /// `requests`.
    pub async fn counted_client(
        &self,
        requests: &Arc<ApiRequests>,
    ) -> Result<Client, DesiredError> {
        let builder =
            kube::client::ClientBuilder::try_from(self.config().await?).map_err(backend)?;
        Ok(builder.with_layer(&requests.layer()).build())
    }

    /// Whether this process runs in a Kubernetes pod with a service
    /// account (the in-cluster configuration is available).
    pub fn in_cluster_available() -> bool {
        std::env::var_os("KUBERNETES_SERVICE_HOST").is_some()
            && Path::new("/var/run/secrets/kubernetes.io/serviceaccount/token").exists()
    }
}

/// How the backend runs.
#[derive(Debug, Clone)]
pub struct KubernetesConfig {
    /// Where the API server is.
    pub access: KubeAccess,
    /// cloudcore's own namespace (its revision Lease lives there; created
    /// if missing).
    pub namespace: String,
    /// How long the first lists may take before [`KubernetesStore::connect`]
    /// gives up.
    pub sync_timeout: Duration,
}

impl KubernetesConfig {
    /// Defaults for `access`: namespace `kubeedge`, as KubeEdge's.
    pub fn new(access: KubeAccess) -> Self {
        KubernetesConfig {
            access,
            namespace: "kubeedge".to_owned(),
            sync_timeout: Duration::from_secs(60),
        }
    }
}

/// What the backend holds of one kind.
#[derive(Default)]
struct KindCache {
    /// Packed: the feed holds the same encodings.
    objects: BTreeMap<ObjectKey, Packed>,
    /// The revision the cache is current at.
    revision: u64,
    /// Whether the first list arrived.
    synced: bool,
}

/// The watched objects, shared by the watch tasks and the readers.
struct Mirror {
    caches: RwLock<HashMap<Kind, KindCache>>,
    feed: Feed,
    /// Names of the edge nodes, which pods are filtered by.
    edge_nodes: RwLock<HashSet<String>>,
    /// Counts the times the edge nodes grew: the pod and device watches
    /// list again when it moves and a new edge node has objects bound to
    /// it already ([`Mirror::passed_over`]). A count, not a notification,
    /// so a growth while a watch is being set up is not missed.
    edge_nodes_grew: watch::Sender<u64>,
    /// Per kind bound to nodes: the nodes (not edge nodes when seen) that
    /// objects left out of the cache were bound to, since the kind's last
    /// list. Only a new edge node named here makes the kind list again: a
    /// thousand nodes joining are not a thousand lists of every pod.
    passed_over: Mutex<HashMap<Kind, HashSet<String>>>,
    synced: Notify,
}

impl Mirror {
    fn keeps(&self, kind: Kind, object: &Object) -> bool {
        if !kind.bound_to_node() {
            return true;
        }
        let Some(node) = object.node_name() else {
            return false;
        };
        self.edge_nodes
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .contains(node)
    }

    /// [`keeps`](Self::keeps), noting the node of an object left out (for
    /// [`passed_over`](Self::passed_over)).
    fn takes_in(&self, kind: Kind, object: &Object) -> bool {
        let keep = self.keeps(kind, object);
        if !keep && let Some(node) = object.node_name() {
            let mut passed_over = self
                .passed_over
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            let nodes = passed_over.entry(kind).or_default();
            if !nodes.contains(node) {
                nodes.insert(node.to_owned());
            }
        }
        keep
    }

    /// Whether an object of `kind` left out since its last list is bound
    /// to a node that is an edge node now: then the kind lists again.
    fn passed_over(&self, kind: Kind) -> bool {
        let passed_over = self
            .passed_over
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let edge_nodes = self
            .edge_nodes
            .read()
            .unwrap_or_else(PoisonError::into_inner);
        passed_over
            .get(&kind)
            .is_some_and(|nodes| nodes.iter().any(|node| edge_nodes.contains(node)))
    }

    /// A list of `kind` begins: what it leaves out is noted afresh.
    fn forget_passed_over(&self, kind: Kind) {
        self.passed_over
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&kind);
    }

    fn caches(&self) -> std::sync::RwLockReadGuard<'_, HashMap<Kind, KindCache>> {
        self.caches.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn caches_mut(&self) -> std::sync::RwLockWriteGuard<'_, HashMap<Kind, KindCache>> {
        self.caches.write().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The names of the edge nodes (labelled [`EDGE_NODE_LABEL`]) a
/// [`KubernetesStore`] watches, as its cache holds them now.
#[derive(Clone)]
pub struct EdgeNodeNames(Arc<Mirror>);

impl EdgeNodeNames {
    /// Whether `node` is an edge node.
    pub fn contains(&self, node: &str) -> bool {
        self.0
            .edge_nodes
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .contains(node)
    }
}

/// The desired state in a Kubernetes API server.
pub struct KubernetesStore {
    client: Client,
    mirror: Arc<Mirror>,
    namespace: String,
    tasks: Vec<JoinHandle<()>>,
    /// Requests the client made, by verb and resource.
    requests: Arc<ApiRequests>,
    /// Each node's Lease as last written: renewed from it with one update,
    /// as a kubelet renews its own (read again only when that fails).
    node_leases: Arc<std::sync::Mutex<HashMap<String, Value>>>,
}

impl Drop for KubernetesStore {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

pub(crate) fn backend(err: impl std::fmt::Display) -> DesiredError {
    DesiredError::Backend(err.to_string())
}

/// The API resource of `kind`.
pub fn api_resource(kind: Kind) -> ApiResource {
    let api_version = kind.api_version();
    let (group, version) = match api_version.split_once('/') {
        Some((group, version)) => (group, version),
        None => ("", api_version),
    };
    ApiResource {
        group: group.to_owned(),
        version: version.to_owned(),
        api_version: api_version.to_owned(),
        kind: kind.name().to_owned(),
        plural: kind.plural().to_owned(),
    }
}

/// An API failure in the desired state's terms.
pub(crate) fn refused(err: kube::Error, key: &str) -> DesiredError {
    match err {
        kube::Error::Api(status) => match (status.code, status.reason.as_str()) {
            (404, _) => DesiredError::NotFound {
                key: key.to_owned(),
            },
            (409, "AlreadyExists") => DesiredError::AlreadyExists {
                key: key.to_owned(),
            },
            (409, _) => DesiredError::Conflict {
                key: key.to_owned(),
                reason: status.message,
            },
            (410, _) => DesiredError::Gone { since: 0 },
            // A Status from the API server names the pause in its details
            // (`retryAfterSeconds`); APF's plain-text 429 has only the
            // header, which [`ApiRequests`] reads (see `replace_status`).
            (429, _) => DesiredError::TooManyRequests {
                retry_after: status
                    .details
                    .as_ref()
                    .map(|details| details.retry_after_seconds)
                    .filter(|seconds| *seconds > 0)
                    .map(|seconds| Duration::from_secs(u64::from(seconds))),
            },
            (400 | 422, _) => DesiredError::Invalid {
                key: key.to_owned(),
                reason: status.message,
            },
            (code, reason) => DesiredError::Backend(format!(
                "the API server answered {code} {reason}: {}",
                status.message
            )),
        },
        other => backend(other),
    }
}

/// `object` as the API returns it, with its type filled in (list items
/// come without).
fn typed(kind: Kind, object: DynamicObject) -> Result<Object, DesiredError> {
    let mut value = serde_json::to_value(object).map_err(backend)?;
    value["apiVersion"] = json!(kind.api_version());
    value["kind"] = json!(kind.name());
    // Bookkeeping no edge needs, and the largest part of many objects.
    if let Some(metadata) = value["metadata"].as_object_mut() {
        metadata.remove("managedFields");
    }
    object_of(value)
}

/// `object` as kube-rs takes it (a Lease, which is no [`Kind`], as well as
/// an [`Object`]'s body).
pub(crate) fn dynamic(object: &Value) -> Result<DynamicObject, DesiredError> {
    serde_json::from_value(object.clone()).map_err(|err| DesiredError::Invalid {
        key: object
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or("(unnamed)")
            .to_owned(),
        reason: err.to_string(),
    })
}

impl KubernetesStore {
    /// Connects to the API server, starts the watches and waits for their
    /// first lists.
    /// Every request to the API server is counted (see
    /// [`KubernetesStore::api_requests`]).
    pub async fn connect(config: KubernetesConfig) -> Result<Self, DesiredError> {
        let requests = Arc::new(ApiRequests::default());
        let client = config.access.counted_client(&requests).await?;
        Self::start(client, config, requests).await
    }

    /// Starts the backend on `client`, whose requests are counted in
    /// `requests` (a client made by [`KubeAccess::counted_client`]; any
    /// other leaves them at zero).
    pub async fn start(
        client: Client,
        config: KubernetesConfig,
        requests: Arc<ApiRequests>,
    ) -> Result<Self, DesiredError> {
        ensure_namespace(&client, &config.namespace).await?;
        let mirror = Arc::new(Mirror {
            caches: RwLock::new(HashMap::new()),
            feed: Feed::new(WINDOW, 0),
            edge_nodes: RwLock::new(HashSet::new()),
            edge_nodes_grew: watch::channel(0).0,
            passed_over: Mutex::new(HashMap::new()),
            synced: Notify::new(),
        });
        let tasks = WATCHED
            .iter()
            .map(|kind| tokio::spawn(follow(client.clone(), mirror.clone(), *kind)))
            .collect();
        let store = KubernetesStore {
            client,
            mirror,
            namespace: config.namespace,
            tasks,
            requests,
            node_leases: Arc::default(),
        };
        let synced = async {
            loop {
                let waiting = store.mirror.synced.notified();
                let missing: Vec<&str> = WATCHED
                    .iter()
                    .filter(|kind| !store.mirror.caches().get(kind).is_some_and(|c| c.synced))
                    .map(|kind| kind.name())
                    .collect();
                if missing.is_empty() {
                    return;
                }
                debug!(?missing, "waiting for the first lists");
                waiting.await;
            }
        };
        tokio::time::timeout(config.sync_timeout, synced)
            .await
            .map_err(|_| {
                DesiredError::Backend(format!(
                    "the API server's objects were not listed within {:?}",
                    config.sync_timeout
                ))
            })?;
        info!("Kubernetes desired state synced");
        Ok(store)
    }

    /// The store behind the trait, ready to share.
    pub fn shared(self) -> Arc<dyn DesiredState> {
        Arc::new(self)
    }

    /// The API client.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// What this store's client asked of the API server, by verb and
    /// resource (every module that uses [`KubernetesStore::client`]).
    pub fn api_requests(&self) -> &Arc<ApiRequests> {
        &self.requests
    }

    /// The edge nodes' names as this backend's Node watch sees them, kept
    /// current (the admission webhook asks it for each pod it reviews).
    pub fn edge_node_names(&self) -> EdgeNodeNames {
        EdgeNodeNames(self.mirror.clone())
    }

    fn api(&self, kind: Kind, namespace: &str) -> Api<DynamicObject> {
        let resource = api_resource(kind);
        match kind.namespaced() {
            true => Api::namespaced_with(self.client.clone(), namespace, &resource),
            false => Api::all_with(self.client.clone(), &resource),
        }
    }

    fn api_for(&self, object: &Object) -> (Api<DynamicObject>, ObjectKey) {
        let key = object.key().clone();
        (self.api(key.kind, &key.namespace), key)
    }
}

/// Creates `namespace` if it is missing.
pub(crate) async fn ensure_namespace(client: &Client, namespace: &str) -> Result<(), DesiredError> {
    let namespaces: Api<DynamicObject> = Api::all_with(
        client.clone(),
        &ApiResource {
            group: String::new(),
            version: "v1".to_owned(),
            api_version: "v1".to_owned(),
            kind: "Namespace".to_owned(),
            plural: "namespaces".to_owned(),
        },
    );
    let found = namespaces
        .get_opt(namespace)
        .await
        .map_err(|err| refused(err, namespace))?;
    if found.is_some() {
        return Ok(());
    }
    let object: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": namespace},
    }))
    .map_err(backend)?;
    match namespaces.create(&PostParams::default(), &object).await {
        Ok(_) => Ok(()),
        Err(err) => match refused(err, namespace) {
            DesiredError::AlreadyExists { .. } => Ok(()),
            other => Err(other),
        },
    }
}

/// Lists `kind` in pages; the objects kept and the list's revision.
async fn list_all(
    api: &Api<DynamicObject>,
    kind: Kind,
    params: &ListParams,
    mirror: &Mirror,
) -> Result<(BTreeMap<ObjectKey, Packed>, u64), DesiredError> {
    let mut objects = BTreeMap::new();
    let mut params = params.clone().limit(500);
    mirror.forget_passed_over(kind);
    loop {
        let page = api
            .list(&params)
            .await
            .map_err(|err| refused(err, kind.plural()))?;
        let revision = page
            .metadata
            .resource_version
            .as_deref()
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0);
        for item in page.items {
            let object = typed(kind, item)?;
            if mirror.takes_in(kind, &object) {
                objects.insert(object.key().clone(), Packed::pack(&object)?);
            }
        }
        match page.metadata.continue_.filter(|token| !token.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => return Ok((objects, revision)),
        }
    }
}

/// One kind's list and watch, for as long as the store lives: each list
/// replaces the kind's cache and starts its history anew; each watch event
/// updates the cache and is published.
async fn follow(client: Client, mirror: Arc<Mirror>, kind: Kind) {
    let api: Api<DynamicObject> = Api::all_with(client, &api_resource(kind));
    let (list_params, watch_params) = match kind {
        Kind::Node => (
            ListParams::default().labels(EDGE_NODE_LABEL),
            WatchParams::default().labels(EDGE_NODE_LABEL),
        ),
        _ => (ListParams::default(), WatchParams::default()),
    };
    let mut backoff = Duration::from_millis(200);
    let mut grew = mirror.edge_nodes_grew.subscribe();
    loop {
        // What the edge nodes are now is what this list filters by.
        grew.borrow_and_update();
        let (objects, revision) = match list_all(&api, kind, &list_params, &mirror).await {
            Ok(listed) => listed,
            Err(DesiredError::NotFound { .. }) => {
                // The kind is not served (KubeEdge's device CRDs not
                // installed): nothing of it, and a look again later.
                warn!(
                    kind = kind.name(),
                    "not served by the API server; looking again in 30 s"
                );
                relisted(&mirror, kind, BTreeMap::new(), 0);
                tokio::time::sleep(Duration::from_secs(30)).await;
                continue;
            }
            Err(err) => {
                warn!(kind = kind.name(), error = %err, "list failed; trying again");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(10));
                continue;
            }
        };
        backoff = Duration::from_millis(200);
        relisted(&mirror, kind, objects, revision);
        let mut at = revision;
        // Watch from the list's revision until the history is gone.
        'watching: loop {
            let params = watch_params.clone().timeout(290);
            let started = tokio::time::Instant::now();
            let stream = match api.watch(&params, &at.to_string()).await {
                Ok(stream) => stream,
                Err(err) => {
                    warn!(kind = kind.name(), error = %err, "watch failed; listing again");
                    tokio::time::sleep(backoff).await;
                    break 'watching;
                }
            };
            let mut stream = std::pin::pin!(stream.into_stream());
            loop {
                let next = match kind.bound_to_node() {
                    true => tokio::select! {
                        next = stream.try_next() => next,
                        _ = grew.changed() => {
                            if mirror.passed_over(kind) {
                                break 'watching;
                            }
                            continue;
                        }
                    },
                    false => stream.try_next().await,
                };
                match next {
                    Ok(Some(KubeEvent::Bookmark(bookmark))) => {
                        if let Ok(revision) = bookmark.metadata.resource_version.parse() {
                            at = revision;
                            if let Some(cache) = mirror.caches_mut().get_mut(&kind) {
                                cache.revision = cache.revision.max(revision);
                            }
                        }
                    }
                    Ok(Some(KubeEvent::Error(status))) => {
                        debug!(kind = kind.name(), code = status.code, message = %status.message, "watch ended");
                        if status.code == 410 {
                            break 'watching;
                        }
                        tokio::time::sleep(backoff).await;
                        break;
                    }
                    Ok(Some(event)) => {
                        let Some(revision) = changed(&mirror, kind, event) else {
                            continue;
                        };
                        at = at.max(revision);
                    }
                    // The watch timed out: watch again from where it was
                    // (after a pause if it ended at once, so a server that
                    // keeps closing watches is not asked in a loop).
                    Ok(None) => {
                        if started.elapsed() < Duration::from_secs(1) {
                            tokio::time::sleep(backoff).await;
                        }
                        break;
                    }
                    Err(err) => {
                        debug!(kind = kind.name(), error = %err, "watch broke; watching again");
                        tokio::time::sleep(backoff).await;
                        break;
                    }
                }
            }
        }
    }
}

/// Replaces `kind`'s cache with a fresh list and starts its history anew
/// (the controller's watches of it list again).
fn relisted(mirror: &Mirror, kind: Kind, objects: BTreeMap<ObjectKey, Packed>, revision: u64) {
    if kind == Kind::Node {
        let names: HashSet<String> = objects.keys().map(|key| key.name.clone()).collect();
        let grown = {
            let mut edge_nodes = mirror
                .edge_nodes
                .write()
                .unwrap_or_else(PoisonError::into_inner);
            let grown = !names.is_subset(&edge_nodes);
            *edge_nodes = names;
            grown
        };
        if grown {
            mirror.edge_nodes_grew.send_modify(|grown| *grown += 1);
        }
    }
    let first = {
        let mut caches = mirror.caches_mut();
        let cache = caches.entry(kind).or_default();
        let first = !cache.synced;
        cache.objects = objects;
        cache.revision = revision;
        cache.synced = true;
        first
    };
    mirror.feed.reset(kind, revision);
    debug!(kind = kind.name(), revision, "listed");
    if first {
        mirror.synced.notify_waiters();
    }
}

/// Takes one watch event into the cache and publishes it; its revision.
fn changed(mirror: &Mirror, kind: Kind, event: KubeEvent<DynamicObject>) -> Option<u64> {
    let (object, deleted) = match event {
        KubeEvent::Added(object) | KubeEvent::Modified(object) => (object, false),
        KubeEvent::Deleted(object) => (object, true),
        KubeEvent::Bookmark(_) | KubeEvent::Error(_) => return None,
    };
    let object = match typed(kind, object) {
        Ok(object) => object,
        Err(err) => {
            warn!(kind = kind.name(), error = %err, "unreadable watch event");
            return None;
        }
    };
    let key = object.key().clone();
    let revision = object.revision();
    if kind == Kind::Node {
        let mut edge_nodes = mirror
            .edge_nodes
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        let new = match deleted {
            true => {
                edge_nodes.remove(&key.name);
                false
            }
            false => edge_nodes.insert(key.name.clone()),
        };
        drop(edge_nodes);
        if new {
            mirror.edge_nodes_grew.send_modify(|grown| *grown += 1);
        }
    }
    let keep = !deleted && mirror.takes_in(kind, &object);
    let packed = match Packed::pack(&object) {
        Ok(packed) => packed,
        Err(err) => {
            warn!(kind = kind.name(), error = %err, "watch event not kept");
            return None;
        }
    };
    let change = {
        let mut caches = mirror.caches_mut();
        let cache = caches.entry(kind).or_default();
        cache.revision = cache.revision.max(revision);
        let held = cache.objects.contains_key(&key);
        match (keep, held) {
            (true, true) => {
                cache.objects.insert(key, packed.clone());
                ChangeKind::Modified
            }
            (true, false) => {
                cache.objects.insert(key, packed.clone());
                ChangeKind::Added
            }
            // No longer kept (deleted, or a pod no longer on an edge node).
            (false, true) => {
                cache.objects.remove(&key);
                ChangeKind::Deleted
            }
            (false, false) => return Some(revision),
        }
    };
    match PackedEvent::sharing(change, &object, packed) {
        Ok(event) => mirror.feed.publish_packed([(kind, event)]),
        Err(err) => warn!(kind = kind.name(), error = %err, "watch event not published"),
    }
    Some(revision)
}

impl DesiredState for KubernetesStore {
    fn get(&self, key: &ObjectKey) -> Result<Option<Object>, DesiredError> {
        let packed = self
            .mirror
            .caches()
            .get(&key.kind)
            .and_then(|cache| cache.objects.get(key).cloned());
        packed.map(|packed| packed.unpack()).transpose()
    }

    fn list_each(
        &self,
        kind: Kind,
        namespace: Option<&str>,
        visit: &mut dyn FnMut(Object),
    ) -> Result<u64, DesiredError> {
        let caches = self.mirror.caches();
        let Some(cache) = caches.get(&kind).filter(|cache| cache.synced) else {
            return Err(DesiredError::Backend(format!(
                "{} not listed from the API server yet",
                kind.plural()
            )));
        };
        let revision = cache.revision;
        let packed: Vec<Packed> = cache
            .objects
            .iter()
            .filter(|(key, _)| namespace.is_none_or(|ns| !kind.namespaced() || key.namespace == ns))
            .map(|(_, object)| object.clone())
            .collect();
        // Decoded one at a time, once the cache is no longer locked.
        drop(caches);
        for object in packed {
            visit(object.unpack()?);
        }
        Ok(revision)
    }

    fn watch(&self, kind: Kind, since: u64) -> Result<WatchStream, DesiredError> {
        self.mirror.feed.watch(kind, since)
    }

    fn create(&self, mut object: Object) -> StoreFuture<Object> {
        let (api, key) = self.api_for(&object);
        object.set_revision(0);
        let prepared = dynamic(object.json()).map(|object| (api, key, object));
        Box::pin(async move {
            let (api, key, object) = prepared?;
            let created = api
                .create(&PostParams::default(), &object)
                .await
                .map_err(|err| refused(err, &key.to_string()))?;
            typed(key.kind, created)
        })
    }

    fn replace(&self, object: Object) -> StoreFuture<Object> {
        let (api, key) = self.api_for(&object);
        let prepared = dynamic(object.json()).map(|object| (api, key, object));
        Box::pin(async move {
            let (api, key, object) = prepared?;
            let replaced = api
                .replace(&key.name, &PostParams::default(), &object)
                .await
                .map_err(|err| refused(err, &key.to_string()))?;
            typed(key.kind, replaced)
        })
    }

    fn replace_status(&self, object: Object) -> StoreFuture<Object> {
        let unconditional = object.revision() == 0;
        let status = object.json().get("status").cloned().unwrap_or(Value::Null);
        let (api, key) = self.api_for(&object);
        let prepared = dynamic(object.json()).map(|object| (api, key, object));
        let requests = self.requests.clone();
        Box::pin(async move {
            let (api, key, object) = prepared?;
            let written = match unconditional {
                // An update with no resourceVersion is refused for custom
                // resources (a Device's status): a merge patch of the
                // status is taken for every kind.
                true => {
                    let patch = kube::api::Patch::Merge(json!({ "status": status }));
                    api.patch_status(&key.name, &kube::api::PatchParams::default(), &patch)
                        .await
                }
                false => {
                    api.replace_status(&key.name, &PostParams::default(), &object)
                        .await
                }
            };
            let written = written.map_err(|err| match refused(err, &key.to_string()) {
                // kube's error carries no headers: the pause is the
                // Retry-After of the last 429 the client's layer saw (the
                // client retries a 429 itself first, so this one is the
                // answer it gave up on).
                DesiredError::TooManyRequests { retry_after: None } => {
                    DesiredError::TooManyRequests {
                        retry_after: requests.last_retry_after(),
                    }
                }
                other => other,
            })?;
            typed(key.kind, written)
        })
    }

    fn delete(&self, key: &ObjectKey) -> StoreFuture<Option<Object>> {
        let api = self.api(key.kind, &key.namespace);
        let key = key.clone();
        Box::pin(async move {
            match api.delete(&key.name, &DeleteParams::default()).await {
                Ok(deleted) => match deleted.left() {
                    // Still there, being deleted gracefully.
                    Some(object) => typed(key.kind, object).map(Some),
                    None => Ok(Some(stub(&key))),
                },
                Err(err) => match refused(err, &key.to_string()) {
                    DesiredError::NotFound { .. } => Ok(None),
                    other => Err(other),
                },
            }
        })
    }

    fn shares_request_budget(&self) -> bool {
        true
    }

    fn evicts(&self) -> bool {
        true
    }

    fn passes_on(&self, object: &Object) -> bool {
        self.mirror.keeps(object.kind(), object)
    }

    fn finish_deletion(&self, key: &ObjectKey, uid: Option<&str>) -> StoreFuture<()> {
        let api = self.api(key.kind, &key.namespace);
        let key = key.clone();
        let params = DeleteParams {
            grace_period_seconds: Some(0),
            preconditions: uid.map(|uid| kube::api::Preconditions {
                uid: Some(uid.to_owned()),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        Box::pin(async move {
            match api.delete(&key.name, &params).await {
                Ok(_) => Ok(()),
                Err(err) => match refused(err, &key.to_string()) {
                    // Gone already, or a new object of that name.
                    DesiredError::NotFound { .. } | DesiredError::Conflict { .. } => Ok(()),
                    other => Err(other),
                },
            }
        })
    }

    fn next_revision(&self) -> StoreFuture<u64> {
        let leases = Api::<DynamicObject>::namespaced_with(
            self.client.clone(),
            &self.namespace,
            &lease_resource(),
        );
        Box::pin(async move {
            let renewed = renew(&leases, REVISION_LEASE, "edgehive-cloudcore", None).await?;
            Ok(revision_of(&renewed))
        })
    }

    fn request_token(
        &self,
        request: super::TokenRequest,
    ) -> StoreFuture<apis::tokens::TokenRequestStatus> {
        let accounts = Api::<DynamicObject>::namespaced_with(
            self.client.clone(),
            &request.namespace,
            &ApiResource {
                group: String::new(),
                version: "v1".to_owned(),
                api_version: "v1".to_owned(),
                kind: "ServiceAccount".to_owned(),
                plural: "serviceaccounts".to_owned(),
            },
        );
        let mut body = request.body();
        body.metadata = Default::default();
        Box::pin(async move {
            let key = format!(
                "serviceaccounts/{}/{}/token",
                request.namespace, request.service_account
            );
            let issued: apis::tokens::TokenRequestObject = accounts
                .create_subresource(
                    "token",
                    &request.service_account,
                    &PostParams::default(),
                    &body,
                )
                .await
                .map_err(|err| refused(err, &key))?;
            Ok(issued.status.unwrap_or_default())
        })
    }

    fn renew_lease(&self, node: &str, duration: Duration) -> StoreFuture<()> {
        let leases = Api::<DynamicObject>::namespaced_with(
            self.client.clone(),
            NODE_LEASES,
            &lease_resource(),
        );
        let node = node.to_owned();
        let owner = self
            .get(&ObjectKey::new(Kind::Node, "", node.as_str()))
            .ok()
            .flatten()
            .and_then(|object| object.uid().map(str::to_owned));
        let cache = self.node_leases.clone();
        let held = cache
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&node);
        Box::pin(async move {
            let renewed = match held {
                Some(mut lease) => {
                    lease["spec"]["renewTime"] = json!(micro_time());
                    lease["spec"]["leaseDurationSeconds"] = json!(duration.as_secs());
                    match leases
                        .replace(&node, &PostParams::default(), &dynamic(&lease)?)
                        .await
                    {
                        Ok(written) => Some(serde_json::to_value(written).map_err(backend)?),
                        // Changed or gone meanwhile: read and written anew.
                        Err(err) => {
                            debug!(%node, error = %err, "node lease not renewed from the last write; read again");
                            None
                        }
                    }
                }
                None => None,
            };
            let renewed = match renewed {
                Some(renewed) => renewed,
                None => renew(&leases, &node, &node, Some((duration, owner))).await?,
            };
            cache
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .insert(node, renewed);
            Ok(())
        })
    }
}

/// The Lease whose renewals give fresh revisions.
const REVISION_LEASE: &str = "edgehive-revision";

/// Where nodes' heartbeat Leases live.
pub const NODE_LEASES: &str = "kube-node-lease";

/// `coordination.k8s.io/v1` Leases.
pub(crate) fn lease_resource() -> ApiResource {
    ApiResource {
        group: "coordination.k8s.io".to_owned(),
        version: "v1".to_owned(),
        api_version: "coordination.k8s.io/v1".to_owned(),
        kind: "Lease".to_owned(),
        plural: "leases".to_owned(),
    }
}

/// Now, as a Lease's `MicroTime`.
pub(crate) fn micro_time() -> String {
    jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%S%.6fZ")
        .to_string()
}

/// Renews (creating if missing) the Lease `name` held by `holder`; for a
/// node's Lease, with its duration and owned by the Node (as a kubelet's).
async fn renew(
    leases: &Api<DynamicObject>,
    name: &str,
    holder: &str,
    node: Option<(Duration, Option<String>)>,
) -> Result<Value, DesiredError> {
    let now = micro_time();
    let existing = leases
        .get_opt(name)
        .await
        .map_err(|err| refused(err, name))?;
    let mut lease = match existing {
        Some(existing) => serde_json::to_value(existing).map_err(backend)?,
        None => {
            let mut lease = json!({
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": name},
                "spec": {"holderIdentity": holder, "acquireTime": now},
            });
            if let Some((_, Some(uid))) = &node {
                lease["metadata"]["ownerReferences"] = json!([{
                    "apiVersion": "v1",
                    "kind": "Node",
                    "name": name,
                    "uid": uid,
                }]);
            }
            lease
        }
    };
    lease["spec"]["holderIdentity"] = json!(holder);
    lease["spec"]["renewTime"] = json!(now);
    if let Some((duration, _)) = node {
        lease["spec"]["leaseDurationSeconds"] = json!(duration.as_secs());
    }
    let object = dynamic(&lease)?;
    let written = match lease.pointer("/metadata/resourceVersion").is_some() {
        true => leases.replace(name, &PostParams::default(), &object).await,
        false => leases.create(&PostParams::default(), &object).await,
    };
    let written = written.map_err(|err| refused(err, name))?;
    serde_json::to_value(written).map_err(backend)
}
