//! Several cloudcore replicas: each node is served by one replica at a
//! time, under a claim in etcd ([`EtcdClaims`], feature `etcd`) or in the
//! Kubernetes API server ([`leases::LeaseClaims`], feature `kubernetes`).
//! Both keep their rules in [`book::ClaimBook`]; how the replicas even out
//! their nodes is [`share::Share`]. On etcd, what KubeEdge nodes
//! acknowledged is kept per node ([`cursor`], `CursorWriter`), so the
//! replica that takes one over sends it only what it lacks.

pub mod book;
pub mod cursor;
#[cfg(feature = "etcd")]
mod cursor_on_etcd;
#[cfg(feature = "kubernetes")]
mod cursor_on_leases;
#[cfg(any(feature = "etcd", feature = "kubernetes"))]
mod cursor_writer;
#[cfg(feature = "kubernetes")]
pub mod leases;
#[cfg(feature = "kubernetes")]
pub mod observed;
#[cfg(feature = "etcd")]
mod on_etcd;
pub mod share;

#[cfg(feature = "etcd")]
pub use cursor_on_etcd::CursorConfig;
#[cfg(any(feature = "etcd", feature = "kubernetes"))]
pub use cursor_writer::{BeforeRelease, CursorCounts, CursorWriter};
#[cfg(feature = "etcd")]
pub use on_etcd::{ClaimsConfig, EtcdClaims};

use std::time::{Duration, Instant};

use tokio::sync::mpsc;

/// The controller asks a replica's claims (whichever engine keeps them)
/// whether it holds a node, and which nodes no replica holds.
#[cfg(any(feature = "etcd", feature = "kubernetes"))]
impl<C: hub::NodeClaims> crate::edgecontroller::NodeHolders for C {
    fn holds(&self, node: &str) -> bool {
        hub::NodeClaims::holds(self, node)
    }

    fn unclaimed(
        &self,
        nodes: Vec<String>,
    ) -> futures_util::future::BoxFuture<'static, Result<Vec<String>, String>> {
        hub::NodeClaims::unclaimed(self, nodes)
    }
}

/// What a replica's claims have done.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClaimCounts {
    /// Nodes held now.
    pub held: usize,
    /// Claims taken.
    pub taken: u64,
    /// Claims refused (another replica held the node, or no lease).
    pub refused: u64,
    /// Claims lost (the lease ended or was no longer trusted).
    pub lost: u64,
    /// Leases granted (more than one: the replica lost the engine).
    pub leases: u64,
    /// Lease renewals the engine answered, and their round trips summed
    /// and the last, in microseconds: the engine's latency.
    pub renewals: u64,
    /// See `renewals`.
    pub renewal_micros: u64,
    /// See `renewals`.
    pub last_renewal_micros: u64,
    /// Nodes handed over to even the replicas out.
    pub handed_over: u64,
    /// Replicas up, as last counted.
    pub replicas: usize,
}

/// One rebalancing round of a replica holding `held` (nodes and their
/// claims' generations), with `claimed` nodes claimed by all and
/// `replicas` up: the nodes it hands over now, counted in `counts`. The
/// caller closes their links, then releases their claims.
fn hand_over(
    share: &mut share::Share,
    counts: &tokio::sync::watch::Sender<ClaimCounts>,
    held: Vec<(String, u64)>,
    claimed: usize,
    replicas: usize,
) -> Vec<(String, u64)> {
    counts.send_modify(|c| c.replicas = replicas);
    let names: Vec<String> = held.iter().map(|(node, _)| node.clone()).collect();
    let going: std::collections::HashSet<String> = share
        .round(&names, claimed, replicas, Instant::now())
        .into_iter()
        .collect();
    if going.is_empty() {
        return Vec::new();
    }
    let going: Vec<(String, u64)> = held
        .into_iter()
        .filter(|(node, _)| going.contains(node))
        .collect();
    tracing::info!(
        count = going.len(),
        held = names.len(),
        claimed,
        replicas,
        "handing nodes over to even the replicas out"
    );
    counts.send_modify(|c| c.handed_over += going.len() as u64);
    going
}

impl ClaimCounts {
    /// The engine answered a renewal after `took`.
    pub fn renewed(&mut self, took: Duration) {
        let micros = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
        self.renewals += 1;
        self.renewal_micros = self.renewal_micros.saturating_add(micros);
        self.last_renewal_micros = micros;
    }
}

fn tokio_stream_from(
    mut receiver: mpsc::UnboundedReceiver<(String, u64)>,
) -> impl futures_util::Stream<Item = (String, u64)> {
    futures_util::stream::poll_fn(move |cx| receiver.poll_recv(cx))
}

/// How long a renewal may take: a third of the TTL, and never past the
/// instant the lease stops being trusted (`trusted`, the book's).
fn renewal_deadline(trusted: Option<Instant>, ttl: Duration) -> tokio::time::Instant {
    let third = tokio::time::Instant::now() + ttl / 3;
    trusted.map_or(third, |until| {
        third.min(tokio::time::Instant::from_std(until))
    })
}
