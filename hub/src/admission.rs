//! Who may link: the checks cloudhub makes of a node's link, as plain
//! functions of what the link tells (the node it names, the common name
//! of its verified certificate), with the HTTP status a WebSocket upgrade
//! request is refused with.
//!
//! A WebSocket link is checked on its upgrade request, before anything is
//! upgraded ([`admit_upgrade`]): a refused peer gets an HTTP error with a
//! short reason, never a `101` and a bare close. What only the link's
//! first frame or the claims engine can tell is checked once the link is
//! up, and refused by closing it:
//!
//! | refusal | when | answer |
//! | --- | --- | --- |
//! | KubeEdge: no `node_id` header | upgrade request | 400 |
//! | KubeEdge: `node_id` not a valid node name | upgrade request | 400 |
//! | KubeEdge: certificate of another node than `node_id` | upgrade request | 403 |
//! | no client certificate, on an endpoint that does not trust the hello | upgrade request | 401 |
//! | native: no hello, or a hello naming another node than the certificate | first frame | close |
//! | another replica holds the node, or the claims engine cannot be reached | claim, after the upgrade | close |

use transports::{Admission, PeerIdentity};

use crate::dialect::{Dialect, NODE_ID_HEADER, node_of_common_name};

/// Why a node's link is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LinkRefusal {
    /// A KubeEdge link whose upgrade request names no node.
    #[error("no node_id header")]
    NoNodeId,
    /// A native link whose first frame is not a hello.
    #[error("no hello")]
    NoHello,
    /// The node name is not one a node may have.
    #[error("invalid node name {0:?}")]
    InvalidNodeName(String),
    /// The certificate is another node's.
    #[error("certificate of node {certified:?} presented as node {named:?}")]
    OtherNodesCertificate {
        /// The node the certificate names.
        certified: String,
        /// The node the link names.
        named: String,
    },
    /// No client certificate, where the link's own word is not trusted.
    #[error("no client certificate")]
    NoCertificate,
    /// A certificate of the cloud's CA that is not a node's (an admin API
    /// user's, a replica's): its common name may be any name.
    #[error("the certificate of {user:?} (group {group:?}) is not a node's")]
    NotANodeCertificate {
        /// Its common name.
        user: String,
        /// The group that makes it a person's or a program's.
        group: String,
    },
}

impl LinkRefusal {
    /// The HTTP status an upgrade request refused for this gets: 400 for a
    /// request that names no valid node (malformed: KubeEdge's edgecore
    /// always sends one), 401 for one with no credentials at all, 403 for
    /// credentials that do not allow what is asked (another node's
    /// certificate).
    pub fn status(&self) -> u16 {
        match self {
            LinkRefusal::NoNodeId | LinkRefusal::NoHello | LinkRefusal::InvalidNodeName(_) => 400,
            LinkRefusal::NoCertificate => 401,
            LinkRefusal::OtherNodesCertificate { .. } | LinkRefusal::NotANodeCertificate { .. } => {
                403
            }
        }
    }
}

/// Whether a link naming node `named` (from its hello or its `node_id`
/// header) may speak for it, with `common_name` the common name of its
/// verified certificate and `groups` its organizations (a node's has none
/// but `system:nodes`); `trust_hello`: the endpoint takes the link's own
/// word when it has no certificate (a Unix socket).
pub fn check_identity(
    dialect: Dialect,
    trust_hello: bool,
    named: Option<&str>,
    common_name: Option<&str>,
    groups: &[String],
) -> Result<(), LinkRefusal> {
    if let (Some(user), Some(group)) = (
        common_name,
        groups.iter().find(|g| *g != crate::certs::NODES_GROUP),
    ) {
        return Err(LinkRefusal::NotANodeCertificate {
            user: user.to_owned(),
            group: group.clone(),
        });
    }
    let certified = common_name.map(node_of_common_name);
    match (named, certified) {
        (None, _) if dialect == Dialect::KubeEdge => Err(LinkRefusal::NoNodeId),
        (None, _) => Err(LinkRefusal::NoHello),
        (Some(named), _) if !crate::certs::valid_node_name(named) => {
            Err(LinkRefusal::InvalidNodeName(named.to_owned()))
        }
        (Some(named), Some(certified)) if certified != named => {
            Err(LinkRefusal::OtherNodesCertificate {
                certified: certified.to_owned(),
                named: named.to_owned(),
            })
        }
        (Some(_), None) if !trust_hello => Err(LinkRefusal::NoCertificate),
        _ => Ok(()),
    }
}

/// The groups (organizations) of a link's verified certificate.
pub fn groups_of(peer: &PeerIdentity) -> Vec<String> {
    peer.certificates
        .first()
        .map(|leaf| crate::certs::organizations(leaf))
        .unwrap_or_default()
}

/// The node a KubeEdge link names in its upgrade request.
pub fn node_id(peer: &PeerIdentity) -> Option<&str> {
    peer.headers
        .iter()
        .find(|(name, _)| name == NODE_ID_HEADER)
        .map(|(_, value)| value.as_str())
}

/// What is known of a link's upgrade request decides: a KubeEdge link
/// names its node there, so every identity check is made; a native link
/// names it in its hello, after the upgrade, so only a missing
/// certificate is refused here.
pub fn admit_upgrade(dialect: Dialect, trust_hello: bool, peer: &PeerIdentity) -> Admission {
    let checked = match dialect {
        Dialect::KubeEdge => check_identity(
            dialect,
            trust_hello,
            node_id(peer),
            peer.common_name.as_deref(),
            &groups_of(peer),
        ),
        Dialect::Native if peer.common_name.is_none() && !trust_hello => {
            Err(LinkRefusal::NoCertificate)
        }
        Dialect::Native => Ok(()),
    };
    match checked {
        Ok(()) => Admission::Accept,
        Err(refusal) => Admission::refuse(refusal.status(), refusal.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(node_id: Option<&str>, common_name: Option<&str>) -> PeerIdentity {
        PeerIdentity {
            remote: "192.0.2.7:40000".into(),
            common_name: common_name.map(str::to_owned),
            certificates: Vec::new(),
            headers: node_id
                .map(|node| vec![(NODE_ID_HEADER.to_owned(), node.to_owned())])
                .unwrap_or_default(),
        }
    }

    fn status(admission: Admission) -> Option<u16> {
        match admission {
            Admission::Accept => None,
            Admission::Refuse { status, .. } => Some(status),
        }
    }

    #[test]
    fn a_kubeedge_request_is_decided_on_its_node_id_and_certificate() {
        let decide = |node_id, common_name| {
            status(admit_upgrade(
                Dialect::KubeEdge,
                false,
                &peer(node_id, common_name),
            ))
        };
        assert_eq!(decide(Some("kube-2"), Some("system:node:kube-2")), None);
        assert_eq!(decide(Some("kube-2"), Some("kube-2")), None);
        assert_eq!(
            decide(Some("kube-2"), Some("system:node:kube-3")),
            Some(403)
        );
        assert_eq!(decide(None, Some("system:node:kube-2")), Some(400));
        assert_eq!(decide(Some("../kube-2"), Some("../kube-2")), Some(400));
        assert_eq!(decide(Some("kube-2"), None), Some(401));
    }

    #[test]
    fn a_refusal_says_why() {
        let refused = admit_upgrade(
            Dialect::KubeEdge,
            false,
            &peer(Some("kube-2"), Some("system:node:kube-3")),
        );
        assert_eq!(
            refused,
            Admission::refuse(
                403,
                "certificate of node \"kube-3\" presented as node \"kube-2\""
            )
        );
    }

    #[test]
    fn a_native_request_is_refused_only_without_a_certificate() {
        // Its node is named in its hello, after the upgrade.
        let native = |common_name, trust_hello| {
            status(admit_upgrade(
                Dialect::Native,
                trust_hello,
                &peer(Some("spoofed"), common_name),
            ))
        };
        assert_eq!(native(Some("n1"), false), None);
        assert_eq!(native(None, false), Some(401));
        assert_eq!(native(None, true), None);
    }

    #[test]
    fn the_hello_is_checked_against_the_certificate_after_the_upgrade() {
        let check = |named, common_name, trust_hello| {
            check_identity(Dialect::Native, trust_hello, named, common_name, &[])
        };
        assert_eq!(check(Some("n1"), Some("n1"), false), Ok(()));
        assert_eq!(check(None, Some("n1"), false), Err(LinkRefusal::NoHello));
        assert!(matches!(
            check(Some("n2"), Some("n1"), false),
            Err(LinkRefusal::OtherNodesCertificate { .. })
        ));
        assert_eq!(check(Some("n1"), None, true), Ok(()));
        assert_eq!(
            check(Some("n1"), None, false),
            Err(LinkRefusal::NoCertificate)
        );
        // A certificate of the cloud's CA with a group other than the
        // nodes' is a person's or a program's: never a node's, whatever
        // its name (an admin API user called n1).
        let nodes = ["system:nodes".to_owned()];
        let viewer = ["edgehive:viewers".to_owned()];
        assert_eq!(
            check_identity(
                Dialect::KubeEdge,
                false,
                Some("n1"),
                Some("system:node:n1"),
                &nodes
            ),
            Ok(())
        );
        let refused = check_identity(Dialect::Native, false, Some("n1"), Some("n1"), &viewer);
        assert!(
            matches!(&refused, Err(LinkRefusal::NotANodeCertificate { group, .. }) if group == "edgehive:viewers"),
            "{refused:?}"
        );
        assert_eq!(refused.map_err(|r| r.status()), Err(403));
    }
}
