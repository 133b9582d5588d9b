//! What the controller answers nodes' requests with, down their links
//! through cloudhub's [`NodeLinks`]: queries, writes (edgehive's and
//! KubeEdge's shapes), service account tokens, MetaServer's access reviews,
//! and KubeEdge twin syncs; and refusals, in the asker's shape.

use std::time::Duration;

use apis::devices::Device;
use apis::kinds::{Kind, ObjectKey};
use apis::tokens::TokenRequestObject;
use beehive::constants::{module, resource_type};
use beehive::resource::{CloudResource, EdgeResource};
use beehive::{Content, Message as HiveMessage};
use hub::NodeLinks;
use tracing::{debug, info, warn};

use super::Controller;
use super::kubeedge;
use super::kubeedge::Refusal;
use super::status_writes::Ticket;
use crate::desired::Object;
use crate::devicecontroller::twin_sync;

/// How long an answer to a node waits for room in cloudhub's channel.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(10);

/// Sends an answer down to its node through cloudhub.
pub(crate) fn send_to_node(links: &NodeLinks, answer: HiveMessage) {
    send_to_node_in_order(links, vec![answer]);
}

/// Sends answers down through cloudhub, each after the one before (a
/// node's answers go down its link in the order cloudhub takes them).
pub(super) fn send_to_node_in_order(links: &NodeLinks, mut answers: Vec<HiveMessage>) {
    for answer in &mut answers {
        // An answer is not an object to acknowledge.
        answer.header.resource_version.clear();
        answer.header.sync = false;
    }
    let links = links.clone();
    // tokio's spawn: answers are also sent from tasks outside actix's.
    tokio::spawn(async move {
        for answer in answers {
            // Bounded, so a cloudhub that never drains its channel leaves
            // no task behind.
            if let Err(refusal) = links.send(answer, ANSWER_TIMEOUT).await {
                return debug!(%refusal, "answer to a node not sent");
            }
        }
    });
}

impl Controller {
    /// Answers a KubeEdge node's twin sync (see [`twin_sync`]) once
    /// devices and models are listed; until then it waits.
    pub(super) fn twin_sync(&mut self, node: &str, request: HiveMessage) {
        match self.reconciler.devices_of(node) {
            Some(devices) => self.answer_twin_sync(node, &request, devices),
            None => {
                debug!(%node, "twin sync waits for devices and models to be listed");
                self.twin_syncs.insert(node.to_owned(), request);
            }
        }
    }

    /// Answers the twin syncs that waited, if devices and models are
    /// listed now, for the nodes still linked here.
    pub(super) fn answer_waiting_twin_syncs(&mut self) {
        if self.twin_syncs.is_empty() || !self.reconciler.devices_listed() {
            return;
        }
        for (node, request) in std::mem::take(&mut self.twin_syncs) {
            if let Some(devices) = self.reconciler.devices_of(&node)
                && self.reconciler.is_connected(&node)
            {
                self.answer_twin_sync(&node, &request, devices);
            }
        }
    }

    /// Sends `node` its devices, then the confirm of `request`. Nothing
    /// is sent if one cannot be read: a partial list would remove the
    /// missing devices at the edge, and the edge asks again in 60 s.
    pub(super) fn answer_twin_sync(
        &self,
        node: &str,
        request: &HiveMessage,
        devices: Vec<ObjectKey>,
    ) {
        let mut listed = Vec::with_capacity(devices.len());
        for key in &devices {
            let read = self.store.get(key).map_err(|err| err.to_string());
            let device: Device = match read.and_then(|object| {
                object
                    .map(|object| object.decode())
                    .transpose()
                    .map_err(|err| err.to_string())
            }) {
                Ok(Some(device)) => device,
                // Deleted meanwhile: not the node's any more.
                Ok(None) => continue,
                Err(err) => {
                    warn!(%node, device = %key, error = %err, "device not read; twin sync not answered");
                    return;
                }
            };
            // A model not there (or unreadable) leaves the twins typed as
            // the device's desired values say.
            let model = device.spec.device_model_ref.as_ref().and_then(|model| {
                let model = ObjectKey::new(
                    Kind::DeviceModel,
                    key.namespace.as_str(),
                    model.name.as_str(),
                );
                let object = self.store.get(&model).ok().flatten()?;
                object.decode().ok()
            });
            listed.push((device, model));
        }
        let event_id = twin_sync::event_id_of(request.content());
        let detail = twin_sync::detail(node, event_id, beehive::message::now_millis(), &listed);
        let result = match twin_sync::detail_message(node, &detail) {
            Ok(result) => result,
            Err(err) => {
                warn!(%node, error = %err, "twin sync not answered");
                return;
            }
        };
        info!(%node, devices = detail.devices.len(), "twin sync answered");
        let confirm = twin_sync::confirm_message(node, request);
        send_to_node_in_order(&self.links, vec![result, confirm]);
        self.count(|c| c.twin_syncs += 1);
    }

    /// Refuses a request that waits for an answer: a node's goes back down
    /// its link, a cloud module's to it directly.
    pub(super) fn refuse_sync(&self, msg: &HiveMessage, reason: &str) {
        if !msg.is_sync() {
            return;
        }
        let refusal = msg.error_response(module::EDGECONTROLLER, reason);
        if msg.resource().parse::<CloudResource>().is_ok() {
            self.send_to_node(refusal);
        } else {
            self.hive.send_resp(refusal);
        }
    }

    /// Answers a node's request that waits for an answer.
    pub(super) fn answer_node(&self, msg: &HiveMessage, content: Content) {
        if msg.is_sync() {
            self.send_to_node(msg.response(module::EDGECONTROLLER, content));
        }
    }

    /// Answers a KubeEdge node's write with the stored object, or with a
    /// Kubernetes Status error.
    pub(super) fn answer_write(&self, msg: &HiveMessage, written: Result<Object, Refusal>) {
        let content = match written {
            Ok(object) => kubeedge::object_answer(object.into_json()),
            Err(refusal) => refusal.answer(),
        };
        self.answer_node(msg, content);
    }

    /// Answers a KubeEdge node's write of its own Node once its status
    /// write (handed to the status writer) settled.
    pub(super) fn answer_node_write(
        &self,
        node: &str,
        msg: &HiveMessage,
        written: Result<Object, Refusal>,
    ) {
        match written {
            Ok(object) if msg.is_sync() => self.status.follow(
                ObjectKey::new(Kind::Node, "", node),
                Ticket::Object(msg.clone(), object),
            ),
            other => self.answer_write(msg, other),
        }
    }

    /// Sends an answer down to its node through cloudhub.
    pub(super) fn send_to_node(&self, answer: HiveMessage) {
        send_to_node(&self.links, answer);
    }

    /// Answers a node's request for a service account token (a KubeEdge
    /// edge's kubelet asks for each projected token itself: the resource
    /// names the service account, the content is the TokenRequest) with
    /// the TokenRequest as the API server answers it, for a pod bound to
    /// that node only.
    pub(super) fn answer_token(&self, node: &str, what: &EdgeResource, msg: &HiveMessage) {
        let asked = TokenRequestObject::from_content(msg.content());
        let bound = asked
            .as_ref()
            .and_then(|asked| asked.spec.bound_object_ref.clone())
            .filter(|pod| !pod.name.is_empty() && !pod.uid.is_empty());
        let (Some(mut asked), Some(pod)) = (asked, bound) else {
            return self.refuse_sync(msg, "a token request names the pod it is bound to");
        };
        let (pod_name, uid) = (pod.name.as_str(), pod.uid.as_str());
        let key = ObjectKey::new(Kind::Pod, what.namespace.as_str(), pod_name);
        if !self.reconciler.may_report(node, &key) {
            warn!(%node, pod = %key, "token request for a pod not bound to the node refused");
            return self.refuse_sync(msg, "the pod is not bound to this node");
        }
        let request =
            apis::tokens::requested(&what.namespace, &what.name, &asked.spec, (pod_name, uid));
        let (store, links) = (self.store.clone(), self.links.clone());
        let msg = msg.clone();
        actix::spawn(async move {
            let answer = match store.request_token(request).await {
                Ok(status) => {
                    asked.status = Some(status);
                    msg.response(module::EDGECONTROLLER, asked.content())
                }
                Err(err) => msg.error_response(module::EDGECONTROLLER, err.to_string()),
            };
            send_to_node(&links, answer);
        });
    }

    /// Answers a node's review of a request its MetaServer was asked with
    /// a service account token. The answer goes to that node only (the
    /// node is the link's), and says nothing of the token.
    pub(super) fn answer_review(&self, node: &str, msg: &HiveMessage) {
        let review = match msg.body::<apis::access::AccessReview>() {
            Ok(review) => review,
            Err(_) => return self.refuse_sync(msg, "an access review does not read"),
        };
        let (access, links, msg, node) = (
            self.config.token_access.clone(),
            self.links.clone(),
            msg.clone(),
            node.to_owned(),
        );
        actix::spawn(async move {
            let answer = crate::reviews::review_edge_request(access.as_ref(), &node, &review).await;
            let answer = match answer.and_then(|a| Content::of(&a).map_err(|e| e.to_string())) {
                Ok(answer) => msg.response(module::EDGECONTROLLER, answer),
                Err(reason) => {
                    warn!(%node, verb = %review.attributes.verb, path = %review.attributes.path, %reason, "no decision for a MetaServer request");
                    msg.error_response(module::EDGECONTROLLER, reason)
                }
            };
            send_to_node(&links, answer);
        });
    }

    /// Answers a node's query with an object it is entitled to: its pods,
    /// what they reference, services and endpoints, and its own Node.
    pub(super) fn answer_query(&self, node: &str, what: &EdgeResource, msg: &HiveMessage) {
        self.count(|c| c.queries += 1);
        if what.resource_type == resource_type::SERVICE_ACCOUNT_TOKEN {
            return self.answer_token(node, what, msg);
        }
        if what.resource_type == resource_type::ACCESS_REVIEW {
            return self.answer_review(node, msg);
        }
        let entitled =
            ObjectKey::from_edge_resource(what).filter(|key| self.reconciler.entitled(node, key));
        let found = entitled.and_then(|key| self.store.get(&key).ok().flatten());
        if what.resource_type == resource_type::NODE && self.reconciler.is_kubeedge(node) {
            // A kubelet reads its Node as a write's answer: {Object, Err}.
            let answer = match found {
                Some(object) => kubeedge::object_answer(object.into_json()),
                None => Refusal::not_found(format!("node {:?} not found", what.name)).answer(),
            };
            return self.send_to_node(msg.response(module::EDGECONTROLLER, answer));
        }
        self.send_to_node(match found {
            Some(object) => msg.response(module::EDGECONTROLLER, object.content()),
            None => msg.error_response(
                module::EDGECONTROLLER,
                format!("{what} not found for node {node}"),
            ),
        });
    }
}
