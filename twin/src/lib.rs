//! Devices at the edge, as KubeEdge has them: [`DeviceTwin`] keeps the
//! twins of the devices bound to this node, the [`EventBus`] bridges it
//! (and edge applications) to MQTT on KubeEdge's topics ([`protocol`]),
//! and [`EmbeddedBroker`] is the in-process MQTT broker it uses by default
//! (any MQTT 3.1.1 broker works too). The cloud's side of devices (its
//! devicecontroller) is part of the cloud crate's edgecontroller: devices travel the
//! same reliable path as pods.

pub mod broker;
pub mod devicetwin;
pub mod dmi;
pub mod eventbus;
pub mod protocol;
#[cfg(feature = "testing")]
pub mod testing;
mod twins;

pub use broker::EmbeddedBroker;
pub use devicetwin::{DeviceTwin, DeviceTwinConfig, DeviceTwinCounts, DeviceTwinHandle};
pub use eventbus::{BrokerAddress, EventBus, EventBusConfig};

/// A failure of the device side.
#[derive(Debug, thiserror::Error)]
pub enum TwinError {
    /// The module could not start.
    #[error(transparent)]
    Hive(#[from] beehive::Error),
}
