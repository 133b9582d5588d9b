//! The certificate endpoints, over HTTPS as in KubeEdge:
//! `GET /ca.crt` gives the CA certificate (DER); `GET /edge.crt` (KubeEdge's
//! edges) or `POST /edge.crt` takes a CSR (DER or PEM) in the body and
//! gives the node's certificate (DER). A node joins with `Authorization:
//! Bearer <join token>` (the JWT part, as KubeEdge sends it, or the whole
//! token); a node that presents its current certificate renews it, for its
//! own name only. A `NodeName` header, when sent, must name the CSR's node.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;
use tracing::{info, warn};
use transports::tls;

use super::{CertError, CloudCa};

/// Largest CSR accepted.
const MAX_CSR: usize = 64 * 1024;

/// Connections served at once.
const MAX_CONNECTIONS: usize = 256;

/// How the certificate endpoints run.
#[derive(Clone)]
pub struct CertServerConfig {
    /// Where to listen (`ip:port`; KubeEdge uses 10002).
    pub address: String,
    /// Names of the cloud in its server certificate.
    pub server_names: Vec<String>,
    /// Lifetime of issued node certificates.
    pub cert_ttl: Duration,
}

/// The running certificate endpoints.
pub struct CertServer {
    /// The bound address.
    pub address: SocketAddr,
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl CertServer {
    /// Binds and serves until [`CertServer::stop`].
    pub async fn start(
        ca: Arc<CloudCa>,
        config: CertServerConfig,
    ) -> Result<CertServer, CertError> {
        let (chain, key) =
            ca.issue_server(&config.server_names, Duration::from_secs(365 * 24 * 3600))?;
        let tls = tls::server_config_optional_client_auth(chain, key, &[ca.root()])
            .map_err(super::cert_error)?;
        let listener = TcpListener::bind(&config.address)
            .await
            .map_err(super::io_error(format!("bind {}", config.address)))?;
        let address = listener
            .local_addr()
            .map_err(super::io_error("local address"))?;
        info!(%address, "certificate endpoints listening");
        let (stop, stopped) = watch::channel(false);
        let task = tokio::spawn(serve(
            listener,
            TlsAcceptor::from(tls),
            ca,
            config.cert_ttl,
            stopped,
        ));
        Ok(CertServer {
            address,
            stop,
            task,
        })
    }

    /// Stops serving and releases the address.
    pub async fn stop(self) {
        self.stop.send_replace(true);
        let _ = self.task.await;
    }
}

async fn serve(
    listener: TcpListener,
    acceptor: TlsAcceptor,
    ca: Arc<CloudCa>,
    cert_ttl: Duration,
    mut stop: watch::Receiver<bool>,
) {
    let connections = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = stop.wait_for(|stop| *stop) => return,
        };
        let (tcp, remote) = match accepted {
            Ok(accepted) => accepted,
            Err(err) => {
                warn!(error = %err, "certificate endpoint accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        // At most this many connections at once; more wait to be served.
        let Ok(permit) = connections.clone().acquire_owned().await else {
            return;
        };
        let (acceptor, ca) = (acceptor.clone(), ca.clone());
        tokio::spawn(async move {
            let tls =
                match tokio::time::timeout(Duration::from_secs(10), acceptor.accept(tcp)).await {
                    Ok(Ok(tls)) => tls,
                    _ => {
                        warn!(%remote, "certificate endpoint: TLS handshake failed");
                        return;
                    }
                };
            // A verified client certificate (renewal) names its node.
            let presented = tls
                .get_ref()
                .1
                .peer_certificates()
                .and_then(|chain| chain.first())
                .and_then(|leaf| tls::common_name(leaf.as_ref()))
                .map(|name| crate::dialect::node_of_common_name(&name).to_owned());
            let service = hyper::service::service_fn(move |request| {
                let (ca, presented) = (ca.clone(), presented.clone());
                async move {
                    Ok::<_, std::convert::Infallible>(
                        route(request, &ca, cert_ttl, presented.as_deref()).await,
                    )
                }
            });
            // Slow or idle clients are cut off: headers within 10 s, the
            // whole connection within a minute, no keep-alive.
            let connection = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(Duration::from_secs(10))
                .keep_alive(false)
                .serve_connection(TokioIo::new(tls), service);
            match tokio::time::timeout(Duration::from_secs(60), connection).await {
                Ok(Ok(())) => {}
                Ok(Err(err)) => {
                    warn!(%remote, error = %err, "certificate endpoint connection failed")
                }
                Err(_) => warn!(%remote, "certificate endpoint connection took too long; closed"),
            }
            drop(permit);
        });
    }
}

fn reply(status: StatusCode, body: impl Into<Bytes>) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(body.into()));
    *response.status_mut() = status;
    response
}

async fn route(
    request: Request<Incoming>,
    ca: &CloudCa,
    cert_ttl: Duration,
    presented: Option<&str>,
) -> Response<Full<Bytes>> {
    match (request.method(), request.uri().path()) {
        (&Method::GET, "/ca.crt") => reply(StatusCode::OK, ca.root().as_ref().to_vec()),
        (&Method::GET | &Method::POST, "/edge.crt") => {
            issue(request, ca, cert_ttl, presented).await
        }
        _ => reply(StatusCode::NOT_FOUND, "no such endpoint"),
    }
}

async fn issue(
    request: Request<Incoming>,
    ca: &CloudCa,
    cert_ttl: Duration,
    presented: Option<&str>,
) -> Response<Full<Bytes>> {
    let named = match request.headers().get("NodeName").map(|v| v.to_str()) {
        None => None,
        Some(Ok(node)) => Some(node.to_owned()),
        Some(Err(_)) => return reply(StatusCode::BAD_REQUEST, "unreadable NodeName header"),
    };
    if presented.is_none() {
        let token = request
            .headers()
            .get(hyper::header::AUTHORIZATION)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.strip_prefix("Bearer "))
            .unwrap_or_default()
            .trim();
        // KubeEdge's edges send the JWT only: the CA hash is theirs to check.
        let token = match token.split('.').count() {
            3 => format!("{}.{token}", super::sha256_hex(ca.root().as_ref())),
            _ => token.to_owned(),
        };
        if let Err(err) = ca.check_token(&token) {
            warn!(error = %err, "join refused");
            return reply(StatusCode::UNAUTHORIZED, err.to_string());
        }
    }
    let csr = match Limited::new(request.into_body(), MAX_CSR).collect().await {
        Ok(body) => body.to_bytes(),
        Err(_) => {
            return reply(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("a CSR is at most {MAX_CSR} bytes"),
            );
        }
    };
    match ca.sign_csr(
        &csr,
        SystemTime::now() + cert_ttl,
        presented,
        named.as_deref(),
    ) {
        Ok((node, cert)) => {
            info!(%node, renewal = presented.is_some(), "node certificate issued");
            reply(StatusCode::OK, cert.as_ref().to_vec())
        }
        Err(err @ CertError::ForeignNode { .. }) => reply(StatusCode::FORBIDDEN, err.to_string()),
        Err(err) => reply(StatusCode::BAD_REQUEST, err.to_string()),
    }
}
