//! The certificate endpoints, over HTTPS as in KubeEdge:
//! `GET /ca.crt` gives the CA certificate (DER); `GET /edge.crt` (KubeEdge's
//! edges) or `POST /edge.crt` takes a CSR (DER or PEM) in the body and
//! gives the node's certificate (DER). A node joins with `Authorization:
//! Bearer <join token>` (the JWT part, as KubeEdge sends it, or the whole
//! token); a node that presents its current certificate renews it, for its
//! own name only. A `NodeName` header, when sent, must name the CSR's node.
//!
//! With a [`JoinLedger`], a token's restrictions hold (its node, single
//! use, revocation: `401` with the reason), and a deleted node's
//! certificate renews nothing (`403`).

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

use super::ledger::{self, Admission};
use super::{CertError, CloudCa, JoinLedger};

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
    /// Token records and revoked nodes; none: tokens are checked by their
    /// signature and claims alone (no single-use tokens, no revocation).
    pub ledger: Option<Arc<dyn JoinLedger>>,
}

impl CertServerConfig {
    /// Endpoints at `address` for a cloud named `server_names`, issuing
    /// certificates for `cert_ttl`, with no ledger.
    pub fn new(address: impl Into<String>, server_names: Vec<String>, cert_ttl: Duration) -> Self {
        CertServerConfig {
            address: address.into(),
            server_names,
            cert_ttl,
            ledger: None,
        }
    }

    /// With `ledger`.
    pub fn with_ledger(mut self, ledger: Arc<dyn JoinLedger>) -> Self {
        self.ledger = Some(ledger);
        self
    }
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
        let issuer = Arc::new(Issuer {
            ca,
            cert_ttl: config.cert_ttl,
            ledger: config.ledger,
        });
        let task = tokio::spawn(serve(listener, TlsAcceptor::from(tls), issuer, stopped));
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

/// What issues certificates: the CA, their lifetime, the ledger.
struct Issuer {
    ca: Arc<CloudCa>,
    cert_ttl: Duration,
    ledger: Option<Arc<dyn JoinLedger>>,
}

async fn serve(
    listener: TcpListener,
    acceptor: TlsAcceptor,
    issuer: Arc<Issuer>,
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
        let (acceptor, issuer) = (acceptor.clone(), issuer.clone());
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
            let leaf = tls
                .get_ref()
                .1
                .peer_certificates()
                .and_then(|chain| chain.first());
            let presented = leaf.and_then(|leaf| {
                let name = tls::common_name(leaf.as_ref())?;
                Some(Presented {
                    node: crate::dialect::node_of_common_name(&name).to_owned(),
                    issued: super::issued_at(leaf.as_ref()).unwrap_or(0),
                })
            });
            let service = hyper::service::service_fn(move |request| {
                let (issuer, presented) = (issuer.clone(), presented.clone());
                async move {
                    Ok::<_, std::convert::Infallible>(
                        route(request, &issuer, presented.as_ref()).await,
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

/// The node certificate a renewing node presented.
#[derive(Clone)]
struct Presented {
    node: String,
    /// When it was issued (Unix seconds).
    issued: u64,
}

async fn route(
    request: Request<Incoming>,
    issuer: &Issuer,
    presented: Option<&Presented>,
) -> Response<Full<Bytes>> {
    match (request.method(), request.uri().path()) {
        (&Method::GET, "/ca.crt") => reply(StatusCode::OK, issuer.ca.root().as_ref().to_vec()),
        (&Method::GET | &Method::POST, "/edge.crt") => issue(request, issuer, presented).await,
        _ => reply(StatusCode::NOT_FOUND, "no such endpoint"),
    }
}

fn refused(status: StatusCode, err: CertError) -> Response<Full<Bytes>> {
    reply(status, err.to_string())
}

async fn issue(
    request: Request<Incoming>,
    issuer: &Issuer,
    presented: Option<&Presented>,
) -> Response<Full<Bytes>> {
    let ca = &issuer.ca;
    let named = match request.headers().get("NodeName").map(|v| v.to_str()) {
        None => None,
        Some(Ok(node)) => Some(node.to_owned()),
        Some(Err(_)) => return reply(StatusCode::BAD_REQUEST, "unreadable NodeName header"),
    };
    let now = super::unix_now();
    let revocations = issuer
        .ledger
        .as_ref()
        .map(|ledger| ledger.revocations())
        .unwrap_or_default();
    // A join's token, checked by signature and claims here; by its state
    // in the ledger once the CSR's node is known.
    let claims = match presented {
        Some(presented) => {
            if revocations.revoked(&presented.node, presented.issued) {
                warn!(node = %presented.node, "renewal refused: the node's certificate was revoked");
                return refused(
                    StatusCode::FORBIDDEN,
                    CertError::RevokedCertificate(presented.node.clone()),
                );
            }
            None
        }
        None => {
            let authorization = request
                .headers()
                .get(hyper::header::AUTHORIZATION)
                .map(|value| value.as_bytes());
            match ca.verify_bearer(authorization) {
                Ok(claims) => Some(claims),
                Err(err) => {
                    warn!(error = %err, "join refused");
                    return refused(StatusCode::UNAUTHORIZED, err);
                }
            }
        }
    };
    let csr = match Limited::new(request.into_body(), MAX_CSR).collect().await {
        Ok(body) => body.to_bytes(),
        Err(_) => {
            return reply(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("a CSR is at most {MAX_CSR} bytes"),
            );
        }
    };
    let node = match CloudCa::csr_node(&csr) {
        Ok(node) => node,
        Err(err) => return refused(StatusCode::BAD_REQUEST, err),
    };
    // A single-use token is spent only once its CSR is signed: a CSR the
    // CA refuses leaves it usable.
    let mut spend = None;
    if let Some(claims) = &claims {
        let record = claims
            .id
            .as_deref()
            .and_then(|id| issuer.ledger.as_ref().and_then(|l| l.token(id)));
        let admission = ledger::admit(claims, record.as_ref(), issuer.ledger.is_some(), &node, now);
        let admission = match admission {
            Ok(admission) => admission,
            Err(err) => {
                warn!(%node, token = claims.id.as_deref().unwrap_or("-"), reason = %err, "join refused");
                return refused(StatusCode::UNAUTHORIZED, err.into());
            }
        };
        // The CSR must be signable before a single-use token is spent.
        if let Some(named) = &named
            && *named != node
        {
            return refused(
                StatusCode::BAD_REQUEST,
                CertError::NodeNameMismatch {
                    named: named.clone(),
                    requested: node,
                },
            );
        }
        spend = matches!(admission, Admission::Consume { .. }).then(|| claims.clone());
    }
    let issued = std::time::UNIX_EPOCH + Duration::from_secs(revocations.issue_time(&node, now));
    let (signed_for, cert) = match ca.sign_csr_at(
        &csr,
        issued,
        SystemTime::now() + issuer.cert_ttl,
        presented.map(|p| p.node.as_str()),
        named.as_deref(),
    ) {
        Ok(signed) => signed,
        Err(err @ CertError::ForeignNode { .. }) => return refused(StatusCode::FORBIDDEN, err),
        Err(err) => return refused(StatusCode::BAD_REQUEST, err),
    };
    if let (Some(claims), Some(ledger)) = (spend, &issuer.ledger) {
        match ledger.consume(claims.clone(), node.clone(), now).await {
            Ok(()) => {}
            Err(super::LedgerError::Refused(err)) => {
                warn!(%node, token = claims.id.as_deref().unwrap_or("-"), reason = %err, "join refused");
                return refused(StatusCode::UNAUTHORIZED, err.into());
            }
            Err(err) => {
                warn!(%node, error = %err, "join not served: the token ledger failed");
                return refused(
                    StatusCode::SERVICE_UNAVAILABLE,
                    CertError::Ledger(err.to_string()),
                );
            }
        }
    }
    info!(node = %signed_for, renewal = presented.is_some(), "node certificate issued");
    reply(StatusCode::OK, cert.as_ref().to_vec())
}
