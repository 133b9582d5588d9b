//! Tests of the parent module (`reviews.rs`).

use super::*;
use apis::access::{AccessReview, ReviewAnswer, attributes};
use std::sync::Arc;

/// Tokens `reader` (may read configmaps in `apps`) and nothing else.
struct Fake;

impl TokenAuthenticator for Fake {
    fn authenticate<'a>(&'a self, token: &'a str) -> Authentication<'a> {
        Box::pin(async move {
            let caller = |node: &str| Caller {
                extra: BTreeMap::from([(NODE_NAME_EXTRA.to_owned(), vec![node.to_owned()])]),
                ..Caller::new(
                    "system:serviceaccount:apps:reader",
                    vec!["system:serviceaccounts".to_owned()],
                )
            };
            Ok(match token {
                "reader" => Some(Caller::new(
                    "system:serviceaccount:apps:reader",
                    vec!["system:serviceaccounts".to_owned()],
                )),
                "bound-to-edge-1" => Some(caller("edge-1")),
                "bound-to-edge-2" => Some(caller("edge-2")),
                _ => None,
            })
        })
    }
}

impl Authorizer for Fake {
    fn allowed<'a>(&'a self, _caller: &'a Caller, access: &'a Access) -> Decision<'a> {
        let ok = access.resource == "configmaps" && access.namespace == "apps";
        Box::pin(async move { Ok(ok) })
    }
}

fn review(token: &str, method: &str, path: &str) -> AccessReview {
    AccessReview {
        token: token.to_owned(),
        attributes: attributes(method, path),
    }
}

#[actix::test]
async fn an_edge_request_is_reviewed_as_the_token_s_user() {
    let access = TokenAccess::new(Arc::new(Fake), Arc::new(Fake));
    let ask = |token, method, path| {
        let (access, review) = (access.clone(), review(token, method, path));
        async move { review_edge_request(Some(&access), "edge-1", &review).await }
    };
    let user = "system:serviceaccount:apps:reader".to_owned();
    assert_eq!(
        ask(
            "reader",
            "GET",
            "/api/v1/namespaces/apps/configmaps/settings"
        )
        .await,
        Ok(ReviewAnswer::Allowed { user: user.clone() })
    );
    assert!(matches!(
        ask("reader", "GET", "/api/v1/namespaces/apps/secrets/keys").await,
        Ok(ReviewAnswer::Denied { reason, .. }) if reason.is_empty()
    ));
    // Only reads of what MetaServer holds, whatever RBAC would say.
    for (method, path) in [
        ("DELETE", "/api/v1/namespaces/apps/configmaps/settings"),
        ("GET", "/api/v1/namespaces/apps/pods/web/log"),
        ("GET", "/api/v1/namespaces/apps/persistentvolumeclaims"),
        ("GET", "/apis/apps/v1/namespaces/apps/configmaps"),
    ] {
        assert!(
            matches!(
                ask("reader", method, path).await,
                Ok(ReviewAnswer::Denied { .. })
            ),
            "{method} {path}"
        );
    }
    assert!(matches!(
        ask("forged", "GET", "/api/v1/namespaces/apps/configmaps").await,
        Ok(ReviewAnswer::Unauthenticated { .. })
    ));
    // A token bound to a pod on this node is its user's; one bound to
    // a pod on another node is no one's here.
    let settings = "/api/v1/namespaces/apps/configmaps/settings";
    assert_eq!(
        ask("bound-to-edge-1", "GET", settings).await,
        Ok(ReviewAnswer::Allowed { user: user.clone() })
    );
    assert!(matches!(
        ask("bound-to-edge-2", "GET", settings).await,
        Ok(ReviewAnswer::Unauthenticated { reason }) if reason.contains("node edge-2, not on edge-1")
    ));
    // No API server: no token is anyone.
    let embedded =
        review_edge_request(None, "edge-1", &review("reader", "GET", "/api/v1/pods")).await;
    assert!(matches!(
        embedded,
        Ok(ReviewAnswer::Unauthenticated { reason }) if reason.contains("Kubernetes mode")
    ));
}

#[actix::test]
async fn a_node_asking_too_many_reviews_gets_no_decision_and_others_are_not_held() {
    let access = TokenAccess {
        limits: Arc::new(ReviewLimits::new(1.0, 3.0)),
        ..TokenAccess::new(Arc::new(Fake), Arc::new(Fake))
    };
    let asked = review("forged", "GET", "/api/v1/namespaces/apps/configmaps");
    for _ in 0..3 {
        assert!(matches!(
            review_edge_request(Some(&access), "edge-1", &asked).await,
            Ok(ReviewAnswer::Unauthenticated { .. })
        ));
    }
    let held = review_edge_request(Some(&access), "edge-1", &asked).await;
    assert!(
        matches!(&held, Err(reason) if reason.contains("node edge-1 asks for more")),
        "{held:?}"
    );
    // Another node has its own bucket.
    assert!(
        review_edge_request(Some(&access), "edge-2", &asked)
            .await
            .is_ok()
    );
}

#[test]
fn a_node_s_bucket_refills_with_time_up_to_its_burst() {
    let limits = ReviewLimits::new(2.0, 4.0);
    let t0 = Instant::now();
    assert_eq!((0..6).filter(|_| limits.take("n", t0)).count(), 4);
    // Half a second earns one at 2 a second.
    let t1 = t0 + Duration::from_millis(500);
    assert!(limits.take("n", t1));
    assert!(!limits.take("n", t1));
    // An hour earns no more than the burst.
    let t2 = t1 + Duration::from_secs(3600);
    assert_eq!((0..10).filter(|_| limits.take("n", t2)).count(), 4);
}

#[test]
fn decisions_are_kept_for_their_time() {
    let cache = DecisionCache::default();
    let caller = Caller::new(
        "kube-apiserver-kubelet-client",
        vec!["system:masters".to_owned()],
    );
    let logs = Access::node(
        &Attributes {
            verb: "get",
            subresource: "proxy",
        },
        "edge-1",
    );
    let stats = Access::node(
        &Attributes {
            verb: "get",
            subresource: "stats",
        },
        "edge-1",
    );
    let elsewhere = Access {
        name: "edge-2".to_owned(),
        ..logs.clone()
    };
    let t0 = Instant::now();
    cache.put(&caller, &logs, true, t0);
    cache.put(&caller, &stats, false, t0);
    assert_eq!(
        cache.get(&caller, &logs, t0 + Duration::from_secs(299)),
        Some(true)
    );
    assert_eq!(cache.get(&caller, &logs, t0 + ALLOWED_FOR), None);
    assert_eq!(
        cache.get(&caller, &stats, t0 + Duration::from_secs(29)),
        Some(false)
    );
    assert_eq!(cache.get(&caller, &stats, t0 + DENIED_FOR), None);
    // Another node, another caller: no decision.
    assert_eq!(cache.get(&caller, &elsewhere, t0), None);
    let other = Caller::new("someone", Vec::new());
    assert_eq!(cache.get(&other, &logs, t0), None);
}
