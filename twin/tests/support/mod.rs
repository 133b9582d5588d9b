//! What the MQTT tests share: a Mosquitto of the test's own and a real
//! MQTT client playing a mapper.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::time::Duration;

use rumqttc::{AsyncClient, Event, EventLoop, MqttOptions, Packet, QoS};
use tokio::sync::mpsc;

pub const WAIT: Duration = Duration::from_secs(20);

/// A Mosquitto of this test's own, refusing packets over `max_packet`.
pub struct Mosquitto {
    pub address: SocketAddr,
    child: std::process::Child,
    _dir: tempfile::TempDir,
}

impl Mosquitto {
    pub fn start(max_packet: usize) -> Mosquitto {
        let address = free_address();
        let dir = tempfile::tempdir().expect("dir");
        let config = dir.path().join("mosquitto.conf");
        std::fs::write(
            &config,
            format!(
                "listener {} {}\nallow_anonymous true\nmax_packet_size {max_packet}\npersistence false\n",
                address.port(),
                address.ip()
            ),
        )
        .expect("config");
        let child = std::process::Command::new("mosquitto")
            .arg("-c")
            .arg(&config)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("mosquitto (run ./scripts/setup-mqtt)");
        // Up once it accepts connections (it says so nowhere else).
        let deadline = std::time::Instant::now() + WAIT;
        while std::net::TcpStream::connect(address).is_err() {
            assert!(
                std::time::Instant::now() < deadline,
                "mosquitto never listened"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Mosquitto {
            address,
            child,
            _dir: dir,
        }
    }
}

impl Drop for Mosquitto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn free_address() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
}

/// A client that keeps its event loop running; what it receives comes out
/// of the channel. Returns once it is connected (and subscribed).
pub async fn mapper(
    broker: SocketAddr,
    id: &str,
    subscribe: Option<&str>,
) -> (AsyncClient, mpsc::UnboundedReceiver<(String, Vec<u8>)>) {
    let mut options = MqttOptions::new(id, broker.ip().to_string(), broker.port());
    options.set_keep_alive(Duration::from_secs(30));
    options.set_max_packet_size(16 << 20, 16 << 20);
    let (client, mut events): (AsyncClient, EventLoop) = AsyncClient::new(options, 64);
    let (got, received) = mpsc::unbounded_channel();
    let (ready, is_ready) = tokio::sync::oneshot::channel();
    let mut ready = Some(ready);
    let filter = subscribe.map(str::to_owned);
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
                    let _ = got.send((p.topic.clone(), p.payload.to_vec()));
                }
                Ok(_) => {}
                Err(err) => {
                    eprintln!("mapper connection: {err}");
                    return;
                }
            }
        }
    });
    tokio::time::timeout(WAIT, is_ready)
        .await
        .expect("connected in time")
        .expect("connected");
    (client, received)
}
