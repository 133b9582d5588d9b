//! The application center (KubeEdge's dynamiccontroller): a KubeEdge
//! edge's MetaServer forwards what its local clients ask (get, list,
//! watch, and writes) to the cloud as *applications*, and waits for the
//! answer up to 10 s before it falls back to its own store.
//!
//! Every application is answered at once:
//!
//! - With a Kubernetes API server behind the cloud ([`ApiServer`]), the
//!   request is made there **in the node's name** (`system:node:<node>`
//!   in group `system:nodes`, by impersonation), so the cluster's own Node
//!   authorizer, RBAC and admission decide what a node may read and write,
//!   as for a kubelet. The answer (or the API server's Status) goes back.
//!   A watch is started for the node: its objects, then its changes, go
//!   down the node's reliable queue, and the edge passes them to its local
//!   watchers ([`watches`]).
//! - Without one (the embedded store), each is refused with a Kubernetes
//!   Status (405): the edge then answers from its own store at once,
//!   instead of after 10 s.
//!
//! Decisions sit in [`requests`] (what call an application is) and
//! [`watches`] (which watches run, what each sends); this module does the
//! I/O around them, in one task behind a [`TaskDoor`].

pub mod requests;
pub mod watches;
pub mod wire;

#[cfg(feature = "kubernetes")]
pub mod kubernetes;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use beehive::constants::group;
use beehive::{Hive, Message as HiveMessage, TaskDoor};
use futures_util::StreamExt;
use futures_util::future::BoxFuture;
use futures_util::stream::BoxStream;
use hub::NodeLinks;
use serde_json::Value;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;
use tracing::{debug, info, warn};

use crate::backoff::Backoff;
use crate::edgecontroller::send_to_node;
use requests::{ApiCall, Request};
use watches::{Admission, ApiEvent, Outgoing, WatchSpec, WatchView, Watches};
use wire::{ApiStatus, Application};

pub use wire::{GROUP, MODULE};

/// A Kubernetes API server, reached in a node's name.
pub trait ApiServer: Send + Sync + 'static {
    /// Makes `call` as `node`; the answer's body, or the API server's
    /// Status.
    fn call(&self, node: &str, call: ApiCall) -> BoxFuture<'static, Result<Vec<u8>, ApiStatus>>;

    /// Watches `path` (with its query, `watch=true` included) as `node`.
    fn watch(
        &self,
        node: &str,
        path: String,
    ) -> BoxFuture<'static, Result<BoxStream<'static, Result<ApiEvent, ApiStatus>>, ApiStatus>>;
}

/// The center's settings.
#[derive(Debug, Clone)]
pub struct CenterConfig {
    /// At most this many forwarded watches per node.
    pub max_watches_per_node: usize,
    /// At most this many of a node's requests in flight at once; more are
    /// refused with 429.
    pub max_calls_per_node: usize,
    /// How long queueing an object for a node may take.
    pub send_timeout: Duration,
    /// The longest wait between attempts of a failing watch.
    pub max_backoff: Duration,
}

impl Default for CenterConfig {
    fn default() -> Self {
        CenterConfig {
            max_watches_per_node: 100,
            max_calls_per_node: 16,
            send_timeout: Duration::from_secs(10),
            max_backoff: Duration::from_secs(30),
        }
    }
}

/// What the center has done so far.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CenterCounts {
    /// Applications answered Approved.
    pub approved: u64,
    /// Applications answered Rejected.
    pub rejected: u64,
    /// Watches running now.
    pub watches: usize,
    /// Objects a watch queued for its node.
    pub queued: u64,
}

/// A running center.
#[derive(Clone)]
pub struct CenterHandle {
    /// Its counts, as they change.
    pub counts: watch::Receiver<CenterCounts>,
}

/// What the center's task takes.
enum Input {
    Hive(HiveMessage),
    /// A watch failed for good (its first listing was refused).
    WatchEnded {
        node: String,
        id: String,
    },
    Stop(oneshot::Sender<()>),
}

/// The application center.
pub struct ApplicationCenter;

impl ApplicationCenter {
    /// Starts the center in `hive` (module and group `dynamiccontroller`),
    /// forwarding to `api`, or refusing everything without one; its
    /// answers and watched objects go to the nodes through `links`
    /// (the controller's, [`crate::ControllerHandle::node_links`]).
    pub fn start(
        hive: &Hive,
        links: NodeLinks,
        api: Option<Arc<dyn ApiServer>>,
        config: CenterConfig,
    ) -> Result<CenterHandle, beehive::Error> {
        let (inbox, inputs) = mpsc::channel(256);
        let (counts_tx, counts) = watch::channel(CenterCounts::default());
        let center = Center {
            links,
            api,
            watches: Watches::new(config.max_watches_per_node),
            running: HashMap::new(),
            calls: HashMap::new(),
            config,
            inbox: inbox.clone(),
            counts: Arc::new(counts_tx),
        };
        actix::spawn(center.run(inputs));
        let door = TaskDoor::new(MODULE, GROUP, inbox, Input::Hive).stopping_with(Input::Stop);
        hive.start_module(move |_| door.clone())?;
        Ok(CenterHandle { counts })
    }
}

struct Center {
    links: NodeLinks,
    api: Option<Arc<dyn ApiServer>>,
    watches: Watches,
    running: HashMap<(String, String), JoinHandle<()>>,
    /// Each node's requests in flight.
    calls: HashMap<String, Arc<tokio::sync::Semaphore>>,
    config: CenterConfig,
    inbox: mpsc::Sender<Input>,
    counts: Arc<watch::Sender<CenterCounts>>,
}

/// The node a message came from (cloudhub puts `node/<node>/` before
/// every resource a node sends, and refuses one naming another node), and
/// the rest of the resource.
fn sender(msg: &HiveMessage) -> Option<(&str, &str)> {
    let rest = msg.resource().strip_prefix("node/")?;
    Some(rest.split_once('/').unwrap_or((rest, "")))
}

impl Center {
    async fn run(mut self, mut inputs: mpsc::Receiver<Input>) {
        while let Some(input) = inputs.recv().await {
            match input {
                Input::Hive(msg) => self.on_message(msg),
                Input::WatchEnded { node, id } => self.stop_watch(&node, &id),
                Input::Stop(done) => {
                    for (_, task) in self.running.drain() {
                        task.abort();
                    }
                    let _ = done.send(());
                    return;
                }
            }
        }
    }

    fn on_message(&mut self, msg: HiveMessage) {
        let Some((node, rest)) = sender(&msg) else {
            debug!(
                resource = msg.resource(),
                "application without a node; ignored"
            );
            return;
        };
        let node = node.to_owned();
        if rest == wire::WATCH_SYNC {
            return self.sync_watches(&node, &msg);
        }
        let app = match Application::from_content(msg.content()) {
            Ok(app) => app,
            Err(reason) => {
                warn!(%node, %reason, "unreadable application refused");
                return self.answer(
                    &node,
                    &msg,
                    Application::default(),
                    Err(ApiStatus::bad_request(reason)),
                );
            }
        };
        if !app.node.is_empty() && app.node != node {
            warn!(%node, named = %app.node, "application in another node's name refused");
            let refusal = ApiStatus::forbidden(format!(
                "node {node} cannot ask in the name of {}",
                app.node
            ));
            return self.answer(&node, &msg, app, Err(refusal));
        }
        let Some(api) = self.api.clone() else {
            let refusal = ApiStatus::not_served(
                "this cloud keeps its own desired state (no Kubernetes API server): \
                 the edge answers from its own store",
            );
            return self.answer(&node, &msg, app, Err(refusal));
        };
        debug!(%node, verb = %app.verb, key = %app.key, "application");
        match Request::of(&app) {
            Err(refusal) => self.answer(&node, &msg, app, Err(refusal)),
            Ok(Request::Call(call)) => {
                let calls = self.calls.entry(node.clone()).or_insert_with(|| {
                    Arc::new(tokio::sync::Semaphore::new(self.config.max_calls_per_node))
                });
                let Ok(permit) = calls.clone().try_acquire_owned() else {
                    let refusal = ApiStatus::too_many(format!(
                        "node {node} has {} requests in flight, its most",
                        self.config.max_calls_per_node
                    ));
                    return self.answer(&node, &msg, app, Err(refusal));
                };
                let (links, counts) = (self.links.clone(), self.counts.clone());
                let read = call.read;
                let pending = api.call(&node, call);
                tokio::spawn(async move {
                    let _permit = permit;
                    let answer = pending.await.map(|body| match read {
                        true => filtered(body),
                        false => body,
                    });
                    answer_node(&links, &counts, &node, &msg, app, answer);
                });
            }
            Ok(Request::Watch(spec)) => self.start_watch(&node, msg, app, spec),
        }
    }

    /// Answers `msg` (an application `app`) down its node's link.
    fn answer(
        &self,
        node: &str,
        msg: &HiveMessage,
        app: Application,
        outcome: Result<Vec<u8>, ApiStatus>,
    ) {
        answer_node(&self.links, &self.counts, node, msg, app, outcome);
    }

    fn start_watch(&mut self, node: &str, msg: HiveMessage, app: Application, spec: WatchSpec) {
        match self.watches.admit(node, &app.id, spec.clone()) {
            Admission::Running => self.answer(node, &msg, app, Ok(Vec::new())),
            Admission::TooMany => {
                let refusal = ApiStatus::too_many(format!(
                    "node {node} runs {} forwarded watches, its most",
                    self.watches.of(node)
                ));
                self.answer(node, &msg, app, Err(refusal));
            }
            Admission::Start => {
                let id = app.id.clone();
                self.spawn_watch(node, &id, spec, Some((msg, app)));
            }
        }
    }

    fn spawn_watch(
        &mut self,
        node: &str,
        id: &str,
        spec: WatchSpec,
        asked: Option<(HiveMessage, Application)>,
    ) {
        let Some(api) = self.api.clone() else { return };
        info!(%node, id, resource = %spec.key.resource, "forwarded watch started");
        let follower = Follower {
            api,
            links: self.links.clone(),
            counts: self.counts.clone(),
            inbox: self.inbox.clone(),
            config: self.config.clone(),
            node: node.to_owned(),
            id: id.to_owned(),
            view: WatchView::new(spec.key.clone(), node),
            spec,
        };
        let task = tokio::spawn(follower.run(asked));
        if let Some(old) = self.running.insert((node.to_owned(), id.to_owned()), task) {
            old.abort();
        }
        self.count_watches();
    }

    fn stop_watch(&mut self, node: &str, id: &str) {
        self.watches.remove(node, id);
        if let Some(task) = self.running.remove(&(node.to_owned(), id.to_owned())) {
            task.abort();
            info!(%node, id, "forwarded watch stopped");
        }
        self.count_watches();
    }

    fn count_watches(&self) {
        let running = self.running.len();
        self.counts.send_modify(|c| c.watches = running);
    }

    /// The edge lists the watches it holds: start the missing, stop the
    /// gone, and answer with those that could not start (KubeEdge's
    /// answer: a map of the failed applications by id).
    fn sync_watches(&mut self, node: &str, msg: &HiveMessage) {
        let listed: BTreeMap<String, Value> = match msg.content() {
            Value::String(text) => serde_json::from_str(text).unwrap_or_default(),
            content => serde_json::from_value(content.clone()).unwrap_or_default(),
        };
        let mut failed = serde_json::Map::new();
        let mut specs = BTreeMap::new();
        let mut apps = BTreeMap::new();
        for (id, content) in listed {
            let refused = |app: Application, status: ApiStatus| {
                (id.clone(), app.rejected(&status).to_content())
            };
            let app = match Application::from_content(&content) {
                Ok(app) => app,
                Err(reason) => {
                    let (id, app) = refused(Application::default(), ApiStatus::bad_request(reason));
                    failed.insert(id, app);
                    continue;
                }
            };
            let spec = match (self.api.is_some(), Request::of(&app)) {
                (false, _) => Err(ApiStatus::not_served(
                    "this cloud has no Kubernetes API server",
                )),
                (true, Ok(Request::Watch(spec))) if app.node.is_empty() || app.node == node => {
                    Ok(spec)
                }
                (true, Ok(_)) => Err(ApiStatus::bad_request("not a watch of this node's")),
                (true, Err(status)) => Err(status),
            };
            match spec {
                Ok(spec) => {
                    specs.insert(id.clone(), spec);
                    apps.insert(id, app);
                }
                Err(status) => {
                    let (id, app) = refused(app, status);
                    failed.insert(id, app);
                }
            }
        }
        let plan = self.watches.sync(node, specs);
        for id in &plan.stop {
            self.stop_watch(node, id);
        }
        for (id, spec) in plan.start {
            self.spawn_watch(node, &id, spec, None);
        }
        for id in plan.refused {
            if let Some(app) = apps.remove(&id) {
                let status =
                    ApiStatus::too_many(format!("node {node} runs its most forwarded watches"));
                failed.insert(id, app.rejected(&status).to_content());
            }
        }
        let mut answer = msg.response(MODULE, Value::Object(failed));
        answer.router.operation = wire::ANSWER.to_owned();
        answer.router.group = group::RESOURCE.to_owned();
        send_to_node(&self.links, answer);
    }
}

/// Applies the answer filters to a read's body (a JSON object or list).
fn filtered(body: Vec<u8>) -> Vec<u8> {
    match serde_json::from_slice::<Value>(&body) {
        Ok(mut object) => {
            wire::point_at_metaserver(&mut object);
            object.to_string().into_bytes()
        }
        Err(_) => body,
    }
}

/// Answers the application in `msg` down `node`'s link: KubeEdge's
/// `applicationResponse`, whose parent is the edge's message.
fn answer_node(
    links: &NodeLinks,
    counts: &watch::Sender<CenterCounts>,
    node: &str,
    msg: &HiveMessage,
    app: Application,
    outcome: Result<Vec<u8>, ApiStatus>,
) {
    let app = match outcome {
        Ok(body) => {
            counts.send_modify(|c| c.approved += 1);
            app.approved(body)
        }
        Err(status) => {
            debug!(%node, verb = %app.verb, key = %app.key, %status, "application refused");
            counts.send_modify(|c| c.rejected += 1);
            app.rejected(&status)
        }
    };
    let answer = HiveMessage::new()
        .build_router(
            MODULE,
            group::RESOURCE,
            format!("node/{node}/ignore/Application/ignore"),
            wire::ANSWER,
        )
        .with_parent(msg.id())
        .with_content(app.to_content());
    send_to_node(links, answer);
}

/// One forwarded watch: lists, queues what the node lacks, then follows
/// the changes; lists again when the API server can no longer resume.
struct Follower {
    api: Arc<dyn ApiServer>,
    links: NodeLinks,
    counts: Arc<watch::Sender<CenterCounts>>,
    inbox: mpsc::Sender<Input>,
    config: CenterConfig,
    node: String,
    id: String,
    spec: WatchSpec,
    view: WatchView,
}

impl Follower {
    async fn run(mut self, mut asked: Option<(HiveMessage, Application)>) {
        let collection = wire::ResourceKey {
            name: None,
            ..self.spec.key.clone()
        };
        let Ok(path) = collection.path("") else {
            return;
        };
        let selection =
            wire::list_query(&self.spec.options, &self.spec.key, wire::Reading::Listing);
        let list_path = match selection.is_empty() {
            true => path.clone(),
            false => format!("{path}?{selection}"),
        };
        let watch_query =
            wire::list_query(&self.spec.options, &self.spec.key, wire::Reading::Watch);
        let mut backoff = Backoff::new(Duration::from_millis(500), self.config.max_backoff);
        let mut resume: Option<String> = None;
        loop {
            if resume.is_none() {
                let list = match self.get(&list_path).await {
                    Ok(list) => list,
                    Err(status) => {
                        let asker = asked.take();
                        if asker.is_some() || refused_for_good(&status) {
                            // The node may not watch this: the asker is told,
                            // a watch the edge listed again ends.
                            return self.end(asker, status).await;
                        }
                        warn!(node = %self.node, id = %self.id, %status, "forwarded watch cannot list; trying again");
                        backoff.pause().await;
                        continue;
                    }
                };
                // The objects first, then the answer (as KubeEdge's
                // cloud): the edge starts its local watch from its store's
                // newest revision once approved, and passes on only what
                // arrives above it.
                for outgoing in self.view.listed(&list) {
                    self.queue(outgoing).await;
                }
                if let Some((msg, app)) = asked.take() {
                    answer_node(
                        &self.links,
                        &self.counts,
                        &self.node,
                        &msg,
                        app,
                        Ok(Vec::new()),
                    );
                }
                resume = list["metadata"]["resourceVersion"]
                    .as_str()
                    .map(str::to_owned);
            }
            let from = resume.clone().unwrap_or_default();
            let watch_path = format!(
                "{path}?{watch_query}&resourceVersion={}",
                form_escape(&from)
            );
            let mut events = match self.api.watch(&self.node, watch_path).await {
                Ok(events) => events,
                Err(status) if status.code == 410 => {
                    resume = None;
                    backoff.pause().await;
                    continue;
                }
                Err(status) if refused_for_good(&status) => return self.end(None, status).await,
                Err(status) => {
                    warn!(node = %self.node, id = %self.id, %status, "forwarded watch cannot watch; trying again");
                    backoff.pause().await;
                    continue;
                }
            };
            let mut changes = 0usize;
            while let Some(event) = events.next().await {
                let event = match event {
                    Ok(event) => event,
                    Err(status) => {
                        if status.code == 410 {
                            // Too old to resume: list again.
                            resume = None;
                        } else {
                            warn!(node = %self.node, id = %self.id, %status, "forwarded watch failed");
                        }
                        break;
                    }
                };
                changes += 1;
                let version = match &event {
                    ApiEvent::Bookmark(version) => Some(version.clone()),
                    ApiEvent::Added(o) | ApiEvent::Modified(o) | ApiEvent::Deleted(o) => {
                        o["metadata"]["resourceVersion"].as_str().map(str::to_owned)
                    }
                };
                if let Some(outgoing) = self.view.changed(event) {
                    self.queue(outgoing).await;
                }
                if version.is_some() {
                    resume = version;
                }
            }
            // A watch that ends at once, again and again, is not retried
            // at full speed.
            match changes {
                0 => backoff.pause().await,
                _ => backoff.reset(),
            }
        }
    }

    /// The API server's answer to a GET of `path`, as the node.
    async fn get(&self, path: &str) -> Result<Value, ApiStatus> {
        let call = ApiCall::get(path.to_owned(), true);
        let body = self.api.call(&self.node, call).await?;
        serde_json::from_slice(&body)
            .map_err(|err| ApiStatus::unavailable(format!("unreadable answer: {err}")))
    }

    /// Ends the watch: the API server refused it for good.
    async fn end(self, asker: Option<(HiveMessage, Application)>, status: ApiStatus) {
        warn!(node = %self.node, id = %self.id, %status, "forwarded watch refused");
        if let Some((msg, app)) = asker {
            answer_node(
                &self.links,
                &self.counts,
                &self.node,
                &msg,
                app,
                Err(status),
            );
        }
        let _ = self
            .inbox
            .send(Input::WatchEnded {
                node: self.node,
                id: self.id,
            })
            .await;
    }

    /// Queues one object for the node (waits until cloudhub has stored it
    /// in the node's queue). A delete goes only if the object is gone
    /// from the API server (not merely out of the selector); an object
    /// the queue did not take is sent again later.
    async fn queue(&mut self, outgoing: Outgoing) {
        let Outgoing {
            operation,
            resource,
            version,
            mut object,
            confirm,
        } = outgoing;
        if let Some(key) = confirm
            && let Ok(path) = key.path("")
        {
            match self.get(&path).await {
                Err(status) if status.code == 404 => {}
                Ok(_) => {
                    return debug!(node = %self.node, %resource, "left the watch's selector; kept at the edge");
                }
                Err(status) => {
                    return warn!(node = %self.node, %resource, %status, "deletion not confirmed; not sent");
                }
            }
        }
        wire::point_at_metaserver(&mut object);
        // Every object is acknowledged; one without a numeric revision
        // gets the clock's, which supersedes what the node holds.
        let version = version.unwrap_or_else(crate::desired::clock_revision);
        let msg = HiveMessage::new()
            .build_router(
                MODULE,
                group::RESOURCE,
                format!("node/{}/{resource}", self.node),
                operation,
            )
            .with_resource_version(version.to_string())
            .with_content(object);
        match self.links.deliver(msg, self.config.send_timeout).await {
            Ok(_) => {
                self.counts.send_modify(|c| c.queued += 1);
                return;
            }
            Err(refusal) => {
                warn!(node = %self.node, %resource, %refusal, "a watched object was not queued")
            }
        }
        self.view.forget(&resource);
    }
}

/// Whether the API server's refusal holds however often it is asked (a
/// client error other than a timeout, an expired revision or a rate
/// limit).
fn refused_for_good(status: &ApiStatus) -> bool {
    (400..500).contains(&status.code) && !matches!(status.code, 408 | 410 | 429)
}

fn form_escape(value: &str) -> String {
    form_urlencoded::byte_serialize(value.as_bytes()).collect()
}
