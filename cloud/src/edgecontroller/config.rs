//! How the edgecontroller runs: its configuration, the hooks replicas and
//! delivery cursors give it, and what it counts.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use crate::cloudstream::KubeletEndpoint;

use super::reconciler::Acked;
use super::status_writer::WriterConfig;
#[cfg(doc)]
use super::{eviction, status_writer};
#[cfg(doc)]
use crate::desired::DesiredState;

/// How the controller runs.
#[derive(Debug, Clone)]
pub struct ControllerConfig {
    /// How long cloudhub may take to queue (and persist) one message for a
    /// node before the controller logs it as not sent.
    pub send_timeout: Duration,
    /// Requests waiting for the controller before callers wait for room.
    pub inbox: usize,
    /// How often nodes that missed a message are reconciled, and a watch
    /// that failed is started again.
    pub retry_every: Duration,
    /// How often connected nodes' heartbeat Leases are renewed (where the
    /// desired state keeps them: in Kubernetes, `kube-node-lease`), and
    /// how long each renewal holds.
    pub lease_every: Duration,
    /// How long a renewal holds (a kubelet's default: 40 s).
    pub lease_duration: Duration,
    /// Where the desired state evicts pods of NotReady nodes (Kubernetes):
    /// how long pods bound to an edge node whose link is down are kept
    /// before they may be evicted (`None`: never). See [`eviction`].
    pub offline_grace: Option<Duration>,
    /// With several replicas: send only to nodes linked to this replica.
    /// A node that links here is brought in step from its inventory, so it
    /// is sent what it lacks, not everything this replica would have
    /// queued while another served it. Off (one cloudcore), every node's
    /// queue is kept, linked or not, and delivered when it returns.
    pub send_to_linked_only: bool,
    /// Where what KubeEdge nodes acknowledged is recorded (a delivery
    /// cursor per node; replicas on etcd): a KubeEdge node that links here
    /// is sent what it lacks by that record, not everything again.
    pub cursors: Option<Arc<dyn DeliveryCursors>>,
    /// With several replicas: this replica's claims on nodes. A node's
    /// status is written as its holder only while this replica holds it;
    /// a node it does not hold is marked unreachable only when no replica
    /// holds it, and only if nobody wrote its Node since this replica read
    /// it (a write conditioned on that version), so a stale mark never
    /// overwrites the status the node's new holder wrote.
    pub claims: Option<Arc<dyn NodeHolders>>,
    /// With claims: how often Nodes shown linked but served by no replica
    /// (their replica died, and they did not link again) are looked for
    /// and marked unreachable.
    pub sweep_every: Duration,
    /// Kubernetes mode with the kubelet API on: the address and port
    /// written into the status of the nodes this controller serves, so
    /// kube-apiserver reaches their kubelet API here.
    pub kubelet_endpoint: Option<KubeletEndpoint>,
    /// Kubernetes mode: who service account tokens are and what they may
    /// read, for edges' MetaServers with `requireAuthorization`. `None`:
    /// every token is refused (no API server issues them).
    pub token_access: Option<crate::reviews::TokenAccess>,
    /// How status writes (pods', devices', nodes') are paced, off the
    /// delivery path (see [`status_writer`]). `None`: as the store needs,
    /// a kubelet's budget ([`WriterConfig::default`]) where it shares an
    /// API server's ([`DesiredState::shares_request_budget`]), unpaced
    /// ([`WriterConfig::unpaced`]) where it is local.
    pub status_writes: Option<WriterConfig>,
}

/// Where the controller reads what a node acknowledged: its delivery
/// cursor, resource (`<namespace>/<type>/<name>`) to what it holds.
pub trait DeliveryCursors: Send + Sync + 'static {
    /// `node`'s cursor, or why it cannot be read.
    fn read(
        &self,
        node: &str,
    ) -> futures_util::future::BoxFuture<'static, Result<BTreeMap<String, Acked>, String>>;
}

/// Which replica holds a node (replicas' claims, as `hub::NodeClaims`
/// keeps them), as the controller asks it.
pub trait NodeHolders: Send + Sync + 'static {
    /// Whether this replica holds `node` now.
    fn holds(&self, node: &str) -> bool;

    /// Of `nodes`, those no replica holds now, as the engine says.
    fn unclaimed(
        &self,
        nodes: Vec<String>,
    ) -> futures_util::future::BoxFuture<'static, Result<Vec<String>, String>>;
}

impl std::fmt::Debug for dyn NodeHolders {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("NodeHolders")
    }
}

impl std::fmt::Debug for dyn DeliveryCursors {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DeliveryCursors")
    }
}

impl Default for ControllerConfig {
    fn default() -> Self {
        ControllerConfig {
            send_timeout: Duration::from_secs(10),
            inbox: 1024,
            retry_every: Duration::from_secs(10),
            lease_every: Duration::from_secs(10),
            lease_duration: Duration::from_secs(40),
            offline_grace: Some(Duration::from_secs(24 * 3600)),
            send_to_linked_only: false,
            cursors: None,
            claims: None,
            sweep_every: Duration::from_secs(30),
            kubelet_endpoint: None,
            token_access: None,
            status_writes: None,
        }
    }
}

/// What the controller has done, for tests and metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ControllerCounts {
    /// Messages queued for nodes.
    pub sent: u64,
    /// Messages cloudhub did not take.
    pub send_failures: u64,
    /// Status reports stored.
    pub status_applied: u64,
    /// Status reports refused (a node speaking for another, unknown pods).
    pub status_refused: u64,
    /// Queries from nodes answered.
    pub queries: u64,
    /// Status patches (KubeEdge's `nodepatch`, `podpatch`) applied.
    pub patches: u64,
    /// Node link events seen.
    pub node_events: u64,
    /// Watch events of the desired state handled.
    pub watch_events: u64,
    /// Times a watch could not resume and its kind was listed again.
    pub relists: u64,
    /// Node heartbeat Leases renewed.
    pub leases_renewed: u64,
    /// Delivery cursor reads answered (KubeEdge nodes brought in step from
    /// what they acknowledged, or, if it could not be read, by sending
    /// everything again; an answer for an earlier link is counted, not
    /// taken).
    pub cursors_read: u64,
    /// KubeEdge nodes' twin syncs (`membership/detail`) answered.
    pub twin_syncs: u64,
    /// Membership updates (a device joined or left a KubeEdge node's
    /// devices) put on nodes' links.
    pub memberships: u64,
    /// KubeEdge nodes' device reports (`twin/edge_updated`,
    /// `state/update`) stored and confirmed.
    pub device_reports: u64,
    /// Batches of messages queued at cloudhub and awaited together.
    pub send_batches: u64,
    /// Messages in those batches (over `send_batches`: the mean size).
    pub batched_sends: u64,
    /// The largest batch so far.
    pub largest_send_batch: u64,
    /// Pods whose offline tolerations the controller wrote (admission had
    /// not lengthened them), off the delivery path.
    pub tolerations_written: u64,
    /// Status writes that landed (pods', devices', nodes'), off the
    /// delivery path.
    pub status_written: u64,
    /// Statuses replaced by a newer one of the same object before they
    /// were written.
    pub status_coalesced: u64,
    /// Status writes the API server answered 429 (Too Many Requests).
    pub status_throttled: u64,
    /// Status writes tried again (after a 429 or a failure).
    pub status_retried: u64,
    /// Statuses dropped (their object gone, or refused for good).
    pub status_dropped: u64,
}
