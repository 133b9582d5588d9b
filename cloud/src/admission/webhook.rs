//! The `MutatingWebhookConfiguration` that makes kube-apiserver call
//! cloudcore's webhook at each pod creation: what it says ([`configuration`],
//! no I/O) and its creation or update at cloudcore's start ([`register`]).
//!
//! - `clientConfig`: a `url` (cloudcore outside the cluster, or a replica
//!   reached at its own address) or a `service` (cloudcore in the
//!   cluster), and the `caBundle` that signed the serving certificate (the
//!   cloud's CA).
//! - `rules`: pods, CREATE, v1; `failurePolicy: Ignore` (cloudcore down
//!   never stops a pod's creation; the pod is then created unmutated);
//!   `sideEffects: None`; `timeoutSeconds: 5`; `reinvocationPolicy:
//!   Never`; every namespace but `kube-system`.
//! - Several replicas may start at once: each writes the same
//!   configuration, an update that lost a race is made again from a fresh
//!   read, and one that changes nothing is not made.

use base64::Engine;
use serde_json::{Value, json};

use super::PATH;

/// The configuration's name (one per cluster, shared by the replicas).
pub const CONFIGURATION_NAME: &str = "edgehive-cloudcore";

/// The webhook's name in it.
pub const WEBHOOK_NAME: &str = "offline-tolerations.edgehive.io";

/// How long the API server waits for the webhook before creating the pod
/// unmutated.
pub const TIMEOUT_SECONDS: u32 = 5;

/// The namespace whose pods are never sent to the webhook.
pub const EXCLUDED_NAMESPACE: &str = "kube-system";

/// Where kube-apiserver reaches the webhook.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    /// An `https://` URL (cloudcore outside the cluster, or on a host the
    /// API server reaches).
    Url(String),
    /// A Service in the cluster in front of cloudcore.
    Service {
        /// The Service's namespace.
        namespace: String,
        /// The Service's name.
        name: String,
        /// The Service's port.
        port: u16,
    },
}

/// A webhook address kube-apiserver would refuse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EndpointError {
    /// Not a URL the API server calls.
    #[error("the webhook URL {url:?} {reason}")]
    Url {
        /// The URL given.
        url: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// Not `namespace/name` or `namespace/name:port`.
    #[error("the webhook Service {reference:?}: expected namespace/name or namespace/name:port")]
    Service {
        /// The reference given.
        reference: String,
    },
}

impl Endpoint {
    /// A URL endpoint, checked as the API server checks it: `https`, a
    /// host, no user, query or fragment.
    pub fn url(url: &str) -> Result<Endpoint, EndpointError> {
        let refuse = |reason| EndpointError::Url {
            url: url.to_owned(),
            reason,
        };
        let uri: hyper::Uri = url.parse().map_err(|_| refuse("is not a URL"))?;
        if uri.scheme_str() != Some("https") {
            return Err(refuse("must be https://"));
        }
        if uri.host().is_none_or(str::is_empty) {
            return Err(refuse("names no host"));
        }
        if uri.query().is_some() || url.contains('#') {
            return Err(refuse("may have no query or fragment"));
        }
        if uri.authority().is_some_and(|a| a.as_str().contains('@')) {
            return Err(refuse("may have no user"));
        }
        Ok(Endpoint::Url(url.to_owned()))
    }

    /// The URL of the webhook on `host` (a name or an IP) at `port`.
    pub fn on_host(host: &str, port: u16) -> Endpoint {
        let host = match host.parse::<std::net::Ipv6Addr>() {
            Ok(_) => format!("[{host}]"),
            Err(_) => host.to_owned(),
        };
        Endpoint::Url(format!("https://{host}:{port}{PATH}"))
    }

    /// A Service endpoint from `namespace/name` or `namespace/name:port`
    /// (port 443 when none is given, as the API server takes it).
    pub fn service(reference: &str) -> Result<Endpoint, EndpointError> {
        let refuse = || EndpointError::Service {
            reference: reference.to_owned(),
        };
        let (namespace, rest) = reference.split_once('/').ok_or_else(refuse)?;
        let (name, port) = match rest.split_once(':') {
            Some((name, port)) => (name, port.parse::<u16>().map_err(|_| refuse())?),
            None => (rest, 443),
        };
        let valid = |part: &str| {
            !part.is_empty()
                && part
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        };
        if !valid(namespace) || !valid(name) || port == 0 {
            return Err(refuse());
        }
        Ok(Endpoint::Service {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            port,
        })
    }

    /// The names the serving certificate must carry for the API server to
    /// accept it at this endpoint.
    pub fn server_names(&self) -> Vec<String> {
        match self {
            Endpoint::Url(url) => url
                .parse::<hyper::Uri>()
                .ok()
                .and_then(|uri| uri.host().map(str::to_owned))
                .map(|host| {
                    host.trim_start_matches('[')
                        .trim_end_matches(']')
                        .to_owned()
                })
                .into_iter()
                .collect(),
            Endpoint::Service {
                namespace, name, ..
            } => vec![
                format!("{name}.{namespace}.svc"),
                format!("{name}.{namespace}.svc.cluster.local"),
            ],
        }
    }

    /// The webhook's `clientConfig`, trusting `ca_pem`.
    fn client_config(&self, ca_pem: &str) -> Value {
        let bundle = base64::engine::general_purpose::STANDARD.encode(ca_pem);
        match self {
            Endpoint::Url(url) => json!({"url": url, "caBundle": bundle}),
            Endpoint::Service {
                namespace,
                name,
                port,
            } => json!({
                "service": {"namespace": namespace, "name": name, "path": PATH, "port": port},
                "caBundle": bundle,
            }),
        }
    }
}

/// The `MutatingWebhookConfiguration` pointing kube-apiserver at
/// `endpoint`, whose certificate `ca_pem` (PEM) signed. Every field the
/// API server would default is written, so a stored configuration equal
/// to this one reads back equal.
pub fn configuration(name: &str, endpoint: &Endpoint, ca_pem: &str) -> Value {
    json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {
            "name": name,
            "labels": {"app.kubernetes.io/managed-by": "edgehive-cloudcore"},
        },
        "webhooks": [{
            "name": WEBHOOK_NAME,
            "admissionReviewVersions": ["v1"],
            "clientConfig": endpoint.client_config(ca_pem),
            "rules": [{
                "operations": ["CREATE"],
                "apiGroups": [""],
                "apiVersions": ["v1"],
                "resources": ["pods"],
                "scope": "Namespaced",
            }],
            "failurePolicy": "Ignore",
            "matchPolicy": "Equivalent",
            "namespaceSelector": {"matchExpressions": [{
                "key": "kubernetes.io/metadata.name",
                "operator": "NotIn",
                "values": [EXCLUDED_NAMESPACE],
            }]},
            "objectSelector": {},
            "sideEffects": "None",
            "timeoutSeconds": TIMEOUT_SECONDS,
            "reinvocationPolicy": "Never",
        }],
    })
}

/// What [`register`] did.
#[cfg(feature = "kubernetes")]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Registered {
    /// The configuration was missing and is created.
    Created,
    /// It differed and is updated.
    Updated,
    /// It already said this.
    Unchanged,
}

/// Why [`register`] failed.
#[cfg(feature = "kubernetes")]
#[derive(Debug, Clone, thiserror::Error)]
pub enum RegistrationError {
    /// The API server does not let cloudcore do it (RBAC).
    #[error(
        "the API server does not let cloudcore {verb} mutatingwebhookconfigurations ({message}): \
         it needs get, create and update of admissionregistration.k8s.io \
         mutatingwebhookconfigurations (docs/kubernetes.md)"
    )]
    Forbidden {
        /// What was refused: get, create or update.
        verb: &'static str,
        /// The API server's words.
        message: String,
    },
    /// Any other failure.
    #[error("{verb} of mutatingwebhookconfigurations/{name} failed: {message}")]
    Failed {
        /// The configuration's name.
        name: String,
        /// What failed: get, create or update.
        verb: &'static str,
        /// Why.
        message: String,
    },
    /// Others kept changing it between this one's read and write.
    #[error(
        "mutatingwebhookconfigurations/{name} kept changing under cloudcore's update ({tries} tries)"
    )]
    Contended {
        /// The configuration's name.
        name: String,
        /// How many times it was read and written.
        tries: usize,
    },
}

/// How many times a lost race is run again.
#[cfg(feature = "kubernetes")]
const TRIES: usize = 8;

/// Creates or updates `configuration` (from [`configuration`]) in the API
/// server. A create or update that another replica's write beat (409) is
/// made again from a fresh read; an update that would change nothing is
/// not made.
#[cfg(feature = "kubernetes")]
pub async fn register(
    client: kube::Client,
    configuration: &Value,
) -> Result<Registered, RegistrationError> {
    use kube::api::{Api, DynamicObject, PostParams};
    use kube::core::ApiResource;

    let resource = ApiResource {
        group: "admissionregistration.k8s.io".to_owned(),
        version: "v1".to_owned(),
        api_version: "admissionregistration.k8s.io/v1".to_owned(),
        kind: "MutatingWebhookConfiguration".to_owned(),
        plural: "mutatingwebhookconfigurations".to_owned(),
    };
    let api: Api<DynamicObject> = Api::all_with(client, &resource);
    let name = configuration["metadata"]["name"]
        .as_str()
        .unwrap_or(CONFIGURATION_NAME)
        .to_owned();
    let failed = |verb: &'static str| {
        let name = name.clone();
        move |err: kube::Error| match err {
            kube::Error::Api(status) if status.code == 403 => RegistrationError::Forbidden {
                verb,
                message: status.message,
            },
            other => RegistrationError::Failed {
                name: name.clone(),
                verb,
                message: other.to_string(),
            },
        }
    };
    let lost_race =
        |err: &kube::Error| matches!(err, kube::Error::Api(status) if status.code == 409);
    let object = |value: &Value| {
        serde_json::from_value::<DynamicObject>(value.clone()).map_err(|err| {
            RegistrationError::Failed {
                name: name.clone(),
                verb: "encode",
                message: err.to_string(),
            }
        })
    };
    for _ in 0..TRIES {
        let existing = api.get_opt(&name).await.map_err(failed("get"))?;
        let Some(existing) = existing else {
            match api
                .create(&PostParams::default(), &object(configuration)?)
                .await
            {
                Ok(_) => return Ok(Registered::Created),
                Err(err) if lost_race(&err) => continue,
                Err(err) => return Err(failed("create")(err)),
            }
        };
        let mut updated =
            serde_json::to_value(existing).map_err(|err| RegistrationError::Failed {
                name: name.clone(),
                verb: "decode",
                message: err.to_string(),
            })?;
        if updated["webhooks"] == configuration["webhooks"] {
            return Ok(Registered::Unchanged);
        }
        updated["webhooks"] = configuration["webhooks"].clone();
        if let Some(labels) = configuration["metadata"]["labels"].as_object() {
            for (key, value) in labels {
                updated["metadata"]["labels"][key] = value.clone();
            }
        }
        match api
            .replace(&name, &PostParams::default(), &object(&updated)?)
            .await
        {
            Ok(_) => return Ok(Registered::Updated),
            Err(err) if lost_race(&err) => continue,
            Err(err) => return Err(failed("update")(err)),
        }
    }
    Err(RegistrationError::Contended { name, tries: TRIES })
}

#[cfg(test)]
mod tests {
    use super::*;

    const CA: &str = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";

    #[test]
    fn the_configuration_says_what_the_api_server_needs() {
        let endpoint = Endpoint::on_host("10.0.0.2", 10354);
        let object = configuration(CONFIGURATION_NAME, &endpoint, CA);
        assert_eq!(object["metadata"]["name"], "edgehive-cloudcore");
        let webhook = &object["webhooks"][0];
        assert_eq!(
            webhook["clientConfig"]["url"],
            "https://10.0.0.2:10354/mutate-pods"
        );
        let bundle = base64::engine::general_purpose::STANDARD
            .decode(
                webhook["clientConfig"]["caBundle"]
                    .as_str()
                    .expect("bundle"),
            )
            .expect("base64");
        assert_eq!(bundle, CA.as_bytes());
        assert_eq!(
            webhook["rules"],
            json!([{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"], "scope": "Namespaced"}])
        );
        assert_eq!(webhook["failurePolicy"], "Ignore");
        assert_eq!(webhook["sideEffects"], "None");
        assert_eq!(webhook["timeoutSeconds"], 5);
        assert_eq!(webhook["admissionReviewVersions"], json!(["v1"]));
        assert_eq!(webhook["reinvocationPolicy"], "Never");
        assert_eq!(
            webhook["namespaceSelector"]["matchExpressions"][0],
            json!({"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["kube-system"]})
        );
        // In the cluster: a Service reference, its names in the certificate.
        let service = Endpoint::service("kubeedge/cloudcore").expect("service");
        let object = configuration(CONFIGURATION_NAME, &service, CA);
        assert_eq!(
            object["webhooks"][0]["clientConfig"]["service"],
            json!({"namespace": "kubeedge", "name": "cloudcore", "path": "/mutate-pods", "port": 443})
        );
        assert!(object["webhooks"][0]["clientConfig"].get("url").is_none());
        assert_eq!(
            service.server_names(),
            [
                "cloudcore.kubeedge.svc",
                "cloudcore.kubeedge.svc.cluster.local"
            ]
        );
    }

    #[test]
    fn endpoints_are_checked_as_the_api_server_checks_them() {
        assert_eq!(
            Endpoint::on_host("fd00::2", 10354),
            Endpoint::Url("https://[fd00::2]:10354/mutate-pods".to_owned())
        );
        assert_eq!(
            Endpoint::on_host("fd00::2", 10354).server_names(),
            ["fd00::2"]
        );
        assert_eq!(
            Endpoint::url("https://cloud.example:8443/mutate-pods")
                .expect("url")
                .server_names(),
            ["cloud.example"]
        );
        for (url, reason) in [
            ("http://cloud:8443/mutate-pods", "must be https://"),
            ("https://cloud/mutate-pods?x=1", "may have no query"),
            ("https://cloud/mutate-pods#x", "may have no query"),
            ("https://user@cloud/mutate-pods", "may have no user"),
            ("not a url", "is not a URL"),
        ] {
            let err = Endpoint::url(url).expect_err(url).to_string();
            assert!(err.contains(reason), "{url}: {err}");
        }
        assert_eq!(
            Endpoint::service("kubeedge/cloudcore:8443"),
            Ok(Endpoint::Service {
                namespace: "kubeedge".to_owned(),
                name: "cloudcore".to_owned(),
                port: 8443,
            })
        );
        for bad in [
            "cloudcore",
            "/cloudcore",
            "kubeedge/",
            "ns/Name",
            "ns/name:x",
            "ns/name:0",
        ] {
            assert!(Endpoint::service(bad).is_err(), "{bad}");
        }
    }
}
