//! Tests of the parent module (`convert.rs`).

use super::*;

#[test]
fn config_values_are_the_wrappers_edgecore_sends() {
    let string = any_of("k", &json!("abc")).expect("a string");
    assert_eq!(
        string.type_url,
        "type.googleapis.com/google.protobuf.StringValue"
    );
    assert_eq!(string.value, [0x0a, 3, b'a', b'b', b'c']);
    // Every JSON number a FloatValue (Go decodes JSON numbers as float64).
    let number = any_of("k", &json!(1)).expect("a number");
    assert_eq!(
        number.type_url,
        "type.googleapis.com/google.protobuf.FloatValue"
    );
    assert_eq!(number.value, [0x0d, 0x00, 0x00, 0x80, 0x3f]);
    let flag = any_of("k", &json!(true)).expect("a flag");
    assert_eq!(
        flag.type_url,
        "type.googleapis.com/google.protobuf.BoolValue"
    );
    assert_eq!(flag.value, [0x08, 0x01]);
    for bad in [json!({"a": 1}), json!([1]), json!(null)] {
        assert!(any_of("k", &bad).is_err(), "{bad}");
    }
}

#[test]
fn field_numbers_are_kubeedges() {
    // PushMethod: otel is 4 and dbMethod 3, declared the other way round.
    let push = api::PushMethod {
        otel: Some(api::PushMethodOtel {
            endpoint_url: "x".to_owned(),
        }),
        db_method: Some(api::DbMethod::default()),
        ..api::PushMethod::default()
    };
    let bytes = push.encode_to_vec();
    assert!(
        bytes.windows(3).any(|w| w == [0x22, 0x03, 0x0a]),
        "{bytes:x?}"
    );
    assert!(bytes.windows(2).any(|w| w == [0x1a, 0x00]), "{bytes:x?}");
    // MapperInfo.address is bytes, field 5.
    let info = api::MapperInfo {
        address: b"/s".to_vec(),
        ..api::MapperInfo::default()
    };
    assert_eq!(info.encode_to_vec(), [0x2a, 0x02, b'/', b's']);
    // A report's device name 1, namespace 3; a state's namespace 2.
    let report = api::ReportDeviceStatusRequest {
        device_name: "d".to_owned(),
        device_namespace: "n".to_owned(),
        reported_device: None,
    };
    assert_eq!(report.encode_to_vec(), [0x0a, 0x01, b'd', 0x1a, 0x01, b'n']);
    let states = api::ReportDeviceStatesRequest {
        device_name: "d".to_owned(),
        device_namespace: "n".to_owned(),
        state: "ok".to_owned(),
    };
    assert_eq!(
        states.encode_to_vec(),
        [0x0a, 0x01, b'd', 0x12, 0x01, b'n', 0x1a, 0x02, b'o', b'k']
    );
}

fn thermometer() -> Device {
    serde_json::from_value(json!({
            "apiVersion": "devices.kubeedge.io/v1beta1",
            "kind": "Device",
            "metadata": {"name": "thermometer", "namespace": "default"},
            "spec": {
                "deviceModelRef": {"name": "thermometer-model"},
                "nodeName": "edge-1",
                "protocol": {"protocolName": "modbus", "configData": {"slaveID": 1, "port": "/dev/ttyS0"}},
                "properties": [
                    {"name": "temperature", "desired": {"value": "20"},
                     "visitors": {"protocolName": "modbus", "configData": {"register": "HoldingRegister", "offset": 2, "scale": 0.5}},
                     "reportCycle": 1000, "collectCycle": 500, "reportToCloud": true,
                     "pushMethod": {"http": {"hostName": "collector", "port": 8080, "requestPath": "/t", "timeout": 5}}},
                    {"name": "humidity"}
                ],
                "methods": [{"name": "reset", "description": "back to defaults", "propertyNames": ["temperature"]}]
            }
        }))
        .expect("a device")
}

#[test]
fn a_models_defaults_go_under_the_devices_own_settings() {
    let model: DeviceModel = serde_json::from_value(json!({
            "apiVersion": "devices.kubeedge.io/v1beta1",
            "kind": "DeviceModel",
            "metadata": {"name": "thermometer-model", "namespace": "default"},
            "spec": {
                "protocol": "modbus",
                "protocolConfigData": {"slaveID": 9, "baudRate": 9600},
                "properties": [
                    {"name": "temperature", "type": "INT",
                     "visitors": {"protocolName": "modbus", "configData": {"register": "InputRegister", "limit": 4}}},
                    {"name": "humidity", "type": "INT",
                     "visitors": {"protocolName": "modbus", "configData": {"register": "CoilRegister", "offset": 7}}}
                ]
            }
        }))
        .expect("a model");
    let merged = with_model_defaults(&thermometer(), Some(&model));
    // The device's own keys win; the model's others are added.
    assert_eq!(
        merged.spec.protocol,
        Some(
            json!({"protocolName": "modbus", "configData": {"slaveID": 1, "port": "/dev/ttyS0", "baudRate": 9600}})
        )
    );
    assert_eq!(
        merged.spec.properties[0].visitors,
        Some(
            json!({"protocolName": "modbus", "configData": {"register": "HoldingRegister", "offset": 2, "scale": 0.5, "limit": 4}})
        )
    );
    // A property without visitors of its own takes the model's whole.
    assert_eq!(
        merged.spec.properties[1].visitors,
        Some(
            json!({"protocolName": "modbus", "configData": {"register": "CoilRegister", "offset": 7}})
        )
    );
    // The rest is the device's, untouched; no model, no change.
    assert_eq!(
        merged.spec.properties[0].desired,
        thermometer().spec.properties[0].desired
    );
    assert_eq!(with_model_defaults(&thermometer(), None), thermometer());
    // And the mapper gets the merged settings.
    let registered = device(&merged).expect("converts");
    let spec = registered.spec.expect("spec");
    let data = spec
        .protocol
        .and_then(|p| p.config_data)
        .expect("config data");
    assert!(data.data.contains_key("baudRate"), "{data:?}");
}

#[test]
fn a_devices_state_reporting_reaches_the_mapper() {
    let mut reporting = thermometer();
    reporting.status = Some(apis::devices::DeviceStatus {
        report_to_cloud: Some(true),
        report_cycle: Some(5000),
        ..Default::default()
    });
    let status = device(&reporting)
        .expect("converts")
        .status
        .expect("status");
    assert!(status.report_to_cloud);
    assert_eq!(status.report_cycle, 5000);
}

#[test]
fn a_device_reads_as_a_mapper_registers_it() {
    let converted = device(&thermometer()).expect("converted");
    assert_eq!(
        (converted.name.as_str(), converted.namespace.as_str()),
        ("thermometer", "default")
    );
    let spec = converted.spec.expect("spec");
    assert_eq!(spec.device_model_reference, "thermometer-model");
    let protocol = spec.protocol.expect("protocol");
    assert_eq!(protocol.protocol_name, "modbus");
    let data = protocol.config_data.expect("configData").data;
    assert_eq!(
        data["slaveID"].type_url,
        "type.googleapis.com/google.protobuf.FloatValue"
    );
    assert_eq!(
        data["port"].type_url,
        "type.googleapis.com/google.protobuf.StringValue"
    );
    let temperature = &spec.properties[0];
    assert_eq!(
        temperature.desired.as_ref().map(|d| d.value.as_str()),
        Some("20")
    );
    assert_eq!(
        (temperature.report_cycle, temperature.collect_cycle),
        (1000, 500)
    );
    assert!(temperature.report_to_cloud);
    let http = temperature
        .push_method
        .as_ref()
        .and_then(|p| p.http.as_ref())
        .expect("http");
    assert_eq!(
        (http.hostname.as_str(), http.port, http.requestpath.as_str()),
        ("collector", 8080, "/t")
    );
    assert_eq!(
        temperature
            .visitors
            .as_ref()
            .and_then(|v| v.config_data.as_ref())
            .map(|c| c.data.len()),
        Some(3)
    );
    // What Go mappers read without checking is there, if empty.
    let humidity = &spec.properties[1];
    assert_eq!(
        humidity.desired.as_ref().map(|d| d.value.as_str()),
        Some("")
    );
    assert!(
        humidity
            .visitors
            .as_ref()
            .and_then(|v| v.config_data.as_ref())
            .is_some()
    );
    assert_eq!(spec.methods[0].property_names, ["temperature"]);
    assert_eq!(protocol_of(&thermometer()).as_deref(), Some("modbus"));
    // A nested configuration value: the device is not passed on.
    let mut nested = thermometer();
    nested.spec.protocol =
        Some(json!({"protocolName": "modbus", "configData": {"serial": {"baud": 9600}}}));
    assert!(matches!(
        device(&nested),
        Err(ConvertError::ConfigValue { .. })
    ));
}

#[test]
fn reports_read_as_mqtt_payloads() {
    let report = api::ReportDeviceStatusRequest {
        device_name: "thermometer".to_owned(),
        device_namespace: "default".to_owned(),
        reported_device: Some(api::DeviceStatus {
            twins: vec![api::Twin {
                property_name: "temperature".to_owned(),
                observed_desired: None,
                reported: Some(api::TwinProperty {
                    value: "21.5".to_owned(),
                    metadata: HashMap::from([("type".to_owned(), "float".to_owned())]),
                }),
            }],
            report_to_cloud: true,
            report_cycle: 1000,
        }),
    };
    let payload = twin_update(&report, 7).expect("a payload");
    assert_eq!(
        payload,
        json!({"event_id": "", "timestamp": 7, "twin": {"temperature": {
                "actual": {"value": "21.5", "metadata": {"timestamp": 7}}}}})
    );
    let parsed: crate::protocol::TwinUpdate =
        serde_json::from_value(payload).expect("devicetwin's form");
    assert_eq!(
        parsed.twin["temperature"]
            .actual
            .as_ref()
            .and_then(|a| a.value.as_deref()),
        Some("21.5")
    );
    let empty = api::ReportDeviceStatusRequest::default();
    assert!(twin_update(&empty, 7).is_err());
    let state = |s: &str| api::ReportDeviceStatesRequest {
        state: s.to_owned(),
        ..Default::default()
    };
    assert_eq!(
        state_update(&state("OK"), 7)
            .ok()
            .map(|p| p["state"].clone()),
        Some(json!("ok"))
    );
    assert!(state_update(&state("on fire"), 7).is_err());
    assert_eq!(
        device_id("default", "thermometer").as_deref(),
        Ok("thermometer")
    );
    assert!(device_id("default", "a/b").is_err());
}
