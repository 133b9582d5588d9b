//! cloudcore: the cloud side of edgehive.
//!
//! `cloudcore token` prints a join token (creating the CA on first use);
//! `cloudcore run` serves the certificate endpoints, cloudhub on every
//! transport asked for, the edgecontroller on its desired-state store and
//! the admin API (for `edgehivectl`), until SIGINT or SIGTERM.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use beehive::{Hive, HiveConfig};
use clap::{Parser, Subcommand};
use hub::certs::{CertServer, CertServerConfig, CloudCa};
use hub::{CloudEndpoint, CloudHub, CloudHubConfig};
use meta::controller::{AdminApi, ControllerConfig, EdgeController, RedbDesiredStore};
use transports::{ListenOptions, TransportKind, tls};

/// The cloud side of edgehive.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    /// Where the CA, keys and queues live.
    #[arg(
        long,
        env = "EDGEHIVE_CLOUD_DIR",
        default_value = "/var/lib/edgehive/cloud"
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
    /// Prints a join token for `edgecore join`.
    Token {
        /// How long the token is valid, in seconds.
        #[arg(long, default_value_t = 24 * 3600)]
        ttl_secs: u64,
    },
    /// Runs the cloud.
    Run(Run),
}

#[derive(clap::Args, Debug)]
struct Run {
    /// WebSocket (wss) listen address.
    #[arg(long)]
    ws: Option<String>,
    /// QUIC listen address.
    #[arg(long)]
    quic: Option<String>,
    /// Unix domain socket path (local edges; trusted by file permissions).
    #[arg(long)]
    uds: Option<PathBuf>,
    /// Certificate endpoints (/ca.crt, /edge.crt) listen address.
    #[arg(long, default_value = "0.0.0.0:10002")]
    certs: String,
    /// Names of this cloud in its server certificate (repeatable).
    #[arg(long = "name", default_values_t = ["localhost".to_owned(), "127.0.0.1".to_owned()])]
    names: Vec<String>,
    /// Keepalive interval in seconds; a silent link is closed after two.
    #[arg(long, default_value_t = 15)]
    keepalive_secs: u64,
    /// Lifetime of node certificates, in days.
    #[arg(long, default_value_t = 365)]
    cert_days: u64,
    /// Admin API listen address (manifests in, objects out; no
    /// authentication, so keep it on loopback).
    #[arg(long, default_value = meta::controller::admin::DEFAULT_ADDRESS)]
    admin: String,
}

fn logging(filter: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(filter));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stdout()))
        .init();
}

fn main() -> Result<()> {
    let args = Args::parse();
    logging(&args.log);
    let ca = CloudCa::load_or_create(&args.data_dir.join("ca")).context("the cloud CA")?;
    match args.command {
        Command::Token { ttl_secs } => {
            println!("{}", ca.issue_token(Duration::from_secs(ttl_secs)));
            Ok(())
        }
        Command::Run(run) => actix::System::new().block_on(serve(args.data_dir, Arc::new(ca), run)),
    }
}

async fn serve(data_dir: PathBuf, ca: Arc<CloudCa>, run: Run) -> Result<()> {
    let certs = CertServer::start(
        ca.clone(),
        CertServerConfig {
            address: run.certs.clone(),
            server_names: run.names.clone(),
            cert_ttl: Duration::from_secs(run.cert_days * 24 * 3600),
        },
    )
    .await
    .context("certificate endpoints")?;
    let (chain, key) = ca.issue_server(&run.names, Duration::from_secs(365 * 24 * 3600))?;
    let server_tls = tls::server_config(chain, key, Some(&[ca.root()]))?;
    let mut endpoints = Vec::new();
    for (kind, address) in [
        (TransportKind::WebSocket, &run.ws),
        (TransportKind::Quic, &run.quic),
    ] {
        if let Some(address) = address {
            endpoints.push(CloudEndpoint {
                kind,
                options: ListenOptions::new(address).with_tls(server_tls.clone()),
                trust_hello: false,
            });
        }
    }
    if let Some(path) = &run.uds {
        endpoints.push(CloudEndpoint {
            kind: TransportKind::UnixSocket,
            options: ListenOptions::new(path.to_string_lossy()),
            trust_hello: true,
        });
    }
    anyhow::ensure!(
        !endpoints.is_empty(),
        "give at least one of --ws, --quic, --uds"
    );
    let hive = Hive::new("cloud", HiveConfig::default());
    // The controller first: it must hear cloudhub's first node events.
    let desired =
        RedbDesiredStore::open(&data_dir.join("desired.redb")).context("desired-state store")?;
    let controller =
        EdgeController::start(&hive, desired.clone().shared(), ControllerConfig::default())?;
    let admin = AdminApi::start(controller, &run.admin).context("admin API")?;
    let hub = CloudHub::start(
        &hive,
        CloudHubConfig {
            endpoints,
            keepalive: Duration::from_secs(run.keepalive_secs),
            store: Some(data_dir.join("queues.redb")),
            ..CloudHubConfig::default()
        },
    )
    .await
    .context("cloudhub")?;
    for (kind, address) in &hub.addresses {
        tracing::info!(%kind, %address, "cloudhub ready");
    }
    tracing::info!(address = %certs.address, "certificate endpoints ready");
    tracing::info!(address = %admin.address, "admin API ready");
    let report = hive.shutdown_on_signal().await?;
    admin.stop().await;
    certs.stop().await;
    desired.close().await;
    tracing::info!(?report, "cloudcore stopped");
    Ok(())
}
