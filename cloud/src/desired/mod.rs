//! The cloud's desired state, behind [`DesiredState`]: the boundary the
//! edgecontroller is written against, shaped after what a Kubernetes API
//! server offers.
//!
//! - **List and watch with resource versions.** [`DesiredState::list`]
//!   answers with the revision the list is current at;
//!   [`DesiredState::watch`] streams every change of a kind after a
//!   revision, or fails with [`DesiredError::Gone`] when that revision is
//!   too old to resume from, and the watcher lists again.
//! - **Writes with optimistic concurrency.** An object given to
//!   [`DesiredState::replace`] or [`DesiredState::replace_status`] with a
//!   `metadata.resourceVersion` is written only if that is still the stored
//!   one ([`DesiredError::Conflict`] otherwise); without one, the write is
//!   unconditional.
//! - **Status through its own door.** [`DesiredState::replace`] keeps the
//!   stored status; [`DesiredState::replace_status`] changes only the
//!   status. Users own specs, nodes own status.
//!
//! Revisions only grow, across every kind: the edge compares them to tell
//! a newer object from a stale one (as KubeEdge's edge parses resource
//! versions as integers).
//!
//! Reads ([`DesiredState::get`], [`DesiredState::list`]) come from the
//! backend's local view and never wait on the network: the embedded
//! backend's database, or a Kubernetes backend's watch caches.
//!
//! The embedded backend is [`EmbeddedStore`] (redb). It behaves like
//! kube-apiserver for everything an edge sees, filling in the API server's
//! defaults ([`apis::defaults`]).

#[cfg(feature = "kubernetes")]
pub mod api_requests;
pub mod embedded;
#[cfg(feature = "etcd")]
pub mod etcd;
pub mod feed;
#[cfg(feature = "kubernetes")]
pub mod kubernetes;
pub mod packed;

use futures_util::future::BoxFuture;
use futures_util::stream::BoxStream;
use serde_json::Value;

use apis::kinds::{Kind, ObjectKey};
pub use apis::object::{Object, revision_of};

pub use embedded::EmbeddedStore;
#[cfg(feature = "etcd")]
pub use etcd::{CatchUp, EtcdConfig, EtcdStore, FenceHold, FenceOf};
#[cfg(feature = "kubernetes")]
pub use kubernetes::{KubeAccess, KubernetesConfig, KubernetesStore};

/// The label that marks a node as an edge node (cloudcore puts it on the
/// Nodes it creates; the Kubernetes backend watches the nodes that carry
/// it).
pub const EDGE_NODE_LABEL: &str = "node-role.kubernetes.io/edge";

/// A failure of the desired state, in the terms of a Kubernetes API server.
#[derive(Debug, Clone, thiserror::Error)]
pub enum DesiredError {
    /// No such object.
    #[error("{key} not found")]
    NotFound {
        /// Which object.
        key: String,
    },
    /// A create found the object already there.
    #[error("{key} already exists")]
    AlreadyExists {
        /// Which object.
        key: String,
    },
    /// A write's precondition failed: the object changed since it was read.
    #[error("conflict on {key}: {reason}")]
    Conflict {
        /// Which object.
        key: String,
        /// What differed.
        reason: String,
    },
    /// The write breaks a rule of the kind (an immutable field, say).
    #[error("{key} is invalid: {reason}")]
    Invalid {
        /// Which object.
        key: String,
        /// Why.
        reason: String,
    },
    /// A watch cannot resume from so old a revision: list again.
    #[error("revision {since} is too old to watch from; list again")]
    Gone {
        /// The revision asked for.
        since: u64,
    },
    /// This backend cannot do that at all (the embedded one issues no
    /// service account tokens).
    #[error("not supported by this desired state: {0}")]
    Unsupported(String),
    /// The backend failed.
    #[error("desired-state store: {0}")]
    Backend(String),
    /// A stored object could not be read back.
    #[error("desired-state object {key} unreadable: {reason}")]
    Corrupt {
        /// Which object.
        key: String,
        /// Why.
        reason: String,
    },
    /// The store has stopped.
    #[error("desired-state store stopped")]
    Stopped,
    /// The API server asked to slow down (429: priority and fairness
    /// rejected the request, or a rate limit), after the client's own
    /// retries.
    #[error("too many requests (429); retry after {retry_after:?}")]
    TooManyRequests {
        /// How long the server asked to wait, where it said.
        retry_after: Option<std::time::Duration>,
    },
}

/// What a desired-state call completes with.
pub type StoreFuture<T> = BoxFuture<'static, Result<T, DesiredError>>;

/// One change of one object, as a watch streams it. The object carries the
/// change's revision as its `metadata.resourceVersion` (a deleted object
/// that of its deletion).
#[derive(Debug, Clone, PartialEq)]
pub enum WatchEvent {
    /// The object was created.
    Added(Object),
    /// The object was changed.
    Modified(Object),
    /// The object was removed; this is its last state.
    Deleted(Object),
}

impl WatchEvent {
    /// The object the event is about.
    pub fn object(&self) -> &Object {
        match self {
            WatchEvent::Added(object)
            | WatchEvent::Modified(object)
            | WatchEvent::Deleted(object) => object,
        }
    }

    /// The object the event is about, given up.
    pub fn into_object(self) -> Object {
        match self {
            WatchEvent::Added(object)
            | WatchEvent::Modified(object)
            | WatchEvent::Deleted(object) => object,
        }
    }

    /// The revision of the change.
    pub fn revision(&self) -> u64 {
        self.object().revision()
    }
}

/// Changes of one kind, in revision order.
pub type WatchStream = BoxStream<'static, Result<WatchEvent, DesiredError>>;

/// Desired state: Kubernetes objects ([`Object`]s) with revisions, listed
/// and watched per kind.
pub trait DesiredState: Send + Sync + 'static {
    /// The object at `key`, from the backend's local view.
    fn get(&self, key: &ObjectKey) -> Result<Option<Object>, DesiredError>;

    /// The objects of `kind`, in `namespace` or in all, handed to `visit`
    /// one at a time without gathering them first (a backend that keeps
    /// them packed, or on disk, decodes one at a time); the revision the
    /// list is current at (a watch from it misses nothing).
    fn list_each(
        &self,
        kind: Kind,
        namespace: Option<&str>,
        visit: &mut dyn FnMut(Object),
    ) -> Result<u64, DesiredError>;

    /// The same objects as [`list_each`](Self::list_each), gathered.
    fn list(
        &self,
        kind: Kind,
        namespace: Option<&str>,
    ) -> Result<(Vec<Object>, u64), DesiredError> {
        let mut objects = Vec::new();
        let revision = self.list_each(kind, namespace, &mut |object| objects.push(object))?;
        Ok((objects, revision))
    }

    /// Every change of `kind` after revision `since`, in order; fails with
    /// [`DesiredError::Gone`] (now or later, in the stream) once `since` is
    /// too old, after which the watcher lists again.
    fn watch(&self, kind: Kind, since: u64) -> Result<WatchStream, DesiredError>;

    /// Creates `object` (filling in the defaults, uid and creation time an
    /// API server fills in); the object as stored.
    fn create(&self, object: Object) -> StoreFuture<Object>;

    /// Replaces the spec (everything but status) of an existing object,
    /// under the precondition described in the module docs; the object as
    /// stored.
    fn replace(&self, object: Object) -> StoreFuture<Object>;

    /// Replaces the status of an existing object, under the same
    /// precondition; the object as stored.
    fn replace_status(&self, object: Object) -> StoreFuture<Object>;

    /// Removes the object at `key`; its last state with the revision of the
    /// removal, or `None` if there was none.
    fn delete(&self, key: &ObjectKey) -> StoreFuture<Option<Object>>;

    /// A revision above every one issued so far, without writing an object
    /// (for messages that must supersede whatever a node holds, such as a
    /// withdrawal).
    fn next_revision(&self) -> StoreFuture<u64>;

    /// Removes `key` for good once its node has stopped it (a graceful
    /// deletion, the kubelet's last step), if its uid is still `uid`.
    /// Backends that delete at once (the embedded one) have nothing to do.
    fn finish_deletion(&self, key: &ObjectKey, uid: Option<&str>) -> StoreFuture<()> {
        let _ = (key, uid);
        Box::pin(async { Ok(()) })
    }

    /// Issues a token of `service_account` in `namespace` for the pod
    /// `pod` (name, uid), as the API server's TokenRequest does: the
    /// TokenRequest's status (`token`, `expirationTimestamp`). Backends
    /// with no token issuer (the embedded one) refuse.
    fn request_token(
        &self,
        request: TokenRequest,
    ) -> StoreFuture<apis::tokens::TokenRequestStatus> {
        let _ = request;
        Box::pin(async {
            Err(DesiredError::Unsupported(
                "service account tokens (no API server issues them)".to_owned(),
            ))
        })
    }

    /// Whether a change of `object` reaches this store's watches (a
    /// Kubernetes backend passes on only pods bound to edge nodes).
    fn passes_on(&self, object: &Object) -> bool {
        let _ = object;
        true
    }

    /// Whether writes here spend an API server's request budget (its
    /// priority and fairness shares seats among every client of a flow),
    /// so the controller paces its status writes as a kubelet paces its
    /// own. A local store takes them as fast as they come.
    fn shares_request_budget(&self) -> bool {
        false
    }

    /// Whether something evicts pods from NotReady nodes here (Kubernetes'
    /// taint manager does; the embedded store has nothing that would).
    fn evicts(&self) -> bool {
        false
    }

    /// Renews `node`'s heartbeat Lease (in `kube-node-lease`, as a kubelet
    /// does), valid for `duration`, while its link is up. Backends with no
    /// leases (the embedded one: its nodes' readiness is their link) do
    /// nothing.
    fn renew_lease(&self, node: &str, duration: std::time::Duration) -> StoreFuture<()> {
        let _ = (node, duration);
        Box::pin(async { Ok(()) })
    }
}

/// A token asked for a pod (the edge's question, as the API server's
/// TokenRequest takes it): the type both halves share.
pub use apis::tokens::TokenRequest;

/// A revision from the clock: the time in microseconds. It starts a new
/// embedded store above what any earlier one issued, and versions the
/// tokens the controller sends, each renewal above the last.
pub fn clock_revision() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| {
            u64::try_from(since.as_micros()).unwrap_or(u64::MAX / 2)
        })
}

/// The node a pod or device is bound to (`spec.nodeName`), if any.
pub fn bound_node(object: &Value) -> Option<&str> {
    object
        .pointer("/spec/nodeName")
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty())
}

/// `body` as a backend read it back or is about to hand it out: an object
/// that names no object of a known kind is corrupt.
pub(crate) fn object_of(body: serde_json::Value) -> Result<Object, DesiredError> {
    Object::new(body).map_err(|err| DesiredError::Corrupt {
        key: "(unnamed)".to_owned(),
        reason: err.to_string(),
    })
}

/// A minimal object naming `key`, for a withdrawal or deletion whose
/// object is gone.
pub fn stub(key: &ObjectKey) -> Object {
    Object::stub(key)
}

/// A digest of the part of `object` a user sets ([`desired_body`]): two
/// objects with equal digests need not be sent to a node again.
pub fn spec_digest(object: &Object) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    desired_body(object.json()).to_string().hash(&mut hasher);
    hasher.finish()
}

/// The part of an object's body a user sets: everything but status and
/// the metadata the system manages. Two objects with equal desired parts
/// need not be sent to a node again.
pub(crate) fn desired_body(object: &Value) -> Value {
    let mut object = object.clone();
    if let Some(map) = object.as_object_mut() {
        map.remove("status");
        if let Some(metadata) = map.get_mut("metadata").and_then(Value::as_object_mut) {
            if let Some(annotations) = metadata
                .get_mut("annotations")
                .and_then(Value::as_object_mut)
            {
                annotations.remove(SPEC_REVISION);
            }
            if metadata
                .get("annotations")
                .and_then(Value::as_object)
                .is_some_and(|a| a.is_empty())
            {
                metadata.remove("annotations");
            }
            for managed in [
                "resourceVersion",
                "uid",
                "creationTimestamp",
                "generation",
                "managedFields",
                "selfLink",
            ] {
                metadata.remove(managed);
            }
        }
    }
    object
}

/// Annotation the embedded backend keeps, across status writes (which give
/// the object new revisions), with the revision of the last spec write:
/// the version its node holds, so a restarted cloud knows it.
pub const SPEC_REVISION: &str = "edgehive.io/spec-revision";

/// The revision of `object`'s last spec write, where the backend records
/// it, else its own revision.
pub fn spec_revision(object: &Object) -> u64 {
    spec_revision_of(object.json())
}

/// [`spec_revision`] of an object's body.
pub(crate) fn spec_revision_of(object: &Value) -> u64 {
    object
        .pointer("/metadata/annotations")
        .and_then(|a| a.get(SPEC_REVISION))
        .and_then(Value::as_str)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| revision_of(object))
}
