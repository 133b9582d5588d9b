//! cloudcore's admission webhook over a real TLS socket, as kube-apiserver
//! calls it: an `AdmissionReview` posted to `/mutate-pods`, the answer's
//! JSONPatch applied to the pod (RFC 6902, as the API server applies it),
//! and the pod's default offline tolerations found lengthened; refusals of
//! what is not a review, with their reasons. With `EDGEHIVE_TEST_KUBECONFIG`
//! (a real kube-apiserver), replicas registering the webhook's
//! configuration at once.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use cloud::admission::{self, AdmissionConfig, AdmissionHandle};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use transports::tls::{self, DevPki};

const WAIT: Duration = Duration::from_secs(10);

/// The webhook on a free port, edge-1 its only edge node, a 600 s window.
async fn webhook(pki: &DevPki) -> AdmissionHandle {
    let (chain, key) = pki.server("localhost").expect("server certificate");
    let edge: HashSet<String> = ["edge-1".to_owned()].into();
    admission::start(AdmissionConfig {
        address: format!("127.0.0.1:{}", transports::testing::free_port()),
        tls: tls::server_config(chain, key, None).expect("TLS"),
        window: Some(Duration::from_secs(600)),
        edge_nodes: Arc::new(edge),
    })
    .await
    .expect("webhook")
}

/// Sends `head` (request line and headers, without the blank line) and
/// `body` over TLS trusting `pki`; the answer's status and JSON body.
async fn call(pki: &DevPki, handle: &AdmissionHandle, head: &str, body: &[u8]) -> (u16, Value) {
    let config = tls::client_config(&[pki.root()], None).expect("TLS");
    let tcp = TcpStream::connect(handle.address).await.expect("connect");
    let name = rustls::pki_types::ServerName::try_from("localhost").expect("name");
    let mut stream = tokio_rustls::TlsConnector::from(config)
        .connect(name, tcp)
        .await
        .expect("TLS handshake");
    let request = format!("{head}\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.expect("write");
    stream.write_all(body).await.expect("write");
    let mut answer = Vec::new();
    tokio::time::timeout(WAIT, stream.read_to_end(&mut answer))
        .await
        .expect("answered in time")
        .expect("read");
    let answer = String::from_utf8(answer).expect("UTF-8");
    let (head, body) = answer.split_once("\r\n\r\n").expect("a head");
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .expect("a status code");
    (code, serde_json::from_str(body).unwrap_or(Value::Null))
}

async fn post(pki: &DevPki, handle: &AdmissionHandle, body: &[u8]) -> (u16, Value) {
    let head = format!(
        "POST /mutate-pods HTTP/1.1\r\nContent-Type: application/json\r\nContent-Length: {}",
        body.len()
    );
    call(pki, handle, &head, body).await
}

/// A pod as the API server hands it to mutating webhooks: defaulted, its
/// DefaultTolerationSeconds tolerations (300 s) after one the user wrote.
fn admitted_pod(node: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "web", "namespace": "shop"},
        "spec": {
            "nodeName": node,
            "containers": [{"name": "web", "image": "busybox", "imagePullPolicy": "Always"}],
            "restartPolicy": "Always",
            "tolerations": [
                {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 30},
                {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
                {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
            ],
        },
    })
}

fn review(uid: &str, pod: &Value) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": "shop",
            "operation": "CREATE",
            "userInfo": {"username": "admin"},
            "object": pod,
        },
    }))
    .expect("JSON")
}

/// Applies a JSONPatch's `replace` and `remove` operations as RFC 6902
/// says: the target must exist, or the patch fails.
fn apply(document: &Value, patch: &Value) -> Result<Value, String> {
    let mut document = document.clone();
    for op in patch.as_array().ok_or("a patch is a list")? {
        let path = op["path"].as_str().ok_or("an op has a path")?;
        let (parent, last) = path.rsplit_once('/').ok_or("a path has a parent")?;
        let parent = document
            .pointer_mut(parent)
            .ok_or_else(|| format!("{path}: no parent"))?;
        let target = match parent {
            Value::Object(map) => map.get_mut(last),
            Value::Array(items) => last.parse::<usize>().ok().and_then(|i| items.get_mut(i)),
            _ => None,
        }
        .ok_or_else(|| format!("{path}: no such value"))?;
        match op["op"].as_str() {
            Some("replace") => *target = op["value"].clone(),
            Some("remove") => {
                let Value::Object(map) = parent else {
                    return Err(format!("{path}: only members are removed here"));
                };
                map.remove(last);
            }
            other => return Err(format!("unexpected op {other:?}")),
        }
    }
    Ok(document)
}

#[tokio::test]
async fn a_pod_for_an_edge_node_comes_back_with_a_patch_lengthening_its_default_tolerations() {
    let pki = DevPki::new("admission test CA").expect("CA");
    let handle = webhook(&pki).await;
    let pod = admitted_pod("edge-1");
    let (code, answer) = post(&pki, &handle, &review("uid-1", &pod)).await;
    assert_eq!(code, 200, "{answer}");
    assert_eq!(answer["apiVersion"], "admission.k8s.io/v1");
    assert_eq!(answer["kind"], "AdmissionReview");
    let response = &answer["response"];
    assert_eq!(response["uid"], "uid-1");
    assert_eq!(response["allowed"], true);
    assert_eq!(response["patchType"], "JSONPatch");
    let patch = base64::engine::general_purpose::STANDARD
        .decode(response["patch"].as_str().expect("a patch"))
        .expect("base64");
    let patch: Value = serde_json::from_slice(&patch).expect("JSON");
    let patched = apply(&pod, &patch).expect("the patch applies");
    // The two defaults lengthened to the window; the user's 30 s stays;
    // nothing else changed.
    assert_eq!(
        patched["spec"]["tolerations"],
        json!([
            {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 30},
            {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 600},
            {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 600},
        ])
    );
    let mut unchanged = patched.clone();
    unchanged["spec"]["tolerations"] = pod["spec"]["tolerations"].clone();
    assert_eq!(unchanged, pod);

    // A pod for another node: allowed as it is, no patch.
    let (code, answer) = post(&pki, &handle, &review("uid-2", &admitted_pod("cloud-1"))).await;
    assert_eq!(code, 200, "{answer}");
    assert_eq!(answer["response"], json!({"uid": "uid-2", "allowed": true}));
}

#[tokio::test]
async fn what_is_not_a_review_is_refused_saying_why() {
    let pki = DevPki::new("admission test CA").expect("CA");
    let handle = webhook(&pki).await;
    let (code, status) = post(&pki, &handle, br#"{"kind": "Pod", "apiVersion": "v1"}"#).await;
    assert_eq!(code, 400, "{status}");
    assert_eq!(status["kind"], "Status");
    let message = status["message"].as_str().expect("a message");
    assert!(
        message.contains("expected an AdmissionReview of admission.k8s.io/v1"),
        "{message}"
    );
    let (code, status) = post(&pki, &handle, b"{garbled").await;
    assert_eq!(code, 400, "{status}");
    assert!(
        status["message"]
            .as_str()
            .is_some_and(|m| m.contains("not JSON")),
        "{status}"
    );
    // Too large: refused from its declared length, the body never sent.
    let head = format!(
        "POST /mutate-pods HTTP/1.1\r\nContent-Type: application/json\r\nContent-Length: {}",
        admission::MAX_BODY + 1
    );
    let (code, status) = call(&pki, &handle, &head, b"").await;
    assert_eq!(code, 413, "{status}");
    // Other methods and paths.
    let (code, _) = call(&pki, &handle, "GET /mutate-pods HTTP/1.1", b"").await;
    assert_eq!(code, 405);
    let (code, _) = call(
        &pki,
        &handle,
        "POST /validate HTTP/1.1\r\nContent-Length: 0",
        b"",
    )
    .await;
    assert_eq!(code, 404);
    let (code, _) = call(&pki, &handle, "GET /healthz HTTP/1.1", b"").await;
    assert_eq!(code, 200);
}

/// The kubeconfig of a real kube-apiserver, or `None` (and a word that the
/// test is skipped).
#[cfg(feature = "kubernetes")]
fn kubeconfig(test: &str) -> Option<String> {
    match std::env::var("EDGEHIVE_TEST_KUBECONFIG") {
        Ok(path) if !path.is_empty() => Some(path),
        _ => {
            println!("{test}: skipped: EDGEHIVE_TEST_KUBECONFIG is not set (no kube-apiserver)");
            None
        }
    }
}

/// Deletes the configuration at the end, also on failure.
#[cfg(feature = "kubernetes")]
struct Registered(String);

#[cfg(feature = "kubernetes")]
impl Drop for Registered {
    fn drop(&mut self) {
        let _ = std::process::Command::new("kubectl")
            .args([
                "--kubeconfig",
                &self.0,
                "delete",
                "mutatingwebhookconfiguration",
            ])
            .args([admission::webhook::CONFIGURATION_NAME, "--ignore-not-found"])
            .output();
    }
}

/// Eight replicas registering at once against a real kube-apiserver
/// (`EDGEHIVE_TEST_KUBECONFIG`): one creates the configuration, none
/// fails; the stored webhook reads back as written, so registering again
/// writes nothing; a changed URL is an update.
#[cfg(feature = "kubernetes")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_registering_at_once_leave_one_configuration() {
    use admission::webhook::{self, Endpoint, Registered as Done};
    let Some(kubeconfig) = kubeconfig("replicas_registering_at_once_leave_one_configuration")
    else {
        return;
    };
    let _cleanup = Registered(kubeconfig.clone());
    let client = cloud::desired::KubeAccess::Kubeconfig(kubeconfig.clone().into())
        .client()
        .await
        .expect("client");
    let pki = DevPki::new("admission test CA").expect("CA");
    let ca = cloud::admin_client::kubeconfig::pem("CERTIFICATE", pki.root().as_ref());
    // No namespace carries this label: no pod of other tests on this API
    // server is ever sent to this webhook.
    let unused = |endpoint: &Endpoint| {
        let mut configuration = webhook::configuration(webhook::CONFIGURATION_NAME, endpoint, &ca);
        configuration["webhooks"][0]["namespaceSelector"] =
            json!({"matchLabels": {"edgehive.io/admission-test": "none"}});
        configuration
    };
    let first = unused(&Endpoint::on_host("127.0.0.1", 9));
    let _ = std::process::Command::new("kubectl")
        .args([
            "--kubeconfig",
            &kubeconfig,
            "delete",
            "mutatingwebhookconfiguration",
        ])
        .args([webhook::CONFIGURATION_NAME, "--ignore-not-found"])
        .output();
    let replicas: Vec<_> = (0..8)
        .map(|_| {
            let (client, configuration) = (client.clone(), first.clone());
            tokio::spawn(async move { webhook::register(client, &configuration).await })
        })
        .collect();
    let mut done = Vec::new();
    for replica in replicas {
        done.push(replica.await.expect("task").expect("registered"));
    }
    assert_eq!(
        done.iter().filter(|d| **d == Done::Created).count(),
        1,
        "{done:?}"
    );
    // As the API server stores it: what was written, defaults included.
    let api: kube::Api<kube::api::DynamicObject> = kube::Api::all_with(
        client.clone(),
        &kube::core::ApiResource {
            group: "admissionregistration.k8s.io".to_owned(),
            version: "v1".to_owned(),
            api_version: "admissionregistration.k8s.io/v1".to_owned(),
            kind: "MutatingWebhookConfiguration".to_owned(),
            plural: "mutatingwebhookconfigurations".to_owned(),
        },
    );
    let stored = serde_json::to_value(api.get(webhook::CONFIGURATION_NAME).await.expect("stored"))
        .expect("JSON");
    assert_eq!(stored["webhooks"], first["webhooks"]);
    let version = stored["metadata"]["resourceVersion"].clone();
    assert_eq!(
        webhook::register(client.clone(), &first)
            .await
            .expect("again"),
        Done::Unchanged
    );
    // A replica elsewhere: updated.
    let moved = unused(&Endpoint::on_host("127.0.0.2", 9));
    assert_eq!(
        webhook::register(client.clone(), &moved)
            .await
            .expect("moved"),
        Done::Updated
    );
    let stored = serde_json::to_value(api.get(webhook::CONFIGURATION_NAME).await.expect("stored"))
        .expect("JSON");
    assert_ne!(stored["metadata"]["resourceVersion"], version);
    assert_eq!(
        stored["webhooks"][0]["clientConfig"]["url"],
        "https://127.0.0.2:9/mutate-pods"
    );
    println!("eight at once: {done:?}");
}
