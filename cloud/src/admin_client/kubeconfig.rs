//! kubeconfig files for the admin API: what `cloudcore` writes for its
//! admin (and prints for other users), and what `edgehivectl` reads.
//!
//! The subset of kubectl's format that matters here: `current-context`
//! names a context, which names a cluster (`server`,
//! `certificate-authority-data` or `certificate-authority`,
//! `tls-server-name`) and a user (`client-certificate-data` and
//! `client-key-data`, or their file forms `client-certificate` and
//! `client-key`; `token` or `tokenFile`). Relative file names are read from
//! the kubeconfig's own directory, as kubectl reads them. Other keys are
//! ignored.

use std::path::{Path, PathBuf};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use serde::{Deserialize, Serialize};
use transports::tls::{self, CertificateDer, Identity};

/// cloudcore's data directory when its configuration names none.
pub const DEFAULT_CLOUD_DATA_DIR: &str = "/var/lib/edgehive/cloud";

/// The admin's kubeconfig in cloudcore's data directory: cloudcore writes
/// it, edgehivectl reads it when no `--kubeconfig` is given.
pub const FILE_NAME: &str = "admin.kubeconfig";

/// A kubeconfig that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum KubeconfigError {
    /// A file cannot be read.
    #[error("{path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The file is not a kubeconfig.
    #[error("not a kubeconfig: {0}")]
    Parse(String),
    /// A context, cluster or user it names is not in it.
    #[error("{0}")]
    Missing(String),
    /// A certificate, key or base64 value is not readable.
    #[error("{field}: {reason}")]
    Invalid {
        /// Which field.
        field: String,
        /// What is wrong.
        reason: String,
    },
}

/// A kubeconfig file (`apiVersion: v1`, `kind: Config`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct Kubeconfig {
    /// `v1`.
    #[serde(rename = "apiVersion", default)]
    pub api_version: String,
    /// `Config`.
    #[serde(default)]
    pub kind: String,
    /// The servers.
    #[serde(default)]
    pub clusters: Vec<NamedCluster>,
    /// Cluster and user pairs.
    #[serde(default)]
    pub contexts: Vec<NamedContext>,
    /// Who the client is.
    #[serde(default)]
    pub users: Vec<NamedUser>,
    /// The context used.
    #[serde(default)]
    pub current_context: String,
}

/// A cluster and its name.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NamedCluster {
    /// Its name.
    pub name: String,
    /// It.
    pub cluster: Cluster,
}

/// Where the server is and how to trust it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct Cluster {
    /// `https://host:port` (or `http://`).
    pub server: String,
    /// The CA's certificates, PEM, base64.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub certificate_authority_data: Option<String>,
    /// A file holding the CA's certificates, PEM.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub certificate_authority: Option<PathBuf>,
    /// The name to check the server's certificate against, when not the
    /// server's host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls_server_name: Option<String>,
}

/// A context and its name.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NamedContext {
    /// Its name.
    pub name: String,
    /// It.
    pub context: Context,
}

/// A cluster and a user.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Context {
    /// The cluster's name.
    pub cluster: String,
    /// The user's name (none: no credentials).
    #[serde(default)]
    pub user: String,
    /// The default namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
}

/// A user and its name.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NamedUser {
    /// Its name.
    pub name: String,
    /// Its credentials.
    pub user: AuthInfo,
}

/// A user's credentials.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct AuthInfo {
    /// The client certificate (and its chain), PEM, base64.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_certificate_data: Option<String>,
    /// Its private key, PEM, base64.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_key_data: Option<String>,
    /// A file holding the client certificate, PEM.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_certificate: Option<PathBuf>,
    /// A file holding its private key, PEM.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_key: Option<PathBuf>,
    /// A bearer token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
    /// A file holding a bearer token.
    #[serde(default, rename = "tokenFile", skip_serializing_if = "Option::is_none")]
    pub token_file: Option<PathBuf>,
}

/// What a client needs from a kubeconfig: where, whom to trust, who it is.
#[derive(Debug)]
pub struct AdminCredentials {
    /// The server's URL (`https://host:port`).
    pub server: String,
    /// The certificates to trust the server by.
    pub roots: Vec<CertificateDer<'static>>,
    /// The name the server's certificate must carry, when not its host.
    pub tls_server_name: Option<String>,
    /// The client certificate and key.
    pub identity: Option<Identity>,
    /// The bearer token.
    pub token: Option<String>,
    /// The context's namespace.
    pub namespace: Option<String>,
}

/// DER as PEM, with `label` (`CERTIFICATE`, `PRIVATE KEY`).
pub fn pem(label: &str, der: &[u8]) -> String {
    let encoded = STANDARD.encode(der);
    let mut text = format!("-----BEGIN {label}-----\n");
    for line in encoded.as_bytes().chunks(64) {
        text.push_str(&String::from_utf8_lossy(line));
        text.push('\n');
    }
    text.push_str(&format!("-----END {label}-----\n"));
    text
}

fn read(path: &Path) -> Result<Vec<u8>, KubeconfigError> {
    std::fs::read(path).map_err(|source| KubeconfigError::Read {
        path: path.display().to_string(),
        source,
    })
}

fn invalid(field: &str, reason: impl std::fmt::Display) -> KubeconfigError {
    KubeconfigError::Invalid {
        field: field.to_owned(),
        reason: reason.to_string(),
    }
}

/// The bytes of a `...-data` field or of its file form (the file relative
/// to `base`); `None` when neither is set.
fn data_or_file(
    field: &str,
    data: Option<&String>,
    file: Option<&PathBuf>,
    base: &Path,
) -> Result<Option<Vec<u8>>, KubeconfigError> {
    match (data, file) {
        (Some(data), _) => STANDARD
            .decode(data.trim())
            .map(Some)
            .map_err(|e| invalid(&format!("{field}-data"), e)),
        (None, Some(file)) => read(&base.join(file)).map(Some),
        (None, None) => Ok(None),
    }
}

impl Kubeconfig {
    /// A kubeconfig with one cluster (`cluster` at `server`, trusted by
    /// `ca`), one user (`user`, by client certificate), and the context
    /// joining them as the current one.
    pub fn with_certificate(
        cluster: &str,
        server: &str,
        ca: &CertificateDer<'_>,
        user: &str,
        identity: &Identity,
    ) -> Kubeconfig {
        let (chain, key) = identity;
        let chain: String = chain.iter().map(|c| pem("CERTIFICATE", c)).collect();
        let context = format!("{user}@{cluster}");
        Kubeconfig {
            api_version: "v1".to_owned(),
            kind: "Config".to_owned(),
            clusters: vec![NamedCluster {
                name: cluster.to_owned(),
                cluster: Cluster {
                    server: server.to_owned(),
                    certificate_authority_data: Some(STANDARD.encode(pem("CERTIFICATE", ca))),
                    ..Cluster::default()
                },
            }],
            contexts: vec![NamedContext {
                name: context.clone(),
                context: Context {
                    cluster: cluster.to_owned(),
                    user: user.to_owned(),
                    namespace: None,
                },
            }],
            users: vec![NamedUser {
                name: user.to_owned(),
                user: AuthInfo {
                    client_certificate_data: Some(STANDARD.encode(chain)),
                    client_key_data: Some(STANDARD.encode(pem("PRIVATE KEY", key.secret_der()))),
                    ..AuthInfo::default()
                },
            }],
            current_context: context,
        }
    }

    /// Parses a kubeconfig.
    pub fn parse(text: &str) -> Result<Kubeconfig, KubeconfigError> {
        serde_yaml_ng::from_str(text).map_err(|e| KubeconfigError::Parse(e.to_string()))
    }

    /// Reads a kubeconfig file and what its current context says; the
    /// files it names are read relative to its directory.
    pub fn load(path: &Path) -> Result<AdminCredentials, KubeconfigError> {
        let text = read(path)?;
        let text = String::from_utf8(text).map_err(|e| KubeconfigError::Parse(e.to_string()))?;
        let base = path.parent().unwrap_or(Path::new("."));
        Kubeconfig::parse(&text)?.credentials(base)
    }

    /// As YAML.
    pub fn to_yaml(&self) -> Result<String, KubeconfigError> {
        serde_yaml_ng::to_string(self).map_err(|e| KubeconfigError::Parse(e.to_string()))
    }

    /// What the current context says, files read relative to `base`.
    pub fn credentials(&self, base: &Path) -> Result<AdminCredentials, KubeconfigError> {
        if self.current_context.is_empty() {
            return Err(KubeconfigError::Missing(
                "no current-context in the kubeconfig".to_owned(),
            ));
        }
        let context = self
            .contexts
            .iter()
            .find(|c| c.name == self.current_context)
            .map(|c| &c.context)
            .ok_or_else(|| {
                KubeconfigError::Missing(format!("no context {:?}", self.current_context))
            })?;
        let cluster = self
            .clusters
            .iter()
            .find(|c| c.name == context.cluster)
            .map(|c| &c.cluster)
            .ok_or_else(|| KubeconfigError::Missing(format!("no cluster {:?}", context.cluster)))?;
        if cluster.server.is_empty() {
            return Err(KubeconfigError::Missing(format!(
                "cluster {:?} has no server",
                context.cluster
            )));
        }
        let roots = match data_or_file(
            "certificate-authority",
            cluster.certificate_authority_data.as_ref(),
            cluster.certificate_authority.as_ref(),
            base,
        )? {
            Some(pem) => {
                tls::certs_from_pem(&pem).map_err(|e| invalid("certificate-authority", e))?
            }
            None => Vec::new(),
        };
        let mut credentials = AdminCredentials {
            server: cluster.server.clone(),
            roots,
            tls_server_name: cluster.tls_server_name.clone(),
            identity: None,
            token: None,
            namespace: context.namespace.clone(),
        };
        if context.user.is_empty() {
            return Ok(credentials);
        }
        let user = self
            .users
            .iter()
            .find(|u| u.name == context.user)
            .map(|u| &u.user)
            .ok_or_else(|| KubeconfigError::Missing(format!("no user {:?}", context.user)))?;
        let certificate = data_or_file(
            "client-certificate",
            user.client_certificate_data.as_ref(),
            user.client_certificate.as_ref(),
            base,
        )?;
        let key = data_or_file(
            "client-key",
            user.client_key_data.as_ref(),
            user.client_key.as_ref(),
            base,
        )?;
        credentials.identity = match (certificate, key) {
            (Some(certificate), Some(key)) => {
                let chain = tls::certs_from_pem(&certificate)
                    .map_err(|e| invalid("client-certificate", e))?;
                if chain.is_empty() {
                    return Err(invalid("client-certificate", "no certificate"));
                }
                let key = tls::key_from_pem(&key).map_err(|e| invalid("client-key", e))?;
                Some((chain, key))
            }
            (None, None) => None,
            _ => {
                return Err(invalid(
                    "client-certificate",
                    "a client certificate needs its key, and a key its certificate",
                ));
            }
        };
        credentials.token = match (&user.token, &user.token_file) {
            (Some(token), _) => Some(token.trim().to_owned()),
            (None, Some(file)) => {
                let token = read(&base.join(file))?;
                Some(String::from_utf8_lossy(&token).trim().to_owned())
            }
            (None, None) => None,
        }
        .filter(|t| !t.is_empty());
        Ok(credentials)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pki() -> (transports::tls::DevPki, Identity) {
        let pki = transports::tls::DevPki::new("test CA").expect("CA");
        let client = pki.client("alice").expect("client");
        (pki, client)
    }

    #[test]
    fn what_is_written_reads_back() {
        let (pki, identity) = pki();
        let written = Kubeconfig::with_certificate(
            "edgehive",
            "https://127.0.0.1:10003",
            &pki.root(),
            "admin",
            &identity,
        );
        let yaml = written.to_yaml().expect("yaml");
        assert!(yaml.contains("current-context: admin@edgehive"), "{yaml}");
        assert!(yaml.contains("certificate-authority-data:"), "{yaml}");
        assert!(yaml.contains("client-key-data:"), "{yaml}");
        let read = Kubeconfig::parse(&yaml).expect("parses");
        assert_eq!(read, written);
        let credentials = read
            .credentials(Path::new("/nonexistent"))
            .expect("credentials");
        assert_eq!(credentials.server, "https://127.0.0.1:10003");
        assert_eq!(credentials.roots, vec![pki.root()]);
        let (chain, key) = credentials.identity.expect("identity");
        assert_eq!(chain, identity.0);
        assert_eq!(key.secret_der(), identity.1.secret_der());
        assert_eq!(credentials.token, None);
    }

    #[test]
    fn kubectl_style_files_with_tokens_and_file_forms() {
        let (pki, (chain, key)) = pki();
        let dir = tempfile::tempdir().expect("dir");
        std::fs::write(dir.path().join("ca.crt"), pem("CERTIFICATE", &pki.root())).expect("ca");
        std::fs::write(dir.path().join("me.crt"), pem("CERTIFICATE", &chain[0])).expect("crt");
        std::fs::write(
            dir.path().join("me.key"),
            pem("PRIVATE KEY", key.secret_der()),
        )
        .expect("key");
        std::fs::write(dir.path().join("token"), "t0ken\n").expect("token");
        let text = r#"
apiVersion: v1
kind: Config
preferences: {}
clusters:
- name: other
  cluster:
    server: https://10.0.0.1:6443
- name: edge
  cluster:
    server: https://cloud.example:10003
    certificate-authority: ca.crt
    tls-server-name: localhost
contexts:
- name: viewer
  context:
    cluster: edge
    user: bob
    namespace: kube-system
- name: files
  context:
    cluster: edge
    user: carol
current-context: viewer
users:
- name: bob
  user:
    token: s3cret
- name: carol
  user:
    client-certificate: me.crt
    client-key: me.key
    tokenFile: token
"#;
        let config = Kubeconfig::parse(text).expect("parses");
        let bob = config.credentials(dir.path()).expect("bob");
        assert_eq!(bob.server, "https://cloud.example:10003");
        assert_eq!(bob.roots, vec![pki.root()]);
        assert_eq!(bob.tls_server_name.as_deref(), Some("localhost"));
        assert_eq!(bob.token.as_deref(), Some("s3cret"));
        assert!(bob.identity.is_none());
        assert_eq!(bob.namespace.as_deref(), Some("kube-system"));

        let mut files = config.clone();
        files.current_context = "files".to_owned();
        let carol = files.credentials(dir.path()).expect("carol");
        assert_eq!(carol.identity.expect("identity").0, chain);
        assert_eq!(carol.token.as_deref(), Some("t0ken"));

        // What is named must be there.
        for (context, wanted) in [("", "no current-context"), ("nope", "no context \"nope\"")] {
            let mut broken = config.clone();
            broken.current_context = context.to_owned();
            let err = broken.credentials(dir.path()).expect_err(context);
            assert!(err.to_string().contains(wanted), "{err}");
        }
        let mut no_user = config.clone();
        no_user.users.clear();
        assert!(no_user.credentials(dir.path()).is_err());
        let mut half = files.clone();
        half.users[1].user.client_key = None;
        assert!(half.credentials(dir.path()).is_err());
        let mut bad = config.clone();
        bad.clusters[1].cluster.certificate_authority = None;
        bad.clusters[1].cluster.certificate_authority_data = Some("not base64!".to_owned());
        assert!(bad.credentials(dir.path()).is_err());
        assert!(Kubeconfig::parse("clusters: 3").is_err());
    }
}
