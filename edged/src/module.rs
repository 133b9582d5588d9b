//! The `edged` module and the task behind it: it keeps a [`PodWorker`] per
//! pod, the configmaps and secrets pods read, the PLEG (a relist of the
//! runtime on a period, turned into events for the pods whose containers
//! changed) and the node's status.
//!
//! On start it loads its pods from metamanager (so it needs no cloud) and
//! reconciles with what containerd already runs: containers of known pods
//! are adopted by their workers, pods the store no longer has are removed.
//!
//! Pods' service account tokens are asked of the cloud here, as a kubelet
//! asks for them: the decisions are [`crate::tokens::TokenBook`]'s; the
//! core asks through edgehub, writes each token through metamanager (from
//! where it comes back to the pod's volume), and deletes it with its pod.
//!
//! One concern: the core task's I/O around decisions made elsewhere
//! (`PodWorker`, `TokenBook`, the PLEG's relist); long because edged has
//! many inputs, not several jobs.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use apis::k8s::Pod;
use apis::tokens::{TokenRequestObject, TokenRequestStatus};
use beehive::constants::{group, module, operation, resource_type};
use beehive::resource::EdgeResource;
use beehive::{Hive, Message as HiveMessage, TaskDoor};
use serde::Deserialize;
use serde_json::Value;
use tokio::sync::{mpsc, oneshot};
use tracing::{Instrument, debug, info, warn};

use crate::config::EdgedConfig;
use crate::cri::{Cri, CriError};
use crate::gc::{ImageCollector, ImageGcPolicy};
use crate::node::NodeReporter;
use crate::server::{self, EdgedServerHandle, PodsView};
use crate::spec::{self, NODE, Objects, POD_UID};
use crate::teardown::{Terminating, say_terminated, teardown};
use crate::tokens::{AskId, Outcome, TokenBook, Verdict};
use crate::worker::{PodWorker, Signal};

/// A failure to start edged.
#[derive(Debug, thiserror::Error)]
pub enum EdgedError {
    /// The runtime cannot be reached.
    #[error(transparent)]
    Cri(#[from] CriError),
    /// The module could not start.
    #[error(transparent)]
    Hive(#[from] beehive::Error),
    /// The HTTP server could not listen.
    #[error("edged server: {0}")]
    Server(std::io::Error),
}

/// The edged module.
pub struct Edged;

/// What a running edged tells its owner.
pub struct EdgedHandle {
    /// Where its HTTP server listens, if it runs one.
    pub server_address: Option<std::net::SocketAddr>,
    /// The pods it runs, with their latest status.
    pub pods: PodsView,
    /// Serves the cloud's streams to those pods (logs, exec, attach): for
    /// edgehub's `streams`.
    pub streams: std::sync::Arc<crate::streams::PodStreamServer>,
}

impl Edged {
    /// Connects to the runtime and starts edged in `hive` (inside an actix
    /// System, after metamanager).
    pub async fn start(hive: &Hive, config: EdgedConfig) -> Result<EdgedHandle, EdgedError> {
        let cri = Cri::connect(&config.cri_socket).await?;
        let pods = PodsView::default();
        let stats = crate::stats::StatsCollector::new(cri.clone(), config.node.clone());
        // Sampled every 10 s, as the kubelet's stats are, so a Summary
        // asked at any time has CPU rates over the last window.
        let sampled = stats.clone();
        actix::spawn(async move {
            let mut every = tokio::time::interval(crate::stats::SAMPLE_EVERY);
            loop {
                every.tick().await;
                if let Err(err) = sampled.summary().await {
                    tracing::debug!(error = %err, "stats not sampled");
                }
            }
        });
        let server = match &config.server_address {
            Some(address) => Some(
                server::start(
                    address,
                    pods.clone(),
                    cri.clone(),
                    config.root_dir.clone(),
                    stats.clone(),
                )
                .map_err(EdgedError::Server)?,
            ),
            None => None,
        };
        let server_address = server.as_ref().map(|s| s.address);
        let streams = crate::streams::PodStreamServer::new(
            pods.clone(),
            cri.clone(),
            config.root_dir.clone(),
            stats,
        );
        // Container logs rotate by size and count.
        let (rotating, view, root, limits) = (
            cri.clone(),
            pods.clone(),
            config.root_dir.clone(),
            config.log_rotation,
        );
        actix::spawn(async move {
            let mut every = tokio::time::interval(limits.every);
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                every.tick().await;
                let (rotated, deleted) =
                    crate::logs::rotate(&rotating, &view, &root, &limits).await;
                if rotated + deleted > 0 {
                    tracing::debug!(rotated, deleted, "container logs rotated");
                }
            }
        });
        let mut image_gc = config.image_gc.clone();
        image_gc.pinned.push(config.pause_image.clone());
        let (inbox, messages) = mpsc::channel(1024);
        let core = Core {
            hive: hive.clone(),
            inbox: inbox.clone(),
            tokens: TokenBook::new(config.tokens),
            token_version: 0,
            cri,
            config: Arc::new(config),
            objects: Arc::new(RwLock::new(Objects::new())),
            workers: HashMap::new(),
            snapshot: HashMap::new(),
            view: pods.clone(),
            terminating: Terminating::default(),
            server,
            images: ImageCollector::default(),
            image_gc,
        };
        actix::spawn(core.run(messages));
        // The module hands what metamanager passes on to the core, in order;
        // stopping it stops the workers (pods keep running in the runtime,
        // to be adopted by the next edged).
        let door = TaskDoor::new(module::EDGED, group::EDGED, inbox, Input::Message)
            .stopping_with(Input::Stop);
        hive.start_module(move |_| door.clone())?;
        Ok(EdgedHandle {
            server_address,
            pods,
            streams,
        })
    }
}

/// What the core task gets.
#[allow(clippy::large_enum_variant)] // Messages are the common case; boxing them costs every one.
enum Input {
    Message(HiveMessage),
    /// Stop the workers (containers keep running) and end; then answer.
    Stop(oneshot::Sender<()>),
    /// The cloud's answer to token question `id` for `key`: the token's
    /// status, or why there is none.
    Token {
        key: String,
        id: AskId,
        answer: Result<TokenRequestStatus, String>,
    },
    /// The token question `id` brought for `key` could not be written.
    TokenNotKept {
        key: String,
        id: AskId,
        reason: String,
    },
}

/// How long a write of a token to metamanager may take.
const STORE_TIMEOUT: Duration = Duration::from_secs(30);

/// What a pod's delete names: the pod's uid, if it carries the pod.
#[derive(Deserialize)]
struct Named {
    #[serde(default)]
    metadata: NamedMeta,
}

#[derive(Default, Deserialize)]
struct NamedMeta {
    #[serde(default)]
    uid: Option<String>,
}

struct WorkerHandle {
    uid: String,
    signals: mpsc::Sender<Signal>,
}

struct Core {
    hive: Hive,
    /// The core's own inbox, for what its tasks bring back.
    inbox: mpsc::Sender<Input>,
    /// Pods' service account tokens: needed, held, asked for, due.
    tokens: TokenBook,
    /// The last version a token was written or deleted at.
    token_version: u64,
    cri: Cri,
    config: Arc<EdgedConfig>,
    objects: Arc<RwLock<Objects>>,
    /// By `<ns>/<name>`.
    workers: HashMap<String, WorkerHandle>,
    /// The PLEG's last view: per pod uid, its containers and their states.
    snapshot: HashMap<String, Vec<(String, i32)>>,
    view: PodsView,
    terminating: Terminating,
    server: Option<EdgedServerHandle>,
    images: ImageCollector,
    image_gc: ImageGcPolicy,
}

impl Core {
    async fn run(mut self, mut messages: mpsc::Receiver<Input>) {
        self.start_up().await;
        let mut relist = tokio::time::interval(self.config.relist_period);
        relist.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut node = NodeReporter::new(self.hive.clone(), self.cri.clone(), self.config.clone());
        let mut node_tick = tokio::time::interval(self.config.node_status_period);
        let mut change_tick = tokio::time::interval(Duration::from_secs(1));
        change_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut gc_tick = tokio::time::interval(self.config.gc_period);
        gc_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let token_wake = self.tokens.next_wake();
            tokio::select! {
                input = messages.recv() => match input {
                    Some(Input::Message(msg)) => self.on_message(msg),
                    Some(Input::Token { key, id, answer }) => self.token_answered(key, id, answer),
                    Some(Input::TokenNotKept { key, id, reason }) => {
                        if let Some(at) = self.tokens.not_kept(&key, id, Instant::now()) {
                            warn!(token = %key, %reason, retry_in = ?at.saturating_duration_since(Instant::now()), "service account token not stored; asking again");
                        }
                        self.ask_tokens();
                    }
                    Some(Input::Stop(done)) => {
                        // Dropping the handles ends the workers.
                        self.workers.clear();
                        if let Some(server) = self.server.take() {
                            server.stop().await;
                        }
                        let _ = done.send(());
                        break;
                    }
                    None => break,
                },
                _ = relist.tick() => self.relist().await,
                _ = node_tick.tick() => node.report().await,
                _ = change_tick.tick() => node.report_if_changed().await,
                _ = gc_tick.tick() => self.collect_garbage().await,
                () = wake_at(token_wake) => self.ask_tokens(),
            }
        }
        debug!("edged stopped");
    }

    /// Loads the pods and their objects from metamanager, removes what the
    /// runtime runs for pods it does not know, and starts a worker per pod.
    async fn start_up(&mut self) {
        let mut pods = Vec::new();
        // Every stored pod's uid, read from the JSON (also of pods that do
        // not parse), and whether the store answered at all: without a
        // complete answer nothing is removed.
        let mut known: Vec<String> = Vec::new();
        let mut complete = true;
        for kind in [
            resource_type::CONFIGMAP,
            resource_type::SECRET,
            resource_type::SERVICE_ACCOUNT_TOKEN,
            resource_type::POD,
        ] {
            let query = HiveMessage::new().build_router(
                module::EDGED,
                group::META,
                format!("*/{kind}"),
                operation::QUERY,
            );
            let listed = match self
                .hive
                .send_sync(module::METAMANAGER, query, Duration::from_secs(30))
                .await
            {
                Ok(answer) => match answer.body::<Vec<Value>>() {
                    Ok(listed) if !answer.is_failure() => listed,
                    _ => {
                        warn!(kind, answer = %answer.content(), "metamanager did not list");
                        complete = false;
                        Vec::new()
                    }
                },
                Err(err) => {
                    warn!(kind, error = %err, "could not load from metamanager");
                    complete = false;
                    Vec::new()
                }
            };
            for object in listed {
                if kind == resource_type::POD {
                    let metadata = &object["metadata"];
                    known.push(match metadata["uid"].as_str() {
                        Some(uid) => uid.to_owned(),
                        None => format!(
                            "{}.{}",
                            metadata["namespace"].as_str().unwrap_or("default"),
                            metadata["name"].as_str().unwrap_or_default()
                        ),
                    });
                    match Pod::deserialize(&object) {
                        Ok(pod) => pods.push(pod),
                        Err(err) => warn!(error = %err, "stored pod unreadable"),
                    }
                } else {
                    let namespace = object["metadata"]["namespace"]
                        .as_str()
                        .unwrap_or("default");
                    let name = object["metadata"]["name"].as_str().unwrap_or_default();
                    let key = format!("{namespace}/{kind}/{name}");
                    if let Ok(mut objects) = self.objects.write() {
                        objects.insert(key, object);
                    }
                }
            }
        }
        if complete {
            self.delete_orphan_tokens(&known);
        }
        match self.managed_sandbox_uids().await {
            Ok(_) if !complete => warn!("the store did not answer in full; no pod is removed"),
            Ok(running) => {
                for uid in running.into_iter().filter(|uid| !known.contains(uid)) {
                    info!(%uid, "removing a pod the store no longer has");
                    if let Err(err) = teardown(&self.cri, &self.config, &uid, 0).await {
                        warn!(%uid, error = %err, "stale pod not removed");
                    }
                }
            }
            Err(err) => warn!(error = %err, "could not list the runtime's pods"),
        }
        info!(pods = pods.len(), "edged loaded its pods");
        for pod in pods {
            self.apply(pod, true);
        }
    }

    /// Tears down this node's sandboxes that no worker owns (a teardown
    /// that failed), and collects unused images.
    async fn collect_garbage(&mut self) {
        let mut owned: Vec<String> = self.workers.values().map(|w| w.uid.clone()).collect();
        if let Ok(terminating) = self.terminating.lock() {
            owned.extend(terminating.iter().cloned());
        }
        if let Ok(running) = self.managed_sandbox_uids().await {
            for uid in running.into_iter().filter(|uid| !owned.contains(uid)) {
                info!(%uid, "collecting the sandbox of a pod edged no longer runs");
                if let Err(err) = teardown(&self.cri, &self.config, &uid, 0).await {
                    warn!(%uid, error = %err, "orphan not removed");
                }
            }
        }
        if let Err(err) = self.images.collect(&self.cri, &self.image_gc).await {
            warn!(error = %err, "image collection failed");
        }
    }

    async fn managed_sandbox_uids(&self) -> Result<Vec<String>, CriError> {
        let sandboxes = self.cri.sandboxes(NODE, &self.config.node).await?;
        let mut uids: Vec<String> = sandboxes
            .into_iter()
            .filter_map(|s| s.labels.get(POD_UID).cloned())
            .collect();
        uids.sort();
        uids.dedup();
        Ok(uids)
    }

    fn on_message(&mut self, msg: HiveMessage) {
        let Ok(resource) = msg.resource().parse::<EdgeResource>() else {
            return;
        };
        let deleted = msg.operation() == operation::DELETE;
        match resource.resource_type.as_str() {
            resource_type::POD => {
                let key = format!("{}/{}", resource.namespace, resource.name);
                if deleted {
                    let uid = msg
                        .body::<Named>()
                        .ok()
                        .and_then(|named| named.metadata.uid);
                    self.terminate(&resource.namespace, &resource.name, uid, 0);
                    for token in self.tokens.gone(&key) {
                        self.delete_token(token);
                    }
                    return;
                }
                match msg.body::<Pod>() {
                    Ok(pod) => self.apply(pod, false),
                    Err(err) => warn!(pod = %key, error = %err, "pod unreadable"),
                }
            }
            kind @ (resource_type::CONFIGMAP
            | resource_type::SECRET
            | resource_type::SERVICE_ACCOUNT_TOKEN) => {
                let key = format!("{}/{kind}/{}", resource.namespace, resource.name);
                let object = match deleted {
                    true => None,
                    false => match msg.body::<Value>() {
                        Ok(object) => Some(object),
                        Err(err) => {
                            warn!(object = %key, error = %err, "object unreadable");
                            return;
                        }
                    },
                };
                let token_of = (kind == resource_type::SERVICE_ACCOUNT_TOKEN).then(|| {
                    object
                        .as_ref()
                        .and_then(|token| token.pointer("/spec/boundObjectRef/name"))
                        .and_then(Value::as_str)
                        .map(str::to_owned)
                });
                if let Ok(mut objects) = self.objects.write() {
                    match object {
                        None => objects.remove(&key),
                        Some(object) => objects.insert(key, object),
                    };
                }
                // Pods of that namespace write their volume files again
                // (only what changed is rewritten); a token concerns its
                // own pod only (the one it is bound to, or else whose name
                // starts its own).
                let prefix = format!("{}/", resource.namespace);
                for (pod, worker) in &self.workers {
                    let Some(name) = pod.strip_prefix(&prefix) else {
                        continue;
                    };
                    let concerned = match &token_of {
                        None => true,
                        Some(Some(bound)) => name == bound.as_str(),
                        Some(None) => resource
                            .name
                            .strip_prefix(name)
                            .is_some_and(|rest| rest.starts_with('.')),
                    };
                    if concerned {
                        let signals = worker.signals.clone();
                        actix::spawn(async move {
                            let _ = signals.send(Signal::Objects).await;
                        });
                    }
                }
            }
            _ => {}
        }
    }

    /// Pod `namespace/name` (of `uid`, if known) is being deleted: its
    /// worker tears it down and says so when done; with no worker of it,
    /// whatever of it the runtime still has gets `grace` seconds, then the
    /// cloud is told at once (a pod that never ran here, or whose worker
    /// went with an edged restart). A pod some worker is tearing down
    /// already is said to have stopped by that worker.
    fn terminate(&mut self, namespace: &str, name: &str, uid: Option<String>, grace: i64) {
        let key = format!("{namespace}/{name}");
        let mine = self
            .workers
            .get(&key)
            .is_some_and(|worker| uid.as_ref().is_none_or(|uid| *uid == worker.uid));
        if mine && let Some(worker) = self.workers.remove(&key) {
            self.delete(worker);
            return;
        }
        let being_torn_down = uid.as_ref().is_some_and(|uid| {
            self.terminating
                .lock()
                .is_ok_and(|terminating| terminating.contains(uid))
        });
        if being_torn_down {
            return;
        }
        let (hive, cri, config, terminating) = (
            self.hive.clone(),
            self.cri.clone(),
            self.config.clone(),
            self.terminating.clone(),
        );
        if let (Some(uid), Ok(mut marked)) = (&uid, terminating.lock()) {
            marked.insert(uid.clone());
        }
        let (namespace, name) = (namespace.to_owned(), name.to_owned());
        actix::spawn(async move {
            if let Some(uid) = &uid {
                if let Err(err) = teardown(&cri, &config, uid, grace).await {
                    // Garbage collection tries again; the cloud is told
                    // when it tells of the deletion again.
                    warn!(pod = %format!("{namespace}/{name}"), error = %err, "pod not torn down");
                    if let Ok(mut marked) = terminating.lock() {
                        marked.remove(uid);
                    }
                    return;
                }
                if let Ok(mut marked) = terminating.lock() {
                    marked.remove(uid);
                }
            }
            say_terminated(&hive, &namespace, &name, uid).await;
        });
    }

    /// Has a worker tear its pod down: marked terminating (so garbage
    /// collection leaves it to the worker's grace period), and told
    /// without fail, even when its signal queue is full.
    fn delete(&mut self, worker: WorkerHandle) {
        if let Ok(mut terminating) = self.terminating.lock() {
            terminating.insert(worker.uid.clone());
        }
        actix::spawn(async move {
            let _ = worker.signals.send(Signal::Delete).await;
        });
    }

    /// Hands `pod` to its worker, starting one if needed (`from_store`: a
    /// pod loaded at start-up, which may have finished before).
    fn apply(&mut self, pod: Pod, from_store: bool) {
        let key = spec::pod_key(&pod);
        let uid = spec::pod_uid(&pod);
        if pod.metadata.deletion_timestamp.is_some() {
            // Marked deleted (as a KubeEdge cloud tells it): torn down
            // within its grace period, as a kubelet does, and said so.
            let grace = pod
                .metadata
                .deletion_grace_period_seconds
                .or_else(|| {
                    pod.spec
                        .as_ref()
                        .and_then(|s| s.termination_grace_period_seconds)
                })
                .unwrap_or(30);
            if let Some(worker) = self.workers.get(&key)
                && worker.uid == uid
            {
                let _ = worker.signals.try_send(Signal::Spec(Box::new(pod.clone())));
            }
            let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
            let name = pod.metadata.name.as_deref().unwrap_or_default();
            self.terminate(namespace, name, Some(uid), grace);
            return;
        }
        self.need_tokens(&key, &pod);
        if let Some(worker) = self.workers.get(&key)
            && worker.uid == uid
        {
            let _ = worker.signals.try_send(Signal::Spec(Box::new(pod)));
            return;
        }
        if let Some(old) = self.workers.remove(&key) {
            // Same name, new pod: the old one goes.
            self.delete(old);
        }
        let (signals, receiver) = mpsc::channel(64);
        let worker = PodWorker::new(
            pod,
            self.cri.clone(),
            self.hive.clone(),
            self.config.clone(),
            self.objects.clone(),
        )
        .with_view(self.view.clone(), self.terminating.clone());
        let worker = if from_store {
            worker.recalling()
        } else {
            worker
        };
        actix::spawn(worker.run(receiver));
        self.workers.insert(key, WorkerHandle { uid, signals });
    }

    /// Tells the book which tokens pod `key` needs (with those the edge
    /// holds for it), deletes those it no longer needs, and asks for what
    /// is due.
    fn need_tokens(&mut self, key: &str, pod: &Pod) {
        let Ok(value) = serde_json::to_value(pod) else {
            return;
        };
        let wants = {
            let objects = self
                .objects
                .read()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            crate::tokens::wants(&value, |key| objects.get(key), jiff::Timestamp::now())
        };
        for token in self.tokens.need(key, wants, Instant::now()) {
            self.delete_token(token);
        }
        self.ask_tokens();
    }

    /// Asks the cloud, through edgehub, for the tokens the book says to
    /// ask for now; each answer comes back as an [`Input::Token`].
    fn ask_tokens(&mut self) {
        let timeout = self.tokens.policy().ask_timeout;
        for ask in self.tokens.to_ask(Instant::now()) {
            let (hive, inbox) = (self.hive.clone(), self.inbox.clone());
            let span = tracing::debug_span!("token", key = %ask.key, id = ?ask.id);
            actix::spawn(
                async move {
                    let query = ask.source.request.query(module::EDGED);
                    let answer = match hive.send_sync(module::EDGEHUB, query, timeout).await {
                        Ok(reply) => apis::tokens::answered(&reply).map_err(|err| err.to_string()),
                        Err(err) => Err(err.to_string()),
                    };
                    let (key, id) = (ask.key, ask.id);
                    let _ = inbox.send(Input::Token { key, id, answer }).await;
                }
                .instrument(span),
            );
        }
    }

    /// Takes the cloud's answer to a token question: a token is written
    /// through metamanager, a refusal asked again later.
    fn token_answered(
        &mut self,
        key: String,
        id: AskId,
        answer: Result<TokenRequestStatus, String>,
    ) {
        let now = Instant::now();
        let outcome = match &answer {
            Ok(status) => Outcome::Issued {
                remaining: crate::tokens::remaining(status, jiff::Timestamp::now()),
            },
            Err(_) => Outcome::Failed,
        };
        match (self.tokens.answered(&key, id, outcome, now), answer) {
            (Verdict::Keep { source, renew }, Ok(status)) => {
                debug!(token = %key, renew_in = ?renew.saturating_duration_since(now), "service account token issued");
                self.keep_token(key, id, source.object(status));
            }
            (Verdict::Retry { at, failures }, Err(reason)) => {
                let retry_in = at.saturating_duration_since(now);
                match failures {
                    1 => {
                        warn!(token = %key, %reason, ?retry_in, "no service account token from the cloud; asking again")
                    }
                    _ => {
                        debug!(token = %key, %reason, ?retry_in, failures, "no service account token from the cloud; asking again")
                    }
                }
            }
            (verdict, _) => debug!(token = %key, ?verdict, "an answer nobody waits for"),
        }
        self.ask_tokens();
    }

    /// Writes a token's object through metamanager (which passes it back
    /// here, for the pod's volume); a write that fails is said.
    fn keep_token(&mut self, key: String, id: AskId, object: TokenRequestObject) {
        let msg = HiveMessage::new()
            .build_router(module::EDGED, group::META, key.clone(), operation::UPDATE)
            .with_resource_version(self.next_token_version().to_string())
            .with_content(object.content());
        let (hive, inbox) = (self.hive.clone(), self.inbox.clone());
        actix::spawn(async move {
            let reason = match hive
                .send_sync(module::METAMANAGER, msg, STORE_TIMEOUT)
                .await
            {
                Ok(reply) => match reply.into_answer() {
                    Ok(_) => return,
                    Err(refused) => refused.reason,
                },
                Err(err) => err.to_string(),
            };
            let _ = inbox.send(Input::TokenNotKept { key, id, reason }).await;
        });
    }

    /// Deletes a token's object through metamanager.
    fn delete_token(&mut self, key: String) {
        let msg = HiveMessage::new()
            .build_router(module::EDGED, group::META, key.clone(), operation::DELETE)
            .with_resource_version(self.next_token_version().to_string());
        let hive = self.hive.clone();
        actix::spawn(async move {
            match hive
                .send_sync(module::METAMANAGER, msg, STORE_TIMEOUT)
                .await
            {
                Ok(reply) => match reply.into_answer() {
                    Ok(_) => debug!(token = %key, "service account token deleted"),
                    Err(refused) => {
                        warn!(token = %key, reason = %refused, "service account token not deleted")
                    }
                },
                Err(err) => warn!(token = %key, error = %err, "service account token not deleted"),
            }
        });
    }

    /// Deletes the tokens edged asked for pods the store no longer has
    /// (deleted while edged was down), by the uid each is bound to.
    fn delete_orphan_tokens(&mut self, known: &[String]) {
        let known: HashSet<&str> = known.iter().map(String::as_str).collect();
        let marker = format!("/{}/", resource_type::SERVICE_ACCOUNT_TOKEN);
        let orphans: Vec<String> = {
            let Ok(mut objects) = self.objects.write() else {
                return;
            };
            let orphans: Vec<String> = objects
                .iter()
                .filter(|(key, object)| {
                    key.contains(&marker)
                        && object
                            .pointer("/spec/boundObjectRef/uid")
                            .and_then(Value::as_str)
                            .is_some_and(|uid| !known.contains(uid))
                })
                .map(|(key, _)| key.clone())
                .collect();
            for key in &orphans {
                objects.remove(key);
            }
            orphans
        };
        for key in orphans {
            info!(token = %key, "deleting the service account token of a pod the store no longer has");
            self.delete_token(key);
        }
    }

    /// The next version a token is written or deleted at: the time in
    /// microseconds (so a renewal supersedes what the edge holds), above
    /// the last.
    fn next_token_version(&mut self) -> u64 {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |since| {
                u64::try_from(since.as_micros()).unwrap_or(u64::MAX / 2)
            });
        self.token_version = now.max(self.token_version + 1);
        self.token_version
    }

    /// The PLEG: lists the runtime's containers and tells the worker of
    /// each pod whose containers changed.
    async fn relist(&mut self) {
        let containers = match self.cri.containers(NODE, &self.config.node, None).await {
            Ok(containers) => containers,
            Err(err) => {
                debug!(error = %err, "relist failed");
                return;
            }
        };
        let mut now: HashMap<String, Vec<(String, i32)>> = HashMap::new();
        for container in containers {
            if let Some(uid) = container.labels.get(POD_UID) {
                now.entry(uid.clone())
                    .or_default()
                    .push((container.id, container.state));
            }
        }
        for states in now.values_mut() {
            states.sort();
        }
        let changed: Vec<String> = now
            .iter()
            .filter(|(uid, states)| self.snapshot.get(*uid) != Some(*states))
            .map(|(uid, _)| uid.clone())
            .chain(
                self.snapshot
                    .keys()
                    .filter(|uid| !now.contains_key(*uid))
                    .cloned(),
            )
            .collect();
        self.snapshot = now;
        if changed.is_empty() {
            return;
        }
        let by_uid: BTreeMap<&str, &WorkerHandle> =
            self.workers.values().map(|w| (w.uid.as_str(), w)).collect();
        for uid in changed {
            if let Some(worker) = by_uid.get(uid.as_str()) {
                let _ = worker.signals.try_send(Signal::Relist);
            }
        }
    }
}

/// Waits until `at`; for ever if there is none.
async fn wake_at(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}
