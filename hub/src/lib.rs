//! The hub links edge nodes to the cloud over any [`transports`] transport.
//!
//! - [`CloudHub`] listens on every configured transport at once and runs one
//!   session actor per connected node. Each node has a downstream
//!   [`NodeQueue`](queue::NodeQueue): every object is kept until the node
//!   acknowledges it, only the newest version of an object is kept, a window
//!   of objects is in flight (not stop-and-wait), and the queue persists in
//!   redb, so a cloud restart loses nothing. After a reconnect it resends
//!   from where the node left off. A node's identity is the common name of
//!   its client certificate: a node can never send or receive for another.
//! - [`EdgeHub`] keeps one link to the cloud. It reconnects with exponential
//!   backoff and jitter, acknowledges an object only after the edge module
//!   that keeps it has persisted it, and holds status reports while offline
//!   (latest per object) until the link returns.
//! - Both sides send keepalives; a link silent for two intervals is closed on
//!   either side, so a half-open link is noticed within two keepalive
//!   intervals instead of TCP's minutes.
//! - Node connects, disconnects and the deletions nodes hold are typed
//!   [`NodeEvent`]s on a channel of their own ([`events`]); cloud modules
//!   hand cloudhub messages for nodes on [`NodeLinks`] and hear a typed
//!   [`Delivery`] or [`Refusal`] back ([`links`]).
//! - Each endpoint speaks a [`Dialect`]: edgehive's own, or KubeEdge's, so
//!   an unmodified KubeEdge edgecore can join (see [`dialect`]).
//!
//! Features pick a side: `cloudhub` (the CA, the certificate server, the
//! nodes' queues) and `edgehub`; a cloud build compiles no edgehub and an
//! edge build no cloudhub. Both are on by default.

// What both sides share: the link's messages and KubeEdge's dialect of
// them, and node identity (certificates, join tokens).
pub mod certs;
pub mod dialect;
/// KubeEdge's JSON message format (lives with the transports, which can
/// carry it on a link).
pub use transports::kubeedge;
pub mod protocol;
mod stats;

// cloudhub (KubeEdge's cloud/pkg/cloudhub): the nodes' queues and
// sessions, the CA and certificate server, the typed seams to the cloud's
// modules.
#[cfg(feature = "cloudhub")]
pub mod acks;
#[cfg(feature = "cloudhub")]
pub mod admission;
#[cfg(feature = "cloudhub")]
pub mod claims;
#[cfg(feature = "cloudhub")]
mod cloudhub;
#[cfg(feature = "cloudhub")]
pub mod events;
#[cfg(feature = "cloudhub")]
pub mod links;
#[cfg(feature = "cloudhub")]
pub mod queue;
#[cfg(feature = "cloudhub")]
pub mod store;

// edgehub (KubeEdge's edge/pkg/edgehub): the edge's link to the cloud.
#[cfg(feature = "edgehub")]
mod edgehub;

#[cfg(feature = "cloudhub")]
pub use acks::AckSink;
#[cfg(feature = "cloudhub")]
pub use claims::NodeClaims;
#[cfg(feature = "cloudhub")]
pub use cloudhub::{CloudEndpoint, CloudHub, CloudHubConfig, CloudHubHandle};
pub use dialect::Dialect;
#[cfg(feature = "edgehub")]
pub use edgehub::{EdgeHub, EdgeHubConfig, EdgeHubHandle, OfflineBuffer, route};
#[cfg(feature = "cloudhub")]
pub use events::{NodeEvent, NodeEventKind, NodeEvents};
#[cfg(feature = "cloudhub")]
pub use links::{Delivered, Delivery, NodeLinks, Outcome, Refusal};
pub use stats::Changes;
#[cfg(feature = "edgehub")]
pub use stats::EdgeHubStats;
#[cfg(feature = "cloudhub")]
pub use stats::HubStats;

/// Why a hub could not start.
#[derive(Debug, thiserror::Error)]
pub enum HubError {
    /// A transport could not listen.
    #[error(transparent)]
    Transport(#[from] transports::TransportError),
    /// The queue store could not be opened.
    #[cfg(feature = "cloudhub")]
    #[error(transparent)]
    Store(#[from] store::StoreError),
    /// The module could not start.
    #[error(transparent)]
    Hive(#[from] beehive::Error),
    /// Certificates could not be made or loaded.
    #[error(transparent)]
    Certificate(#[from] certs::CertError),
}
