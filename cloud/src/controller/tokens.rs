//! Service account tokens asked for by edges: a node's kubelet (KubeEdge's,
//! or edgehive's edged) asks for each projected token of a pod when it
//! starts the pod, through its link, and renews it; the controller checks
//! that the pod is bound to that node and asks the API server for a
//! TokenRequest bound to the pod. No I/O here: how a node's request reads.

use serde_json::Value;

use crate::desired::TokenRequest;

/// The expiry the API server defaults a projected token to.
const DEFAULT_EXPIRATION: i64 = 3600;

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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

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
}
