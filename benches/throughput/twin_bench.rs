//! The `twin` group: reported-twin updates from 100 simulated mappers (real
//! MQTT clients) through the embedded broker, the eventbus, devicetwin,
//! metamanager's store, edgehub, a WebSocket link with mutual TLS, cloudhub
//! and the edgecontroller, into the cloud's desired-state store (redb).
//!
//! - throughput: every mapper publishes its updates as fast as MQTT takes
//!   them; the run ends when the cloud store holds each device's last
//!   value (updates within one report period are coalesced, latest wins,
//!   as the devicetwin promises);
//! - latency: every mapper reports one value at a time, paced above the
//!   report period, timed from the publish to the cloud store's commit of
//!   that value, p50 and p99.
//!
//! Baseline in the same run: raw MQTT publish/subscribe through the same
//! broker (the same mappers publishing the same number of messages to one
//! subscriber, and the same paced latency from publish to receipt).
//!
//! The same over DMI (KubeEdge v1.15+ mappers): 100 gRPC clients, each its
//! own connection to the edge's DMI socket, calling `ReportDeviceStatus`,
//! as fast as each call is answered and then paced. Baseline: the same
//! calls to a gRPC server that answers without doing anything, over a Unix
//! socket beside it (what gRPC itself costs).
//!
//! One concern: the `twin` group, the DMI path timed against bare gRPC.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use beehive::{Hive, HiveConfig};
use cloud::desired::{StoreFuture, WatchStream};
use cloud::{ControllerConfig, DesiredError, DesiredState, EdgeController, EmbeddedStore};
use hub::{CloudEndpoint, CloudHub, CloudHubConfig, EdgeHub, EdgeHubConfig};
use meta::{EdgeStore, Kind, MetaManager, ObjectKey};
use rumqttc::{AsyncClient, QoS};
use serde_json::{Value, json};
use tokio::sync::mpsc;
use transports::tls::{self, DevPki};
use transports::{DialOptions, ListenOptions, TransportKind};
use twin::dmi::api;
use twin::dmi::api::device_manager_service_client::DeviceManagerServiceClient;
use twin::dmi::api::device_manager_service_server::{
    DeviceManagerService, DeviceManagerServiceServer,
};
use twin::{BrokerAddress, DeviceTwin, DeviceTwinConfig, EmbeddedBroker, EventBus, EventBusConfig};

use crate::Scale;
use crate::report::{Report, median, quantile_us};

const MAPPERS: usize = 100;
const NODE: &str = "bench-edge";
const WAIT: Duration = Duration::from_secs(120);
/// Between two paced reports of one mapper: above the report period, so
/// each value is written on its own.
const PACE: Duration = Duration::from_millis(250);

pub fn run(scale: Scale, report: &mut Report) -> Result<()> {
    let (updates, samples) = if scale.runs == 1 { (20, 4) } else { (200, 30) };
    actix::System::new().block_on(async move {
        let rig = Rig::start().await?;
        let mut twin_rates = Vec::new();
        let mut raw_rates = Vec::new();
        for run in 0..scale.runs {
            raw_rates.push(raw_throughput(rig.broker, updates, run).await?);
            twin_rates.push(rig.throughput(updates, run).await?);
        }
        let raw_latency = raw_latency(rig.broker, samples).await?;
        let twin_latency = rig.latency(samples).await?;
        let noop = NoopDmi::start(&rig.dir.path().join("noop.sock"))?;
        let mut dmi_rates = Vec::new();
        let mut grpc_rates = Vec::new();
        for run in 0..scale.runs {
            grpc_rates.push(grpc_throughput(&noop.socket, updates).await?);
            dmi_rates.push(rig.dmi_throughput(updates, run).await?);
        }
        let grpc_latency = grpc_latency(&noop.socket, samples).await?;
        let dmi_latency = rig.dmi_latency(samples).await?;
        let scenario = "twin/100 mappers over DMI";
        let baseline = "raw gRPC calls, no-op server, Unix socket";
        report.with_baseline(
            scenario,
            "updates/s to the cloud store",
            median(dmi_rates),
            "calls/s",
            median(grpc_rates),
            baseline,
        );
        for (q, name) in [(0.5, "p50"), (0.99, "p99")] {
            report.with_baseline(
                scenario,
                &format!("latency {name}, mapper to cloud store"),
                quantile_us(&dmi_latency, q),
                "µs",
                quantile_us(&grpc_latency, q),
                baseline,
            );
        }
        let scenario = "twin/100 mappers";
        report.with_baseline(
            scenario,
            "updates/s to the cloud store",
            median(twin_rates),
            "msg/s",
            median(raw_rates),
            "raw MQTT pub/sub, same broker",
        );
        for (q, name) in [(0.5, "p50"), (0.99, "p99")] {
            report.with_baseline(
                scenario,
                &format!("latency {name}, mapper to cloud store"),
                quantile_us(&twin_latency, q),
                "µs",
                quantile_us(&raw_latency, q),
                "raw MQTT pub/sub, same broker",
            );
        }
        rig.stop().await;
        Ok(())
    })
}

/// A cloud and an edge with devicetwin, linked over WebSocket with mutual
/// TLS, the embedded broker, and 100 devices bound to the edge.
struct Rig {
    cloud: Hive,
    edge: Hive,
    broker: SocketAddr,
    _embedded: EmbeddedBroker,
    /// The edge's DMI socket.
    dmi: PathBuf,
    _dmi: twin::dmi::DmiServerHandle,
    /// Device statuses as the cloud store commits them.
    committed: tokio::sync::Mutex<mpsc::UnboundedReceiver<(Instant, Value)>>,
    dir: tempfile::TempDir,
}

/// The desired-state store, telling the bench of each device status it
/// commits.
struct Observed {
    inner: Arc<dyn DesiredState>,
    committed: mpsc::UnboundedSender<(Instant, Value)>,
}

impl DesiredState for Observed {
    fn get(&self, key: &ObjectKey) -> Result<Option<apis::Object>, DesiredError> {
        self.inner.get(key)
    }

    fn list_each(
        &self,
        kind: Kind,
        namespace: Option<&str>,
        visit: &mut dyn FnMut(apis::Object),
    ) -> Result<u64, DesiredError> {
        self.inner.list_each(kind, namespace, visit)
    }

    fn watch(&self, kind: Kind, since: u64) -> Result<WatchStream, DesiredError> {
        self.inner.watch(kind, since)
    }

    fn create(&self, object: apis::Object) -> StoreFuture<apis::Object> {
        self.inner.create(object)
    }

    fn replace(&self, object: apis::Object) -> StoreFuture<apis::Object> {
        self.inner.replace(object)
    }

    fn replace_status(&self, object: apis::Object) -> StoreFuture<apis::Object> {
        let device = object["kind"] == "Device";
        let written = self.inner.replace_status(object);
        let committed = self.committed.clone();
        Box::pin(async move {
            let stored = written.await?;
            if device {
                let _ = committed.send((Instant::now(), stored.json().clone()));
            }
            Ok(stored)
        })
    }

    fn delete(&self, key: &ObjectKey) -> StoreFuture<Option<apis::Object>> {
        self.inner.delete(key)
    }

    fn next_revision(&self) -> StoreFuture<u64> {
        self.inner.next_revision()
    }
}

fn device(n: usize) -> Value {
    json!({
        "apiVersion": "devices.kubeedge.io/v1beta1",
        "kind": "Device",
        "metadata": {"name": format!("sensor-{n:03}"), "namespace": "default"},
        "spec": {"nodeName": NODE, "properties": [{"name": "value"}]}
    })
}

/// The value a committed device status reports, with the device's name.
fn reported(device: &Value) -> Option<(String, String)> {
    let name = device["metadata"]["name"].as_str()?.to_owned();
    let value = device["status"]["twins"]
        .as_array()?
        .iter()
        .find(|t| t["propertyName"] == "value")?["reported"]["value"]
        .as_str()?
        .to_owned();
    Some((name, value))
}

impl Rig {
    async fn start() -> Result<Rig> {
        let dir = tempfile::tempdir()?;
        let pki = DevPki::new("twin bench CA")?;
        let cloud = Hive::new("cloud", HiveConfig::default());
        let (committed_tx, committed) = mpsc::unbounded_channel();
        let store = Observed {
            inner: EmbeddedStore::open(&dir.path().join("desired.redb"))?.shared(),
            committed: committed_tx,
        };
        let controller =
            EdgeController::start(&cloud, Arc::new(store), ControllerConfig::default())?;
        let (chain, key) = pki.server("localhost")?;
        let options = ListenOptions::new("127.0.0.1:0").with_tls(tls::server_config(
            chain,
            key,
            Some(&[pki.root()]),
        )?);
        let hub = CloudHub::start(
            &cloud,
            CloudHubConfig {
                node_events: controller.node_events(),
                links: controller.node_links(),
                endpoints: vec![CloudEndpoint {
                    kind: TransportKind::WebSocket,
                    options,
                    trust_hello: false,
                    dialect: hub::Dialect::Native,
                }],
                store: Some(dir.path().join("queues.redb")),
                ..CloudHubConfig::default()
            },
        )
        .await?;
        let address = hub.addresses[0].1.clone();
        controller
            .apply(
                (0..MAPPERS)
                    .map(|i| apis::Object::new(device(i)).expect("a device"))
                    .collect(),
            )
            .await
            .map_err(|err| anyhow::anyhow!("devices not applied: {err}"))?;

        let edge = Hive::new("edge", HiveConfig::default());
        let store = EdgeStore::open(&dir.path().join("edge.redb"))?;
        MetaManager::start(&edge, store)?;
        let twins = DeviceTwin::start(&edge, DeviceTwinConfig::new(NODE))?;
        let embedded = EmbeddedBroker::start("127.0.0.1:0", 4 << 20).await?;
        let dmi_socket = dir.path().join("dmi.sock");
        let dmi = twin::dmi::server::start(&edge, twin::dmi::DmiConfig::new(&dmi_socket))?;
        let broker = embedded.address;
        EventBus::start(
            &edge,
            EventBusConfig::new(
                NODE,
                BrokerAddress {
                    host: broker.ip().to_string(),
                    port: broker.port(),
                },
            ),
        )?;
        let dial = DialOptions::new(&address, "localhost")
            .with_tls(tls::client_config(&[pki.root()], Some(pki.client(NODE)?))?);
        EdgeHub::start(
            &edge,
            EdgeHubConfig::new(NODE, TransportKind::WebSocket, dial),
        )?;
        let mut counts = twins.counts.clone();
        tokio::time::timeout(WAIT, counts.wait_for(|c| c.devices == MAPPERS))
            .await
            .context("the devices never reached the edge")??;
        Ok(Rig {
            cloud,
            edge,
            broker,
            _embedded: embedded,
            dmi: dmi_socket,
            _dmi: dmi,
            committed: tokio::sync::Mutex::new(committed),
            dir,
        })
    }

    /// Every mapper publishes `updates` values as fast as it can; the
    /// updates per second until the cloud store holds every last value.
    async fn throughput(&self, updates: usize, run: usize) -> Result<f64> {
        let mappers = connect_all(self.broker, &format!("mapper-{run}"), None).await?;
        let mut committed = self.committed.lock().await;
        while committed.try_recv().is_ok() {}
        let last = |n: usize| format!("{run}-{n}-{}", updates - 1);
        let mut waiting: HashMap<String, String> = (0..MAPPERS)
            .map(|n| (format!("sensor-{n:03}"), last(n)))
            .collect();
        let started = Instant::now();
        for step in 0..updates {
            for (n, (client, _)) in mappers.iter().enumerate() {
                client
                    .publish(
                        format!("$hw/events/device/sensor-{n:03}/twin/update"),
                        QoS::AtLeastOnce,
                        false,
                        report(&format!("{run}-{n}-{step}")),
                    )
                    .await?;
            }
        }
        tokio::time::timeout(WAIT, async {
            while !waiting.is_empty() {
                let Some((_, device)) = committed.recv().await else {
                    break;
                };
                if let Some((name, value)) = reported(&device)
                    && waiting.get(&name) == Some(&value)
                {
                    waiting.remove(&name);
                }
            }
        })
        .await
        .context("the cloud store never got every last value")?;
        let rate = (MAPPERS * updates) as f64 / started.elapsed().as_secs_f64();
        disconnect_all(mappers).await;
        Ok(rate)
    }

    /// Paced reports, timed from publish to the cloud store's commit.
    async fn latency(&self, samples: usize) -> Result<Vec<u64>> {
        let mappers = connect_all(self.broker, "paced", None).await?;
        let mut committed = self.committed.lock().await;
        while committed.try_recv().is_ok() {}
        let mut sent: HashMap<(String, String), Instant> = HashMap::new();
        let mut latencies = Vec::new();
        let stagger = PACE / MAPPERS as u32;
        for step in 0..samples {
            for (n, (client, _)) in mappers.iter().enumerate() {
                let value = format!("paced-{n}-{step}");
                sent.insert((format!("sensor-{n:03}"), value.clone()), Instant::now());
                client
                    .publish(
                        format!("$hw/events/device/sensor-{n:03}/twin/update"),
                        QoS::AtLeastOnce,
                        false,
                        report(&value),
                    )
                    .await?;
                // Take what committed meanwhile, so its time is its own.
                let until = tokio::time::Instant::now() + stagger;
                while let Ok(Some((at, device))) =
                    tokio::time::timeout_at(until, committed.recv()).await
                {
                    if let Some(key) = reported(&device)
                        && let Some(published) = sent.remove(&key)
                    {
                        latencies.push(at.duration_since(published).as_nanos() as u64);
                    }
                }
            }
        }
        let deadline = tokio::time::Instant::now() + WAIT;
        while !sent.is_empty() {
            match tokio::time::timeout_at(deadline, committed.recv()).await {
                Ok(Some((at, device))) => {
                    if let Some(key) = reported(&device)
                        && let Some(published) = sent.remove(&key)
                    {
                        latencies.push(at.duration_since(published).as_nanos() as u64);
                    }
                }
                _ => anyhow::bail!("{} paced reports never reached the cloud store", sent.len()),
            }
        }
        disconnect_all(mappers).await;
        latencies.sort_unstable();
        Ok(latencies)
    }

    /// Every DMI mapper reports `updates` values, each call once the last
    /// is answered; the updates per second until the cloud store holds
    /// every last value.
    async fn dmi_throughput(&self, updates: usize, run: usize) -> Result<f64> {
        let mappers = dial_all(&self.dmi).await?;
        let mut committed = self.committed.lock().await;
        while committed.try_recv().is_ok() {}
        let last = |n: usize| format!("dmi-{run}-{n}-{}", updates - 1);
        let mut waiting: HashMap<String, String> = (0..MAPPERS)
            .map(|n| (format!("sensor-{n:03}"), last(n)))
            .collect();
        let started = Instant::now();
        let calls = mappers
            .into_iter()
            .enumerate()
            .map(|(n, mut client)| async move {
                for step in 0..updates {
                    client
                        .report_device_status(status_report(n, &format!("dmi-{run}-{n}-{step}")))
                        .await?;
                }
                anyhow::Ok(())
            });
        for called in futures_util::future::join_all(calls).await {
            called?;
        }
        tokio::time::timeout(WAIT, async {
            while !waiting.is_empty() {
                let Some((_, device)) = committed.recv().await else {
                    break;
                };
                if let Some((name, value)) = reported(&device)
                    && waiting.get(&name) == Some(&value)
                {
                    waiting.remove(&name);
                }
            }
        })
        .await
        .context("the cloud store never got every last DMI value")?;
        Ok((MAPPERS * updates) as f64 / started.elapsed().as_secs_f64())
    }

    /// Paced DMI reports, timed from the call to the cloud store's commit.
    async fn dmi_latency(&self, samples: usize) -> Result<Vec<u64>> {
        let mut mappers = dial_all(&self.dmi).await?;
        let mut committed = self.committed.lock().await;
        while committed.try_recv().is_ok() {}
        let mut sent: HashMap<(String, String), Instant> = HashMap::new();
        let mut latencies = Vec::new();
        let stagger = PACE / MAPPERS as u32;
        let mut take = |at: Instant, device: &Value, sent: &mut HashMap<_, Instant>| {
            if let Some(key) = reported(device)
                && let Some(published) = sent.remove(&key)
            {
                latencies.push(at.duration_since(published).as_nanos() as u64);
            }
        };
        for step in 0..samples {
            for (n, client) in mappers.iter_mut().enumerate() {
                let value = format!("dmi-paced-{n}-{step}");
                sent.insert((format!("sensor-{n:03}"), value.clone()), Instant::now());
                client
                    .report_device_status(status_report(n, &value))
                    .await?;
                let until = tokio::time::Instant::now() + stagger;
                while let Ok(Some((at, device))) =
                    tokio::time::timeout_at(until, committed.recv()).await
                {
                    take(at, &device, &mut sent);
                }
            }
        }
        let deadline = tokio::time::Instant::now() + WAIT;
        while !sent.is_empty() {
            match tokio::time::timeout_at(deadline, committed.recv()).await {
                Ok(Some((at, device))) => take(at, &device, &mut sent),
                _ => anyhow::bail!(
                    "{} paced DMI reports never reached the cloud store",
                    sent.len()
                ),
            }
        }
        latencies.sort_unstable();
        Ok(latencies)
    }

    async fn stop(self) {
        let _ = self.edge.shutdown().await;
        let _ = self.cloud.shutdown().await;
    }
}

/// A DMI mapper's report of sensor `n`'s value.
fn status_report(n: usize, value: &str) -> api::ReportDeviceStatusRequest {
    api::ReportDeviceStatusRequest {
        device_name: format!("sensor-{n:03}"),
        device_namespace: "default".to_owned(),
        reported_device: Some(api::DeviceStatus {
            twins: vec![api::Twin {
                property_name: "value".to_owned(),
                observed_desired: None,
                reported: Some(api::TwinProperty {
                    value: value.to_owned(),
                    metadata: Default::default(),
                }),
            }],
            report_to_cloud: true,
            report_cycle: 0,
        }),
    }
}

type DmiClient = DeviceManagerServiceClient<tonic::transport::Channel>;

/// 100 DMI clients, each its own connection to `socket`.
async fn dial_all(socket: &Path) -> Result<Vec<DmiClient>> {
    let mut clients = Vec::with_capacity(MAPPERS);
    for _ in 0..MAPPERS {
        let channel = twin::dmi::dial(socket, WAIT).await?;
        clients.push(DeviceManagerServiceClient::new(channel));
    }
    Ok(clients)
}

/// The DMI baseline's server: answers every call at once, doing nothing.
struct NoopDmi {
    socket: PathBuf,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Drop for NoopDmi {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

struct Noop;

#[tonic::async_trait]
impl DeviceManagerService for Noop {
    async fn mapper_register(
        &self,
        _: tonic::Request<api::MapperRegisterRequest>,
    ) -> Result<tonic::Response<api::MapperRegisterResponse>, tonic::Status> {
        Ok(tonic::Response::new(api::MapperRegisterResponse::default()))
    }

    async fn report_device_status(
        &self,
        _: tonic::Request<api::ReportDeviceStatusRequest>,
    ) -> Result<tonic::Response<api::ReportDeviceStatusResponse>, tonic::Status> {
        Ok(tonic::Response::new(api::ReportDeviceStatusResponse {}))
    }

    async fn report_device_states(
        &self,
        _: tonic::Request<api::ReportDeviceStatesRequest>,
    ) -> Result<tonic::Response<api::ReportDeviceStatesResponse>, tonic::Status> {
        Ok(tonic::Response::new(api::ReportDeviceStatesResponse {}))
    }
}

impl NoopDmi {
    fn start(socket: &Path) -> Result<NoopDmi> {
        let listener = tokio::net::UnixListener::bind(socket)?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tonic::transport::Server::builder().serve_with_incoming_shutdown(
            DeviceManagerServiceServer::new(Noop),
            twin::dmi::incoming(listener),
            async {
                let _ = stopped.await;
            },
        );
        tokio::spawn(server);
        Ok(NoopDmi {
            socket: socket.to_path_buf(),
            stop: Some(stop),
        })
    }
}

/// The DMI baseline: the same calls, answered by the no-op server.
async fn grpc_throughput(socket: &Path, updates: usize) -> Result<f64> {
    let mappers = dial_all(socket).await?;
    let started = Instant::now();
    let calls = mappers
        .into_iter()
        .enumerate()
        .map(|(n, mut client)| async move {
            for step in 0..updates {
                client
                    .report_device_status(status_report(n, &format!("raw-{n}-{step}")))
                    .await?;
            }
            anyhow::Ok(())
        });
    for called in futures_util::future::join_all(calls).await {
        called?;
    }
    Ok((MAPPERS * updates) as f64 / started.elapsed().as_secs_f64())
}

/// The DMI baseline's latency: paced calls, timed to their answer.
async fn grpc_latency(socket: &Path, samples: usize) -> Result<Vec<u64>> {
    let mut mappers = dial_all(socket).await?;
    let mut latencies = Vec::new();
    let stagger = PACE / MAPPERS as u32;
    for step in 0..samples {
        for (n, client) in mappers.iter_mut().enumerate() {
            let started = Instant::now();
            client
                .report_device_status(status_report(n, &format!("raw-paced-{n}-{step}")))
                .await?;
            latencies.push(started.elapsed().as_nanos() as u64);
            tokio::time::sleep(stagger.saturating_sub(started.elapsed())).await;
        }
    }
    latencies.sort_unstable();
    Ok(latencies)
}

fn report(value: &str) -> Vec<u8> {
    serde_json::to_vec(
        &json!({"event_id": "", "timestamp": 0, "twin": {"value": {"actual": {"value": value}}}}),
    )
    .unwrap_or_default()
}

type Mapper = (
    AsyncClient,
    mpsc::UnboundedReceiver<twin::testing::Received>,
);

/// 100 connected MQTT clients (subscribed to `filter`, if given); what
/// each receives comes out of its channel with the time it arrived.
async fn connect_all(
    broker: SocketAddr,
    prefix: &str,
    filter: Option<&str>,
) -> Result<Vec<Mapper>> {
    let mut mappers = Vec::with_capacity(MAPPERS);
    for n in 0..MAPPERS {
        mappers.push(connect(broker, &format!("{prefix}-{n}"), filter).await?);
    }
    Ok(mappers)
}

async fn connect(broker: SocketAddr, id: &str, filter: Option<&str>) -> Result<Mapper> {
    twin::testing::connect(broker, id, filter)
        .await
        .map_err(anyhow::Error::msg)
}

async fn disconnect_all(mappers: Vec<Mapper>) {
    for (client, _) in mappers {
        let _ = client.disconnect().await;
    }
}

/// The baseline: the same publishes to one subscriber; messages per second
/// until it has them all.
async fn raw_throughput(broker: SocketAddr, updates: usize, run: usize) -> Result<f64> {
    let (_sink, mut received) =
        connect(broker, &format!("raw-sink-{run}"), Some("bench/raw/#")).await?;
    let mappers = connect_all(broker, &format!("raw-{run}"), None).await?;
    let expected = MAPPERS * updates;
    let started = Instant::now();
    for step in 0..updates {
        for (n, (client, _)) in mappers.iter().enumerate() {
            client
                .publish(
                    format!("bench/raw/{n}"),
                    QoS::AtLeastOnce,
                    false,
                    report(&format!("{run}-{n}-{step}")),
                )
                .await?;
        }
    }
    let mut got = 0;
    tokio::time::timeout(WAIT, async {
        while got < expected {
            if received.recv().await.is_none() {
                break;
            }
            got += 1;
        }
    })
    .await
    .context("the raw subscriber never got every message")?;
    anyhow::ensure!(got == expected, "raw subscriber got {got} of {expected}");
    let rate = expected as f64 / started.elapsed().as_secs_f64();
    disconnect_all(mappers).await;
    Ok(rate)
}

/// The baseline's latency: paced publishes, timed to their receipt.
async fn raw_latency(broker: SocketAddr, samples: usize) -> Result<Vec<u64>> {
    let (_sink, mut received) = connect(broker, "raw-paced-sink", Some("bench/paced/#")).await?;
    let mappers = connect_all(broker, "raw-paced", None).await?;
    let mut sent: HashMap<Vec<u8>, Instant> = HashMap::new();
    let mut latencies = Vec::new();
    let stagger = PACE / MAPPERS as u32;
    let mut take = |at: Instant, payload: Vec<u8>, sent: &mut HashMap<Vec<u8>, Instant>| {
        if let Some(published) = sent.remove(&payload) {
            latencies.push(at.duration_since(published).as_nanos() as u64);
        }
    };
    for step in 0..samples {
        for (n, (client, _)) in mappers.iter().enumerate() {
            let payload = report(&format!("paced-{n}-{step}"));
            sent.insert(payload.clone(), Instant::now());
            client
                .publish(format!("bench/paced/{n}"), QoS::AtLeastOnce, false, payload)
                .await?;
            let until = tokio::time::Instant::now() + stagger;
            while let Ok(Some(got)) = tokio::time::timeout_at(until, received.recv()).await {
                take(got.at, got.payload, &mut sent);
            }
        }
    }
    let deadline = tokio::time::Instant::now() + WAIT;
    while !sent.is_empty() {
        match tokio::time::timeout_at(deadline, received.recv()).await {
            Ok(Some(got)) => take(got.at, got.payload, &mut sent),
            _ => anyhow::bail!("{} paced messages never arrived", sent.len()),
        }
    }
    disconnect_all(mappers).await;
    latencies.sort_unstable();
    Ok(latencies)
}
