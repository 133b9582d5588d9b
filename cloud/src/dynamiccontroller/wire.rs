//! KubeEdge's application messages, as a KubeEdge edge's MetaServer sends
//! them and waits for their answers, and the API server requests they
//! stand for.
//!
//! An application is a JSON object with Go's field names: `ID`, `Key`
//! (`/<group>/<version>/<resource>/<namespace>/<name>`, `core` for the
//! core group and `null` for no namespace or name, or a non-resource path
//! such as `/version`), `Verb`, `Nodename`, `Option` (the request's
//! options, JSON), `ReqBody` (the object written, JSON), `Subresource`,
//! and for the answer `Status` (`Approved`, `Rejected`), `Reason`,
//! `Error` (`{"ErrStatus": <a Kubernetes Status>}`) and `RespBody` (the API
//! server's answer, JSON). Byte fields travel as Go writes `[]byte`:
//! base64, or `null` when empty.

use apis::k8s::Status;
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use beehive::Content;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::{Map, Value, json};

/// Group of the messages (KubeEdge's `DynamicControllerModuleGroup`).
pub const GROUP: &str = "dynamiccontroller";
/// The module that answers them (KubeEdge's `DynamicControllerModuleName`).
pub const MODULE: &str = "dynamiccontroller";
/// Operation of an answer.
pub const ANSWER: &str = "applicationResponse";
/// Resource (after `node/<node>/`) of the edge's list of its watches.
pub const WATCH_SYNC: &str = "watchapp/sync";
/// Status of an application the cloud carried out.
pub const APPROVED: &str = "Approved";
/// Status of an application the cloud refused.
pub const REJECTED: &str = "Rejected";

/// Where KubeEdge's in-cluster clients at the edge reach the MetaServer:
/// the `default/kubernetes` EndpointSlice is rewritten to point there.
pub const METASERVER_ADDRESS: &str = "127.0.0.1";
/// The MetaServer's port.
pub const METASERVER_PORT: u16 = 10550;

/// One application, as the edge sends it and gets it back answered.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Application {
    /// The edge's identifier: a digest of the request.
    #[serde(rename = "ID", default)]
    pub id: String,
    /// What the request is about.
    #[serde(rename = "Key", default)]
    pub key: String,
    /// `get`, `list`, `watch`, `create`, `update`, `updatestatus`,
    /// `patch` or `delete`.
    #[serde(rename = "Verb", default)]
    pub verb: String,
    /// The node that asks (the link's node is the one believed).
    #[serde(rename = "Nodename", default)]
    pub node: String,
    /// The request's options (ListOptions, GetOptions, ..., PatchInfo).
    #[serde(rename = "Option", default, with = "go_bytes")]
    pub option: Vec<u8>,
    /// The object of a write.
    #[serde(rename = "ReqBody", default, with = "go_bytes")]
    pub request_body: Vec<u8>,
    /// `status`, say, or empty.
    #[serde(rename = "Subresource", default)]
    pub subresource: String,
    /// The API server's answer.
    #[serde(rename = "RespBody", default, with = "go_bytes")]
    pub response_body: Vec<u8>,
    /// Where the application stands.
    #[serde(rename = "Status", default)]
    pub status: String,
    /// Why it failed, where no Kubernetes Status says it.
    #[serde(rename = "Reason", default)]
    pub reason: String,
    /// Why it was refused: `{"ErrStatus": <Status>}`.
    #[serde(rename = "Error", default)]
    pub error: Value,
    /// Everything else the edge sent, given back as it came.
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

/// Go's `[]byte` in JSON: base64, `null` for none.
mod go_bytes {
    use super::*;

    pub fn serialize<S: Serializer>(bytes: &[u8], serializer: S) -> Result<S::Ok, S::Error> {
        match bytes.is_empty() {
            true => serializer.serialize_none(),
            false => serializer.serialize_str(&STANDARD.encode(bytes)),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<u8>, D::Error> {
        match Option::<String>::deserialize(deserializer)? {
            None => Ok(Vec::new()),
            Some(text) => STANDARD
                .decode(text.as_bytes())
                .map_err(serde::de::Error::custom),
        }
    }
}

impl Application {
    /// Reads an application from a message's content: the JSON object, or
    /// that JSON as a string.
    pub fn from_content(content: &Content) -> Result<Application, String> {
        match content {
            Content::Text(text) => serde_json::from_str(text).map_err(|err| err.to_string()),
            other => other.decode().map_err(|err| err.to_string()),
        }
        .map_err(|err| format!("unreadable application: {err}"))
    }

    /// One of the applications an edge lists, as JSON.
    pub fn from_json(value: &Value) -> Result<Application, String> {
        match value {
            Value::String(text) => serde_json::from_str(text),
            other => Application::deserialize(other),
        }
        .map_err(|err| format!("unreadable application: {err}"))
    }

    /// The options, parsed (`{}` when there are none).
    pub fn options(&self) -> Result<Value, ApiStatus> {
        parse_json(&self.option, "Option")
    }

    /// The application answered: approved with `body` (the API server's
    /// answer; empty for none).
    pub fn approved(mut self, body: Vec<u8>) -> Application {
        self.status = APPROVED.to_owned();
        self.response_body = body;
        self.reason.clear();
        self.error = Value::Null;
        self
    }

    /// The application answered: refused with `status`.
    pub fn rejected(mut self, status: &ApiStatus) -> Application {
        self.status = REJECTED.to_owned();
        self.response_body.clear();
        self.reason = status.message.clone();
        self.error = json!({ "ErrStatus": status.to_json() });
        self
    }

    /// The application as a message content.
    pub fn to_content(&self) -> Content {
        Content::of(self).expect("an application of strings and bytes encodes")
    }
}

fn parse_json(bytes: &[u8], what: &str) -> Result<Value, ApiStatus> {
    if bytes.is_empty() {
        return Ok(json!({}));
    }
    serde_json::from_slice(bytes)
        .map_err(|err| ApiStatus::bad_request(format!("unreadable {what}: {err}")))
}

/// A Kubernetes Status: why a request failed, as the API server says it
/// (so the edge's clients see `IsNotFound`, `IsForbidden` and the like).
#[derive(Debug, Clone, PartialEq)]
pub struct ApiStatus {
    /// HTTP status code.
    pub code: u16,
    /// Kubernetes' reason (`NotFound`, `Forbidden`, ...).
    pub reason: String,
    /// What went wrong.
    pub message: String,
    /// The Status as the API server sent it, where it did.
    pub raw: Option<Value>,
}

impl ApiStatus {
    /// A Status of our own.
    pub fn new(code: u16, reason: &str, message: impl Into<String>) -> ApiStatus {
        ApiStatus {
            code,
            reason: reason.to_owned(),
            message: message.into(),
            raw: None,
        }
    }

    /// 400: unreadable or not allowed in that form.
    pub fn bad_request(message: impl Into<String>) -> ApiStatus {
        ApiStatus::new(400, "BadRequest", message)
    }

    /// 403: not this node's to ask.
    pub fn forbidden(message: impl Into<String>) -> ApiStatus {
        ApiStatus::new(403, "Forbidden", message)
    }

    /// 405: this cloud does not serve it.
    pub fn not_served(message: impl Into<String>) -> ApiStatus {
        ApiStatus::new(405, "MethodNotAllowed", message)
    }

    /// 429: the node holds too many already.
    pub fn too_many(message: impl Into<String>) -> ApiStatus {
        ApiStatus::new(429, "TooManyRequests", message)
    }

    /// 503: the API server could not be reached.
    pub fn unavailable(message: impl Into<String>) -> ApiStatus {
        ApiStatus::new(503, "ServiceUnavailable", message)
    }

    /// A Status the API server sent.
    pub fn from_api(status: Value) -> ApiStatus {
        ApiStatus {
            code: status["code"]
                .as_u64()
                .and_then(|c| u16::try_from(c).ok())
                .unwrap_or(500),
            reason: status["reason"].as_str().unwrap_or("").to_owned(),
            message: status["message"].as_str().unwrap_or("").to_owned(),
            raw: Some(status),
        }
    }

    /// The Status object.
    pub fn to_json(&self) -> Value {
        if let Some(raw) = &self.raw {
            return raw.clone();
        }
        serde_json::to_value(Status::failure(self.code, &self.reason, &self.message))
            .unwrap_or(Value::Null)
    }
}

impl std::fmt::Display for ApiStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}: {}", self.code, self.reason, self.message)
    }
}

/// What an application's key names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// Objects of one resource: all of them, those of a namespace, or one.
    Resource(ResourceKey),
    /// A discovery path (`/version`, `/api`, `/apis/<group>/<version>`,
    /// ...), which a node may only read.
    Discovery(String),
}

/// A resource key: `/<group>/<version>/<resource>/<namespace>/<name>`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ResourceKey {
    /// API group, `""` for the core group.
    pub group: String,
    /// API version.
    pub version: String,
    /// The resource's plural name (`pods`, `services`).
    pub resource: String,
    /// The namespace, if the key names one.
    pub namespace: Option<String>,
    /// The object, if the key names one.
    pub name: Option<String>,
}

/// The discovery paths a node may read through the cloud (KubeEdge's
/// pass-through paths).
const DISCOVERY: &[&str] = &[
    "/api",
    "/apis",
    "/version",
    "/healthz",
    "/livez",
    "/readyz",
    "/openapi/v2",
    "/openapi/v3",
];

/// Whether `segment` may stand in an API path: a Kubernetes name, group,
/// version or resource (no `/`, `?`, `%`, `..` or spaces).
pub fn plain(segment: &str) -> bool {
    !segment.is_empty()
        && segment != "."
        && segment != ".."
        && segment
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b':'))
}

impl Target {
    /// Parses an application's key.
    pub fn parse(key: &str) -> Result<Target, ApiStatus> {
        let trimmed = key.trim_end_matches('/');
        let Some(path) = trimmed.strip_prefix('/') else {
            return Err(ApiStatus::bad_request(format!("key {key:?} is not a path")));
        };
        let segments: Vec<&str> = path.split('/').collect();
        if !segments.iter().all(|s| plain(s)) {
            return Err(ApiStatus::bad_request(format!(
                "key {key:?} is not a plain path"
            )));
        }
        let discovery = DISCOVERY.contains(&trimmed)
            || matches!(
                segments.as_slice(),
                ["api", _] | ["apis", _] | ["apis", _, _]
            );
        if discovery {
            return Ok(Target::Discovery(trimmed.to_owned()));
        }
        let [group, version, resource, rest @ ..] = segments.as_slice() else {
            return Err(ApiStatus::bad_request(format!(
                "key {key:?} names no resource"
            )));
        };
        if rest.len() > 2 {
            return Err(ApiStatus::bad_request(format!("key {key:?} is too long")));
        }
        let named = |s: Option<&&str>| s.filter(|s| **s != "null").map(|s| s.to_string());
        Ok(Target::Resource(ResourceKey {
            group: match *group {
                "core" => String::new(),
                group => group.to_owned(),
            },
            version: version.to_string(),
            resource: resource.to_string(),
            namespace: named(rest.first()),
            name: named(rest.get(1)),
        }))
    }
}

impl ResourceKey {
    /// The API path of the collection, or of the object if the key names
    /// one, with `subresource` after it.
    pub fn path(&self, subresource: &str) -> Result<String, ApiStatus> {
        let mut path = match self.group.as_str() {
            "" => format!("/api/{}", self.version),
            group => format!("/apis/{group}/{}", self.version),
        };
        if let Some(namespace) = &self.namespace
            && self.resource != "namespaces"
        {
            path.push_str("/namespaces/");
            path.push_str(namespace);
        }
        path.push('/');
        path.push_str(&self.resource);
        if let Some(name) = &self.name {
            path.push('/');
            path.push_str(name);
        }
        if !subresource.is_empty() {
            if !plain(subresource) || self.name.is_none() {
                return Err(ApiStatus::bad_request(format!(
                    "subresource {subresource:?} of {path} cannot be asked for"
                )));
            }
            path.push('/');
            path.push_str(subresource);
        }
        Ok(path)
    }

    /// The type name a KubeEdge edge files these objects under: the kind,
    /// in lower case (`pods` → `pod`, `endpoints` → `endpoints`).
    pub fn edge_type(&self) -> String {
        resource_to_kind(&self.resource).to_lowercase()
    }
}

/// The kind of a resource's objects, as KubeEdge guesses it from the
/// plural name (a table for the irregular ones, then English plurals).
pub fn resource_to_kind(resource: &str) -> String {
    let irregular = [
        ("endpoints", "Endpoints"),
        ("endpointslices", "EndpointSlice"),
        ("nodes", "Node"),
        ("namespaces", "Namespace"),
        ("services", "Service"),
        ("podstatus", "PodStatus"),
        ("nodestatus", "NodeStatus"),
        ("customresourcedefinitions", "CustomResourceDefinition"),
        ("leases", "Leases"),
    ];
    if let Some((_, kind)) = irregular.iter().find(|(r, _)| *r == resource) {
        return (*kind).to_owned();
    }
    let mut kind = String::with_capacity(resource.len());
    let mut chars = resource.chars();
    if let Some(first) = chars.next() {
        kind.extend(first.to_uppercase());
        kind.push_str(chars.as_str());
    }
    if let Some(stem) = kind.strip_suffix("ies") {
        format!("{stem}y")
    } else if let Some(stem) = kind.strip_suffix("ses") {
        format!("{stem}s")
    } else if let Some(stem) = kind.strip_suffix('s') {
        stem.to_owned()
    } else {
        kind
    }
}

/// How a forwarded request reads: a list as the edge's client asked it, a
/// fresh listing of what a watch selects, or that watch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reading {
    /// The client's list: selectors, paging, and the resource version
    /// where it gave one.
    List,
    /// What a watch selects, now (its own resource version, paging and
    /// the initial-events options of a client's watch-list request left
    /// out: the cloud lists afresh and watches from there).
    Listing,
    /// The watch (`watch=true`, with bookmarks; the caller adds the
    /// resource version to resume from).
    Watch,
}

/// The query string of a read with `options` (ListOptions as JSON),
/// URL-encoded. A key that names one object selects it by
/// `metadata.name`.
pub fn list_query(options: &Value, key: &ResourceKey, reading: Reading) -> String {
    let mut query = form_urlencoded::Serializer::new(String::new());
    let mut fields = options["fieldSelector"].as_str().unwrap_or("").to_owned();
    if let Some(name) = &key.name {
        if !fields.is_empty() {
            fields.push(',');
        }
        fields.push_str(&format!("metadata.name={name}"));
    }
    if let Some(labels) = options["labelSelector"].as_str().filter(|s| !s.is_empty()) {
        query.append_pair("labelSelector", labels);
    }
    if !fields.is_empty() {
        query.append_pair("fieldSelector", &fields);
    }
    match reading {
        Reading::Watch => {
            query.append_pair("watch", "true");
            query.append_pair("allowWatchBookmarks", "true");
        }
        Reading::Listing => {}
        Reading::List => {
            let text = |field: &str| options[field].as_str().filter(|s| !s.is_empty());
            // A match without a version is refused by the API server.
            if let Some(version) = text("resourceVersion") {
                query.append_pair("resourceVersion", version);
                if let Some(matching) = text("resourceVersionMatch") {
                    query.append_pair("resourceVersionMatch", matching);
                }
            }
            if let Some(token) = text("continue") {
                query.append_pair("continue", token);
            }
            if let Some(limit) = options["limit"].as_u64().filter(|l| *l > 0) {
                query.append_pair("limit", &limit.to_string());
            }
        }
    }
    query.finish()
}

/// The query string of a write with `options` (CreateOptions,
/// UpdateOptions, PatchOptions as JSON).
pub fn write_query(options: &Value) -> String {
    let mut query = form_urlencoded::Serializer::new(String::new());
    if let Some(manager) = options["fieldManager"].as_str().filter(|s| !s.is_empty()) {
        query.append_pair("fieldManager", manager);
    }
    if let Some(dry_run) = options["dryRun"].as_array() {
        for mode in dry_run.iter().filter_map(Value::as_str) {
            query.append_pair("dryRun", mode);
        }
    }
    if options["force"].as_bool() == Some(true) {
        query.append_pair("force", "true");
    }
    query.finish()
}

/// The content types a patch may have.
pub const PATCH_TYPES: &[&str] = &[
    "application/json-patch+json",
    "application/merge-patch+json",
    "application/strategic-merge-patch+json",
    "application/apply-patch+yaml",
];

/// A KubeEdge PatchInfo (the `Option` of a `patch`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct PatchInfo {
    /// The object patched.
    #[serde(rename = "Name", default)]
    pub name: String,
    /// One of [`PATCH_TYPES`].
    #[serde(rename = "PatchType", default)]
    pub patch_type: String,
    /// The patch.
    #[serde(rename = "Data", default, with = "go_bytes")]
    pub data: Vec<u8>,
    /// PatchOptions.
    #[serde(rename = "Options", default)]
    pub options: Value,
    /// `["status"]`, say.
    #[serde(rename = "Subresources", default)]
    pub subresources: Option<Vec<String>>,
}

/// Rewrites the `default/kubernetes` EndpointSlice (alone, or in a list)
/// to point at the edge's MetaServer, as KubeEdge's cloud does, so
/// in-cluster clients at the edge talk to their node's MetaServer.
pub fn point_at_metaserver(object: &mut Value) {
    let slices = object["kind"].as_str() == Some("EndpointSliceList");
    if let Some(items) = object.get_mut("items").and_then(Value::as_array_mut) {
        for item in items.iter_mut() {
            let slice = slices || item["kind"].as_str() == Some("EndpointSlice");
            rewrite_default_master(item, slice);
        }
        return;
    }
    let slice = object["kind"].as_str() == Some("EndpointSlice");
    rewrite_default_master(object, slice);
}

fn rewrite_default_master(object: &mut Value, is_slice: bool) {
    let metadata = &object["metadata"];
    if !is_slice
        || metadata["name"].as_str() != Some("kubernetes")
        || metadata["namespace"].as_str() != Some("default")
    {
        return;
    }
    // One endpoint, the node's own MetaServer (as KubeEdge keeps the
    // first only).
    if let Some(endpoints) = object.get_mut("endpoints").and_then(Value::as_array_mut) {
        endpoints.truncate(1);
        if let Some(endpoint) = endpoints.first_mut() {
            endpoint["addresses"] = json!([METASERVER_ADDRESS]);
        }
    }
    if let Some(ports) = object.get_mut("ports").and_then(Value::as_array_mut) {
        for port in ports {
            if port["name"].as_str() == Some("https") {
                port["port"] = json!(METASERVER_PORT);
            }
        }
    }
}

#[cfg(test)]
mod tests;
