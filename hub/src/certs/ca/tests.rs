//! Tests of the parent module (`ca.rs`).

use super::*;
use crate::certs::*;

fn ca() -> (tempfile::TempDir, CloudCa) {
    let dir = tempfile::tempdir().expect("dir");
    let ca = CloudCa::load_or_create(dir.path()).expect("CA");
    (dir, ca)
}

fn csr(node: &str) -> Vec<u8> {
    let key = KeyPair::generate().expect("key");
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
    params.distinguished_name.push(DnType::CommonName, node);
    params.serialize_request(&key).expect("csr").der().to_vec()
}

#[test]
fn a_ca_survives_a_reload() {
    let (dir, ca) = ca();
    let again = CloudCa::load_or_create(dir.path()).expect("reload");
    assert_eq!(again.root(), ca.root());
    let token = ca.issue_token(Duration::from_secs(60));
    again.check_token(&token).expect("same CA, same token key");
}

/// The `Authorization` header a join sends: the whole token or the JWT
/// alone (KubeEdge's edges); anything else is an invalid token.
#[test]
fn a_bearer_header_carries_the_token_or_its_jwt() {
    let (_dir, ca) = ca();
    let token = ca.issue_token(Duration::from_secs(60));
    let jwt = token.split_once('.').expect("four parts").1;
    for header in [format!("Bearer {token}"), format!("Bearer {jwt} ")] {
        ca.verify_bearer(Some(header.as_bytes())).expect(&header);
    }
    let bad: [&[u8]; 5] = [
        b"",
        token.as_bytes(),
        b"Bearer a.b.c",
        b"Bearer \xff\xfe.x",
        b"Bearer ...",
    ];
    for header in bad {
        assert!(matches!(
            ca.verify_bearer(Some(header)),
            Err(CertError::InvalidToken | CertError::WrongCa)
        ));
    }
    assert!(ca.verify_bearer(None).is_err());
}

/// A token checked the way KubeEdge checks it: four dot-separated
/// parts; the first the hex SHA-256 of the CA certificate's DER (what
/// `/ca.crt` serves); the rest an HS256 JWT with `exp` and a `jti`
/// (registered claims, which KubeEdge's JWT library reads), signed
/// with the CA key's SEC1 DER (Go's `x509.MarshalECPrivateKey`).
#[test]
fn tokens_verify_as_kubeedge_verifies_them() {
    let (dir, ca) = ca();
    let token = ca.issue_token(Duration::from_secs(60));
    let parts: Vec<&str> = token.split('.').collect();
    assert_eq!(parts.len(), 4);
    assert_eq!(parts[0], sha256_hex(ca.root().as_ref()));
    let decode = |part: &str| -> serde_json::Value {
        serde_json::from_slice(&URL_SAFE_NO_PAD.decode(part).expect("base64url")).expect("json")
    };
    assert_eq!(
        decode(parts[1]),
        serde_json::json!({"alg": "HS256", "typ": "JWT"})
    );
    let claims = decode(parts[2]);
    assert_eq!(claims.as_object().map(|c| c.len()), Some(2));
    assert!(claims["jti"].as_str().is_some_and(|id| id.len() == 16));
    assert!(claims["exp"].as_u64().is_some_and(|exp| exp > unix_now()));

    let pem = std::fs::read_to_string(dir.path().join("ca.key")).expect("key");
    let key = KeyPair::from_pem(&pem).expect("key");
    let sec1 = p256_sec1_der(key.serialized_der()).expect("an EC P-256 CA key");
    assert_eq!(sec1.len(), 121);
    assert_eq!(&sec1[..7], &[0x30, 0x77, 0x02, 0x01, 0x01, 0x04, 0x20]);
    assert_eq!(&sec1[sec1.len() - 65..], key.public_key_raw());
    let signature = URL_SAFE_NO_PAD.decode(parts[3]).expect("signature");
    let hmac = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &sec1);
    let signed = format!("{}.{}", parts[1], parts[2]);
    ring::hmac::verify(&hmac, signed.as_bytes(), &signature).expect("SEC1-keyed HS256");
}

/// A CA taken over from KubeEdge: its key in SEC1 PEM (`EC PRIVATE
/// KEY`, Go's format) loads, signs, and keys tokens the same way.
#[test]
fn a_kubeedge_ca_with_a_sec1_key_is_taken_over() {
    let (dir, ca) = ca();
    let pem = std::fs::read_to_string(dir.path().join("ca.key")).expect("key");
    let key = KeyPair::from_pem(&pem).expect("key");
    let sec1 = p256_sec1_der(key.serialized_der()).expect("sec1");
    assert_eq!(
        p256_pkcs8_der(&sec1).and_then(|pkcs8| p256_sec1_der(&pkcs8)),
        Some(sec1.clone())
    );
    let sec1_pem = format!(
        "-----BEGIN EC PRIVATE KEY-----\n{}\n-----END EC PRIVATE KEY-----\n",
        base64::engine::general_purpose::STANDARD.encode(&sec1)
    );
    let cert_pem = std::fs::read_to_string(dir.path().join("ca.crt")).expect("cert");
    let taken = CloudCa::from_pem(&cert_pem, &sec1_pem).expect("a SEC1 CA key loads");
    // Tokens of one verify with the other: the same key, keyed alike.
    taken
        .check_token(&ca.issue_token(Duration::from_secs(60)))
        .expect("same token key");
    let until = SystemTime::now() + Duration::from_secs(60);
    let (node, cert) = taken
        .sign_csr(&csr("edge-5"), until, None, None)
        .expect("signs");
    assert_eq!(node, "edge-5");
    let root = ca.root();
    let (_, issued) = x509_parser::parse_x509_certificate(cert.as_ref()).expect("cert");
    let (_, authority) = x509_parser::parse_x509_certificate(root.as_ref()).expect("CA");
    assert_eq!(issued.issuer(), authority.subject());
    assert!(
        issued
            .verify_signature(Some(authority.public_key()))
            .is_ok()
    );
    assert!(
        CloudCa::from_pem(
            &cert_pem,
            "-----BEGIN EC PRIVATE KEY-----\nAAAA\n-----END EC PRIVATE KEY-----\n"
        )
        .is_err()
    );
}

#[test]
fn tokens_are_checked() {
    let (_dir, ca) = ca();
    let token = ca.issue_token(Duration::from_secs(60));
    assert!(token.starts_with(&sha256_hex(ca.root().as_ref())));
    ca.check_token(&token).expect("valid");
    assert!(matches!(
        ca.check_token(&ca.issue_token(Duration::ZERO)),
        Err(CertError::ExpiredToken)
    ));
    let (_other_dir, other) = super::tests::ca();
    assert!(matches!(other.check_token(&token), Err(CertError::WrongCa)));
    let mut forged = token.clone();
    forged.pop();
    forged.push(if token.ends_with('A') { 'B' } else { 'A' });
    assert!(matches!(
        ca.check_token(&forged),
        Err(CertError::InvalidToken)
    ));
    assert!(matches!(
        ca.check_token("garbage"),
        Err(CertError::InvalidToken)
    ));
    assert!(ca.check_token("").is_err());
}

#[test]
fn a_csr_becomes_a_certificate_for_its_node_only() {
    let (_dir, ca) = ca();
    let until = SystemTime::now() + Duration::from_secs(3600);
    let (node, cert) = ca
        .sign_csr(&csr("edge-1"), until, None, None)
        .expect("issued");
    assert_eq!(node, "edge-1");
    assert_eq!(
        transports::tls::common_name(cert.as_ref()).as_deref(),
        Some("edge-1")
    );
    assert!(
        ca.sign_csr(&csr("edge-1"), until, Some("edge-1"), None)
            .is_ok(),
        "renewal by itself"
    );
    assert!(matches!(
        ca.sign_csr(&csr("edge-2"), until, Some("edge-1"), None),
        Err(CertError::ForeignNode { .. })
    ));
    assert!(matches!(
        ca.sign_csr(&csr("edge-2"), until, None, Some("edge-3")),
        Err(CertError::NodeNameMismatch { .. })
    ));
    assert!(matches!(
        ca.sign_csr(&csr("bad/name"), until, None, None),
        Err(CertError::BadNodeName(_))
    ));
    assert!(ca.sign_csr(b"not a csr", until, None, None).is_err());
}

/// A node cannot get a certificate naming anything but itself: the
/// signer writes the subject anew (no organization of the CSR's kept),
/// so no node becomes an admin or a cloud replica (the admin API's
/// `edgehive:replicas`, user `system:edgehive:replica:<name>`).
#[test]
fn a_csr_asking_for_groups_or_a_replicas_name_gets_neither() {
    let (_dir, ca) = ca();
    let until = SystemTime::now() + Duration::from_secs(3600);
    let asking = |common_name: &str, groups: &[&str]| {
        let key = KeyPair::generate().expect("key");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
        for group in groups {
            params
                .distinguished_name
                .push(DnType::OrganizationName, *group);
        }
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        params.serialize_request(&key).expect("csr").der().to_vec()
    };
    let organizations = |der: &[u8]| -> Vec<String> {
        let (_, cert) = x509_parser::parse_x509_certificate(der).expect("certificate");
        cert.subject()
            .iter_organization()
            .filter_map(|o| o.as_str().ok().map(str::to_owned))
            .collect()
    };
    let groups = ["edgehive:replicas", "edgehive:admins"];
    assert!(matches!(
        ca.sign_csr(
            &asking("system:edgehive:replica:a", &groups),
            until,
            None,
            None
        ),
        Err(CertError::BadNodeName(_))
    ));
    let (_, cert) = ca
        .sign_csr(&asking("edge-1", &groups), until, None, None)
        .expect("issued");
    assert!(organizations(cert.as_ref()).is_empty());
    assert_eq!(
        transports::tls::common_name(cert.as_ref()).as_deref(),
        Some("edge-1")
    );
    let (_, cert) = ca
        .sign_csr(&asking("system:node:edge-1", &groups), until, None, None)
        .expect("issued");
    assert_eq!(organizations(cert.as_ref()), ["system:nodes"]);
}
