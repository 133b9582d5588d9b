//! metamanager: the edge module that keeps every object the edge holds.
//!
//! Objects from the cloud (insert, update, patch, delete) are persisted,
//! confirmed to the requester only after the commit (edgehub acknowledges
//! to the cloud on that confirmation), and then passed to the module that
//! acts on them (edged for pods and their objects, twin for devices). A
//! stale version is confirmed and otherwise ignored, so a resent object is
//! applied once. Queries from edge modules are answered from the store,
//! with the cloud reachable or not: that is edge autonomy. Status reports
//! from edge modules are stored and sent up through edgehub.
//!
//! The cloud's inventory question carries its [`Watermark`] (up to which
//! revision it has handled each type's changes); once answered, the
//! tombstones it covers are pruned in the background, in small batches
//! between writes (see [`crate::tombstones`]).

use actix::prelude::*;
use beehive::IntoRouteName as _;
use beehive::constants::{group, module, operation, resource_type};
use beehive::resource::EdgeResource;
use beehive::{Content, Hive, Message as HiveMessage, Module, ModuleError};
use tokio::sync::mpsc;
use tracing::{debug, warn};

use crate::store::{Committed, EdgeStore, Record, StoreError, WriteOutcome};
use crate::tombstones::Watermark;

/// A write on its way to the store, with what to do once it is committed.
type Written = (HiveMessage, EdgeResource, Committed);

/// The metamanager module.
pub struct MetaManager {
    hive: Hive,
    store: EdgeStore,
    /// Writes in submission order, confirmed and passed on in that order.
    written: Option<mpsc::UnboundedSender<Written>>,
    /// The last version given to a status report.
    last_status_version: u64,
    /// A tombstone sweep is running.
    pruning: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl MetaManager {
    /// Starts metamanager in `hive` on `store`.
    pub fn start(hive: &Hive, store: EdgeStore) -> Result<beehive::StartOutcome, beehive::Error> {
        hive.start_module(move |hive| MetaManager {
            hive: hive.clone(),
            store: store.clone(),
            written: None,
            last_status_version: 0,
            pruning: Default::default(),
        })
    }
}

/// The group of the module that acts on objects of `kind`, if any.
pub fn acting_group(kind: &str) -> Option<&'static str> {
    match kind {
        resource_type::POD
        | resource_type::CONFIGMAP
        | resource_type::SECRET
        | resource_type::SERVICE_ACCOUNT_TOKEN
        | resource_type::SERVICE
        | resource_type::ENDPOINTS
        | resource_type::NODE => Some(group::EDGED),
        resource_type::DEVICE
        | resource_type::DEVICE_MODEL
        | resource_type::TWIN
        | resource_type::MEMBERSHIP => Some(group::TWIN),
        _ => None,
    }
}

fn is_status(kind: &str) -> bool {
    kind.ends_with("status")
}

impl Actor for MetaManager {
    type Context = Context<Self>;
}

impl Module for MetaManager {
    fn name(&self) -> &str {
        module::METAMANAGER
    }

    fn group(&self) -> &str {
        group::META
    }

    fn handle(&mut self, msg: HiveMessage, ctx: &mut Context<Self>) -> Result<(), ModuleError> {
        let Ok(resource) = msg.resource().parse::<EdgeResource>() else {
            warn!(resource = msg.resource(), "unreadable resource");
            if msg.is_sync() {
                self.hive
                    .send_resp(msg.error_response(module::METAMANAGER, "unreadable resource"));
            }
            return Ok(());
        };
        match msg.operation() {
            operation::INSERT
            | operation::UPDATE
            | operation::PATCH
            | operation::DELETE
            | operation::UPLOAD => self.write(msg, resource, ctx),
            operation::QUERY => match self.answer(&resource) {
                Ok(Some(answer)) => {
                    let watermark = (resource.to_string() == INVENTORY)
                        .then(|| msg.body::<Watermark>().ok())
                        .flatten();
                    self.hive
                        .send_resp(msg.response(module::METAMANAGER, answer));
                    if let Some(watermark) = watermark.filter(|w| !w.is_empty()) {
                        self.sweep(watermark);
                    }
                }
                // A status is the edge's own report: the cloud is never
                // asked for one the edge does not hold.
                Ok(None) if is_status(&resource.resource_type) => {
                    self.hive.send_resp(
                        msg.error_response(module::METAMANAGER, format!("{resource} not held")),
                    );
                }
                Ok(None) => self.ask_the_cloud(msg, &resource),
                Err(reason) => {
                    self.hive
                        .send_resp(msg.error_response(module::METAMANAGER, reason));
                }
            },
            other => {
                debug!(operation = other, "operation ignored");
                if msg.is_sync() {
                    let reason = format!("metamanager does not handle {other:?}");
                    self.hive
                        .send_resp(msg.error_response(module::METAMANAGER, reason));
                }
            }
        }
        Ok(())
    }
}

impl MetaManager {
    /// Submits the write now, in mailbox order; one task confirms writes
    /// after their commits in the same order, so two versions of an object
    /// reach the acting module oldest first, and writes still batch.
    fn write(&mut self, msg: HiveMessage, resource: EdgeResource, ctx: &mut Context<Self>) {
        if msg.resource_version().is_empty() && !is_status(&resource.resource_type) {
            // Only status reports get versions here; an object without one
            // could shadow every version the cloud sends later.
            warn!(resource = %resource, "object without a resource version refused");
            if msg.is_sync() {
                self.hive.send_resp(
                    msg.error_response(module::METAMANAGER, "an object needs a resource version"),
                );
            }
            return;
        }
        let record = Record {
            version: self.version_of(&msg),
            object: (msg.operation() != operation::DELETE).then(|| msg.content().clone()),
        };
        match self.store.submit(&resource.to_string(), record) {
            Ok(committed) => {
                if self.written.is_none() {
                    let (tx, rx) = mpsc::unbounded_channel();
                    ctx.spawn(confirm_in_order(self.hive.clone(), rx).into_actor(self));
                    self.written = Some(tx);
                }
                if let Some(written) = &self.written {
                    let _ = written.send((msg, resource, committed));
                }
            }
            Err(err) => {
                warn!(error = %err, "edge store unavailable");
                if msg.is_sync() {
                    self.hive.send_resp(not_stored(&msg, &err));
                }
            }
        }
    }

    /// Prunes the tombstones `watermark` covers, in the background; one
    /// sweep at a time (a question asked meanwhile waits for the next).
    fn sweep(&self, watermark: Watermark) {
        use std::sync::atomic::Ordering;
        if self.pruning.swap(true, Ordering::AcqRel) {
            debug!("a tombstone sweep is running; this watermark waits for the next");
            return;
        }
        let (store, pruning) = (self.store.clone(), self.pruning.clone());
        actix::spawn(async move {
            match store.prune_tombstones(&watermark).await {
                Ok(pruned) => debug!(
                    pruned,
                    held = store.tombstones().held(),
                    "tombstones the cloud's watermark covers pruned"
                ),
                Err(err) => warn!(error = %err, "tombstones not pruned"),
            }
            pruning.store(false, Ordering::Release);
        });
    }

    /// An object's own version; a status report, which has none, gets the
    /// next of a strictly increasing sequence (milliseconds, or one more
    /// than the last when the clock stands still or steps back), so the
    /// newest report always wins.
    fn version_of(&mut self, msg: &HiveMessage) -> String {
        if !msg.resource_version().is_empty() {
            return msg.resource_version().to_owned();
        }
        let now = u64::try_from(beehive::message::now_millis()).unwrap_or(0);
        self.last_status_version = now.max(self.last_status_version + 1);
        self.last_status_version.to_string()
    }

    /// One object, or the list of a type in a namespace; `None` for an
    /// object the edge does not hold.
    fn answer(&self, resource: &EdgeResource) -> Result<Option<Content>, String> {
        let key = resource.to_string();
        if key == INVENTORY {
            let mut held = apis::inventory::Held::new();
            for kind in CONTROLLED {
                for (key, record) in self
                    .store
                    .list_type(None, kind)
                    .map_err(|e| e.to_string())?
                {
                    held.insert(key, record.version);
                }
            }
            return Content::of(&held).map(Some).map_err(|e| e.to_string());
        }
        if resource.name.is_empty() {
            // `*` as the namespace lists every namespace.
            let namespace = Some(resource.namespace.as_str()).filter(|ns| *ns != "*");
            let objects = self
                .store
                .list_type(namespace, &resource.resource_type)
                .map_err(|e| e.to_string())?;
            let objects: Vec<Content> = objects.into_iter().filter_map(|(_, r)| r.object).collect();
            return Content::of(&objects).map(Some).map_err(|e| e.to_string());
        }
        match self.store.get(&key).map_err(|e| e.to_string())? {
            Some(record) if !record.is_deleted() => Ok(Some(record.object.unwrap_or_default())),
            _ => Ok(None),
        }
    }

    /// Forwards a query for an object the edge does not hold to the cloud
    /// (edgehub answers at once when the link is down) and answers the
    /// asker with what comes back.
    fn ask_the_cloud(&self, msg: HiveMessage, resource: &EdgeResource) {
        let hive = self.hive.clone();
        let query = HiveMessage::new().build_router(
            module::METAMANAGER,
            group::RESOURCE,
            resource.to_string(),
            operation::QUERY,
        );
        let not_held = format!("{resource} not found");
        actix::spawn(async move {
            let answer = match hive
                .send_sync(module::EDGEHUB, query, CLOUD_QUERY_TIMEOUT)
                .await
            {
                Ok(reply) => match reply.into_answer() {
                    Ok(reply) => msg.response(module::METAMANAGER, reply.content),
                    Err(refused) if refused.reason.is_empty() => {
                        msg.error_response(module::METAMANAGER, format!("{not_held}: refused"))
                    }
                    Err(refused) => {
                        msg.error_response(module::METAMANAGER, format!("{not_held}: {refused}"))
                    }
                },
                Err(err) => msg.error_response(module::METAMANAGER, format!("{not_held}: {err}")),
            };
            hive.send_resp(answer);
        });
    }
}

/// metamanager's answer to a write it committed: `{"applied": bool}`,
/// false when the store held a newer version already (the write changed
/// nothing). A write it could not commit is answered as a
/// [`beehive::Failure`] instead.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct WriteAnswer {
    /// Whether the write changed the store.
    pub applied: bool,
}

impl WriteAnswer {
    /// The answer as a response's content.
    pub fn content(self) -> Content {
        Content::of(&self).expect("a flag encodes")
    }

    /// The answer `reply` carries, or why the write was not done.
    pub fn of(reply: &HiveMessage) -> Result<WriteAnswer, beehive::Failure> {
        if let Some(failure) = reply.failure() {
            return Err(failure);
        }
        reply
            .body()
            .map_err(|err| beehive::Failure::refused(format!("not a write's answer: {err}")))
    }
}

/// How long a query forwarded to the cloud may take.
const CLOUD_QUERY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// The answer to a write the store could not commit: it may succeed if
/// tried again, so edgehub does not acknowledge it and the cloud resends.
fn not_stored(msg: &HiveMessage, err: &StoreError) -> HiveMessage {
    msg.retryable_error(module::METAMANAGER, err.to_string())
}

/// Resource types the cloud's edgecontroller keeps in step on each node
/// (reported by an inventory query).
const CONTROLLED: [&str; 5] = [
    resource_type::POD,
    resource_type::CONFIGMAP,
    resource_type::SECRET,
    resource_type::DEVICE,
    resource_type::DEVICE_MODEL,
];

/// The resource of an inventory query (shared with the cloud's
/// edgecontroller, which asks it).
pub use beehive::constants::INVENTORY;

/// Confirms each write right after its commit, in order, and queues it for
/// the module that acts on it; a slow module never holds up confirmations
/// (and so the cloud's acknowledgements).
async fn confirm_in_order(hive: Hive, mut written: mpsc::UnboundedReceiver<Written>) {
    let (pass_on, to_pass_on) = mpsc::unbounded_channel();
    actix::spawn(pass_on_in_order(hive.clone(), to_pass_on));
    while let Some((msg, resource, committed)) = written.recv().await {
        match committed.await {
            Ok(outcome) => {
                if msg.is_sync() {
                    let answer = WriteAnswer {
                        applied: outcome == WriteOutcome::Applied,
                    };
                    hive.send_resp(msg.response(module::METAMANAGER, answer.content()));
                }
                if outcome == WriteOutcome::Applied {
                    let _ = pass_on.send((msg, resource));
                }
            }
            Err(err) => {
                warn!(resource = %resource, error = %err, "object not stored");
                if msg.is_sync() {
                    hive.send_resp(not_stored(&msg, &err));
                }
            }
        }
    }
}

/// Hands stored objects to the module that acts on them, and status
/// reports up to edgehub, in commit order.
async fn pass_on_in_order(
    hive: Hive,
    mut stored: mpsc::UnboundedReceiver<(HiveMessage, EdgeResource)>,
) {
    while let Some((msg, resource)) = stored.recv().await {
        if is_status(&resource.resource_type) {
            // Up to the cloud (its edgecontroller takes the resource
            // group); edgehub keeps it while offline. Its asker has been
            // answered here already.
            let mut msg = msg;
            msg.router.group = group::RESOURCE.into_route_name();
            msg.header.sync = false;
            if let Err(err) = hive.send(module::EDGEHUB, msg).await {
                debug!(error = %err, "status not sent up");
            }
        } else if let Some(target) = acting_group(&resource.resource_type) {
            let _ = hive.send_to_group(target, msg).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_write_answer_reads_back_from_its_response_and_a_failure_from_an_error() {
        let write = HiveMessage::new().build_router(
            module::EDGEHUB,
            group::RESOURCE,
            "default/pod/web",
            operation::UPDATE,
        );
        for applied in [true, false] {
            let answer = WriteAnswer { applied };
            let reply = write.response(module::METAMANAGER, answer.content());
            assert_eq!(
                reply.body::<serde_json::Value>().expect("json body"),
                json!({ "applied": applied })
            );
            assert_eq!(WriteAnswer::of(&reply), Ok(answer));
        }
        let failed = write.retryable_error(module::METAMANAGER, "disk full");
        assert_eq!(
            WriteAnswer::of(&failed),
            Err(beehive::Failure::retryable("disk full"))
        );
        let odd = write.response(
            module::METAMANAGER,
            beehive::Content::of(&json!(["not", "an", "answer"])).expect("json body"),
        );
        assert!(WriteAnswer::of(&odd).is_err_and(|failure| !failure.retryable));
    }
}
