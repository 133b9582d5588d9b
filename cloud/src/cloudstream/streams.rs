//! Streams to edge pods and nodes through their links (`stream`):
//! a container's log, a command, an attach, a forwarded port, a node's
//! resource figures. The cloud finds the pod's node in the desired state
//! and opens the stream on that node's link; the node checks the pod is
//! its own and serves it. Whoever calls this has been authorized by the
//! API in front of it (the admin API, the kubelet API for kube-apiserver).

use std::sync::Arc;
use std::time::Duration;

use apis::api::ApiError;
use apis::kinds::{Kind, ObjectKey};
use apis::streams::{PodRef, StatsKind, StreamRequest, channel};
use bytes::{Bytes, BytesMut};
use stream::{Chunk, NodeTunnels, StreamError, TunnelStream};

use crate::desired::DesiredState;

/// How long a node may take to accept a stream.
pub const OPEN_TIMEOUT: Duration = Duration::from_secs(10);

/// The most bytes of one stats answer.
const MAX_STATS: usize = 16 << 20;

/// Opens streams to the pods and nodes linked to this cloud.
#[derive(Clone)]
pub struct PodStreams {
    tunnels: NodeTunnels,
    store: Arc<dyn DesiredState>,
    /// The other replicas, to forward to the one holding a node.
    peers: Option<crate::peers::Peers>,
}

impl PodStreams {
    /// Streams over `tunnels`, to pods found in `store`.
    pub fn new(tunnels: NodeTunnels, store: Arc<dyn DesiredState>) -> PodStreams {
        PodStreams {
            tunnels,
            store,
            peers: None,
        }
    }

    /// The streams, forwarding what is asked of a node another replica
    /// holds to that replica ([`crate::peers`]).
    pub fn with_peers(mut self, peers: crate::peers::Peers) -> PodStreams {
        self.peers = Some(peers);
        self
    }

    /// The other replicas, if there are any.
    pub fn peers(&self) -> Option<&crate::peers::Peers> {
        self.peers.as_ref()
    }

    /// Where a request for `node` is answered: here, or forwarded to the
    /// replica holding it (never when `forwarded` already).
    pub async fn route(&self, node: &str, forwarded: bool) -> crate::peers::Route {
        let linked = self.is_linked(node);
        match &self.peers {
            Some(peers) => peers.route(node, linked, forwarded).await,
            None => crate::peers::Route::Here,
        }
    }

    /// The node `request`'s pod is bound to.
    pub fn node_of(&self, request: &StreamRequest) -> Result<String, ApiError> {
        match request.pod() {
            Some(pod) => self.node_of_pod(pod),
            None => Err(ApiError::BadRequest("a stream for no pod".to_owned())),
        }
    }

    /// The node `pod` is bound to.
    pub fn node_of_pod(&self, pod: &PodRef) -> Result<String, ApiError> {
        let key = ObjectKey::new(Kind::Pod, &pod.namespace, &pod.name);
        let object = self
            .store
            .get(&key)
            .map_err(|err| ApiError::Unavailable(err.to_string()))?
            .ok_or_else(|| ApiError::NotFound(key.clone()))?;
        object.node_name().map(str::to_owned).ok_or_else(|| {
            ApiError::BadRequest(format!("pod {key} is not scheduled to a node yet"))
        })
    }

    /// Opens a stream for `request` to its pod's node.
    pub async fn open(&self, request: &StreamRequest) -> Result<TunnelStream, ApiError> {
        let node = self.node_of(request)?;
        self.open_on(&node, request).await
    }

    /// Opens a stream for `request` to `node`.
    pub async fn open_on(
        &self,
        node: &str,
        request: &StreamRequest,
    ) -> Result<TunnelStream, ApiError> {
        self.tunnels
            .open(node, Bytes::from(request.encode()), OPEN_TIMEOUT)
            .await
            .map_err(|err| refused(node, err))
    }

    /// `node`'s resource figures (`what`), read whole.
    pub async fn stats(&self, node: &str, what: StatsKind) -> Result<Bytes, ApiError> {
        let mut stream = self.open_on(node, &StreamRequest::Stats { what }).await?;
        let mut answer = BytesMut::new();
        while let Some(chunk) = stream.recv().await {
            match chunk.map_err(|err| refused(node, err))? {
                Chunk::Data(channel::STDOUT, bytes) => {
                    if answer.len() + bytes.len() > MAX_STATS {
                        return Err(ApiError::Unavailable(format!(
                            "node {node}'s stats exceed {MAX_STATS} bytes"
                        )));
                    }
                    answer.extend_from_slice(&bytes);
                }
                Chunk::Data(channel::ERROR, bytes) => {
                    return Err(ApiError::Unavailable(format!(
                        "node {node}: {}",
                        String::from_utf8_lossy(&bytes)
                    )));
                }
                _ => {}
            }
        }
        Ok(answer.freeze())
    }

    /// The desired state the pods are found in.
    pub fn store(&self) -> &Arc<dyn DesiredState> {
        &self.store
    }

    /// Whether `node` is linked to this cloud.
    pub fn is_linked(&self, node: &str) -> bool {
        self.tunnels.is_linked(node)
    }

    /// Whether `node` is linked to this cloud in KubeEdge's dialect (its
    /// link carries no streams).
    pub fn is_linked_kubeedge(&self, node: &str) -> bool {
        self.tunnels.is_linked_kubeedge(node)
    }
}

/// A stream's failure as the API reports it.
pub fn refused(node: &str, err: StreamError) -> ApiError {
    match err {
        StreamError::Refused(reason) => ApiError::BadRequest(format!("node {node}: {reason}")),
        StreamError::NotLinked(_) => ApiError::Unavailable(format!(
            "node {node} is not linked to this cloud (offline, or served by another replica)"
        )),
        other => ApiError::Unavailable(format!("node {node}: {other}")),
    }
}
