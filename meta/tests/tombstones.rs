//! Tombstone pruning on a real store on disk: 100,000 create/delete
//! cycles through the store API (the path metamanager writes through;
//! the link would add minutes of transport on 2 cores and nothing the
//! store sees), pruned as the cloud's watermarks come, stay bounded.

use meta::store::Record;
use meta::{EdgeStore, Watermark, WriteOutcome};
use serde_json::json;

const CYCLES: u64 = 100_000;
/// Cycles between two inventory questions (two watermarks).
const INTERVAL: u64 = 1_000;

fn size(path: &std::path::Path) -> u64 {
    std::fs::metadata(path).map(|m| m.len()).unwrap_or(0)
}

/// Creates and deletes `CYCLES` pods of fresh names (a pod at revision
/// `2n+1`, its deletion at `2n+2`); every `INTERVAL` cycles the cloud's
/// watermark says what it handled one interval ago (it lags), and, with
/// `prune`, the store prunes. Returns the most tombstones ever held.
async fn churn(store: &EdgeStore, prune: bool) -> u64 {
    let mut most = 0;
    let mut watermark_at = 0;
    for start in (0..CYCLES).step_by(INTERVAL as usize) {
        let mut committed = Vec::with_capacity(2 * INTERVAL as usize);
        for n in start..start + INTERVAL {
            let resource = format!("default/pod/p{n}");
            let object = json!({"metadata": {"name": format!("p{n}")}, "spec": {"n": n}});
            for record in [
                Record {
                    version: (2 * n + 1).to_string(),
                    object: Some(beehive::Content::of(&object).expect("json")),
                },
                Record {
                    version: (2 * n + 2).to_string(),
                    object: None,
                },
            ] {
                committed.push(store.submit(&resource, record).expect("submit"));
            }
        }
        for done in committed {
            assert_eq!(done.await.expect("committed"), WriteOutcome::Applied);
        }
        most = most.max(store.tombstones().held());
        if prune {
            store
                .prune_tombstones(&Watermark::of([("pod", watermark_at)]))
                .await
                .expect("prune");
        }
        watermark_at = 2 * (start + INTERVAL);
    }
    most
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tombstones_stay_bounded_over_100k_create_delete_cycles() {
    let dir = tempfile::tempdir().expect("dir");
    let empty = dir.path().join("empty.redb");
    EdgeStore::open(&empty).expect("open").close().await;
    let pruned_path = dir.path().join("pruned.redb");
    let kept_path = dir.path().join("kept.redb");

    let pruned = EdgeStore::open(&pruned_path).expect("open");
    let most = churn(&pruned, true).await;
    // Bound: the deletions of the last two intervals (the watermark lags
    // one interval behind what was written).
    assert!(most <= 2 * INTERVAL, "at most {most} tombstones held");
    let held = pruned.tombstones().held();
    assert!(held <= 2 * INTERVAL, "{held} held at the end");
    assert!(pruned.tombstones().pruned() >= CYCLES - 2 * INTERVAL);
    assert_eq!(
        pruned
            .records_of_type(None, "pod", true)
            .expect("scan")
            .len() as u64,
        held
    );

    // The guarantee: a deletion the watermark does not cover yet keeps
    // refusing an older upsert; covered, it goes.
    let last = format!("default/pod/p{}", CYCLES - 1);
    let deleted_at = 2 * CYCLES;
    assert_eq!(
        pruned
            .put(
                &last,
                &(deleted_at - 1).to_string(),
                beehive::Content::of(&json!({"late": true})).expect("json")
            )
            .await
            .expect("put"),
        WriteOutcome::Stale
    );
    assert!(
        pruned
            .get(&last)
            .expect("get")
            .is_some_and(|r| r.is_deleted())
    );
    pruned
        .prune_tombstones(&Watermark::of([("pod", deleted_at)]))
        .await
        .expect("prune");
    assert_eq!(pruned.tombstones().held(), 0);
    assert!(pruned.get(&last).expect("get").is_none());
    pruned.close().await;

    let kept = EdgeStore::open(&kept_path).expect("open");
    let kept_most = churn(&kept, false).await;
    assert_eq!(kept_most, CYCLES);
    kept.close().await;

    let (empty_size, pruned_size, kept_size) = (size(&empty), size(&pruned_path), size(&kept_path));
    EdgeStore::compact(&pruned_path).expect("compact");
    EdgeStore::compact(&empty).expect("compact");
    let (empty_compacted, pruned_compacted) = (size(&empty), size(&pruned_path));
    println!(
        "store file after {CYCLES} cycles: empty {empty_size} B, pruned {pruned_size} B, \
         kept {kept_size} B; compacted: empty {empty_compacted} B, pruned {pruned_compacted} B"
    );
    // Without pruning the file holds every tombstone; with it, a bounded
    // working set (redb reuses freed pages, so the file stops growing).
    assert!(pruned_size * 4 < kept_size, "{pruned_size} vs {kept_size}");
    // Compacted, a store with no tombstones left is an empty one's size
    // (within a few pages).
    assert!(
        pruned_compacted <= empty_compacted + 64 * 1024,
        "{pruned_compacted} vs {empty_compacted}"
    );
    // The counts survive a reopen (counted from the file).
    let reopened = EdgeStore::open(&kept_path).expect("reopen");
    assert_eq!(reopened.tombstones().held(), CYCLES);
}
