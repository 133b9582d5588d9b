//! Replicas forwarding to each other: a replica reaches only the nodes
//! linked to it, so when the admin API is asked for a stream (logs, exec,
//! attach, port-forward) or the resource metrics of a node another
//! replica holds, it forwards the request to that replica's admin API and
//! relays the answer.
//!
//! - Each replica publishes the URL its peers reach its admin API at
//!   beside the record that names it (etcd: the value of
//!   `<prefix>/replicas/<name>`; Kubernetes: the annotation
//!   [`ADDRESS_ANNOTATION`] of its replica Lease). The claims name each
//!   node's holder; a [`PeerDirectory`] answers "holder of node N → its
//!   URL" and "every other replica up".
//! - The decisions are plain functions: [`route`] (here, forward, or a
//!   refusal) and [`merge_items`] (lists from several replicas, each
//!   object once).
//! - A forwarded request carries [`FORWARDED_HEADER`] and is never
//!   forwarded again: the peer answers from what is linked to it, as a
//!   lone replica does. The caller was authorized by the first replica;
//!   the peer authenticates the forwarding replica by its client
//!   certificate from the cloud's CA (CN [`REPLICA_USER_PREFIX`]`<name>`,
//!   group [`crate::admin::auth::REPLICAS`]).

use std::sync::Arc;
use std::time::Duration;

use actix_web::http::StatusCode;
use actix_web::{HttpResponse, ResponseError};
use apis::api::ApiError;
use bytes::Bytes;
use futures_util::future::BoxFuture;
use futures_util::stream::BoxStream;
use rustls::pki_types::CertificateDer;
use serde_json::{Value, json};

use crate::admin_client::kubeconfig::AdminCredentials;
use crate::admin_client::{AdminClient, ClientError};

/// The header a forwarded request carries: the forwarding replica's name.
pub const FORWARDED_HEADER: &str = "x-edgehive-forwarded-by";

/// The group of the cloud's replicas forwarding to each other
/// (this module): pods' logs, exec, attach, port-forward and
/// resource metrics, and only for a user named
/// [`REPLICA_USER_PREFIX`]`<replica>` (a name no node
/// certificate can carry: the join endpoint signs node names only).
pub const REPLICAS: &str = "edgehive:replicas";

/// The common name of a replica's own client certificate, before its name.
pub const REPLICA_USER_PREFIX: &str = "system:edgehive:replica:";

/// The replica Lease's annotation holding the replica's admin API URL.
pub const ADDRESS_ANNOTATION: &str = "edgehive.io/admin-url";

/// How long a holder's lookup may take.
pub const LOOKUP_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a peer may take to answer a request (a stream's head, a
/// metrics answer).
pub const PEER_TIMEOUT: Duration = Duration::from_secs(10);

/// Another replica, as its record names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peer {
    /// Its name.
    pub replica: String,
    /// Its admin API's URL (`https://host:port`), if it publishes one.
    pub url: Option<String>,
}

/// Who holds which node, and where the replicas are reached.
pub trait PeerDirectory: Send + Sync {
    /// The replica holding `node` (`None`: no replica holds it).
    fn holder(&self, node: &str) -> BoxFuture<'static, Result<Option<Peer>, String>>;

    /// Every replica up, this one included.
    fn replicas(&self) -> BoxFuture<'static, Result<Vec<Peer>, String>>;
}

/// Where a request for a node goes.
#[derive(Debug)]
pub enum Route {
    /// Answered here (linked here; or not, and answered as a lone
    /// replica answers: "not linked to this cloud").
    Here,
    /// Forwarded to the replica holding the node.
    Forward {
        /// The holder.
        replica: String,
        /// Its admin API.
        url: String,
    },
    /// Refused: the holder cannot be asked.
    Refuse(ApiError),
}

/// Where a request for `node` goes: here if it is linked here or the
/// request was forwarded already (never forwarded twice); else to the
/// replica the claims name, if it is another one and publishes its
/// address; here when no replica holds the node (offline: answered as
/// today); refused when the holder cannot be looked up or reached.
pub fn route(
    node: &str,
    linked_here: bool,
    forwarded: bool,
    me: &str,
    holder: impl FnOnce() -> Result<Option<Peer>, String>,
) -> Route {
    if linked_here || forwarded {
        return Route::Here;
    }
    match holder() {
        Ok(None) => Route::Here,
        Ok(Some(peer)) if peer.replica == me => Route::Here,
        Ok(Some(Peer {
            replica,
            url: Some(url),
        })) if !url.is_empty() => Route::Forward { replica, url },
        Ok(Some(Peer { replica, .. })) => Route::Refuse(ApiError::Unavailable(format!(
            "node {node} is linked to replica {replica}, which publishes no admin API address (replicas.advertiseAddress)"
        ))),
        Err(reason) => Route::Refuse(ApiError::Unavailable(format!(
            "node {node} is not linked to this cloud, and the replica holding it cannot be looked up: {reason}"
        ))),
    }
}

/// The replicas a list is asked of besides this one: every other one
/// that publishes an address.
pub fn others(replicas: Vec<Peer>, me: &str) -> Vec<(String, String)> {
    replicas
        .into_iter()
        .filter(|peer| peer.replica != me)
        .filter_map(|peer| Some((peer.replica, peer.url.filter(|url| !url.is_empty())?)))
        .collect()
}

/// The items of one list from several replicas: this one's first, then
/// each peer's, an object (by namespace and name) only once.
pub fn merge_items(own: Vec<Value>, theirs: Vec<Vec<Value>>) -> Vec<Value> {
    let key = |item: &Value| {
        let metadata = &item["metadata"];
        (
            metadata["namespace"].as_str().unwrap_or("").to_owned(),
            metadata["name"].as_str().unwrap_or("").to_owned(),
        )
    };
    let mut seen = std::collections::HashSet::new();
    own.into_iter()
        .chain(theirs.into_iter().flatten())
        .filter(|item| seen.insert(key(item)))
        .collect()
}

/// What went wrong forwarding to a peer.
#[derive(Debug, thiserror::Error)]
pub enum ForwardError {
    /// The peer did not answer (down, unreachable, too slow).
    #[error("node {node} is linked to replica {replica} ({url}), which did not answer: {reason}")]
    Unreachable {
        /// The node asked for.
        node: String,
        /// The holder.
        replica: String,
        /// Its admin API.
        url: String,
        /// Why.
        reason: String,
    },
    /// The peer answered with a refusal: relayed as it came.
    #[error("{message}")]
    Refused {
        /// Its HTTP status.
        code: u16,
        /// Its Status reason.
        reason: String,
        /// Its Status message.
        message: String,
    },
    /// This replica cannot talk to peers (its TLS settings).
    #[error("replica {replica}: {reason}")]
    Settings {
        /// The peer.
        replica: String,
        /// Why.
        reason: String,
    },
}

impl ForwardError {
    fn of(err: ClientError, node: &str, replica: &str, url: &str) -> ForwardError {
        match err {
            ClientError::Server {
                code,
                reason,
                message,
            } => ForwardError::Refused {
                code,
                reason,
                message,
            },
            ClientError::Settings(reason) => ForwardError::Settings {
                replica: replica.to_owned(),
                reason,
            },
            other => ForwardError::Unreachable {
                node: node.to_owned(),
                replica: replica.to_owned(),
                url: url.to_owned(),
                reason: other.to_string(),
            },
        }
    }
}

impl ResponseError for ForwardError {
    fn status_code(&self) -> StatusCode {
        match self {
            ForwardError::Refused { code, .. } => {
                StatusCode::from_u16(*code).unwrap_or(StatusCode::BAD_GATEWAY)
            }
            _ => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    fn error_response(&self) -> HttpResponse {
        let reason = match self {
            ForwardError::Refused { reason, .. } => reason.as_str(),
            _ => "ServiceUnavailable",
        };
        HttpResponse::build(self.status_code()).json(json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {},
            "status": "Failure", "message": self.to_string(),
            "reason": reason, "code": self.status_code().as_u16(),
        }))
    }
}

/// A replica's way to its peers: who holds what, and a client of each
/// peer's admin API with this replica's own certificate.
#[derive(Clone)]
pub struct Peers {
    me: String,
    directory: Arc<dyn PeerDirectory>,
    roots: Vec<CertificateDer<'static>>,
    identity: Option<Arc<transports::tls::Identity>>,
}

impl std::fmt::Debug for Peers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Peers").field("me", &self.me).finish()
    }
}

/// A WebSocket to a peer's admin API.
pub type PeerSocket =
    tokio_tungstenite::WebSocketStream<std::pin::Pin<Box<dyn crate::admin_client::Connection>>>;

impl Peers {
    /// Replica `me`'s peers as `directory` finds them, reached over HTTPS
    /// trusting `roots` (the cloud's CA) with `identity` (this replica's
    /// client certificate), or over plain HTTP where a peer publishes an
    /// `http://` URL.
    pub fn new(
        me: impl Into<String>,
        directory: Arc<dyn PeerDirectory>,
        roots: Vec<CertificateDer<'static>>,
        identity: Option<transports::tls::Identity>,
    ) -> Peers {
        Peers {
            me: me.into(),
            directory,
            roots,
            identity: identity.map(Arc::new),
        }
    }

    /// This replica's name.
    pub fn me(&self) -> &str {
        &self.me
    }

    /// Where a request for `node` goes ([`route`]), looking its holder up
    /// only when that matters.
    pub async fn route(&self, node: &str, linked_here: bool, forwarded: bool) -> Route {
        if linked_here || forwarded {
            return Route::Here;
        }
        let looked_up = tokio::time::timeout(LOOKUP_TIMEOUT, self.directory.holder(node))
            .await
            .unwrap_or_else(|_| Err("no answer in time".to_owned()));
        route(node, false, false, &self.me, || looked_up)
    }

    /// The other replicas up that publish an address.
    pub async fn others(&self) -> Vec<(String, String)> {
        match tokio::time::timeout(LOOKUP_TIMEOUT, self.directory.replicas()).await {
            Ok(Ok(replicas)) => others(replicas, &self.me),
            Ok(Err(reason)) => {
                tracing::warn!(%reason, "the replicas cannot be listed: answering with this one's nodes");
                Vec::new()
            }
            Err(_) => {
                tracing::warn!(
                    "the replicas' list did not come in time: answering with this one's nodes"
                );
                Vec::new()
            }
        }
    }

    /// A client of the admin API at `url`, marked as forwarded by this
    /// replica.
    pub fn client(&self, replica: &str, url: &str) -> Result<AdminClient, ForwardError> {
        let client = if url.starts_with("https://") {
            let identity = self
                .identity
                .as_ref()
                .map(|identity| (identity.0.clone(), identity.1.clone_key()));
            let credentials = AdminCredentials {
                server: url.to_owned(),
                roots: self.roots.clone(),
                tls_server_name: None,
                identity,
                token: None,
                namespace: None,
            };
            AdminClient::from_credentials(&credentials, None).map_err(|err| {
                ForwardError::Settings {
                    replica: replica.to_owned(),
                    reason: err.to_string(),
                }
            })?
        } else if self.identity.is_some() {
            // This replica authenticates to its peers, so they serve HTTPS:
            // a plain URL is not one of them (it could name anyone able to
            // write a Lease or the replica record), and users' streams are
            // not sent to it.
            return Err(ForwardError::Settings {
                replica: replica.to_owned(),
                reason: format!(
                    "its published address {url} is not https:// (replicas with authentication reach each other over TLS only)"
                ),
            });
        } else {
            AdminClient::new(url)
        };
        Ok(client.with_header(FORWARDED_HEADER, &self.me))
    }

    /// `GET path` of the peer as it arrives (a log), for `node`.
    pub async fn stream(
        &self,
        node: &str,
        replica: &str,
        url: &str,
        path: &str,
    ) -> Result<BoxStream<'static, Result<Bytes, ClientError>>, ForwardError> {
        let client = self.client(replica, url)?;
        answered_in_time(client.stream(path), node, replica, url).await
    }

    /// `GET path` of the peer as JSON (`node`: what it is asked for, for
    /// the error's words).
    pub async fn get(
        &self,
        node: &str,
        replica: &str,
        url: &str,
        path: &str,
    ) -> Result<Value, ForwardError> {
        let client = self.client(replica, url)?;
        answered_in_time(client.get(path), node, replica, url).await
    }

    /// The peer's WebSocket at `path`, offering `protocols` (the
    /// client's `Sec-WebSocket-Protocol`): the socket and the protocol
    /// the peer chose. A refusal is the peer's, relayed.
    pub async fn websocket(
        &self,
        node: &str,
        replica: &str,
        url: &str,
        path: &str,
        protocols: Option<&str>,
    ) -> Result<(PeerSocket, Option<String>), ForwardError> {
        use tokio_tungstenite::tungstenite::client::IntoClientRequest;
        let client = self.client(replica, url)?;
        let failed = |reason: String| ForwardError::Unreachable {
            node: node.to_owned(),
            replica: replica.to_owned(),
            url: url.to_owned(),
            reason,
        };
        let mut request = client
            .websocket_url(path)
            .into_client_request()
            .map_err(|err| failed(err.to_string()))?;
        let headers = request.headers_mut();
        let mut add = |name: &str, value: &str| -> Result<(), ForwardError> {
            let name =
                tokio_tungstenite::tungstenite::http::HeaderName::from_bytes(name.as_bytes())
                    .map_err(|err| failed(err.to_string()))?;
            let value = value
                .parse()
                .map_err(|_| failed(format!("header {name}")))?;
            headers.insert(name, value);
            Ok(())
        };
        if let Some(protocols) = protocols {
            add("sec-websocket-protocol", protocols)?;
        }
        for (name, value) in client.headers() {
            add(name, value)?;
        }
        let opened = tokio::time::timeout(PEER_TIMEOUT, async {
            let stream = client
                .connect()
                .await
                .map_err(|err| failed(err.to_string()))?;
            match tokio_tungstenite::client_async(request, stream).await {
                Ok((socket, response)) => {
                    let chosen = response
                        .headers()
                        .get("sec-websocket-protocol")
                        .and_then(|value| value.to_str().ok())
                        .map(str::to_owned);
                    Ok((socket, chosen))
                }
                Err(tokio_tungstenite::tungstenite::Error::Http(response)) => {
                    let body = response.body().as_deref().unwrap_or_default();
                    let status: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
                    let code = response.status().as_u16();
                    Err(ForwardError::Refused {
                        code,
                        reason: status["reason"]
                            .as_str()
                            .map_or_else(|| code.to_string(), str::to_owned),
                        message: status["message"]
                            .as_str()
                            .map(str::to_owned)
                            .unwrap_or_else(|| String::from_utf8_lossy(body).into_owned()),
                    })
                }
                Err(err) => Err(failed(err.to_string())),
            }
        })
        .await;
        opened.unwrap_or_else(|_| Err(failed("no answer in time".to_owned())))
    }
}

/// A peer's answer to `asked` within [`PEER_TIMEOUT`], its failure in the
/// words of `node` and `replica`.
async fn answered_in_time<T>(
    asked: impl std::future::Future<Output = Result<T, ClientError>>,
    node: &str,
    replica: &str,
    url: &str,
) -> Result<T, ForwardError> {
    tokio::time::timeout(PEER_TIMEOUT, asked)
        .await
        .unwrap_or_else(|_| Err(ClientError::Unexpected("no answer in time".to_owned())))
        .map_err(|err| ForwardError::of(err, node, replica, url))
}

/// Whether another replica forwarded this request: it is answered here,
/// never forwarded again.
pub(crate) fn forwarded(request: &actix_web::HttpRequest) -> bool {
    request.headers().contains_key(FORWARDED_HEADER)
}

#[cfg(test)]
mod tests;
