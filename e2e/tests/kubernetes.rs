//! cloudcore on a real Kubernetes cluster: it drives edge nodes from a
//! kube-apiserver, as KubeEdge's cloudcore does.
//!
//! These tests run only when `EDGEHIVE_TEST_KUBECONFIG` names a kubeconfig
//! of a cluster they may write to (an admin's), with `kubectl` on the PATH
//! and containerd as the other process tests use it
//! (`EDGEHIVE_CRI_SOCKET`). Without it each test says it was skipped and
//! passes: no package registry offers a kube-apiserver, so CI has none.
//!
//! Each test starts cloudcore with `--kubeconfig`, joins an edgecore (in
//! edgehive's own dialect, or in KubeEdge's) and works through kubectl, as
//! a KubeEdge user would: the Node appears labelled as an edge node and
//! Ready, its Lease in `kube-node-lease` is renewed, a pod bound to it runs
//! on containerd and reports Running with its IP, a killed edgecore turns
//! the node NotReady with its pods kept, and a `kubectl delete` made while
//! the edge is away is finished when it returns, once the edge holds it.
//! A test whose edge runs pods names its node with a test node: its pods
//! are removed from containerd when the test ends, passed or failed.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::process::Command;
use std::time::Duration;

use edged::testing::TestNode;
use serde_json::Value;
use support::{
    CloudcoreRun, EdgecoreRun, Process, free_address, join_node, share_ca, tempfile_dir, test_node,
    until,
};

mod support;

/// The kubeconfig of the cluster under test, or `None` (and a word that the
/// test is skipped).
fn kubeconfig(test: &str) -> Option<String> {
    match std::env::var("EDGEHIVE_TEST_KUBECONFIG") {
        Ok(path) if !path.is_empty() => Some(path),
        _ => {
            println!("{test}: skipped: EDGEHIVE_TEST_KUBECONFIG is not set (no kube-apiserver)");
            None
        }
    }
}

/// Runs kubectl against `kubeconfig`; its exit status and stdout (stderr
/// goes with a failure).
fn kubectl(kubeconfig: &str, args: &[&str]) -> (bool, String) {
    let out = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .output()
        .expect("kubectl on the PATH");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    (out.status.success(), stdout + &stderr)
}

/// The object kubectl gets as JSON, if it exists.
fn get(kubeconfig: &str, args: &[&str]) -> Option<Value> {
    let mut args = args.to_vec();
    args.extend(["-o", "json"]);
    let (ok, out) = kubectl(kubeconfig, &args);
    ok.then(|| serde_json::from_str(&out).ok()).flatten()
}

fn condition<'a>(object: &'a Value, kind: &str) -> Option<&'a Value> {
    object["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == kind)
}

fn cri_socket() -> String {
    support::cri_socket().display().to_string()
}

/// A cloudcore on the cluster and a joined edgecore.
struct Cluster {
    kubeconfig: String,
    cloud: Option<Process>,
    cloud_run: CloudcoreRun,
    /// The edge's MetaServer: what the edge holds.
    metaserver: String,
    edge: Option<Process>,
    edge_run: EdgecoreRun,
    edge_dir: String,
    node: String,
    namespace: String,
    /// cloudcore's kubelet API for the edge nodes.
    stream: String,
    /// cloudcore's resource metrics API (metrics.k8s.io).
    metrics_server: String,
    /// With pods, the node's test node. Last: dropped after the edge, it
    /// removes the node's pods.
    _node_pods: Option<TestNode>,
}

impl Cluster {
    fn start(kubeconfig: String, name: &str, dialect: &str) -> Cluster {
        Cluster::start_with(kubeconfig, name, dialect, true)
    }

    /// With `pods` false the edge runs no pods (no edged): it only holds
    /// what it is sent, which its MetaServer shows.
    fn start_with(kubeconfig: String, name: &str, dialect: &str, pods: bool) -> Cluster {
        Cluster::start_with_cloud(kubeconfig, name, dialect, pods, &[], &[])
    }

    /// [`Cluster::start_with`], cloudcore given `global` arguments before
    /// `run` (`--config FILE`) and `run` ones after the others.
    fn start_with_cloud(
        kubeconfig: String,
        name: &str,
        dialect: &str,
        pods: bool,
        global: &[&str],
        run: &[&str],
    ) -> Cluster {
        let mut cluster = Cluster::prepare(kubeconfig, name, dialect, pods, global, run);
        cluster.start_edge();
        cluster
    }

    /// [`Cluster::start_with_cloud`] up to the edge: cloudcore runs, the
    /// edge has joined, the namespace exists; [`Cluster::start_edge`]
    /// starts edgecore.
    fn prepare(
        kubeconfig: String,
        name: &str,
        dialect: &str,
        pods: bool,
        global: &[&str],
        run: &[&str],
    ) -> Cluster {
        // Declared first: if the start fails, dropped after the edge.
        let node_pods = pods.then(|| test_node(name));
        let node = match &node_pods {
            Some(test_node) => test_node.name().to_owned(),
            None => format!("{name}-{}", std::process::id()),
        };
        let namespace = format!("edgehive-test-{}", std::process::id());
        let dir = tempfile_dir(&node);
        let (cloud_dir, edge_dir) = (format!("{dir}/cloud"), format!("{dir}/edge"));
        let (hub, certs, admin, metrics, stream, metrics_server) = (
            free_address(),
            free_address(),
            free_address(),
            free_address(),
            free_address(),
            free_address(),
        );
        let cloud_run = CloudcoreRun::new(&cloud_dir, &certs)
            .global(global)
            .with("--kubeconfig", &kubeconfig)
            .with("--admin", &admin)
            .flag("--admin-insecure")
            .with("--metrics", &metrics)
            .with("--stream", &stream)
            .with("--metrics-server", &metrics_server)
            .with("--keepalive-secs", "2");
        let cloud_run = match dialect {
            "kubeedge" => cloud_run.kubeedge_hub(&hub),
            _ => cloud_run.hub(&hub),
        }
        .and(run);
        let cloud = cloud_run.start();
        cloud.wait_for("certificate endpoints ready", Duration::from_secs(90));
        join_node(&cloud_dir, &certs, &node, &edge_dir);
        let metaserver = free_address();
        let cri = match pods {
            true => cri_socket(),
            false => "off".to_owned(),
        };
        let mut edge_run = EdgecoreRun::new(&edge_dir, &hub)
            .with("--metaserver", &metaserver)
            .with("--edged-server", &free_address())
            .with("--mqtt-broker", &free_address())
            .with("--metrics", &free_address())
            .with("--node-ip", "127.0.0.1")
            .with("--keepalive-secs", "2")
            .with("--cri-socket", &cri);
        if dialect == "kubeedge" {
            edge_run = edge_run.with("--dialect", "kubeedge");
        }
        let (ok, out) = kubectl(&kubeconfig, &["create", "namespace", &namespace]);
        assert!(ok || out.contains("AlreadyExists"), "{out}");
        let cloud = Some(cloud);
        Cluster {
            kubeconfig,
            cloud_run,
            metaserver,
            cloud,
            edge: None,
            edge_run,
            edge_dir,
            node,
            namespace,
            stream,
            metrics_server,
            _node_pods: node_pods,
        }
    }

    fn start_edge(&mut self) {
        let edge = self.edge_run.start();
        let Some(cloud) = &self.cloud else {
            panic!("no cloudcore running");
        };
        cloud.wait_for(
            &format!("node connected node={}", self.node),
            Duration::from_secs(30),
        );
        self.edge = Some(edge);
    }

    /// Kills cloudcore (SIGKILL) and starts it again on its data.
    fn restart_cloud(&mut self) {
        // Dropping a process kills it (SIGKILL) and reaps it, so its ports
        // are free for the next.
        drop(self.cloud.take());
        let cloud = self.cloud.insert(self.cloud_run.start());
        cloud.wait_for(
            &format!("node connected node={}", self.node),
            Duration::from_secs(90),
        );
    }

    /// cloudcore's `/metrics` page.
    fn cloud_metrics(&self) -> String {
        let at = self
            .cloud_run
            .value_of("--metrics")
            .expect("cloudcore runs with --metrics");
        let mut tcp = std::net::TcpStream::connect(at).expect("cloudcore's metrics");
        tcp.set_read_timeout(Some(Duration::from_secs(20)))
            .expect("timeout");
        tcp.write_all(b"GET /metrics HTTP/1.0\r\nHost: cloudcore\r\n\r\n")
            .expect("request");
        let mut answer = String::new();
        tcp.read_to_string(&mut answer).expect("metrics");
        answer
    }

    /// The pods the edge holds (its MetaServer's answer): name and version.
    fn held_pods(&self) -> BTreeMap<String, u64> {
        held_pods(&self.metaserver, &self.namespace)
    }

    fn node(&self) -> Option<Value> {
        get(&self.kubeconfig, &["get", "node", &self.node])
    }

    /// cloudcore's data directory.
    fn cloud_dir(&self) -> String {
        self.cloud_run.dir().to_owned()
    }

    fn ready(&self) -> Option<String> {
        self.node()
            .and_then(|node| condition(&node, "Ready").cloned())
            .and_then(|c| c["status"].as_str().map(str::to_owned))
    }

    fn pod(&self, name: &str) -> Option<Value> {
        get(
            &self.kubeconfig,
            &["get", "pod", name, "-n", &self.namespace],
        )
    }

    /// Creates the configmaps `pod`'s projected volumes name that the
    /// namespace lacks: a cluster without kube-controller-manager has no
    /// root CA publisher (`kube-root-ca.crt`), and some API servers add
    /// sources of their own.
    fn publish_missing_configmaps(&self, pod: &Value) {
        let volumes = pod["spec"]["volumes"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        for volume in volumes {
            let sources = volume["projected"]["sources"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            for source in sources {
                let Some(name) = source["configMap"]["name"].as_str() else {
                    continue;
                };
                if get(
                    &self.kubeconfig,
                    &["get", "configmap", name, "-n", &self.namespace],
                )
                .is_some()
                {
                    continue;
                }
                let mut args = vec![
                    "create".to_owned(),
                    "configmap".to_owned(),
                    name.to_owned(),
                    "-n".to_owned(),
                    self.namespace.clone(),
                ];
                for item in source["configMap"]["items"]
                    .as_array()
                    .into_iter()
                    .flatten()
                {
                    if let Some(key) = item["key"].as_str() {
                        args.push(format!("--from-literal={key}=stand-in"));
                    }
                }
                let args: Vec<&str> = args.iter().map(String::as_str).collect();
                let (ok, out) = kubectl(&self.kubeconfig, &args);
                assert!(ok || out.contains("AlreadyExists"), "{out}");
            }
        }
    }

    fn apply(&self, manifest: &str) {
        let file = std::env::temp_dir().join(format!("{}-{}.yaml", self.node, fastrand::u32(..)));
        std::fs::write(&file, manifest).expect("manifest");
        let (ok, out) = kubectl(
            &self.kubeconfig,
            &[
                "apply",
                "-n",
                &self.namespace,
                "-f",
                &file.to_string_lossy(),
            ],
        );
        assert!(ok, "kubectl apply: {out}");
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = kubectl(
            &self.kubeconfig,
            &["delete", "namespace", &self.namespace, "--wait=false"],
        );
        let _ = kubectl(
            &self.kubeconfig,
            &["delete", "node", &self.node, "--wait=false"],
        );
    }
}

/// The pods an edge holds in `namespace` (its MetaServer at `metaserver`
/// answers): name and version.
fn held_pods(metaserver: &str, namespace: &str) -> BTreeMap<String, u64> {
    let Ok(mut stream) = std::net::TcpStream::connect(metaserver) else {
        return BTreeMap::new();
    };
    let request = format!("GET /api/v1/namespaces/{namespace}/pods HTTP/1.0\r\nHost: edge\r\n\r\n");

    if stream.write_all(request.as_bytes()).is_err() {
        return BTreeMap::new();
    }
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    let body = answer.split_once("\r\n\r\n").map_or("", |(_, body)| body);
    let list: Value = serde_json::from_str(body).unwrap_or(Value::Null);
    list["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|pod| {
            let name = pod["metadata"]["name"].as_str()?.to_owned();
            let version = pod["metadata"]["resourceVersion"].as_str()?.parse().ok()?;
            Some((name, version))
        })
        .collect()
}

fn web(node: &str) -> String {
    format!(
        "apiVersion: v1
kind: ConfigMap
metadata:
  name: web-conf
data:
  index.html: hello from the API server
---
apiVersion: v1
kind: Pod
metadata:
  name: web
spec:
  nodeName: {node}
  terminationGracePeriodSeconds: 2
  containers:
  - name: web
    image: 127.0.0.1:5000/busybox:latest
    command: [\"sh\", \"-c\", \"exec httpd -f -p 8080 -h /www\"]
    volumeMounts:
    - name: www
      mountPath: /www
    readinessProbe:
      httpGet:
        path: /index.html
        port: 8080
      periodSeconds: 1
  volumes:
  - name: www
    configMap:
      name: web-conf
"
    )
}

fn deployment(node: &str) -> String {
    format!(
        "apiVersion: apps/v1
kind: Deployment
metadata:
  name: hello
spec:
  replicas: 1
  selector:
    matchLabels:
      app: hello
  template:
    metadata:
      labels:
        app: hello
    spec:
      nodeSelector:
        kubernetes.io/hostname: {node}
      tolerations:
      - key: node-role.kubernetes.io/edge
        operator: Exists
      terminationGracePeriodSeconds: 1
      containers:
      - name: hello
        image: 127.0.0.1:5000/busybox:latest
        command: [\"sh\", \"-c\", \"exec sleep 3600\"]
"
    )
}

/// The node, its lease, a pod's life and a killed edge, from kubectl.
fn an_edge_node_runs_pods_from_the_api_server(dialect: &str) {
    let test = format!("an_edge_node_runs_pods_from_the_api_server({dialect})");
    let Some(kubeconfig) = kubeconfig(&test) else {
        return;
    };
    let mut cluster = Cluster::start(kubeconfig, &format!("eh-{dialect}"), dialect);

    // The node: labelled as an edge node, Ready from its link, its lease
    // renewed.
    let node = until("the Node in the API server, Ready", || {
        cluster
            .node()
            .filter(|n| condition(n, "Ready").is_some_and(|c| c["status"] == "True"))
    });
    assert_eq!(
        node["metadata"]["labels"]["node-role.kubernetes.io/edge"], "",
        "{node}"
    );
    let lease = until("the node's Lease", || {
        get(
            &cluster.kubeconfig,
            &["get", "lease", "-n", "kube-node-lease", &cluster.node],
        )
    });
    assert_eq!(lease["spec"]["holderIdentity"], cluster.node.as_str());
    let renewed = lease["spec"]["renewTime"].clone();
    until("the Lease renewed", || {
        get(
            &cluster.kubeconfig,
            &["get", "lease", "-n", "kube-node-lease", &cluster.node],
        )
        .filter(|l| l["spec"]["renewTime"] != renewed)
    });

    // A pod bound to it runs on containerd; kubectl sees it Running and
    // Ready, with its IP, as the edge reports it. Its service account
    // token (the projected volume the API server added) is in the
    // container.
    cluster.apply(&web(&cluster.node));
    let admitted = until("the pod admitted", || cluster.pod("web"));
    cluster.publish_missing_configmaps(&admitted);
    let pod = until("the pod Running and Ready", || {
        cluster.pod("web").filter(|p| {
            p["status"]["phase"] == "Running"
                && condition(p, "Ready").is_some_and(|c| c["status"] == "True")
        })
    });
    assert!(
        pod["status"]["podIP"]
            .as_str()
            .is_some_and(|ip| !ip.is_empty()),
        "{pod}"
    );
    let (ok, wide) = kubectl(
        &cluster.kubeconfig,
        &["get", "pods", "-o", "wide", "-n", &cluster.namespace],
    );
    assert!(ok && wide.contains(&cluster.node), "{wide}");
    println!("{wide}");
    let uid = pod["metadata"]["uid"].as_str().expect("uid");
    let token_volume = pod["spec"]["volumes"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|v| v["projected"]["sources"].is_array())
        .and_then(|v| v["name"].as_str())
        .expect("the API server added a projected token volume");
    let token = std::fs::read_to_string(format!(
        "{}/edged/pods/{uid}/volumes/projected/{token_volume}/token",
        cluster.edge_dir
    ))
    .expect("the token file in the pod's volume");
    assert_eq!(token.split('.').count(), 3, "a JWT: {token}");

    // A configmap update reaches the running pod's volume.
    let (ok, out) = kubectl(
        &cluster.kubeconfig,
        &[
            "patch",
            "configmap",
            "web-conf",
            "-n",
            &cluster.namespace,
            "--type=merge",
            "-p",
            r#"{"data":{"index.html":"updated through the API server"}}"#,
        ],
    );
    assert!(ok, "{out}");
    let volume = format!(
        "{}/edged/pods/{uid}/volumes/configmap/www/index.html",
        cluster.edge_dir
    );
    until("the update in the pod's volume", || {
        std::fs::read_to_string(&volume)
            .ok()
            .filter(|page| page == "updated through the API server")
    });

    // The scheduler places a Deployment's pods by nodeSelector on the edge
    // node, where they run.
    cluster.apply(&deployment(&cluster.node));
    let placed = until("the Deployment's pod Running on the edge", || {
        let (ok, out) = kubectl(
            &cluster.kubeconfig,
            &[
                "get",
                "pods",
                "-n",
                &cluster.namespace,
                "-l",
                "app=hello",
                "-o",
                "json",
            ],
        );
        let pods: Value = ok.then(|| serde_json::from_str(&out).ok()).flatten()?;
        pods["items"]
            .as_array()?
            .iter()
            .find(|p| p["status"]["phase"] == "Running")
            .cloned()
    });
    assert_eq!(
        placed["spec"]["nodeName"],
        cluster.node.as_str(),
        "{placed}"
    );
    let (ok, out) = kubectl(
        &cluster.kubeconfig,
        &["delete", "deployment", "hello", "-n", &cluster.namespace],
    );
    assert!(ok, "{out}");

    // Its default tolerations of an offline node are lengthened to
    // cloudcore's window (a day by default), so an outage shorter than
    // that evicts nothing. On the shared test cluster another test's
    // cloudcore (one with a 90 s window, say) may write them first: any
    // cloudcore lengthens only the API server's 300 s defaults, so what is
    // asserted is that they no longer are 300 s.
    let tolerations = until("the offline tolerations lengthened", || {
        cluster.pod("web").filter(|p| {
            let offline: Vec<&Value> = p["spec"]["tolerations"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|t| {
                    t["effect"] == "NoExecute"
                        && (t["key"] == "node.kubernetes.io/not-ready"
                            || t["key"] == "node.kubernetes.io/unreachable")
                })
                .collect();
            offline.len() == 2 && offline.iter().all(|t| t["tolerationSeconds"] != 300)
        })
    });
    println!("{}", tolerations["spec"]["tolerations"]);

    // The edge is killed: the node goes NotReady, its link condition says
    // why, its pod stays; then it comes back.
    if let Some(edge) = cluster.edge.take() {
        edge.signal("-KILL");
    }
    let offline = until("the node NotReady by its link", || {
        cluster.node().filter(|n| {
            condition(n, "Ready").is_some_and(|c| c["status"] != "True")
                && condition(n, "EdgeLink").is_some_and(|c| c["status"] == "False")
        })
    });
    println!("{}", offline["status"]["conditions"]);
    assert!(
        cluster.pod("web").is_some(),
        "the pod stays while the node is offline"
    );

    // kubectl delete while the edge is away: the pod object waits, being
    // deleted, until the edge returns, stops the pod and says so.
    let (ok, out) = kubectl(
        &cluster.kubeconfig,
        &[
            "delete",
            "pod",
            "web",
            "-n",
            &cluster.namespace,
            "--wait=false",
        ],
    );
    assert!(ok, "{out}");
    let terminating = cluster
        .pod("web")
        .expect("kept until the edge says the pod stopped");
    assert!(
        terminating["metadata"]["deletionTimestamp"].is_string(),
        "{terminating}"
    );
    cluster.start_edge();
    until("the node Ready again", || {
        cluster.ready().filter(|ready| ready == "True")
    });
    until("the pod object gone", || {
        cluster.pod("web").is_none().then_some(())
    });
    let pod_dir = format!("{}/edged/pods/{uid}", cluster.edge_dir);
    until("the pod gone from the edge's disk", || {
        (!std::path::Path::new(&pod_dir).exists()).then_some(())
    });
}

#[test]
fn an_edge_node_runs_pods_from_the_api_server_native() {
    an_edge_node_runs_pods_from_the_api_server("native");
}

#[test]
fn an_edge_node_runs_pods_from_the_api_server_kubeedge() {
    an_edge_node_runs_pods_from_the_api_server("kubeedge");
}

/// `kubectl delete pod` of a pod whose container takes a few seconds to
/// stop after SIGTERM (grace 30 s): the pod object stays, being deleted,
/// while containerd still runs its container, and is gone only once the
/// edge said the container stopped: when it is gone, none of the pod's
/// containers runs.
fn a_deleted_pod_stays_until_its_containers_stopped(dialect: &str) {
    let test = format!("a_deleted_pod_stays_until_its_containers_stopped({dialect})");
    let Some(kubeconfig) = kubeconfig(&test) else {
        return;
    };
    let cluster = Cluster::start(kubeconfig, &format!("stop-{dialect}"), dialect);
    cluster.apply(&format!(
        "apiVersion: v1
kind: Pod
metadata:
  name: slow
spec:
  nodeName: {}
  terminationGracePeriodSeconds: 30
  automountServiceAccountToken: false
  containers:
  - name: slow
    image: 127.0.0.1:5000/busybox:latest
    command: [\"sh\", \"-c\", \"trap 'sleep 3; exit 0' TERM; while true; do sleep 1; done\"]
",
        cluster.node
    ));
    let running = until("the pod Running", || {
        cluster
            .pod("slow")
            .filter(|p| p["status"]["phase"] == "Running")
    });
    let uid = running["metadata"]["uid"]
        .as_str()
        .expect("a uid")
        .to_owned();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let cri = runtime
        .block_on(edged::Cri::connect(&support::cri_socket()))
        .expect("containerd");
    let running_containers = || {
        runtime
            .block_on(cri.containers(edged::spec::POD_UID, &uid, None))
            .expect("containerd answers")
            .into_iter()
            .filter(|c| c.state == edged::cri::api::ContainerState::ContainerRunning as i32)
            .count()
    };
    assert_eq!(running_containers(), 1);
    let (ok, out) = kubectl(
        &cluster.kubeconfig,
        &[
            "delete",
            "pod",
            "slow",
            "-n",
            &cluster.namespace,
            "--wait=false",
        ],
    );
    assert!(ok, "{out}");
    // Being deleted, its container still stopping (3 s after SIGTERM):
    // the object is there.
    let stopping = until("the pod being deleted while its container runs", || {
        let pod = cluster.pod("slow")?;
        (pod["metadata"]["deletionTimestamp"].is_string() && running_containers() == 1)
            .then_some(pod)
    });
    println!(
        "being deleted, container running: deletionTimestamp {}",
        stopping["metadata"]["deletionTimestamp"]
    );
    // Gone only once the container stopped.
    until("the pod object gone", || {
        cluster.pod("slow").is_none().then_some(())
    });
    let left = running_containers();
    println!("pod object gone; containers of the pod running: {left}");
    assert_eq!(left, 0, "a container of the pod still ran when it was gone");
}

#[test]
fn a_deleted_pod_stays_until_its_containers_stopped_native() {
    a_deleted_pod_stays_until_its_containers_stopped("native");
}

#[test]
fn a_deleted_pod_stays_until_its_containers_stopped_kubeedge() {
    a_deleted_pod_stays_until_its_containers_stopped("kubeedge");
}

/// cloudcore killed (SIGKILL) while 500 pods stream from the API server to
/// an edge: after it restarts, the edge holds every one, none older than
/// the API server's version.
fn a_killed_cloudcore_loses_nothing(dialect: &str) {
    let test = format!("a_killed_cloudcore_loses_nothing({dialect})");
    let Some(kubeconfig) = kubeconfig(&test) else {
        return;
    };
    // cloudcore's admission webhook lengthens the pods' offline
    // tolerations as they are created (its own configuration, kept to the
    // test's namespace), so nothing is left for cloudcore to write.
    let name = format!("edgehive-test-kill-{dialect}-{}", std::process::id());
    let _webhook = WebhookGuard {
        kubeconfig: kubeconfig.clone(),
        name: name.clone(),
    };
    let config = std::env::temp_dir().join(format!("{name}.yaml"));
    std::fs::write(
        &config,
        format!("modules:\n  admission:\n    configurationName: {name}\n"),
    )
    .expect("config");
    let config = config.to_string_lossy().into_owned();
    let admission = free_address();
    let mut cluster = Cluster::start_with_cloud(
        kubeconfig,
        &format!("eh-kill-{dialect}"),
        dialect,
        false,
        &["--config", &config],
        &["--admission", &admission],
    );
    webhook_only_for(&cluster, &name);
    // Stock pods, admitted as usual (a service account token volume, the
    // default tolerations).
    let stock = |name: &str| {
        serde_json::json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": cluster.namespace},
            "spec": {
                "nodeName": cluster.node,
                "containers": [{"name": "c", "image": "127.0.0.1:5000/busybox:latest"}],
            },
        })
    };
    let probe = stock("probe").to_string();
    let probe_file = std::env::temp_dir().join(format!("{name}-probe.json"));
    std::fs::write(&probe_file, &probe).expect("probe");
    let probe_file = probe_file.to_string_lossy().into_owned();
    until("cloudcore's webhook knowing the edge node", || {
        let (ok, out) = kubectl(
            &cluster.kubeconfig,
            &[
                "create",
                "-f",
                &probe_file,
                "--dry-run=server",
                "-o",
                "json",
            ],
        );
        let tried: Value = serde_json::from_str(&out).ok().filter(|_| ok)?;
        let offline = offline_tolerations(&tried);
        (!offline.is_empty() && offline.values().all(|seconds| seconds == 86_400)).then_some(())
    });
    const PODS: usize = 1_000;
    let items: Vec<Value> = (0..PODS).map(|n| stock(&format!("p-{n:04}"))).collect();
    let list = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": items});
    cluster.apply(&list.to_string());
    until("the stream under way", || {
        (cluster.held_pods().len() >= 20).then_some(())
    });
    cluster.restart_cloud();
    webhook_only_for(&cluster, &name);
    let held = until("every pod at the edge", || {
        let held = cluster.held_pods();
        (held.len() == PODS).then_some(held)
    });
    let (ok, out) = kubectl(
        &cluster.kubeconfig,
        &[
            "get",
            "pods",
            "-n",
            &cluster.namespace,
            "-o",
            "json",
            "--show-managed-fields",
        ],
    );
    assert!(ok, "{out}");
    let listed: Value = serde_json::from_str(&out).expect("pods");
    for pod in listed["items"].as_array().into_iter().flatten() {
        let name = pod["metadata"]["name"].as_str().expect("name");
        let version: u64 = pod["metadata"]["resourceVersion"]
            .as_str()
            .and_then(|v| v.parse().ok())
            .expect("version");
        let at_edge = held.get(name).copied().unwrap_or(0);
        assert!(
            at_edge > 0 && at_edge <= version,
            "{name}: edge holds {at_edge}, API server {version}"
        );
    }
    // No pod was written by cloudcore, before the kill or after: the only
    // manager of each pod's fields is kubectl, which created it.
    let mut managers = BTreeSet::new();
    for pod in listed["items"].as_array().into_iter().flatten() {
        for field in pod["metadata"]["managedFields"]
            .as_array()
            .into_iter()
            .flatten()
        {
            managers.insert(format!(
                "{} {}",
                field["manager"].as_str().unwrap_or("?"),
                field["operation"].as_str().unwrap_or("?")
            ));
        }
    }
    assert!(
        managers.iter().all(|m| m.starts_with("kubectl")),
        "pods written by others than kubectl: {managers:?}"
    );
    // And the restarted cloudcore's own count: no token asked for while
    // delivering (its pod writes are not counted here: it also follows
    // the pods of other tests' edge nodes on this API server, some
    // created without a webhook, whose tolerations it may write).
    let metrics = cluster.cloud_metrics();
    let asked: Vec<&str> = metrics
        .lines()
        .filter(|line| line.starts_with("edgehive_apiserver_requests_total"))
        .filter(|line| line.contains("resource=\"serviceaccounts/token\""))
        .collect();
    assert!(asked.is_empty(), "cloudcore asked for tokens: {asked:?}");
    println!(
        "{test}: {} of {PODS} pods held after the restart; their fields' managers: {managers:?}; cloudcore's requests after it: {:?}",
        held.len(),
        metrics
            .lines()
            .filter(|line| line.starts_with("edgehive_apiserver_requests_total"))
            .collect::<Vec<_>>()
    );
}

#[test]
fn a_killed_cloudcore_loses_nothing_native() {
    a_killed_cloudcore_loses_nothing("native");
}

#[test]
fn a_killed_cloudcore_loses_nothing_kubeedge() {
    a_killed_cloudcore_loses_nothing("kubeedge");
}

/// The `value` of `flag` among the edge's arguments (`--mqtt-broker`, ...).
fn edge_flag<'a>(cluster: &'a Cluster, flag: &str) -> &'a str {
    cluster
        .edge_run
        .value_of(flag)
        .unwrap_or_else(|| panic!("the edge runs without {flag}"))
}

/// The devices the edge holds in the test's namespace (its MetaServer's
/// answer), or `None` when the MetaServer does not answer with a list.
fn held_devices(cluster: &Cluster) -> Option<Vec<String>> {
    let mut stream = std::net::TcpStream::connect(&cluster.metaserver).ok()?;
    let request = format!(
        "GET /apis/devices.kubeedge.io/v1beta1/namespaces/{}/devices HTTP/1.0\r\nHost: edge\r\n\r\n",
        cluster.namespace
    );
    stream.write_all(request.as_bytes()).ok()?;
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    let body = answer.split_once("\r\n\r\n").map_or("", |(_, body)| body);
    let list: Value = serde_json::from_str(body).ok()?;
    let items = list["items"].as_array()?;
    Some(
        items
            .iter()
            .filter_map(|device| device["metadata"]["name"].as_str().map(str::to_owned))
            .collect(),
    )
}

/// A device model and a device bound to `node` (the thermometer of
/// `examples/manifests/thermometer.yaml`).
fn thermometer(node: &str, device: &str) -> String {
    format!(
        "apiVersion: devices.kubeedge.io/v1beta1
kind: DeviceModel
metadata:
  name: thermometer
spec:
  protocol: virtual
  properties:
  - name: temperature
    type: float
    accessMode: ReadOnly
    unit: Celsius
  - name: setpoint
    type: int
    accessMode: ReadWrite
---
apiVersion: devices.kubeedge.io/v1beta1
kind: Device
metadata:
  name: {device}
spec:
  nodeName: {node}
  deviceModelRef:
    name: thermometer
  protocol:
    protocolName: virtual
  properties:
  - name: temperature
    reportCycle: 1000
  - name: setpoint
    desired:
      value: \"21\"
"
    )
}

/// KubeEdge's device CRDs (edgehive's `manifests/crds/`) on the cluster: a
/// Device bound to the edge node goes down to it, the values its mapper
/// reports over the edge's MQTT broker come back into the Device's status
/// through the API server, and a deleted Device leaves the edge.
#[test]
fn a_device_reports_through_the_api_server() {
    let test = "a_device_reports_through_the_api_server";
    let Some(kubeconfig) = kubeconfig(test) else {
        return;
    };
    let cluster = Cluster::start(kubeconfig, "eh-device", "native");

    // The CRDs, installed as a user would (idempotent: other runs may have
    // installed them already), and served.
    let crds = concat!(env!("CARGO_MANIFEST_DIR"), "/../manifests/crds");
    let (ok, out) = kubectl(&cluster.kubeconfig, &["apply", "-f", crds]);
    assert!(ok, "kubectl apply -f {crds}: {out}");
    let (ok, out) = kubectl(
        &cluster.kubeconfig,
        &[
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            "crd/devices.devices.kubeedge.io",
            "crd/devicemodels.devices.kubeedge.io",
        ],
    );
    assert!(ok, "the CRDs established: {out}");

    // The model and a device bound to the node. cloudcore lists the kinds
    // again 30 s after it found them not served, so the device may take
    // that long to reach the edge.
    let device = format!("thermo-{}", cluster.node);
    cluster.apply(&thermometer(&cluster.node, &device));
    until("the device at the edge", || {
        held_devices(&cluster)
            .filter(|held| held.contains(&device))
            .map(drop)
    });

    // The mapper (its own process, on the edge's MQTT broker) gets the
    // desired setpoint and reports it and a temperature; the Device's
    // status in the API server shows both.
    let mapper = Process::start(
        env!("CARGO_BIN_EXE_e2e-mapper"),
        &[
            "--broker",
            edge_flag(&cluster, "--mqtt-broker"),
            "--node",
            &cluster.node,
            "--period-ms",
            "200",
        ],
    );
    let reported = until("the device's reported values in the API server", || {
        let object = get(
            &cluster.kubeconfig,
            &["get", "device", &device, "-n", &cluster.namespace],
        )?;
        let twins = object["status"]["twins"].as_array()?;
        let reported = |name: &str| {
            twins
                .iter()
                .find(|t| t["propertyName"] == name)
                .and_then(|t| t["reported"]["value"].as_str())
                .map(str::to_owned)
        };
        (reported("setpoint").as_deref() == Some("21") && reported("temperature").is_some())
            .then_some(object)
    });
    println!("{test}: {}", reported["status"]);
    drop(mapper);

    // kubectl delete: the device leaves the edge.
    let (ok, out) = kubectl(
        &cluster.kubeconfig,
        &["delete", "device", &device, "-n", &cluster.namespace],
    );
    assert!(ok, "{out}");
    until("the device gone from the edge", || {
        held_devices(&cluster)
            .filter(|held| !held.contains(&device))
            .map(drop)
    });
}

/// A cloudcore replica on the cluster: its process and hub address.
fn k8s_replica(kubeconfig: &str, dir: &str, name: &str) -> (Process, String, String) {
    k8s_replica_with_admin(kubeconfig, dir, name, "off")
}

/// [`k8s_replica`] with its admin API at `admin` (`off`: none).
fn k8s_replica_with_admin(
    kubeconfig: &str,
    dir: &str,
    name: &str,
    admin: &str,
) -> (Process, String, String) {
    let (hub, certs) = (free_address(), free_address());
    let process = CloudcoreRun::new(dir, &certs)
        .hub(&hub)
        .with("--kubeconfig", kubeconfig)
        .with("--admin", admin)
        .with("--metrics", &free_address())
        .with("--stream", "off")
        .with("--keepalive-secs", "2")
        .with("--replica", name)
        .with("--claim-ttl-secs", "3")
        .start();
    process.wait_for("certificate endpoints ready", Duration::from_secs(90));
    (process, hub, certs)
}

/// Two cloudcore replicas on one cluster, claims as Leases: the edge
/// knows both; the one serving it is SIGKILLed and the other takes the
/// node over once its Lease is seen unrenewed, keeping what the edge held.
/// Then b dies with the edge: a third replica marks the node, served by
/// none, unreachable.
#[test]
fn two_replicas_on_the_api_server_one_killed_its_node_taken_over() {
    let test = "two_replicas_on_the_api_server_one_killed_its_node_taken_over";
    let Some(kubeconfig) = kubeconfig(test) else {
        return;
    };
    let node = format!("eh-replicas-{}", std::process::id());
    let namespace = format!("edgehive-replicas-{}", std::process::id());
    let dir = tempfile_dir(&node);
    let (a_dir, b_dir, edge_dir) = (
        format!("{dir}/a"),
        format!("{dir}/b"),
        format!("{dir}/edge"),
    );
    // Names of this run's own: a replica named as one killed in an
    // earlier run waits one TTL for that one's Lease to end.
    let (a_name, b_name) = (
        format!("a-{}", std::process::id()),
        format!("b-{}", std::process::id()),
    );
    let (a, a_hub, certs) = k8s_replica(&kubeconfig, &a_dir, &a_name);
    // One CA for the cloud: b is given a's.
    share_ca(&a_dir, &b_dir);
    let (b, b_hub, _) = k8s_replica(&kubeconfig, &b_dir, &b_name);
    join_node(&a_dir, &certs, &node, &edge_dir);
    let (ok, out) = kubectl(&kubeconfig, &["create", "namespace", &namespace]);
    assert!(ok || out.contains("AlreadyExists"), "{out}");
    let metaserver = free_address();
    let edge = EdgecoreRun::new(&edge_dir, &format!("{a_hub},{b_hub}"))
        .with("--metaserver", &metaserver)
        .with("--edged-server", &free_address())
        .with("--mqtt-broker", &free_address())
        .with("--node-ip", "127.0.0.1")
        .with("--keepalive-secs", "2")
        .with("--cri-socket", "off")
        .start();
    a.wait_for(
        &format!("node connected node={node}"),
        Duration::from_secs(30),
    );
    let pod = |name: &str| {
        serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {
                "nodeName": node,
                "automountServiceAccountToken": false,
                "containers": [{"name": "c", "image": "127.0.0.1:5000/busybox:latest"}],
            },
        })
        .to_string()
    };
    let apply = |name: &str| {
        let file = format!("{dir}/{name}.json");
        std::fs::write(&file, pod(name)).expect("manifest");
        let (ok, out) = kubectl(&kubeconfig, &["apply", "-f", &file]);
        assert!(ok, "kubectl apply: {out}");
    };
    apply("before");
    until("the pod at the edge through replica a", || {
        held_pods(&metaserver, &namespace)
            .contains_key("before")
            .then_some(())
    });
    // The node's claim is a Lease naming replica a.
    let claim = get(
        &kubeconfig,
        &[
            "get",
            "lease",
            &format!("edgehive-claim-{node}"),
            "-n",
            "kubeedge",
        ],
    )
    .expect("the node's claim Lease");
    assert_eq!(claim["spec"]["holderIdentity"], a_name.as_str());

    // a dies; b takes the node once a's Lease is seen unrenewed.
    a.signal("-KILL");
    let killed = std::time::Instant::now();
    b.wait_for(
        &format!("node connected node={node}"),
        Duration::from_secs(60),
    );
    println!(
        "{test}: the edge linked to replica b {:?} after a was killed (3 s claims)",
        killed.elapsed()
    );
    apply("after");
    let held = until("both pods at the edge through replica b", || {
        let held = held_pods(&metaserver, &namespace);
        (held.len() == 2).then_some(held)
    });
    println!("{test}: the edge holds {held:?}");
    let claim = get(
        &kubeconfig,
        &[
            "get",
            "lease",
            &format!("edgehive-claim-{node}"),
            "-n",
            "kubeedge",
        ],
    )
    .expect("the node's claim Lease");
    assert_eq!(claim["spec"]["holderIdentity"], b_name.as_str());
    until("the Node Ready, written by b", || {
        get(&kubeconfig, &["get", "node", &node])
            .and_then(|n| condition(&n, "Ready").cloned())
            .filter(|c| c["status"] == "True")
    });

    // A third replica, c; then b dies, and the edge with it before it
    // could link to c: no replica serves the node, and c marks it
    // unreachable once b's Lease is seen unrenewed.
    let c_dir = format!("{dir}/c");
    share_ca(&a_dir, &c_dir);
    let c_name = format!("c-{}", std::process::id());
    let (c, _, _) = k8s_replica(&kubeconfig, &c_dir, &c_name);
    b.signal("-KILL");
    edge.signal("-KILL");
    let killed = std::time::Instant::now();
    c.wait_for(
        &format!("node served by no replica marked unreachable node={node}"),
        Duration::from_secs(90),
    );
    println!(
        "{test}: replica c marked the orphaned node unreachable {:?} after b and the edge were killed",
        killed.elapsed()
    );
    let marked = get(&kubeconfig, &["get", "node", &node]).expect("the Node");
    assert_eq!(
        condition(&marked, "Ready").map(|c| c["status"].clone()),
        Some(serde_json::json!("Unknown")),
        "{marked}"
    );
    assert_eq!(
        condition(&marked, "EdgeLink").map(|c| c["status"].clone()),
        Some(serde_json::json!("False")),
        "{marked}"
    );
    c.stop();
    let _ = kubectl(
        &kubeconfig,
        &["delete", "namespace", &namespace, "--wait=false"],
    );
    let _ = kubectl(&kubeconfig, &["delete", "node", &node, "--wait=false"]);
    let _ = kubectl(
        &kubeconfig,
        &[
            "delete",
            "lease",
            "-n",
            "kubeedge",
            &format!("edgehive-claim-{node}"),
            &format!("edgehive-replica-{a_name}"),
            &format!("edgehive-replica-{b_name}"),
            "--wait=false",
        ],
    );
}

/// Two replicas on the API server (Lease claims), their admin APIs over
/// HTTPS; an edge linked to b alone runs a pod on containerd. Through a,
/// which does not hold the node, edgehivectl reads the pod's log, runs a
/// command in it and sees it in `top pods`: a finds b in b's replica Lease
/// (`edgehive.io/admin-url`) and forwards to it.
#[test]
fn a_replica_on_the_api_server_forwards_streams_and_metrics_to_the_holder() {
    let test = "a_replica_on_the_api_server_forwards_streams_and_metrics_to_the_holder";
    let Some(kubeconfig) = kubeconfig(test) else {
        return;
    };
    let id = std::process::id();
    // Declared first, dropped last: after the edge, its pods are removed.
    let node_guard = test_node("eh-forward");
    let node = node_guard.name().to_owned();
    let namespace = format!("edgehive-forward-{id}");
    let dir = tempfile_dir(&node);
    let (a_dir, b_dir, edge_dir) = (
        format!("{dir}/a"),
        format!("{dir}/b"),
        format!("{dir}/edge"),
    );
    let (a_name, b_name) = (format!("fa-{id}"), format!("fb-{id}"));
    let replica = |dir: &str, name: &str| {
        let admin = free_address();
        let (process, hub, certs) = k8s_replica_with_admin(&kubeconfig, dir, name, &admin);
        (process, hub, certs, format!("https://{admin}"))
    };
    let (a, _a_hub, certs, a_admin) = replica(&a_dir, &a_name);
    share_ca(&a_dir, &b_dir);
    let (b, b_hub, _, b_admin) = replica(&b_dir, &b_name);
    join_node(&a_dir, &certs, &node, &edge_dir);
    let (ok, out) = kubectl(&kubeconfig, &["create", "namespace", &namespace]);
    assert!(ok || out.contains("AlreadyExists"), "{out}");
    let edge = EdgecoreRun::new(&edge_dir, &b_hub)
        .with("--metaserver", &free_address())
        .with("--edged-server", &free_address())
        .with("--mqtt-broker", &free_address())
        .with("--node-ip", "127.0.0.1")
        .with("--keepalive-secs", "2")
        .with("--cri-socket", &cri_socket())
        .start();
    b.wait_for(
        &format!("node connected node={node}"),
        Duration::from_secs(30),
    );
    let manifest = format!("{dir}/talker.yaml");
    std::fs::write(
        &manifest,
        format!(
            "apiVersion: v1
kind: Pod
metadata:
  name: talker
  namespace: {namespace}
spec:
  nodeName: {node}
  terminationGracePeriodSeconds: 1
  automountServiceAccountToken: false
  containers:
  - name: talker
    image: 127.0.0.1:5000/busybox:latest
    command: [\"sh\", \"-c\", \"i=0; while true; do echo line $i; i=$((i+1)); sleep 1; done\"]
"
        ),
    )
    .expect("manifest");
    let (ok, out) = kubectl(&kubeconfig, &["apply", "-f", &manifest]);
    assert!(ok, "{out}");

    // edgehivectl with a's admin kubeconfig, through a.
    let ns = namespace.as_str();
    let admin_kubeconfig = format!("{a_dir}/admin.kubeconfig");
    let ctl = |server: &str, args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_e2e-edgehivectl"))
            .args(["--kubeconfig", &admin_kubeconfig, "--server", server])
            .args(args)
            .output()
            .expect("edgehivectl");
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let log = until("the talker's log through replica a", || {
        let (code, out, _) = ctl(&a_admin, &["logs", "talker", "-n", ns, "--tail", "2"]);
        (code == 0 && out.contains("line 2")).then_some(out)
    });
    println!("{test}: edgehivectl logs through a:\n{log}");
    let (code, out, err) = ctl(
        &a_admin,
        &[
            "exec",
            "talker",
            "-n",
            ns,
            "--",
            "sh",
            "-c",
            "echo hi; exit 3",
        ],
    );
    assert_eq!((code, out.as_str()), (3, "hi\n"), "{err}");
    let top = until("the talker in top pods through replica a", || {
        let (code, out, _) = ctl(&a_admin, &["top", "pods", "-n", ns]);
        (code == 0 && out.lines().any(|l| l.starts_with("talker "))).then_some(out)
    });
    println!("{test}: edgehivectl top pods through a:\n{top}");
    // b, holding the node, answers the same directly.
    let (code, out, err) = ctl(&b_admin, &["logs", "talker", "-n", ns, "--tail", "1"]);
    assert!(code == 0 && out.starts_with("line "), "{out}{err}");
    println!("{test}: exec through a: hi, exit 3; b answers directly");

    drop(edge);
    a.stop();
    b.stop();
    let _ = kubectl(
        &kubeconfig,
        &["delete", "namespace", &namespace, "--wait=false"],
    );
    let _ = kubectl(&kubeconfig, &["delete", "node", &node, "--wait=false"]);
    let _ = kubectl(
        &kubeconfig,
        &[
            "delete",
            "lease",
            "-n",
            "kubeedge",
            &format!("edgehive-claim-{node}"),
            &format!("edgehive-replica-{a_name}"),
            &format!("edgehive-replica-{b_name}"),
            "--wait=false",
        ],
    );
}

/// A pod with a web server and a container that keeps writing lines.
fn chatty(node: &str) -> String {
    format!(
        "apiVersion: v1
kind: Pod
metadata:
  name: chatty
spec:
  nodeName: {node}
  terminationGracePeriodSeconds: 1
  containers:
  - name: web
    image: 127.0.0.1:5000/busybox:latest
    command: [\"sh\", \"-c\", \"mkdir -p /www && echo served-through-the-tunnel > /www/index.html && exec httpd -f -p 8080 -h /www\"]
  - name: talker
    image: 127.0.0.1:5000/busybox:latest
    command: [\"sh\", \"-c\", \"i=0; while true; do echo line $i; i=$((i+1)); sleep 0.1; done\"]
"
    )
}

/// kubectl's exit code, stdout and stderr, with `input` on its stdin.
fn kubectl_with_input(
    kubeconfig: &str,
    args: &[&str],
    input: &[u8],
) -> (Option<i32>, String, String) {
    let mut child = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("kubectl on the PATH");
    if let Some(mut stdin) = child.stdin.take() {
        stdin.write_all(input).expect("kubectl's stdin");
    }
    let out = child.wait_with_output().expect("kubectl ran");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// kubectl logs, exec (stdin, exit code) and port-forward on an edge pod:
/// kube-apiserver calls the kubelet API the Node names (cloudcore's), and
/// cloudcore carries each call through the node's link to its runtime.
#[test]
fn kubectl_logs_exec_and_port_forward_reach_an_edge_pod() {
    let test = "kubectl_logs_exec_and_port_forward_reach_an_edge_pod";
    let Some(kubeconfig) = kubeconfig(test) else {
        return;
    };
    let cluster = Cluster::start(kubeconfig, "eh-streams", "native");
    let port: i64 = cluster
        .stream
        .rsplit_once(':')
        .and_then(|(_, port)| port.parse().ok())
        .expect("the kubelet API's port");

    // The Node names cloudcore's kubelet API: its InternalIP and port.
    let node = until("the Node naming cloudcore's kubelet API", || {
        cluster
            .node()
            .filter(|n| n["status"]["daemonEndpoints"]["kubeletEndpoint"]["Port"] == port)
    });
    assert_eq!(
        node["status"]["addresses"][0]["type"], "InternalIP",
        "{node}"
    );
    assert_eq!(
        node["status"]["addresses"][0]["address"], "127.0.0.1",
        "{node}"
    );

    cluster.apply(&chatty(&cluster.node));
    until("the pod Running", || {
        cluster
            .pod("chatty")
            .filter(|p| p["status"]["phase"] == "Running" && p["status"]["podIP"].is_string())
    });
    let ns = cluster.namespace.as_str();

    // kubectl logs: what the container wrote, the last lines asked for.
    until("kubectl logs with twenty lines", || {
        let (ok, out) = kubectl(
            &cluster.kubeconfig,
            &["logs", "chatty", "-c", "talker", "-n", ns],
        );
        (ok && out.lines().count() >= 20).then_some(())
    });
    let (ok, logs) = kubectl(
        &cluster.kubeconfig,
        &["logs", "chatty", "-c", "talker", "-n", ns, "--tail=3"],
    );
    println!("kubectl logs --tail=3:\n{logs}");
    let numbers: Vec<u64> = logs
        .lines()
        .filter_map(|l| l.strip_prefix("line ")?.parse().ok())
        .collect();
    assert!(ok && numbers.len() == 3 && numbers[0] >= 17, "{logs}");
    assert!(numbers.windows(2).all(|w| w[1] == w[0] + 1), "{logs}");
    // Followed: lines keep coming until kubectl is told to stop.
    let (code, followed, err) = kubectl_with_input(
        &cluster.kubeconfig,
        &[
            "logs",
            "-f",
            "chatty",
            "-c",
            "talker",
            "-n",
            ns,
            "--limit-bytes=2000",
        ],
        b"",
    );
    assert_eq!(code, Some(0), "{err}");
    assert!(
        followed.len() >= 1000 && followed.len() <= 2000,
        "{} bytes: {err}",
        followed.len()
    );

    // kubectl exec: output on both streams, the exit code, stdin.
    let (code, out, err) = kubectl_with_input(
        &cluster.kubeconfig,
        &[
            "exec",
            "chatty",
            "-c",
            "web",
            "-n",
            ns,
            "--",
            "sh",
            "-c",
            "echo out; echo err >&2; exit 3",
        ],
        b"",
    );
    println!("kubectl exec: code {code:?}, stdout {out:?}, stderr {err:?}");
    assert_eq!(out, "out\n");
    assert!(err.contains("err"), "{err}");
    assert_eq!(code, Some(3), "{err}");
    let (code, out, err) = kubectl_with_input(
        &cluster.kubeconfig,
        &[
            "exec",
            "-i",
            "chatty",
            "-c",
            "web",
            "-n",
            ns,
            "--",
            "sh",
            "-c",
            "wc -c; cat /www/index.html",
        ],
        &[b'x'; 100_000],
    );
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(out, "100000\nserved-through-the-tunnel\n", "{err}");

    // kubectl port-forward: the pod's web server, fetched locally.
    let local = free_address();
    let local_port = local
        .rsplit_once(':')
        .map(|(_, p)| p.to_owned())
        .expect("port");
    let forward = Process::start(
        "kubectl",
        &[
            "--kubeconfig",
            &cluster.kubeconfig,
            "port-forward",
            "-n",
            ns,
            "pod/chatty",
            &format!("{local_port}:8080"),
        ],
    );
    forward.wait_for("Forwarding from", Duration::from_secs(30));
    for _ in 0..3 {
        let mut tcp = std::net::TcpStream::connect(&local).expect("the forwarded port");
        tcp.write_all(b"GET /index.html HTTP/1.0\r\n\r\n")
            .expect("request");
        let mut page = String::new();
        tcp.read_to_string(&mut page).expect("page");
        assert!(
            page.starts_with("HTTP/1.") && page.contains("served-through-the-tunnel"),
            "{page}"
        );
    }
    println!("kubectl port-forward: 3 pages fetched through the tunnel");
    drop(forward);

    // A pod on no edge node linked here: the kubelet API cannot reach it.
    let (ok, out) = kubectl(&cluster.kubeconfig, &["logs", "no-such-pod", "-n", ns]);
    assert!(!ok, "{out}");

    // Callers other than the API server's kubelet client: a certificate
    // from another CA is refused in the handshake; one the cluster's CA
    // signed for a user without rights on nodes/proxy gets 403.
    let cloud_ca = format!("{}/ca/ca.crt", cluster.cloud_dir());
    let path = format!("/containerLogs/{ns}/chatty/talker");
    let stranger = transports::tls::DevPki::new("stranger")
        .and_then(|ca| ca.client("kube-apiserver-kubelet-client"))
        .expect("a stranger's certificate");
    let answer = kubelet_api_get(&cluster.stream, &cloud_ca, stranger, &path);
    assert!(answer.is_err(), "{answer:?}");
    println!(
        "a certificate from another CA: {}",
        answer.err().unwrap_or_default()
    );
    let nobody = cluster_signed_identity(&cluster.kubeconfig, "edgehive-test-nobody");
    let answer = kubelet_api_get(&cluster.stream, &cloud_ca, nobody, &path).expect("an answer");
    println!(
        "a user without rights: {}",
        answer.lines().next().unwrap_or("")
    );
    assert!(answer.starts_with("HTTP/1.1 403"), "{answer}");
    assert!(answer.contains("subresource=proxy"), "{answer}");
}

/// The metrics API registered with the API server while a test runs.
struct ApiServiceGuard {
    kubeconfig: String,
}

impl Drop for ApiServiceGuard {
    fn drop(&mut self) {
        let _ = kubectl(
            &self.kubeconfig,
            &[
                "delete",
                "apiservice",
                "v1beta1.metrics.k8s.io",
                "--wait=false",
            ],
        );
        let _ = kubectl(
            &self.kubeconfig,
            &[
                "delete",
                "service",
                "cloudcore",
                "-n",
                "kubeedge",
                "--wait=false",
            ],
        );
    }
}

/// A cluster node whose kubelet answers only `/stats/summary` with fixed
/// figures (250m of CPU), reached by the API server's node proxy: the
/// Node is created here and names this server.
struct StubKubelet {
    node: String,
    kubeconfig: String,
    asked: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl StubKubelet {
    fn start(node: &str, host: std::net::IpAddr) -> StubKubelet {
        let kubeconfig = std::env::var("EDGEHIVE_TEST_KUBECONFIG").expect("a kubeconfig");
        let address = free_address();
        let port = address
            .rsplit_once(':')
            .map(|(_, p)| p.to_owned())
            .expect("port");
        let listener =
            std::net::TcpListener::bind(format!("{host}:{port}")).expect("the kubelet's port");
        let pki = transports::tls::DevPki::new("stub kubelet").expect("a CA");
        let (chain, key) = pki.server(&host.to_string()).expect("a certificate");
        let tls = transports::tls::server_config(chain, key, None).expect("TLS");
        let asked = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let summary = serde_json::json!({
            "node": {"nodeName": node, "cpu": {"time": "2026-11-26T10:00:00Z", "usageNanoCores": 250_000_000u64},
                     "memory": {"time": "2026-11-26T10:00:00Z", "workingSetBytes": 64u64 << 20}},
            "pods": [],
        })
        .to_string();
        let counter = asked.clone();
        std::thread::spawn(move || {
            for tcp in listener.incoming().flatten() {
                let Ok(connection) = tokio_rustls::rustls::ServerConnection::new(tls.clone())
                else {
                    continue;
                };
                let mut stream = tokio_rustls::rustls::StreamOwned::new(connection, tcp);
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") && stream.read(&mut byte).unwrap_or(0) == 1 {
                    head.push(byte[0]);
                }
                let head = String::from_utf8_lossy(&head).into_owned();
                let answer = match head.starts_with("GET /stats/summary") {
                    true => {
                        counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        format!(
                            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{summary}",
                            summary.len()
                        )
                    }
                    false => {
                        "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                            .to_owned()
                    }
                };
                let _ = stream.write_all(answer.as_bytes());
                let _ = stream.flush();
                stream.conn.send_close_notify();
                let _ = stream.flush();
            }
        });
        let manifest = serde_json::json!({
            "apiVersion": "v1", "kind": "Node", "metadata": {"name": node},
        });
        let file = std::env::temp_dir().join(format!("{node}.json"));
        std::fs::write(&file, manifest.to_string()).expect("manifest");
        let (ok, out) = kubectl(&kubeconfig, &["create", "-f", &file.to_string_lossy()]);
        assert!(ok, "{out}");
        let status = serde_json::json!({"status": {
            "addresses": [{"type": "InternalIP", "address": host.to_string()}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": port.parse::<u16>().expect("port")}},
        }});
        let (ok, out) = kubectl(
            &kubeconfig,
            &[
                "patch",
                "node",
                node,
                "--subresource=status",
                "--type=merge",
                "-p",
                &status.to_string(),
            ],
        );
        assert!(ok, "{out}");
        StubKubelet {
            node: node.to_owned(),
            kubeconfig,
            asked,
        }
    }

    fn asked(&self) -> usize {
        self.asked.load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl Drop for StubKubelet {
    fn drop(&mut self) {
        let _ = kubectl(
            &self.kubeconfig,
            &["delete", "node", &self.node, "--wait=false"],
        );
    }
}

/// The millicores a `kubectl top` line's second column shows.
fn top_millicores(line: &str) -> Option<u64> {
    let cpu = line.split_whitespace().nth(1)?;
    match cpu.strip_suffix('m') {
        Some(milli) => milli.parse().ok(),
        None => cpu.parse::<u64>().ok().map(|cores| cores * 1000),
    }
}

/// kubectl top on an edge pod and node: kube-apiserver's aggregation layer
/// calls cloudcore's metrics.k8s.io (the APIService names its Service,
/// the serving certificate checked against cloudcore's CA), which reads
/// the node's figures through its link; cloudcore authenticates the front
/// proxy by the request-header CA the API server publishes.
#[test]
fn kubectl_top_reads_an_edge_pod_through_the_aggregation_layer() {
    use base64::Engine;
    let test = "kubectl_top_reads_an_edge_pod_through_the_aggregation_layer";
    let Some(kubeconfig) = kubeconfig(test) else {
        return;
    };
    let cluster = Cluster::start(kubeconfig, "eh-top", "native");
    let (host, port) = cluster
        .metrics_server
        .rsplit_once(':')
        .expect("the metrics API's address");
    let cloud_ca = format!("{}/ca/ca.crt", cluster.cloud_dir());
    let ca_bundle =
        base64::engine::general_purpose::STANDARD.encode(std::fs::read(&cloud_ca).expect("CA"));
    // No kube-proxy in the test's cluster: the Service names the host
    // (ExternalName), where a cluster's Service selects cloudcore's pods.
    let registration = format!(
        "apiVersion: v1
kind: Service
metadata:
  name: cloudcore-metrics
  namespace: kubeedge
spec:
  type: ExternalName
  externalName: {host}
  ports:
  - port: {port}
---
apiVersion: apiregistration.k8s.io/v1
kind: APIService
metadata:
  name: v1beta1.metrics.k8s.io
spec:
  group: metrics.k8s.io
  version: v1beta1
  groupPriorityMinimum: 100
  versionPriority: 100
  service:
    name: cloudcore-metrics
    namespace: kubeedge
    port: {port}
  caBundle: {ca_bundle}
"
    );
    // A registration left by an earlier run would read Available at once.
    drop(ApiServiceGuard {
        kubeconfig: cluster.kubeconfig.clone(),
    });
    let (ok, out) = kubectl(
        &cluster.kubeconfig,
        &[
            "wait",
            "--for=delete",
            "apiservice/v1beta1.metrics.k8s.io",
            "--timeout=30s",
        ],
    );
    assert!(ok || out.contains("not found"), "{out}");
    let _guard = ApiServiceGuard {
        kubeconfig: cluster.kubeconfig.clone(),
    };
    let file = std::env::temp_dir().join(format!("{}-apiservice.yaml", cluster.node));
    std::fs::write(&file, registration).expect("manifest");
    let (ok, out) = kubectl(
        &cluster.kubeconfig,
        &["apply", "-f", &file.to_string_lossy()],
    );
    assert!(ok, "{out}");
    let available = until("the APIService Available", || {
        let service = get(
            &cluster.kubeconfig,
            &["get", "apiservice", "v1beta1.metrics.k8s.io"],
        )?;
        let condition = condition(&service, "Available")?;
        (condition["status"] == "True").then(|| condition.clone())
    });
    println!("APIService v1beta1.metrics.k8s.io: {available}");

    let burner = format!(
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
  - name: idle
    image: 127.0.0.1:5000/busybox:latest
    command: [sleep, \"3600\"]
",
        cluster.node
    );
    cluster.apply(&burner);
    let ns = cluster.namespace.as_str();
    let top = until("the burner's CPU in kubectl top", || {
        let (ok, out) = kubectl(
            &cluster.kubeconfig,
            &["top", "pod", "burner", "-n", ns, "--containers"],
        );
        let line = out.lines().find(|l| l.contains(" burner "))?;
        let millicores = top_millicores(line.split_once(' ')?.1.trim_start())?;
        // A core's share on a shared 2-core machine: well above idle.
        (ok && millicores >= 100).then(|| out.clone())
    });
    println!(
        "kubectl top pod burner --containers:
{top}"
    );
    let idle = top
        .lines()
        .find(|l| l.contains(" idle "))
        .and_then(|l| top_millicores(l.split_once(' ')?.1.trim_start()))
        .expect("the idle container's line");
    assert!(idle < 50, "{top}");
    let (ok, nodes) = kubectl(&cluster.kubeconfig, &["top", "node", &cluster.node]);
    println!(
        "kubectl top node:
{nodes}"
    );
    let line = nodes
        .lines()
        .find(|l| l.starts_with(&cluster.node))
        .unwrap_or_default();
    assert!(
        ok && top_millicores(line).is_some_and(|m| m >= 200),
        "{nodes}"
    );
    // Listed with the namespace's pods, as kubectl top pod without a name asks.
    let (ok, listed) = kubectl(&cluster.kubeconfig, &["top", "pod", "-n", ns]);
    assert!(
        ok && listed.lines().any(|l| l.starts_with("burner ")),
        "{listed}"
    );
    // By label, as kubectl top pod -l (and an autoscaler's selector) asks.
    let (ok, selected) = kubectl(
        &cluster.kubeconfig,
        &["top", "pod", "-n", ns, "-l", "app=burner"],
    );
    println!("kubectl top pod -l app=burner:\n{selected}");
    assert!(
        ok && selected.lines().any(|l| l.starts_with("burner ")),
        "{selected}"
    );
    let (_, none) = kubectl(
        &cluster.kubeconfig,
        &["top", "pod", "-n", ns, "-l", "app=nothing"],
    );
    assert!(!none.contains("burner"), "{none}");

    // A node of the cluster's own (no edge label): its kubelet read through
    // the API server's node proxy, listed beside the edge node.
    // (The API server proxies to no loopback address: the host's own.)
    let host = std::net::UdpSocket::bind("0.0.0.0:0")
        .and_then(|udp| udp.connect("192.0.2.255:9").map(|()| udp))
        .or_else(|_| {
            let udp = std::net::UdpSocket::bind("0.0.0.0:0")?;
            udp.connect("10.255.255.255:9").map(|()| udp)
        })
        .and_then(|udp| udp.local_addr())
        .map(|address| address.ip())
        .expect("a non-loopback address of this host");
    let kubelet = StubKubelet::start(&format!("{}-cloud", cluster.node), host);
    let listed = until("the cluster node's figures in kubectl top node", || {
        let (ok, listed) = kubectl(&cluster.kubeconfig, &["top", "node"]);
        let line = listed.lines().find(|l| l.starts_with(&kubelet.node))?;
        (ok && top_millicores(line).is_some()).then_some(listed)
    });
    println!("kubectl top node (an edge node and a cluster node):\n{listed}");
    for node in [&cluster.node, &kubelet.node] {
        assert!(
            listed.lines().any(|l| l.starts_with(node.as_str())),
            "{node}: {listed}"
        );
    }
    let cloud_line = listed
        .lines()
        .find(|l| l.starts_with(&kubelet.node))
        .unwrap_or_default();
    assert_eq!(top_millicores(cloud_line), Some(250), "{listed}");
    // Nodes by label: the edge node's labels from cloudcore's state, the
    // cluster node's from the API server.
    let (ok, edge_only) = kubectl(
        &cluster.kubeconfig,
        &["top", "node", "-l", "node-role.kubernetes.io/edge"],
    );
    println!("kubectl top node -l node-role.kubernetes.io/edge:\n{edge_only}");
    assert!(
        ok && edge_only.lines().any(|l| l.starts_with(&cluster.node)),
        "{edge_only}"
    );
    assert!(!edge_only.contains(&kubelet.node), "{edge_only}");
    let (ok, cloud_only) = kubectl(
        &cluster.kubeconfig,
        &["top", "node", "-l", "!node-role.kubernetes.io/edge"],
    );
    assert!(
        ok && cloud_only.lines().any(|l| l.starts_with(&kubelet.node)),
        "{cloud_only}"
    );
    assert!(kubelet.asked() > 0, "the kubelet was never asked");
    drop(kubelet);

    // A user without rights is refused; a certificate the front proxy's CA
    // did not sign cannot even call cloudcore's metrics API.
    let (ok, out) = kubectl(
        &cluster.kubeconfig,
        &[
            "top",
            "pod",
            "burner",
            "-n",
            ns,
            "--as",
            "edgehive-test-nobody",
        ],
    );
    assert!(!ok && out.contains("forbidden"), "{out}");
    let nobody = cluster_signed_identity(&cluster.kubeconfig, "edgehive-test-nobody-top");
    let path = format!("/apis/metrics.k8s.io/v1beta1/namespaces/{ns}/pods/burner");
    let answer = kubelet_api_get(&cluster.metrics_server, &cloud_ca, nobody, &path);
    println!("a certificate from the cluster's CA at cloudcore's metrics API: {answer:?}");
    assert!(
        answer.as_ref().is_err_and(|err| err.contains("UnknownCA")),
        "{answer:?}"
    );
}

/// GET `path` from the kubelet API at `address`, trusting `ca_file`,
/// presenting `identity`: the whole answer, or why there is none.
fn kubelet_api_get(
    address: &str,
    ca_file: &str,
    identity: transports::tls::Identity,
    path: &str,
) -> Result<String, String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let roots =
        transports::tls::certs_from_pem(&std::fs::read(ca_file).map_err(|e| e.to_string())?)
            .map_err(|e| e.to_string())?;
    let config =
        transports::tls::client_config(&roots, Some(identity)).map_err(|e| e.to_string())?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    runtime.block_on(async {
        let tcp = tokio::net::TcpStream::connect(address)
            .await
            .map_err(|e| e.to_string())?;
        let name = tokio_rustls::rustls::pki_types::ServerName::try_from("127.0.0.1")
            .map_err(|e| e.to_string())?;
        let mut tls = tokio_rustls::TlsConnector::from(config)
            .connect(name, tcp)
            .await
            .map_err(|e| e.to_string())?;
        let request =
            format!("GET {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n");
        tls.write_all(request.as_bytes())
            .await
            .map_err(|e| e.to_string())?;
        let mut answer = Vec::new();
        tls.read_to_end(&mut answer)
            .await
            .map_err(|e| e.to_string())?;
        Ok(String::from_utf8_lossy(&answer).into_owned())
    })
}

/// A client certificate for `user` signed by the cluster's CA, through the
/// CertificateSigningRequest API (approved with the test's admin rights).
fn cluster_signed_identity(kubeconfig: &str, user: &str) -> transports::tls::Identity {
    use base64::Engine;
    let key = rcgen::KeyPair::generate().expect("a key");
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, user);
    let request = params.serialize_request(&key).expect("a request");
    let pem = request.pem().expect("PEM");
    let name = format!("{user}-{}", std::process::id());
    let csr = serde_json::json!({
        "apiVersion": "certificates.k8s.io/v1",
        "kind": "CertificateSigningRequest",
        "metadata": {"name": name},
        "spec": {
            "request": base64::engine::general_purpose::STANDARD.encode(pem),
            "signerName": "kubernetes.io/kube-apiserver-client",
            "usages": ["client auth"],
            "expirationSeconds": 600,
        },
    });
    let file = std::env::temp_dir().join(format!("{name}.json"));
    std::fs::write(&file, csr.to_string()).expect("CSR file");
    let (ok, out) = kubectl(kubeconfig, &["create", "-f", &file.to_string_lossy()]);
    assert!(ok, "{out}");
    let (ok, out) = kubectl(kubeconfig, &["certificate", "approve", &name]);
    assert!(ok, "{out}");
    let issued = until("the CSR signed", || {
        let csr = get(kubeconfig, &["get", "csr", &name])?;
        csr["status"]["certificate"].as_str().map(str::to_owned)
    });
    let _ = kubectl(kubeconfig, &["delete", "csr", &name]);
    let pem = base64::engine::general_purpose::STANDARD
        .decode(issued)
        .expect("base64");
    let chain = transports::tls::certs_from_pem(&pem).expect("the certificate");
    let key = transports::tls::key_from_pem(key.serialize_pem().as_bytes()).expect("the key");
    (chain, key)
}

/// `GET path` on an edge's MetaServer with `token` as a bearer token if
/// given: the status code and the body as JSON (Null if it is not).
fn metaserver_get(metaserver: &str, path: &str, token: Option<&str>) -> (u16, Value) {
    let mut stream = std::net::TcpStream::connect(metaserver).expect("MetaServer");
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    let authorization = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    let request =
        format!("GET {path} HTTP/1.0\r\nHost: edge\r\n{authorization}Connection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).expect("request");
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    let code = answer
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or(0);
    let body = answer.split_once("\r\n\r\n").map_or("", |(_, body)| body);
    (code, serde_json::from_str(body).unwrap_or(Value::Null))
}

/// KubeEdge's `requireAuthorization`: an edge application with a service
/// account token reads from the edge's MetaServer what RBAC lets that
/// account read (kube-apiserver's TokenReview and SubjectAccessReview,
/// asked by cloudcore for the node), is refused the rest (403) and a bad
/// token (401); without a token, loopback is served as before. With the
/// cloud gone, kept decisions still answer and a new one is 503.
#[test]
fn metaserver_serves_a_service_account_what_rbac_allows() {
    let Some(kubeconfig) = kubeconfig("metaserver_serves_a_service_account_what_rbac_allows")
    else {
        return;
    };
    let mut cluster = Cluster::start_with(kubeconfig, "metaauth", "native", false);
    // The edge again, now with requireAuthorization.
    drop(cluster.edge.take());
    cluster.edge_run = cluster
        .edge_run
        .clone()
        .flag("--metaserver-require-authorization");
    cluster.start_edge();
    let ns = cluster.namespace.clone();
    let kc = cluster.kubeconfig.clone();
    let node = cluster.node.clone();
    let ready = cluster
        .edge
        .as_ref()
        .expect("edge")
        .wait_for("metaserver ready", Duration::from_secs(30));
    assert!(ready.contains("require_authorization=true"), "{ready}");
    cluster
        .edge
        .as_ref()
        .expect("edge")
        .wait_for("connected to the cloud", Duration::from_secs(30));

    // A service account that may get and list configmaps in the namespace.
    for args in [
        vec!["create", "serviceaccount", "reader", "-n", &ns],
        vec![
            "create",
            "role",
            "configmap-reader",
            "--verb=get,list",
            "--resource=configmaps",
            "-n",
            &ns,
        ],
        vec![
            "create",
            "rolebinding",
            "configmap-reader",
            "--role=configmap-reader",
            &format!("--serviceaccount={ns}:reader"),
            "-n",
            &ns,
        ],
    ] {
        let (ok, out) = kubectl(&kc, &args);
        assert!(ok || out.contains("AlreadyExists"), "{out}");
    }
    // Its token, from the API server's TokenRequest.
    let (ok, token) = kubectl(&kc, &["create", "token", "reader", "-n", &ns]);
    assert!(ok, "{token}");
    let token = token.trim().to_owned();

    // A configmap and a secret the edge holds: a pod bound to it names
    // both.
    cluster.apply(&format!(
        "apiVersion: v1
kind: ConfigMap
metadata:
  name: settings
data:
  mode: edge
---
apiVersion: v1
kind: Secret
metadata:
  name: keys
stringData:
  key: hidden
---
apiVersion: v1
kind: Pod
metadata:
  name: reader-app
spec:
  nodeName: {node}
  serviceAccountName: reader
  automountServiceAccountToken: false
  containers:
  - name: app
    image: 127.0.0.1:5000/busybox:latest
    command: [sleep, \"3600\"]
    envFrom:
    - configMapRef:
        name: settings
    - secretRef:
        name: keys
"
    ));
    let configmap = format!("/api/v1/namespaces/{ns}/configmaps/settings");
    let secret = format!("/api/v1/namespaces/{ns}/secrets/keys");
    // Without a token, from loopback: served as before.
    until("the configmap and the secret at the edge", || {
        let (code, object) = metaserver_get(&cluster.metaserver, &configmap, None);
        let (secret_code, _) = metaserver_get(&cluster.metaserver, &secret, None);
        (code == 200 && object["data"]["mode"] == "edge" && secret_code == 200).then_some(())
    });

    // With the token: what RBAC allows. (edgehub logs its connection a
    // moment before it takes questions; until then a review gets 503.)
    let (code, object) = until("a review answered by the cloud", || {
        let (code, object) = metaserver_get(&cluster.metaserver, &configmap, Some(&token));
        (code != 503).then_some((code, object))
    });
    assert_eq!(code, 200, "{object}");
    assert_eq!(object["data"]["mode"], "edge");
    let list = format!("/api/v1/namespaces/{ns}/configmaps");
    let (code, listed) = metaserver_get(&cluster.metaserver, &list, Some(&token));
    assert_eq!(code, 200, "{listed}");
    assert_eq!(listed["kind"], "ConfigMapList");
    // Not a secret: 403, as kube-apiserver words it.
    let (code, status) = metaserver_get(&cluster.metaserver, &secret, Some(&token));
    assert_eq!(code, 403, "{status}");
    assert_eq!(status["kind"], "Status");
    assert_eq!(status["reason"], "Forbidden");
    let message = status["message"].as_str().unwrap_or_default();
    assert!(
        message.contains(&format!("system:serviceaccount:{ns}:reader"))
            && message.contains("secrets"),
        "{message}"
    );
    // Not a watch either (the role grants get and list only).
    let (code, _) = metaserver_get(
        &cluster.metaserver,
        &format!("{list}?watch=true"),
        Some(&token),
    );
    assert_eq!(code, 403);
    // A token the API server did not issue: 401.
    let (code, status) = metaserver_get(&cluster.metaserver, &configmap, Some("not-a-token"));
    assert_eq!(code, 401, "{status}");
    assert_eq!(status["reason"], "Unauthorized");
    println!("allowed 200, secret 403 ({message}), bad token 401, no token on loopback 200");

    // Tokens bound to a pod (as the kubelet projects them into pods) name
    // the pod's node: valid on this node, refused on another's.
    let other = format!("{node}-other");
    cluster.apply(&format!(
        "apiVersion: v1
kind: Node
metadata:
  name: {other}
---
apiVersion: v1
kind: Pod
metadata:
  name: elsewhere-app
spec:
  nodeName: {other}
  serviceAccountName: reader
  automountServiceAccountToken: false
  containers:
  - name: app
    image: 127.0.0.1:5000/busybox:latest
"
    ));
    let bound_token = |pod: &str| {
        let (ok, token) = kubectl(
            &kc,
            &[
                "create",
                "token",
                "reader",
                "-n",
                &ns,
                "--bound-object-kind",
                "Pod",
                "--bound-object-name",
                pod,
            ],
        );
        assert!(ok, "{token}");
        token.trim().to_owned()
    };
    let here = bound_token("reader-app");
    let (code, object) = metaserver_get(&cluster.metaserver, &configmap, Some(&here));
    assert_eq!(code, 200, "{object}");
    let elsewhere = bound_token("elsewhere-app");
    let (code, status) = metaserver_get(&cluster.metaserver, &configmap, Some(&elsewhere));
    let _ = kubectl(&kc, &["delete", "node", &other, "--wait=false"]);
    assert_eq!(code, 401, "{status}");
    let reason = status["message"].as_str().unwrap_or_default().to_owned();
    assert!(reason.contains(&other), "{reason}");
    println!("a token bound to a pod here 200, to a pod on another node 401 ({reason})");
    // Tokens are never logged, at the edge or in the cloud.
    let logged = |process: &Option<Process>| {
        process
            .as_ref()
            .map(Process::take_lines)
            .unwrap_or_default()
    };
    let lines = [logged(&cluster.edge), logged(&cluster.cloud)].concat();
    assert!(
        !lines
            .iter()
            .any(|line| line.contains(&token) || line.contains("not-a-token")),
        "a token in the logs"
    );

    // The cloud gone: the kept decision answers, a new question cannot.
    drop(cluster.cloud.take());
    let (code, _) = metaserver_get(&cluster.metaserver, &configmap, Some(&token));
    assert_eq!(code, 200);
    let (code, status) = metaserver_get(
        &cluster.metaserver,
        &format!("/api/v1/namespaces/{ns}/pods"),
        Some(&token),
    );
    assert_eq!(code, 503, "{status}");
    let message = status["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("authorization needs the cloud"),
        "{message}"
    );
    println!("cloud gone: kept decision 200, new question 503 ({message})");
}

/// cloudcore's MutatingWebhookConfiguration while a test runs: deleted at
/// the end, also on failure, so no pod creation elsewhere waits on a
/// webhook whose cloudcore is gone.
struct WebhookGuard {
    kubeconfig: String,
    /// The MutatingWebhookConfiguration's name.
    name: String,
}

impl Drop for WebhookGuard {
    fn drop(&mut self) {
        let _ = kubectl(
            &self.kubeconfig,
            &[
                "delete",
                "mutatingwebhookconfiguration",
                &self.name,
                "--ignore-not-found",
                "--wait=false",
            ],
        );
    }
}

/// Keeps the webhook configuration `name` to the test's own namespace
/// (other tests create edge pods on this API server meanwhile, and expect
/// their own cloudcore's window).
fn webhook_only_for(cluster: &Cluster, name: &str) {
    let only_here = format!(
        r#"[{{"op": "replace", "path": "/webhooks/0/namespaceSelector", "value": {{"matchLabels": {{"kubernetes.io/metadata.name": "{}"}}}}}}]"#,
        cluster.namespace
    );
    let (ok, out) = kubectl(
        &cluster.kubeconfig,
        &[
            "patch",
            "mutatingwebhookconfiguration",
            name,
            "--type=json",
            "-p",
            &only_here,
        ],
    );
    assert!(ok, "{out}");
}

/// A pod of `namespace` for `kubectl create`: `placement` is its spec's
/// nodeName or nodeSelector lines.
fn sleeper(name: &str, placement: &str) -> String {
    format!(
        "apiVersion: v1
kind: Pod
metadata:
  name: {name}
spec:
{placement}
  tolerations:
  - key: node-role.kubernetes.io/edge
    operator: Exists
  terminationGracePeriodSeconds: 1
  containers:
  - name: main
    image: 127.0.0.1:5000/busybox:latest
    command: [\"sh\", \"-c\", \"exec sleep 3600\"]
"
    )
}

/// The `tolerationSeconds` of `pod`'s NoExecute tolerations of the
/// offline taints, by key.
fn offline_tolerations(pod: &Value) -> BTreeMap<String, Value> {
    pod["spec"]["tolerations"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|t| t["effect"] == "NoExecute")
        .filter_map(|t| {
            let key = t["key"].as_str()?;
            key.starts_with("node.kubernetes.io/")
                .then(|| (key.to_owned(), t["tolerationSeconds"].clone()))
        })
        .collect()
}

/// The admission webhook: cloudcore (Kubernetes mode, `--admission`, a
/// one-hour window) registers `edgehive-cloudcore`, kube-apiserver calls
/// it over TLS as kubectl creates pods, and a pod bound to the edge node
/// is created with its default offline tolerations already lengthened:
/// the object kubectl gets back from its create carries them, the edge
/// holds that very version, and no one but its creator ever wrote it
/// (`managedFields`). A pod placed by an edge nodeSelector is mutated at
/// creation too; one for another node is left at the API server's 300 s.
#[test]
fn the_admission_webhook_creates_edge_pods_with_lengthened_tolerations() {
    let test = "the_admission_webhook_creates_edge_pods_with_lengthened_tolerations";
    let Some(kubeconfig) = kubeconfig(test) else {
        return;
    };
    // Before cloudcore starts: whatever happens next, it is deleted.
    let _webhook = WebhookGuard {
        kubeconfig: kubeconfig.clone(),
        name: "edgehive-cloudcore".to_owned(),
    };
    let config = std::env::temp_dir().join(format!("{test}-{}.yaml", std::process::id()));
    std::fs::write(&config, "kubeAPIConfig:\n  offlineGraceSeconds: 3600\n").expect("config");
    let admission = free_address();
    let config = config.to_string_lossy().into_owned();
    let cluster = Cluster::start_with_cloud(
        kubeconfig,
        "admission",
        "native",
        false,
        &["--config", &config],
        &["--admission", &admission],
    );
    let kc = cluster.kubeconfig.clone();
    let ns = cluster.namespace.clone();

    // Registered before cloudcore said it was ready, as configured.
    let registered = get(
        &kc,
        &["get", "mutatingwebhookconfiguration", "edgehive-cloudcore"],
    )
    .expect("the MutatingWebhookConfiguration, registered at start");
    let webhook = &registered["webhooks"][0];
    assert_eq!(
        webhook["clientConfig"]["url"],
        format!("https://{admission}/mutate-pods"),
        "{registered}"
    );
    let bundle = base64::Engine::decode(
        &base64::engine::general_purpose::STANDARD,
        webhook["clientConfig"]["caBundle"]
            .as_str()
            .expect("caBundle"),
    )
    .expect("base64");
    let ca = std::fs::read(format!("{}/ca/ca.crt", cluster.cloud_dir())).expect("the cloud CA");
    assert_eq!(bundle, ca, "the caBundle is the cloud's CA");
    assert_eq!(webhook["failurePolicy"], "Ignore");
    assert_eq!(webhook["sideEffects"], "None");
    assert_eq!(webhook["timeoutSeconds"], 5);
    assert_eq!(webhook["reinvocationPolicy"], "Never");
    assert_eq!(
        webhook["admissionReviewVersions"],
        serde_json::json!(["v1"])
    );
    assert_eq!(
        webhook["rules"],
        serde_json::json!([{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"], "scope": "Namespaced"}])
    );
    assert_eq!(
        webhook["namespaceSelector"]["matchExpressions"][0]["values"],
        serde_json::json!(["kube-system"])
    );
    // Other tests may create edge pods on this API server meanwhile, and
    // expect their own cloudcore's window: this test's webhook is kept to
    // its own namespace from here on.
    let only_here = format!(
        r#"[{{"op": "replace", "path": "/webhooks/0/namespaceSelector", "value": {{"matchLabels": {{"kubernetes.io/metadata.name": "{ns}"}}}}}}]"#
    );
    let (ok, out) = kubectl(
        &kc,
        &[
            "patch",
            "mutatingwebhookconfiguration",
            "edgehive-cloudcore",
            "--type=json",
            "-p",
            &only_here,
        ],
    );
    assert!(ok, "{out}");

    let create = |name: &str, placement: &str, dry_run: bool| -> Value {
        let file = std::env::temp_dir().join(format!("{}-{name}.yaml", cluster.node));
        std::fs::write(&file, sleeper(name, placement)).expect("manifest");
        let file = file.to_string_lossy().into_owned();
        let mut args = vec!["create", "-n", &ns, "-f", &file, "-o", "json"];
        if dry_run {
            args.push("--dry-run=server");
        }
        let (ok, out) = kubectl(&kc, &args);
        assert!(ok, "kubectl create: {out}");
        serde_json::from_str(&out).expect("the created pod as JSON")
    };
    let lengthened: BTreeMap<String, Value> = [
        ("node.kubernetes.io/not-ready".to_owned(), Value::from(3600)),
        (
            "node.kubernetes.io/unreachable".to_owned(),
            Value::from(3600),
        ),
    ]
    .into();
    let on_the_node = format!("  nodeName: {}", cluster.node);

    // cloudcore knows the node as an edge node once its Node watch has
    // brought it (just after the node connected): server-side dry runs of
    // the pod, which pass through admission and store nothing, show when.
    until("cloudcore's webhook knowing the edge node", || {
        let tried = create("bound", &on_the_node, true);
        (offline_tolerations(&tried) == lengthened).then_some(())
    });

    // Bound to the edge node: created lengthened.
    let bound = create("bound", &on_the_node, false);
    println!("as created: {}", bound["spec"]["tolerations"]);
    assert_eq!(offline_tolerations(&bound), lengthened, "{bound}");
    let created_version = bound["metadata"]["resourceVersion"]
        .as_str()
        .expect("a resourceVersion")
        .to_owned();

    // Left to the scheduler, but only edge nodes match: created lengthened.
    let selected = create(
        "selected",
        &format!(
            "  nodeSelector:\n    node-role.kubernetes.io/edge: \"\"\n    kubernetes.io/hostname: {}",
            cluster.node
        ),
        false,
    );
    assert_eq!(offline_tolerations(&selected), lengthened, "{selected}");

    // Another node: the API server's default stays.
    let elsewhere = create("elsewhere", "  nodeName: not-an-edge-node", false);
    let default: BTreeMap<String, Value> = [
        ("node.kubernetes.io/not-ready".to_owned(), Value::from(300)),
        (
            "node.kubernetes.io/unreachable".to_owned(),
            Value::from(300),
        ),
    ]
    .into();
    assert_eq!(offline_tolerations(&elsewhere), default, "{elsewhere}");

    // Delivered to the edge as created: cloudcore wrote nothing first.
    let held = until("the bound pod at the edge", || {
        cluster.held_pods().get("bound").copied()
    });
    assert_eq!(
        held.to_string(),
        created_version,
        "the edge holds the pod as created"
    );
    let pod = get(
        &kc,
        &["get", "pod", "bound", "-n", &ns, "--show-managed-fields"],
    )
    .expect("the pod");
    assert_eq!(
        pod["metadata"]["resourceVersion"],
        created_version.as_str(),
        "no write since its creation: {pod}"
    );
    let managers: Vec<(String, String)> = pod["metadata"]["managedFields"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|entry| {
            (
                entry["manager"].as_str().unwrap_or_default().to_owned(),
                entry["operation"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    println!(
        "managedFields: {managers:?}, resourceVersion {created_version}, held at the edge {held}"
    );
    assert_eq!(
        managers,
        [("kubectl-create".to_owned(), "Update".to_owned())],
        "only its creator wrote it"
    );
}

/// A Node that stays Ready, so that the node lifecycle controller never
/// sees every node NotReady (its "master disruption mode", where it
/// evicts nothing) while the test's edge is away. No edge backs it: the
/// test writes its Ready condition once and renews its Lease every 5 s
/// from a thread, as a kubelet would. An edge linked to the test's
/// cloudcore would not do: with the test's 2 s keepalive a loaded machine
/// drops its link now and then, each drop writes it NotReady, and the
/// controller's disruption mode then lifts the taints and restarts every
/// toleration (the test failed so once, its pods never evicted). It
/// carries no edge label (no cloudcore acts on it) and a NoSchedule taint
/// (no pod lands on it).
struct Witness {
    kubeconfig: String,
    node: String,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    renewing: Option<std::thread::JoinHandle<()>>,
}

impl Witness {
    fn start(kubeconfig: &str, name: &str) -> Witness {
        let node = format!("{name}-{}", std::process::id());
        // A Lease's renewTime is a MicroTime: six digits of fraction.
        let now = || {
            let at = jiff::Timestamp::now();
            format!(
                "{}.{:06}Z",
                at.strftime("%Y-%m-%dT%H:%M:%S"),
                at.subsec_microsecond()
            )
        };
        let create = |object: Value| {
            let file = format!(
                "{}/{node}-{}.json",
                std::env::temp_dir().display(),
                object["kind"].as_str().unwrap_or("object")
            );
            std::fs::write(&file, object.to_string()).expect("witness manifest");
            let (ok, out) = kubectl(kubeconfig, &["create", "-f", &file]);
            let _ = std::fs::remove_file(&file);
            assert!(ok || out.contains("AlreadyExists"), "{out}");
        };
        create(serde_json::json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": node},
            "spec": {"taints": [{"key": "edgehive.io/witness", "effect": "NoSchedule"}]},
        }));
        let at = jiff::Timestamp::now()
            .strftime("%Y-%m-%dT%H:%M:%SZ")
            .to_string();
        let ready = serde_json::json!({"status": {"conditions": [{
            "type": "Ready", "status": "True", "reason": "Witness",
            "message": "kept Ready by the test", "lastHeartbeatTime": at, "lastTransitionTime": at,
        }]}});
        let (ok, out) = kubectl(
            kubeconfig,
            &[
                "patch",
                "node",
                &node,
                "--subresource=status",
                "--type=merge",
                "-p",
                &ready.to_string(),
            ],
        );
        assert!(ok, "{out}");
        create(serde_json::json!({
            "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": node, "namespace": "kube-node-lease"},
            "spec": {"holderIdentity": node, "leaseDurationSeconds": 40, "renewTime": now()},
        }));
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let renewing = {
            let (kubeconfig, node, stop) = (kubeconfig.to_owned(), node.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let renewed = serde_json::json!({"spec": {"renewTime": now()}});
                    let _ = kubectl(
                        &kubeconfig,
                        &[
                            "patch",
                            "lease",
                            &node,
                            "-n",
                            "kube-node-lease",
                            "--type=merge",
                            "-p",
                            &renewed.to_string(),
                        ],
                    );
                    // A kubelet renews every 10 s; 5 s leaves room on a
                    // loaded API server within the controller's 50 s grace.
                    for _ in 0..50 {
                        if stop.load(std::sync::atomic::Ordering::Relaxed) {
                            return;
                        }
                        std::thread::sleep(Duration::from_millis(100));
                    }
                }
            })
        };
        Witness {
            kubeconfig: kubeconfig.to_owned(),
            node,
            stop,
            renewing: Some(renewing),
        }
    }
}

impl Drop for Witness {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(renewing) = self.renewing.take() {
            let _ = renewing.join();
        }
        let _ = kubectl(
            &self.kubeconfig,
            &["delete", "node", &self.node, "--wait=false"],
        );
        let _ = kubectl(
            &self.kubeconfig,
            &[
                "delete",
                "lease",
                &self.node,
                "-n",
                "kube-node-lease",
                "--wait=false",
            ],
        );
    }
}

/// A `kubectl get --watch --output-watch-events` of some objects: the
/// API server's watch events (the objects that exist first, as `ADDED`),
/// handed over as kubectl prints them.
struct Watch {
    kubectl: std::process::Child,
    events: std::sync::mpsc::Receiver<Value>,
}

impl Watch {
    /// Watches what `kubectl get ARGS` names.
    fn start(kubeconfig: &str, args: &[&str]) -> Watch {
        let mut kubectl = Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .args(args)
            .args(["--watch", "--output-watch-events", "-o", "json"])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("kubectl on the PATH");
        let stdout = kubectl.stdout.take().expect("kubectl's stdout");
        let (tx, events) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let stream = serde_json::Deserializer::from_reader(std::io::BufReader::new(stdout));
            for event in stream.into_iter::<Value>().map_while(Result::ok) {
                if tx.send(event).is_err() {
                    break;
                }
            }
        });
        Watch { kubectl, events }
    }

    /// Hands each event (`type`, `object`) to `check` until it gives
    /// something back, for up to `limit`.
    fn until<T>(
        &self,
        what: &str,
        limit: Duration,
        mut check: impl FnMut(&str, &Value) -> Option<T>,
    ) -> T {
        let deadline = std::time::Instant::now() + limit;
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            let event = match self.events.recv_timeout(left) {
                Ok(event) => event,
                Err(err) => panic!("never: {what} ({err:?} within {limit:?})"),
            };
            let kind = event["type"].as_str().unwrap_or_default();
            if let Some(found) = check(kind, &event["object"]) {
                return found;
            }
        }
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        let _ = self.kubectl.kill();
        let _ = self.kubectl.wait();
    }
}

/// The NoExecute taint `key` of a Node, if it has it.
fn taint<'a>(node: &'a Value, key: &str) -> Option<&'a Value> {
    node["spec"]["taints"]
        .as_array()?
        .iter()
        .find(|t| t["key"] == key && t["effect"] == "NoExecute")
}

/// Whether a Node carries either offline taint.
fn offline_tainted(node: &Value) -> bool {
    taint(node, "node.kubernetes.io/unreachable").is_some()
        || taint(node, "node.kubernetes.io/not-ready").is_some()
}

/// Seconds since the epoch of an API server timestamp.
fn epoch_seconds(at: &Value) -> i64 {
    at.as_str()
        .and_then(|at| at.parse::<jiff::Timestamp>().ok())
        .map(|at| at.as_second())
        .unwrap_or_else(|| panic!("not a timestamp: {at}"))
}

/// The containers containerd holds for `node`'s pods, through CRI:
/// `<namespace>/<pod>` → every container (id, state), exited ones too.
fn edge_containers(node: &str) -> BTreeMap<String, Vec<(String, String)>> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let inventory = runtime.block_on(async {
        let cri = edged::cri::Cri::connect(&support::cri_socket())
            .await
            .expect("containerd");
        edged::testing::inventory(&cri)
            .await
            .expect("CRI inventory")
    });
    let mut containers: BTreeMap<String, Vec<(String, String)>> = BTreeMap::new();
    for held in inventory.tests {
        if held.node == node && held.kind == "container" {
            containers
                .entry(held.pod)
                .or_default()
                .push((held.id, held.state));
        }
    }
    containers
}

/// A pod for `node` whose offline tolerations are the API server's
/// defaults (`seconds` None) or the user's own of `seconds`.
fn offline_pod(name: &str, node: &str, seconds: Option<u32>) -> String {
    let own = match seconds {
        None => String::new(),
        Some(seconds) => format!(
            "
  - key: node.kubernetes.io/unreachable
    operator: Exists
    effect: NoExecute
    tolerationSeconds: {seconds}
  - key: node.kubernetes.io/not-ready
    operator: Exists
    effect: NoExecute
    tolerationSeconds: {seconds}"
        ),
    };
    format!(
        "apiVersion: v1
kind: Pod
metadata:
  name: {name}
spec:
  nodeName: {node}
  tolerations:
  - key: node-role.kubernetes.io/edge
    operator: Exists{own}
  terminationGracePeriodSeconds: 1
  containers:
  - name: main
    image: 127.0.0.1:5000/busybox:latest
    command: [\"sh\", \"-c\", \"exec sleep 3600\"]
"
    )
}

/// A node offline past the API server's default 300 s toleration keeps its
/// pods: cloudcore's window (90 s here, a day by default) governs, not the
/// default.
///
/// cloudcore runs with its admission webhook (kept to this test's
/// namespace), so two pods bound to the edge node are created with their
/// default `not-ready` / `unreachable` tolerations lengthened to the
/// window; a control pod carries the user's own 10 s ones, which cloudcore
/// leaves alone. edgecore is killed (SIGKILL): the node lifecycle
/// controller taints the Node `unreachable:NoExecute` (awaited by watch)
/// and the taint manager evicts the control pod once its 10 s run out,
/// while the window's pods are not evicted and their containers keep
/// running at the edge (containerd, through CRI).
///
/// The edge node is alone in a zone of its own and a witness Node
/// stays Ready meanwhile ([`Witness`]): the node lifecycle controller stops tainting a
/// zone whose nodes are mostly NotReady, and every zone while none is
/// Ready (its "master disruption mode"), which the other tests' nodes on
/// a shared API server would otherwise decide.
///
/// Both ends of the window are shown, in about three minutes, because
/// each proves what the other cannot: first the edge returns within the
/// window, and the same pods (same uids) are Running, never deleted, their
/// containers the very ones (not restarted); the control pod's eviction is
/// carried out at the edge. The time from edgecore's start to its link
/// and to the Node Ready and untainted is printed. Then the edge is killed
/// again and left away: the window's pods are evicted once the window
/// after the new taint ends, not before (their deletion is stamped no
/// earlier than the taint's time plus the window): the window is what
/// governs. The edge then returns, offline longer than the node lifecycle
/// controller's grace period, and the Node turns Ready again (the time is
/// printed) while the evictions are carried out at the edge. A shorter window would leave too little room for the edge's
/// return on a loaded machine; a longer one only adds waiting.
#[test]
fn a_node_offline_past_the_default_toleration_keeps_its_pods() {
    let test = "a_node_offline_past_the_default_toleration_keeps_its_pods";
    let Some(kubeconfig) = kubeconfig(test) else {
        return;
    };
    const WINDOW: i64 = 90;
    const CONTROL: u32 = 10;
    let name = format!("edgehive-test-offline-{}", std::process::id());
    let _webhook = WebhookGuard {
        kubeconfig: kubeconfig.clone(),
        name: name.clone(),
    };
    let config = std::env::temp_dir().join(format!("{name}.yaml"));
    std::fs::write(
        &config,
        format!(
            "kubeAPIConfig:\n  offlineGraceSeconds: {WINDOW}\nmodules:\n  admission:\n    configurationName: {name}\n"
        ),
    )
    .expect("config");
    let config = config.to_string_lossy().into_owned();
    let admission = free_address();
    let mut cluster = Cluster::prepare(
        kubeconfig,
        "offline-window",
        "native",
        true,
        &["--config", &config],
        &["--admission", &admission],
    );
    webhook_only_for(&cluster, &name);
    let (kc, ns, node) = (
        cluster.kubeconfig.clone(),
        cluster.namespace.clone(),
        cluster.node.clone(),
    );
    // The Node, created before its edge links (cloudcore then writes its
    // status only), alone in a zone of its own; and a witness node that
    // stays Ready: the node lifecycle controller taints no node of a zone
    // with several nodes mostly NotReady (other tests' leftovers on this
    // API server), nor any node while every zone is down.
    let zone = format!("edgehive-offline-{}", std::process::id());
    let manifest = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": node,
            "labels": {
                "node-role.kubernetes.io/edge": "",
                "kubernetes.io/hostname": node,
                "kubernetes.io/os": std::env::consts::OS,
                "topology.kubernetes.io/zone": zone,
            },
        },
    });
    let file = std::env::temp_dir().join(format!("{node}-node.json"));
    std::fs::write(&file, manifest.to_string()).expect("manifest");
    let (ok, out) = kubectl(&kc, &["create", "-f", &file.to_string_lossy()]);
    assert!(ok, "{out}");
    cluster.start_edge();
    let _witness = Witness::start(&cluster.kubeconfig, "offline-witness");
    let window: BTreeMap<String, Value> = [
        (
            "node.kubernetes.io/not-ready".to_owned(),
            Value::from(WINDOW),
        ),
        (
            "node.kubernetes.io/unreachable".to_owned(),
            Value::from(WINDOW),
        ),
    ]
    .into();
    let create = |manifest: String, dry_run: bool| -> Value {
        let file = std::env::temp_dir().join(format!("{node}-{}.yaml", fastrand::u32(..)));
        std::fs::write(&file, manifest).expect("manifest");
        let file = file.to_string_lossy().into_owned();
        let mut args = vec!["create", "-n", &ns, "-f", &file, "-o", "json"];
        if dry_run {
            args.push("--dry-run=server");
        }
        let (ok, out) = kubectl(&kc, &args);
        assert!(ok, "kubectl create: {out}");
        serde_json::from_str(&out).expect("the created pod as JSON")
    };
    until("cloudcore's webhook knowing the edge node", || {
        let tried = create(offline_pod("kept-a", &node, None), true);
        (offline_tolerations(&tried) == window).then_some(())
    });
    let mut uids = BTreeMap::new();
    for kept in ["kept-a", "kept-b"] {
        let pod = create(offline_pod(kept, &node, None), false);
        assert_eq!(offline_tolerations(&pod), window, "lengthened: {pod}");
        uids.insert(kept.to_owned(), pod["metadata"]["uid"].clone());
    }
    let control = create(offline_pod("control", &node, Some(CONTROL)), false);
    let own: BTreeMap<String, Value> = window
        .keys()
        .map(|key| (key.clone(), Value::from(CONTROL)))
        .collect();
    assert_eq!(offline_tolerations(&control), own, "left alone: {control}");
    cluster.publish_missing_configmaps(&control);

    // Every pod Running at the edge, as the API server shows it.
    let pods = Watch::start(&kc, &["get", "pods", "-n", &ns]);
    let mut latest: BTreeMap<String, Value> = BTreeMap::new();
    let mut track = |kind: &str, pod: &Value| {
        let name = pod["metadata"]["name"].as_str().unwrap_or_default();
        match kind {
            "DELETED" => latest.remove(name),
            _ => latest.insert(name.to_owned(), pod.clone()),
        };
        latest.clone()
    };
    pods.until(
        "the three pods Running",
        Duration::from_secs(120),
        |kind, pod| {
            let now = track(kind, pod);
            (now.len() == 3 && now.values().all(|p| p["status"]["phase"] == "Running"))
                .then_some(())
        },
    );
    let before = edge_containers(&node);
    for kept in ["kept-a", "kept-b"] {
        let held = &before[&format!("{ns}/{kept}")];
        assert!(
            held.len() == 1 && held[0].1 == "RUNNING",
            "{kept} at the edge: {held:?}"
        );
    }
    println!("{test}: at the edge before the outage: {before:?}");

    // Offline: edgecore killed; the node lifecycle controller taints the
    // Node unreachable.
    let nodes = Watch::start(&kc, &["get", "node", &node]);
    let killed = std::time::Instant::now();
    if let Some(edge) = cluster.edge.take() {
        edge.signal("-KILL");
    }
    let tainted = nodes.until(
        "the Node tainted unreachable",
        Duration::from_secs(120),
        |_, n| taint(n, "node.kubernetes.io/unreachable").cloned(),
    );
    let taint_added = epoch_seconds(&tainted["timeAdded"]);
    println!(
        "{test}: tainted {tainted} {:.1?} after the kill",
        killed.elapsed()
    );

    // The control pod is evicted once its own 10 s run out; the window's
    // pods are not.
    let evicted = pods.until(
        "the control pod evicted",
        Duration::from_secs(120),
        |kind, pod| {
            let now = track(kind, pod);
            now.get("control")
                .filter(|p| p["metadata"]["deletionTimestamp"].is_string())
                .map(|_| now.clone())
        },
    );
    let control_evicted = epoch_seconds(&evicted["control"]["metadata"]["deletionTimestamp"]);
    println!(
        "{test}: control pod evicted (deletionTimestamp) {} s after the taint was added",
        control_evicted - taint_added
    );
    assert!(
        control_evicted >= taint_added + i64::from(CONTROL),
        "evicted no earlier than its toleration allowed"
    );
    for kept in ["kept-a", "kept-b"] {
        let pod = cluster.pod(kept).expect("kept");
        assert!(
            pod["metadata"]["deletionTimestamp"].is_null(),
            "{kept} evicted with the control pod: {pod}"
        );
        assert_eq!(pod["metadata"]["uid"], uids[kept]);
    }
    let offline = edge_containers(&node);
    for kept in ["kept-a", "kept-b"] {
        assert_eq!(
            offline[&format!("{ns}/{kept}")],
            before[&format!("{ns}/{kept}")],
            "{kept} runs on at the edge with no cloud"
        );
    }

    // The edge returns within the window.
    let started = std::time::Instant::now();
    cluster.start_edge();
    let linked = started.elapsed();
    let ready = nodes.until("the Node Ready again", Duration::from_secs(120), |_, n| {
        condition(n, "Ready")
            .is_some_and(|c| c["status"] == "True")
            .then(|| started.elapsed())
    });
    let untainted = match cluster.node().filter(|n| !offline_tainted(n)) {
        Some(_) => started.elapsed(),
        None => nodes.until("the taint gone", Duration::from_secs(120), |_, n| {
            (!offline_tainted(n)).then(|| started.elapsed())
        }),
    };
    println!(
        "{test}: edgecore started; its link up after {linked:.1?}, the Node Ready after {ready:.1?}, untainted after {untainted:.1?}"
    );
    pods.until(
        "the control pod's eviction carried out",
        Duration::from_secs(60),
        |kind, pod| {
            let now = track(kind, pod);
            (!now.contains_key("control")).then_some(())
        },
    );
    for kept in ["kept-a", "kept-b"] {
        let pod = cluster.pod(kept).expect("kept");
        assert!(pod["metadata"]["deletionTimestamp"].is_null(), "{pod}");
        assert_eq!(pod["metadata"]["uid"], uids[kept], "the same pod");
        assert_eq!(pod["status"]["phase"], "Running", "{pod}");
        assert_eq!(
            pod["status"]["containerStatuses"][0]["restartCount"], 0,
            "{pod}"
        );
    }
    let after = edge_containers(&node);
    for kept in ["kept-a", "kept-b"] {
        assert_eq!(
            after[&format!("{ns}/{kept}")],
            before[&format!("{ns}/{kept}")],
            "{kept}: the same container, not restarted"
        );
    }

    // Offline again, this time past the window: its end evicts the pods.
    let killed = std::time::Instant::now();
    if let Some(edge) = cluster.edge.take() {
        edge.signal("-KILL");
    }
    let tainted = nodes.until(
        "the Node tainted unreachable again",
        Duration::from_secs(120),
        |_, n| taint(n, "node.kubernetes.io/unreachable").cloned(),
    );
    let taint_added = epoch_seconds(&tainted["timeAdded"]);
    println!(
        "{test}: tainted again {:.1?} after the kill",
        killed.elapsed()
    );
    let evicted = pods.until(
        "the window's pods evicted",
        Duration::from_secs(WINDOW as u64 + 120),
        |kind, pod| {
            let now = track(kind, pod);
            ["kept-a", "kept-b"]
                .iter()
                .all(|kept| {
                    now.get(*kept)
                        .is_some_and(|p| p["metadata"]["deletionTimestamp"].is_string())
                })
                .then(|| now.clone())
        },
    );
    for kept in ["kept-a", "kept-b"] {
        let at = epoch_seconds(&evicted[kept]["metadata"]["deletionTimestamp"]);
        println!(
            "{test}: {kept} evicted (deletionTimestamp) {} s after the taint was added",
            at - taint_added
        );
        assert!(
            at >= taint_added + WINDOW,
            "{kept} evicted before its window ended"
        );
    }

    // The edge returns after the window, offline longer than the node
    // lifecycle controller's grace period this time: the Node turns Ready,
    // and the evictions are carried out at the edge.
    let started = std::time::Instant::now();
    cluster.start_edge();
    let linked = started.elapsed();
    let ready = nodes.until(
        "the Node Ready after the window",
        Duration::from_secs(180),
        |_, n| {
            condition(n, "Ready")
                .is_some_and(|c| c["status"] == "True")
                .then(|| started.elapsed())
        },
    );
    let untainted = match cluster.node().filter(|n| !offline_tainted(n)) {
        Some(_) => started.elapsed(),
        None => nodes.until("the taint gone", Duration::from_secs(180), |_, n| {
            (!offline_tainted(n)).then(|| started.elapsed())
        }),
    };
    println!(
        "{test}: after {:.1?} offline, edgecore started; its link up after {linked:.1?}, the Node Ready after {ready:.1?}, untainted after {untainted:.1?}",
        killed.elapsed() - started.elapsed()
    );
    pods.until(
        "the evictions carried out",
        Duration::from_secs(60),
        |kind, pod| {
            let now = track(kind, pod);
            now.is_empty().then_some(())
        },
    );
    until("the evicted pods' containers stopped at the edge", || {
        edge_containers(&node)
            .values()
            .flatten()
            .all(|(_, state)| state != "RUNNING")
            .then_some(())
    });
}

/// The value of the metric line of cloudcore's `/metrics` that starts with
/// `series` (its name and labels), 0 if it has none.
fn metric_value(metrics: &str, series: &str) -> u64 {
    metrics
        .lines()
        .find_map(|line| line.strip_prefix(series)?.trim().parse::<f64>().ok())
        .map_or(0, |value| value as u64)
}

/// Nodes made for a test, removed when it ends (also when it fails).
struct BareNodes {
    kubeconfig: String,
    names: Vec<String>,
}

impl Drop for BareNodes {
    fn drop(&mut self) {
        let mut args = vec!["delete", "node", "--ignore-not-found", "--wait=false"];
        args.extend(self.names.iter().map(String::as_str));
        let _ = kubectl(&self.kubeconfig, &args);
    }
}

/// A pod bound to a node before the node is an edge node (before it has a
/// Node at all) reaches the edge once the node links: cloudcore's pod watch
/// leaves out pods of nodes that are not edge nodes, noting their nodes,
/// and lists again when one of those becomes an edge node. Edge nodes that
/// join with nothing bound to them make no list of every pod (a thousand
/// nodes joining had made some 650).
#[test]
fn a_pod_bound_before_its_node_joined_reaches_it_and_bare_joins_list_nothing() {
    let test = "a_pod_bound_before_its_node_joined_reaches_it_and_bare_joins_list_nothing";
    let Some(kubeconfig) = kubeconfig(test) else {
        return;
    };
    const LIST_PODS: &str = r#"edgehive_apiserver_requests_total{verb="list",resource="pods"}"#;
    let mut cluster = Cluster::prepare(kubeconfig, "eh-early", "native", false, &[], &[]);
    cluster.apply(&web(&cluster.node));
    until("the pod in the API server", || {
        get(
            &cluster.kubeconfig,
            &["get", "pod", "web", "-n", &cluster.namespace],
        )
    });
    cluster.start_edge();
    until("the pod bound before its node joined, at the edge", || {
        cluster.held_pods().contains_key("web").then_some(())
    });

    // Edge nodes with nothing bound to them join.
    const BARE: usize = 12;
    let bare = BareNodes {
        kubeconfig: cluster.kubeconfig.clone(),
        names: (0..BARE)
            .map(|i| format!("{}-bare-{i}", cluster.node))
            .collect(),
    };
    let before = metric_value(&cluster.cloud_metrics(), LIST_PODS);
    for name in &bare.names {
        let node = format!(
            "apiVersion: v1\nkind: Node\nmetadata:\n  name: {name}\n  labels:\n    node-role.kubernetes.io/edge: \"\"\n"
        );
        cluster.apply(&node);
    }
    until("the bare nodes in cloudcore's view", || {
        let nodes = get(
            &cluster.kubeconfig,
            &["get", "nodes", "-l", "node-role.kubernetes.io/edge"],
        )?;
        let names: BTreeSet<&str> = nodes["items"]
            .as_array()?
            .iter()
            .filter_map(|node| node["metadata"]["name"].as_str())
            .collect();
        bare.names
            .iter()
            .all(|name| names.contains(name.as_str()))
            .then_some(())
    });
    // A pod for the linked node after them: once it is at the edge, the
    // pod watch has run past the joins.
    cluster.apply(&web(&cluster.node).replace("name: web\n", "name: web-after\n"));
    until("a pod created after the joins, at the edge", || {
        cluster.held_pods().contains_key("web-after").then_some(())
    });
    let after = metric_value(&cluster.cloud_metrics(), LIST_PODS);
    println!("{test}: lists of pods {before} before {BARE} bare joins, {after} after");
    // Other tests' nodes may join meanwhile with pods bound to them: a few
    // lists are theirs; one per bare join would be ours.
    assert!(
        after - before < BARE as u64 / 2,
        "{BARE} bare joins listed pods {} times",
        after - before
    );
}
