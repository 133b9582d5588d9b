//! How the two ends of a link talk: edgehive's own dialect, or KubeEdge's,
//! so that an unmodified KubeEdge edgecore can join an edgehive cloud (and
//! an edgehive edge can speak to it as one would).
//!
//! | | native | KubeEdge |
//! | --- | --- | --- |
//! | frames | MessagePack | JSON, one message per WebSocket text message, upgraded at any path |
//! | node name | the hello, checked against the certificate | the `node_id` upgrade header, checked against the certificate |
//! | cloud's first word | a keepalive | nothing |
//! | keepalives | both ways | the edge's only (`websocket`/`resource`/`node`/`keepalive`, `"ping"`) |
//! | acknowledgement | `response` in the `hub` group | `response` in the object's own route, content `"OK"` |
//! | edge requests | group `resource` | group `meta`; the cloud answers every one |
//! | node and pod status | `nodestatus` / `podstatus` updates | `nodepatch` / `podpatch` patches (a JSON patch as a string) |
//! | a deleted pod stopped | `delete` of `<ns>/pod/<name>`, `{"uid"}` | the same `delete` in group `meta`, the kubelet's `DeleteOptions` (grace 0, uid precondition), answered `"OK"` |
//!
//! KubeEdge's cloud leaves the certificate-to-`node_id` check off by
//! default; edgehive always makes it.

use apis::termination::PodTerminated;
use beehive::IntoRouteName as _;
use beehive::constants::{group, module, operation, resource_type};
use beehive::resource::{CloudResource, EdgeResource};
use beehive::{Content, Message, SmolStr};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use transports::{Codec, DialOptions, ListenOptions};

use crate::protocol::{self, Kind};

/// KubeEdge's default project id, sent in the `project_id` header.
pub const KUBEEDGE_PROJECT_ID: &str = "e632aba927ea4ac2b575ec1603d56f10";

/// The upgrade header that names the node on a KubeEdge link.
pub const NODE_ID_HEADER: &str = "node_id";

/// Objects in flight to a KubeEdge node at most (its edge queues 100
/// messages and drops the oldest beyond that).
pub const KUBEEDGE_WINDOW: usize = 64;

/// The name KubeEdge's edgehub goes by as a message source.
pub const KUBEEDGE_EDGEHUB: &str = "websocket";

/// How a link's two ends talk.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Dialect {
    /// edgehive's own.
    #[default]
    Native,
    /// KubeEdge's (WebSocket only).
    #[serde(rename = "kubeedge")]
    KubeEdge,
}

impl std::fmt::Display for Dialect {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Dialect::Native => "native",
            Dialect::KubeEdge => "kubeedge",
        })
    }
}

impl std::str::FromStr for Dialect {
    type Err = String;
    fn from_str(text: &str) -> Result<Dialect, String> {
        match text {
            "native" => Ok(Dialect::Native),
            "kubeedge" => Ok(Dialect::KubeEdge),
            other => Err(format!("unknown dialect {other:?} (native or kubeedge)")),
        }
    }
}

impl Dialect {
    /// The frame codec of this dialect.
    pub fn codec(self) -> Codec {
        match self {
            Dialect::Native => Codec::MessagePack,
            Dialect::KubeEdge => Codec::KubeEdgeJson,
        }
    }

    /// `options` set up to accept links in this dialect.
    pub fn listen_options(self, options: ListenOptions) -> ListenOptions {
        options.with_codec(self.codec())
    }

    /// `options` set up to dial the cloud as `node` in this dialect: a
    /// KubeEdge edge names itself in the upgrade headers, and upgrades at
    /// `/<project>/<node>/events`.
    pub fn dial_options(self, node: &str, options: DialOptions) -> DialOptions {
        match self {
            Dialect::Native => options.with_codec(Codec::MessagePack),
            Dialect::KubeEdge => options
                .with_codec(Codec::KubeEdgeJson)
                .with_path(format!("/{KUBEEDGE_PROJECT_ID}/{node}/events"))
                .with_header(NODE_ID_HEADER, node)
                .with_header("project_id", KUBEEDGE_PROJECT_ID)
                .with_header("ConnectionUse", "msg"),
        }
    }

    /// What the edge says first on a new link: the hello (native), or its
    /// node registration (KubeEdge). Either is answered at once, and the
    /// edge counts its link as up only then, so a refused link takes
    /// nothing with it.
    pub fn opener(self, node: &str) -> Message {
        match self {
            Dialect::Native => protocol::hello(node),
            Dialect::KubeEdge => self.registration(node),
        }
    }

    /// Whether the cloud sends keepalives. A KubeEdge cloud never does; an
    /// edge in its dialect pings it over WebSocket instead, and counts its
    /// pongs as signs of life.
    pub fn cloud_keeps_alive(self) -> bool {
        self == Dialect::Native
    }

    /// How many objects may wait for a node's acknowledgement at once, of
    /// the `configured` window. A KubeEdge edge takes its messages into a
    /// queue of 100 that drops the oldest when full, and its cloud never
    /// resends a dropped one here; at most [`KUBEEDGE_WINDOW`] in flight
    /// leaves room for the answers to its own requests.
    pub fn window(self, configured: usize) -> usize {
        match self {
            Dialect::Native => configured,
            Dialect::KubeEdge => configured.min(KUBEEDGE_WINDOW),
        }
    }

    /// Whether an object left unacknowledged is sent again after a while,
    /// link or no link: a KubeEdge edge may drop what it received (a full
    /// queue, a failed store), and says so to nobody.
    pub fn resends_unacknowledged(self) -> bool {
        self == Dialect::KubeEdge
    }

    /// Whether a node in this dialect reports what it holds when asked
    /// (its inventory). KubeEdge's edges cannot: what they acknowledged is
    /// all the cloud knows.
    pub fn reports_inventory(self) -> bool {
        self == Dialect::Native
    }

    /// The edge's keepalive.
    pub fn keepalive(self) -> Message {
        match self {
            Dialect::Native => protocol::keepalive(module::EDGEHUB),
            Dialect::KubeEdge => Message::new()
                .build_router(
                    KUBEEDGE_EDGEHUB,
                    group::RESOURCE,
                    "node",
                    operation::KEEPALIVE,
                )
                .with_content("ping"),
        }
    }

    /// The edge's acknowledgement of `msg`, sent once it is stored.
    pub fn ack(self, msg: &Message) -> Message {
        match self {
            Dialect::Native => protocol::ack(msg, module::EDGEHUB),
            Dialect::KubeEdge => {
                // KubeEdge answers in the object's own route, "OK".
                let mut ack = msg.response(msg.router.source.clone(), "OK");
                ack.router.destination = SmolStr::default();
                ack.header.resource_version.clear();
                ack
            }
        }
    }

    /// What a message from an edge is, for the cloud. On a KubeEdge link
    /// every `response` acknowledges its parent (the cloud asks a KubeEdge
    /// node nothing, so none answers a question).
    pub fn kind(self, msg: &Message) -> Kind {
        match self {
            Dialect::Native => protocol::kind(msg),
            Dialect::KubeEdge => match (msg.operation(), msg.parent_id()) {
                (operation::KEEPALIVE, _) => Kind::Keepalive,
                (operation::RESPONSE, Some(parent)) => Kind::Ack(parent),
                _ => Kind::Payload,
            },
        }
    }

    /// An upstream message as the cloud's modules take it. A KubeEdge
    /// edge's requests come in group `meta` and all wait for an answer
    /// (the `sync` flag never travels on its wire), so they are marked so.
    ///
    /// A KubeEdge kubelet's delete of its own pod (grace 0, the uid as
    /// precondition: its containers stopped) becomes edgehive's
    /// [`PodTerminated`] word; `DeleteOptions` that do not read are left as
    /// they came, for the cloud to refuse.
    pub fn to_cloud_modules(self, mut msg: Message) -> Message {
        if self == Dialect::KubeEdge {
            if msg.operation() == operation::DELETE
                && let Ok(resource) = msg.resource().parse::<CloudResource>()
                && resource.resource.resource_type == resource_type::POD
                && let Ok(stopped) = PodTerminated::from_delete_options(
                    &resource.resource.namespace,
                    &resource.resource.name,
                    msg.content(),
                )
            {
                msg.content = stopped.message(module::EDGED).content;
            }
            if msg.group() == group::META {
                msg.router.group = group::RESOURCE.into_route_name();
            }
            msg.header.sync = matches!(
                msg.operation(),
                operation::INSERT
                    | operation::UPDATE
                    | operation::PATCH
                    | operation::DELETE
                    | operation::QUERY
            );
        }
        msg
    }

    /// An edge module's message in this dialect's form, just before it
    /// goes on the link. A KubeEdge edge reports node and pod status as
    /// patches of the objects (a strategic merge patch as a string; the
    /// whole status replaces the old one, as edgehive's edge reports it
    /// whole), sends its requests in group `meta`, and carries no versions
    /// or `sync` flag up.
    pub fn upstream(self, mut msg: Message) -> Message {
        if self == Dialect::Native {
            return msg;
        }
        if let Ok(resource) = msg.resource().parse::<EdgeResource>()
            && resource.resource_type == resource_type::POD
            && let Some(stopped) = PodTerminated::of(&resource.namespace, &resource.name, &msg)
        {
            // A pod that stopped: its kubelet's delete.
            msg.content = stopped.delete_options();
        } else if let Ok(resource) = msg.resource().parse::<EdgeResource>() {
            let patch_type = match resource.resource_type.as_str() {
                resource_type::NODE_STATUS => Some(resource_type::NODE_PATCH),
                resource_type::POD_STATUS => Some(resource_type::POD_PATCH),
                _ => None,
            };
            if let Some(patch_type) = patch_type
                && msg.operation() != operation::QUERY
                && msg.operation() != operation::DELETE
            {
                let mut status = msg.body::<Value>().unwrap_or(Value::Null);
                if let Some(fields) = status.as_object_mut() {
                    fields.insert("$patch".to_owned(), json!("replace"));
                }
                let patch = json!({ "status": status });
                msg.router.resource =
                    format!("{}/{patch_type}/{}", resource.namespace, resource.name).into();
                msg.router.operation = operation::PATCH.into_route_name();
                msg.content = Content::Text(patch.to_string());
            }
        }
        if msg.group() == group::RESOURCE {
            msg.router.group = group::META.into_route_name();
        }
        msg.header.resource_version.clear();
        msg.header.sync = false;
        msg
    }

    /// The node registration a KubeEdge edge sends when its link comes up:
    /// an insert of its Node object, answered with the cloud's copy.
    fn registration(self, node: &str) -> Message {
        let arch = match std::env::consts::ARCH {
            "x86_64" => "amd64",
            "aarch64" => "arm64",
            other => other,
        };
        let object = json!({
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": node,
                "labels": {
                    "kubernetes.io/hostname": node,
                    "kubernetes.io/os": std::env::consts::OS,
                    "kubernetes.io/arch": arch,
                    "node-role.kubernetes.io/edge": "",
                    "node-role.kubernetes.io/agent": "",
                },
            },
        });
        Message::new()
            .build_router(
                module::EDGED,
                group::META,
                format!("default/{}/{node}", resource_type::NODE),
                operation::INSERT,
            )
            .with_content(apis::kinds::object_content(&object))
    }
}

/// The node a certificate's common name stands for: KubeEdge's edges ask
/// for `system:node:<node>`, edgehive's for `<node>`.
pub fn node_of_common_name(common_name: &str) -> &str {
    common_name
        .strip_prefix("system:node:")
        .unwrap_or(common_name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use transports::kubeedge;

    /// The JSON of `msg` without the fields that differ per message.
    fn shape(msg: &Message) -> Value {
        let mut wire: Value = serde_json::from_slice(&kubeedge::encode(msg)).expect("json");
        let header = wire["header"].as_object_mut().expect("header");
        header.remove("msg_id");
        header.remove("timestamp");
        if header.contains_key("parent_msg_id") {
            header.insert("parent_msg_id".into(), json!("<parent>"));
        }
        wire
    }

    #[test]
    fn a_kubeedge_edge_keeps_alive_in_kubeedges_words() {
        assert_eq!(
            shape(&Dialect::KubeEdge.keepalive()),
            json!({"header": {}, "route": {"source": "websocket", "group": "resource",
                   "operation": "keepalive", "resource": "node"}, "content": "ping"})
        );
    }

    #[test]
    fn a_kubeedge_ack_answers_in_the_objects_route() {
        let pod = Message::new()
            .build_router("edgecontroller", "resource", "default/pod/web", "insert")
            .with_resource_version("42")
            .with_content(beehive::Content::of(&json!({"kind": "Pod"})).expect("json body"));
        let ack = Dialect::KubeEdge.ack(&pod);
        assert_eq!(ack.parent_id(), Some(pod.id()));
        assert_eq!(
            shape(&ack),
            json!({"header": {"parent_msg_id": "<parent>"},
                   "route": {"source": "edgecontroller", "group": "resource",
                             "operation": "response", "resource": "default/pod/web"},
                   "content": "OK"})
        );
        assert_eq!(Dialect::KubeEdge.kind(&ack), Kind::Ack(pod.id()));
        assert_eq!(Dialect::Native.kind(&ack), Kind::Payload);
    }

    #[test]
    fn statuses_go_up_as_kubeedges_patches() {
        let status = json!({"phase": "Running"});
        let report = Message::new()
            .build_router("edged", "resource", "default/podstatus/web", "update")
            .with_resource_version("1700000000000")
            .with_content(Content::of(&status).expect("json"));
        let patch = Dialect::KubeEdge.upstream(report);
        assert_eq!(
            shape(&patch),
            json!({"header": {}, "route": {"source": "edged", "group": "meta",
                   "operation": "patch", "resource": "default/podpatch/web"},
                   "content": "{\"status\":{\"$patch\":\"replace\",\"phase\":\"Running\"}}"})
        );
        let node = Message::new()
            .build_router("edged", "resource", "default/nodestatus/n1", "update")
            .with_content(beehive::Content::of(&json!({"phase": "Running"})).expect("json body"));
        let patch = Dialect::KubeEdge.upstream(node);
        assert_eq!(patch.resource(), "default/nodepatch/n1");
        assert_eq!(patch.operation(), "patch");
        // A query keeps its form; only its group is KubeEdge's.
        let mut query =
            Message::new().build_router("metamanager", "resource", "default/configmap/cm", "query");
        query.header.sync = true;
        let sent = Dialect::KubeEdge.upstream(query);
        assert_eq!(
            shape(&sent),
            json!({"header": {}, "route": {"source": "metamanager", "group": "meta",
                   "operation": "query", "resource": "default/configmap/cm"},
                   "content": null})
        );
    }

    #[test]
    fn a_stopped_pod_goes_up_as_a_kubelets_delete() {
        let stopped = PodTerminated::new("ns", "web", Some("u-1".to_owned()));
        let sent = Dialect::KubeEdge.upstream(stopped.message("edged"));
        // What a KubeEdge edgecore's kubelet sends through its MetaClient
        // once the pod's containers stopped.
        assert_eq!(
            shape(&sent),
            json!({"header": {}, "route": {"source": "edged", "group": "meta",
                   "operation": "delete", "resource": "ns/pod/web"},
                   "content": {"gracePeriodSeconds": 0, "preconditions": {"uid": "u-1"}}})
        );
        // The cloud takes it as edgehive's word, waiting for an answer.
        let mut at_cloud = sent.clone();
        at_cloud.router.resource = format!("node/n1/{}", sent.resource()).into();
        let taken = Dialect::KubeEdge.to_cloud_modules(at_cloud);
        assert!(taken.is_sync());
        assert_eq!(taken.group(), "resource");
        assert_eq!(
            PodTerminated::of("ns", "web", &taken),
            Some(stopped.clone())
        );
        // An older edge's bare uid reads alike; the native form is left.
        let mut older = taken.clone();
        older.content = Content::text("u-1");
        older.router.group = "meta".into_route_name();
        let taken = Dialect::KubeEdge.to_cloud_modules(older);
        assert_eq!(
            PodTerminated::of("ns", "web", &taken),
            Some(stopped.clone())
        );
        let native = Dialect::Native.upstream(stopped.message("edged"));
        assert_eq!(
            native.body::<serde_json::Value>().expect("json body"),
            json!({"uid": "u-1"})
        );
    }

    #[test]
    fn the_cloud_answers_every_kubeedge_request() {
        let insert = Message::new().build_router("edged", "meta", "default/node/n1", "insert");
        let taken = Dialect::KubeEdge.to_cloud_modules(insert);
        assert!(taken.is_sync());
        assert_eq!(taken.group(), "resource");
        let native =
            Message::new().build_router("edged", "resource", "default/podstatus/a", "update");
        assert!(!Dialect::Native.to_cloud_modules(native).is_sync());
    }

    #[test]
    fn a_kubeedge_node_never_has_more_in_flight_than_its_queue_holds() {
        assert_eq!(Dialect::KubeEdge.window(512), KUBEEDGE_WINDOW);
        assert_eq!(Dialect::KubeEdge.window(8), 8);
        assert_eq!(Dialect::Native.window(512), 512);
    }

    #[test]
    fn kubeedge_common_names_name_their_node() {
        assert_eq!(node_of_common_name("system:node:edge-1"), "edge-1");
        assert_eq!(node_of_common_name("edge-1"), "edge-1");
        assert_eq!("kubeedge".parse::<Dialect>(), Ok(Dialect::KubeEdge));
        assert!("mqtt".parse::<Dialect>().is_err());
    }
}
