//! The `pods` group, against the containerd of `scripts/setup-containerd`:
//!
//! - time from the pod messages reaching the edge (metamanager, then
//!   edged) to every pod Running, for 1 pod and for 20 at once; baseline in
//!   the same run: the same CRI calls made directly, in sequence (image
//!   status, sandbox, create, start, status until running);
//! - edgecore's RSS with 0 and with 50 running pods (the real binary, run
//!   offline with its pods in its store).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use beehive::constants::{group, module, operation};
use beehive::{Hive, HiveConfig, Message};
use edged::cri::api;
use edged::{Cri, Edged, EdgedConfig};
use meta::{EdgeStore, MetaManager};
use serde_json::{Value, json};

use crate::Scale;
use crate::report::Report;

const IMAGE: &str = "127.0.0.1:5000/edgehive/busybox:latest";
const PAUSE: &str = "127.0.0.1:5000/edgehive/pause:latest";
const WAIT: Duration = Duration::from_secs(120);

fn socket() -> PathBuf {
    std::env::var_os("EDGEHIVE_CRI_SOCKET")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/run/edgehive/containerd/containerd.sock"))
}

fn pod(name: &str, uid: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "uid": uid},
        "spec": {
            "terminationGracePeriodSeconds": 0,
            "containers": [{"name": "main", "image": IMAGE, "imagePullPolicy": "IfNotPresent",
                            "command": ["sleep", "3600"]}]
        }
    })
}

pub fn run(scale: Scale, report: &mut Report) -> Result<()> {
    let batches: &[usize] = if scale.runs == 1 { &[1, 3] } else { &[1, 20] };
    let rss_pods = if scale.runs == 1 { 5 } else { 50 };
    actix::System::new().block_on(async {
        let cri = Cri::connect(&socket())
            .await
            .context("containerd (run ./scripts/setup-containerd)")?;
        for image in [PAUSE, IMAGE] {
            pull(&cri, image).await?;
        }
        for &pods in batches {
            let direct = direct(&cri, pods).await?;
            let through_edged = through_edged(pods).await?;
            report.with_baseline(
                &format!("pods/{pods}_to_running"),
                "seconds",
                through_edged,
                "s",
                direct,
                "same CRI calls, direct, in sequence",
            );
        }
        Ok::<_, anyhow::Error>(())
    })?;
    let edgecore = Path::new(env!("CARGO_BIN_EXE_bench-edgecore"));
    let idle = edgecore_rss(edgecore, 0)?;
    let busy = edgecore_rss(edgecore, rss_pods)?;
    report.plain("pods/edgecore_rss", "rss_0_pods", idle / 1048576.0, "MiB");
    report.plain(
        "pods/edgecore_rss",
        &format!("rss_{rss_pods}_pods"),
        busy / 1048576.0,
        "MiB",
    );
    Ok(())
}

async fn pull(cri: &Cri, image: &str) -> Result<()> {
    let mut images = cri.images.clone();
    images
        .pull_image(api::PullImageRequest {
            image: Some(api::ImageSpec {
                image: image.to_owned(),
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
        .with_context(|| format!("pull {image}"))?;
    Ok(())
}

/// The baseline: `pods` pods made with direct CRI calls, one after another;
/// seconds until the last is running. Removed afterwards.
async fn direct(cri: &Cri, pods: usize) -> Result<f64> {
    let mut runtime = cri.runtime.clone();
    let mut images = cri.images.clone();
    let logs = tempfile::tempdir()?;
    let run = format!("bench-direct-{}", std::process::id());
    let started = Instant::now();
    let mut sandboxes = Vec::new();
    for n in 0..pods {
        let config = api::PodSandboxConfig {
            metadata: Some(api::PodSandboxMetadata {
                name: format!("direct-{n}"),
                uid: format!("{run}-{n}"),
                namespace: "bench".to_owned(),
                attempt: 0,
            }),
            hostname: format!("direct-{n}"),
            log_directory: logs.path().to_string_lossy().into_owned(),
            labels: HashMap::from([("edgehive.io/bench".to_owned(), run.clone())]),
            ..Default::default()
        };
        for image in [PAUSE, IMAGE] {
            images
                .image_status(api::ImageStatusRequest {
                    image: Some(api::ImageSpec {
                        image: image.to_owned(),
                        ..Default::default()
                    }),
                    verbose: false,
                })
                .await?;
        }
        let sandbox = runtime
            .run_pod_sandbox(api::RunPodSandboxRequest {
                config: Some(config.clone()),
                runtime_handler: String::new(),
            })
            .await?
            .into_inner()
            .pod_sandbox_id;
        runtime
            .pod_sandbox_status(api::PodSandboxStatusRequest {
                pod_sandbox_id: sandbox.clone(),
                verbose: false,
            })
            .await?;
        let container = runtime
            .create_container(api::CreateContainerRequest {
                pod_sandbox_id: sandbox.clone(),
                config: Some(api::ContainerConfig {
                    metadata: Some(api::ContainerMetadata {
                        name: "main".to_owned(),
                        attempt: 0,
                    }),
                    image: Some(api::ImageSpec {
                        image: IMAGE.to_owned(),
                        ..Default::default()
                    }),
                    command: vec!["sleep".to_owned(), "3600".to_owned()],
                    log_path: format!("direct-{n}.log"),
                    ..Default::default()
                }),
                sandbox_config: Some(config),
            })
            .await?
            .into_inner()
            .container_id;
        runtime
            .start_container(api::StartContainerRequest {
                container_id: container.clone(),
            })
            .await?;
        loop {
            let status = runtime
                .container_status(api::ContainerStatusRequest {
                    container_id: container.clone(),
                    verbose: false,
                })
                .await?
                .into_inner()
                .status;
            if status.is_some_and(|s| s.state == api::ContainerState::ContainerRunning as i32) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        sandboxes.push(sandbox);
    }
    let seconds = started.elapsed().as_secs_f64();
    for sandbox in sandboxes {
        let _ = runtime
            .stop_pod_sandbox(api::StopPodSandboxRequest {
                pod_sandbox_id: sandbox.clone(),
            })
            .await;
        let _ = runtime
            .remove_pod_sandbox(api::RemovePodSandboxRequest {
                pod_sandbox_id: sandbox,
            })
            .await;
    }
    Ok(seconds)
}

/// `pods` pods through metamanager and edged; seconds from the messages to
/// every pod reported Running. Removed afterwards.
async fn through_edged(pods: usize) -> Result<f64> {
    let dir = tempfile::tempdir()?;
    let hive = Hive::new("bench-edge", HiveConfig::default());
    let store = EdgeStore::open(&dir.path().join("edge.redb"))?;
    let mut changes = store.subscribe();
    MetaManager::start(&hive, store.clone())?;
    let node = format!("bench-{}-{pods}", std::process::id());
    let config = EdgedConfig {
        relist_period: Duration::from_millis(100),
        ..EdgedConfig::new(node.clone(), socket(), dir.path().join("edged"))
    };
    Edged::start(&hive, config).await?;
    let objects: Vec<Value> = (0..pods)
        .map(|n| pod(&format!("p{n}"), &format!("{node}-{n}")))
        .collect();
    let started = Instant::now();
    for (n, object) in objects.iter().enumerate() {
        let msg = Message::new()
            .build_router(
                module::EDGEHUB,
                group::RESOURCE,
                format!("default/pod/p{n}"),
                operation::INSERT,
            )
            .with_resource_version("1")
            .with_content(apis::kinds::object_content(object));
        hive.send_sync(module::METAMANAGER, msg, WAIT).await?;
    }
    let mut running = std::collections::HashSet::new();
    let deadline = tokio::time::Instant::now() + WAIT;
    while running.len() < pods {
        let change = tokio::time::timeout_at(deadline, changes.recv())
            .await
            .context("pods never all ran")??;
        if change.resource.contains("/podstatus/")
            && change
                .record
                .object
                .as_ref()
                .and_then(|s| s.decode::<apis::k8s::PodStatus>().ok())
                .is_some_and(|s| s.phase.as_deref() == Some("Running"))
        {
            running.insert(change.resource);
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    for (n, object) in objects.iter().enumerate() {
        let msg = Message::new()
            .build_router(
                module::EDGEHUB,
                group::RESOURCE,
                format!("default/pod/p{n}"),
                operation::DELETE,
            )
            .with_resource_version("2")
            .with_content(apis::kinds::object_content(object));
        hive.send_sync(module::METAMANAGER, msg, WAIT).await?;
    }
    wait_removed(&node).await?;
    let _ = hive.shutdown().await;
    store.close().await;
    Ok(seconds)
}

/// Waits until containerd holds no sandbox of `node`.
async fn wait_removed(node: &str) -> Result<()> {
    let cri = Cri::connect(&socket()).await?;
    let deadline = Instant::now() + WAIT;
    loop {
        let mut runtime = cri.runtime.clone();
        let left = runtime
            .list_pod_sandbox(api::ListPodSandboxRequest {
                filter: Some(api::PodSandboxFilter {
                    label_selector: HashMap::from([(
                        edged::spec::NODE.to_owned(),
                        node.to_owned(),
                    )]),
                    ..Default::default()
                }),
            })
            .await?
            .into_inner()
            .items
            .len();
        if left == 0 {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("{left} sandboxes of {node} left");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// edgecore's RSS (bytes) once `pods` pods from its store run.
fn edgecore_rss(edgecore: &Path, pods: usize) -> Result<f64> {
    let dir = tempfile::tempdir()?;
    let node = format!("bench-rss-{}-{pods}", std::process::id());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let store = EdgeStore::open(&dir.path().join("edge.redb"))?;
        for n in 0..pods {
            store
                .put(
                    &format!("default/pod/p{n}"),
                    "1",
                    apis::kinds::object_content(&pod(&format!("p{n}"), &format!("{node}-{n}"))),
                )
                .await?;
        }
        store.close().await;
        Ok::<_, anyhow::Error>(())
    })?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let server = format!("127.0.0.1:{port}");
    let mut child = Command::new(edgecore)
        .arg("--data-dir")
        .arg(dir.path())
        .args(["--log", "warn", "run", "--transport", "uds", "--cloud"])
        .arg(dir.path().join("no-cloud.sock"))
        .args([
            "--node",
            &node,
            "--metaserver",
            "off",
            "--edged-server",
            &server,
            "--mqtt-broker",
            "127.0.0.1:0",
        ])
        .arg("--cri-socket")
        .arg(socket())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
    let pid = child.id();
    let deadline = Instant::now() + WAIT;
    let measured = loop {
        let body = http_get(&server, "/pods").unwrap_or_default();
        let listed: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
        let running = listed["items"].as_array().map_or(0, |items| {
            items
                .iter()
                .filter(|p| p["status"]["phase"] == "Running")
                .count()
        });
        if !body.is_empty() && running == pods {
            // Settled: let the first status reports and GC pass.
            std::thread::sleep(Duration::from_secs(2));
            let statm = std::fs::read_to_string(format!("/proc/{pid}/statm"))?;
            let pages: f64 = statm
                .split_whitespace()
                .nth(1)
                .and_then(|p| p.parse().ok())
                .unwrap_or(0.0);
            break pages * 4096.0;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            bail!("edgecore never ran its {pods} pods");
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let _ = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status();
    let _ = child.wait();
    // The pods outlive edgecore (as they should); remove them.
    runtime.block_on(async {
        let cri = Cri::connect(&socket()).await?;
        for n in 0..pods {
            edged::teardown::teardown(
                &cri,
                &EdgedConfig::new(node.clone(), socket(), dir.path().join("edged")),
                &format!("{node}-{n}"),
                0,
            )
            .await?;
        }
        Ok::<_, anyhow::Error>(())
    })?;
    Ok(measured)
}

fn http_get(address: &str, path: &str) -> Option<String> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(address).ok()?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {address}\r\n\r\n").ok()?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).ok()?;
    answer
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_owned())
}
