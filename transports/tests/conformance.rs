//! One conformance suite, run over every transport with real sockets and
//! real TLS (mutual TLS for WebSocket and QUIC; certificates made at run time).

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::{Rig, assert_ends, next_message, numbered, receive_distinct, sized, within};
use transports::{FrameError, Lane, Limits, TransportError, TransportKind};

async fn round_trip(kind: TransportKind) {
    let rig = Rig::new(kind);
    let mut listener = rig.listen().await;
    let (client, mut server) = rig.pair(&mut listener).await;
    let request = numbered(0, 1);
    client.sender.send(&request).await.expect("send");
    let got = next_message(&mut server.receiver).await;
    assert_eq!(got, request);
    let reply = got.response(
        "cloud",
        beehive::Content::of(&serde_json::json!("pong")).expect("json body"),
    );
    server.sender.send(&reply).await.expect("reply");
    let mut client_rx = client.receiver;
    let back = next_message(&mut client_rx).await;
    assert_eq!(back.parent_id(), Some(request.id()));
    if kind == TransportKind::UnixSocket {
        assert!(
            server.peer.remote.starts_with("uds:uid="),
            "{:?}",
            server.peer
        );
    } else {
        assert_eq!(
            server.peer.common_name.as_deref(),
            Some("node-a"),
            "mutual TLS identity"
        );
        assert_eq!(client.peer.common_name.as_deref(), Some("cloud"));
    }
}

async fn order_within_the_ordered_stream(kind: TransportKind) {
    let rig = Rig::new(kind);
    let mut listener = rig.listen().await;
    let (client, mut server) = rig.pair(&mut listener).await;
    let sender = client.sender.clone();
    tokio::spawn(async move {
        for n in 0..1_000 {
            sender.send(&numbered(0, n)).await.expect("send");
        }
    });
    for n in 0..1_000u64 {
        let msg = next_message(&mut server.receiver).await;
        assert_eq!(msg.body::<serde_json::Value>().expect("json body")["n"], n);
    }
}

async fn concurrent_messages_arrive_exactly_once(kind: TransportKind) {
    let rig = Rig::new(kind);
    let mut listener = rig.listen().await;
    let (client, mut server) = rig.pair(&mut listener).await;
    for from in 0..10 {
        let sender = client.sender.clone();
        tokio::spawn(async move {
            for n in 0..100 {
                let lane = if n % 2 == 0 {
                    Lane::Independent
                } else {
                    Lane::Ordered
                };
                sender
                    .send_on(&numbered(from, n), lane)
                    .await
                    .expect("send");
            }
        });
    }
    let seen = receive_distinct(&mut server.receiver, 1_000).await;
    assert_eq!(seen.len(), 1_000);
    // Nothing beyond the thousand: closing the client ends the stream.
    client.sender.close().await;
    assert!(within(server.receiver.recv()).await.is_none());
}

async fn frame_limit(kind: TransportKind) {
    const MAX: usize = 64 * 1024;
    let limits = Limits {
        max_frame: MAX,
        ..Limits::default()
    };
    let rig = Rig::with_limits(kind, limits);
    let mut listener = rig.listen().await;

    // The sender refuses an oversized message itself, and the link lives on.
    let (client, mut server) = rig.pair(&mut listener).await;
    let over = sized(MAX + 1);
    assert!(matches!(
        client.sender.send(&over).await,
        Err(TransportError::Frame(FrameError::TooLarge { max: MAX, .. }))
    ));
    let under = sized(MAX - 1);
    assert_eq!(under.to_bytes().expect("encode").len(), MAX - 1);
    client
        .sender
        .send(&under)
        .await
        .expect("just under the limit");
    let got = next_message(&mut server.receiver).await;
    assert_eq!(got, under);

    // A peer with a larger limit sending more than the receiver allows:
    // refused from the frame header, that connection closed.
    let big_sender_limits = Limits {
        max_frame: 4 * MAX,
        ..limits
    };
    let dial = rig.dial_options(&listener).with_limits(big_sender_limits);
    let loud = rig.transport.dial(&dial).await.expect("dial");
    let mut loud_server = within(listener.accept()).await.expect("accepted");
    loud.sender.send(&sized(MAX + 1)).await.expect("queued");
    match within(loud_server.receiver.recv()).await {
        Some(Err(TransportError::Frame(FrameError::TooLarge { max: MAX, .. }))) => {}
        other => panic!("expected a refused frame, got {other:?}"),
    }
    assert!(
        within(loud_server.receiver.recv()).await.is_none(),
        "that link is closed"
    );
    let mut loud_rx = loud.receiver;
    assert_ends(&mut loud_rx).await;

    // The first connection and the listener are unaffected.
    client.sender.send(&numbered(0, 7)).await.expect("send");
    let got = next_message(&mut server.receiver).await;
    assert_eq!(got.body::<serde_json::Value>().expect("json body")["n"], 7);
}

async fn a_garbled_frame_closes_only_its_connection(kind: TransportKind) {
    let rig = Rig::new(kind);
    let mut listener = rig.listen().await;
    let (bad, mut bad_server) = rig.pair(&mut listener).await;
    let (good, mut good_server) = rig.pair(&mut listener).await;
    bad.sender
        .send_frame(
            Bytes::from_static(b"\xc1 this is not messagepack"),
            Lane::Ordered,
        )
        .await
        .expect("queued");
    match within(bad_server.receiver.recv()).await {
        Some(Err(TransportError::Frame(FrameError::Decode(_)))) => {}
        other => panic!("expected a decode error, got {other:?}"),
    }
    assert!(within(bad_server.receiver.recv()).await.is_none());
    let mut bad_rx = bad.receiver;
    assert_ends(&mut bad_rx).await;

    good.sender.send(&numbered(1, 1)).await.expect("send");
    let got = next_message(&mut good_server.receiver).await;
    assert_eq!(
        got.body::<serde_json::Value>().expect("json body")["from"],
        1
    );
    // And the listener still accepts.
    let (third, mut third_server) = rig.pair(&mut listener).await;
    third.sender.send(&numbered(3, 0)).await.expect("send");
    assert!(
        within(third_server.receiver.recv())
            .await
            .expect("open")
            .is_ok()
    );
}

async fn close_by_either_side_is_noticed(kind: TransportKind) {
    let rig = Rig::new(kind);
    let mut listener = rig.listen().await;

    let (client, mut server) = rig.pair(&mut listener).await;
    client.sender.send(&numbered(0, 0)).await.expect("send");
    client.sender.close().await;
    assert!(
        within(server.receiver.recv())
            .await
            .expect("delivered before close")
            .is_ok()
    );
    assert!(
        within(server.receiver.recv()).await.is_none(),
        "server sees the client's close"
    );
    within(server.sender.closed()).await;

    let (client, server) = rig.pair(&mut listener).await;
    server.sender.close().await;
    let mut client_rx = client.receiver;
    assert_ends(&mut client_rx).await;
    within(client.sender.closed()).await;
    assert!(matches!(
        client.sender.send(&numbered(0, 1)).await,
        Err(TransportError::Closed)
    ));

    // Dropping every handle closes the link too.
    let (client, mut server) = rig.pair(&mut listener).await;
    drop(client);
    assert!(
        within(server.receiver.recv()).await.is_none(),
        "server sees the drop"
    );
}

async fn a_client_reconnects_after_the_listener_restarts(kind: TransportKind) {
    let rig = Rig::new(kind);
    let mut listener = rig.listen().await;
    let address = listener.local_addr().to_owned();
    let (client, server) = rig.pair(&mut listener).await;
    drop(server);
    listener.shutdown().await;
    let mut client_rx = client.receiver;
    assert_ends(&mut client_rx).await;

    let mut options = rig.listen.clone();
    options.address = address.clone();
    let mut listener = within(rig.transport.listen(&options))
        .await
        .expect("listen again");
    assert_eq!(listener.local_addr(), address);
    let (client, mut server) = rig.pair(&mut listener).await;
    client.sender.send(&numbered(0, 0)).await.expect("send");
    assert!(within(server.receiver.recv()).await.expect("open").is_ok());
}

async fn mutual_tls_refuses_wrong_and_missing_client_certificates(kind: TransportKind) {
    let rig = Rig::new(kind);
    let mut listener = rig.listen().await;
    let address = listener.local_addr().to_owned();

    let stranger = common::Pki::new("some other CA");
    for (n, identity) in [Some(stranger.client("node-a")), None]
        .into_iter()
        .enumerate()
    {
        let dial = rig.dial_as(&address, identity);
        // TLS 1.3 may let the client finish before the server refuses; then
        // the link dies without carrying anything.
        if let Ok(link) = rig.transport.dial(&dial).await {
            let _ = link.sender.send(&numbered(9, 9)).await;
            let mut rx = link.receiver;
            assert!(
                !matches!(within(rx.recv()).await, Some(Ok(_))),
                "a refused client receives nothing"
            );
        }
        within(listener.wait_rejected(n as u64 + 1)).await;
    }
    // The listener yields only the properly certified node.
    let (_client, server) = rig.pair(&mut listener).await;
    assert_eq!(server.peer.common_name.as_deref(), Some("node-a"));
    assert_eq!(listener.accepted(), 1);
    assert_eq!(listener.rejected(), 2);
}

async fn a_stalled_handshake_holds_up_nobody(kind: TransportKind) {
    // The real client's handshake, under the same limit, must finish in
    // time on a loaded machine too.
    let limits = Limits {
        handshake_timeout: Duration::from_secs(2),
        ..Limits::default()
    };
    let rig = Rig::with_limits(kind, limits);
    let mut listener = rig.listen().await;
    // A peer that connects and then says nothing.
    let silent = match kind {
        TransportKind::UnixSocket => {
            let s = tokio::net::UnixStream::connect(listener.local_addr())
                .await
                .expect("connect");
            Box::new(s) as Box<dyn std::any::Any + Send>
        }
        TransportKind::Quic => {
            let s = tokio::net::UdpSocket::bind("127.0.0.1:0")
                .await
                .expect("udp");
            s.send_to(&[0u8; 1200], listener.local_addr())
                .await
                .expect("send");
            Box::new(s) as Box<dyn std::any::Any + Send>
        }
        TransportKind::WebSocket => {
            let s = tokio::net::TcpStream::connect(listener.local_addr())
                .await
                .expect("connect");
            Box::new(s) as Box<dyn std::any::Any + Send>
        }
    };
    // A real client is served meanwhile.
    let (client, mut server) = rig.pair(&mut listener).await;
    client.sender.send(&numbered(0, 0)).await.expect("send");
    assert!(within(server.receiver.recv()).await.expect("open").is_ok());
    if kind != TransportKind::Quic {
        // The silent one is dropped after the handshake timeout. (A QUIC
        // datagram of zeros is not even an attempt, quinn ignores it.)
        within(listener.wait_rejected(1)).await;
    }
    drop(silent);
}

async fn dialing_a_silent_server_times_out(kind: TransportKind) {
    let limits = Limits {
        handshake_timeout: Duration::from_millis(300),
        connect_timeout: Duration::from_millis(300),
        ..Limits::default()
    };
    let rig = Rig::with_limits(kind, limits);
    // Something that accepts connections and never answers.
    let (address, _guard): (String, Box<dyn std::any::Any + Send>) = match kind {
        TransportKind::Quic => {
            let s = std::net::UdpSocket::bind("127.0.0.1:0").expect("udp");
            (s.local_addr().expect("addr").to_string(), Box::new(s))
        }
        _ => {
            let s = std::net::TcpListener::bind("127.0.0.1:0").expect("tcp");
            (s.local_addr().expect("addr").to_string(), Box::new(s))
        }
    };
    let dial = rig.dial_as(&address, rig.client.as_ref().map(common::clone_identity));
    let result = within(rig.transport.dial(&dial)).await;
    assert!(
        matches!(result, Err(TransportError::Timeout { .. })),
        "{:?}",
        result.err()
    );
}

/// WebSocket links probe their peer with pings and count its pongs (a
/// peer's WebSocket layer answers while it reads); the other transports
/// have no probe, and a ping there changes nothing.
async fn pings_are_answered_where_the_transport_has_them(kind: TransportKind) {
    let rig = Rig::new(kind);
    let mut listener = rig.listen().await;
    let (mut client, mut server) = rig.pair(&mut listener).await;
    let pings = kind == TransportKind::WebSocket;
    assert_eq!(client.sender.can_ping(), pings);
    assert_eq!(server.sender.can_ping(), pings);
    client.sender.ping().expect("ping");
    let request = numbered(0, 1);
    client.sender.send(&request).await.expect("send");
    // The server reads the ping (its pong goes out first), then the request.
    let got = next_message(&mut server.receiver).await;
    server
        .sender
        .send(&got.response(
            "cloud",
            beehive::Content::of(&serde_json::json!("ok")).expect("json body"),
        ))
        .await
        .expect("reply");
    within(client.receiver.recv())
        .await
        .expect("open")
        .expect("reply");
    assert_eq!(client.receiver.pongs(), u64::from(pings));
    assert_eq!(server.receiver.pongs(), 0, "the server sent no ping");
}

/// A sender can tell how much the connection has taken: frames handed to
/// it (`written`) and frames still waiting (`backlog`).
async fn written_and_backlog_count_what_the_connection_took(kind: TransportKind) {
    let rig = Rig::new(kind);
    let mut listener = rig.listen().await;
    let (client, mut server) = rig.pair(&mut listener).await;
    assert_eq!((client.sender.written(), client.sender.backlog()), (0, 0));
    for n in 0..3 {
        client.sender.send(&numbered(0, n)).await.expect("send");
    }
    for _ in 0..3 {
        next_message(&mut server.receiver).await;
    }
    assert_eq!(client.sender.written(), 3);
    assert_eq!(client.sender.backlog(), 0);
}

/// A frame of inner stream `id`: the marker, the id, the sequence number,
/// and `size` bytes in all.
fn stream_frame(id: u64, n: u64, size: usize) -> Bytes {
    let mut frame = vec![transports::RAW_FRAME_MARKER];
    frame.extend_from_slice(&id.to_be_bytes());
    frame.extend_from_slice(&n.to_be_bytes());
    frame.resize(size.max(frame.len()), 0xab);
    Bytes::from(frame)
}

/// The stream id and sequence number of a frame made by [`stream_frame`].
fn stream_frame_of(frame: &Bytes) -> (u64, u64) {
    let number = |at: usize| {
        let bytes: [u8; 8] = frame[at..at + 8].try_into().expect("8 bytes");
        u64::from_be_bytes(bytes)
    };
    (number(1), number(9))
}

/// Frames of three inner streams, sent interleaved with messages from
/// several tasks, all arrive: each stream's in order, every message once,
/// and raw frames are never taken for messages.
async fn inner_streams_keep_their_order(kind: TransportKind) {
    let rig = Rig::new(kind);
    let mut listener = rig.listen().await;
    let (client, mut server) = rig.pair(&mut listener).await;
    const FRAMES: u64 = 200;
    for id in 1..=3u64 {
        let sender = client.sender.clone();
        tokio::spawn(async move {
            for n in 0..FRAMES {
                let frame = stream_frame(id, n, 100 + (n as usize * 37) % 3000);
                sender
                    .send_frame(frame, Lane::Stream(id))
                    .await
                    .expect("stream frame");
            }
        });
    }
    let sender = client.sender.clone();
    tokio::spawn(async move {
        for n in 0..FRAMES {
            sender.send(&numbered(0, n as usize)).await.expect("send");
        }
    });
    let mut next = [0u64; 4];
    let mut messages = 0;
    while messages < FRAMES || next[1..].iter().any(|n| *n < FRAMES) {
        let item = within(server.receiver.recv_item())
            .await
            .expect("link open")
            .expect("a frame");
        match item {
            transports::Received::Message(msg) => {
                assert_eq!(
                    msg.body::<serde_json::Value>().expect("json body")["n"],
                    messages
                );
                messages += 1;
            }
            transports::Received::Raw(frame) => {
                let (id, n) = stream_frame_of(&frame);
                assert_eq!(n, next[id as usize], "stream {id} in order");
                next[id as usize] += 1;
            }
        }
    }
}

/// Messages sent after frames of inner streams were queued are written
/// before the rest of them: a stream never holds the link's messages back.
async fn messages_go_ahead_of_queued_stream_frames(kind: TransportKind) {
    let rig = Rig::new(kind);
    let mut listener = rig.listen().await;
    let (client, mut server) = rig.pair(&mut listener).await;
    const FRAMES: u64 = 64;
    // Queued without yielding: on this test's one thread, the writer
    // finds all of them, the message last, when it next runs.
    for n in 0..FRAMES {
        client
            .sender
            .try_send_frame(stream_frame(7, n, 16 * 1024), Lane::Stream(7))
            .expect("queued");
    }
    client
        .sender
        .try_send(&numbered(0, 0), Lane::Ordered)
        .expect("queued");
    let mut frames_before = 0;
    loop {
        match within(server.receiver.recv_item())
            .await
            .expect("open")
            .expect("frame")
        {
            transports::Received::Message(_) => break,
            transports::Received::Raw(_) => frames_before += 1,
        }
    }
    assert!(
        frames_before < FRAMES,
        "the message came after every stream frame"
    );
    if kind != TransportKind::Quic {
        // One ordered byte stream: the writer took the message first.
        assert_eq!(frames_before, 0);
    }
}

macro_rules! conformance {
    ($module:ident, $kind:expr, [$($test:ident),* $(,)?]) => {
        mod $module {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $test() {
                    super::$test($kind).await;
                }
            )*
        }
    };
}

/// Cases that need the writer and the test on one thread.
macro_rules! on_one_thread {
    ($module:ident, $kind:expr, [$($test:ident),* $(,)?]) => {
        mod $module {
            $(
                #[tokio::test(flavor = "current_thread")]
                async fn $test() {
                    super::$test($kind).await;
                }
            )*
        }
    };
}

on_one_thread!(
    ws_one_thread,
    transports::TransportKind::WebSocket,
    [messages_go_ahead_of_queued_stream_frames]
);
on_one_thread!(
    quic_one_thread,
    transports::TransportKind::Quic,
    [messages_go_ahead_of_queued_stream_frames]
);
on_one_thread!(
    uds_one_thread,
    transports::TransportKind::UnixSocket,
    [messages_go_ahead_of_queued_stream_frames]
);

conformance!(
    ws,
    transports::TransportKind::WebSocket,
    [
        round_trip,
        order_within_the_ordered_stream,
        concurrent_messages_arrive_exactly_once,
        frame_limit,
        a_garbled_frame_closes_only_its_connection,
        close_by_either_side_is_noticed,
        a_client_reconnects_after_the_listener_restarts,
        mutual_tls_refuses_wrong_and_missing_client_certificates,
        a_stalled_handshake_holds_up_nobody,
        dialing_a_silent_server_times_out,
        pings_are_answered_where_the_transport_has_them,
        written_and_backlog_count_what_the_connection_took,
        inner_streams_keep_their_order,
    ]
);

conformance!(
    quic,
    transports::TransportKind::Quic,
    [
        round_trip,
        order_within_the_ordered_stream,
        concurrent_messages_arrive_exactly_once,
        frame_limit,
        a_garbled_frame_closes_only_its_connection,
        close_by_either_side_is_noticed,
        a_client_reconnects_after_the_listener_restarts,
        mutual_tls_refuses_wrong_and_missing_client_certificates,
        a_stalled_handshake_holds_up_nobody,
        dialing_a_silent_server_times_out,
        pings_are_answered_where_the_transport_has_them,
        written_and_backlog_count_what_the_connection_took,
        inner_streams_keep_their_order,
    ]
);

// UDS has no TLS (file permissions guard it) and its dial completes
// without a server handshake, so the TLS and dial-timeout cases do not apply.
conformance!(
    uds,
    transports::TransportKind::UnixSocket,
    [
        round_trip,
        order_within_the_ordered_stream,
        concurrent_messages_arrive_exactly_once,
        frame_limit,
        a_garbled_frame_closes_only_its_connection,
        close_by_either_side_is_noticed,
        a_client_reconnects_after_the_listener_restarts,
        a_stalled_handshake_holds_up_nobody,
        pings_are_answered_where_the_transport_has_them,
        written_and_backlog_count_what_the_connection_took,
        inner_streams_keep_their_order,
    ]
);

/// Over QUIC a large message on its own stream does not hold back the
/// small ordered messages sent after it, and more independent messages
/// than may be open at once all arrive (the sender waits for streams).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quic_a_large_independent_message_holds_back_no_ordered_one() {
    let rig = Rig::new(TransportKind::Quic);
    let mut listener = rig.listen().await;
    let (client, mut server) = rig.pair(&mut listener).await;
    let large = sized(8 * 1024 * 1024);
    client
        .sender
        .send_on(&large, Lane::Independent)
        .await
        .expect("send large");
    for n in 0..20 {
        client
            .sender
            .send(&numbered(0, n))
            .await
            .expect("send small");
    }
    // The large one needs several flow-control windows of its stream, the
    // small ones were sent right after it: they do not wait for it.
    let (mut before_large, mut small, mut large_seen) = (0, 0, false);
    while small < 20 || !large_seen {
        let msg = next_message(&mut server.receiver).await;
        if msg.id() == large.id() {
            large_seen = true;
        } else {
            small += 1;
            if !large_seen {
                before_large += 1;
            }
        }
    }
    assert!(
        before_large > 0,
        "the small messages waited for the large one"
    );

    // Twice as many independent messages as may be open at once.
    for n in 0..32 {
        client
            .sender
            .send_on(&numbered(1, n), Lane::Independent)
            .await
            .expect("send");
    }
    let seen = receive_distinct(&mut server.receiver, 32).await;
    assert_eq!(seen.len(), 32);
}

/// One QUIC transport dials an IPv4 peer and then an IPv6 one: its dials
/// share an endpoint per address family, not the first one it bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quic_dials_both_address_families() {
    let rig = Rig::new(TransportKind::Quic);
    let mut v4 = rig.listen().await;
    let mut v6_options = rig.listen.clone();
    v6_options.address = "[::1]:0".into();
    let Ok(mut v6) = rig.transport.listen(&v6_options).await else {
        eprintln!("no IPv6 loopback here; skipped");
        return;
    };
    for listener in [&mut v4, &mut v6] {
        let client = rig.dial(listener).await;
        let mut server = within(listener.accept()).await.expect("accepted");
        client.sender.send(&numbered(0, 1)).await.expect("send");
        let got = next_message(&mut server.receiver).await;
        assert_eq!(got.body::<serde_json::Value>().expect("json body")["n"], 1);
    }
}

/// A WebSocket upgrade carries the dialer's headers to the accepting side
/// (KubeEdge's edges name themselves there), over mutual TLS.
#[tokio::test]
async fn websocket_upgrade_headers_reach_the_accepting_side() {
    let rig = Rig::new(TransportKind::WebSocket);
    let mut listener = rig.listen().await;
    let dial = rig
        .dial_options(&listener)
        .with_header("node_id", "edge-7")
        .with_header("project_id", "e632aba927ea4ac2b575ec1603d56f10")
        .with_header("ConnectionUse", "msg");
    let _client = rig.transport.dial(&dial).await.expect("dial");
    let server = within(listener.accept()).await.expect("accepted link");
    let header = |name: &str| {
        server
            .peer
            .headers
            .iter()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.as_str())
    };
    assert_eq!(header("node_id"), Some("edge-7"));
    assert_eq!(
        header("project_id"),
        Some("e632aba927ea4ac2b575ec1603d56f10")
    );
    assert_eq!(header("connectionuse"), Some("msg"), "names are lower-case");
    assert_eq!(server.peer.common_name.as_deref(), Some("node-a"));
    // A header that cannot be sent is a clear error, not a panic.
    let bad = rig.dial_options(&listener).with_header("bad name", "x");
    assert!(rig.transport.dial(&bad).await.is_err());
}

/// A WebSocket link can carry KubeEdge's JSON instead of MessagePack: a
/// message crosses in KubeEdge's shape, and a frame that is not a KubeEdge
/// message closes that link with a clear error. QUIC and Unix sockets
/// refuse the codec.
#[tokio::test]
async fn websocket_links_carry_kubeedge_json() {
    use transports::Codec;
    let mut rig = Rig::new(TransportKind::WebSocket);
    rig.listen = rig.listen.clone().with_codec(Codec::KubeEdgeJson);
    let mut listener = rig.listen().await;
    // At KubeEdge's path, which a KubeEdge endpoint takes as any other;
    // an edgehive endpoint takes only its own.
    let dial = rig
        .dial_options(&listener)
        .with_codec(Codec::KubeEdgeJson)
        .with_path("/e632aba927ea4ac2b575ec1603d56f10/edge-7/events");
    let client = rig.transport.dial(&dial).await.expect("dial");
    let mut server = within(listener.accept()).await.expect("accepted link");
    let native = Rig::new(TransportKind::WebSocket);
    let native_listener = native.listen().await;
    let elsewhere = native
        .dial_options(&native_listener)
        .with_path("/e632aba927ea4ac2b575ec1603d56f10/edge-7/events");
    assert!(native.transport.dial(&elsewhere).await.is_err());
    let sent = numbered(0, 1);
    client.sender.send(&sent).await.expect("send");
    let got = within(server.receiver.recv())
        .await
        .expect("a message")
        .expect("decodes");
    assert_eq!(got.id(), sent.id());
    assert_eq!(got.content(), sent.content());
    // What went over the wire is KubeEdge's JSON.
    let frame = transports::Codec::KubeEdgeJson
        .encode(&sent, 1 << 20)
        .expect("encodes");
    let json: serde_json::Value = serde_json::from_slice(&frame).expect("JSON");
    assert_eq!(json["header"]["msg_id"], sent.id().to_string());
    client
        .sender
        .try_send_frame(Bytes::from_static(b"{not json"), Lane::Ordered)
        .expect("queued");
    let refused = within(server.receiver.recv()).await.expect("an answer");
    assert!(
        refused
            .as_ref()
            .is_err_and(|e| e.to_string().contains("not a valid message")),
        "{refused:?}"
    );
    assert_ends(&mut server.receiver).await;

    let quic = Rig::new(TransportKind::Quic);
    let refused = quic
        .transport
        .listen(&quic.listen.clone().with_codec(Codec::KubeEdgeJson))
        .await;
    assert!(refused.is_err());
}

/// KubeEdge's edges write their JSON with gorilla's `WriteJSON`: text
/// WebSocket messages. A KubeEdge endpoint takes them from a plain
/// WebSocket client at KubeEdge's path, and answers in text too.
#[tokio::test]
async fn a_kubeedge_endpoint_takes_and_sends_text_messages() {
    use futures_util::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::Message as WsMessage;
    use transports::{Codec, ListenOptions};
    let transport = TransportKind::WebSocket.transport().expect("ws");
    let mut options = ListenOptions::new("127.0.0.1:0").with_codec(Codec::KubeEdgeJson);
    options.allow_plaintext = true;
    let mut listener = transport.listen(&options).await.expect("listen");
    let url = format!(
        "ws://{}/e632aba927ea4ac2b575ec1603d56f10/edge-7/events",
        listener.local_addr()
    );
    let tcp = tokio::net::TcpStream::connect(listener.local_addr())
        .await
        .expect("connect");
    let (mut client, _) = tokio_tungstenite::client_async(url, tcp)
        .await
        .expect("upgrade");
    let mut server = within(listener.accept()).await.expect("accepted link");
    let keepalive = r#"{"header":{"msg_id":"00000000-0000-4000-8000-000000000001","timestamp":1},"route":{"source":"websocket","group":"resource","operation":"keepalive","resource":"node"},"content":"ping"}"#;
    // A Go zero message (what an edgecore shutting down writes) is passed
    // over: the link goes on to the next message.
    let zero = r#"{"header":{"msg_id":"","parent_msg_id":"","timestamp":0,"sync":false},"route":{"source":"","group":"","operation":"","resource":""},"content":null}"#;
    client.send(WsMessage::text(zero)).await.expect("sent");
    client.send(WsMessage::text(keepalive)).await.expect("sent");
    let got = within(server.receiver.recv())
        .await
        .expect("a message")
        .expect("decodes");
    assert_eq!(got.operation(), "keepalive");
    assert_eq!(
        got.body::<serde_json::Value>().expect("json body"),
        serde_json::json!("ping")
    );
    server.sender.send(&got).await.expect("sent back");
    match within(client.next()).await {
        Some(Ok(WsMessage::Text(text))) => {
            let json: serde_json::Value = serde_json::from_str(&text).expect("JSON");
            assert_eq!(json["route"]["operation"], "keepalive");
        }
        other => panic!("expected a text message, got {other:?}"),
    }
    // Newer KubeEdge edges ping and reconnect without a pong. The pong goes
    // out while the link is read, as a hub session always reads it.
    tokio::spawn(async move { while server.receiver.recv().await.is_some() {} });
    client
        .send(WsMessage::Ping(Bytes::from_static(b"alive?")))
        .await
        .expect("ping");
    match within(client.next()).await {
        Some(Ok(WsMessage::Pong(payload))) => assert_eq!(&payload[..], b"alive?"),
        other => panic!("expected a pong, got {other:?}"),
    }
}

/// A peer that never said it reads batches (an older edgehive) is sent
/// every message alone, however many wait together.
#[tokio::test]
async fn a_peer_that_does_not_read_batches_gets_none() {
    use futures_util::StreamExt;
    use tokio_tungstenite::tungstenite::Message as WsMessage;
    use transports::ListenOptions;
    let transport = TransportKind::WebSocket.transport().expect("ws");
    let mut options = ListenOptions::new("127.0.0.1:0");
    options.allow_plaintext = true;
    let mut listener = transport.listen(&options).await.expect("listen");
    let url = format!("ws://{}/edgehive", listener.local_addr());
    let tcp = tokio::net::TcpStream::connect(listener.local_addr())
        .await
        .expect("connect");
    let (mut client, response) = tokio_tungstenite::client_async(url, tcp)
        .await
        .expect("upgrade");
    assert!(!response.headers().contains_key("x-edgehive-batch"));
    let server = within(listener.accept()).await.expect("accepted link");
    for n in 0..50 {
        server
            .sender
            .try_send(&numbered(0, n), Lane::Ordered)
            .expect("queued");
    }
    for n in 0..50 {
        match within(client.next()).await {
            Some(Ok(WsMessage::Binary(frame))) => {
                assert_ne!(frame.first(), Some(&0xc1), "message {n} came in a batch");
                let msg = beehive::Message::from_bytes(&frame).expect("one message");
                assert_eq!(msg.body::<serde_json::Value>().expect("json body")["n"], n);
            }
            other => panic!("expected message {n}, got {other:?}"),
        }
    }
}
