//! devicetwin: the edge's device twins.
//!
//! Devices and device models arrive from the cloud through metamanager,
//! which has persisted them. The devices bound to this node are its
//! members, announced on `$hw/events/node/<node>/membership/updated`. Each
//! device property is a twin: the expected value comes from the cloud's
//! desired value (or an edge application), the actual value from the
//! device's mapper; both carry versions (`{cloud, edge}`). When the cloud
//! changes an expected value the mapper gets the difference on
//! `twin/update/delta`; what mappers report is gathered per device
//! (latest wins per property) and, every `report_period`, written as the
//! device's status through metamanager, which persists it and sends it up
//! (edgehub keeps it while the cloud is away). A mapper's update is
//! answered on its result topic once that write is committed, so an
//! answered report survives a crash.
//!
//! The decisions are plain code in [`crate::twins`] ([`TwinBook`]); this
//! module is the task around it, taking the messages in arrival order (so
//! the twins have one writer), loading and writing through metamanager and
//! publishing through the eventbus.

use std::time::Duration;

use apis::devices::DeviceStatus;
use apis::kinds::object_content;
use beehive::constants::{group, module, operation, resource_type};
use beehive::message::now_millis;
use beehive::resource::EdgeResource;
use beehive::{Content, Hive, Message as HiveMessage, SmolStr, TaskDoor};
use serde_json::Value;
use tokio::sync::{mpsc, oneshot, watch};
use tracing::{debug, info, warn};

use crate::TwinError;
use crate::twins::{Publish, TwinBook};

/// How devicetwin runs.
#[derive(Debug, Clone)]
pub struct DeviceTwinConfig {
    /// This node's name.
    pub node: String,
    /// How often reported changes are written and sent up; reports within
    /// one period go as one status per device.
    pub report_period: Duration,
    /// How long metamanager may take to answer.
    pub store_timeout: Duration,
}

impl DeviceTwinConfig {
    /// Defaults for `node`.
    pub fn new(node: impl Into<String>) -> Self {
        DeviceTwinConfig {
            node: node.into(),
            report_period: Duration::from_millis(100),
            store_timeout: Duration::from_secs(10),
        }
    }
}

/// What devicetwin has done, for tests and metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DeviceTwinCounts {
    /// Devices bound to this node.
    pub devices: usize,
    /// Twin and state updates accepted from mappers and applications.
    pub accepted: u64,
    /// Requests answered with an error.
    pub refused: u64,
    /// Device statuses written (and so sent up).
    pub written: u64,
    /// Device statuses metamanager did not take (tried again later).
    pub write_failures: u64,
    /// Changes of desired values from the cloud.
    pub cloud_changes: u64,
}

/// A running devicetwin.
#[derive(Clone)]
pub struct DeviceTwinHandle {
    /// What it has done so far.
    pub counts: watch::Receiver<DeviceTwinCounts>,
}

/// The devicetwin module.
pub struct DeviceTwin;

impl DeviceTwin {
    /// Starts devicetwin in `hive` (inside an actix System): the `twin`
    /// module, where metamanager passes devices and models and the
    /// eventbus passes MQTT requests. It first loads what metamanager
    /// holds.
    pub fn start(hive: &Hive, config: DeviceTwinConfig) -> Result<DeviceTwinHandle, TwinError> {
        let (inbox, requests) = mpsc::channel(4096);
        let (counts_tx, counts) = watch::channel(DeviceTwinCounts::default());
        let twins = Twins {
            hive: hive.clone(),
            book: TwinBook::new(config.node.clone()),
            config,
            counts: counts_tx,
        };
        actix::spawn(twins.run(requests));
        let door = TaskDoor::new(module::DEVICETWIN, group::TWIN, inbox, |msg| {
            Input::Hive(Box::new(msg))
        })
        .stopping_with(Input::Stop);
        hive.start_module(move |_| door.clone())?;
        Ok(DeviceTwinHandle { counts })
    }
}

enum Input {
    Hive(Box<HiveMessage>),
    Stop(oneshot::Sender<()>),
}

/// devicetwin's task: the twins' book, and the doors to metamanager and
/// the eventbus.
struct Twins {
    hive: Hive,
    config: DeviceTwinConfig,
    book: TwinBook,
    counts: watch::Sender<DeviceTwinCounts>,
}

impl Twins {
    async fn run(mut self, mut requests: mpsc::Receiver<Input>) {
        self.load().await;
        let mut tick = tokio::time::interval(self.config.report_period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                input = requests.recv() => match input {
                    Some(Input::Hive(msg)) => self.on_message(*msg).await,
                    Some(Input::Stop(done)) => {
                        self.write_reports().await;
                        self.counts.send_replace(self.book.counts());
                        let _ = done.send(());
                        break;
                    }
                    None => break,
                },
                _ = tick.tick() => self.write_reports().await,
            }
            let counts = self.book.counts();
            self.counts
                .send_if_modified(|c| std::mem::replace(c, counts) != counts);
        }
        debug!("devicetwin stopped");
    }

    /// Loads models, devices and their last statuses from metamanager, and
    /// sends every status up again (the cloud may have missed the last
    /// ones if the node restarted while offline).
    async fn load(&mut self) {
        for model in self.list(resource_type::DEVICE_MODEL).await {
            self.book.model_changed(&model);
        }
        for device in self.list(resource_type::DEVICE).await {
            self.book.device_changed(&device, false, now_millis());
        }
        for (namespace, name) in self.book.held() {
            let resource = EdgeResource::new(
                namespace.as_str(),
                resource_type::DEVICE_STATUS,
                name.as_str(),
            );
            let Some(status) = self.query(&resource.to_string()).await else {
                continue;
            };
            match status.decode::<DeviceStatus>() {
                Ok(status) => self.book.restore(&name, &status),
                Err(err) => warn!(device = %resource, error = %err, "stored status unreadable"),
            }
        }
        let counts = self.book.counts();
        self.counts.send_replace(counts);
        info!(devices = counts.devices, "devicetwin ready");
    }

    async fn list(&self, kind: &str) -> Vec<Value> {
        match self
            .query(&format!("*/{kind}"))
            .await
            .map(|answer| answer.decode::<Vec<Value>>())
        {
            Some(Ok(items)) => items,
            Some(Err(err)) => {
                warn!(kind, error = %err, "metamanager did not list");
                Vec::new()
            }
            None => Vec::new(),
        }
    }

    /// What metamanager answers for `resource`; `None` when it holds
    /// nothing there.
    async fn query(&self, resource: &str) -> Option<Content> {
        let query = HiveMessage::new().build_router(
            module::DEVICETWIN,
            group::META,
            SmolStr::new(resource),
            operation::QUERY,
        );
        match self
            .hive
            .send_sync(module::METAMANAGER, query, self.config.store_timeout)
            .await
        {
            Ok(answer) => match answer.into_answer() {
                Ok(answer) => Some(answer.content),
                Err(refused) => {
                    debug!(resource, %refused, "not held");
                    None
                }
            },
            Err(err) => {
                warn!(resource, error = %err, "metamanager did not answer");
                None
            }
        }
    }

    async fn on_message(&mut self, msg: HiveMessage) {
        let now = now_millis();
        if msg.resource().starts_with("$hw/") {
            let body = msg.body::<Value>().unwrap_or_default();
            let out = self.book.request(msg.resource(), &body, now);
            return self.publish_all(out).await;
        }
        let Ok(resource) = msg.resource().parse::<EdgeResource>() else {
            return debug!(resource = msg.resource(), "not for devicetwin");
        };
        let deleted = msg.operation() == operation::DELETE;
        if matches!(
            resource.resource_type.as_str(),
            resource_type::DEVICE | resource_type::DEVICE_MODEL
        ) {
            // DMI mappers hear of it too, when DMI runs.
            match self.hive.try_send(crate::dmi::server::SOURCE, msg.clone()) {
                Ok(()) | Err(beehive::Error::UnknownModule(_)) => {}
                Err(err) => warn!(error = %err, "a device change not passed to DMI mappers"),
            }
        }
        let body = match deleted {
            true => Value::Null,
            false => match msg.body::<Value>() {
                Ok(body) => body,
                Err(err) => return warn!(resource = %resource, error = %err, "unreadable"),
            },
        };
        let out = match (resource.resource_type.as_str(), deleted) {
            (resource_type::DEVICE_MODEL, false) => {
                self.book.model_changed(&body);
                Vec::new()
            }
            (resource_type::DEVICE_MODEL, true) => {
                self.book.model_removed(&resource.namespace, &resource.name);
                Vec::new()
            }
            (resource_type::DEVICE, false) => self.book.device_changed(&body, true, now),
            (resource_type::DEVICE, true) => self.book.device_removed(&resource, now),
            (other, _) => {
                debug!(kind = other, "not for devicetwin");
                Vec::new()
            }
        };
        self.publish_all(out).await;
    }

    /// Writes the status of every device reported on since the last
    /// write through metamanager (which persists it and sends it up); once
    /// a device's write is committed, its waiting requests are answered and
    /// its changes announced.
    async fn write_reports(&mut self) {
        let settled = self.book.settle_idle(now_millis());
        self.publish_all(settled).await;
        let writes = self.book.take_writes();
        if writes.is_empty() {
            return;
        }
        let timeout = self.config.store_timeout;
        let stored = writes.into_iter().map(|write| {
            let msg = HiveMessage::new()
                .build_router(
                    module::DEVICETWIN,
                    group::META,
                    write.resource.to_string(),
                    operation::UPDATE,
                )
                .with_content(object_content(&write.status));
            let hive = self.hive.clone();
            async move {
                let stored = match hive.send_sync(module::METAMANAGER, msg, timeout).await {
                    Ok(reply) => reply
                        .into_answer()
                        .map(drop)
                        .map_err(|refused| refused.reason),
                    Err(err) => Err(err.to_string()),
                };
                (write.id, stored)
            }
        });
        for (id, stored) in futures_util::future::join_all(stored).await {
            let out = match stored {
                Ok(()) => self.book.write_committed(&id, now_millis()),
                Err(reason) => {
                    warn!(device = %id, %reason, "device status not stored; trying again");
                    self.book.write_failed(&id, &reason)
                }
            };
            self.publish_all(out).await;
        }
    }

    async fn publish_all(&self, out: Vec<Publish>) {
        for (topic, payload) in out {
            let msg = HiveMessage::new()
                .build_router(module::DEVICETWIN, group::TWIN, topic, operation::PUBLISH)
                .with_content(object_content(&payload));
            if let Err(err) = self.hive.send(module::EVENTBUS, msg).await {
                debug!(error = %err, "not published (no eventbus?)");
            }
        }
    }
}
