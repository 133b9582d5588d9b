//! The edge's DMI server (`DeviceManagerService`) on a Unix socket, where
//! KubeEdge's mappers find it:
//!
//! - `MapperRegister` records the mapper (its protocol, its socket) and,
//!   asked `withData`, answers with the devices of its protocol bound to
//!   this node and their models, as metamanager holds them (without, they
//!   come as `RegisterDevice` calls); from then on the cloud's changes to
//!   them reach it ([`dispatch`]);
//! - `ReportDeviceStatus` / `ReportDeviceStates` go to devicetwin as the
//!   `twin/update` / `state/update` an MQTT mapper would publish, so both
//!   kinds of mapper take one path (persisted, then up to the cloud).
//!
//! A report for a device this node does not hold, or that does not read,
//! is refused with a gRPC error; nothing else is touched.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use apis::devices::{Device, DeviceModel};
use beehive::constants::{group, module, operation, resource_type};
use beehive::resource::EdgeResource;
use beehive::{Content, Hive, Message as HiveMessage, SmolStr};
use serde::Deserialize;
use serde_json::Value;
use tokio::sync::watch;
use tonic::{Request, Response, Status};
use tracing::{debug, info, warn};

use super::api::device_manager_service_server::{DeviceManagerService, DeviceManagerServiceServer};
use super::api::{self, MapperInfo};
use super::{convert, dispatch};
use crate::protocol;

/// The DMI module: its messages to devicetwin come from it, and devicetwin
/// passes it the devices and models the cloud sends (for their mappers).
pub const SOURCE: &str = "dmi";

/// The DMI module's group: its own, so that nothing sent to a group (the
/// cloud's `twin` messages, the eventbus's) waits on calls to mappers.
pub const GROUP: &str = "dmi";

/// The most bytes of one DMI request (gRPC's default, as edgecore's).
pub const MAX_REQUEST: usize = 4 << 20;

/// Why the DMI server could not start.
#[derive(Debug, thiserror::Error)]
pub enum DmiError {
    /// The socket could not be made.
    #[error("DMI socket {path}: {source}")]
    Socket {
        /// Where.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

/// How the DMI server runs.
#[derive(Debug, Clone)]
pub struct DmiConfig {
    /// The Unix socket to serve on (KubeEdge's default:
    /// [`super::DEFAULT_SOCKET`]).
    pub socket: PathBuf,
    /// How long metamanager may take to answer.
    pub store_timeout: Duration,
    /// Where the registered mappers are kept across restarts (a mapper
    /// registers only when it starts, so an edge that restarts must know it
    /// still); none: not kept.
    pub mappers_file: Option<PathBuf>,
}

impl DmiConfig {
    /// Defaults, on `socket`.
    pub fn new(socket: impl Into<PathBuf>) -> DmiConfig {
        DmiConfig {
            socket: socket.into(),
            store_timeout: Duration::from_secs(10),
            mappers_file: None,
        }
    }
}

/// The mappers kept in `file`, if it reads.
fn load_mappers(file: &std::path::Path) -> BTreeMap<String, Mapper> {
    let Ok(text) = std::fs::read(file) else {
        return BTreeMap::new();
    };
    let kept: Vec<(String, String, PathBuf)> = match serde_json::from_slice(&text) {
        Ok(kept) => kept,
        Err(err) => {
            warn!(file = %file.display(), error = %err, "registered mappers unreadable; they must register again");
            return BTreeMap::new();
        }
    };
    kept.into_iter()
        .map(|(name, protocol, socket)| {
            (
                protocol.clone(),
                Mapper {
                    name,
                    protocol,
                    socket,
                },
            )
        })
        .collect()
}

/// Keeps `mappers` in `file` (written aside, then renamed over it).
fn save_mappers(file: &std::path::Path, mappers: &BTreeMap<String, Mapper>) {
    let kept: Vec<(&str, &str, &PathBuf)> = mappers
        .values()
        .map(|m| (m.name.as_str(), m.protocol.as_str(), &m.socket))
        .collect();
    let aside = file.with_extension("tmp");
    let written = serde_json::to_vec(&kept)
        .map_err(std::io::Error::other)
        .and_then(|bytes| std::fs::write(&aside, bytes))
        .and_then(|()| std::fs::rename(&aside, file));
    if let Err(err) = written {
        warn!(file = %file.display(), error = %err, "registered mappers not kept");
    }
}

/// A registered mapper.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mapper {
    /// Its name.
    pub name: String,
    /// The protocol it serves.
    pub protocol: String,
    /// Its own gRPC socket.
    pub socket: PathBuf,
}

/// The mappers registered, by protocol (one mapper per protocol, as
/// KubeEdge has it: a mapper registering a protocol again replaces it).
pub type Mappers = Arc<Mutex<BTreeMap<String, Mapper>>>;

/// A running DMI server.
pub struct DmiServerHandle {
    /// The socket it serves on.
    pub socket: PathBuf,
    /// The mappers registered.
    pub mappers: Mappers,
    stop: watch::Sender<bool>,
}

impl DmiServerHandle {
    /// Stops serving.
    pub fn stop(&self) {
        let _ = self.stop.send(true);
    }
}

impl Drop for DmiServerHandle {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Starts the DMI server (inside a tokio runtime), its messages to
/// devicetwin and its reads from metamanager through `hive`. A stale socket
/// file is replaced.
pub fn start(hive: &Hive, config: DmiConfig) -> Result<DmiServerHandle, DmiError> {
    let socket_error = |source| DmiError::Socket {
        path: config.socket.clone(),
        source,
    };
    if let Some(dir) = config.socket.parent() {
        std::fs::create_dir_all(dir).map_err(socket_error)?;
    }
    match std::fs::remove_file(&config.socket) {
        Ok(()) => debug!(socket = %config.socket.display(), "stale DMI socket removed"),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
        Err(err) => return Err(socket_error(err)),
    }
    let listener = tokio::net::UnixListener::bind(&config.socket).map_err(socket_error)?;
    // Only this user (and its group) may register mappers and report: a
    // mapper is given its devices' configuration, and the edge dials the
    // socket it names.
    {
        use std::os::unix::fs::PermissionsExt;
        let owner_and_group = std::fs::Permissions::from_mode(0o660);
        std::fs::set_permissions(&config.socket, owner_and_group).map_err(socket_error)?;
    }
    let kept = config
        .mappers_file
        .as_deref()
        .map(load_mappers)
        .unwrap_or_default();
    let mappers = Mappers::new(Mutex::new(kept.clone()));
    // Devices and models to their mappers: devicetwin passes the cloud's
    // changes to this module, the service its registrations.
    let (inputs, dispatched) = tokio::sync::mpsc::channel(1024);
    let door = beehive::TaskDoor::new(SOURCE, GROUP, inputs.clone(), |msg| {
        dispatch::Input::Hive(Box::new(msg))
    });
    hive.start_module(move |_| door.clone())
        .map_err(|err| socket_error(std::io::Error::other(err.to_string())))?;
    let store = Store {
        hive: hive.clone(),
        timeout: config.store_timeout,
    };
    let names = dispatch::Names::default();
    let service = DmiService {
        store: store.clone(),
        hive: hive.clone(),
        mappers: mappers.clone(),
        dispatch: inputs,
        names: names.clone(),
        mappers_file: config.mappers_file.clone(),
    };
    let known = service.dispatch.clone();
    tokio::spawn(async move {
        // What the edge holds first (until metamanager answers), the
        // mappers registered before a restart (they get their devices
        // again), then the changes as they come.
        let loaded = store.load().await;
        for mapper in kept.into_values() {
            info!(protocol = %mapper.protocol, mapper = %mapper.name, "mapper registered before the restart");
            let _ = known
                .send(dispatch::Input::Registered {
                    protocol: mapper.protocol,
                    socket: mapper.socket,
                    listed: None,
                })
                .await;
        }
        dispatch::run(dispatched, loaded, names).await;
    });
    let server = DeviceManagerServiceServer::new(service)
        .max_decoding_message_size(MAX_REQUEST)
        .max_encoding_message_size(64 << 20);
    let incoming = super::incoming(listener);
    let (stop, mut stopped) = watch::channel(false);
    let socket = config.socket.clone();
    tokio::spawn(async move {
        let signal = async move {
            let _ = stopped.wait_for(|stop| *stop).await;
        };
        let served = tonic::transport::Server::builder()
            .serve_with_incoming_shutdown(server, incoming, signal)
            .await;
        if let Err(err) = served {
            warn!(error = %err, "DMI server stopped");
        }
    });
    info!(socket = %socket.display(), "DMI server listening");
    Ok(DmiServerHandle {
        socket: config.socket,
        mappers,
        stop,
    })
}

/// Reads from metamanager.
#[derive(Clone)]
struct Store {
    hive: Hive,
    timeout: Duration,
}

impl Store {
    /// What metamanager holds at `resource` (`*/device`: a list).
    async fn query(&self, resource: &str) -> Result<Option<Content>, Status> {
        let query = HiveMessage::new().build_router(
            SOURCE,
            group::META,
            SmolStr::new(resource),
            operation::QUERY,
        );
        let answer = self
            .hive
            .send_sync(module::METAMANAGER, query, self.timeout)
            .await
            .map_err(|err| Status::unavailable(format!("the edge's store: {err}")))?;
        Ok(answer.into_answer().ok().map(|answer| answer.content))
    }

    async fn list<T: for<'de> Deserialize<'de>>(&self, kind: &str) -> Result<Vec<T>, Status> {
        let items = match self.query(&format!("*/{kind}")).await? {
            Some(answer) => answer.decode::<Vec<Value>>().unwrap_or_default(),
            None => Vec::new(),
        };
        Ok(items
            .into_iter()
            .filter_map(|item| match T::deserialize(&item) {
                Ok(item) => Some(item),
                Err(err) => {
                    warn!(kind, error = %err, "a stored object that does not read");
                    None
                }
            })
            .collect())
    }

    /// Every model and device held, once metamanager answers.
    async fn load(&self) -> (Vec<DeviceModel>, Vec<Device>) {
        loop {
            let models = self.list(resource_type::DEVICE_MODEL).await;
            let devices = self.list(resource_type::DEVICE).await;
            match (models, devices) {
                (Ok(models), Ok(devices)) => return (models, devices),
                (Err(err), _) | (_, Err(err)) => {
                    warn!(error = %err, "devices not loaded for DMI mappers yet; trying again");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        }
    }
}

/// A registration's answer: models, devices, and what was listed (each
/// device's key and spec).
type Listing = (
    Vec<api::DeviceModel>,
    Vec<api::Device>,
    Vec<(dispatch::DeviceKey, apis::devices::DeviceSpec)>,
);

struct DmiService {
    store: Store,
    hive: Hive,
    mappers: Mappers,
    dispatch: tokio::sync::mpsc::Sender<dispatch::Input>,
    /// The namespaces each device name is held in (devicetwin knows
    /// devices by name).
    names: dispatch::Names,
    /// Where registrations are kept.
    mappers_file: Option<PathBuf>,
}

impl DmiService {
    /// The devices of `protocol` this node holds, each with its model (the
    /// two lists index-aligned, as KubeEdge answers).
    async fn devices_of(&self, protocol: &str) -> Result<Listing, Status> {
        let models: Vec<DeviceModel> = self.store.list(resource_type::DEVICE_MODEL).await?;
        let devices: Vec<Device> = self.store.list(resource_type::DEVICE).await?;
        let (mut model_list, mut device_list, mut listed) = (Vec::new(), Vec::new(), Vec::new());
        for device in devices {
            if convert::protocol_of(&device).as_deref() != Some(protocol) {
                continue;
            }
            let namespace = device
                .metadata
                .namespace
                .clone()
                .unwrap_or_else(|| "default".to_owned());
            let model_name = device
                .spec
                .device_model_ref
                .as_ref()
                .map(|m| m.name.as_str());
            let model = models.iter().find(|m| {
                m.metadata.name.as_deref() == model_name
                    && m.metadata.namespace.as_deref().unwrap_or("default") == namespace
            });
            let Some(model) = model else {
                warn!(device = ?device.metadata.name, "its model is not here yet; not given to the mapper");
                continue;
            };
            match convert::device(&convert::with_model_defaults(&device, Some(model))) {
                Ok(converted) => {
                    model_list.push(convert::model(model));
                    device_list.push(converted);
                    listed.push((
                        (
                            namespace.clone(),
                            device.metadata.name.clone().unwrap_or_default(),
                        ),
                        device.spec.clone(),
                    ));
                }
                Err(err) => {
                    warn!(device = ?device.metadata.name, error = %err, "not given to the mapper")
                }
            }
        }
        Ok((model_list, device_list, listed))
    }

    /// The device id of a reported device this node holds.
    async fn held(&self, namespace: &str, name: &str) -> Result<String, Status> {
        let id = convert::device_id(namespace, name)
            .map_err(|err| Status::invalid_argument(err.to_string()))?;
        let namespace = if namespace.is_empty() {
            "default"
        } else {
            namespace
        };
        // devicetwin knows a device by its name: a name held in another
        // namespace too would take this report as that device's.
        let elsewhere = self
            .names
            .lock()
            .map(|names| {
                names
                    .get(name)
                    .is_some_and(|held| held.iter().any(|ns| ns != namespace))
            })
            .unwrap_or(false);
        if elsewhere {
            return Err(Status::failed_precondition(format!(
                "a device named {name} is held in another namespace too; this edge knows devices by name"
            )));
        }
        let resource = EdgeResource::new(namespace, resource_type::DEVICE, name);
        match self.store.query(&resource.to_string()).await? {
            Some(_) => Ok(id),
            None => Err(Status::not_found(format!(
                "device {namespace}/{name} is not bound to this node"
            ))),
        }
    }

    /// Passes `payload` to devicetwin on `topic`, as the eventbus passes an
    /// MQTT mapper's.
    async fn to_devicetwin(&self, topic: String, payload: Value) -> Result<(), Status> {
        let msg = HiveMessage::new()
            .build_router(SOURCE, group::TWIN, topic, operation::UPDATE)
            .with_content(Content::of(&payload).map_err(|err| Status::internal(err.to_string()))?);
        self.hive
            .send(module::DEVICETWIN, msg)
            .await
            .map_err(|err| Status::unavailable(format!("devicetwin: {err}")))
    }
}

fn now_ms() -> i64 {
    beehive::message::now_millis()
}

#[tonic::async_trait]
impl DeviceManagerService for DmiService {
    async fn mapper_register(
        &self,
        request: Request<api::MapperRegisterRequest>,
    ) -> Result<Response<api::MapperRegisterResponse>, Status> {
        let request = request.into_inner();
        let Some(MapperInfo {
            name,
            protocol,
            address,
            ..
        }) = request.mapper
        else {
            return Err(Status::invalid_argument("no mapper in the registration"));
        };
        if protocol.is_empty() || name.is_empty() {
            return Err(Status::invalid_argument(
                "a mapper names itself and its protocol",
            ));
        }
        let socket = String::from_utf8(address)
            .map_err(|_| Status::invalid_argument("the mapper's address is not a path"))?;
        let mapper = Mapper {
            name: name.clone(),
            protocol: protocol.clone(),
            socket: PathBuf::from(socket),
        };
        let socket = mapper.socket.clone();
        let replaced = {
            let mut mappers = self
                .mappers
                .lock()
                .map_err(|_| Status::internal("mapper registry"))?;
            let replaced = mappers.insert(protocol.clone(), mapper);
            if let Some(file) = &self.mappers_file {
                save_mappers(file, &mappers);
            }
            replaced
        };
        match replaced {
            Some(old) if old.name != name => {
                info!(%protocol, mapper = %name, replaced = %old.name, "mapper registered in another's place")
            }
            Some(_) => info!(%protocol, mapper = %name, "mapper registered again"),
            None => info!(%protocol, mapper = %name, "mapper registered"),
        }
        let registered = |listed| dispatch::Input::Registered {
            protocol: protocol.clone(),
            socket: socket.clone(),
            listed,
        };
        if !request.with_data {
            // Its devices come as RegisterDevice calls.
            let _ = self.dispatch.send(registered(None)).await;
            return Ok(Response::new(api::MapperRegisterResponse::default()));
        }
        let (model_list, device_list, listed) = self.devices_of(&protocol).await?;
        let _ = self.dispatch.send(registered(Some(listed))).await;
        debug!(%protocol, devices = device_list.len(), "devices given to the mapper");
        Ok(Response::new(api::MapperRegisterResponse {
            model_list,
            device_list,
        }))
    }

    async fn report_device_status(
        &self,
        request: Request<api::ReportDeviceStatusRequest>,
    ) -> Result<Response<api::ReportDeviceStatusResponse>, Status> {
        let report = request.into_inner();
        let id = self
            .held(&report.device_namespace, &report.device_name)
            .await?;
        let payload = convert::twin_update(&report, now_ms())
            .map_err(|err| Status::invalid_argument(err.to_string()))?;
        self.to_devicetwin(protocol::device_topic(&id, "twin/update"), payload)
            .await?;
        Ok(Response::new(api::ReportDeviceStatusResponse {}))
    }

    async fn report_device_states(
        &self,
        request: Request<api::ReportDeviceStatesRequest>,
    ) -> Result<Response<api::ReportDeviceStatesResponse>, Status> {
        let report = request.into_inner();
        let id = self
            .held(&report.device_namespace, &report.device_name)
            .await?;
        let payload = convert::state_update(&report, now_ms())
            .map_err(|err| Status::invalid_argument(err.to_string()))?;
        self.to_devicetwin(protocol::device_topic(&id, "state/update"), payload)
            .await?;
        Ok(Response::new(api::ReportDeviceStatesResponse {}))
    }
}
