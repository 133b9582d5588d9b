//! The task around [`StatusWriter`]: the controller hands it status
//! writes and goes on (delivery to the edges never waits for the API
//! server); the task starts what the writer says, writes through the
//! desired state's status door, answers the edges that wait through
//! cloudhub's links, and counts. One concern: the I/O around the writer's
//! decisions.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use beehive::Message as HiveMessage;
use beehive::constants::module;
use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use hub::NodeLinks;
use serde_json::Value;
use tokio::sync::{mpsc, watch};
use tracing::{debug, info, warn};

use apis::kinds::ObjectKey;

use super::kubeedge::{self, Refusal};
use super::status_writer::{Outcome, Settled, StatusWriter, WriterConfig};
use super::{ControllerCounts, send_to_node};
use crate::desired::{DesiredState, Object};
use crate::devicecontroller::twin_sync;

/// A status write for the desired state.
#[derive(Debug, Clone)]
pub(super) struct Job {
    /// The object with its new status: written through the status door,
    /// unconditionally unless it carries a `resourceVersion`.
    pub(super) object: Object,
    /// Which submission it is (the overlay's entry names the newest).
    seq: u64,
    /// Reports of nodes it stands for.
    reports: u64,
    /// A node served by no replica, whose Node this write marks
    /// unreachable (conditioned on the version read).
    mark: Option<String>,
}

/// What waits for a status write: a report of a node that wants an
/// answer.
#[derive(Debug)]
pub(super) enum Ticket {
    /// A status replace (edgehive's or KubeEdge's `podstatus`, a
    /// `nodestatus`): "OK", or an error answer.
    Replace(HiveMessage),
    /// A KubeEdge `podpatch`: the object as stored, or a Status error.
    Patch(HiveMessage),
    /// A KubeEdge node's registration or `nodepatch`: this object (the
    /// Node as the controller made it), or a Status error.
    Object(HiveMessage, Object),
    /// A KubeEdge devicetwin report: confirmed once written (never
    /// answered otherwise: the edge sends it again).
    Device(String, HiveMessage),
}

/// A status handed to the writer and not yet seen back in the desired
/// state's view: what the controller compares the next report with.
#[derive(Debug)]
struct Overlaid {
    seq: u64,
    status: Value,
    /// The revision it was written at, once written (the view is current
    /// again once it holds that revision or a later one).
    written_at: Option<u64>,
}

type Overlay = Arc<Mutex<HashMap<ObjectKey, Overlaid>>>;

/// What the controller hands the writer task.
enum Request {
    /// A write, and what waits for it.
    Write(ObjectKey, Job, Option<Ticket>),
    /// A ticket for the write of an object under way (answered at once if
    /// none is).
    Follow(ObjectKey, Ticket),
}

/// The controller's side of the status writer task: writes go in and the
/// controller goes on.
pub(super) struct StatusWrites {
    queue: mpsc::UnboundedSender<Request>,
    overlay: Overlay,
    seq: u64,
}

impl StatusWrites {
    /// Starts the writer's task on `store`, answering nodes through `links`.
    pub(super) fn start(
        store: Arc<dyn DesiredState>,
        links: NodeLinks,
        config: WriterConfig,
        counts: Arc<watch::Sender<ControllerCounts>>,
    ) -> Self {
        let (queue, jobs) = mpsc::unbounded_channel();
        let overlay = Overlay::default();
        tokio::spawn(write_paced(
            store,
            links,
            config,
            counts,
            jobs,
            overlay.clone(),
        ));
        StatusWrites {
            queue,
            overlay,
            seq: 0,
        }
    }

    /// Hands `object` (with its new status) to the writer, `ticket`
    /// waiting for the write; `report`: a node's report (counted in
    /// `status_applied` once written), not the controller's own write.
    pub(super) fn submit(
        &mut self,
        key: ObjectKey,
        object: Object,
        ticket: Option<Ticket>,
        report: bool,
    ) {
        self.hand_over(key, object, ticket, report, None);
    }

    fn hand_over(
        &mut self,
        key: ObjectKey,
        object: Object,
        ticket: Option<Ticket>,
        report: bool,
        mark: Option<String>,
    ) {
        self.seq += 1;
        let status = object.json().get("status").cloned().unwrap_or(Value::Null);
        self.overlay
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(
                key.clone(),
                Overlaid {
                    seq: self.seq,
                    status,
                    written_at: None,
                },
            );
        let job = Job {
            object,
            seq: self.seq,
            reports: u64::from(report),
            mark,
        };
        if self.queue.send(Request::Write(key, job, ticket)).is_err() {
            warn!("status writer stopped; status not written");
        }
    }

    /// Hands over the mark of `node`, served by no replica, as
    /// unreachable: `object` carries the version it was read at, and is
    /// written only if still at it.
    pub(super) fn mark(&mut self, key: ObjectKey, object: Object, node: &str) {
        self.hand_over(key, object, None, false, Some(node.to_owned()));
    }

    /// `ticket` is answered once the write of `key` under way settles (at
    /// once if none is).
    pub(super) fn follow(&self, key: ObjectKey, ticket: Ticket) {
        if self.queue.send(Request::Follow(key, ticket)).is_err() {
            warn!("status writer stopped; an answer not given");
        }
    }

    /// The object at `key` as the controller is to see it: `held` (the
    /// desired state's view) with the status last handed to the writer
    /// if the view does not show it yet.
    pub(super) fn current(&self, key: &ObjectKey, held: Option<Object>) -> Option<Object> {
        let mut overlay = self.overlay.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(overlaid) = overlay.get(key) else {
            return held;
        };
        let mut object = held?;
        if overlaid
            .written_at
            .is_some_and(|at| object.revision() >= at)
        {
            overlay.remove(key);
            return Some(object);
        }
        object.edit(|body| body["status"] = overlaid.status.clone());
        Some(object)
    }
}

/// The writer's task: takes writes, starts them as [`StatusWriter`] says,
/// answers what waited; ends with the controller.
async fn write_paced(
    store: Arc<dyn DesiredState>,
    links: NodeLinks,
    config: WriterConfig,
    counts: Arc<watch::Sender<ControllerCounts>>,
    mut jobs: mpsc::UnboundedReceiver<Request>,
    overlay: Overlay,
) {
    let mut writer: StatusWriter<ObjectKey, Job, Ticket> = StatusWriter::new(config);
    let mut flying = FuturesUnordered::new();
    loop {
        let now = Instant::now();
        for start in writer.poll(now) {
            let put = store.replace_status(start.write.object.clone());
            flying.push(async move { (start.key, start.write, put.await) });
        }
        let wake = writer.next_wake(now).map(tokio::time::Instant::from_std);
        tokio::select! {
            request = jobs.recv() => {
                let Some(request) = request else {
                    // The controller stopped: so does the writer, letting
                    // go of the store (a node reports its status again).
                    return;
                };
                let mut next = Some(request);
                while let Some(request) = next.take() {
                    match request {
                        Request::Write(key, job, ticket) => {
                            let reports = job.reports;
                            writer.submit(key, job, ticket, reports, Instant::now());
                        }
                        Request::Follow(key, ticket) => {
                            if let Some(ticket) = writer.attach(&key, ticket) {
                                answer(&links, ticket, &Settled::Written, None);
                            }
                        }
                    }
                    next = jobs.try_recv().ok();
                }
            }
            Some((key, job, written)) = flying.next(), if !flying.is_empty() => {
                let outcome = match &written {
                    Ok(_) => Outcome::Written,
                    Err(err) => Outcome::of_error(err),
                };
                match (&outcome, &job.mark) {
                    (Outcome::Written, Some(node)) => {
                        info!(%node, "node served by no replica marked unreachable")
                    }
                    (_, Some(node)) => debug!(%node, ?outcome, "node not marked"),
                    (outcome, None) => log_outcome(&key, outcome),
                }
                {
                    let mut overlay = overlay.lock().unwrap_or_else(PoisonError::into_inner);
                    let ours = overlay.get(&key).is_some_and(|o| o.seq == job.seq);
                    match (&written, &outcome) {
                        (Ok(stored), _) if ours => {
                            if let Some(o) = overlay.get_mut(&key) {
                                o.written_at = Some(stored.revision());
                            }
                        }
                        (_, Outcome::Gone) => {
                            overlay.remove(&key);
                        }
                        (_, Outcome::Refused(_)) if ours => {
                            overlay.remove(&key);
                        }
                        _ => {}
                    }
                }
                let (answers, landed) = writer.completed(&key, job, outcome, Instant::now());
                let stored = written.ok();
                let (mut patches, mut devices) = (0, 0);
                for (ticket, settled) in answers {
                    match answer(&links, ticket, &settled, stored.as_ref()) {
                        Some(Answered::Patch) => patches += 1,
                        Some(Answered::Device) => devices += 1,
                        None => {}
                    }
                }
                let done = writer.counts();
                counts.send_modify(|c| {
                    c.status_applied += landed;
                    c.patches += patches;
                    c.device_reports += devices;
                    c.status_written = done.written;
                    c.status_coalesced = done.coalesced;
                    c.status_throttled = done.throttled;
                    c.status_retried = done.retried;
                    c.status_dropped = done.dropped;
                });
                continue;
            }
            _ = tokio::time::sleep_until(wake.unwrap_or_else(tokio::time::Instant::now)), if wake.is_some() => {}
        }
        let coalesced = writer.counts().coalesced;
        counts.send_if_modified(|c| {
            let moved = c.status_coalesced != coalesced;
            c.status_coalesced = coalesced;
            moved
        });
    }
}

fn log_outcome(key: &ObjectKey, outcome: &Outcome) {
    match outcome {
        Outcome::Written => debug!(%key, "status written"),
        Outcome::Gone => debug!(%key, "status not written: the object is gone"),
        Outcome::Throttled(pause) => {
            warn!(%key, ?pause, "status write throttled (429); writes pause")
        }
        Outcome::Failed(reason) => warn!(%key, %reason, "status not written; trying again"),
        Outcome::Refused(reason) => warn!(%key, %reason, "status refused; dropped"),
    }
}

/// Which counted answer was given.
pub(super) enum Answered {
    Patch,
    Device,
}

/// Answers `ticket` for a write that `settled`, `stored` the object as
/// written.
pub(super) fn answer(
    links: &NodeLinks,
    ticket: Ticket,
    settled: &Settled,
    stored: Option<&Object>,
) -> Option<Answered> {
    let refusal = |gone: bool, reason: &str| match gone {
        true => Refusal::not_found("deleted meanwhile"),
        false => Refusal::internal(format!("the status could not be stored: {reason}")),
    };
    match (ticket, settled) {
        (Ticket::Replace(msg), Settled::Written) => {
            send_to_node(links, msg.response(module::EDGECONTROLLER, "OK"));
            None
        }
        (Ticket::Replace(msg), Settled::Failed { gone, reason }) => {
            let refusal = refusal(*gone, reason);
            send_to_node(
                links,
                msg.error_response(module::EDGECONTROLLER, refusal.message),
            );
            None
        }
        (Ticket::Patch(msg), Settled::Written) => {
            let content = match stored {
                Some(object) => kubeedge::object_answer(object.json().clone()),
                None => Refusal::internal("the status was written, not read back").answer(),
            };
            send_to_node(links, msg.response(module::EDGECONTROLLER, content));
            Some(Answered::Patch)
        }
        (Ticket::Patch(msg), Settled::Failed { gone, reason }) => {
            let content = refusal(*gone, reason).answer();
            send_to_node(links, msg.response(module::EDGECONTROLLER, content));
            None
        }
        (Ticket::Device(node, msg), Settled::Written) => {
            // The edge's devicetwin stops sending it again.
            send_to_node(links, twin_sync::confirm_message(&node, &msg));
            Some(Answered::Device)
        }
        (Ticket::Object(msg, object), Settled::Written) => {
            let content = kubeedge::object_answer(object.into_json());
            send_to_node(links, msg.response(module::EDGECONTROLLER, content));
            None
        }
        (Ticket::Object(msg, _), Settled::Failed { gone, reason }) => {
            let content = refusal(*gone, reason).answer();
            send_to_node(links, msg.response(module::EDGECONTROLLER, content));
            None
        }
        // KubeEdge's cloud answers a report it does not take with nothing
        // (any answer would read as its confirm): sent again in 60 s.
        (Ticket::Device(..), Settled::Failed { .. }) => None,
    }
}
