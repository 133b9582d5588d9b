//! The client against a real three-member etcd cluster (Debian's etcd).

use std::time::Duration;

use etcd::testing::Cluster;
use etcd::{Change, EtcdError, Written};
use futures_util::StreamExt;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_hold_only_on_the_revision_the_writer_saw() {
    let cluster = Cluster::start(3).await;
    let etcd = cluster.client();
    let created = match etcd
        .create(b"/t/a", b"1".to_vec(), 0)
        .await
        .expect("create")
    {
        Written::Done(revision) => revision,
        other => panic!("created: {other:?}"),
    };
    // A second create finds it there.
    match etcd
        .create(b"/t/a", b"2".to_vec(), 0)
        .await
        .expect("create")
    {
        Written::Conflict(Some(entry)) => {
            assert_eq!((entry.value, entry.mod_revision), (b"1".to_vec(), created))
        }
        other => panic!("second create: {other:?}"),
    }
    let replaced = match etcd
        .replace(b"/t/a", b"3".to_vec(), created)
        .await
        .expect("replace")
    {
        Written::Done(revision) => revision,
        other => panic!("replaced: {other:?}"),
    };
    assert!(replaced > created, "revisions grow");
    // On a stale revision: refused, with what is there now.
    match etcd
        .replace(b"/t/a", b"4".to_vec(), created)
        .await
        .expect("replace")
    {
        Written::Conflict(Some(entry)) => assert_eq!(entry.value, b"3".to_vec()),
        other => panic!("stale replace: {other:?}"),
    }
    match etcd.delete(b"/t/a", created).await.expect("delete") {
        Written::Conflict(Some(_)) => {}
        other => panic!("stale delete: {other:?}"),
    }
    assert!(matches!(
        etcd.delete(b"/t/a", replaced).await,
        Ok(Written::Done(_))
    ));
    assert_eq!(etcd.get(b"/t/a").await.expect("get").0, None);
    assert!(matches!(
        etcd.replace(b"/t/a", b"5".to_vec(), replaced).await,
        Ok(Written::Conflict(None))
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_list_pages_through_one_snapshot_and_a_watch_resumes_after_it() {
    let cluster = Cluster::start(3).await;
    let etcd = cluster.client();
    for i in 0..1_200 {
        etcd.put(format!("/l/{i:05}").as_bytes(), vec![b'x'; 10], 0)
            .await
            .expect("put");
    }
    etcd.put(b"/other", b"not listed".to_vec(), 0)
        .await
        .expect("put");
    let (entries, revision) = etcd.list(b"/l/").await.expect("list");
    assert_eq!(entries.len(), 1_200, "more than one page");
    let (counted, counted_at) = etcd.count(b"/l/").await.expect("count");
    assert_eq!(counted, 1_200, "the count is of the prefix only");
    assert_eq!(counted_at, revision);
    assert!(
        entries.windows(2).all(|w| w[0].key < w[1].key),
        "in key order"
    );

    let mut changes = Box::pin(etcd.watch(b"/l/", revision + 1).await.expect("watch"));
    etcd.put(b"/l/new", b"n".to_vec(), 0).await.expect("put");
    etcd.put(b"/other", b"unwatched".to_vec(), 0)
        .await
        .expect("put");
    let (gone, _) = etcd.get(b"/l/00000").await.expect("get");
    let gone = gone.expect("there");
    etcd.delete(b"/l/00000", gone.mod_revision)
        .await
        .expect("delete");
    let mut seen = Vec::new();
    while seen.len() < 2 {
        let batch = tokio::time::timeout(Duration::from_secs(10), changes.next())
            .await
            .expect("a change in time")
            .expect("the watch goes on")
            .expect("no error");
        seen.extend(batch);
    }
    assert!(matches!(&seen[0], Change::Put(entry) if entry.key == b"/l/new"));
    match &seen[1] {
        Change::Delete { key, previous, .. } => {
            assert_eq!(key, b"/l/00000");
            assert_eq!(
                previous.as_ref().map(|p| p.value.clone()),
                Some(vec![b'x'; 10])
            );
        }
        other => panic!("a delete: {other:?}"),
    }

    // History compacted away: the watch says so, and the watcher lists.
    let (_, now) = etcd.get(b"/l/new").await.expect("get");
    etcd.compact(now).await.expect("compact");
    let mut stale = Box::pin(etcd.watch(b"/l/", revision).await.expect("watch"));
    let first = tokio::time::timeout(Duration::from_secs(10), stale.next())
        .await
        .expect("an answer in time")
        .expect("an item");
    assert!(
        matches!(first, Err(EtcdError::Compacted { .. })),
        "{first:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_under_a_lease_lives_as_long_as_the_lease() {
    let cluster = Cluster::start(3).await;
    let etcd = cluster.client();
    let lease = etcd.grant(Duration::from_secs(5)).await.expect("grant");
    assert!(matches!(
        etcd.create(b"/claim/n1", b"r1".to_vec(), lease).await,
        Ok(Written::Done(_))
    ));
    let ttl = etcd
        .keep_alive(lease)
        .await
        .expect("keepalive")
        .expect("alive");
    assert!(ttl <= Duration::from_secs(5) && ttl > Duration::ZERO);
    let (held, _) = etcd.get(b"/claim/n1").await.expect("get");
    assert_eq!(held.expect("held").lease, lease);
    etcd.revoke(lease).await.expect("revoke");
    assert_eq!(
        etcd.get(b"/claim/n1").await.expect("get").0,
        None,
        "gone with its lease"
    );
    assert_eq!(
        etcd.keep_alive(lease).await.expect("keepalive"),
        None,
        "expired"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_member_interrupts_nothing_while_a_quorum_stands() {
    let mut cluster = Cluster::start(3).await;
    let etcd = cluster.client();
    etcd.put(b"/q/before", b"1".to_vec(), 0).await.expect("put");
    cluster.kill(0);
    for i in 0..20 {
        etcd.put(format!("/q/{i}").as_bytes(), b"v".to_vec(), 0)
            .await
            .expect("written with two of three members");
    }
    let (entries, _) = etcd.list(b"/q/").await.expect("list");
    assert_eq!(entries.len(), 21);
    cluster.restart(0);
    cluster.wait_ready().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_write_holds_only_while_its_fence_does() {
    let cluster = Cluster::start(3).await;
    let etcd = cluster.client();
    let Written::Done(claimed) = etcd
        .create(b"/f/claim", b"a".to_vec(), 0)
        .await
        .expect("claim")
    else {
        panic!("claimed");
    };
    let fence = etcd::Fence {
        key: b"/f/claim".to_vec(),
        create_revision: claimed,
    };
    let Written::Done(at) = etcd
        .create_fenced(b"/f/object", b"1".to_vec(), &fence)
        .await
        .expect("object")
    else {
        panic!("created under its fence");
    };
    assert!(matches!(
        etcd.create_fenced(b"/f/object", b"0".to_vec(), &fence)
            .await,
        Ok(Written::Conflict(Some(_)))
    ));
    let written = etcd
        .replace_fenced(b"/f/object", b"2".to_vec(), at, &fence)
        .await
        .expect("write");
    let Written::Done(at) = written else {
        panic!("under its fence: {written:?}")
    };
    // The claim is taken away and made anew by another.
    etcd.delete(b"/f/claim", claimed).await.expect("delete");
    etcd.create(b"/f/claim", b"b".to_vec(), 0)
        .await
        .expect("reclaim");
    assert_eq!(
        etcd.replace_fenced(b"/f/object", b"3".to_vec(), at, &fence)
            .await
            .expect("write"),
        Written::Fenced
    );
    assert_eq!(
        etcd.create_fenced(b"/f/other", b"3".to_vec(), &fence)
            .await
            .expect("write"),
        Written::Fenced
    );
    assert_eq!(
        etcd.get(b"/f/object")
            .await
            .expect("get")
            .0
            .expect("there")
            .value,
        b"2".to_vec()
    );
}
