//! Node Leases as the controller decides them, with no I/O: what a
//! KubeEdge node is answered of its own Lease ([`LeaseBook`], kept in
//! memory), and when the connected nodes' heartbeat Leases are renewed
//! where the desired state keeps them ([`RenewalRounds`]). The controller
//! (`nodes.rs`) sends the answers and runs the rounds.

use std::collections::HashMap;

use beehive::Content;
use serde_json::{Value, json};

use super::kubeedge::Refusal;
use super::requests::LeaseRequest;
use crate::desired::revision_of;

/// What a node is answered of a Lease.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum LeaseAnswer {
    /// The node's Lease as held now (after a write, as written, at its new
    /// `resourceVersion`).
    Lease(Value),
    /// Refused.
    Refused(LeaseRefused),
}

/// Why a node's request of a Lease is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LeaseRefused {
    /// It names another node's Lease: a node holds only its own.
    NotOwn,
    /// A read before the node wrote its Lease: NotFound, which a kubelet
    /// takes as the cue to create it.
    NotWritten,
    /// Neither a read nor a write.
    Operation,
}

impl LeaseRefused {
    /// The refusal as a Kubernetes Status says it, for `node`'s
    /// `operation`.
    pub(crate) fn refusal(self, node: &str, operation: &str) -> Refusal {
        match self {
            LeaseRefused::NotOwn => Refusal::forbidden("a node holds only its own lease"),
            LeaseRefused::NotWritten => {
                Refusal::not_found(format!("leases.coordination.k8s.io {node:?} not found"))
            }
            LeaseRefused::Operation => Refusal::bad_request(format!("{operation} of a lease")),
        }
    }
}

/// Each KubeEdge node's own Lease, kept in memory (it is written every few
/// seconds), answered as a kubelet expects of the API server.
#[derive(Debug, Default)]
pub(crate) struct LeaseBook {
    leases: HashMap<String, Value>,
}

impl LeaseBook {
    /// `node`'s `request` of the Lease named `named`, `content` its body:
    /// a read answers the Lease held (NotFound before the first write); a
    /// write keeps `content` as the Lease, its `resourceVersion` (where it
    /// has metadata) one above the one held (from 1), and answers it.
    pub(crate) fn answer(
        &mut self,
        node: &str,
        named: &str,
        request: LeaseRequest,
        content: &Content,
    ) -> LeaseAnswer {
        if named != node {
            return LeaseAnswer::Refused(LeaseRefused::NotOwn);
        }
        match request {
            LeaseRequest::Read => match self.leases.get(node) {
                Some(lease) => LeaseAnswer::Lease(lease.clone()),
                None => LeaseAnswer::Refused(LeaseRefused::NotWritten),
            },
            LeaseRequest::Write => {
                let mut lease: Value = content.decode().unwrap_or_default();
                let version = self.leases.get(node).map_or(0, revision_of) + 1;
                if let Some(metadata) = lease.get_mut("metadata").and_then(Value::as_object_mut) {
                    metadata.insert("resourceVersion".into(), json!(version.to_string()));
                }
                self.leases.insert(node.to_owned(), lease.clone());
                LeaseAnswer::Lease(lease)
            }
            LeaseRequest::Other => LeaseAnswer::Refused(LeaseRefused::Operation),
        }
    }
}

/// Heartbeat Lease renewals in flight at most: each is a connection to the
/// API server (kube's client speaks HTTP/1.1), and a round of 1,000 nodes
/// takes some 30 round trips.
pub(crate) const LEASES_IN_FLIGHT: usize = 32;

/// One round of heartbeat Lease renewals.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Round {
    /// Its id, for [`RenewalRounds::ended`].
    pub(crate) id: u64,
    /// The nodes whose Lease it renews: those connected when it started.
    pub(crate) nodes: Vec<String>,
    /// Renewals in flight at most.
    pub(crate) in_flight: usize,
}

/// What a renewal tick comes to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Renewal {
    /// Renew these Leases, then report the round [`RenewalRounds::ended`].
    Start(Round),
    /// No node is connected: nothing to renew.
    NoneConnected,
    /// This round is still under way: a slow API server gets no second
    /// round of the same Leases on top of it.
    UnderWay(u64),
}

/// When the connected nodes' heartbeat Leases are renewed: on each tick,
/// one round at a time, the nodes connected then, a few at a time.
#[derive(Debug)]
pub(crate) struct RenewalRounds {
    under_way: Option<u64>,
    last: u64,
    in_flight: usize,
}

impl Default for RenewalRounds {
    fn default() -> Self {
        RenewalRounds::new(LEASES_IN_FLIGHT)
    }
}

impl RenewalRounds {
    /// Rounds with at most `in_flight` renewals in flight (at least one).
    pub(crate) fn new(in_flight: usize) -> RenewalRounds {
        RenewalRounds {
            under_way: None,
            last: 0,
            in_flight: in_flight.max(1),
        }
    }

    /// A tick, with `connected` the nodes linked now.
    pub(crate) fn tick(&mut self, connected: Vec<String>) -> Renewal {
        if connected.is_empty() {
            return Renewal::NoneConnected;
        }
        if let Some(round) = self.under_way {
            return Renewal::UnderWay(round);
        }
        self.last += 1;
        self.under_way = Some(self.last);
        Renewal::Start(Round {
            id: self.last,
            nodes: connected,
            in_flight: self.in_flight,
        })
    }

    /// Round `id` ended (every renewal in it answered); a word about any
    /// other round changes nothing.
    pub(crate) fn ended(&mut self, id: u64) {
        if self.under_way == Some(id) {
            self.under_way = None;
        }
    }
}

#[cfg(test)]
mod tests;
