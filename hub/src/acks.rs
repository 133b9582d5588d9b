//! What nodes acknowledged, for whoever keeps a record of it. A node that
//! cannot report what it holds (KubeEdge's edgecore) is brought in step,
//! when another cloud replica takes it over, from such a record (a
//! delivery cursor per node) instead of being sent everything again.
//!
//! cloudhub tells an [`AckSink`] from its actor, in the order things
//! happen there, so every call must be cheap (push into a channel): no
//! I/O.

use futures_util::future::BoxFuture;

/// Takes what nodes acknowledged, and what they may no longer hold.
pub trait AckSink: Send + Sync + 'static {
    /// `node` acknowledged `resource` (`<namespace>/<type>/<name>`) at
    /// `version`: it holds that version or a newer one.
    fn held(&self, node: &str, resource: &str, version: &str);

    /// A message of `resource` is on its way to `node` whose outcome is
    /// not known: a deletion, or one queued before its session began
    /// (perhaps under another claim, perhaps older than what it holds).
    /// From now on it may hold any version of it, or none.
    fn unsure(&self, node: &str, resource: &str);

    /// Done once what was told of `node` so far is recorded (or cannot
    /// be). A session that begins with objects queued from before (perhaps
    /// under another claim, and older than what the node holds) sends them
    /// only then: a record that the node holds an object must never
    /// outlive an older message of it delivered after.
    fn recorded(&self, node: &str) -> BoxFuture<'static, ()>;

    /// `node` acknowledged the deletion of `resource`: it holds it no more.
    fn gone(&self, node: &str, resource: &str);

    /// `node`'s session here ended, or this replica lost its claim on it:
    /// what it acknowledged is recorded now, and nothing more is said of
    /// it until its next session here.
    fn ended(&self, node: &str);
}
