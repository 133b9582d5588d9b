//! What nodes say: cloudhub's word on their links, their messages sorted
//! by request and answered, and their word that a deleted pod stopped.

use apis::kinds::{Kind, ObjectKey, valid_name};
use apis::termination::PodTerminated;
use beehive::resource::CloudResource;
use beehive::{Content, Message as HiveMessage};
use hub::{Dialect, NodeEvent, NodeEventKind};
use serde_json::Value;
use tracing::{debug, info, warn};

use super::Controller;
use super::adoption;
use super::kubeedge::{self, Refusal};
use super::reconciler::{NodeDialect, Termination};
use super::requests::NodeRequest;
use super::status_writes::Ticket;

impl Controller {
    /// A node linked or unlinked here, or holds a deletion.
    pub(super) async fn on_node_event(&mut self, event: NodeEvent) {
        let NodeEvent { node, kind } = event;
        if !valid_name(&node) {
            warn!(%node, "node event for an invalid node name ignored");
            return;
        }
        let actions = match kind {
            NodeEventKind::Deleted(resource) => {
                let Some(key) = ObjectKey::from_edge_resource(&resource) else {
                    return;
                };
                self.reconciler.delivered(&node, &key)
            }
            NodeEventKind::Connected(dialect) => {
                self.count(|c| c.node_events += 1);
                let dialect = match dialect {
                    Dialect::KubeEdge => NodeDialect::KubeEdge,
                    Dialect::Native => NodeDialect::Native,
                };
                self.reconciler.connected(&node, dialect, &self.store)
            }
            // Served by another replica now: nothing to say of it here.
            NodeEventKind::ServedElsewhere => {
                self.count(|c| c.node_events += 1);
                self.twin_syncs.remove(&node);
                self.reconciler.served_elsewhere(&node);
                return;
            }
            NodeEventKind::Disconnected => {
                self.count(|c| c.node_events += 1);
                self.twin_syncs.remove(&node);
                self.reconciler.disconnected(&node)
            }
        };
        self.act(actions).await;
    }

    pub(super) async fn on_message(&mut self, msg: HiveMessage) {
        let Ok(resource) = msg.resource().parse::<CloudResource>() else {
            debug!(resource = msg.resource(), "message without a node; ignored");
            self.refuse_sync(&msg, "no node/<node>/ in the resource");
            return;
        };
        let node = resource.node.clone();
        let edge = resource.resource;
        match NodeRequest::of(&node, &edge, msg.operation()) {
            NodeRequest::TwinSync => self.twin_sync(&node, msg),
            NodeRequest::Lease(request) => self.lease(&node, &edge, request, &msg),
            NodeRequest::Query => self.answer_query(&node, &edge, &msg),
            NodeRequest::RegisterNode => {
                let given = msg.body::<Value>().unwrap_or_default();
                let answer = self.adopt_node(&node, &given).await;
                self.answer_node_write(&node, &msg, answer);
            }
            NodeRequest::ForeignNode => {
                let answer = Err(adoption::NodeRefused::RegistersAnother.into());
                self.answer_node_write(&node, &msg, answer);
            }
            NodeRequest::PatchNode => {
                let answer = self.patch_node(&node, &edge, msg.content()).await;
                self.answer_node_write(&node, &msg, answer);
            }
            NodeRequest::NodeStatus => {
                let status = kubeedge::status_of(msg.content());
                // Answered "OK" by the status writer once written.
                let ticket = msg.is_sync().then(|| Ticket::Replace(msg.clone()));
                if let Err(refusal) = self.node_status(&node, &edge, &status, ticket).await {
                    self.refuse_sync(&msg, &refusal.message)
                }
            }
            NodeRequest::PodTerminated => {
                let answer = match PodTerminated::of(&edge.namespace, &edge.name, &msg) {
                    Some(stopped) => self.pod_terminated(&node, stopped).await,
                    None => Err(Refusal::bad_request("a pod's delete names its uid")),
                };
                match answer {
                    Ok(()) => self.answer_node(&msg, Content::text("OK")),
                    Err(refusal) => self.answer_node(&msg, kubeedge::status_error(&refusal)),
                }
            }
            NodeRequest::PodPatch => {
                // A readable one is a status report, taken with the others.
                let reason = kubeedge::patch_of(msg.content()).err();
                let reason = reason.unwrap_or_else(|| "unreadable patch".to_owned());
                self.answer_write(&msg, Err(Refusal::bad_request(reason)));
            }
            NodeRequest::Other => {
                debug!(%node, op = msg.operation(), kind = %edge.resource_type, "not for the edgecontroller; ignored");
                self.refuse_sync(&msg, "the edgecontroller does not take this");
            }
        }
    }

    /// Takes `node`'s word that a pod stopped there (edgehive's edge, or a
    /// KubeEdge kubelet's delete of its pod): a graceful deletion of that
    /// pod on that node is finished. `Ok` once the pod is gone (or was),
    /// the answer a KubeEdge kubelet takes as done.
    async fn pod_terminated(&mut self, node: &str, stopped: PodTerminated) -> Result<(), Refusal> {
        let key = ObjectKey::new(Kind::Pod, stopped.namespace.as_str(), stopped.name.as_str());
        match self
            .reconciler
            .terminated(node, &key, stopped.uid.as_deref())
        {
            Termination::Finish { key, uid } => self.finish_deletion(&key, uid.as_deref()).await,
            Termination::Gone => Ok(()),
            Termination::Kept => {
                debug!(%node, pod = %key, "stopped before its deletion shows here; kept");
                // A kubelet asks again; the word is kept meanwhile.
                Err(Refusal::conflict(format!(
                    "{key} is not seen being deleted yet"
                )))
            }
            Termination::Refused(reason) => {
                warn!(%node, pod = %key, %reason, "a node's word for a pod not bound to it refused");
                Err(Refusal::forbidden(reason))
            }
        }
    }

    /// Removes `key` from the desired state, its graceful deletion done
    /// (`uid` as precondition, so a new pod of that name stays). A failure
    /// has its node told of the deletion again on the next retry.
    pub(super) async fn finish_deletion(
        &mut self,
        key: &ObjectKey,
        uid: Option<&str>,
    ) -> Result<(), Refusal> {
        match self.store.finish_deletion(key, uid).await {
            Ok(()) => {
                info!(%key, "deletion finished: its node says it stopped");
                Ok(())
            }
            Err(err) => {
                warn!(%key, error = %err, "deletion not finished");
                self.reconciler.unfinished(key);
                Err(Refusal::internal(err.to_string()))
            }
        }
    }
}
