//! What the process tests share: child processes with their log lines,
//! free ports, polling, edgehivectl, and test nodes whose pods are removed
//! when the test ends.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// A child process whose stdout lines can be awaited.
pub struct Process {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl Process {
    /// Starts `program` with `args`, logging at info.
    pub fn start(program: &str, args: &[&str]) -> Process {
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
    pub fn wait_for(&self, needle: &str, limit: Duration) -> String {
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

    /// The first log line containing any of `needles`, within `limit`.
    pub fn wait_for_any(&self, needles: &[&str], limit: Duration) -> String {
        let deadline = Instant::now() + limit;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) if needles.iter().any(|n| line.contains(n)) => return line,
                Ok(_) => continue,
                Err(_) => panic!("no log line with any of {needles:?} within {limit:?}"),
            }
        }
    }

    /// The log lines that arrived and were not awaited (nor taken) yet.
    pub fn take_lines(&self) -> Vec<String> {
        self.lines.try_iter().collect()
    }

    /// Sends `signal` (`-TERM`, `-KILL`, ...).
    pub fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .args([signal, &self.child.id().to_string()])
            .status()
            .expect("kill");
        assert!(status.success());
    }

    /// SIGTERM, and a clean exit.
    pub fn stop(mut self) {
        self.terminate();
    }

    /// [`Process::stop`], keeping the process's lines to read (a second
    /// call finds the exit already made).
    pub fn terminate(&mut self) {
        if let Ok(Some(status)) = self.child.try_wait() {
            assert!(status.success(), "clean exit on SIGTERM: {status}");
            return;
        }
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

/// A loopback address whose port no concurrent test is handed: these
/// tests stop and start processes on the same ports.
pub use transports::testing::free_address;

/// Polls `check` every 100 ms for up to a minute (for state that only a
/// poll can see, such as a file that a process writes).
pub fn until<T>(what: &str, mut check: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(found) = check() {
            return found;
        }
        assert!(Instant::now() < deadline, "never: {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A fresh directory for one test.
pub fn tempfile_dir(name: &str) -> String {
    let dir =
        std::env::temp_dir().join(format!("edgehive-processes-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    dir.to_string_lossy().into_owned()
}

/// Runs edgehivectl; its exit status, stdout and stderr.
pub fn ctl(admin: &str, args: &[&str]) -> (bool, String, String) {
    outcome(
        Command::new(env!("CARGO_BIN_EXE_e2e-edgehivectl"))
            .arg("--server")
            .arg(admin)
            .args(args),
        "edgehivectl",
    )
}

/// Runs edgehivectl with `--kubeconfig KUBECONFIG` (the environment's
/// `EDGEHIVE_ADMIN` and `EDGEHIVE_KUBECONFIG` set aside); its exit status,
/// stdout and stderr.
pub fn ctl_kubeconfig(kubeconfig: &str, args: &[&str]) -> (bool, String, String) {
    outcome(
        Command::new(env!("CARGO_BIN_EXE_e2e-edgehivectl"))
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .args(args)
            .env_remove("EDGEHIVE_ADMIN")
            .env_remove("EDGEHIVE_KUBECONFIG"),
        "edgehivectl",
    )
}

/// Runs `command` to its end: its exit status, stdout and stderr.
pub fn outcome(command: &mut Command, what: &str) -> (bool, String, String) {
    let out = command.output().expect(what);
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `cloudcore --data-dir CLOUD_DIR token ARGS` (through the admin API at
/// `admin` when given): its exit status, stdout (trimmed) and stderr.
pub fn cloudcore_token(
    cloud_dir: &str,
    admin: Option<&str>,
    args: &[&str],
) -> (bool, String, String) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_e2e-cloudcore"));
    command.args(["--data-dir", cloud_dir, "token"]);
    if let Some(admin) = admin {
        command.args(["--admin", admin]);
    }
    let out = command.args(args).output().expect("cloudcore token");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).trim().to_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `edgecore join` of node `node` (its data in `data_dir`) through the
/// certificate endpoints at `certs`: its exit status and stderr.
pub fn edgecore_join(certs: &str, token: &str, node: &str, data_dir: &str) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_e2e-edgecore"))
        .args(["--data-dir", data_dir, "join", "--certs", certs])
        .args(["--token", token, "--node", node])
        .output()
        .expect("edgecore join");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Joins node `name` (its data in `data_dir`) to the cloud whose data is in
/// `cloud_dir` and whose certificate endpoints are at `certs`, with a fresh
/// token, as a user would: `cloudcore token`, then `edgecore join`.
pub fn join_node(cloud_dir: &str, certs: &str, name: &str, data_dir: &str) {
    let (ok, token, err) = cloudcore_token(cloud_dir, None, &["--ttl-secs", "600"]);
    assert!(ok, "cloudcore token failed: {err}");
    let (ok, err) = edgecore_join(certs, &token, name, data_dir);
    assert!(ok, "edgecore join failed: {err}");
}

/// `<binary> [global...] --data-dir DIR run [flags...]`, with the flags not
/// given filled in from `defaults`: the command line [`CloudcoreRun`] and
/// [`EdgecoreRun`] both build.
#[derive(Debug, Clone)]
struct RunLine {
    global: Vec<String>,
    dir: String,
    run: Vec<String>,
    defaults: &'static [(&'static str, &'static str)],
}

impl RunLine {
    fn new(
        dir: &str,
        run: [&str; 2],
        defaults: &'static [(&'static str, &'static str)],
    ) -> RunLine {
        RunLine {
            global: Vec::new(),
            dir: dir.to_owned(),
            run: run.map(str::to_owned).to_vec(),
            defaults,
        }
    }

    fn and(&mut self, args: &[&str]) {
        self.run.extend(args.iter().map(|a| (*a).to_owned()));
    }

    fn value_of(&self, flag: &str) -> Option<&str> {
        let at = self.run.iter().position(|arg| arg == flag)?;
        self.run.get(at + 1).map(String::as_str)
    }

    fn args(&self) -> Vec<String> {
        let mut args = self.global.clone();
        args.extend(["--data-dir".to_owned(), self.dir.clone(), "run".to_owned()]);
        args.extend(self.run.iter().cloned());
        for (flag, default) in self.defaults {
            if !self.run.iter().any(|arg| arg == flag) {
                args.extend([(*flag).to_owned(), (*default).to_owned()]);
            }
        }
        args
    }

    fn start(&self, binary: &str) -> Process {
        let args = self.args();
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        Process::start(binary, &args)
    }
}

/// `cloudcore run` as every process suite starts it: the one place its
/// command line is spelled. [`CloudcoreRun::new`] names the data directory
/// and the certificate endpoints; cloudhub listens where [`CloudcoreRun::hub`]
/// (or [`CloudcoreRun::kubeedge_hub`]) says; metrics are off unless a
/// `--metrics` is given.
#[derive(Debug, Clone)]
pub struct CloudcoreRun(RunLine);

impl CloudcoreRun {
    /// Its data in `dir`, its certificate endpoints on `certs`.
    pub fn new(dir: &str, certs: &str) -> CloudcoreRun {
        CloudcoreRun(RunLine::new(
            dir,
            ["--certs", certs],
            &[("--metrics", "off")],
        ))
    }

    /// cloudhub's WebSocket, in edgehive's dialect, on `address`.
    pub fn hub(self, address: &str) -> CloudcoreRun {
        self.with("--ws", address)
    }

    /// cloudhub's WebSocket, in KubeEdge's dialect, on `address`.
    pub fn kubeedge_hub(self, address: &str) -> CloudcoreRun {
        self.with("--kubeedge-ws", address)
    }

    /// `flag value` after `run`.
    pub fn with(self, flag: &str, value: &str) -> CloudcoreRun {
        self.and(&[flag, value])
    }

    /// `flag` alone after `run`.
    pub fn flag(self, flag: &str) -> CloudcoreRun {
        self.and(&[flag])
    }

    /// `args` after `run`, as they are.
    pub fn and(mut self, args: &[&str]) -> CloudcoreRun {
        self.0.and(args);
        self
    }

    /// `args` before `run` (`--config FILE`).
    pub fn global(mut self, args: &[&str]) -> CloudcoreRun {
        self.0.global.extend(args.iter().map(|a| (*a).to_owned()));
        self
    }

    /// Its data directory.
    pub fn dir(&self) -> &str {
        &self.0.dir
    }

    /// The value given to `flag` after `run`.
    pub fn value_of(&self, flag: &str) -> Option<&str> {
        self.0.value_of(flag)
    }

    /// The whole command line.
    pub fn args(&self) -> Vec<String> {
        self.0.args()
    }

    /// Starts it.
    pub fn start(&self) -> Process {
        self.0.start(env!("CARGO_BIN_EXE_e2e-cloudcore"))
    }
}

/// `cloudcore run` with its data in `cloud_dir`, cloudhub's WebSocket on
/// `hub` and the certificate endpoints on `certs`, with `extra` arguments;
/// metrics off unless `extra` says otherwise.
pub fn start_cloudcore(cloud_dir: &str, hub: &str, certs: &str, extra: &[&str]) -> Process {
    CloudcoreRun::new(cloud_dir, certs)
        .hub(hub)
        .and(extra)
        .start()
}

/// `edgecore run` as every process suite starts it: the one place its
/// command line is spelled. [`EdgecoreRun::new`] names the node's data
/// directory (a joined node's) and the cloud it links to (one address or
/// several); the local servers it is not given (`--metaserver`,
/// `--edged-server`, `--mqtt-broker`) listen on ports of their own
/// choosing, and metrics are off unless a `--metrics` is given.
#[derive(Debug, Clone)]
pub struct EdgecoreRun(RunLine);

impl EdgecoreRun {
    /// Its data in `dir`, linking to `cloud`.
    pub fn new(dir: &str, cloud: &str) -> EdgecoreRun {
        const DEFAULTS: &[(&str, &str)] = &[
            ("--metaserver", "127.0.0.1:0"),
            ("--edged-server", "127.0.0.1:0"),
            ("--mqtt-broker", "127.0.0.1:0"),
            ("--metrics", "off"),
        ];
        EdgecoreRun(RunLine::new(dir, ["--cloud", cloud], DEFAULTS))
    }

    /// `flag value` after `run`.
    pub fn with(self, flag: &str, value: &str) -> EdgecoreRun {
        self.and(&[flag, value])
    }

    /// `flag` alone after `run`.
    pub fn flag(self, flag: &str) -> EdgecoreRun {
        self.and(&[flag])
    }

    /// `args` after `run`, as they are.
    pub fn and(mut self, args: &[&str]) -> EdgecoreRun {
        self.0.and(args);
        self
    }

    /// The value given to `flag` after `run`.
    pub fn value_of(&self, flag: &str) -> Option<&str> {
        self.0.value_of(flag)
    }

    /// Starts it.
    pub fn start(&self) -> Process {
        self.0.start(env!("CARGO_BIN_EXE_e2e-edgecore"))
    }

    /// Runs it to its end (for a start that must fail): its output.
    pub fn output(&self) -> std::process::Output {
        Command::new(env!("CARGO_BIN_EXE_e2e-edgecore"))
            .args(self.0.args())
            .output()
            .expect("edgecore")
    }
}

/// `edgecore run` of a joined node (`data_dir`) linking to `cloud` (one
/// address or several), with `extra` arguments (see [`EdgecoreRun`]).
pub fn start_edgecore(data_dir: &str, cloud: &str, extra: &[&str]) -> Process {
    EdgecoreRun::new(data_dir, cloud).and(extra).start()
}

/// Gives the cloud in `to_dir` the CA of the one in `from_dir` (replicas
/// of one cloud share a CA).
pub fn share_ca(from_dir: &str, to_dir: &str) {
    std::fs::create_dir_all(to_dir).expect("the replica's data dir");
    let copied = Command::new("cp")
        .args(["-r", &format!("{from_dir}/ca"), &format!("{to_dir}/ca")])
        .status()
        .expect("cp");
    assert!(copied.success(), "the CA copied");
}

/// The containerd socket edged's tests use (`EDGEHIVE_CRI_SOCKET`, else
/// the one `scripts/setup-containerd` starts).
pub use edged::testing::cri_socket;

/// A node for a test that runs pods (`test-<what>-<pid>`, `what` its own
/// among the tests of its file): when it is dropped, also while a failed
/// test unwinds, every pod sandbox of the node is removed from containerd
/// with its containers. Declare it before the edgecore that runs the
/// node's pods: locals are dropped in reverse, so the edge is killed
/// first and cannot start them again.
pub fn test_node(what: &str) -> edged::testing::TestNode {
    edged::testing::TestNode::new(cri_socket(), what)
}

/// `GET /` over HTTP/1.0 from 127.0.0.1:`port` (a forwarded port): the
/// whole answer.
pub fn fetch(port: u16) -> String {
    use std::io::{Read, Write};
    let mut tcp = std::net::TcpStream::connect(("127.0.0.1", port)).expect("the forwarded port");
    tcp.set_read_timeout(Some(Duration::from_secs(20)))
        .expect("timeout");
    tcp.write_all(b"GET / HTTP/1.0\r\n\r\n").expect("request");
    let mut answer = String::new();
    let _ = tcp.read_to_string(&mut answer);
    answer
}
