//! What a node's word, and its link, make of its Node object, with no I/O
//! and time passed in: a registration's or a patch's labels and
//! annotations merged into the stored Node ([`adopted`]), a status report
//! taken as the node's own ([`own_status`]), the status write that follows
//! (the link's conditions set, an unchanged status written only every
//! [`NODE_STATUS_REFRESH`]: [`status_write`]), and which Nodes shown linked
//! no replica links are candidates to mark unreachable
//! ([`shown_linked_elsewhere`]). The controller (`nodes.rs`) reads and
//! writes the store, and asks the claims, around these.

use std::time::Duration;

use beehive::Content;
use beehive::resource::EdgeResource;
use k8s_openapi::api::core::v1::{NodeCondition, NodeStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde::Deserialize;
use serde_json::{Value, json};

use super::kubeedge::{self, Refusal};
use super::reconciler::LINK_CONDITION;
use crate::cloudstream::KubeletEndpoint;
use crate::desired::Object;

/// How often a node's unchanged status is written all the same (a
/// kubelet's `nodeStatusReportFrequency`): its Lease, renewed every 10 s,
/// is the heartbeat the node lifecycle controller reads in between.
pub(crate) const NODE_STATUS_REFRESH: Duration = Duration::from_secs(300);

/// Why a node's word about a Node is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum NodeRefused {
    /// It registers another node.
    RegistersAnother,
    /// It patches another node's Node.
    PatchesAnother,
    /// It reports another node's status.
    ReportsAnother,
    /// What it reports is not a NodeStatus.
    NotANodeStatus,
    /// Its patch is unreadable (why).
    UnreadablePatch(String),
}

impl From<NodeRefused> for Refusal {
    fn from(refused: NodeRefused) -> Refusal {
        match refused {
            NodeRefused::RegistersAnother => Refusal::forbidden("a node registers only itself"),
            NodeRefused::PatchesAnother => Refusal::forbidden("a node patches only itself"),
            NodeRefused::ReportsAnother => Refusal::forbidden("a node reports only its own status"),
            NodeRefused::NotANodeStatus => Refusal::invalid("not a NodeStatus"),
            NodeRefused::UnreadablePatch(why) => Refusal::bad_request(why),
        }
    }
}

/// The status a node's registration (or its patched Node) carries, if
/// any (`null` is none): taken as the node's report of its status.
pub(crate) fn given_status(given: &Value) -> Option<&Value> {
    given.get("status").filter(|status| !status.is_null())
}

/// `node`'s patch (`content`) of the Node `what` names: its own only.
pub(crate) fn own_patch(
    node: &str,
    what: &EdgeResource,
    content: &Content,
) -> Result<Value, NodeRefused> {
    if what.name != node {
        return Err(NodeRefused::PatchesAnother);
    }
    kubeedge::patch_of(content).map_err(NodeRefused::UnreadablePatch)
}

/// The Node `patch` makes of the stored one (`None`: of nothing), to be
/// adopted as the node's word.
pub(crate) fn patched(stored: Option<Object>, patch: &Value) -> Value {
    let mut object = stored.map(Object::into_json).unwrap_or_default();
    kubeedge::strategic_merge(&mut object, patch);
    object
}

/// `node`'s report of the status of the Node `what` names: its own only,
/// and a NodeStatus.
pub(crate) fn own_status(
    node: &str,
    what: &EdgeResource,
    status: &Value,
) -> Result<NodeStatus, NodeRefused> {
    if what.name != node {
        return Err(NodeRefused::ReportsAnother);
    }
    NodeStatus::deserialize(status).map_err(|_| NodeRefused::NotANodeStatus)
}

/// The `Ready` condition a status reports, if it reports one.
pub(crate) fn reported_ready(status: &NodeStatus) -> Option<&NodeCondition> {
    status
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == "Ready")
}

/// What a node's labels and annotations make of its stored Node.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Adopted {
    /// Nothing new: the Node as stored is the answer.
    AsStored(Object),
    /// The Node to store in its place (unconditionally: the node's word
    /// for its own Node).
    Replace(Object),
}

/// The stored Node with the labels and annotations `given` (the node's
/// registration, or its patched Node) names added (and changed; none is
/// taken away).
pub(crate) fn adopted(stored: Object, given: &Value) -> Adopted {
    let mut object = stored.clone();
    object.edit(|object| {
        for field in ["labels", "annotations"] {
            let Some(given) = given
                .pointer(&format!("/metadata/{field}"))
                .and_then(Value::as_object)
            else {
                continue;
            };
            if let Some(held) = object["metadata"]
                .as_object_mut()
                .map(|metadata| metadata.entry(field).or_insert_with(|| json!({})))
                .and_then(Value::as_object_mut)
            {
                held.extend(given.iter().map(|(k, v)| (k.clone(), v.clone())));
            }
        }
    });
    match object == stored {
        true => Adopted::AsStored(stored),
        false => Adopted::Replace(unconditional(object)),
    }
}

/// What a write of a node's status starts from, and whose write it is.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum StatusSource<'a> {
    /// The node's report, written as its holder.
    Report(Box<NodeStatus>),
    /// The stored status with the link's conditions brought up to date,
    /// written as the node's holder.
    Refresh,
    /// The stored status with the link's conditions (the link down),
    /// written for a node no replica holds, only if its stored Node is
    /// still at this version (read before the claims were asked).
    Mark(&'a str),
}

impl StatusSource<'_> {
    /// The version a mark is conditioned on.
    fn at(&self) -> Option<&str> {
        match self {
            StatusSource::Mark(at) => Some(at),
            StatusSource::Report(_) | StatusSource::Refresh => None,
        }
    }
}

/// What the controller knows of a node besides its stored Node.
#[derive(Debug, Clone)]
pub(crate) struct NodeFacts<'a> {
    /// Its `Ready` condition now, from its link and its own report.
    pub(crate) ready: NodeCondition,
    /// Its link's own condition now ([`LINK_CONDITION`]).
    pub(crate) link: NodeCondition,
    /// Whether it speaks KubeEdge (its edged reports its kubelet version).
    pub(crate) kubeedge: bool,
    /// Where kube-apiserver reaches its kubelet API (Kubernetes mode with
    /// the kubelet API on), written by its holder.
    pub(crate) endpoint: Option<&'a KubeletEndpoint>,
}

/// What a write of a node's status comes to.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum NodeWrite {
    /// A mark of a Node written since it was read: nothing is written (the
    /// node's new holder wrote it).
    WrittenSince,
    /// The stored status is current (it differs in heartbeat times at
    /// most, and its heartbeat is younger than [`NODE_STATUS_REFRESH`]):
    /// nothing is written, as a kubelet.
    Current,
    /// Hand this Node to the status writer (unconditional for its holder;
    /// at the version read for a mark).
    Write(Object),
    /// No Node is stored: create this one (labelled as an edge node), then
    /// write `status` to it ([`after_create`]).
    Create {
        /// The Node to create.
        object: Object,
        /// Its status, written once it is created.
        status: Value,
    },
    /// The status does not serialize (why): nothing is written.
    Unwritable(String),
}

/// What writing `node`'s status from `source` over `existing` (its Node
/// as stored, with the status last handed to the writer) comes to at
/// `now`, with `facts` of its link: the `Ready` condition first and the
/// link's second, each keeping its transition time while its status
/// holds; the kubelet endpoint (holders only); a kubelet version until
/// its KubeEdge edge reports one.
pub(crate) fn status_write(
    node: &str,
    existing: Option<Object>,
    source: StatusSource<'_>,
    facts: NodeFacts<'_>,
    now: Time,
) -> NodeWrite {
    let at = source.at();
    if let Some(at) = at
        && existing.as_ref().and_then(version_of).as_deref() != Some(at)
    {
        return NodeWrite::WrittenSince;
    }
    let marked = at.is_some();
    let mut status = match source {
        StatusSource::Report(reported) => *reported,
        StatusSource::Refresh | StatusSource::Mark(_) => existing
            .as_ref()
            .and_then(|object| object.json().get("status"))
            .and_then(|s| NodeStatus::deserialize(s).ok())
            .unwrap_or_default(),
    };
    if let (Some(endpoint), false) = (facts.endpoint, marked) {
        endpoint.apply(&mut status);
    }
    if !facts.kubeedge {
        // Before its edged reports (or with edged off), kubectl still
        // shows which edgehive serves the node.
        let info = status.node_info.get_or_insert_with(Default::default);
        if info.kubelet_version.is_empty() {
            info.kubelet_version = apis::KUBELET_VERSION.to_owned();
        }
    }
    let conditions = status.conditions.get_or_insert_with(Vec::new);
    let ready = kept_transition(conditions, "Ready", facts.ready);
    conditions.insert(0, ready);
    // The link's own condition: Ready may say NotReady for other reasons,
    // and a node within its offline window keeps its pods.
    let link_type = facts.link.type_.clone();
    let link = kept_transition(conditions, &link_type, facts.link);
    conditions.insert(1, link);
    let status = match serde_json::to_value(&status) {
        Ok(status) => status,
        Err(err) => return NodeWrite::Unwritable(err.to_string()),
    };
    match existing {
        Some(mut object) => {
            if object
                .json()
                .get("status")
                .is_some_and(|stored| node_status_current(stored, &status, now))
            {
                return NodeWrite::Current;
            }
            object.edit(|body| body["status"] = status);
            NodeWrite::Write(match marked {
                // The node's holder is the only writer of its status.
                false => unconditional(object),
                true => object,
            })
        }
        None => match Object::new(json!({
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": node,
                "labels": {
                    "node-role.kubernetes.io/edge": "",
                    "kubernetes.io/hostname": node,
                    "kubernetes.io/os": std::env::consts::OS,
                },
            },
        })) {
            Ok(object) => NodeWrite::Create { object, status },
            Err(err) => NodeWrite::Unwritable(err.to_string()),
        },
    }
}

/// `condition` in place of the one of type `kind` in `conditions` (taken
/// out), keeping its transition time if its status is the same.
fn kept_transition(
    conditions: &mut Vec<NodeCondition>,
    kind: &str,
    condition: NodeCondition,
) -> NodeCondition {
    match conditions.iter().position(|c| c.type_ == kind) {
        Some(i) => {
            let old = conditions.remove(i);
            match old.status == condition.status {
                true => NodeCondition {
                    last_transition_time: old.last_transition_time,
                    ..condition
                },
                false => condition,
            }
        }
        None => condition,
    }
}

/// After [`NodeWrite::Create`]: the Node whose `status` goes to the status
/// writer, the one `created` (as stored) or, where it existed already
/// (`None`: created by an earlier write whose change the view does not
/// show yet), `node`'s by name.
pub(crate) fn after_create(node: &str, created: Option<Object>, status: Value) -> Object {
    let mut object = match created {
        Some(created) => unconditional(created),
        None => Object::stub(&apis::ObjectKey::new(apis::Kind::Node, "", node)),
    };
    object.edit(|body| body["status"] = status);
    object
}

/// The `resourceVersion` of a stored object.
pub(crate) fn version_of(object: &Object) -> Option<String> {
    (object.revision() != 0).then(|| object.revision().to_string())
}

/// Whether the stored node status needs no write for `new`: they differ in
/// heartbeat times at most, and the stored heartbeat is younger than
/// [`NODE_STATUS_REFRESH`] at `now`.
pub(crate) fn node_status_current(stored: &Value, new: &Value, now: Time) -> bool {
    let without_heartbeats = |status: &Value| {
        let mut status = status.clone();
        for condition in status["conditions"].as_array_mut().into_iter().flatten() {
            if let Some(condition) = condition.as_object_mut() {
                condition.remove("lastHeartbeatTime");
            }
        }
        status
    };
    if stored == new {
        return true;
    }
    if without_heartbeats(stored) != without_heartbeats(new) {
        return false;
    }
    let beat = stored["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["type"] == "Ready")
        .and_then(|c| c["lastHeartbeatTime"].as_str())
        .and_then(|at| at.parse::<jiff::Timestamp>().ok());
    beat.is_some_and(|beat| {
        now.0.duration_since(beat)
            < jiff::SignedDuration::try_from(NODE_STATUS_REFRESH).unwrap_or_default()
    })
}

/// Of the stored `nodes`, those shown linked (by the link condition the
/// controller writes) that are not `linked_here`, each with the version
/// it was read at: their replica may have died, and they did not link
/// again; the claims say which no replica holds.
pub(crate) fn shown_linked_elsewhere(
    nodes: &[Object],
    linked_here: impl Fn(&str) -> bool,
) -> Vec<(String, String)> {
    let shown_linked = |node: &Object| {
        node.json()
            .pointer("/status/conditions")
            .and_then(Value::as_array)
            .is_some_and(|conditions| {
                conditions
                    .iter()
                    .any(|c| c["type"] == LINK_CONDITION && c["status"] == "True")
            })
    };
    nodes
        .iter()
        .filter(|node| shown_linked(node))
        .filter_map(|node| {
            let name = node.key().name.as_str();
            if linked_here(name) {
                return None;
            }
            Some((name.to_owned(), version_of(node)?))
        })
        .collect()
}

/// `object` without its resource version: a write of it is
/// unconditional.
pub(super) fn unconditional(mut object: Object) -> Object {
    object.set_revision(0);
    object
}

#[cfg(test)]
mod tests;
