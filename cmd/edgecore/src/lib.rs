//! edgecore: the edge side of edgehive.
//!
//! `edgecore join` gets this node's certificate with a token from
//! `cloudcore token`; `edgecore run` then keeps the node linked to the cloud
//! (metamanager on redb, edgehub, edged running pods on containerd through
//! CRI, MetaServer for local applications, devicetwin and the eventbus with
//! its MQTT broker, Prometheus metrics) until SIGINT or SIGTERM, needing no
//! token.
//!
//! Settings come from a YAML file (`--config`, by default
//! /etc/edgehive/edgecore.yaml if it exists; `edgecore --defaultconfig`
//! prints every key with its default); command-line flags override it.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use beehive::{Hive, HiveConfig};
use clap::{Parser, Subcommand};
use cmd_common::config::{Check, settle, to_yaml};
use config::{EdgeCoreConfig, MqttMode};
use hub::certs::{NodeCredentials, join, keep_renewed};
use hub::{EdgeHub, EdgeHubConfig};
use meta::{EdgeStore, MetaManager, MetaServer};
use metrics::EdgeMetrics as _;
use transports::{DialOptions, TransportKind, tls};

pub mod config;
mod metrics;

/// The edge side of edgehive.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    /// The configuration file (YAML); /etc/edgehive/edgecore.yaml is read if
    /// it exists.
    #[arg(long, env = "EDGEHIVE_EDGE_CONFIG")]
    config: Option<PathBuf>,
    /// Prints the default configuration and exits.
    #[arg(long)]
    defaultconfig: bool,
    /// Where the node's certificate and its object store live (dataDir).
    #[arg(long, env = "EDGEHIVE_EDGE_DIR")]
    data_dir: Option<PathBuf>,
    /// Log filter, RUST_LOG syntax (log); RUST_LOG wins when set.
    #[arg(long)]
    log: Option<String>,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Joins the cloud: gets and stores this node's certificate.
    Join {
        /// The cloud's certificate endpoints, host:port.
        #[arg(long)]
        certs: String,
        /// The cloud's name in its certificate (default:
        /// modules.edgeHub.serverName).
        #[arg(long)]
        server_name: Option<String>,
        /// A token from `cloudcore token`.
        #[arg(long, env = "EDGEHIVE_TOKEN")]
        token: String,
        /// This node's name.
        #[arg(long)]
        node: String,
    },
    /// Runs the edge.
    Run(Box<Run>),
}

/// Flags of `run`; each overrides its key in the configuration file.
#[derive(clap::Args, Debug)]
struct Run {
    /// The cloud's hub address, host:port or a socket path for uds; for a
    /// cloud of several replicas, their addresses separated by commas,
    /// tried in turn (modules.edgeHub.server).
    #[arg(long)]
    cloud: Option<String>,
    /// ws, quic or uds (modules.edgeHub.transport).
    #[arg(long)]
    transport: Option<String>,
    /// native, or kubeedge to talk to the cloud as a KubeEdge edgecore
    /// does, over ws (modules.edgeHub.dialect).
    #[arg(long)]
    dialect: Option<hub::Dialect>,
    /// The cloud's name in its certificate (modules.edgeHub.serverName).
    #[arg(long)]
    server_name: Option<String>,
    /// This node's name, over uds; other transports take it from the
    /// certificate (modules.edgeHub.nodeName).
    #[arg(long)]
    node: Option<String>,
    /// Keepalive interval in seconds; a silent link is closed after two
    /// (modules.edgeHub.keepaliveInterval).
    #[arg(long)]
    keepalive_secs: Option<u64>,
    /// The cloud's certificate endpoints (host:port): renew this node's
    /// certificate there once two thirds of its lifetime have passed
    /// (modules.edgeHub.httpServer).
    #[arg(long)]
    certs: Option<String>,
    /// MetaServer listen address: the edge's objects for local
    /// applications, secrets included, so on loopback unless
    /// --metaserver-require-authorization; "off" for none
    /// (modules.metaManager.metaServer).
    #[arg(long)]
    metaserver: Option<String>,
    /// MetaServer takes service account tokens and serves what their
    /// accounts may read, as the cloud decides (beyond loopback: TLS with
    /// the node's certificate) (modules.metaManager.metaServer.requireAuthorization).
    #[arg(long)]
    metaserver_require_authorization: bool,
    /// The CRI runtime's socket (containerd); "off" runs no pods
    /// (modules.edged.criSocket, modules.edged.enable).
    #[arg(long)]
    cri_socket: Option<String>,
    /// The pod sandbox image (modules.edged.podSandboxImage).
    #[arg(long)]
    pause_image: Option<String>,
    /// This node's IP, reported as its InternalIP (modules.edged.nodeIP).
    #[arg(long)]
    node_ip: Option<String>,
    /// edged's HTTP server (/healthz, /pods, /containerLogs/...); it shows
    /// every pod's logs, so keep it on loopback; "off" for none
    /// (modules.edged.server).
    #[arg(long)]
    edged_server: Option<String>,
    /// A container's log is rotated at this size, such as 10Mi
    /// (modules.edged.containerLogMaxSize).
    #[arg(long)]
    container_log_max_size: Option<String>,
    /// Log files kept per container (modules.edged.containerLogMaxFiles).
    #[arg(long)]
    container_log_max_files: Option<usize>,
    /// An external MQTT broker (host:port) for the eventbus, instead of the
    /// embedded one (modules.eventBus.mqttMode: external,
    /// mqttServerExternal).
    #[arg(long)]
    mqtt: Option<String>,
    /// Where the embedded MQTT broker listens, for mappers and edge
    /// applications on KubeEdge's topics; "off" runs neither it nor the
    /// eventbus, unless --mqtt names a broker
    /// (modules.eventBus.mqttServerInternal).
    #[arg(long)]
    mqtt_broker: Option<String>,
    /// Prometheus metrics listen address; "off" for none (modules.metrics).
    #[arg(long)]
    metrics: Option<String>,
    /// The Unix socket KubeEdge's DMI mappers use; "off" for none
    /// (modules.deviceTwin.dmiSockPath).
    #[arg(long)]
    dmi_socket: Option<String>,
}

impl Run {
    /// The configuration with these flags applied.
    fn apply(self, mut config: EdgeCoreConfig) -> Result<EdgeCoreConfig> {
        let modules = &mut config.modules;
        let hub = &mut modules.edge_hub;
        if let Some(cloud) = self.cloud {
            hub.server = cloud;
        }
        if let Some(transport) = self.transport {
            hub.transport = transport;
        }
        if let Some(name) = self.server_name {
            hub.server_name = name;
        }
        if let Some(dialect) = self.dialect {
            hub.dialect = dialect;
        }
        if self.node.is_some() {
            hub.node_name = self.node;
        }
        if let Some(secs) = self.keepalive_secs {
            hub.keepalive_interval = secs;
        }
        if self.certs.is_some() {
            hub.http_server = self.certs;
        }
        modules.meta_manager.meta_server.apply_flag(self.metaserver);
        if self.metaserver_require_authorization {
            modules.meta_manager.meta_server.require_authorization = true;
        }
        match self.cri_socket.as_deref() {
            None => {}
            Some("off") => modules.edged.enable = false,
            Some(socket) => {
                modules.edged.enable = true;
                modules.edged.cri_socket = socket.to_owned();
            }
        }
        if let Some(image) = self.pause_image {
            modules.edged.pod_sandbox_image = image;
        }
        if let Some(ip) = self.node_ip {
            modules.edged.node_ip = ip;
        }
        modules.edged.server.apply_flag(self.edged_server);
        if let Some(size) = self.container_log_max_size {
            modules.edged.container_log_max_size = size;
        }
        if let Some(files) = self.container_log_max_files {
            modules.edged.container_log_max_files = files;
        }
        match self.dmi_socket.as_deref() {
            None => {}
            Some("off") => modules.device_twin.dmi_sock_path.clear(),
            Some(path) => modules.device_twin.dmi_sock_path = path.to_owned(),
        }
        let bus = &mut modules.event_bus;
        match (self.mqtt, self.mqtt_broker.as_deref()) {
            (Some(external), _) => {
                bus.enable = true;
                bus.mqtt_mode = MqttMode::External;
                bus.mqtt_server_external = external;
            }
            (None, Some("off")) => bus.enable = false,
            (None, Some(listen)) => {
                bus.enable = true;
                bus.mqtt_mode = MqttMode::Internal;
                bus.mqtt_server_internal = listen.to_owned();
            }
            (None, None) => {}
        }
        modules.metrics.apply_flag(self.metrics);
        Check::check(&config).map_err(|reason| anyhow::anyhow!("{reason}"))?;
        Ok(config)
    }
}

/// Where the configuration file is read from by default.
const DEFAULT_CONFIG: &str = "/etc/edgehive/edgecore.yaml";

/// edgecore's command line: parses the arguments and runs the command
/// they name (the binary's `main`).
pub fn main() -> Result<()> {
    let args = Args::parse();
    if args.defaultconfig {
        print!("{}", to_yaml(&EdgeCoreConfig::default()));
        return Ok(());
    }
    let settings: EdgeCoreConfig = settle(
        args.config.as_deref(),
        std::path::Path::new(DEFAULT_CONFIG),
        args.data_dir,
        args.log,
    )?;
    let pki = settings.certificate_dir();
    let Some(command) = args.command else {
        bail!("give a command: join, run (see --help)");
    };
    match command {
        Command::Join {
            certs,
            server_name,
            token,
            node,
        } => actix::System::new().block_on(async move {
            let server_name =
                server_name.unwrap_or_else(|| settings.modules.edge_hub.server_name.clone());
            // Before the token is presented: one that does not read is named
            // so, and a directory that cannot hold what the cloud signs
            // stops the join (a single-use token is used up once it signs).
            hub::certs::check_token(&token).context("join")?;
            NodeCredentials::check_writable(&pki).with_context(|| {
                format!(
                    "{} cannot hold the node's credentials: nothing was sent to the cloud, \
                     the token is unused",
                    pki.display()
                )
            })?;
            let credentials = join(&certs, &server_name, &token, &node)
                .await
                .context("join")?;
            credentials.save(&pki).with_context(|| {
                format!(
                    "the cloud issued {node}'s certificate (a single-use token is used up), \
                     but {} could not store it: join again with a new token",
                    pki.display()
                )
            })?;
            println!("joined as {node}; credentials in {}", pki.display());
            Ok(())
        }),
        Command::Run(flags) => {
            let settings = flags.apply(settings)?;
            let hub = &settings.modules.edge_hub;
            let transport: TransportKind = hub
                .transport
                .parse()
                .map_err(|err| anyhow::anyhow!("modules.edgeHub.transport: {err}"))?;
            // Several addresses (the cloud's replicas), comma-separated:
            // the first is dialed first, the others in turn after it.
            let mut servers = hub
                .server
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_owned);
            let first = servers.next().context("modules.edgeHub.server is empty")?;
            let alternates: Vec<String> = servers.collect();
            let mut dial = DialOptions::new(&first, &hub.server_name);
            let mut renewal = None;
            let node = if transport == TransportKind::UnixSocket {
                hub.node_name
                    .clone()
                    .context("modules.edgeHub.nodeName (--node) is needed over uds")?
            } else {
                let Some(credentials) = NodeCredentials::load(&pki)? else {
                    bail!(
                        "no credentials in {}: run `edgecore join` first",
                        pki.display()
                    );
                };
                // The identity is swapped in place when the certificate is
                // renewed; the next link presents the new one.
                let identity = credentials.reloadable()?;
                let roots = [credentials.ca.clone()];
                dial = dial.with_tls(tls::client_config_reloadable(&roots, identity.clone())?);
                let node = credentials.node.clone();
                if let Some(certs) = hub.http_server.clone() {
                    let pki = pki.clone();
                    renewal = Some(keep_renewed(
                        certs,
                        hub.server_name.clone(),
                        pki,
                        credentials,
                        identity,
                    ));
                }
                node
            };
            let config = EdgeHubConfig {
                keepalive: Duration::from_secs(hub.keepalive_interval),
                dialect: hub.dialect,
                alternates,
                ..EdgeHubConfig::new(node, transport, dial)
            };
            actix::System::new().block_on(async move {
                if let Some(renewal) = renewal {
                    actix::spawn(renewal);
                }
                run(settings, config).await
            })
        }
    }
}

/// The eventbus's broker.
enum Mqtt {
    /// The embedded broker, listening here.
    Embedded(String),
    /// A broker elsewhere, host:port.
    External(String),
}

/// MetaServer's TLS beyond loopback: the certificate the settings name,
/// else a self-signed one kept in the certificate directory (a node's own
/// certificate authenticates it as a client only).
/// A pod status's phase, all the metrics page reads of it.
#[derive(serde::Deserialize)]
struct Phase {
    #[serde(default)]
    phase: Option<String>,
}

fn metaserver_tls(
    settings: &EdgeCoreConfig,
    node: &str,
    address: &str,
) -> Result<Arc<meta::metaserver::TlsConfig>> {
    let section = &settings.modules.meta_manager.meta_server;
    let (chain, key) = if section.tls_cert_file.as_os_str().is_empty() {
        let mut names = vec![node.to_owned(), "localhost".to_owned()];
        if let Some((host, _)) = address.rsplit_once(':') {
            let host = host.trim_start_matches('[').trim_end_matches(']');
            let every = host
                .parse::<std::net::IpAddr>()
                .is_ok_and(|ip| ip.is_unspecified());
            if !every && !host.is_empty() {
                names.push(host.to_owned());
            }
        }
        hub::certs::metaserver_identity(&settings.certificate_dir(), &names)
            .context("MetaServer's serving certificate")?
    } else {
        let read = |path: &std::path::Path| {
            std::fs::read(path)
                .with_context(|| format!("modules.metaManager.metaServer: {}", path.display()))
        };
        let chain = tls::certs_from_pem(&read(&section.tls_cert_file)?)?;
        let key = tls::key_from_pem(&read(&section.tls_private_key_file)?)?;
        (chain, key)
    };
    Ok(tls::server_config(chain, key, None)?)
}

async fn run(settings: EdgeCoreConfig, mut config: EdgeHubConfig) -> Result<()> {
    let data_dir = settings.data_dir.clone();
    let modules = &settings.modules;
    std::fs::create_dir_all(&data_dir).with_context(|| data_dir.display().to_string())?;
    let hive = Hive::new("edge", HiveConfig::default());
    let store = EdgeStore::open(&data_dir.join("edge.redb")).context("edge store")?;
    MetaManager::start(&hive, store.clone())?;
    if modules.edged.enable {
        let mut pods = edged::EdgedConfig::new(
            config.node.clone(),
            &modules.edged.cri_socket,
            data_dir.join("edged"),
        );
        pods.pause_image = modules.edged.pod_sandbox_image.clone();
        pods.node_ip = modules.edged.node_ip.clone();
        pods.server_address = modules.edged.server.enabled().map(str::to_owned);
        pods.log_rotation = edged::logs::Rotation {
            max_size: edged::logs::parse_size(&modules.edged.container_log_max_size)
                .map_err(anyhow::Error::msg)
                .context("modules.edged.containerLogMaxSize")?,
            max_files: modules.edged.container_log_max_files.max(2),
            ..edged::logs::Rotation::default()
        };
        let socket = pods.cri_socket.display().to_string();
        let edged = edged::Edged::start(&hive, pods).await.with_context(|| {
            format!("edged (is containerd up at {socket}? see scripts/setup-containerd)")
        })?;
        tracing::info!(%socket, server = ?edged.server_address, "edged ready");
        // The cloud's logs, exec and attach of these pods come through the
        // link.
        config.streams = Some(edged.streams.clone());
    }
    let mut twin_counts = None;
    if modules.device_twin.enable {
        let twins = twin::DeviceTwinConfig {
            report_period: Duration::from_millis(modules.device_twin.report_period_ms),
            ..twin::DeviceTwinConfig::new(config.node.clone())
        };
        twin_counts = Some(
            twin::DeviceTwin::start(&hive, twins)
                .context("devicetwin")?
                .counts,
        );
    }
    // KubeEdge's DMI mappers register and report over gRPC; devices keep
    // running without it.
    let _dmi = match modules.device_twin.dmi_sock_path.as_str() {
        "" => None,
        _ if !modules.device_twin.enable => None,
        path => match twin::dmi::server::start(
            &hive,
            twin::dmi::DmiConfig {
                // Mappers register once, when they start: kept across
                // this edge's restarts.
                mappers_file: Some(data_dir.join("dmi-mappers.json")),
                ..twin::dmi::DmiConfig::new(path)
            },
        ) {
            Ok(server) => Some(server),
            Err(err) => {
                tracing::warn!(error = %err, "no DMI server: KubeEdge's DMI mappers cannot register");
                None
            }
        },
    };
    // Kept alive for the process's life.
    let mut _embedded = None;
    let mqtt = modules
        .event_bus
        .enable
        .then(|| match modules.event_bus.mqtt_mode {
            MqttMode::Internal => Mqtt::Embedded(modules.event_bus.mqtt_server_internal.clone()),
            MqttMode::External => Mqtt::External(modules.event_bus.mqtt_server_external.clone()),
        });
    if let Some(mqtt) = mqtt {
        let bus = |broker| twin::EventBusConfig::new(config.node.clone(), broker);
        let broker = match mqtt {
            Mqtt::External(address) => {
                let (host, port) = address
                    .rsplit_once(':')
                    .and_then(|(h, p)| Some((h.to_owned(), p.parse::<u16>().ok()?)))
                    .context("modules.eventBus.mqttServerExternal wants host:port")?;
                twin::BrokerAddress { host, port }
            }
            Mqtt::Embedded(listen) => {
                // Room above the eventbus's limit, so an oversized request
                // reaches it and is answered with an error result.
                let limit = twin::eventbus::DEFAULT_MAX_PAYLOAD * 4;
                let embedded = twin::EmbeddedBroker::start(&listen, limit)
                    .await
                    .with_context(|| format!("embedded MQTT broker on {listen}"))?;
                let address = twin::BrokerAddress {
                    host: embedded.address.ip().to_string(),
                    port: embedded.address.port(),
                };
                _embedded = Some(embedded);
                address
            }
        };
        let shown = format!("{}:{}", broker.host, broker.port);
        twin::EventBus::start(&hive, bus(broker)).context("eventbus")?;
        tracing::info!(broker = %shown, "eventbus ready");
    }
    let metaserver = match modules.meta_manager.meta_server.enabled() {
        None => None,
        Some(address) => {
            let section = &modules.meta_manager.meta_server;
            let authorization = match section.require_authorization {
                false => None,
                true => {
                    let tls = match meta::metaserver::is_loopback(address) {
                        true => None,
                        false => Some(metaserver_tls(&settings, &config.node, address)?),
                    };
                    Some(meta::Authorization {
                        reviewer: Arc::new(meta::access::HubReviewer::new(
                            hive.clone(),
                            Duration::from_secs(10),
                        )),
                        limits: meta::access::DecisionLimits::default(),
                        tls,
                    })
                }
            };
            let tls = authorization.as_ref().is_some_and(|a| a.tls.is_some());
            let server =
                MetaServer::serve(store.clone(), address, authorization).context("metaserver")?;
            tracing::info!(
                address = %server.address,
                require_authorization = section.require_authorization,
                tls,
                "metaserver ready"
            );
            Some(server)
        }
    };
    let node = config.node.clone();
    let hub = EdgeHub::start(&hive, config)?;
    let metrics = match modules.metrics.enabled() {
        Some(address) => {
            let (hive, store) = (hive.clone(), store.clone());
            let render: cmd_common::metrics::Render = Arc::new(move || {
                let mut page = cmd_common::metrics::Exposition::default();
                page.hive(&hive);
                page.edgehub(&hub.stats, *hub.online.borrow());
                // The statuses of the pods held (a deleted pod's last status
                // stays in the store).
                let held: std::collections::HashSet<String> = store
                    .list_type(None, beehive::constants::resource_type::POD)
                    .unwrap_or_default()
                    .into_iter()
                    .map(|(key, _)| key)
                    .collect();
                let statuses = store
                    .list_type(None, beehive::constants::resource_type::POD_STATUS)
                    .unwrap_or_default();
                let phases: Vec<String> = statuses
                    .iter()
                    .filter(|(key, _)| held.contains(&key.replacen("/podstatus/", "/pod/", 1)))
                    .map(|(_, record)| {
                        record
                            .object
                            .as_ref()
                            .and_then(|status| status.decode::<Phase>().ok())
                            .and_then(|status| status.phase)
                            .unwrap_or_else(|| "Unknown".to_owned())
                    })
                    .collect();
                page.pods_by_phase(phases.iter().map(String::as_str));
                if let Some(counts) = &twin_counts {
                    let counts = *counts.borrow();
                    page.gauge(
                        "edgehive_devices",
                        "Devices bound to this node.",
                        &[],
                        counts.devices as u64,
                    );
                    page.counter(
                        "edgehive_device_reports_total",
                        "Twin and state updates accepted from mappers.",
                        &[],
                        counts.accepted,
                    );
                    page.counter(
                        "edgehive_device_requests_refused_total",
                        "Device requests answered with an error.",
                        &[],
                        counts.refused,
                    );
                }
                page.finish()
            });
            let (bound, server) = cmd_common::metrics::serve(address, render).context("metrics")?;
            tracing::info!(address = %bound, "metrics ready");
            Some(server)
        }
        None => None,
    };
    tracing::info!(%node, "edgecore running");
    let report = hive.shutdown_on_signal().await?;
    if let Some(metrics) = metrics {
        metrics.stop(true).await;
    }
    if let Some(server) = metaserver {
        server.stop().await;
    }
    store.close().await;
    tracing::info!(?report, "edgecore stopped");
    Ok(())
}
