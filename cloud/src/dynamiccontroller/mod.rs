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

mod follower;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use beehive::IntoRouteName as _;
use beehive::constants::group;
use beehive::{Content, Message as HiveMessage};
use beehive::{Hive, TaskDoor};
use follower::Follower;
use futures_util::future::BoxFuture;
use futures_util::stream::BoxStream;
use hub::NodeLinks;
use requests::{ApiCall, Request};
use serde_json::Value;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;
use tracing::{debug, info, warn};
use watches::{Admission, ApiEvent, WatchSpec, WatchView, Watches};
use wire::{ApiStatus, Application, GROUP, MODULE};

use crate::edgecontroller::send_to_node;

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
            Content::Text(text) => serde_json::from_str(text).unwrap_or_default(),
            content => content.decode().unwrap_or_default(),
        };
        let mut failed = BTreeMap::new();
        let mut specs = BTreeMap::new();
        let mut apps = BTreeMap::new();
        for (id, content) in listed {
            let refused = |app: Application, status: ApiStatus| (id.clone(), app.rejected(&status));
            let app = match Application::from_json(&content) {
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
                failed.insert(id, app.rejected(&status));
            }
        }
        let failed = Content::of(&failed).expect("applications of strings and bytes encode");
        let mut answer = msg.response(MODULE, failed);
        answer.router.operation = wire::ANSWER.into_route_name();
        answer.router.group = group::RESOURCE.into_route_name();
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

/// Whether the API server's refusal holds however often it is asked (a
/// client error other than a timeout, an expired revision or a rate
/// limit).
fn refused_for_good(status: &ApiStatus) -> bool {
    (400..500).contains(&status.code) && !matches!(status.code, 408 | 410 | 429)
}

fn form_escape(value: &str) -> String {
    form_urlencoded::byte_serialize(value.as_bytes()).collect()
}
