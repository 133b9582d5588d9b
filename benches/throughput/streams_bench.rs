//! The `streams` group: the tunnel inside a node's link (`stream`)
//! with edged's stream server at the edge end, over a real Unix-socket
//! link, against the containerd of `scripts/setup-containerd`:
//!
//! - a container's log read through the tunnel, beside reading and
//!   filtering the same file on the edge directly;
//! - the round trip of a command run in a container (`exec true`, opened,
//!   run, its outcome back), beside a direct CRI `ExecSync`;
//! - memory of idle open streams (the cloud's and the edge's ends, in one
//!   process), per stream.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use apis::k8s::Pod;
use apis::streams::{Io, LogOptions, PodRef, StreamRequest, channel};
use bytes::Bytes;
use edged::Cri;
use edged::cri::api;
use stream::{Chunk, PendingStream, StreamHandler, Tunnel, TunnelStream};
use transports::{DialOptions, Link, ListenOptions, Received, Transport, UnixSocket};

use crate::Scale;
use crate::hub_bench::rss_bytes;
use crate::report::Report;

const IMAGE: &str = "127.0.0.1:5000/edgehive/busybox:latest";
const OPEN: Duration = Duration::from_secs(20);

fn socket() -> PathBuf {
    std::env::var_os("EDGEHIVE_CRI_SOCKET")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/run/edgehive/containerd/containerd.sock"))
}

/// Reads a link's end: raw frames to its tunnel, the end to every stream.
fn read(link: Link, tunnel: Tunnel) -> transports::LinkSender {
    let Link {
        sender,
        mut receiver,
        ..
    } = link;
    tokio::spawn(async move {
        loop {
            match receiver.recv_item().await {
                Some(Ok(Received::Raw(frame))) => tunnel.received(&frame),
                Some(Ok(Received::Message(_))) => {}
                _ => return tunnel.link_lost(),
            }
        }
    });
    sender
}

/// A cloud's and an edge's tunnel over a real link; `handler` serves.
async fn linked(
    dir: &std::path::Path,
    handler: Arc<dyn StreamHandler>,
) -> Result<(Tunnel, Tunnel, Vec<transports::LinkSender>)> {
    let path = dir.join("link.sock").to_string_lossy().into_owned();
    let mut listener = UnixSocket.listen(&ListenOptions::new(&path)).await?;
    let dialed = UnixSocket.dial(&DialOptions::new(&path, "cloud")).await?;
    let accepted = listener.accept().await.context("accepted")?;
    let cloud = Tunnel::for_cloud(accepted.sender.clone());
    let edge = Tunnel::for_edge(dialed.sender.clone(), Some(handler));
    let senders = vec![read(accepted, cloud.clone()), read(dialed, edge.clone())];
    Ok((cloud, edge, senders))
}

/// Serves logs from one directory, and holds any other stream open.
struct Bench {
    logs: PathBuf,
    pods: Arc<edged::streams::PodStreamServer>,
}

impl StreamHandler for Bench {
    fn open(&self, request: Bytes, pending: PendingStream) {
        match StreamRequest::decode(&request) {
            Ok(StreamRequest::Logs { options, .. }) => {
                let logs = self.logs.clone();
                tokio::spawn(async move { edged::logs::serve(&logs, options, pending).await });
            }
            Ok(StreamRequest::Stats { .. }) => {
                // Idle: accepted, held until the cloud closes it.
                if let Ok(mut stream) = pending.accept() {
                    tokio::spawn(async move { while stream.recv().await.is_some() {} });
                }
            }
            _ => self.pods.open(request, pending),
        }
    }
}

pub fn run(scale: Scale, report: &mut Report) -> Result<()> {
    let quick = scale.runs == 1;
    actix::System::new().block_on(async {
        let dir = tempfile::tempdir()?;
        let cri = Cri::connect(&socket())
            .await
            .context("containerd (run ./scripts/setup-containerd)")?;
        let container = Container::start(&cri, dir.path()).await?;
        let pods: edged::server::PodsView = Arc::new(RwLock::new(BTreeMap::from([(
            "bench/exec".to_owned(),
            container.pod(),
        )])));
        let handler = Arc::new(Bench {
            logs: dir.path().join("logs"),
            pods: edged::streams::PodStreamServer::new(
                pods,
                cri.clone(),
                dir.path().to_owned(),
                edged::stats::StatsCollector::new(cri.clone(), "bench".to_owned()),
            ),
        });
        let (cloud, _edge, _senders) = linked(dir.path(), handler).await?;

        // First: memory freed by the runs below would be reused here.
        // Idle streams: what each costs, both ends, over links of their
        // own (one link takes stream::MAX_STREAMS at once).
        let links = if quick { 5 } else { 20 };
        let per_link = 100;
        let mut tunnels = Vec::new();
        for n in 0..links {
            let dir = dir.path().join(format!("idle-{n}"));
            std::fs::create_dir_all(&dir)?;
            let handler = Arc::new(Bench {
                logs: dir.clone(),
                pods: edged::streams::PodStreamServer::new(
                    Arc::default(),
                    cri.clone(),
                    dir.clone(),
                    edged::stats::StatsCollector::new(cri.clone(), "bench".to_owned()),
                ),
            });
            tunnels.push(linked(&dir, handler).await?);
        }
        let before = rss_bytes();
        let mut open = Vec::with_capacity(links * per_link);
        for (cloud, _, _) in &tunnels {
            for _ in 0..per_link {
                let request = StreamRequest::Stats {
                    what: apis::streams::StatsKind::Summary,
                };
                open.push(cloud.open(Bytes::from(request.encode()), OPEN).await?);
            }
        }
        let after = rss_bytes();
        report.plain(
            "streams/idle",
            "RSS per open stream (cloud and edge ends)",
            after.saturating_sub(before) as f64 / open.len() as f64 / 1024.0,
            "KiB",
        );
        drop(open);

        // A container's log: 32 MiB of lines (4 MiB quick).
        let size = if quick { 4 << 20 } else { 32 << 20 };
        std::fs::create_dir_all(dir.path().join("logs"))?;
        let file = dir.path().join("logs").join("0.log");
        write_log(&file, size)?;
        let (mut tunnel_rate, mut direct_rate) = (Vec::new(), Vec::new());
        for _ in 0..scale.runs {
            let started = Instant::now();
            let read = read_direct(&file)?;
            direct_rate.push(read as f64 / started.elapsed().as_secs_f64() / 1048576.0);
            let started = Instant::now();
            let got = read_through(&cloud).await?;
            tunnel_rate.push(got as f64 / started.elapsed().as_secs_f64() / 1048576.0);
            anyhow::ensure!(
                got == read,
                "{got} bytes through the tunnel, {read} read directly"
            );
        }
        report.with_baseline(
            "streams/logs",
            "throughput",
            median(tunnel_rate),
            "MiB/s",
            median(direct_rate),
            "the same file read and filtered on the edge",
        );

        // exec: opened, run, its outcome back; beside CRI ExecSync.
        let rounds = if quick { 20 } else { 200 };
        let (mut through, mut direct) = (Vec::new(), Vec::new());
        for _ in 0..rounds {
            let started = Instant::now();
            exec_through(&cloud).await?;
            through.push(started.elapsed().as_secs_f64() * 1e3);
            let started = Instant::now();
            let mut runtime = cri.runtime.clone();
            runtime
                .exec_sync(api::ExecSyncRequest {
                    container_id: container.id.clone(),
                    cmd: vec!["true".to_owned()],
                    timeout: 10,
                })
                .await?;
            direct.push(started.elapsed().as_secs_f64() * 1e3);
        }
        report.with_baseline(
            "streams/exec",
            "round trip (median)",
            median(through),
            "ms",
            median(direct),
            "a direct CRI ExecSync",
        );

        container.stop(&cri).await;
        Ok(())
    })
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(0.0)
}

/// Writes about `size` bytes of CRI log lines to `file`.
fn write_log(file: &std::path::Path, size: usize) -> Result<()> {
    use std::io::Write;
    let mut out = std::io::BufWriter::new(std::fs::File::create(file)?);
    let (mut written, mut n) = (0, 0u64);
    while written < size {
        let line = format!(
            "2026-11-23T00:00:00.{:09}Z stdout F line {n} of a chatty container's log, as it writes them\n",
            n % 1_000_000_000
        );
        out.write_all(line.as_bytes())?;
        written += line.len();
        n += 1;
    }
    out.flush()?;
    Ok(())
}

/// Reads and filters the log file as edged does: the bytes it gives.
fn read_direct(file: &std::path::Path) -> Result<usize> {
    let text = std::fs::read(file)?;
    let mut filter = edged::logs::LogFilter::new(&LogOptions::default(), jiff::Timestamp::now())
        .map_err(anyhow::Error::msg)?;
    Ok(String::from_utf8_lossy(&text)
        .lines()
        .filter_map(|line| filter.line(line))
        .map(|line| line.len())
        .sum())
}

/// Reads the log through the tunnel: the bytes that came.
async fn read_through(cloud: &Tunnel) -> Result<usize> {
    let request = StreamRequest::Logs {
        pod: PodRef {
            namespace: "bench".to_owned(),
            name: "logs".to_owned(),
        },
        container: "main".to_owned(),
        options: LogOptions::default(),
    };
    let mut stream = cloud.open(Bytes::from(request.encode()), OPEN).await?;
    let mut got = 0;
    while let Some(chunk) = stream.recv().await {
        if let Chunk::Data(channel::STDOUT, bytes) = chunk? {
            got += bytes.len();
        }
    }
    Ok(got)
}

/// `true` run in the container through the tunnel, until its outcome.
async fn exec_through(cloud: &Tunnel) -> Result<()> {
    let request = StreamRequest::Exec {
        pod: PodRef {
            namespace: "bench".to_owned(),
            name: "exec".to_owned(),
        },
        container: "main".to_owned(),
        command: vec!["true".to_owned()],
        io: Io {
            stdout: true,
            stderr: true,
            ..Io::default()
        },
    };
    let mut stream: TunnelStream = cloud.open(Bytes::from(request.encode()), OPEN).await?;
    while let Some(chunk) = stream.recv().await {
        if let Chunk::Data(channel::ERROR, status) = chunk? {
            anyhow::ensure!(
                String::from_utf8_lossy(&status).contains("Success"),
                "exec failed: {}",
                String::from_utf8_lossy(&status)
            );
        }
    }
    Ok(())
}

/// A running busybox container for the exec rounds.
struct Container {
    sandbox: String,
    id: String,
}

impl Container {
    async fn start(cri: &Cri, dir: &std::path::Path) -> Result<Container> {
        let mut runtime = cri.runtime.clone();
        let run = format!("bench-streams-{}", std::process::id());
        let config = api::PodSandboxConfig {
            metadata: Some(api::PodSandboxMetadata {
                name: "exec".to_owned(),
                uid: run.clone(),
                namespace: "bench".to_owned(),
                attempt: 0,
            }),
            hostname: "exec".to_owned(),
            log_directory: dir.to_string_lossy().into_owned(),
            labels: HashMap::from([("edgehive.io/bench".to_owned(), run)]),
            ..Default::default()
        };
        let sandbox = runtime
            .run_pod_sandbox(api::RunPodSandboxRequest {
                config: Some(config.clone()),
                runtime_handler: String::new(),
            })
            .await?
            .into_inner()
            .pod_sandbox_id;
        let id = runtime
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
                    log_path: "main.log".to_owned(),
                    ..Default::default()
                }),
                sandbox_config: Some(config),
            })
            .await?
            .into_inner()
            .container_id;
        runtime
            .start_container(api::StartContainerRequest {
                container_id: id.clone(),
            })
            .await?;
        Ok(Container { sandbox, id })
    }

    /// As edged's view shows it: running, with its runtime id.
    fn pod(&self) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "exec", "namespace": "bench", "uid": "bench-exec"},
            "spec": {"containers": [{"name": "main", "image": IMAGE}]},
            "status": {"containerStatuses": [{
                "name": "main", "image": IMAGE, "imageID": "", "ready": true, "restartCount": 0,
                "containerID": format!("containerd://{}", self.id),
                "state": {"running": {"startedAt": "2026-11-23T00:00:00Z"}},
            }]},
        }))
        .unwrap_or_default()
    }

    async fn stop(self, cri: &Cri) {
        let mut runtime = cri.runtime.clone();
        let _ = runtime
            .stop_pod_sandbox(api::StopPodSandboxRequest {
                pod_sandbox_id: self.sandbox.clone(),
            })
            .await;
        let _ = runtime
            .remove_pod_sandbox(api::RemovePodSandboxRequest {
                pod_sandbox_id: self.sandbox,
            })
            .await;
    }
}
