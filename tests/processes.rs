//! cloudcore and edgecore as separate processes: join with a token, connect
//! with mutual TLS, a frozen edgecore (SIGSTOP) dropped by the cloud within
//! two keepalive intervals, reconnect after SIGCONT, clean SIGTERM.
#![cfg(feature = "cli")]

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const KEEPALIVE_SECS: u64 = 2;

struct Process {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl Process {
    fn start(program: &str, args: &[&str]) -> Process {
        let mut child = Command::new(program)
            .args(args)
            .env("RUST_LOG", "info")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Process { child, lines }
    }

    /// The first log line containing `needle`, within `limit`.
    fn wait_for(&self, needle: &str, limit: Duration) -> String {
        let deadline = Instant::now() + limit;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) if line.contains(needle) => return line,
                Ok(_) => continue,
                Err(_) => panic!("no log line with {needle:?} within {limit:?}"),
            }
        }
    }

    fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .args([signal, &self.child.id().to_string()])
            .status()
            .expect("kill");
        assert!(status.success());
    }

    fn stop(mut self) {
        self.signal("-TERM");
        let status = self.child.wait().expect("wait");
        assert!(status.success(), "clean exit on SIGTERM: {status}");
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

#[test]
fn join_connect_and_a_frozen_edge_is_dropped_then_returns() {
    let cloudcore = env!("CARGO_BIN_EXE_cloudcore");
    let edgecore = env!("CARGO_BIN_EXE_edgecore");
    let dir = tempfile_dir();
    let cloud_dir = format!("{dir}/cloud");
    let edge_dir = format!("{dir}/edge");
    let hub = format!("127.0.0.1:{}", free_port());
    let certs = format!("127.0.0.1:{}", free_port());
    let keepalive = KEEPALIVE_SECS.to_string();

    let cloud = Process::start(
        cloudcore,
        &[
            "--data-dir",
            &cloud_dir,
            "run",
            "--ws",
            &hub,
            "--certs",
            &certs,
            "--keepalive-secs",
            &keepalive,
        ],
    );
    cloud.wait_for("certificate endpoints ready", Duration::from_secs(30));
    let token = Command::new(cloudcore)
        .args(["--data-dir", &cloud_dir, "token", "--ttl-secs", "600"])
        .output()
        .expect("token");
    assert!(token.status.success());
    let token = String::from_utf8(token.stdout)
        .expect("utf8")
        .trim()
        .to_owned();
    let joined = Command::new(edgecore)
        .args([
            "--data-dir",
            &edge_dir,
            "join",
            "--certs",
            &certs,
            "--token",
            &token,
            "--node",
            "edge-1",
        ])
        .status()
        .expect("join");
    assert!(joined.success());

    // From now on edgecore runs without the token.
    let edge = Process::start(
        edgecore,
        &[
            "--data-dir",
            &edge_dir,
            "run",
            "--cloud",
            &hub,
            "--keepalive-secs",
            &keepalive,
        ],
    );
    cloud.wait_for("node connected node=edge-1", Duration::from_secs(30));

    edge.signal("-STOP");
    let frozen = Instant::now();
    cloud.wait_for("no keepalive from the node", Duration::from_secs(30));
    let noticed = frozen.elapsed();
    assert!(
        noticed <= Duration::from_secs(2 * KEEPALIVE_SECS) + Duration::from_millis(500),
        "half-open link noticed after {noticed:?}"
    );
    edge.signal("-CONT");
    cloud.wait_for(
        "node connected node=edge-1 session=2",
        Duration::from_secs(30),
    );

    edge.stop();
    cloud.stop();
}

fn tempfile_dir() -> String {
    let dir = std::env::temp_dir().join(format!("edgehive-processes-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    dir.to_string_lossy().into_owned()
}
