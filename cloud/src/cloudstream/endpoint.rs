//! Where kube-apiserver reaches an edge node's kubelet API: the cloudcore
//! serving it ([`crate::cloudstream`]), written into the node's status so no
//! rule on the API server's host is needed. The API server dials the
//! Node's first address of its preferred types at
//! `daemonEndpoints.kubeletEndpoint.port`; the Node's `InternalIP` becomes
//! that cloudcore's, the edge's own address stays as its `ExternalIP`, and
//! its `Hostname` (the node's name) stays, for stats asked by name.

use k8s_openapi::api::core::v1::{DaemonEndpoint, NodeAddress, NodeDaemonEndpoints, NodeStatus};

/// The kubelet API's address as Nodes name it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubeletEndpoint {
    /// The address the API server reaches this cloudcore at.
    pub address: String,
    /// The kubelet API's port.
    pub port: u16,
}

impl KubeletEndpoint {
    /// `status` naming this endpoint.
    pub fn apply(&self, status: &mut NodeStatus) {
        let addresses = status.addresses.get_or_insert_with(Vec::new);
        let own = addresses
            .iter()
            .position(|a| a.type_ == "InternalIP")
            .map(|i| addresses.remove(i));
        if let Some(own) = own.filter(|own| own.address != self.address)
            && !addresses.iter().any(|a| a.type_ == "ExternalIP")
        {
            addresses.push(NodeAddress {
                type_: "ExternalIP".to_owned(),
                address: own.address,
            });
        }
        addresses.insert(
            0,
            NodeAddress {
                type_: "InternalIP".to_owned(),
                address: self.address.clone(),
            },
        );
        status.daemon_endpoints = Some(NodeDaemonEndpoints {
            kubelet_endpoint: Some(DaemonEndpoint {
                port: i32::from(self.port),
            }),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn address(type_: &str, address: &str) -> NodeAddress {
        NodeAddress {
            type_: type_.to_owned(),
            address: address.to_owned(),
        }
    }

    #[test]
    fn the_node_names_the_cloudcore_that_serves_it() {
        let endpoint = KubeletEndpoint {
            address: "10.1.0.5".to_owned(),
            port: 10250,
        };
        let mut status = NodeStatus {
            addresses: Some(vec![
                address("InternalIP", "192.168.8.20"),
                address("Hostname", "edge-1"),
            ]),
            ..NodeStatus::default()
        };
        endpoint.apply(&mut status);
        assert_eq!(
            status.addresses,
            Some(vec![
                address("InternalIP", "10.1.0.5"),
                address("Hostname", "edge-1"),
                address("ExternalIP", "192.168.8.20"),
            ])
        );
        let port = status
            .daemon_endpoints
            .as_ref()
            .and_then(|d| d.kubelet_endpoint.as_ref());
        assert_eq!(port.map(|p| p.port), Some(10250));
        // Applied again (each status write): the same.
        let once = status.clone();
        endpoint.apply(&mut status);
        assert_eq!(status, once);
    }
}
