//! The embedded MQTT broker: a small MQTT 3.1.1 broker in-process, the
//! eventbus's default, for mappers and applications on the node.
//!
//! It does what KubeEdge's topics need: CONNECT, SUBSCRIBE and UNSUBSCRIBE
//! with `+` and `#` wildcards (including topics that start with `$`, such
//! as `$hw/...`, matched by filters that name them), PUBLISH at QoS 0 and 1
//! (a QoS 1 publish is acknowledged; deliveries go out at QoS 0, the grant
//! every subscription gets), PINGREQ and DISCONNECT. No retained messages,
//! no sessions, no QoS 2. A packet over the size limit is refused from its
//! header, before it is read, and closes only its sender's connection; a
//! subscriber that cannot keep up loses messages rather than slowing the
//! publisher. (rumqttd refuses every filter that starts with `$`.)

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::BytesMut;
use rumqttc::mqttbytes::v4::{
    ConnAck, ConnectReturnCode, Packet, PubAck, Publish, SubAck, SubscribeReasonCode, UnsubAck,
};
use rumqttc::mqttbytes::{self, QoS};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tracing::{debug, info, warn};

/// KubeEdge's MQTT port.
pub const DEFAULT_ADDRESS: &str = "127.0.0.1:1883";

/// Packets queued for one client; its own writer task sends them, so a
/// session waiting to queue a message for another client still delivers
/// to its own. When the queue is full, a QoS 0 message for it is dropped,
/// and a QoS 1 publisher waits for room (up to [`SLOW_SUBSCRIBER`]) before
/// its message is acknowledged.
const SUBSCRIBER_QUEUE: usize = 1024;
/// How long a QoS 1 publisher waits for full subscribers; one still full
/// then is disconnected (its client learns it missed a message, rather than
/// the message being lost silently).
const SLOW_SUBSCRIBER: Duration = Duration::from_secs(5);
/// Topic filters one client may hold.
const MAX_FILTERS: usize = 1024;
/// Connections at once; more wait to be accepted.
const MAX_CONNECTIONS: usize = 4096;

/// A running embedded broker.
pub struct EmbeddedBroker {
    /// Where it listens.
    pub address: SocketAddr,
    stop: watch::Sender<bool>,
}

impl EmbeddedBroker {
    /// Listens on `address`, refusing packets over `max_packet` bytes.
    pub async fn start(address: &str, max_packet: usize) -> std::io::Result<EmbeddedBroker> {
        let listener = TcpListener::bind(address).await?;
        let address = listener.local_addr()?;
        let (stop, stopped) = watch::channel(false);
        let router = Arc::new(Mutex::new(Router::default()));
        tokio::spawn(accept(listener, router, max_packet, stopped));
        info!(%address, "embedded MQTT broker listening");
        Ok(EmbeddedBroker { address, stop })
    }

    /// Stops accepting; open connections end.
    pub fn stop(&self) {
        self.stop.send_replace(true);
    }
}

impl Drop for EmbeddedBroker {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Who is subscribed to what.
#[derive(Default)]
struct Router {
    next: u64,
    clients: HashMap<u64, Subscriber>,
}

struct Subscriber {
    filters: Vec<String>,
    outbox: mpsc::Sender<Packet>,
}

impl Router {
    /// The queues of the clients subscribed to `topic`.
    fn subscribers(&self, topic: &str) -> Vec<(u64, mpsc::Sender<Packet>)> {
        self.clients
            .iter()
            .filter(|(_, s)| s.filters.iter().any(|f| matches(f, topic)))
            .map(|(id, s)| (*id, s.outbox.clone()))
            .collect()
    }
}

/// Queues `publish` for every subscriber of its topic: a QoS 0 message is
/// dropped for a full subscriber; a QoS 1 message waits for room in all of
/// them at once, and a subscriber still full after [`SLOW_SUBSCRIBER`] is
/// disconnected.
async fn route(router: &Mutex<Router>, publish: &Publish) {
    let subscribers = match router.lock() {
        Ok(router) => router.subscribers(&publish.topic),
        Err(_) => return,
    };
    let copy = || {
        let mut copy = Publish::new(publish.topic.clone(), QoS::AtMostOnce, Vec::new());
        copy.payload = publish.payload.clone();
        Packet::Publish(copy)
    };
    if publish.qos == QoS::AtMostOnce {
        for (_, outbox) in subscribers {
            if outbox.try_send(copy()).is_err() {
                debug!(topic = %publish.topic, "a slow subscriber missed a QoS 0 message");
            }
        }
        return;
    }
    let deadline = tokio::time::Instant::now() + SLOW_SUBSCRIBER;
    let sends = subscribers.into_iter().map(|(id, outbox)| {
        let packet = copy();
        async move {
            let queued = matches!(
                tokio::time::timeout_at(deadline, outbox.send(packet)).await,
                Ok(Ok(()))
            );
            (id, queued)
        }
    });
    for (id, queued) in futures_util::future::join_all(sends).await {
        if !queued {
            warn!(topic = %publish.topic, client = id, "a subscriber stayed full; disconnected");
            if let Ok(mut router) = router.lock() {
                // Dropping its queue ends its writer, and so its connection.
                router.clients.remove(&id);
            }
        }
    }
}

/// Whether topic filter `filter` matches `topic` (MQTT 3.1.1 rules; a
/// wildcard in the first level does not match a `$` topic).
pub fn matches(filter: &str, topic: &str) -> bool {
    if topic.starts_with('$') && (filter.starts_with('+') || filter.starts_with('#')) {
        return false;
    }
    let mut topic_levels = topic.split('/');
    for level in filter.split('/') {
        match level {
            "#" => return true,
            "+" => {
                if topic_levels.next().is_none() {
                    return false;
                }
            }
            name => {
                if topic_levels.next() != Some(name) {
                    return false;
                }
            }
        }
    }
    topic_levels.next().is_none()
}

/// Whether `filter` is a valid topic filter.
fn valid_filter(filter: &str) -> bool {
    let levels: Vec<&str> = filter.split('/').collect();
    !filter.is_empty()
        && levels.iter().enumerate().all(|(i, level)| {
            (*level == "#" && i == levels.len() - 1)
                || *level == "+"
                || !(level.contains('#') || level.contains('+'))
        })
}

async fn accept(
    listener: TcpListener,
    router: Arc<Mutex<Router>>,
    max_packet: usize,
    mut stopped: watch::Receiver<bool>,
) {
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    loop {
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    let router = router.clone();
                    let stopped = stopped.clone();
                    tokio::spawn(async move {
                        if let Err(reason) = session(stream, router, max_packet, stopped).await {
                            debug!(%peer, %reason, "MQTT connection closed");
                        }
                        drop(slot);
                    });
                }
                Err(err) => {
                    warn!(error = %err, "accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            },
            _ = stopped.changed() => return,
        }
    }
}

/// Reads the next packet, refusing one over `max` from its header.
async fn read_packet(
    stream: &mut OwnedReadHalf,
    buffer: &mut BytesMut,
    max: usize,
) -> Result<Packet, String> {
    loop {
        match Packet::read(buffer, max) {
            Ok(packet) => return Ok(packet),
            Err(mqttbytes::Error::InsufficientBytes(_)) => {}
            Err(err) => return Err(format!("bad packet: {err}")),
        }
        if stream.read_buf(buffer).await.map_err(|e| e.to_string())? == 0 {
            return Err("closed".to_owned());
        }
    }
}

async fn write_packet(
    stream: &mut OwnedWriteHalf,
    packet: Packet,
    max: usize,
) -> Result<(), String> {
    let mut out = BytesMut::new();
    packet.write(&mut out, max).map_err(|e| e.to_string())?;
    stream.write_all(&out).await.map_err(|e| e.to_string())
}

async fn session(
    stream: TcpStream,
    router: Arc<Mutex<Router>>,
    max: usize,
    mut stopped: watch::Receiver<bool>,
) -> Result<(), String> {
    let (mut reader, mut writer) = stream.into_split();
    let mut buffer = BytesMut::with_capacity(4096);
    let connect = tokio::time::timeout(
        Duration::from_secs(10),
        read_packet(&mut reader, &mut buffer, max),
    )
    .await
    .map_err(|_| "no CONNECT in time".to_owned())??;
    let Packet::Connect(connect) = connect else {
        return Err("the first packet was not CONNECT".to_owned());
    };
    write_packet(
        &mut writer,
        Packet::ConnAck(ConnAck::new(ConnectReturnCode::Success, false)),
        max,
    )
    .await?;
    let (outbox, mut inbox) = mpsc::channel::<Packet>(SUBSCRIBER_QUEUE);
    let id = {
        let mut router = router.lock().map_err(|_| "router poisoned".to_owned())?;
        router.next += 1;
        let id = router.next;
        router.clients.insert(
            id,
            Subscriber {
                filters: Vec::new(),
                outbox: outbox.clone(),
            },
        );
        id
    };
    // The router holds the only strong handle of the queue: when it drops
    // this client, the writer ends. (Shadowing would keep this one alive,
    // and every closed connection with it.)
    let outbox = {
        let weak = outbox.downgrade();
        drop(outbox);
        weak
    };
    // The writer: everything for this client, in order, until its queue
    // is dropped (the session ended, or the router disconnected it).
    let writing = tokio::spawn(async move {
        while let Some(packet) = inbox.recv().await {
            if write_packet(&mut writer, packet, max).await.is_err() {
                break;
            }
        }
        let _ = writer.shutdown().await;
    });
    // Silent for 1.5 keep-alive intervals: gone (0 means no keep-alive).
    let keep_alive = match connect.keep_alive {
        0 => Duration::from_secs(u64::from(u32::MAX)),
        seconds => Duration::from_secs(u64::from(seconds)) * 3 / 2,
    };
    let reply = |packet: Packet| {
        let outbox = outbox.upgrade();
        async move {
            let disconnected = || "disconnected: the client did not read".to_owned();
            outbox
                .ok_or_else(disconnected)?
                .send(packet)
                .await
                .map_err(|_| disconnected())
        }
    };
    let result = async {
        loop {
            tokio::select! {
                packet = tokio::time::timeout(keep_alive, read_packet(&mut reader, &mut buffer, max)) => {
                    let packet = packet.map_err(|_| "keep-alive expired".to_owned())??;
                    match packet {
                        Packet::Publish(publish) => {
                            // Acknowledged once queued for its subscribers.
                            route(&router, &publish).await;
                            if publish.qos != QoS::AtMostOnce {
                                reply(Packet::PubAck(PubAck::new(publish.pkid))).await?;
                            }
                        }
                        Packet::Subscribe(subscribe) => {
                            let mut codes = Vec::with_capacity(subscribe.filters.len());
                            if let Ok(mut router) = router.lock()
                                && let Some(me) = router.clients.get_mut(&id)
                            {
                                for filter in subscribe.filters {
                                    if valid_filter(&filter.path) && me.filters.len() < MAX_FILTERS {
                                        me.filters.push(filter.path);
                                        codes.push(SubscribeReasonCode::Success(QoS::AtMostOnce));
                                    } else {
                                        codes.push(SubscribeReasonCode::Failure);
                                    }
                                }
                            }
                            reply(Packet::SubAck(SubAck::new(subscribe.pkid, codes))).await?;
                        }
                        Packet::Unsubscribe(unsubscribe) => {
                            if let Ok(mut router) = router.lock()
                                && let Some(me) = router.clients.get_mut(&id)
                            {
                                me.filters.retain(|f| !unsubscribe.topics.contains(f));
                            }
                            reply(Packet::UnsubAck(UnsubAck::new(unsubscribe.pkid))).await?;
                        }
                        Packet::PingReq => reply(Packet::PingResp).await?,
                        Packet::Disconnect => return Ok(()),
                        _ => {}
                    }
                }
                _ = stopped.changed() => return Ok(()),
            }
        }
    }
    .await;
    if let Ok(mut router) = router.lock() {
        router.clients.remove(&id);
    }
    let _ = writing.await;
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A client's DISCONNECT ends its connection: the broker closes it
    /// (it once kept every closed connection, its task and its slot).
    #[tokio::test]
    async fn the_broker_closes_a_connection_after_disconnect() {
        let address = format!("127.0.0.1:{}", transports::testing::free_port());
        let broker = EmbeddedBroker::start(&address, 1 << 16)
            .await
            .expect("broker");
        for _ in 0..3 {
            let mut stream = TcpStream::connect(broker.address).await.expect("connect");
            let mut out = BytesMut::new();
            Packet::Connect(rumqttc::mqttbytes::v4::Connect::new("closing"))
                .write(&mut out, 1 << 16)
                .expect("connect packet");
            Packet::Disconnect
                .write(&mut out, 1 << 16)
                .expect("disconnect packet");
            stream.write_all(&out).await.expect("write");
            let mut read = Vec::new();
            tokio::time::timeout(Duration::from_secs(20), stream.read_to_end(&mut read))
                .await
                .expect("closed by the broker in time")
                .expect("read");
            assert_eq!(read.first(), Some(&0x20), "a CONNACK, then the end");
        }
    }

    #[test]
    fn filters_match_as_mqtt_says() {
        assert!(matches(
            "$hw/events/device/+/twin/update",
            "$hw/events/device/dev-1/twin/update"
        ));
        assert!(!matches(
            "$hw/events/device/+/twin/update",
            "$hw/events/device/dev-1/twin/update/delta"
        ));
        assert!(matches("$hw/events/upload/#", "$hw/events/upload/a/b"));
        assert!(matches("n1/user/#", "n1/user/app"));
        assert!(
            !matches("#", "$hw/events/upload/a"),
            "wildcards do not reach $ topics"
        );
        assert!(!matches("+/events/x", "$hw/events/x"));
        assert!(matches("a/+", "a/b"));
        assert!(!matches("a/+", "a"));
        assert!(
            valid_filter("a/#")
                && valid_filter("+/b/+")
                && !valid_filter("a/#/b")
                && !valid_filter("a+/b")
        );
    }
}
