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

mod admin;
mod cli;
pub mod config;
mod desired;
mod kubernetes;
mod metrics;
mod replicas;
mod serve;
mod tokens;

use std::sync::Arc;

use anyhow::Context as _;
use anyhow::Result;
use clap::Parser as _;
use cmd_common::config::{settle, to_yaml};
use hub::certs::CloudCa;

use crate::admin::{admin_kubeconfig, admin_server_url};
use crate::cli::{Args, Command};
use crate::config::CloudCoreConfig;
use crate::serve::serve;
use crate::tokens::tokens;

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
