//! Tests of the parent module (`embedded.rs`).

use super::*;
use crate::desired::SPEC_REVISION;
use futures_util::StreamExt;
use serde_json::json;

fn pod(name: &str, node: &str) -> Object {
    object(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "busybox:1.36"}]},
    }))
}

fn configmap(name: &str, value: &str) -> Object {
    object(json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": "default"},
        "data": {"v": value},
    }))
}

fn object(body: Value) -> Object {
    Object::new(body).expect("an object")
}

fn store() -> (tempfile::TempDir, EmbeddedStore) {
    let dir = tempfile::tempdir().expect("dir");
    let store = EmbeddedStore::open(&dir.path().join("desired.redb")).expect("open");
    (dir, store)
}

#[tokio::test]
async fn revisions_grow_across_writes_deletes_and_reopens() {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("desired.redb");
    let store = EmbeddedStore::open(&path).expect("open");
    let a = store.create(pod("a", "n")).await.expect("create");
    let first = a.revision();
    let mut changed = a.clone();
    changed.edit(|o| o["spec"]["containers"][0]["image"] = json!("busybox:1.37"));
    let second = store.replace(changed).await.expect("replace").revision();
    assert!(second > first);
    store.create(pod("b", "n")).await.expect("create");
    store.create(configmap("a", "1")).await.expect("create");
    let (pods, at) = store.list(Kind::Pod, Some("default")).expect("list");
    assert_eq!(pods.len(), 2);
    let key = ObjectKey::new(Kind::Pod, "default", "a");
    let removed = store.delete(&key).await.expect("delete").expect("held");
    assert!(removed.revision() > at);
    let bumped = store.next_revision().await.expect("bump");
    assert_eq!(bumped, removed.revision() + 1);
    assert!(store.delete(&key).await.expect("delete").is_none());
    assert!(store.get(&key).expect("get").is_none());
    store.close().await;

    let store = EmbeddedStore::open(&path).expect("reopen");
    let (pods, at) = store.list(Kind::Pod, None).expect("list");
    assert_eq!(pods.len(), 1);
    assert_eq!(at, bumped);
    let again = store.create(pod("a", "n")).await.expect("create");
    assert_eq!(again.revision(), bumped + 1);
    // A store made anew later starts above what the old one issued.
    let fresh = EmbeddedStore::open(&dir.path().join("fresh.redb")).expect("fresh");
    let z = fresh.create(pod("z", "n")).await.expect("create");
    assert!(z.revision() > first, "{} <= {first}", z.revision());
}

#[tokio::test]
async fn a_create_is_defaulted_as_an_api_server_would() {
    let (_dir, store) = store();
    let mut given = pod("web", "edge-1");
    given.edit(|o| o["status"] = json!({"phase": "Running"}));
    given.edit(|o| o["metadata"]["resourceVersion"] = json!("7"));
    let stored = store.create(given.clone()).await.expect("create");
    assert!(
        stored["metadata"]["uid"]
            .as_str()
            .is_some_and(|u| !u.is_empty())
    );
    assert!(stored["metadata"]["creationTimestamp"].is_string());
    assert_eq!(stored["spec"]["dnsPolicy"], "ClusterFirst");
    assert_eq!(stored["spec"]["enableServiceLinks"], true);
    assert_eq!(stored["spec"]["restartPolicy"], "Always");
    assert_eq!(
        stored["spec"]["containers"][0]["imagePullPolicy"],
        "IfNotPresent"
    );
    // The status is the server's, not the caller's.
    assert_eq!(stored["status"]["phase"], "Pending");
    assert_eq!(stored["status"]["qosClass"], "BestEffort");
    assert!(matches!(
        store.create(given).await,
        Err(DesiredError::AlreadyExists { .. })
    ));
}

#[tokio::test]
async fn replaces_are_conditional_keep_status_and_skip_no_ops() {
    let (_dir, store) = store();
    let created = store.create(pod("web", "edge-1")).await.expect("create");
    let mut status = created.clone();
    status.edit(|o| o["status"] = json!({"phase": "Running"}));
    let with_status = store.replace_status(status).await.expect("status");
    assert_eq!(with_status["status"]["phase"], "Running");
    // The spec's revision is kept across the status write.
    assert_eq!(
        with_status["metadata"]["annotations"][SPEC_REVISION],
        created["metadata"]["resourceVersion"]
    );
    assert_eq!(
        crate::desired::spec_revision(&with_status),
        created.revision()
    );

    // Written over a stale read: a conflict, nothing written.
    let mut stale = created.clone();
    stale.edit(|o| o["spec"]["containers"][0]["image"] = json!("busybox:1.37"));
    assert!(matches!(
        store.replace(stale.clone()).await,
        Err(DesiredError::Conflict { .. })
    ));
    // The same change over the current revision goes through, and the
    // status stays.
    stale.edit(|o| {
        o["metadata"]["resourceVersion"] = with_status["metadata"]["resourceVersion"].clone()
    });
    stale.edit(|o| o["status"] = json!({"phase": "Failed"}));
    let replaced = store.replace(stale).await.expect("replace");
    assert_eq!(replaced["status"]["phase"], "Running");
    assert_eq!(replaced["metadata"]["uid"], created["metadata"]["uid"]);
    assert!(
        replaced["metadata"]["annotations"]
            .get(SPEC_REVISION)
            .is_none()
    );
    assert!(replaced.revision() > with_status.revision());

    // A replace that changes nothing writes nothing.
    let again = store.replace(replaced.clone()).await.expect("no-op");
    assert_eq!(again.revision(), replaced.revision());

    // A pod's node is immutable once set.
    let mut moved = replaced.clone();
    moved.edit(|o| o["spec"]["nodeName"] = json!("edge-2"));
    assert!(matches!(
        store.replace(moved).await,
        Err(DesiredError::Invalid { .. })
    ));
    let missing = pod("nobody", "edge-1");
    assert!(matches!(
        store.replace(missing).await,
        Err(DesiredError::NotFound { .. })
    ));
}

#[tokio::test]
async fn a_watch_resumes_from_a_revision_and_sees_only_its_kind() {
    let (_dir, store) = store();
    let (_, listed) = store.list(Kind::ConfigMap, None).expect("list");
    let a = store.create(configmap("a", "1")).await.expect("a");
    store.create(pod("p", "edge-1")).await.expect("pod");
    let mut changed = a.clone();
    changed.edit(|o| o["data"]["v"] = json!("2"));
    let a2 = store.replace(changed).await.expect("a2");
    let removed = store
        .delete(&ObjectKey::new(Kind::ConfigMap, "default", "a"))
        .await
        .expect("delete")
        .expect("held");

    // From the list: the configmap's newest change only (the history
    // is compacted by object: its creation and update were superseded
    // by its deletion), then live ones.
    let mut watch = store.watch(Kind::ConfigMap, listed).expect("watch");
    assert_eq!(
        watch.next().await.expect("event").expect("ok"),
        WatchEvent::Deleted(removed.clone())
    );
    // Resumed after the second change: only the third, then live ones.
    let mut resumed = store.watch(Kind::ConfigMap, a2.revision()).expect("watch");
    assert_eq!(
        resumed.next().await.expect("event").expect("ok"),
        WatchEvent::Deleted(removed)
    );
    let b = store.create(configmap("b", "1")).await.expect("b");
    assert_eq!(
        resumed.next().await.expect("event").expect("ok"),
        WatchEvent::Added(b.clone())
    );
    assert_eq!(
        watch.next().await.expect("event").expect("ok"),
        WatchEvent::Added(b)
    );
    // Older than what the store keeps: list again.
    assert!(matches!(
        store.watch(Kind::ConfigMap, listed - 1),
        Err(DesiredError::Gone { .. })
    ));
}
