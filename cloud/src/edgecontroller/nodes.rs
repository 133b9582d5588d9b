//! A node's own objects, as the controller reads and writes them around
//! the rules of [`adoption`] and [`leases`]: its Node (adopted when it
//! registers, patched, its status handed to the status writer), its Lease
//! (answered from memory; the heartbeat Leases of linked nodes renewed in
//! rounds), and nodes no replica holds (marked unreachable).

use std::collections::HashSet;

use apis::kinds::{Kind, ObjectKey};
use beehive::constants::resource_type;
use beehive::resource::EdgeResource;
use beehive::{Content, Message as HiveMessage};
use futures_util::StreamExt;
use serde_json::Value;
use tokio::sync::mpsc;
use tracing::{debug, warn};

use super::adoption::{Adopted, NodeFacts, NodeWrite, StatusSource, version_of};
use super::kubeedge::Refusal;
use super::leases::{LeaseAnswer, Renewal};
use super::requests::LeaseRequest;
use super::status_writes::Ticket;
use super::{Controller, Input};
use super::{adoption, kubeedge};
use crate::desired::{DesiredError, Object};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

/// Now, to the second (as Kubernetes writes condition times).
fn now() -> Time {
    let now = jiff::Timestamp::now();
    Time(jiff::Timestamp::from_second(now.as_second()).unwrap_or(now))
}

/// Tells the controller a round of Lease renewals ended, when dropped.
struct RoundEnd {
    ended: mpsc::UnboundedSender<u64>,
    id: u64,
}

impl Drop for RoundEnd {
    fn drop(&mut self) {
        let _ = self.ended.send(self.id);
    }
}

impl Controller {
    /// Starts a round of heartbeat Lease renewals of the connected nodes,
    /// if [`leases::RenewalRounds`] says so, off the controller's task (a
    /// slow API server delays no message); its end comes back on
    /// `renewals_ended`.
    pub(super) fn renew_leases(&mut self) {
        let round = match self.renewals.tick(self.reconciler.connected_nodes()) {
            Renewal::Start(round) => round,
            Renewal::NoneConnected | Renewal::UnderWay(_) => return,
        };
        let (store, counts, duration, ended) = (
            self.store.clone(),
            self.counts.clone(),
            self.config.lease_duration,
            self.renewals_ended.clone(),
        );
        // The round's end is told however its task ends, a panic or a
        // drop before its first poll included: a round never told would
        // stop renewals for good.
        let end = RoundEnd {
            ended,
            id: round.id,
        };
        actix::spawn(async move {
            let _end = end;
            // A few at a time: kube's client speaks HTTP/1.1, so every
            // renewal in flight is a connection of its own, and a round
            // of 1,000 at once opened 1,000 TLS connections to the API
            // server and kept them in the pool (some 40 MB of cloudcore's
            // heap at 1,000 nodes, and a peak three times that).
            let mut renewals = futures_util::stream::iter(round.nodes)
                .map(|node| {
                    // A renewal slower than the Lease's own duration is of
                    // no use, and must not hold the round (and the next).
                    let renewed =
                        tokio::time::timeout(duration, store.renew_lease(&node, duration));
                    async move { (node, renewed.await) }
                })
                .buffer_unordered(round.in_flight);
            // Each renewal is bounded, the round is not: against a hung
            // API server it takes its renewals' timeouts in turn (nothing
            // would renew meanwhile anyway), and once the server answers
            // again the rest go through at its pace. A round cut short
            // instead would start over from the same first nodes each
            // tick and, under a slow server, never reach the last ones.
            while let Some((node, renewed)) = renewals.next().await {
                match renewed {
                    Ok(Ok(())) => counts.send_modify(|c| c.leases_renewed += 1),
                    Ok(Err(err)) => warn!(%node, error = %err, "node lease not renewed"),
                    Err(_) => warn!(%node, ?duration, "node lease renewal timed out"),
                }
            }
        });
    }

    /// Takes what a node says of its own Node object (its registration, or
    /// a patch of it applied to the stored object): its labels,
    /// annotations and status. Returns the object as stored.
    pub(super) async fn adopt_node(
        &mut self,
        node: &str,
        given: &Value,
    ) -> Result<Object, Refusal> {
        let key = ObjectKey::new(Kind::Node, "", node);
        match adoption::given_status(given) {
            Some(status) => {
                let what = EdgeResource::new("default", resource_type::NODE_STATUS, node);
                self.node_status(node, &what, status, None).await?;
            }
            None => self.update_node(node).await,
        }
        // With the status just handed to the writer.
        let stored = self
            .store
            .get(&key)
            .map(|held| self.status.current(&key, held))
            .map_err(|err| Refusal::internal(err.to_string()))?
            .ok_or_else(|| Refusal::internal(format!("node {node} not stored")))?;
        match adoption::adopted(stored, given) {
            Adopted::AsStored(object) => Ok(object),
            Adopted::Replace(object) => self
                .store
                .replace(object)
                .await
                .map_err(|err| Refusal::internal(err.to_string())),
        }
    }

    /// Applies a KubeEdge node's patch of its own Node object.
    pub(super) async fn patch_node(
        &mut self,
        node: &str,
        what: &EdgeResource,
        content: &Content,
    ) -> Result<Object, Refusal> {
        let patch = adoption::own_patch(node, what, content)?;
        self.update_node(node).await;
        let key = ObjectKey::new(Kind::Node, "", node);
        let stored = self
            .store
            .get(&key)
            .map_err(|err| Refusal::internal(err.to_string()))?;
        let adopted = self
            .adopt_node(node, &adoption::patched(stored, &patch))
            .await?;
        self.count(|c| c.patches += 1);
        Ok(adopted)
    }

    /// Answers a KubeEdge node's `request` of its Lease (`what`) from
    /// [`leases::LeaseBook`].
    pub(super) fn lease(
        &mut self,
        node: &str,
        what: &EdgeResource,
        request: LeaseRequest,
        msg: &HiveMessage,
    ) {
        let answer = match self.leases.answer(node, &what.name, request, msg.content()) {
            LeaseAnswer::Lease(lease) => kubeedge::object_answer(lease),
            LeaseAnswer::Refused(why) => why.refusal(node, msg.operation()).answer(),
        };
        self.answer_node(msg, answer);
    }

    /// Takes `node`'s report of its own status, `ticket` waiting for its
    /// write.
    pub(super) async fn node_status(
        &mut self,
        node: &str,
        what: &EdgeResource,
        status: &Value,
        ticket: Option<Ticket>,
    ) -> Result<(), Refusal> {
        let reported = match adoption::own_status(node, what, status) {
            Ok(reported) => reported,
            Err(refused) => {
                let refusal = Refusal::from(refused);
                self.refuse_status(node, what, &refusal.message);
                return Err(refusal);
            }
        };
        if let Some(ready) = adoption::reported_ready(&reported) {
            self.reconciler.reported_ready(node, ready.clone());
        }
        let submitted = match self.holds(node) {
            // Counted in `status_applied` once written.
            true => {
                let source = StatusSource::Report(Box::new(reported));
                self.write_node(node, source, ticket).await
            }
            false => {
                debug!(%node, "status of a node this replica does not hold: not written");
                self.answer_now(ticket);
                false
            }
        };
        if !submitted {
            self.count(|c| c.status_applied += 1);
        }
        Ok(())
    }

    /// Whether this replica writes `node`'s status: it holds the node, or
    /// there are no replicas.
    fn holds(&self, node: &str) -> bool {
        self.config.claims.as_ref().is_none_or(|c| c.holds(node))
    }

    /// Writes the node's object (creating it on first sight, labelled as
    /// an edge node) with its `Ready` condition from the link and the
    /// node's own report. With replicas, only as the node's holder; a node
    /// this replica does not hold is marked unreachable if no replica holds
    /// it ([`Input::Unclaimed`]).
    pub(super) async fn update_node(&mut self, node: &str) {
        if self.holds(node) {
            self.write_node(node, StatusSource::Refresh, None).await;
            return;
        }
        let key = ObjectKey::new(Kind::Node, "", node);
        if let Some(version) = self
            .store
            .get(&key)
            .ok()
            .flatten()
            .as_ref()
            .and_then(version_of)
        {
            self.mark_if_unclaimed(vec![(node.to_owned(), version)]);
        }
    }

    /// Finds the Nodes shown linked (by the link condition this controller
    /// writes) that no replica links here, and marks those no replica
    /// holds unreachable: their replica died, and they did not link again.
    pub(super) fn sweep_unclaimed(&self) {
        let nodes = match self.store.list(Kind::Node, None) {
            Ok((nodes, _)) => nodes,
            Err(err) => return debug!(error = %err, "nodes not listed; no sweep this round"),
        };
        let candidates =
            adoption::shown_linked_elsewhere(&nodes, |node| self.reconciler.is_connected(node));
        if !candidates.is_empty() {
            self.mark_if_unclaimed(candidates);
        }
    }

    /// Asks the claims which of `nodes` no replica holds; those come back
    /// as an [`Input::Unclaimed`], with the version each was read at
    /// before the question (so a claim taken after the answer, and its
    /// holder's write, make the mark's write fail, not overwrite it).
    pub(super) fn mark_if_unclaimed(&self, nodes: Vec<(String, String)>) {
        let Some(claims) = self.config.claims.clone() else {
            return;
        };
        let (inbox, timeout) = (self.inbox.clone(), self.config.send_timeout);
        actix::spawn(async move {
            let names = nodes.iter().map(|(node, _)| node.clone()).collect();
            let unclaimed = match tokio::time::timeout(timeout, claims.unclaimed(names)).await {
                Ok(Ok(unclaimed)) => unclaimed.into_iter().collect::<HashSet<_>>(),
                Ok(Err(err)) => return debug!(error = %err, "claims not read; no node marked"),
                Err(_) => return debug!("claims not read in time; no node marked"),
            };
            let nodes: Vec<_> = nodes
                .into_iter()
                .filter(|(node, _)| unclaimed.contains(node))
                .collect();
            if !nodes.is_empty() {
                let _ = inbox.send(Input::Unclaimed(nodes)).await;
            }
        });
    }

    /// Marks unreachable the `nodes` no replica holds (each with the
    /// version its Node was read at), but those linked here meanwhile.
    pub(super) async fn mark_unclaimed(&mut self, nodes: Vec<(String, String)>) {
        for (node, version) in nodes {
            if !self.reconciler.is_connected(&node) {
                self.write_node(&node, StatusSource::Mark(&version), None)
                    .await;
            }
        }
    }

    /// Hands the node's object, as [`adoption::status_write`] makes it
    /// from `source`, to the status writer (a mark conditioned on the
    /// version it was read at). `ticket` waits for the write (answered now
    /// if none is needed). Whether a write was handed over.
    pub(super) async fn write_node(
        &mut self,
        node: &str,
        source: StatusSource<'_>,
        ticket: Option<Ticket>,
    ) -> bool {
        let report = matches!(source, StatusSource::Report(_));
        let marked = matches!(source, StatusSource::Mark(_));
        let key = ObjectKey::new(Kind::Node, "", node);
        let existing = match self.store.get(&key) {
            // With the status last handed to the writer, if the view does
            // not show it yet.
            Ok(existing) => self.status.current(&key, existing),
            Err(err) => {
                warn!(%node, error = %err, "node unreadable");
                self.answer_now(ticket);
                return false;
            }
        };
        let now = now();
        let facts = NodeFacts {
            ready: self.reconciler.ready_condition(node, now.clone()),
            link: self.reconciler.link_condition(node, now.clone()),
            kubeedge: self.reconciler.is_kubeedge(node),
            endpoint: self.config.kubelet_endpoint.as_ref(),
        };
        let object = match adoption::status_write(node, existing, source, facts, now) {
            NodeWrite::Write(object) => object,
            NodeWrite::Create { object, status } => match self.store.create(object).await {
                // Created once, here (the registration a node's status
                // needs); its status goes to the writer as any other.
                Ok(created) => adoption::after_create(node, Some(created), status),
                Err(DesiredError::AlreadyExists { .. }) => {
                    adoption::after_create(node, None, status)
                }
                Err(err) => {
                    warn!(%node, error = %err, "node not stored");
                    self.answer_now(ticket);
                    return false;
                }
            },
            NodeWrite::WrittenSince => {
                debug!(%node, "node written since it was read: not marked");
                return false;
            }
            // As a kubelet: an unchanged status is written once every few
            // minutes, the node's Lease is its heartbeat.
            NodeWrite::Current => {
                self.answer_now(ticket);
                return false;
            }
            NodeWrite::Unwritable(err) => {
                warn!(%node, error = %err, "node status unwritable");
                self.answer_now(ticket);
                return false;
            }
        };
        match marked {
            true => self.status.mark(key, object, node),
            false => self.status.submit(key, object, ticket, report),
        }
        true
    }
}
