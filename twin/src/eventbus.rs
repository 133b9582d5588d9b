//! eventbus: the bridge between beehive and an MQTT broker (the embedded one
//! or any MQTT 3.1.1 broker), on KubeEdge's topics, so KubeEdge's mappers
//! work unchanged.
//!
//! From MQTT: a publish on a device or membership topic
//! (`$hw/events/device/...`, `$hw/events/node/...`) goes to the `twin`
//! group; one on `$hw/events/upload/#` or `<node>/user/#` goes up to the
//! cloud through edgehub. The message's resource is the topic; its content
//! is the payload as JSON, or as a string when it is not JSON (the twin
//! answers with an error result then), so bad input never stops the bridge.
//!
//! To MQTT: a beehive message with operation `publish` is published on the
//! topic in its resource; one with operation `subscribe` adds a
//! subscription.

use std::time::Duration;

use actix::prelude::*;
use apis::kinds::object_content;
use beehive::IntoRouteName as _;
use beehive::constants::{group, module, operation};
use beehive::{Content, Hive, Message as HiveMessage, Module, ModuleError, SmolStr};
use rumqttc::{AsyncClient, Event, MqttOptions, Packet, QoS};
use tracing::{debug, info, warn};

use crate::TwinError;

/// Where the broker is.
#[derive(Debug, Clone)]
pub struct BrokerAddress {
    /// Host name or address.
    pub host: String,
    /// Port.
    pub port: u16,
}

/// The largest payload the eventbus takes by default: 1 MiB.
pub const DEFAULT_MAX_PAYLOAD: usize = 1 << 20;

/// How the eventbus runs.
#[derive(Debug, Clone)]
pub struct EventBusConfig {
    /// The broker to connect to.
    pub broker: BrokerAddress,
    /// This bridge's MQTT client id.
    pub client_id: String,
    /// This node's name (for `<node>/user/#`).
    pub node: String,
    /// Payloads larger than this are neither accepted nor published.
    pub max_payload: usize,
}

impl EventBusConfig {
    /// Defaults for `node` with the broker at `broker`.
    pub fn new(node: impl Into<String>, broker: BrokerAddress) -> Self {
        let node = node.into();
        EventBusConfig {
            broker,
            client_id: format!("edgehive-eventbus-{node}"),
            node,
            max_payload: DEFAULT_MAX_PAYLOAD,
        }
    }

    /// The topics the bridge subscribes to: KubeEdge's request topics
    /// (what edgecore itself publishes, such as `.../updated` or
    /// `.../twin/cloud_updated`, is not among them).
    pub fn topics(&self) -> Vec<String> {
        vec![
            "$hw/events/device/+/twin/update".to_owned(),
            "$hw/events/device/+/twin/get".to_owned(),
            "$hw/events/device/+/state/update".to_owned(),
            format!("$hw/events/node/{}/membership/get", self.node),
            "$hw/events/upload/#".to_owned(),
            "$hw/events/connected/+".to_owned(),
            "$hw/events/disconnected/+".to_owned(),
            format!("{}/user/#", self.node),
        ]
    }
}

/// Where a message from MQTT goes: the twin, or the cloud.
fn destination(topic: &str) -> &'static str {
    if topic.starts_with("$hw/events/upload/") || topic.contains("/user/") {
        module::EDGEHUB
    } else {
        group::TWIN
    }
}

/// The eventbus module.
pub struct EventBus {
    client: AsyncClient,
    subscriber: AsyncClient,
    max_payload: usize,
}

impl EventBus {
    /// Connects to the broker and starts the eventbus in `hive` (inside an
    /// actix System). It reconnects by itself when the broker goes away.
    pub fn start(hive: &Hive, config: EventBusConfig) -> Result<(), TwinError> {
        // Two connections: one reads, and may wait for beehive (which
        // slows the broker's sending to it: backpressure); one writes, and
        // is always polled, so a publish from beehive never waits for the
        // reading side (which would close a cycle through devicetwin).
        let options = |role: &str| {
            let mut options = MqttOptions::new(
                format!("{}-{role}", config.client_id),
                &config.broker.host,
                config.broker.port,
            );
            options.set_keep_alive(Duration::from_secs(30));
            options.set_clean_session(true);
            // Larger packets are read (up to a bound) so an oversized
            // request can be answered with an error instead of breaking
            // the link.
            let incoming = config.max_payload.saturating_mul(4).max(64 * 1024);
            options.set_max_packet_size(incoming, config.max_payload + 4096);
            options
        };
        let (subscriber, mut incoming) = AsyncClient::new(options("in"), 64);
        let (publisher, mut outgoing) = AsyncClient::new(options("out"), 1024);
        let topics = config.topics();
        let resubscriber = subscriber.clone();
        let from_mqtt = hive.clone();
        let answerer = publisher.clone();
        let max_payload = config.max_payload;
        actix::spawn(async move {
            loop {
                match incoming.poll().await {
                    Ok(Event::Incoming(Packet::ConnAck(_))) => {
                        info!("eventbus connected to the broker");
                        for topic in &topics {
                            if let Err(err) = resubscriber.try_subscribe(topic, QoS::AtLeastOnce) {
                                warn!(%topic, error = %err, "subscription failed");
                            }
                        }
                    }
                    Ok(Event::Incoming(Packet::Publish(publish))) => {
                        if publish.payload.len() > max_payload {
                            refuse_oversized(
                                &answerer,
                                &publish.topic,
                                publish.payload.len(),
                                max_payload,
                            )
                            .await;
                        } else {
                            deliver(&from_mqtt, &publish.topic, &publish.payload).await;
                        }
                    }
                    Ok(_) => {}
                    Err(err) => {
                        // The event loop reconnects on the next poll.
                        debug!(error = %err, "broker connection lost; reconnecting");
                        tokio::time::sleep(Duration::from_millis(500)).await;
                    }
                }
            }
        });
        actix::spawn(async move {
            loop {
                if let Err(err) = outgoing.poll().await {
                    debug!(error = %err, "broker connection lost; reconnecting");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
            }
        });
        hive.start_module(move |_| EventBus {
            client: publisher.clone(),
            subscriber: subscriber.clone(),
            max_payload,
        })?;
        Ok(())
    }
}

/// Answers an oversized request on its result topic (when it has one)
/// and drops it.
async fn refuse_oversized(client: &AsyncClient, topic: &str, size: usize, max: usize) {
    let reason = format!("payload of {size} bytes is larger than the {max} bytes taken");
    warn!(%topic, size, "oversized payload refused");
    if let Some(result) = crate::protocol::result_topic(topic) {
        let payload = crate::protocol::error_result("", crate::protocol::code::TOO_LARGE, &reason);
        let payload = serde_json::to_vec(&payload).unwrap_or_default();
        if let Err(err) = client.try_publish(result, QoS::AtLeastOnce, false, payload) {
            debug!(error = %err, "error result not published");
        }
    }
}

/// Hands an MQTT message to beehive.
async fn deliver(hive: &Hive, topic: &str, payload: &[u8]) {
    let content = object_content(&crate::protocol::content_of(payload));
    let to = destination(topic);
    let msg = HiveMessage::new()
        .build_router(
            module::EVENTBUS,
            group::BUS,
            SmolStr::new(topic),
            operation::PUBLISH,
        )
        .with_content(content);
    let sent = if to == module::EDGEHUB {
        let mut msg = msg;
        msg.router.group = group::USER.into_route_name();
        hive.send(to, msg).await
    } else {
        hive.send_to_group(to, msg).await
    };
    if let Err(err) = sent {
        debug!(%topic, error = %err, "MQTT message not delivered");
    }
}

impl Actor for EventBus {
    type Context = Context<Self>;
}

impl Module for EventBus {
    fn name(&self) -> &str {
        module::EVENTBUS
    }

    fn group(&self) -> &str {
        group::BUS
    }

    fn handle(&mut self, msg: HiveMessage, ctx: &mut Context<Self>) -> Result<(), ModuleError> {
        let topic = msg.resource().to_owned();
        let client = self.client.clone();
        match msg.operation() {
            operation::PUBLISH => {
                let payload = match msg.content() {
                    Content::Text(text) => text.clone().into_bytes(),
                    other => serde_json::to_vec(other).unwrap_or_default(),
                };
                if payload.len() > self.max_payload {
                    warn!(%topic, size = payload.len(), "payload too large; not published");
                    return Ok(());
                }
                // Waits for room in the client's queue: backpressure.
                ctx.wait(
                    async move {
                        if let Err(err) = client
                            .publish(topic, QoS::AtLeastOnce, false, payload)
                            .await
                        {
                            warn!(error = %err, "publish failed");
                        }
                    }
                    .into_actor(self),
                );
            }
            operation::SUBSCRIBE => {
                if let Err(err) = self.subscriber.try_subscribe(topic, QoS::AtLeastOnce) {
                    warn!(error = %err, "subscribe failed");
                }
            }
            other => debug!(operation = other, "eventbus ignores it"),
        }
        Ok(())
    }
}
