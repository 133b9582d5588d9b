//! How cloudhub runs: the addresses it listens on and its limits, and
//! what it shares with the cloud's other modules (node events, node
//! links, tunnels, claims).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use transports::{ListenOptions, TransportKind};

use crate::dialect::Dialect;

/// One address cloudhub listens on.
#[derive(Clone)]
pub struct CloudEndpoint {
    /// Which transport.
    pub kind: TransportKind,
    /// Address, TLS and limits.
    pub options: ListenOptions,
    /// Accept the node name from the hello when the peer has no client
    /// certificate. Only for links that are protected otherwise (a Unix
    /// socket's file permissions); off by default.
    pub trust_hello: bool,
    /// How nodes on this endpoint talk: edgehive's own dialect, or
    /// KubeEdge's (WebSocket only), so KubeEdge edgecores can join.
    pub dialect: Dialect,
}

/// How cloudhub runs.
#[derive(Clone)]
pub struct CloudHubConfig {
    /// Where to listen; every endpoint at once.
    pub endpoints: Vec<CloudEndpoint>,
    /// Keepalive interval; a link silent for two intervals is closed.
    pub keepalive: Duration,
    /// Time a new link has to say hello.
    pub hello_timeout: Duration,
    /// Objects in flight per node before acks must come back.
    pub window: usize,
    /// Objects held per node at most; more are refused and counted.
    pub max_objects_per_node: usize,
    /// A disconnected node's queue leaves memory after this long (it stays
    /// in the store and is loaded again when the node returns).
    pub evict_after: Duration,
    /// Where the queues persist; none keeps them in memory only.
    pub store: Option<PathBuf>,
    /// An object a KubeEdge node has not acknowledged this long is sent
    /// again (KubeEdge's own cloud retries after 5 s).
    pub kubeedge_resend_after: Duration,
    /// With several cloud replicas: the claims under which this one
    /// serves nodes (none: it serves every node that connects).
    pub claims: Option<Arc<dyn crate::NodeClaims>>,
    /// Told what nodes that cannot report what they hold (KubeEdge's)
    /// acknowledge, so another replica that takes one over sends it only
    /// what it lacks (none: nobody is told).
    pub acks: Option<Arc<dyn crate::AckSink>>,
    /// Where the native nodes' tunnels are kept, for whoever opens streams
    /// to them (a fresh set by default; give one to share it before the
    /// hub starts).
    pub streams: stream::NodeTunnels,
    /// Where the node events go (connects, disconnects, deletions a node
    /// holds): give the controller's, so it hears them.
    pub node_events: crate::NodeEvents,
    /// Where cloud modules hand messages for nodes and hear their outcome
    /// (typed); cloudhub takes its receiving end when it starts. Give the
    /// controller's.
    pub links: crate::NodeLinks,
    /// Revoked node certificates (deleted nodes): a link presenting one
    /// is closed right after its handshake (none: no revocation).
    pub revocations: Option<Arc<dyn crate::certs::JoinLedger>>,
}

impl Default for CloudHubConfig {
    fn default() -> Self {
        CloudHubConfig {
            endpoints: Vec::new(),
            keepalive: Duration::from_secs(15),
            hello_timeout: Duration::from_secs(10),
            window: 512,
            max_objects_per_node: 100_000,
            evict_after: Duration::from_secs(3600),
            store: None,
            kubeedge_resend_after: Duration::from_secs(10),
            claims: None,
            acks: None,
            streams: stream::NodeTunnels::default(),
            node_events: crate::NodeEvents::default(),
            links: crate::NodeLinks::default(),
            revocations: None,
        }
    }
}
