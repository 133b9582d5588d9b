//! Tests of the parent module (`store.rs`).

use super::*;

fn doc(value: serde_json::Value) -> Content {
    Content::of(&value).expect("json")
}
use serde_json::json;

#[tokio::test]
async fn newer_versions_win_and_tombstones_hold() {
    let dir = tempfile::tempdir().expect("dir");
    let store = EdgeStore::open(&dir.path().join("edge.redb")).expect("open");
    assert_eq!(
        store
            .put("default/pod/a", "2", doc(json!({"v": 2})))
            .await
            .expect("put"),
        WriteOutcome::Applied
    );
    assert_eq!(
        store
            .put("default/pod/a", "1", doc(json!({"v": 1})))
            .await
            .expect("put"),
        WriteOutcome::Stale
    );
    assert_eq!(
        store
            .put("default/pod/a", "2", doc(json!({"v": 2})))
            .await
            .expect("put"),
        WriteOutcome::Stale
    );
    assert_eq!(
        store
            .get("default/pod/a")
            .expect("get")
            .and_then(|r| r.object)
            .map(|object| object.decode::<serde_json::Value>().expect("json")),
        Some(json!({"v": 2}))
    );
    assert_eq!(
        store.delete("default/pod/a", "3").await.expect("delete"),
        WriteOutcome::Applied
    );
    assert_eq!(
        store
            .put("default/pod/a", "2", doc(json!({"v": 2})))
            .await
            .expect("put"),
        WriteOutcome::Stale
    );
    assert!(
        store
            .get("default/pod/a")
            .expect("get")
            .is_some_and(|r| r.is_deleted())
    );
    store
        .put("default/pod/b", "1", doc(json!(1)))
        .await
        .expect("put");
    store
        .put("default/configmap/c", "1", doc(json!(1)))
        .await
        .expect("put");
    let pods = store.list("default/pod/").expect("list");
    assert_eq!(
        pods.iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>(),
        ["default/pod/b"]
    );
}

#[tokio::test]
async fn committed_objects_survive_a_reopen() {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("edge.redb");
    let store = EdgeStore::open(&path).expect("open");
    let writes: Vec<_> = (0..500)
        .map(|n| {
            let store = store.clone();
            tokio::spawn(async move {
                store
                    .put(&format!("default/pod/p{n}"), "1", doc(json!(n)))
                    .await
            })
        })
        .collect();
    for write in writes {
        write.await.expect("join").expect("committed");
    }
    store.close().await;
    let store = EdgeStore::open(&path).expect("reopen");
    assert_eq!(store.list("default/pod/").expect("list").len(), 500);
}
