//! Node status: capacity and allocatable (cpu, memory, pods) from the
//! host, nodeInfo (kernel, OS, the runtime's name and version from CRI),
//! addresses and the Ready condition; sent up through metamanager on a
//! period and whenever it changes.

use std::collections::BTreeMap;
use std::sync::Arc;

use apis::k8s::{NodeAddress, NodeCondition, NodeStatus, NodeSystemInfo, Quantity, Time};
use beehive::constants::{group, module, operation};
use beehive::{Hive, Message as HiveMessage};
use tracing::debug;

use crate::config::EdgedConfig;
use crate::cri::Cri;

/// Sends the node's status.
pub struct NodeReporter {
    hive: Hive,
    cri: Cri,
    config: Arc<EdgedConfig>,
    last: Option<NodeStatus>,
    ready_since: Option<Time>,
}

fn read(path: &str) -> String {
    std::fs::read_to_string(path)
        .map(|s| s.trim().to_owned())
        .unwrap_or_default()
}

/// Total memory in KiB, from /proc/meminfo.
fn memory_kib() -> u64 {
    read("/proc/meminfo")
        .lines()
        .find_map(|line| line.strip_prefix("MemTotal:"))
        .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

fn os_image() -> String {
    read("/etc/os-release")
        .lines()
        .find_map(|line| line.strip_prefix("PRETTY_NAME="))
        .map(|name| name.trim_matches('"').to_owned())
        .unwrap_or_else(|| "Linux".to_owned())
}

fn architecture() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

impl NodeReporter {
    /// A reporter for the node in `config`.
    pub fn new(hive: Hive, cri: Cri, config: Arc<EdgedConfig>) -> Self {
        NodeReporter {
            hive,
            cri,
            config,
            last: None,
            ready_since: None,
        }
    }

    /// The node's status now.
    pub async fn status(&mut self) -> NodeStatus {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        let capacity = BTreeMap::from([
            ("cpu".to_owned(), Quantity(cpus.to_string())),
            ("memory".to_owned(), Quantity(format!("{}Ki", memory_kib()))),
            (
                "pods".to_owned(),
                Quantity(self.config.max_pods.to_string()),
            ),
        ]);
        let runtime = self.cri.version().await;
        let (ready, reason, message, runtime_version) = match &runtime {
            Ok(v) => (
                "True",
                "EdgedReady",
                "edged is posting ready status".to_owned(),
                format!("{}://{}", v.runtime_name, v.runtime_version),
            ),
            Err(err) => (
                "False",
                "ContainerRuntimeUnreachable",
                err.to_string(),
                String::new(),
            ),
        };
        let was_ready = self
            .last
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
            .map(|c| c.status.clone());
        if was_ready.as_deref() != Some(ready) || self.ready_since.is_none() {
            let now = jiff::Timestamp::now();
            self.ready_since = Some(Time(
                jiff::Timestamp::from_second(now.as_second()).unwrap_or(now),
            ));
        }
        let mut addresses = vec![NodeAddress {
            type_: "Hostname".to_owned(),
            address: self.config.node.clone(),
            ..Default::default()
        }];
        if !self.config.node_ip.is_empty() {
            addresses.insert(
                0,
                NodeAddress {
                    type_: "InternalIP".to_owned(),
                    address: self.config.node_ip.clone(),
                    ..Default::default()
                },
            );
        }
        NodeStatus {
            allocatable: Some(capacity.clone()),
            capacity: Some(capacity),
            addresses: Some(addresses),
            conditions: Some(vec![NodeCondition {
                type_: "Ready".to_owned(),
                status: ready.to_owned(),
                reason: Some(reason.to_owned()),
                message: Some(message),
                last_transition_time: self.ready_since,
                last_heartbeat_time: None,
                ..Default::default()
            }]),
            node_info: Some(NodeSystemInfo {
                architecture: architecture().to_owned(),
                boot_id: read("/proc/sys/kernel/random/boot_id"),
                container_runtime_version: runtime_version,
                kernel_version: read("/proc/sys/kernel/osrelease"),
                kube_proxy_version: String::new(),
                kubelet_version: apis::KUBELET_VERSION.to_owned(),
                machine_id: read("/etc/machine-id"),
                operating_system: "linux".to_owned(),
                os_image: os_image(),
                system_uuid: String::new(),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    /// Sends the status up if it changed since the last report (checked
    /// often, so a change goes up at once).
    pub async fn report_if_changed(&mut self) {
        let status = self.status().await;
        if self.last.as_ref() != Some(&status) {
            self.send(status).await;
        }
    }

    /// Sends the status up (on the node-status period, changed or not).
    pub async fn report(&mut self) {
        let status = self.status().await;
        self.send(status).await;
    }

    async fn send(&mut self, status: NodeStatus) {
        let Ok(content) = beehive::Content::of(&status) else {
            return;
        };
        let msg = HiveMessage::new()
            .build_router(
                module::EDGED,
                group::META,
                format!("default/nodestatus/{}", self.config.node),
                operation::UPDATE,
            )
            .with_content(content);
        match self.hive.send(module::METAMANAGER, msg).await {
            Ok(()) => self.last = Some(status),
            Err(err) => debug!(error = %err, "node status not reported"),
        }
    }
}
