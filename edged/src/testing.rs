//! For tests that run pods on a real containerd (`scripts/setup-containerd`):
//! a test takes its node's name from a [`TestNode`], whose drop removes
//! every pod sandbox of that node (and so its containers) through CRI, also
//! when the test fails; [`inventory`] tells what tests left behind, for the
//! check that ends the suite (`edged/tests/leftovers.rs`).
//!
//! What counts as a test's: a sandbox or container whose
//! [`spec::NODE`] label starts with [`NODE_PREFIX`], and any container in
//! such a sandbox. The quickstart's node (`edge-1`) and every other node
//! are not the tests'.

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};

use crate::cri::{Cri, CriError, api};
use crate::spec;

/// Every test node's name starts so, and no other node's should.
pub const NODE_PREFIX: &str = "test-";

/// The socket of the containerd tests use: `EDGEHIVE_CRI_SOCKET`, else the
/// one `scripts/setup-containerd` starts.
pub fn cri_socket() -> PathBuf {
    std::env::var_os("EDGEHIVE_CRI_SOCKET")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/run/edgehive/containerd/containerd.sock"))
}

/// The test nodes of this process that are alive: two tests of one
/// process (`cargo test` runs a binary's tests as threads) must not share
/// a node, or one's clean-up would remove the other's pods.
static LIVE: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// A node name for one test, `test-<what>-<pid>`, unique among the
/// processes running at the time: on drop (also while a failed test
/// unwinds) every sandbox labelled with it is stopped and removed, with its
/// containers. Drop it after whatever runs pods for the node (edgecore,
/// edged) has stopped, or that would start them again: declared before
/// them, a local is dropped after them.
pub struct TestNode {
    name: String,
    socket: PathBuf,
}

impl TestNode {
    /// The node `test-<what>-<pid>`, whose pods run on the containerd at
    /// `socket`. Panics if another live `TestNode` of this process has the
    /// name (give each test its own `what`).
    pub fn new(socket: impl Into<PathBuf>, what: &str) -> TestNode {
        let name = format!("{NODE_PREFIX}{what}-{}", std::process::id());
        let mut live = LIVE.lock().unwrap_or_else(PoisonError::into_inner);
        assert!(
            !live.contains(&name),
            "two tests of this process use node {name}: give each its own name"
        );
        live.push(name.clone());
        TestNode {
            name,
            socket: socket.into(),
        }
    }

    /// The node's name.
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl fmt::Display for TestNode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name)
    }
}

impl Drop for TestNode {
    fn drop(&mut self) {
        let outcome = clean_up_on_own_thread(&self.socket, &self.name);
        LIVE.lock()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|name| *name != self.name);
        match outcome {
            Ok(0) => {}
            Ok(removed) if std::thread::panicking() => eprintln!(
                "test node {}: removed its {removed} pod sandboxes after the failure",
                self.name
            ),
            Ok(_) => {}
            // A second panic while unwinding would abort: say it instead.
            Err(err) if std::thread::panicking() => {
                eprintln!("test node {}: clean-up failed: {err}", self.name)
            }
            Err(err) => panic!("test node {}: clean-up failed: {err}", self.name),
        }
    }
}

/// [`remove_node_pods`] and a check that nothing of the node is left, on
/// a thread of its own with its own runtime: drop may run inside a
/// runtime (an actix or tokio test), where blocking on another is refused.
fn clean_up_on_own_thread(socket: &Path, node: &str) -> Result<usize, String> {
    let (socket, node) = (socket.to_path_buf(), node.to_owned());
    let thread = std::thread::Builder::new()
        .name("test-node-clean-up".to_owned())
        .spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|err| format!("a runtime: {err}"))?;
            runtime.block_on(async {
                let cri = Cri::connect(&socket).await.map_err(|e| e.to_string())?;
                let removed = remove_node_pods(&cri, &node)
                    .await
                    .map_err(|e| e.to_string())?;
                let left: Vec<String> = inventory(&cri)
                    .await
                    .map_err(|e| e.to_string())?
                    .tests
                    .iter()
                    .filter(|held| held.node == node)
                    .map(Held::to_string)
                    .collect();
                match left.is_empty() {
                    true => Ok(removed),
                    false => Err(format!("still in containerd:\n{}", left.join("\n"))),
                }
            })
        })
        .map_err(|err| format!("a thread: {err}"))?;
    thread
        .join()
        .map_err(|_| "the clean-up thread panicked".to_owned())?
}

/// A call's answer, a runtime's "not found" (it went meanwhile) as done.
fn unless_gone<T>(
    answer: Result<tonic::Response<T>, tonic::Status>,
    call: &'static str,
) -> Result<(), CriError> {
    match answer {
        Ok(_) => Ok(()),
        Err(status) if status.code() == tonic::Code::NotFound => Ok(()),
        Err(status) => Err(CriError::Call { call, status }),
    }
}

/// Stops and removes every sandbox labelled with `node` (CRI removes a
/// sandbox's containers with it), then any container labelled with it
/// outside them; the number of sandboxes removed.
pub async fn remove_node_pods(cri: &Cri, node: &str) -> Result<usize, CriError> {
    let mut runtime = cri.runtime.clone();
    let sandboxes = cri.sandboxes(spec::NODE, node).await?;
    for sandbox in &sandboxes {
        let answer = runtime
            .stop_pod_sandbox(api::StopPodSandboxRequest {
                pod_sandbox_id: sandbox.id.clone(),
            })
            .await;
        unless_gone(answer, "StopPodSandbox")?;
        let answer = runtime
            .remove_pod_sandbox(api::RemovePodSandboxRequest {
                pod_sandbox_id: sandbox.id.clone(),
            })
            .await;
        unless_gone(answer, "RemovePodSandbox")?;
    }
    for container in cri.containers(spec::NODE, node, None).await? {
        let answer = runtime
            .stop_container(api::StopContainerRequest {
                container_id: container.id.clone(),
                timeout: 0,
            })
            .await;
        unless_gone(answer, "StopContainer")?;
        let answer = runtime
            .remove_container(api::RemoveContainerRequest {
                container_id: container.id,
            })
            .await;
        unless_gone(answer, "RemoveContainer")?;
    }
    Ok(sandboxes.len())
}

/// A sandbox or container the runtime holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Held {
    /// `sandbox` or `container`.
    pub kind: &'static str,
    /// Its id, shortened as crictl does.
    pub id: String,
    /// Its node label (a container in a sandbox without one: the
    /// sandbox's); empty if none.
    pub node: String,
    /// `<namespace>/<name>` of its pod.
    pub pod: String,
    /// A container's name.
    pub container: Option<String>,
    /// `READY`, `NOTREADY`; `CREATED`, `RUNNING`, `EXITED`, `UNKNOWN`.
    pub state: String,
}

impl fmt::Display for Held {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let node = match self.node.as_str() {
            "" => "(none)",
            node => node,
        };
        write!(f, "{} {} node={node} pod={}", self.kind, self.id, self.pod)?;
        if let Some(container) = &self.container {
            write!(f, " container={container}")?;
        }
        write!(f, " state={}", self.state)
    }
}

/// What the runtime holds, split into the tests' and the rest.
#[derive(Debug, Default)]
pub struct Inventory {
    /// The tests' (see the module's doc).
    pub tests: Vec<Held>,
    /// Everything else (the quickstart's pods, say): not the tests' to
    /// remove.
    pub others: Vec<Held>,
}

/// Every sandbox and container the runtime holds, in any state (a
/// stopped sandbox still holds its network namespace), sorted into the
/// tests' and the others.
pub async fn inventory(cri: &Cri) -> Result<Inventory, CriError> {
    let mut runtime = cri.runtime.clone();
    let sandboxes = runtime
        .list_pod_sandbox(api::ListPodSandboxRequest { filter: None })
        .await
        .map_err(CriError::call("ListPodSandbox"))?
        .into_inner()
        .items;
    let containers = runtime
        .list_containers(api::ListContainersRequest { filter: None })
        .await
        .map_err(CriError::call("ListContainers"))?
        .into_inner()
        .containers;
    let is_tests = |node: &str| node.starts_with(NODE_PREFIX);
    let mut inventory = Inventory::default();
    // Each sandbox's node and pod, for its containers.
    let mut pods: HashMap<String, (String, String)> = HashMap::new();
    for sandbox in sandboxes {
        let node = label(&sandbox.labels, spec::NODE);
        let pod = sandbox
            .metadata
            .as_ref()
            .map_or_else(|| "?".to_owned(), |m| format!("{}/{}", m.namespace, m.name));
        let state = api::PodSandboxState::try_from(sandbox.state)
            .map_or("UNKNOWN", |s| s.as_str_name())
            .trim_start_matches("SANDBOX_")
            .to_owned();
        pods.insert(sandbox.id.clone(), (node.clone(), pod.clone()));
        let held = Held {
            kind: "sandbox",
            id: short(&sandbox.id),
            node: node.clone(),
            pod,
            container: None,
            state,
        };
        match is_tests(&node) {
            true => inventory.tests.push(held),
            false => inventory.others.push(held),
        }
    }
    for container in containers {
        let (sandbox_node, sandbox_pod) = pods
            .get(&container.pod_sandbox_id)
            .cloned()
            .unwrap_or_default();
        let own_node = label(&container.labels, spec::NODE);
        let node = match own_node.is_empty() {
            true => sandbox_node.clone(),
            false => own_node.clone(),
        };
        let pod = match sandbox_pod.is_empty() {
            false => sandbox_pod,
            true => format!(
                "{}/{}",
                label(&container.labels, spec::POD_NAMESPACE),
                label(&container.labels, spec::POD_NAME)
            ),
        };
        let state = api::ContainerState::try_from(container.state)
            .map_or("CONTAINER_UNKNOWN", |s| s.as_str_name())
            .trim_start_matches("CONTAINER_")
            .to_owned();
        let held = Held {
            kind: "container",
            id: short(&container.id),
            node,
            pod,
            container: container.metadata.map(|m| m.name),
            state,
        };
        match is_tests(&own_node) || is_tests(&sandbox_node) {
            true => inventory.tests.push(held),
            false => inventory.others.push(held),
        }
    }
    Ok(inventory)
}

fn label(labels: &HashMap<String, String>, key: &str) -> String {
    labels.get(key).cloned().unwrap_or_default()
}

/// The first 13 characters of an id, as crictl shows them.
fn short(id: &str) -> String {
    id.chars().take(13).collect()
}
