//! Devices end to end, with real parts: a cloud (cloudhub over WebSocket
//! with mutual TLS, edgecontroller on redb, admin API) and an edge
//! (edgehub, metamanager on redb, devicetwin, eventbus) in this process, a
//! real MQTT broker (the embedded one, then a Mosquitto started here) and a
//! real MQTT client playing the mapper, on KubeEdge's topics.

use std::net::SocketAddr;
use std::time::Duration;

use rumqttc::{AsyncClient, QoS};
use serde_json::{Value, json};
use tokio::sync::mpsc::UnboundedReceiver;
use twin::{BrokerAddress, DeviceTwin, DeviceTwinConfig, EventBus, EventBusConfig};

use e2e::mqtt::{Mosquitto, WAIT, mapper};
use e2e::{Cloud, Edge};

const NODE: &str = "edge-1";
const DEVICE: &str = "thermo-1";

#[actix::test]
async fn with_the_embedded_broker() {
    let broker = twin::EmbeddedBroker::start("127.0.0.1:0", 1 << 20)
        .await
        .expect("broker");
    a_device_twin_round_trip(broker.address).await;
}

#[actix::test]
async fn with_mosquitto() {
    let broker = Mosquitto::start(1 << 20);
    a_device_twin_round_trip(broker.address).await;
}

fn model_yaml() -> &'static str {
    "apiVersion: devices.kubeedge.io/v1beta1
kind: DeviceModel
metadata:
  name: thermometer
spec:
  protocol: modbus
  properties:
  - name: temperature
    type: float
    accessMode: ReadOnly
  - name: setpoint
    type: int
    accessMode: ReadWrite
"
}

fn device_yaml(setpoint: &str) -> String {
    format!(
        "apiVersion: devices.kubeedge.io/v1beta1
kind: Device
metadata:
  name: {DEVICE}
spec:
  nodeName: {NODE}
  deviceModelRef:
    name: thermometer
  protocol:
    protocolName: modbus
    configData:
      port: 502
  properties:
  - name: temperature
  - name: setpoint
    desired:
      value: \"{setpoint}\"
"
    )
}

/// What the mapper sees: every message on `$hw/events/#`.
struct Mapper {
    client: AsyncClient,
    got: UnboundedReceiver<twin::testing::Received>,
}

impl Mapper {
    async fn publish(&self, topic: &str, payload: impl Into<Vec<u8>>) {
        self.client
            .publish(topic, QoS::AtLeastOnce, false, payload.into())
            .await
            .expect("publish");
    }

    /// The next message on `topic` that `wanted` accepts; others are
    /// skipped.
    async fn until(&mut self, topic: &str, mut wanted: impl FnMut(&Value) -> bool) -> Value {
        let found = tokio::time::timeout(WAIT, async {
            loop {
                let received = self.got.recv().await.expect("mapper connection");
                let (at, payload) = (received.topic, received.payload);
                if at != topic {
                    continue;
                }
                let payload: Value =
                    serde_json::from_slice(&payload).expect("edgecore publishes JSON");
                if wanted(&payload) {
                    return payload;
                }
            }
        })
        .await;
        found.unwrap_or_else(|_| panic!("nothing wanted on {topic} in time"))
    }

    /// Asks and waits for the result with the same event id.
    async fn ask(&mut self, topic: &str, result: &str, payload: Value) -> Value {
        let event = payload["event_id"].clone();
        self.publish(topic, serde_json::to_vec(&payload).expect("json"))
            .await;
        self.until(result, |r| r["event_id"] == event).await
    }
}

fn device_topic(suffix: &str) -> String {
    format!("$hw/events/device/{DEVICE}/{suffix}")
}

/// Waits until the cloud's copy of the device satisfies `wanted`, looking
/// again each time the controller's counts move (a status stored among
/// them).
async fn cloud_device(cloud: &Cloud, wanted: impl FnMut(&Value) -> bool) -> Value {
    let path = format!("/apis/devices.kubeedge.io/v1beta1/namespaces/default/devices/{DEVICE}");
    cloud.get_until(&path, WAIT, wanted).await
}

fn reported<'a>(device: &'a Value, property: &str) -> Option<&'a str> {
    device["status"]["twins"]
        .as_array()?
        .iter()
        .find(|t| t["propertyName"] == property)?["reported"]["value"]
        .as_str()
}

async fn start_twin(edge: &Edge, broker: SocketAddr) {
    let config = DeviceTwinConfig {
        report_period: Duration::from_millis(50),
        ..DeviceTwinConfig::new(NODE)
    };
    DeviceTwin::start(&edge.hive, config).expect("devicetwin");
    let address = BrokerAddress {
        host: broker.ip().to_string(),
        port: broker.port(),
    };
    let bus = EventBusConfig {
        max_payload: 16 << 10,
        ..EventBusConfig::new(NODE, address)
    };
    EventBus::start(&edge.hive, bus).expect("eventbus");
}

async fn a_device_twin_round_trip(broker: SocketAddr) {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .try_init();
    let cloud = Cloud::start().await;
    let edge = Edge::start(&cloud, NODE).await;
    start_twin(&edge, broker).await;
    let (client, got) = mapper(broker, "mapper-1", Some("$hw/events/#")).await;
    let mut mapper = Mapper { client, got };

    // The bridge subscribes once connected: ask until it answers.
    let membership = format!("$hw/events/node/{NODE}/membership/get");
    let membership_result = format!("{membership}/result");
    let mut attempt = 0;
    let empty = loop {
        attempt += 1;
        let event = format!("m{attempt}");
        mapper
            .publish(
                &membership,
                serde_json::to_vec(&json!({"event_id": event})).expect("json"),
            )
            .await;
        let answer = tokio::time::timeout(
            Duration::from_millis(500),
            mapper.until(&membership_result, |r| r["event_id"] == event.as_str()),
        )
        .await;
        if let Ok(answer) = answer {
            break answer;
        }
        assert!(attempt < 40, "the eventbus never answered");
    };
    assert_eq!(empty["devices"], json!([]));

    // The cloud binds a device to the node: the mapper hears of it, and of
    // the desired value it does not have yet.
    let applied = cloud
        .apply(&format!("{}---\n{}", model_yaml(), device_yaml("20")))
        .await;
    assert_eq!(
        applied,
        ["DeviceModel/thermometer created", "Device/thermo-1 created"]
    );
    let updated_topic = format!("$hw/events/node/{NODE}/membership/updated");
    let added = mapper.until(&updated_topic, |_| true).await;
    assert_eq!(added["added_devices"][0]["id"], DEVICE);
    assert_eq!(
        added["added_devices"][0]["attributes"]["model"]["value"],
        "thermometer"
    );
    let delta = mapper
        .until(&device_topic("twin/update/delta"), |_| true)
        .await;
    assert_eq!(delta["delta"], json!({"setpoint": "20"}));
    assert_eq!(delta["twin"]["setpoint"]["metadata"]["type"], "int");
    assert!(delta["twin"]["setpoint"]["expected_version"]["cloud"].as_u64() > Some(0));

    // Membership get lists it, with its twins.
    let members = mapper
        .ask(
            &membership,
            &membership_result,
            json!({"event_id": "list-1"}),
        )
        .await;
    let devices = members["devices"].as_array().expect("devices");
    assert_eq!(devices.len(), 1);
    assert_eq!(devices[0]["twin"]["setpoint"]["expected"]["value"], "20");
    assert_eq!(
        devices[0]["twin"]["temperature"]["metadata"]["type"],
        "float"
    );

    // The mapper reports: the result comes once the edge stored it, and
    // the cloud's device status shows the value.
    let result = mapper
        .ask(
            &device_topic("twin/update"),
            &device_topic("twin/update/result"),
            json!({"event_id": "r1", "timestamp": 1, "twin": {
                "temperature": {"actual": {"value": "21.5"}},
                "setpoint": {"actual": {"value": "20"}}
            }}),
        )
        .await;
    assert_eq!(result["twin"]["temperature"]["actual"]["value"], "21.5");
    assert_eq!(result["twin"]["temperature"]["actual_version"]["edge"], 1);
    let state = mapper
        .ask(
            &device_topic("state/update"),
            &device_topic("state/update/result"),
            json!({"event_id": "s1", "state": "online"}),
        )
        .await;
    assert_eq!(state["device"]["state"], "online");
    let device = cloud_device(&cloud, |d| {
        reported(d, "temperature") == Some("21.5") && d["status"]["state"] == "online"
    })
    .await;
    assert_eq!(reported(&device, "setpoint"), Some("20"));
    assert!(device["status"]["lastOnlineTime"].is_string());

    // The cloud changes the desired value: the mapper gets the delta.
    let applied = cloud.apply(&device_yaml("25")).await;
    assert_eq!(applied, ["Device/thermo-1 configured"]);
    let delta = mapper
        .until(&device_topic("twin/update/delta"), |d| {
            d["delta"]["setpoint"] == "25"
        })
        .await;
    assert_eq!(delta["twin"]["setpoint"]["actual"]["value"], "20");
    let twins = mapper
        .ask(
            &device_topic("twin/get"),
            &device_topic("twin/get/result"),
            json!({"event_id": "g1"}),
        )
        .await;
    assert_eq!(twins["twin"]["setpoint"]["expected"]["value"], "25");
    assert_eq!(twins["twin"]["temperature"]["actual"]["value"], "21.5");

    // Bad input gets error results; the bridge stays up.
    mapper
        .publish(&device_topic("twin/update"), b"{not json".to_vec())
        .await;
    let broken = mapper
        .until(&device_topic("twin/update/result"), |r| {
            r.get("code").is_some()
        })
        .await;
    assert_eq!(broken["code"], 400);
    let numeric = mapper
        .ask(
            &device_topic("twin/update"),
            &device_topic("twin/update/result"),
            json!({"event_id": "bad-1", "twin": {"temperature": {"actual": {"value": 21}}}}),
        )
        .await;
    assert_eq!(numeric["code"], 400);
    let unknown = mapper
        .ask(
            "$hw/events/device/ghost/twin/get",
            "$hw/events/device/ghost/twin/get/result",
            json!({"event_id": "bad-2"}),
        )
        .await;
    assert_eq!(unknown["code"], 404);
    mapper
        .publish(&device_topic("twin/update"), vec![b' '; 32 << 10])
        .await;
    let oversized = mapper
        .until(&device_topic("twin/update/result"), |r| r["code"] == 413)
        .await;
    assert!(
        oversized["reason"]
            .as_str()
            .is_some_and(|r| r.contains("bytes"))
    );

    // With the cloud gone, a report is still taken and kept; it reaches the
    // cloud once it is back.
    let mut online = edge.hub.online.clone();
    let (offline_mapper, online) = (&mut mapper, &mut online);
    let cloud = cloud
        .restart(move || async move {
            tokio::time::timeout(WAIT, online.wait_for(|up| !*up))
                .await
                .expect("the edge never noticed")
                .expect("edgehub gone");
            let kept = offline_mapper
                .ask(
                    &device_topic("twin/update"),
                    &device_topic("twin/update/result"),
                    json!({"event_id": "r2", "twin": {"temperature": {"actual": {"value": "30"}}}}),
                )
                .await;
            assert_eq!(kept["twin"]["temperature"]["actual_version"]["edge"], 2);
        })
        .await;
    let device = cloud_device(&cloud, |d| reported(d, "temperature") == Some("30")).await;
    assert_eq!(reported(&device, "setpoint"), Some("20"));

    // Deleting the device unbinds it.
    cloud
        .client
        .delete(&format!(
            "/apis/devices.kubeedge.io/v1beta1/namespaces/default/devices/{DEVICE}"
        ))
        .await
        .expect("delete");
    let removed = mapper
        .until(&updated_topic, |u| {
            u["removed_devices"]
                .as_array()
                .is_some_and(|r| !r.is_empty())
        })
        .await;
    assert_eq!(removed["removed_devices"][0]["id"], DEVICE);
    let _ = mapper.client.disconnect().await;
    edge.shutdown().await;
    cloud.shutdown().await;
}

/// More reports at once than every queue on the way holds (broker, bridge,
/// devicetwin): each is answered, none is lost, nothing stalls. (The
/// bridge once read and wrote MQTT on one connection, and a burst like this
/// closed a cycle of full queues through devicetwin.)
#[actix::test]
async fn a_burst_of_reports_is_answered_in_full() {
    const BURST: usize = 6_000;
    let broker = twin::EmbeddedBroker::start("127.0.0.1:0", 1 << 20)
        .await
        .expect("broker");
    let cloud = Cloud::start().await;
    let edge = Edge::start(&cloud, NODE).await;
    start_twin(&edge, broker.address).await;
    cloud
        .apply(&format!("{}---\n{}", model_yaml(), device_yaml("20")))
        .await;
    let result_topic = device_topic("twin/update/result");
    let (client, got) = mapper(broker.address, "burst", Some(&result_topic)).await;
    let mut mapper = Mapper { client, got };
    // Ready once the device is at the edge.
    let mut attempt = 0;
    loop {
        attempt += 1;
        let event = format!("probe-{attempt}");
        mapper
            .publish(
                &device_topic("twin/update"),
                serde_json::to_vec(&json!({"event_id": event, "twin": {"temperature": {"actual": {"value": "0"}}}}))
                    .expect("json"),
            )
            .await;
        let answer = tokio::time::timeout(
            Duration::from_millis(500),
            mapper.until(&result_topic, |r| r["event_id"] == event.as_str()),
        )
        .await;
        if answer.is_ok_and(|r| r.get("code").is_none()) {
            break;
        }
        assert!(attempt < 40, "the device never reached the edge");
    }
    let publisher = mapper.client.clone();
    tokio::spawn(async move {
        for n in 0..BURST {
            let report = json!({"event_id": format!("burst-{n}"), "twin": {"temperature": {"actual": {"value": n.to_string()}}}});
            publisher
                .publish(
                    device_topic("twin/update"),
                    QoS::AtLeastOnce,
                    false,
                    serde_json::to_vec(&report).expect("json"),
                )
                .await
                .expect("publish");
        }
    });
    let mut answered = std::collections::BTreeSet::new();
    tokio::time::timeout(Duration::from_secs(120), async {
        while answered.len() < BURST {
            let payload = mapper.got.recv().await.expect("mapper connection").payload;
            let result: Value = serde_json::from_slice(&payload).expect("json");
            assert!(result.get("code").is_none(), "refused: {result}");
            if let Some(event) = result["event_id"]
                .as_str()
                .and_then(|e| e.strip_prefix("burst-"))
            {
                answered.insert(event.to_owned());
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{} of {BURST} reports answered", answered.len()));
    let last = (BURST - 1).to_string();
    let device = cloud_device(&cloud, |d| {
        reported(d, "temperature") == Some(last.as_str())
    })
    .await;
    assert_eq!(device["status"]["twins"][1]["propertyName"], "temperature");
    edge.shutdown().await;
    cloud.shutdown().await;
}
