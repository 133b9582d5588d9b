//! Kubernetes' rules for names, which every part of edgehive checks the same
//! way: object and node names are DNS-1123 subdomains; namespaces, container
//! and volume names are DNS-1123 labels.

/// Whether `label` is a DNS-1123 label: at most 63 lower-case letters,
/// digits and `-`, starting and ending with a letter or digit.
///
/// ```
/// assert!(beehive::names::valid_label("web-1"));
/// assert!(!beehive::names::valid_label("Web"));
/// assert!(!beehive::names::valid_label("a.b"));
/// ```
pub fn valid_label(label: &str) -> bool {
    let bytes = label.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= 63
        && bytes
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
        && bytes.first().is_some_and(u8::is_ascii_alphanumeric)
        && bytes.last().is_some_and(u8::is_ascii_alphanumeric)
}

/// Whether `name` is a DNS-1123 subdomain: at most 253 characters of
/// labels joined by `.`.
///
/// ```
/// assert!(beehive::names::valid_subdomain("edge-1.example"));
/// assert!(!beehive::names::valid_subdomain("edge/1"));
/// assert!(!beehive::names::valid_subdomain(""));
/// ```
pub fn valid_subdomain(name: &str) -> bool {
    !name.is_empty() && name.len() <= 253 && name.split('.').all(valid_label)
}
