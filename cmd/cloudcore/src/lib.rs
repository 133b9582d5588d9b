//! cloudcore: the cloud side of edgehive.
//!
//! `cloudcore token create` prints a join token (creating the CA on first
//! use), optionally bound to one node and single-use, and records it in the
//! running cloudcore's token ledger; `token list` and `token delete ID`
//! list and revoke tokens there (as `kubeadm token create/list/delete`);
//! `cloudcore kubeconfig --user NAME --role admin|view` prints a kubeconfig
//! for the admin API; `cloudcore run` serves the certificate endpoints, cloudhub on every
//! transport asked for, the edgecontroller on its desired-state store, the
//! admin API (for `edgehivectl`) and Prometheus metrics, until SIGINT or
//! SIGTERM.
//!
//! Settings come from a YAML file (`--config`, by default
//! /etc/edgehive/cloudcore.yaml if it exists; `cloudcore --defaultconfig`
//! prints every key with its default); command-line flags override it.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use beehive::{Hive, HiveConfig};
use clap::{Parser, Subcommand};
use cloud::cloudstream::KubeletApiConfig;
use cloud::cloudstream::KubeletEndpoint;
use cloud::cloudstream::metrics::{OtherKubelets, ResourceMetrics};
use cloud::cloudstream::metrics_api::{ClusterKubelets, MetricsApiConfig, published_front_proxy};
use cloud::desired::{EtcdConfig, EtcdStore, KubeAccess, KubernetesConfig, KubernetesStore};
use cloud::dynamiccontroller::ApiServer;
use cloud::dynamiccontroller::kubernetes::KubernetesApi;
use cloud::edgecontroller::DeliveryCursors;
use cloud::ledger::StoredLedger;
use cloud::replicas::leases::{LeaseClaims, LeaseClaimsConfig};
use cloud::replicas::{ClaimCounts, ClaimsConfig, CursorConfig, CursorWriter, EtcdClaims};
use cloud::reviews::{SubjectAccessReviews, TokenAccess, TokenReviews};
use cloud::{
    AdminApi, ApplicationCenter, CenterConfig, ControllerConfig, DesiredState, EdgeController,
    EmbeddedStore, NodeHolders,
};
use cmd_common::config::{Check, settle, to_yaml};
use config::CloudCoreConfig;
use hub::certs::{CertServer, CertServerConfig, CloudCa, JoinLedger};
use hub::{CloudEndpoint, CloudHub, CloudHubConfig, Dialect};
use metrics::CloudMetrics as _;
use transports::{ListenOptions, TransportKind, tls};

/// The cloud side of edgehive.
pub mod config;
mod metrics;

#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    /// The configuration file (YAML); /etc/edgehive/cloudcore.yaml is read
    /// if it exists.
    #[arg(long, env = "EDGEHIVE_CLOUD_CONFIG")]
    config: Option<PathBuf>,
    /// Prints the default configuration and exits.
    #[arg(long)]
    defaultconfig: bool,
    /// Where the CA, keys and queues live (dataDir).
    #[arg(long, env = "EDGEHIVE_CLOUD_DIR")]
    data_dir: Option<PathBuf>,
    /// Log filter, RUST_LOG syntax (log); RUST_LOG wins when set.
    #[arg(long)]
    log: Option<String>,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand, Debug)]
enum Command {
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
enum Role {
    /// Group edgehive:admins.
    Admin,
    /// Group edgehive:viewers.
    View,
}

impl Role {
    fn group(self) -> &'static str {
        match self {
            Role::Admin => cloud::admin::auth::ADMINS,
            Role::View => cloud::admin::auth::VIEWERS,
        }
    }
}

/// `cloudcore token`: with no subcommand, `create`.
#[derive(clap::Args, Debug)]
struct Token {
    /// The running cloudcore's admin API, where the token ledger is
    /// reached (default: modules.admin of the configuration).
    #[arg(long, global = true)]
    admin: Option<String>,
    #[command(subcommand)]
    action: Option<TokenAction>,
    #[command(flatten)]
    create: CreateToken,
}

#[derive(Subcommand, Debug)]
enum TokenAction {
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
    },
}

/// Flags of `token create`.
#[derive(clap::Args, Debug)]
struct CreateToken {
    /// How long the token is valid, in seconds.
    #[arg(long, default_value_t = 24 * 3600)]
    ttl_secs: u64,
    /// The only node the token may join (its certificate's name).
    #[arg(long)]
    node: Option<String>,
    /// The token joins one node, once; a second join with it is refused.
    #[arg(long)]
    single_use: bool,
}

/// Flags of `run`; each overrides its key in the configuration file.
#[derive(clap::Args, Debug)]
struct Run {
    /// WebSocket (wss) listen address (modules.cloudHub.websocket). Any of
    /// --ws, --quic, --uds replaces the file's choice of transports.
    #[arg(long)]
    ws: Option<String>,
    /// WebSocket (wss) listen address in KubeEdge's dialect, for KubeEdge
    /// edgecores (modules.cloudHub.kubeedgeWebsocket).
    #[arg(long)]
    kubeedge_ws: Option<String>,
    /// QUIC listen address (modules.cloudHub.quic).
    #[arg(long)]
    quic: Option<String>,
    /// Unix domain socket path, for local edges, trusted by file
    /// permissions (modules.cloudHub.unixsocket).
    #[arg(long)]
    uds: Option<PathBuf>,
    /// Certificate endpoints (/ca.crt, /edge.crt) listen address
    /// (modules.cloudHub.https).
    #[arg(long)]
    certs: Option<String>,
    /// Names of this cloud in its server certificate, repeatable
    /// (modules.cloudHub.advertiseAddress).
    #[arg(long = "name")]
    names: Vec<String>,
    /// Keepalive interval in seconds; a silent link is closed after two
    /// (modules.cloudHub.keepaliveInterval).
    #[arg(long)]
    keepalive_secs: Option<u64>,
    /// Lifetime of node certificates, in days
    /// (modules.cloudHub.nodeCertificateDays).
    #[arg(long)]
    cert_days: Option<u64>,
    /// Admin API listen address: manifests in, objects out, over HTTPS
    /// for callers with a client certificate of the cloud's CA or a bearer
    /// token; "off" for none (modules.admin).
    #[arg(long)]
    admin: Option<String>,
    /// The admin API in plain HTTP without authentication, on a loopback
    /// address only (modules.admin.authentication: false).
    #[arg(long)]
    admin_insecure: bool,
    /// Bearer tokens for the admin API, kube-apiserver's token file format
    /// (modules.admin.tokenFile).
    #[arg(long)]
    admin_token_file: Option<PathBuf>,
    /// Prometheus metrics listen address; "off" for none (modules.metrics).
    #[arg(long)]
    metrics: Option<String>,
    /// The kubelet API of edge nodes for kube-apiserver (kubectl logs,
    /// exec, port-forward), Kubernetes mode only: listen address, or "off"
    /// (modules.cloudStream).
    #[arg(long)]
    stream: Option<String>,
    /// The CA of kube-apiserver's kubelet client certificate, PEM
    /// (modules.cloudStream.tlsStreamCAFile; default: the cluster's CA).
    #[arg(long)]
    stream_client_ca: Option<PathBuf>,
    /// The port KubeEdge edgecores' edgestream dials for their logs, exec
    /// and attach, on the kubelet API's host; 0 for none
    /// (modules.cloudStream.tunnelPort).
    #[arg(long)]
    tunnel_port: Option<u16>,
    /// The resource metrics API (metrics.k8s.io, kubectl top) for
    /// kube-apiserver's aggregation layer, Kubernetes mode only: listen
    /// address, or "off" (modules.metricsServer).
    #[arg(long)]
    metrics_server: Option<String>,
    /// The admission webhook that lengthens edge pods' offline tolerations
    /// as the API server creates them, Kubernetes mode only: listen
    /// address, or "off" (modules.admission).
    #[arg(long)]
    admission: Option<String>,
    /// A kubeconfig: drive edge nodes from that cluster's API server
    /// instead of the embedded store (kubeAPIConfig.kubeConfig).
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// etcd members' client URLs, comma-separated: keep the desired state
    /// there, shared with other cloudcore replicas (etcd.endpoints).
    #[arg(long, value_delimiter = ',')]
    etcd: Vec<String>,
    /// This replica's name among the cloud's replicas; on a Kubernetes
    /// cluster, makes it one of several (replicas.name, replicas.enable).
    #[arg(long)]
    replica: Option<String>,
    /// How long a dead replica's nodes wait for another, in seconds
    /// (replicas.claimTtlSeconds).
    #[arg(long)]
    claim_ttl_secs: Option<u64>,
    /// The URL the other replicas reach this one's admin API at
    /// (replicas.advertiseAddress).
    #[arg(long)]
    replica_address: Option<String>,
}

impl Run {
    /// The configuration with these flags applied.
    fn apply(self, mut config: CloudCoreConfig) -> Result<CloudCoreConfig> {
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

/// The address kube-apiserver reaches this cloudcore at, when none is
/// configured: with replicas each must name itself (the API server must
/// reach this replica, not a shared address), in a pod its IP; else the
/// first IP of `cloudHub.advertiseAddress` (an InternalIP is one), else its
/// first name.
fn advertised_host(settings: &CloudCoreConfig) -> Option<String> {
    let pod_ip = std::env::var("POD_IP").ok().filter(|ip| !ip.is_empty());
    if settings.replicas.enable && pod_ip.is_some() {
        return pod_ip;
    }
    let names = &settings.modules.cloud_hub.advertise_address;
    names
        .iter()
        .find(|name| name.parse::<std::net::IpAddr>().is_ok())
        .or(names.first())
        .cloned()
}

/// The admission webhook (Kubernetes mode): served over TLS with a
/// certificate of the cloud's CA for the names the API server calls it
/// by, then registered as the `MutatingWebhookConfiguration`
/// `edgehive-cloudcore` with that CA as its `caBundle`. A registration the
/// API server refuses is logged, naming what is missing; the webhook
/// still serves (another replica's registration may name it), and pods
/// it does not see keep the controller's lengthening.
async fn start_admission(
    settings: &CloudCoreConfig,
    ca: &CloudCa,
    store: &KubernetesStore,
) -> Result<cloud::admission::AdmissionHandle> {
    use cloud::admission::webhook::{self, Endpoint};
    let section = &settings.modules.admission;
    let port = section
        .address
        .rsplit_once(':')
        .and_then(|(_, port)| port.parse::<u16>().ok())
        .context("modules.admission.address: no port")?;
    let endpoint = match (section.service.as_str(), section.url.as_str()) {
        ("", "") => Endpoint::on_host(
            &advertised_host(settings)
                .context("modules.admission.url: none, and no cloudHub.advertiseAddress")?,
            port,
        ),
        ("", url) => Endpoint::url(url).context("modules.admission.url")?,
        (service, _) => Endpoint::service(service).context("modules.admission.service")?,
    };
    let mut names = endpoint.server_names();
    names.extend(settings.modules.cloud_hub.advertise_address.iter().cloned());
    names.extend(std::env::var("POD_IP").ok().filter(|ip| !ip.is_empty()));
    names.sort();
    names.dedup();
    let (chain, key) = ca.issue_server(&names, Duration::from_secs(365 * 24 * 3600))?;
    let grace = settings.kube_api_config.offline_grace_seconds;
    let handle = cloud::admission::start(cloud::admission::AdmissionConfig {
        address: section.address.clone(),
        tls: tls::server_config(chain, key, None)?,
        window: (grace > 0).then(|| Duration::from_secs(grace)),
        edge_nodes: Arc::new(store.edge_node_names()),
    })
    .await
    .with_context(|| format!("modules.admission.address {}", section.address))?;
    let ca_pem = cloud::admin_client::kubeconfig::pem("CERTIFICATE", ca.root().as_ref());
    let configuration = webhook::configuration(&section.configuration_name, &endpoint, &ca_pem);
    match webhook::register(store.client().clone(), &configuration).await {
        Ok(done) => {
            tracing::info!(
                ?done,
                ?endpoint,
                name = %section.configuration_name,
                "admission webhook registered"
            )
        }
        Err(err) => tracing::error!(
            error = %err,
            "the admission webhook is not registered: pods bound to edge nodes are created with the API server's 300 s offline tolerations, which the edgecontroller then lengthens"
        ),
    }
    Ok(handle)
}

/// The kubelet API's settings (Kubernetes mode), and the endpoint edge
/// Nodes name: this cloudcore's certificate from its CA, client
/// certificates checked against kube-apiserver's kubelet-client CA (a file,
/// or the cluster's CA as the `kube-root-ca.crt` ConfigMap publishes it),
/// callers authorized by the API server.
async fn kubelet_api_config(
    settings: &CloudCoreConfig,
    ca: &CloudCa,
    store: &KubernetesStore,
) -> Result<(KubeletEndpoint, KubeletApiConfig)> {
    let section = &settings.modules.cloud_stream;
    let advertise = match section.advertise_address.as_str() {
        "" => advertised_host(settings).context(
            "modules.cloudStream.advertiseAddress: none, and no cloudHub.advertiseAddress",
        )?,
        address => address.to_owned(),
    };
    let port = section
        .address
        .rsplit_once(':')
        .and_then(|(_, port)| port.parse::<u16>().ok())
        .context("modules.cloudStream.address: no port")?;
    let client_ca = match section.tls_stream_ca_file.as_str() {
        "" => {
            // Published by kube-controller-manager into every namespace,
            // cloudcore's own just created perhaps: a few tries.
            let namespace = &settings.kube_api_config.namespace;
            let mut tries = 0;
            loop {
                match cloud::cloudstream::cluster_ca(store.client().clone(), namespace).await {
                    Ok(pem) => break pem.into_bytes(),
                    Err(_) if tries < 10 => {
                        tries += 1;
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                    Err(err) => anyhow::bail!(
                        "the cluster's CA ({namespace}/kube-root-ca.crt: {err}); set modules.cloudStream.tlsStreamCAFile"
                    ),
                }
            }
        }
        file => std::fs::read(file)
            .with_context(|| format!("modules.cloudStream.tlsStreamCAFile {file}"))?,
    };
    let client_roots = tls::certs_from_pem(&client_ca)?;
    anyhow::ensure!(
        !client_roots.is_empty(),
        "the kubelet-client CA holds no certificate"
    );
    let (chain, key) = ca.issue_server(
        std::slice::from_ref(&advertise),
        Duration::from_secs(365 * 24 * 3600),
    )?;
    let config = KubeletApiConfig {
        address: section.address.clone(),
        tls: tls::server_config(chain, key, Some(&client_roots))?,
        authorizer: Arc::new(SubjectAccessReviews::new(store.client().clone())),
        edge_tunnels: cloud::cloudstream::edgestream::EdgeTunnels::default(),
    };
    let endpoint = KubeletEndpoint {
        address: advertise,
        port,
    };
    Ok((endpoint, config))
}

/// The resource metrics API's settings (Kubernetes mode): this cloudcore's
/// certificate for the Service the APIService names, the front proxy as
/// the API server publishes it, callers authorized by the API server.
async fn metrics_server_config(
    settings: &CloudCoreConfig,
    ca: &CloudCa,
    store: &KubernetesStore,
) -> Result<MetricsApiConfig> {
    let section = &settings.modules.metrics_server;
    let (front_proxy, proxy_ca) = published_front_proxy(store.client().clone())
        .await
        .map_err(|reason| anyhow::anyhow!("the API server's front proxy: {reason}"))?;
    let client_roots = tls::certs_from_pem(proxy_ca.as_bytes())?;
    anyhow::ensure!(
        !client_roots.is_empty(),
        "the request-header CA holds no certificate"
    );
    let service = format!(
        "{}.{}.svc",
        section.service_name, settings.kube_api_config.namespace
    );
    let mut names = vec![service.clone(), format!("{service}.cluster.local")];
    names.extend(settings.modules.cloud_hub.advertise_address.iter().cloned());
    names.extend(std::env::var("POD_IP").ok().filter(|ip| !ip.is_empty()));
    let (chain, key) = ca.issue_server(&names, Duration::from_secs(365 * 24 * 3600))?;
    Ok(MetricsApiConfig {
        address: section.address.clone(),
        tls: tls::server_config(chain, key, Some(&client_roots))?,
        front_proxy,
        authorizer: Arc::new(SubjectAccessReviews::new(store.client().clone())),
    })
}

/// The admin API's server certificate names: the cloud's advertised
/// names and the host it listens on (unless that is every address).
fn admin_names(settings: &CloudCoreConfig) -> Vec<String> {
    let mut names = settings.modules.cloud_hub.advertise_address.clone();
    // The address the other replicas reach it at.
    if let Some(url) = replica_url(settings) {
        let host = url.split("://").nth(1).unwrap_or(&url);
        let host = match host.rsplit_once(':') {
            Some((host, port)) if port.parse::<u16>().is_ok() => host,
            _ => host,
        };
        let host = host.trim_start_matches('[').trim_end_matches(']');
        if !host.is_empty() && !names.iter().any(|n| n == host) {
            names.push(host.to_owned());
        }
    }
    if let Some((host, _)) = settings.modules.admin.address.rsplit_once(':') {
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let every = host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_unspecified());
        if !every && !host.is_empty() && !names.iter().any(|n| n == host) {
            names.push(host.to_owned());
        }
    }
    names
}

/// The URL the other replicas reach this one's admin API at
/// (`replicas.advertiseAddress`; by default `$POD_IP`, else the admin
/// API's listen host, else the first advertised name, at its port). `None`
/// without an admin API.
fn replica_url(settings: &CloudCoreConfig) -> Option<String> {
    let admin = &settings.modules.admin;
    let address = admin.enabled()?;
    let given = &settings.replicas.advertise_address;
    if !given.is_empty() {
        return Some(given.clone());
    }
    let scheme = if admin.authentication {
        "https"
    } else {
        "http"
    };
    let (host, port) = address.rsplit_once(':').unwrap_or((address, "10003"));
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    let pod_ip = std::env::var("POD_IP").ok().filter(|ip| !ip.is_empty());
    let host = match (pod_ip, bare.parse::<std::net::IpAddr>()) {
        (Some(ip), _) => ip,
        (None, Ok(ip)) if ip.is_unspecified() => settings
            .modules
            .cloud_hub
            .advertise_address
            .first()
            .cloned()
            .unwrap_or_else(|| "127.0.0.1".to_owned()),
        (None, _) => bare.to_owned(),
    };
    Some(if host.contains(':') {
        format!("{scheme}://[{host}]:{port}")
    } else {
        format!("{scheme}://{host}:{port}")
    })
}

/// The admin API's URL as a kubeconfig names it: its listen address, or
/// the first advertised name at its port when it listens on every address.
fn admin_server_url(settings: &CloudCoreConfig) -> String {
    let address = &settings.modules.admin.address;
    let (host, port) = address.rsplit_once(':').unwrap_or((address, "10003"));
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    let host = match bare.parse::<std::net::IpAddr>() {
        Ok(ip) if ip.is_unspecified() => settings
            .modules
            .cloud_hub
            .advertise_address
            .first()
            .cloned()
            .unwrap_or_else(|| "127.0.0.1".to_owned()),
        _ => bare.to_owned(),
    };
    if host.contains(':') {
        format!("https://[{host}]:{port}")
    } else {
        format!("https://{host}:{port}")
    }
}

/// The admin API's TLS (the CA's server certificate; client certificates
/// of the CA verified when presented) and its bearer tokens.
fn admin_auth(settings: &CloudCoreConfig, ca: &CloudCa) -> Result<cloud::admin::AdminAuth> {
    let (chain, key) =
        ca.issue_server(&admin_names(settings), Duration::from_secs(365 * 24 * 3600))?;
    let tls = tls::server_config_optional_client_auth(chain, key, &[ca.root()])?;
    let file = &settings.modules.admin.token_file;
    let tokens = if file.as_os_str().is_empty() {
        cloud::admin::auth::Tokens::none()
    } else {
        let tokens = cloud::admin::auth::Tokens::read(file).context("modules.admin.tokenFile")?;
        tracing::info!(file = %file.display(), tokens = tokens.len(), "admin API bearer tokens");
        tokens
    };
    Ok(cloud::admin::AdminAuth { tls, tokens })
}

/// A kubeconfig for `user` in `group`, a client certificate of the CA
/// valid for `days`.
fn admin_kubeconfig(
    ca: &CloudCa,
    server: &str,
    user: &str,
    group: &str,
    days: u64,
) -> Result<String> {
    anyhow::ensure!(!user.is_empty(), "--user: a name");
    let identity = ca.issue_client(user, group, Duration::from_secs(days * 24 * 3600))?;
    let kubeconfig = cloud::admin_client::kubeconfig::Kubeconfig::with_certificate(
        "edgehive",
        server,
        &ca.root(),
        user,
        &identity,
    );
    Ok(kubeconfig.to_yaml()?)
}

/// The admin's certificates' lifetime in the kubeconfig written at first
/// start, in days.
const ADMIN_DAYS: u64 = 5 * 365;

/// Writes `<dataDir>/admin.kubeconfig` (readable by its owner only) for
/// user `admin` in `edgehive:admins`, unless it is there already.
fn write_admin_kubeconfig(settings: &CloudCoreConfig, ca: &CloudCa) -> Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let path = settings
        .data_dir
        .join(cloud::admin_client::kubeconfig::FILE_NAME);
    if path.exists() {
        return Ok(());
    }
    let text = admin_kubeconfig(
        ca,
        &admin_server_url(settings),
        "admin",
        cloud::admin::auth::ADMINS,
        ADMIN_DAYS,
    )?;
    let partial = path.with_extension("kubeconfig.partial");
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&partial)
        .with_context(|| partial.display().to_string())?;
    file.write_all(text.as_bytes())
        .and_then(|()| file.sync_all())
        .with_context(|| partial.display().to_string())?;
    std::fs::rename(&partial, &path).with_context(|| path.display().to_string())?;
    tracing::info!(path = %path.display(), "admin kubeconfig written (edgehivectl --kubeconfig)");
    Ok(())
}

/// Where the configuration file is read from by default.
const DEFAULT_CONFIG: &str = "/etc/edgehive/cloudcore.yaml";

/// cloudcore's command line: parses the arguments and runs the command
/// they name (the binary's `main`).
pub fn main() -> Result<()> {
    let args = Args::parse();
    if args.defaultconfig {
        print!("{}", to_yaml(&CloudCoreConfig::default()));
        return Ok(());
    }
    let settings: CloudCoreConfig = settle(
        args.config.as_deref(),
        std::path::Path::new(DEFAULT_CONFIG),
        args.data_dir,
        args.log,
    )?;
    let Some(command) = args.command else {
        anyhow::bail!("give a command: run, token, kubeconfig (see --help)");
    };
    let ca = CloudCa::load_or_create(&settings.ca_dir()).context("the cloud CA")?;
    match command {
        Command::Token(token) => tokens(&ca, &settings, token),
        Command::Kubeconfig {
            user,
            role,
            days,
            server,
        } => {
            anyhow::ensure!(days > 0, "--days: at least 1");
            let server = server.unwrap_or_else(|| admin_server_url(&settings));
            let kubeconfig = admin_kubeconfig(&ca, &server, &user, role.group(), days)?;
            print!("{kubeconfig}");
            Ok(())
        }
        Command::Run(run) => {
            let settings = (*run).apply(settings)?;
            actix::System::new().block_on(serve(Arc::new(ca), settings))
        }
    }
}

/// `cloudcore token ...`: tokens are signed here; their records live in
/// the running cloudcore's ledger, reached through its admin API.
fn tokens(ca: &CloudCa, settings: &CloudCoreConfig, token: Token) -> Result<()> {
    use cloud::admin::TOKENS_PATH;
    use hub::certs::{TokenRecord, TokenSpec};
    // With authentication, as the admin: the kubeconfig cloudcore wrote.
    let admin = match token.admin.as_deref().or(settings.modules.admin.enabled()) {
        None => None,
        Some(address) if address.starts_with("http://") => Some(cloud::AdminClient::new(address)),
        Some(address) if settings.modules.admin.authentication => {
            let path = settings
                .data_dir
                .join(cloud::admin_client::kubeconfig::FILE_NAME);
            match cloud::admin_client::kubeconfig::Kubeconfig::load(&path) {
                Ok(credentials) => {
                    let server = token
                        .admin
                        .as_deref()
                        .map(|a| format!("https://{}", a.trim_start_matches("https://")));
                    Some(
                        cloud::AdminClient::from_credentials(&credentials, server.as_deref())
                            .with_context(|| format!("{}", path.display()))?,
                    )
                }
                Err(_) => Some(cloud::AdminClient::new(address)),
            }
        }
        Some(address) => Some(cloud::AdminClient::new(address)),
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let need_admin = || {
        admin
            .clone()
            .context("modules.admin is off: no ledger to reach")
    };
    match token.action.unwrap_or(TokenAction::Create(token.create)) {
        TokenAction::Create(create) => {
            if let Some(node) = &create.node {
                anyhow::ensure!(
                    hub::certs::valid_node_name(node),
                    "invalid node name {node:?}"
                );
            }
            let (claims, token) = ca.issue_restricted_token(&TokenSpec {
                ttl: Duration::from_secs(create.ttl_secs),
                node: create.node,
                single_use: create.single_use,
            });
            let record = TokenRecord::issued(&claims).context("a token without an id")?;
            let body = serde_json::to_vec(&record)?;
            let recorded = match &admin {
                Some(admin) => runtime
                    .block_on(admin.raw(hyper::Method::POST, TOKENS_PATH, Some(body)))
                    .map_err(anyhow::Error::from)
                    .and_then(|(status, body)| match status {
                        201 => Ok(()),
                        _ => Err(anyhow::anyhow!(
                            "{status}: {}",
                            String::from_utf8_lossy(&body)
                        )),
                    }),
                None => Err(anyhow::anyhow!("modules.admin is off")),
            };
            if let Err(err) = recorded {
                eprintln!(
                    "token {} not recorded ({err:#}): it works, but `token list` will not show it",
                    record.id
                );
            }
            println!("{token}");
            Ok(())
        }
        TokenAction::List => {
            let admin = need_admin()?;
            let (tokens, revoked) = runtime.block_on(async {
                let tokens = admin.get(TOKENS_PATH).await?;
                let revoked = admin.get(&format!("{TOKENS_PATH}/revokednodes")).await?;
                anyhow::Ok((tokens, revoked))
            })?;
            let tokens: Vec<TokenRecord> = serde_json::from_value(tokens)?;
            println!(
                "{:<18} {:<24} {:<10} {:<26} STATE",
                "ID", "NODE", "USES", "EXPIRES"
            );
            for t in tokens {
                let expires = jiff::Timestamp::from_second(t.expires.min(i64::MAX as u64) as i64)
                    .map(|at| at.to_string())
                    .unwrap_or_else(|_| "never".to_owned());
                let state = match (&t.revoked, &t.used_by) {
                    (Some(_), _) => "revoked".to_owned(),
                    (None, Some(by)) => format!("used by {by}"),
                    (None, None) => "valid".to_owned(),
                };
                let uses = if t.single_use { "once" } else { "any" };
                println!(
                    "{:<18} {:<24} {:<10} {:<26} {state}",
                    t.id,
                    t.node.as_deref().unwrap_or("<any>"),
                    uses,
                    expires
                );
            }
            for (node, revocation) in revoked["nodes"].as_object().into_iter().flatten() {
                println!(
                    "revoked node {node}: certificates issued until {} refused",
                    revocation["at"]
                        .as_i64()
                        .and_then(|at| jiff::Timestamp::from_second(at).ok())
                        .map(|at| at.to_string())
                        .unwrap_or_default()
                );
            }
            Ok(())
        }
        TokenAction::Delete { id } => {
            let admin = need_admin()?;
            let answer = runtime.block_on(admin.delete(&format!("{TOKENS_PATH}/{id}")))?;
            match answer["revoked"].as_bool() {
                Some(true) => println!("token {id} revoked"),
                _ => println!("token {id} was revoked already"),
            }
            Ok(())
        }
    }
}

async fn serve(ca: Arc<CloudCa>, settings: CloudCoreConfig) -> Result<()> {
    let data_dir = settings.data_dir.clone();
    let hub_settings = &settings.modules.cloud_hub;
    let names = hub_settings.advertise_address.clone();
    let (chain, key) = ca.issue_server(&names, Duration::from_secs(365 * 24 * 3600))?;
    let server_tls = tls::server_config(chain, key, Some(&[ca.root()]))?;
    let mut endpoints = Vec::new();
    for (kind, dialect, listener) in [
        (
            TransportKind::WebSocket,
            Dialect::Native,
            &hub_settings.websocket,
        ),
        (
            TransportKind::WebSocket,
            Dialect::KubeEdge,
            &hub_settings.kubeedge_websocket,
        ),
        (TransportKind::Quic, Dialect::Native, &hub_settings.quic),
    ] {
        if let Some(address) = listener.enabled() {
            endpoints.push(CloudEndpoint {
                kind,
                options: ListenOptions::new(address).with_tls(server_tls.clone()),
                trust_hello: false,
                dialect,
            });
        }
    }
    if let Some(path) = hub_settings.unixsocket.enabled() {
        endpoints.push(CloudEndpoint {
            kind: TransportKind::UnixSocket,
            options: ListenOptions::new(path),
            trust_hello: true,
            dialect: Dialect::Native,
        });
    }
    let hive = Hive::new("cloud", HiveConfig::default());
    // The controller first: it must hear cloudhub's first node events.
    let desired = Desired::open(&settings).await?;
    // Join tokens' records and deleted nodes, with the desired state (every
    // replica sees the same); a deleted Node's certificates are revoked.
    let ledger: Arc<dyn JoinLedger> = Arc::new(StoredLedger::new(
        desired.shared(),
        &settings.kube_api_config.namespace,
    ));
    let _revoker = tokio::spawn(cloud::ledger::revoke_deleted_nodes(
        desired.shared(),
        ledger.clone(),
    ));
    let certs = match hub_settings.https.enabled() {
        Some(address) => Some(
            CertServer::start(
                ca.clone(),
                CertServerConfig::new(
                    address,
                    names.clone(),
                    Duration::from_secs(hub_settings.node_certificate_days * 24 * 3600),
                )
                .with_ledger(ledger.clone()),
            )
            .await
            .context("certificate endpoints")?,
        ),
        None => None,
    };
    // Replicas serve each node under a claim.
    let claims = start_claims(&settings, &desired).await?;
    // Replicas keep what KubeEdge nodes acknowledged in their engine, so
    // the replica that takes one over sends it only what it lacks: written
    // only under the node's claim, and once more before it is given up.
    let cursors = match (&claims, &desired) {
        (Some(Claims::Etcd(claims)), Desired::Etcd(_)) => {
            let mut config = CursorConfig::new(settings.etcd.endpoints.clone());
            config.prefix = settings.etcd.prefix.clone();
            let cursors =
                CursorWriter::start(config, claims.fencing()).context("delivery cursors")?;
            claims.before_release(cursors.before_release());
            Some(cursors)
        }
        (Some(Claims::Leases(claims)), Desired::Kubernetes(store)) => {
            let cursors = CursorWriter::on_kubernetes(
                store.client().clone(),
                &settings.kube_api_config.namespace,
                claims.clone(),
                Duration::from_secs(1),
            );
            claims.before_release(cursors.before_release());
            Some(cursors)
        }
        _ => None,
    };
    let grace = settings.kube_api_config.offline_grace_seconds;
    // Kubernetes mode: kube-apiserver reaches edge nodes' kubelet API here.
    let kubelet_api = match &desired {
        Desired::Kubernetes(store) if settings.modules.cloud_stream.enable => {
            match kubelet_api_config(&settings, &ca, store).await {
                Ok(api) => Some(api),
                Err(err) => {
                    tracing::warn!(error = %format!("{err:#}"), "no kubelet API for edge nodes: kubectl logs, exec and port-forward will not reach them");
                    None
                }
            }
        }
        _ => None,
    };
    let controller_config = ControllerConfig {
        offline_grace: (grace > 0).then(|| Duration::from_secs(grace)),
        // Replicas: a node is sent to by the one that serves it.
        send_to_linked_only: desired.replicated(&settings),
        cursors: cursors
            .clone()
            .map(|cursors| Arc::new(cursors) as Arc<dyn DeliveryCursors>),
        // A node's status is written by its holder; one no replica holds
        // is marked unreachable by any, every other claim TTL.
        claims: claims.as_ref().map(Claims::holders),
        sweep_every: Duration::from_secs(2 * settings.replicas.claim_ttl_seconds),
        kubelet_endpoint: kubelet_api.as_ref().map(|(endpoint, _)| endpoint.clone()),
        // Edges' MetaServers with requireAuthorization: tokens reviewed by
        // the API server (TokenReview, then SubjectAccessReview), with
        // cloudcore's credentials. Elsewhere no token is anyone.
        token_access: match &desired {
            Desired::Kubernetes(store) => Some(TokenAccess::new(
                Arc::new(TokenReviews::new(store.client().clone())),
                Arc::new(SubjectAccessReviews::new(store.client().clone())),
            )),
            _ => None,
        },
        ..ControllerConfig::default()
    };
    let controller = EdgeController::start(&hive, desired.shared(), controller_config)?;
    let dynamic = &settings.modules.dynamic_controller;
    if dynamic.enable {
        let config = CenterConfig {
            max_watches_per_node: dynamic.max_watches_per_node,
            ..CenterConfig::default()
        };
        ApplicationCenter::start(&hive, controller.node_links(), desired.api_server(), config)?;
    }
    // Streams to edge pods (logs, exec, port-forward, stats) go through
    // the nodes' links, kept by cloudhub.
    let tunnels = stream::NodeTunnels::default();
    let mut pod_streams =
        cloud::cloudstream::streams::PodStreams::new(tunnels.clone(), controller.store().clone());
    // Replicas: what is asked of a node another replica holds is asked of
    // that replica's admin API, as this replica (its own certificate).
    if let Some(claims) = &claims {
        let replica = replica_name(&settings.replicas);
        let identity = ca.issue_client(
            &format!("{}{replica}", cloud::peers::REPLICA_USER_PREFIX),
            cloud::admin::auth::REPLICAS,
            Duration::from_secs(365 * 24 * 3600),
        )?;
        tracing::info!(url = ?replica_url(&settings), "forwarding to the replica holding a node; peers reach this one at that URL");
        let peers =
            cloud::peers::Peers::new(replica, claims.directory(), vec![ca.root()], Some(identity));
        pod_streams = pod_streams.with_peers(peers);
    }
    // KubeEdge edgecores' edgestream tunnels, for their logs, exec,
    // attach and stats through the kubelet API: on the kubelet API's host,
    // with cloudhub's certificate and node certificates required.
    let _tunnel_port = match (&kubelet_api, settings.modules.cloud_stream.tunnel_port) {
        (Some((_, config)), port) if port != 0 => {
            let host = settings
                .modules
                .cloud_stream
                .address
                .rsplit_once(':')
                .map_or("0.0.0.0", |(host, _)| host);
            let tunnel = cloud::cloudstream::edgestream::TunnelConfig {
                address: format!("{host}:{port}"),
                tls: server_tls.clone(),
            };
            match cloud::cloudstream::edgestream::start(tunnel, config.edge_tunnels.clone()).await {
                Ok(handle) => Some(handle),
                Err(err) => {
                    tracing::warn!(error = %err, port, "no edgestream tunnel port (modules.cloudStream.tunnelPort): KubeEdge edgecores get no logs or exec");
                    None
                }
            }
        }
        _ => None,
    };
    let _kubelet_api = match kubelet_api {
        Some((_, config)) => match cloud::cloudstream::start(config, pod_streams.clone()).await {
            Ok(handle) => {
                tracing::info!(address = %handle.address, "kubelet API for edge nodes ready");
                Some(handle)
            }
            // The nodes are still served; only kubectl's streams are not.
            Err(err) => {
                tracing::warn!(error = %err, "no kubelet API for edge nodes (modules.cloudStream.address): kubectl logs, exec and port-forward will not reach them");
                None
            }
        },
        None => None,
    };
    // Kubernetes mode, when asked: metrics.k8s.io for `kubectl top`.
    let _metrics_server = match &desired {
        Desired::Kubernetes(store) if settings.modules.metrics_server.enable => {
            let started = async {
                let config = metrics_server_config(&settings, &ca, store).await?;
                let others = settings.modules.metrics_server.cloud_nodes.then(|| {
                    Arc::new(ClusterKubelets::new(store.client().clone())) as Arc<dyn OtherKubelets>
                });
                let metrics = ResourceMetrics::new(pod_streams.clone(), others);
                anyhow::Ok(cloud::cloudstream::metrics_api::start(config, metrics).await?)
            };
            match started.await {
                Ok(handle) => Some(handle),
                // The nodes are still served; only kubectl top is not.
                Err(err) => {
                    tracing::warn!(error = %format!("{err:#}"), "no resource metrics API (modules.metricsServer): kubectl top will not reach edge pods");
                    None
                }
            }
        }
        _ => None,
    };
    // Kubernetes mode, when asked: pods bound to edge nodes are created
    // with their offline tolerations lengthened (no write per pod).
    let _admission = match &desired {
        Desired::Kubernetes(store) if settings.modules.admission.enable => {
            match start_admission(&settings, &ca, store).await {
                Ok(handle) => Some(handle),
                Err(err) => {
                    tracing::error!(error = %format!("{err:#}"), "no admission webhook (modules.admission)");
                    None
                }
            }
        }
        _ if settings.modules.admission.enable => {
            tracing::info!(
                "modules.admission: Kubernetes mode only; no webhook without an API server"
            );
            None
        }
        _ => None,
    };
    let admin = match settings.modules.admin.enabled() {
        Some(address) if settings.modules.admin.authentication => {
            let auth = admin_auth(&settings, &ca)?;
            let started = AdminApi::start_tls(
                controller.clone(),
                address,
                Some(pod_streams.clone()),
                auth,
                Some(ledger.clone()),
            )
            .context("admin API")?;
            write_admin_kubeconfig(&settings, &ca)?;
            Some(started)
        }
        Some(address) => {
            tracing::warn!(
                %address,
                "admin API without authentication (modules.admin.authentication: false): whoever reaches it controls every node"
            );
            Some(
                AdminApi::start_with_ledger(
                    controller.clone(),
                    address,
                    Some(pod_streams.clone()),
                    Some(ledger.clone()),
                )
                .context("admin API")?,
            )
        }
        None => None,
    };
    if let (Some(Claims::Etcd(claims)), Desired::Etcd(store)) = (&claims, &desired) {
        // A node's status is written only under this replica's claim.
        store.fence_with(claims.fencing());
        // A node taken over is served once this replica sees every apply
        // answered before.
        claims.catch_up_with(store.catching_up());
    }
    let hub = CloudHub::start(
        &hive,
        CloudHubConfig {
            node_events: controller.node_events(),
            links: controller.node_links(),
            endpoints,
            keepalive: Duration::from_secs(hub_settings.keepalive_interval),
            store: Some(data_dir.join("queues.redb")),
            claims: claims.as_ref().map(Claims::shared),
            acks: cursors
                .clone()
                .map(|cursors| Arc::new(cursors) as Arc<dyn hub::AckSink>),
            streams: tunnels,
            revocations: Some(ledger.clone()),
            ..CloudHubConfig::default()
        },
    )
    .await
    .context("cloudhub")?;
    for (kind, address) in &hub.addresses {
        tracing::info!(%kind, %address, "cloudhub ready");
    }
    let metrics = match settings.modules.metrics.enabled() {
        Some(address) => {
            let (hive, stats, store) =
                (hive.clone(), hub.stats.clone(), controller.store().clone());
            let claim_counts = claims.as_ref().map(Claims::counts);
            let cursor_counts = cursors.as_ref().map(CursorWriter::counts);
            let controller_counts = controller.counts.clone();
            let api_requests = match &desired {
                Desired::Kubernetes(store) => Some(store.api_requests().clone()),
                _ => None,
            };
            let render: cmd_common::metrics::Render = Arc::new(move || {
                let mut page = cmd_common::metrics::Exposition::default();
                page.hive(&hive);
                page.cloudhub(&stats);
                page.controller(&controller_counts.borrow());
                if let Some(requests) = &api_requests {
                    page.api_requests(requests);
                }
                if let Some(counts) = &claim_counts {
                    let c = counts.borrow().clone();
                    page.gauge(
                        "edgehive_replica_nodes_held",
                        "Nodes this replica holds a claim on.",
                        &[],
                        c.held as u64,
                    );
                    page.counter(
                        "edgehive_replica_claims_taken_total",
                        "Claims on nodes taken.",
                        &[],
                        c.taken,
                    );
                    page.counter(
                        "edgehive_replica_claims_refused_total",
                        "Claims refused (another replica serves the node, or no trusted lease).",
                        &[],
                        c.refused,
                    );
                    page.counter(
                        "edgehive_replica_claims_lost_total",
                        "Claims lost with the lease (failovers away from this replica).",
                        &[],
                        c.lost,
                    );
                    page.counter(
                        "edgehive_replica_leases_total",
                        "Claim leases granted (more than one: the replica lost etcd).",
                        &[],
                        c.leases,
                    );
                    page.counter(
                        "edgehive_replica_handed_over_total",
                        "Nodes handed over to another replica (to even the replicas out, or on SIGTERM).",
                        &[],
                        c.handed_over,
                    );
                    page.counter(
                        "edgehive_replica_engine_renewals_total",
                        "Claim lease renewals the engine (etcd, the API server) answered.",
                        &[],
                        c.renewals,
                    );
                    page.counter(
                        "edgehive_replica_engine_renewal_microseconds_total",
                        "Their round trips, summed: the engine's latency is this over the renewals.",
                        &[],
                        c.renewal_micros,
                    );
                    page.gauge(
                        "edgehive_replica_engine_last_renewal_microseconds",
                        "The last renewal's round trip.",
                        &[],
                        c.last_renewal_micros,
                    );
                    page.gauge(
                        "edgehive_replica_replicas",
                        "Replicas up, as this one last counted them.",
                        &[],
                        c.replicas as u64,
                    );
                }
                if let Some(counts) = &cursor_counts {
                    page.counter(
                        "edgehive_replica_cursor_writes_total",
                        "Delivery cursors (what a KubeEdge node acknowledged) written to the engine (etcd, or ConfigMaps).",
                        &[],
                        counts.borrow().writes,
                    );
                }
                // One pod decoded at a time: a scrape does not copy them all.
                let mut phases = Vec::new();
                let _ = store.list_each(apis::Kind::Pod, None, &mut |pod| {
                    phases.push(
                        pod["status"]["phase"]
                            .as_str()
                            .unwrap_or("Unknown")
                            .to_owned(),
                    )
                });
                page.pods_by_phase(phases.iter().map(String::as_str));
                page.finish()
            });
            let (bound, server) = cmd_common::metrics::serve(address, render).context("metrics")?;
            tracing::info!(address = %bound, "metrics ready");
            Some(server)
        }
        None => None,
    };
    if let Some(certs) = &certs {
        tracing::info!(address = %certs.address, "certificate endpoints ready");
    }
    if let Some(admin) = &admin {
        tracing::info!(address = %admin.address, "admin API ready");
    }
    Hive::signalled().await?;
    // Stop taking requests first: what is in flight is answered (each
    // object queued for its node) while the edgecontroller and cloudhub
    // still run; then what feeds cloudhub stops, draining; cloudhub last.
    if let Some(admin) = admin {
        admin.stop().await;
    }
    drop(_kubelet_api);
    drop(_metrics_server);
    drop(_admission);
    if let Some(certs) = certs {
        certs.stop().await;
    }
    for feeder in [
        cloud::dynamiccontroller::wire::MODULE,
        beehive::constants::module::EDGECONTROLLER,
    ] {
        let stopped = hive.stop_module(feeder).await;
        if !stopped.timed_out.is_empty() {
            tracing::warn!(module = feeder, "did not drain before cloudhub stops");
        }
    }
    if let Some(cursors) = &cursors {
        // What the nodes acknowledged is written while their claims are
        // still this replica's.
        if tokio::time::timeout(Duration::from_secs(2), cursors.flush_all())
            .await
            .is_err()
        {
            tracing::warn!("delivery cursors not all written before stopping");
        }
    }
    if let Some(claims) = &claims {
        // Handed over first: the nodes' links close and every other
        // replica may take them at once, while this one stops.
        claims.give_up().await;
    }
    let report = hive.shutdown().await;
    if let Some(metrics) = metrics {
        metrics.stop(true).await;
    }
    desired.close().await;
    tracing::info!(?report, "cloudcore stopped");
    Ok(())
}

/// This replica's claims on the nodes it serves.
#[derive(Clone)]
enum Claims {
    /// Keys in etcd, under the replica's etcd lease.
    Etcd(EtcdClaims),
    /// Kubernetes Leases in cloudcore's namespace.
    Leases(LeaseClaims),
}

impl Claims {
    fn counts(&self) -> tokio::sync::watch::Receiver<ClaimCounts> {
        match self {
            Claims::Etcd(claims) => claims.counts(),
            Claims::Leases(claims) => claims.counts(),
        }
    }

    fn shared(&self) -> Arc<dyn hub::NodeClaims> {
        match self {
            Claims::Etcd(claims) => Arc::new(claims.clone()),
            Claims::Leases(claims) => Arc::new(claims.clone()),
        }
    }

    fn directory(&self) -> Arc<dyn cloud::peers::PeerDirectory> {
        match self {
            Claims::Etcd(claims) => Arc::new(claims.clone()),
            Claims::Leases(claims) => Arc::new(claims.clone()),
        }
    }

    fn holders(&self) -> Arc<dyn NodeHolders> {
        match self {
            Claims::Etcd(claims) => Arc::new(claims.clone()),
            Claims::Leases(claims) => Arc::new(claims.clone()),
        }
    }

    async fn give_up(&self) {
        match self {
            Claims::Etcd(claims) => claims.give_up().await,
            Claims::Leases(claims) => claims.give_up().await,
        }
    }
}

/// This replica's name: the configured one, or the host's name and the
/// process id (lowercase: it names Kubernetes Leases).
fn replica_name(replicas: &config::ReplicasSection) -> String {
    match replicas.name.is_empty() {
        false => replicas.name.clone(),
        true => {
            let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
                .map(|h| h.trim().to_lowercase())
                .unwrap_or_else(|_| "cloudcore".to_owned());
            format!("{host}-{}", std::process::id())
        }
    }
}

/// The claims this replica serves nodes under, if it is one of several:
/// in etcd with the desired state there, as Leases on a Kubernetes
/// cluster with `replicas.enable`.
async fn start_claims(settings: &CloudCoreConfig, desired: &Desired) -> Result<Option<Claims>> {
    let replicas = &settings.replicas;
    let ttl = Duration::from_secs(replicas.claim_ttl_seconds);
    match desired {
        Desired::Etcd(_) => {
            let replica = replica_name(replicas);
            tracing::info!(%replica, "serving nodes under claims in etcd");
            let mut config = ClaimsConfig::new(settings.etcd.endpoints.clone(), replica);
            config.prefix = settings.etcd.prefix.clone();
            config.ttl = ttl;
            config.advertise = replica_url(settings).unwrap_or_default();
            let claims = EtcdClaims::start(config).context("etcd claims")?;
            Ok(Some(Claims::Etcd(claims)))
        }
        Desired::Kubernetes(store) if replicas.enable => {
            let replica = replica_name(replicas);
            tracing::info!(%replica, "serving nodes under Lease claims");
            let mut config = LeaseClaimsConfig::new(replica);
            config.namespace = settings.kube_api_config.namespace.clone();
            config.ttl = ttl;
            config.advertise = replica_url(settings).unwrap_or_default();
            // The Lease keeper: its own thread and connection.
            if let Some(access) = Desired::kube_access(settings) {
                config.keeper_client = Some(access.config().await.context("the Lease keeper")?);
            }
            let claims = LeaseClaims::start(store.client().clone(), config)
                .await
                .context("Lease claims")?;
            Ok(Some(Claims::Leases(claims)))
        }
        Desired::Kubernetes(_) => Ok(None),
        Desired::Embedded(_) if replicas.enable => anyhow::bail!(
            "replicas.enable: replicas share their desired state in etcd (etcd.endpoints) or a Kubernetes API server (kubeAPIConfig)"
        ),
        Desired::Embedded(_) => Ok(None),
    }
}

/// The desired state cloudcore runs on.
enum Desired {
    Embedded(EmbeddedStore),
    Kubernetes(Arc<KubernetesStore>),
    Etcd(Arc<EtcdStore>),
}

impl Desired {
    /// Whether this cloudcore is one of several replicas (each node sent
    /// to by the one that serves it).
    fn replicated(&self, settings: &CloudCoreConfig) -> bool {
        match self {
            Desired::Etcd(_) => true,
            Desired::Kubernetes(_) => settings.replicas.enable,
            Desired::Embedded(_) => false,
        }
    }

    /// How the Kubernetes API server is reached, if one is configured.
    fn kube_access(settings: &CloudCoreConfig) -> Option<KubeAccess> {
        let kube = &settings.kube_api_config;
        if !kube.kube_config.is_empty() {
            Some(KubeAccess::Kubeconfig(PathBuf::from(&kube.kube_config)))
        } else if kube.in_cluster && KubeAccess::in_cluster_available() {
            Some(KubeAccess::InCluster)
        } else {
            None
        }
    }

    /// A Kubernetes API server if one is configured (a kubeconfig, or the
    /// pod's service account), else the embedded store in the data dir.
    async fn open(settings: &CloudCoreConfig) -> Result<Desired> {
        let kube = &settings.kube_api_config;
        let access = Desired::kube_access(settings);
        if !settings.etcd.endpoints.is_empty() {
            let endpoints = settings.etcd.endpoints.clone();
            tracing::info!(?endpoints, "desired state: etcd");
            let mut config = EtcdConfig::new(endpoints);
            config.prefix = settings.etcd.prefix.clone();
            let store = EtcdStore::connect(config).await.context("etcd")?;
            return Ok(Desired::Etcd(Arc::new(store)));
        }
        match access {
            Some(access) => {
                tracing::info!(?access, "desired state: a Kubernetes API server");
                let mut config = KubernetesConfig::new(access);
                config.namespace = kube.namespace.clone();
                let store = KubernetesStore::connect(config)
                    .await
                    .context("the Kubernetes API server")?;
                Ok(Desired::Kubernetes(Arc::new(store)))
            }
            None => {
                let path = settings.data_dir.join("desired.redb");
                tracing::info!(path = %path.display(), "desired state: the embedded store");
                let store = EmbeddedStore::open(&path).context("desired-state store")?;
                Ok(Desired::Embedded(store))
            }
        }
    }

    /// The API server a KubeEdge edge's MetaServer is answered from, if
    /// there is one.
    fn api_server(&self) -> Option<Arc<dyn ApiServer>> {
        match self {
            Desired::Embedded(_) | Desired::Etcd(_) => None,
            Desired::Kubernetes(store) => {
                Some(Arc::new(KubernetesApi::new(store.client().clone())))
            }
        }
    }

    fn shared(&self) -> Arc<dyn DesiredState> {
        match self {
            Desired::Embedded(store) => store.clone().shared(),
            Desired::Kubernetes(store) => store.clone(),
            Desired::Etcd(store) => store.clone(),
        }
    }

    async fn close(self) {
        if let Desired::Embedded(store) = self {
            store.close().await;
        }
    }
}
