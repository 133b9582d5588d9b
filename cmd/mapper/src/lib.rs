//! edgehive-mapper: a KubeEdge-style mapper for simulated devices. It
//! speaks MQTT on KubeEdge's topics (older mappers' way), or, with
//! `--dmi`, KubeEdge's DMI over gRPC (today's mappers' way); either works
//! against KubeEdge's edgecore too.
//!
//! It asks for the node's devices (`membership/get`) and follows membership
//! changes; every period it reports each device's twins: a property the
//! cloud set a desired value for is driven to it (the device "applies" the
//! setpoint), any other property reads a simulated sensor value. A delta
//! from edgecore is applied and reported at once. It also reports each
//! device online.
//!
//! ```text
//! edgehive-mapper --broker 127.0.0.1:1883 --node edge-1 --period-ms 1000
//! edgehive-mapper --dmi /etc/kubeedge/dmi.sock --protocol virtual
//! ```

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Parser;
use rumqttc::{AsyncClient, Event, MqttOptions, Packet, QoS};
use serde_json::{Value, json};
use twin::protocol::{self, MemberDevice, MsgTwin};

/// A mapper for simulated devices.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    /// The MQTT broker edgecore uses, host:port.
    #[arg(long, default_value = twin::broker::DEFAULT_ADDRESS)]
    broker: String,
    /// The node whose devices this mapper drives (MQTT mode).
    #[arg(long, default_value = "")]
    node: String,
    /// DMI mode: the edge's DMI socket (KubeEdge's default
    /// /etc/kubeedge/dmi.sock) instead of MQTT.
    #[arg(long)]
    dmi: Option<std::path::PathBuf>,
    /// DMI mode: this mapper's own socket.
    #[arg(long, default_value = "/etc/kubeedge/edgehive-mapper.sock")]
    socket: std::path::PathBuf,
    /// DMI mode: the protocol whose devices it drives.
    #[arg(long, default_value = "virtual")]
    protocol: String,
    /// How often every device reports, in milliseconds.
    #[arg(long, default_value_t = 1000)]
    period_ms: u64,
}

mod dmi;

/// What the mapper knows of a device: its twins' expected values.
type Devices = BTreeMap<String, BTreeMap<String, Option<String>>>;

/// The mapper's command line: parses the arguments and runs until killed
/// (the binary's `main`).
#[tokio::main(flavor = "current_thread")]
pub async fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stdout()))
        .init();
    let args = Args::parse();
    if let Some(edge) = args.dmi {
        return dmi::run(dmi::DmiMode {
            edge,
            socket: args.socket,
            name: "edgehive-mapper".to_owned(),
            protocol: args.protocol,
            period: Duration::from_millis(args.period_ms.max(10)),
        })
        .await;
    }
    anyhow::ensure!(!args.node.is_empty(), "--node names the node (MQTT mode)");
    let (host, port) = args
        .broker
        .rsplit_once(':')
        .context("--broker wants host:port")?;
    let port: u16 = port.parse().context("--broker wants host:port")?;
    let mut options = MqttOptions::new(format!("edgehive-mapper-{}", args.node), host, port);
    options.set_keep_alive(Duration::from_secs(30));
    let (client, mut events) = AsyncClient::new(options, 256);
    let membership = protocol::node_topic(&args.node, "membership/get");
    let mut devices = Devices::new();
    let mut tick = tokio::time::interval(Duration::from_millis(args.period_ms.max(10)));
    let mut reading: u64 = 0;
    loop {
        tokio::select! {
            event = events.poll() => match event {
                Ok(Event::Incoming(Packet::ConnAck(_))) => {
                    tracing::info!(broker = %args.broker, "connected");
                    for filter in [
                        protocol::node_topic(&args.node, "membership/#"),
                        format!("{}+/twin/update/delta", protocol::DEVICE_PREFIX),
                    ] {
                        client.try_subscribe(filter, QoS::AtLeastOnce)?;
                    }
                    client.try_publish(&membership, QoS::AtLeastOnce, false, json!({"event_id": "mapper-start"}).to_string())?;
                }
                Ok(Event::Incoming(Packet::Publish(publish))) => {
                    let Ok(payload) = serde_json::from_slice::<Value>(&publish.payload) else {
                        tracing::warn!(topic = %publish.topic, "payload is not JSON; ignored");
                        continue;
                    };
                    on_message(&client, &mut devices, &publish.topic, &payload).await?;
                }
                Ok(_) => {}
                Err(err) => {
                    tracing::warn!(error = %err, "broker connection lost; reconnecting");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            },
            _ = tick.tick() => {
                reading += 1;
                for (id, twins) in &devices {
                    report(&client, id, twins, reading).await?;
                }
            }
        }
    }
}

/// Follows membership and applies deltas.
async fn on_message(
    client: &AsyncClient,
    devices: &mut Devices,
    topic: &str,
    payload: &Value,
) -> Result<()> {
    let members = |field: &str| -> Vec<MemberDevice> {
        payload
            .get(field)
            .and_then(|d| serde_json::from_value(d.clone()).ok())
            .unwrap_or_default()
    };
    if topic.ends_with("/membership/get/result") || topic.ends_with("/membership/updated") {
        for device in members("devices")
            .into_iter()
            .chain(members("added_devices"))
        {
            tracing::info!(device = %device.id, "driving device");
            let twins = expected_values(&device.twin);
            devices.insert(device.id.clone(), twins);
            let state = json!({"event_id": "", "state": "online"}).to_string();
            client.try_publish(
                protocol::device_topic(&device.id, "state/update"),
                QoS::AtLeastOnce,
                false,
                state,
            )?;
        }
        for device in members("removed_devices") {
            tracing::info!(device = %device.id, "device removed");
            devices.remove(&device.id);
        }
    } else if let Some(id) = topic
        .strip_prefix(protocol::DEVICE_PREFIX)
        .and_then(|rest| rest.strip_suffix("/twin/update/delta"))
    {
        let Some(twins) = devices.get_mut(id) else {
            return Ok(());
        };
        let delta: BTreeMap<String, String> = payload
            .get("delta")
            .and_then(|d| serde_json::from_value(d.clone()).ok())
            .unwrap_or_default();
        for (property, value) in delta {
            tracing::info!(device = %id, %property, %value, "applying the desired value");
            twins.insert(property, Some(value));
        }
        report(client, id, twins, 0).await?;
    }
    Ok(())
}

fn expected_values(twins: &BTreeMap<String, MsgTwin>) -> BTreeMap<String, Option<String>> {
    twins
        .iter()
        .map(|(name, twin)| {
            (
                name.clone(),
                twin.expected.as_ref().and_then(|e| e.value.clone()),
            )
        })
        .collect()
}

/// Reports every twin: the expected value where there is one, a simulated
/// reading otherwise.
async fn report(
    client: &AsyncClient,
    id: &str,
    twins: &BTreeMap<String, Option<String>>,
    reading: u64,
) -> Result<()> {
    if twins.is_empty() {
        return Ok(());
    }
    let simulated = format!("{:.1}", 20.0 + (reading % 50) as f64 / 10.0);
    let twin: BTreeMap<&String, Value> = twins
        .iter()
        .map(|(name, expected)| {
            let value = expected.clone().unwrap_or_else(|| simulated.clone());
            (name, json!({"actual": {"value": value}}))
        })
        .collect();
    let payload =
        json!({"event_id": "", "timestamp": beehive::message::now_millis(), "twin": twin});
    // Never waits: this task also reads, and a full queue means the broker
    // is slow; the next period reports again.
    if let Err(err) = client.try_publish(
        protocol::device_topic(id, "twin/update"),
        QoS::AtLeastOnce,
        false,
        payload.to_string(),
    ) {
        tracing::warn!(device = %id, error = %err, "report not queued; the next one follows");
    }
    Ok(())
}
