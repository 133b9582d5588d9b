//! Tests of the parent module (`twins.rs`).

use super::*;

fn value(v: &str, timestamp: i64) -> Option<TwinValue> {
    Some(TwinValue {
        value: Some(v.to_owned()),
        metadata: Some(ValueMetadata { timestamp }),
    })
}

#[test]
fn a_stored_status_brings_back_reports_versions_and_state() {
    let mut held = DeviceEntry {
        namespace: "default".to_owned(),
        name: "thermo-1".to_owned(),
        state: Some("online".to_owned()),
        last_online: Some("2026-11-22T04:00:00Z".to_owned()),
        ..DeviceEntry::default()
    };
    held.twins.insert(
        "temperature".to_owned(),
        TwinState {
            actual: value("21.5", 7),
            actual_version: TwinVersion { cloud: 3, edge: 4 },
            type_: "float".to_owned(),
            in_spec: true,
            ..TwinState::default()
        },
    );
    // An expected value an edge application set after the cloud's.
    held.twins.insert(
        "setpoint".to_owned(),
        TwinState {
            expected: value("23", 9),
            expected_version: TwinVersion { cloud: 3, edge: 1 },
            type_: "int".to_owned(),
            in_spec: true,
            ..TwinState::default()
        },
    );
    let stored = serde_json::to_value(held.status()).expect("status");
    let status = DeviceStatus::deserialize(&stored).expect("reads");

    // After a restart: the device as the cloud sent it, then its status.
    let mut restarted = DeviceEntry::default();
    restarted.twins.insert(
        "setpoint".to_owned(),
        TwinState {
            expected: value("21", 1),
            expected_version: TwinVersion { cloud: 3, edge: 0 },
            ..TwinState::default()
        },
    );
    restarted.restore(&status);
    let temperature = &restarted.twins["temperature"];
    assert_eq!(temperature.actual, value("21.5", 7));
    assert_eq!(
        temperature.actual_version,
        TwinVersion { cloud: 3, edge: 4 }
    );
    assert_eq!(temperature.type_, "float");
    let setpoint = &restarted.twins["setpoint"];
    assert_eq!(setpoint.expected, value("23", 9));
    assert_eq!(setpoint.expected_version, TwinVersion { cloud: 3, edge: 1 });
    assert_eq!(restarted.state.as_deref(), Some("online"));

    // A newer desired value from the cloud wins over the edge's.
    let mut newer = DeviceEntry::default();
    newer.twins.insert(
        "setpoint".to_owned(),
        TwinState {
            expected: value("25", 10),
            expected_version: TwinVersion { cloud: 5, edge: 0 },
            ..TwinState::default()
        },
    );
    newer.restore(&status);
    assert_eq!(newer.twins["setpoint"].expected, value("25", 10));
}

fn thermometer(desired: Option<&str>, revision: u64, node: &str) -> Value {
    let mut property = json!({"name": "temperature"});
    if let Some(desired) = desired {
        property["desired"] = json!({"value": desired});
    }
    json!({
        "apiVersion": "devices.kubeedge.io/v1beta1", "kind": "Device",
        "metadata": {"name": "thermo-1", "namespace": "default",
                     "resourceVersion": revision.to_string()},
        "spec": {"nodeName": node, "deviceModelRef": {"name": "thermometer"},
                 "protocol": {"protocolName": "modbus"}, "properties": [property]},
    })
}

fn topics(out: &[Publish]) -> Vec<&str> {
    out.iter().map(|(topic, _)| topic.as_str()).collect()
}

#[test]
fn a_desired_value_from_the_cloud_reaches_the_mapper_as_a_delta() {
    let mut book = TwinBook::new("edge-1");
    // Bound to another node: nothing.
    assert!(
        book.device_changed(&thermometer(None, 1, "edge-2"), true, 10)
            .is_empty()
    );
    assert_eq!(book.counts().devices, 0);
    let out = book.device_changed(&thermometer(Some("20"), 2, "edge-1"), true, 10);
    assert_eq!(
        topics(&out),
        [
            "$hw/events/node/edge-1/membership/updated",
            "$hw/events/device/thermo-1/twin/cloud_updated",
            "$hw/events/device/thermo-1/twin/update/document",
            "$hw/events/device/thermo-1/twin/update/delta",
        ]
    );
    assert_eq!(out[3].1["delta"]["temperature"], "20");
    assert_eq!(out[3].1["timestamp"], 10);
    let twin = &out[1].1["twin"]["temperature"];
    assert_eq!(twin["expected"]["value"], "20");
    assert_eq!(twin["expected_version"]["cloud"], 2);
    // The same desired value again (only the revision moved): nothing
    // new for the mapper.
    let out = book.device_changed(&thermometer(Some("20"), 3, "edge-1"), true, 20);
    assert_eq!(topics(&out), ["$hw/events/device/thermo-1/updated"]);
    assert_eq!(book.counts().cloud_changes, 1);
    // Removed: the membership says so.
    let resource = EdgeResource::new("default", resource_type::DEVICE, "thermo-1");
    let out = book.device_removed(&resource, 30);
    assert_eq!(topics(&out), ["$hw/events/node/edge-1/membership/updated"]);
    assert_eq!(out[0].1["removed_devices"][0]["id"], "thermo-1");
    assert_eq!(book.counts().devices, 0);
}

#[test]
fn a_report_is_answered_once_its_status_is_written_and_refused_after_three_failures() {
    let mut book = TwinBook::new("edge-1");
    book.device_changed(&thermometer(Some("20"), 2, "edge-1"), false, 10);
    assert_eq!(
        book.take_writes().len(),
        1,
        "a new device's twins are written"
    );
    let report = json!({"event_id": "e1", "twin": {"temperature": {"actual": {"value": "19.5"}}}});
    let update = "$hw/events/device/thermo-1/twin/update";
    assert!(
        book.request(update, &report, 20).is_empty(),
        "answered after the write"
    );
    assert_eq!(book.counts().accepted, 1);
    let writes = book.take_writes();
    assert_eq!(writes.len(), 1);
    assert_eq!(
        writes[0].resource.to_string(),
        "default/devicestatus/thermo-1"
    );
    let reported = &writes[0].status["twins"][0]["reported"];
    assert_eq!(reported["value"], "19.5");
    assert_eq!(reported["metadata"]["timestamp"], "20");
    let out = book.write_committed("thermo-1", 30);
    assert_eq!(
        topics(&out),
        [
            "$hw/events/device/thermo-1/twin/update/document",
            "$hw/events/device/thermo-1/twin/update/result",
            "$hw/events/device/thermo-1/twin/edge_updated",
        ]
    );
    assert_eq!(out[1].1["event_id"], "e1");
    assert_eq!(book.counts().written, 1);

    // Writes that fail: the report stays to be written; after three in
    // a row the waiting request gets an error.
    let report = json!({"event_id": "e2", "twin": {"temperature": {"actual": {"value": "19.0"}}}});
    book.request(update, &report, 40);
    for attempt in 1..=3 {
        assert_eq!(book.take_writes().len(), 1, "attempt {attempt}");
        let out = book.write_failed("thermo-1", "disk full");
        if attempt < 3 {
            assert!(out.is_empty());
        } else {
            assert_eq!(
                topics(&out),
                ["$hw/events/device/thermo-1/twin/update/result"]
            );
            assert_eq!(out[0].1["code"], 500);
            assert_eq!(out[0].1["event_id"], "e2");
        }
    }
    assert_eq!(book.counts().write_failures, 3);
    let writes = book.take_writes();
    assert_eq!(writes[0].status["twins"][0]["reported"]["value"], "19.0");

    // Refused: a device not bound here, a payload that is not JSON.
    let out = book.request("$hw/events/device/nobody/twin/update", &report, 50);
    assert_eq!(out[0].1["code"], 404);
    let out = book.request(update, &json!("garbage"), 50);
    assert_eq!(out[0].1["code"], 400);
    assert_eq!(book.counts().refused, 2);
    // A state update; "online" stamps the last online time.
    let state = "$hw/events/device/thermo-1/state/update";
    book.request(
        state,
        &json!({"event_id": "e3", "state": "online"}),
        1_700_000_000_400,
    );
    let writes = book.take_writes();
    assert_eq!(writes[0].status["state"], "online");
    assert_eq!(writes[0].status["lastOnlineTime"], "2023-11-14T22:13:20Z");
}

#[test]
fn a_delta_is_the_expected_value_where_the_actual_differs() {
    let mut twin = TwinState {
        expected: value("20", 1),
        ..TwinState::default()
    };
    assert_eq!(twin.delta().as_deref(), Some("20"));
    twin.actual = value("19", 2);
    assert_eq!(twin.delta().as_deref(), Some("20"));
    twin.actual = value("20", 3);
    assert_eq!(twin.delta(), None);
    twin.expected = None;
    assert_eq!(twin.delta(), None);
}
