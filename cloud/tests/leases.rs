//! Replicas' claims as Leases in a real kube-apiserver: one node served by
//! one replica at a time, a released or given-up node taken at once, a
//! dead replica's node taken once its Lease is seen unrenewed for its
//! duration, a replica cut off from the API server letting its nodes go
//! before another may take them, and releases that never delete a newer
//! holder's claim.
//!
//! Runs when `EDGEHIVE_TEST_KUBECONFIG` names a kubeconfig with rights on
//! namespaces and Leases (an admin's); says it was skipped otherwise. Each
//! test works in a namespace of its own, deleted at the end.
#![cfg(feature = "kubernetes")]

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use cloud::desired::KubeAccess;
use cloud::replicas::leases::{
    LeaseClaims, LeaseClaimsConfig, REPLICA_UID_ANNOTATION, claim_lease_name, replica_lease_name,
};
use futures_util::StreamExt;
use hub::NodeClaims;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, DeleteParams};
use kube::{Client, Config};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// How long the tests' replicas' Leases last.
const TTL: Duration = Duration::from_secs(3);

fn kubeconfig(test: &str) -> Option<String> {
    match std::env::var("EDGEHIVE_TEST_KUBECONFIG") {
        Ok(path) if !path.is_empty() => Some(path),
        _ => {
            println!("{test}: skipped: EDGEHIVE_TEST_KUBECONFIG is not set (no kube-apiserver)");
            None
        }
    }
}

/// A namespace of the test's own, deleted when the test ends (passed or
/// not).
struct Namespace {
    name: String,
    kubeconfig: String,
}

impl Namespace {
    fn new(kubeconfig: &str) -> Namespace {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|since| since.subsec_nanos())
            .unwrap_or_default();
        Namespace {
            name: format!("edgehive-leases-{:x}{:x}", std::process::id(), nanos),
            kubeconfig: kubeconfig.to_owned(),
        }
    }
}

impl Drop for Namespace {
    fn drop(&mut self) {
        let deleted = std::process::Command::new("kubectl")
            .args(["--kubeconfig", &self.kubeconfig, "delete", "namespace"])
            .args([&self.name, "--wait=false", "--ignore-not-found"])
            .output();
        if !deleted.is_ok_and(|out| out.status.success()) {
            eprintln!("namespace {} not deleted", self.name);
        }
    }
}

async fn kube_config(kubeconfig: &str) -> Config {
    KubeAccess::Kubeconfig(kubeconfig.into())
        .config()
        .await
        .expect("kubeconfig read")
}

async fn client(kubeconfig: &str) -> Client {
    Client::try_from(kube_config(kubeconfig).await).expect("client")
}

/// Replica `name`'s claims, once its Lease is made.
async fn replica(client: Client, namespace: &str, name: &str, ttl: Duration) -> LeaseClaims {
    let mut config = LeaseClaimsConfig::new(name);
    config.namespace = namespace.to_owned();
    config.ttl = ttl;
    let claims = LeaseClaims::start(client, config)
        .await
        .expect("claims started");
    let mut counts = claims.counts();
    tokio::time::timeout(Duration::from_secs(10), counts.wait_for(|c| c.leases >= 1))
        .await
        .expect("replica Lease made in time")
        .expect("counts");
    claims
}

fn leases(client: &Client, namespace: &str) -> Api<Lease> {
    Api::namespaced(client.clone(), namespace)
}

/// The claim Lease of `node`: its holder and the replica Lease uid it
/// names, if it exists.
async fn claim_of(leases: &Api<Lease>, node: &str) -> Option<(String, String)> {
    let name = claim_lease_name(node).expect("claim name");
    let lease = leases.get_opt(&name).await.expect("claim read")?;
    let holder = lease
        .spec
        .and_then(|spec| spec.holder_identity)
        .unwrap_or_default();
    let named = lease
        .metadata
        .annotations
        .and_then(|annotations| annotations.get(REPLICA_UID_ANNOTATION).cloned())
        .unwrap_or_default();
    Some((holder, named))
}

/// The uid of `replica`'s Lease, if it exists.
async fn replica_uid(leases: &Api<Lease>, replica: &str) -> Option<String> {
    let name = replica_lease_name(replica).expect("replica Lease name");
    leases
        .get_opt(&name)
        .await
        .expect("replica Lease read")?
        .metadata
        .uid
}

/// Claims `node` on `claims` until it is taken (`within` at most): when,
/// and the first refusal's reason.
async fn claim_until_taken(
    claims: &LeaseClaims,
    node: &str,
    within: Duration,
) -> (Instant, Option<String>) {
    let deadline = Instant::now() + within;
    let mut first_refusal = None;
    loop {
        match claims.claim_now(node).await {
            Ok(_) => return (Instant::now(), first_refusal),
            Err(reason) => {
                assert!(Instant::now() < deadline, "{node} not taken: {reason}");
                first_refusal.get_or_insert(reason);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_is_served_by_one_replica_and_moves_once_released() {
    let Some(kubeconfig) = kubeconfig("a_node_is_served_by_one_replica_and_moves_once_released")
    else {
        return;
    };
    let namespace = Namespace::new(&kubeconfig);
    let client = client(&kubeconfig).await;
    let a = replica(client.clone(), &namespace.name, "a", TTL).await;
    let b = replica(client.clone(), &namespace.name, "b", TTL).await;
    let leases = leases(&client, &namespace.name);
    let a_uid = replica_uid(&leases, "a").await.expect("a's Lease");

    let generation = a.claim_now("n1").await.expect("a claims n1");
    assert_eq!(
        b.claim_now("n1").await,
        Err("replica a serves node n1".to_owned())
    );
    assert!(a.holds("n1") && !b.holds("n1"));
    assert_eq!(
        claim_of(&leases, "n1").await,
        Some(("a".to_owned(), a_uid.clone()))
    );
    // The node links to a again: the claim is the new session's.
    let again = a.claim_now("n1").await.expect("a claims n1 again");
    assert!(again > generation);
    a.release_now("n1", generation).await;
    assert!(
        a.holds("n1"),
        "the old session's release keeps the new one's"
    );
    assert!(claim_of(&leases, "n1").await.is_some());

    a.release_now("n1", again).await;
    assert!(!a.holds("n1"));
    assert_eq!(
        claim_of(&leases, "n1").await,
        None,
        "the claim Lease deleted"
    );
    b.claim_now("n1").await.expect("b claims n1 at once");
    assert!(b.holds("n1") && !a.holds("n1"));
    let b_uid = replica_uid(&leases, "b").await.expect("b's Lease");
    assert_eq!(claim_of(&leases, "n1").await, Some(("b".to_owned(), b_uid)));
    assert_eq!(
        a.claim_now("n1").await,
        Err("replica b serves node n1".to_owned())
    );

    let (a_counts, b_counts) = (a.counts().borrow().clone(), b.counts().borrow().clone());
    assert_eq!((a_counts.taken, a_counts.refused, a_counts.held), (1, 1, 0));
    assert_eq!((b_counts.taken, b_counts.refused, b_counts.held), (1, 1, 1));
    assert_eq!((a_counts.leases, b_counts.leases), (1, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_that_gives_up_frees_its_nodes_at_once() {
    let Some(kubeconfig) = kubeconfig("a_replica_that_gives_up_frees_its_nodes_at_once") else {
        return;
    };
    let namespace = Namespace::new(&kubeconfig);
    let client = client(&kubeconfig).await;
    let a = replica(client.clone(), &namespace.name, "a", TTL).await;
    let b = replica(client.clone(), &namespace.name, "b", TTL).await;
    let leases = leases(&client, &namespace.name);

    let first = a.claim_now("n1").await.expect("a claims n1");
    let second = a.claim_now("n2").await.expect("a claims n2");
    let mut lost = a.lost();
    let started = Instant::now();
    a.give_up().await;
    let mut nodes = Vec::new();
    while nodes.len() < 2 {
        let node = tokio::time::timeout(Duration::from_secs(5), lost.next())
            .await
            .expect("nodes lost in time")
            .expect("lost stream open");
        nodes.push(node);
    }
    nodes.sort();
    assert_eq!(
        nodes,
        vec![("n1".to_owned(), first), ("n2".to_owned(), second)]
    );
    assert!(!a.holds("n1") && !a.holds("n2"));
    assert_eq!(
        replica_uid(&leases, "a").await,
        None,
        "a's Lease is deleted"
    );
    b.claim_now("n1").await.expect("b takes n1 at once");
    b.claim_now("n2").await.expect("b takes n2 at once");
    println!(
        "gave up: b took both nodes {:?} after a was told to stop",
        started.elapsed()
    );
    assert_eq!(
        claim_of(&leases, "n1").await.map(|claim| claim.0),
        Some("b".to_owned())
    );
    assert_eq!(
        claim_of(&leases, "n2").await.map(|claim| claim.0),
        Some("b".to_owned())
    );
    let counts = a.counts().borrow().clone();
    assert_eq!((counts.lost, counts.held), (2, 0));
    assert_eq!(
        a.claim_now("n3").await,
        Err("this replica holds no trusted Lease (the API server out of reach)".to_owned())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_replicas_node_is_taken_once_its_lease_is_seen_unrenewed() {
    let Some(kubeconfig) =
        kubeconfig("a_dead_replicas_node_is_taken_once_its_lease_is_seen_unrenewed")
    else {
        return;
    };
    let namespace = Namespace::new(&kubeconfig);
    let client = client(&kubeconfig).await;
    let a = replica(client.clone(), &namespace.name, "a", TTL).await;
    let b = replica(client.clone(), &namespace.name, "b", TTL).await;
    let leases = leases(&client, &namespace.name);

    a.claim_now("n1").await.expect("a claims n1");
    // a dies: nothing renews its Lease, nothing is deleted.
    drop(a);
    let died = Instant::now();
    let (taken, refusal) = claim_until_taken(&b, "n1", TTL * 3).await;
    let after = taken - died;
    println!("dead replica: b took n1 {after:?} after a stopped renewing (TTL {TTL:?})");
    assert_eq!(refusal.as_deref(), Some("replica a serves node n1"));
    // Counted from b's first sight of a's Lease, which came after a died.
    assert!(after >= TTL, "taken after {after:?}, before a TTL");
    assert!(after < TTL * 2, "taken after {after:?}");
    let b_uid = replica_uid(&leases, "b").await.expect("b's Lease");
    assert_eq!(claim_of(&leases, "n1").await, Some(("b".to_owned(), b_uid)));
    assert!(b.holds("n1"));
    assert!(
        replica_uid(&leases, "a").await.is_some(),
        "a's Lease left as it was"
    );
}

/// A TCP proxy to the API server that can be cut: from then on it
/// forwards nothing, and holds every connection open (requests hang, as
/// when the network drops packets).
struct Proxy {
    addr: SocketAddr,
    cut: watch::Sender<bool>,
}

impl Proxy {
    async fn start(target: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("proxy bound");
        let addr = listener.local_addr().expect("proxy address");
        let (cut, _) = watch::channel(false);
        let cuts = cut.clone();
        tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                let mut cut = cuts.subscribe();
                tokio::spawn(async move {
                    if !*cut.borrow() {
                        let Ok(mut outbound) = TcpStream::connect(target).await else {
                            return;
                        };
                        tokio::select! {
                            _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => return,
                            _ = cut.wait_for(|cut| *cut) => {}
                        }
                        // Both ends held open, silent.
                        std::future::pending::<()>().await;
                        drop(outbound);
                    }
                    std::future::pending::<()>().await;
                    drop(inbound);
                });
            }
        });
        Proxy { addr, cut }
    }

    fn cut(&self) {
        self.cut.send_replace(true);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_cut_off_lets_its_node_go_before_another_may_take_it() {
    let Some(kubeconfig) =
        kubeconfig("a_replica_cut_off_lets_its_node_go_before_another_may_take_it")
    else {
        return;
    };
    let namespace = Namespace::new(&kubeconfig);
    let client = client(&kubeconfig).await;
    // a speaks to the API server through the proxy; b directly.
    let mut config = kube_config(&kubeconfig).await;
    let target: SocketAddr = format!(
        "{}:{}",
        config.cluster_url.host().expect("API server host"),
        config.cluster_url.port_u16().unwrap_or(443)
    )
    .parse()
    .expect("the API server's address is an IP address and port");
    let proxy = Proxy::start(target).await;
    config.cluster_url = format!("https://{}", proxy.addr)
        .parse()
        .expect("proxy URL");
    let a = replica(
        Client::try_from(config).expect("a's client"),
        &namespace.name,
        "a",
        TTL,
    )
    .await;
    let b = replica(client.clone(), &namespace.name, "b", TTL).await;
    let leases = leases(&client, &namespace.name);

    let generation = a.claim_now("n1").await.expect("a claims n1");
    let mut lost = a.lost();
    proxy.cut();
    let cut = Instant::now();
    let taker = {
        let b = b.clone();
        tokio::spawn(async move { claim_until_taken(&b, "n1", TTL * 4).await })
    };
    let node = tokio::time::timeout(TTL * 2, lost.next())
        .await
        .expect("a lets n1 go")
        .expect("lost stream open");
    let let_go = cut.elapsed();
    assert_eq!(node, ("n1".to_owned(), generation));
    assert!(!a.holds("n1"));
    let (taken, refusal) = taker.await.expect("b's claims");
    let taken = taken - cut;
    println!(
        "cut off: a let n1 go {let_go:?} after the cut, b took it {taken:?} after (TTL {TTL:?})"
    );
    assert!(let_go < TTL, "a held n1 {let_go:?} after the cut");
    assert!(let_go < taken, "b took n1 while a held it");
    assert_eq!(refusal.as_deref(), Some("replica a serves node n1"));
    let b_uid = replica_uid(&leases, "b").await.expect("b's Lease");
    assert_eq!(claim_of(&leases, "n1").await, Some(("b".to_owned(), b_uid)));
    assert_eq!(
        a.claim_now("n2").await,
        Err("this replica holds no trusted Lease (the API server out of reach)".to_owned())
    );
    let counts = a.counts().borrow().clone();
    assert_eq!((counts.lost, counts.held, counts.leases), (1, 0, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_whose_lease_is_deleted_lets_its_nodes_go_and_starts_anew() {
    let Some(kubeconfig) =
        kubeconfig("a_replica_whose_lease_is_deleted_lets_its_nodes_go_and_starts_anew")
    else {
        return;
    };
    let namespace = Namespace::new(&kubeconfig);
    let client = client(&kubeconfig).await;
    let a = replica(client.clone(), &namespace.name, "a", TTL).await;
    let b = replica(client.clone(), &namespace.name, "b", TTL).await;
    let leases = leases(&client, &namespace.name);
    let first = replica_uid(&leases, "a").await.expect("a's Lease");

    let generation = a.claim_now("n1").await.expect("a claims n1");
    let mut lost = a.lost();
    let mut counts = a.counts();
    let name = replica_lease_name("a").expect("name");
    leases
        .delete(&name, &DeleteParams::default())
        .await
        .expect("a's Lease deleted behind its back");
    let deleted = Instant::now();
    let node = tokio::time::timeout(TTL, lost.next())
        .await
        .expect("a lets n1 go at its next renewal")
        .expect("lost stream open");
    println!("deleted Lease: a let n1 go {:?} after", deleted.elapsed());
    assert_eq!(node, ("n1".to_owned(), generation));
    tokio::time::timeout(TTL * 2, counts.wait_for(|c| c.leases == 2))
        .await
        .expect("a new incarnation in time")
        .expect("counts");
    let second = replica_uid(&leases, "a").await.expect("a's new Lease");
    assert_ne!(first, second, "a new incarnation is a new object");
    // The claim names a's first incarnation: free.
    assert_eq!(claim_of(&leases, "n1").await, Some(("a".to_owned(), first)));
    b.claim_now("n1").await.expect("b takes n1 at once");
    // And a, under its new incarnation, claims again.
    a.claim_now("n2").await.expect("a claims n2");
    assert_eq!(
        claim_of(&leases, "n2").await,
        Some(("a".to_owned(), second))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_after_a_takeover_never_deletes_the_new_holders_claim() {
    let Some(kubeconfig) =
        kubeconfig("a_release_after_a_takeover_never_deletes_the_new_holders_claim")
    else {
        return;
    };
    let namespace = Namespace::new(&kubeconfig);
    let client = client(&kubeconfig).await;
    // a renews every 10 s: it does not notice its Lease is gone before
    // its release below.
    let a = replica(
        client.clone(),
        &namespace.name,
        "a",
        Duration::from_secs(30),
    )
    .await;
    let b = replica(client.clone(), &namespace.name, "b", TTL).await;
    let leases = leases(&client, &namespace.name);

    let generation = a.claim_now("n1").await.expect("a claims n1");
    let name = replica_lease_name("a").expect("name");
    leases
        .delete(&name, &DeleteParams::default())
        .await
        .expect("a's Lease deleted behind its back");
    b.claim_now("n1")
        .await
        .expect("b takes n1 (a's Lease is gone)");
    assert!(a.holds("n1"), "a has not noticed yet");
    // a's session of n1 ends: its release must not delete b's claim.
    a.release_now("n1", generation).await;
    let b_uid = replica_uid(&leases, "b").await.expect("b's Lease");
    assert_eq!(
        claim_of(&leases, "n1").await,
        Some(("b".to_owned(), b_uid)),
        "b's claim stays"
    );
    assert!(b.holds("n1") && !a.holds("n1"));
}

/// A new replica takes its share, as on etcd: the one holding every node
/// hands the surplus over a few at a time, refusing those nodes for a
/// while, and the new one claims them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_replica_takes_its_share_of_the_nodes() {
    let Some(kubeconfig) = kubeconfig("a_new_replica_takes_its_share_of_the_nodes") else {
        return;
    };
    let namespace = Namespace::new(&kubeconfig);
    let client = client(&kubeconfig).await;
    let a = replica(client.clone(), &namespace.name, "a", TTL).await;
    for i in 0..8 {
        a.claim_now(&format!("n{i}"))
            .await
            .expect("a alone claims every node");
    }
    let mut handed = a.lost();
    let b = replica(client.clone(), &namespace.name, "b", TTL).await;
    // Fair is 4 each, with a slack of one: 3 go, one a round.
    let mut moved = Vec::new();
    while moved.len() < 3 {
        let (node, _) = tokio::time::timeout(Duration::from_secs(60), handed.next())
            .await
            .expect("a hands nodes over")
            .expect("a running");
        let refused = a.claim_now(&node).await.expect_err("handed over");
        assert!(refused.contains("handed over"), "{refused}");
        // Its edge goes on to b (b's first look at a's Lease refuses; the
        // edge dials again, as it would).
        let mut attempts = 0;
        while let Err(reason) = b.claim_now(&node).await {
            attempts += 1;
            assert!(attempts < 100, "b never took {node}: {reason}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        moved.push(node);
    }
    println!("handed over to b: {moved:?}");
    let (a_counts, b_counts) = (a.counts().borrow().clone(), b.counts().borrow().clone());
    assert_eq!(b_counts.held, 3);
    assert_eq!(a_counts.handed_over, 3);
    assert_eq!(a_counts.replicas, 2);
    assert_eq!(a_counts.lost, 0, "handed over, not lost");
}

/// Which nodes no replica holds, as a replica asks before it marks a node
/// unreachable: not one claimed by a live replica (its own or another's),
/// and one whose replica gave up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unclaimed_nodes_are_those_no_live_replica_holds() {
    let Some(kubeconfig) = kubeconfig("unclaimed_nodes_are_those_no_live_replica_holds") else {
        return;
    };
    let namespace = Namespace::new(&kubeconfig);
    let client = client(&kubeconfig).await;
    let a = replica(client.clone(), &namespace.name, "a", TTL).await;
    let b = replica(client.clone(), &namespace.name, "b", TTL).await;
    a.claim_now("n1").await.expect("a claims n1");
    let nodes = || vec!["n1".to_owned(), "n2".to_owned()];
    assert_eq!(b.unclaimed(nodes()).await, Ok(vec!["n2".to_owned()]));
    assert_eq!(a.unclaimed(nodes()).await, Ok(vec!["n2".to_owned()]));
    a.give_up().await;
    assert_eq!(b.unclaimed(nodes()).await, Ok(nodes()));
}

/// A keeper on its own thread and connection renews the replica's Lease
/// while the runtime the claims were made on is stalled for twice the
/// Lease's duration: no claim is lost (one sharing that runtime would
/// have let every node go).
#[tokio::test(flavor = "current_thread")]
async fn a_keeper_on_its_own_thread_keeps_the_claims_through_a_stalled_runtime() {
    let Some(kubeconfig) =
        kubeconfig("a_keeper_on_its_own_thread_keeps_the_claims_through_a_stalled_runtime")
    else {
        return;
    };
    let namespace = Namespace::new(&kubeconfig);
    let mut config = LeaseClaimsConfig::new("a");
    config.namespace = namespace.name.clone();
    config.ttl = TTL;
    config.keeper_client = Some(kube_config(&kubeconfig).await);
    let a = LeaseClaims::start(client(&kubeconfig).await, config)
        .await
        .expect("claims started");
    let mut counts = a.counts();
    tokio::time::timeout(Duration::from_secs(10), counts.wait_for(|c| c.leases >= 1))
        .await
        .expect("replica Lease made in time")
        .expect("counts");
    a.claim_now("n1").await.expect("a claims n1");
    let renewed = a.counts().borrow().renewals;
    // The only thread of this runtime is held: nothing on it runs.
    std::thread::sleep(TTL * 2);
    let counts = a.counts().borrow().clone();
    assert!(a.holds("n1"), "n1 still held");
    assert_eq!(counts.lost, 0);
    assert!(
        counts.renewals >= renewed + 3,
        "renewed meanwhile: {} then {}",
        renewed,
        counts.renewals
    );
    a.give_up().await;
}
