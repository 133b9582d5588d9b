//! The beehive message: header, router and content, as in KubeEdge's `model.Message`.

use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize, de::DeserializeOwned};
use smol_str::SmolStr;
use uuid::Uuid;

use crate::constants::operation;
use crate::content::Content;

/// Errors from building, reading or (de)serialising a [`Message`].
#[derive(Debug, thiserror::Error)]
pub enum MessageError {
    /// The body does not read as the requested type.
    #[error("message body does not fit the requested type: {0}")]
    Read(String),
    /// The message could not be encoded as MessagePack.
    #[error("message could not be encoded: {0}")]
    Encode(#[source] rmp_serde::encode::Error),
    /// The bytes are not a MessagePack-encoded message.
    #[error("bytes are not a valid message: {0}")]
    Decode(#[source] rmp_serde::decode::Error),
}

/// Message metadata: identity, correlation and versioning.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Header {
    /// Unique id of this message.
    pub id: Uuid,
    /// For a response: the id of the request it answers.
    #[serde(default)]
    pub parent_id: Option<Uuid>,
    /// Creation time, milliseconds since the Unix epoch.
    pub timestamp: i64,
    /// Kubernetes resource version of the object carried, if any.
    #[serde(default)]
    pub resource_version: String,
    /// Whether the sender waits for a response (`send_sync`).
    #[serde(default)]
    pub sync: bool,
}

/// Where a message comes from, where it goes and what it does.
///
/// The five names are [`SmolStr`]s: a module's or group's name, an
/// operation and most resources fit in 23 bytes and are kept inline, so
/// building, cloning and answering a message allocates nothing for its
/// route (a route of `String`s took four allocations per fresh message,
/// a third of what a send costs). Longer resources share one allocation
/// between clones.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Router {
    /// The module that sent it.
    pub source: SmolStr,
    /// The module it is addressed to (empty when sent to a group).
    #[serde(default)]
    pub destination: SmolStr,
    /// The group it is routed by (e.g. `meta`, `twin`, `resource`).
    pub group: SmolStr,
    /// What to do: `insert`, `update`, `delete`, `query`, `response`, ...
    pub operation: SmolStr,
    /// What it is about: `<ns>/<type>/<name>` on the edge,
    /// `node/<node>/<ns>/<type>/<name>` on the cloud.
    pub resource: SmolStr,
}

/// What a route's names are made from, without a copy where none is
/// needed: a `&'static str` (the constants modules, groups and operations
/// are named by) is kept as a pointer, and a [`SmolStr`] (a name read off
/// another message) is shared. Owned text up to 23 bytes is kept inline;
/// longer text is copied once into an allocation its clones then share
/// (a `String`'s buffer cannot be taken over). Borrowed text of a shorter
/// life is copied by saying so, `SmolStr::new(text)`, or as a `&String`.
pub trait IntoRouteName {
    /// The name as a route keeps it.
    fn into_route_name(self) -> SmolStr;
}

impl IntoRouteName for &'static str {
    fn into_route_name(self) -> SmolStr {
        SmolStr::new_static(self)
    }
}

impl IntoRouteName for String {
    fn into_route_name(self) -> SmolStr {
        SmolStr::from(self)
    }
}

impl IntoRouteName for SmolStr {
    fn into_route_name(self) -> SmolStr {
        self
    }
}

impl IntoRouteName for &SmolStr {
    fn into_route_name(self) -> SmolStr {
        self.clone()
    }
}

impl IntoRouteName for &String {
    fn into_route_name(self) -> SmolStr {
        SmolStr::new(self)
    }
}

/// Why a request was not done, as an `error` response says it: the one
/// shape of a failure between modules ([`Message::failed`] writes it,
/// [`Message::failure`] reads it).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{reason}")]
pub struct Failure {
    /// What went wrong, for people and logs.
    pub reason: String,
    /// Whether the request may succeed if made again (a store that failed
    /// to commit), unlike a refusal, which is final.
    pub retryable: bool,
}

impl Failure {
    /// A final refusal: asking again cannot help.
    pub fn refused(reason: impl Into<String>) -> Failure {
        Failure {
            reason: reason.into(),
            retryable: false,
        }
    }

    /// A failure the same request may not meet again.
    pub fn retryable(reason: impl Into<String>) -> Failure {
        Failure {
            reason: reason.into(),
            retryable: true,
        }
    }
}

/// One beehive message. Its content is a [`Content`]: nothing, text, or an
/// encoded document the reading module decodes into its own type.
///
/// ```
/// use beehive::{Message, constants::{operation, group}};
///
/// let request = Message::new()
///     .build_router("edged", group::META, "default/pod/nginx", operation::QUERY)
///     .fill_body(&serde_json::json!({"watch": false}))
///     .unwrap();
/// let response = request.response("metamanager", "OK");
/// assert_eq!(response.parent_id(), Some(request.id()));
/// assert_eq!(response.operation(), operation::RESPONSE);
///
/// let bytes = request.to_bytes().unwrap();
/// assert_eq!(beehive::Message::from_bytes(&bytes).unwrap(), request);
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Message {
    /// Identity, correlation and version.
    pub header: Header,
    /// Source, destination, group, operation, resource.
    pub router: Router,
    /// The body.
    #[serde(default)]
    pub content: Content,
}

impl Default for Message {
    fn default() -> Self {
        Self::new()
    }
}

/// Milliseconds since the Unix epoch; a clock before 1970 reads as 0.
///
/// Seconds times 1,000 plus the milliseconds of the second: the same value
/// as `Duration::as_millis`, without its 128-bit arithmetic (every message
/// reads the clock).
#[inline]
pub fn now_millis() -> i64 {
    match SystemTime::now().duration_since(UNIX_EPOCH) {
        Ok(since) => i64::try_from(since.as_secs()).map_or(i64::MAX, |secs| {
            secs.saturating_mul(1000)
                .saturating_add(i64::from(since.subsec_millis()))
        }),
        Err(_) => 0,
    }
}

/// Fresh message ids: random (version 4) UUIDs, drawn from the same
/// generator as `Uuid::new_v4` (the thread's ChaCha12 generator, seeded
/// and reseeded from the operating system), a batch at a time.
///
/// `Uuid::new_v4` asks that generator for 16 bytes per id, which cost as
/// much as the rest of building a message; one call for `IDS` ids shares
/// that cost. Each id still has 122 bits from a cryptographically secure
/// generator and the version and variant bits of `new_v4`, so ids stay
/// unique and unguessable (a peer cannot forge the answer to a request it
/// was not sent). The batch waiting in a thread is as much state as the
/// generator's own buffer already holds.
mod ids {
    use std::cell::RefCell;

    use uuid::{Builder, Uuid};

    /// Ids drawn at a time.
    const IDS: usize = 32;

    struct Batch {
        ids: [u128; IDS],
        next: usize,
    }

    // A fork without exec copies the batch (and rand's ThreadRng, which
    // is not reseeded on fork): the child must not build messages before
    // its batch is refreshed, or it repeats the parent's ids. Checking
    // std::process::id() here cost 11 more instructions per message under
    // callgrind, and a getpid system call, so it is not checked.
    thread_local! {
        static BATCH: RefCell<Batch> = const {
            RefCell::new(Batch { ids: [0; IDS], next: IDS })
        };
    }

    /// A fresh random (version 4) UUID. Not inlined, so that the thread
    /// local is reached directly here rather than through its accessor in
    /// every crate that builds messages.
    #[inline(never)]
    pub(super) fn uuid() -> Uuid {
        BATCH.with(|batch| {
            let mut batch = batch.borrow_mut();
            if batch.next == IDS {
                rand::fill(&mut batch.ids);
                batch.next = 0;
            }
            let random = batch.ids[batch.next];
            batch.next += 1;
            Builder::from_random_bytes(random.to_le_bytes()).into_uuid()
        })
    }
}

/// A retryable failure as it is written.
#[derive(Serialize)]
struct RetryableBody<'a> {
    reason: &'a str,
    retryable: bool,
}

/// A failure as it is read; `retryable` counts only as the flag `true`,
/// whatever else a peer wrote there or beside it.
#[derive(Deserialize)]
struct FailureBody {
    reason: String,
    #[serde(default, deserialize_with = "flag_true")]
    retryable: bool,
}

fn flag_true<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<bool, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Flag {
        Bool(bool),
        Other(serde::de::IgnoredAny),
    }
    Ok(matches!(Flag::deserialize(deserializer)?, Flag::Bool(true)))
}

impl Message {
    /// A new message with a fresh id, the current time and no route or body
    /// (KubeEdge's `NewMessage("")`).
    #[inline]
    pub fn new() -> Self {
        Message {
            header: Header {
                id: ids::uuid(),
                parent_id: None,
                timestamp: now_millis(),
                resource_version: String::new(),
                sync: false,
            },
            router: Router::default(),
            content: Content::Empty,
        }
    }

    /// Sets source, group, resource and operation (KubeEdge's `BuildRouter`).
    #[inline]
    pub fn build_router(
        mut self,
        source: impl IntoRouteName,
        group: impl IntoRouteName,
        resource: impl IntoRouteName,
        operation: impl IntoRouteName,
    ) -> Self {
        self.router.source = source.into_route_name();
        self.router.group = group.into_route_name();
        self.router.resource = resource.into_route_name();
        self.router.operation = operation.into_route_name();
        self
    }

    /// Sets the destination module.
    pub fn with_destination(mut self, destination: impl IntoRouteName) -> Self {
        self.router.destination = destination.into_route_name();
        self
    }

    /// Sets the resource version of the carried object.
    pub fn with_resource_version(mut self, version: impl Into<String>) -> Self {
        self.header.resource_version = version.into();
        self
    }

    /// Sets the parent id (the request this message answers).
    pub fn with_parent(mut self, parent: Uuid) -> Self {
        self.header.parent_id = Some(parent);
        self
    }

    /// Sets the content.
    pub fn with_content(mut self, content: impl Into<Content>) -> Self {
        self.content = content.into();
        self
    }

    /// Encodes `body` into the content (KubeEdge's `FillBody`).
    pub fn fill_body<T: Serialize + ?Sized>(mut self, body: &T) -> Result<Self, MessageError> {
        self.content = Content::of(body)?;
        Ok(self)
    }

    /// Reads the content as `T`.
    pub fn body<T: DeserializeOwned>(&self) -> Result<T, MessageError> {
        self.content.decode()
    }

    /// A response to this message (KubeEdge's `NewRespByMessage`): fresh id,
    /// `parent_id` = this id, operation `response`, same resource and group,
    /// addressed back to this message's source.
    pub fn response(&self, source: impl IntoRouteName, content: impl Into<Content>) -> Message {
        let mut resp = Message::new()
            .build_router(
                source,
                self.router.group.clone(),
                self.router.resource.clone(),
                operation::RESPONSE,
            )
            .with_destination(self.router.source.clone())
            .with_parent(self.header.id)
            .with_content(content);
        resp.header.resource_version = self.header.resource_version.clone();
        resp
    }

    /// The error response to this message saying `failure`: like
    /// [`Message::response`], with operation `error`. A final refusal's
    /// content is its reason as a string (KubeEdge's form); a retryable
    /// failure's is `{"reason": ..., "retryable": true}`. Read back with
    /// [`Message::failure`].
    pub fn failed(&self, source: impl IntoRouteName, failure: Failure) -> Message {
        let content = match failure.retryable {
            false => Content::Text(failure.reason),
            true => Content::of(&RetryableBody {
                reason: &failure.reason,
                retryable: true,
            })
            .expect("a string and a flag encode"),
        };
        let mut resp = self.response(source, content);
        resp.router.operation = SmolStr::new_static(operation::ERROR);
        resp
    }

    /// A final refusal of this message: [`Message::failed`] with
    /// [`Failure::refused`].
    pub fn error_response(&self, source: impl IntoRouteName, reason: impl Into<String>) -> Message {
        self.failed(source, Failure::refused(reason))
    }

    /// A failure that may not happen again (a store that failed to
    /// commit, say): [`Message::failed`] with [`Failure::retryable`].
    pub fn retryable_error(
        &self,
        source: impl IntoRouteName,
        reason: impl Into<String>,
    ) -> Message {
        self.failed(source, Failure::retryable(reason))
    }

    /// Why the request this message answers was not done, if it is an
    /// error response; the one reader of the forms [`Message::failed`]
    /// writes (and of a KubeEdge peer's: a string, or any JSON, read as
    /// its text).
    pub fn failure(&self) -> Option<Failure> {
        if !self.is_failure() {
            return None;
        }
        Some(match &self.content {
            Content::Empty => Failure::refused(""),
            Content::Text(reason) => Failure::refused(reason.clone()),
            Content::Document(document) => match document
                .is_map()
                .then(|| document.decode::<FailureBody>())
                .and_then(Result::ok)
            {
                Some(body) => Failure {
                    reason: body.reason,
                    retryable: body.retryable,
                },
                None => Failure::refused(self.content.to_json()),
            },
        })
    }

    /// Whether this is an error response (what [`Message::failure`] reads),
    /// without reading its reason.
    pub fn is_failure(&self) -> bool {
        self.operation() == operation::ERROR
    }

    /// This answer, or why the request it answers was not done.
    pub fn into_answer(self) -> Result<Message, Failure> {
        match self.failure() {
            Some(failure) => Err(failure),
            None => Ok(self),
        }
    }

    /// Whether this is an error response saying the request may be made
    /// again.
    pub fn is_retryable(&self) -> bool {
        self.failure().is_some_and(|failure| failure.retryable)
    }

    /// This message's id.
    pub fn id(&self) -> Uuid {
        self.header.id
    }
    /// The id of the request this message answers, if it is a response.
    pub fn parent_id(&self) -> Option<Uuid> {
        self.header.parent_id
    }
    /// Creation time in milliseconds since the Unix epoch.
    pub fn timestamp(&self) -> i64 {
        self.header.timestamp
    }
    /// Resource version of the carried object (empty if none).
    pub fn resource_version(&self) -> &str {
        &self.header.resource_version
    }
    /// Whether the sender waits for a response.
    pub fn is_sync(&self) -> bool {
        self.header.sync
    }
    /// The sending module.
    pub fn source(&self) -> &str {
        &self.router.source
    }
    /// The destination module.
    pub fn destination(&self) -> &str {
        &self.router.destination
    }
    /// The routing group.
    pub fn group(&self) -> &str {
        &self.router.group
    }
    /// The operation.
    pub fn operation(&self) -> &str {
        &self.router.operation
    }
    /// The resource string.
    pub fn resource(&self) -> &str {
        &self.router.resource
    }
    /// The content.
    pub fn content(&self) -> &Content {
        &self.content
    }

    /// Encodes as MessagePack with named fields (the wire form).
    pub fn to_bytes(&self) -> Result<Vec<u8>, MessageError> {
        // Header and route alone take about 100 bytes: starting at 256
        // spares small messages the reallocations of a growing buffer
        // (a 256 B message took 520-550 ns to encode, 250-440 ns now).
        let mut bytes = Vec::with_capacity(256 + self.content.len());
        // The map rmp-serde writes for this struct with named fields, with
        // the content's encoding appended as it is held rather than read
        // and written again: the same bytes, one pass less.
        let written = |err| MessageError::Encode(rmp_serde::encode::Error::InvalidValueWrite(err));
        rmp::encode::write_map_len(&mut bytes, 3).map_err(written)?;
        rmp::encode::write_str(&mut bytes, "header").map_err(written)?;
        rmp_serde::encode::write_named(&mut bytes, &self.header).map_err(MessageError::Encode)?;
        rmp::encode::write_str(&mut bytes, "router").map_err(written)?;
        rmp_serde::encode::write_named(&mut bytes, &self.router).map_err(MessageError::Encode)?;
        rmp::encode::write_str(&mut bytes, "content").map_err(written)?;
        self.content.append_msgpack(&mut bytes).map_err(written)?;
        Ok(bytes)
    }

    /// Decodes the wire form.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, MessageError> {
        rmp_serde::from_slice(bytes).map_err(MessageError::Decode)
    }
}

#[cfg(test)]
mod tests;
