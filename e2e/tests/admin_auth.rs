//! The admin API with authentication, as a user meets it: cloudcore over
//! HTTPS writing its admin's kubeconfig at first start, edgehivectl
//! reading kubeconfigs (client certificates, bearer tokens), a viewer
//! refused what it may not do (403), strangers refused (401), a pod on
//! containerd through CRI at an edge for the logs and exec (removed from
//! containerd when the test ends, passed or failed: its test node).

use std::process::Command;
use std::time::Duration;

use cloud::AdminClient;
use cloud::admin_client::kubeconfig::{AuthInfo, Kubeconfig, NamedUser};
use serde_json::Value;
use support::{
    cri_socket, free_address, join_node, start_cloudcore, start_edgecore, tempfile_dir, test_node,
    until,
};

mod support;

/// Runs edgehivectl with `kubeconfig`; its exit status, stdout, stderr.
fn ctl(kubeconfig: &str, args: &[&str]) -> (bool, String, String) {
    support::ctl_kubeconfig(kubeconfig, args)
}

/// A request with `kubeconfig`'s credentials: the status code and the
/// body (JSON).
fn raw(kubeconfig: &str, method: &str, path: &str) -> (u16, Value) {
    let credentials = Kubeconfig::load(kubeconfig.as_ref()).expect("kubeconfig");
    let client = AdminClient::from_credentials(&credentials, None).expect("client");
    let method = method.parse().expect("method");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let (code, body) = runtime
        .block_on(client.raw(method, path, None))
        .expect("an answer");
    (code, serde_json::from_slice(&body).unwrap_or(Value::Null))
}

/// `kubeconfig` with its user replaced by `user` (none: no credentials),
/// written to `dir/name`.
fn with_user(kubeconfig: &str, user: Option<AuthInfo>, dir: &str, name: &str) -> String {
    let text = std::fs::read_to_string(kubeconfig).expect("kubeconfig");
    let mut config = Kubeconfig::parse(&text).expect("parses");
    let context = &mut config.contexts[0].context;
    match user {
        Some(user) => {
            context.user = name.to_owned();
            config.users = vec![NamedUser {
                name: name.to_owned(),
                user,
            }];
        }
        None => {
            context.user.clear();
            config.users.clear();
        }
    }
    let path = format!("{dir}/{name}.kubeconfig");
    std::fs::write(&path, config.to_yaml().expect("yaml")).expect("write");
    path
}

fn token(token: &str) -> Option<AuthInfo> {
    Some(AuthInfo {
        token: Some(token.to_owned()),
        ..AuthInfo::default()
    })
}

#[test]
fn the_admin_api_knows_its_callers_and_their_roles() {
    // Declared first, dropped last: after the edge, its pods are removed.
    let node_guard = test_node("adminauth");
    let node = node_guard.name().to_owned();
    let dir = tempfile_dir("adminauth");
    let (hub, certs, admin) = (free_address(), free_address(), free_address());
    let (cloud_dir, edge_dir) = (format!("{dir}/cloud"), format!("{dir}/edge"));
    let tokens = format!("{dir}/tokens.csv");
    std::fs::write(
        &tokens,
        "alice-token,alice,1,\"edgehive:admins\"\ncarol-token,carol,2,\"edgehive:viewers,other\"\n",
    )
    .expect("tokens");
    let cloud = start_cloudcore(
        &cloud_dir,
        &hub,
        &certs,
        &[
            "--admin",
            &admin,
            "--admin-token-file",
            &tokens,
            "--keepalive-secs",
            "2",
        ],
    );
    cloud.wait_for("admin API ready", Duration::from_secs(30));

    // The admin's kubeconfig, written at first start for its owner only.
    let kubeconfig = format!("{cloud_dir}/admin.kubeconfig");
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(&kubeconfig)
            .expect("admin.kubeconfig")
            .permissions(),
    );
    assert_eq!(mode & 0o777, 0o600);

    join_node(&cloud_dir, &certs, &node, &edge_dir);
    let socket = cri_socket().display().to_string();
    let (metaserver, edged, broker) = (free_address(), free_address(), free_address());
    let _edge = start_edgecore(
        &edge_dir,
        &hub,
        &[
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
        ],
    );
    cloud.wait_for(
        &format!("node connected node={node}"),
        Duration::from_secs(30),
    );

    // The admin: apply, get, logs, exec (a WebSocket over TLS).
    let manifest = format!("{dir}/talker.yaml");
    std::fs::write(
        &manifest,
        format!(
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
    command: [sh, -c, \"i=0; while true; do echo line $i; i=$((i+1)); sleep 0.1; done\"]
"
        ),
    )
    .expect("manifest");
    let (ok, out, err) = ctl(&kubeconfig, &["apply", "-f", &manifest]);
    assert!(ok, "{err}");
    assert_eq!(out.trim(), "pod/talker created");
    until("the pod Running in the cloud's view", || {
        let (ok, out, _) = ctl(&kubeconfig, &["get", "pod", "talker", "-o", "json"]);
        let pod: Value = ok.then(|| serde_json::from_str(&out).ok()).flatten()?;
        (pod["status"]["phase"] == "Running").then_some(())
    });
    until("lines in the log", || {
        let (ok, out, _) = ctl(&kubeconfig, &["logs", "talker"]);
        (ok && out.contains("line 2")).then_some(())
    });
    let (ok, out, err) = ctl(&kubeconfig, &["exec", "talker", "--", "echo", "hi"]);
    assert!(ok, "{err}");
    assert_eq!(out, "hi\n");

    // A viewer: reads and logs, but no apply, no exec, no secrets.
    let viewer = format!("{dir}/bob.kubeconfig");
    let printed = Command::new(env!("CARGO_BIN_EXE_e2e-cloudcore"))
        .args([
            "--data-dir",
            &cloud_dir,
            "kubeconfig",
            "--user",
            "bob",
            "--role",
            "view",
            "--days",
            "1",
            "--server",
            &format!("https://{admin}"),
        ])
        .output()
        .expect("cloudcore kubeconfig");
    assert!(printed.status.success());
    std::fs::write(&viewer, &printed.stdout).expect("viewer kubeconfig");
    let (ok, out, err) = ctl(&viewer, &["get", "pods"]);
    assert!(ok, "{err}");
    assert!(out.contains("talker"), "{out}");
    let (ok, out, err) = ctl(&viewer, &["logs", "talker", "--tail", "1"]);
    assert!(ok, "{err}");
    assert!(out.starts_with("line "), "{out}");
    let (ok, _, err) = ctl(&viewer, &["apply", "-f", &manifest]);
    assert!(!ok);
    assert!(
        err.starts_with("Error from server (Forbidden): ")
            && err.contains(r#"User "bob" cannot create resource "apply""#),
        "{err}"
    );
    let (ok, out, err) = ctl(&viewer, &["exec", "talker", "--", "echo", "hi"]);
    assert!(!ok);
    assert!(out.is_empty(), "{out}");
    assert!(
        err.contains(r#"Error from server (Forbidden): pods "talker" is forbidden: User "bob" cannot create resource "pods/exec" in API group "" in the namespace "default""#),
        "{err}"
    );
    let (code, status) = raw(&viewer, "DELETE", "/api/v1/namespaces/default/pods/talker");
    assert_eq!(code, 403);
    assert_eq!(
        (&status["kind"], &status["reason"], &status["code"]),
        (
            &Value::from("Status"),
            &Value::from("Forbidden"),
            &Value::from(403)
        ),
        "{status}"
    );
    let (code, _) = raw(&viewer, "GET", "/api/v1/namespaces/default/secrets");
    assert_eq!(code, 403);

    // No credentials: 401, as a Status.
    let anonymous = with_user(&kubeconfig, None, &dir, "anonymous");
    let (ok, _, err) = ctl(&anonymous, &["get", "pods"]);
    assert!(!ok);
    assert!(
        err.starts_with("Error from server (Unauthorized): "),
        "{err}"
    );
    let (code, status) = raw(&anonymous, "GET", "/api/v1/namespaces/default/pods");
    assert_eq!(code, 401);
    assert_eq!(status["kind"], "Status");
    assert_eq!(status["reason"], "Unauthorized");

    // A certificate of another CA: the handshake fails (or 401), nothing read.
    let other = transports::tls::DevPki::new("another CA").expect("CA");
    let (chain, key) = other.client("admin").expect("client certificate");
    let stranger = with_user(
        &kubeconfig,
        Some(AuthInfo {
            client_certificate_data: Some(base64_pem("CERTIFICATE", &chain[0])),
            client_key_data: Some(base64_pem("PRIVATE KEY", key.secret_der())),
            ..AuthInfo::default()
        }),
        &dir,
        "stranger",
    );
    let (ok, out, err) = ctl(&stranger, &["get", "pods"]);
    assert!(!ok, "{out}");
    assert!(!out.contains("talker"), "{out}");
    assert!(
        err.contains("cannot reach") || err.contains("(Unauthorized)"),
        "{err}"
    );

    // Bearer tokens: each with its role; a wrong one is a stranger.
    let alice = with_user(&kubeconfig, token("alice-token"), &dir, "alice");
    let (ok, out, err) = ctl(&alice, &["apply", "-f", &manifest]);
    assert!(ok, "{err}");
    assert_eq!(out.trim(), "pod/talker unchanged");
    let carol = with_user(&kubeconfig, token("carol-token"), &dir, "carol");
    let (ok, out, err) = ctl(&carol, &["get", "pods"]);
    assert!(ok, "{err}");
    assert!(out.contains("talker"), "{out}");
    let (ok, _, err) = ctl(&carol, &["delete", "pod", "talker"]);
    assert!(!ok);
    assert!(
        err.contains(r#"User "carol" cannot delete resource "pods""#),
        "{err}"
    );
    let wrong = with_user(&kubeconfig, token("alice-tokem"), &dir, "wrong");
    let (ok, _, err) = ctl(&wrong, &["get", "pods"]);
    assert!(!ok);
    assert!(
        err.starts_with("Error from server (Unauthorized): "),
        "{err}"
    );
    let (code, _) = raw(&wrong, "GET", "/api/v1/nodes");
    assert_eq!(code, 401);

    // Plain HTTP to the HTTPS port gets nothing.
    let (ok, out, _) = support::ctl(&admin, &["get", "pods"]);
    assert!(!ok, "{out}");

    // The admin cleans up.
    let (ok, _, err) = ctl(&kubeconfig, &["delete", "-f", &manifest]);
    assert!(ok, "{err}");
    cloud.stop();
}

/// `der` as base64 of its PEM, as kubeconfigs carry certificates and keys.
fn base64_pem(label: &str, der: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD
        .encode(cloud::admin_client::kubeconfig::pem(label, der))
}

#[test]
fn the_admin_api_without_authentication_stays_on_loopback() {
    let dir = tempfile_dir("adminauth-open");
    let out = Command::new(env!("CARGO_BIN_EXE_e2e-cloudcore"))
        .args([
            "--data-dir",
            &dir,
            "run",
            "--ws",
            &free_address(),
            "--admin",
            "0.0.0.0:0",
            "--admin-insecure",
        ])
        .output()
        .expect("cloudcore");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("modules.admin.authentication") && err.contains("loopback"),
        "{err}"
    );
}
