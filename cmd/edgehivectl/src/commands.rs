//! Each command, carried out against the admin API: the client the flags
//! ask for, and what each command sends and prints.

use std::io::Write as _;

use anyhow::Context as _;
use anyhow::{Result, bail};
use apis::kinds::Kind;
use cloud::AdminClient;
use cloud::admin_client::ClientError;
use cloud::admin_client::kubeconfig::Kubeconfig;
use futures_util::StreamExt as _;
use serde_json::Value;

use crate::cli::{Args, Command, Output, Top};
use crate::manifests::read_manifests;
use crate::print::{describe, print_table};
use crate::terminal;
use crate::top::{bytes, millicores, top_table};

/// The path of a pod's `exec` or `attach` with its standard streams.
pub(crate) fn interactive_path(
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

/// The client the flags, and the kubeconfig they lead to, ask for.
pub(crate) fn client(args: &Args) -> Result<AdminClient> {
    let default = std::path::Path::new(cloud::admin_client::kubeconfig::DEFAULT_CLOUD_DATA_DIR)
        .join(cloud::admin_client::kubeconfig::FILE_NAME);
    client_with(args, &default)
}

/// [`client`], with cloudcore's kubeconfig looked for at `default`. Plain
/// HTTP only when `--server` asks for it: with neither flag, a default
/// kubeconfig that is missing or unreadable is named as the cause.
fn client_with(args: &Args, default: &std::path::Path) -> Result<AdminClient> {
    let kubeconfig = match (&args.kubeconfig, &args.server) {
        (Some(path), _) => Some(path.clone()),
        (None, server) => match std::fs::File::open(default) {
            Ok(_) => Some(default.to_owned()),
            Err(_) if server.is_some() => None,
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => bail!(
                "no kubeconfig: give --kubeconfig (cloudcore writes <dataDir>/{}; {} is not \
                 there), or --server HOST:PORT for an admin API without authentication",
                cloud::admin_client::kubeconfig::FILE_NAME,
                default.display()
            ),
            Err(err) => bail!(
                "{}: {err}: run as its owner, or give --kubeconfig",
                default.display()
            ),
        },
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
            // Only with --server: without it, client_with stopped above.
            let Some(server) = args.server.as_deref() else {
                bail!("no kubeconfig and no --server");
            };
            if server.starts_with("https://") {
                bail!("{server}: HTTPS needs a kubeconfig with the server's CA (--kubeconfig)");
            }
            Ok(AdminClient::new(server))
        }
    }
}

pub(crate) async fn run(args: Args) -> Result<()> {
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
            let tty = terminal::usable_tty(stdin, tty);
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
            let tty = terminal::usable_tty(stdin, tty);
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
            ignore_not_found,
        } => match (files.is_empty(), kind, name) {
            (false, None, None) => {
                // As kubectl: every object is tried; one not found is an
                // error on stderr and the exit code, unless ignored.
                let results = client.delete_manifest(read_manifests(&files)?).await?;
                let mut missing = 0;
                for r in results.results {
                    let what = format!("{}/{}", r.kind.to_lowercase(), r.name);
                    if r.not_found() {
                        if !ignore_not_found {
                            eprintln!("Error from server (NotFound): {what} not found");
                            missing += 1;
                        }
                    } else {
                        println!("{what} {}", r.result);
                    }
                }
                if missing > 0 {
                    std::process::exit(1);
                }
            }
            (true, Some(kind), Some(name)) => {
                let kind = kind_of(&kind)?;
                match client.delete(&object_path(kind, &namespace, &name)).await {
                    Ok(_) => println!("{}/{name} deleted", kind.name().to_lowercase()),
                    Err(ClientError::Server { code: 404, .. }) if ignore_not_found => {}
                    Err(err) => return Err(err.into()),
                }
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

pub(crate) fn kind_of(word: &str) -> Result<Kind> {
    Kind::from_user(word).with_context(|| {
        let known: Vec<&str> = Kind::ALL.iter().map(|k| k.plural()).collect();
        format!(
            "the server doesn't have a resource type {word:?} ({})",
            known.join(", ")
        )
    })
}

pub(crate) fn object_path(kind: Kind, namespace: &str, name: &str) -> String {
    let prefix = kind.api_prefix();
    if kind.namespaced() {
        format!("{prefix}/namespaces/{namespace}/{}/{name}", kind.plural())
    } else {
        format!("{prefix}/{}/{name}", kind.plural())
    }
}

pub(crate) fn list_of(kind: Kind, items: Vec<Value>) -> Value {
    kind.list(items, String::new()).unwrap_or(Value::Null)
}

#[cfg(test)]
mod tests {
    use clap::Parser as _;

    use super::*;

    /// `argv` as given: the environment's `EDGEHIVE_ADMIN` and
    /// `EDGEHIVE_KUBECONFIG` (which clap reads too) are set aside.
    fn args(argv: &[&str]) -> Args {
        let mut args = Args::try_parse_from(argv).expect("args");
        let given = |flag: &str| argv.contains(&flag);
        if !given("--server") {
            args.server = None;
        }
        if !given("--kubeconfig") {
            args.kubeconfig = None;
        }
        args
    }

    #[test]
    fn without_a_kubeconfig_or_a_server_the_missing_file_is_named() {
        let dir = tempfile::tempdir().expect("dir");
        let missing = dir.path().join("admin.kubeconfig");
        let err = client_with(&args(&["edgehivectl", "get", "pods"]), &missing)
            .expect_err("no kubeconfig");
        let shown = err.to_string();
        assert!(
            shown.contains("--kubeconfig") && shown.contains(&missing.display().to_string()),
            "{shown}"
        );
        // A path that cannot be opened for another reason says why.
        let file = dir.path().join("file");
        std::fs::write(&file, "x").expect("a file");
        let blocked = file.join("admin.kubeconfig");
        let err = client_with(&args(&["edgehivectl", "get", "pods"]), &blocked)
            .expect_err("not a directory");
        assert!(
            err.to_string().starts_with(&blocked.display().to_string()),
            "{err}"
        );
        // Plain HTTP when asked for.
        assert!(
            client_with(
                &args(&["edgehivectl", "--server", "127.0.0.1:1", "get", "pods"]),
                &missing
            )
            .is_ok()
        );
    }
}
