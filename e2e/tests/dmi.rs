//! KubeEdge's DMI at the edge, with real parts: a cloud and an edge in this
//! process (cloudhub over WebSocket with mutual TLS, metamanager on redb,
//! devicetwin), the edge's DMI server on a Unix socket, and a gRPC client
//! over that socket playing a KubeEdge mapper: it registers, gets its
//! protocol's devices, and its reports reach the cloud's Device status.

use std::path::Path;
use std::time::Duration;

use serde_json::Value;
use tokio::sync::mpsc;
use tonic::transport::Channel;
use tonic::{Request, Response, Status};
use twin::dmi::api::device_manager_service_client::DeviceManagerServiceClient;
use twin::dmi::api::device_mapper_service_server::{
    DeviceMapperService, DeviceMapperServiceServer,
};
use twin::dmi::api::{self, MapperInfo};
use twin::{DeviceTwin, DeviceTwinConfig};

use e2e::{Cloud, Edge};

const NODE: &str = "edge-dmi";
const WAIT: Duration = Duration::from_secs(20);

/// A gRPC channel to the Unix socket at `path`, as a mapper dials edgecore.
async fn dial(path: &Path) -> DeviceManagerServiceClient<Channel> {
    let channel = twin::dmi::dial(path, WAIT).await.expect("the DMI socket");
    DeviceManagerServiceClient::new(channel)
}

/// A mapper's own gRPC server: every call it gets, as "Call name desired".
/// A stalling one never answers: it holds each call until the caller gives
/// up on it ("dropped Call name") or the mapper dies.
struct RecordingMapper {
    calls: mpsc::UnboundedSender<String>,
    stall: bool,
}

/// Notes "dropped ..." when the call it guards is abandoned.
struct Abandoned(mpsc::UnboundedSender<String>, String);

impl Drop for Abandoned {
    fn drop(&mut self) {
        let _ = self.0.send(format!("dropped {}", self.1));
    }
}

impl RecordingMapper {
    async fn note(&self, call: &str, device: Option<&api::Device>, name: &str) {
        let desired = device
            .and_then(|d| d.spec.as_ref())
            .and_then(|s| s.properties.iter().find(|p| p.name == "temperature"))
            .and_then(|p| p.desired.as_ref())
            .map(|d| d.value.clone())
            .unwrap_or_default();
        let name = device.map_or(name, |d| d.name.as_str());
        let seen = format!("{call} {name} {desired}").trim_end().to_owned();
        let _ = self.calls.send(seen.clone());
        if self.stall {
            let _abandoned = Abandoned(self.calls.clone(), seen);
            std::future::pending::<()>().await;
        }
    }
}

#[tonic::async_trait]
impl DeviceMapperService for RecordingMapper {
    async fn register_device(
        &self,
        request: Request<api::RegisterDeviceRequest>,
    ) -> Result<Response<api::RegisterDeviceResponse>, Status> {
        self.note("RegisterDevice", request.get_ref().device.as_ref(), "")
            .await;
        Ok(Response::new(api::RegisterDeviceResponse::default()))
    }
    async fn remove_device(
        &self,
        request: Request<api::RemoveDeviceRequest>,
    ) -> Result<Response<api::RemoveDeviceResponse>, Status> {
        self.note("RemoveDevice", None, &request.get_ref().device_name)
            .await;
        Ok(Response::new(api::RemoveDeviceResponse {}))
    }
    async fn update_device(
        &self,
        request: Request<api::UpdateDeviceRequest>,
    ) -> Result<Response<api::UpdateDeviceResponse>, Status> {
        self.note("UpdateDevice", request.get_ref().device.as_ref(), "")
            .await;
        Ok(Response::new(api::UpdateDeviceResponse {}))
    }
    async fn create_device_model(
        &self,
        request: Request<api::CreateDeviceModelRequest>,
    ) -> Result<Response<api::CreateDeviceModelResponse>, Status> {
        let name = request
            .get_ref()
            .model
            .as_ref()
            .map(|m| m.name.clone())
            .unwrap_or_default();
        self.note("CreateDeviceModel", None, &name).await;
        Ok(Response::new(api::CreateDeviceModelResponse::default()))
    }
    async fn remove_device_model(
        &self,
        request: Request<api::RemoveDeviceModelRequest>,
    ) -> Result<Response<api::RemoveDeviceModelResponse>, Status> {
        self.note("RemoveDeviceModel", None, &request.get_ref().model_name)
            .await;
        Ok(Response::new(api::RemoveDeviceModelResponse {}))
    }
    async fn update_device_model(
        &self,
        request: Request<api::UpdateDeviceModelRequest>,
    ) -> Result<Response<api::UpdateDeviceModelResponse>, Status> {
        let name = request
            .get_ref()
            .model
            .as_ref()
            .map(|m| m.name.clone())
            .unwrap_or_default();
        self.note("UpdateDeviceModel", None, &name).await;
        Ok(Response::new(api::UpdateDeviceModelResponse {}))
    }
    async fn get_device(
        &self,
        _request: Request<api::GetDeviceRequest>,
    ) -> Result<Response<api::GetDeviceResponse>, Status> {
        Err(Status::unimplemented("not asked by the edge"))
    }
}

/// Serves a [`RecordingMapper`] on `socket`: the calls it gets.
fn serve_mapper(socket: &Path) -> mpsc::UnboundedReceiver<String> {
    let (calls, got) = mpsc::unbounded_channel();
    let listener = tokio::net::UnixListener::bind(socket).expect("the mapper's socket");
    let incoming = twin::dmi::incoming(listener);
    tokio::spawn(tonic::transport::Server::builder().serve_with_incoming(
        DeviceMapperServiceServer::new(RecordingMapper {
            calls,
            stall: false,
        }),
        incoming,
    ));
    got
}

/// A mapper on a runtime of its own, as a process of its own: dropping
/// [`MapperProcess`] kills it, every connection and call with it.
struct MapperProcess {
    die: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for MapperProcess {
    fn drop(&mut self) {
        drop(self.die.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn spawn_mapper(socket: &Path, stall: bool) -> (MapperProcess, mpsc::UnboundedReceiver<String>) {
    let (calls, got) = mpsc::unbounded_channel();
    let (die, died) = tokio::sync::oneshot::channel::<()>();
    let (bound, is_bound) = std::sync::mpsc::channel();
    let socket = socket.to_owned();
    let thread = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("the mapper's runtime");
        runtime.block_on(async move {
            let _ = std::fs::remove_file(&socket);
            let listener = tokio::net::UnixListener::bind(&socket).expect("the mapper's socket");
            let _ = bound.send(());
            let server = tonic::transport::Server::builder().serve_with_incoming(
                DeviceMapperServiceServer::new(RecordingMapper { calls, stall }),
                twin::dmi::incoming(listener),
            );
            tokio::select! {
                _ = server => {}
                _ = died => {}
            }
        });
        // The runtime goes here: its tasks, sockets and held calls too.
    });
    is_bound.recv().expect("the mapper listening");
    let process = MapperProcess {
        die: Some(die),
        thread: Some(thread),
    };
    (process, got)
}

/// The next call the mapper gets.
async fn next_call(got: &mut mpsc::UnboundedReceiver<String>) -> String {
    tokio::time::timeout(WAIT, got.recv())
        .await
        .expect("a call to the mapper in time")
        .expect("the mapper's server")
}

fn manifests() -> &'static str {
    "apiVersion: devices.kubeedge.io/v1beta1
kind: DeviceModel
metadata:
  name: thermometer
spec:
  protocol: modbus
  properties:
  - name: temperature
    type: float
    accessMode: ReadOnly
---
apiVersion: devices.kubeedge.io/v1beta1
kind: Device
metadata:
  name: thermo-dmi
spec:
  nodeName: edge-dmi
  deviceModelRef:
    name: thermometer
  protocol:
    protocolName: modbus
    configData:
      slaveID: 1
  properties:
  - name: temperature
    visitors:
      protocolName: modbus
      configData:
        register: HoldingRegister
        offset: 2
---
apiVersion: devices.kubeedge.io/v1beta1
kind: Device
metadata:
  name: lamp-opcua
spec:
  nodeName: edge-dmi
  deviceModelRef:
    name: thermometer
  protocol:
    protocolName: opcua
"
}

/// Applies [`manifests`] and waits until both devices are at the edge.
async fn apply_devices(cloud: &Cloud, twins: &twin::DeviceTwinHandle) {
    let applied = cloud.apply(manifests()).await;
    assert_eq!(applied.len(), 3, "{applied:?}");
    let mut counts = twins.counts.clone();
    tokio::time::timeout(WAIT, counts.wait_for(|c| c.devices == 2))
        .await
        .expect("both devices at the edge")
        .expect("devicetwin");
}

fn mapper(protocol: &str, with_data: bool, socket: &Path) -> api::MapperRegisterRequest {
    api::MapperRegisterRequest {
        with_data,
        mapper: Some(MapperInfo {
            name: format!("{protocol}-mapper"),
            version: "v1.22.0".to_owned(),
            api_version: "v1.0.0".to_owned(),
            protocol: protocol.to_owned(),
            address: socket.to_string_lossy().into_owned().into_bytes(),
            state: "ok".to_owned(),
        }),
    }
}

fn reported(device: &Value, property: &str) -> Option<String> {
    device["status"]["twins"]
        .as_array()?
        .iter()
        .find(|t| t["propertyName"] == property)?["reported"]["value"]
        .as_str()
        .map(str::to_owned)
}

#[actix::test]
async fn a_dmi_mapper_registers_gets_its_devices_and_reports_to_the_cloud() {
    let cloud = Cloud::start().await;
    let edge = Edge::start(&cloud, NODE).await;
    let config = DeviceTwinConfig {
        report_period: Duration::from_millis(50),
        ..DeviceTwinConfig::new(NODE)
    };
    let twins = DeviceTwin::start(&edge.hive, config).expect("devicetwin");
    let dir = tempfile::tempdir().expect("dir");
    let socket = dir.path().join("kubeedge").join("dmi.sock");
    // A stale socket file from an earlier run is replaced.
    std::fs::create_dir_all(socket.parent().expect("parent")).expect("dir");
    std::fs::write(&socket, b"stale").expect("stale file");
    let dmi = twin::dmi::server::start(&edge.hive, twin::dmi::DmiConfig::new(&socket))
        .expect("DMI server");
    // Only the edge's user and group may connect.
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(&socket)
            .expect("the socket")
            .permissions(),
    );
    assert_eq!(mode & 0o777, 0o660, "{mode:o}");

    apply_devices(&cloud, &twins).await;

    // The modbus mapper registers: it gets its device (not the opcua one)
    // with the model, the configuration values as KubeEdge sends them.
    let mut client = dial(&socket).await;
    let modbus_socket = dir.path().join("modbus.sock");
    let mut calls = serve_mapper(&modbus_socket);
    let answer = client
        .mapper_register(mapper("modbus", true, &modbus_socket))
        .await
        .expect("registered")
        .into_inner();
    let names: Vec<&str> = answer.device_list.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(names, ["thermo-dmi"]);
    assert_eq!(answer.model_list.len(), 1);
    assert_eq!(answer.model_list[0].name, "thermometer");
    let spec = answer.device_list[0].spec.as_ref().expect("spec");
    let slave = &spec
        .protocol
        .as_ref()
        .and_then(|p| p.config_data.as_ref())
        .expect("configData")
        .data["slaveID"];
    assert_eq!(
        slave.type_url,
        "type.googleapis.com/google.protobuf.FloatValue"
    );
    let mappers = dmi.mappers.lock().expect("registry").clone();
    assert_eq!(mappers["modbus"].socket, modbus_socket);
    // Without data: registered, nothing listed (its device comes as a
    // call; nothing serves that socket here, so the call fails and is
    // made again later).
    let bare = client
        .mapper_register(mapper("opcua", false, &dir.path().join("opcua.sock")))
        .await
        .expect("registered")
        .into_inner();
    assert!(bare.device_list.is_empty());

    // A reported value reaches the cloud's Device status.
    let report = api::ReportDeviceStatusRequest {
        device_name: "thermo-dmi".to_owned(),
        device_namespace: "default".to_owned(),
        reported_device: Some(api::DeviceStatus {
            twins: vec![api::Twin {
                property_name: "temperature".to_owned(),
                observed_desired: None,
                reported: Some(api::TwinProperty {
                    value: "21.5".to_owned(),
                    metadata: Default::default(),
                }),
            }],
            report_to_cloud: true,
            report_cycle: 1000,
        }),
    };
    client
        .report_device_status(report.clone())
        .await
        .expect("reported");
    let path = "/apis/devices.kubeedge.io/v1beta1/namespaces/default/devices/thermo-dmi";
    let mut controller = cloud.controller.counts.clone();
    let device = tokio::time::timeout(WAIT, async {
        loop {
            let device = cloud.client.get(path).await.expect("get device");
            if reported(&device, "temperature").as_deref() == Some("21.5") {
                return device;
            }
            controller.changed().await.expect("controller");
        }
    })
    .await
    .expect("the reported value in the cloud's Device status");
    println!("cloud's status: {}", device["status"]);
    let state = api::ReportDeviceStatesRequest {
        device_name: "thermo-dmi".to_owned(),
        device_namespace: "default".to_owned(),
        state: "online".to_owned(),
    };
    client
        .report_device_states(state)
        .await
        .expect("state reported");
    tokio::time::timeout(WAIT, async {
        loop {
            let device = cloud.client.get(path).await.expect("get device");
            if device["status"]["state"] == "online" {
                return;
            }
            controller.changed().await.expect("controller");
        }
    })
    .await
    .expect("the state in the cloud's Device status");

    // Bad input gets an error and changes nothing else.
    let mut unknown = report.clone();
    unknown.device_name = "nobody".to_owned();
    let refused = client
        .report_device_status(unknown)
        .await
        .expect_err("an unknown device");
    assert_eq!(refused.code(), tonic::Code::NotFound, "{refused}");
    let bad_state = api::ReportDeviceStatesRequest {
        device_name: "thermo-dmi".to_owned(),
        device_namespace: "default".to_owned(),
        state: "on fire".to_owned(),
    };
    let refused = client
        .report_device_states(bad_state)
        .await
        .expect_err("a bad state");
    assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused}");
    let mut oversized = report.clone();
    if let Some(status) = oversized.reported_device.as_mut() {
        status.twins[0].reported = Some(api::TwinProperty {
            value: "x".repeat(5 << 20),
            metadata: Default::default(),
        });
    }
    let refused = client
        .report_device_status(oversized)
        .await
        .expect_err("an oversized report");
    assert_eq!(refused.code(), tonic::Code::OutOfRange, "{refused}");
    let nameless = client
        .mapper_register(api::MapperRegisterRequest {
            with_data: true,
            mapper: None,
        })
        .await
        .expect_err("no mapper");
    assert_eq!(nameless.code(), tonic::Code::InvalidArgument);
    // The device's value stands.
    let device = cloud.client.get(path).await.expect("get device");
    assert_eq!(reported(&device, "temperature").as_deref(), Some("21.5"));

    // The cloud's changes reach the mapper: a desired value (UpdateDevice
    // carrying it), a new device of its protocol (RegisterDevice), a
    // device deleted (RemoveDevice).
    let desired = manifests().replace(
        "  - name: temperature\n    visitors:",
        "  - name: temperature\n    desired:\n      value: \"30\"\n    visitors:",
    );
    cloud.apply(&desired).await;
    assert_eq!(next_call(&mut calls).await, "UpdateDevice thermo-dmi 30");
    let second = manifests()
        .split("---")
        .nth(1)
        .expect("the device")
        .replace("name: thermo-dmi", "name: thermo-two");
    cloud.apply(&second).await;
    assert_eq!(next_call(&mut calls).await, "RegisterDevice thermo-two");
    let deleted = cloud
        .client
        .delete("/apis/devices.kubeedge.io/v1beta1/namespaces/default/devices/thermo-two")
        .await;
    assert!(deleted.is_ok(), "{deleted:?}");
    assert_eq!(next_call(&mut calls).await, "RemoveDevice thermo-two");
    // A mapper that restarts (registers again) gets its devices back.
    let again = client
        .mapper_register(mapper("modbus", true, &modbus_socket))
        .await
        .expect("registered again")
        .into_inner();
    let names: Vec<&str> = again.device_list.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(names, ["thermo-dmi"]);
    assert!(calls.try_recv().is_err(), "no call beyond those");
}

/// A mapper that hangs in a call delays no other mapper; when it dies in
/// the middle of the call and comes back, it has its device again and the
/// cloud's next change reaches it.
#[actix::test]
async fn a_mapper_that_hangs_or_dies_mid_call_delays_no_other_and_loses_nothing() {
    let cloud = Cloud::start().await;
    let edge = Edge::start(&cloud, NODE).await;
    let twins = DeviceTwin::start(&edge.hive, DeviceTwinConfig::new(NODE)).expect("devicetwin");
    let dir = tempfile::tempdir().expect("dir");
    let socket = dir.path().join("dmi.sock");
    let _dmi = twin::dmi::server::start(&edge.hive, twin::dmi::DmiConfig::new(&socket))
        .expect("DMI server");
    apply_devices(&cloud, &twins).await;
    let mut client = dial(&socket).await;

    // The modbus mapper registers without data, takes its first call (the
    // model, as edgecore sends it first) and never answers.
    let modbus_socket = dir.path().join("modbus.sock");
    let (hung, mut hung_calls) = spawn_mapper(&modbus_socket, true);
    client
        .mapper_register(mapper("modbus", false, &modbus_socket))
        .await
        .expect("registered");
    assert_eq!(
        next_call(&mut hung_calls).await,
        "CreateDeviceModel thermometer"
    );

    // The opcua mapper gets its calls while that call is still held.
    let opcua_socket = dir.path().join("opcua.sock");
    let mut opcua_calls = serve_mapper(&opcua_socket);
    client
        .mapper_register(mapper("opcua", false, &opcua_socket))
        .await
        .expect("registered");
    assert_eq!(
        next_call(&mut opcua_calls).await,
        "CreateDeviceModel thermometer"
    );
    assert_eq!(
        next_call(&mut opcua_calls).await,
        "RegisterDevice lamp-opcua"
    );
    assert!(
        hung_calls.try_recv().is_err(),
        "the modbus call was still held while opcua's were made"
    );

    // The modbus mapper dies in the middle of the call, and comes back.
    drop(hung);
    let (_back, mut back_calls) = spawn_mapper(&modbus_socket, false);
    let again = client
        .mapper_register(mapper("modbus", true, &modbus_socket))
        .await
        .expect("registered again")
        .into_inner();
    let names: Vec<&str> = again.device_list.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(
        names,
        ["thermo-dmi"],
        "its device, listed at its registration"
    );

    // The cloud's next change reaches it, and is the first call it gets:
    // what was queued for it before it died is not made (its registration
    // listed the device as held).
    let desired = manifests().replace(
        "  - name: temperature\n    visitors:",
        "  - name: temperature\n    desired:\n      value: \"30\"\n    visitors:",
    );
    cloud.apply(&desired).await;
    assert_eq!(
        next_call(&mut back_calls).await,
        "UpdateDevice thermo-dmi 30"
    );
    // And opcua's mapper got nothing more than its own.
    while let Ok(call) = opcua_calls.try_recv() {
        assert!(
            call.ends_with("lamp-opcua") || call.contains("thermometer"),
            "{call}"
        );
    }
    edge.shutdown().await;
    cloud.shutdown().await;
}

/// Reads one HTTP/2 frame: type, flags, stream, payload.
async fn read_frame(stream: &mut tokio::net::UnixStream) -> (u8, u8, u32, Vec<u8>) {
    use tokio::io::AsyncReadExt;
    let mut header = [0u8; 9];
    tokio::time::timeout(WAIT, stream.read_exact(&mut header))
        .await
        .expect("a frame in time")
        .expect("a frame");
    let length =
        (usize::from(header[0]) << 16) | (usize::from(header[1]) << 8) | usize::from(header[2]);
    let mut payload = vec![0u8; length];
    stream.read_exact(&mut payload).await.expect("its payload");
    let id = u32::from_be_bytes([header[5], header[6], header[7], header[8]]) & 0x7fff_ffff;
    (header[3], header[4], id, payload)
}

fn h2_frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(9 + payload.len());
    let length = payload.len();
    out.extend_from_slice(&[
        (length >> 16) as u8,
        (length >> 8) as u8,
        length as u8,
        kind,
        flags,
    ]);
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// A mapper dialing as KubeEdge's Go mapper-framework does (grpc-go given
/// the socket's path) names the path as the request's `:authority`; the
/// edge serves it. The request is written frame by frame here, as grpc-go
/// writes it, since Rust's HTTP/2 clients refuse to send such an authority.
#[actix::test]
async fn a_mapper_naming_the_socket_path_as_authority_as_go_does_is_served() {
    use prost::Message as _;
    use tokio::io::AsyncWriteExt;
    let cloud = Cloud::start().await;
    let edge = Edge::start(&cloud, NODE).await;
    let _twins = DeviceTwin::start(&edge.hive, DeviceTwinConfig::new(NODE)).expect("devicetwin");
    let dir = tempfile::tempdir().expect("dir");
    let socket = dir.path().join("dmi.sock");
    let dmi = twin::dmi::server::start(&edge.hive, twin::dmi::DmiConfig::new(&socket))
        .expect("DMI server");

    let mut stream = tokio::net::UnixStream::connect(&socket)
        .await
        .expect("connect");
    let path = socket.to_string_lossy().into_owned();
    let mut encoder = loona_hpack::Encoder::new();
    let headers: Vec<(&[u8], &[u8])> = vec![
        (b":method", b"POST"),
        (b":scheme", b"http"),
        (b":path", b"/v1beta1.DeviceManagerService/MapperRegister"),
        (b":authority", path.as_bytes()),
        (b"content-type", b"application/grpc"),
        (b"te", b"trailers"),
        (b"user-agent", b"grpc-go/1.70.0"),
    ];
    let block = encoder.encode(headers);
    let request = mapper("gomapper", false, &dir.path().join("go.sock")).encode_to_vec();
    let mut message = vec![0u8];
    message.extend_from_slice(&(request.len() as u32).to_be_bytes());
    message.extend_from_slice(&request);
    let mut written = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    written.extend(h2_frame(0x4, 0, 0, &[]));
    written.extend(h2_frame(0x1, 0x4, 1, &block));
    written.extend(h2_frame(0x0, 0x1, 1, &message));
    stream.write_all(&written).await.expect("the request");

    // The answer: response headers, the message, trailers with
    // grpc-status 0 (not a RST_STREAM with PROTOCOL_ERROR).
    let mut decoder = loona_hpack::Decoder::new();
    let mut status = None;
    while status.is_none() {
        let (kind, flags, id, payload) = read_frame(&mut stream).await;
        match kind {
            0x4 if flags & 0x1 == 0 => {
                stream
                    .write_all(&h2_frame(0x4, 0x1, 0, &[]))
                    .await
                    .expect("settings acked");
            }
            0x3 => panic!("stream {id} reset: error code {payload:?}"),
            0x7 => panic!("connection closed (GOAWAY): {payload:?}"),
            0x1 => {
                for (name, value) in decoder.decode(&payload).expect("the server's headers") {
                    if name == b"grpc-status" {
                        status = Some(String::from_utf8_lossy(&value).into_owned());
                    }
                }
            }
            _ => {}
        }
    }
    assert_eq!(status.as_deref(), Some("0"));
    let mappers = dmi.mappers.lock().expect("registry").clone();
    assert!(mappers.contains_key("gomapper"), "{:?}", mappers.keys());
    edge.shutdown().await;
    cloud.shutdown().await;
}
