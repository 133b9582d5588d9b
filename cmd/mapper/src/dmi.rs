//! edgehive-mapper's DMI mode: a mapper as KubeEdge's mapper-framework
//! makes them, over gRPC on Unix sockets. It serves `DeviceMapperService`
//! on its own socket (the edge registers, updates and removes its devices
//! there), registers with the edge's `DeviceManagerService` (and gets the
//! devices of its protocol), and every period reports each device's twins
//! (`ReportDeviceStatus`) and its state (`ReportDeviceStates`). The edge
//! gone (a restart), it registers again.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result};
use tonic::transport::Channel;
use tonic::{Request, Response, Status};
use twin::dmi::api::device_manager_service_client::DeviceManagerServiceClient;
use twin::dmi::api::device_mapper_service_server::{
    DeviceMapperService, DeviceMapperServiceServer,
};
use twin::dmi::api::{self, MapperInfo};

/// A device: namespace and name, and each property's desired value.
type Devices = Arc<Mutex<BTreeMap<(String, String), BTreeMap<String, Option<String>>>>>;

/// The DMI mode's settings.
pub struct DmiMode {
    /// The edge's DMI socket.
    pub edge: PathBuf,
    /// This mapper's own socket.
    pub socket: PathBuf,
    /// Its name.
    pub name: String,
    /// The protocol it serves.
    pub protocol: String,
    /// How often every device reports.
    pub period: Duration,
}

fn remember(devices: &Devices, device: &api::Device) {
    let twins = device
        .spec
        .iter()
        .flat_map(|spec| spec.properties.iter())
        .map(|p| {
            let desired = p.desired.as_ref().map(|d| d.value.clone());
            (p.name.clone(), desired.filter(|v| !v.is_empty()))
        })
        .collect();
    if let Ok(mut devices) = devices.lock() {
        devices.insert((device.namespace.clone(), device.name.clone()), twins);
    }
}

struct Server(Devices);

#[tonic::async_trait]
impl DeviceMapperService for Server {
    async fn register_device(
        &self,
        request: Request<api::RegisterDeviceRequest>,
    ) -> Result<Response<api::RegisterDeviceResponse>, Status> {
        let device = request
            .into_inner()
            .device
            .ok_or_else(|| Status::invalid_argument("no device"))?;
        tracing::info!(device = %device.name, "device registered");
        remember(&self.0, &device);
        Ok(Response::new(api::RegisterDeviceResponse {
            device_name: device.name,
            device_namespace: device.namespace,
        }))
    }

    async fn update_device(
        &self,
        request: Request<api::UpdateDeviceRequest>,
    ) -> Result<Response<api::UpdateDeviceResponse>, Status> {
        let device = request
            .into_inner()
            .device
            .ok_or_else(|| Status::invalid_argument("no device"))?;
        tracing::info!(device = %device.name, "device updated");
        remember(&self.0, &device);
        Ok(Response::new(api::UpdateDeviceResponse {}))
    }

    async fn remove_device(
        &self,
        request: Request<api::RemoveDeviceRequest>,
    ) -> Result<Response<api::RemoveDeviceResponse>, Status> {
        let request = request.into_inner();
        tracing::info!(device = %request.device_name, "device removed");
        if let Ok(mut devices) = self.0.lock() {
            devices.remove(&(request.device_namespace, request.device_name));
        }
        Ok(Response::new(api::RemoveDeviceResponse {}))
    }

    async fn create_device_model(
        &self,
        request: Request<api::CreateDeviceModelRequest>,
    ) -> Result<Response<api::CreateDeviceModelResponse>, Status> {
        let model = request.into_inner().model.unwrap_or_default();
        Ok(Response::new(api::CreateDeviceModelResponse {
            device_model_name: model.name,
            device_model_namespace: model.namespace,
        }))
    }

    async fn remove_device_model(
        &self,
        _request: Request<api::RemoveDeviceModelRequest>,
    ) -> Result<Response<api::RemoveDeviceModelResponse>, Status> {
        Ok(Response::new(api::RemoveDeviceModelResponse {}))
    }

    async fn update_device_model(
        &self,
        _request: Request<api::UpdateDeviceModelRequest>,
    ) -> Result<Response<api::UpdateDeviceModelResponse>, Status> {
        Ok(Response::new(api::UpdateDeviceModelResponse {}))
    }

    async fn get_device(
        &self,
        request: Request<api::GetDeviceRequest>,
    ) -> Result<Response<api::GetDeviceResponse>, Status> {
        let request = request.into_inner();
        let held = self
            .0
            .lock()
            .map(|d| {
                d.contains_key(&(
                    request.device_namespace.clone(),
                    request.device_name.clone(),
                ))
            })
            .unwrap_or(false);
        match held {
            true => Ok(Response::new(api::GetDeviceResponse {
                device: Some(api::Device {
                    name: request.device_name,
                    namespace: request.device_namespace,
                    ..api::Device::default()
                }),
            })),
            false => Err(Status::not_found("no such device here")),
        }
    }
}

async fn dial(path: &Path) -> Result<DeviceManagerServiceClient<Channel>> {
    let channel = twin::dmi::dial(path, Duration::from_secs(10))
        .await
        .context("the edge's DMI socket")?;
    Ok(DeviceManagerServiceClient::new(channel))
}

/// Registers (until the edge answers) and takes the devices it lists.
async fn register(mode: &DmiMode, devices: &Devices) -> DeviceManagerServiceClient<Channel> {
    loop {
        let attempt = async {
            let mut client = dial(&mode.edge).await?;
            let answer = client
                .mapper_register(api::MapperRegisterRequest {
                    with_data: true,
                    mapper: Some(MapperInfo {
                        name: mode.name.clone(),
                        version: env!("CARGO_PKG_VERSION").to_owned(),
                        api_version: "v1beta1".to_owned(),
                        protocol: mode.protocol.clone(),
                        address: mode.socket.to_string_lossy().into_owned().into_bytes(),
                        state: "ok".to_owned(),
                    }),
                })
                .await
                .context("MapperRegister")?
                .into_inner();
            anyhow::Ok((client, answer))
        };
        match attempt.await {
            Ok((client, answer)) => {
                // Added to what it holds: a RegisterDevice that came while
                // this registration was under way stays.
                for device in &answer.device_list {
                    remember(devices, device);
                }
                tracing::info!(devices = answer.device_list.len(), edge = %mode.edge.display(), "registered");
                return client;
            }
            Err(err) => {
                tracing::warn!(error = %format!("{err:#}"), "not registered yet; trying again");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }
}

/// Runs the mapper in DMI mode.
pub async fn run(mode: DmiMode) -> Result<()> {
    let devices = Devices::default();
    if let Some(dir) = mode.socket.parent() {
        std::fs::create_dir_all(dir).with_context(|| dir.display().to_string())?;
    }
    let _ = std::fs::remove_file(&mode.socket);
    let listener = tokio::net::UnixListener::bind(&mode.socket)
        .with_context(|| format!("the mapper's socket {}", mode.socket.display()))?;
    let incoming = twin::dmi::incoming(listener);
    let service = DeviceMapperServiceServer::new(Server(devices.clone()));
    tokio::spawn(async move {
        if let Err(err) = tonic::transport::Server::builder()
            .serve_with_incoming(service, incoming)
            .await
        {
            tracing::error!(error = %err, "the mapper's server stopped");
        }
    });
    let mut client = register(&mode, &devices).await;
    let mut tick = tokio::time::interval(mode.period);
    let mut reading: u64 = 0;
    loop {
        tick.tick().await;
        reading += 1;
        let held: Vec<_> = devices
            .lock()
            .map(|d| d.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
            .unwrap_or_default();
        let simulated = format!("{:.1}", 20.0 + (reading % 50) as f64 / 10.0);
        let mut lost = false;
        for ((namespace, name), twins) in held {
            let twins = twins
                .iter()
                .map(|(property, desired)| api::Twin {
                    property_name: property.clone(),
                    observed_desired: desired.clone().map(|value| api::TwinProperty {
                        value,
                        metadata: Default::default(),
                    }),
                    // A property the cloud set is driven to it; any other
                    // reads a simulated sensor.
                    reported: Some(api::TwinProperty {
                        value: desired.clone().unwrap_or_else(|| simulated.clone()),
                        metadata: Default::default(),
                    }),
                })
                .collect();
            let status = api::ReportDeviceStatusRequest {
                device_name: name.clone(),
                device_namespace: namespace.clone(),
                reported_device: Some(api::DeviceStatus {
                    twins,
                    report_to_cloud: true,
                    report_cycle: i64::try_from(mode.period.as_millis()).unwrap_or(i64::MAX),
                }),
            };
            let state = api::ReportDeviceStatesRequest {
                device_name: name.clone(),
                device_namespace: namespace,
                state: "online".to_owned(),
            };
            let reported = client.report_device_status(status).await;
            let stated = client.report_device_states(state).await;
            for answer in [reported.err(), stated.err()].into_iter().flatten() {
                // The edge unreachable (gone, restarting) is a reason to
                // register again; an answer refusing the report (a rate
                // limit included) is not.
                match answer.code() {
                    tonic::Code::Unavailable => lost = true,
                    _ => tracing::warn!(device = %name, error = %answer, "report refused"),
                }
            }
        }
        if lost {
            tracing::warn!("the edge went away; registering again");
            client = register(&mode, &devices).await;
        }
    }
}
