//! Test and benchmark support (feature `testing`): a real MQTT client whose
//! event loop runs in a task, standing in for a mapper or an application.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use rumqttc::{AsyncClient, Event, MqttOptions, Packet, QoS};
use tokio::sync::mpsc;

/// A message the client received.
#[derive(Debug, Clone)]
pub struct Received {
    /// Its topic.
    pub topic: String,
    /// Its payload.
    pub payload: Vec<u8>,
    /// When it arrived.
    pub at: Instant,
}

/// Connects client `id` to `broker` and subscribes it to `filter`, if
/// given; returns once connected (and subscribed). What it receives comes
/// out of the channel; the channel ends when the connection does.
pub async fn connect(
    broker: SocketAddr,
    id: &str,
    filter: Option<&str>,
) -> Result<(AsyncClient, mpsc::UnboundedReceiver<Received>), String> {
    let mut options = MqttOptions::new(id, broker.ip().to_string(), broker.port());
    options.set_keep_alive(Duration::from_secs(30));
    options.set_max_packet_size(16 << 20, 16 << 20);
    let (client, mut events) = AsyncClient::new(options, 1024);
    let (got, received) = mpsc::unbounded_channel();
    let (ready, is_ready) = tokio::sync::oneshot::channel();
    let mut ready = Some(ready);
    let filter = filter.map(str::to_owned);
    let subscriber = client.clone();
    tokio::spawn(async move {
        loop {
            match events.poll().await {
                Ok(Event::Incoming(Packet::ConnAck(_))) => match &filter {
                    Some(filter) => {
                        let _ = subscriber.subscribe(filter, QoS::AtLeastOnce).await;
                    }
                    None => {
                        if let Some(ready) = ready.take() {
                            let _ = ready.send(());
                        }
                    }
                },
                Ok(Event::Incoming(Packet::SubAck(_))) => {
                    if let Some(ready) = ready.take() {
                        let _ = ready.send(());
                    }
                }
                Ok(Event::Incoming(Packet::Publish(p))) => {
                    let _ = got.send(Received {
                        topic: p.topic.clone(),
                        payload: p.payload.to_vec(),
                        at: Instant::now(),
                    });
                }
                Ok(_) => {}
                Err(err) => {
                    tracing::debug!(error = %err, "test client's connection ended");
                    return;
                }
            }
        }
    });
    match tokio::time::timeout(Duration::from_secs(20), is_ready).await {
        Ok(Ok(())) => Ok((client, received)),
        Ok(Err(_)) => Err(format!("{id}: the connection ended before it was ready")),
        Err(_) => Err(format!("{id}: not connected in time")),
    }
}
