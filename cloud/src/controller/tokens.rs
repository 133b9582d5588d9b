//! Service account tokens for pods' projected volumes: which tokens a pod
//! needs, and when each is due again. No I/O; the controller asks the
//! desired state for the tokens (a TokenRequest bound to the pod) and
//! sends each to the pod's node as a `serviceaccounttoken` object, named
//! as the edge's volumes look for it.
//!
//! A token is renewed once 80 % of its life has passed (as the kubelet
//! does), and retried after [`RETRY`] when it could not be had; the edge
//! keeps the last one it got while the cloud is away.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use apis::kinds::{ObjectKey, token_name};

use crate::desired::TokenRequest;

/// How soon a token that could not be had is asked for again.
pub const RETRY: Duration = Duration::from_secs(30);

/// The expiry the API server defaults a projected token to.
const DEFAULT_EXPIRATION: i64 = 3600;

/// One token a pod needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenSource {
    /// The name of the `serviceaccounttoken` object at the edge.
    pub name: String,
    /// What to ask for.
    pub request: TokenRequest,
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

/// The request a KubeEdge edge's kubelet makes for a token of
/// `service_account` in `namespace` (its TokenRequest's `spec`), bound to
/// the pod `pod` (name, uid).
pub fn requested(
    namespace: &str,
    service_account: &str,
    spec: &Value,
    pod: (&str, &str),
) -> TokenRequest {
    TokenRequest {
        namespace: namespace.to_owned(),
        service_account: service_account.to_owned(),
        audiences: spec["audiences"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|a| a.as_str().map(str::to_owned))
            .collect(),
        expiration_seconds: spec["expirationSeconds"]
            .as_i64()
            .unwrap_or(DEFAULT_EXPIRATION),
        pod: (pod.0.to_owned(), pod.1.to_owned()),
    }
}

/// The object that carries an issued token to the edge: the TokenRequest
/// with the API server's answer as its status.
pub fn token_object(source: &TokenSource, status: Value) -> Value {
    json!({
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "metadata": {"name": source.name, "namespace": source.request.namespace},
        "spec": {
            "audiences": source.request.audiences,
            "expirationSeconds": source.request.expiration_seconds,
        },
        "status": status,
    })
}

/// When a token issued at `now` for `expiration_seconds` is due again.
pub fn renew_at(now: Instant, expiration_seconds: i64) -> Instant {
    let life = Duration::from_secs(u64::try_from(expiration_seconds.max(60)).unwrap_or(3600));
    now + life.mul_f64(0.8)
}

/// The pods whose tokens are to be kept fresh: their node, what they
/// need, and when each is due.
#[derive(Debug, Default)]
pub struct TokenSchedule {
    pods: HashMap<ObjectKey, Scheduled>,
}

#[derive(Debug)]
struct Scheduled {
    node: String,
    pod: Value,
    due: Instant,
}

impl TokenSchedule {
    /// Follows `pod` on `node`, its tokens due at `due`.
    pub fn follow(&mut self, key: ObjectKey, node: &str, pod: Value, due: Instant) {
        self.pods.insert(
            key,
            Scheduled {
                node: node.to_owned(),
                pod,
                due,
            },
        );
    }

    /// Stops following `key`; the node and names of the tokens it had.
    pub fn forget(&mut self, key: &ObjectKey) -> Option<(String, Vec<TokenSource>)> {
        self.pods
            .remove(key)
            .map(|scheduled| (scheduled.node, sources(&scheduled.pod)))
    }

    /// Whether `key`'s tokens, for the same pod (uid) on `node`, are not
    /// due yet at `now` (a spec change of the pod needs none anew).
    pub fn fresh(&self, key: &ObjectKey, node: &str, pod: &Value, now: Instant) -> bool {
        self.pods.get(key).is_some_and(|scheduled| {
            scheduled.due > now
                && scheduled.node == node
                && scheduled.pod["metadata"]["uid"] == pod["metadata"]["uid"]
                && sources(&scheduled.pod) == sources(pod)
        })
    }

    /// The pods whose tokens are due at `now`: key, node and pod.
    pub fn due(&self, now: Instant) -> Vec<(ObjectKey, String, Value)> {
        self.pods
            .iter()
            .filter(|(_, scheduled)| scheduled.due <= now)
            .map(|(key, scheduled)| (key.clone(), scheduled.node.clone(), scheduled.pod.clone()))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use apis::kinds::Kind;

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
    fn a_kubelets_token_request_is_read_as_asked() {
        let spec = json!({
            "audiences": ["api", "vault"],
            "expirationSeconds": 3607,
            "boundObjectRef": {"kind": "Pod", "name": "web", "uid": "u-1"},
        });
        let request = requested("shop", "default", &spec, ("web", "u-1"));
        assert_eq!(request.namespace, "shop");
        assert_eq!(request.service_account, "default");
        assert_eq!(
            request.audiences,
            vec!["api".to_owned(), "vault".to_owned()]
        );
        assert_eq!(request.expiration_seconds, 3607);
        assert_eq!(request.pod, ("web".to_owned(), "u-1".to_owned()));
        let bare = requested("shop", "default", &json!({}), ("web", "u-1"));
        assert!(bare.audiences.is_empty());
        assert_eq!(bare.expiration_seconds, DEFAULT_EXPIRATION);
    }

    #[test]
    fn tokens_are_due_at_four_fifths_of_their_life() {
        let start = Instant::now();
        assert_eq!(renew_at(start, 3600), start + Duration::from_secs(2880));
        let mut schedule = TokenSchedule::default();
        let key = ObjectKey::new(Kind::Pod, "shop", "web");
        schedule.follow(key.clone(), "edge-1", pod(), renew_at(start, 3600));
        assert!(schedule.due(start + Duration::from_secs(2879)).is_empty());
        let due = schedule.due(start + Duration::from_secs(2880));
        assert_eq!(due.len(), 1);
        assert_eq!(due[0].1, "edge-1");
        let (node, had) = schedule.forget(&key).expect("followed");
        assert_eq!((node.as_str(), had.len()), ("edge-1", 2));
        assert!(schedule.due(start + Duration::from_secs(9999)).is_empty());
    }
}
