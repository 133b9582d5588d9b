//! Streams inside a real node link, through cloudhub and edgehub (with a
//! real metamanager on redb), over every transport: many streams at once,
//! some drained, some stalled, while objects go down; and a link cut that
//! ends every stream on both sides.
#![cfg(all(feature = "cloudhub", feature = "edgehub"))]

mod common;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{World, await_applied, edge_config, get, pod, start_cloud, start_edge};
use stream::{Chunk, PendingStream, StreamError, StreamHandler};
use tokio::sync::mpsc;
use transports::TransportKind;

const KEEPALIVE: Duration = Duration::from_secs(5);
const OPEN: Duration = Duration::from_secs(20);

/// Serves every stream as a chatty log: 32 KiB chunks on channel 1 until
/// the stream ends; tells `ends` how each stream ended.
struct Firehose {
    ends: mpsc::UnboundedSender<StreamError>,
}

impl StreamHandler for Firehose {
    fn open(&self, _request: Bytes, stream: PendingStream) {
        let Ok(mut stream) = stream.accept() else {
            return;
        };
        let ends = self.ends.clone();
        tokio::spawn(async move {
            let writer = stream.writer();
            let chunk = Bytes::from(vec![b'x'; 32 * 1024]);
            let written = async {
                loop {
                    writer.send(1, chunk.clone()).await?;
                }
            };
            let ended: Result<(), StreamError> = tokio::select! {
                err = written => err,
                // The cloud closing it, or the link's end, shows here.
                end = async {
                    loop {
                        match stream.recv().await {
                            Some(Ok(_)) => continue,
                            Some(Err(err)) => return Err(err),
                            None => return Ok(()),
                        }
                    }
                } => end,
            };
            if let Err(err) = ended {
                let _ = ends.send(err);
            }
        });
    }
}

/// Waits until the cloud has opened `sessions` sessions (the last one's
/// streams may be opened).
async fn linked(cloud: &common::Cloud, sessions: u64) {
    let stats = cloud.handle.stats.clone();
    assert!(
        stats
            .changes
            .wait_for(OPEN, || get(&stats.sessions_opened) >= sessions)
            .await,
        "session {sessions} never opened"
    );
}

/// Sends `version` of `pods` pods and waits until the edge applied them
/// all: how long that took.
async fn deliver(
    cloud: &common::Cloud,
    edge: &mut common::Edge,
    pods: usize,
    version: u64,
) -> Duration {
    let started = Instant::now();
    for p in 0..pods {
        cloud
            .hive
            .send("cloudhub", pod("n1", &format!("p{p}"), version))
            .await
            .expect("send");
    }
    let finals: HashMap<String, u64> = (0..pods)
        .map(|p| (format!("default/pod/p{p}"), version))
        .collect();
    await_applied(&mut edge.applied, &finals).await;
    started.elapsed()
}

async fn twenty_streams_do_not_hold_objects_back(kind: TransportKind) {
    const PODS: usize = 1_000;
    let world = World::new(kind);
    let cloud = start_cloud(&world, &world.any_address(), None, KEEPALIVE).await;
    let (ends, _) = mpsc::unbounded_channel();
    let mut config = edge_config(&world, "n1", Some("n1"), &cloud.address, KEEPALIVE);
    config.streams = Some(Arc::new(Firehose { ends }));
    let mut edge = start_edge(config, &world.path("edge.redb"));
    linked(&cloud, 1).await;
    // The same objects without streams first: the baseline.
    let alone = deliver(&cloud, &mut edge, PODS, 1).await;

    // 20 streams: ten drained as fast as they come, ten never read.
    let read = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut drained = Vec::new();
    let mut stalled = Vec::new();
    for n in 0..20 {
        let mut stream = cloud
            .handle
            .streams
            .open("n1", Bytes::from(format!("log {n}")), OPEN)
            .await
            .expect("opened");
        match n % 2 {
            0 => {
                let read = read.clone();
                drained.push(tokio::spawn(async move {
                    while let Some(Ok(Chunk::Data(_, chunk))) = stream.recv().await {
                        read.fetch_add(chunk.len(), std::sync::atomic::Ordering::Relaxed);
                    }
                }))
            }
            _ => stalled.push(stream),
        }
    }
    assert_eq!(cloud.handle.streams.open_streams(), 20);
    let with_streams = deliver(&cloud, &mut edge, PODS, 2).await;
    let drained_bytes = read.load(std::sync::atomic::Ordering::Relaxed);
    for reader in drained {
        reader.abort();
    }
    drop(stalled);
    println!(
        "{kind:?}: {PODS} objects delivered in {alone:?} alone, {with_streams:?} beside 20 streams \
         (10 drained: {} MiB read, 10 stalled)",
        drained_bytes / (1024 * 1024)
    );
    assert!(drained_bytes > 0, "the drained streams carried bytes");
    // The stated bound: beside the streams, delivery takes at most five
    // times as long as alone, plus two seconds for a loaded machine.
    // Without the link's priority for messages it grows with the bytes
    // the streams push (gigabytes on loopback).
    assert!(
        with_streams <= alone * 5 + Duration::from_secs(2),
        "{with_streams:?} beside streams, {alone:?} alone"
    );
}

async fn a_link_cut_ends_its_streams_on_both_sides(kind: TransportKind) {
    let world = World::new(kind);
    let cloud = start_cloud(&world, &world.any_address(), None, KEEPALIVE).await;
    let (ends, mut ended) = mpsc::unbounded_channel();
    let mut config = edge_config(&world, "n1", Some("n1"), &cloud.address, KEEPALIVE);
    config.streams = Some(Arc::new(Firehose { ends }));
    let edge = start_edge(config, &world.path("edge.redb"));
    linked(&cloud, 1).await;
    let mut streams = Vec::new();
    for n in 0..5 {
        let stream = cloud
            .handle
            .streams
            .open("n1", Bytes::from(format!("log {n}")), OPEN)
            .await
            .expect("opened");
        streams.push(stream);
    }
    edge.handle.cut_link();
    for stream in &mut streams {
        let end = loop {
            match tokio::time::timeout(OPEN, stream.recv())
                .await
                .expect("no hang")
            {
                Some(Ok(_)) => continue,
                other => break other,
            }
        };
        assert_eq!(end, Some(Err(StreamError::LinkLost)));
    }
    for _ in 0..5 {
        let end = tokio::time::timeout(OPEN, ended.recv())
            .await
            .expect("no hang at the edge")
            .expect("an end");
        assert_eq!(end, StreamError::LinkLost);
    }
    // The node links again; a stream to it works again.
    linked(&cloud, 2).await;
    let mut again = cloud
        .handle
        .streams
        .open("n1", Bytes::from_static(b"again"), OPEN)
        .await
        .expect("opened on the new link");
    assert!(matches!(again.recv().await, Some(Ok(Chunk::Data(1, _)))));
    // A node not linked here.
    assert_eq!(
        cloud
            .handle
            .streams
            .open("n2", Bytes::new(), OPEN)
            .await
            .err(),
        Some(StreamError::NotLinked("n2".to_owned()))
    );
}

macro_rules! over {
    ($module:ident, $kind:expr) => {
        mod $module {
            #[actix::test]
            async fn twenty_streams_do_not_hold_objects_back() {
                super::twenty_streams_do_not_hold_objects_back($kind).await;
            }

            #[actix::test]
            async fn a_link_cut_ends_its_streams_on_both_sides() {
                super::a_link_cut_ends_its_streams_on_both_sides($kind).await;
            }
        }
    };
}

over!(ws, transports::TransportKind::WebSocket);
over!(quic, transports::TransportKind::Quic);
over!(uds, transports::TransportKind::UnixSocket);
