//! The real `kubectl` against a standalone cloudcore, with the admin
//! kubeconfig cloudcore writes: discovery (`version`, `api-resources`),
//! `get` as tables (`-o wide`, `--show-labels`, `-A`, several kinds at
//! once, `all`), `-o name|yaml|jsonpath`, `get -w` seeing an update, `delete -l`,
//! and a NotFound. kubectl is the machine's (`kubectl` on PATH); without
//! one the test says so and checks nothing.

use std::io::{BufRead as _, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use support::{ctl_kubeconfig, free_address, outcome, start_cloudcore, tempfile_dir};

mod support;

/// `kubectl --kubeconfig KUBECONFIG ARGS`, its discovery cache beside the
/// kubeconfig (kubectl keys it by host and port, which tests reuse):
/// success, stdout, stderr.
fn kubectl(kubeconfig: &str, args: &[&str]) -> (bool, String, String) {
    outcome(
        Command::new("kubectl")
            .args(kubectl_flags(kubeconfig))
            .args(args),
        "kubectl",
    )
}

fn kubectl_flags(kubeconfig: &str) -> [String; 4] {
    [
        "--kubeconfig".to_owned(),
        kubeconfig.to_owned(),
        "--cache-dir".to_owned(),
        format!("{kubeconfig}.cache"),
    ]
}

/// The next line a child printed, within `limit` (a failure, not a hang).
fn next_line(lines: &std::sync::mpsc::Receiver<String>, what: &str) -> String {
    lines
        .recv_timeout(Duration::from_secs(30))
        .unwrap_or_else(|_| panic!("no {what} from kubectl within 30 s"))
}

fn manifest(image: &str, value: &str) -> String {
    format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: demo, labels: {{app: demo}}}}\n\
         data: {{a: \"{value}\"}}\n---\n\
         apiVersion: v1\nkind: Pod\nmetadata: {{name: web, labels: {{app: demo}}}}\n\
         spec:\n  nodeName: edge-k\n  containers: [{{name: c, image: {image}}}]\n"
    )
}

/// A pod no selector of the test selects, at `image`.
fn other(image: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: other, labels: {{app: other}}}}\n\
         spec:\n  nodeName: edge-k\n  containers: [{{name: c, image: {image}}}]\n"
    )
}

#[test]
fn kubectl_reads_and_watches_the_standalone_cloud() {
    if Command::new("kubectl")
        .arg("version")
        .arg("--client")
        .output()
        .is_err()
    {
        eprintln!("skipped: no kubectl on PATH");
        return;
    }
    let dir = tempfile_dir("kubectl");
    let cloud_dir = format!("{dir}/cloud");
    let (hub, certs, admin) = (free_address(), free_address(), free_address());
    let cloud = start_cloudcore(&cloud_dir, &hub, &certs, &["--admin", &admin]);
    cloud.wait_for("admin API ready", Duration::from_secs(30));
    let kubeconfig = format!("{cloud_dir}/admin.kubeconfig");

    // Discovery.
    let (ok, out, err) = kubectl(&kubeconfig, &["version"]);
    assert!(
        ok && out.contains("Server Version: v1.34.0-edgehive"),
        "{out} {err}"
    );
    let (ok, out, err) = kubectl(&kubeconfig, &["api-resources"]);
    assert!(ok, "{err}");
    for resource in [
        "pods ",
        "configmaps ",
        "nodes ",
        "devices ",
        "devicemodels ",
    ] {
        assert!(out.contains(resource), "{resource} in {out}");
    }

    let file = format!("{dir}/demo.yaml");
    std::fs::write(&file, manifest("busybox:1.36", "1")).expect("manifest");
    let other_file = format!("{dir}/other.yaml");
    std::fs::write(&other_file, other("busybox:1.36")).expect("manifest");
    let (ok, _, err) = ctl_kubeconfig(&kubeconfig, &["apply", "-f", &other_file]);
    assert!(ok, "{err}");
    let (ok, _, err) = ctl_kubeconfig(&kubeconfig, &["apply", "-f", &file]);
    assert!(ok, "{err}");

    // Tables, as kube-apiserver's.
    let (ok, out, err) = kubectl(&kubeconfig, &["get", "cm,pods"]);
    assert!(ok, "{err}");
    assert!(out.contains("NAME             DATA   AGE"), "{out}");
    assert!(out.contains("configmap/demo   1"), "{out}");
    let header = out
        .lines()
        .find(|line| line.contains("READY"))
        .unwrap_or_default();
    assert!(
        header
            .split_whitespace()
            .eq(["NAME", "READY", "STATUS", "RESTARTS", "AGE"]),
        "{out}"
    );
    let (ok, out, _) = kubectl(
        &kubeconfig,
        &["get", "pods", "-o", "wide", "-A", "--show-labels"],
    );
    assert!(ok);
    let row = out
        .lines()
        .find(|line| line.contains("web"))
        .unwrap_or_default();
    assert!(
        row.starts_with("default") && row.contains("edge-k") && row.ends_with("app=demo"),
        "{out}"
    );
    let (_, out, _) = kubectl(
        &kubeconfig,
        &["get", "pods", "-o", "name", "-l", "app=demo"],
    );
    assert_eq!(out.trim(), "pod/web");
    let (_, out, _) = kubectl(
        &kubeconfig,
        &[
            "get",
            "pods",
            "-o",
            "name",
            "--field-selector",
            "metadata.name=other",
        ],
    );
    assert_eq!(out.trim(), "pod/other");
    let (ok, out, err) = kubectl(&kubeconfig, &["get", "all"]);
    assert!(ok && out.contains("pod/web"), "{out} {err}");
    let (_, out, _) = kubectl(
        &kubeconfig,
        &[
            "-n",
            "default",
            "get",
            "pod",
            "web",
            "-o",
            "jsonpath={.spec.nodeName}",
        ],
    );
    assert_eq!(out, "edge-k");
    let (_, out, _) = kubectl(&kubeconfig, &["get", "cm", "demo", "-o", "yaml"]);
    assert!(
        out.contains("a: \"1\"") && out.contains("kind: ConfigMap"),
        "{out}"
    );

    // -w: the table, then a row per change.
    // `get NAME -w` watches that name alone (a field selector).
    let mut watch = Command::new("kubectl")
        .args(kubectl_flags(&kubeconfig))
        .args(["get", "pods", "web", "-w"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("kubectl get -w");
    let stdout = watch.stdout.take().expect("stdout");
    let (sender, lines) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if sender.send(line).is_err() {
                break;
            }
        }
    });
    let first = next_line(&lines, "table header");
    assert!(first.starts_with("NAME"), "{first}");
    let listed = next_line(&lines, "row of the listed pod");
    assert!(listed.starts_with("web"), "{listed}");
    std::fs::write(&file, manifest("busybox:1.37", "2")).expect("manifest");
    let (ok, _, err) = ctl_kubeconfig(&kubeconfig, &["apply", "-f", &file]);
    assert!(ok, "{err}");
    let changed = next_line(&lines, "row of the changed pod");
    assert!(changed.starts_with("web"), "{changed}");
    // Another pod's change is not web's: the next row is web's next one.
    std::fs::write(&other_file, other("busybox:1.37")).expect("manifest");
    let (ok, _, err) = ctl_kubeconfig(&kubeconfig, &["apply", "-f", &other_file]);
    assert!(ok, "{err}");
    std::fs::write(&file, manifest("busybox:1.38", "3")).expect("manifest");
    let (ok, _, err) = ctl_kubeconfig(&kubeconfig, &["apply", "-f", &file]);
    assert!(ok, "{err}");
    let changed = next_line(&lines, "row of the pod changed again");
    assert!(changed.starts_with("web"), "{changed}");
    let _ = watch.kill();
    let _ = watch.wait();
    let (_, out, _) = kubectl(
        &kubeconfig,
        &[
            "get",
            "pod",
            "web",
            "-o",
            "jsonpath={.spec.containers[0].image}",
        ],
    );
    assert_eq!(out, "busybox:1.38");

    // delete -l, then nothing; a name that is not there.
    let (ok, out, err) = kubectl(&kubeconfig, &["delete", "cm,pods", "-l", "app=demo"]);
    assert!(ok, "{err}");
    assert!(
        out.contains("configmap \"demo\" deleted")
            && out.contains("pod \"web\" deleted")
            && !out.contains("other"),
        "{out}"
    );
    let (ok, out, err) = kubectl(&kubeconfig, &["get", "cm,pods", "-l", "app=demo"]);
    assert!(
        ok && out.is_empty() && err.contains("No resources found"),
        "{out} {err}"
    );
    let (_, out, _) = kubectl(&kubeconfig, &["get", "pods", "-o", "name"]);
    assert_eq!(out.trim(), "pod/other");
    let (ok, _, err) = kubectl(
        &kubeconfig,
        &["get", "pods", "--field-selector", "spec.foo=x"],
    );
    assert!(
        !ok && err.contains("field label not supported: spec.foo"),
        "{err}"
    );
    let (ok, _, err) = kubectl(&kubeconfig, &["get", "pod", "web"]);
    assert!(!ok && err.contains("(NotFound)"), "{err}");
    drop(cloud);
}
