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
//! cloudcore's `<dataDir>/admin.kubeconfig` when it can read it. Without
//! one it talks plain HTTP to `--server` (default 127.0.0.1:10003).
//! `--server` names another server: `https://` with the kubeconfig's
//! credentials, `host:port` or `http://` in plain HTTP, with none of them.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use apis::kinds::Kind;
use clap::{Parser, Subcommand, ValueEnum};
use cloud::AdminClient;
use cloud::admin_client::kubeconfig::Kubeconfig;
use futures_util::StreamExt;
use serde_json::Value;

/// kubectl for an edgehive cloud.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    /// The admin API of cloudcore (or an edge's MetaServer): host:port or
    /// http://host:port for plain HTTP, https://host:port for TLS with the
    /// kubeconfig's CA and credentials; overrides the kubeconfig's server.
    #[arg(long, global = true, env = "EDGEHIVE_ADMIN")]
    server: Option<String>,
    /// A kubeconfig naming the admin API, its CA and your credentials
    /// (default: cloudcore's <dataDir>/admin.kubeconfig when readable).
    #[arg(long, global = true, env = "EDGEHIVE_KUBECONFIG")]
    kubeconfig: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
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
enum Top {
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

/// A CPU quantity (`250000000n`, `15u`, `15m`, `2`) in millicores.
fn millicores(quantity: &str) -> Option<f64> {
    let (number, per_milli) = [("n", 1e6), ("u", 1e3), ("m", 1.0)]
        .iter()
        .find_map(|(suffix, scale)| Some((quantity.strip_suffix(suffix)?, *scale)))
        .unwrap_or((quantity, 1e-3));
    number.parse::<f64>().ok().map(|n| n / per_milli)
}

/// A memory quantity (`2048Ki`, `5Mi`, `1234`) in bytes.
fn bytes(quantity: &str) -> Option<u64> {
    let units = [
        ("Ki", 1u64 << 10),
        ("Mi", 1 << 20),
        ("Gi", 1 << 30),
        ("Ti", 1 << 40),
    ];
    let (number, unit) = units
        .iter()
        .find_map(|(suffix, unit)| Some((quantity.strip_suffix(suffix)?, *unit)))
        .unwrap_or((quantity, 1));
    number.parse::<u64>().ok()?.checked_mul(unit)
}

/// `kubectl top`'s table: the usage of each row, CPU in millicores and
/// memory in MiB.
fn top_table(header: &[&str], rows: Vec<(Vec<String>, &Value)>) -> String {
    let mut lines = vec![
        header
            .iter()
            .map(|h| (*h).to_owned())
            .chain(["CPU(cores)".to_owned(), "MEMORY(bytes)".to_owned()])
            .collect::<Vec<_>>(),
    ];
    for (names, usage) in rows {
        // As kubectl shows them: millicores rounded up, whole MiB.
        let cpu = usage["cpu"]
            .as_str()
            .and_then(millicores)
            .unwrap_or(0.0)
            .ceil();
        let memory = usage["memory"].as_str().and_then(bytes).unwrap_or(0) >> 20;
        lines.push(
            names
                .into_iter()
                .chain([format!("{cpu}m"), format!("{memory}Mi")])
                .collect(),
        );
    }
    let widths: Vec<usize> = (0..lines[0].len())
        .map(|i| lines.iter().map(|l| l[i].len()).max().unwrap_or(0))
        .collect();
    lines
        .iter()
        .map(|line| {
            let cells: Vec<String> = line
                .iter()
                .zip(&widths)
                .map(|(cell, width)| format!("{cell:<width$}"))
                .collect();
            cells.join("   ").trim_end().to_owned() + "\n"
        })
        .collect()
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Output {
    /// The table with more columns.
    Wide,
    /// YAML.
    Yaml,
    /// JSON.
    Json,
}

/// The path of a pod's `exec` or `attach` with its standard streams.
fn interactive_path(
    namespace: &str,
    pod: &str,
    what: &str,
    container: Option<String>,
    stdin: bool,
    tty: bool,
    mut query: form_urlencoded::Serializer<'_, String>,
) -> String {
    if let Some(container) = &container {
        query.append_pair("container", container);
    }
    query.append_pair("stdout", "true");
    query.append_pair("stderr", if tty { "false" } else { "true" });
    if stdin {
        query.append_pair("stdin", "true");
    }
    if tty {
        query.append_pair("tty", "true");
    }
    format!(
        "/api/v1/namespaces/{namespace}/pods/{pod}/{what}?{}",
        query.finish()
    )
}

mod terminal;

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

/// The client the flags, and the kubeconfig they lead to, ask for.
fn client(args: &Args) -> Result<AdminClient> {
    let default = std::path::Path::new(cloud::admin_client::kubeconfig::DEFAULT_CLOUD_DATA_DIR)
        .join(cloud::admin_client::kubeconfig::FILE_NAME);
    let kubeconfig = match &args.kubeconfig {
        Some(path) => Some(path.clone()),
        None => std::fs::File::open(&default).is_ok().then_some(default),
    };
    match kubeconfig {
        Some(path) => {
            let credentials =
                Kubeconfig::load(&path).with_context(|| format!("{}", path.display()))?;
            Ok(AdminClient::from_credentials(
                &credentials,
                args.server.as_deref(),
            )?)
        }
        None => {
            let server = args
                .server
                .as_deref()
                .unwrap_or(cloud::admin::DEFAULT_ADDRESS);
            if server.starts_with("https://") {
                bail!("{server}: HTTPS needs a kubeconfig with the server's CA (--kubeconfig)");
            }
            Ok(AdminClient::new(server))
        }
    }
}

async fn run(args: Args) -> Result<()> {
    let client = client(&args)?;
    match args.command {
        Command::Logs {
            pod,
            container,
            namespace,
            follow,
            tail,
            since_seconds,
            timestamps,
            previous,
            limit_bytes,
        } => {
            let mut query = form_urlencoded::Serializer::new(String::new());
            if let Some(container) = &container {
                query.append_pair("container", container);
            }
            for (name, on) in [
                ("follow", follow),
                ("timestamps", timestamps),
                ("previous", previous),
            ] {
                if on {
                    query.append_pair(name, "true");
                }
            }
            for (name, value) in [
                ("tailLines", tail),
                ("sinceSeconds", since_seconds),
                ("limitBytes", limit_bytes),
            ] {
                if let Some(value) = value {
                    query.append_pair(name, &value.to_string());
                }
            }
            let path = format!(
                "/api/v1/namespaces/{namespace}/pods/{pod}/log?{}",
                query.finish()
            );
            let mut body = client.stream(&path).await?;
            let mut out = std::io::stdout();
            while let Some(chunk) = body.next().await {
                let chunk = chunk.context("the log was cut")?;
                out.write_all(&chunk).context("stdout")?;
                out.flush().context("stdout")?;
            }
        }
        Command::Exec {
            pod,
            container,
            namespace,
            stdin,
            tty,
            command,
        } => {
            let mut query = form_urlencoded::Serializer::new(String::new());
            for word in &command {
                query.append_pair("command", word);
            }
            let path = interactive_path(&namespace, &pod, "exec", container, stdin, tty, query);
            let code = terminal::run(&client, &path, stdin, tty).await?;
            std::process::exit(code);
        }
        Command::PortForward {
            pod,
            ports,
            namespace,
            address,
        } => {
            let path = format!("/api/v1/namespaces/{namespace}/pods/{pod}/portforward");
            terminal::forward(&client, &path, &address, &ports).await?;
        }
        Command::Attach {
            pod,
            container,
            namespace,
            stdin,
            tty,
        } => {
            let query = form_urlencoded::Serializer::new(String::new());
            let path = interactive_path(&namespace, &pod, "attach", container, stdin, tty, query);
            let code = terminal::run(&client, &path, stdin, tty).await?;
            std::process::exit(code);
        }
        Command::Apply { files } => {
            let results = client.apply(read_manifests(&files)?).await?;
            for r in results.results {
                println!("{}/{} {}", r.kind.to_lowercase(), r.name, r.result);
            }
        }
        Command::Delete {
            files,
            kind,
            name,
            namespace,
        } => match (files.is_empty(), kind, name) {
            (false, None, None) => {
                let results = client.delete_manifest(read_manifests(&files)?).await?;
                for r in results.results {
                    println!("{}/{} {}", r.kind.to_lowercase(), r.name, r.result);
                }
            }
            (true, Some(kind), Some(name)) => {
                let kind = kind_of(&kind)?;
                client.delete(&object_path(kind, &namespace, &name)).await?;
                println!("{}/{name} deleted", kind.name().to_lowercase());
            }
            _ => bail!("give either -f FILE or KIND NAME"),
        },
        Command::Get {
            kind,
            name,
            namespace,
            all_namespaces,
            selector,
            output,
        } => {
            let kind = kind_of(&kind)?;
            if name.is_some() && selector.is_some() {
                bail!("a name and a selector (-l) cannot go together");
            }
            let items = match &name {
                Some(name) => vec![client.get(&object_path(kind, &namespace, name)).await?],
                None => {
                    let prefix = kind.api_prefix();
                    let mut path = if all_namespaces || !kind.namespaced() {
                        format!("{prefix}/{}", kind.plural())
                    } else {
                        format!("{prefix}/namespaces/{namespace}/{}", kind.plural())
                    };
                    if let Some(selector) = &selector {
                        let query = form_urlencoded::Serializer::new(String::new())
                            .append_pair("labelSelector", selector)
                            .finish();
                        path = format!("{path}?{query}");
                    }
                    let list = client.get(&path).await?;
                    list.get("items")
                        .and_then(Value::as_array)
                        .cloned()
                        .unwrap_or_default()
                }
            };
            let single = name.is_some();
            match output {
                Some(Output::Json) => {
                    let value = if single {
                        items[0].clone()
                    } else {
                        list_of(kind, items)
                    };
                    println!("{}", serde_json::to_string_pretty(&value)?);
                }
                Some(Output::Yaml) => {
                    let value = if single {
                        items[0].clone()
                    } else {
                        list_of(kind, items)
                    };
                    print!("{}", serde_yaml_ng::to_string(&value)?);
                }
                Some(Output::Wide) => print_table(kind, &items, all_namespaces, true),
                None => {
                    if items.is_empty() {
                        eprintln!("No resources found.");
                    } else {
                        print_table(kind, &items, all_namespaces, false);
                    }
                }
            }
        }
        Command::Top { what } => {
            const API: &str = "/apis/metrics.k8s.io/v1beta1";
            let items = |value: Value| match value.get("items") {
                Some(Value::Array(items)) => items.clone(),
                _ => vec![value],
            };
            let selected = |path: String, selector: &Option<String>| match selector {
                Some(selector) => {
                    let query = form_urlencoded::Serializer::new(String::new())
                        .append_pair("labelSelector", selector)
                        .finish();
                    format!("{path}?{query}")
                }
                None => path,
            };
            let table = match what {
                Top::Nodes { name, selector } => {
                    let path = match &name {
                        Some(name) => format!("{API}/nodes/{name}"),
                        None => selected(format!("{API}/nodes"), &selector),
                    };
                    let nodes = items(client.get(&path).await?);
                    let rows = nodes
                        .iter()
                        .map(|n| {
                            let name = n["metadata"]["name"].as_str().unwrap_or("").to_owned();
                            (vec![name], &n["usage"])
                        })
                        .collect::<Vec<_>>();
                    if rows.is_empty() && selector.is_some() {
                        anyhow::bail!("No resources found");
                    }
                    if rows.is_empty() {
                        anyhow::bail!("metrics not available yet");
                    }
                    top_table(&["NAME"], rows)
                }
                Top::Pods {
                    name,
                    namespace,
                    all_namespaces,
                    containers,
                    selector,
                } => {
                    let path = match (&name, all_namespaces) {
                        (Some(name), _) => format!("{API}/namespaces/{namespace}/pods/{name}"),
                        (None, true) => selected(format!("{API}/pods"), &selector),
                        (None, false) => {
                            selected(format!("{API}/namespaces/{namespace}/pods"), &selector)
                        }
                    };
                    let pods = items(client.get(&path).await?);
                    if pods.is_empty() {
                        match all_namespaces {
                            true => anyhow::bail!("No resources found"),
                            false => anyhow::bail!("No resources found in {namespace} namespace."),
                        }
                    }
                    let mut header = Vec::new();
                    if all_namespaces {
                        header.push("NAMESPACE");
                    }
                    header.push(if containers { "POD" } else { "NAME" });
                    if containers {
                        header.push("NAME");
                    }
                    let mut sums = Vec::new();
                    for pod in &pods {
                        let mut cells = Vec::new();
                        if all_namespaces {
                            cells.push(
                                pod["metadata"]["namespace"]
                                    .as_str()
                                    .unwrap_or("")
                                    .to_owned(),
                            );
                        }
                        cells.push(pod["metadata"]["name"].as_str().unwrap_or("").to_owned());
                        let list = pod["containers"].as_array().cloned().unwrap_or_default();
                        if containers {
                            for c in list {
                                let mut cells = cells.clone();
                                cells.push(c["name"].as_str().unwrap_or("").to_owned());
                                sums.push((cells, c["usage"].clone()));
                            }
                        } else {
                            // Summed before rounding.
                            let cpu: f64 = list
                                .iter()
                                .filter_map(|c| c["usage"]["cpu"].as_str().and_then(millicores))
                                .sum();
                            let memory: u64 = list
                                .iter()
                                .filter_map(|c| c["usage"]["memory"].as_str().and_then(bytes))
                                .sum();
                            let usage = serde_json::json!({
                                "cpu": format!("{}n", (cpu * 1e6) as u64),
                                "memory": memory.to_string(),
                            });
                            sums.push((cells, usage));
                        }
                    }
                    top_table(
                        &header,
                        sums.iter()
                            .map(|(cells, usage)| (cells.clone(), usage))
                            .collect(),
                    )
                }
            };
            print!("{table}");
        }
        Command::Describe {
            kind,
            name,
            namespace,
        } => {
            let kind = kind_of(&kind)?;
            let object = client.get(&object_path(kind, &namespace, &name)).await?;
            print!("{}", describe(kind, &object));
        }
    }
    Ok(())
}

fn kind_of(word: &str) -> Result<Kind> {
    Kind::from_user(word).with_context(|| {
        let known: Vec<&str> = Kind::ALL.iter().map(|k| k.plural()).collect();
        format!(
            "the server doesn't have a resource type {word:?} ({})",
            known.join(", ")
        )
    })
}

fn object_path(kind: Kind, namespace: &str, name: &str) -> String {
    let prefix = kind.api_prefix();
    if kind.namespaced() {
        format!("{prefix}/namespaces/{namespace}/{}/{name}", kind.plural())
    } else {
        format!("{prefix}/{}/{name}", kind.plural())
    }
}

fn list_of(kind: Kind, items: Vec<Value>) -> Value {
    kind.list(items, String::new()).unwrap_or(Value::Null)
}

/// The manifests in `files`, one YAML stream.
fn read_manifests(files: &[PathBuf]) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    for file in files {
        if file == Path::new("-") {
            let mut text = Vec::new();
            std::io::stdin().read_to_end(&mut text)?;
            push_document(&mut out, &text);
        } else if file.is_dir() {
            let mut entries: Vec<PathBuf> = std::fs::read_dir(file)
                .with_context(|| file.display().to_string())?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| {
                    matches!(
                        p.extension().and_then(|e| e.to_str()),
                        Some("yaml" | "yml" | "json")
                    )
                })
                .collect();
            entries.sort();
            for entry in entries {
                let text = std::fs::read(&entry).with_context(|| entry.display().to_string())?;
                push_document(&mut out, &text);
            }
        } else {
            let text = std::fs::read(file).with_context(|| file.display().to_string())?;
            push_document(&mut out, &text);
        }
    }
    Ok(out)
}

fn push_document(out: &mut Vec<u8>, text: &[u8]) {
    if !out.is_empty() {
        out.extend_from_slice(b"\n---\n");
    }
    out.extend_from_slice(text);
}

fn str_at<'a>(value: &'a Value, path: &[&str]) -> &'a str {
    let mut at = value;
    for key in path {
        at = &at[*key];
    }
    at.as_str().unwrap_or("")
}

fn age(object: &Value) -> String {
    let created = str_at(object, &["metadata", "creationTimestamp"]);
    let Ok(created) = created.parse::<jiff::Timestamp>() else {
        return "<unknown>".to_owned();
    };
    let secs = (jiff::Timestamp::now().as_second() - created.as_second()).max(0);
    match secs {
        s if s < 120 => format!("{s}s"),
        s if s < 7200 => format!("{}m", s / 60),
        s if s < 172_800 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86_400),
    }
}

fn ready_status(node: &Value) -> String {
    let ready = node["status"]["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == "Ready"))
        .map(|c| str_at(c, &["status"]).to_owned());
    match ready.as_deref() {
        Some("True") => "Ready".to_owned(),
        Some("False") => "NotReady".to_owned(),
        _ => "Unknown".to_owned(),
    }
}

fn pod_columns(pod: &Value) -> (String, String, u64) {
    let statuses = pod["status"]["containerStatuses"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let total = pod["spec"]["containers"].as_array().map_or(0, Vec::len);
    let ready = statuses.iter().filter(|s| s["ready"] == true).count();
    let restarts = statuses
        .iter()
        .filter_map(|s| s["restartCount"].as_u64())
        .sum();
    let waiting = statuses
        .iter()
        .find_map(|s| s["state"]["waiting"]["reason"].as_str());
    let phase = waiting
        .or_else(|| pod["status"]["phase"].as_str())
        .unwrap_or("Unknown");
    (format!("{ready}/{total}"), phase.to_owned(), restarts)
}

fn print_table(kind: Kind, items: &[Value], with_namespace: bool, wide: bool) {
    let mut header: Vec<&str> = Vec::new();
    if with_namespace && kind.namespaced() {
        header.push("NAMESPACE");
    }
    header.push("NAME");
    let extra: &[&str] = match kind {
        Kind::Pod if wide => &["READY", "STATUS", "RESTARTS", "AGE", "IP", "NODE"],
        Kind::Pod => &["READY", "STATUS", "RESTARTS", "AGE", "NODE"],
        Kind::Node if wide => &[
            "STATUS",
            "ROLES",
            "AGE",
            "VERSION",
            "INTERNAL-IP",
            "OS-IMAGE",
        ],
        Kind::Node => &["STATUS", "ROLES", "AGE", "VERSION"],
        Kind::ConfigMap => &["DATA", "AGE"],
        Kind::Secret => &["TYPE", "DATA", "AGE"],
        Kind::Service => &["TYPE", "CLUSTER-IP", "PORT(S)", "AGE"],
        Kind::Endpoints => &["ENDPOINTS", "AGE"],
        Kind::Device if wide => &["MODEL", "NODE", "STATE", "TWINS", "AGE", "PROTOCOL"],
        Kind::Device => &["MODEL", "NODE", "STATE", "TWINS", "AGE"],
        Kind::DeviceModel => &["PROPERTIES", "PROTOCOL", "AGE"],
    };
    header.extend_from_slice(extra);
    let mut rows = vec![header.iter().map(|h| h.to_string()).collect::<Vec<_>>()];
    for item in items {
        let mut row = Vec::new();
        if with_namespace && kind.namespaced() {
            row.push(str_at(item, &["metadata", "namespace"]).to_owned());
        }
        row.push(str_at(item, &["metadata", "name"]).to_owned());
        match kind {
            Kind::Pod => {
                let (ready, status, restarts) = pod_columns(item);
                row.extend([ready, status, restarts.to_string(), age(item)]);
                if wide {
                    row.push(or_none(str_at(item, &["status", "podIP"])));
                }
                row.push(or_none(str_at(item, &["spec", "nodeName"])));
            }
            Kind::Node => {
                row.extend([
                    ready_status(item),
                    "edge".to_owned(),
                    age(item),
                    or_none(str_at(item, &["status", "nodeInfo", "kubeletVersion"])),
                ]);
                if wide {
                    let ip = item["status"]["addresses"]
                        .as_array()
                        .and_then(|a| a.iter().find(|a| a["type"] == "InternalIP"))
                        .map(|a| str_at(a, &["address"]).to_owned())
                        .unwrap_or_default();
                    row.push(or_none(&ip));
                    row.push(or_none(str_at(item, &["status", "nodeInfo", "osImage"])));
                }
            }
            Kind::ConfigMap => {
                let data = count(&item["data"]) + count(&item["binaryData"]);
                row.extend([data.to_string(), age(item)]);
            }
            Kind::Secret => {
                let kind = str_at(item, &["type"]);
                row.extend([
                    if kind.is_empty() { "Opaque" } else { kind }.to_owned(),
                    (count(&item["data"]) + count(&item["stringData"])).to_string(),
                    age(item),
                ]);
            }
            Kind::Service => {
                let kind = str_at(item, &["spec", "type"]);
                let ports: Vec<String> = item["spec"]["ports"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|p| {
                        let protocol = p["protocol"].as_str().unwrap_or("TCP");
                        format!("{}/{protocol}", p["port"])
                    })
                    .collect();
                row.extend([
                    if kind.is_empty() { "ClusterIP" } else { kind }.to_owned(),
                    or_none(str_at(item, &["spec", "clusterIP"])),
                    or_none(&ports.join(",")),
                    age(item),
                ]);
            }
            Kind::Endpoints => {
                let mut addresses = Vec::new();
                for subset in item["subsets"].as_array().into_iter().flatten() {
                    for address in subset["addresses"].as_array().into_iter().flatten() {
                        for port in subset["ports"].as_array().into_iter().flatten() {
                            addresses.push(format!(
                                "{}:{}",
                                str_at(address, &["ip"]),
                                port["port"]
                            ));
                        }
                    }
                }
                row.extend([or_none(&addresses.join(",")), age(item)]);
            }
            Kind::Device => {
                let twins = item["status"]["twins"].as_array().map_or(0, Vec::len);
                row.extend([
                    or_none(str_at(item, &["spec", "deviceModelRef", "name"])),
                    or_none(str_at(item, &["spec", "nodeName"])),
                    or_none(str_at(item, &["status", "state"])),
                    twins.to_string(),
                    age(item),
                ]);
                if wide {
                    row.push(or_none(str_at(item, &["spec", "protocol", "protocolName"])));
                }
            }
            Kind::DeviceModel => {
                let properties = item["spec"]["properties"].as_array().map_or(0, Vec::len);
                row.extend([
                    properties.to_string(),
                    or_none(str_at(item, &["spec", "protocol"])),
                    age(item),
                ]);
            }
        }
        rows.push(row);
    }
    let widths: Vec<usize> = (0..rows[0].len())
        .map(|c| {
            rows.iter()
                .map(|r| r.get(c).map_or(0, String::len))
                .max()
                .unwrap_or(0)
        })
        .collect();
    for row in rows {
        let line: Vec<String> = row
            .iter()
            .zip(&widths)
            .map(|(cell, width)| format!("{cell:<width$}"))
            .collect();
        println!("{}", line.join("   ").trim_end());
    }
}

fn count(value: &Value) -> usize {
    value.as_object().map_or(0, serde_json::Map::len)
}

fn or_none(text: &str) -> String {
    if text.is_empty() {
        "<none>".to_owned()
    } else {
        text.to_owned()
    }
}

fn labels(object: &Value) -> String {
    let labels: Vec<String> = object["metadata"]["labels"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or("")))
        .collect();
    or_none(&labels.join(","))
}

/// kubectl-style detail: the fields people look for first, then the
/// conditions.
fn describe(kind: Kind, object: &Value) -> String {
    let mut out = String::new();
    let mut line = |key: &str, value: String| out.push_str(&format!("{key:<16}{value}\n"));
    line("Name:", str_at(object, &["metadata", "name"]).to_owned());
    if kind.namespaced() {
        line(
            "Namespace:",
            str_at(object, &["metadata", "namespace"]).to_owned(),
        );
    }
    line("Labels:", labels(object));
    line(
        "Created:",
        or_none(str_at(object, &["metadata", "creationTimestamp"])),
    );
    line(
        "Version:",
        str_at(object, &["metadata", "resourceVersion"]).to_owned(),
    );
    match kind {
        Kind::Pod => {
            line("Node:", or_none(str_at(object, &["spec", "nodeName"])));
            line("Status:", or_none(str_at(object, &["status", "phase"])));
            line("IP:", or_none(str_at(object, &["status", "podIP"])));
            line("Containers:", String::new());
            let statuses = object["status"]["containerStatuses"].as_array();
            for container in object["spec"]["containers"]
                .as_array()
                .into_iter()
                .flatten()
            {
                let name = str_at(container, &["name"]);
                line(&format!("  {name}:"), String::new());
                line("    Image:", str_at(container, &["image"]).to_owned());
                let status = statuses.into_iter().flatten().find(|s| s["name"] == name);
                if let Some(status) = status {
                    let state = status["state"]
                        .as_object()
                        .and_then(|s| s.keys().next().cloned())
                        .unwrap_or_default();
                    line("    State:", or_none(&state));
                    line("    Ready:", status["ready"].to_string());
                    line("    Restarts:", status["restartCount"].to_string());
                }
            }
        }
        Kind::Node => {
            line("Status:", ready_status(object));
            for address in object["status"]["addresses"]
                .as_array()
                .into_iter()
                .flatten()
            {
                line(
                    &format!("{}:", str_at(address, &["type"])),
                    str_at(address, &["address"]).to_owned(),
                );
            }
        }
        Kind::ConfigMap | Kind::Secret => {
            let keys: Vec<&String> = object["data"]
                .as_object()
                .into_iter()
                .flatten()
                .map(|(k, _)| k)
                .collect();
            line(
                "Data keys:",
                or_none(
                    &keys
                        .iter()
                        .map(|k| k.as_str())
                        .collect::<Vec<_>>()
                        .join(", "),
                ),
            );
        }
        Kind::Device => {
            line(
                "Model:",
                or_none(str_at(object, &["spec", "deviceModelRef", "name"])),
            );
            line("Node:", or_none(str_at(object, &["spec", "nodeName"])));
            line("State:", or_none(str_at(object, &["status", "state"])));
            line(
                "Last online:",
                or_none(str_at(object, &["status", "lastOnlineTime"])),
            );
            line("Twins:", String::new());
            line(
                "  PROPERTY",
                format!("{:<14}{:<14}OBSERVED DESIRED", "DESIRED", "REPORTED"),
            );
            let reported = object["status"]["twins"].as_array();
            let mut names: Vec<String> = Vec::new();
            for property in object["spec"]["properties"]
                .as_array()
                .into_iter()
                .flatten()
            {
                names.push(str_at(property, &["name"]).to_owned());
            }
            for twin in reported.into_iter().flatten() {
                let name = str_at(twin, &["propertyName"]).to_owned();
                if !names.contains(&name) {
                    names.push(name);
                }
            }
            for name in names {
                let desired = object["spec"]["properties"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .find(|p| p["name"] == name.as_str())
                    .map(|p| str_at(p, &["desired", "value"]).to_owned())
                    .unwrap_or_default();
                let twin = reported
                    .into_iter()
                    .flatten()
                    .find(|t| t["propertyName"] == name.as_str());
                let (value, observed) = twin.map_or((String::new(), String::new()), |t| {
                    (
                        str_at(t, &["reported", "value"]).to_owned(),
                        str_at(t, &["observedDesired", "value"]).to_owned(),
                    )
                });
                line(
                    &format!("  {name}"),
                    format!(
                        "{:<14}{:<14}{}",
                        or_none(&desired),
                        or_none(&value),
                        or_none(&observed)
                    ),
                );
            }
            return out;
        }
        Kind::DeviceModel | Kind::Service | Kind::Endpoints => {
            if let Ok(spec) = serde_yaml_ng::to_string(&object["spec"]) {
                line("Spec:", String::new());
                for spec_line in spec.lines() {
                    line("", format!("  {spec_line}"));
                }
            }
        }
    }
    if let Some(conditions) = object["status"]["conditions"].as_array() {
        out.push_str("Conditions:\n  TYPE              STATUS    REASON            MESSAGE\n");
        for c in conditions {
            out.push_str(&format!(
                "  {:<18}{:<10}{:<18}{}\n",
                str_at(c, &["type"]),
                str_at(c, &["status"]),
                str_at(c, &["reason"]),
                str_at(c, &["message"]),
            ));
        }
    }
    out
}
