//! The admission decision, with no I/O: an `AdmissionReview`
//! (`admission.k8s.io/v1`) in, the review to send back out.
//!
//! A pod is mutated only when it is being created and can only run on an
//! edge node: its `spec.nodeName` names one, or (left to the scheduler) its
//! `nodeSelector` or its required node affinity can only match nodes
//! labelled [`EDGE_NODE_LABEL`]. The mutation is
//! [`eviction::lengthened`]'s: the `not-ready` / `unreachable` NoExecute
//! tolerations the API server's DefaultTolerationSeconds admission gave it
//! (300 s) are lengthened to the window, or lose their limit; tolerations
//! a user wrote stay. It goes back as a JSONPatch of `replace` and
//! `remove` operations on those tolerations' `tolerationSeconds`.
//!
//! A review is always answered `allowed: true`: the webhook never refuses
//! a pod. Only a body that is not an `admission.k8s.io/v1`
//! `AdmissionReview` with a request and a uid is an error (the server
//! answers it 400).

use std::collections::HashSet;
use std::time::Duration;

use base64::Engine;
use serde::Serialize;
use serde_json::{Value, json};

use crate::desired::EDGE_NODE_LABEL;
use crate::edgecontroller::eviction;

/// The review's API version, the only one this webhook speaks.
pub const REVIEW_API_VERSION: &str = "admission.k8s.io/v1";

/// Which nodes are edge nodes, as cloudcore knows them now.
pub trait EdgeNodes: Send + Sync {
    /// Whether `node` is an edge node.
    fn is_edge_node(&self, node: &str) -> bool;
}

impl EdgeNodes for HashSet<String> {
    fn is_edge_node(&self, node: &str) -> bool {
        self.contains(node)
    }
}

#[cfg(feature = "kubernetes")]
impl EdgeNodes for crate::desired::kubernetes::EdgeNodeNames {
    fn is_edge_node(&self, node: &str) -> bool {
        self.contains(node)
    }
}

/// A body that is not a review this webhook can answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReviewError {
    /// Not JSON at all.
    #[error("the body is not JSON: {0}")]
    NotJson(String),
    /// JSON, but not an `admission.k8s.io/v1` `AdmissionReview`.
    #[error(
        "expected an AdmissionReview of admission.k8s.io/v1, got kind {kind:?} of apiVersion {api_version:?}"
    )]
    NotReview {
        /// The body's `kind`.
        kind: String,
        /// The body's `apiVersion`.
        api_version: String,
    },
    /// A review without its `request`.
    #[error("the AdmissionReview has no request")]
    NoRequest,
    /// A request without the `uid` the answer must echo.
    #[error("the AdmissionReview's request has no uid")]
    NoUid,
}

/// One JSONPatch (RFC 6902) operation.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "op", rename_all = "lowercase")]
pub enum PatchOp {
    /// Sets the value at `path`, which must exist.
    Replace {
        /// A JSON pointer.
        path: String,
        /// The new value.
        value: Value,
    },
    /// Removes the value at `path`, which must exist.
    Remove {
        /// A JSON pointer.
        path: String,
    },
}

/// What the webhook answers a review.
#[derive(Debug, Clone, PartialEq)]
pub struct Answer {
    /// The `AdmissionReview` to send back.
    pub review: Value,
    /// The request's uid.
    pub uid: String,
    /// The pod as `namespace/name` (its `generateName` when it has no
    /// name yet), for the log; empty when the request is not for a pod.
    pub pod: String,
    /// The patch's operations (none: allowed as it is).
    pub patch: Vec<PatchOp>,
}

/// Answers the review in `body`: allowed, with the patch lengthening the
/// pod's default offline tolerations to `window` (`None`: no limit) when
/// [`decide`] says so.
pub fn answer(
    body: &[u8],
    window: Option<Duration>,
    edge: &dyn EdgeNodes,
) -> Result<Answer, ReviewError> {
    let review: Value =
        serde_json::from_slice(body).map_err(|err| ReviewError::NotJson(err.to_string()))?;
    let (kind, api_version) = (
        review["kind"].as_str().unwrap_or_default(),
        review["apiVersion"].as_str().unwrap_or_default(),
    );
    if kind != "AdmissionReview" || api_version != REVIEW_API_VERSION {
        return Err(ReviewError::NotReview {
            kind: kind.to_owned(),
            api_version: api_version.to_owned(),
        });
    }
    let request = review
        .get("request")
        .filter(|r| r.is_object())
        .ok_or(ReviewError::NoRequest)?;
    let uid = request["uid"]
        .as_str()
        .filter(|uid| !uid.is_empty())
        .ok_or(ReviewError::NoUid)?;
    let patch = decide(request, window, edge);
    let mut response = json!({"uid": uid, "allowed": true});
    if !patch.is_empty() {
        // Serializing a list of plain operations cannot fail.
        let ops = serde_json::to_vec(&patch).unwrap_or_default();
        response["patchType"] = json!("JSONPatch");
        response["patch"] = json!(base64::engine::general_purpose::STANDARD.encode(ops));
    }
    Ok(Answer {
        review: json!({
            "apiVersion": REVIEW_API_VERSION,
            "kind": "AdmissionReview",
            "response": response,
        }),
        uid: uid.to_owned(),
        pod: pod_name(request),
        patch,
    })
}

/// The patch for one review's `request` (empty: nothing to change): only a
/// pod's creation, only for a pod that can only run on an edge node.
pub fn decide(request: &Value, window: Option<Duration>, edge: &dyn EdgeNodes) -> Vec<PatchOp> {
    let resource = &request["resource"];
    let creates_a_pod = request["operation"] == "CREATE"
        && resource["group"].as_str().unwrap_or_default().is_empty()
        && resource["version"] == "v1"
        && resource["resource"] == "pods"
        && request["subResource"]
            .as_str()
            .unwrap_or_default()
            .is_empty();
    let pod = &request["object"];
    if !creates_a_pod || !pod.is_object() || !runs_on_edge(pod, edge) {
        return Vec::new();
    }
    patch(pod, window)
}

/// Whether `pod` can only run on an edge node: bound to one, or placed by
/// a `nodeSelector` or a required node affinity only edge nodes match.
pub fn runs_on_edge(pod: &Value, edge: &dyn EdgeNodes) -> bool {
    let spec = &pod["spec"];
    if let Some(node) = spec["nodeName"].as_str().filter(|node| !node.is_empty()) {
        return edge.is_edge_node(node);
    }
    if spec["nodeSelector"]
        .as_object()
        .is_some_and(|selector| selector.contains_key(EDGE_NODE_LABEL))
    {
        return true;
    }
    // The terms are alternatives: every one must require an edge node.
    spec.pointer(
        "/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution/nodeSelectorTerms",
    )
    .and_then(Value::as_array)
    .is_some_and(|terms| {
        !terms.is_empty() && terms.iter().all(|term| term_requires_edge(term, edge))
    })
}

/// Whether a node selector term matches edge nodes only: one of its
/// requirements (all of which must hold) needs the edge label, or names
/// only edge nodes.
fn term_requires_edge(term: &Value, edge: &dyn EdgeNodes) -> bool {
    let requirements = |field: &str| term[field].as_array().into_iter().flatten();
    let values = |requirement: &Value| -> Vec<String> {
        requirement["values"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|value| value.as_str().map(str::to_owned))
            .collect()
    };
    let labelled = requirements("matchExpressions").any(|requirement| {
        requirement["key"] == EDGE_NODE_LABEL
            && match requirement["operator"].as_str() {
                Some("Exists") => true,
                Some("In") => !values(requirement).is_empty(),
                _ => false,
            }
    });
    let named = requirements("matchFields").any(|requirement| {
        let names = values(requirement);
        requirement["key"] == "metadata.name"
            && requirement["operator"] == "In"
            && !names.is_empty()
            && names.iter().all(|name| edge.is_edge_node(name))
    });
    labelled || named
}

/// The JSONPatch lengthening `pod`'s default offline tolerations to
/// `window` (`None`: no limit), by [`eviction::lengthened`]'s rule; empty
/// if there is nothing to lengthen.
pub fn patch(pod: &Value, window: Option<Duration>) -> Vec<PatchOp> {
    let Some(lengthened) = eviction::lengthened(pod, window) else {
        return Vec::new();
    };
    let tolerations = |pod: &Value| {
        pod.pointer("/spec/tolerations")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default()
    };
    let (before, after) = (tolerations(pod), tolerations(&lengthened));
    before
        .iter()
        .zip(&after)
        .enumerate()
        .filter(|(_, (before, after))| before != after)
        .map(|(at, (_, after))| {
            let path = format!("/spec/tolerations/{at}/tolerationSeconds");
            match after.get("tolerationSeconds") {
                Some(seconds) => PatchOp::Replace {
                    path,
                    value: seconds.clone(),
                },
                None => PatchOp::Remove { path },
            }
        })
        .collect()
}

/// `namespace/name` of the request's pod (or its `generateName`, for a
/// pod whose name the API server has not chosen yet).
fn pod_name(request: &Value) -> String {
    if request["resource"]["resource"] != "pods" {
        return String::new();
    }
    let metadata = &request["object"]["metadata"];
    let namespace = request["namespace"]
        .as_str()
        .or(metadata["namespace"].as_str())
        .unwrap_or_default();
    let name = request["name"]
        .as_str()
        .filter(|name| !name.is_empty())
        .or(metadata["name"].as_str())
        .or(metadata["generateName"].as_str())
        .unwrap_or_default();
    format!("{namespace}/{name}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn edge() -> HashSet<String> {
        ["edge-1".to_owned(), "edge-2".to_owned()].into()
    }

    /// Tolerations as the API server's DefaultTolerationSeconds admission
    /// leaves them, after one a user wrote.
    fn admitted_tolerations() -> Value {
        json!([
            {"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"},
            {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
            {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
        ])
    }

    fn pod(spec: Value) -> Value {
        let mut spec = spec;
        spec["tolerations"] = admitted_tolerations();
        spec["containers"] = json!([{"name": "main", "image": "busybox"}]);
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "ns"}, "spec": spec})
    }

    fn request(operation: &str, object: Value) -> Value {
        json!({
            "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
            "requestResource": {"group": "", "version": "v1", "resource": "pods"},
            "name": "p",
            "namespace": "ns",
            "operation": operation,
            "userInfo": {"username": "admin"},
            "object": object,
            "oldObject": null,
            "dryRun": false,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
        })
    }

    fn review(request: Value) -> Vec<u8> {
        serde_json::to_vec(&json!({
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": request,
        }))
        .expect("JSON")
    }

    const DAY: Option<Duration> = Some(Duration::from_secs(86_400));

    fn lengthened_to(seconds: i64) -> Vec<PatchOp> {
        [1, 2]
            .map(|at| PatchOp::Replace {
                path: format!("/spec/tolerations/{at}/tolerationSeconds"),
                value: json!(seconds),
            })
            .to_vec()
    }

    #[test]
    fn a_pod_bound_to_an_edge_node_has_its_default_tolerations_lengthened() {
        let created = request("CREATE", pod(json!({"nodeName": "edge-1"})));
        assert_eq!(decide(&created, DAY, &edge()), lengthened_to(86_400));
        // No window: the limit goes.
        let removed = decide(&created, None, &edge());
        assert_eq!(
            removed,
            [1, 2]
                .map(|at| PatchOp::Remove {
                    path: format!("/spec/tolerations/{at}/tolerationSeconds")
                })
                .to_vec()
        );
    }

    #[test]
    fn pods_placed_only_on_edge_nodes_by_selector_or_affinity_are_mutated() {
        let selected = pod(json!({"nodeSelector": {"node-role.kubernetes.io/edge": ""}}));
        assert!(runs_on_edge(&selected, &edge()));
        let affinity = |terms: Value| {
            pod(json!({"affinity": {"nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}
            }}}))
        };
        let exists = json!({"key": "node-role.kubernetes.io/edge", "operator": "Exists"});
        let zone = json!({"key": "zone", "operator": "In", "values": ["a"]});
        // One term, the edge label among its requirements.
        assert!(runs_on_edge(
            &affinity(json!([{"matchExpressions": [zone.clone(), exists.clone()]}])),
            &edge()
        ));
        assert!(runs_on_edge(
            &affinity(json!([{"matchExpressions": [
                {"key": "node-role.kubernetes.io/edge", "operator": "In", "values": [""]}
            ]}])),
            &edge()
        ));
        // Every term must require it: one that does not lets the pod
        // land elsewhere.
        assert!(!runs_on_edge(
            &affinity(json!([
                {"matchExpressions": [exists.clone()]},
                {"matchExpressions": [zone.clone()]},
            ])),
            &edge()
        ));
        // Terms naming edge nodes only.
        let named = |names: Value| {
            affinity(json!([{"matchFields": [
                {"key": "metadata.name", "operator": "In", "values": names}
            ]}]))
        };
        assert!(runs_on_edge(&named(json!(["edge-1", "edge-2"])), &edge()));
        assert!(!runs_on_edge(&named(json!(["edge-1", "cloud-1"])), &edge()));
        // Keeping away from edge nodes is not running on them.
        for operator in ["DoesNotExist", "NotIn"] {
            assert!(!runs_on_edge(
                &affinity(json!([{"matchExpressions": [
                    {"key": "node-role.kubernetes.io/edge", "operator": operator, "values": [""]}
                ]}])),
                &edge()
            ));
        }
        assert!(!runs_on_edge(&affinity(json!([])), &edge()));
        // The scheduler may place these anywhere: not mutated.
        assert!(!runs_on_edge(&pod(json!({})), &edge()));
        assert!(!runs_on_edge(
            &pod(json!({"nodeSelector": {"kubernetes.io/hostname": "edge-1"}})),
            &edge()
        ));
        // A pod created with the edge selector is mutated at creation.
        assert_eq!(
            decide(&request("CREATE", selected), DAY, &edge()),
            lengthened_to(86_400)
        );
    }

    #[test]
    fn anything_else_is_allowed_as_it_is() {
        let edge_pod = pod(json!({"nodeName": "edge-1"}));
        // Another node, or a node not (yet) known as an edge node.
        for node in ["cloud-1", "edge-3"] {
            let other = request("CREATE", pod(json!({ "nodeName": node })));
            assert!(decide(&other, DAY, &edge()).is_empty(), "{node}");
        }
        // Not a create.
        for operation in ["UPDATE", "DELETE", "CONNECT"] {
            assert!(decide(&request(operation, edge_pod.clone()), DAY, &edge()).is_empty());
        }
        // A subresource (a binding) or another resource.
        let mut binding = request("CREATE", edge_pod.clone());
        binding["subResource"] = json!("binding");
        assert!(decide(&binding, DAY, &edge()).is_empty());
        let mut deployment = request("CREATE", edge_pod.clone());
        deployment["resource"] =
            json!({"group": "apps", "version": "v1", "resource": "deployments"});
        assert!(decide(&deployment, DAY, &edge()).is_empty());
        // No object, or one that is not an object.
        for object in [Value::Null, json!("pod")] {
            assert!(decide(&request("CREATE", object), DAY, &edge()).is_empty());
        }
        // A window equal to the default changes nothing.
        assert!(
            decide(
                &request("CREATE", edge_pod),
                Some(Duration::from_secs(300)),
                &edge()
            )
            .is_empty()
        );
    }

    #[test]
    fn tolerations_a_user_wrote_stay() {
        let mut chosen = pod(json!({"nodeName": "edge-1"}));
        chosen["spec"]["tolerations"] = json!([
            {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 30},
            {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
            {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoSchedule", "tolerationSeconds": 300},
            {"key": "other", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
        ]);
        assert_eq!(
            patch(&chosen, DAY),
            vec![PatchOp::Replace {
                path: "/spec/tolerations/1/tolerationSeconds".to_owned(),
                value: json!(86_400),
            }]
        );
        // No tolerations at all: nothing to lengthen.
        let mut bare = pod(json!({"nodeName": "edge-1"}));
        bare["spec"]
            .as_object_mut()
            .expect("spec")
            .remove("tolerations");
        assert!(patch(&bare, DAY).is_empty());
    }

    #[test]
    fn the_answer_echoes_the_uid_and_carries_a_base64_json_patch() {
        let body = review(request("CREATE", pod(json!({"nodeName": "edge-2"}))));
        let answered = answer(&body, Some(Duration::from_secs(600)), &edge()).expect("answer");
        let response = &answered.review["response"];
        assert_eq!(answered.review["apiVersion"], "admission.k8s.io/v1");
        assert_eq!(answered.review["kind"], "AdmissionReview");
        assert_eq!(response["uid"], "705ab4f5-6393-11e8-b7cc-42010a800002");
        assert_eq!(response["allowed"], true);
        assert_eq!(response["patchType"], "JSONPatch");
        let ops = base64::engine::general_purpose::STANDARD
            .decode(response["patch"].as_str().expect("patch"))
            .expect("base64");
        let ops: Value = serde_json::from_slice(&ops).expect("JSON");
        assert_eq!(
            ops,
            json!([
                {"op": "replace", "path": "/spec/tolerations/1/tolerationSeconds", "value": 600},
                {"op": "replace", "path": "/spec/tolerations/2/tolerationSeconds", "value": 600},
            ])
        );
        assert_eq!(answered.pod, "ns/p");
        // Not mutated: allowed, no patch at all.
        let body = review(request("CREATE", pod(json!({"nodeName": "cloud-1"}))));
        let answered = answer(&body, DAY, &edge()).expect("answer");
        assert_eq!(
            answered.review["response"],
            json!({"uid": "705ab4f5-6393-11e8-b7cc-42010a800002", "allowed": true})
        );
    }

    #[test]
    fn a_malformed_review_is_an_error_that_says_why() {
        let err = |body: &[u8]| answer(body, DAY, &edge()).expect_err("malformed");
        assert!(matches!(err(b"{not json"), ReviewError::NotJson(_)));
        assert_eq!(
            err(br#"{"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview", "request": {"uid": "u"}}"#),
            ReviewError::NotReview {
                kind: "AdmissionReview".to_owned(),
                api_version: "admission.k8s.io/v1beta1".to_owned(),
            }
        );
        assert_eq!(
            err(br#"{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}"#),
            ReviewError::NoRequest
        );
        assert_eq!(
            err(
                br#"{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {"operation": "CREATE"}}"#
            ),
            ReviewError::NoUid
        );
        assert!(
            err(b"[]")
                .to_string()
                .contains("expected an AdmissionReview of admission.k8s.io/v1")
        );
    }
}
