//! edgehive's test rig for tests that span crates: a cloud (cloudhub,
//! edgecontroller and application center on a desired-state backend, the
//! admin API) and edges (edgehub, metamanager on redb, MetaServer) linked
//! over WebSocket with mutual TLS, each in its own hive in this process;
//! a scripted KubeEdge edge ([`kubeedge`]); a Mosquitto and an MQTT client
//! playing a mapper ([`mqtt`]).
// A test rig: its items are named for what tests call them, and
// documented where the name does not say enough.
#![allow(missing_docs)]

pub mod kubeedge;
pub mod mqtt;

use std::time::Duration;

use beehive::constants::{group, module};
use beehive::{Hive, HiveConfig, Message};
use cloud::{
    AdminApi, AdminApiHandle, AdminClient, ApplicationCenter, CenterConfig, CenterHandle,
    ControllerConfig, ControllerCounts, ControllerHandle, DesiredState, EdgeController,
    EmbeddedStore,
};
use hub::{
    CloudEndpoint, CloudHub, CloudHubConfig, CloudHubHandle, EdgeHub, EdgeHubConfig, EdgeHubHandle,
};
use meta::{EdgeStore, MetaManager, MetaServer, MetaServerHandle};
use tokio::sync::{mpsc, watch};
use transports::testing::free_address;
use transports::tls::{self, DevPki};
use transports::{DialOptions, ListenOptions, TransportKind};

pub use beehive::testing::recorder;

/// The next message, or a failure naming what was awaited.
pub async fn next(rx: &mut mpsc::UnboundedReceiver<Message>, what: &str) -> Message {
    tokio::time::timeout(Duration::from_secs(30), rx.recv())
        .await
        .unwrap_or_else(|_| panic!("timed out waiting for {what}"))
        .unwrap_or_else(|| panic!("recorder gone while waiting for {what}"))
}

pub struct Cloud {
    pub pki: DevPki,
    pub hive: Hive,
    pub hub: CloudHubHandle,
    pub controller: ControllerHandle,
    /// The application center (KubeEdge's dynamiccontroller).
    pub center: CenterHandle,
    pub admin: AdminApiHandle,
    pub client: AdminClient,
    pub address: String,
    /// cloudhub's endpoint in KubeEdge's dialect.
    pub kubeedge_address: String,
    pub dir: tempfile::TempDir,
}

impl Cloud {
    /// A cloud on fresh ports with a fresh data directory.
    pub async fn start() -> Cloud {
        let dir = tempfile::tempdir().expect("dir");
        let pki = DevPki::new("meta test CA").expect("CA");
        Cloud::start_with(pki, dir, &free_address()).await
    }

    /// A cloud with `pki`, its stores in `dir`, cloudhub on `listen` (and
    /// in KubeEdge's dialect on a fresh port).
    pub async fn start_with(pki: DevPki, dir: tempfile::TempDir, listen: &str) -> Cloud {
        Cloud::start_on(pki, dir, listen, &free_address()).await
    }

    /// A fresh cloud that sends a KubeEdge node's unacknowledged objects
    /// again after `after`.
    pub async fn start_resending_after(after: Duration) -> Cloud {
        let dir = tempfile::tempdir().expect("dir");
        let pki = DevPki::new("meta test CA").expect("CA");
        Cloud::start_full(pki, dir, &free_address(), &free_address(), after).await
    }

    /// Like [`Cloud::start_with`], KubeEdge's endpoint on `kubeedge_listen`.
    pub async fn start_on(
        pki: DevPki,
        dir: tempfile::TempDir,
        listen: &str,
        kubeedge_listen: &str,
    ) -> Cloud {
        // Longer than any test waits for an ack.
        let resend = Duration::from_secs(120);
        Cloud::start_full(pki, dir, listen, kubeedge_listen, resend).await
    }

    async fn start_full(
        pki: DevPki,
        dir: tempfile::TempDir,
        listen: &str,
        kubeedge_listen: &str,
        kubeedge_resend_after: Duration,
    ) -> Cloud {
        let backend = Backend {
            store: None,
            api: None,
        };
        Cloud::start_backed(
            pki,
            dir,
            listen,
            kubeedge_listen,
            kubeedge_resend_after,
            backend,
            ControllerConfig::default(),
        )
        .await
    }

    /// A fresh cloud on `backend`.
    pub async fn start_backed_by(backend: Backend) -> Cloud {
        Cloud::start_backed_by_with(backend, ControllerConfig::default()).await
    }

    /// A fresh cloud on `backend`, its edgecontroller run by `controller`.
    pub async fn start_backed_by_with(backend: Backend, controller: ControllerConfig) -> Cloud {
        let dir = tempfile::tempdir().expect("dir");
        let pki = DevPki::new("meta test CA").expect("CA");
        let resend = Duration::from_secs(120);
        Cloud::start_backed(
            pki,
            dir,
            &free_address(),
            &free_address(),
            resend,
            backend,
            controller,
        )
        .await
    }

    async fn start_backed(
        pki: DevPki,
        dir: tempfile::TempDir,
        listen: &str,
        kubeedge_listen: &str,
        kubeedge_resend_after: Duration,
        backend: Backend,
        controller: ControllerConfig,
    ) -> Cloud {
        let hive = Hive::new("cloud", HiveConfig::default());
        // After a restart in this process the last cloud's store threads
        // may still be letting go of the files: there is no event for
        // that, so opening is tried again for a while.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let store = match backend.store {
            Some(store) => store,
            None => loop {
                match EmbeddedStore::open(&dir.path().join("desired.redb")) {
                    Ok(store) => break store.shared(),
                    Err(err) if std::time::Instant::now() < deadline => {
                        let _ = err;
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                    Err(err) => panic!("desired store: {err}"),
                }
            },
        };
        let controller = EdgeController::start(&hive, store, controller).expect("controller");
        let center = ApplicationCenter::start(
            &hive,
            controller.node_links(),
            backend.api,
            CenterConfig::default(),
        )
        .expect("application center");
        let (chain, key) = pki.server("localhost").expect("server cert");
        let server_tls = tls::server_config(chain, key, Some(&[pki.root()])).expect("tls");
        let options = ListenOptions::new(listen).with_tls(server_tls.clone());
        let kubeedge_options = ListenOptions::new(kubeedge_listen).with_tls(server_tls);
        let hub = loop {
            let config = CloudHubConfig {
                node_events: controller.node_events(),
                links: controller.node_links(),
                endpoints: vec![
                    CloudEndpoint {
                        kind: TransportKind::WebSocket,
                        options: options.clone(),
                        trust_hello: false,
                        dialect: hub::Dialect::Native,
                    },
                    CloudEndpoint {
                        kind: TransportKind::WebSocket,
                        options: kubeedge_options.clone(),
                        trust_hello: false,
                        dialect: hub::Dialect::KubeEdge,
                    },
                ],
                keepalive: Duration::from_secs(2),
                kubeedge_resend_after,
                store: Some(dir.path().join("queues.redb")),
                ..CloudHubConfig::default()
            };
            match CloudHub::start(&hive, config).await {
                Ok(hub) => break hub,
                Err(err) if std::time::Instant::now() < deadline => {
                    let _ = err;
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(err) => panic!("cloudhub: {err}"),
            }
        };
        let address = hub.addresses[0].1.clone();
        let kubeedge_address = hub.addresses[1].1.clone();
        let admin = AdminApi::start(controller.clone(), "127.0.0.1:0", None).expect("admin API");
        let client = AdminClient::new(&admin.address.to_string());
        Cloud {
            pki,
            hive,
            hub,
            controller,
            center,
            admin,
            client,
            address,
            kubeedge_address,
            dir,
        }
    }

    /// Stops the cloud and starts it again on the same address, stores and
    /// certificates, as after a crash and restart; `while_down` runs in
    /// between.
    pub async fn restart<F: std::future::Future<Output = ()>>(
        self,
        while_down: impl FnOnce() -> F,
    ) -> Cloud {
        let Cloud {
            pki,
            hive,
            hub,
            controller,
            center,
            admin,
            client,
            address,
            kubeedge_address,
            dir,
        } = self;
        admin.stop().await;
        let _ = hive.shutdown().await;
        drop((hub, controller, center, client));
        while_down().await;
        Cloud::start_on(pki, dir, &address, &kubeedge_address).await
    }

    /// Waits until the controller's counts satisfy `condition`.
    pub async fn counts(
        &self,
        what: &str,
        condition: impl FnMut(&ControllerCounts) -> bool,
    ) -> ControllerCounts {
        let mut counts: watch::Receiver<ControllerCounts> = self.controller.counts.clone();
        *tokio::time::timeout(Duration::from_secs(30), counts.wait_for(condition))
            .await
            .unwrap_or_else(|_| panic!("timed out waiting for {what}"))
            .expect("controller gone")
    }

    /// The object at admin API `path` once it satisfies `wanted`, read
    /// again each time the controller's counts move (a status written
    /// among them): for what the status writer writes after the count
    /// that announced it. Fails after `within` in all, with the last
    /// object read. A change while the object is read is not missed: this
    /// receiver has not seen it yet.
    pub async fn get_until(
        &self,
        path: &str,
        within: Duration,
        mut wanted: impl FnMut(&serde_json::Value) -> bool,
    ) -> serde_json::Value {
        let mut counts = self.controller.counts.clone();
        let mut last = serde_json::Value::Null;
        let found = tokio::time::timeout(within, async {
            loop {
                let object = self.client.get(path).await.expect("get");
                if wanted(&object) {
                    return object;
                }
                last = object;
                counts.changed().await.expect("controller gone");
            }
        })
        .await;
        found.unwrap_or_else(|_| panic!("{path} never got there; last read: {last}"))
    }

    pub async fn apply(&self, manifest: &str) -> Vec<String> {
        self.client
            .apply(manifest.as_bytes().to_vec())
            .await
            .expect("apply")
            .results
            .into_iter()
            .map(|r| format!("{}/{} {}", r.kind, r.name, r.result))
            .collect()
    }

    pub async fn shutdown(self) {
        self.admin.stop().await;
        let _ = self.hive.shutdown().await;
    }
}

/// What a cloud runs on: the embedded store (none given), or a given
/// desired state and the API server behind it.
pub struct Backend {
    pub store: Option<std::sync::Arc<dyn DesiredState>>,
    pub api: Option<std::sync::Arc<dyn cloud::dynamiccontroller::ApiServer>>,
}

pub struct Edge {
    pub node: String,
    pub hive: Hive,
    pub hub: EdgeHubHandle,
    pub store: EdgeStore,
    /// What metamanager passed on to edged, after storing it.
    pub edged: mpsc::UnboundedReceiver<Message>,
    pub metaserver: MetaServerHandle,
    pub dir: tempfile::TempDir,
}

impl Edge {
    /// An edge for `node`, linked to `cloud` with a certificate for `node`.
    pub async fn start(cloud: &Cloud, node: &str) -> Edge {
        Edge::start_in(cloud, node, tempfile::tempdir().expect("dir")).await
    }

    /// Like [`Edge::start`], with the edge store in `dir` (`edge.redb`),
    /// which may hold objects already.
    pub async fn start_in(cloud: &Cloud, node: &str, dir: tempfile::TempDir) -> Edge {
        Edge::start_speaking(cloud, node, dir, hub::Dialect::Native).await
    }

    /// An edge for `node` that talks to `cloud` in `dialect` (KubeEdge's
    /// goes to the cloud's KubeEdge endpoint).
    pub async fn start_speaking(
        cloud: &Cloud,
        node: &str,
        dir: tempfile::TempDir,
        dialect: hub::Dialect,
    ) -> Edge {
        let hive = Hive::new("edge", HiveConfig::default());
        let store = EdgeStore::open(&dir.path().join("edge.redb")).expect("edge store");
        MetaManager::start(&hive, store.clone()).expect("metamanager");
        let edged = recorder(&hive, module::EDGED, group::EDGED);
        let identity = cloud.pki.client(node).expect("client cert");
        let address = match dialect {
            hub::Dialect::Native => &cloud.address,
            hub::Dialect::KubeEdge => &cloud.kubeedge_address,
        };
        let dial = DialOptions::new(address, "localhost")
            .with_tls(tls::client_config(&[cloud.pki.root()], Some(identity)).expect("tls"));
        let config = EdgeHubConfig {
            keepalive: Duration::from_secs(2),
            reconnect_initial: Duration::from_millis(20),
            reconnect_max: Duration::from_millis(200),
            dialect,
            ..EdgeHubConfig::new(node, TransportKind::WebSocket, dial)
        };
        let hub = EdgeHub::start(&hive, config).expect("edgehub");
        let metaserver = MetaServer::start(store.clone(), "127.0.0.1:0").expect("metaserver");
        let mut online = hub.online.clone();
        tokio::time::timeout(Duration::from_secs(30), online.wait_for(|up| *up))
            .await
            .expect("edge never connected")
            .expect("edgehub gone");
        Edge {
            node: node.to_owned(),
            hive,
            hub,
            store,
            edged,
            metaserver,
            dir,
        }
    }

    /// Reports a status (pod or node) as edged would: to metamanager, which
    /// stores it and sends it up.
    pub async fn report(&self, resource: &str, status: serde_json::Value) {
        let msg = Message::new()
            .build_router(
                module::EDGED,
                group::META,
                beehive::SmolStr::new(resource),
                beehive::constants::operation::UPDATE,
            )
            .with_content(beehive::Content::of(&status).expect("json"));
        let reply = self
            .hive
            .send_sync(module::METAMANAGER, msg, Duration::from_secs(10))
            .await
            .expect("status stored");
        assert_ne!(reply.operation(), "error", "{reply:?}");
    }

    pub async fn shutdown(self) {
        self.metaserver.stop().await;
        let _ = self.hive.shutdown().await;
        self.store.close().await;
    }
}

/// A pod manifest for `node` using the given configmaps by volume.
pub fn pod_yaml(name: &str, node: &str, configmaps: &[&str]) -> String {
    let mut yaml = format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: default\nspec:\n  nodeName: {node}\n  containers:\n  - name: main\n    image: 127.0.0.1:5000/busybox:latest\n"
    );
    if !configmaps.is_empty() {
        yaml.push_str("  volumes:\n");
        for cm in configmaps {
            yaml.push_str(&format!(
                "  - name: {cm}\n    configMap:\n      name: {cm}\n"
            ));
        }
    }
    yaml
}

/// A configmap manifest.
pub fn configmap_yaml(name: &str, value: &str) -> String {
    format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\ndata:\n  key: \"{value}\"\n"
    )
}
