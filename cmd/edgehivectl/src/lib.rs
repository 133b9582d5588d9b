//! edgehivectl: kubectl for an edgehive cloud, over its admin API.
//!
//! ```text
//! edgehivectl apply -f pod.yaml          # also -f dir/, -f - (stdin), repeatable
//! edgehivectl delete -f pod.yaml
//! edgehivectl delete pod web -n default
//! edgehivectl get pods [-A | -n NS] [NAME] [-o wide|yaml|json]
//! edgehivectl get nodes
//! edgehivectl describe pod web
//! edgehivectl logs [-f] [--tail N] POD [-c CONTAINER]
//! edgehivectl exec -it POD [-c CONTAINER] -- sh
//! edgehivectl attach -it POD
//! edgehivectl port-forward POD 8080:80
//! ```
//!
//! It finds the admin API, its CA and the caller's credentials in a
//! kubeconfig: `--kubeconfig` (or `$EDGEHIVE_KUBECONFIG`), else
//! cloudcore's `<dataDir>/admin.kubeconfig`. Without one it talks plain
//! HTTP to `--server`, and only when that is given; with neither, it says
//! which file it looked for.
//! `--server` names another server: `https://` with the kubeconfig's
//! credentials, `host:port` or `http://` in plain HTTP, with none of them.

mod cli;
mod commands;
mod manifests;
mod print;
mod terminal;
mod top;

use anyhow::Context as _;
use clap::Parser as _;

use crate::cli::Args;
use crate::commands::run;

/// edgehivectl's command line: parses the arguments, runs the command
/// and exits non-zero with the error when it fails (the binary's `main`).
pub fn main() {
    let args = Args::parse();
    let result = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("runtime")
        .and_then(|runtime| runtime.block_on(run(args)));
    if let Err(err) = result {
        eprintln!("{err:#}");
        std::process::exit(1);
    }
}
