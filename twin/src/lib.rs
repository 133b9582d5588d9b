//! Devices. Built so far: the `eventbus`, the MQTT bridge on KubeEdge's
//! topics, to any MQTT 3.1.1 broker. To come with the rest of the devices
//! issue: the embedded broker, `devicetwin` and the cloud's
//! `devicecontroller`.

pub mod eventbus;

pub use eventbus::{BrokerAddress, EventBus, EventBusConfig};

/// A failure of the device side.
#[derive(Debug, thiserror::Error)]
pub enum TwinError {
    /// The module could not start.
    #[error(transparent)]
    Hive(#[from] beehive::Error),
}
