//! The eventbus with the embedded broker and with a real Mosquitto (started
//! here, on a port of its own; `scripts/setup-mqtt` installs it), and a real
//! MQTT client playing a mapper: messages cross both ways on KubeEdge's topics, and bad input
//! (broken JSON, an oversized payload) stops neither the broker nor the
//! bridge.

use std::net::SocketAddr;
use std::time::Duration;

use beehive::constants::{group, module, operation};
use beehive::{Hive, HiveConfig, Message};
use rumqttc::QoS;
use serde_json::json;
use tokio::sync::mpsc;
use twin::{BrokerAddress, EventBus, EventBusConfig};

use e2e::mqtt::{Mosquitto, WAIT, mapper};

async fn next(seen: &mut mpsc::UnboundedReceiver<Message>, what: &str) -> Message {
    tokio::time::timeout(WAIT, seen.recv())
        .await
        .unwrap_or_else(|_| panic!("timed out: {what}"))
        .expect("recorder")
}

#[actix::test]
async fn with_the_embedded_broker() {
    let broker = twin::EmbeddedBroker::start("127.0.0.1:0", 64 << 10)
        .await
        .expect("broker");
    messages_cross_both_ways_and_bad_input_stops_nothing(broker.address).await;
}

#[actix::test]
async fn with_mosquitto() {
    let broker = Mosquitto::start(64 << 10);
    messages_cross_both_ways_and_bad_input_stops_nothing(broker.address).await;
}

/// Where the broker under test listens.
struct Broker {
    address: SocketAddr,
}

async fn messages_cross_both_ways_and_bad_input_stops_nothing(address: SocketAddr) {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .try_init();
    let broker = Broker { address };
    let hive = Hive::new("edge", HiveConfig::default());
    let mut twin = beehive::testing::recorder(&hive, module::DEVICETWIN, group::TWIN);
    let address = BrokerAddress {
        host: broker.address.ip().to_string(),
        port: broker.address.port(),
    };
    EventBus::start(&hive, EventBusConfig::new("node-1", address)).expect("eventbus");

    // The mapper listens for deltas of its device.
    let (mapper_client, mut mapper_got) = mapper(
        broker.address,
        "mapper-1",
        Some("$hw/events/device/dev-1/twin/update/delta"),
    )
    .await;

    // The bridge subscribes once connected; until then a report may be
    // lost, so the mapper repeats its first report until it is seen.
    let report = json!({"event_id": "e1", "timestamp": 1, "twin": {"temperature": {"actual": {"value": "21"}}}});
    let first = loop {
        mapper_client
            .publish(
                "$hw/events/device/dev-1/twin/update",
                QoS::AtLeastOnce,
                false,
                serde_json::to_vec(&report).expect("json"),
            )
            .await
            .expect("publish");
        if let Ok(Some(msg)) = tokio::time::timeout(Duration::from_millis(500), twin.recv()).await {
            break msg;
        }
    };
    assert_eq!(first.resource(), "$hw/events/device/dev-1/twin/update");
    assert_eq!(
        first.body::<serde_json::Value>().expect("json body")["twin"]["temperature"]["actual"]["value"],
        "21"
    );

    // Broken JSON reaches the twin as a string (it answers with an error
    // result); the bridge goes on.
    mapper_client
        .publish(
            "$hw/events/device/dev-1/twin/update",
            QoS::AtLeastOnce,
            false,
            b"{not json".to_vec(),
        )
        .await
        .expect("publish");
    // Copies of the repeated first report may still be on their way.
    let broken = loop {
        let msg = next(&mut twin, "broken JSON").await;
        if msg.body::<serde_json::Value>().expect("json body")["event_id"] != "e1" {
            break msg;
        }
    };
    assert_eq!(
        broken.body::<serde_json::Value>().expect("json body"),
        json!("{not json")
    );

    // An oversized payload: the broker drops that client, nobody else, and
    // the payload goes nowhere.
    let (rogue, _) = mapper(broker.address, "rogue", None).await;
    let _ = rogue
        .publish(
            "$hw/events/device/dev-2/twin/update",
            QoS::AtLeastOnce,
            false,
            vec![b'x'; 128 << 10],
        )
        .await;
    let later = json!({"event_id": "e2", "timestamp": 2, "twin": {}});
    mapper_client
        .publish(
            "$hw/events/device/dev-1/twin/update",
            QoS::AtLeastOnce,
            false,
            serde_json::to_vec(&later).expect("json"),
        )
        .await
        .expect("publish");
    let after = next(&mut twin, "a report after the oversized one").await;
    assert_eq!(
        after.body::<serde_json::Value>().expect("json body")["event_id"],
        "e2",
        "the oversized payload got through: {after:?}"
    );

    // From beehive to the mapper: a delta.
    let delta = Message::new()
        .build_router(
            module::DEVICETWIN,
            group::BUS,
            "$hw/events/device/dev-1/twin/update/delta",
            operation::PUBLISH,
        )
        .with_content(
            beehive::Content::of(&json!({"event_id": "d1", "delta": {"temperature": "25"}}))
                .expect("json body"),
        );
    hive.send(module::EVENTBUS, delta).await.expect("send");
    let twin::testing::Received { topic, payload, .. } =
        tokio::time::timeout(WAIT, mapper_got.recv())
            .await
            .expect("delta in time")
            .expect("delta");
    assert_eq!(topic, "$hw/events/device/dev-1/twin/update/delta");
    let payload: serde_json::Value = serde_json::from_slice(&payload).expect("json");
    assert_eq!(payload["delta"]["temperature"], "25");
    let _ = hive.shutdown().await;
}
