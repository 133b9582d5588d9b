//! Tests of the parent module (`dispatch.rs`).

use super::*;
use serde_json::json;

fn device(name: &str, protocol: &str, desired: &str) -> Device {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"deviceModelRef": {"name": "m"}, "protocol": {"protocolName": protocol},
                 "properties": [{"name": "p", "desired": {"value": desired}}]}
    }))
    .expect("device")
}

fn model() -> DeviceModel {
    serde_json::from_value(json!({"metadata": {"name": "m", "namespace": "default"},
                                      "spec": {"protocol": "modbus", "properties": [{"name": "p"}]}}))
        .expect("model")
}

fn calls(planned: &[Planned]) -> Vec<(&str, &'static str)> {
    planned
        .iter()
        .map(|p| (p.protocol.as_str(), call_name(&p.call)))
        .collect()
}

#[test]
fn changes_reach_the_mapper_of_their_protocol() {
    let mut dispatch = Dispatch::default();
    dispatch.model_changed(model());
    // No mapper yet: nothing to call.
    assert!(
        dispatch
            .device_changed(device("a", "modbus", "1"))
            .is_empty()
    );
    // A mapper that registers without data gets the device, model first.
    let planned = dispatch.registered("modbus", "/m.sock".into(), None);
    assert_eq!(
        calls(&planned),
        [
            ("modbus", "CreateDeviceModel"),
            ("modbus", "RegisterDevice")
        ]
    );
    // A change: an update, the model not again.
    assert_eq!(
        calls(&dispatch.device_changed(device("a", "modbus", "2"))),
        [("modbus", "UpdateDevice")]
    );
    // Another protocol's device: not this mapper's.
    assert!(
        dispatch
            .device_changed(device("b", "opcua", "1"))
            .is_empty()
    );
    // Moved to opcua: removed from modbus's mapper.
    assert_eq!(
        calls(&dispatch.device_changed(device("a", "opcua", "2"))),
        [("modbus", "RemoveDevice")]
    );
    // A model change reaches the mappers that have it; its removal too.
    dispatch.device_changed(device("c", "modbus", "1"));
    assert_eq!(
        calls(&dispatch.model_changed(model())),
        [("modbus", "UpdateDeviceModel")]
    );
    let key = ("default".to_owned(), "m".to_owned());
    assert_eq!(
        calls(&dispatch.model_removed(&key)),
        [("modbus", "RemoveDeviceModel")]
    );
    let c = ("default".to_owned(), "c".to_owned());
    assert_eq!(
        calls(&dispatch.device_removed(&c)),
        [("modbus", "RemoveDevice")]
    );
    assert!(dispatch.device_removed(&c).is_empty());
}

#[test]
fn a_listed_registration_needs_no_calls_and_a_failed_call_is_made_again() {
    let mut dispatch = Dispatch::default();
    dispatch.model_changed(model());
    dispatch.device_changed(device("a", "modbus", "1"));
    // Answered with its devices: they are its.
    let listed = vec![(
        ("default".to_owned(), "a".to_owned()),
        device("a", "modbus", "1").spec,
    )];
    assert!(
        dispatch
            .registered("modbus", "/m.sock".into(), Some(&listed))
            .is_empty()
    );
    let planned = dispatch.device_changed(device("a", "modbus", "2"));
    assert_eq!(calls(&planned), [("modbus", "UpdateDevice")]);
    // The update failed: the next change registers it again.
    dispatch.failed(&planned[0]);
    assert_eq!(
        calls(&dispatch.device_changed(device("a", "modbus", "3"))),
        [("modbus", "RegisterDevice")]
    );
}

#[test]
fn a_failure_reported_after_the_mapper_registered_again_changes_nothing() {
    let mut dispatch = Dispatch::default();
    dispatch.model_changed(model());
    dispatch.registered("modbus", "/m.sock".into(), None);
    let planned = dispatch.device_changed(device("a", "modbus", "1"));
    assert_eq!(
        calls(&planned),
        [
            ("modbus", "CreateDeviceModel"),
            ("modbus", "RegisterDevice")
        ]
    );
    // The mapper died in the call and registered again, listing "a".
    let listed = vec![(
        ("default".to_owned(), "a".to_owned()),
        device("a", "modbus", "1").spec,
    )];
    assert!(
        dispatch
            .registered("modbus", "/m.sock".into(), Some(&listed))
            .is_empty()
    );
    // The old call's failure comes in late: the listing stands.
    dispatch.failed(&planned[1]);
    assert_eq!(
        calls(&dispatch.device_changed(device("a", "modbus", "2"))),
        [("modbus", "UpdateDevice")]
    );
}

#[test]
fn a_listed_device_no_longer_its_is_removed_at_registration() {
    let mut dispatch = Dispatch::default();
    dispatch.model_changed(model());
    dispatch.device_changed(device("a", "modbus", "1"));
    dispatch.device_changed(device("moved", "opcua", "1"));
    // The mapper lists "a" (its), "gone" (deleted while its removal
    // was queued) and "moved" (another protocol's now).
    let listed: Listed = ["a", "gone", "moved"]
        .iter()
        .map(|name| {
            (
                ("default".to_owned(), (*name).to_owned()),
                device(name, "modbus", "1").spec,
            )
        })
        .collect();
    let planned = dispatch.registered("modbus", "/m.sock".into(), Some(&listed));
    let removed: Vec<&str> = planned
        .iter()
        .filter_map(|p| match &p.call {
            Call::Remove((_, name)) => Some(name.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(removed, ["gone", "moved"]);
    assert_eq!(planned.len(), 2, "nothing else: \"a\" is as listed");
}

#[test]
fn what_changed_since_the_listing_is_sent() {
    let mut dispatch = Dispatch::default();
    dispatch.model_changed(model());
    dispatch.device_changed(device("a", "modbus", "2"));
    dispatch.device_changed(device("b", "modbus", "1"));
    // Listed: "a" as it was before its change, "b" not at all (it came
    // after the listing): both are sent.
    let listed = vec![(
        ("default".to_owned(), "a".to_owned()),
        device("a", "modbus", "1").spec,
    )];
    let planned = dispatch.registered("modbus", "/m.sock".into(), Some(&listed));
    let names: Vec<&str> = planned
        .iter()
        .filter_map(|p| match &p.call {
            Call::Register(d) => Some(d.name.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(names, ["a", "b"]);
}

#[test]
fn a_device_waiting_for_its_model_is_sent_when_it_comes() {
    let mut dispatch = Dispatch::default();
    dispatch.registered("modbus", "/m.sock".into(), None);
    let planned = dispatch.device_changed(device("a", "modbus", "1"));
    assert_eq!(calls(&planned), [("modbus", "RegisterDevice")]);
    // Its registration failed; the model's arrival sends it again, the
    // model first.
    dispatch.failed(&planned[0]);
    assert_eq!(
        calls(&dispatch.model_changed(model())),
        [
            ("modbus", "CreateDeviceModel"),
            ("modbus", "RegisterDevice")
        ]
    );
    // The names index: one namespace per name here.
    let names = Names::default();
    dispatch.device_changed(device("a2", "opcua", "1"));
    dispatch.publish_names(&names);
    assert_eq!(names.lock().map(|n| n.len()).unwrap_or(0), 2);
}
