//! The controller's API side: applies and deletes are written to the
//! desired state and answered once the controller has queued what they mean
//! for the nodes; reads go to the desired state.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use apis::api::ApiError;
use apis::kinds::{Kind, ObjectKey};
use apis::manifest;
use hub::{NodeEvents, NodeLinks};
use tokio::sync::watch;
use tracing::warn;

use super::ControllerCounts;
use super::reconciler::FOLLOWED;
use crate::desired::packed::Packed;
use crate::desired::{DesiredError, DesiredState, Object};

/// What an apply did.
#[derive(Debug, Clone, PartialEq)]
pub enum Applied {
    /// A new object, stored at this revision.
    Created(u64),
    /// A changed object, stored at this revision.
    Configured(u64),
    /// Nothing changed; the revision held.
    Unchanged(u64),
}

impl Applied {
    /// kubectl's word for it.
    pub fn verb(&self) -> &'static str {
        match self {
            Applied::Created(_) => "created",
            Applied::Configured(_) => "configured",
            Applied::Unchanged(_) => "unchanged",
        }
    }
}

/// The revision up to which the controller has handled each kind's
/// changes (sent what they meant to the nodes' queues).
pub type Handled = HashMap<Kind, u64>;

/// A handle to a running controller: applies and deletes go to the
/// desired state and are answered once the controller has queued what they
/// mean for the nodes; reads go to the desired state.
#[derive(Clone)]
pub struct ControllerHandle {
    store: Arc<dyn DesiredState>,
    handled: watch::Receiver<Handled>,
    /// How long an apply waits for the controller to queue its objects.
    wait: Duration,
    /// What the controller has done so far.
    pub counts: watch::Receiver<ControllerCounts>,
    /// Where cloudhub tells the controller of its nodes' links.
    node_events: NodeEvents,
    /// Where the controller hands cloudhub messages for nodes.
    links: NodeLinks,
}

/// An object checked for an apply, packed until it is written
/// ([`ControllerHandle::admit`]).
#[derive(Debug)]
pub struct Admitted {
    key: ObjectKey,
    packed: Packed,
}

/// How often an apply writes a spec again over a status written meanwhile.
const APPLY_ATTEMPTS: usize = 5;

fn refused(err: DesiredError) -> ApiError {
    match err {
        DesiredError::NotFound { key } => {
            ApiError::Conflict(format!("{key} was deleted meanwhile"))
        }
        DesiredError::AlreadyExists { key } => {
            ApiError::Conflict(format!("{key} was created meanwhile"))
        }
        DesiredError::Conflict { key, reason } => ApiError::Conflict(format!("{key}: {reason}")),
        DesiredError::Invalid { reason, .. } => ApiError::Invalid(reason),
        other => ApiError::Unavailable(other.to_string()),
    }
}

impl ControllerHandle {
    /// The handle of a controller just started (by [`super::EdgeController::start`]).
    pub(super) fn new(
        store: Arc<dyn DesiredState>,
        handled: watch::Receiver<Handled>,
        wait: Duration,
        counts: watch::Receiver<ControllerCounts>,
        node_events: NodeEvents,
        links: NodeLinks,
    ) -> ControllerHandle {
        ControllerHandle {
            store,
            handled,
            wait,
            counts,
            node_events,
            links,
        }
    }

    /// The channel the controller hears cloudhub's node events on: give it
    /// to cloudhub ([`hub::CloudHubConfig::node_events`]).
    pub fn node_events(&self) -> NodeEvents {
        self.node_events.clone()
    }

    /// The channel the controller (and whoever answers nodes beside it,
    /// as the application center) hands cloudhub messages for nodes on:
    /// give it to cloudhub ([`hub::CloudHubConfig::links`]).
    pub fn node_links(&self) -> NodeLinks {
        self.links.clone()
    }

    /// Creates or replaces objects (status is the nodes' to set and is
    /// kept), as `kubectl apply` does, and answers once the controller has
    /// queued each for the nodes it goes to. Every object is checked first,
    /// against its kind and, for kinds bound to a node, against the node
    /// it is stored with; if one fails, none is applied.
    pub async fn apply(&self, objects: Vec<Object>) -> Result<Vec<(ObjectKey, Applied)>, ApiError> {
        let mut admitted = Vec::with_capacity(objects.len());
        for object in objects {
            let object = manifest::check(object.into_json())?;
            admitted.push(self.admit(object)?);
        }
        self.apply_admitted(admitted).await
    }

    /// Checks `object` (as [`manifest::check`] gave it) against
    /// what is stored where that decides something (a pod's or a device's
    /// node is immutable), and packs it until it is written: thousands of
    /// objects in one manifest are not held as trees while they wait.
    pub fn admit(&self, object: Object) -> Result<Admitted, ApiError> {
        let key = object.key().clone();
        // Read only where it decides something: an unchanged re-apply of
        // thousands of configmaps is otherwise one more read of each.
        if key.kind.bound_to_node()
            && let Some(stored) = self.store.get(&key).map_err(refused)?
            && let Some(bound) = stored.node_name()
            && object.node_name() != Some(bound)
        {
            return Err(ApiError::Invalid(format!(
                "{key}: spec.nodeName is immutable once set (bound to {bound})"
            )));
        }
        let packed = Packed::pack(&object).map_err(refused)?;
        Ok(Admitted { key, packed })
    }

    /// [`apply`](Self::apply) of objects already admitted: all of them, or
    /// none if one was refused on the way (the first refusal).
    pub async fn apply_admitted(
        &self,
        checked: Vec<Admitted>,
    ) -> Result<Vec<(ObjectKey, Applied)>, ApiError> {
        let mut applied = Vec::with_capacity(checked.len());
        let mut written = Vec::new();
        for Admitted { key, packed } in checked {
            let mut object = packed.unpack().map_err(refused)?;
            let stored = match self.store.get(&key).map_err(refused)? {
                None => {
                    let created = self.store.create(object).await.map_err(refused)?;
                    (Applied::Created(created.revision()), created)
                }
                Some(old) => {
                    // Written only over what was read; a node's status
                    // written meanwhile makes a conflict, and the spec is
                    // written again over what is stored now.
                    let mut held = old.revision();
                    drop(old);
                    let mut attempts = 0;
                    let stored = loop {
                        object.set_revision(held);
                        match self.store.replace(object.clone()).await {
                            Err(DesiredError::Conflict { .. }) if attempts < APPLY_ATTEMPTS => {
                                attempts += 1;
                                match self.store.get(&key).map_err(refused)? {
                                    Some(now) => held = now.revision(),
                                    None => {
                                        return Err(ApiError::Conflict(format!(
                                            "{key} was deleted meanwhile"
                                        )));
                                    }
                                }
                            }
                            written => break written.map_err(refused)?,
                        }
                    };
                    let revision = stored.revision();
                    match revision == held {
                        true => (Applied::Unchanged(revision), stored),
                        false => (Applied::Configured(revision), stored),
                    }
                }
            };
            let (outcome, stored) = stored;
            // Waited for only where the controller hears of it: a kind it
            // follows, and an object its desired state passes on (in
            // Kubernetes mode, not a pod on a node that is no edge node).
            if let Applied::Created(revision) | Applied::Configured(revision) = outcome
                && FOLLOWED.contains(&key.kind)
                && self.store.passes_on(&stored)
            {
                written.push((key.kind, revision));
            }
            applied.push((key, outcome));
        }
        self.handled(written).await?;
        Ok(applied)
    }

    /// Deletes an object; `None` if there was none. Answered once the
    /// controller has queued the deletion for the nodes that hold it.
    pub async fn delete(&self, key: ObjectKey) -> Result<Option<Object>, ApiError> {
        let removed = self.store.delete(&key).await.map_err(refused)?;
        if let Some(removed) = &removed
            && FOLLOWED.contains(&key.kind)
            && self.store.passes_on(removed)
        {
            self.handled(vec![(key.kind, removed.revision())]).await?;
        }
        Ok(removed)
    }

    /// Waits until the controller has handled every `(kind, revision)`;
    /// an error if it stopped first (the writes are stored, and reach
    /// their nodes when they link to a running cloud, but were not queued:
    /// never answered as if they were).
    async fn handled(&self, written: Vec<(Kind, u64)>) -> Result<(), ApiError> {
        if written.is_empty() {
            return Ok(());
        }
        let mut handled = self.handled.clone();
        let done = handled.wait_for(|handled| {
            written
                .iter()
                .all(|(kind, revision)| handled.get(kind).is_some_and(|h| h >= revision))
        });
        match tokio::time::timeout(self.wait, done).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(_)) => {
                warn!("the edgecontroller stopped before queueing a write");
                Err(ApiError::Unavailable(
                    "the cloud is stopping: stored, but not queued for its node; it is sent when the node links to a running cloud".to_owned(),
                ))
            }
            Err(_) => {
                warn!(
                    wait = ?self.wait,
                    "the edgecontroller has not yet queued a write; answered anyway"
                );
                Ok(())
            }
        }
    }

    /// The desired state, for reads.
    pub fn store(&self) -> &Arc<dyn DesiredState> {
        &self.store
    }
}
