//! Streams inside a link (the tunnel), over a real Unix-socket link: opened
//! by the cloud, accepted or refused by the edge, bytes both ways with
//! flow control, messages never held back, and a link's end ending every
//! stream on both sides.

use std::sync::Arc;
use std::time::Duration;

use beehive::Message;
use bytes::Bytes;
use stream::{Chunk, PendingStream, StreamError, StreamHandler, Tunnel, TunnelStream, WINDOW};
use tokio::sync::mpsc;
use transports::{DialOptions, Lane, Link, ListenOptions, Received, Transport, UnixSocket};

const TIMEOUT: Duration = Duration::from_secs(20);

/// Both ends of a real link, each read by a loop that hands raw frames to
/// its tunnel and messages to a channel, and ends the tunnel's streams
/// when the link ends.
struct Pair {
    cloud: Tunnel,
    edge: Tunnel,
    cloud_link: transports::LinkSender,
    edge_link: transports::LinkSender,
    at_edge: mpsc::UnboundedReceiver<Message>,
    _dir: tempfile::TempDir,
}

fn read(link: Link, tunnel: Tunnel) -> (transports::LinkSender, mpsc::UnboundedReceiver<Message>) {
    let Link {
        sender,
        mut receiver,
        ..
    } = link;
    let (messages, received) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        loop {
            match receiver.recv_item().await {
                Some(Ok(Received::Raw(frame))) => tunnel.received(&frame),
                Some(Ok(Received::Message(msg))) => {
                    let _ = messages.send(msg);
                }
                _ => {
                    tunnel.link_lost();
                    return;
                }
            }
        }
    });
    (sender, received)
}

async fn pair(handler: Option<Arc<dyn StreamHandler>>) -> Pair {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("hub.sock").to_string_lossy().into_owned();
    let mut listener = UnixSocket
        .listen(&ListenOptions::new(&path))
        .await
        .expect("listen");
    let dialed = UnixSocket
        .dial(&DialOptions::new(&path, "cloud"))
        .await
        .expect("dial");
    let accepted = listener.accept().await.expect("accepted");
    // The edge dials; the cloud accepts.
    let cloud = Tunnel::for_cloud(accepted.sender.clone());
    let edge = Tunnel::for_edge(dialed.sender.clone(), handler);
    let (cloud_link, _) = read(accepted, cloud.clone());
    let (edge_link, at_edge) = read(dialed, edge.clone());
    Pair {
        cloud,
        edge,
        cloud_link,
        edge_link,
        at_edge,
        _dir: dir,
    }
}

/// Serves every stream with `serve`, on a task of its own.
struct Serve<F>(F);

impl<F, Fut> StreamHandler for Serve<F>
where
    F: Fn(Bytes, TunnelStream) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    fn open(&self, request: Bytes, stream: PendingStream) {
        match stream.accept() {
            Ok(stream) => {
                tokio::spawn((self.0)(request, stream));
            }
            Err(err) => panic!("accept: {err}"),
        }
    }
}

/// Echoes channel 0 back on channel 1, and ends when channel 0 ends.
fn echo() -> Arc<dyn StreamHandler> {
    Arc::new(Serve(
        |_request: Bytes, mut stream: TunnelStream| async move {
            let writer = stream.writer();
            while let Some(Ok(chunk)) = stream.recv().await {
                match chunk {
                    Chunk::Data(0, bytes) => writer.send(1, bytes).await.expect("echo"),
                    Chunk::End(0) => break,
                    _ => {}
                }
            }
            stream.close();
        },
    ))
}

async fn read_all(stream: &mut TunnelStream, channel: u8) -> Vec<u8> {
    let mut got = Vec::new();
    while let Some(chunk) = tokio::time::timeout(TIMEOUT, stream.recv())
        .await
        .expect("in time")
    {
        match chunk.expect("clean") {
            Chunk::Data(c, bytes) if c == channel => got.extend_from_slice(&bytes),
            _ => {}
        }
    }
    got
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bytes_go_both_ways_past_many_windows() {
    let pair = pair(Some(echo())).await;
    let mut stream = pair
        .cloud
        .open(Bytes::from_static(b"echo"), TIMEOUT)
        .await
        .expect("opened");
    let sent: Vec<u8> = (0..4 * WINDOW as usize + 12_345)
        .map(|i| (i % 251) as u8)
        .collect();
    let writer = stream.writer();
    let payload = Bytes::from(sent.clone());
    let sending = tokio::spawn(async move {
        writer.send(0, payload).await.expect("sent");
        writer.end(0).await.expect("ended");
    });
    let got = read_all(&mut stream, 1).await;
    sending.await.expect("sender");
    assert_eq!(got.len(), sent.len());
    assert!(got == sent, "the bytes came back as sent");
    assert_eq!((pair.cloud.opened(), pair.edge.opened()), (1, 1));
    assert_eq!(pair.cloud.open_streams(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_stream_says_why_and_a_node_without_a_handler_refuses_all() {
    struct Refuse;
    impl StreamHandler for Refuse {
        fn open(&self, request: Bytes, stream: PendingStream) {
            stream.refuse(&format!(
                "pod {} is not on this node",
                String::from_utf8_lossy(&request)
            ));
        }
    }
    let pair = pair(Some(Arc::new(Refuse))).await;
    let refused = pair
        .cloud
        .open(Bytes::from_static(b"default/web"), TIMEOUT)
        .await;
    assert_eq!(
        refused.err(),
        Some(StreamError::Refused(
            "pod default/web is not on this node".to_owned()
        ))
    );
    let pair = self::pair(None).await;
    let refused = pair.cloud.open(Bytes::from_static(b"x"), TIMEOUT).await;
    assert_eq!(
        refused.err(),
        Some(StreamError::Refused(
            "this node serves no streams".to_owned()
        ))
    );
    // The edge cannot open streams to the cloud.
    assert!(matches!(
        pair.edge.open(Bytes::new(), TIMEOUT).await,
        Err(StreamError::Protocol(_))
    ));
}

/// A stream whose reader does not read holds its sender at one window,
/// and holds back nothing else: messages on the link go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_reader_stops_its_sender_and_nothing_else() {
    let (go, wait) = mpsc::unbounded_channel::<()>();
    let wait = Arc::new(tokio::sync::Mutex::new(Some(wait)));
    let (got_tx, mut got) = mpsc::unbounded_channel::<usize>();
    let handler = Arc::new(Serve(move |_request: Bytes, mut stream: TunnelStream| {
        let (wait, got_tx) = (wait.clone(), got_tx.clone());
        async move {
            // Reads nothing until told.
            let mut wait = wait.lock().await.take().expect("one stream");
            let _ = wait.recv().await;
            let mut total = 0;
            while let Some(Ok(chunk)) = stream.recv().await {
                if let Chunk::Data(_, bytes) = chunk {
                    total += bytes.len();
                }
            }
            let _ = got_tx.send(total);
        }
    }));
    let mut pair = pair(Some(handler)).await;
    let stream = pair
        .cloud
        .open(Bytes::new(), TIMEOUT)
        .await
        .expect("opened");
    let writer = stream.writer();
    let size = 3 * WINDOW as usize;
    let sending = tokio::spawn(async move {
        writer
            .send(0, Bytes::from(vec![7u8; size]))
            .await
            .expect("sent");
    });
    // Messages still go down while the stream is stuck.
    for n in 0..100u64 {
        let msg = Message::new()
            .build_router("cloud", "resource", format!("default/pod/p{n}"), "update")
            .with_content(beehive::Content::of(&serde_json::json!({ "n": n })).expect("json body"));
        pair.cloud_link
            .send_on(&msg, Lane::Ordered)
            .await
            .expect("message");
    }
    for n in 0..100u64 {
        let msg = tokio::time::timeout(TIMEOUT, pair.at_edge.recv())
            .await
            .expect("a message in time")
            .expect("link open");
        assert_eq!(msg.body::<serde_json::Value>().expect("json body")["n"], n);
    }
    assert!(!sending.is_finished(), "the sender waits for credit");
    go.send(()).expect("go");
    sending.await.expect("sender");
    drop(stream);
    let total = tokio::time::timeout(TIMEOUT, got.recv())
        .await
        .expect("in time")
        .expect("a total");
    assert_eq!(total, size);
}

/// A link that ends ends its streams on both sides with an error, not a
/// hang: a reader, and a sender waiting for credit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_link_cut_ends_every_stream_on_both_sides() {
    let (ends_tx, mut ends) = mpsc::unbounded_channel::<Option<Result<Chunk, StreamError>>>();
    // The edge's handlers read nothing until the link is cut: a chunk read
    // before would give the writer credit, and it could finish unstuck.
    let (cut_tx, cut) = tokio::sync::watch::channel(false);
    let handler = Arc::new(Serve(move |_request: Bytes, mut stream: TunnelStream| {
        let ends_tx = ends_tx.clone();
        let mut cut = cut.clone();
        async move {
            let _ = cut.wait_for(|cut| *cut).await;
            let _ = ends_tx.send(loop {
                match stream.recv().await {
                    Some(Ok(_)) => continue,
                    other => break other,
                }
            });
        }
    }));
    let pair = pair(Some(handler)).await;
    let mut streams = Vec::new();
    for _ in 0..3 {
        streams.push(
            pair.cloud
                .open(Bytes::new(), TIMEOUT)
                .await
                .expect("opened"),
        );
    }
    let writer = streams[0].writer();
    let stuck = tokio::spawn(async move {
        writer
            .send(0, Bytes::from(vec![1u8; 2 * WINDOW as usize]))
            .await
    });
    pair.edge_link.close().await;
    let _ = cut_tx.send(true);
    let error = tokio::time::timeout(TIMEOUT, stuck)
        .await
        .expect("no hang")
        .expect("task");
    assert_eq!(error, Err(StreamError::LinkLost));
    for stream in &mut streams {
        let end = tokio::time::timeout(TIMEOUT, stream.recv())
            .await
            .expect("no hang");
        assert_eq!(end, Some(Err(StreamError::LinkLost)));
    }
    for _ in 0..3 {
        let end = tokio::time::timeout(TIMEOUT, ends.recv())
            .await
            .expect("no hang at the edge")
            .expect("an end");
        assert_eq!(end, Some(Err(StreamError::LinkLost)));
    }
    assert_eq!(
        (pair.cloud.open_streams(), pair.edge.open_streams()),
        (0, 0)
    );
}
