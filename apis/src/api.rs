//! The read side of a Kubernetes-shaped HTTP API, shared by the edge's
//! MetaServer and the cloud's admin API: list, get and (where the source
//! can) watch, at the paths Kubernetes uses (`/api/v1/namespaces/{ns}/pods`,
//! `/api/v1/nodes/{name}`, ...). Errors are Kubernetes `Status` objects.
//! Lists and watches take a `labelSelector` ([`crate::selector`]); a watch
//! under one sees an object that comes to match as `ADDED` and one that
//! stops matching as `DELETED`, as from kube-apiserver.

use actix_web::http::StatusCode;
use actix_web::web::{self, Bytes};
use actix_web::{HttpResponse, ResponseError};
use futures_util::stream::BoxStream;
use serde::Deserialize;
use serde_json::Value;

use crate::fields::FieldSelector;
use crate::k8s::Status;
use crate::kinds::{CORE_PREFIX, DEVICES_PREFIX, Kind, ListWriter, ObjectKey};
use crate::selector::LabelSelector;
use crate::table;

/// A failed API request; answered as a Kubernetes `Status`.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The request cannot be read (400, `BadRequest`).
    #[error("{0}")]
    BadRequest(String),
    /// The object is not acceptable (422, `Invalid`).
    #[error("{0}")]
    Invalid(String),
    /// No such object (404, `NotFound`).
    #[error("{0} not found")]
    NotFound(ObjectKey),
    /// No such resource type here (404, `NotFound`).
    #[error("the server could not find the requested resource {0:?}")]
    UnknownResource(String),
    /// The request conflicts with what is stored (409, `Conflict`).
    #[error("{0}")]
    Conflict(String),
    /// This server cannot do that (405, `MethodNotAllowed`).
    #[error("{0}")]
    NotAllowed(String),
    /// Something behind the API failed (503, `ServiceUnavailable`).
    #[error("{0}")]
    Unavailable(String),
    /// The caller is not known: no credentials, or none that check out
    /// (401, `Unauthorized`).
    #[error("{0}")]
    Unauthorized(String),
    /// The caller is known but may not do this (403, `Forbidden`).
    #[error("{0}")]
    Forbidden(String),
    /// The request's body is larger than this server takes (413,
    /// `RequestEntityTooLarge`).
    #[error("{0}")]
    TooLarge(String),
    /// A watch from a resource version too old to resume from (410,
    /// `Expired`): the watcher lists again.
    #[error("{0}")]
    Expired(String),
}

impl ApiError {
    fn reason(&self) -> &'static str {
        match self {
            ApiError::BadRequest(_) => "BadRequest",
            ApiError::Invalid(_) => "Invalid",
            ApiError::NotFound(_) | ApiError::UnknownResource(_) => "NotFound",
            ApiError::Conflict(_) => "Conflict",
            ApiError::NotAllowed(_) => "MethodNotAllowed",
            ApiError::Unavailable(_) => "ServiceUnavailable",
            ApiError::Unauthorized(_) => "Unauthorized",
            ApiError::Forbidden(_) => "Forbidden",
            ApiError::TooLarge(_) => "RequestEntityTooLarge",
            ApiError::Expired(_) => "Expired",
        }
    }

    /// The Kubernetes `Status` that reports this error.
    pub fn status(&self) -> Status {
        Status::failure(
            self.status_code().as_u16(),
            self.reason(),
            &self.to_string(),
        )
    }
}

impl ResponseError for ApiError {
    fn status_code(&self) -> StatusCode {
        match self {
            ApiError::BadRequest(_) => StatusCode::BAD_REQUEST,
            ApiError::Invalid(_) => StatusCode::UNPROCESSABLE_ENTITY,
            ApiError::NotFound(_) | ApiError::UnknownResource(_) => StatusCode::NOT_FOUND,
            ApiError::Conflict(_) => StatusCode::CONFLICT,
            ApiError::NotAllowed(_) => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::Unauthorized(_) => StatusCode::UNAUTHORIZED,
            ApiError::Forbidden(_) => StatusCode::FORBIDDEN,
            ApiError::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::Expired(_) => StatusCode::GONE,
        }
    }

    fn error_response(&self) -> HttpResponse {
        HttpResponse::build(self.status_code()).json(self.status())
    }
}

/// Watch events as newline-delimited JSON, one event per line.
pub type EventStream = BoxStream<'static, Bytes>;

/// Where an API's objects come from.
pub trait ObjectSource: Send + Sync + 'static {
    /// One object.
    fn get(&self, key: &ObjectKey) -> Result<Option<Value>, ApiError>;

    /// The objects of `kind` (in `namespace`, or in all), handed to
    /// `visit` one at a time, never gathered (a list of thousands is
    /// written out as it is read); the resource version the list is
    /// current at.
    fn list_each(
        &self,
        kind: Kind,
        namespace: Option<&str>,
        visit: &mut dyn FnMut(Value),
    ) -> Result<String, ApiError>;

    /// Changes to objects of `kind` after `since` (a resource version from
    /// a list), or, without it, every current object as `ADDED` and then
    /// the changes.
    fn watch(
        &self,
        kind: Kind,
        namespace: Option<String>,
        since: Option<u64>,
    ) -> Result<EventStream, ApiError> {
        let _ = (kind, namespace, since);
        Err(ApiError::NotAllowed(
            "this server does not watch".to_owned(),
        ))
    }
}

/// Query parameters of a list.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ListQuery {
    /// Stream changes instead of listing.
    #[serde(default)]
    pub watch: Option<String>,
    /// Start the watch after this version.
    #[serde(default)]
    pub resource_version: Option<String>,
    /// Only objects whose labels this selects.
    #[serde(default)]
    pub label_selector: Option<String>,
    /// Only objects whose fields this selects ([`FieldSelector`]).
    #[serde(default)]
    pub field_selector: Option<String>,
}

impl ListQuery {
    fn watching(&self) -> bool {
        matches!(self.watch.as_deref(), Some("true" | "1"))
    }

    /// The label and field selectors of a list or watch of `kind`, if they
    /// select anything less than everything.
    fn selector(&self, kind: Kind) -> Result<Option<Selection>, ApiError> {
        let labels = match self.label_selector.as_deref() {
            Some(text) => Some(
                LabelSelector::parse(text).map_err(|err| ApiError::BadRequest(err.to_string()))?,
            ),
            None => None,
        }
        .filter(|labels| !labels.is_empty());
        let fields = match self.field_selector.as_deref() {
            Some(text) => Some(
                FieldSelector::parse(text, kind)
                    .map_err(|err| ApiError::BadRequest(err.to_string()))?,
            ),
            None => None,
        }
        .filter(|fields| !fields.is_empty());
        Ok((labels.is_some() || fields.is_some()).then_some(Selection { labels, fields }))
    }
}

/// What a list or watch selects: its labels and its fields, both.
#[derive(Debug, Clone, Default)]
pub struct Selection {
    /// The label selector, if any.
    pub labels: Option<LabelSelector>,
    /// The field selector, if any.
    pub fields: Option<FieldSelector>,
}

impl Selection {
    /// A selection by labels alone.
    pub fn labels(labels: LabelSelector) -> Selection {
        Selection {
            labels: Some(labels),
            fields: None,
        }
    }

    /// Whether `object` is selected.
    pub fn matches_object(&self, object: &Value) -> bool {
        self.labels
            .as_ref()
            .is_none_or(|l| l.matches_object(object))
            && self
                .fields
                .as_ref()
                .is_none_or(|f| f.matches_object(object))
    }
}

/// Registers the read routes for `S`, which must be in the app's data as
/// `web::Data<S>`.
pub fn read_routes<S: ObjectSource>(cfg: &mut web::ServiceConfig) {
    for prefix in [CORE_PREFIX, DEVICES_PREFIX] {
        cfg.route(
            &format!("{prefix}/namespaces/{{namespace}}/{{plural}}"),
            web::get().to(list_namespaced::<S>),
        )
        .route(
            &format!("{prefix}/namespaces/{{namespace}}/{{plural}}/{{name}}"),
            web::get().to(get_namespaced::<S>),
        )
        .route(
            &format!("{prefix}/{{plural}}"),
            web::get().to(list_everywhere::<S>),
        )
        .route(
            &format!("{prefix}/{{plural}}/{{name}}"),
            web::get().to(get_cluster::<S>),
        );
    }
    cfg.route("/healthz", web::get().to(|| async { "ok" }));
}

/// The kind served at `plural` under the request's path, checked for the
/// path's prefix (core or devices API group) and scope.
pub fn kind_at(
    request: &actix_web::HttpRequest,
    plural: &str,
    namespaced_path: bool,
) -> Result<Kind, ApiError> {
    match Kind::from_plural(plural) {
        Some(kind)
            if (kind.namespaced() || !namespaced_path)
                && request
                    .path()
                    .starts_with(&format!("{}/", kind.api_prefix())) =>
        {
            Ok(kind)
        }
        _ => Err(ApiError::UnknownResource(plural.to_owned())),
    }
}

async fn list_namespaced<S: ObjectSource>(
    request: actix_web::HttpRequest,
    source: web::Data<S>,
    path: web::Path<(String, String)>,
    query: web::Query<ListQuery>,
) -> Result<HttpResponse, ApiError> {
    let (namespace, plural) = path.into_inner();
    let kind = kind_at(&request, &plural, true)?;
    list(
        source.get_ref(),
        kind,
        Some(namespace),
        &query,
        as_table(&request),
    )
}

async fn list_everywhere<S: ObjectSource>(
    request: actix_web::HttpRequest,
    source: web::Data<S>,
    path: web::Path<String>,
    query: web::Query<ListQuery>,
) -> Result<HttpResponse, ApiError> {
    let kind = kind_at(&request, &path.into_inner(), false)?;
    list(source.get_ref(), kind, None, &query, as_table(&request))
}

/// Whether the request asks for a `Table` (kubectl's `get`).
fn as_table(request: &actix_web::HttpRequest) -> bool {
    request
        .headers()
        .get(actix_web::http::header::ACCEPT)
        .and_then(|accept| accept.to_str().ok())
        .is_some_and(table::wants_table)
}

/// Seconds since the epoch, for a table's AGE.
fn now() -> i64 {
    jiff::Timestamp::now().as_second()
}

fn list<S: ObjectSource>(
    source: &S,
    kind: Kind,
    namespace: Option<String>,
    query: &ListQuery,
    as_table: bool,
) -> Result<HttpResponse, ApiError> {
    let selector = query.selector(kind)?;
    if as_table && !query.watching() {
        let mut rows = Vec::new();
        let version = source.list_each(kind, namespace.as_deref(), &mut |item| {
            if selector.as_ref().is_none_or(|s| s.matches_object(&item)) {
                rows.push(item);
            }
        })?;
        return Ok(HttpResponse::Ok().json(table::table(kind, &rows, &version, now())));
    }
    if query.watching() {
        let since = match query.resource_version.as_deref() {
            None | Some("" | "0") => None,
            Some(version) => Some(version.parse::<u64>().map_err(|_| {
                ApiError::BadRequest(format!("resourceVersion {version:?} is not a number"))
            })?),
        };
        let known = match (&selector, since) {
            // Resumed from a list's version under a selector: what the
            // client holds is what the selector selected then, known from a
            // list taken now (events at or below its version are from
            // before it, and are told as their client may need them).
            (Some(selector), Some(_)) => {
                let mut keys = std::collections::HashSet::new();
                let at = source.list_each(kind, namespace.as_deref(), &mut |item| {
                    if selector.matches_object(&item) {
                        keys.insert(event_key(&item));
                    }
                })?;
                Some(Known {
                    keys,
                    at: at.parse().unwrap_or(u64::MAX),
                })
            }
            _ => None,
        };
        let mut events = source.watch(kind, namespace, since)?;
        if let Some(selector) = selector {
            events = selected_events(events, selector, known);
        }
        if as_table {
            events = table_events(events, kind);
        }
        return Ok(HttpResponse::Ok()
            .content_type("application/json")
            .streaming(futures_util::StreamExt::map(events, Ok::<_, ApiError>)));
    }
    // Written item by item: a list of thousands of objects is held as its
    // JSON only, never as trees.
    let mut list = ListWriter::new(kind);
    let version = source.list_each(kind, namespace.as_deref(), &mut |item| {
        if selector.as_ref().is_none_or(|s| s.matches_object(&item)) {
            list.push(&item);
        }
    })?;
    Ok(HttpResponse::Ok()
        .content_type("application/json")
        .body(list.finish(&version)))
}

async fn get_namespaced<S: ObjectSource>(
    request: actix_web::HttpRequest,
    source: web::Data<S>,
    path: web::Path<(String, String, String)>,
) -> Result<HttpResponse, ApiError> {
    let (namespace, plural, name) = path.into_inner();
    let kind = kind_at(&request, &plural, true)?;
    get(
        source.get_ref(),
        ObjectKey::new(kind, namespace, name),
        as_table(&request),
    )
}

async fn get_cluster<S: ObjectSource>(
    request: actix_web::HttpRequest,
    source: web::Data<S>,
    path: web::Path<(String, String)>,
) -> Result<HttpResponse, ApiError> {
    let (plural, name) = path.into_inner();
    match kind_at(&request, &plural, false) {
        Ok(kind) if !kind.namespaced() => get(
            source.get_ref(),
            ObjectKey::new(kind, "", name),
            as_table(&request),
        ),
        _ => Err(ApiError::UnknownResource(plural)),
    }
}

fn get<S: ObjectSource>(
    source: &S,
    key: ObjectKey,
    as_table: bool,
) -> Result<HttpResponse, ApiError> {
    match source.get(&key)? {
        Some(object) if as_table => {
            let version = object["metadata"]["resourceVersion"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            Ok(HttpResponse::Ok().json(table::table(key.kind, [&object], &version, now())))
        }
        Some(object) => Ok(HttpResponse::Ok().json(object)),
        None => Err(ApiError::NotFound(key)),
    }
}

/// Watch events whose objects become one-row `Table`s (kubectl's `get
/// -w`); a `Status` (an expired watch) is left as it is.
fn table_events(events: EventStream, kind: Kind) -> EventStream {
    futures_util::StreamExt::boxed(futures_util::StreamExt::map(events, move |line| {
        let Ok(mut event) = serde_json::from_slice::<Value>(&line) else {
            return line;
        };
        if event["object"]["kind"] == "Status" {
            return line;
        }
        let version = event["object"]["metadata"]["resourceVersion"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        event["object"] = table::table(kind, [&event["object"]], &version, now());
        event_line(&event)
    }))
}

/// An error binding a listener on `address`, with the address in it (the
/// OS's "Address already in use" alone names no port).
pub fn bind_error(address: &str) -> impl FnOnce(std::io::Error) -> std::io::Error + '_ {
    move |err| std::io::Error::new(err.kind(), format!("cannot listen on {address}: {err}"))
}

/// Runs a bound actix-web server on the current actix System; its first
/// bound address and a handle to stop it. `name` is for the logs.
pub fn spawn_server(
    name: &'static str,
    bound: &[std::net::SocketAddr],
    server: actix_web::dev::Server,
) -> std::io::Result<(std::net::SocketAddr, actix_web::dev::ServerHandle)> {
    let address = bound.first().copied().ok_or_else(|| {
        std::io::Error::new(std::io::ErrorKind::AddrNotAvailable, "no address bound")
    })?;
    let handle = server.handle();
    actix::spawn(async move {
        if let Err(err) = server.await {
            tracing::warn!(error = %err, server = name, "server stopped");
        }
    });
    tracing::info!(%address, server = name, "listening");
    Ok((address, handle))
}

/// The events of `events` (one per line) for objects `selector` selects:
/// an object that comes to match is `ADDED`, one that stops matching is
/// `DELETED`, others are left out; bookmarks and errors pass. A watch
/// `resumed` from a list's version does not know what its client holds: a
/// deletion, or a change that leaves an object unselected, is passed as
/// `DELETED` whatever came before (a deletion of an object a client does
/// not hold changes nothing for it).
///
/// With `known` (a resumed watch), what the selector selected at a version:
/// events after it are told exactly from there, those at or below it as a
/// resumed watch must.
pub fn selected_events(
    events: EventStream,
    selector: Selection,
    known: Option<Known>,
) -> EventStream {
    use futures_util::StreamExt;
    let (mut matching, resumed_until) = match known {
        Some(known) => (known.keys, Some(known.at)),
        None => (std::collections::HashSet::new(), None),
    };
    let selected = events.filter_map(move |line| {
        let resumed = resumed_until.is_some_and(|until| event_version(&line) <= until);
        let passed = select_event(&mut matching, &selector, resumed, line);
        std::future::ready(passed)
    });
    Box::pin(selected)
}

/// What a resumed watch's client holds: the keys its selector selected in
/// a list at version `at`.
#[derive(Debug, Default)]
pub struct Known {
    /// (namespace, name) of each object selected.
    pub keys: std::collections::HashSet<(String, String)>,
    /// The list's version.
    pub at: u64,
}

/// An object's (namespace, name).
fn event_key(object: &Value) -> (String, String) {
    let text = |field: &str| {
        object["metadata"][field]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    };
    (text("namespace"), text("name"))
}

/// The resource version of a watch event line's object (0 if unreadable:
/// taken as old).
fn event_version(line: &Bytes) -> u64 {
    serde_json::from_slice::<Value>(line)
        .ok()
        .and_then(|event| {
            event["object"]["metadata"]["resourceVersion"]
                .as_str()?
                .parse()
                .ok()
        })
        .unwrap_or(0)
}

/// One event of [`selected_events`]: the line to pass, if any.
fn select_event(
    matching: &mut std::collections::HashSet<(String, String)>,
    selector: &Selection,
    resumed: bool,
    line: Bytes,
) -> Option<Bytes> {
    let Ok(mut event) = serde_json::from_slice::<Value>(&line) else {
        return Some(line);
    };
    let kind = event["type"].as_str().unwrap_or_default().to_owned();
    let object = &event["object"];
    let key = event_key(object);
    let (was, is) = (matching.contains(&key), selector.matches_object(object));
    let shown = match kind.as_str() {
        "ADDED" | "MODIFIED" => match (was, is) {
            (false, true) if kind == "MODIFIED" && resumed => "MODIFIED",
            (false, true) => "ADDED",
            (true, true) => kind.as_str(),
            (true, false) => "DELETED",
            (false, false) if kind == "MODIFIED" && resumed => "DELETED",
            (false, false) => return None,
        },
        "DELETED" if was || resumed => "DELETED",
        "DELETED" => return None,
        _ => return Some(line),
    };
    if is && shown != "DELETED" {
        matching.insert(key);
    } else {
        matching.remove(&key);
    }
    if shown == kind {
        return Some(line);
    }
    event["type"] = Value::String(shown.to_owned());
    Some(event_line(&event))
}

/// Whether every address `address` resolves to is a loopback address (an
/// API served there without authentication is for this host only).
pub fn is_loopback(address: &str) -> bool {
    use std::net::ToSocketAddrs;
    match address.to_socket_addrs() {
        Ok(addresses) => {
            let addresses: Vec<std::net::SocketAddr> = addresses.collect();
            !addresses.is_empty() && addresses.iter().all(|a| a.ip().is_loopback())
        }
        Err(_) => false,
    }
}

/// One watch event as a line of the stream.
pub fn event_line(event: &Value) -> Bytes {
    let mut line = serde_json::to_vec(event).unwrap_or_default();
    line.push(b'\n');
    Bytes::from(line)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn event(kind: &str, name: &str, app: &str) -> Bytes {
        event_line(&json!({"type": kind, "object": {"metadata": {
            "name": name, "namespace": "default", "labels": {"app": app}}}}))
    }

    fn seen(line: Option<Bytes>) -> Option<String> {
        let event: Value = serde_json::from_slice(&line?).ok()?;
        Some(format!(
            "{} {}",
            event["type"].as_str()?,
            event["object"]["metadata"]["name"].as_str()?
        ))
    }

    #[test]
    fn a_resumed_watch_that_knows_its_list_shows_only_what_it_selected() {
        let at = |kind: &str, name: &str, app: &str, version: u64| {
            event_line(&json!({"type": kind, "object": {"metadata": {
                "name": name, "namespace": "default", "labels": {"app": app},
                "resourceVersion": version.to_string()}}}))
        };
        let selector = Selection::labels(LabelSelector::parse("app=web").expect("selector"));
        let known = Known {
            keys: [("default".to_owned(), "a".to_owned())]
                .into_iter()
                .collect(),
            at: 10,
        };
        let events = futures_util::StreamExt::boxed(futures_util::stream::iter([
            // At or below the list's version: what the client may hold.
            at("MODIFIED", "c", "db", 9),
            // After it: b was never selected, a was.
            at("MODIFIED", "b", "db", 11),
            at("DELETED", "b", "db", 12),
            at("MODIFIED", "a", "db", 13),
            at("MODIFIED", "d", "web", 14),
        ]));
        let passed: Vec<Bytes> = actix::System::new().block_on(futures_util::StreamExt::collect(
            selected_events(events, selector, Some(known)),
        ));
        let passed: Vec<String> = passed
            .into_iter()
            .filter_map(|line| seen(Some(line)))
            .collect();
        assert_eq!(passed, ["DELETED c", "DELETED a", "ADDED d"]);
    }

    #[test]
    fn a_watch_under_a_selector_sees_objects_come_and_go_as_they_match() {
        let selector = Selection::labels(LabelSelector::parse("app=web").expect("selector"));
        let mut matching = std::collections::HashSet::new();
        let mut pass = |line| seen(select_event(&mut matching, &selector, false, line));
        assert_eq!(pass(event("ADDED", "a", "web")).as_deref(), Some("ADDED a"));
        assert_eq!(pass(event("ADDED", "b", "db")), None);
        assert_eq!(
            pass(event("MODIFIED", "a", "web")).as_deref(),
            Some("MODIFIED a")
        );
        // b comes to match, a stops matching.
        assert_eq!(
            pass(event("MODIFIED", "b", "web")).as_deref(),
            Some("ADDED b")
        );
        assert_eq!(
            pass(event("MODIFIED", "a", "db")).as_deref(),
            Some("DELETED a")
        );
        assert_eq!(pass(event("DELETED", "a", "db")), None);
        assert_eq!(
            pass(event("DELETED", "b", "web")).as_deref(),
            Some("DELETED b")
        );
        // Bookmarks and errors pass as they are.
        let bookmark = event_line(&json!({"type": "BOOKMARK", "object": {"metadata": {}}}));
        assert_eq!(
            select_event(&mut matching, &selector, false, bookmark.clone()),
            Some(bookmark)
        );
        // Resumed from a list's version: what the client may hold from its
        // list is told when it goes or stops matching.
        let mut matching = std::collections::HashSet::new();
        let mut resumed = |line| seen(select_event(&mut matching, &selector, true, line));
        assert_eq!(
            resumed(event("MODIFIED", "c", "web")).as_deref(),
            Some("MODIFIED c")
        );
        assert_eq!(
            resumed(event("MODIFIED", "d", "db")).as_deref(),
            Some("DELETED d")
        );
        assert_eq!(
            resumed(event("DELETED", "e", "web")).as_deref(),
            Some("DELETED e")
        );
        assert_eq!(resumed(event("ADDED", "f", "db")), None);
    }
}
