//! Service account tokens for pods' projected volumes, as both halves see
//! them: which tokens a pod needs (one per `serviceAccountToken` source),
//! the TokenRequest a kubelet makes for each (bound to the pod), the
//! question an edge asks its cloud for one and how the answer reads, the
//! `serviceaccounttoken` object the edge keeps it in, and when a token is
//! due again. No I/O; the time is passed in.
//!
//! A token is renewed once 80 % of its life has passed, or once it is a
//! day old, whichever comes first (the kubelet's rule).
//!
//! The question: operation `query`, resource
//! `{namespace}/serviceaccounttoken/{serviceAccountName}`, content the
//! TokenRequest (`spec`: audiences, expirationSeconds, boundObjectRef to
//! the pod), as a KubeEdge edge's kubelet asks it. The answer is the
//! TokenRequest with the API server's `status` (`token`,
//! `expirationTimestamp`); a refusal is an `error` message whose content
//! says why.

use std::time::{Duration, Instant};

use beehive::constants::{group, operation, resource_type};
use beehive::{Content, IntoRouteName, Message};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::k8s::{ObjectMeta, nullable};
use crate::kinds::token_name;

/// The expiry the API server defaults a projected token to.
pub const DEFAULT_EXPIRATION: i64 = 3600;

/// A token is renewed once it is this old, however long it holds (the
/// kubelet's `maxTTL`).
pub const MAX_AGE: Duration = Duration::from_secs(24 * 3600);

/// A service account token asked for a pod's projected volume.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TokenRequest {
    /// The pod's namespace.
    pub namespace: String,
    /// Whose token.
    pub service_account: String,
    /// For whom (empty: the API server's own audience).
    pub audiences: Vec<String>,
    /// How long it holds.
    pub expiration_seconds: i64,
    /// The pod it is bound to: name and uid.
    pub pod: (String, String),
}

impl TokenRequest {
    /// The resource a node asks for it under:
    /// `{namespace}/serviceaccounttoken/{serviceAccountName}`.
    pub fn resource(&self) -> String {
        format!(
            "{}/{}/{}",
            self.namespace,
            resource_type::SERVICE_ACCOUNT_TOKEN,
            self.service_account
        )
    }

    /// Its `spec`, as a kubelet sends it.
    pub fn spec(&self) -> TokenRequestSpec {
        TokenRequestSpec {
            audiences: self.audiences.clone(),
            expiration_seconds: Some(self.expiration_seconds),
            bound_object_ref: Some(BoundObjectReference {
                api_version: "v1".to_owned(),
                kind: "Pod".to_owned(),
                name: self.pod.0.clone(),
                uid: self.pod.1.clone(),
            }),
        }
    }

    /// The TokenRequest object, as a kubelet sends it.
    pub fn body(&self) -> TokenRequestObject {
        TokenRequestObject::new(&self.service_account, &self.namespace, self.spec())
    }

    /// The question `source` (an edge module) asks the cloud for this
    /// token, through edgehub (send it with `send_sync`).
    pub fn query(&self, source: impl IntoRouteName) -> Message {
        Message::new()
            .build_router(source, group::RESOURCE, self.resource(), operation::QUERY)
            .with_content(self.body().content())
    }
}

/// authentication.k8s.io/v1 TokenRequest: the question (`spec`) and the
/// API server's answer (`status`), as edge and cloud pass it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TokenRequestObject {
    /// `authentication.k8s.io/v1`.
    #[serde(rename = "apiVersion", default, deserialize_with = "nullable")]
    pub api_version: String,
    /// `TokenRequest`.
    #[serde(default, deserialize_with = "nullable")]
    pub kind: String,
    /// Name (the service account's, or the edge's token object's) and
    /// namespace.
    #[serde(default, deserialize_with = "nullable")]
    pub metadata: ObjectMeta,
    /// What is asked.
    #[serde(default, deserialize_with = "nullable")]
    pub spec: TokenRequestSpec,
    /// The API server's answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<TokenRequestStatus>,
}

/// A TokenRequest's `spec`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenRequestSpec {
    /// For whom (empty: the API server's own audience).
    #[serde(default, deserialize_with = "nullable")]
    pub audiences: Vec<String>,
    /// How long it is to hold.
    #[serde(
        rename = "expirationSeconds",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub expiration_seconds: Option<i64>,
    /// The pod it is bound to.
    #[serde(
        rename = "boundObjectRef",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub bound_object_ref: Option<BoundObjectReference>,
}

/// The object a token is bound to (here always a pod).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BoundObjectReference {
    /// `v1`.
    #[serde(rename = "apiVersion", default, deserialize_with = "nullable")]
    pub api_version: String,
    /// `Pod`.
    #[serde(default, deserialize_with = "nullable")]
    pub kind: String,
    /// The pod's name.
    #[serde(default, deserialize_with = "nullable")]
    pub name: String,
    /// The pod's uid.
    #[serde(default, deserialize_with = "nullable")]
    pub uid: String,
}

/// A TokenRequest's `status`: the token and when it expires.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenRequestStatus {
    /// The token (a JWT).
    #[serde(default, deserialize_with = "nullable")]
    pub token: String,
    /// When it expires (RFC 3339).
    #[serde(rename = "expirationTimestamp", default, deserialize_with = "nullable")]
    pub expiration_timestamp: String,
}

impl TokenRequestObject {
    /// A TokenRequest named `name` in `namespace` asking for `spec`.
    pub fn new(name: &str, namespace: &str, spec: TokenRequestSpec) -> Self {
        TokenRequestObject {
            api_version: "authentication.k8s.io/v1".to_owned(),
            kind: "TokenRequest".to_owned(),
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                namespace: Some(namespace.to_owned()),
                ..ObjectMeta::default()
            },
            spec,
            status: None,
        }
    }

    /// Read from a message's content: the object, or (from a KubeEdge
    /// peer) its JSON text.
    pub fn from_content(content: &Content) -> Option<TokenRequestObject> {
        match content {
            Content::Text(text) => serde_json::from_str(text).ok(),
            other => other.decode().ok(),
        }
    }

    /// As a message's content.
    pub fn content(&self) -> Content {
        Content::of(self).expect("a TokenRequest of strings and numbers encodes")
    }
}

/// One token a pod needs.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TokenSource {
    /// The name of the `serviceaccounttoken` object at the edge
    /// ([`token_name`]).
    pub name: String,
    /// What to ask for.
    pub request: TokenRequest,
}

impl TokenSource {
    /// Its resource at the edge: `{namespace}/serviceaccounttoken/{name}`
    /// (where the edge's volumes look for it).
    pub fn key(&self) -> String {
        format!(
            "{}/{}/{}",
            self.request.namespace,
            resource_type::SERVICE_ACCOUNT_TOKEN,
            self.name
        )
    }

    /// The object the edge keeps the token in: the TokenRequest as asked
    /// (bound to the pod), named [`TokenSource::name`], with the API
    /// server's `status`.
    pub fn object(&self, status: TokenRequestStatus) -> TokenRequestObject {
        TokenRequestObject {
            status: Some(status),
            ..TokenRequestObject::new(&self.name, &self.request.namespace, self.request.spec())
        }
    }

    /// Whether `object` (a `serviceaccounttoken` object the edge holds)
    /// carries a token asked as this one is: bound to the same pod (uid),
    /// for the same audiences and expiry.
    pub fn held_in(&self, object: &TokenRequestObject) -> bool {
        let spec = &object.spec;
        object
            .status
            .as_ref()
            .is_some_and(|status| !status.token.is_empty())
            && spec.bound_object_ref.as_ref().map(|pod| pod.uid.as_str())
                == Some(self.request.pod.1.as_str())
            && spec.expiration_seconds == Some(self.request.expiration_seconds)
            && spec.audiences == self.request.audiences
    }
}

/// The tokens `pod` needs: one per `serviceAccountToken` source of its
/// projected volumes.
pub fn sources(pod: &Value) -> Vec<TokenSource> {
    let metadata = &pod["metadata"];
    let (Some(name), Some(uid)) = (metadata["name"].as_str(), metadata["uid"].as_str()) else {
        return Vec::new();
    };
    let namespace = metadata["namespace"].as_str().unwrap_or("default");
    let account = pod["spec"]["serviceAccountName"]
        .as_str()
        .filter(|a| !a.is_empty())
        .unwrap_or("default");
    let mut found = Vec::new();
    for volume in pod["spec"]["volumes"].as_array().into_iter().flatten() {
        let Some(volume_name) = volume["name"].as_str() else {
            continue;
        };
        let sources = volume["projected"]["sources"].as_array();
        for (index, source) in sources.into_iter().flatten().enumerate() {
            let token = &source["serviceAccountToken"];
            if !token.is_object() {
                continue;
            }
            let audiences = token["audience"]
                .as_str()
                .filter(|a| !a.is_empty())
                .map(|a| vec![a.to_owned()])
                .unwrap_or_default();
            found.push(TokenSource {
                name: token_name(name, volume_name, index),
                request: TokenRequest {
                    namespace: namespace.to_owned(),
                    service_account: account.to_owned(),
                    audiences,
                    expiration_seconds: token["expirationSeconds"]
                        .as_i64()
                        .unwrap_or(DEFAULT_EXPIRATION),
                    pod: (name.to_owned(), uid.to_owned()),
                },
            });
        }
    }
    found
}

/// The request a kubelet makes for a token of `service_account` in
/// `namespace` (its TokenRequest's `spec`), bound to the pod `pod` (name,
/// uid).
pub fn requested(
    namespace: &str,
    service_account: &str,
    spec: &TokenRequestSpec,
    pod: (&str, &str),
) -> TokenRequest {
    TokenRequest {
        namespace: namespace.to_owned(),
        service_account: service_account.to_owned(),
        audiences: spec.audiences.clone(),
        expiration_seconds: spec.expiration_seconds.unwrap_or(DEFAULT_EXPIRATION),
        pod: (pod.0.to_owned(), pod.1.to_owned()),
    }
}

/// Why an answer to a token question gives no token.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AnswerError {
    /// The cloud (or edgehub, for an unreachable cloud) said no.
    #[error("refused: {0}")]
    Refused(String),
    /// The answer holds no token.
    #[error("the answer holds no token")]
    NoToken,
}

/// The `status` (`token`, `expirationTimestamp`) of the cloud's answer to
/// a token question, or why there is none.
pub fn answered(reply: &Message) -> Result<TokenRequestStatus, AnswerError> {
    if let Some(refused) = reply.failure() {
        return Err(AnswerError::Refused(refused.reason));
    }
    // A KubeEdge cloud may send the object as JSON text.
    TokenRequestObject::from_content(reply.content())
        .and_then(|object| object.status)
        .filter(|status| !status.token.is_empty())
        .ok_or(AnswerError::NoToken)
}

/// How long after now a token is due again: once 80 % of its life
/// (`expiration_seconds`) has passed, or once it is [`MAX_AGE`] old,
/// whichever comes first. `remaining` is how long it still holds (from
/// its `expirationTimestamp`); a token just issued has its whole life
/// left, one kept for a while less.
pub fn renew_in(expiration_seconds: i64, remaining: Duration) -> Duration {
    let life = Duration::from_secs(u64::try_from(expiration_seconds).unwrap_or(0));
    let age = life.saturating_sub(remaining);
    remaining
        .saturating_sub(life / 5)
        .min(MAX_AGE.saturating_sub(age))
}

/// When a token issued at `now` for `expiration_seconds` is due again
/// (a minute's life at least).
pub fn renew_at(now: Instant, expiration_seconds: i64) -> Instant {
    let seconds = expiration_seconds.max(60);
    let life = Duration::from_secs(u64::try_from(seconds).unwrap_or(3600));
    now + renew_in(seconds, life)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod() -> Value {
        json!({
            "metadata": {"name": "web", "namespace": "shop", "uid": "u-1"},
            "spec": {
                "serviceAccountName": "reader",
                "volumes": [
                    {"name": "www", "configMap": {"name": "web"}},
                    {"name": "kube-api-access-x", "projected": {"sources": [
                        {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                        {"configMap": {"name": "kube-root-ca.crt"}},
                        {"serviceAccountToken": {"audience": "vault", "path": "vault"}},
                    ]}},
                ],
            },
        })
    }

    #[test]
    fn a_pod_needs_one_token_per_projected_source() {
        let found = sources(&pod());
        assert_eq!(found.len(), 2);
        assert_eq!(found[0].name, "web.kube-api-access-x.0");
        assert_eq!(
            found[0].key(),
            "shop/serviceaccounttoken/web.kube-api-access-x.0"
        );
        assert_eq!(found[0].request.service_account, "reader");
        assert_eq!(found[0].request.namespace, "shop");
        assert!(found[0].request.audiences.is_empty());
        assert_eq!(found[0].request.expiration_seconds, 3607);
        assert_eq!(found[0].request.pod, ("web".to_owned(), "u-1".to_owned()));
        assert_eq!(found[1].name, "web.kube-api-access-x.2");
        assert_eq!(found[1].request.audiences, vec!["vault".to_owned()]);
        assert_eq!(found[1].request.expiration_seconds, DEFAULT_EXPIRATION);
        // No uid yet (not created), no projected volume: nothing.
        assert!(sources(&json!({"metadata": {"name": "a"}, "spec": {}})).is_empty());
    }

    #[test]
    fn the_question_is_a_kubelets_and_reads_back_as_asked() {
        let source = &sources(&pod())[1];
        let query = source.request.query("edged");
        assert_eq!(query.operation(), operation::QUERY);
        assert_eq!(query.group(), group::RESOURCE);
        assert_eq!(query.resource(), "shop/serviceaccounttoken/reader");
        let body = query.body::<Value>().expect("json");
        assert_eq!(body["kind"], "TokenRequest");
        assert_eq!(
            body["spec"]["boundObjectRef"],
            json!({"apiVersion": "v1", "kind": "Pod", "name": "web", "uid": "u-1"})
        );
        // What the cloud reads from it is what was asked.
        let asked = TokenRequestObject::from_content(query.content()).expect("object");
        let read = requested("shop", "reader", &asked.spec, ("web", "u-1"));
        assert_eq!(read, source.request);
        let bare = requested(
            "shop",
            "default",
            &TokenRequestSpec::default(),
            ("web", "u-1"),
        );
        assert!(bare.audiences.is_empty());
        assert_eq!(bare.expiration_seconds, DEFAULT_EXPIRATION);
    }

    #[test]
    fn a_kubelets_question_reads_with_its_nulls() {
        // Go's kubelet: a nil audience list, a zero status.
        let asked = json!({
            "kind": "TokenRequest", "apiVersion": "authentication.k8s.io/v1",
            "metadata": {"name": "default", "namespace": "shop", "creationTimestamp": null},
            "spec": {"audiences": null, "expirationSeconds": 3607,
                     "boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": "web", "uid": "u-1"}},
            "status": {"token": "", "expirationTimestamp": null},
        });
        for content in [
            Content::of(&asked).expect("json"),
            Content::text(asked.to_string()),
        ] {
            let object = TokenRequestObject::from_content(&content).expect("reads");
            assert!(object.spec.audiences.is_empty());
            assert_eq!(object.spec.expiration_seconds, Some(3607));
            let pod = object.spec.bound_object_ref.expect("bound");
            assert_eq!((pod.name.as_str(), pod.uid.as_str()), ("web", "u-1"));
            assert_eq!(object.status.map(|s| s.token), Some(String::new()));
        }
    }

    #[test]
    fn answers_read_as_a_status_or_a_refusal() {
        let query = sources(&pod())[0].request.query("edged");
        let mut content = query.body::<Value>().expect("json");
        content["status"] =
            json!({"token": "a.b.c", "expirationTimestamp": "2030-01-01T00:00:00Z"});
        let answer = Content::of(&content).expect("json");
        let status = answered(&query.response("edgecontroller", answer)).expect("token");
        assert_eq!(status.token, "a.b.c");
        // As JSON text too.
        let text = Content::text(content.to_string());
        assert!(answered(&query.response("edgecontroller", text)).is_ok());
        let refusal = query.error_response("edgecontroller", "the pod is not bound to this node");
        assert_eq!(
            answered(&refusal),
            Err(AnswerError::Refused(
                "the pod is not bound to this node".into()
            ))
        );
        let empty = query.response(
            "edgecontroller",
            beehive::Content::of(&json!({"status": {"token": ""}})).expect("json body"),
        );
        assert_eq!(answered(&empty), Err(AnswerError::NoToken));
    }

    #[test]
    fn a_kept_token_is_held_only_for_the_same_pod_and_request() {
        let source = &sources(&pod())[0];
        let issued = |token: &str| TokenRequestStatus {
            token: token.to_owned(),
            ..TokenRequestStatus::default()
        };
        let object = source.object(issued("a.b.c"));
        assert_eq!(
            object.metadata.name.as_deref(),
            Some("web.kube-api-access-x.0")
        );
        assert!(source.held_in(&object));
        // Another pod of the same name (another uid), another expiry, no
        // token, or a token object without its binding: not held.
        let mut other = source.clone();
        other.request.pod.1 = "u-2".into();
        assert!(!other.held_in(&object));
        let mut longer = source.clone();
        longer.request.expiration_seconds = 7200;
        assert!(!longer.held_in(&object));
        assert!(!source.held_in(&source.object(issued(""))));
        let unbound: TokenRequestObject =
            serde_json::from_value(json!({"status": {"token": "a.b.c"}})).expect("object");
        assert!(!source.held_in(&unbound));
    }

    #[test]
    fn tokens_are_due_at_four_fifths_of_their_life_or_a_day() {
        let hour = Duration::from_secs(3600);
        assert_eq!(renew_in(3600, hour), Duration::from_secs(2880));
        // Kept a while: due when a fifth of its life is left.
        assert_eq!(
            renew_in(3600, Duration::from_secs(1000)),
            Duration::from_secs(280)
        );
        assert_eq!(renew_in(3600, Duration::from_secs(100)), Duration::ZERO);
        // A two-day token: a day after it was issued.
        let two_days = Duration::from_secs(48 * 3600);
        assert_eq!(renew_in(48 * 3600, two_days), MAX_AGE);
        assert_eq!(renew_in(48 * 3600, two_days - hour), MAX_AGE - hour);
        let start = Instant::now();
        assert_eq!(renew_at(start, 3600), start + Duration::from_secs(2880));
        assert_eq!(renew_at(start, 10), start + Duration::from_secs(48));
    }
}
