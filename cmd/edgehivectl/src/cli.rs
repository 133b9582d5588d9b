//! edgehivectl's command line: its commands, their flags, and the output
//! formats.

use std::path::PathBuf;

use clap::{Parser, Subcommand, ValueEnum};

/// kubectl for an edgehive cloud.
#[derive(Parser, Debug)]
#[command(version, about)]
pub(crate) struct Args {
    /// The admin API of cloudcore (or an edge's MetaServer): host:port or
    /// http://host:port for plain HTTP, https://host:port for TLS with the
    /// kubeconfig's CA and credentials; overrides the kubeconfig's server.
    #[arg(long, global = true, env = "EDGEHIVE_ADMIN")]
    pub(crate) server: Option<String>,
    /// A kubeconfig naming the admin API, its CA and your credentials
    /// (default: cloudcore's <dataDir>/admin.kubeconfig; without it, only
    /// --server reaches an admin API, in plain HTTP).
    #[arg(long, global = true, env = "EDGEHIVE_KUBECONFIG")]
    pub(crate) kubeconfig: Option<PathBuf>,
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Subcommand, Debug)]
pub(crate) enum Command {
    /// Creates or updates the objects in manifests (YAML or JSON).
    Apply {
        /// A manifest file, a directory of them, or - for stdin (repeatable).
        #[arg(short = 'f', long = "filename", required = true)]
        files: Vec<PathBuf>,
    },
    /// Deletes the objects in manifests, or one object by kind and name.
    Delete {
        /// A manifest file, a directory of them, or - for stdin (repeatable).
        #[arg(short = 'f', long = "filename")]
        files: Vec<PathBuf>,
        /// Kind (pod, configmap, secret, service, endpoints, node).
        kind: Option<String>,
        /// Name.
        name: Option<String>,
        /// Namespace.
        #[arg(short, long, default_value = "default")]
        namespace: String,
        /// An object that is not there is no error.
        #[arg(long)]
        ignore_not_found: bool,
    },
    /// Lists objects of a kind, or shows one.
    Get {
        /// Kind (pods, nodes, configmaps, secrets, services, endpoints; short names work).
        kind: String,
        /// Name (all when left out).
        name: Option<String>,
        /// Namespace.
        #[arg(short, long, default_value = "default")]
        namespace: String,
        /// Every namespace.
        #[arg(short = 'A', long)]
        all_namespaces: bool,
        /// Only objects whose labels this selects (`app=web,tier!=cache`).
        #[arg(short = 'l', long)]
        selector: Option<String>,
        /// Output format.
        #[arg(short, long, value_enum)]
        output: Option<Output>,
    },
    /// Prints a container's log (from its edge node, through the cloud).
    Logs {
        /// The pod.
        pod: String,
        /// The container (the pod's only one when left out).
        #[arg(short, long)]
        container: Option<String>,
        /// Namespace.
        #[arg(short, long, default_value = "default")]
        namespace: String,
        /// Keeps printing what the container writes.
        #[arg(short, long)]
        follow: bool,
        /// Only the last lines.
        #[arg(long)]
        tail: Option<i64>,
        /// Only what was written in the last seconds.
        #[arg(long)]
        since_seconds: Option<i64>,
        /// Each line with its timestamp.
        #[arg(long)]
        timestamps: bool,
        /// The container's previous run.
        #[arg(short, long)]
        previous: bool,
        /// At most this many bytes.
        #[arg(long)]
        limit_bytes: Option<i64>,
    },
    /// Runs a command in a container of an edge pod (through the cloud).
    Exec {
        /// The pod.
        pod: String,
        /// The container (the pod's only one when left out).
        #[arg(short, long)]
        container: Option<String>,
        /// Namespace.
        #[arg(short, long, default_value = "default")]
        namespace: String,
        /// Passes standard input to the command.
        #[arg(short = 'i', long)]
        stdin: bool,
        /// A terminal for the command (raw mode when standard input is one).
        #[arg(short = 't', long)]
        tty: bool,
        /// The command and its arguments, after `--`.
        #[arg(last = true, required = true)]
        command: Vec<String>,
    },
    /// Forwards local ports to ports of an edge pod (through the cloud),
    /// until interrupted.
    PortForward {
        /// The pod.
        pod: String,
        /// LOCAL:REMOTE, or PORT for the same on both sides (repeatable).
        #[arg(required = true)]
        ports: Vec<String>,
        /// Namespace.
        #[arg(short, long, default_value = "default")]
        namespace: String,
        /// The local address to listen on.
        #[arg(long, default_value = "127.0.0.1")]
        address: String,
    },
    /// Attaches to the main process of a container of an edge pod.
    Attach {
        /// The pod.
        pod: String,
        /// The container (the pod's only one when left out).
        #[arg(short, long)]
        container: Option<String>,
        /// Namespace.
        #[arg(short, long, default_value = "default")]
        namespace: String,
        /// Passes standard input to the process.
        #[arg(short = 'i', long)]
        stdin: bool,
        /// The process has a terminal (raw mode when standard input is one).
        #[arg(short = 't', long)]
        tty: bool,
    },
    /// Shows the CPU and memory the nodes or pods use now (the resource
    /// metrics API), as `kubectl top`.
    Top {
        #[command(subcommand)]
        what: Top,
    },
    /// Shows one object in detail.
    Describe {
        /// Kind.
        kind: String,
        /// Name.
        name: String,
        /// Namespace.
        #[arg(short, long, default_value = "default")]
        namespace: String,
    },
}

#[derive(Subcommand, Debug)]
pub(crate) enum Top {
    /// The nodes linked to the cloud.
    #[command(alias = "node", alias = "no")]
    Nodes {
        /// One node.
        name: Option<String>,
        /// Only nodes whose labels this selects.
        #[arg(short = 'l', long)]
        selector: Option<String>,
    },
    /// Pods.
    #[command(alias = "pod", alias = "po")]
    Pods {
        /// One pod.
        name: Option<String>,
        /// Namespace.
        #[arg(short, long, default_value = "default")]
        namespace: String,
        /// Pods of every namespace.
        #[arg(short = 'A', long)]
        all_namespaces: bool,
        /// Each container on a line of its own.
        #[arg(long)]
        containers: bool,
        /// Only pods whose labels this selects.
        #[arg(short = 'l', long)]
        selector: Option<String>,
    },
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub(crate) enum Output {
    /// The table with more columns.
    Wide,
    /// YAML.
    Yaml,
    /// JSON.
    Json,
}
