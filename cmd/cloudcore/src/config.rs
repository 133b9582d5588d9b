//! `cloudcore.yaml`: which of the cloud's modules run, where they listen,
//! where data lives (shaped like KubeEdge's cloudcore.yaml; the reading,
//! flags and checks all configurations share are in `cmd_common::config`).

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use cmd_common::config::{
    Check, CoreConfig, Listener, apply_listener_flag, check_host_port, or_under,
};

/// `cloudcore.yaml`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct CloudCoreConfig {
    /// `cloudcore.config.edgehive.io/v1alpha1`.
    pub api_version: String,
    /// `CloudCore`.
    pub kind: String,
    /// Where the CA, keys, queues and desired state live.
    pub data_dir: PathBuf,
    /// Log filter (RUST_LOG syntax); RUST_LOG wins when set.
    pub log: String,
    /// Where the desired state comes from: a Kubernetes API server, or
    /// (with none given and not running in a pod) the embedded store.
    #[serde(rename = "kubeAPIConfig")]
    pub kube_api_config: KubeApiConfig,
    /// An etcd cluster holding the desired state, shared by several
    /// cloudcore replicas (standalone mode); none: the embedded store.
    pub etcd: EtcdSection,
    /// Several cloudcore replicas sharing the nodes, each served by one at
    /// a time under a claim (in etcd, or as a Kubernetes Lease).
    pub replicas: ReplicasSection,
    /// The modules.
    pub modules: CloudModules,
}

/// The Kubernetes API server cloudcore drives edge nodes from (KubeEdge's
/// `kubeAPIConfig`). With a kubeconfig, or running in a pod with a service
/// account (unless `inCluster` is false), the desired state is that
/// cluster's; otherwise it is the embedded store in `dataDir`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct KubeApiConfig {
    /// A kubeconfig file ("" for none).
    pub kube_config: String,
    /// Use the pod's service account when cloudcore runs in a pod.
    pub in_cluster: bool,
    /// cloudcore's own namespace in the cluster (created if missing).
    pub namespace: String,
    /// How long the pods of an edge node whose link is down are kept
    /// before Kubernetes may evict them, in seconds (0: never); see the
    /// docs/kubernetes.md.
    pub offline_grace_seconds: u64,
}

impl Default for KubeApiConfig {
    fn default() -> Self {
        KubeApiConfig {
            kube_config: String::new(),
            in_cluster: true,
            namespace: "kubeedge".to_owned(),
            offline_grace_seconds: 24 * 3600,
        }
    }
}

/// Where the shared desired state lives when it is in etcd.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct EtcdSection {
    /// The members' client URLs (`http://10.0.0.1:2379`); empty: no etcd.
    pub endpoints: Vec<String>,
    /// The key prefix under which the desired state lives.
    pub prefix: String,
}

impl Default for EtcdSection {
    fn default() -> Self {
        EtcdSection {
            endpoints: Vec::new(),
            prefix: "/edgehive".to_owned(),
        }
    }
}

/// cloudcore as one of several replicas.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct ReplicasSection {
    /// On a Kubernetes cluster: this cloudcore is one of several, each
    /// node served by one under a Lease in `kubeAPIConfig.namespace`. With
    /// `etcd.endpoints`, replicas are always on (claims in etcd).
    pub enable: bool,
    /// This replica's name among the replicas ("": the host's name and
    /// the process id).
    pub name: String,
    /// How long a replica's claims on its nodes outlive its last renewal:
    /// the longest a dead replica's nodes wait for another, in seconds.
    pub claim_ttl_seconds: u64,
    /// The URL the other replicas reach this one's admin API at, to
    /// forward what is asked of the nodes it holds (logs, exec, metrics):
    /// `https://host:port` ("": `$POD_IP`, else the admin API's listen
    /// host, else the first `cloudHub.advertiseAddress`, at the admin
    /// API's port; `http://` when the admin API has no authentication).
    pub advertise_address: String,
}

impl Default for ReplicasSection {
    fn default() -> Self {
        ReplicasSection {
            enable: false,
            name: String::new(),
            claim_ttl_seconds: 10,
            advertise_address: String::new(),
        }
    }
}

/// cloudcore's modules.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct CloudModules {
    /// cloudhub: the nodes' links and the certificate endpoints.
    pub cloud_hub: CloudHubSection,
    /// The admin API (for edgehivectl).
    pub admin: AdminSection,
    /// Prometheus metrics at `/metrics`.
    pub metrics: Listener,
    /// The application center (KubeEdge's dynamiccontroller): answers what
    /// a KubeEdge edge's MetaServer forwards.
    pub dynamic_controller: DynamicControllerSection,
    /// The kubelet API of edge nodes for kube-apiserver (Kubernetes mode;
    /// KubeEdge's cloudStream): `kubectl logs`, `exec`, `attach`,
    /// `port-forward` through the nodes' links.
    pub cloud_stream: CloudStreamSection,
    /// The resource metrics API (`metrics.k8s.io`) for kube-apiserver's
    /// aggregation layer (Kubernetes mode): `kubectl top` on edge pods.
    pub metrics_server: MetricsServerSection,
    /// The admission webhook (Kubernetes mode; KubeEdge's `admission`):
    /// pods bound to edge nodes are created with their offline
    /// tolerations already lengthened.
    pub admission: AdmissionSection,
}

/// The admin API (for edgehivectl): where it listens and how it knows its
/// callers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct AdminSection {
    /// Whether it runs.
    pub enable: bool,
    /// host:port.
    pub address: String,
    /// true: HTTPS with the cloud CA's certificate, every caller known by a
    /// client certificate of that CA or a bearer token and given a role by
    /// its group (`edgehive:admins`, `edgehive:viewers`); `cloudcore`
    /// writes `<dataDir>/admin.kubeconfig` for its admin. false: plain
    /// HTTP to anyone, on a loopback address only.
    pub authentication: bool,
    /// Bearer tokens besides client certificates, in kube-apiserver's
    /// `--token-auth-file` format (`token,user,uid,"group1,group2"`);
    /// empty for none.
    pub token_file: PathBuf,
}

impl Default for AdminSection {
    fn default() -> Self {
        AdminSection {
            enable: true,
            address: cloud::admin::DEFAULT_ADDRESS.to_owned(),
            authentication: true,
            token_file: PathBuf::new(),
        }
    }
}

impl AdminSection {
    /// Applies the `--admin` flag: an address enables it there, "off"
    /// disables it, none leaves it as the file says.
    pub fn apply_flag(&mut self, flag: Option<String>) {
        apply_listener_flag(&mut self.enable, &mut self.address, flag);
    }

    /// Its address, when it runs.
    pub fn enabled(&self) -> Option<&str> {
        self.enable.then_some(self.address.as_str())
    }
}

/// cloudcore as the cluster's metrics-server (Kubernetes mode): serves
/// `metrics.k8s.io/v1beta1` to kube-apiserver's aggregation layer, edge
/// nodes' figures through their links, the cluster's own nodes' from their
/// kubelets through the API server.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct MetricsServerSection {
    /// Whether it runs (off unless asked: an APIService must name it, in
    /// place of any metrics-server).
    pub enable: bool,
    /// host:port it listens on.
    pub address: String,
    /// The Service the APIService names, in cloudcore's namespace; its
    /// DNS name (`<serviceName>.<namespace>.svc`) is in the serving
    /// certificate the API server checks against the APIService's
    /// `caBundle` (cloudcore's CA).
    pub service_name: String,
    /// Whether the cluster's own (non-edge) nodes are served too, read
    /// through the API server's node proxy.
    pub cloud_nodes: bool,
}

impl Default for MetricsServerSection {
    fn default() -> Self {
        MetricsServerSection {
            enable: false,
            address: cloud::cloudstream::metrics_api::DEFAULT_ADDRESS.to_owned(),
            service_name: "cloudcore-metrics".to_owned(),
            cloud_nodes: true,
        }
    }
}

/// cloudcore's mutating admission webhook (Kubernetes mode): the API
/// server calls it as it creates a pod, and a pod bound to an edge node
/// is created with its default offline tolerations lengthened to
/// `kubeAPIConfig.offlineGraceSeconds`, with no write afterwards. At
/// start cloudcore creates or updates the `MutatingWebhookConfiguration`
/// `edgehive-cloudcore` naming it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct AdmissionSection {
    /// Whether it runs (only ever with a Kubernetes API server; off unless
    /// asked: it registers a cluster-wide webhook, which needs its own
    /// permission and an address the API server reaches).
    pub enable: bool,
    /// host:port it listens on.
    pub address: String,
    /// The URL the API server calls it at ("": `https://<host>:<port of
    /// address>/mutate-pods`, host: with replicas the `POD_IP` environment
    /// variable when set, else the first IP of
    /// `modules.cloudHub.advertiseAddress`). Its host is in the serving
    /// certificate.
    pub url: String,
    /// In the cluster: the Service in front of cloudcore the API server
    /// calls instead of a URL, `namespace/name` or `namespace/name:port`
    /// (port 443 when none is given); "": the URL.
    pub service: String,
    /// The name of the `MutatingWebhookConfiguration` cloudcore registers
    /// (one per cloudcore installation; replicas share it).
    pub configuration_name: String,
}

impl Default for AdmissionSection {
    fn default() -> Self {
        AdmissionSection {
            enable: false,
            address: cloud::admission::DEFAULT_ADDRESS.to_owned(),
            url: String::new(),
            service: String::new(),
            configuration_name: cloud::admission::webhook::CONFIGURATION_NAME.to_owned(),
        }
    }
}

/// The kubelet API cloudcore serves for edge nodes (Kubernetes mode).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct CloudStreamSection {
    /// Whether it runs (only ever with a Kubernetes API server).
    pub enable: bool,
    /// host:port it listens on.
    pub address: String,
    /// The address kube-apiserver reaches it at, written as edge Nodes'
    /// `InternalIP` ("": with replicas, the `POD_IP` environment variable
    /// when set, each replica its own; otherwise the first IP of
    /// `modules.cloudHub.advertiseAddress`).
    pub advertise_address: String,
    /// The CA that signed kube-apiserver's kubelet client certificate
    /// (`--kubelet-client-certificate`), PEM ("": the cluster's CA, from the
    /// `kube-root-ca.crt` ConfigMap in cloudcore's namespace).
    #[serde(rename = "tlsStreamCAFile")]
    pub tls_stream_ca_file: String,
    /// The port KubeEdge edgecores' edgestream dials (their
    /// `modules.edgeStream.server`), on the host of `address`: their logs,
    /// exec, attach and stats come through it (0: off).
    pub tunnel_port: u16,
}

impl Default for CloudStreamSection {
    fn default() -> Self {
        CloudStreamSection {
            enable: true,
            address: cloud::cloudstream::DEFAULT_ADDRESS.to_owned(),
            advertise_address: String::new(),
            tls_stream_ca_file: String::new(),
            tunnel_port: cloud::cloudstream::edgestream::DEFAULT_TUNNEL_PORT,
        }
    }
}

/// The application center's settings (KubeEdge's `dynamicController`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct DynamicControllerSection {
    /// Whether it runs. Off, a KubeEdge edge's forwarded requests go
    /// unanswered and each waits 10 s at the edge (KubeEdge's behaviour
    /// with its dynamicController off); on, each is answered at once.
    pub enable: bool,
    /// At most this many forwarded watches per node; more are refused
    /// with 429.
    pub max_watches_per_node: usize,
}

impl Default for DynamicControllerSection {
    fn default() -> Self {
        DynamicControllerSection {
            enable: true,
            max_watches_per_node: 100,
        }
    }
}

/// cloudhub's settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct CloudHubSection {
    /// WebSocket over TLS (wss).
    pub websocket: Listener,
    /// WebSocket over TLS in KubeEdge's dialect, for unmodified KubeEdge
    /// edgecores (off by default). To move a KubeEdge fleet, put this on
    /// the address the nodes know (KubeEdge's is port 10000) and the
    /// native `websocket` elsewhere.
    pub kubeedge_websocket: Listener,
    /// QUIC.
    pub quic: Listener,
    /// Unix domain socket (local edges, trusted by file permissions).
    pub unixsocket: Listener,
    /// The certificate endpoints (`/ca.crt`, `/edge.crt`) for joining.
    pub https: Listener,
    /// Names of this cloud in its server certificate.
    pub advertise_address: Vec<String>,
    /// Keepalive interval, seconds; a silent link is closed after two.
    pub keepalive_interval: u64,
    /// Lifetime of node certificates, days.
    pub node_certificate_days: u64,
    /// Where the cloud's CA (certificate and key) lives; created on first
    /// use. Empty: `<dataDir>/ca`.
    pub ca_dir: PathBuf,
}

impl Default for CloudCoreConfig {
    fn default() -> Self {
        CloudCoreConfig {
            api_version: "cloudcore.config.edgehive.io/v1alpha1".to_owned(),
            kind: "CloudCore".to_owned(),
            data_dir: PathBuf::from(cloud::admin_client::kubeconfig::DEFAULT_CLOUD_DATA_DIR),
            log: "info".to_owned(),
            kube_api_config: KubeApiConfig::default(),
            etcd: EtcdSection::default(),
            replicas: ReplicasSection::default(),
            modules: CloudModules::default(),
        }
    }
}

impl Default for CloudModules {
    fn default() -> Self {
        CloudModules {
            cloud_hub: CloudHubSection::default(),
            admin: AdminSection::default(),
            metrics: Listener::on(DEFAULT_CLOUD_METRICS),
            dynamic_controller: DynamicControllerSection::default(),
            cloud_stream: CloudStreamSection::default(),
            metrics_server: MetricsServerSection::default(),
            admission: AdmissionSection::default(),
        }
    }
}

impl Default for CloudHubSection {
    fn default() -> Self {
        CloudHubSection {
            websocket: Listener::on("0.0.0.0:10000"),
            kubeedge_websocket: Listener::off("0.0.0.0:10010"),
            quic: Listener::off("0.0.0.0:10001"),
            unixsocket: Listener::off("/var/lib/edgehive/cloud/cloudhub.sock"),
            https: Listener::on("0.0.0.0:10002"),
            advertise_address: vec!["localhost".to_owned(), "127.0.0.1".to_owned()],
            keepalive_interval: 15,
            node_certificate_days: 365,
            ca_dir: PathBuf::new(),
        }
    }
}

/// cloudcore's metrics address by default.
pub const DEFAULT_CLOUD_METRICS: &str = "127.0.0.1:10004";

impl CloudCoreConfig {
    /// Where the CA lives.
    pub fn ca_dir(&self) -> PathBuf {
        or_under(&self.modules.cloud_hub.ca_dir, &self.data_dir, "ca")
    }
}

impl CoreConfig for CloudCoreConfig {
    fn data_dir_mut(&mut self) -> &mut PathBuf {
        &mut self.data_dir
    }

    fn log_mut(&mut self) -> &mut String {
        &mut self.log
    }
}

impl Check for CloudCoreConfig {
    fn check(&self) -> Result<(), String> {
        let hub = &self.modules.cloud_hub;
        if !(hub.websocket.enable
            || hub.kubeedge_websocket.enable
            || hub.quic.enable
            || hub.unixsocket.enable)
        {
            return Err(
                "modules.cloudHub: enable at least one of websocket, kubeedgeWebsocket, quic, unixsocket"
                    .to_owned(),
            );
        }
        if hub.keepalive_interval == 0 {
            return Err(
                "modules.cloudHub.keepaliveInterval: must be at least 1 (seconds)".to_owned(),
            );
        }
        if hub.node_certificate_days == 0 {
            return Err("modules.cloudHub.nodeCertificateDays: must be at least 1".to_owned());
        }
        if hub.advertise_address.is_empty() {
            return Err("modules.cloudHub.advertiseAddress: name at least one".to_owned());
        }
        if !self.etcd.endpoints.is_empty() && !self.kube_api_config.kube_config.is_empty() {
            return Err(
                "etcd.endpoints and kubeAPIConfig.kubeConfig: choose one home for the desired state"
                    .to_owned(),
            );
        }
        if self.replicas.claim_ttl_seconds < 2 {
            return Err("replicas.claimTtlSeconds: must be at least 2".to_owned());
        }
        if self.modules.dynamic_controller.max_watches_per_node == 0 {
            return Err(
                "modules.dynamicController.maxWatchesPerNode: must be at least 1".to_owned(),
            );
        }
        for (key, listener) in [
            ("modules.cloudHub.websocket.address", &hub.websocket),
            (
                "modules.cloudHub.kubeedgeWebsocket.address",
                &hub.kubeedge_websocket,
            ),
            ("modules.cloudHub.quic.address", &hub.quic),
            ("modules.cloudHub.https.address", &hub.https),
            (
                "modules.admin.address",
                &Listener {
                    enable: self.modules.admin.enable,
                    address: self.modules.admin.address.clone(),
                },
            ),
            ("modules.metrics.address", &self.modules.metrics),
            (
                "modules.cloudStream.address",
                &Listener {
                    enable: self.modules.cloud_stream.enable,
                    address: self.modules.cloud_stream.address.clone(),
                },
            ),
            (
                "modules.metricsServer.address",
                &Listener {
                    enable: self.modules.metrics_server.enable,
                    address: self.modules.metrics_server.address.clone(),
                },
            ),
            (
                "modules.admission.address",
                &Listener {
                    enable: self.modules.admission.enable,
                    address: self.modules.admission.address.clone(),
                },
            ),
        ] {
            if listener.enable {
                check_host_port(key, &listener.address)?;
            }
        }
        let stream = &self.modules.cloud_stream;
        if stream.enable && stream.tunnel_port != 0 {
            let admin = Listener {
                enable: self.modules.admin.enable,
                address: self.modules.admin.address.clone(),
            };
            let taken = [
                (&hub.websocket, "modules.cloudHub.websocket"),
                (
                    &hub.kubeedge_websocket,
                    "modules.cloudHub.kubeedgeWebsocket",
                ),
                (&hub.quic, "modules.cloudHub.quic"),
                (&hub.https, "modules.cloudHub.https"),
                (&self.modules.metrics, "modules.metrics"),
                (&admin, "modules.admin"),
            ]
            .into_iter()
            .filter(|(listener, _)| listener.enable)
            .map(|(listener, key)| (listener.address.as_str(), key))
            .chain([(stream.address.as_str(), "modules.cloudStream.address")]);
            for (address, key) in taken {
                let port = address
                    .rsplit_once(':')
                    .and_then(|(_, p)| p.parse::<u16>().ok());
                if port == Some(stream.tunnel_port) {
                    return Err(format!(
                        "modules.cloudStream.tunnelPort: {} is taken by {key} ({address})",
                        stream.tunnel_port
                    ));
                }
            }
        }
        let admission = &self.modules.admission;
        if admission.enable {
            match (admission.url.as_str(), admission.service.as_str()) {
                ("", "") => {}
                (_, "") => cloud::admission::webhook::Endpoint::url(&admission.url)
                    .map(drop)
                    .map_err(|err| format!("modules.admission.url: {err}"))?,
                ("", _) => cloud::admission::webhook::Endpoint::service(&admission.service)
                    .map(drop)
                    .map_err(|err| format!("modules.admission.service: {err}"))?,
                _ => {
                    return Err(
                        "modules.admission.url and modules.admission.service: choose one way for the API server to reach the webhook"
                            .to_owned(),
                    );
                }
            }
        }
        let admin = &self.modules.admin;
        if admin.enable && !admin.authentication && !cloud::admin::is_loopback(&admin.address) {
            return Err(format!(
                "modules.admin.authentication: false serves the admin API in plain HTTP to whoever reaches it, so only on a loopback address, not {:?}",
                admin.address
            ));
        }
        if admin.enable && !admin.authentication && !admin.token_file.as_os_str().is_empty() {
            return Err(
                "modules.admin.tokenFile: bearer tokens need authentication: true".to_owned(),
            );
        }
        if hub.unixsocket.enable && hub.unixsocket.address.is_empty() {
            return Err("modules.cloudHub.unixsocket.address: the socket path is empty".to_owned());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
