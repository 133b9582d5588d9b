//! Streams to edge pods from the cloud, as a user runs them: cloudcore and
//! edgecore as separate processes, a busybox pod on containerd through CRI
//! (`scripts/setup-containerd`), edgehivectl talking to cloudcore's admin
//! API, the bytes going through the node's link. The rig's pods are removed
//! from containerd when the test ends, passed or failed (its test node).

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use edged::testing::TestNode;
use serde_json::Value;
use support::{
    Process, cri_socket, ctl, fetch, free_address, join_node, start_cloudcore, start_edgecore,
    tempfile_dir, test_node, until,
};

mod support;

/// A cloud, an edge linked to it over WebSocket, and a pod `talker` on
/// the edge writing a numbered line every 50 ms.
struct Rig {
    cloud: Process,
    _edge: Process,
    admin: String,
    dir: String,
    node: String,
    /// edged's local server (its kubelet read-only port).
    edged: String,
    /// Last: dropped after the edge, it removes the node's pods.
    _node: TestNode,
}

fn start(name: &str) -> Rig {
    start_with(name, &[])
}

/// [`start`] with more edgecore flags.
fn start_with(name: &str, edge_flags: &[&str]) -> Rig {
    // Declared first: if the rig fails to start, dropped after the edge.
    let node_guard = test_node(&format!("streams-{name}"));
    let node = node_guard.name().to_owned();
    let dir = tempfile_dir(&node);
    let (hub, certs, admin) = (free_address(), free_address(), free_address());
    let (cloud_dir, edge_dir) = (format!("{dir}/cloud"), format!("{dir}/edge"));
    let cloud = start_cloudcore(
        &cloud_dir,
        &hub,
        &certs,
        &[
            "--admin",
            &admin,
            "--admin-insecure",
            "--keepalive-secs",
            "2",
        ],
    );
    cloud.wait_for("certificate endpoints ready", Duration::from_secs(30));
    join_node(&cloud_dir, &certs, &node, &edge_dir);
    let socket = cri_socket().display().to_string();
    let (metaserver, edged, broker) = (free_address(), free_address(), free_address());
    let mut args = vec![
        "--transport",
        "ws",
        "--metaserver",
        &metaserver,
        "--edged-server",
        &edged,
        "--mqtt-broker",
        &broker,
        "--node-ip",
        "127.0.0.1",
        "--keepalive-secs",
        "2",
        "--cri-socket",
        &socket,
    ];
    args.extend_from_slice(edge_flags);
    let edge = start_edgecore(&edge_dir, &hub, &args);
    cloud.wait_for(
        &format!("node connected node={node}"),
        Duration::from_secs(30),
    );
    let manifest = format!(
        "apiVersion: v1
kind: Pod
metadata:
  name: talker
spec:
  nodeName: {node}
  terminationGracePeriodSeconds: 1
  containers:
  - name: talker
    image: 127.0.0.1:5000/busybox:latest
    command: [sh, -c, \"i=0; while true; do echo line $i; i=$((i+1)); sleep 0.05; done\"]
---
apiVersion: v1
kind: Pod
metadata:
  name: web
spec:
  nodeName: {node}
  terminationGracePeriodSeconds: 1
  containers:
  - name: web
    image: 127.0.0.1:5000/busybox:latest
    command: [sh, -c, \"mkdir -p /www && echo hello-from-the-edge > /www/index.html && httpd -p 127.0.0.1:8082 -h /www && exec httpd -f -p 8080 -h /www\"]
---
apiVersion: v1
kind: Pod
metadata:
  name: elsewhere
spec:
  nodeName: a-node-not-linked-here
  containers:
  - name: c
    image: 127.0.0.1:5000/busybox:latest
"
    );
    let file = format!("{dir}/pods.yaml");
    std::fs::write(&file, manifest).expect("manifest");
    let (ok, _, err) = ctl(&admin, &["apply", "-f", &file]);
    assert!(ok, "{err}");
    for pod in ["talker", "web"] {
        until("the pods Running in the cloud's view", || {
            let (ok, out, _) = ctl(&admin, &["get", "pod", pod, "-o", "json"]);
            let pod: Value = ok.then(|| serde_json::from_str(&out).ok()).flatten()?;
            (pod["status"]["phase"] == "Running").then_some(())
        });
    }
    Rig {
        cloud,
        _edge: edge,
        admin,
        dir,
        node,
        edged,
        _node: node_guard,
    }
}

/// The numbers of `line N` lines in `text`.
fn numbers(text: &str) -> Vec<u64> {
    text.lines()
        .filter_map(|line| line.strip_prefix("line ")?.parse().ok())
        .collect()
}

#[test]
fn logs_of_an_edge_pod_from_the_cloud() {
    let rig = start("logs");
    // Enough lines written for a tail.
    until("ten lines in the log", || {
        let (ok, out, _) = ctl(&rig.admin, &["logs", "talker"]);
        (ok && numbers(&out).len() >= 10).then_some(())
    });
    let (ok, out, err) = ctl(&rig.admin, &["logs", "talker", "--tail", "3"]);
    assert!(ok, "{err}");
    let tail = numbers(&out);
    assert_eq!(tail.len(), 3, "{out}");
    assert!(tail.windows(2).all(|w| w[1] == w[0] + 1), "{tail:?}");
    let (ok, out, _) = ctl(
        &rig.admin,
        &["logs", "talker", "--timestamps", "--tail", "1"],
    );
    assert!(ok);
    let stamped = out.trim_end();
    let (time, text) = stamped.split_once(' ').expect("a timestamp, then the line");
    assert!(time.parse::<jiff::Timestamp>().is_ok(), "{stamped}");
    assert!(text.starts_with("line "), "{stamped}");
    let (ok, out, _) = ctl(&rig.admin, &["logs", "talker", "--limit-bytes", "7"]);
    assert!(ok);
    assert_eq!(out, "line 0\n");

    // Followed: the lines keep coming, in order, none missing, until the
    // reader stops (Ctrl-C).
    let mut follow = Command::new(env!("CARGO_BIN_EXE_e2e-edgehivectl"))
        .args([
            "--server", &rig.admin, "logs", "-f", "talker", "--tail", "1",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("edgehivectl logs -f");
    let stdout = follow.stdout.take().expect("stdout");
    let mut lines = BufReader::new(stdout).lines();
    let mut seen = Vec::new();
    while seen.len() < 40 {
        let line = lines
            .next()
            .expect("the followed log goes on")
            .expect("a line");
        seen.extend(numbers(&line));
    }
    assert!(seen.windows(2).all(|w| w[1] == w[0] + 1), "{seen:?}");
    let _ = follow.kill();
    let _ = follow.wait();

    // A pod on a node that is not linked here, a pod that does not exist,
    // a container the pod does not have: clear refusals, exit code 1.
    let (ok, _, err) = ctl(&rig.admin, &["logs", "elsewhere"]);
    assert!(!ok);
    assert!(err.contains("is not linked to this cloud"), "{err}");
    let (ok, _, err) = ctl(&rig.admin, &["logs", "nobody"]);
    assert!(!ok);
    assert!(err.contains("not found"), "{err}");
    let (ok, _, err) = ctl(&rig.admin, &["logs", "talker", "-c", "sidecar"]);
    assert!(!ok);
    assert!(err.contains("container sidecar is not valid"), "{err}");
    let _ = (&rig.dir, &rig.node, &rig.cloud);
}

/// Runs edgehivectl against `admin` with `input` on its standard input
/// and `env` set: its exit code, stdout and stderr.
fn ctl_with(
    admin: &str,
    args: &[&str],
    input: &str,
    env: &[(&str, &str)],
) -> (i32, String, String) {
    with_input(
        Command::new(env!("CARGO_BIN_EXE_e2e-edgehivectl"))
            .arg("--server")
            .arg(admin)
            .args(args)
            .envs(env.iter().copied()),
        input,
    )
}

/// [`ctl_with`] with a terminal as edgehivectl's standard input and
/// output: run under `script` (util-linux), which hands it a pseudo
/// terminal, passes `input` to it and ends with its exit code.
fn ctl_in_terminal(
    admin: &str,
    args: &[&str],
    input: &str,
    env: &[(&str, &str)],
) -> (i32, String, String) {
    let line = std::iter::once(env!("CARGO_BIN_EXE_e2e-edgehivectl"))
        .chain(["--server", admin])
        .chain(args.iter().copied())
        .collect::<Vec<_>>()
        .join(" ");
    with_input(
        Command::new("script")
            .args(["-qec", &line, "/dev/null"])
            .envs(env.iter().copied()),
        input,
    )
}

/// Runs `command` with `input` piped on its standard input (closed after
/// it): its exit code, stdout and stderr.
fn with_input(command: &mut Command, input: &str) -> (i32, String, String) {
    use std::io::Write;
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start");
    let mut stdin = child.stdin.take().expect("stdin");
    stdin.write_all(input.as_bytes()).expect("input");
    drop(stdin);
    let out = child.wait_with_output().expect("the command ends");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn exec_in_an_edge_pod_from_the_cloud() {
    let rig = start("exec");
    // Output on both streams, and the command's exit code as ours.
    let (code, out, err) = ctl_with(
        &rig.admin,
        &[
            "exec",
            "talker",
            "--",
            "sh",
            "-c",
            "echo out; echo err >&2; exit 3",
        ],
        "",
        &[],
    );
    assert_eq!((code, out.as_str(), err.as_str()), (3, "out\n", "err\n"));
    let (code, out, _) = ctl_with(
        &rig.admin,
        &["exec", "talker", "--", "cat", "/etc/hostname"],
        "",
        &[],
    );
    assert_eq!(code, 0);
    assert!(!out.trim().is_empty());

    // A shell with stdin and a terminal (edgehivectl's own standard input
    // a terminal: `script` gives it one), sized 123x45 by the resize sent
    // at the start: it reads its commands and ends with an exit code.
    // (util-linux's `script`, which Debian always has; said when missing.)
    if Command::new("script").arg("--version").output().is_ok() {
        let (code, out, err) = ctl_in_terminal(
            &rig.admin,
            &["exec", "-i", "-t", "talker", "--", "sh"],
            "stty size; exit 4\n",
            &[("COLUMNS", "123"), ("LINES", "45")],
        );
        assert_eq!(code, 4, "{out} {err}");
        assert!(out.contains("45 123"), "the terminal's size: {out:?}");
    } else {
        eprintln!("the terminal case skipped: no util-linux `script` on PATH");
    }
    // Asked for a terminal with piped input, as kubectl it says it cannot
    // use one and goes on without: the command sees the input's end (on a
    // terminal it never would, and this never ended).
    let (code, out, err) = ctl_with(
        &rig.admin,
        &[
            "exec",
            "-i",
            "-t",
            "talker",
            "--",
            "sh",
            "-c",
            "tty; cat >/dev/null; exit 4",
        ],
        "some input\n",
        &[],
    );
    assert_eq!(code, 4, "{out} {err}");
    assert!(out.contains("not a tty"), "{out:?}");
    assert!(
        err.contains("Unable to use a TTY - input is not a terminal or the right kind of file"),
        "{err}"
    );

    // Refusals: a command for no pod, a pod on a node not linked here.
    let (code, _, err) = ctl_with(&rig.admin, &["exec", "nobody", "--", "true"], "", &[]);
    assert_eq!(code, 1);
    assert!(err.contains("not found"), "{err}");
    let (code, _, err) = ctl_with(&rig.admin, &["exec", "elsewhere", "--", "true"], "", &[]);
    assert_eq!(code, 1);
    assert!(err.contains("is not linked to this cloud"), "{err}");
    let _ = (&rig.dir, &rig.node, &rig.cloud);
}

/// Runs edgehivectl against `admin` with `input` piped on its standard
/// input (closed after it): its exit code and stdout, or a failure if it
/// has not ended within `limit` (killed then, so a lost end of input
/// fails the test instead of hanging it).
fn ctl_bounded(admin: &str, args: &[&str], input: Vec<u8>, limit: Duration) -> (i32, Vec<u8>) {
    use std::io::Write;
    let mut child = Command::new(env!("CARGO_BIN_EXE_e2e-edgehivectl"))
        .arg("--server")
        .arg(admin)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("edgehivectl");
    let pid = child.id();
    let mut stdin = child.stdin.take().expect("stdin");
    std::thread::spawn(move || {
        let _ = stdin.write_all(&input);
    });
    let (done, outcome) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = done.send(child.wait_with_output());
    });
    match outcome.recv_timeout(limit) {
        Ok(out) => {
            let out = out.expect("edgehivectl ends");
            let code = out.status.code().unwrap_or(-1);
            if code != 0 {
                eprintln!("stderr: {}", String::from_utf8_lossy(&out.stderr));
            }
            (code, out.stdout)
        }
        Err(_) => {
            let _ = Command::new("kill").arg("-9").arg(pid.to_string()).status();
            panic!(
                "edgehivectl {args:?} did not end within {limit:?} (the end of its input lost?)"
            );
        }
    }
}

/// A command reading its standard input to the end, through the admin API
/// (`v5.channel.k8s.io`, its close of stdin) and edged (SPDY to the
/// runtime, stdin's end a FIN): the command sees the end and exits.
#[test]
fn exec_with_stdin_sees_its_end() {
    let rig = start("stdin");
    let limit = Duration::from_secs(60);
    let input: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();

    let (code, out) = ctl_bounded(
        &rig.admin,
        &["exec", "-i", "talker", "--", "wc", "-c"],
        input.clone(),
        limit,
    );
    assert_eq!((code, String::from_utf8_lossy(&out).trim()), (0, "100000"));

    let (code, out) = ctl_bounded(
        &rig.admin,
        &["exec", "-i", "talker", "--", "cat"],
        input.clone(),
        limit,
    );
    assert_eq!(code, 0);
    assert_eq!(out.len(), input.len());
    assert!(out == input, "cat echoed other bytes than it was given");

    // Nothing at all on stdin: the end alone.
    let (code, out) = ctl_bounded(
        &rig.admin,
        &["exec", "-i", "talker", "--", "cat"],
        Vec::new(),
        limit,
    );
    assert_eq!((code, out.len()), (0, 0));

    // The exit code still comes back once the input is read.
    let (code, out) = ctl_bounded(
        &rig.admin,
        &["exec", "-i", "talker", "--", "sh", "-c", "wc -c; exit 3"],
        b"abc".to_vec(),
        limit,
    );
    assert_eq!((code, String::from_utf8_lossy(&out).trim()), (3, "3"));

    // A command that never reads its input: its exit code still comes
    // back. (The input is kept under the pipes' buffers: a megabyte that
    // `head -c 10` left unread was seen to leave containerd 1.6's exec
    // unanswered, its status never written, so that is not tested here.)
    let (code, _) = ctl_bounded(
        &rig.admin,
        &["exec", "-i", "talker", "--", "sh", "-c", "exit 5"],
        vec![b'x'; 4_000],
        limit,
    );
    assert_eq!(code, 5);
    let _ = (&rig.dir, &rig.node, &rig.cloud);
}

#[test]
fn port_forward_to_an_edge_pods_httpd() {
    let rig = start("port-forward");
    let local = |address: String| {
        address
            .rsplit_once(':')
            .and_then(|(_, port)| port.parse::<u16>().ok())
            .expect("a port")
    };
    let (web, closed, inside) = (
        local(free_address()),
        local(free_address()),
        local(free_address()),
    );
    let mut forward = Command::new(env!("CARGO_BIN_EXE_e2e-edgehivectl"))
        .args(["--server", &rig.admin, "port-forward", "web"])
        .arg(format!("{web}:8080"))
        .arg(format!("{closed}:8081"))
        .arg(format!("{inside}:8082"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("edgehivectl port-forward");
    let mut lines = BufReader::new(forward.stdout.take().expect("stdout")).lines();
    for port in [web, closed, inside] {
        let line = lines.next().expect("a line").expect("stdout");
        assert!(
            line.starts_with(&format!("Forwarding from 127.0.0.1:{port} -> ")),
            "{line}"
        );
    }
    // Several connections, one after another and at once.
    for _ in 0..3 {
        let answer = fetch(web);
        assert!(answer.starts_with("HTTP/1.1 200 OK"), "{answer}");
        assert!(answer.contains("hello-from-the-edge"), "{answer}");
    }
    let at_once: Vec<_> = (0..5)
        .map(|_| std::thread::spawn(move || fetch(web)))
        .collect();
    for answer in at_once {
        assert!(
            answer
                .join()
                .expect("fetch")
                .contains("hello-from-the-edge")
        );
    }
    // Nothing listens on 8081 in the pod: the connection ends, empty.
    assert_eq!(fetch(closed), "");
    // A server bound to the pod's own loopback, reached inside the pod's
    // network namespace (the runtime's port-forward).
    let answer = fetch(inside);
    if !answer.contains("hello-from-the-edge") {
        let _ = forward.kill();
        let mut err = String::new();
        let _ =
            std::io::Read::read_to_string(&mut forward.stderr.take().expect("stderr"), &mut err);
        panic!("{answer:?}: {err}");
    }
    let _ = forward.kill();
    let _ = forward.wait();
    let _ = (&rig.dir, &rig.node, &rig.cloud);
}

/// The talker's log files on the edge: (name, size), sorted.
fn log_files(rig: &Rig, uid: &str) -> Vec<(String, u64)> {
    let dir = format!("{}/edge/edged/pods/{uid}/logs/talker", rig.dir);
    let mut files: Vec<(String, u64)> = std::fs::read_dir(&dir)
        .map(|entries| {
            entries
                .filter_map(|entry| {
                    let entry = entry.ok()?;
                    let size = entry.metadata().ok()?.len();
                    Some((entry.file_name().into_string().ok()?, size))
                })
                .collect()
        })
        .unwrap_or_default();
    files.sort();
    files
}

/// Logs rotate by size and count (1 KiB, 3 files here), and a followed
/// log goes on across the rotations: every line once, in order.
#[test]
fn a_followed_log_goes_on_across_rotations() {
    let rig = start_with(
        "rotation",
        &[
            "--container-log-max-size",
            "1Ki",
            "--container-log-max-files",
            "3",
        ],
    );
    let (ok, out, _) = ctl(&rig.admin, &["get", "pod", "talker", "-o", "json"]);
    assert!(ok);
    let pod: Value = serde_json::from_str(&out).expect("json");
    let uid = pod["metadata"]["uid"].as_str().expect("uid").to_owned();
    let mut follow = Command::new(env!("CARGO_BIN_EXE_e2e-edgehivectl"))
        .args(["--server", &rig.admin, "logs", "-f", "talker"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("edgehivectl logs -f");
    let mut lines = BufReader::new(follow.stdout.take().expect("stdout")).lines();
    let mut seen = Vec::new();
    let mut rotated = std::collections::BTreeSet::new();
    let mut most_files = 0;
    // Until the log was rotated three times (so the oldest was deleted),
    // looking at the files between lines.
    while rotated.len() < 3 {
        let line = lines
            .next()
            .expect("the followed log goes on")
            .expect("a line");
        seen.extend(numbers(&line));
        let files = log_files(&rig, &uid);
        most_files = most_files.max(files.len());
        rotated.extend(
            files
                .into_iter()
                .map(|(name, _)| name)
                .filter(|name| name != "0.log"),
        );
    }
    // A few lines after the last rotation.
    for _ in 0..20 {
        let line = lines
            .next()
            .expect("the followed log goes on")
            .expect("a line");
        seen.extend(numbers(&line));
    }
    let _ = follow.kill();
    let _ = follow.wait();
    assert_eq!(seen.first(), Some(&0));
    assert!(
        seen.windows(2).all(|w| w[1] == w[0] + 1),
        "every line once, in order, across {} rotations: {seen:?}",
        rotated.len()
    );
    assert!(most_files <= 3, "at most 3 files kept, saw {most_files}");
    let files = log_files(&rig, &uid);
    assert!(files.len() <= 3, "{files:?}");
    println!(
        "rotation: {} lines followed across {} rotations; files now {files:?}",
        seen.len(),
        rotated.len()
    );
    let _ = (&rig.node, &rig.cloud);
}

/// Attached to the talker's main process: its output as it writes it.
#[test]
fn attach_to_an_edge_pods_main_process() {
    let rig = start("attach");
    let mut attached = Command::new(env!("CARGO_BIN_EXE_e2e-edgehivectl"))
        .args(["--server", &rig.admin, "attach", "talker"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("edgehivectl attach");
    let mut lines = BufReader::new(attached.stdout.take().expect("stdout")).lines();
    let mut seen = Vec::new();
    while seen.len() < 20 {
        let line = lines.next().expect("the output goes on").expect("a line");
        seen.extend(numbers(&line));
    }
    assert!(seen.windows(2).all(|w| w[1] == w[0] + 1), "{seen:?}");
    let _ = attached.kill();
    let _ = attached.wait();
    // A pod on a node not linked here.
    let (code, _, err) = ctl_with(&rig.admin, &["attach", "elsewhere"], "", &[]);
    assert_eq!(code, 1);
    assert!(err.contains("is not linked to this cloud"), "{err}");
    let _ = (&rig.dir, &rig.node, &rig.cloud);
}

/// A plain HTTP GET of `path` from `address`: the body of a 200.
fn http_get(address: &str, path: &str) -> Option<String> {
    use std::io::{Read, Write};
    let mut tcp = std::net::TcpStream::connect(address).ok()?;
    tcp.set_read_timeout(Some(Duration::from_secs(20))).ok()?;
    tcp.write_all(format!("GET {path} HTTP/1.0\r\nHost: {address}\r\n\r\n").as_bytes())
        .ok()?;
    let mut answer = String::new();
    tcp.read_to_string(&mut answer).ok()?;
    let (head, body) = answer.split_once("\r\n\r\n")?;
    let ok = head.starts_with("HTTP/1.") && head.get(8..13) == Some(" 200 ");
    ok.then(|| body.to_owned())
}

/// The millicores in a `top` line's CPU column (`123m`).
fn millicores_of(line: &str) -> Option<u64> {
    line.split_whitespace()
        .find_map(|cell| cell.strip_suffix('m')?.parse().ok())
}

#[test]
fn top_shows_what_edge_pods_and_nodes_use() {
    let rig = start("top");
    // A container that burns CPU.
    let file = format!("{}/burner.yaml", rig.dir);
    let manifest = format!(
        "apiVersion: v1
kind: Pod
metadata:
  name: burner
  labels:
    app: burner
spec:
  nodeName: {}
  terminationGracePeriodSeconds: 1
  # The edge's containers outlive the test's edgecore (as an edge's pods
  # outlive edgecore): the burner stops itself after 3 minutes, so none is
  # left to slow the tests after it.
  restartPolicy: Never
  containers:
  - name: burner
    image: 127.0.0.1:5000/busybox:latest
    command: [timeout, \"180\", sh, -c, \"while true; do :; done\"]
",
        rig.node
    );
    std::fs::write(&file, manifest).expect("manifest");
    let (ok, _, err) = ctl(&rig.admin, &["apply", "-f", &file]);
    assert!(ok, "{err}");

    // edgehivectl top pods: the burner near a core, read from containerd's
    // figures through the node's link; the idle web server near none.
    let top = until("the burner's CPU in top", || {
        let (ok, out, _) = ctl(&rig.admin, &["top", "pods"]);
        let line = out.lines().find(|l| l.starts_with("burner "))?.to_owned();
        // A core's share on a shared 2-core machine: well above idle.
        (ok && millicores_of(&line)? >= 100).then_some(out)
    });
    println!("edgehivectl top pods:\n{top}");
    assert!(top.starts_with("NAME"), "{top}");
    let web = top
        .lines()
        .find(|l| l.starts_with("web "))
        .expect("web in top");
    assert!(millicores_of(web).is_some_and(|m| m < 50), "{top}");
    let (ok, containers, err) = ctl(&rig.admin, &["top", "pod", "burner", "--containers"]);
    assert!(
        ok && containers.contains("burner   burner"),
        "{containers}{err}"
    );

    // By label: the burner alone; a selector nothing matches, nothing.
    let (ok, selected, err) = ctl(&rig.admin, &["top", "pods", "-l", "app=burner"]);
    assert!(ok, "{err}");
    let names: Vec<&str> = selected
        .lines()
        .skip(1)
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert_eq!(names, ["burner"], "{selected}");
    let (ok, _, err) = ctl(&rig.admin, &["top", "pods", "-l", "app in (nothing)"]);
    assert!(!ok && err.contains("No resources found"), "{err}");
    let (ok, _, err) = ctl(&rig.admin, &["top", "pods", "-l", "app in nothing"]);
    assert!(!ok && err.contains("label selector"), "{err}");
    let (ok, listed, err) = ctl(&rig.admin, &["get", "pods", "-l", "app=burner"]);
    assert!(ok, "{err}");
    assert_eq!(listed.lines().count(), 2, "{listed}");
    assert!(
        listed
            .lines()
            .nth(1)
            .is_some_and(|l| l.starts_with("burner ")),
        "{listed}"
    );

    // edgehivectl top nodes: the node, with memory in use (its CPU rate
    // needs two samples a second apart: "not available yet" before).
    let nodes = until("the node in top nodes", || {
        let (ok, nodes, _) = ctl(&rig.admin, &["top", "nodes"]);
        (ok && nodes.lines().any(|l| l.starts_with(&rig.node))).then_some(nodes)
    });
    println!("edgehivectl top nodes:\n{nodes}");
    let line = nodes
        .lines()
        .find(|l| l.starts_with(&rig.node))
        .unwrap_or("");
    assert!(!line.contains(" 0Mi"), "{nodes}");

    // A pod on a node not linked here has no figures.
    let (ok, _, err) = ctl(&rig.admin, &["top", "pod", "elsewhere"]);
    assert!(!ok && err.contains("not linked"), "{err}");

    // The kubelet's own endpoints at the edge, as metrics-server reads them.
    let summary: Value =
        serde_json::from_str(&http_get(&rig.edged, "/stats/summary").expect("summary"))
            .expect("summary JSON");
    assert_eq!(summary["node"]["nodeName"], rig.node.as_str());
    let burner = summary["pods"]
        .as_array()
        .and_then(|pods| pods.iter().find(|p| p["podRef"]["name"] == "burner"))
        .expect("the burner in the summary");
    assert!(
        burner["cpu"]["usageCoreNanoSeconds"]
            .as_u64()
            .is_some_and(|n| n > 0),
        "{burner}"
    );
    assert!(
        burner["memory"]["workingSetBytes"]
            .as_u64()
            .is_some_and(|n| n > 0),
        "{burner}"
    );
    let metrics = http_get(&rig.edged, "/metrics/resource").expect("resource metrics");
    for family in [
        "node_cpu_usage_seconds_total",
        "node_memory_working_set_bytes",
        "container_cpu_usage_seconds_total{container=\"burner\",namespace=\"default\",pod=\"burner\"}",
        "pod_memory_working_set_bytes{namespace=\"default\",pod=\"burner\"}",
    ] {
        assert!(
            metrics.lines().any(|l| l.starts_with(family)),
            "{family} not in\n{metrics}"
        );
    }
}

/// The run number in a `run N` log.
fn run_of(text: &str) -> Option<u64> {
    text.lines()
        .find_map(|line| line.strip_prefix("run ")?.trim().parse().ok())
}

#[test]
fn the_previous_run_of_a_restarted_container_has_its_own_log() {
    let rig = start("previous");
    // Each run counts itself in an emptyDir (kept across restarts), says
    // its number, and fails a moment later.
    let file = format!("{}/counter.yaml", rig.dir);
    let manifest = format!(
        "apiVersion: v1
kind: Pod
metadata:
  name: counter
spec:
  nodeName: {}
  terminationGracePeriodSeconds: 1
  containers:
  - name: counter
    image: 127.0.0.1:5000/busybox:latest
    command: [sh, -c, \"n=$(cat /data/n 2>/dev/null || echo 0); n=$((n+1)); echo $n > /data/n; echo run $n; sleep 2; exit 1\"]
    volumeMounts:
    - name: data
      mountPath: /data
  volumes:
  - name: data
    emptyDir: {{}}
",
        rig.node
    );
    std::fs::write(&file, manifest).expect("manifest");
    let (ok, _, err) = ctl(&rig.admin, &["apply", "-f", &file]);
    assert!(ok, "{err}");
    // Once it has restarted: --previous is the run before the current one.
    let (previous, current) = until("a restart, and both runs' logs", || {
        let (ok, current, _) = ctl(&rig.admin, &["logs", "counter"]);
        let (was, previous, _) = ctl(&rig.admin, &["logs", "counter", "--previous"]);
        let (current, previous) = (run_of(&current)?, run_of(&previous)?);
        (ok && was && current >= 2 && previous + 1 == current).then_some((previous, current))
    });
    println!("logs --previous: run {previous}; logs: run {current}");
    // A container that never restarted has no previous run.
    let (ok, _, err) = ctl(&rig.admin, &["logs", "web", "--previous"]);
    assert!(!ok, "{err}");
}

/// The real kubectl (when the machine has one) reaches an edge pod's log
/// and runs a command in it through the standalone cloud's admin API, as
/// it would through kube-apiserver and a kubelet.
#[test]
fn kubectl_logs_and_exec_reach_an_edge_pod() {
    // kubectl 1.30 and later run exec over WebSocket (v5.channel.k8s.io),
    // what the admin API serves; older ones speak SPDY.
    let minor = Command::new("kubectl")
        .args(["version", "--client", "-o", "json"])
        .output()
        .ok()
        .and_then(|out| serde_json::from_slice::<Value>(&out.stdout).ok())
        .and_then(|version| {
            version["clientVersion"]["minor"]
                .as_str()?
                .trim_end_matches('+')
                .parse::<u32>()
                .ok()
        });
    if minor.is_none_or(|minor| minor < 30) {
        eprintln!("skipped: no kubectl 1.30 or later on PATH (found minor {minor:?})");
        return;
    }
    let rig = start("kubectl");
    let kubeconfig = format!("{}/plain.kubeconfig", rig.dir);
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {{server: \"http://{}\"}}\n\
             users:\n- name: u\n  user: {{}}\ncontexts:\n- name: x\n  context: {{cluster: c, user: u}}\n\
             current-context: x\n",
            rig.admin
        ),
    )
    .expect("kubeconfig");
    let kubectl = |args: &[&str]| {
        let out = Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("kubectl");
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    until("lines in the log, through kubectl", || {
        let (code, out, _) = kubectl(&["logs", "talker", "--tail", "2"]);
        (code == 0 && numbers(&out).len() == 2).then_some(())
    });
    let (code, out, err) = kubectl(&["exec", "talker", "--", "sh", "-c", "echo hi; exit 3"]);
    assert_eq!((code, out.as_str()), (3, "hi\n"), "{err}");
    let _ = (&rig.cloud, &rig.node, &rig.edged);
}
