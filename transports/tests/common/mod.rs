//! Test rigs: a CA made at run time, listeners on free ports or fresh
//! socket paths, and dial options pointing at them, for every transport.
#![allow(dead_code)]

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use beehive::Message;
use serde_json::json;
use transports::tls::{self, CertificateDer, DevPki, Identity};
use transports::{DialOptions, Limits, Link, ListenOptions, Listener, Transport, TransportKind};

/// A certificate authority made for one test.
pub struct Pki(DevPki);

impl Pki {
    pub fn new(name: &str) -> Pki {
        Pki(DevPki::new(name).expect("CA"))
    }
    pub fn root(&self) -> CertificateDer<'static> {
        self.0.root()
    }
    pub fn server(&self) -> Identity {
        self.0.server("cloud").expect("server certificate")
    }
    pub fn client(&self, node: &str) -> Identity {
        self.0.client(node).expect("client certificate")
    }
}

static SOCKETS: AtomicUsize = AtomicUsize::new(0);

/// Everything one test needs for one transport.
pub struct Rig {
    pub kind: TransportKind,
    pub transport: Box<dyn Transport>,
    pub pki: Pki,
    pub listen: ListenOptions,
    /// Client identity presented when dialing (mutual TLS).
    pub client: Option<Identity>,
}

impl Rig {
    /// A rig with mutual TLS for ws and quic (client "node-a"), plain for uds.
    pub fn new(kind: TransportKind) -> Rig {
        Rig::with_limits(kind, Limits::default())
    }

    pub fn with_limits(kind: TransportKind, limits: Limits) -> Rig {
        let pki = Pki::new("edgehive test CA");
        let address = match kind {
            TransportKind::UnixSocket => std::env::temp_dir()
                .join(format!(
                    "edgehive-test-{}-{}.sock",
                    std::process::id(),
                    SOCKETS.fetch_add(1, Ordering::Relaxed)
                ))
                .to_string_lossy()
                .into_owned(),
            // A held port: some tests restart the listener on it.
            _ => transports::testing::free_address(),
        };
        let mut listen = ListenOptions::new(address).with_limits(limits);
        let mut client = None;
        if kind != TransportKind::UnixSocket {
            let (chain, key) = pki.server();
            listen = listen
                .with_tls(tls::server_config(chain, key, Some(&[pki.root()])).expect("server TLS"));
            client = Some(pki.client("node-a"));
        }
        Rig {
            kind,
            transport: kind.transport().expect("transport compiled in"),
            pki,
            listen,
            client,
        }
    }

    pub async fn listen(&self) -> Listener {
        self.transport.listen(&self.listen).await.expect("listen")
    }

    /// Dial options for `listener`, presenting `identity` (if TLS).
    pub fn dial_as(&self, listener_addr: &str, identity: Option<Identity>) -> DialOptions {
        let mut dial = DialOptions::new(listener_addr, "localhost").with_limits(self.listen.limits);
        if self.kind != TransportKind::UnixSocket {
            dial = dial
                .with_tls(tls::client_config(&[self.pki.root()], identity).expect("client TLS"));
        }
        dial
    }

    pub fn dial_options(&self, listener: &Listener) -> DialOptions {
        self.dial_as(
            listener.local_addr(),
            self.client.as_ref().map(clone_identity),
        )
    }

    pub async fn dial(&self, listener: &Listener) -> Link {
        self.transport
            .dial(&self.dial_options(listener))
            .await
            .expect("dial")
    }

    /// A dialed link and the listener's side of it.
    pub async fn pair(&self, listener: &mut Listener) -> (Link, Link) {
        let client = self.dial(listener).await;
        let server = within(listener.accept()).await.expect("accepted link");
        (client, server)
    }
}

pub fn clone_identity(identity: &Identity) -> Identity {
    (identity.0.clone(), identity.1.clone_key())
}

/// A numbered message.
pub fn numbered(from: usize, n: usize) -> Message {
    Message::new()
        .build_router("test", "hub", "default/pod/p", "update")
        .with_content(beehive::Content::of(&json!({"from": from, "n": n})).expect("json body"))
}

/// A message whose encoded frame is exactly `size` bytes.
pub fn sized(size: usize) -> Message {
    let base = Message::new().with_content("");
    let mut filler = size.saturating_sub(base.to_bytes().expect("encode").len());
    loop {
        let msg = Message::new()
            .with_content(beehive::Content::of(&json!("x".repeat(filler))).expect("json body"));
        let len = msg.to_bytes().expect("encode").len();
        if len == size || filler == 0 {
            return msg;
        }
        filler = if len > size {
            filler - (len - size).min(filler)
        } else {
            filler + (size - len)
        };
    }
}

/// Awaits `f`, failing the test if it hangs (a hang guard, not a timing assertion).
pub async fn within<F: std::future::Future>(f: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(20), f)
        .await
        .expect("hung for 20 s")
}

/// The next message on `receiver`, within the test's time limit; panics
/// if the link ended or refused what came.
pub async fn next_message(receiver: &mut transports::LinkReceiver) -> Message {
    within(receiver.recv())
        .await
        .expect("open")
        .expect("message")
}

/// The next `count` [`numbered`] messages, each a different one: panics on
/// a duplicate. Their `(from, n)` keys.
pub async fn receive_distinct(
    receiver: &mut transports::LinkReceiver,
    count: usize,
) -> HashSet<(Option<u64>, Option<u64>)> {
    let mut seen = HashSet::new();
    for _ in 0..count {
        let msg = next_message(receiver).await;
        let key = (
            msg.body::<serde_json::Value>().expect("json body")["from"].as_u64(),
            msg.body::<serde_json::Value>().expect("json body")["n"].as_u64(),
        );
        assert!(seen.insert(key), "duplicate {key:?}");
    }
    seen
}

/// Waits for the link to end: no further message, at most an error (a
/// reset from a peer that closed with unread data is a way of ending too).
pub async fn assert_ends(receiver: &mut transports::LinkReceiver) {
    loop {
        match within(receiver.recv()).await {
            None => return,
            Some(Err(_)) => continue,
            Some(Ok(msg)) => panic!("expected the link to end, got {msg:?}"),
        }
    }
}
