//! An edgehive edge (the native dialect) asks its cloud for a pod's
//! service account token as a KubeEdge edge's kubelet does: the question
//! `apis::tokens` builds, sent through edgehub. cloudhub passes it to the
//! edgecontroller, whose token answer asks the desired state for a
//! TokenRequest, for pods bound to that node only, and the edge reads the
//! token from the answer. (The desired state here issues tokens of its
//! own; e2e/tests/kubernetes.rs does it with kube-apiserver.)

use std::sync::{Arc, Mutex};
use std::time::Duration;

use apis::kinds::{Kind, ObjectKey};
use apis::tokens::{AnswerError, TokenRequest, answered};
use beehive::constants::module;
use cloud::desired::{StoreFuture, WatchStream};
use cloud::{DesiredError, DesiredState, EmbeddedStore};
use e2e::{Backend, Cloud, Edge, next, pod_yaml};

/// The embedded store, issuing tokens as an API server would and
/// recording what it was asked.
struct Issuing {
    inner: Arc<dyn DesiredState>,
    asked: Arc<Mutex<Vec<cloud::desired::TokenRequest>>>,
}

impl DesiredState for Issuing {
    fn get(&self, key: &ObjectKey) -> Result<Option<apis::Object>, DesiredError> {
        self.inner.get(key)
    }
    fn list_each(
        &self,
        kind: Kind,
        namespace: Option<&str>,
        visit: &mut dyn FnMut(apis::Object),
    ) -> Result<u64, DesiredError> {
        self.inner.list_each(kind, namespace, visit)
    }
    fn watch(&self, kind: Kind, since: u64) -> Result<WatchStream, DesiredError> {
        self.inner.watch(kind, since)
    }
    fn create(&self, object: apis::Object) -> StoreFuture<apis::Object> {
        self.inner.create(object)
    }
    fn replace(&self, object: apis::Object) -> StoreFuture<apis::Object> {
        self.inner.replace(object)
    }
    fn replace_status(&self, object: apis::Object) -> StoreFuture<apis::Object> {
        self.inner.replace_status(object)
    }
    fn delete(&self, key: &ObjectKey) -> StoreFuture<Option<apis::Object>> {
        self.inner.delete(key)
    }
    fn next_revision(&self) -> StoreFuture<u64> {
        self.inner.next_revision()
    }
    fn finish_deletion(&self, key: &ObjectKey, uid: Option<&str>) -> StoreFuture<()> {
        self.inner.finish_deletion(key, uid)
    }
    fn request_token(
        &self,
        request: cloud::desired::TokenRequest,
    ) -> StoreFuture<apis::tokens::TokenRequestStatus> {
        let token = format!("issued-for-{}", request.pod.0);
        if let Ok(mut asked) = self.asked.lock() {
            asked.push(request);
        }
        Box::pin(async move {
            Ok(apis::tokens::TokenRequestStatus {
                token,
                expiration_timestamp: "2030-01-01T00:00:00Z".to_owned(),
            })
        })
    }
}

/// The question edged asks for a token of pod `pod` (name, uid).
fn question(pod: (&str, &str)) -> TokenRequest {
    TokenRequest {
        namespace: "default".into(),
        service_account: "default".into(),
        audiences: vec!["api".into()],
        expiration_seconds: 600,
        pod: (pod.0.into(), pod.1.into()),
    }
}

#[actix::test]
async fn a_native_edge_asks_for_its_pods_token_as_a_kubelet_does() {
    let dir = tempfile::tempdir().expect("dir");
    let inner = EmbeddedStore::open(&dir.path().join("desired.redb"))
        .expect("store")
        .shared();
    let asked = Arc::new(Mutex::new(Vec::new()));
    let store = Arc::new(Issuing {
        inner,
        asked: asked.clone(),
    });
    let backend = Backend {
        store: Some(store),
        api: None,
    };
    let cloud = Cloud::start_backed_by(backend).await;
    let mut a = Edge::start(&cloud, "node-a").await;
    let mut b = Edge::start(&cloud, "node-b").await;
    cloud.apply(&pod_yaml("web", "node-a", &[])).await;
    cloud.apply(&pod_yaml("other", "node-b", &[])).await;
    let web = next(&mut a.edged, "web at node-a").await;
    let other = next(&mut b.edged, "other at node-b").await;
    let uid = |pod: &beehive::Message| {
        pod.body::<serde_json::Value>().expect("json body")["metadata"]["uid"]
            .as_str()
            .expect("a uid")
            .to_owned()
    };
    let (web_uid, other_uid) = (uid(&web), uid(&other));

    // Its own pod's token: asked of the desired state as the edge asked.
    let reply = a
        .hive
        .send_sync(
            module::EDGEHUB,
            question(("web", &web_uid)).query(module::EDGED),
            Duration::from_secs(20),
        )
        .await
        .expect("an answer");
    let status = answered(&reply).expect("a token");
    assert_eq!(status.token, "issued-for-web");
    assert_eq!(status.expiration_timestamp, "2030-01-01T00:00:00Z");
    let request = asked.lock().expect("asked")[0].clone();
    assert_eq!(
        (
            request.namespace.as_str(),
            request.service_account.as_str(),
            request.audiences.clone(),
            request.expiration_seconds,
            request.pod.clone()
        ),
        (
            "default",
            "default",
            vec!["api".to_owned()],
            600,
            ("web".to_owned(), web_uid)
        )
    );

    // Another node's pod: refused, and nothing asked of the desired state.
    let reply = a
        .hive
        .send_sync(
            module::EDGEHUB,
            question(("other", &other_uid)).query(module::EDGED),
            Duration::from_secs(20),
        )
        .await
        .expect("an answer");
    match answered(&reply) {
        Err(AnswerError::Refused(reason)) => {
            assert!(reason.contains("not bound to this node"), "{reason}")
        }
        other => panic!("not refused: {other:?}"),
    }
    assert_eq!(asked.lock().expect("asked").len(), 1);
    a.shutdown().await;
    b.shutdown().await;
    cloud.shutdown().await;
}
