//! edgecore: the edge side of edgehive.
//!
//! `edgecore join` gets this node's certificate with a token from
//! `cloudcore token`; `edgecore run` then keeps the node linked to the cloud
//! (metamanager on redb, edgehub, edged running pods on containerd through
//! CRI, MetaServer for local applications) until SIGINT or SIGTERM, needing
//! no token.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use beehive::{Hive, HiveConfig};
use clap::{Parser, Subcommand};
use hub::certs::{NodeCredentials, join, keep_renewed};
use hub::{EdgeHub, EdgeHubConfig};
use meta::{EdgeStore, MetaManager, MetaServer};
use transports::{DialOptions, TransportKind, tls};

/// The edge side of edgehive.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    /// Where the node's certificate and its object store live.
    #[arg(
        long,
        env = "EDGEHIVE_EDGE_DIR",
        default_value = "/var/lib/edgehive/edge"
    )]
    data_dir: PathBuf,
    /// Log filter (RUST_LOG syntax); RUST_LOG wins when set.
    #[arg(long, default_value = "info")]
    log: String,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Joins the cloud: gets and stores this node's certificate.
    Join {
        /// The cloud's certificate endpoints, host:port.
        #[arg(long)]
        certs: String,
        /// The cloud's name in its certificate.
        #[arg(long, default_value = "localhost")]
        server_name: String,
        /// A token from `cloudcore token`.
        #[arg(long, env = "EDGEHIVE_TOKEN")]
        token: String,
        /// This node's name.
        #[arg(long)]
        node: String,
    },
    /// Runs the edge.
    Run {
        /// The cloud's hub address (host:port, or a socket path for uds).
        #[arg(long)]
        cloud: String,
        /// ws, quic or uds.
        #[arg(long, default_value = "ws")]
        transport: TransportKind,
        /// The cloud's name in its certificate.
        #[arg(long, default_value = "localhost")]
        server_name: String,
        /// This node's name, over uds (other transports take it from the certificate).
        #[arg(long)]
        node: Option<String>,
        /// Keepalive interval in seconds; a silent link is closed after two.
        #[arg(long, default_value_t = 15)]
        keepalive_secs: u64,
        /// The cloud's certificate endpoints (host:port): renew this node's
        /// certificate there once two thirds of its lifetime have passed.
        #[arg(long)]
        certs: Option<String>,
        /// MetaServer listen address (the edge's objects for local
        /// applications, secrets included: keep it on loopback); "off"
        /// turns it off.
        #[arg(long, default_value = meta::metaserver::DEFAULT_ADDRESS)]
        metaserver: String,
        /// The CRI runtime's socket (containerd); "off" runs no pods.
        #[arg(
            long,
            env = "EDGEHIVE_CRI_SOCKET",
            default_value = "/run/edgehive/containerd/containerd.sock"
        )]
        cri_socket: String,
        /// The pod sandbox image.
        #[arg(long, default_value = "127.0.0.1:5000/edgehive/pause:latest")]
        pause_image: String,
        /// This node's IP, reported as its InternalIP.
        #[arg(long, default_value = "")]
        node_ip: String,
        /// edged's HTTP server (/healthz, /pods, /containerLogs/...); "off"
        /// runs none. Keep it on loopback: it shows every pod's logs.
        #[arg(long, default_value = edged::server::DEFAULT_ADDRESS)]
        edged_server: String,
        /// An external MQTT broker (host:port) for the eventbus, instead of
        /// the embedded one.
        #[arg(long)]
        mqtt: Option<String>,
        /// Where the embedded MQTT broker listens, for mappers and edge
        /// applications on KubeEdge's topics; "off" runs neither it nor the
        /// eventbus (unless --mqtt names a broker).
        #[arg(long, default_value = twin::broker::DEFAULT_ADDRESS)]
        mqtt_broker: String,
    },
}

fn main() -> Result<()> {
    let args = Args::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(&args.log));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stdout()))
        .init();
    let pki = args.data_dir.join("pki");
    match args.command {
        Command::Join {
            certs,
            server_name,
            token,
            node,
        } => actix::System::new().block_on(async move {
            let credentials = join(&certs, &server_name, &token, &node)
                .await
                .context("join")?;
            credentials.save(&pki)?;
            println!("joined as {node}; credentials in {}", pki.display());
            Ok(())
        }),
        Command::Run {
            cloud,
            transport,
            server_name,
            node,
            keepalive_secs,
            certs,
            metaserver,
            cri_socket,
            pause_image,
            node_ip,
            edged_server,
            mqtt,
            mqtt_broker,
        } => {
            let mut dial = DialOptions::new(&cloud, &server_name);
            let mut renewal = None;
            let node = if transport == TransportKind::UnixSocket {
                node.context("--node is needed over uds")?
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
                if let Some(certs) = certs {
                    let pki = pki.clone();
                    renewal = Some(keep_renewed(
                        certs,
                        server_name.clone(),
                        pki,
                        credentials,
                        identity,
                    ));
                }
                node
            };
            let config = EdgeHubConfig {
                keepalive: Duration::from_secs(keepalive_secs),
                ..EdgeHubConfig::new(node, transport, dial)
            };
            actix::System::new().block_on(async move {
                if let Some(renewal) = renewal {
                    actix::spawn(renewal);
                }
                let pods = (cri_socket != "off").then(|| {
                    let mut edged = edged::EdgedConfig::new(
                        config.node.clone(),
                        &cri_socket,
                        args.data_dir.join("edged"),
                    );
                    edged.pause_image = pause_image;
                    edged.node_ip = node_ip;
                    edged.server_address = (edged_server != "off").then_some(edged_server);
                    edged
                });
                let mqtt = match (mqtt, mqtt_broker.as_str()) {
                    (Some(address), _) => {
                        let (host, port) = address
                            .rsplit_once(':')
                            .and_then(|(h, p)| Some((h.to_owned(), p.parse::<u16>().ok()?)))
                            .context("--mqtt wants host:port")?;
                        Some(Mqtt::External(twin::BrokerAddress { host, port }))
                    }
                    (None, "off") => None,
                    (None, listen) => Some(Mqtt::Embedded(listen.to_owned())),
                };
                run(args.data_dir, config, metaserver, pods, mqtt).await
            })
        }
    }
}

/// The eventbus's broker.
enum Mqtt {
    /// The embedded broker, listening here.
    Embedded(String),
    /// A broker elsewhere.
    External(twin::BrokerAddress),
}

async fn run(
    data_dir: PathBuf,
    config: EdgeHubConfig,
    metaserver: String,
    pods: Option<edged::EdgedConfig>,
    mqtt: Option<Mqtt>,
) -> Result<()> {
    std::fs::create_dir_all(&data_dir).with_context(|| data_dir.display().to_string())?;
    let hive = Hive::new("edge", HiveConfig::default());
    let store = EdgeStore::open(&data_dir.join("edge.redb")).context("edge store")?;
    MetaManager::start(&hive, store.clone())?;
    if let Some(pods) = pods {
        let socket = pods.cri_socket.display().to_string();
        let edged = edged::Edged::start(&hive, pods).await.with_context(|| {
            format!("edged (is containerd up at {socket}? see scripts/setup-containerd)")
        })?;
        tracing::info!(%socket, server = ?edged.server_address, "edged ready");
    }
    twin::DeviceTwin::start(&hive, twin::DeviceTwinConfig::new(config.node.clone()))
        .context("devicetwin")?;
    // Kept alive for the process's life.
    let mut _embedded = None;
    if let Some(mqtt) = mqtt {
        let bus = |broker| twin::EventBusConfig::new(config.node.clone(), broker);
        let broker = match mqtt {
            Mqtt::External(address) => address,
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
    let metaserver = match metaserver.as_str() {
        "off" => None,
        address => {
            let server = MetaServer::start(store.clone(), address).context("metaserver")?;
            tracing::info!(address = %server.address, "metaserver ready");
            Some(server)
        }
    };
    let node = config.node.clone();
    EdgeHub::start(&hive, config)?;
    tracing::info!(%node, "edgecore running");
    let report = hive.shutdown_on_signal().await?;
    if let Some(server) = metaserver {
        server.stop().await;
    }
    store.close().await;
    tracing::info!(?report, "edgecore stopped");
    Ok(())
}
