//! Devices and models to their mappers: what the cloud changes reaches the
//! mapper registered for the device's protocol (`RegisterDevice`,
//! `UpdateDevice`, `RemoveDevice`, `CreateDeviceModel`,
//! `UpdateDeviceModel`, `RemoveDeviceModel`), as KubeEdge's edgecore
//! calls them.
//!
//! [`Dispatch`] decides (plain code: which calls a change makes), the task
//! in [`run`] makes them over each mapper's Unix socket, in order for each
//! mapper and in a lane of its own, so a mapper that hangs in a call or dies
//! in the middle of one delays no other mapper. A call that fails leaves the
//! device unsent to that mapper, so its next change (or the mapper's next
//! registration) registers it again.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;
use std::time::Duration;

use apis::devices::{Device, DeviceModel};
use tokio::sync::mpsc;
use tracing::{debug, info, warn};

use super::api;
use super::api::device_mapper_service_client::DeviceMapperServiceClient;
use super::convert;

/// How long one call to a mapper may take (edgecore's 10 s).
pub const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// A device's key: namespace and name.
pub type DeviceKey = (String, String);

/// The namespaces each device name is held in, as the dispatch last saw
/// them (the server refuses a report for a name held in two).
pub type Names = std::sync::Arc<std::sync::Mutex<BTreeMap<String, BTreeSet<String>>>>;

/// What a registration's answer listed: each device's key and spec.
pub type Listed = Vec<(DeviceKey, apis::devices::DeviceSpec)>;

/// A call to a mapper.
#[derive(Debug, Clone, PartialEq)]
pub enum Call {
    /// `RegisterDevice` (first time at this mapper).
    Register(api::Device),
    /// `UpdateDevice`.
    Update(api::Device),
    /// `RemoveDevice`.
    Remove(DeviceKey),
    /// `CreateDeviceModel`.
    CreateModel(api::DeviceModel),
    /// `UpdateDeviceModel`.
    UpdateModel(api::DeviceModel),
    /// `RemoveDeviceModel`.
    RemoveModel(DeviceKey),
}

/// What to call, and where.
#[derive(Debug, Clone, PartialEq)]
pub struct Planned {
    /// The protocol whose mapper is called.
    pub protocol: String,
    /// Its socket.
    pub socket: PathBuf,
    /// The call.
    pub call: Call,
    /// The mapper's registrations for this protocol when it was planned
    /// (a failure reported after a later registration is settled by it).
    pub registration: u64,
}

/// What the dispatch knows: mappers, devices, models, and which device
/// and model each mapper has.
#[derive(Debug, Default)]
pub struct Dispatch {
    mappers: BTreeMap<String, PathBuf>,
    devices: BTreeMap<DeviceKey, (String, Device)>,
    models: BTreeMap<DeviceKey, DeviceModel>,
    /// (protocol, device) pairs the mapper has.
    sent: BTreeSet<(String, DeviceKey)>,
    /// (protocol, model) pairs the mapper has.
    sent_models: BTreeSet<(String, DeviceKey)>,
    /// Registrations seen per protocol.
    registrations: BTreeMap<String, u64>,
}

fn key_of(namespace: Option<&String>, name: Option<&String>) -> DeviceKey {
    (
        namespace.cloned().unwrap_or_else(|| "default".to_owned()),
        name.cloned().unwrap_or_default(),
    )
}

impl Dispatch {
    /// A mapper registered for `protocol` at `socket`; `listed`: what its
    /// answer listed (none: it asked for nothing). A device listed as held
    /// here is the mapper's; any other of its protocol is sent to it (a
    /// device that came or changed between the listing and now).
    pub fn registered(
        &mut self,
        protocol: &str,
        socket: PathBuf,
        listed: Option<&Listed>,
    ) -> Vec<Planned> {
        self.mappers.insert(protocol.to_owned(), socket.clone());
        *self.registrations.entry(protocol.to_owned()).or_default() += 1;
        self.sent.retain(|(p, _)| p != protocol);
        self.sent_models.retain(|(p, _)| p != protocol);
        let keys: Vec<DeviceKey> = self
            .devices
            .iter()
            .filter(|(_, (p, _))| p == protocol)
            .map(|(key, _)| key.clone())
            .collect();
        let mut calls = Vec::new();
        for key in keys {
            let as_held = listed.is_some_and(|listed| {
                listed.iter().any(|(k, spec)| {
                    *k == key && self.devices.get(&key).is_some_and(|(_, d)| d.spec == *spec)
                })
            });
            if as_held {
                if let Some(model) = self.model_key_of(&key) {
                    self.sent_models.insert((protocol.to_owned(), model));
                }
                self.sent.insert((protocol.to_owned(), key));
            } else {
                calls.extend(self.send_device(&key));
            }
        }
        // What it lists and should not have (deleted, or moved to another
        // protocol, while it was away or its removal was still queued):
        // removed.
        for (key, _) in listed.into_iter().flatten() {
            let wanted = self.devices.get(key).is_some_and(|(p, _)| p == protocol);
            if !wanted {
                calls.push(Planned {
                    registration: self.registration_of(protocol),
                    protocol: protocol.to_owned(),
                    socket: socket.clone(),
                    call: Call::Remove(key.clone()),
                });
            }
        }
        calls
    }

    /// How many times a mapper registered for `protocol`.
    fn registration_of(&self, protocol: &str) -> u64 {
        self.registrations.get(protocol).copied().unwrap_or(0)
    }

    /// The key of `device`'s model.
    fn model_key_of(&self, device: &DeviceKey) -> Option<DeviceKey> {
        let (_, device_object) = self.devices.get(device)?;
        let name = device_object.spec.device_model_ref.as_ref()?.name.clone();
        Some((device.0.clone(), name))
    }

    /// The calls that bring `key`'s mapper up to date with it.
    fn send_device(&mut self, key: &DeviceKey) -> Vec<Planned> {
        let Some((protocol, device)) = self.devices.get(key).cloned() else {
            return Vec::new();
        };
        let Some(socket) = self.mappers.get(&protocol).cloned() else {
            return Vec::new();
        };
        // With its model's defaults, as edgecore gives it.
        let model = self
            .model_key_of(key)
            .and_then(|model_key| self.models.get(&model_key))
            .cloned();
        let converted =
            match convert::device(&convert::with_model_defaults(&device, model.as_ref())) {
                Ok(converted) => converted,
                Err(err) => {
                    warn!(device = %key.1, error = %err, "not given to its mapper");
                    return Vec::new();
                }
            };
        let registration = self.registration_of(&protocol);
        let plan = |call| Planned {
            protocol: protocol.clone(),
            socket: socket.clone(),
            call,
            registration,
        };
        let mut calls = Vec::new();
        // Its model first, as edgecore does.
        if let Some(model_key) = self.model_key_of(key)
            && !self
                .sent_models
                .contains(&(protocol.clone(), model_key.clone()))
            && let Some(model) = self.models.get(&model_key)
        {
            self.sent_models.insert((protocol.clone(), model_key));
            calls.push(plan(Call::CreateModel(convert::model(model))));
        }
        let first = self.sent.insert((protocol.clone(), key.clone()));
        calls.push(plan(match first {
            true => Call::Register(converted),
            false => Call::Update(converted),
        }));
        calls
    }

    /// A device from the cloud, new or changed.
    pub fn device_changed(&mut self, device: Device) -> Vec<Planned> {
        let key = key_of(
            device.metadata.namespace.as_ref(),
            device.metadata.name.as_ref(),
        );
        let protocol = convert::protocol_of(&device).unwrap_or_default();
        let mut calls = Vec::new();
        match self.devices.get(&key) {
            // Only its status changed (the cloud stored what the node
            // reported): nothing for the mapper.
            Some((old, stored))
                if *old == protocol
                    && stored.spec == device.spec
                    && self.sent.contains(&(protocol.clone(), key.clone())) =>
            {
                self.devices.insert(key, (protocol, device));
                return calls;
            }
            // Moved to another protocol: it leaves its old mapper.
            Some((old, _)) if *old != protocol => calls.extend(self.device_removed(&key)),
            _ => {}
        }
        self.devices.insert(key.clone(), (protocol, device));
        calls.extend(self.send_device(&key));
        calls
    }

    /// A device removed (or no longer bound to this node).
    pub fn device_removed(&mut self, key: &DeviceKey) -> Vec<Planned> {
        let Some((protocol, _)) = self.devices.remove(key) else {
            return Vec::new();
        };
        if !self.sent.remove(&(protocol.clone(), key.clone())) {
            return Vec::new();
        }
        match self.mappers.get(&protocol) {
            Some(socket) => vec![Planned {
                registration: self.registration_of(&protocol),
                protocol,
                socket: socket.clone(),
                call: Call::Remove(key.clone()),
            }],
            None => Vec::new(),
        }
    }

    /// A model from the cloud, new or changed: mappers that have it get it
    /// again.
    pub fn model_changed(&mut self, model: DeviceModel) -> Vec<Planned> {
        let key = key_of(
            model.metadata.namespace.as_ref(),
            model.metadata.name.as_ref(),
        );
        let converted = convert::model(&model);
        self.models.insert(key.clone(), model);
        let mut calls: Vec<Planned> = self
            .sent_models
            .iter()
            .filter(|(_, k)| *k == key)
            .filter_map(|(protocol, _)| {
                Some(Planned {
                    protocol: protocol.clone(),
                    socket: self.mappers.get(protocol)?.clone(),
                    call: Call::UpdateModel(converted.clone()),
                    registration: self.registration_of(protocol),
                })
            })
            .collect();
        // Devices of this model whose mapper does not have them yet.
        let waiting: Vec<DeviceKey> = self
            .devices
            .iter()
            .filter(|(k, (p, _))| {
                self.mappers.contains_key(p)
                    && !self.sent.contains(&(p.clone(), (*k).clone()))
                    && self.model_key_of(k).as_ref() == Some(&key)
            })
            .map(|(k, _)| k.clone())
            .collect();
        for device in waiting {
            calls.extend(self.send_device(&device));
        }
        calls
    }

    /// A model removed: mappers that have it drop it.
    pub fn model_removed(&mut self, key: &DeviceKey) -> Vec<Planned> {
        self.models.remove(key);
        let holders: Vec<String> = self
            .sent_models
            .iter()
            .filter(|(_, k)| k == key)
            .map(|(p, _)| p.clone())
            .collect();
        holders
            .into_iter()
            .filter_map(|protocol| {
                self.sent_models.remove(&(protocol.clone(), key.clone()));
                Some(Planned {
                    socket: self.mappers.get(&protocol)?.clone(),
                    registration: self.registration_of(&protocol),
                    protocol,
                    call: Call::RemoveModel(key.clone()),
                })
            })
            .collect()
    }

    /// Publishes which namespaces hold each device name.
    pub fn publish_names(&self, names: &Names) {
        let mut by_name: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (namespace, name) in self.devices.keys() {
            by_name
                .entry(name.clone())
                .or_default()
                .insert(namespace.clone());
        }
        if let Ok(mut names) = names.lock() {
            *names = by_name;
        }
    }

    /// A call failed: the mapper is taken not to have what it carried, so
    /// the next change or registration sends it again. A mapper that
    /// registered since the call was planned (it died in the call and came
    /// back) has said what it holds: the failure changes nothing.
    pub fn failed(&mut self, planned: &Planned) {
        if planned.registration != self.registration_of(&planned.protocol) {
            return;
        }
        match &planned.call {
            Call::Register(device) | Call::Update(device) => {
                let key = (device.namespace.clone(), device.name.clone());
                self.sent.remove(&(planned.protocol.clone(), key));
            }
            Call::CreateModel(model) | Call::UpdateModel(model) => {
                let key = (model.namespace.clone(), model.name.clone());
                self.sent_models.remove(&(planned.protocol.clone(), key));
            }
            Call::Remove(_) | Call::RemoveModel(_) => {}
        }
    }
}

/// What the dispatch task takes.
#[derive(Debug)]
pub enum Input {
    /// A mapper registered (`listed`: answered with its devices).
    Registered {
        /// Its protocol.
        protocol: String,
        /// Its socket.
        socket: PathBuf,
        /// What its answer listed (none: it asked for nothing).
        listed: Option<Listed>,
    },
    /// A device or model message from the cloud (through devicetwin).
    Hive(Box<beehive::Message>),
}

/// Makes `call` to the mapper at `socket`.
async fn call(socket: PathBuf, call: Call) -> Result<(), String> {
    let channel = super::dial(&socket, CALL_TIMEOUT)
        .await
        .map_err(|err| format!("the mapper's socket: {err}"))?;
    let mut client = DeviceMapperServiceClient::new(channel);
    let answered = match call {
        Call::Register(device) => client
            .register_device(api::RegisterDeviceRequest {
                device: Some(device),
            })
            .await
            .map(drop),
        Call::Update(device) => client
            .update_device(api::UpdateDeviceRequest {
                device: Some(device),
            })
            .await
            .map(drop),
        Call::Remove((namespace, name)) => client
            .remove_device(api::RemoveDeviceRequest {
                device_name: name,
                device_namespace: namespace,
            })
            .await
            .map(drop),
        Call::CreateModel(model) => client
            .create_device_model(api::CreateDeviceModelRequest { model: Some(model) })
            .await
            .map(drop),
        Call::UpdateModel(model) => client
            .update_device_model(api::UpdateDeviceModelRequest { model: Some(model) })
            .await
            .map(drop),
        Call::RemoveModel((namespace, name)) => client
            .remove_device_model(api::RemoveDeviceModelRequest {
                model_name: name,
                model_namespace: namespace,
            })
            .await
            .map(drop),
    };
    answered.map_err(|status| format!("{}: {}", status.code(), status.message()))
}

/// The dispatch task: devices and models as they come (first `loaded`,
/// what metamanager held), registrations, calls in order; `names` kept as
/// the devices come and go.
pub async fn run(
    mut inputs: mpsc::Receiver<Input>,
    loaded: (Vec<DeviceModel>, Vec<Device>),
    names: Names,
) {
    use beehive::constants::{operation, resource_type};
    use beehive::resource::EdgeResource;

    let mut dispatch = Dispatch::default();
    let (models, devices) = loaded;
    for model in models {
        dispatch.model_changed(model);
    }
    for device in devices {
        dispatch.device_changed(device);
    }
    dispatch.publish_names(&names);
    // One lane per protocol; failures come back here.
    let mut lanes: HashMap<String, Lane> = HashMap::new();
    let (failures, mut failed) = mpsc::unbounded_channel::<Planned>();
    loop {
        let input = tokio::select! {
            input = inputs.recv() => match input {
                Some(input) => input,
                None => break,
            },
            Some(planned) = failed.recv() => {
                dispatch.failed(&planned);
                continue;
            }
        };
        let planned = match input {
            Input::Registered {
                protocol,
                socket,
                listed,
            } => {
                // What the mapper's old lane still holds (a call it hangs
                // in, calls behind it) was planned for the mapper before
                // it registered again: its registration plans afresh.
                if let Some(old) = lanes.remove(&protocol) {
                    old.task.abort();
                }
                dispatch.registered(&protocol, socket, listed.as_ref())
            }
            Input::Hive(msg) => {
                let Ok(resource) = msg.resource().parse::<EdgeResource>() else {
                    continue;
                };
                let key = (resource.namespace.clone(), resource.name.clone());
                let deleted = msg.operation() == operation::DELETE;
                match (resource.resource_type.as_str(), deleted) {
                    (resource_type::DEVICE, false) => match msg.body::<Device>() {
                        Ok(device) => dispatch.device_changed(device),
                        Err(err) => {
                            debug!(error = %err, "device unreadable");
                            continue;
                        }
                    },
                    (resource_type::DEVICE, true) => dispatch.device_removed(&key),
                    (resource_type::DEVICE_MODEL, false) => match msg.body::<DeviceModel>() {
                        Ok(model) => dispatch.model_changed(model),
                        Err(err) => {
                            debug!(error = %err, "model unreadable");
                            continue;
                        }
                    },
                    (resource_type::DEVICE_MODEL, true) => dispatch.model_removed(&key),
                    _ => continue,
                }
            }
        };
        dispatch.publish_names(&names);
        for planned in planned {
            let lane = lanes
                .entry(planned.protocol.clone())
                .or_insert_with(|| call_lane(failures.clone()));
            if let Err(mpsc::error::SendError(planned)) = lane.calls.send(planned) {
                // A lane ends only with this task; taken as failed.
                dispatch.failed(&planned);
            }
        }
    }
}

/// One mapper's calls, made in order by a task of their own.
struct Lane {
    calls: mpsc::UnboundedSender<Planned>,
    task: tokio::task::JoinHandle<()>,
}

/// A task making one mapper's calls in order. A failed call goes back to
/// `failures`, and so do the calls queued behind it, unmade: the mapper
/// is down, and what they carry is sent again on the next change or
/// registration.
fn call_lane(failures: mpsc::UnboundedSender<Planned>) -> Lane {
    let (lane, mut calls) = mpsc::unbounded_channel::<Planned>();
    let task = tokio::spawn(async move {
        while let Some(planned) = calls.recv().await {
            let what = call_name(&planned.call);
            match call(planned.socket.clone(), planned.call.clone()).await {
                Ok(()) => info!(protocol = %planned.protocol, call = %what, "mapper called"),
                Err(reason) => {
                    warn!(protocol = %planned.protocol, call = %what, %reason, "mapper call failed; sent again on the next change");
                    let mut failed = vec![planned];
                    while let Ok(queued) = calls.try_recv() {
                        failed.push(queued);
                    }
                    for planned in failed {
                        if failures.send(planned).is_err() {
                            return;
                        }
                    }
                }
            }
        }
    });
    Lane { calls: lane, task }
}

fn call_name(call: &Call) -> &'static str {
    match call {
        Call::Register(_) => "RegisterDevice",
        Call::Update(_) => "UpdateDevice",
        Call::Remove(_) => "RemoveDevice",
        Call::CreateModel(_) => "CreateDeviceModel",
        Call::UpdateModel(_) => "UpdateDeviceModel",
        Call::RemoveModel(_) => "RemoveDeviceModel",
    }
}

#[cfg(test)]
mod tests;
