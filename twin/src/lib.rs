//! Devices. Built so far: the `eventbus`, the MQTT bridge on KubeEdge's
//! topics, and [`EmbeddedBroker`], the in-process MQTT broker it uses by
//! default (any MQTT 3.1.1 broker works too). To come with the rest of the
//! devices issue: `devicetwin` and the cloud's `devicecontroller`.

pub mod broker;
pub mod eventbus;

pub use broker::EmbeddedBroker;
pub use eventbus::{BrokerAddress, EventBus, EventBusConfig};

/// A failure of the device side.
#[derive(Debug, thiserror::Error)]
pub enum TwinError {
    /// The module could not start.
    #[error(transparent)]
    Hive(#[from] beehive::Error),
}
