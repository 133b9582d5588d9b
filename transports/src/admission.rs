//! The accepting side's say on a link before it exists: a check run on
//! each WebSocket upgrade request (its headers and the verified peer
//! certificate, as a [`PeerIdentity`]), which either lets the upgrade go
//! on or answers it with an HTTP error and a short reason, so that a
//! refused peer never gets a `101 Switching Protocols` it would take for a
//! link. QUIC and Unix sockets have no request to answer: their links are
//! checked after they are established.

use std::sync::Arc;

use crate::link::PeerIdentity;

/// The answer to a link's request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Admission {
    /// The link goes on.
    Accept,
    /// The request is answered with `status` (an HTTP error status: 4xx or
    /// 5xx; anything else is sent as 403) and `reason` as a plain-text body.
    Refuse {
        /// The HTTP status.
        status: u16,
        /// Why, in a few words, for the peer's log.
        reason: String,
    },
}

impl Admission {
    /// A refusal with `status` and `reason`.
    pub fn refuse(status: u16, reason: impl Into<String>) -> Admission {
        Admission::Refuse {
            status,
            reason: reason.into(),
        }
    }
}

/// A check of every link request on a listener (see [`Admission`]).
pub type AdmissionCheck = Arc<dyn Fn(&PeerIdentity) -> Admission + Send + Sync>;
