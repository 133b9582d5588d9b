//! Between Kubernetes objects and DMI messages, as KubeEdge's edgecore
//! converts them, so that its mappers read what edgehive sends:
//!
//! - a `devices.kubeedge.io/v1beta1` Device or DeviceModel as the DMI
//!   `Device` / `DeviceModel` a mapper registers: configuration values
//!   (`configData`) as protobuf wrapper types in `Any` (every JSON number
//!   as a `FloatValue`, as edgecore sends them), and the fields Go mappers
//!   read without checking always present (`spec.protocol`, each
//!   property's `desired` and `visitors.configData`);
//! - a mapper's `ReportDeviceStatus` / `ReportDeviceStates` as the
//!   `twin/update` / `state/update` payloads devicetwin takes from MQTT
//!   mappers, so both kinds of mapper go one way.

use std::collections::HashMap;

use apis::devices::{Device, DeviceModel};
use prost::Message;
use serde_json::{Map, Value, json};

use super::api;

/// Why an object cannot be given to a mapper, or a report taken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConvertError {
    /// A configuration value that is not a string, number or flag.
    #[error("{key}: {reason}")]
    ConfigValue {
        /// Where.
        key: String,
        /// What it is.
        reason: String,
    },
    /// A report that cannot be taken.
    #[error("{0}")]
    Report(String),
}

/// The type URL of a protobuf wrapper in an `Any`.
fn wrapper_url(name: &str) -> String {
    format!("type.googleapis.com/google.protobuf.{name}")
}

/// One configuration value as the `Any` edgecore sends: a string, a number
/// (as `FloatValue`, JSON numbers being Go's float64) or a flag.
pub fn any_of(key: &str, value: &Value) -> Result<prost_types::Any, ConvertError> {
    let (name, bytes) = match value {
        Value::String(text) => ("StringValue", text.clone().encode_to_vec()),
        Value::Bool(flag) => ("BoolValue", flag.encode_to_vec()),
        Value::Number(number) => {
            let float = number.as_f64().ok_or_else(|| ConvertError::ConfigValue {
                key: key.to_owned(),
                reason: format!("{number} is not a number a mapper reads"),
            })?;
            ("FloatValue", (float as f32).encode_to_vec())
        }
        other => {
            return Err(ConvertError::ConfigValue {
                key: key.to_owned(),
                reason: format!(
                    "{} values are not passed to mappers (strings, numbers and flags are)",
                    kind_of(other)
                ),
            });
        }
    };
    Ok(prost_types::Any {
        type_url: wrapper_url(name),
        value: bytes,
    })
}

fn kind_of(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Array(_) => "list",
        Value::Object(_) => "object",
        Value::String(_) => "string",
        Value::Number(_) => "number",
        Value::Bool(_) => "boolean",
    }
}

/// A flat JSON object (`configData`) as a `CustomizedValue`; none: empty.
pub fn customized(at: &str, data: Option<&Value>) -> Result<api::CustomizedValue, ConvertError> {
    let mut out = HashMap::new();
    match data {
        None | Some(Value::Null) => {}
        Some(Value::Object(fields)) => {
            for (key, value) in fields {
                out.insert(key.clone(), any_of(&format!("{at}.{key}"), value)?);
            }
        }
        Some(other) => {
            return Err(ConvertError::ConfigValue {
                key: at.to_owned(),
                reason: format!("expected an object, got a {}", kind_of(other)),
            });
        }
    }
    Ok(api::CustomizedValue { data: out })
}

/// `field` of `object`, its name matched without regard to case (as Go's
/// JSON decoding matches a CRD's `hostName` to the proto's `hostname`).
fn field<'a>(object: Option<&'a Value>, name: &str) -> Option<&'a Value> {
    let fields = object?.as_object()?;
    fields.get(name).or_else(|| {
        fields
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v)
    })
}

fn text(object: Option<&Value>, name: &str) -> String {
    field(object, name)
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned()
}

fn integer(object: Option<&Value>, name: &str) -> i64 {
    field(object, name)
        .and_then(Value::as_i64)
        .unwrap_or_default()
}

/// A property's `pushMethod` (HTTP, MQTT, OpenTelemetry, a database).
pub fn push_method(value: Option<&Value>) -> Option<api::PushMethod> {
    let value = value.filter(|v| v.is_object())?;
    let http = field(Some(value), "http").map(|http| api::PushMethodHttp {
        hostname: text(Some(http), "hostname"),
        port: integer(Some(http), "port"),
        requestpath: text(Some(http), "requestpath"),
        timeout: integer(Some(http), "timeout"),
    });
    let mqtt = field(Some(value), "mqtt").map(|mqtt| api::PushMethodMqtt {
        address: text(Some(mqtt), "address"),
        topic: text(Some(mqtt), "topic"),
        qos: i32::try_from(integer(Some(mqtt), "qos")).unwrap_or_default(),
        retained: field(Some(mqtt), "retained")
            .and_then(Value::as_bool)
            .unwrap_or(false),
    });
    let otel = field(Some(value), "otel").map(|otel| api::PushMethodOtel {
        endpoint_url: text(Some(otel), "endpointURL"),
    });
    let db = field(Some(value), "dbMethod").map(|db| {
        let influx = field(Some(db), "influxdb2");
        let redis = field(Some(db), "redis");
        let tdengine = field(Some(db), "tdengine");
        let mysql = field(Some(db), "mysql");
        api::DbMethod {
            influxdb2: influx.map(|i| api::DbMethodInfluxdb2 {
                influxdb2_client_config: field(Some(i), "influxdb2ClientConfig").map(|c| {
                    api::Influxdb2ClientConfig {
                        url: text(Some(c), "url"),
                        org: text(Some(c), "org"),
                        bucket: text(Some(c), "bucket"),
                    }
                }),
                influxdb2_data_config: field(Some(i), "influxdb2DataConfig").map(|c| {
                    api::Influxdb2DataConfig {
                        measurement: text(Some(c), "measurement"),
                        tag: field(Some(c), "tag")
                            .and_then(Value::as_object)
                            .map(|tags| {
                                tags.iter()
                                    .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned())))
                                    .collect()
                            })
                            .unwrap_or_default(),
                        field_key: text(Some(c), "fieldKey"),
                    }
                }),
            }),
            redis: redis.map(|r| api::DbMethodRedis {
                redis_client_config: field(Some(r), "redisClientConfig").map(|c| {
                    api::RedisClientConfig {
                        addr: text(Some(c), "addr"),
                        db: i32::try_from(integer(Some(c), "db")).unwrap_or_default(),
                        poolsize: i32::try_from(integer(Some(c), "poolsize")).unwrap_or_default(),
                        min_idle_conns: i32::try_from(integer(Some(c), "minIdleConns"))
                            .unwrap_or_default(),
                    }
                }),
            }),
            tdengine: tdengine.map(|t| api::DbMethodTdEngine {
                td_engine_client_config: field(Some(t), "tdEngineClientConfig").map(|c| {
                    api::TdEngineClientConfig {
                        addr: text(Some(c), "addr"),
                        dbname: text(Some(c), "dbname"),
                    }
                }),
            }),
            mysql: mysql.map(|m| api::DbMethodMySql {
                mysql_client_config: field(Some(m), "mysqlClientConfig").map(|c| {
                    api::MySqlClientConfig {
                        addr: text(Some(c), "addr"),
                        database: text(Some(c), "database"),
                        user_name: text(Some(c), "userName"),
                    }
                }),
            }),
        }
    });
    Some(api::PushMethod {
        http,
        mqtt,
        otel,
        db_method: db,
    })
}

/// `device` with its model's defaults merged in, as KubeEdge's edgecore
/// does before `RegisterDevice` and `UpdateDevice`: the model's
/// `protocolConfigData` under the device's `spec.protocol.configData`, and
/// each model property's `visitors` under the device property of the same
/// name; the device's own `configData` keys win, and its own
/// `protocolName`s.
pub fn with_model_defaults(device: &Device, model: Option<&DeviceModel>) -> Device {
    let mut merged = device.clone();
    let Some(model) = model else {
        return merged;
    };
    if let Some(defaults) = model.spec.protocol_config_data.as_ref() {
        let protocol = merged
            .spec
            .protocol
            .get_or_insert_with(|| Value::Object(Map::new()));
        let data = overlay(Some(defaults), protocol.get("configData"));
        if let Some(protocol) = protocol.as_object_mut() {
            protocol.insert("configData".to_owned(), data);
        }
    }
    for property in &mut merged.spec.properties {
        let Some(defaults) = model
            .spec
            .properties
            .iter()
            .find(|p| p.name == property.name)
            .and_then(|p| p.visitors.as_ref())
        else {
            continue;
        };
        let own = property.visitors.as_ref();
        let mut visitors = defaults.clone();
        let data = overlay(
            defaults.get("configData"),
            own.and_then(|own| own.get("configData")),
        );
        if let Some(object) = visitors.as_object_mut() {
            object.insert("configData".to_owned(), data);
            if let Some(name) = own
                .and_then(|own| own.get("protocolName"))
                .filter(|name| !name.is_null())
            {
                object.insert("protocolName".to_owned(), name.clone());
            }
        }
        property.visitors = Some(visitors);
    }
    merged
}

/// `base`'s keys with `over`'s put over them (objects; anything else
/// counts as none).
fn overlay(base: Option<&Value>, over: Option<&Value>) -> Value {
    let mut merged = base.and_then(Value::as_object).cloned().unwrap_or_default();
    for (key, value) in over.and_then(Value::as_object).into_iter().flatten() {
        merged.insert(key.clone(), value.clone());
    }
    Value::Object(merged)
}

/// A Device as a mapper registers it.
pub fn device(device: &Device) -> Result<api::Device, ConvertError> {
    let protocol = device.spec.protocol.as_ref();
    let protocol = api::ProtocolConfig {
        protocol_name: text(protocol, "protocolName"),
        config_data: Some(customized(
            "spec.protocol.configData",
            field(protocol, "configData"),
        )?),
    };
    let mut properties = Vec::with_capacity(device.spec.properties.len());
    for property in &device.spec.properties {
        let at = format!("spec.properties[{}].visitors.configData", property.name);
        let visitors = property.visitors.as_ref();
        properties.push(api::DeviceProperty {
            name: property.name.clone(),
            desired: Some(api::TwinProperty {
                value: property
                    .desired
                    .as_ref()
                    .map(|d| d.value.clone())
                    .unwrap_or_default(),
                metadata: property
                    .desired
                    .as_ref()
                    .map(|d| d.metadata.clone().into_iter().collect())
                    .unwrap_or_default(),
            }),
            visitors: Some(api::VisitorConfig {
                protocol_name: text(visitors, "protocolName"),
                config_data: Some(customized(&at, field(visitors, "configData"))?),
            }),
            report_cycle: property.report_cycle.unwrap_or_default(),
            collect_cycle: property.collect_cycle.unwrap_or_default(),
            report_to_cloud: property.report_to_cloud.unwrap_or(false),
            push_method: push_method(property.push_method.as_ref()),
        });
    }
    let methods = device
        .spec
        .methods
        .as_ref()
        .and_then(Value::as_array)
        .map(|methods| {
            methods
                .iter()
                .map(|m| api::DeviceMethod {
                    name: text(Some(m), "name"),
                    description: text(Some(m), "description"),
                    property_names: field(Some(m), "propertyNames")
                        .and_then(Value::as_array)
                        .map(|names| {
                            names
                                .iter()
                                .filter_map(|n| n.as_str().map(str::to_owned))
                                .collect()
                        })
                        .unwrap_or_default(),
                })
                .collect()
        })
        .unwrap_or_default();
    let status = device.status.as_ref().map(|status| api::DeviceStatus {
        twins: status
            .twins
            .iter()
            .map(|twin| api::Twin {
                property_name: twin.property_name.clone(),
                observed_desired: twin.observed_desired.as_ref().map(twin_property),
                reported: twin.reported.as_ref().map(twin_property),
            })
            .collect(),
        report_to_cloud: status.report_to_cloud.unwrap_or(false),
        report_cycle: status.report_cycle.unwrap_or_default(),
    });
    Ok(api::Device {
        name: device.metadata.name.clone().unwrap_or_default(),
        namespace: device
            .metadata
            .namespace
            .clone()
            .unwrap_or_else(|| "default".to_owned()),
        spec: Some(api::DeviceSpec {
            device_model_reference: device
                .spec
                .device_model_ref
                .as_ref()
                .map(|m| m.name.clone())
                .unwrap_or_default(),
            protocol: Some(protocol),
            properties,
            methods,
        }),
        status,
    })
}

fn twin_property(property: &apis::devices::TwinProperty) -> api::TwinProperty {
    api::TwinProperty {
        value: property.value.clone(),
        metadata: property.metadata.clone().into_iter().collect(),
    }
}

/// A DeviceModel as a mapper gets it.
pub fn model(model: &DeviceModel) -> api::DeviceModel {
    let optional = |v: &Option<String>| v.clone().unwrap_or_default();
    api::DeviceModel {
        name: model.metadata.name.clone().unwrap_or_default(),
        namespace: model
            .metadata
            .namespace
            .clone()
            .unwrap_or_else(|| "default".to_owned()),
        spec: Some(api::DeviceModelSpec {
            properties: model
                .spec
                .properties
                .iter()
                .map(|p| api::ModelProperty {
                    name: p.name.clone(),
                    description: optional(&p.description),
                    r#type: optional(&p.type_),
                    access_mode: optional(&p.access_mode),
                    minimum: optional(&p.minimum),
                    maximum: optional(&p.maximum),
                    unit: optional(&p.unit),
                })
                .collect(),
            commands: Vec::new(),
        }),
    }
}

/// The protocol a device's mapper must serve (`spec.protocol.protocolName`).
pub fn protocol_of(device: &Device) -> Option<String> {
    field(device.spec.protocol.as_ref(), "protocolName")
        .and_then(Value::as_str)
        .filter(|name| !name.is_empty())
        .map(str::to_owned)
}

/// The states a mapper may report.
pub const STATES: [&str; 5] = ["online", "offline", "ok", "unknown", "unhealthy"];

/// The device id devicetwin knows a reported device by.
pub fn device_id(namespace: &str, name: &str) -> Result<String, ConvertError> {
    let valid =
        |part: &str| !part.is_empty() && part.len() <= 253 && !part.contains(['/', '+', '#']);
    match (valid(name), namespace.is_empty() || valid(namespace)) {
        (true, true) => Ok(name.to_owned()),
        _ => Err(ConvertError::Report(format!(
            "{namespace:?}/{name:?} is not a device"
        ))),
    }
}

/// A `ReportDeviceStatus` as the `twin/update` payload an MQTT mapper
/// would send: each reported twin's value as the actual one, at `now_ms`.
pub fn twin_update(
    report: &api::ReportDeviceStatusRequest,
    now_ms: i64,
) -> Result<Value, ConvertError> {
    let twins = report
        .reported_device
        .as_ref()
        .map(|status| status.twins.as_slice())
        .unwrap_or_default();
    let mut twin = Map::new();
    for reported in twins {
        let Some(value) = reported.reported.as_ref() else {
            continue;
        };
        if reported.property_name.is_empty() {
            return Err(ConvertError::Report(
                "a twin without a property name".to_owned(),
            ));
        }
        // The mapper's metadata is not taken (as KubeEdge drops it): the
        // twin's type is the model's, and a reported type must not change
        // or delete it.
        let entry = json!({
            "actual": {"value": value.value, "metadata": {"timestamp": now_ms}},
        });
        twin.insert(reported.property_name.clone(), entry);
    }
    if twin.is_empty() {
        return Err(ConvertError::Report(
            "the report names no reported twin".to_owned(),
        ));
    }
    Ok(json!({"event_id": "", "timestamp": now_ms, "twin": twin}))
}

/// A `ReportDeviceStates` as the `state/update` payload an MQTT mapper
/// would send.
pub fn state_update(
    report: &api::ReportDeviceStatesRequest,
    now_ms: i64,
) -> Result<Value, ConvertError> {
    let state = report.state.to_ascii_lowercase();
    if !STATES.contains(&state.as_str()) {
        return Err(ConvertError::Report(format!(
            "state {:?} is not one of {STATES:?}",
            report.state
        )));
    }
    Ok(json!({"event_id": "", "timestamp": now_ms, "state": state}))
}

#[cfg(test)]
mod tests;
