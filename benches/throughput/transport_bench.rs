//! `transport` scenarios: one connection per transport, 256 B and 64 KiB
//! messages one way (msgs/s, MB/s) and round trips (p50/p99), each against
//! a raw length-prefixed socket of the same family carrying the same bytes
//! (TCP for ws and quic, Unix for uds). WebSocket and QUIC run with mutual
//! TLS, as in production; the raw baseline has no TLS.
//!
//! The machines are shared and noisy, so every one-way figure is the median
//! of several runs, each transport run next to its baseline's. Beside the
//! raw socket, ws and quic also get their protocol's own ceiling in the
//! same run, built from the libraries the transports use: TLS over TCP
//! (tokio-rustls) for ws, a bare quinn stream for quic. The distance to the
//! ceiling is what edgehive's own layers cost; the rest is TLS's or QUIC's.

use std::time::{Duration, Instant};

use std::sync::Arc;

use anyhow::{Context as _, Result, anyhow};
use beehive::Message;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader, BufWriter};
use tokio_rustls::rustls;
use transports::tls::{self, DevPki};
use transports::{DialOptions, Lane, Link, ListenOptions, Listener, Transport, TransportKind};

use crate::Scale;
use crate::report::{Report, median, quantile_us};

/// The message sizes measured.
const SIZES: [(usize, &str); 2] = [(256, "256B"), (64 * 1024, "64KiB")];

/// A message whose encoded frame is `size` bytes (near enough).
fn message_of(size: usize) -> Message {
    let empty = Message::new()
        .with_content(beehive::Content::of(&serde_json::json!("")).expect("json body"));
    let overhead = empty.to_bytes().map(|b| b.len()).unwrap_or(0) + 4;
    Message::new().with_content(
        beehive::Content::of(&serde_json::json!(
            "x".repeat(size.saturating_sub(overhead))
        ))
        .expect("json body"),
    )
}

struct Pair {
    client: Link,
    server: Link,
    _listener: Listener,
}

/// Both sides' mutual-TLS configurations, made once per run.
#[derive(Clone)]
struct TlsPair {
    server: Arc<rustls::ServerConfig>,
    client: Arc<rustls::ClientConfig>,
}

impl TlsPair {
    fn new(pki: &DevPki) -> Result<TlsPair> {
        let (chain, key) = pki.server("cloud")?;
        Ok(TlsPair {
            server: tls::server_config(chain, key, Some(&[pki.root()]))?,
            client: tls::client_config(&[pki.root()], Some(pki.client("bench-node")?))?,
        })
    }
}

async fn connect(
    kind: TransportKind,
    tls: Option<&TlsPair>,
    socket_dir: &std::path::Path,
) -> Result<Pair> {
    let transport: Box<dyn Transport> = kind.transport()?;
    let address = match kind {
        TransportKind::UnixSocket => socket_dir
            .join(format!("bench-{}.sock", std::process::id()))
            .to_string_lossy()
            .into_owned(),
        _ => "127.0.0.1:0".to_owned(),
    };
    let tls = tls.filter(|_| kind != TransportKind::UnixSocket);
    let tls_on = tls.is_some();
    let mut listen = ListenOptions::new(address);
    listen.tls = tls.map(|tls| tls.server.clone());
    listen.allow_plaintext = !tls_on;
    let mut listener = transport.listen(&listen).await?;
    let mut dial = DialOptions::new(listener.local_addr(), "localhost");
    dial.tls = tls.map(|tls| tls.client.clone());
    dial.allow_plaintext = !tls_on;
    let client = transport.dial(&dial).await?;
    let server = listener
        .accept()
        .await
        .ok_or_else(|| anyhow!("listener stopped"))?;
    Ok(Pair {
        client,
        server,
        _listener: listener,
    })
}

/// What one way carries: frames as they are, or messages through the codec.
#[derive(Clone, Copy, PartialEq)]
enum Carry {
    Frames,
    Messages,
}

/// One way through the transport: time for `n` frames or messages.
async fn transport_one_way(
    pair: &mut Pair,
    msg: &Message,
    n: usize,
    carry: Carry,
) -> Result<Duration> {
    let sender = pair.client.sender.clone();
    let msg = msg.clone();
    let frame = bytes::Bytes::from(msg.to_bytes()?);
    let start = Instant::now();
    let sending = tokio::spawn(async move {
        for _ in 0..n {
            match carry {
                Carry::Frames => sender.send_frame(frame.clone(), Lane::Ordered).await?,
                Carry::Messages => sender.send(&msg).await?,
            }
        }
        Ok::<_, transports::TransportError>(())
    });
    let receiver = &mut pair.server.receiver;
    for _ in 0..n {
        match carry {
            Carry::Frames => drop(
                receiver
                    .recv_frame()
                    .await
                    .ok_or_else(|| anyhow!("link closed"))??,
            ),
            Carry::Messages => drop(
                receiver
                    .recv()
                    .await
                    .ok_or_else(|| anyhow!("link closed"))??,
            ),
        }
    }
    let elapsed = start.elapsed();
    sending.await??;
    Ok(elapsed)
}

/// Round trips through the transport, sorted nanoseconds.
async fn transport_round_trips(pair: &mut Pair, msg: &Message, n: usize) -> Result<Vec<u64>> {
    let echo_sender = pair.server.sender.clone();
    let mut times = Vec::with_capacity(n);
    for _ in 0..n {
        let start = Instant::now();
        pair.client.sender.send(msg).await?;
        let got = pair
            .server
            .receiver
            .recv()
            .await
            .ok_or_else(|| anyhow!("closed"))??;
        echo_sender.send(&got).await?;
        pair.client
            .receiver
            .recv()
            .await
            .ok_or_else(|| anyhow!("closed"))??;
        times.push(start.elapsed().as_nanos() as u64);
    }
    times.sort_unstable();
    Ok(times)
}

async fn raw_write<W: AsyncWrite + Unpin>(w: &mut W, frame: &[u8]) -> std::io::Result<()> {
    w.write_all(&(frame.len() as u32).to_be_bytes()).await?;
    w.write_all(frame).await
}

async fn raw_read<R: AsyncRead + Unpin>(r: &mut R, buf: &mut Vec<u8>) -> std::io::Result<()> {
    let mut len = [0u8; 4];
    r.read_exact(&mut len).await?;
    buf.resize(u32::from_be_bytes(len) as usize, 0);
    r.read_exact(buf).await?;
    Ok(())
}

/// A connected raw socket pair of the baseline's family.
async fn raw_pair(
    kind: TransportKind,
    socket_dir: &std::path::Path,
) -> Result<(Box<dyn RawStream>, Box<dyn RawStream>)> {
    if kind == TransportKind::UnixSocket {
        let path = socket_dir.join(format!("raw-{}.sock", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let listener = tokio::net::UnixListener::bind(&path)?;
        let client = tokio::net::UnixStream::connect(&path).await?;
        let (server, _) = listener.accept().await?;
        Ok((Box::new(client), Box::new(server)))
    } else {
        let (client, server) = tcp_pair().await?;
        Ok((Box::new(client), Box::new(server)))
    }
}

/// A connected loopback TCP pair, Nagle off on both ends.
async fn tcp_pair() -> Result<(tokio::net::TcpStream, tokio::net::TcpStream)> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let client = tokio::net::TcpStream::connect(listener.local_addr()?).await?;
    let (server, _) = listener.accept().await?;
    client.set_nodelay(true)?;
    server.set_nodelay(true)?;
    Ok((client, server))
}

trait RawStream: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> RawStream for T {}

async fn raw_one_way(
    kind: TransportKind,
    dir: &std::path::Path,
    frame: &[u8],
    n: usize,
) -> Result<Duration> {
    let (client, server) = raw_pair(kind, dir).await?;
    stream_one_way(client, server, frame, n).await
}

/// Length-prefixed frames one way over a connected stream pair, buffered
/// as a careful hand-written sender and receiver would.
async fn stream_one_way(
    client: Box<dyn RawStream>,
    server: Box<dyn RawStream>,
    frame: &[u8],
    n: usize,
) -> Result<Duration> {
    let frame = frame.to_vec();
    let start = Instant::now();
    let writer = tokio::spawn(async move {
        let mut w = BufWriter::with_capacity(64 * 1024, client);
        for _ in 0..n {
            raw_write(&mut w, &frame).await?;
        }
        w.flush().await?;
        Ok::<_, std::io::Error>(w)
    });
    let mut r = BufReader::with_capacity(64 * 1024, server);
    let mut buf = Vec::new();
    for _ in 0..n {
        raw_read(&mut r, &mut buf).await?;
    }
    let elapsed = start.elapsed();
    drop(writer.await??);
    Ok(elapsed)
}

/// A protocol's own ceiling: the library a transport is built on, used
/// directly, carrying the same length-prefixed frames.
#[derive(Clone, Copy)]
enum Ceiling {
    /// TLS 1.3 with mutual authentication over TCP (tokio-rustls).
    TlsOverTcp,
    /// One bidirectional quinn stream of a mutually authenticated connection.
    BareQuinn,
}

impl Ceiling {
    fn of(kind: TransportKind, tls_on: bool) -> Option<Ceiling> {
        match kind {
            TransportKind::WebSocket if tls_on => Some(Ceiling::TlsOverTcp),
            TransportKind::Quic => Some(Ceiling::BareQuinn),
            _ => None,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Ceiling::TlsOverTcp => "raw tls over tcp",
            Ceiling::BareQuinn => "bare quinn stream",
        }
    }

    fn metric(self) -> &'static str {
        match self {
            Ceiling::TlsOverTcp => "one_way_vs_tls",
            Ceiling::BareQuinn => "one_way_vs_quinn",
        }
    }

    async fn one_way(self, tls: &TlsPair, frame: &[u8], n: usize) -> Result<Duration> {
        match self {
            Ceiling::TlsOverTcp => {
                let (client, server) = tls_pair(tls).await?;
                stream_one_way(client, server, frame, n).await
            }
            Ceiling::BareQuinn => {
                let (client, server, endpoints) = quinn_pair(tls).await?;
                let elapsed = stream_one_way(client, server, frame, n).await?;
                for endpoint in endpoints {
                    endpoint.close(0u32.into(), b"done");
                }
                Ok(elapsed)
            }
        }
    }
}

/// A TCP connection under mutual TLS, as a raw stream pair.
async fn tls_pair(tls: &TlsPair) -> Result<(Box<dyn RawStream>, Box<dyn RawStream>)> {
    let (client, server) = tcp_pair().await?;
    let connector = tokio_rustls::TlsConnector::from(tls.client.clone());
    let acceptor = tokio_rustls::TlsAcceptor::from(tls.server.clone());
    let name = rustls::pki_types::ServerName::try_from("localhost")?;
    let (client, server) =
        tokio::try_join!(connector.connect(name, client), acceptor.accept(server))?;
    Ok((Box::new(client), Box::new(server)))
}

/// A quinn connection's bidirectional stream, as a raw stream pair (and
/// the endpoints, to close afterwards).
async fn quinn_pair(
    tls: &TlsPair,
) -> Result<(Box<dyn RawStream>, Box<dyn RawStream>, [quinn::Endpoint; 2])> {
    use quinn::crypto::rustls::{QuicClientConfig, QuicServerConfig};
    const ALPN: &[u8] = b"bench";
    let mut server_tls = (*tls.server).clone();
    server_tls.alpn_protocols = vec![ALPN.to_vec()];
    let mut client_tls = (*tls.client).clone();
    client_tls.alpn_protocols = vec![ALPN.to_vec()];
    let server_config =
        quinn::ServerConfig::with_crypto(Arc::new(QuicServerConfig::try_from(server_tls)?));
    let server = quinn::Endpoint::server(server_config, "127.0.0.1:0".parse()?)?;
    let address = server.local_addr()?;
    let client = quinn::Endpoint::client("127.0.0.1:0".parse()?)?;
    let client_config = quinn::ClientConfig::new(Arc::new(QuicClientConfig::try_from(client_tls)?));
    let (dialed, accepted) = tokio::try_join!(
        async {
            let connection = client
                .connect_with(client_config, address, "localhost")?
                .await?;
            let (mut send, recv) = connection.open_bi().await?;
            // A stream is announced to the peer by its first bytes.
            send.write_all(b"!").await?;
            Ok::<_, anyhow::Error>(tokio::io::join(recv, send))
        },
        async {
            let incoming = server
                .accept()
                .await
                .ok_or_else(|| anyhow!("no connection"))?;
            let connection = incoming.await?;
            let (send, mut recv) = connection.accept_bi().await?;
            let mut hello = [0u8; 1];
            recv.read_exact(&mut hello).await?;
            Ok::<_, anyhow::Error>(tokio::io::join(recv, send))
        }
    )?;
    Ok((Box::new(dialed), Box::new(accepted), [client, server]))
}

async fn raw_round_trips(
    kind: TransportKind,
    dir: &std::path::Path,
    frame: &[u8],
    n: usize,
) -> Result<Vec<u64>> {
    let (mut client, mut server) = raw_pair(kind, dir).await?;
    let echo = tokio::spawn(async move {
        let mut buf = Vec::new();
        for _ in 0..n {
            raw_read(&mut server, &mut buf).await?;
            raw_write(&mut server, &buf).await?;
        }
        Ok::<_, std::io::Error>(())
    });
    let mut buf = Vec::new();
    let mut times = Vec::with_capacity(n);
    for _ in 0..n {
        let start = Instant::now();
        raw_write(&mut client, frame).await?;
        raw_read(&mut client, &mut buf).await?;
        times.push(start.elapsed().as_nanos() as u64);
    }
    echo.await??;
    times.sort_unstable();
    Ok(times)
}

/// One-way runs per figure; the median is reported.
fn one_way_runs(scale: Scale) -> usize {
    if scale.runs > 1 { 5 } else { 1 }
}

/// Runs the transport scenarios for `kinds` and adds their rows.
pub fn run(scale: Scale, kinds: &[TransportKind], report: &mut Report) -> Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let dir = std::env::temp_dir();
    runtime.block_on(async {
        let tls = TlsPair::new(&DevPki::new("edgehive bench CA")?)?;
        // WebSocket also without TLS, to show what TLS costs.
        let mut variants = Vec::new();
        for &kind in kinds {
            variants.push((kind, kind != TransportKind::UnixSocket, kind.to_string()));
            if kind == TransportKind::WebSocket {
                variants.push((kind, false, "ws-plain".to_owned()));
            }
        }
        for (kind, tls_on, name) in variants {
            let baseline = if kind == TransportKind::UnixSocket {
                "raw unix socket"
            } else {
                "raw tcp socket"
            };
            let ceiling = Ceiling::of(kind, tls_on);
            for (size, label) in SIZES {
                let msg = message_of(size);
                let frame = msg.to_bytes()?;
                // About 256 MB of 64 KiB frames, a million of 256 B.
                let n = (scale.messages * 256 / size).clamp(50, 1_000_000);
                let decoded_n = (n / 4).max(50);
                let rt =
                    (scale.round_trips / 10).clamp(100, 20_000) / if size > 1024 { 10 } else { 1 };
                let scenario = format!("transport/{name}/{label}");

                let mut pair = connect(kind, Some(&tls).filter(|_| tls_on), &dir)
                    .await
                    .with_context(|| format!("{name} link"))?;
                transport_one_way(&mut pair, &msg, n / 10 + 1, Carry::Frames).await?; // warm-up
                let rate = |n: usize, d: Duration| n as f64 / d.as_secs_f64();
                let (mut frames, mut messages, mut raw, mut ceilings) =
                    (Vec::new(), Vec::new(), Vec::new(), Vec::new());
                for _ in 0..one_way_runs(scale) {
                    let took = transport_one_way(&mut pair, &msg, n, Carry::Frames).await?;
                    frames.push(rate(n, took));
                    let took =
                        transport_one_way(&mut pair, &msg, decoded_n, Carry::Messages).await?;
                    messages.push(rate(decoded_n, took));
                    raw.push(rate(n, raw_one_way(kind, &dir, &frame, n).await?));
                    if let Some(ceiling) = ceiling {
                        let took = ceiling.one_way(&tls, &frame, n).await?;
                        ceilings.push(rate(n, took));
                    }
                }
                let (frames, messages, raw) = (median(frames), median(messages), median(raw));
                let mb = |rate: f64| rate * frame.len() as f64 / 1e6;
                report.with_baseline(&scenario, "one_way", frames, "msgs/s", raw, baseline);
                report.with_baseline(
                    &scenario,
                    "one_way_bytes",
                    mb(frames),
                    "MB/s",
                    mb(raw),
                    baseline,
                );
                report.with_baseline(
                    &scenario,
                    "one_way_decoded",
                    messages,
                    "msgs/s",
                    raw,
                    baseline,
                );
                if let Some(ceiling) = ceiling {
                    report.with_baseline(
                        &scenario,
                        ceiling.metric(),
                        mb(frames),
                        "MB/s",
                        mb(median(ceilings)),
                        ceiling.name(),
                    );
                }

                let ours = transport_round_trips(&mut pair, &msg, rt).await?;
                let raw = raw_round_trips(kind, &dir, &frame, rt).await?;
                report.with_baseline(
                    &scenario,
                    "rtt_p50",
                    quantile_us(&ours, 0.5),
                    "us",
                    quantile_us(&raw, 0.5),
                    baseline,
                );
                report.with_baseline(
                    &scenario,
                    "rtt_p99",
                    quantile_us(&ours, 0.99),
                    "us",
                    quantile_us(&raw, 0.99),
                    baseline,
                );
                pair.client.sender.close().await;
            }
        }
        Ok(())
    })
}

/// The raw one-way rate (frames/s) of the baseline socket family, for other
/// scenarios that compare against it.
pub async fn raw_one_way_rate(
    kind: TransportKind,
    dir: &std::path::Path,
    frame: &[u8],
    n: usize,
) -> Result<f64> {
    let elapsed = raw_one_way(kind, dir, frame, n).await?;
    Ok(n as f64 / elapsed.as_secs_f64())
}
