//! cloudcore's command line: its commands and the flags of `run`, laid over
//! the configuration file.

use std::path::PathBuf;

use anyhow::Result;
use clap::{Parser, Subcommand};
use cmd_common::config::Check;

use crate::config::CloudCoreConfig;

/// The cloud side of edgehive.
#[derive(Parser, Debug)]
#[command(version, about)]
pub(crate) struct Args {
    /// The configuration file (YAML); /etc/edgehive/cloudcore.yaml is read
    /// if it exists.
    #[arg(long, env = "EDGEHIVE_CLOUD_CONFIG")]
    pub(crate) config: Option<PathBuf>,
    /// Prints the default configuration and exits.
    #[arg(long)]
    pub(crate) defaultconfig: bool,
    /// Where the CA, keys and queues live (dataDir).
    #[arg(long, env = "EDGEHIVE_CLOUD_DIR")]
    pub(crate) data_dir: Option<PathBuf>,
    /// Log filter, RUST_LOG syntax (log); RUST_LOG wins when set.
    #[arg(long)]
    pub(crate) log: Option<String>,
    #[command(subcommand)]
    pub(crate) command: Option<Command>,
}

#[derive(Subcommand, Debug)]
pub(crate) enum Command {
    /// Join tokens for `edgecore join`: create (the default), list, delete.
    Token(Token),
    /// Prints a kubeconfig for the admin API: a client certificate of the
    /// cloud's CA for USER, in the role's group.
    Kubeconfig {
        /// The user's name (the certificate's common name).
        #[arg(long)]
        user: String,
        /// admin: everything; view: reads, logs and metrics (not secrets,
        /// not exec, attach, port-forward, apply, delete).
        #[arg(long, value_enum)]
        role: Role,
        /// How long the certificate is valid, in days.
        #[arg(long, default_value_t = 365)]
        days: u64,
        /// The server's URL in the kubeconfig (default: https:// and
        /// modules.admin.address, or the first advertiseAddress when that
        /// listens on every address).
        #[arg(long)]
        server: Option<String>,
    },
    /// Runs the cloud.
    Run(Box<Run>),
}

/// A role of the admin API.
#[derive(clap::ValueEnum, Clone, Copy, Debug)]
pub(crate) enum Role {
    /// Group edgehive:admins.
    Admin,
    /// Group edgehive:viewers.
    View,
}

impl Role {
    pub(crate) fn group(self) -> &'static str {
        match self {
            Role::Admin => cloud::admin::auth::ADMINS,
            Role::View => cloud::admin::auth::VIEWERS,
        }
    }
}

/// `cloudcore token`: with no subcommand, `create`.
#[derive(clap::Args, Debug)]
pub(crate) struct Token {
    /// The running cloudcore's admin API, where the token ledger is
    /// reached (default: modules.admin of the configuration).
    #[arg(long, global = true)]
    pub(crate) admin: Option<String>,
    #[command(subcommand)]
    pub(crate) action: Option<TokenAction>,
    #[command(flatten)]
    pub(crate) create: CreateToken,
}

#[derive(Subcommand, Debug)]
pub(crate) enum TokenAction {
    /// Prints a new join token and records it with the running cloudcore
    /// (its admin API); offline, the token still works, unlisted.
    Create(CreateToken),
    /// Lists the recorded tokens (id, node, single use, expiry, state) and
    /// the deleted nodes whose certificates are revoked.
    List,
    /// Revokes the token with this id: refused from now on.
    Delete {
        /// The token's id (`token list`).
        id: String,
        /// Revoke an id the ledger never recorded (a token made while the
        /// admin API was away); otherwise an unknown id is an error.
        #[arg(long)]
        unrecorded: bool,
    },
}

/// Flags of `token create`.
#[derive(clap::Args, Debug)]
pub(crate) struct CreateToken {
    /// How long the token is valid, in seconds.
    #[arg(long, default_value_t = 24 * 3600)]
    pub(crate) ttl_secs: u64,
    /// The only node the token may join (its certificate's name).
    #[arg(long)]
    pub(crate) node: Option<String>,
    /// The token joins one node, once; a second join with it is refused.
    #[arg(long)]
    pub(crate) single_use: bool,
}

/// Flags of `run`; each overrides its key in the configuration file.
#[derive(clap::Args, Debug)]
pub(crate) struct Run {
    /// WebSocket (wss) listen address (modules.cloudHub.websocket). Any of
    /// --ws, --quic, --uds replaces the file's choice of transports.
    #[arg(long)]
    pub(crate) ws: Option<String>,
    /// WebSocket (wss) listen address in KubeEdge's dialect, for KubeEdge
    /// edgecores (modules.cloudHub.kubeedgeWebsocket).
    #[arg(long)]
    pub(crate) kubeedge_ws: Option<String>,
    /// QUIC listen address (modules.cloudHub.quic).
    #[arg(long)]
    pub(crate) quic: Option<String>,
    /// Unix domain socket path, for local edges, trusted by file
    /// permissions (modules.cloudHub.unixsocket).
    #[arg(long)]
    pub(crate) uds: Option<PathBuf>,
    /// Certificate endpoints (/ca.crt, /edge.crt) listen address
    /// (modules.cloudHub.https).
    #[arg(long)]
    pub(crate) certs: Option<String>,
    /// Names of this cloud in its server certificate, repeatable
    /// (modules.cloudHub.advertiseAddress).
    #[arg(long = "name")]
    pub(crate) names: Vec<String>,
    /// Keepalive interval in seconds; a silent link is closed after two
    /// (modules.cloudHub.keepaliveInterval).
    #[arg(long)]
    pub(crate) keepalive_secs: Option<u64>,
    /// Lifetime of node certificates, in days
    /// (modules.cloudHub.nodeCertificateDays).
    #[arg(long)]
    pub(crate) cert_days: Option<u64>,
    /// Admin API listen address: manifests in, objects out, over HTTPS
    /// for callers with a client certificate of the cloud's CA or a bearer
    /// token; "off" for none (modules.admin).
    #[arg(long)]
    pub(crate) admin: Option<String>,
    /// The admin API in plain HTTP without authentication, on a loopback
    /// address only (modules.admin.authentication: false).
    #[arg(long)]
    pub(crate) admin_insecure: bool,
    /// Bearer tokens for the admin API, kube-apiserver's token file format
    /// (modules.admin.tokenFile).
    #[arg(long)]
    pub(crate) admin_token_file: Option<PathBuf>,
    /// Prometheus metrics listen address; "off" for none (modules.metrics).
    #[arg(long)]
    pub(crate) metrics: Option<String>,
    /// The kubelet API of edge nodes for kube-apiserver (kubectl logs,
    /// exec, port-forward), Kubernetes mode only: listen address, or "off"
    /// (modules.cloudStream).
    #[arg(long)]
    pub(crate) stream: Option<String>,
    /// The CA of kube-apiserver's kubelet client certificate, PEM
    /// (modules.cloudStream.tlsStreamCAFile; default: the cluster's CA).
    #[arg(long)]
    pub(crate) stream_client_ca: Option<PathBuf>,
    /// The port KubeEdge edgecores' edgestream dials for their logs, exec
    /// and attach, on the kubelet API's host; 0 for none
    /// (modules.cloudStream.tunnelPort).
    #[arg(long)]
    pub(crate) tunnel_port: Option<u16>,
    /// The resource metrics API (metrics.k8s.io, kubectl top) for
    /// kube-apiserver's aggregation layer, Kubernetes mode only: listen
    /// address, or "off" (modules.metricsServer).
    #[arg(long)]
    pub(crate) metrics_server: Option<String>,
    /// The admission webhook that lengthens edge pods' offline tolerations
    /// as the API server creates them, Kubernetes mode only: listen
    /// address, or "off" (modules.admission).
    #[arg(long)]
    pub(crate) admission: Option<String>,
    /// A kubeconfig: drive edge nodes from that cluster's API server
    /// instead of the embedded store (kubeAPIConfig.kubeConfig).
    #[arg(long)]
    pub(crate) kubeconfig: Option<PathBuf>,
    /// etcd members' client URLs, comma-separated: keep the desired state
    /// there, shared with other cloudcore replicas (etcd.endpoints).
    #[arg(long, value_delimiter = ',')]
    pub(crate) etcd: Vec<String>,
    /// This replica's name among the cloud's replicas; on a Kubernetes
    /// cluster, makes it one of several (replicas.name, replicas.enable).
    #[arg(long)]
    pub(crate) replica: Option<String>,
    /// How long a dead replica's nodes wait for another, in seconds
    /// (replicas.claimTtlSeconds).
    #[arg(long)]
    pub(crate) claim_ttl_secs: Option<u64>,
    /// The URL the other replicas reach this one's admin API at
    /// (replicas.advertiseAddress).
    #[arg(long)]
    pub(crate) replica_address: Option<String>,
}

impl Run {
    /// The configuration with these flags applied.
    pub(crate) fn apply(self, mut config: CloudCoreConfig) -> Result<CloudCoreConfig> {
        let hub = &mut config.modules.cloud_hub;
        // Transports given an address on the command line are the ones
        // that run ("off" only turns one off).
        let named = |flag: &Option<String>| flag.as_deref().is_some_and(|f| f != "off");
        let uds = self.uds.as_ref().map(|p| p.to_string_lossy().into_owned());
        if named(&self.ws) || named(&self.kubeedge_ws) || named(&self.quic) || named(&uds) {
            hub.websocket.enable = false;
            hub.kubeedge_websocket.enable = false;
            hub.quic.enable = false;
            hub.unixsocket.enable = false;
        }
        hub.websocket.apply_flag(self.ws);
        hub.kubeedge_websocket.apply_flag(self.kubeedge_ws);
        hub.quic.apply_flag(self.quic);
        hub.unixsocket
            .apply_flag(self.uds.map(|p| p.to_string_lossy().into_owned()));
        hub.https.apply_flag(self.certs);
        if !self.names.is_empty() {
            hub.advertise_address = self.names;
        }
        if let Some(secs) = self.keepalive_secs {
            hub.keepalive_interval = secs;
        }
        if let Some(days) = self.cert_days {
            hub.node_certificate_days = days;
        }
        if let Some(kubeconfig) = self.kubeconfig {
            config.kube_api_config.kube_config = kubeconfig.to_string_lossy().into_owned();
        }
        if !self.etcd.is_empty() {
            config.etcd.endpoints = self.etcd;
        }
        if let Some(replica) = self.replica {
            config.replicas.name = replica;
            config.replicas.enable = true;
        }
        if let Some(ttl) = self.claim_ttl_secs {
            config.replicas.claim_ttl_seconds = ttl;
        }
        if let Some(address) = self.replica_address {
            config.replicas.advertise_address = address;
        }
        let stream = &mut config.modules.cloud_stream;
        match self.stream.as_deref() {
            None => {}
            Some("off") => stream.enable = false,
            Some(address) => {
                stream.enable = true;
                stream.address = address.to_owned();
            }
        }
        if let Some(file) = self.stream_client_ca {
            stream.tls_stream_ca_file = file.to_string_lossy().into_owned();
        }
        if let Some(port) = self.tunnel_port {
            stream.tunnel_port = port;
        }
        let metrics_server = &mut config.modules.metrics_server;
        match self.metrics_server.as_deref() {
            None => {}
            Some("off") => metrics_server.enable = false,
            Some(address) => {
                metrics_server.enable = true;
                metrics_server.address = address.to_owned();
            }
        }
        let admission = &mut config.modules.admission;
        match self.admission.as_deref() {
            None => {}
            Some("off") => admission.enable = false,
            Some(address) => {
                admission.enable = true;
                admission.address = address.to_owned();
            }
        }
        config.modules.admin.apply_flag(self.admin);
        if self.admin_insecure {
            config.modules.admin.authentication = false;
        }
        if let Some(file) = self.admin_token_file {
            config.modules.admin.token_file = file;
        }
        config.modules.metrics.apply_flag(self.metrics);
        Check::check(&config).map_err(|reason| anyhow::anyhow!("{reason}"))?;
        Ok(config)
    }
}
