//! The controller shell's own rules, as plain functions: what a node's
//! message asks of the edgecontroller ([`NodeRequest::of`], the one place
//! KubeEdge's operation and resource-type strings are matched, a Lease's
//! operations among them), and how status reports waiting in the input are
//! gathered into one commit ([`gather`]). The shell (`mod.rs`) carries the
//! answers out.

use beehive::constants::{operation, resource_type};
use beehive::resource::EdgeResource;

use crate::devicecontroller::twin_sync;

/// What a node's message asks of the edgecontroller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NodeRequest {
    /// A KubeEdge devicetwin's sync: its node's devices.
    TwinSync,
    /// Its node Lease: read, written, or something else asked of it.
    Lease(LeaseRequest),
    /// An object the node may read, read.
    Query,
    /// The node registers (or updates) itself.
    RegisterNode,
    /// The node writes another node: refused.
    ForeignNode,
    /// A patch of its Node.
    PatchNode,
    /// Its Node's status.
    NodeStatus,
    /// A pod stopped there (its delete).
    PodTerminated,
    /// A pod status patch that did not read as a status report.
    PodPatch,
    /// Nothing the edgecontroller takes.
    Other,
}

/// What a node asks of its Lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LeaseRequest {
    /// Its Lease, read.
    Read,
    /// Its Lease, created or renewed.
    Write,
    /// Anything else: refused.
    Other,
}

impl NodeRequest {
    /// What `operation` on `resource` (the node's own form, without
    /// `node/<node>/`) from `node` asks.
    pub(crate) fn of(node: &str, resource: &EdgeResource, operation: &str) -> NodeRequest {
        if twin_sync::is_detail_request(resource) {
            return NodeRequest::TwinSync;
        }
        match (operation, resource.resource_type.as_str()) {
            (operation::QUERY, resource_type::LEASE) => NodeRequest::Lease(LeaseRequest::Read),
            (operation::INSERT | operation::UPDATE, resource_type::LEASE) => {
                NodeRequest::Lease(LeaseRequest::Write)
            }
            (_, resource_type::LEASE) => NodeRequest::Lease(LeaseRequest::Other),
            (operation::QUERY, _) => NodeRequest::Query,
            (operation::INSERT | operation::UPDATE, resource_type::NODE) => {
                match resource.name == node {
                    true => NodeRequest::RegisterNode,
                    false => NodeRequest::ForeignNode,
                }
            }
            (operation::PATCH, resource_type::NODE_PATCH) => NodeRequest::PatchNode,
            (
                operation::UPLOAD | operation::UPDATE | operation::INSERT | operation::PATCH,
                resource_type::NODE_STATUS,
            ) => NodeRequest::NodeStatus,
            (operation::DELETE, resource_type::POD) => NodeRequest::PodTerminated,
            (operation::PATCH, resource_type::POD_PATCH) => NodeRequest::PodPatch,
            _ => NodeRequest::Other,
        }
    }
}

/// An input as [`gather`] reads it.
pub(crate) enum Read<R, I> {
    /// A status report.
    Report(R),
    /// Something else, handed back.
    Other(I),
}

/// Gathers status reports behind `first`, at most `limit` in all, from
/// what `next` has waiting (`None`: nothing more waits). `read` tells a
/// report from other input; the first other input stops the gathering and
/// is returned, to be handled next, so nothing is reordered but reports
/// among themselves.
pub(crate) fn gather<I, R>(
    first: R,
    limit: usize,
    mut next: impl FnMut() -> Option<I>,
    read: impl Fn(I) -> Read<R, I>,
) -> (Vec<R>, Option<I>) {
    let mut reports = vec![first];
    while reports.len() < limit {
        let Some(input) = next() else {
            break;
        };
        match read(input) {
            Read::Report(another) => reports.push(another),
            Read::Other(other) => return (reports, Some(other)),
        }
    }
    (reports, None)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn asked(node: &str, resource: &str, op: &str) -> NodeRequest {
        let resource: EdgeResource = resource.parse().expect("a resource");
        NodeRequest::of(node, &resource, op)
    }

    #[test]
    fn each_message_a_node_sends_asks_one_thing() {
        use NodeRequest::*;
        for (resource, op, expected) in [
            (
                "default/lease/edge-1",
                operation::QUERY,
                Lease(LeaseRequest::Read),
            ),
            (
                "default/lease/edge-1",
                operation::INSERT,
                Lease(LeaseRequest::Write),
            ),
            (
                "default/lease/edge-1",
                operation::UPDATE,
                Lease(LeaseRequest::Write),
            ),
            (
                "default/lease/edge-1",
                operation::DELETE,
                Lease(LeaseRequest::Other),
            ),
            (
                "default/lease/edge-2",
                operation::QUERY,
                Lease(LeaseRequest::Read),
            ),
            ("default/configmap/cfg", operation::QUERY, Query),
            ("default/node/edge-1", operation::INSERT, RegisterNode),
            ("default/node/edge-1", operation::UPDATE, RegisterNode),
            ("default/node/edge-2", operation::UPDATE, ForeignNode),
            ("default/nodepatch/edge-1", operation::PATCH, PatchNode),
            ("default/nodestatus/edge-1", operation::UPLOAD, NodeStatus),
            ("default/nodestatus/edge-1", operation::UPDATE, NodeStatus),
            ("default/pod/web", operation::DELETE, PodTerminated),
            ("default/podpatch/web", operation::PATCH, PodPatch),
            ("default/pod/web", operation::INSERT, Other),
            ("default/nodestatus/edge-1", operation::DELETE, Other),
        ] {
            assert_eq!(asked("edge-1", resource, op), expected, "{op} {resource}");
        }
    }

    #[test]
    fn a_devicetwins_sync_is_known_by_its_resource() {
        assert_eq!(
            asked("edge-1", "membership/detail", "get"),
            NodeRequest::TwinSync
        );
    }

    #[test]
    fn reports_are_gathered_up_to_the_limit_and_the_first_other_input_waits() {
        // Inputs: even numbers are reports, odd ones are not.
        let report = |i: u32| match i % 2 {
            0 => Read::Report(i),
            _ => Read::Other(i),
        };
        let mut waiting = vec![2, 4, 6, 7, 8].into_iter();
        assert_eq!(
            gather(0, 10, || waiting.next(), report),
            (vec![0, 2, 4, 6], Some(7))
        );
        assert_eq!(
            waiting.next(),
            Some(8),
            "nothing behind the other input is taken"
        );
        let mut waiting = vec![2, 4, 6, 8].into_iter();
        assert_eq!(
            gather(0, 3, || waiting.next(), report),
            (vec![0, 2, 4], None)
        );
        assert_eq!(waiting.next(), Some(6), "nothing beyond the limit is taken");
        let mut none = std::iter::empty();
        assert_eq!(gather(0, 10, || none.next(), report), (vec![0], None));
    }
}
