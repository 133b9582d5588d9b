//! Whether this cloud may serve a node. With several cloud replicas each
//! node is served by one at a time, under a claim the replicas keep in a
//! shared engine (etcd, a Kubernetes Lease); cloudhub asks for the claim
//! before it starts a node's session, says when the session ends, and
//! closes the sessions of nodes whose claims are lost.

use futures_util::future::BoxFuture;
use futures_util::stream::BoxStream;

/// The claims of one cloud replica on the nodes it serves.
pub trait NodeClaims: Send + Sync + 'static {
    /// Claims `node` for this replica; why not, if it may not serve it
    /// (another replica holds it, or this one cannot reach the engine).
    fn claim(&self, node: &str) -> BoxFuture<'static, Result<(), String>>;

    /// `node`'s session here ended: its claim is given up, so another
    /// replica may take the node at once.
    fn release(&self, node: &str);

    /// Whether this replica holds `node` now (a claim under a lease it
    /// still trusts). One that does not must not speak for the node:
    /// another replica may serve it already.
    fn holds(&self, node: &str) -> bool;

    /// Nodes whose claims this replica lost (its lease ran out, or it lost
    /// the engine): their sessions are closed, and nothing more is sent.
    fn lost(&self) -> BoxStream<'static, String>;
}
