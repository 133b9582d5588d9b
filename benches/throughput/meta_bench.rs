//! The `meta` group: the edge store's writes and reads of 1 KiB objects,
//! and the edge's memory with 10,000 stored objects.
//!
//! Writes go in as metamanager makes them: many submitted at once, batched
//! into shared transactions by the store's writer thread, each confirmed
//! after its commit. Also measured: the whole metamanager path (a beehive
//! `send_sync` per object, confirmed after the commit). Baselines, same run,
//! same bytes: raw redb with one transaction per object (what an edge that
//! commits each write on its own pays) and with one transaction for all.
//! Memory is measured in fresh child processes, one per store, as the
//! growth of RSS from opening the store to holding the objects. Last, the
//! store file after create/delete cycles with tombstones pruned as the
//! cloud's watermark comes, beside an empty store's.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use beehive::constants::{group, module, operation};
use beehive::{Hive, HiveConfig, Message};
use meta::store::Record;
use meta::{EdgeStore, MetaManager};
use redb::{Database, ReadableDatabase, TableDefinition};
use serde_json::json;

use crate::Scale;
use crate::hub_bench::rss_bytes;
use crate::report::Report;

const TABLE: TableDefinition<&str, &[u8]> = TableDefinition::new("objects");
const OBJECTS_FOR_MEMORY: usize = 10_000;

fn key(n: usize) -> String {
    format!("default/configmap/object-{n:06}")
}

/// A 1 KiB object (its JSON payload).
fn payload(n: usize) -> beehive::Content {
    apis::kinds::object_content(&json!({"apiVersion": "v1", "kind": "ConfigMap",
           "metadata": {"name": format!("object-{n:06}"), "namespace": "default"},
           "data": {"blob": "x".repeat(900)}}))
}

/// The bytes the edge store keeps for object `n`, for the raw baselines.
fn stored_bytes(n: usize) -> Vec<u8> {
    let record = Record {
        version: "1".to_owned(),
        object: Some(payload(n)),
    };
    rmp_serde::to_vec_named(&record).unwrap_or_default()
}

pub fn run(scale: Scale, report: &mut Report) -> Result<()> {
    let objects = if scale.runs == 1 { 2_000 } else { 20_000 };
    let one_by_one = if scale.runs == 1 { 200 } else { 2_000 };
    let dir = tempfile::tempdir()?;

    // Raw redb baselines.
    let bytes: Vec<Vec<u8>> = (0..objects).map(stored_bytes).collect();
    let raw_each = {
        let db = Database::create(dir.path().join("raw-each.redb"))?;
        let started = Instant::now();
        for (n, value) in bytes.iter().take(one_by_one).enumerate() {
            let txn = db.begin_write()?;
            txn.open_table(TABLE)?
                .insert(key(n).as_str(), value.as_slice())?;
            txn.commit()?;
        }
        one_by_one as f64 / started.elapsed().as_secs_f64()
    };
    let raw_db = Database::create(dir.path().join("raw-batch.redb"))?;
    let raw_batch = {
        let started = Instant::now();
        let txn = raw_db.begin_write()?;
        {
            let mut table = txn.open_table(TABLE)?;
            for (n, value) in bytes.iter().enumerate() {
                table.insert(key(n).as_str(), value.as_slice())?;
            }
        }
        txn.commit()?;
        objects as f64 / started.elapsed().as_secs_f64()
    };
    let raw_reads = {
        let started = Instant::now();
        let mut found = 0usize;
        for n in 0..objects {
            let txn = raw_db.begin_read()?;
            let table = txn.open_table(TABLE)?;
            let value = table.get(key(n).as_str())?;
            let record: Option<Record> = value.and_then(|v| rmp_serde::from_slice(v.value()).ok());
            found += usize::from(record.is_some());
        }
        anyhow::ensure!(found == objects, "raw reads found {found} of {objects}");
        objects as f64 / started.elapsed().as_secs_f64()
    };

    let path = dir.path().join("edge.redb");
    let (store_writes, store_reads, manager_writes) =
        actix::System::new().block_on(async move {
            let store = EdgeStore::open(&path)?;
            let started = Instant::now();
            let committed: Vec<_> = (0..objects)
                .map(|n| {
                    store.submit(
                        &key(n),
                        Record {
                            version: "1".to_owned(),
                            object: Some(payload(n)),
                        },
                    )
                })
                .collect::<Result<_, _>>()?;
            for write in committed {
                write.await?;
            }
            let writes = objects as f64 / started.elapsed().as_secs_f64();

            let started = Instant::now();
            let mut found = 0usize;
            for n in 0..objects {
                found += usize::from(store.get(&key(n))?.is_some());
            }
            anyhow::ensure!(found == objects, "store reads found {found} of {objects}");
            let reads = objects as f64 / started.elapsed().as_secs_f64();

            // The whole metamanager path, 64 writers at a time.
            let hive = Hive::new("bench-edge", HiveConfig::default());
            MetaManager::start(&hive, store.clone())?;
            let started = Instant::now();
            let per_writer = objects / 64;
            let writers: Vec<_> = (0..64)
                .map(|w| {
                    let hive = hive.clone();
                    actix::spawn(async move {
                        for i in 0..per_writer {
                            let n = w * per_writer + i;
                            let msg = Message::new()
                                .build_router(
                                    module::EDGEHUB,
                                    group::RESOURCE,
                                    key(n),
                                    operation::UPDATE,
                                )
                                .with_resource_version("2")
                                .with_content(payload(n));
                            hive.send_sync(module::METAMANAGER, msg, Duration::from_secs(60))
                                .await?;
                        }
                        Ok::<_, beehive::Error>(())
                    })
                })
                .collect();
            for writer in writers {
                writer.await.context("writer")??;
            }
            let manager = (per_writer * 64) as f64 / started.elapsed().as_secs_f64();
            let _ = hive.shutdown().await;
            store.close().await;
            Ok::<_, anyhow::Error>((writes, reads, manager))
        })?;

    report.with_baseline(
        "meta/store_write_1KiB",
        "writes_per_sec",
        store_writes,
        "obj/s",
        raw_each,
        "raw redb, 1 txn per object",
    );
    report.with_baseline(
        "meta/store_write_1KiB",
        "writes_per_sec_vs_one_batch",
        store_writes,
        "obj/s",
        raw_batch,
        "raw redb, 1 txn for all",
    );
    report.with_baseline(
        "meta/metamanager_write_1KiB",
        "writes_per_sec",
        manager_writes,
        "obj/s",
        raw_each,
        "raw redb, 1 txn per object",
    );
    report.with_baseline(
        "meta/store_read_1KiB",
        "reads_per_sec",
        store_reads,
        "obj/s",
        raw_reads,
        "raw redb get, 1 read txn each",
    );

    // Tombstones: the store file after create/delete cycles of fresh
    // names, pruned as the cloud's watermark comes (every 1,000 cycles,
    // lagging one interval), beside an empty store's file.
    let cycles: u64 = if scale.runs == 1 { 20_000 } else { 100_000 };
    let churned = dir.path().join("churn.redb");
    let empty = dir.path().join("empty.redb");
    let (held, pruned) = actix::System::new().block_on({
        let churned = churned.clone();
        let empty = empty.clone();
        async move {
            EdgeStore::open(&empty)?.close().await;
            let store = EdgeStore::open(&churned)?;
            let mut watermark = 0;
            for start in (0..cycles).step_by(1_000) {
                let mut committed = Vec::new();
                for n in start..start + 1_000 {
                    let resource = format!("default/pod/churn-{n}");
                    let object = json!({"metadata": {"name": format!("churn-{n}")}});
                    let object = apis::kinds::object_content(&object);
                    for (version, object) in [(2 * n + 1, Some(object)), (2 * n + 2, None)] {
                        let record = Record {
                            version: version.to_string(),
                            object,
                        };
                        committed.push(store.submit(&resource, record)?);
                    }
                }
                for done in committed {
                    done.await?;
                }
                store
                    .prune_tombstones(&meta::Watermark::of([("pod", watermark)]))
                    .await?;
                watermark = 2 * (start + 1_000);
            }
            let counts = (store.tombstones().held(), store.tombstones().pruned());
            store.close().await;
            Ok::<_, anyhow::Error>(counts)
        }
    })?;
    let size = |path: &Path| std::fs::metadata(path).map(|m| m.len() as f64 / 1024.0);
    report.with_baseline(
        &format!("meta/store_after_{cycles}_create_delete_cycles"),
        "file_size",
        size(&churned)?,
        "KiB",
        size(&empty)?,
        "an empty store",
    );
    report.plain(
        &format!("meta/store_after_{cycles}_create_delete_cycles"),
        "tombstones_held",
        held as f64,
        "count",
    );
    report.plain(
        &format!("meta/store_after_{cycles}_create_delete_cycles"),
        "tombstones_pruned",
        pruned as f64,
        "count",
    );

    let exe = std::env::current_exe()?;
    let rss = |mode: &str| -> Result<f64> {
        let dir = tempfile::tempdir()?;
        let out = Command::new(&exe)
            .args(["__meta-rss", "--address"])
            .arg(dir.path().join(format!("{mode}.redb")))
            .args(["--mode", mode])
            .output()?;
        anyhow::ensure!(
            out.status.success(),
            "memory child failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse::<f64>()
            .context("memory child's answer")
    };
    let edge_rss = rss("edgehive")?;
    let raw_rss = rss("raw")?;
    report.with_baseline(
        "meta/edge_memory_10k_objects",
        "rss_growth",
        edge_rss / (1024.0 * 1024.0),
        "MiB",
        raw_rss / (1024.0 * 1024.0),
        "raw redb holding the same bytes",
    );
    Ok(())
}

/// Child mode: opens a store at `path`, fills it with 10,000 objects, and
/// prints how much RSS grew from before the open.
pub fn rss_child(path: &Path, mode: &str) -> Result<()> {
    let before = rss_bytes();
    match mode {
        "raw" => {
            let db = Database::create(path)?;
            let txn = db.begin_write()?;
            {
                let mut table = txn.open_table(TABLE)?;
                for n in 0..OBJECTS_FOR_MEMORY {
                    table.insert(key(n).as_str(), stored_bytes(n).as_slice())?;
                }
            }
            txn.commit()?;
            let grown = rss_bytes().saturating_sub(before);
            let txn = db.begin_read()?;
            let table = txn.open_table(TABLE)?;
            let mut held = 0usize;
            for n in 0..OBJECTS_FOR_MEMORY {
                held += usize::from(table.get(key(n).as_str())?.is_some());
            }
            anyhow::ensure!(held == OBJECTS_FOR_MEMORY);
            println!("{grown}");
        }
        _ => {
            actix::System::new().block_on(async move {
                let store = EdgeStore::open(path)?;
                let hive = Hive::new("rss-edge", HiveConfig::default());
                MetaManager::start(&hive, store.clone())?;
                // As edgehub delivers them: at most a window (512) in flight.
                for window in (0..OBJECTS_FOR_MEMORY).collect::<Vec<_>>().chunks(512) {
                    let writes = window.iter().map(|&n| {
                        let msg = Message::new()
                            .build_router(
                                module::EDGEHUB,
                                group::RESOURCE,
                                key(n),
                                operation::INSERT,
                            )
                            .with_resource_version("1")
                            .with_content(payload(n));
                        let hive = hive.clone();
                        async move {
                            hive.send_sync(module::METAMANAGER, msg, Duration::from_secs(60))
                                .await
                        }
                    });
                    for write in futures_util::future::join_all(writes).await {
                        write?;
                    }
                }
                let grown = rss_bytes().saturating_sub(before);
                for n in 0..OBJECTS_FOR_MEMORY {
                    anyhow::ensure!(store.get(&key(n))?.is_some(), "object {n} missing");
                }
                println!("{grown}");
                let _ = hive.shutdown().await;
                store.close().await;
                Ok::<_, anyhow::Error>(())
            })?;
        }
    }
    Ok(())
}
