//! A KubeEdge edge's MetaServer against a cloud on a real kube-apiserver:
//! what it forwards is answered from the API server, in the node's name.
//!
//! Runs when `EDGEHIVE_TEST_KUBECONFIG` names a kubeconfig with rights to
//! impersonate nodes (an admin's); says it was skipped otherwise. The edge
//! is KubeEdge's side of the link scripted frame by frame (see
//! `common/kubeedge.rs`).
#![cfg(feature = "kubernetes")]

use std::process::Command;
use std::time::Duration;

use cloud::desired::{KubeAccess, KubernetesConfig, KubernetesStore};
use cloud::dynamiccontroller::kubernetes::KubernetesApi;
use e2e::kubeedge::{KubeEdgeEdge, ack, answered, application, application_content, watch_sync};
use e2e::{Backend, Cloud};
use serde_json::{Value, json};

fn kubeconfig(test: &str) -> Option<String> {
    match std::env::var("EDGEHIVE_TEST_KUBECONFIG") {
        Ok(path) if !path.is_empty() => Some(path),
        _ => {
            println!("{test}: skipped: EDGEHIVE_TEST_KUBECONFIG is not set (no kube-apiserver)");
            None
        }
    }
}

/// Runs kubectl as the cluster's admin; panics on failure.
fn kubectl(kubeconfig: &str, args: &[&str], stdin: Option<&str>) -> String {
    use std::io::Write;
    let mut child = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("kubectl on the PATH");
    if let Some(input) = stdin {
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(input.as_bytes())
            .expect("manifest written");
    }
    drop(child.stdin.take());
    let out = child.wait_with_output().expect("kubectl ran");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "kubectl {args:?}: {}{}",
        text,
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

fn service(name: &str, label: &str, port: u16) -> String {
    format!(
        "apiVersion: v1
kind: Service
metadata:
  name: {name}
  namespace: default
  labels: {{watched: {label}}}
spec:
  ports: [{{port: {port}}}]
"
    )
}

/// A cloud on the API server `kubeconfig` names, its application center
/// forwarding there.
async fn on_kubernetes(kubeconfig: &str) -> Cloud {
    let config = KubernetesConfig::new(KubeAccess::Kubeconfig(kubeconfig.into()));
    let store = KubernetesStore::connect(config)
        .await
        .expect("the API server");
    let api = KubernetesApi::new(store.client().clone());
    Cloud::start_backed_by(Backend {
        store: Some(store.shared()),
        api: Some(std::sync::Arc::new(api)),
    })
    .await
}

/// The slice kube-apiserver publishes for itself.
const DEFAULT_MASTER: &str = "apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: kubernetes
  namespace: default
  labels: {kubernetes.io/service-name: kubernetes}
addressType: IPv4
endpoints:
  - addresses: [192.0.2.10]
ports:
  - {name: https, port: 6443, protocol: TCP}
";

/// The next frame the application center sends, skipping any other.
async fn from_center(edge: &mut KubeEdgeEdge, what: &str) -> Value {
    loop {
        let frame = edge.recv(what).await;
        if frame["route"]["source"] == "dynamiccontroller" {
            return frame;
        }
    }
}

#[actix::test]
async fn a_kubeedge_metaserver_reads_and_watches_the_api_server_as_its_node() {
    let test = "a_kubeedge_metaserver_reads_and_watches_the_api_server_as_its_node";
    let Some(kubeconfig) = kubeconfig(test) else {
        return;
    };
    let cloud = on_kubernetes(&kubeconfig).await;
    let suffix = std::process::id();
    let node = format!("metaserver-{suffix}");
    let mut edge = KubeEdgeEdge::dial(&cloud, Some(&node), &format!("system:node:{node}")).await;

    // A list, as the node may make it: the API server's own answer.
    let list = application("list", "/core/v1/services/default/null", json!({}), &node);
    let (app, body) = answered(&edge.ask(list, "the list's answer").await);
    assert_eq!(app["Status"], "Approved", "{app}");
    let names: Vec<&str> = body["items"]
        .as_array()
        .expect("a list")
        .iter()
        .filter_map(|s| s["metadata"]["name"].as_str())
        .collect();
    assert!(names.contains(&"kubernetes"), "{names:?}");

    // Discovery passes through.
    let version = application("get", "/version", json!({}), &node);
    let (app, body) = answered(&edge.ask(version, "the version's answer").await);
    assert_eq!(app["Status"], "Approved", "{app}");
    assert!(body["gitVersion"].is_string(), "{body}");

    // The default master points at the edge's MetaServer (nodes may read
    // endpoint slices with the repository's RBAC for MetaServer clients).
    let rbac = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../manifests/rbac/metaserver-nodes.yaml"
    );
    kubectl(&kubeconfig, &["apply", "-f", rbac], None);
    // A cluster whose API server publishes no endpoints of its own gets
    // the slice it would publish, for this check only.
    let published = kubectl(
        &kubeconfig,
        &["get", "endpointslices", "-n", "default", "-o", "name"],
        None,
    );
    let made_master = !published
        .lines()
        .any(|l| l == "endpointslice.discovery.k8s.io/kubernetes");
    if made_master {
        kubectl(&kubeconfig, &["apply", "-f", "-"], Some(DEFAULT_MASTER));
    }
    let master = application(
        "get",
        "/discovery.k8s.io/v1/endpointslices/default/kubernetes",
        json!({}),
        &node,
    );
    let (app, body) = answered(&edge.ask(master, "the default master's answer").await);
    assert_eq!(app["Status"], "Approved", "{app}");
    assert_eq!(
        body["endpoints"][0]["addresses"],
        json!(["127.0.0.1"]),
        "{body}"
    );
    assert_eq!(body["ports"][0]["port"], 10550, "{body}");
    if made_master {
        kubectl(
            &kubeconfig,
            &["delete", "endpointslice", "kubernetes", "-n", "default"],
            None,
        );
    }

    // What the node may not read, the API server refuses it: the cluster's
    // Node authorizer judged the request as this node's, not cloudcore's.
    let secret = format!("not-for-nodes-{suffix}");
    kubectl(
        &kubeconfig,
        &[
            "create",
            "secret",
            "generic",
            &secret,
            "-n",
            "default",
            "--from-literal=k=v",
        ],
        None,
    );
    let key = format!("/core/v1/secrets/default/{secret}");
    let (app, body) = answered(
        &edge
            .ask(
                application("get", &key, json!({}), &node),
                "the secret's answer",
            )
            .await,
    );
    assert_eq!(app["Status"], "Rejected", "{app}");
    assert_eq!(app["Error"]["ErrStatus"]["code"], 403, "{app}");
    let message = app["Error"]["ErrStatus"]["message"].as_str().unwrap_or("");
    assert!(
        message.contains(&format!("system:node:{node}")),
        "{message}"
    );
    assert_eq!(body, Value::Null);
    kubectl(
        &kubeconfig,
        &["delete", "secret", &secret, "-n", "default"],
        None,
    );

    // A watch: its objects, then its changes, come down the node's queue.
    let label = format!("w{suffix}");
    let first = format!("watched-a-{suffix}");
    let second = format!("watched-b-{suffix}");
    kubectl(
        &kubeconfig,
        &["apply", "-f", "-"],
        Some(&service(&first, &label, 80)),
    );
    // As a Kubernetes 1.32 client's watch-list request comes: initial
    // events, "not older than" and no resource version.
    let options = json!({
        "labelSelector": format!("watched={label}"),
        "resourceVersionMatch": "NotOlderThan",
        "sendInitialEvents": true,
        "allowWatchBookmarks": true,
    });
    let watch = application(
        "watch",
        "/core/v1/services/default/null",
        options.clone(),
        &node,
    );
    let watch_id = watch["content"]["ID"].clone();
    edge.send(watch).await;
    // Approved once the node may watch this; the listed object comes
    // down the queue meanwhile (in either order).
    let first_frame = from_center(&mut edge, "the watch's answer or object").await;
    let second_frame = from_center(&mut edge, "the watch's answer or object").await;
    let (answer, listed) = match first_frame["route"]["operation"] == "applicationResponse" {
        true => (first_frame, second_frame),
        false => (second_frame, first_frame),
    };
    let (app, _) = answered(&answer);
    assert_eq!(listed["route"]["operation"], "insert", "{listed}");
    assert_eq!(
        listed["route"]["resource"],
        format!("default/service/{first}")
    );
    assert_eq!(listed["content"]["kind"], "Service");
    assert!(
        listed["header"]["resourceversion"]
            .as_str()
            .is_some_and(|v| !v.is_empty()),
        "{listed}"
    );
    edge.send(ack(&listed)).await;
    assert_eq!(app["Status"], "Approved", "{app}");
    assert_eq!(cloud.center.counts.borrow().watches, 1);

    kubectl(
        &kubeconfig,
        &["apply", "-f", "-"],
        Some(&service(&second, &label, 81)),
    );
    let added = from_center(&mut edge, "the new service").await;
    assert_eq!(added["route"]["operation"], "insert", "{added}");
    assert_eq!(
        added["route"]["resource"],
        format!("default/service/{second}")
    );
    edge.send(ack(&added)).await;

    kubectl(
        &kubeconfig,
        &["delete", "service", &first, "-n", "default"],
        None,
    );
    let deleted = from_center(&mut edge, "the deleted service").await;
    assert_eq!(deleted["route"]["operation"], "delete", "{deleted}");
    assert_eq!(
        deleted["route"]["resource"],
        format!("default/service/{first}")
    );
    edge.send(ack(&deleted)).await;
    // The edge can have a frame before cloudhub has answered the watch
    // that queued it.
    let mut counts = cloud.center.counts.clone();
    tokio::time::timeout(Duration::from_secs(10), counts.wait_for(|c| c.queued == 3))
        .await
        .expect("three objects queued")
        .expect("center running");

    // The edge lists its watches; the one it still holds keeps running.
    let content = application_content("watch", "/core/v1/services/default/null", options, &node);
    assert_eq!(content["ID"], watch_id);
    let answer = edge
        .ask(
            watch_sync(json!({ watch_id.as_str().unwrap_or(""): content })),
            "the watch list's answer",
        )
        .await;
    assert_eq!(answer["content"], json!({}), "none failed");
    assert_eq!(cloud.center.counts.borrow().watches, 1);
    // It no longer holds it: the watch stops. One it lists that the node
    // may not hold (secrets) starts, is refused by the API server, and ends
    // rather than being tried for ever.
    let secrets = application_content("watch", "/core/v1/secrets/default/null", json!({}), &node);
    let secrets_id = secrets["ID"].as_str().unwrap_or("").to_owned();
    let answer = edge
        .ask(
            watch_sync(json!({ secrets_id: secrets })),
            "the changed watch list's answer",
        )
        .await;
    assert_eq!(answer["content"], json!({}));
    tokio::time::timeout(Duration::from_secs(10), counts.wait_for(|c| c.watches == 0))
        .await
        .expect("the watch stopped")
        .expect("center running");

    kubectl(
        &kubeconfig,
        &["delete", "service", &second, "-n", "default"],
        None,
    );
    let counts = cloud.center.counts.borrow().clone();
    println!("{test}: {counts:?}");
    assert_eq!((counts.approved, counts.rejected, counts.queued), (4, 1, 3));
    cloud.shutdown().await;
}
