//! Port forwarding into a pod: through the runtime's streaming server when\nit offers one, else a TCP connection in the pod's network namespace,\ncarried both ways.

use apis::k8s::Pod;
use apis::streams::{UpgradeTarget, channel};
use bytes::Bytes;
use futures_util::{SinkExt as _, StreamExt as _};
use stream::{Chunk, PendingStream};
use tokio_tungstenite::tungstenite::Message as WsMessage;

use super::{CONNECT_TIMEOUT, channel_message, connect_runtime, streaming_url};
use crate::cri::Cri;

/// One connection to `port` of the pod, at its address on the node's pod
/// network (the node's loopback for a pod on the host's network): bytes on
/// channel 0 both ways, the connection's end as the stream's.
pub(crate) async fn port_forward(cri: &Cri, pod: &Pod, port: u16, pending: PendingStream) {
    let host_network = pod
        .spec
        .as_ref()
        .and_then(|spec| spec.host_network)
        .unwrap_or(false);
    let ip = match host_network {
        true => Some("127.0.0.1".to_owned()),
        false => pod.status.as_ref().and_then(|s| s.pod_ip.clone()),
    };
    let Some(ip) = ip.filter(|ip| !ip.is_empty()) else {
        return pending.refuse("the pod has no address yet");
    };
    let Ok(ip) = ip.parse::<std::net::IpAddr>() else {
        return pending.refuse(&format!("the pod's address {ip:?} is not an IP address"));
    };
    let connected =
        tokio::time::timeout(CONNECT_TIMEOUT, tokio::net::TcpStream::connect((ip, port)));
    let connected = connected.await.unwrap_or_else(|_| {
        Err(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            "no answer",
        ))
    });
    match connected {
        Ok(tcp) => carry(tcp, pending, channel::STDIN).await,
        // Perhaps bound to the pod's own loopback only: the runtime's
        // port-forward, inside the pod's network namespace, reaches it.
        Err(err) => match forward_in_sandbox(cri, pod, port).await {
            Ok(ws) => carry_forwarded(ws, pending).await,
            Err(reason) => pending.refuse(&format!(
                "port {port} of the pod at {ip}: {err}; in its network namespace: {reason}"
            )),
        },
    }
}

pub(crate) type RuntimeSocket = tokio_tungstenite::WebSocketStream<tokio::net::TcpStream>;

/// A connection to `port` inside the pod's network namespace: CRI
/// `PortForward`, then the runtime's streaming server over WebSocket
/// (channel 0 the bytes, channel 1 an error, each channel's
/// first message the port), its two port messages read.
pub(crate) async fn forward_in_sandbox(
    cri: &Cri,
    pod: &Pod,
    port: u16,
) -> Result<RuntimeSocket, String> {
    let target = UpgradeTarget::PortForward { ports: vec![port] };
    let url = streaming_url(cri, pod, target).await?;
    let mut ws = connect_runtime(&url).await?;
    for _ in 0..2 {
        match ws.next().await {
            Some(Ok(WsMessage::Binary(frame))) if frame.len() == 3 => {}
            other => return Err(format!("the runtime's port-forward began with {other:?}")),
        }
    }
    Ok(ws)
}

/// [`carry`] over the runtime's port-forward WebSocket: the cloud's
/// channel 0 to its data channel and back; its error channel ends the
/// stream with the error.
pub(crate) async fn carry_forwarded(ws: RuntimeSocket, pending: PendingStream) {
    let Ok(mut stream) = pending.accept() else {
        return;
    };
    let (mut to_runtime, mut from_runtime) = ws.split();
    let writer = stream.writer();
    let upstream = async {
        while let Some(message) = from_runtime.next().await {
            match message {
                Ok(WsMessage::Binary(frame)) if frame.first() == Some(&0) && frame.len() > 1 => {
                    if writer.send(channel::STDIN, frame.slice(1..)).await.is_err() {
                        return None;
                    }
                }
                Ok(WsMessage::Binary(frame)) if frame.first() == Some(&1) && frame.len() > 1 => {
                    return Some(String::from_utf8_lossy(&frame[1..]).into_owned());
                }
                Ok(WsMessage::Close(_)) | Err(_) => return None,
                Ok(_) => {}
            }
        }
        None
    };
    // The cloud's bytes, until it goes. Its end of writing is not passed
    // on (no half-close in this protocol): the pod's answer still comes
    // back, and the pod's side ending ends the stream.
    let downstream = async {
        while let Some(Ok(chunk)) = stream.recv().await {
            if let Chunk::Data(channel::STDIN, bytes) = chunk
                && to_runtime
                    .send(channel_message(channel::STDIN, &bytes))
                    .await
                    .is_err()
            {
                break;
            }
        }
        let _ = to_runtime.close().await;
    };
    let failed = tokio::select! {
        failed = upstream => failed,
        () = downstream => None,
    };
    match failed {
        Some(reason) => stream.fail(&reason),
        None => stream.close(),
    }
}

/// Carries bytes between `tcp` and the accepted stream: the cloud's on
/// channel 0 to `tcp` (their end as its write side's), `tcp`'s to the
/// cloud on `up`. Either side's end ends the stream.
pub(crate) async fn carry(tcp: tokio::net::TcpStream, pending: PendingStream, up: u8) {
    let Ok(mut stream) = pending.accept() else {
        return;
    };
    let (mut from_pod, mut to_pod) = tcp.into_split();
    let writer = stream.writer();
    let upstream = async {
        let mut buffer = vec![0u8; 32 * 1024];
        loop {
            match tokio::io::AsyncReadExt::read(&mut from_pod, &mut buffer).await {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    let bytes = Bytes::copy_from_slice(&buffer[..n]);
                    if writer.send(up, bytes).await.is_err() {
                        return;
                    }
                }
            }
        }
    };
    let downstream = async {
        while let Some(Ok(chunk)) = stream.recv().await {
            let written = match chunk {
                Chunk::Data(channel::STDIN, bytes) => {
                    tokio::io::AsyncWriteExt::write_all(&mut to_pod, &bytes).await
                }
                Chunk::End(channel::STDIN) => tokio::io::AsyncWriteExt::shutdown(&mut to_pod).await,
                _ => Ok(()),
            };
            if written.is_err() {
                return;
            }
        }
    };
    // The far side ending ends the stream; the cloud's side ending (its
    // client gone) too.
    tokio::select! {
        () = upstream => {}
        () = downstream => {}
    }
    stream.close();
}
