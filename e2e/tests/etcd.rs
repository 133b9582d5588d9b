//! The etcd desired-state backend on a real three-member etcd cluster:
//! two replicas' stores share one desired state.
#![cfg(feature = "etcd")]

use std::time::Duration;

use apis::kinds::{Kind, ObjectKey};
use cloud::desired::{DesiredError, DesiredState, EtcdConfig, EtcdStore, WatchEvent};
use cloud::replicas::{ClaimsConfig, EtcdClaims};
use e2e::{Backend, Cloud, Edge, next, pod_yaml};
use etcd::testing::Cluster;
use futures_util::StreamExt;
use hub::NodeClaims;
use serde_json::{Value, json};

fn pod(name: &str, node: &str) -> apis::Object {
    apis::Object::new(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "busybox:1.36"}]},
    }))
    .expect("a pod")
}

async fn store(cluster: &Cluster, prefix: &str) -> EtcdStore {
    let mut config = EtcdConfig::new(cluster.endpoints());
    config.prefix = prefix.to_owned();
    EtcdStore::connect(config).await.expect("the etcd store")
}

async fn next_event(watch: &mut cloud::desired::WatchStream, what: &str) -> WatchEvent {
    tokio::time::timeout(Duration::from_secs(10), watch.next())
        .await
        .unwrap_or_else(|_| panic!("timed out waiting for {what}"))
        .unwrap_or_else(|| panic!("watch ended before {what}"))
        .unwrap_or_else(|err| panic!("watch failed before {what}: {err}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_share_one_desired_state_and_never_overwrite_each_other() {
    let cluster = Cluster::start(3).await;
    let a = store(&cluster, "/shared").await;
    let b = store(&cluster, "/shared").await;
    let (_, since) = b.list(Kind::Pod, None).expect("list");
    let mut seen_by_b = b.watch(Kind::Pod, since).expect("watch");

    // Created through one, as kube-apiserver would store it.
    let created = a.create(pod("web", "edge-1")).await.expect("create");
    assert_eq!(
        created["spec"]["restartPolicy"], "Always",
        "defaults filled in"
    );
    assert!(created["metadata"]["uid"].is_string());
    let first: u64 = created["metadata"]["resourceVersion"]
        .as_str()
        .expect("rv")
        .parse()
        .expect("numeric");
    match next_event(&mut seen_by_b, "the pod at the other replica").await {
        WatchEvent::Added(object) => assert_eq!(object, created),
        other => panic!("added: {other:?}"),
    }
    let key = ObjectKey::new(Kind::Pod, "default", "web");
    assert_eq!(b.get(&key).expect("get"), Some(created.clone()));
    assert!(matches!(
        a.create(pod("web", "edge-1")).await,
        Err(DesiredError::AlreadyExists { .. })
    ));

    // A change through the other replica, then one on the stale revision.
    let mut changed = created.clone();
    changed.edit(|o| o["spec"]["containers"][0]["image"] = json!("busybox:1.37"));
    let replaced = b.replace(changed.clone()).await.expect("replace");
    let second: u64 = replaced["metadata"]["resourceVersion"]
        .as_str()
        .expect("rv")
        .parse()
        .expect("numeric");
    assert!(second > first, "revisions grow");
    let mut stale = changed;
    stale.edit(|o| o["spec"]["containers"][0]["image"] = json!("busybox:stale"));
    assert!(matches!(
        a.replace(stale).await,
        Err(DesiredError::Conflict { .. })
    ));
    // The node is immutable, as kube-apiserver has it.
    let mut moved = replaced.clone();
    moved.edit(|o| o["spec"]["nodeName"] = json!("edge-2"));
    assert!(matches!(
        a.replace(moved).await,
        Err(DesiredError::Invalid { .. })
    ));

    // Status through its own door: the spec's revision is kept for the node.
    let mut reported = replaced.clone();
    reported.edit(|o| o["status"] = json!({"phase": "Running"}));
    let with_status = a.replace_status(reported).await.expect("status");
    assert_eq!(with_status["status"]["phase"], "Running");
    assert_eq!(cloud::desired::spec_revision(&with_status), second);

    let deleted = b.delete(&key).await.expect("delete").expect("was there");
    assert_eq!(deleted["metadata"]["uid"], created["metadata"]["uid"]);
    let mut last = None;
    while last.is_none() {
        if let WatchEvent::Deleted(object) = next_event(&mut seen_by_b, "the deletion").await {
            last = Some(object);
        }
    }
    assert_eq!(b.delete(&key).await.expect("delete"), None);
    let next = a.next_revision().await.expect("a revision");
    assert!(next > second);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_go_on_with_a_member_killed() {
    let mut cluster = Cluster::start(3).await;
    let a = store(&cluster, "/quorum").await;
    // The member every client asks first, and a's watch is on.
    cluster.kill(0);
    let mut last = 0;
    for i in 0..20 {
        let created = a
            .create(pod(&format!("p{i}"), "edge-1"))
            .await
            .expect("created with two of three members");
        last = created["metadata"]["resourceVersion"]
            .as_str()
            .and_then(|rv| rv.parse().ok())
            .expect("a numeric resourceVersion");
    }
    // a's own mirror follows on another member.
    tokio::time::timeout(Duration::from_secs(20), a.catching_up()(last))
        .await
        .expect("a's watch goes on at another member");
    assert_eq!(a.list(Kind::Pod, None).expect("list").0.len(), 20);
    let b = store(&cluster, "/quorum").await;
    assert_eq!(b.list(Kind::Pod, None).expect("list").0.len(), 20);
}

/// The whole cloud on the etcd store: a pod applied through the admin API
/// reaches a real edge.
#[actix::test]
async fn the_cloud_runs_on_etcd() {
    let cluster = Cluster::start(3).await;
    let store = store(&cluster, "/cloud").await.shared();
    let cloud = Cloud::start_backed_by(Backend {
        store: Some(store),
        api: None,
    })
    .await;
    let mut edge = Edge::start(&cloud, "etcd-edge").await;
    let applied = cloud.apply(&pod_yaml("web", "etcd-edge", &[])).await;
    assert_eq!(applied, vec!["Pod/web created".to_owned()]);
    let got = next(&mut edge.edged, "the pod at the edge").await;
    assert_eq!(
        (got.operation(), got.resource()),
        ("insert", "default/pod/web")
    );
    assert!(
        edge.store.get("default/pod/web").expect("read").is_some(),
        "stored at the edge"
    );
    edge.shutdown().await;
    cloud.shutdown().await;
}

fn claims(cluster: &Cluster, replica: &str, ttl_secs: u64) -> EtcdClaims {
    let mut config = ClaimsConfig::new(cluster.endpoints(), replica);
    config.prefix = "/claims-test".to_owned();
    config.ttl = Duration::from_secs(ttl_secs);
    EtcdClaims::start(config).expect("claims")
}

/// Waits until `claims` holds a lease.
async fn leased(claims: &EtcdClaims) {
    let mut counts = claims.counts();
    tokio::time::timeout(Duration::from_secs(10), counts.wait_for(|c| c.leases >= 1))
        .await
        .expect("a lease in time")
        .expect("claims running");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_is_served_by_one_replica_at_a_time() {
    let cluster = Cluster::start(3).await;
    let (a, b) = (claims(&cluster, "a", 5), claims(&cluster, "b", 5));
    leased(&a).await;
    leased(&b).await;
    let first = a.claim_now("n1").await.expect("a claims n1");
    // The fence is the claim key's own creation.
    let (fence, hold) = a.fence("n1").await.expect("a fence");
    drop(hold);
    let (claim, _) = cluster.client().get(&fence.key).await.expect("get");
    assert_eq!(
        Some(fence.create_revision),
        claim.map(|c| c.create_revision)
    );
    let second = a
        .claim_now("n1")
        .await
        .expect("a reconnect finds its claim");
    let refused = b.claim_now("n1").await.expect_err("a holds n1");
    assert!(refused.contains("replica a"), "{refused}");
    assert!(a.holds("n1") && !b.holds("n1"));

    // The first session's release comes after the second claimed: the
    // second keeps the node.
    a.release_now("n1", first).await;
    assert!(a.holds("n1"));
    assert!(b.claim_now("n1").await.is_err());
    // Its link ended: b may take it at once.
    a.release_now("n1", second).await;
    let taken = b.claim_now("n1").await.expect("b claims n1");
    assert!(a.claim_now("n1").await.is_err());

    // b is told to stop: it hands every node over.
    let mut lost = b.lost();
    b.give_up().await;
    assert_eq!(lost.next().await, Some(("n1".to_owned(), taken)));
    a.claim_now("n1").await.expect("a claims n1 again");
    let counts = a.counts().borrow().clone();
    assert_eq!((counts.held, counts.taken, counts.refused), (1, 2, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_replicas_nodes_are_taken_once_its_lease_ends() {
    let cluster = Cluster::start(3).await;
    let (a, b) = (claims(&cluster, "a", 2), claims(&cluster, "b", 2));
    leased(&a).await;
    leased(&b).await;
    a.claim_now("n1").await.expect("a claims n1");
    // Await the claim's end in etcd itself.
    let etcd = cluster.client();
    let (_, at) = etcd.get(b"/claims-test/claims/n1").await.expect("get");
    let mut changes = Box::pin(
        etcd.watch(b"/claims-test/claims/", at + 1)
            .await
            .expect("watch"),
    );
    // a dies without a word: its lease is no longer renewed.
    drop(a);
    let ended = tokio::time::timeout(Duration::from_secs(15), changes.next())
        .await
        .expect("the claim ends with its lease")
        .expect("watch")
        .expect("no error");
    assert!(
        matches!(&ended[0], etcd::Change::Delete { .. }),
        "{ended:?}"
    );
    b.claim_now("n1").await.expect("b claims n1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_cut_off_from_etcd_gives_its_nodes_up_before_its_lease_can_end() {
    let mut cluster = Cluster::start(3).await;
    let ttl = Duration::from_secs(3);
    let a = claims(&cluster, "a", 3);
    leased(&a).await;
    a.claim_now("n1").await.expect("a claims n1");
    let mut lost = a.lost();
    // No quorum: the lease cannot be renewed.
    cluster.kill(1);
    cluster.kill(2);
    let cut = tokio::time::Instant::now();
    let node = tokio::time::timeout(ttl * 2, lost.next())
        .await
        .expect("given up in time")
        .expect("a lost node");
    let after = cut.elapsed();
    assert_eq!(node.0, "n1");
    assert!(!a.holds("n1"));
    // Before etcd could have ended the lease (ttl after the last renewal,
    // which came before the cut).
    assert!(
        after < ttl,
        "given up after {after:?}, the lease lasts {ttl:?}"
    );
    assert!(
        a.claim_now("n2").await.is_err(),
        "no claims without a trusted lease"
    );
}

async fn store_fenced_by(cluster: &Cluster, claims: &EtcdClaims) -> EtcdStore {
    let store = store(cluster, "/fenced").await;
    store.fence_with(claims.fencing());
    store
}

/// etcd itself refuses a node's status from a replica that lost the node,
/// however late that replica learns it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_that_lost_a_node_cannot_write_its_status() {
    let cluster = Cluster::start(3).await;
    let (a, b) = (claims(&cluster, "a", 5), claims(&cluster, "b", 5));
    leased(&a).await;
    leased(&b).await;
    let store = store(&cluster, "/fenced").await;
    store.fence_with(a.fencing());
    let created = store.create(pod("p", "n1")).await.expect("create");

    // Served by no replica (its link is down everywhere): a may still say
    // so, as etcd checks that no claim exists.
    let mut reported = created.clone();
    reported.edit(|o| o["status"] = json!({"phase": "Pending"}));
    let unclaimed = store
        .replace_status(reported)
        .await
        .expect("nobody serves n1");
    let mut reported = unclaimed.clone();
    reported.edit(|o| o["status"] = json!({"phase": "Running"}));
    a.claim_now("n1").await.expect("a claims n1");
    let written = store.replace_status(reported).await.expect("a serves n1");
    assert_eq!(written["status"]["phase"], "Running");

    // The claim goes behind a's back (its lease ran out while it was
    // frozen, say) and b takes the node; a still believes it holds it.
    let etcd = cluster.client();
    let (claim, _) = etcd.get(b"/claims-test/claims/n1").await.expect("get");
    let claim = claim.expect("a's claim");
    assert!(matches!(
        etcd.delete(&claim.key, claim.mod_revision).await,
        Ok(etcd::Written::Done(_))
    ));
    b.claim_now("n1").await.expect("b claims n1");
    assert!(a.holds("n1"), "a has not noticed");
    // Nor may a replica that never held it write while b serves it.
    let c = claims(&cluster, "c", 5);
    leased(&c).await;
    let other = store_fenced_by(&cluster, &c).await;
    let mut elsewhere = written.clone();
    elsewhere.edit(|o| o["status"] = json!({"phase": "Unknown"}));
    assert!(matches!(
        other.replace_status(elsewhere).await,
        Err(DesiredError::Conflict { .. })
    ));
    let mut late = written.clone();
    late.edit(|o| o["status"] = json!({"phase": "Failed"}));
    match store.replace_status(late).await {
        Err(DesiredError::Conflict { reason, .. }) => assert!(reason.contains("claim"), "{reason}"),
        other => panic!("a late status refused: {other:?}"),
    }
    let key = ObjectKey::new(Kind::Pod, "default", "p");
    let (stored, _) = etcd
        .get(b"/fenced/objects/pods/default/p")
        .await
        .expect("get");
    let stored: Value = serde_json::from_slice(&stored.expect("stored").value).expect("json");
    assert_eq!(
        stored["status"]["phase"], "Running",
        "{key}: what a wrote last, under its claim"
    );
}

/// A new replica takes its share: the one holding every node hands the
/// surplus over a few at a time (closing their links, giving their claims
/// up, refusing them for a while), and the new one claims them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_replica_takes_its_share_of_the_nodes() {
    let cluster = Cluster::start(3).await;
    let a = claims(&cluster, "a", 2);
    leased(&a).await;
    let nodes: Vec<String> = (0..20).map(|i| format!("n{i:02}")).collect();
    for node in &nodes {
        a.claim_now(node).await.expect("a alone claims every node");
    }
    let mut handed = a.lost();
    let b = claims(&cluster, "b", 2);
    leased(&b).await;
    // Each node a hands over links to b, as its edge would.
    // Fair is 10 each, with a slack of one: 9 go, 3 a round.
    let mut moved = Vec::new();
    while moved.len() < 9 {
        let (node, _) = tokio::time::timeout(Duration::from_secs(20), handed.next())
            .await
            .expect("a hands nodes over")
            .expect("a running");
        // Refused at a for a while: its edge goes on to b, dialling again
        // until a has given the claim up.
        let refused = a.claim_now(&node).await.expect_err("handed over");
        assert!(refused.contains("handed over"), "{refused}");
        let mut attempts = 0;
        while let Err(reason) = b.claim_now(&node).await {
            attempts += 1;
            assert!(attempts < 100, "b never took {node}: {reason}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        moved.push(node);
    }
    println!("handed over to b: {moved:?}");
    tokio::time::timeout(
        Duration::from_secs(10),
        a.counts().wait_for(|c| c.held == 11),
    )
    .await
    .expect("a's releases done")
    .expect("a running");
    let (a_counts, b_counts) = (a.counts().borrow().clone(), b.counts().borrow().clone());
    assert_eq!(b_counts.held, 9);
    assert_eq!(a_counts.handed_over, moved.len() as u64);
    assert_eq!(a_counts.replicas, 2);
    assert_eq!(a_counts.lost, 0, "handed over, not lost");
}

/// A replica that claims a node serves it only once its mirror of the
/// desired state has caught up with the claim: what another replica
/// applied just before is seen.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claimed_node_is_served_once_every_earlier_apply_is_seen() {
    let cluster = Cluster::start(3).await;
    let (a_store, b_store) = (
        store(&cluster, "/caught-up").await,
        store(&cluster, "/caught-up").await,
    );
    let mut config = ClaimsConfig::new(cluster.endpoints(), "b");
    config.prefix = "/caught-up".to_owned();
    config.ttl = Duration::from_secs(3);
    let b = EtcdClaims::start(config).expect("claims");
    b.catch_up_with(b_store.catching_up());
    leased(&b).await;

    // The hook waits for a revision that is not there yet.
    let (_, now) = cluster.client().get(b"/caught-up/none").await.expect("get");
    let catch_up = b_store.catching_up();
    assert!(
        tokio::time::timeout(Duration::from_millis(300), catch_up(now + 1_000))
            .await
            .is_err(),
        "no revision {} yet",
        now + 1_000
    );
    tokio::time::timeout(Duration::from_secs(10), catch_up(now))
        .await
        .expect("the revision already reached");
    for i in 0..20 {
        let name = format!("applied-{i}");
        a_store
            .create(pod(&name, "n1"))
            .await
            .expect("applied at a");
        b.claim_now(&format!("n{i}")).await.expect("b claims");
        let key = ObjectKey::new(Kind::Pod, "default", &name);
        assert!(
            b_store.get(&key).expect("read").is_some(),
            "b sees {name}, applied before its claim"
        );
    }
}

/// A member frozen (SIGSTOP: stalled, not down, so its calls time out
/// rather than fail) costs no claim: renewals go on to the members that
/// answer, within the lease's trust.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_etcd_member_costs_no_claim() {
    let cluster = Cluster::start(3).await;
    let a = claims(&cluster, "a", 5);
    leased(&a).await;
    a.claim_now("n1").await.expect("a claims n1");
    let mut counts = a.counts();
    let before = counts.borrow().renewals;
    // Member 0 is the one every client asks first.
    cluster.signal(0, "-STOP");
    tokio::time::timeout(
        Duration::from_secs(30),
        counts.wait_for(|c| c.renewals >= before + 6),
    )
    .await
    .expect("renewals go on")
    .expect("claims running");
    let counts = a.counts().borrow().clone();
    assert_eq!(counts.lost, 0, "{counts:?}");
    assert!(a.holds("n1"));
    cluster.signal(0, "-CONT");
}
