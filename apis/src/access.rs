//! What a request to a Kubernetes-shaped API asks, as kube-apiserver's
//! authorizers name it ([`attributes`]), and the messages an edge and the
//! cloud exchange to review an edge application's request
//! ([`AccessReview`], [`ReviewAnswer`]): the edge's MetaServer, with
//! `requireAuthorization`, asks the cloud whether a service account token
//! may do what its bearer asks, and the cloud answers through
//! kube-apiserver's TokenReview and SubjectAccessReview.

use serde::{Deserialize, Serialize};

/// A request as kube-apiserver's authorizers see it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct RequestAttributes {
    /// `get`, `list`, `watch`, `create`, `update`, `patch`, `delete`,
    /// `deletecollection`.
    pub verb: String,
    /// Whether the path names a resource (`/api/...`, `/apis/g/v/...`);
    /// otherwise only `path` matters.
    pub resource_request: bool,
    /// The API group (`""` for the core group).
    pub group: String,
    /// The resource (`pods`).
    pub resource: String,
    /// The subresource (`log`, `exec`, ...), or empty.
    pub subresource: String,
    /// The namespace, or empty.
    pub namespace: String,
    /// The object's name, or empty.
    pub name: String,
    /// The path, without its query.
    pub path: String,
}

/// Subresources that run something in a pod or open a way into it: asked
/// with a WebSocket `GET`, but authorized as `create`.
const INTO_POD: [&str; 4] = ["exec", "attach", "portforward", "proxy"];

/// Names `method path?query` as kube-apiserver's request info does.
pub fn attributes(method: &str, path_and_query: &str) -> RequestAttributes {
    let (path, query) = path_and_query
        .split_once('?')
        .unwrap_or((path_and_query, ""));
    let watch = form_urlencoded::parse(query.as_bytes())
        .any(|(key, value)| key == "watch" && (value == "true" || value == "1"));
    let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let mut attributes = RequestAttributes {
        verb: match method {
            "GET" | "HEAD" => "get",
            "POST" => "create",
            "PUT" => "update",
            "PATCH" => "patch",
            "DELETE" => "delete",
            other => other,
        }
        .to_lowercase(),
        resource_request: false,
        group: String::new(),
        resource: String::new(),
        subresource: String::new(),
        namespace: String::new(),
        name: String::new(),
        path: path.to_owned(),
    };
    let rest = match segments.as_slice() {
        ["api", _version, rest @ ..] if !rest.is_empty() => rest,
        ["apis", group, _version, rest @ ..] if !rest.is_empty() => {
            attributes.group = (*group).to_owned();
            rest
        }
        _ => return attributes,
    };
    attributes.resource_request = true;
    let rest = match rest {
        ["namespaces", namespace, rest @ ..] if !rest.is_empty() => {
            attributes.namespace = (*namespace).to_owned();
            rest
        }
        rest => rest,
    };
    attributes.resource = rest[0].to_owned();
    attributes.name = rest.get(1).copied().unwrap_or_default().to_owned();
    attributes.subresource = rest.get(2..).map(|s| s.join("/")).unwrap_or_default();
    if attributes.resource == "namespaces" && rest.len() == 2 {
        // `/api/v1/namespaces/{name}` names a namespace object.
        attributes.namespace = attributes.name.clone();
    }
    match attributes.verb.as_str() {
        "get" if watch => attributes.verb = "watch".to_owned(),
        "get" if attributes.name.is_empty() => attributes.verb = "list".to_owned(),
        "delete" if attributes.name.is_empty() => attributes.verb = "deletecollection".to_owned(),
        _ => {}
    }
    if INTO_POD.contains(&attributes.subresource.as_str()) {
        attributes.verb = "create".to_owned();
    }
    attributes
}

/// The edge resource type of a review question (`<namespace>/accessreview`).
pub use beehive::constants::resource_type::ACCESS_REVIEW;

/// An edge application's request, for the cloud to review: the bearer
/// token it presented and what it asks. Sent by the node whose MetaServer
/// was asked; the cloud answers that node only.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AccessReview {
    /// The service account token (a bearer secret: never logged).
    pub token: String,
    /// What the request asks.
    pub attributes: RequestAttributes,
}

impl std::fmt::Debug for AccessReview {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AccessReview")
            .field("token", &"<redacted>")
            .field("attributes", &self.attributes)
            .finish()
    }
}

/// The cloud's answer to an [`AccessReview`]. A review the cloud could not
/// make (kube-apiserver unreachable) is an error answer instead, and the
/// edge refuses with 503 without keeping it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "decision", rename_all = "camelCase")]
pub enum ReviewAnswer {
    /// The token's user may.
    Allowed {
        /// Who the token is (`system:serviceaccount:<ns>:<name>`).
        user: String,
    },
    /// The token's user may not (403).
    Denied {
        /// Who the token is.
        user: String,
        /// Why, in kube-apiserver's words.
        reason: String,
    },
    /// The token is not valid, or tokens cannot be checked here (401).
    Unauthenticated {
        /// Why.
        reason: String,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_are_named_as_kube_apiserver_names_them() {
        let get = attributes("GET", "/api/v1/namespaces/apps/configmaps/settings");
        assert_eq!(
            (
                get.verb.as_str(),
                get.resource.as_str(),
                get.namespace.as_str(),
                get.name.as_str()
            ),
            ("get", "configmaps", "apps", "settings")
        );
        assert_eq!(
            attributes("GET", "/api/v1/namespaces/apps/pods").verb,
            "list"
        );
        assert_eq!(attributes("GET", "/api/v1/pods?watch=true").verb, "watch");
        let devices = attributes("GET", "/apis/devices.kubeedge.io/v1beta1/devices");
        assert_eq!(devices.group, "devices.kubeedge.io");
    }

    #[test]
    fn a_review_never_shows_its_token() {
        let review = AccessReview {
            token: "secret-token".to_owned(),
            attributes: attributes("GET", "/api/v1/nodes"),
        };
        assert!(!format!("{review:?}").contains("secret-token"));
        let answer = ReviewAnswer::Denied {
            user: "u".to_owned(),
            reason: "no".to_owned(),
        };
        let json = serde_json::to_value(&answer).expect("serializes");
        assert_eq!(json["decision"], "denied");
        assert_eq!(
            serde_json::from_value::<ReviewAnswer>(json).ok(),
            Some(answer)
        );
    }
}
