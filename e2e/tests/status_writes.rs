//! Status writes never hold up delivery: with every status write of the
//! desired state stalled (a store whose `replace_status` waits until the
//! test lets it go), new pods still reach a real edge over a real link;
//! once released, every reported status lands, coalesced (fewer writes
//! than reports).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use apis::kinds::{Kind, ObjectKey};
use cloud::desired::{DesiredError, StoreFuture, TokenRequest, WatchStream};
use cloud::{DesiredState, EmbeddedStore};
use e2e::{Backend, Cloud, Edge, next, pod_yaml};
use serde_json::json;
use tokio::sync::watch;

/// The embedded store, its status writes held at a gate the test opens.
struct Stalling {
    inner: Arc<dyn DesiredState>,
    open: watch::Receiver<bool>,
    /// Status writes asked for (started by the writer), by object.
    asked: Mutex<Vec<String>>,
}

impl DesiredState for Stalling {
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
        let key = object.key().to_string();
        self.asked.lock().expect("asked").push(key);
        let mut open = self.open.clone();
        let write = self.inner.replace_status(object);
        Box::pin(async move {
            open.wait_for(|open| *open)
                .await
                .map_err(|_| DesiredError::Stopped)?;
            write.await
        })
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
        request: TokenRequest,
    ) -> StoreFuture<apis::tokens::TokenRequestStatus> {
        self.inner.request_token(request)
    }
    fn passes_on(&self, object: &apis::Object) -> bool {
        self.inner.passes_on(object)
    }
    fn shares_request_budget(&self) -> bool {
        self.inner.shares_request_budget()
    }
    fn evicts(&self) -> bool {
        self.inner.evicts()
    }
    fn renew_lease(&self, node: &str, duration: Duration) -> StoreFuture<()> {
        self.inner.renew_lease(node, duration)
    }
}

#[actix::test]
async fn stalled_status_writes_hold_up_no_delivery_and_land_coalesced() {
    let dir = tempfile::tempdir().expect("dir");
    let inner = EmbeddedStore::open(&dir.path().join("desired.redb"))
        .expect("store")
        .shared();
    let (gate, open) = watch::channel(false);
    let store = Arc::new(Stalling {
        inner,
        open,
        asked: Mutex::new(Vec::new()),
    });
    let cloud = Cloud::start_backed_by(Backend {
        store: Some(store.clone()),
        api: None,
    })
    .await;
    let mut edge = Edge::start(&cloud, "stall-node").await;

    let applied = cloud.apply(&pod_yaml("first", "stall-node", &[])).await;
    assert_eq!(applied, ["Pod/first created"]);
    let got = next(&mut edge.edged, "the first pod").await;
    assert_eq!(got.resource(), "default/pod/first");

    // Statuses of the pod, one after another, each newer: the first write
    // stalls at the gate, the next waits behind it, the rest replace the
    // waiting one.
    const REPORTS: u64 = 6;
    for n in 0..REPORTS {
        edge.report(
            "default/podstatus/first",
            json!({"phase": "Running", "podIP": format!("10.88.0.{n}")}),
        )
        .await;
    }
    let counts = cloud
        .counts("the reports coalesced", |c| c.status_coalesced >= 1)
        .await;
    assert_eq!(counts.status_written, 0, "{counts:?}");

    // Delivery goes on while every status write is stalled.
    for name in ["second", "third", "fourth"] {
        let applied = cloud.apply(&pod_yaml(name, "stall-node", &[])).await;
        assert_eq!(applied, [format!("Pod/{name} created")]);
        let got = next(&mut edge.edged, name).await;
        assert_eq!(got.resource(), format!("default/pod/{name}"));
    }
    let counts = *cloud.controller.counts.borrow();
    assert_eq!((counts.status_written, counts.status_applied), (0, 0));
    let asked: Vec<String> = store.asked.lock().expect("asked").clone();
    // Started: the node's status and the pod's first, nothing more of the
    // pod while its first write is in flight.
    let pod_writes =
        |asked: &[String]| asked.iter().filter(|key| key.contains("first")).count() as u64;
    assert_eq!(pod_writes(&asked), 1, "{asked:?}");

    // Released: every report lands, in fewer writes than reports, the
    // newest status last.
    gate.send_replace(true);
    let counts = cloud
        .counts("every report written", |c| c.status_applied >= REPORTS)
        .await;
    let asked: Vec<String> = store.asked.lock().expect("asked").clone();
    let writes = pod_writes(&asked);
    assert!(writes < REPORTS, "{writes} writes for {REPORTS} reports");
    assert_eq!(counts.status_applied, REPORTS, "{counts:?}");
    assert_eq!(
        counts.status_coalesced + writes,
        REPORTS,
        "each report written or coalesced: {counts:?}"
    );
    let pod = store
        .get(&ObjectKey::new(Kind::Pod, "default", "first"))
        .expect("read")
        .expect("pod");
    assert_eq!(pod["status"]["podIP"], format!("10.88.0.{}", REPORTS - 1));
    println!(
        "{REPORTS} reports, {writes} pod status writes, {} coalesced; status writes asked: {}",
        counts.status_coalesced,
        asked.len()
    );

    edge.shutdown().await;
    cloud.shutdown().await;
}
