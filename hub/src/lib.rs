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

pub mod acks;
pub mod admission;
pub mod certs;
pub mod claims;
mod cloud;
pub mod dialect;
mod edge;
pub mod events;
pub mod links;
/// KubeEdge's JSON message format (lives with the transports, which can
/// carry it on a link).
pub use transports::kubeedge;
pub mod protocol;
pub mod queue;
mod stats;
pub mod store;

pub use acks::AckSink;
pub use claims::NodeClaims;
pub use cloud::{CloudEndpoint, CloudHub, CloudHubConfig, CloudHubHandle};
pub use dialect::Dialect;
pub use edge::{EdgeHub, EdgeHubConfig, EdgeHubHandle, OfflineBuffer, route};
pub use events::{NodeEvent, NodeEventKind, NodeEvents};
pub use links::{Delivery, NodeLinks, Outcome, Refusal};
pub use stats::{Changes, EdgeHubStats, HubStats};

/// Why a hub could not start.
#[derive(Debug, thiserror::Error)]
pub enum HubError {
    /// A transport could not listen.
    #[error(transparent)]
    Transport(#[from] transports::TransportError),
    /// The queue store could not be opened.
    #[error(transparent)]
    Store(#[from] store::StoreError),
    /// The module could not start.
    #[error(transparent)]
    Hive(#[from] beehive::Error),
    /// Certificates could not be made or loaded.
    #[error(transparent)]
    Certificate(#[from] certs::CertError),
}
