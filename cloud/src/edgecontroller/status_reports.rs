//! Status reports from nodes (pods', devices', KubeEdge twins'): read from
//! their messages, checked against what the node may report, and handed to
//! the status writer in batches, coalesced per object.

use apis::kinds::{Kind, ObjectKey};
use beehive::constants::{operation, resource_type};
use beehive::resource::{CloudResource, EdgeResource};
use beehive::{Content, Message as HiveMessage};
use serde_json::Value;
use tracing::warn;

use super::Controller;
use super::adoption::unconditional;
use super::kubeedge::Refusal;
use super::status_writes::Ticket;
use super::{kubeedge, status_writer, status_writes};
use crate::desired::Object;
use crate::devicecontroller::{twin_reports, twin_sync};

/// Status reports stored in one commit at most.
pub(super) const STATUS_BATCH: usize = 512;

/// A node's status report of an object bound to it (a pod's or a
/// device's status), read once where the controller takes its inputs.
pub(super) struct StatusReport {
    kind: Kind,
    node: String,
    what: EdgeResource,
    change: StatusChange,
    msg: HiveMessage,
}

/// What a status report does to the object's status.
pub(super) enum StatusChange {
    /// Replaces it (edgehive's `podstatus`, KubeEdge's older wrapped one).
    Replace(Value),
    /// Patches the object (KubeEdge's `podpatch`); only its status and a
    /// required uid are taken.
    Patch(Value),
    /// Sets a device's twins or state (a KubeEdge edge's devicetwin
    /// report, see [`twin_reports`]): the report's content.
    Device(twin_reports::ReportKind, Value),
}

impl StatusReport {
    /// The report `msg` is, or `msg` back when it is none.
    // Both sides hold the message: boxing one would only add an allocation.
    #[allow(clippy::result_large_err)]
    pub(super) fn of(msg: HiveMessage) -> Result<StatusReport, HiveMessage> {
        let status_operation = matches!(
            msg.operation(),
            operation::UPLOAD | operation::UPDATE | operation::INSERT | operation::PATCH
        );
        if !status_operation {
            return Err(msg);
        }
        let Ok(resource) = msg.resource().parse::<CloudResource>() else {
            return Err(msg);
        };
        if let Some(report) = twin_reports::device_report_of(&resource.resource) {
            let what = EdgeResource::new(report.namespace, resource_type::DEVICE, report.name);
            let change = StatusChange::Device(report.kind, msg.body::<Value>().unwrap_or_default());
            return Ok(StatusReport {
                kind: Kind::Device,
                node: resource.node,
                what,
                change,
                msg,
            });
        }
        let resource_type = resource.resource.resource_type.as_str();
        let (kind, change) =
            if resource_type == resource_type::POD_PATCH && msg.operation() == operation::PATCH {
                match kubeedge::patch_of(msg.content()) {
                    Ok(patch) => (Kind::Pod, StatusChange::Patch(patch)),
                    Err(_) => return Err(msg),
                }
            } else {
                let Some(kind) = [Kind::Pod, Kind::Device]
                    .into_iter()
                    .find(|k| k.status_type() == Some(resource_type))
                else {
                    return Err(msg);
                };
                let status = kubeedge::status_of(msg.content());
                (kind, StatusChange::Replace(status))
            };
        Ok(StatusReport {
            kind,
            node: resource.node,
            what: resource.resource,
            change,
            msg,
        })
    }

    /// The status `object` gets from this report, or why it gets none.
    fn status_for(&self, object: &Object) -> Result<Value, Refusal> {
        match &self.change {
            StatusChange::Replace(status) if self.kind == Kind::Device => {
                Ok(keep_users_device_status(status, object.json()))
            }
            StatusChange::Replace(status) => Ok(status.clone()),
            StatusChange::Patch(patch) => {
                let uid = object.uid();
                if let Some(required) = kubeedge::required_uid(patch)
                    && uid.is_some_and(|uid| uid != required)
                {
                    return Err(Refusal::conflict(format!(
                        "the patch is for uid {required}, not {uid:?}"
                    )));
                }
                let mut status = object.json().get("status").cloned().unwrap_or(Value::Null);
                if let Some(patch) = patch.get("status") {
                    kubeedge::strategic_merge(&mut status, patch);
                }
                Ok(status)
            }
            StatusChange::Device(kind, content) => {
                twin_reports::reported_status(*kind, content, object.json())
                    .map_err(Refusal::bad_request)
            }
        }
    }
}

/// A node's device status with what the user set in the stored one kept:
/// `reportToCloud` and `reportCycle` are the mapper's instructions (KubeEdge
/// keeps them in the status), never the node's to drop.
pub(super) fn keep_users_device_status(reported: &Value, stored: &Value) -> Value {
    let mut status = reported.clone();
    if let (Some(status), Some(old)) = (
        status.as_object_mut(),
        stored.get("status").and_then(Value::as_object),
    ) {
        for key in ["reportToCloud", "reportCycle"] {
            if let Some(value) = old.get(key)
                && !status.contains_key(key)
            {
                status.insert(key.to_owned(), value.clone());
            }
        }
    }
    status
}

impl Controller {
    pub(super) fn refuse_status(&self, node: &str, what: &EdgeResource, reason: &str) {
        warn!(%node, resource = %what, reason, "status refused");
        self.count(|c| c.status_refused += 1);
    }

    /// Hands the statuses nodes report of objects bound to them (pods,
    /// devices) to the status writer, which writes the latest per object
    /// off this task; a node never sets the status of another node's
    /// object. A report that waits for an answer is answered by the writer
    /// once its write landed or failed (at once if it changes nothing or is
    /// refused).
    pub(super) fn bound_statuses(&mut self, reports: Vec<StatusReport>) {
        for report in reports {
            let key = ObjectKey::new(
                report.kind,
                report.what.namespace.as_str(),
                report.what.name.as_str(),
            );
            // What was last handed to the writer, where the view does not
            // show it yet: a report is compared with the newest status.
            let base = self
                .store
                .get(&key)
                .map(|held| self.status.current(&key, held));
            let taken = match base {
                Ok(Some(object)) => report
                    .status_for(&object)
                    .and_then(|status| {
                        self.with_status(report.kind, &report.node, object.clone(), &status)
                    })
                    .map(|changed| changed.ok_or(object)),
                Ok(None) => Err(Refusal::not_found("no such object")),
                Err(err) => Err(Refusal::internal(err.to_string())),
            };
            let waits = report.msg.is_sync();
            match (taken, report.change) {
                (Ok(Ok(object)), change) => {
                    let ticket = match change {
                        StatusChange::Replace(_) => waits.then_some(Ticket::Replace(report.msg)),
                        StatusChange::Patch(_) => waits.then_some(Ticket::Patch(report.msg)),
                        StatusChange::Device(..) => Some(Ticket::Device(report.node, report.msg)),
                    };
                    // A node is the only writer of its objects' status: the
                    // write is unconditional, so a cache a moment behind the
                    // API server cannot make it a conflict.
                    self.status.submit(key, unconditional(object), ticket, true);
                }
                // Nothing changes: answered at once.
                (Ok(Err(object)), StatusChange::Patch(_)) => {
                    self.count(|c| c.patches += 1);
                    self.answer_write(&report.msg, Ok(object));
                }
                (Ok(Err(_)), StatusChange::Replace(_)) => {
                    self.answer_node(&report.msg, Content::text("OK"))
                }
                (Ok(Err(_)), StatusChange::Device(..)) => {
                    // The edge's devicetwin stops sending it again.
                    self.count(|c| c.device_reports += 1);
                    self.send_to_node(twin_sync::confirm_message(&report.node, &report.msg));
                }
                (Err(refusal), change) => {
                    self.refuse_status(&report.node, &report.what, &refusal.message);
                    match change {
                        StatusChange::Patch(_) => self.answer_write(&report.msg, Err(refusal)),
                        StatusChange::Replace(_) => self.refuse_sync(&report.msg, &refusal.message),
                        // KubeEdge's cloud answers a report it does not
                        // take with nothing (any answer would read as its
                        // confirm): the edge sends it again in 60 s.
                        StatusChange::Device(..) => {}
                    }
                }
            }
        }
    }

    /// `object` with the status `node` reports if it changes anything
    /// (`None` if not), or why the node may not set it.
    pub(super) fn with_status(
        &self,
        kind: Kind,
        node: &str,
        object: Object,
        status: &Value,
    ) -> Result<Option<Object>, Refusal> {
        if object.node_name() != Some(node) {
            return Err(Refusal::forbidden("the object is not bound to this node"));
        }
        kind.check_status(status)
            .map_err(|err| Refusal::invalid(err.to_string()))?;
        if object.json().get("status") == Some(status) {
            return Ok(None);
        }
        let mut object = object;
        object.edit(|body| body["status"] = status.clone());
        Ok(Some(object))
    }

    /// Answers a ticket whose report needed no write.
    pub(super) fn answer_now(&self, ticket: Option<Ticket>) {
        if let Some(ticket) = ticket {
            let _ =
                status_writes::answer(&self.links, ticket, &status_writer::Settled::Written, None);
        }
    }
}

#[cfg(test)]
mod device_status_tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_nodes_device_report_keeps_the_users_reporting_settings() {
        let stored =
            json!({"status": {"reportToCloud": true, "reportCycle": 5000, "state": "offline"}});
        let reported = json!({"state": "online", "twins": []});
        assert_eq!(
            keep_users_device_status(&reported, &stored),
            json!({"state": "online", "twins": [], "reportToCloud": true, "reportCycle": 5000})
        );
        // Nothing stored, nothing added.
        assert_eq!(keep_users_device_status(&reported, &json!({})), reported);
    }
}
