//! Devices: `devicetwin` (desired and reported twins), `eventbus` (the MQTT
//! bridge, KubeEdge topics) and the cloud `devicecontroller`.
//!
//! Status: arrives with the devices issue; until then this crate only reserves its name.
