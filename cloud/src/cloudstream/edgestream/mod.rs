//! KubeEdge's edgestream tunnel, served for KubeEdge edgecores linked to
//! this cloud in KubeEdge's dialect: their logs, exec, attach and stats
//! reach the kubelet API through it, since their links carry no streams.
//!
//! A KubeEdge edgecore with `modules.edgeStream.enable: true` dials the
//! tunnel port (`modules.cloudStream.tunnelPort`, 10014; KubeEdge's is
//! 10004, where cloudcore's metrics are by default)
//! with its node certificate and keeps one WebSocket there
//! ([`server`]). For each kubelet API request for one of its pods the
//! cloud opens a connection on that tunnel ([`session`]): a `XConnect`
//! message naming the request the edge makes to its local kubelet server,
//! then `Data` both ways, and `RemoveConnect` from whichever side ends
//! it ([`codec`]). For exec and attach the edge passes the caller's
//! upgrade to its kubelet and relays the raw connection, the kubelet's
//! `101` head included, so the kubelet API answers it as it answers an
//! upgrade carried over a native link.
//!
//! The node of a tunnel is the one its verified certificate names; a
//! tunnel naming another node is refused before it is upgraded.

pub mod codec;
pub mod server;
pub mod session;

use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use tracing::info;

pub use session::{EdgeConnection, EdgeStreamError, EdgeTunnels, EdgeWriter, TunnelSession};

use super::{Handler, KubeletApiHandle};

/// The tunnel port by default: KubeEdge's 10004 plus 10, as the KubeEdge
/// dialect's link listener is KubeEdge's 10000 plus 10 (cloudcore's
/// metrics take 10004).
pub const DEFAULT_TUNNEL_PORT: u16 = 10014;

/// How a kubelet API request reaches a node's pods.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamPath {
    /// Through the node's KubeEdge edgestream tunnel.
    EdgeStream,
    /// Through the node's own link (`stream`).
    Link,
    /// Nowhere: the node is linked in KubeEdge's dialect (no streams in
    /// its link) and keeps no edgestream tunnel here.
    KubeEdgeWithoutEdgeStream,
}

/// The path to a node: its edgestream tunnel if it keeps one here (only
/// KubeEdge edgecores do), else its link, unless that link is in
/// KubeEdge's dialect.
pub fn stream_path(has_tunnel: bool, linked_in_kubeedge_dialect: bool) -> StreamPath {
    match (has_tunnel, linked_in_kubeedge_dialect) {
        (true, _) => StreamPath::EdgeStream,
        (false, true) => StreamPath::KubeEdgeWithoutEdgeStream,
        (false, false) => StreamPath::Link,
    }
}

/// What a node linked in KubeEdge's dialect without a tunnel is told.
pub fn without_edgestream(node: &str) -> String {
    format!(
        "node {node} is a KubeEdge edgecore with no edgestream tunnel to this cloudcore: if it has just connected, its tunnel follows its link within seconds; else set modules.edgeStream.enable: true (and modules.edgeStream.server: this cloudcore's tunnel port) in its edgecore.yaml"
    )
}

/// The tunnel port's settings.
pub struct TunnelConfig {
    /// host:port to listen on.
    pub address: String,
    /// TLS: this cloud's certificate, and node certificates required and
    /// verified against the cloud's CA.
    pub tls: Arc<rustls::ServerConfig>,
}

/// Serves the tunnel port, keeping the tunnels in `tunnels`.
pub async fn start(
    config: TunnelConfig,
    tunnels: EdgeTunnels,
) -> std::io::Result<KubeletApiHandle> {
    let handler: Handler = Arc::new(move |request, caller, permit| {
        let tunnels = tunnels.clone();
        Box::pin(async move { server::answer(request, caller, tunnels, permit) })
    });
    let handle = super::serve_tls(&config.address, config.tls, handler, "edgestream").await?;
    info!(address = %handle.address, "edgestream tunnel port for KubeEdge edgecores listening");
    Ok(handle)
}

/// A whole answer from `node`'s edge to a `MetricConnect` for `path`
/// (`/stats/summary`, `/metrics/resource`), at most `max` bytes.
pub async fn fetch(
    session: &Arc<TunnelSession>,
    path: &str,
    headers: Vec<(String, String)>,
    max: usize,
) -> Result<Bytes, String> {
    let request = codec::EdgedRequest::new(
        0,
        path,
        "",
        headers.iter().map(|(n, v)| (n.as_str(), v.as_str())),
        None,
    );
    let mut connection = session
        .connect(codec::MessageType::MetricConnect, request)
        .await
        .map_err(|err| err.to_string())?;
    let mut answer = BytesMut::new();
    while let Some(bytes) = connection.recv().await {
        let bytes = bytes.map_err(|err| err.to_string())?;
        if answer.len() + bytes.len() > max {
            return Err(format!(
                "node {}'s answer exceeds {max} bytes",
                session.node()
            ));
        }
        answer.extend_from_slice(&bytes);
    }
    Ok(answer.freeze())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tunnel_wins_and_a_kubeedge_link_without_one_is_told_why() {
        assert_eq!(stream_path(true, true), StreamPath::EdgeStream);
        assert_eq!(stream_path(true, false), StreamPath::EdgeStream);
        assert_eq!(stream_path(false, false), StreamPath::Link);
        assert_eq!(
            stream_path(false, true),
            StreamPath::KubeEdgeWithoutEdgeStream
        );
        assert!(without_edgestream("edge-1").contains("modules.edgeStream.enable: true"));
    }

    #[test]
    fn a_tunnel_speaks_for_the_node_its_certificate_names() {
        use super::server::admit;
        use crate::reviews::Caller;
        use hyper::StatusCode;
        let node = |name: &str| Caller::new(name.to_owned(), vec!["system:nodes".to_owned()]);
        let path = server::CONNECT_PATH;
        assert_eq!(
            admit(
                "GET",
                path,
                Some("edge-1"),
                Some(&node("system:node:edge-1"))
            ),
            Ok("edge-1".to_owned())
        );
        assert_eq!(
            admit("GET", path, Some("edge-1"), Some(&node("edge-1"))),
            Ok("edge-1".to_owned())
        );
        let code = |result: Result<String, (StatusCode, String)>| result.err().map(|(c, _)| c);
        assert_eq!(
            code(admit(
                "GET",
                path,
                Some("edge-2"),
                Some(&node("system:node:edge-1"))
            )),
            Some(StatusCode::FORBIDDEN)
        );
        assert_eq!(
            code(admit("GET", path, None, Some(&node("edge-1")))),
            Some(StatusCode::BAD_REQUEST)
        );
        assert_eq!(
            code(admit("GET", path, Some("edge-1"), None)),
            Some(StatusCode::UNAUTHORIZED)
        );
        assert_eq!(
            code(admit(
                "GET",
                "/other",
                Some("edge-1"),
                Some(&node("edge-1"))
            )),
            Some(StatusCode::NOT_FOUND)
        );
        assert_eq!(
            code(admit("POST", path, Some("edge-1"), Some(&node("edge-1")))),
            Some(StatusCode::METHOD_NOT_ALLOWED)
        );
    }
}
