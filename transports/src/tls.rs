//! rustls configuration: TLS 1.3 with the ring provider chosen explicitly
//! (no process-wide default needed), optional mutual TLS, and the peer's
//! identity read from its certificate.

use std::sync::Arc;

use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
pub use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};

use crate::error::TransportError;
use crate::link::PeerIdentity;

fn provider() -> Arc<CryptoProvider> {
    let mut provider = rustls::crypto::ring::default_provider();
    // AES-128-GCM first (rustls puts AES-256 first): strong enough, and
    // cheaper per byte on links that carry a stream of small messages.
    provider
        .cipher_suites
        .sort_by_key(|suite| suite.suite() != rustls::CipherSuite::TLS13_AES_128_GCM_SHA256);
    Arc::new(provider)
}

fn tls_error(context: &str, err: impl std::fmt::Display) -> TransportError {
    TransportError::Tls(format!("{context}: {err}"))
}

fn root_store(roots: &[CertificateDer<'static>]) -> Result<RootCertStore, TransportError> {
    let mut store = RootCertStore::empty();
    for root in roots {
        store
            .add(root.clone())
            .map_err(|e| tls_error("trust anchor", e))?;
    }
    Ok(store)
}

/// A server configuration. With `client_roots`, every client must present
/// a certificate signed by one of them (mutual TLS).
pub fn server_config(
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
    client_roots: Option<&[CertificateDer<'static>]>,
) -> Result<Arc<ServerConfig>, TransportError> {
    let builder = ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| tls_error("protocol versions", e))?;
    let builder = match client_roots {
        Some(roots) => {
            let verifier = WebPkiClientVerifier::builder_with_provider(
                Arc::new(root_store(roots)?),
                provider(),
            )
            .build()
            .map_err(|e| tls_error("client verifier", e))?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let config = builder
        .with_single_cert(chain, key)
        .map_err(|e| tls_error("server certificate", e))?;
    Ok(Arc::new(config))
}

/// A server configuration that asks for a client certificate signed by
/// `client_roots` but also serves clients without one (the join endpoint:
/// a node renews with its certificate, joins with a token).
pub fn server_config_optional_client_auth(
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
    client_roots: &[CertificateDer<'static>],
) -> Result<Arc<ServerConfig>, TransportError> {
    let verifier = WebPkiClientVerifier::builder_with_provider(
        Arc::new(root_store(client_roots)?),
        provider(),
    )
    .allow_unauthenticated()
    .build()
    .map_err(|e| tls_error("client verifier", e))?;
    let config = ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| tls_error("protocol versions", e))?
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain, key)
        .map_err(|e| tls_error("server certificate", e))?;
    Ok(Arc::new(config))
}

/// A client configuration that accepts any server certificate. Only for
/// fetching a CA certificate that is checked afterwards against a hash the
/// caller already trusts (the join token's); never for anything else.
pub fn bootstrap_client_config() -> Result<Arc<ClientConfig>, TransportError> {
    let provider = provider();
    let config = ClientConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| tls_error("protocol versions", e))?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AcceptAnyServer(provider)))
        .with_no_client_auth();
    Ok(Arc::new(config))
}

/// Accepts any server certificate, still checking that the server holds
/// its key (the handshake signature).
#[derive(Debug)]
struct AcceptAnyServer(Arc<CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for AcceptAnyServer {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// A client configuration trusting `roots`, presenting `identity` (a chain
/// and its key) when given.
pub fn client_config(
    roots: &[CertificateDer<'static>],
    identity: Option<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)>,
) -> Result<Arc<ClientConfig>, TransportError> {
    let builder = ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| tls_error("protocol versions", e))?
        .with_root_certificates(root_store(roots)?);
    let config = match identity {
        Some((chain, key)) => builder
            .with_client_auth_cert(chain, key)
            .map_err(|e| tls_error("client certificate", e))?,
        None => builder.with_no_client_auth(),
    };
    Ok(Arc::new(config))
}

/// A client identity that can be replaced while in use (certificate
/// renewal): links opened after [`ReloadableIdentity::replace`] present the
/// new certificate; links already open keep theirs.
#[derive(Debug, Clone)]
pub struct ReloadableIdentity {
    current: Arc<std::sync::RwLock<Arc<rustls::sign::CertifiedKey>>>,
}

impl ReloadableIdentity {
    /// An identity from a chain and its key.
    pub fn new(
        chain: Vec<CertificateDer<'static>>,
        key: PrivateKeyDer<'static>,
    ) -> Result<Self, TransportError> {
        Ok(ReloadableIdentity {
            current: Arc::new(std::sync::RwLock::new(certified(chain, key)?)),
        })
    }

    /// Presents `chain` from now on.
    pub fn replace(
        &self,
        chain: Vec<CertificateDer<'static>>,
        key: PrivateKeyDer<'static>,
    ) -> Result<(), TransportError> {
        let next = certified(chain, key)?;
        *self
            .current
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = next;
        Ok(())
    }

    /// The certificate presented now (leaf first).
    pub fn chain(&self) -> Vec<CertificateDer<'static>> {
        self.current
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .cert
            .clone()
    }
}

fn certified(
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
) -> Result<Arc<rustls::sign::CertifiedKey>, TransportError> {
    let key = provider()
        .key_provider
        .load_private_key(key)
        .map_err(|e| tls_error("client key", e))?;
    Ok(Arc::new(rustls::sign::CertifiedKey::new(chain, key)))
}

impl rustls::client::ResolvesClientCert for ReloadableIdentity {
    fn resolve(
        &self,
        _root_hint_subjects: &[&[u8]],
        _sigschemes: &[rustls::SignatureScheme],
    ) -> Option<Arc<rustls::sign::CertifiedKey>> {
        Some(
            self.current
                .read()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .clone(),
        )
    }

    fn has_certs(&self) -> bool {
        true
    }
}

/// A client configuration trusting `roots` and presenting whatever
/// `identity` holds at the time of each handshake.
pub fn client_config_reloadable(
    roots: &[CertificateDer<'static>],
    identity: ReloadableIdentity,
) -> Result<Arc<ClientConfig>, TransportError> {
    let mut config = ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| tls_error("protocol versions", e))?
        .with_root_certificates(root_store(roots)?)
        .with_client_cert_resolver(Arc::new(identity));
    // A resumed session would keep presenting the certificate of the first
    // handshake; every link does a full handshake with the current one.
    config.resumption = rustls::client::Resumption::disabled();
    Ok(Arc::new(config))
}

/// Certificates from PEM text.
pub fn certs_from_pem(pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, TransportError> {
    CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| tls_error("PEM certificates", e))
}

/// A private key from PEM text.
pub fn key_from_pem(pem: &[u8]) -> Result<PrivateKeyDer<'static>, TransportError> {
    PrivateKeyDer::from_pem_slice(pem).map_err(|e| tls_error("PEM private key", e))
}

/// The server name to verify, from a host name or an IP address.
#[cfg(feature = "ws")]
pub(crate) fn server_name(name: &str) -> Result<ServerName<'static>, TransportError> {
    ServerName::try_from(name.to_owned()).map_err(|e| tls_error("server name", e))
}

/// The common name of a DER certificate's subject, if it has one.
pub fn common_name(der: &[u8]) -> Option<String> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    let name = cert.subject().iter_common_name().next()?;
    name.as_str().ok().map(str::to_owned)
}

/// The identity of a peer from its address and certificate chain.
pub(crate) fn identity(remote: String, chain: Option<&[CertificateDer<'_>]>) -> PeerIdentity {
    let certificates: Vec<Vec<u8>> = chain
        .unwrap_or_default()
        .iter()
        .map(|c| c.as_ref().to_vec())
        .collect();
    PeerIdentity {
        remote,
        common_name: certificates.first().and_then(|leaf| common_name(leaf)),
        certificates,
        headers: Vec::new(),
    }
}

/// A throw-away certificate authority made at run time, for tests,
/// benchmarks and demos (feature `dev-pki`). Production certificates come
/// from the cloud's CA through the join flow.
#[cfg(feature = "dev-pki")]
pub struct DevPki {
    issuer: rcgen::CertifiedIssuer<'static, rcgen::KeyPair>,
}

/// A certificate chain and its private key.
pub type Identity = (Vec<CertificateDer<'static>>, PrivateKeyDer<'static>);

#[cfg(feature = "dev-pki")]
impl DevPki {
    /// A new CA whose certificate has the common name `name`.
    pub fn new(name: &str) -> Result<DevPki, TransportError> {
        use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
        let mut params =
            CertificateParams::new(Vec::<String>::new()).map_err(|e| tls_error("CA", e))?;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        let key = KeyPair::generate().map_err(|e| tls_error("CA key", e))?;
        let issuer =
            rcgen::CertifiedIssuer::self_signed(params, key).map_err(|e| tls_error("CA", e))?;
        Ok(DevPki { issuer })
    }

    /// The CA certificate, to trust.
    pub fn root(&self) -> CertificateDer<'static> {
        self.issuer.der().clone()
    }

    fn leaf(
        &self,
        common_name: &str,
        organization: Option<&str>,
        purpose: rcgen::ExtendedKeyUsagePurpose,
    ) -> Result<Identity, TransportError> {
        use rcgen::{CertificateParams, DnType, KeyPair};
        let mut params =
            CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()])
                .map_err(|e| tls_error("certificate", e))?;
        if let Some(organization) = organization {
            params
                .distinguished_name
                .push(DnType::OrganizationName, organization);
        }
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        params.extended_key_usages = vec![purpose];
        let key = KeyPair::generate().map_err(|e| tls_error("key", e))?;
        let cert = params
            .signed_by(&key, &self.issuer)
            .map_err(|e| tls_error("sign", e))?;
        Ok((
            vec![cert.der().clone()],
            PrivateKeyDer::Pkcs8(key.serialize_der().into()),
        ))
    }

    /// A server certificate for `localhost` and 127.0.0.1, common name `name`.
    pub fn server(&self, name: &str) -> Result<Identity, TransportError> {
        self.leaf(name, None, rcgen::ExtendedKeyUsagePurpose::ServerAuth)
    }

    /// A client certificate with common name `node`.
    pub fn client(&self, node: &str) -> Result<Identity, TransportError> {
        self.leaf(node, None, rcgen::ExtendedKeyUsagePurpose::ClientAuth)
    }

    /// A client certificate with common name `user` and organization
    /// `group` (a person's or a program's, as the admin API's users have).
    pub fn client_in_group(&self, user: &str, group: &str) -> Result<Identity, TransportError> {
        self.leaf(
            user,
            Some(group),
            rcgen::ExtendedKeyUsagePurpose::ClientAuth,
        )
    }
}
