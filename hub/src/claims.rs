//! Whether this cloud may serve a node. With several cloud replicas each
//! node is served by one at a time, under a claim the replicas keep in a
//! shared engine (etcd, a Kubernetes Lease); cloudhub asks for the claim
//! before it starts a node's session, says when the session ends, and
//! closes the sessions of nodes whose claims are lost.

use futures_util::future::BoxFuture;
use futures_util::stream::BoxStream;

/// The claims of one cloud replica on the nodes it serves.
pub trait NodeClaims: Send + Sync + 'static {
    /// Claims `node` for a new session of it on this replica: the claim's
    /// generation, or why this replica may not serve it (another replica
    /// holds it, or this one cannot reach the engine).
    fn claim(&self, node: &str) -> BoxFuture<'static, Result<u64, String>>;

    /// The session that claimed `node` at `generation` ended: its claim is
    /// given up (unless a newer session of the node claimed it since), so
    /// another replica may take the node at once.
    fn release(&self, node: &str, generation: u64);

    /// Whether this replica holds `node` now (a claim under a lease it
    /// still trusts). One that does not must not speak for the node:
    /// another replica may serve it already.
    fn holds(&self, node: &str) -> bool;

    /// Of `nodes`, those no replica holds now, as the engine says (read
    /// when asked: a claim made after the answer is not counted). A node
    /// no replica serves may be marked unreachable by any replica.
    fn unclaimed(&self, nodes: Vec<String>) -> BoxFuture<'static, Result<Vec<String>, String>>;

    /// Claims this replica lost (its lease ran out, or it lost the
    /// engine), as node and generation: those sessions are closed, and
    /// nothing more is sent.
    fn lost(&self) -> BoxStream<'static, (String, u64)>;
}
