//! Probes: startup, liveness and readiness, each an exec (CRI ExecSync),
//! an httpGet or a tcpSocket, with Kubernetes' timing fields
//! (initialDelaySeconds, periodSeconds, timeoutSeconds, successThreshold,
//! failureThreshold). Liveness and readiness wait for startup to pass; a
//! failed liveness (or startup) probe has the container killed; readiness
//! decides the container's `ready`.

use std::collections::HashMap;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use apis::k8s::{Container, IntOrString, Probe};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tracing::debug;

use crate::cri::{Cri, api};

/// Which probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ProbeKind {
    /// Gates the other two until it passes.
    Startup,
    /// Failing: the container is killed.
    Liveness,
    /// Decides `ready`.
    Readiness,
}

#[derive(Debug, Default, Clone)]
struct ProbeState {
    successes: i32,
    failures: i32,
    next: Option<Instant>,
    passed: Option<bool>,
}

/// What the probes of one container say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// The container is ready (for traffic).
    pub ready: bool,
    /// The container must be killed, and why.
    pub kill: Option<String>,
    /// When a probe is due next.
    pub next: Option<Instant>,
}

/// The probe states of one pod's containers.
#[derive(Debug, Default)]
pub struct Prober {
    /// By container name: the container id the states belong to, and the
    /// state of each probe.
    states: HashMap<String, (String, HashMap<ProbeKind, ProbeState>)>,
}

/// When a container started, as an `Instant` (CRI gives nanoseconds since
/// the epoch).
fn started_instant(started_at_nanos: i64, now: Instant) -> Instant {
    let since_epoch = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let started = Duration::from_nanos(u64::try_from(started_at_nanos).unwrap_or(0));
    now.checked_sub(since_epoch.saturating_sub(started))
        .unwrap_or(now)
}

impl Prober {
    /// Runs the probes of `container` (running as `id`, started at
    /// `started_at` in CRI nanoseconds) that are due; `host` is the pod's
    /// address for httpGet and tcpSocket.
    pub async fn check(
        &mut self,
        cri: &Cri,
        container: &Container,
        id: &str,
        started_at: i64,
        host: &str,
    ) -> Verdict {
        let now = Instant::now();
        let started = started_instant(started_at, now);
        let entry = self
            .states
            .entry(container.name.clone())
            .or_insert_with(|| (id.to_owned(), HashMap::new()));
        if entry.0 != id {
            // A new container: its probes start over.
            *entry = (id.to_owned(), HashMap::new());
        }
        let states = &mut entry.1;
        let mut next: Option<Instant> = None;
        let mut due_at = |at: Instant| next = Some(next.map_or(at, |n: Instant| n.min(at)));
        let probes = [
            (ProbeKind::Startup, container.startup_probe.as_ref()),
            (ProbeKind::Liveness, container.liveness_probe.as_ref()),
            (ProbeKind::Readiness, container.readiness_probe.as_ref()),
        ];
        let mut started_up = true;
        let mut kill = None;
        let mut ready = true;
        for (kind, probe) in probes {
            let Some(probe) = probe else { continue };
            if kind != ProbeKind::Startup && !started_up {
                ready = false;
                continue;
            }
            let state = states.entry(kind).or_default();
            if kind == ProbeKind::Startup && state.passed == Some(true) {
                // A startup probe that passed is done.
                continue;
            }
            let first = started + seconds(probe.initial_delay_seconds, 0);
            let due = state.next.unwrap_or(first);
            if due <= now {
                let ok = run(cri, probe, container, id, host).await;
                debug!(container = %container.name, ?kind, ok, "probe");
                if ok {
                    state.successes += 1;
                    state.failures = 0;
                } else {
                    state.failures += 1;
                    state.successes = 0;
                }
                let success_threshold = probe.success_threshold.unwrap_or(1).max(1);
                let failure_threshold = probe.failure_threshold.unwrap_or(3).max(1);
                if state.successes >= success_threshold {
                    state.passed = Some(true);
                } else if state.failures >= failure_threshold {
                    state.passed = Some(false);
                }
                state.next = Some(
                    Instant::now() + seconds(probe.period_seconds, 10).max(Duration::from_secs(1)),
                );
            }
            if let Some(at) = state.next.or(Some(first)) {
                due_at(at);
            }
            match kind {
                ProbeKind::Startup => {
                    started_up = state.passed == Some(true);
                    if state.passed == Some(false) {
                        kill = Some("Startup probe failed".to_owned());
                    }
                    ready &= started_up;
                }
                ProbeKind::Liveness => {
                    if state.passed == Some(false) {
                        kill = Some("Liveness probe failed".to_owned());
                    }
                }
                ProbeKind::Readiness => ready &= state.passed == Some(true),
            }
        }
        if kill.is_some() {
            // The next container starts with fresh probes.
            self.states.remove(&container.name);
        }
        Verdict { ready, kill, next }
    }

    /// Forgets a container's probes.
    pub fn forget(&mut self, container: &str) {
        self.states.remove(container);
    }
}

fn seconds(value: Option<i32>, default: u64) -> Duration {
    Duration::from_secs(value.map_or(default, |v| u64::try_from(v).unwrap_or(0)))
}

/// The container port a probe names (a number, or a port's name).
fn port(port: &IntOrString, container: &Container) -> Option<u16> {
    match port {
        IntOrString::Int(number) => u16::try_from(*number).ok(),
        IntOrString::String(name) => container
            .ports
            .iter()
            .flatten()
            .find(|p| p.name.as_deref() == Some(name.as_str()))
            .and_then(|p| u16::try_from(p.container_port).ok()),
    }
}

/// Runs one probe once: whether it passed.
pub async fn run(cri: &Cri, probe: &Probe, container: &Container, id: &str, host: &str) -> bool {
    let timeout = seconds(probe.timeout_seconds, 1).max(Duration::from_secs(1));
    if let Some(exec) = &probe.exec {
        let mut runtime = cri.runtime.clone();
        let answer = runtime
            .exec_sync(api::ExecSyncRequest {
                container_id: id.to_owned(),
                cmd: exec.command.clone().unwrap_or_default(),
                timeout: i64::try_from(timeout.as_secs()).unwrap_or(1),
            })
            .await;
        return answer.is_ok_and(|a| a.into_inner().exit_code == 0);
    }
    if let Some(http) = &probe.http_get {
        let Some(port) = port(&http.port, container) else {
            return false;
        };
        let host = http.host.clone().unwrap_or_else(|| host.to_owned());
        let path = http.path.clone().unwrap_or_else(|| "/".to_owned());
        let get = async {
            let mut stream = tokio::net::TcpStream::connect((host.as_str(), port))
                .await
                .ok()?;
            let request = format!(
                "GET {path} HTTP/1.0\r\nHost: {host}:{port}\r\nUser-Agent: edgehive-probe\r\n\r\n"
            );
            stream.write_all(request.as_bytes()).await.ok()?;
            let mut head = vec![0u8; 64];
            let read = stream.read(&mut head).await.ok()?;
            let line = String::from_utf8_lossy(&head[..read]).into_owned();
            let code: u16 = line.split_whitespace().nth(1)?.parse().ok()?;
            Some((200..400).contains(&code))
        };
        return tokio::time::timeout(timeout, get)
            .await
            .ok()
            .flatten()
            .unwrap_or(false);
    }
    if let Some(tcp) = &probe.tcp_socket {
        let Some(port) = port(&tcp.port, container) else {
            return false;
        };
        let host = tcp.host.clone().unwrap_or_else(|| host.to_owned());
        return tokio::time::timeout(
            timeout,
            tokio::net::TcpStream::connect((host.as_str(), port)),
        )
        .await
        .is_ok_and(|connected| connected.is_ok());
    }
    // A probe of a kind edged does not run (grpc) counts as failing.
    false
}
