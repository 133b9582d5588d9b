//! The cloud's certificate authority (cloudhub's side of joining): it
//! creates or loads the CA, signs join tokens (KubeEdge's format, keyed as
//! KubeEdge keys them) and node certificates from a CSR.

use std::path::Path;
use std::time::{Duration, SystemTime};

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use rcgen::{
    BasicConstraints, CertificateParams, CertificateSigningRequestParams, DnType, DnValue,
    ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose,
};
use transports::tls::{CertificateDer, Identity, PrivateKeyDer};

use super::ledger::TokenClaims;
use super::{
    BACKDATE, CertError, TokenSpec, cert_error, io_error, offset, sha256_hex, unix_now,
    valid_node_name, write_private,
};

/// The cloud's certificate authority.
pub struct CloudCa {
    issuer: Issuer<'static, KeyPair>,
    cert: CertificateDer<'static>,
    /// Signs tokens: the key's SEC1 DER (KubeEdge's), or its PKCS#8 DER
    /// when it is not an EC P-256 key.
    token_key: ring::hmac::Key,
    /// Also accepted: the PKCS#8 DER key of edgehive's earlier tokens.
    older_token_key: ring::hmac::Key,
}

impl CloudCa {
    /// Loads `ca.crt` and `ca.key` (PEM) from `dir`, or creates them (the
    /// key readable by its owner only).
    pub fn load_or_create(dir: &Path) -> Result<CloudCa, CertError> {
        let (cert_path, key_path) = (dir.join("ca.crt"), dir.join("ca.key"));
        if cert_path.exists() && key_path.exists() {
            let cert_pem = std::fs::read_to_string(&cert_path)
                .map_err(io_error(cert_path.display().to_string()))?;
            let key_pem = std::fs::read_to_string(&key_path)
                .map_err(io_error(key_path.display().to_string()))?;
            return CloudCa::from_pem(&cert_pem, &key_pem);
        }
        std::fs::create_dir_all(dir).map_err(io_error(dir.display().to_string()))?;
        let key = KeyPair::generate().map_err(cert_error)?;
        let mut params = CertificateParams::new(Vec::<String>::new()).map_err(cert_error)?;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, "edgehive cloud CA");
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        params.not_before = offset(SystemTime::now() - Duration::from_secs(300));
        params.not_after = offset(SystemTime::now() + Duration::from_secs(10 * 365 * 24 * 3600));
        let cert = params.self_signed(&key).map_err(cert_error)?;
        std::fs::write(&cert_path, cert.pem())
            .map_err(io_error(cert_path.display().to_string()))?;
        write_private(&key_path, &key.serialize_pem())?;
        CloudCa::from_pem(&cert.pem(), &key.serialize_pem())
    }

    /// A CA from its certificate and key in PEM.
    pub fn from_pem(cert_pem: &str, key_pem: &str) -> Result<CloudCa, CertError> {
        let key = match transports::tls::key_from_pem(key_pem.as_bytes()) {
            // KubeEdge's CA key: SEC1.
            Ok(PrivateKeyDer::Sec1(sec1)) => {
                let pkcs8 = p256_pkcs8_der(sec1.secret_sec1_der()).ok_or_else(|| {
                    CertError::Certificate("an EC CA key must be P-256 with its public key".into())
                })?;
                KeyPair::try_from(&PrivateKeyDer::Pkcs8(pkcs8.into()))
            }
            _ => KeyPair::from_pem(key_pem),
        }
        .map_err(cert_error)?;
        let pkcs8 = key.serialized_der();
        let token_key = ring::hmac::Key::new(
            ring::hmac::HMAC_SHA256,
            &p256_sec1_der(pkcs8).unwrap_or_else(|| pkcs8.to_vec()),
        );
        let older_token_key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, pkcs8);
        let issuer = Issuer::from_ca_cert_pem(cert_pem, key).map_err(cert_error)?;
        let cert = transports::tls::certs_from_pem(cert_pem.as_bytes())
            .map_err(cert_error)?
            .into_iter()
            .next()
            .ok_or_else(|| CertError::Certificate("no certificate in the CA file".into()))?;
        Ok(CloudCa {
            issuer,
            cert,
            token_key,
            older_token_key,
        })
    }

    /// The CA certificate.
    pub fn root(&self) -> CertificateDer<'static> {
        self.cert.clone()
    }

    /// A server certificate for the cloud's `names` (host names or IPs).
    pub fn issue_server(&self, names: &[String], ttl: Duration) -> Result<Identity, CertError> {
        let key = KeyPair::generate().map_err(cert_error)?;
        let mut params = CertificateParams::new(names.to_vec()).map_err(cert_error)?;
        params
            .distinguished_name
            .push(DnType::CommonName, "edgehive cloudcore");
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.not_before = offset(SystemTime::now() - Duration::from_secs(300));
        params.not_after = offset(SystemTime::now() + ttl);
        let cert = params.signed_by(&key, &self.issuer).map_err(cert_error)?;
        Ok((
            vec![cert.der().clone(), self.cert.clone()],
            PrivateKeyDer::Pkcs8(key.serialize_der().into()),
        ))
    }

    /// A client certificate for a person or a program (the admin API's
    /// users): common name `user`, organization `group` (what Kubernetes
    /// reads as the user's group), valid for `ttl`.
    pub fn issue_client(
        &self,
        user: &str,
        group: &str,
        ttl: Duration,
    ) -> Result<Identity, CertError> {
        let key = KeyPair::generate().map_err(cert_error)?;
        let mut params = CertificateParams::new(Vec::<String>::new()).map_err(cert_error)?;
        params
            .distinguished_name
            .push(DnType::OrganizationName, group);
        params.distinguished_name.push(DnType::CommonName, user);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.not_before = offset(SystemTime::now() - Duration::from_secs(300));
        params.not_after = offset(SystemTime::now() + ttl);
        let cert = params.signed_by(&key, &self.issuer).map_err(cert_error)?;
        Ok((
            vec![cert.der().clone()],
            PrivateKeyDer::Pkcs8(key.serialize_der().into()),
        ))
    }

    /// A join token valid for `ttl`, for any node, reusable.
    pub fn issue_token(&self, ttl: Duration) -> String {
        self.issue_restricted_token(&TokenSpec {
            ttl,
            ..TokenSpec::default()
        })
        .1
    }

    /// A join token with the restrictions of `spec` (its claims carry
    /// them, under the signature) and a fresh id: its claims and the token.
    pub fn issue_restricted_token(&self, spec: &TokenSpec) -> (TokenClaims, String) {
        let claims = TokenClaims {
            id: Some(format!("{:016x}", fastrand::u64(..))),
            expires: unix_now() + spec.ttl.as_secs(),
            node: spec.node.clone(),
            single_use: spec.single_use,
        };
        let mut payload = serde_json::json!({"exp": claims.expires, "jti": claims.id});
        if let Some(node) = &claims.node {
            payload["node"] = node.clone().into();
        }
        if claims.single_use {
            payload["singleUse"] = true.into();
        }
        let header = URL_SAFE_NO_PAD.encode(br#"{"alg":"HS256","typ":"JWT"}"#);
        let payload = URL_SAFE_NO_PAD.encode(payload.to_string());
        let signed = format!("{header}.{payload}");
        let signature =
            URL_SAFE_NO_PAD.encode(ring::hmac::sign(&self.token_key, signed.as_bytes()));
        let token = format!("{}.{signed}.{signature}", sha256_hex(self.cert.as_ref()));
        (claims, token)
    }

    /// Checks a join token: this CA, a valid signature, not expired.
    pub fn check_token(&self, token: &str) -> Result<(), CertError> {
        let claims = self.verify_token(token)?;
        if claims.expires <= unix_now() {
            return Err(CertError::ExpiredToken);
        }
        Ok(())
    }

    /// A join token's claims, if it names this CA and its signature holds
    /// (expiry not checked: see [`ledger::admit`]).
    pub fn verify_token(&self, token: &str) -> Result<TokenClaims, CertError> {
        let (ca_hash, jwt) = token.split_once('.').ok_or(CertError::InvalidToken)?;
        if ca_hash != sha256_hex(self.cert.as_ref()) {
            return Err(CertError::WrongCa);
        }
        let (signed, signature) = jwt.rsplit_once('.').ok_or(CertError::InvalidToken)?;
        let signature = URL_SAFE_NO_PAD
            .decode(signature)
            .map_err(|_| CertError::InvalidToken)?;
        [&self.token_key, &self.older_token_key]
            .into_iter()
            .find(|key| ring::hmac::verify(key, signed.as_bytes(), &signature).is_ok())
            .ok_or(CertError::InvalidToken)?;
        let (_, payload) = signed.split_once('.').ok_or(CertError::InvalidToken)?;
        let payload = URL_SAFE_NO_PAD
            .decode(payload)
            .map_err(|_| CertError::InvalidToken)?;
        let claims: serde_json::Value =
            serde_json::from_slice(&payload).map_err(|_| CertError::InvalidToken)?;
        Ok(TokenClaims {
            id: claims["jti"].as_str().map(str::to_owned),
            expires: claims["exp"].as_u64().ok_or(CertError::InvalidToken)?,
            node: claims["node"].as_str().map(str::to_owned),
            single_use: claims["singleUse"].as_bool().unwrap_or(false),
        })
    }

    /// A join request's token claims, from its `Authorization` header
    /// (`Bearer <token>`): the whole token, or the JWT part alone as
    /// KubeEdge's edges send it (the CA hash is theirs to check). The
    /// header's bytes are untrusted: anything unreadable is an invalid token.
    pub fn verify_bearer(&self, authorization: Option<&[u8]>) -> Result<TokenClaims, CertError> {
        let token = authorization
            .and_then(|value| std::str::from_utf8(value).ok())
            .and_then(|value| value.strip_prefix("Bearer "))
            .unwrap_or_default()
            .trim();
        let token = match token.split('.').count() {
            3 => format!("{}.{token}", sha256_hex(self.cert.as_ref())),
            _ => token.to_owned(),
        };
        self.verify_token(&token)
    }

    /// The node a CSR (DER or PEM) names.
    pub fn csr_node(csr: &[u8]) -> Result<String, CertError> {
        requested_node(&parse_csr(csr)?).map(|(_, node)| node)
    }

    /// Issues a client certificate for the node a CSR (DER or PEM) names,
    /// valid until `not_after`. With `presented`, the CSR must name that
    /// node (a renewal by the node itself); with `named` (the request's
    /// `NodeName` header), that node too. A KubeEdge edge names itself
    /// `system:node:<node>` (organization `system:nodes`); its certificate
    /// keeps that name.
    pub fn sign_csr(
        &self,
        csr: &[u8],
        not_after: SystemTime,
        presented: Option<&str>,
        named: Option<&str>,
    ) -> Result<(String, CertificateDer<'static>), CertError> {
        self.sign_csr_at(csr, SystemTime::now(), not_after, presented, named)
    }

    /// [`CloudCa::sign_csr`], the certificate issued at `issued` (its
    /// `notBefore` [`BACKDATE`] before).
    pub fn sign_csr_at(
        &self,
        csr: &[u8],
        issued: SystemTime,
        not_after: SystemTime,
        presented: Option<&str>,
        named: Option<&str>,
    ) -> Result<(String, CertificateDer<'static>), CertError> {
        let mut request = parse_csr(csr)?;
        let (common_name, node) = requested_node(&request)?;
        if let Some(presented) = presented
            && presented != node
        {
            return Err(CertError::ForeignNode {
                presented: presented.to_owned(),
                requested: node,
            });
        }
        if let Some(named) = named
            && named != node
        {
            return Err(CertError::NodeNameMismatch {
                named: named.to_owned(),
                requested: node,
            });
        }
        let params = &mut request.params;
        params.is_ca = IsCa::NoCa;
        params.subject_alt_names.clear();
        params.distinguished_name = rcgen::DistinguishedName::new();
        if common_name != node {
            params
                .distinguished_name
                .push(DnType::OrganizationName, "system:nodes");
        }
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.not_before = offset(issued - BACKDATE);
        params.not_after = offset(not_after);
        let cert = request.signed_by(&self.issuer).map_err(cert_error)?;
        Ok((node, cert.der().clone()))
    }
}

/// A parsed CSR's common name and the node it names (a KubeEdge edge's
/// `system:node:<node>` too), if that is a valid node name.
fn requested_node(
    request: &CertificateSigningRequestParams,
) -> Result<(String, String), CertError> {
    let common_name = request
        .params
        .distinguished_name
        .get(&DnType::CommonName)
        .map(dn_text)
        .unwrap_or_default();
    let node = crate::dialect::node_of_common_name(&common_name).to_owned();
    if !valid_node_name(&node) {
        return Err(CertError::BadNodeName(common_name));
    }
    Ok((common_name, node))
}

fn parse_csr(csr: &[u8]) -> Result<CertificateSigningRequestParams, CertError> {
    match std::str::from_utf8(csr) {
        Ok(pem) if pem.contains("-----BEGIN") => CertificateSigningRequestParams::from_pem(pem),
        _ => CertificateSigningRequestParams::from_der(&csr.to_vec().into()),
    }
    .map_err(cert_error)
}

/// prime256v1's OID, whole (tag, length, value).
const P256: [u8; 10] = [0x06, 0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07];

/// An EC P-256 private key (PKCS#8 DER) in SEC1 DER, as Go's
/// `x509.MarshalECPrivateKey` writes it (KubeEdge keys its tokens with
/// that); `None` for any other key.
fn p256_sec1_der(pkcs8: &[u8]) -> Option<Vec<u8>> {
    let (outer, _) = der_item(pkcs8, 0x30)?;
    let (_version, rest) = der_item(outer, 0x02)?;
    let (algorithm, rest) = der_item(rest, 0x30)?;
    if !algorithm.ends_with(&P256) {
        return None;
    }
    let (ec_key, _) = der_item(rest, 0x04)?;
    let (private, public) = ec_key_parts(ec_key)?;
    let mut key = vec![0x30, 0x77, 0x02, 0x01, 0x01, 0x04, 0x20];
    key.extend(std::iter::repeat_n(0, 32 - private.len()));
    key.extend_from_slice(private);
    key.extend_from_slice(&[0xa0, 0x0a]);
    key.extend_from_slice(&P256);
    key.extend_from_slice(&[0xa1, 0x44, 0x03, 0x42]);
    key.extend_from_slice(public);
    Some(key)
}

/// A SEC1 EC P-256 private key (KubeEdge's `ca.key`, `EC PRIVATE KEY`) as
/// PKCS#8 DER, which is what the signing library takes.
fn p256_pkcs8_der(sec1: &[u8]) -> Option<Vec<u8>> {
    let (private, public) = ec_key_parts(sec1)?;
    let mut ec_key = vec![0x30, 0x6b, 0x02, 0x01, 0x01, 0x04, 0x20];
    ec_key.extend(std::iter::repeat_n(0, 32 - private.len()));
    ec_key.extend_from_slice(private);
    ec_key.extend_from_slice(&[0xa1, 0x44, 0x03, 0x42]);
    ec_key.extend_from_slice(public);
    // version 0, id-ecPublicKey with prime256v1, the key as an octet string.
    let mut key = vec![0x30, 0x81, 0x87, 0x02, 0x01, 0x00, 0x30, 0x13];
    key.extend_from_slice(&[0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01]);
    key.extend_from_slice(&P256);
    key.extend_from_slice(&[0x04, 0x6d]);
    key.extend_from_slice(&ec_key);
    Some(key)
}

/// The private scalar and the public key (the bit string's content, with
/// its unused-bits byte) of a P-256 `ECPrivateKey` (RFC 5915), which must
/// carry its public key.
fn ec_key_parts(ec_key: &[u8]) -> Option<(&[u8], &[u8])> {
    let (ec_key, _) = der_item(ec_key, 0x30)?;
    let (_version, rest) = der_item(ec_key, 0x02)?;
    let (private, mut rest) = der_item(rest, 0x04)?;
    let mut public = None;
    while !rest.is_empty() {
        let tag = rest[0];
        let (value, next) = der_item(rest, tag)?;
        match tag {
            0xa0 if value != P256 => return None,
            0xa1 => public = Some(der_item(value, 0x03)?.0),
            _ => {}
        }
        rest = next;
    }
    let public = public?;
    (private.len() <= 32 && public.len() == 66).then_some((private, public))
}

/// The value of the DER item with `tag` at the start of `bytes`, and what
/// follows it.
fn der_item(bytes: &[u8], tag: u8) -> Option<(&[u8], &[u8])> {
    let (&first, rest) = bytes.split_first()?;
    if first != tag {
        return None;
    }
    let (&length, rest) = rest.split_first()?;
    let (length, rest) = match length {
        short if short < 0x80 => (usize::from(short), rest),
        0x81 => (usize::from(*rest.first()?), rest.get(1..)?),
        0x82 => (
            usize::from(*rest.first()?) << 8 | usize::from(*rest.get(1)?),
            rest.get(2..)?,
        ),
        _ => return None,
    };
    Some((rest.get(..length)?, rest.get(length..)?))
}

fn dn_text(value: &DnValue) -> String {
    match value {
        DnValue::Utf8String(s) => s.clone(),
        DnValue::PrintableString(s) => s.as_str().to_owned(),
        DnValue::Ia5String(s) => s.as_str().to_owned(),
        DnValue::TeletexString(s) => s.as_str().to_owned(),
        DnValue::BmpString(_) | DnValue::UniversalString(_) => String::new(),
        _ => String::new(),
    }
}

#[cfg(test)]
#[cfg(all(feature = "cloudhub", feature = "edgehub"))]
mod tests;
