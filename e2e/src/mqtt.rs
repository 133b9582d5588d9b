//! What the MQTT tests share: a Mosquitto of the test's own and a real
//! MQTT client playing a mapper.

use std::net::SocketAddr;
use std::time::Duration;

use rumqttc::AsyncClient;
use tokio::sync::mpsc;
use twin::testing::Received;

pub const WAIT: Duration = Duration::from_secs(20);

/// A Mosquitto of this test's own, refusing packets over `max_packet`.
pub struct Mosquitto {
    pub address: SocketAddr,
    child: std::process::Child,
    _dir: tempfile::TempDir,
}

impl Mosquitto {
    pub fn start(max_packet: usize) -> Mosquitto {
        let address = SocketAddr::from(([127, 0, 0, 1], transports::testing::free_port()));
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
        let mut child = std::process::Command::new("mosquitto")
            .arg("-c")
            .arg(&config)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("mosquitto (run ./scripts/setup-mqtt)");
        // Up once it accepts connections (it says so nowhere else).
        let deadline = std::time::Instant::now() + WAIT;
        while std::net::TcpStream::connect(address).is_err() {
            if let Ok(Some(status)) = child.try_wait() {
                panic!("mosquitto exited: {status}");
            }
            if std::time::Instant::now() >= deadline {
                let _ = child.kill();
                panic!("mosquitto never listened on {address}");
            }
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

/// A client standing in for a mapper; returns once it is connected (and
/// subscribed).
pub async fn mapper(
    broker: SocketAddr,
    id: &str,
    subscribe: Option<&str>,
) -> (AsyncClient, mpsc::UnboundedReceiver<Received>) {
    twin::testing::connect(broker, id, subscribe)
        .await
        .unwrap_or_else(|err| panic!("{err}"))
}
