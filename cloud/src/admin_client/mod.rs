//! A small HTTP client for the admin API and MetaServer: what the CLI uses,
//! and what tests use to read both the way an application would. Plain
//! HTTP by default (MetaServer, an admin API on loopback without
//! authentication); HTTPS with a client certificate or a bearer token from
//! a kubeconfig ([`AdminClient::from_credentials`]).

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use futures_util::stream::{self, BoxStream};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::header::{AUTHORIZATION, CONTENT_TYPE, HOST};
use hyper::{Method, Request, Response};
use hyper_util::rt::TokioIo;
use serde_json::Value;
use tokio::io::{AsyncRead, AsyncWrite};
use transports::tls::ServerName;

use kubeconfig::AdminCredentials;

pub mod kubeconfig;

/// Path of the apply endpoint.
pub const APPLY_PATH: &str = "/apis/edgehive.io/v1/apply";
/// Path of the delete-by-manifest endpoint.
pub const DELETE_PATH: &str = "/apis/edgehive.io/v1/delete";
/// Join tokens: `GET` lists their records, `POST` records one (a
/// [`hub::certs::TokenRecord`]), `DELETE .../{id}` revokes one; `GET
/// .../revokednodes` lists the deleted nodes whose certificates are revoked.
pub const TOKENS_PATH: &str = "/apis/edgehive.io/v1/jointokens";

/// What became of one object of a manifest.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ObjectResult {
    /// Its kind.
    pub kind: String,
    /// Its namespace (empty for nodes).
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// `created`, `configured`, `unchanged`, `deleted` or `not found`.
    pub result: String,
}

impl ObjectResult {
    /// The result of a delete of an object that is not there.
    pub const NOT_FOUND: &'static str = "not found";

    /// Whether the object was not there to delete.
    pub fn not_found(&self) -> bool {
        self.result == Self::NOT_FOUND
    }
}

/// The answer to an apply or a delete.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ManifestResults {
    /// One entry per object, in manifest order.
    pub results: Vec<ObjectResult>,
}

/// TCP keepalive of connections to an admin API: probes after this long
/// without traffic,
const KEEPALIVE_IDLE: Duration = Duration::from_secs(30);
/// every this long,
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);
/// and the connection is given up after this many unanswered.
const KEEPALIVE_PROBES: u32 = 3;

/// Time to connect and get an answer (a watch's stream is not limited).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// What went wrong talking to a server.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// No connection, or it broke.
    #[error("cannot reach {address}: {reason}")]
    Unreachable {
        /// The server's address.
        address: String,
        /// Why.
        reason: String,
    },
    /// The server said no; its own words.
    #[error("Error from server ({reason}): {message}")]
    Server {
        /// HTTP status code.
        code: u16,
        /// The Status reason (e.g. `NotFound`, `Invalid`).
        reason: String,
        /// The Status message.
        message: String,
    },
    /// The answer is not what the API gives.
    #[error("unexpected answer from the server: {0}")]
    Unexpected(String),
    /// The client's settings cannot be used (a server URL, TLS material).
    #[error("{0}")]
    Settings(String),
}

/// A connection to the server, plain or TLS.
pub trait Connection: AsyncRead + AsyncWrite + Send + Unpin {}

impl<T: AsyncRead + AsyncWrite + Send + Unpin> Connection for T {}

/// HTTPS: the TLS configuration and the name the server must prove.
#[derive(Clone)]
struct Tls {
    config: Arc<rustls::ClientConfig>,
    name: ServerName<'static>,
}

/// A client of one server, by `host:port`.
#[derive(Clone)]
pub struct AdminClient {
    address: String,
    tls: Option<Tls>,
    token: Option<String>,
    /// Headers sent with every request (and WebSocket opened).
    headers: Vec<(String, String)>,
}

impl std::fmt::Debug for AdminClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdminClient")
            .field("address", &self.address)
            .field("tls", &self.tls.is_some())
            .field("token", &self.token.is_some())
            .finish()
    }
}

impl AdminClient {
    /// A client of the server at `address` over plain HTTP (`host:port`,
    /// an `http://` prefix is allowed).
    pub fn new(address: &str) -> Self {
        let address = address
            .trim_start_matches("http://")
            .trim_end_matches('/')
            .to_owned();
        AdminClient {
            address,
            tls: None,
            token: None,
            headers: Vec::new(),
        }
    }

    /// A client as a kubeconfig says ([`super::kubeconfig`]), of `server`
    /// if given, else of the kubeconfig's. `https://` gets TLS trusting
    /// the kubeconfig's CA, with its client certificate and bearer token;
    /// `http://` or no scheme gets plain HTTP and none of the credentials
    /// (they are not sent in the clear).
    pub fn from_credentials(
        credentials: &AdminCredentials,
        server: Option<&str>,
    ) -> Result<Self, ClientError> {
        let server = server.unwrap_or(&credentials.server);
        let Some(address) = server.strip_prefix("https://") else {
            return Ok(AdminClient::new(server));
        };
        let address = address.trim_end_matches('/').to_owned();
        if credentials.roots.is_empty() {
            return Err(ClientError::Settings(format!(
                "{server}: no certificate-authority to trust the server by"
            )));
        }
        let host = match &credentials.tls_server_name {
            Some(name) => name.clone(),
            None => host_of(&address).to_owned(),
        };
        let name = ServerName::try_from(host.clone())
            .map_err(|e| ClientError::Settings(format!("server name {host:?}: {e}")))?;
        let identity = credentials
            .identity
            .as_ref()
            .map(|(chain, key)| (chain.clone(), key.clone_key()));
        let config = transports::tls::client_config(&credentials.roots, identity)
            .map_err(|e| ClientError::Settings(e.to_string()))?;
        Ok(AdminClient {
            address,
            tls: Some(Tls { config, name }),
            token: credentials.token.clone(),
            headers: Vec::new(),
        })
    }

    /// The client, sending header `name: value` with every request (a
    /// replica marking what it forwards, `crate::peers`).
    pub fn with_header(mut self, name: &str, value: &str) -> Self {
        self.headers.push((name.to_owned(), value.to_owned()));
        self
    }

    /// The headers sent with every request besides `Authorization`, for
    /// the WebSockets opened on [`AdminClient::connect`].
    pub fn headers(&self) -> impl Iterator<Item = (&str, &str)> {
        self.headers.iter().map(|(n, v)| (n.as_str(), v.as_str()))
    }

    /// `host:port` of the server.
    pub fn address(&self) -> &str {
        &self.address
    }

    /// Whether the client speaks HTTPS.
    pub fn is_tls(&self) -> bool {
        self.tls.is_some()
    }

    /// The `Authorization` header's value it sends, if any.
    pub fn authorization(&self) -> Option<String> {
        self.token.as_ref().map(|token| format!("Bearer {token}"))
    }

    /// The WebSocket URL of `path` (`ws://` or `wss://`).
    pub fn websocket_url(&self, path: &str) -> String {
        let scheme = if self.tls.is_some() { "wss" } else { "ws" };
        format!("{scheme}://{}{path}", self.address)
    }

    /// A connection to the server: TCP, then TLS when it speaks HTTPS
    /// (what WebSockets are opened on).
    pub async fn connect(&self) -> Result<Pin<Box<dyn Connection>>, ClientError> {
        let tcp = tokio::net::TcpStream::connect(&self.address)
            .await
            .map_err(|e| self.unreachable(e))?;
        // A peer whose host vanishes (a partition, not a closed process)
        // is noticed in about a minute, also by a stream that is quiet
        // for a while (a followed log, a terminal): without this such a
        // stream, relayed by a replica, would wait forever.
        let keepalive = socket2::TcpKeepalive::new()
            .with_time(KEEPALIVE_IDLE)
            .with_interval(KEEPALIVE_INTERVAL)
            .with_retries(KEEPALIVE_PROBES);
        if let Err(err) = socket2::SockRef::from(&tcp).set_tcp_keepalive(&keepalive) {
            tracing::debug!(error = %err, "no TCP keepalive on a connection to the admin API");
        }
        match &self.tls {
            None => Ok(Box::pin(tcp)),
            Some(tls) => {
                let connector = tokio_rustls::TlsConnector::from(tls.config.clone());
                let stream = connector
                    .connect(tls.name.clone(), tcp)
                    .await
                    .map_err(|e| self.unreachable(format!("TLS: {e}")))?;
                Ok(Box::pin(stream))
            }
        }
    }

    /// Applies the manifests in `body` (YAML or JSON).
    pub async fn apply(&self, body: Vec<u8>) -> Result<ManifestResults, ClientError> {
        let answer = self.call(Method::POST, APPLY_PATH, Some(body)).await?;
        serde_json::from_value(answer).map_err(|e| ClientError::Unexpected(e.to_string()))
    }

    /// Deletes the objects the manifests in `body` name.
    pub async fn delete_manifest(&self, body: Vec<u8>) -> Result<ManifestResults, ClientError> {
        let answer = self.call(Method::POST, DELETE_PATH, Some(body)).await?;
        serde_json::from_value(answer).map_err(|e| ClientError::Unexpected(e.to_string()))
    }

    /// `GET path` as JSON.
    pub async fn get(&self, path: &str) -> Result<Value, ClientError> {
        self.call(Method::GET, path, None).await
    }

    /// `DELETE path`; the deleted object.
    pub async fn delete(&self, path: &str) -> Result<Value, ClientError> {
        self.call(Method::DELETE, path, None).await
    }

    /// A raw request: the status code and the body, whatever they are.
    pub async fn raw(
        &self,
        method: Method,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<(u16, Bytes), ClientError> {
        let response = tokio::time::timeout(REQUEST_TIMEOUT, async {
            let response = self.send(method, path, body).await?;
            let status = response.status().as_u16();
            let body = response
                .into_body()
                .collect()
                .await
                .map_err(|e| self.unreachable(e))?
                .to_bytes();
            Ok::<_, ClientError>((status, body))
        })
        .await
        .map_err(|_| self.unreachable("no answer in time"))??;
        Ok(response)
    }

    /// The body of `path` as it arrives (a followed log), or the server's
    /// refusal. Ends with an error if the server cuts it.
    pub async fn stream(
        &self,
        path: &str,
    ) -> Result<BoxStream<'static, Result<Bytes, ClientError>>, ClientError> {
        let response = self.open(path).await?;
        let address = self.address.clone();
        let chunks = stream::unfold(Some(response.into_body()), move |body| {
            let address = address.clone();
            async move {
                let mut body = body?;
                loop {
                    match body.frame().await {
                        Some(Ok(frame)) => {
                            if let Ok(data) = frame.into_data() {
                                return Some((Ok(data), Some(body)));
                            }
                        }
                        Some(Err(err)) => {
                            let err = ClientError::Unreachable {
                                address,
                                reason: err.to_string(),
                            };
                            return Some((Err(err), None));
                        }
                        None => return None,
                    }
                }
            }
        });
        Ok(chunks.boxed())
    }

    /// Watches `path` (a list path; `watch=true` is added): each item is
    /// one watch event, as the server sent it.
    pub async fn watch(
        &self,
        path: &str,
    ) -> Result<BoxStream<'static, Result<Value, ClientError>>, ClientError> {
        let separator = if path.contains('?') { '&' } else { '?' };
        let path = format!("{path}{separator}watch=true");
        let response = self.open(&path).await?;
        let address = self.address.clone();
        let lines = stream::unfold(
            (response.into_body(), Vec::<u8>::new(), address),
            |(mut body, mut buffer, address)| async move {
                loop {
                    if let Some(end) = buffer.iter().position(|b| *b == b'\n') {
                        let line: Vec<u8> = buffer.drain(..=end).collect();
                        let event = serde_json::from_slice(&line)
                            .map_err(|e| ClientError::Unexpected(e.to_string()));
                        return Some((event, (body, buffer, address)));
                    }
                    match body.frame().await {
                        Some(Ok(frame)) => {
                            if let Some(data) = frame.data_ref() {
                                buffer.extend_from_slice(data);
                            }
                        }
                        Some(Err(err)) => {
                            let err = ClientError::Unreachable {
                                address: address.clone(),
                                reason: err.to_string(),
                            };
                            return Some((Err(err), (body, Vec::new(), address)));
                        }
                        None => return None,
                    }
                }
            },
        );
        Ok(lines.boxed())
    }

    async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<Value, ClientError> {
        let (status, body) = self.raw(method, path, body).await?;
        if !(200..300).contains(&status) {
            return Err(server_error(status, &body));
        }
        serde_json::from_slice(&body).map_err(|e| ClientError::Unexpected(e.to_string()))
    }

    /// A GET of `path` whose body is read as it arrives: the response
    /// once its head says success, the server's refusal otherwise.
    async fn open(&self, path: &str) -> Result<Response<Incoming>, ClientError> {
        let response = tokio::time::timeout(REQUEST_TIMEOUT, self.send(Method::GET, path, None))
            .await
            .map_err(|_| self.unreachable("no answer in time"))??;
        if !response.status().is_success() {
            let status = response.status().as_u16();
            let body = response
                .into_body()
                .collect()
                .await
                .map_err(|e| self.unreachable(e))?
                .to_bytes();
            return Err(server_error(status, &body));
        }
        Ok(response)
    }

    async fn send(
        &self,
        method: Method,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<Response<Incoming>, ClientError> {
        let stream = self.connect().await?;
        let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| self.unreachable(e))?;
        tokio::spawn(async move {
            let _ = connection.await;
        });
        let mut request = Request::builder()
            .method(method)
            .uri(path)
            .header(HOST, &self.address)
            .header(CONTENT_TYPE, "application/yaml");
        if let Some(authorization) = self.authorization() {
            request = request.header(AUTHORIZATION, authorization);
        }
        for (name, value) in &self.headers {
            request = request.header(name.as_str(), value.as_str());
        }
        let request = request
            .body(Full::new(Bytes::from(body.unwrap_or_default())))
            .map_err(|e| ClientError::Unexpected(e.to_string()))?;
        sender
            .send_request(request)
            .await
            .map_err(|e| self.unreachable(e))
    }

    fn unreachable(&self, reason: impl ToString) -> ClientError {
        ClientError::Unreachable {
            address: self.address.clone(),
            reason: reason.to_string(),
        }
    }
}

/// The host of `host:port` (`[v6]:port` too), for the server name.
fn host_of(address: &str) -> &str {
    let host = match address.rsplit_once(':') {
        Some((host, port)) if port.parse::<u16>().is_ok() => host,
        _ => address,
    };
    host.trim_start_matches('[').trim_end_matches(']')
}

/// The server's `Status` as an error (or the body as it is).
fn server_error(code: u16, body: &[u8]) -> ClientError {
    let status: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let field = |name: &str| status.get(name).and_then(Value::as_str).map(str::to_owned);
    ClientError::Server {
        code,
        reason: field("reason").unwrap_or_else(|| code.to_string()),
        message: field("message").unwrap_or_else(|| String::from_utf8_lossy(body).into_owned()),
    }
}
