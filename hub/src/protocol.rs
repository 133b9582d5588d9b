//! What the hubs say to each other besides the objects they carry: the
//! hello that opens a session, keepalives, and acknowledgements. All are
//! ordinary beehive messages in the `hub` group.

use beehive::IntoRouteName as _;
use beehive::constants::{group, operation};
use beehive::resource::{CloudResource, EdgeResource};
use beehive::{Content, Message, SmolStr};
use serde::{Deserialize, Serialize};

/// Operation of the first message on a link.
pub const HELLO: &str = "hello";

/// What an edge says first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    /// The node this edge is.
    pub node: String,
}

/// The hello message of `node`.
pub fn hello(node: &str) -> Message {
    Message::new()
        .build_router("edgehub", group::HUB, format!("node/{node}"), HELLO)
        .with_content(
            Content::of(&Hello {
                node: node.to_owned(),
            })
            .expect("a name encodes"),
        )
}

/// A keepalive from `source`.
pub fn keepalive(source: &'static str) -> Message {
    Message::new().build_router(source, group::HUB, "node", operation::KEEPALIVE)
}

/// The acknowledgement of `msg`: a response in the hub group whose
/// `parent_id` is `msg`'s id.
pub fn ack(msg: &Message, source: &'static str) -> Message {
    let mut ack = msg.response(source, Content::Empty);
    ack.router.group = group::HUB.into_route_name();
    ack
}

/// What a message on a link is, for the hub.
#[derive(Debug, PartialEq, Eq)]
pub enum Kind {
    /// A session opener.
    Hello,
    /// Liveness only.
    Keepalive,
    /// Acknowledges the message with this id.
    Ack(beehive::Uuid),
    /// Anything else: an object or a request for the modules.
    Payload,
}

/// Classifies a message received on a link.
pub fn kind(msg: &Message) -> Kind {
    if msg.group() != group::HUB {
        return Kind::Payload;
    }
    match (msg.operation(), msg.parent_id()) {
        (HELLO, _) => Kind::Hello,
        (operation::KEEPALIVE, _) => Kind::Keepalive,
        (operation::RESPONSE, Some(parent)) => Kind::Ack(parent),
        _ => Kind::Payload,
    }
}

/// Whether a downstream message is an object that must be acknowledged:
/// one that carries a resource version (KubeEdge's rule).
pub fn needs_ack(msg: &Message) -> bool {
    !msg.resource_version().is_empty()
}

/// Why a message from a node was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// It names another node.
    #[error("node {node:?} sent a message for node {named:?}")]
    ForeignNode {
        /// The sender.
        node: String,
        /// The node named in the message.
        named: String,
    },
    /// Its resource string is not understood.
    #[error("node {node:?} sent an unreadable resource {resource:?}")]
    BadResource {
        /// The sender.
        node: String,
        /// The resource.
        resource: String,
    },
}

/// Rewrites an upstream message from `node` into the cloud's form
/// (`node/<node>/<ns>/<type>/<name>`); a message that names another node is
/// refused. Resources that are not namespaced objects (e.g. `node`) pass
/// with the prefix added.
pub fn to_cloud(node: &str, mut msg: Message) -> Result<Message, Refusal> {
    let resource = msg.resource().to_owned();
    if resource.starts_with("node/") {
        let named: CloudResource = resource.parse().map_err(|_| Refusal::BadResource {
            node: node.to_owned(),
            resource: resource.clone(),
        })?;
        if named.node != node {
            return Err(Refusal::ForeignNode {
                node: node.to_owned(),
                named: named.node,
            });
        }
        return Ok(msg);
    }
    msg.router.resource = match resource.parse::<EdgeResource>() {
        Ok(edge) => edge.on_node(node).to_string().into(),
        Err(_) => format!("node/{node}/{resource}").into(),
    };
    Ok(msg)
}

/// The node a cloud-side message is for, and the message in the edge's form.
/// Besides objects (`node/<node>/<ns>/<type>/<name>`), a resource of one
/// segment after the node passes, as KubeEdge's cloudhub trims any: the
/// devicecontroller's confirms to a KubeEdge edge's twin go to
/// `node/<node>/twin`.
pub fn to_edge(mut msg: Message) -> Option<(String, Message)> {
    let (node, edge) = match msg.resource().parse::<CloudResource>() {
        Ok(cloud) => {
            // The text after `node/<node>/`, as the parse found it: the
            // edge's resource (but for the `/` an empty name leaves at the
            // end, which the edge's form does without). Cut from the
            // message's own text, a long resource is copied once.
            let written = msg
                .resource()
                .get("node/".len() + cloud.node.len() + 1..)
                .unwrap_or_default();
            let edge = match cloud.resource.name.is_empty() {
                true => written.strip_suffix('/').unwrap_or(written),
                false => written,
            };
            (cloud.node, SmolStr::new(edge))
        }
        Err(_) => {
            let (node, edge) = msg.resource().strip_prefix("node/")?.split_once('/')?;
            if node.is_empty() || edge.is_empty() || edge.contains('/') {
                return None;
            }
            (node.to_owned(), SmolStr::new(edge))
        }
    };
    msg.router.resource = edge;
    Some((node, msg))
}

/// Whether `msg` from the other side answers a request still waiting here.
#[cfg(any(feature = "cloudhub", feature = "edgehub"))]
pub(crate) fn is_answer(hive: &beehive::Hive, msg: &Message) -> bool {
    matches!(msg.operation(), operation::RESPONSE | operation::ERROR)
        && msg
            .parent_id()
            .is_some_and(|parent| hive.is_pending(parent))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn upstream(resource: &str) -> Message {
        Message::new().build_router(
            "edged",
            "resource",
            beehive::SmolStr::new(resource),
            "update",
        )
    }

    #[test]
    fn upstream_resources_get_the_senders_prefix() {
        let msg = to_cloud("n1", upstream("default/podstatus/web")).expect("accepted");
        assert_eq!(msg.resource(), "node/n1/default/podstatus/web");
        let msg = to_cloud("n1", upstream("node/n1/default/pod/web")).expect("own node");
        assert_eq!(msg.resource(), "node/n1/default/pod/web");
    }

    #[test]
    fn a_node_cannot_speak_for_another() {
        assert_eq!(
            to_cloud("n1", upstream("node/n2/default/pod/web")),
            Err(Refusal::ForeignNode {
                node: "n1".into(),
                named: "n2".into()
            })
        );
        assert!(matches!(
            to_cloud("n1", upstream("node/")),
            Err(Refusal::BadResource { .. })
        ));
    }

    #[test]
    fn downstream_resources_lose_the_prefix() {
        let msg = upstream("node/n1/default/pod/web").with_resource_version("3");
        let (node, edge) = to_edge(msg).expect("cloud form");
        assert_eq!((node.as_str(), edge.resource()), ("n1", "default/pod/web"));
        assert!(to_edge(upstream("default/pod/web")).is_none());
        // A twin confirm's one segment passes; an empty or odd one does not.
        let (node, edge) = to_edge(upstream("node/n1/twin")).expect("one segment");
        assert_eq!((node.as_str(), edge.resource()), ("n1", "twin"));
        for odd in ["node/n1/", "node//twin", "node/n1//pod", "node/n1"] {
            assert!(to_edge(upstream(odd)).is_none(), "{odd}");
        }
        // The edge's form is the parsed resource's, whatever its length:
        // a list's trailing `/` goes, a name keeps its slashes.
        for (cloud, edge) in [
            ("node/n1/default/pod/", "default/pod"),
            ("node/n1/default/pod", "default/pod"),
            ("node/n1/default/configmap/a/b", "default/configmap/a/b"),
            (
                "node/edge-node-0042/kube-system/pod/coredns-5d78c9869d-xk2lp",
                "kube-system/pod/coredns-5d78c9869d-xk2lp",
            ),
        ] {
            let (_, msg) = to_edge(upstream(cloud)).expect(cloud);
            let parsed = cloud.parse::<CloudResource>().expect(cloud);
            assert_eq!(msg.resource(), edge, "{cloud}");
            assert_eq!(msg.resource(), parsed.resource.to_string(), "{cloud}");
        }
    }

    #[test]
    fn control_messages_are_recognised() {
        let object = upstream("default/pod/web").with_resource_version("1");
        assert_eq!(kind(&object), Kind::Payload);
        assert!(needs_ack(&object));
        assert_eq!(kind(&ack(&object, "edgehub")), Kind::Ack(object.id()));
        assert_eq!(kind(&keepalive("edgehub")), Kind::Keepalive);
        assert_eq!(kind(&hello("n1")), Kind::Hello);
        // A response to a query in another group is payload, not an ack.
        assert_eq!(
            kind(&object.response(
                "metamanager",
                beehive::Content::of(&serde_json::json!(1)).expect("json body")
            )),
            Kind::Payload
        );
    }
}
