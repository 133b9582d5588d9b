//! A real etcd cluster for tests: members as child processes of Debian's
//! `etcd` (package etcd-server), on loopback ports below the ephemeral
//! range, each with its own data directory.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::Etcd;

/// One member.
struct Member {
    name: String,
    client: String,
    peer: String,
    process: Option<Child>,
}

/// A cluster of members on loopback; killed when dropped.
pub struct Cluster {
    members: Vec<Member>,
    dir: tempfile::TempDir,
}

impl Cluster {
    /// Starts `size` members and waits until the cluster answers.
    pub async fn start(size: usize) -> Cluster {
        let dir = tempfile::tempdir().expect("a data directory");
        let members: Vec<Member> = (0..size)
            .map(|i| Member {
                name: format!("m{i}"),
                client: transports::testing::free_address(),
                peer: transports::testing::free_address(),
                process: None,
            })
            .collect();
        let mut cluster = Cluster { members, dir };
        for i in 0..size {
            cluster.launch(i, "new");
        }
        cluster.wait_ready().await;
        cluster
    }

    fn launch(&mut self, i: usize, state: &str) {
        let initial: Vec<String> = self
            .members
            .iter()
            .map(|m| format!("{}=http://{}", m.name, m.peer))
            .collect();
        let member = &self.members[i];
        let data = self.dir.path().join(&member.name);
        let child = Command::new("etcd")
            .args(["--name", &member.name])
            .arg("--data-dir")
            .arg(&data)
            .args(["--listen-client-urls", &format!("http://{}", member.client)])
            .args([
                "--advertise-client-urls",
                &format!("http://{}", member.client),
            ])
            .args(["--listen-peer-urls", &format!("http://{}", member.peer)])
            .args([
                "--initial-advertise-peer-urls",
                &format!("http://{}", member.peer),
            ])
            .args(["--initial-cluster", &initial.join(",")])
            .args(["--initial-cluster-state", state])
            .args(["--initial-cluster-token", "edgehive-test"])
            // Fast elections on loopback.
            .args(["--heartbeat-interval", "50", "--election-timeout", "500"])
            .args(["--log-level", "error", "--logger", "zap"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("etcd on the PATH (Debian's etcd-server; ./scripts/setup-host installs it)");
        self.members[i].process = Some(child);
    }

    /// The members' client URLs.
    pub fn endpoints(&self) -> Vec<String> {
        self.members
            .iter()
            .map(|m| format!("http://{}", m.client))
            .collect()
    }

    /// A client of every member.
    pub fn client(&self) -> Etcd {
        Etcd::connect(&self.endpoints()).expect("endpoints")
    }

    /// Waits until a write goes through (a leader is elected). etcd tells
    /// no one when it is ready: asking is the only way.
    pub async fn wait_ready(&self) {
        let client = self.client();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            match client.put(b"/edgehive-test/ready", b"1".to_vec(), 0).await {
                Ok(_) => return,
                Err(err) if tokio::time::Instant::now() < deadline => {
                    let _ = err;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(err) => panic!("etcd cluster not ready: {err}"),
            }
        }
    }

    /// SIGKILLs member `i`.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut child) = self.members[i].process.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Sends member `i` `signal` (`-STOP` freezes it: a member stalled,
    /// not down, which answers nothing; `-CONT` wakes it).
    pub fn signal(&self, i: usize, signal: &str) {
        if let Some(child) = &self.members[i].process {
            let status = Command::new("kill")
                .args([signal, &child.id().to_string()])
                .status()
                .expect("kill");
            assert!(status.success(), "kill {signal} member {i}");
        }
    }

    /// Starts member `i` again on its data directory.
    pub fn restart(&mut self, i: usize) {
        self.kill(i);
        self.launch(i, "existing");
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for i in 0..self.members.len() {
            // A frozen member is woken, so it dies of the kill.
            self.signal(i, "-CONT");
            self.kill(i);
        }
    }
}
