//! Who may use the admin API, and for what.
//!
//! **Authentication** (as kube-apiserver's): a client certificate signed by
//! the cloud's CA, verified in the TLS handshake (its common name is the
//! user, its organizations the groups), or `Authorization: Bearer <token>`
//! with a token from a token file in kube-apiserver's `--token-auth-file`
//! format (`token,user,uid,"group1,group2"`). A request with neither is
//! refused with 401.
//!
//! **Authorization** by group, two roles:
//!
//! | group | may |
//! | --- | --- |
//! | `edgehive:admins` | everything |
//! | `edgehive:viewers` | `get`, `list`, `watch` of every resource but secrets (pods' logs and resource metrics included); not exec, attach, port-forward, apply, delete |
//!
//! A request is named the way kube-apiserver names it ([`attributes`]):
//! a verb (`get`, `list`, `watch`, `create`, `update`, `patch`, `delete`;
//! exec, attach and port-forward are `create` even over a WebSocket `GET`,
//! as Kubernetes has it since 1.31), an API group, a resource and
//! subresource, a namespace and a name. What is refused gets 403 with a
//! Kubernetes-worded message (`pods "web" is forbidden: User "bob" cannot
//! create resource "pods/exec" in API group "" in the namespace "default"`).

use std::path::Path;

use subtle::ConstantTimeEq;

/// The group whose members may do everything.
pub const ADMINS: &str = "edgehive:admins";
/// The group whose members may read (not secrets), follow logs and read
/// resource metrics.
pub const VIEWERS: &str = "edgehive:viewers";
/// The group of the cloud's replicas ([`crate::peers::REPLICAS`]).
pub use crate::peers::REPLICAS;

/// Why the authentication settings cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    /// The token file cannot be read.
    #[error("{path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A line of the token file is not `token,user,uid[,"groups"]`.
    #[error("{path}, line {line}: {reason}")]
    TokenFile {
        /// The file.
        path: String,
        /// The line, from 1.
        line: usize,
        /// What is wrong.
        reason: String,
    },
}

/// An authenticated caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    /// The user name (a certificate's common name, a token's user).
    pub name: String,
    /// The groups (a certificate's organizations, a token's groups).
    pub groups: Vec<String>,
}

impl User {
    /// A user named `name` in `groups`.
    pub fn new(name: &str, groups: &[&str]) -> User {
        User {
            name: name.to_owned(),
            groups: groups.iter().map(|g| (*g).to_owned()).collect(),
        }
    }

    /// The user a (verified) client certificate names: its subject's
    /// common name, its organizations as groups. `None` without a common
    /// name.
    pub fn from_certificate(der: &[u8]) -> Option<User> {
        let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
        let subject = cert.subject();
        let name = subject.iter_common_name().next()?.as_str().ok()?.to_owned();
        if name.is_empty() {
            return None;
        }
        let groups = subject
            .iter_organization()
            .filter_map(|o| o.as_str().ok().map(str::to_owned))
            .collect();
        Some(User { name, groups })
    }

    fn member_of(&self, group: &str) -> bool {
        self.groups.iter().any(|g| g == group)
    }
}

pub use apis::access::{RequestAttributes, attributes};

/// What may happen to a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// It goes on.
    Allow,
    /// It is refused (403), for this reason.
    Forbidden(String),
}

/// Whether `user` may do `method path?query` (see the module's roles).
pub fn authorize(method: &str, path_and_query: &str, user: &User) -> Decision {
    let request = attributes(method, path_and_query);
    if user.member_of(ADMINS) {
        return Decision::Allow;
    }
    let reads = matches!(request.verb.as_str(), "get" | "list" | "watch");
    if user.member_of(VIEWERS) && reads && request.resource != "secrets" {
        return Decision::Allow;
    }
    if user.member_of(REPLICAS)
        && user.name.starts_with(crate::peers::REPLICA_USER_PREFIX)
        && forwarded_by_replicas(&request)
    {
        return Decision::Allow;
    }
    Decision::Forbidden(forbidden_message(&request, user))
}

/// What a replica forwards to another: a pod's log and streams, and
/// resource metrics.
fn forwarded_by_replicas(request: &RequestAttributes) -> bool {
    if !request.resource_request {
        return false;
    }
    match (
        request.verb.as_str(),
        request.group.as_str(),
        request.resource.as_str(),
    ) {
        ("get", "", "pods") => request.subresource == "log",
        ("create", "", "pods") => {
            matches!(
                request.subresource.as_str(),
                "exec" | "attach" | "portforward"
            )
        }
        ("get" | "list", "metrics.k8s.io", "pods" | "nodes") => true,
        _ => false,
    }
}

/// kube-apiserver's words for a refusal.
fn forbidden_message(request: &RequestAttributes, user: &User) -> String {
    if !request.resource_request {
        return format!(
            "forbidden: User {:?} cannot {} path {:?}",
            user.name, request.verb, request.path
        );
    }
    let resource = if request.subresource.is_empty() {
        request.resource.clone()
    } else {
        format!("{}/{}", request.resource, request.subresource)
    };
    let qualified = if request.group.is_empty() {
        request.resource.clone()
    } else {
        format!("{}.{}", request.resource, request.group)
    };
    let what = if request.name.is_empty() {
        qualified
    } else {
        format!("{qualified} {:?}", request.name)
    };
    let scope = if request.namespace.is_empty() {
        "at the cluster scope".to_owned()
    } else {
        format!("in the namespace {:?}", request.namespace)
    };
    format!(
        "{what} is forbidden: User {:?} cannot {} resource {resource:?} in API group {:?} {scope}",
        user.name, request.verb, request.group
    )
}

/// Bearer tokens and the users they stand for.
#[derive(Clone, Default)]
pub struct Tokens {
    entries: Vec<(Vec<u8>, User)>,
}

impl std::fmt::Debug for Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokens")
            .field("count", &self.entries.len())
            .finish()
    }
}

impl Tokens {
    /// No tokens: only client certificates authenticate.
    pub fn none() -> Tokens {
        Tokens::default()
    }

    /// Reads a token file (kube-apiserver's `--token-auth-file` format).
    pub fn read(path: &Path) -> Result<Tokens, AuthError> {
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| AuthError::Read {
            path: shown.clone(),
            source,
        })?;
        Tokens::parse(&text).map_err(|(line, reason)| AuthError::TokenFile {
            path: shown,
            line,
            reason,
        })
    }

    /// Parses a token file: one `token,user,uid[,"group1,group2"]` a line
    /// (CSV; blank lines and lines starting with `#` skipped). The error
    /// is the line (from 1) and what is wrong with it.
    pub fn parse(text: &str) -> Result<Tokens, (usize, String)> {
        let mut entries: Vec<(Vec<u8>, User)> = Vec::new();
        for (index, line) in text.lines().enumerate() {
            let number = index + 1;
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let fields = csv_fields(line).map_err(|reason| (number, reason))?;
            if fields.len() < 3 {
                return Err((
                    number,
                    format!(
                        "expected token,user,uid[,\"groups\"], got {} field(s)",
                        fields.len()
                    ),
                ));
            }
            let (token, name) = (fields[0].trim(), fields[1].trim());
            if token.is_empty() || name.is_empty() {
                return Err((number, "the token and the user must not be empty".into()));
            }
            if entries.iter().any(|(known, _)| known == token.as_bytes()) {
                return Err((number, "the same token twice".into()));
            }
            let groups = fields
                .get(3)
                .map(|groups| {
                    groups
                        .split(',')
                        .map(str::trim)
                        .filter(|g| !g.is_empty())
                        .map(str::to_owned)
                        .collect()
                })
                .unwrap_or_default();
            entries.push((
                token.as_bytes().to_vec(),
                User {
                    name: name.to_owned(),
                    groups,
                },
            ));
        }
        Ok(Tokens { entries })
    }

    /// How many tokens there are.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The user `token` stands for. Every known token is compared, each
    /// in constant time, so the time taken says nothing of which matched.
    pub fn user(&self, token: &str) -> Option<User> {
        let mut found = None;
        for (known, user) in &self.entries {
            if bool::from(known.as_slice().ct_eq(token.as_bytes())) {
                found = Some(user);
            }
        }
        found.cloned()
    }
}

/// The fields of one CSV line (quotes, `""` inside quotes).
fn csv_fields(line: &str) -> Result<Vec<String>, String> {
    let mut fields = Vec::new();
    let mut field = String::new();
    let mut chars = line.chars().peekable();
    let mut quoted = false;
    let mut was_quoted = false;
    while let Some(c) = chars.next() {
        match (quoted, c) {
            (true, '"') if chars.peek() == Some(&'"') => {
                chars.next();
                field.push('"');
            }
            (true, '"') => quoted = false,
            (true, c) => field.push(c),
            (false, '"') if field.trim().is_empty() && !was_quoted => {
                field.clear();
                quoted = true;
                was_quoted = true;
            }
            (false, '"') => return Err("a quote inside an unquoted field".into()),
            (false, ',') => {
                fields.push(std::mem::take(&mut field));
                was_quoted = false;
            }
            (false, c) => field.push(c),
        }
    }
    if quoted {
        return Err("a quoted field is not closed".into());
    }
    fields.push(field);
    Ok(fields)
}

/// Who is calling: a verified client certificate's user first, then a
/// bearer token's (`authorization` is the header's value). `Err` is the
/// 401 message.
pub fn authenticate(
    certificate: Option<&User>,
    authorization: Option<&str>,
    tokens: &Tokens,
) -> Result<User, String> {
    if let Some(user) = certificate {
        return Ok(user.clone());
    }
    let Some(authorization) = authorization else {
        return Err("Unauthorized: no client certificate and no bearer token".into());
    };
    let token = authorization
        .strip_prefix("Bearer ")
        .or_else(|| authorization.strip_prefix("bearer "))
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .ok_or_else(|| "Unauthorized: only bearer tokens are taken".to_owned())?;
    tokens
        .user(token)
        .ok_or_else(|| "Unauthorized: invalid bearer token".to_owned())
}

#[cfg(test)]
mod tests;
