//! MetaServer: a local, Kubernetes-shaped HTTP API over the edge store, for
//! applications on the edge node. It lists, gets and watches pods,
//! configmaps, secrets, services, endpoints and nodes from what the edge
//! holds, so it answers with the cloud unreachable. Without
//! authorization it listens on loopback only (it serves secrets, and
//! anything that can reach it can read them). With authorization
//! (KubeEdge's `requireAuthorization`, see [`crate::access`]) a request
//! with a service account token may read what that account may, as the
//! cloud's kube-apiserver decides; beyond loopback such a server speaks
//! TLS only, and a request without a token is served to loopback peers
//! only.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;

use actix_web::body::MessageBody;
use actix_web::dev::{ServerHandle, ServiceRequest, ServiceResponse};
use actix_web::middleware::{Next, from_fn};
use actix_web::web::Bytes;
use actix_web::{App, HttpServer, web};
use futures_util::StreamExt;
use futures_util::stream;
use serde_json::Value;
use tokio::sync::broadcast::error::RecvError;
use tracing::warn;

use beehive::Content;
use beehive::constants::resource_type;

use crate::access::{AccessReviewer, DecisionLimits, Gate};
use crate::store::{EdgeStore, StoreChange, StoreError};
use apis::api::{self, ApiError, EventStream, ObjectSource};
use apis::kinds::{Change, Kind, ObjectKey};

/// The address MetaServer listens on by default (KubeEdge's port).
pub const DEFAULT_ADDRESS: &str = "127.0.0.1:10550";

/// A running MetaServer.
pub struct MetaServerHandle {
    /// The bound address.
    pub address: SocketAddr,
    server: ServerHandle,
}

impl MetaServerHandle {
    /// Stops serving; open watches end.
    pub async fn stop(self) {
        self.server.stop(false).await;
    }
}

/// Why MetaServer does not start.
#[derive(Debug, thiserror::Error)]
pub enum MetaServerError {
    /// Without authorization it serves anyone who reaches it.
    #[error(
        "MetaServer without requireAuthorization serves every object the edge holds, secrets included, to whoever reaches it, so only on a loopback address, not {0:?}"
    )]
    NotLoopback(String),
    /// Beyond loopback, bearer tokens must not cross the network in clear.
    #[error("MetaServer on {0:?}, beyond loopback, takes bearer tokens: it needs TLS")]
    NoTls(String),
    /// The address cannot be listened on.
    #[error("MetaServer on {address}: {source}")]
    Bind {
        /// The address asked for.
        address: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

/// The TLS settings MetaServer serves with.
pub use rustls::ServerConfig as TlsConfig;

/// MetaServer with authorization (KubeEdge's `requireAuthorization`).
pub struct Authorization {
    /// Who reviews a token's request (the cloud, over the hub link).
    pub reviewer: Arc<dyn AccessReviewer>,
    /// How long decisions are kept.
    pub limits: DecisionLimits,
    /// TLS: needed beyond loopback, optional on it.
    pub tls: Option<Arc<TlsConfig>>,
}

pub use apis::api::is_loopback;

/// The edge's local API.
pub struct MetaServer;

impl MetaServer {
    /// Serves `store` on `address` (e.g. [`DEFAULT_ADDRESS`], a loopback
    /// address) without authorization; must run inside an actix System.
    pub fn start(store: EdgeStore, address: &str) -> Result<MetaServerHandle, MetaServerError> {
        MetaServer::serve(store, address, None)
    }

    /// Serves `store` on `address`, with `authorization` if given (then
    /// beyond loopback too, with its TLS); must run inside an actix System.
    pub fn serve(
        store: EdgeStore,
        address: &str,
        authorization: Option<Authorization>,
    ) -> Result<MetaServerHandle, MetaServerError> {
        let loopback = is_loopback(address);
        let (gate, tls) = match authorization {
            None if !loopback => return Err(MetaServerError::NotLoopback(address.to_owned())),
            None => (None, None),
            Some(auth) if auth.tls.is_none() && !loopback => {
                return Err(MetaServerError::NoTls(address.to_owned()));
            }
            Some(auth) => (
                Some(web::Data::new(Gate::new(auth.reviewer, auth.limits))),
                auth.tls,
            ),
        };
        let objects = web::Data::new(EdgeObjects(store));
        let server = HttpServer::new(move || {
            let gated = gate.is_some();
            let mut app = App::new().app_data(objects.clone());
            if let Some(gate) = &gate {
                app = app.app_data(gate.clone());
            }
            app.wrap(actix_web::middleware::Condition::new(gated, from_fn(admit)))
                .configure(api::read_routes::<EdgeObjects>)
                .configure(|cfg| apis::discovery::routes(cfg, apis::discovery::Verbs::Read))
        })
        .workers(1)
        .disable_signals()
        .shutdown_timeout(1);
        let bind_error = |source| MetaServerError::Bind {
            address: address.to_owned(),
            source,
        };
        let server = match tls {
            Some(tls) => server.bind_rustls_0_23(address, (*tls).clone()),
            None => server.bind(address),
        }
        .map_err(bind_error)?;
        let bound = server.addrs();
        let (address, handle) =
            api::spawn_server("metaserver", &bound, server.run()).map_err(bind_error)?;
        Ok(MetaServerHandle {
            address,
            server: handle,
        })
    }
}

/// Lets a request through the [`Gate`], or answers it with its refusal
/// (a Kubernetes Status). `/healthz` is open.
async fn admit(
    request: ServiceRequest,
    next: Next<impl MessageBody + 'static>,
) -> Result<ServiceResponse<impl MessageBody>, actix_web::Error> {
    let gate = request.app_data::<web::Data<Gate>>().cloned();
    if let Some(gate) = gate.filter(|_| request.path() != "/healthz") {
        let authorization = request
            .headers()
            .get(actix_web::http::header::AUTHORIZATION)
            .map(|value| value.to_str().unwrap_or_default().to_owned());
        let loopback = request
            .peer_addr()
            .is_some_and(|peer| peer.ip().to_canonical().is_loopback());
        let method = request.method().as_str().to_owned();
        let path_and_query = request
            .uri()
            .path_and_query()
            .map_or_else(|| request.path().to_owned(), |p| p.as_str().to_owned());
        if let Err(refusal) = gate
            .admit(authorization.as_deref(), loopback, &method, &path_and_query)
            .await
        {
            return Ok(request.error_response(refusal).map_into_right_body());
        }
    }
    next.call(request)
        .await
        .map(ServiceResponse::map_into_left_body)
}

/// The edge store seen as Kubernetes objects.
struct EdgeObjects(EdgeStore);

fn unavailable(err: StoreError) -> ApiError {
    ApiError::Unavailable(err.to_string())
}

/// A stored version as a number (versions from Kubernetes are numbers in
/// practice; anything else counts as 0).
fn version_number(version: &str) -> u64 {
    version.parse().unwrap_or(0)
}

/// A pod as the edge knows it: the object from the cloud with the status
/// edged last reported here (the edge's own truth, also offline).
fn with_local_status(store: &EdgeStore, resource: &str, object: &Content) -> Value {
    let mut object = json_of(resource, object);
    let mut parts = resource.splitn(3, '/');
    let (Some(namespace), Some(resource_type::POD), Some(name)) =
        (parts.next(), parts.next(), parts.next())
    else {
        return object;
    };
    let status = store
        .get(&format!("{namespace}/{}/{name}", resource_type::POD_STATUS))
        .ok()
        .flatten()
        .and_then(|record| record.object);
    if let (Some(status), Some(map)) = (status, object.as_object_mut()) {
        map.insert("status".to_owned(), json_of(resource, &status));
    }
    object
}

/// A stored object as JSON, for the API; one that does not read (the store
/// wrote it, so it always does) is said and served as `null`.
fn json_of(resource: &str, object: &Content) -> Value {
    object.decode().unwrap_or_else(|err| {
        warn!(%resource, error = %err, "stored object does not read");
        Value::Null
    })
}

impl ObjectSource for EdgeObjects {
    fn get(&self, key: &ObjectKey) -> Result<Option<Value>, ApiError> {
        let resource = key.edge_resource().to_string();
        let record = self.0.get(&resource).map_err(unavailable)?;
        Ok(record
            .and_then(|record| record.object)
            .map(|object| with_local_status(&self.0, &resource, &object)))
    }

    fn list_each(
        &self,
        kind: Kind,
        namespace: Option<&str>,
        visit: &mut dyn FnMut(Value),
    ) -> Result<String, ApiError> {
        let records = self
            .0
            .list_type(namespace, kind.resource_type())
            .map_err(unavailable)?;
        let version = records
            .iter()
            .map(|(_, record)| version_number(&record.version))
            .max()
            .unwrap_or(0);
        for (resource, record) in records {
            if let Some(object) = record.object {
                visit(with_local_status(&self.0, &resource, &object));
            }
        }
        Ok(version.to_string())
    }

    fn watch(
        &self,
        kind: Kind,
        namespace: Option<String>,
        since: Option<u64>,
    ) -> Result<EventStream, ApiError> {
        // Subscribed before listing, so nothing falls between the two.
        let changes = self.0.subscribe();
        let mut seen = HashMap::new();
        let mut initial = Vec::new();
        // Without a version: everything there, as ADDED. From a version:
        // what changed after it (deletions too), so nothing between the
        // watcher's list and this watch is lost.
        let records = self
            .0
            .records_of_type(namespace.as_deref(), kind.resource_type(), since.is_some())
            .map_err(unavailable)?;
        for (resource, record) in records {
            let version = version_number(&record.version);
            if since.is_some_and(|since| version <= since) {
                continue;
            }
            seen.insert(resource.clone(), version);
            match (record.object, since) {
                (Some(object), None) => {
                    let object = with_local_status(&self.0, &resource, &object);
                    push_event(&mut initial, kind, Change::Added, &object);
                }
                (Some(object), Some(_)) => {
                    let object = with_local_status(&self.0, &resource, &object);
                    push_event(&mut initial, kind, Change::Modified, &object);
                }
                (None, _) => {
                    if let Some(stub) = stub_of(kind, &resource) {
                        push_event(&mut initial, kind, Change::Deleted, &stub);
                    }
                }
            }
        }
        let watch = Watch {
            store: self.0.clone(),
            kind,
            namespace,
            floor: since.unwrap_or(0),
            seen,
        };
        let tail = stream::unfold(
            (changes, watch, false),
            |(mut changes, mut watch, ended)| async move {
                if ended {
                    return None;
                }
                loop {
                    match changes.recv().await {
                        Ok(change) => {
                            if let Some(line) = watch.event(&change) {
                                return Some((line, (changes, watch, false)));
                            }
                        }
                        Err(RecvError::Lagged(missed)) => {
                            warn!(missed, "a watcher fell behind; its watch ends");
                            let line = api::event_line(&apis::kinds::expired_event(
                                "the watch fell behind; list again",
                            ));
                            return Some((line, (changes, watch, true)));
                        }
                        Err(RecvError::Closed) => return None,
                    }
                }
            },
        );
        Ok(stream::iter(initial).chain(tail).boxed())
    }
}

/// What one watch is looking at.
struct Watch {
    store: EdgeStore,
    kind: Kind,
    namespace: Option<String>,
    /// Changes at or below this version are already known to the watcher.
    floor: u64,
    /// Versions the watcher got in the initial list.
    seen: HashMap<String, u64>,
}

impl Watch {
    /// The event line for `change`, if the watcher wants it.
    fn event(&mut self, change: &StoreChange) -> Option<Bytes> {
        let mut parts = change.resource.splitn(3, '/');
        let (namespace, resource_type) = (parts.next()?, parts.next()?);
        if self.namespace.as_deref().is_some_and(|ns| ns != namespace) {
            return None;
        }
        if self.kind == Kind::Pod && resource_type == resource_type::POD_STATUS {
            // The pod's status changed here: the pod changed, as seen here.
            let pod = format!("{namespace}/{}/{}", resource_type::POD, parts.next()?);
            let object = self.store.get(&pod).ok().flatten()?.object?;
            let object = with_local_status(&self.store, &pod, &object);
            let mut lines = Vec::with_capacity(1);
            push_event(&mut lines, self.kind, Change::Modified, &object);
            return lines.pop();
        }
        if resource_type != self.kind.resource_type()
            || self.namespace.as_deref().is_some_and(|ns| ns != namespace)
        {
            return None;
        }
        let version = version_number(&change.record.version);
        let known = self.seen.get(&change.resource).copied().unwrap_or(0);
        if version <= self.floor || version <= known {
            return None;
        }
        let previous = change.previous.as_ref().and_then(|p| p.object.as_ref());
        let (what, object) = match (&change.record.object, previous) {
            (Some(object), None) => (Change::Added, object),
            (Some(object), Some(_)) => (Change::Modified, object),
            (None, Some(previous)) => (Change::Deleted, previous),
            (None, None) => return None,
        };
        let object = with_local_status(&self.store, &change.resource, object);
        let mut lines = Vec::with_capacity(1);
        push_event(&mut lines, self.kind, what, &object);
        lines.pop()
    }
}

/// A minimal object naming the deleted `resource` (a tombstone keeps only
/// its version).
fn stub_of(kind: Kind, resource: &str) -> Option<Value> {
    let mut parts = resource.splitn(3, '/');
    let (namespace, _, name) = (parts.next()?, parts.next()?, parts.next()?);
    let mut metadata = serde_json::json!({ "name": name });
    if kind.namespaced() {
        metadata["namespace"] = Value::String(namespace.to_owned());
    }
    Some(serde_json::json!({ "apiVersion": "v1", "kind": kind.name(), "metadata": metadata }))
}

fn push_event(lines: &mut Vec<Bytes>, kind: Kind, change: Change, object: &Value) {
    match kind.watch_event(change, object) {
        Ok(event) => lines.push(api::event_line(&event)),
        Err(err) => warn!(error = %err, "stored object skipped in a watch"),
    }
}
