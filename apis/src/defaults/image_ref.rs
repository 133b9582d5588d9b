//! Image references as kube-apiserver reads them for the pull policy's
//! default: `github.com/distribution/reference`, as
//! `k8s.io/kubernetes/pkg/util/parsers.ParseImageName` uses it.

// ---------------------------------------------------------------------------

/// The tag `ParseImageName` finds in `image`: `latest` when there is
/// neither tag nor digest, empty when there is only a digest, `None` when
/// the reference does not parse (`ParseNormalizedNamed` fails).
pub(super) fn image_tag(image: &str) -> Option<String> {
    // A bare 64-hex identifier is refused.
    if image.len() == 64
        && image
            .bytes()
            .all(|b| matches!(b, b'a'..=b'f' | b'0'..=b'9'))
    {
        return None;
    }
    // splitDockerDomain: the first component is a registry if it has a dot
    // or colon, is localhost, or has upper case; else Docker Hub.
    let (domain, remainder) = match image.split_once('/') {
        None => ("docker.io".to_owned(), format!("library/{image}")),
        Some((first, rest)) => {
            if first == "localhost" || first.contains(['.', ':']) || first.to_lowercase() != first {
                let domain = if first == "index.docker.io" {
                    "docker.io"
                } else {
                    first
                };
                (domain.to_owned(), rest.to_owned())
            } else {
                ("docker.io".to_owned(), image.to_owned())
            }
        }
    };
    let remainder = if domain == "docker.io" && !remainder.contains('/') {
        format!("library/{remainder}")
    } else {
        remainder
    };
    let remote = remainder.split(':').next().unwrap_or("");
    if remote.to_lowercase() != remote {
        return None;
    }

    // Parse(domain + "/" + remainder) against the reference grammar.
    let full = format!("{domain}/{remainder}");
    let (name_tag, digest) = match full.split_once('@') {
        Some((name_tag, digest)) => (name_tag, Some(digest)),
        None => (full.as_str(), None),
    };
    let (name, tag) = match name_tag.rsplit_once(':') {
        Some((name, tag)) if !tag.contains('/') => (name, Some(tag)),
        _ => (name_tag, None),
    };
    let path = match name.split_once('/') {
        Some((host, path)) if valid_domain(host) && valid_remote_name(path) => path,
        _ if valid_remote_name(name) => name,
        _ => return None,
    };
    if path.len() > 255 {
        return None;
    }
    if let Some(tag) = tag {
        let word = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
        let bytes = tag.as_bytes();
        let valid = !bytes.is_empty()
            && bytes.len() <= 128
            && word(bytes[0])
            && bytes.iter().all(|&b| word(b) || b == b'.' || b == b'-');
        if !valid {
            return None;
        }
    }
    if let Some(digest) = digest
        && !valid_digest(digest)
    {
        return None;
    }
    Some(match (tag, digest) {
        (Some(tag), _) => tag.to_owned(),
        (None, Some(_)) => String::new(),
        (None, None) => "latest".to_owned(),
    })
}

/// `host[:port]`, the host a dotted name of `[a-zA-Z0-9-]` labels (not
/// starting or ending with `-`) or a bracketed IPv6 address.
pub(super) fn valid_domain(domain: &str) -> bool {
    let (host, port) = match domain.rsplit_once(':') {
        Some((host, port))
            if !host.is_empty() && (!host.starts_with('[') || host.ends_with(']')) =>
        {
            (host, Some(port))
        }
        _ => (domain, None),
    };
    if port.is_some_and(|p| p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit())) {
        return false;
    }
    if let Some(inner) = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        return !inner.is_empty() && inner.bytes().all(|b| b.is_ascii_hexdigit() || b == b':');
    }
    host.split('.').all(|label| {
        let bytes = label.as_bytes();
        !bytes.is_empty()
            && bytes
                .iter()
                .all(|&b| b.is_ascii_alphanumeric() || b == b'-')
            && bytes[0] != b'-'
            && bytes[bytes.len() - 1] != b'-'
    })
}

/// Path components of `[a-z0-9]+` runs joined by `.`, `_`, `__` or dashes.
pub(super) fn valid_remote_name(path: &str) -> bool {
    path.split('/').all(|component| {
        let bytes = component.as_bytes();
        let alnum = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
        let mut i = 0;
        let mut expect_alnum = true;
        while i < bytes.len() {
            if expect_alnum {
                if !alnum(bytes[i]) {
                    return false;
                }
                while i < bytes.len() && alnum(bytes[i]) {
                    i += 1;
                }
                expect_alnum = false;
            } else {
                match bytes[i] {
                    b'.' => i += 1,
                    b'_' => {
                        i += 1;
                        if bytes.get(i) == Some(&b'_') {
                            i += 1;
                        }
                    }
                    b'-' => {
                        while bytes.get(i) == Some(&b'-') {
                            i += 1;
                        }
                    }
                    _ => return false,
                }
                expect_alnum = true;
            }
        }
        !bytes.is_empty() && !expect_alnum
    })
}

/// A digest go-digest accepts: a registered algorithm (sha256, sha384,
/// sha512) and its lower-case hex of the right length.
pub(super) fn valid_digest(digest: &str) -> bool {
    let Some((algorithm, hex)) = digest.split_once(':') else {
        return false;
    };
    let len = match algorithm {
        "sha256" => 64,
        "sha384" => 96,
        "sha512" => 128,
        _ => return false,
    };
    hex.len() == len && hex.bytes().all(|b| matches!(b, b'a'..=b'f' | b'0'..=b'9'))
}
