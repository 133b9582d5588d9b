//! Node identity: the cloud's certificate authority, join tokens, node
//! certificates issued from a CSR, and their renewal.
//!
//! A join token is KubeEdge's: `hex(sha256(CA certificate))` + `.` + a JWT
//! (HS256) keyed with the CA's private key as KubeEdge keys it (an EC key's
//! SEC1 DER), carrying its expiry, so a token from a KubeEdge cloudcore
//! whose CA this cloud took over still works. A joining edge fetches the CA over HTTPS without trusting it yet
//! and accepts it only if its hash matches the token; then it sends a CSR
//! with the token and gets a certificate whose common name is its node name.
//! From then on it connects with mutual TLS, and the hub binds every
//! message on that link to that name.

#[cfg(feature = "cloudhub")]
mod ca;
#[cfg(feature = "edgehub")]
mod join;
#[cfg(feature = "cloudhub")]
pub mod ledger;
#[cfg(feature = "cloudhub")]
mod server;

use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rcgen::{CertificateParams, DnType, ExtendedKeyUsagePurpose, KeyPair};
use transports::tls::{Identity, PrivateKeyDer};

#[cfg(feature = "cloudhub")]
pub use ca::CloudCa;
#[cfg(feature = "edgehub")]
pub use join::{JoinError, NodeCredentials, check_token, https_request, join, keep_renewed, renew};
#[cfg(feature = "cloudhub")]
pub use ledger::{JoinLedger, LedgerError, MemoryLedger, Revocations, TokenClaims, TokenRecord};
#[cfg(feature = "cloudhub")]
pub use server::{CertServer, CertServerConfig};

/// How far back a node certificate's validity starts before it is issued
/// (clock skew); its issue time is its `notBefore` plus this.
pub const BACKDATE: Duration = Duration::from_secs(300);

/// When a certificate (DER) was issued, in Unix seconds: its `notBefore`
/// plus [`BACKDATE`].
pub fn issued_at(cert: &[u8]) -> Option<u64> {
    let (_, cert) = x509_parser::parse_x509_certificate(cert).ok()?;
    let not_before = u64::try_from(cert.validity().not_before.timestamp()).ok()?;
    Some(not_before + BACKDATE.as_secs())
}

/// The organizations (what Kubernetes reads as groups) a DER certificate's
/// subject names; none for one that does not read.
pub fn organizations(cert: &[u8]) -> Vec<String> {
    let Ok((_, cert)) = x509_parser::parse_x509_certificate(cert) else {
        return Vec::new();
    };
    cert.subject()
        .iter_organization()
        .filter_map(|o| o.as_str().ok().map(str::to_owned))
        .collect()
}

/// The only organization a node's certificate carries (KubeEdge's form;
/// edgehive's own has none). A certificate of the cloud's CA naming any
/// other is a person's or a program's (the admin API's users, replicas),
/// and never speaks for a node, whatever its common name.
pub const NODES_GROUP: &str = "system:nodes";

/// What a new join token is restricted to.
#[derive(Debug, Clone, Default)]
pub struct TokenSpec {
    /// How long it is valid.
    pub ttl: Duration,
    /// The only node it may join.
    pub node: Option<String>,
    /// Whether it joins once only.
    pub single_use: bool,
}

/// Why a certificate operation failed.
#[derive(Debug, thiserror::Error)]
pub enum CertError {
    /// Reading or writing certificate files failed.
    #[error("{context}: {source}")]
    Io {
        /// Which file.
        context: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// Making or parsing a certificate, key or CSR failed.
    #[error("certificate: {0}")]
    Certificate(String),
    /// The token is not of the form `<ca hash>.<jwt>` or its signature is wrong.
    #[error("invalid join token")]
    InvalidToken,
    /// The token names another certificate authority.
    #[error("join token is for another CA")]
    WrongCa,
    /// The token has expired.
    #[error("join token expired")]
    ExpiredToken,
    /// The token may not join this node (bound elsewhere, used, revoked).
    #[cfg(feature = "cloudhub")]
    #[error(transparent)]
    Refused(#[from] ledger::TokenRefusal),
    /// The token ledger could not be read or written.
    #[error("token ledger: {0}")]
    Ledger(String),
    /// The presented certificate belongs to a deleted node.
    #[error("the certificate of node {0:?} was revoked (the node was deleted); join again")]
    RevokedCertificate(String),
    /// The CSR names no valid node.
    #[error("CSR names no valid node: {0}")]
    BadNodeName(String),
    /// The request's `NodeName` names another node than its CSR.
    #[error("the CSR names node {requested:?}, the NodeName header {named:?}")]
    NodeNameMismatch {
        /// The node in the header.
        named: String,
        /// The node in the CSR.
        requested: String,
    },
    /// A node asked for a certificate of another node.
    #[error("node {presented:?} asked for a certificate of node {requested:?}")]
    ForeignNode {
        /// The node of the presented certificate.
        presented: String,
        /// The node in the CSR.
        requested: String,
    },
}

fn cert_error(e: impl std::fmt::Display) -> CertError {
    CertError::Certificate(e.to_string())
}

fn io_error(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> CertError {
    let context = context.into();
    move |source| CertError::Io { context, source }
}

/// Node names are DNS-1123 subdomains in practice; anything that could
/// change the meaning of a resource string is refused.
pub fn valid_node_name(node: &str) -> bool {
    beehive::names::valid_subdomain(node)
}

#[cfg(feature = "cloudhub")]
fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn offset(at: SystemTime) -> time::OffsetDateTime {
    let secs = at
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    time::OffsetDateTime::from_unix_timestamp(secs).unwrap_or(time::OffsetDateTime::UNIX_EPOCH)
}

/// Hex of the SHA-256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    ring::digest::digest(&ring::digest::SHA256, bytes)
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn write_private(path: &Path, contents: &str) -> Result<(), CertError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .map_err(io_error(path.display().to_string()))?;
    // An existing file keeps its mode on open: make sure it is private.
    std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(0o600))
        .map_err(io_error(path.display().to_string()))?;
    file.write_all(contents.as_bytes())
        .map_err(io_error(path.display().to_string()))
}

/// A self-signed server certificate for `names` (host names or IPs),
/// valid for `ttl`: what an edge's MetaServer serves TLS with when it is
/// given no certificate, as a kubelet does (clients trust it by pinning
/// it; a node's own certificate is for client authentication only).
pub fn self_signed_server(names: &[String], ttl: Duration) -> Result<Identity, CertError> {
    let key = KeyPair::generate().map_err(cert_error)?;
    let mut params = CertificateParams::new(names.to_vec()).map_err(cert_error)?;
    params.distinguished_name.push(
        DnType::CommonName,
        names.first().map_or("metaserver", String::as_str),
    );
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    params.not_before = offset(SystemTime::now() - Duration::from_secs(300));
    params.not_after = offset(SystemTime::now() + ttl);
    let cert = params.self_signed(&key).map_err(cert_error)?;
    Ok((
        vec![cert.der().clone()],
        PrivateKeyDer::Pkcs8(key.serialize_der().into()),
    ))
}

/// MetaServer's serving certificate in `dir`: `metaserver.pem`
/// (certificate and key, readable by its owner only) as kept there, or,
/// the first time, a self-signed one for `names` valid a year, kept there
/// with its certificate alone in `metaserver.crt` for clients to trust.
pub fn metaserver_identity(dir: &Path, names: &[String]) -> Result<Identity, CertError> {
    let bundle = dir.join("metaserver.pem");
    let io = |err: std::io::Error| CertError::Certificate(format!("{}: {err}", bundle.display()));
    match std::fs::read(&bundle) {
        Ok(pem) => {
            let chain = transports::tls::certs_from_pem(&pem).map_err(cert_error)?;
            let key = transports::tls::key_from_pem(&pem).map_err(cert_error)?;
            if chain.is_empty() {
                return Err(CertError::Certificate(format!(
                    "no certificate in {}",
                    bundle.display()
                )));
            }
            Ok((chain, key))
        }
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
            let (chain, key) = self_signed_server(names, Duration::from_secs(365 * 24 * 3600))?;
            let cert = pem_block("CERTIFICATE", chain[0].as_ref());
            std::fs::create_dir_all(dir).map_err(io)?;
            write_private(
                &bundle,
                &(cert.clone() + &pem_block("PRIVATE KEY", key.secret_der())),
            )?;
            std::fs::write(dir.join("metaserver.crt"), cert).map_err(io)?;
            Ok((chain, key))
        }
        Err(err) => Err(io(err)),
    }
}

/// `der` as a PEM block labelled `label`.
pub(crate) fn pem_block(label: &str, der: &[u8]) -> String {
    use base64::Engine as _;
    let body = base64::engine::general_purpose::STANDARD.encode(der);
    let lines: Vec<&str> = body
        .as_bytes()
        .chunks(64)
        .map(|chunk| std::str::from_utf8(chunk).unwrap_or_default())
        .collect();
    format!(
        "-----BEGIN {label}-----\n{}\n-----END {label}-----\n",
        lines.join("\n")
    )
}
