//! The edge side of node identity: join with a token, keep the credentials
//! on disk, renew the certificate with itself.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use rcgen::{CertificateParams, DnType, KeyPair};
use rustls::ClientConfig;
use tokio_rustls::TlsConnector;
use transports::tls::{self, CertificateDer, PrivateKeyDer};

use super::{sha256_hex, valid_node_name};

/// Largest response body accepted from the certificate endpoints.
const MAX_RESPONSE: usize = 64 * 1024;

/// Why joining or renewing failed.
#[derive(Debug, thiserror::Error)]
pub enum JoinError {
    /// The token is not `<ca hash>.<jwt>`: nothing was sent to the cloud.
    #[error(
        "the join token is malformed: {0}; a token is `<CA hash>.<JWT>`, as `cloudcore token` \
         (or keadm gettoken) prints it"
    )]
    BadToken(&'static str),
    /// The CA the cloud served does not match the token: someone is in the way.
    #[error("the cloud's CA certificate does not match the join token")]
    CaMismatch,
    /// The node name is not a valid name.
    #[error("invalid node name {0:?}")]
    BadNodeName(String),
    /// The cloud refused (bad or expired token, foreign node, ...).
    #[error("the cloud refused: {status} {reason}")]
    Refused {
        /// HTTP status.
        status: StatusCode,
        /// The cloud's reason.
        reason: String,
    },
    /// Talking to the certificate endpoints failed.
    #[error("certificate endpoint: {0}")]
    Http(String),
    /// Reading or writing credential files failed.
    #[error("{context}: {source}")]
    Io {
        /// Which file.
        context: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A key, CSR or certificate could not be made or read.
    #[error("certificate: {0}")]
    Certificate(String),
}

fn http(e: impl std::fmt::Display) -> JoinError {
    JoinError::Http(e.to_string())
}

fn certificate(e: impl std::fmt::Display) -> JoinError {
    JoinError::Certificate(e.to_string())
}

/// A node's identity: its name, the cloud's CA, its certificate and key.
pub struct NodeCredentials {
    /// The node name (the certificate's common name).
    pub node: String,
    /// The cloud's CA certificate.
    pub ca: CertificateDer<'static>,
    /// The node's certificate.
    pub cert: CertificateDer<'static>,
    /// The node's private key.
    pub key: PrivateKeyDer<'static>,
}

impl Clone for NodeCredentials {
    fn clone(&self) -> Self {
        NodeCredentials {
            node: self.node.clone(),
            ca: self.ca.clone(),
            cert: self.cert.clone(),
            key: self.key.clone_key(),
        }
    }
}

impl NodeCredentials {
    /// Loads `ca.crt` and `node.pem` (certificate and key, PEM) from `dir`,
    /// if a join stored them there.
    pub fn load(dir: &Path) -> Result<Option<NodeCredentials>, JoinError> {
        let read = |name: &str| -> Result<Option<Vec<u8>>, JoinError> {
            let path = dir.join(name);
            match std::fs::read(&path) {
                Ok(bytes) => Ok(Some(bytes)),
                Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(None),
                Err(source) => Err(JoinError::Io {
                    context: path.display().to_string(),
                    source,
                }),
            }
        };
        let (Some(ca), Some(bundle)) = (read("ca.crt")?, read("node.pem")?) else {
            return Ok(None);
        };
        let (cert, key) = (bundle.clone(), bundle);
        let first = |pem: &[u8]| -> Result<CertificateDer<'static>, JoinError> {
            tls::certs_from_pem(pem)
                .map_err(certificate)?
                .into_iter()
                .next()
                .ok_or_else(|| JoinError::Certificate("no certificate in file".into()))
        };
        let cert = first(&cert)?;
        let node = tls::common_name(cert.as_ref())
            .map(|name| crate::dialect::node_of_common_name(&name).to_owned())
            .ok_or_else(|| JoinError::Certificate("no common name".into()))?;
        Ok(Some(NodeCredentials {
            node,
            ca: first(&ca)?,
            cert,
            key: tls::key_from_pem(&key).map_err(certificate)?,
        }))
    }

    /// Whether [`NodeCredentials::save`] could store credentials in `dir`:
    /// makes it, writes a private file there and renames it, as `save`
    /// does, and removes it. A join checks this before presenting its
    /// token, so that a directory that cannot hold the credentials never
    /// uses up a single-use token.
    pub fn check_writable(dir: &Path) -> Result<(), JoinError> {
        let io = |path: &Path| {
            let context = path.display().to_string();
            move |source| JoinError::Io { context, source }
        };
        std::fs::create_dir_all(dir).map_err(io(dir))?;
        let probe = dir.join(".join-probe.tmp");
        super::write_private(&probe, "probe").map_err(|e| JoinError::Io {
            context: probe.display().to_string(),
            source: std::io::Error::other(e.to_string()),
        })?;
        let renamed = dir.join(".join-probe");
        std::fs::rename(&probe, &renamed).map_err(io(&probe))?;
        std::fs::remove_file(&renamed).map_err(io(&renamed))
    }

    /// Stores the credentials in `dir`: `ca.crt`, and `node.pem` with the
    /// certificate and its key (readable by its owner only).
    pub fn save(&self, dir: &Path) -> Result<(), JoinError> {
        let io = |path: &Path| {
            let context = path.display().to_string();
            move |source| JoinError::Io { context, source }
        };
        std::fs::create_dir_all(dir).map_err(io(dir))?;
        let pem = super::pem_block;
        // The certificate and its key go in one file, written aside and
        // renamed into place: a crash leaves the old pair or the new one,
        // never a certificate with the wrong key.
        let bundle =
            pem("CERTIFICATE", self.cert.as_ref()) + &pem("PRIVATE KEY", self.key.secret_der());
        let bundle_tmp = dir.join("node.pem.tmp");
        super::write_private(&bundle_tmp, &bundle)
            .map_err(|e| JoinError::Certificate(e.to_string()))?;
        let ca_tmp = dir.join("ca.crt.tmp");
        std::fs::write(&ca_tmp, pem("CERTIFICATE", self.ca.as_ref())).map_err(io(&ca_tmp))?;
        std::fs::rename(&ca_tmp, dir.join("ca.crt")).map_err(io(&ca_tmp))?;
        std::fs::rename(&bundle_tmp, dir.join("node.pem")).map_err(io(&bundle_tmp))
    }

    /// A TLS client configuration for the hub: trusts the cloud's CA,
    /// presents the node's certificate.
    pub fn client_tls(&self) -> Result<Arc<ClientConfig>, JoinError> {
        tls::client_config(
            std::slice::from_ref(&self.ca),
            Some((vec![self.cert.clone()], self.key.clone_key())),
        )
        .map_err(certificate)
    }

    /// When the certificate stops being valid.
    pub fn not_after(&self) -> Result<SystemTime, JoinError> {
        Ok(self.validity()?.1)
    }

    /// When the certificate starts and stops being valid.
    pub fn validity(&self) -> Result<(SystemTime, SystemTime), JoinError> {
        let (_, cert) =
            x509_parser::parse_x509_certificate(self.cert.as_ref()).map_err(certificate)?;
        let at = |secs: i64| UNIX_EPOCH + Duration::from_secs(u64::try_from(secs).unwrap_or(0));
        Ok((
            at(cert.validity().not_before.timestamp()),
            at(cert.validity().not_after.timestamp()),
        ))
    }

    /// When to renew: once two thirds of the certificate's lifetime have
    /// passed (kubelet and KubeEdge rotate at a similar point).
    pub fn renew_at(&self) -> Result<SystemTime, JoinError> {
        let (not_before, not_after) = self.validity()?;
        let lifetime = not_after.duration_since(not_before).unwrap_or_default();
        Ok(not_before + lifetime * 2 / 3)
    }

    /// The identity to present, replaceable on renewal.
    pub fn reloadable(&self) -> Result<tls::ReloadableIdentity, JoinError> {
        tls::ReloadableIdentity::new(vec![self.cert.clone()], self.key.clone_key())
            .map_err(certificate)
    }
}

/// Keeps a node's certificate fresh: sleeps until it is due, renews it with
/// the cloud at `address`, stores it in `dir` and hands it to `identity`,
/// so that every later link presents it. A failed attempt is retried a
/// minute later. Runs until the task is dropped.
pub async fn keep_renewed(
    address: String,
    server_name: String,
    dir: std::path::PathBuf,
    mut credentials: NodeCredentials,
    identity: tls::ReloadableIdentity,
) {
    loop {
        let due = credentials
            .renew_at()
            .unwrap_or_else(|_| SystemTime::now())
            .duration_since(SystemTime::now())
            .unwrap_or_default();
        tokio::time::sleep(due).await;
        match renew(&address, &server_name, &credentials).await {
            Ok(renewed) => {
                if let Err(err) = renewed.save(&dir) {
                    tracing::warn!(error = %err, "renewed certificate not stored");
                }
                if let Err(err) =
                    identity.replace(vec![renewed.cert.clone()], renewed.key.clone_key())
                {
                    tracing::warn!(error = %err, "renewed certificate not taken up");
                } else {
                    tracing::info!(node = %renewed.node, "certificate renewed");
                }
                credentials = renewed;
            }
            Err(err) => {
                tracing::warn!(error = %err, "certificate renewal failed; retrying in a minute");
                tokio::time::sleep(Duration::from_secs(60)).await;
            }
        }
    }
}

/// A fresh key and a CSR naming `node`.
fn key_and_csr(node: &str) -> Result<(KeyPair, Vec<u8>), JoinError> {
    let key = KeyPair::generate().map_err(certificate)?;
    let mut params = CertificateParams::new(Vec::<String>::new()).map_err(certificate)?;
    params.distinguished_name.push(DnType::CommonName, node);
    let csr = params.serialize_request(&key).map_err(certificate)?;
    Ok((key, csr.der().to_vec()))
}

/// One HTTPS request to a cloud's certificate endpoints at `address`
/// (at most 30 s; the answer's body at most 1 MiB).
pub async fn https_request(
    address: &str,
    server_name: &str,
    tls_config: Arc<ClientConfig>,
    method: Method,
    path: &str,
    headers: &[(&str, &str)],
    body: Vec<u8>,
) -> Result<(StatusCode, Bytes), JoinError> {
    let exchange = async {
        let tcp = tokio::net::TcpStream::connect(address)
            .await
            .map_err(http)?;
        let name = tls::ServerName::try_from(server_name.to_owned()).map_err(http)?;
        let stream = TlsConnector::from(tls_config)
            .connect(name, tcp)
            .await
            .map_err(http)?;
        let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(http)?;
        tokio::spawn(connection);
        let mut builder = Request::builder()
            .method(method)
            .uri(path)
            .header(hyper::header::HOST, server_name);
        for (name, value) in headers {
            builder = builder.header(*name, *value);
        }
        let request = builder.body(Full::new(Bytes::from(body))).map_err(http)?;
        let response = sender.send_request(request).await.map_err(http)?;
        let status = response.status();
        let body = Limited::new(response.into_body(), MAX_RESPONSE)
            .collect()
            .await
            .map_err(http)?
            .to_bytes();
        Ok((status, body))
    };
    tokio::time::timeout(Duration::from_secs(30), exchange)
        .await
        .map_err(|_| JoinError::Http("timed out".into()))?
}

fn expect_ok(status: StatusCode, body: Bytes) -> Result<Bytes, JoinError> {
    if status == StatusCode::OK {
        Ok(body)
    } else {
        Err(JoinError::Refused {
            status,
            reason: String::from_utf8_lossy(&body).into_owned(),
        })
    }
}

/// Joins the cloud whose certificate endpoints listen at `address`: fetches
/// its CA and checks it against the token, then gets a certificate for
/// `node` with the token.
pub async fn join(
    address: &str,
    server_name: &str,
    token: &str,
    node: &str,
) -> Result<NodeCredentials, JoinError> {
    if !valid_node_name(node) {
        return Err(JoinError::BadNodeName(node.to_owned()));
    }
    let token = token.trim();
    let ca_hash = token_ca_hash(token)?;
    let bootstrap = tls::bootstrap_client_config().map_err(certificate)?;
    let (status, ca) = https_request(
        address,
        server_name,
        bootstrap,
        Method::GET,
        "/ca.crt",
        &[],
        Vec::new(),
    )
    .await?;
    let ca = expect_ok(status, ca)?;
    if sha256_hex(&ca) != ca_hash {
        return Err(JoinError::CaMismatch);
    }
    let ca = CertificateDer::from(ca.to_vec());
    let trusting = tls::client_config(std::slice::from_ref(&ca), None).map_err(certificate)?;
    let (key, csr) = key_and_csr(node)?;
    // As KubeEdge's edges ask: GET with the CSR, the node named in a header.
    let bearer = format!("Bearer {token}");
    let (status, cert) = https_request(
        address,
        server_name,
        trusting,
        Method::GET,
        "/edge.crt",
        &[("Authorization", &bearer), ("NodeName", node)],
        csr,
    )
    .await?;
    let cert = CertificateDer::from(expect_ok(status, cert)?.to_vec());
    Ok(NodeCredentials {
        node: node.to_owned(),
        ca,
        cert,
        key: PrivateKeyDer::Pkcs8(key.serialize_der().into()),
    })
}

/// Whether `token` reads as a join token (see [`join`]), before anything is
/// sent: `edgecore join` checks it first of all.
pub fn check_token(token: &str) -> Result<(), JoinError> {
    token_ca_hash(token.trim()).map(drop)
}

/// The CA hash of a join token `<CA hash>.<JWT>` (64 hex digits, then a
/// JWT's three base64url parts), checked before anything is sent, so that a
/// token cut short or pasted without its hash is named as such rather than
/// taken for a CA that does not match.
fn token_ca_hash(token: &str) -> Result<&str, JoinError> {
    let Some((ca_hash, jwt)) = token.split_once('.') else {
        return Err(JoinError::BadToken("it has no `.`"));
    };
    if ca_hash.starts_with("eyJ") {
        return Err(JoinError::BadToken(
            "it starts with a JWT; the CA's hash must come first",
        ));
    }
    // Lower case, as every token is printed: the cloud compares it so.
    if ca_hash.len() != 64
        || !ca_hash
            .bytes()
            .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    {
        return Err(JoinError::BadToken(
            "its CA hash is not 64 lower-case hexadecimal digits",
        ));
    }
    let base64url = |part: &str| {
        !part.is_empty()
            && part
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'=')
    };
    let parts: Vec<&str> = jwt.split('.').collect();
    if parts.len() != 3 || !parts.iter().all(|part| base64url(part)) {
        return Err(JoinError::BadToken(
            "what follows the CA hash is not a JWT (three base64url parts)",
        ));
    }
    Ok(ca_hash)
}

/// Renews a node's certificate (a new key too), authenticating with the
/// current one.
pub async fn renew(
    address: &str,
    server_name: &str,
    current: &NodeCredentials,
) -> Result<NodeCredentials, JoinError> {
    let (key, csr) = key_and_csr(&current.node)?;
    let (status, cert) = https_request(
        address,
        server_name,
        current.client_tls()?,
        Method::GET,
        "/edge.crt",
        &[("NodeName", &current.node)],
        csr,
    )
    .await?;
    let cert = CertificateDer::from(expect_ok(status, cert)?.to_vec());
    Ok(NodeCredentials {
        node: current.node.clone(),
        ca: current.ca.clone(),
        cert,
        key: PrivateKeyDer::Pkcs8(key.serialize_der().into()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_is_read_before_anything_is_sent() {
        let hash = "ab".repeat(32);
        let jwt = "eyJhbGciOiJIUzI1NiJ9.eyJleHAiOjF9.c2ln-_";
        let token = format!("{hash}.{jwt}");
        assert_eq!(token_ca_hash(&token).expect("a token"), hash);
        let refused = |token: &str| match token_ca_hash(token) {
            Err(JoinError::BadToken(why)) => why,
            other => panic!("{token:?} read as {other:?}"),
        };
        assert!(refused("no-dot-at-all").contains("no `.`"));
        assert!(refused(&format!("{hash}.")).contains("not a JWT"));
        assert!(refused(jwt).contains("starts with a JWT"));
        assert!(refused(&format!("{}.{jwt}", &hash[..63])).contains("64 lower-case"));
        assert!(refused(&format!("{}.{jwt}", hash.to_uppercase())).contains("64 lower-case"));
        assert!(refused(&format!("{hash}.{}", &jwt[..20])).contains("not a JWT"));
        assert!(refused(&format!("{hash}.{jwt}.x")).contains("not a JWT"));
        let shown = JoinError::BadToken("it has no `.`").to_string();
        assert!(shown.contains("cloudcore token"), "{shown}");
    }
}
