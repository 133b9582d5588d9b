//! `port-forward` through the admin API: one WebSocket per forwarded port,\nits data and error channels carried to and from the pod's port on the\nedge (`portforward.k8s.io` and `v4.channel.k8s.io`).

use ::stream::{Chunk, TunnelStream};
use actix_web::{HttpRequest, HttpResponse, web};
use apis::api::ApiError;
use apis::streams::{PodRef, StreamRequest, channel};

use super::{
    PORT_FORWARD_PROTOCOLS, peers_of, pod_of, port_forward_error, query_pairs, relay_upgrade,
};
use crate::cloudstream::streams::PodStreams;
use crate::peers::{Route, forwarded};

/// Channel 255 of `v5.channel.k8s.io`: `[255, c]` closes input channel `c`.
pub(crate) const CLOSE_CHANNEL: u8 = 255;

/// Ends a stream's WebSocket with a normal closure (1000), as
/// kube-apiserver does: kubectl takes a close without a code (1005) for a
/// broken stream, and an exec's exit code read before it for lost.
pub(crate) async fn session_close(session: actix_ws::Session) -> Result<(), actix_ws::Closed> {
    session
        .close(Some(actix_ws::CloseCode::Normal.into()))
        .await
}

pub(crate) async fn port_forward(
    request: HttpRequest,
    body: web::Payload,
    streams: web::Data<PodStreams>,
    path: web::Path<(String, String)>,
) -> Result<HttpResponse, actix_web::Error> {
    let (namespace, name) = path.into_inner();
    let pairs = query_pairs(&request);
    let ports: Vec<&str> = pairs
        .iter()
        .filter(|(k, _)| k == "ports" || k == "port")
        .flat_map(|(_, v)| v.split(','))
        .collect();
    let port = match ports.as_slice() {
        [port] => port.trim().parse::<u16>().ok().filter(|port| *port > 0),
        _ => None,
    }
    .ok_or_else(|| {
        ApiError::BadRequest("one port to forward, 1 to 65535, per connection".to_owned())
    })?;
    pod_of(&streams, &namespace, &name)?;
    let to_node = StreamRequest::PortForward {
        pod: PodRef { namespace, name },
        port,
    };
    let node = streams.node_of(&to_node)?;
    match streams.route(&node, forwarded(&request)).await {
        Route::Here => {}
        Route::Refuse(err) => return Err(err.into()),
        Route::Forward { replica, url } => {
            let peers = peers_of(&streams)?;
            return relay_upgrade(
                &request,
                body,
                peers,
                [&node, &replica, &url],
                &PORT_FORWARD_PROTOCOLS,
            )
            .await;
        }
    }
    let stream = streams.open_on(&node, &to_node).await?;
    let (response, session, messages) =
        actix_ws::handle_with_protocols(&request, body, &PORT_FORWARD_PROTOCOLS)?;
    actix_web::rt::spawn(carry_port(stream, port, session, messages));
    Ok(response)
}

pub(crate) async fn carry_port(
    mut stream: TunnelStream,
    port: u16,
    session: actix_ws::Session,
    mut messages: actix_ws::MessageStream,
) {
    let mut session = session;
    let prefix = port.to_le_bytes();
    for channel in [0u8, 1] {
        if session
            .binary(vec![channel, prefix[0], prefix[1]])
            .await
            .is_err()
        {
            return;
        }
    }
    let writer = stream.writer();
    let mut replies = session.clone();
    let from_client = async {
        let mut open = true;
        while let Some(Ok(message)) = messages.recv().await {
            let going_on = match message {
                // Bytes the pod no longer takes end nothing: its answer
                // may still be on its way.
                actix_ws::Message::Binary(frame) if open && frame.first() == Some(&0) => {
                    open = writer.send(channel::STDIN, frame.slice(1..)).await.is_ok();
                    true
                }
                actix_ws::Message::Ping(bytes) => replies.pong(&bytes).await.is_ok(),
                actix_ws::Message::Close(_) => false,
                _ => true,
            };
            if !going_on {
                break;
            }
        }
    };
    let to_client = async {
        while let Some(chunk) = stream.recv().await {
            let frame = match chunk {
                Ok(Chunk::Data(channel::STDIN, bytes)) => {
                    let mut frame = Vec::with_capacity(bytes.len() + 1);
                    frame.push(0);
                    frame.extend_from_slice(&bytes);
                    frame
                }
                Ok(_) => continue,
                Err(err) => {
                    let _ = session.binary(port_forward_error(&err.to_string())).await;
                    return;
                }
            };
            if session.binary(frame).await.is_err() {
                return;
            }
        }
    };
    tokio::select! {
        () = from_client => {}
        () = to_client => {}
    }
    drop(stream);
    let _ = session_close(replies).await;
}
