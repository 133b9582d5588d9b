//! `devices.kubeedge.io/v1beta1`: a `Device` is bound to a node and names
//! its `DeviceModel`; its properties carry the desired values the cloud
//! sets, its status the values a mapper reported (the device twin).
//!
//! Fields edgehive does not act on (protocol and visitor configuration,
//! methods) are kept as free JSON so a KubeEdge manifest passes through
//! unchanged.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::k8s::{ListableResource, ObjectMeta, Resource};

/// The API group of KubeEdge's devices.
pub const GROUP: &str = "devices.kubeedge.io";
/// The version of it edgehive speaks.
pub const VERSION: &str = "v1beta1";
/// `group/version`.
pub const API_VERSION: &str = "devices.kubeedge.io/v1beta1";

/// A device, bound to one node.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Device {
    /// Standard object metadata.
    pub metadata: ObjectMeta,
    /// What the user wants.
    #[serde(default)]
    pub spec: DeviceSpec,
    /// What the node reports.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<DeviceStatus>,
}

/// A device's desired state.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceSpec {
    /// The model this device is an instance of.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_model_ref: Option<LocalObjectReference>,
    /// The node the device is attached to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_name: Option<String>,
    /// The properties, with their desired values.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub properties: Vec<DeviceProperty>,
    /// How the mapper reaches the device (protocol name and its
    /// configuration); the mapper's business.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<Value>,
    /// Methods the device offers; the mapper's business.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub methods: Option<Value>,
}

/// A reference to an object in the same namespace.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LocalObjectReference {
    /// Its name.
    #[serde(default)]
    pub name: String,
}

/// One property of a device.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceProperty {
    /// The property's name, as in the model.
    pub name: String,
    /// The value the cloud wants, if it wants one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub desired: Option<TwinProperty>,
    /// How the mapper reads it; the mapper's business.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub visitors: Option<Value>,
    /// How often the mapper reports it, in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub report_cycle: Option<i64>,
    /// How often the mapper reads it, in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub collect_cycle: Option<i64>,
    /// Whether reported values go to the cloud.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub report_to_cloud: Option<bool>,
    /// Where the mapper pushes values; the mapper's business.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub push_method: Option<Value>,
}

/// A value with its metadata (`timestamp`, `type`, ...).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TwinProperty {
    /// The value, as a string (KubeEdge's twins are strings).
    #[serde(default)]
    pub value: String,
    /// Free metadata.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub metadata: BTreeMap<String, String>,
}

/// What the node reports of a device.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceStatus {
    /// One entry per property with a reported or observed desired value.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub twins: Vec<Twin>,
    /// The device's state as its mapper reported it (`online`, `offline`,
    /// ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
    /// When it was last reported online (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_online_time: Option<String>,
    /// Whether the mapper reports the device's state to the cloud (set by
    /// the user; passed to the mapper, kept across the node's reports).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub report_to_cloud: Option<bool>,
    /// How often the mapper reports the state, in milliseconds (as
    /// `reportToCloud`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub report_cycle: Option<i64>,
}

/// The twin of one property: what was reported, and the desired value the
/// node had when it was.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Twin {
    /// The property.
    pub property_name: String,
    /// The value the mapper reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reported: Option<TwinProperty>,
    /// The desired value the node holds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_desired: Option<TwinProperty>,
}

/// A device model: the properties devices of this model have.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct DeviceModel {
    /// Standard object metadata.
    pub metadata: ObjectMeta,
    /// The model.
    #[serde(default)]
    pub spec: DeviceModelSpec,
}

/// A model's properties and protocol.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct DeviceModelSpec {
    /// The properties.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub properties: Vec<ModelProperty>,
    /// The protocol devices of this model speak.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<String>,
    /// The protocol's settings every device of this model starts from
    /// (a device's own `spec.protocol.configData` keys win).
    #[serde(
        default,
        rename = "protocolConfigData",
        skip_serializing_if = "Option::is_none"
    )]
    pub protocol_config_data: Option<Value>,
}

/// One property of a model.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ModelProperty {
    /// The property's name.
    pub name: String,
    /// What it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Its type: `int`, `float`, `double`, `string`, `boolean`, `bytes`,
    /// `stream`.
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub type_: Option<String>,
    /// `ReadWrite` or `ReadOnly`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub access_mode: Option<String>,
    /// Lowest valid value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub minimum: Option<String>,
    /// Highest valid value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub maximum: Option<String>,
    /// Unit of the value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unit: Option<String>,
    /// How a mapper reads it, for every device of this model (a device's
    /// own visitors' `configData` keys win).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub visitors: Option<Value>,
}

impl Device {
    /// The type of `property` in `model`, `string` when the model does not
    /// say (KubeEdge's default).
    pub fn property_type(model: Option<&DeviceModel>, property: &str) -> String {
        model
            .and_then(|m| m.spec.properties.iter().find(|p| p.name == property))
            .and_then(|p| p.type_.clone())
            .unwrap_or_else(|| "string".to_owned())
    }
}

/// Implements [`Resource`] and [`ListableResource`] for a kind of this
/// group.
macro_rules! resource {
    ($t:ty, $kind:literal, $list:literal) => {
        impl Resource for $t {
            const API_VERSION: &'static str = API_VERSION;
            const KIND: &'static str = $kind;
        }

        impl ListableResource for $t {
            const LIST_KIND: &'static str = $list;
        }
    };
}

resource!(Device, "Device", "DeviceList");
resource!(DeviceModel, "DeviceModel", "DeviceModelList");

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_kubeedge_device_manifest_reads_and_keeps_what_the_mapper_needs() {
        let manifest = json!({
            "apiVersion": "devices.kubeedge.io/v1beta1",
            "kind": "Device",
            "metadata": { "name": "thermo-1", "namespace": "default" },
            "spec": {
                "deviceModelRef": { "name": "thermometer" },
                "nodeName": "edge-1",
                "protocol": { "protocolName": "modbus", "configData": { "port": 502 } },
                "properties": [{
                    "name": "setpoint",
                    "desired": { "value": "21", "metadata": { "type": "int" } },
                    "visitors": { "protocolName": "modbus", "configData": { "register": 3 } },
                    "reportCycle": 1000
                }]
            },
            "status": { "twins": [{
                "propertyName": "setpoint",
                "reported": { "value": "20", "metadata": { "timestamp": "1" } }
            }], "state": "online" }
        });
        let device: Device = serde_json::from_value(manifest.clone()).expect("reads");
        assert_eq!(device.spec.node_name.as_deref(), Some("edge-1"));
        assert_eq!(
            device.spec.properties[0]
                .desired
                .as_ref()
                .map(|d| d.value.as_str()),
            Some("21")
        );
        let status = device.status.clone().expect("status");
        assert_eq!(
            status.twins[0].reported.as_ref().map(|r| r.value.as_str()),
            Some("20")
        );
        let back = serde_json::to_value(&device).expect("writes");
        assert_eq!(back["spec"]["protocol"], manifest["spec"]["protocol"]);
        assert_eq!(
            back["spec"]["properties"][0]["visitors"],
            manifest["spec"]["properties"][0]["visitors"]
        );
        assert_eq!(<Device as ListableResource>::LIST_KIND, "DeviceList");
    }

    #[test]
    fn a_model_names_property_types() {
        let model: DeviceModel = serde_json::from_value(json!({
            "metadata": { "name": "thermometer" },
            "spec": { "properties": [{ "name": "temperature", "type": "float", "accessMode": "ReadOnly" }] }
        }))
        .expect("reads");
        assert_eq!(Device::property_type(Some(&model), "temperature"), "float");
        assert_eq!(Device::property_type(Some(&model), "other"), "string");
        assert_eq!(Device::property_type(None, "temperature"), "string");
    }
}
