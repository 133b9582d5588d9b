//! A cloud and an edge in one process, linked by a real transport: the
//! cloud runs cloudhub, the edge runs edgehub and a real metamanager on
//! redb, plus a recorder that sees what metamanager passes on.
#![allow(dead_code)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use beehive::constants::group;
use beehive::{Hive, HiveConfig, Message};
use hub::{
    CloudEndpoint, CloudHub, CloudHubConfig, CloudHubHandle, EdgeHub, EdgeHubConfig, EdgeHubHandle,
};
use meta::{EdgeStore, MetaManager};
use tokio::sync::mpsc;
use transports::tls::{self, DevPki};
use transports::{DialOptions, ListenOptions, TransportKind};

pub use beehive::testing::recorder;

static SOCKETS: AtomicUsize = AtomicUsize::new(0);

/// Certificates and addresses for one test.
pub struct World {
    pub kind: TransportKind,
    pub pki: DevPki,
    pub dir: tempfile::TempDir,
}

impl World {
    pub fn new(kind: TransportKind) -> World {
        World {
            kind,
            pki: DevPki::new("edgehive test cloud CA").expect("CA"),
            dir: tempfile::tempdir().expect("dir"),
        }
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// A listen address: a free port, or a fresh socket path.
    pub fn any_address(&self) -> String {
        match self.kind {
            TransportKind::UnixSocket => self
                .path(&format!(
                    "cloud-{}.sock",
                    SOCKETS.fetch_add(1, Ordering::Relaxed)
                ))
                .to_string_lossy()
                .into_owned(),
            // A held port: some tests restart the cloud on it.
            _ => transports::testing::free_address(),
        }
    }

    pub fn endpoint(&self, address: &str) -> CloudEndpoint {
        let mut options = ListenOptions::new(address);
        if self.kind != TransportKind::UnixSocket {
            let (chain, key) = self.pki.server("cloud").expect("server cert");
            options = options
                .with_tls(tls::server_config(chain, key, Some(&[self.pki.root()])).expect("tls"));
        }
        CloudEndpoint {
            kind: self.kind,
            options,
            trust_hello: self.kind == TransportKind::UnixSocket,
            dialect: hub::Dialect::Native,
        }
    }

    /// Dial options presenting a certificate for `cert_node` (none: no certificate).
    pub fn dial(&self, address: &str, cert_node: Option<&str>) -> DialOptions {
        let mut dial = DialOptions::new(address, "localhost");
        if self.kind != TransportKind::UnixSocket {
            let identity = cert_node.map(|node| self.pki.client(node).expect("client cert"));
            dial = dial.with_tls(tls::client_config(&[self.pki.root()], identity).expect("tls"));
        }
        dial
    }
}

pub struct Cloud {
    pub hive: Hive,
    pub handle: CloudHubHandle,
    pub address: String,
    /// What nodes sent up, as the cloud's `resource` group sees it.
    pub upstream: mpsc::UnboundedReceiver<Message>,
    /// cloudhub's node events.
    pub node_events: mpsc::UnboundedReceiver<hub::NodeEvent>,
}

pub async fn start_cloud(
    world: &World,
    address: &str,
    store: Option<&Path>,
    keepalive: Duration,
) -> Cloud {
    let hive = Hive::new("cloud", HiveConfig::default());
    let upstream = recorder(&hive, "edgecontroller", group::RESOURCE);
    let events = hub::NodeEvents::default();
    let node_events = events.subscribe();
    let config = CloudHubConfig {
        endpoints: vec![world.endpoint(address)],
        keepalive,
        window: 64,
        store: store.map(Path::to_path_buf),
        node_events: events,
        ..CloudHubConfig::default()
    };
    let handle = CloudHub::start(&hive, config).await.expect("cloudhub");
    let address = handle.addresses[0].1.clone();
    Cloud {
        hive,
        handle,
        address,
        upstream,
        node_events,
    }
}

pub struct Edge {
    pub hive: Hive,
    pub handle: EdgeHubHandle,
    pub store: EdgeStore,
    /// What metamanager passed on to edged, after storing it.
    pub applied: mpsc::UnboundedReceiver<Message>,
}

pub fn edge_config(
    world: &World,
    node: &str,
    cert_node: Option<&str>,
    cloud: &str,
    keepalive: Duration,
) -> EdgeHubConfig {
    EdgeHubConfig {
        keepalive,
        reconnect_initial: Duration::from_millis(5),
        reconnect_max: Duration::from_millis(100),
        ..EdgeHubConfig::new(node, world.kind, world.dial(cloud, cert_node))
    }
}

pub fn start_edge(config: EdgeHubConfig, store_path: &Path) -> Edge {
    let hive = Hive::new("edge", HiveConfig::default());
    let store = EdgeStore::open(store_path).expect("edge store");
    MetaManager::start(&hive, store.clone()).expect("metamanager");
    let applied = recorder(&hive, "edged", group::EDGED);
    let handle = EdgeHub::start(&hive, config).expect("edgehub");
    Edge {
        hive,
        handle,
        store,
        applied,
    }
}

/// A pod object for `node` at `version`, as edgecontroller sends it.
pub fn pod(node: &str, name: &str, version: u64) -> Message {
    Message::new()
        .build_router(
            "edgecontroller",
            group::RESOURCE,
            format!("node/{node}/default/pod/{name}"),
            "update",
        )
        .with_resource_version(version.to_string())
        .with_content(
            beehive::Content::of(
                &serde_json::json!({"metadata": {"name": name, "resourceVersion": version.to_string()}}),
            )
            .expect("json"),
        )
}

/// Waits until every pod in `finals` has been applied at its final version,
/// checking that no version is applied twice and none goes backwards.
pub async fn await_applied(
    applied: &mut mpsc::UnboundedReceiver<Message>,
    finals: &HashMap<String, u64>,
) {
    let mut newest: HashMap<String, u64> = HashMap::new();
    let mut seen = std::collections::HashSet::new();
    while finals.iter().any(|(pod, v)| newest.get(pod) != Some(v)) {
        let Ok(next) = tokio::time::timeout(Duration::from_secs(20), applied.recv()).await else {
            let missing: Vec<_> = finals
                .iter()
                .filter(|(pod, v)| newest.get(*pod) != Some(v))
                .map(|(pod, v)| format!("{pod} v{v} (have {:?})", newest.get(pod)))
                .take(5)
                .collect();
            panic!(
                "objects stopped arriving; {} missing, e.g. {missing:?}",
                finals.len()
                    - finals
                        .iter()
                        .filter(|(p, v)| newest.get(*p) == Some(v))
                        .count()
            );
        };
        let msg = next.expect("recorder gone");
        let version: u64 = msg.resource_version().parse().expect("numeric version");
        let pod = msg.resource().to_owned();
        assert!(
            seen.insert((pod.clone(), version)),
            "{pod} v{version} applied twice"
        );
        let held = newest.entry(pod.clone()).or_default();
        assert!(version > *held, "{pod}: v{version} applied after v{held}");
        *held = version;
    }
}

/// Waits until a counter condition holds (woken by every count), or fails.
pub async fn eventually(changes: &hub::Changes, what: &str, condition: impl FnMut() -> bool) {
    assert!(
        changes.wait_for(Duration::from_secs(60), condition).await,
        "never: {what}"
    );
}

pub fn get(counter: &std::sync::atomic::AtomicU64) -> u64 {
    counter.load(Ordering::Relaxed)
}

pub type Shared<T> = Arc<T>;
