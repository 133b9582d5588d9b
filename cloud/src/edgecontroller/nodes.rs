//! A node's own objects, as the controller keeps them: its Node (adopted
//! when it registers, patched, its status written coalesced and refreshed
//! every five minutes as a kubelet's), its Lease (renewed for linked nodes),
//! and nodes no replica holds (marked unreachable).

// The controller's types and imports.
use super::*;

/// How often a node's unchanged status is written all the same (a
/// kubelet's `nodeStatusReportFrequency`): its Lease, renewed every 10 s,
/// is the heartbeat the node lifecycle controller reads in between.
pub(super) const NODE_STATUS_REFRESH: Duration = Duration::from_secs(300);

/// Whether the stored node status needs no write for `new`: they differ in
/// heartbeat times at most, and the stored heartbeat is younger than
/// [`NODE_STATUS_REFRESH`] at `now`.
pub(super) fn node_status_current(stored: &Value, new: &Value, now: Time) -> bool {
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

impl Controller {
    /// Renews every connected node's heartbeat Lease, off the
    /// controller's task (a slow API server delays no message).
    pub(super) fn renew_leases(&self) {
        let nodes = self.reconciler.connected_nodes();
        // One round at a time: a slow API server gets no second round of
        // the same Leases on top of the first.
        if nodes.is_empty()
            || self
                .renewing
                .swap(true, std::sync::atomic::Ordering::AcqRel)
        {
            return;
        }
        let renewing = self.renewing.clone();
        let (store, counts, duration) = (
            self.store.clone(),
            self.counts.clone(),
            self.config.lease_duration,
        );
        actix::spawn(async move {
            // A few at a time: kube's client speaks HTTP/1.1, so every
            // renewal in flight is a connection of its own, and a round
            // of 1,000 at once opened 1,000 TLS connections to the API
            // server and kept them in the pool (some 40 MB of cloudcore's
            // heap at 1,000 nodes, and a peak three times that).
            let mut renewals = futures_util::stream::iter(nodes)
                .map(|node| {
                    let renewed = store.renew_lease(&node, duration);
                    async move { (node, renewed.await) }
                })
                .buffer_unordered(LEASES_IN_FLIGHT);
            while let Some((node, renewed)) = renewals.next().await {
                match renewed {
                    Ok(()) => counts.send_modify(|c| c.leases_renewed += 1),
                    Err(err) => warn!(%node, error = %err, "node lease not renewed"),
                }
            }
            renewing.store(false, std::sync::atomic::Ordering::Release);
        });
    }

    /// Takes what a node says of its own Node object (its registration, or
    /// a patch of it applied to the stored object): its labels,
    /// annotations and status. Returns the object as stored.
    pub(super) async fn adopt_node(&mut self, node: &str, given: &Value) -> Result<Value, Refusal> {
        let key = ObjectKey::new(Kind::Node, "", node);
        match given.get("status").filter(|status| !status.is_null()) {
            Some(status) => {
                let what = EdgeResource::new("default", resource_type::NODE_STATUS, node);
                self.node_status(node, &what, status, None).await?;
            }
            None => self.update_node(node, None).await,
        }
        // With the status just handed to the writer.
        let mut object = self
            .store
            .get(&key)
            .map(|held| self.status.current(&key, held))
            .map_err(|err| Refusal::internal(err.to_string()))?
            .ok_or_else(|| Refusal::internal(format!("node {node} not stored")))?;
        let before = object.clone();
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
        if object == before {
            return Ok(object);
        }
        self.store
            .replace(unconditional(object))
            .await
            .map_err(|err| Refusal::internal(err.to_string()))
    }

    /// Applies a KubeEdge node's patch of its own Node object.
    pub(super) async fn patch_node(
        &mut self,
        node: &str,
        what: &EdgeResource,
        content: &Value,
    ) -> Result<Value, Refusal> {
        if what.name != node {
            return Err(Refusal::forbidden("a node patches only itself"));
        }
        let patch = kubeedge::patch_of(content).map_err(Refusal::bad_request)?;
        self.update_node(node, None).await;
        let key = ObjectKey::new(Kind::Node, "", node);
        let mut object = self
            .store
            .get(&key)
            .map_err(|err| Refusal::internal(err.to_string()))?
            .unwrap_or_default();
        kubeedge::strategic_merge(&mut object, &patch);
        let adopted = self.adopt_node(node, &object).await?;
        self.count(|c| c.patches += 1);
        Ok(adopted)
    }

    /// A KubeEdge node's lease: its own only, kept in memory, answered as
    /// a kubelet expects (NotFound before the first is written).
    pub(super) fn lease(&mut self, node: &str, what: &EdgeResource, msg: &HiveMessage) {
        if what.name != node {
            let refusal = Refusal::forbidden("a node holds only its own lease");
            return self.answer_node(msg, refusal.answer());
        }
        let answer = match msg.operation() {
            operation::QUERY => match self.leases.get(node) {
                Some(lease) => kubeedge::object_answer(lease.clone()),
                None => {
                    Refusal::not_found(format!("leases.coordination.k8s.io {node:?} not found"))
                        .answer()
                }
            },
            operation::INSERT | operation::UPDATE => {
                let mut lease = msg.content().clone();
                let version = self
                    .leases
                    .get(node)
                    .and_then(|held| held.pointer("/metadata/resourceVersion"))
                    .and_then(Value::as_str)
                    .and_then(|v| v.parse::<u64>().ok())
                    .unwrap_or(0)
                    + 1;
                if let Some(metadata) = lease.get_mut("metadata").and_then(Value::as_object_mut) {
                    metadata.insert("resourceVersion".into(), json!(version.to_string()));
                }
                self.leases.insert(node.to_owned(), lease.clone());
                kubeedge::object_answer(lease)
            }
            other => Refusal::bad_request(format!("{other} of a lease")).answer(),
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
        let refused = |refusal: Refusal| {
            self.refuse_status(node, what, &refusal.message);
            Err(refusal)
        };
        if what.name != node {
            return refused(Refusal::forbidden("a node reports only its own status"));
        }
        let Ok(reported) = NodeStatus::deserialize(status) else {
            return refused(Refusal::invalid("not a NodeStatus"));
        };
        if let Some(ready) = reported
            .conditions
            .iter()
            .flatten()
            .find(|c| c.type_ == "Ready")
        {
            self.reconciler.reported_ready(node, ready.clone());
        }
        let held = self.config.claims.as_ref().is_none_or(|c| c.holds(node));
        let submitted = match held {
            // Counted in `status_applied` once written.
            true => self.write_node(node, Some(reported), None, ticket).await,
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

    /// Writes the node's object (creating it on first sight, labelled as
    /// an edge node): its reported status if given, and its `Ready`
    /// condition from the link and the node's own report. With replicas,
    /// only as the node's holder; a node this replica does not hold is
    /// marked unreachable if no replica holds it ([`Input::Unclaimed`]).
    pub(super) async fn update_node(&mut self, node: &str, reported: Option<NodeStatus>) {
        let held = self.config.claims.as_ref().is_none_or(|c| c.holds(node));
        if held {
            self.write_node(node, reported, None, None).await;
            return;
        }
        if reported.is_some() {
            return debug!(%node, "status of a node this replica does not hold: not written");
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
        let shown_linked = |node: &Value| {
            node.pointer("/status/conditions")
                .and_then(Value::as_array)
                .is_some_and(|conditions| {
                    conditions
                        .iter()
                        .any(|c| c["type"] == reconciler::LINK_CONDITION && c["status"] == "True")
                })
        };
        let candidates: Vec<(String, String)> = nodes
            .iter()
            .filter(|node| shown_linked(node))
            .filter_map(|node| {
                let name = node.pointer("/metadata/name")?.as_str()?;
                let linked_here = self.reconciler.is_connected(name);
                (!linked_here).then(|| Some((name.to_owned(), version_of(node)?)))?
            })
            .collect();
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

    /// [`Controller::update_node`]'s write, handed to the status writer:
    /// unconditional (`at` is `None`: this replica serves the node), or
    /// only if the stored Node is still at version `at`. `ticket` waits
    /// for the write (answered now if none is needed). Whether a write was
    /// handed over.
    pub(super) async fn write_node(
        &mut self,
        node: &str,
        reported: Option<NodeStatus>,
        at: Option<&str>,
        ticket: Option<Ticket>,
    ) -> bool {
        let report = reported.is_some();
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
        if let Some(at) = at
            && existing.as_ref().and_then(version_of).as_deref() != Some(at)
        {
            debug!(%node, "node written since it was read: not marked");
            return false;
        }
        let mut status = match reported {
            Some(reported) => reported,
            None => existing
                .as_ref()
                .and_then(|object| object.get("status"))
                .and_then(|s| NodeStatus::deserialize(s).ok())
                .unwrap_or_default(),
        };
        if let (Some(endpoint), None) = (&self.config.kubelet_endpoint, at) {
            endpoint.apply(&mut status);
        }
        if !self.reconciler.is_kubeedge(node) {
            // Before its edged reports (or with edged off), kubectl still
            // shows which edgehive serves the node.
            let info = status.node_info.get_or_insert_with(Default::default);
            if info.kubelet_version.is_empty() {
                info.kubelet_version = apis::KUBELET_VERSION.to_owned();
            }
        }
        let ready = self.reconciler.ready_condition(node, now());
        let conditions = status.conditions.get_or_insert_with(Vec::new);
        let previous = conditions.iter().position(|c| c.type_ == "Ready");
        let ready = match previous.map(|i| conditions.remove(i)) {
            // The transition time moves only when the status does.
            Some(old) if old.status == ready.status => NodeCondition {
                last_transition_time: old.last_transition_time,
                ..ready
            },
            _ => ready,
        };
        conditions.insert(0, ready);
        // The link's own condition: Ready may say NotReady for other
        // reasons, and a node within its offline window keeps its pods.
        let link = self.reconciler.link_condition(node, now());
        let link = match conditions.iter().position(|c| c.type_ == link.type_) {
            Some(i) => {
                let old = conditions.remove(i);
                match old.status == link.status {
                    true => NodeCondition {
                        last_transition_time: old.last_transition_time,
                        ..link
                    },
                    false => link,
                }
            }
            None => link,
        };
        conditions.insert(1, link);
        let status = match serde_json::to_value(&status) {
            Ok(status) => status,
            Err(err) => {
                warn!(%node, error = %err, "node status unwritable");
                self.answer_now(ticket);
                return false;
            }
        };
        let object = match existing {
            Some(mut object) => {
                if object
                    .get("status")
                    .is_some_and(|stored| node_status_current(stored, &status, now()))
                {
                    // As a kubelet: an unchanged status is written once
                    // every few minutes, the node's Lease is its heartbeat.
                    self.answer_now(ticket);
                    return false;
                }
                object["status"] = status;
                match at {
                    // The node's holder is the only writer of its status.
                    None => unconditional(object),
                    Some(_) => object,
                }
            }
            None => {
                let object = json!({
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
                });
                // Created once, here (the registration a node's status
                // needs); its status goes to the writer as any other.
                match self.store.create(object).await {
                    // Created (or by an earlier write whose change has not
                    // come back yet): its status follows.
                    Ok(mut created) => {
                        created["status"] = status;
                        unconditional(created)
                    }
                    Err(DesiredError::AlreadyExists { .. }) => {
                        let mut object = json!({
                            "apiVersion": "v1",
                            "kind": "Node",
                            "metadata": {"name": node},
                        });
                        object["status"] = status;
                        object
                    }
                    Err(err) => {
                        warn!(%node, error = %err, "node not stored");
                        self.answer_now(ticket);
                        return false;
                    }
                }
            }
        };
        match at {
            Some(_) => self.status.mark(key, object, node),
            None => self.status.submit(key, object, ticket, report),
        }
        true
    }
}

#[cfg(test)]
mod node_status_tests {
    use super::*;

    #[test]
    fn an_unchanged_node_status_is_written_every_five_minutes_only() {
        let status = |beat: &str, ready: &str| {
            json!({"conditions": [
                {"type": "Ready", "status": ready, "lastHeartbeatTime": beat},
                {"type": "EdgeLink", "status": "True", "lastHeartbeatTime": beat},
            ], "nodeInfo": {"kubeletVersion": "v1"}})
        };
        let at = |text: &str| Time(text.parse().expect("time"));
        let stored = status("2026-11-27T10:00:00Z", "True");
        // The same status with a newer heartbeat: not written within five
        // minutes, written after.
        let beat = status("2026-11-27T10:04:00Z", "True");
        assert!(node_status_current(
            &stored,
            &beat,
            at("2026-11-27T10:04:00Z")
        ));
        assert!(!node_status_current(
            &stored,
            &beat,
            at("2026-11-27T10:05:01Z")
        ));
        // Anything else changed: written at once.
        let changed = status("2026-11-27T10:00:10Z", "False");
        assert!(!node_status_current(
            &stored,
            &changed,
            at("2026-11-27T10:00:10Z")
        ));
        let mut other = stored.clone();
        other["nodeInfo"]["kubeletVersion"] = json!("v2");
        assert!(!node_status_current(
            &stored,
            &other,
            at("2026-11-27T10:00:00Z")
        ));
        assert!(node_status_current(
            &stored,
            &stored,
            at("2026-11-27T11:00:00Z")
        ));
    }
}
