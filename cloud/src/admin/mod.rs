//! The admin API: Kubernetes manifests in, Kubernetes objects out.
//!
//! - `POST /apis/edgehive.io/v1/apply` and `.../delete` take manifests (YAML
//!   with one or more documents, or JSON; a `List` too) and answer with one
//!   result per object. Every object is checked before any is applied, so a
//!   bad manifest changes nothing and gets a 4xx `Status` saying why.
//! - `GET /api/v1/namespaces/{ns}/{pods|configmaps|secrets|services|endpoints}[/{name}]`,
//!   `GET /api/v1/{plural}` (all namespaces) and `GET /api/v1/nodes[/{name}]`
//!   list and get, with status.
//! - `DELETE` on an object's path deletes it.
//! - A pod's log, exec, attach and port-forward, and the nodes' and pods'
//!   resource figures, through the nodes' links ([`pods`], [`metrics`]).
//!
//! Served with [`AdminApi::start_tls`], it takes HTTPS only, and every
//! request must come from a known user with the right role ([`auth`]):
//! a client certificate of the cloud's CA or a bearer token; 401 and 403
//! are Kubernetes `Status` answers. [`AdminApi::start`] serves plain HTTP
//! to anyone, and only on a loopback address: whoever reaches it controls
//! every node.

use std::any::Any;
use std::net::SocketAddr;
use std::sync::Arc;

use actix_web::dev::{Extensions, ServerHandle, Service, ServiceRequest};
use actix_web::web::{self, Bytes};
use actix_web::{App, HttpRequest, HttpResponse, HttpServer, ResponseError};
use futures_util::StreamExt as _;
use futures_util::future::Either;
use serde_json::Value;

use apis::api::{self, ApiError, ObjectSource};
use apis::kinds::{CORE_PREFIX, DEVICES_PREFIX, Kind, ObjectKey};

use crate::desired::{DesiredState, Object};
use crate::edgecontroller::ControllerHandle;

pub mod auth;
pub use apis::manifest;
pub mod pods;

/// The admin API's default address.
pub const DEFAULT_ADDRESS: &str = "127.0.0.1:10003";

/// Manifests larger than this are refused before they are read whole.
pub const MAX_MANIFEST_BYTES: usize = 8 << 20;

// The API's paths and answers, shared with its client.
pub use crate::admin_client::{
    APPLY_PATH, DELETE_PATH, ManifestResults, ObjectResult, TOKENS_PATH,
};

/// A running admin API.
pub struct AdminApiHandle {
    /// The bound address.
    pub address: SocketAddr,
    server: ServerHandle,
}

impl AdminApiHandle {
    /// Stops serving.
    pub async fn stop(self) {
        self.server.stop(true).await;
    }
}

/// How the admin API knows its callers: TLS, and bearer tokens.
#[derive(Clone)]
pub struct AdminAuth {
    /// The server's TLS: its certificate, and client certificates asked
    /// for but optional, verified against the cloud's CA when given (see
    /// `transports::tls::server_config_optional_client_auth`).
    pub tls: Arc<rustls::ServerConfig>,
    /// The bearer tokens taken besides client certificates.
    pub tokens: auth::Tokens,
}

/// The user the connection's client certificate names (verified in the
/// handshake), put in each connection's data by `on_connect`.
#[derive(Debug, Clone)]
struct CertificateUser(Option<auth::User>);

fn certificate_user(connection: &dyn Any, data: &mut Extensions) {
    type Tls = actix_tls::accept::rustls_0_23::TlsStream<actix_web::rt::net::TcpStream>;
    if let Some(tls) = connection.downcast_ref::<Tls>() {
        let (_, session) = tls.get_ref();
        let user = session
            .peer_certificates()
            .and_then(|chain| chain.first())
            .and_then(|leaf| auth::User::from_certificate(leaf));
        data.insert(CertificateUser(user));
    }
}

/// The authentication and authorization of one request: `None` to let
/// it through, or the refusal (401 or 403).
fn refusal(request: &ServiceRequest, tokens: &auth::Tokens) -> Option<ApiError> {
    let method = request.method().as_str();
    if method == "GET" && request.path() == "/healthz" {
        return None;
    }
    let certificate = request
        .conn_data::<CertificateUser>()
        .and_then(|user| user.0.as_ref());
    let authorization = request
        .headers()
        .get(actix_web::http::header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok());
    let user = match auth::authenticate(certificate, authorization, tokens) {
        Ok(user) => user,
        Err(message) => {
            tracing::info!(method, path = request.path(), reason = %message, "admin API: refused");
            return Some(ApiError::Unauthorized(message));
        }
    };
    let path = request
        .uri()
        .path_and_query()
        .map_or(request.path(), |p| p.as_str());
    match auth::authorize(method, path, &user) {
        auth::Decision::Allow => {
            tracing::debug!(user = %user.name, method, path = request.path(), "admin API");
            None
        }
        auth::Decision::Forbidden(message) => {
            tracing::info!(user = %user.name, method, path = request.path(), reason = %message, "admin API: forbidden");
            Some(ApiError::Forbidden(message))
        }
    }
}

/// Whether every address `address` resolves to is a loopback address
/// (the admin API's and MetaServer's rule for serving without
/// authentication).
pub use apis::api::is_loopback;

/// The admin API server.
pub struct AdminApi;

impl AdminApi {
    /// Serves the controller behind `handle` on `address` (inside an
    /// actix System), and the pods' streams (logs, exec, ...) through
    /// `streams` if given: plain HTTP, no authentication, so `address`
    /// must be a loopback address.
    pub fn start(
        handle: ControllerHandle,
        address: &str,
        streams: Option<crate::cloudstream::streams::PodStreams>,
    ) -> std::io::Result<AdminApiHandle> {
        AdminApi::start_with_ledger(handle, address, streams, None)
    }

    /// [`AdminApi::start`], with the join-token ledger at [`TOKENS_PATH`].
    pub fn start_with_ledger(
        handle: ControllerHandle,
        address: &str,
        streams: Option<crate::cloudstream::streams::PodStreams>,
        ledger: Option<Arc<dyn hub::certs::JoinLedger>>,
    ) -> std::io::Result<AdminApiHandle> {
        if !is_loopback(address) {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!(
                    "the admin API without authentication serves loopback addresses only, not {address}"
                ),
            ));
        }
        Self::serve(handle, address, streams, None, ledger)
    }

    /// [`AdminApi::start_with_ledger`] over HTTPS, every request
    /// authenticated and authorized ([`auth`]); any address.
    pub fn start_tls(
        handle: ControllerHandle,
        address: &str,
        streams: Option<crate::cloudstream::streams::PodStreams>,
        auth: AdminAuth,
        ledger: Option<Arc<dyn hub::certs::JoinLedger>>,
    ) -> std::io::Result<AdminApiHandle> {
        Self::serve(handle, address, streams, Some(auth), ledger)
    }

    fn serve(
        handle: ControllerHandle,
        address: &str,
        streams: Option<crate::cloudstream::streams::PodStreams>,
        auth: Option<AdminAuth>,
        ledger: Option<Arc<dyn hub::certs::JoinLedger>>,
    ) -> std::io::Result<AdminApiHandle> {
        let ledger = ledger.map(web::Data::from);
        let tokens = auth.as_ref().map(|auth| Arc::new(auth.tokens.clone()));
        let objects = web::Data::new(DesiredObjects(handle.store().clone()));
        let controller = web::Data::new(handle);
        let metrics = streams.clone().map(|streams| {
            web::Data::new(crate::cloudstream::metrics::ResourceMetrics::new(
                streams, None,
            ))
        });
        let streams = streams.map(web::Data::new);
        let server = HttpServer::new(move || {
            let tokens = tokens.clone();
            let app = App::new()
                // Before every route, WebSocket upgrades included.
                .wrap_fn(move |request, service| {
                    match tokens.as_ref().and_then(|t| refusal(&request, t)) {
                        None => Either::Left(service.call(request)),
                        Some(refused) => Either::Right(std::future::ready(Ok(
                            request.into_response(refused.error_response())
                        ))),
                    }
                })
                .app_data(objects.clone())
                .app_data(controller.clone())
                .route(APPLY_PATH, web::post().to(apply))
                .route(DELETE_PATH, web::post().to(delete_manifest))
                .configure(delete_routes);
            let app = match &ledger {
                Some(ledger) => app.app_data(ledger.clone()).configure(token_routes),
                None => app,
            };
            // Before the read routes: a pod's subresources are not objects.
            let app = match (&streams, &metrics) {
                (Some(streams), Some(metrics)) => app
                    .app_data(streams.clone())
                    .app_data(metrics.clone())
                    .configure(pods::routes)
                    .configure(crate::cloudstream::metrics::routes),
                _ => app,
            };
            app.configure(api::read_routes::<DesiredObjects>)
                .configure(|cfg| apis::discovery::routes(cfg, apis::discovery::Verbs::ReadDelete))
        })
        .workers(1)
        .disable_signals()
        .shutdown_timeout(2)
        .on_connect(certificate_user);
        let server = match auth {
            Some(auth) => server
                .bind_rustls_0_23(address, Arc::unwrap_or_clone(auth.tls))
                .map_err(api::bind_error(address))?,
            None => server.bind(address).map_err(api::bind_error(address))?,
        };
        let bound = server.addrs();
        let (address, handle) = api::spawn_server("admin API", &bound, server.run())?;
        Ok(AdminApiHandle {
            address,
            server: handle,
        })
    }
}

/// The desired state seen as Kubernetes objects: the read API's codec
/// takes their bodies.
struct DesiredObjects(Arc<dyn DesiredState>);

impl ObjectSource for DesiredObjects {
    fn get(&self, key: &ObjectKey) -> Result<Option<Value>, ApiError> {
        self.0
            .get(key)
            .map(|object| object.map(Object::into_json))
            .map_err(|err| ApiError::Unavailable(err.to_string()))
    }

    fn list_each(
        &self,
        kind: Kind,
        namespace: Option<&str>,
        visit: &mut dyn FnMut(Value),
    ) -> Result<String, ApiError> {
        let revision = self
            .0
            .list_each(kind, namespace, &mut |object| visit(object.into_json()))
            .map_err(|err| ApiError::Unavailable(err.to_string()))?;
        Ok(revision.to_string())
    }

    /// The desired state's own watch of `kind`, from `since`; without it,
    /// what there is now as `ADDED` (a list), then the changes after the
    /// list's revision. A revision too old to resume from ends the stream
    /// with kube-apiserver's `410 Expired`, for the watcher to list again.
    fn watch(
        &self,
        kind: Kind,
        namespace: Option<String>,
        since: Option<u64>,
    ) -> Result<api::EventStream, ApiError> {
        use apis::kinds::{Change, expired_event};
        use futures_util::stream;

        use crate::desired::{DesiredError, WatchEvent};
        let unavailable = |err: DesiredError| ApiError::Unavailable(err.to_string());
        let mut initial = Vec::new();
        let from = match since {
            Some(since) => since,
            None => self
                .0
                .list_each(kind, namespace.as_deref(), &mut |object| {
                    if let Ok(event) = kind.watch_event(Change::Added, object.json()) {
                        initial.push(api::event_line(&event));
                    }
                })
                .map_err(unavailable)?,
        };
        let changes = self.0.watch(kind, from).map_err(|err| match err {
            DesiredError::Gone { .. } => ApiError::Expired(err.to_string()),
            err => unavailable(err),
        })?;
        let changes = changes
            .scan(false, move |ended, event| {
                if *ended {
                    return std::future::ready(None);
                }
                let line = match event {
                    Ok(event) => {
                        let (change, object) = match &event {
                            WatchEvent::Added(o) => (Change::Added, o),
                            WatchEvent::Modified(o) => (Change::Modified, o),
                            WatchEvent::Deleted(o) => (Change::Deleted, o),
                        };
                        let elsewhere = namespace
                            .as_deref()
                            .is_some_and(|ns| object.key().namespace != ns);
                        match elsewhere {
                            true => None,
                            false => kind
                                .watch_event(change, object.json())
                                .ok()
                                .map(|event| api::event_line(&event)),
                        }
                    }
                    Err(err) => {
                        *ended = true;
                        Some(api::event_line(&expired_event(&err.to_string())))
                    }
                };
                std::future::ready(Some(line))
            })
            .filter_map(std::future::ready);
        Ok(stream::iter(initial).chain(changes).boxed())
    }
}

fn result(key: &ObjectKey, result: &str) -> ObjectResult {
    ObjectResult {
        kind: key.kind.name().to_owned(),
        namespace: key.namespace.clone(),
        name: key.name.clone(),
        result: result.to_owned(),
    }
}

/// A manifest's bytes, read into one buffer of the size its
/// `Content-Length` gives (refused before anything is allocated when that
/// is above [`MAX_MANIFEST_BYTES`]). Read as actix reads a body, a buffer
/// of 8 KiB doubled as it filled: a 6 MB manifest was copied through
/// buffers up to 8 MiB. (cloudcore's RSS after such an apply did not
/// change with this: see docs/kubernetes.md, "Benchmark: memory".)
async fn manifest_body(
    request: &HttpRequest,
    mut payload: web::Payload,
) -> Result<Vec<u8>, ApiError> {
    let too_large = || {
        ApiError::TooLarge(format!(
            "a manifest may be at most {MAX_MANIFEST_BYTES} bytes"
        ))
    };
    let declared = match request
        .headers()
        .get(actix_web::http::header::CONTENT_LENGTH)
    {
        Some(value) => Some(
            value
                .to_str()
                .ok()
                .and_then(|value| value.parse::<usize>().ok())
                .ok_or_else(|| ApiError::BadRequest("unreadable Content-Length".to_owned()))?,
        ),
        None => None,
    };
    if declared.is_some_and(|length| length > MAX_MANIFEST_BYTES) {
        return Err(too_large());
    }
    let mut body = Vec::with_capacity(declared.unwrap_or(0));
    while let Some(chunk) = payload.next().await {
        let chunk = chunk.map_err(|err| ApiError::BadRequest(format!("body not read: {err}")))?;
        if body.len() + chunk.len() > MAX_MANIFEST_BYTES {
            return Err(too_large());
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

async fn apply(
    controller: web::Data<ControllerHandle>,
    request: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let body = manifest_body(&request, payload).await?;
    // Each object packed as it is read: a manifest of thousands is never
    // held as trees all at once.
    let mut admitted = Vec::new();
    manifest::for_each(&body, |object| {
        admitted.push(controller.admit(object)?);
        Ok(())
    })?;
    drop(body);
    let applied = controller.apply_admitted(admitted).await?;
    let results = applied
        .iter()
        .map(|(key, applied)| result(key, applied.verb()))
        .collect();
    Ok(HttpResponse::Ok().json(ManifestResults { results }))
}

async fn delete_manifest(
    controller: web::Data<ControllerHandle>,
    request: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let body = manifest_body(&request, payload).await?;
    // Only the keys are kept: a manifest of thousands is not held as trees.
    let mut keys = Vec::new();
    manifest::for_each(&body, |object| {
        keys.push(object.key().clone());
        Ok(())
    })?;
    drop(body);
    let mut results = Vec::with_capacity(keys.len());
    for key in keys {
        let deleted = controller.delete(key.clone()).await?;
        results.push(result(
            &key,
            if deleted.is_some() {
                "deleted"
            } else {
                ObjectResult::NOT_FOUND
            },
        ));
    }
    Ok(HttpResponse::Ok().json(ManifestResults { results }))
}

fn token_routes(cfg: &mut web::ServiceConfig) {
    cfg.route(TOKENS_PATH, web::get().to(list_tokens))
        .route(TOKENS_PATH, web::post().to(record_token))
        .route(
            &format!("{TOKENS_PATH}/revokednodes"),
            web::get().to(revoked_nodes),
        )
        .route(
            &format!("{TOKENS_PATH}/{{id}}"),
            web::delete().to(revoke_token),
        );
}

type Ledger = web::Data<dyn hub::certs::JoinLedger>;

fn ledger_failed(err: hub::certs::LedgerError) -> HttpResponse {
    HttpResponse::ServiceUnavailable().json(serde_json::json!({"message": err.to_string()}))
}

async fn list_tokens(ledger: Ledger) -> HttpResponse {
    HttpResponse::Ok().json(ledger.tokens())
}

async fn revoked_nodes(ledger: Ledger) -> HttpResponse {
    HttpResponse::Ok().json(ledger.revocations())
}

async fn record_token(ledger: Ledger, body: Bytes) -> HttpResponse {
    let record: hub::certs::TokenRecord = match serde_json::from_slice(&body) {
        Ok(record) => record,
        Err(err) => {
            return HttpResponse::BadRequest()
                .json(serde_json::json!({"message": format!("not a token record: {err}")}));
        }
    };
    match ledger.record(record.clone()).await {
        Ok(()) => HttpResponse::Created().json(record),
        Err(err) => ledger_failed(err),
    }
}

/// `?unrecorded=true`: revoke an id the ledger never recorded (a token made
/// while the admin API was away).
#[derive(serde::Deserialize)]
struct RevokeQuery {
    #[serde(default)]
    unrecorded: bool,
}

/// Revokes a recorded token; an id the ledger does not know is `404`
/// (a typo must not read as done), unless asked for as unrecorded.
async fn revoke_token(
    ledger: Ledger,
    id: web::Path<String>,
    query: web::Query<RevokeQuery>,
) -> HttpResponse {
    use hub::certs::ledger::Revoked;
    let id = id.into_inner();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    match ledger.revoke_token(id.clone(), now, query.unrecorded).await {
        Ok(Revoked::Unknown) => HttpResponse::NotFound().json(serde_json::json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "reason": "NotFound", "code": 404,
            "message": format!(
                "join token {id:?} not found: `cloudcore token list` shows the recorded ones \
                 (--unrecorded revokes an id that was never recorded)"
            ),
        })),
        Ok(revoked) => {
            HttpResponse::Ok().json(serde_json::json!({"revoked": revoked == Revoked::Now}))
        }
        Err(err) => ledger_failed(err),
    }
}

/// `DELETE` of one object, at the paths its kind is read at.
fn delete_routes(cfg: &mut web::ServiceConfig) {
    for prefix in [CORE_PREFIX, DEVICES_PREFIX] {
        cfg.route(
            &format!("{prefix}/namespaces/{{namespace}}/{{plural}}/{{name}}"),
            web::delete().to(delete_namespaced),
        )
        .route(
            &format!("{prefix}/{{plural}}/{{name}}"),
            web::delete().to(delete_cluster),
        );
    }
}

async fn delete_namespaced(
    request: actix_web::HttpRequest,
    controller: web::Data<ControllerHandle>,
    path: web::Path<(String, String, String)>,
) -> Result<HttpResponse, ApiError> {
    let (namespace, plural, name) = path.into_inner();
    let kind = api::kind_at(&request, &plural, true)?;
    delete_one(&controller, ObjectKey::new(kind, namespace, name)).await
}

async fn delete_cluster(
    request: actix_web::HttpRequest,
    controller: web::Data<ControllerHandle>,
    path: web::Path<(String, String)>,
) -> Result<HttpResponse, ApiError> {
    let (plural, name) = path.into_inner();
    match api::kind_at(&request, &plural, false) {
        Ok(kind) if !kind.namespaced() => {
            delete_one(&controller, ObjectKey::new(kind, "", name)).await
        }
        _ => Err(ApiError::UnknownResource(plural)),
    }
}

async fn delete_one(
    controller: &ControllerHandle,
    key: ObjectKey,
) -> Result<HttpResponse, ApiError> {
    match controller.delete(key.clone()).await? {
        Some(object) => Ok(HttpResponse::Ok().json(object)),
        None => Err(ApiError::NotFound(key)),
    }
}
