//! edged's local HTTP server (127.0.0.1 by default), as a kubelet's
//! read-only port: `/healthz`, `/pods` (a PodList of what edged runs, with
//! the status it last computed), a container's log,
//! `/containerLogs/{namespace}/{pod}/{container}[?tailLines=N]`, and the
//! resource figures, `/stats/summary` and `/metrics/resource`.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use actix_web::dev::ServerHandle;
use actix_web::{App, HttpResponse, HttpServer, web};
use apis::k8s::{List, Pod};
use serde::Deserialize;
use tracing::{info, warn};

use crate::cri::Cri;
use crate::stats::StatsCollector;

/// The pods edged runs, by `<ns>/<name>`, with their latest status.
pub type PodsView = Arc<RwLock<BTreeMap<String, Pod>>>;

/// The server's default address.
pub const DEFAULT_ADDRESS: &str = "127.0.0.1:10350";

/// A running edged server.
pub struct EdgedServerHandle {
    /// The bound address.
    pub address: SocketAddr,
    server: ServerHandle,
}

impl EdgedServerHandle {
    /// Stops serving.
    pub async fn stop(self) {
        self.server.stop(true).await;
    }
}

struct Shared {
    pods: PodsView,
    cri: Cri,
    root: PathBuf,
    stats: Arc<StatsCollector>,
}

/// Starts the server on `address` (inside an actix System).
pub fn start(
    address: &str,
    pods: PodsView,
    cri: Cri,
    root: PathBuf,
    stats: Arc<StatsCollector>,
) -> std::io::Result<EdgedServerHandle> {
    let shared = web::Data::new(Shared {
        pods,
        cri,
        root,
        stats,
    });
    let server = HttpServer::new(move || {
        App::new()
            .app_data(shared.clone())
            .route("/healthz", web::get().to(healthz))
            .route("/pods", web::get().to(list_pods))
            .route("/stats/summary", web::get().to(summary))
            .route("/metrics/resource", web::get().to(resource_metrics))
            .route(
                "/containerLogs/{namespace}/{pod}/{container}",
                web::get().to(logs),
            )
    })
    .workers(1)
    .disable_signals()
    .shutdown_timeout(1)
    .bind(address)
    .map_err(apis::api::bind_error(address))?;
    let address = server.addrs().first().copied().ok_or_else(|| {
        std::io::Error::new(std::io::ErrorKind::AddrNotAvailable, "no address bound")
    })?;
    let server = server.run();
    let handle = server.handle();
    actix::spawn(async move {
        if let Err(err) = server.await {
            warn!(error = %err, "edged server stopped");
        }
    });
    info!(%address, "edged server listening");
    Ok(EdgedServerHandle {
        address,
        server: handle,
    })
}

async fn healthz(shared: web::Data<Shared>) -> HttpResponse {
    match shared.cri.version().await {
        Ok(_) => HttpResponse::Ok().body("ok"),
        Err(err) => HttpResponse::ServiceUnavailable().body(format!("container runtime: {err}")),
    }
}

async fn list_pods(shared: web::Data<Shared>) -> HttpResponse {
    let items: Vec<Pod> = shared
        .pods
        .read()
        .map(|pods| pods.values().cloned().collect())
        .unwrap_or_default();
    HttpResponse::Ok().json(List::<Pod> {
        items,
        ..List::default()
    })
}

async fn summary(shared: web::Data<Shared>) -> HttpResponse {
    match shared.stats.summary().await {
        Ok(summary) => HttpResponse::Ok().json(summary),
        Err(err) => HttpResponse::ServiceUnavailable().body(err.to_string()),
    }
}

async fn resource_metrics(shared: web::Data<Shared>) -> HttpResponse {
    match shared.stats.summary().await {
        Ok(summary) => HttpResponse::Ok()
            .content_type("text/plain; version=0.0.4")
            .body(crate::stats::resource_metrics(&summary)),
        Err(err) => HttpResponse::ServiceUnavailable().body(err.to_string()),
    }
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct LogQuery {
    tail_lines: Option<usize>,
}

async fn logs(
    shared: web::Data<Shared>,
    path: web::Path<(String, String, String)>,
    query: web::Query<LogQuery>,
) -> HttpResponse {
    let (namespace, pod, container) = path.into_inner();
    let uid = shared.pods.read().ok().and_then(|pods| {
        let pod = pods.get(&format!("{namespace}/{pod}"))?;
        Some(crate::spec::pod_uid(pod))
    });
    let Some(uid) = uid else {
        return HttpResponse::NotFound().body(format!("pod {namespace}/{pod} is not on this node"));
    };
    if container.contains('/') || container.contains("..") {
        return HttpResponse::BadRequest().body("bad container name");
    }
    let dir = shared
        .root
        .join("pods")
        .join(&uid)
        .join("logs")
        .join(&container);
    let Some(file) = latest_log(&dir) else {
        return HttpResponse::NotFound().body(format!("no log of container {container:?}"));
    };
    match tokio::fs::read(&file).await {
        Ok(bytes) => {
            let text = String::from_utf8_lossy(&bytes);
            let lines: Vec<&str> = text.lines().filter_map(message).collect();
            let start = query
                .tail_lines
                .map_or(0, |tail| lines.len().saturating_sub(tail));
            let mut body = lines[start..].join("\n");
            if !body.is_empty() {
                body.push('\n');
            }
            HttpResponse::Ok().content_type("text/plain").body(body)
        }
        Err(err) => HttpResponse::InternalServerError().body(err.to_string()),
    }
}

/// The log of the latest attempt (`<attempt>.log`) in `dir`.
fn latest_log(dir: &Path) -> Option<PathBuf> {
    std::fs::read_dir(dir)
        .ok()?
        .filter_map(|entry| entry.ok())
        .filter_map(|entry| {
            let name = entry.file_name().into_string().ok()?;
            let attempt: u32 = name.strip_suffix(".log")?.parse().ok()?;
            Some((attempt, entry.path()))
        })
        .max_by_key(|(attempt, _)| *attempt)
        .map(|(_, path)| path)
}

/// The message of a CRI log line (`<time> <stream> <tag> <message>`).
fn message(line: &str) -> Option<&str> {
    let mut parts = line.splitn(4, ' ');
    let (_time, _stream, _tag) = (parts.next()?, parts.next()?, parts.next()?);
    Some(parts.next().unwrap_or(""))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cri_log_lines_give_their_message() {
        assert_eq!(
            message("2026-11-22T02:17:34.147230137Z stdout F hello there"),
            Some("hello there")
        );
        assert_eq!(message("2026-11-22T02:17:34Z stderr F "), Some(""));
        assert_eq!(message("garbage"), None);
    }

    #[test]
    fn the_latest_attempt_is_read() {
        let dir = tempfile::tempdir().expect("dir");
        for attempt in [0, 2, 10] {
            std::fs::write(dir.path().join(format!("{attempt}.log")), "x").expect("write");
        }
        std::fs::write(dir.path().join("notes.txt"), "x").expect("write");
        assert_eq!(latest_log(dir.path()), Some(dir.path().join("10.log")));
    }
}
