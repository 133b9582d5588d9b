//! The Lease rules, deterministic and randomized: a KubeEdge node's own
//! Lease read and written through the book, and the renewal rounds' ticks
//! and ends, each checked against a simple model.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::*;
use crate::test_rng::Rng;
use beehive::Content;

fn lease(node: &str, version: Option<&str>) -> Value {
    let mut lease = json!({
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": node, "namespace": "kube-node-lease"},
        "spec": {"holderIdentity": node, "leaseDurationSeconds": 40},
    });
    if let Some(version) = version {
        lease["metadata"]["resourceVersion"] = json!(version);
    }
    lease
}

fn version(answer: &LeaseAnswer) -> Option<&str> {
    match answer {
        LeaseAnswer::Lease(lease) => lease.pointer("/metadata/resourceVersion")?.as_str(),
        LeaseAnswer::Refused(_) => None,
    }
}

#[test]
fn a_lease_read_before_its_first_write_is_not_found() {
    let mut book = LeaseBook::default();
    assert_eq!(
        book.answer("edge-1", "edge-1", LeaseRequest::Read, &Content::Empty),
        LeaseAnswer::Refused(LeaseRefused::NotWritten)
    );
    let written = book.answer(
        "edge-1",
        "edge-1",
        LeaseRequest::Write,
        &apis::kinds::object_content(&lease("edge-1", None)),
    );
    assert_eq!(
        book.answer("edge-1", "edge-1", LeaseRequest::Read, &Content::Empty),
        written,
        "read as written"
    );
    assert_eq!(
        book.answer("edge-2", "edge-2", LeaseRequest::Read, &Content::Empty),
        LeaseAnswer::Refused(LeaseRefused::NotWritten),
        "each node's own"
    );
}

#[test]
fn each_write_moves_the_resource_version_up_by_one() {
    let mut book = LeaseBook::default();
    let first = book.answer(
        "n",
        "n",
        LeaseRequest::Write,
        &apis::kinds::object_content(&lease("n", None)),
    );
    assert_eq!(version(&first), Some("1"));
    // The node's own version is not taken: the book's is.
    let second = book.answer(
        "n",
        "n",
        LeaseRequest::Write,
        &apis::kinds::object_content(&lease("n", Some("77"))),
    );
    assert_eq!(version(&second), Some("2"));
    let mut renewed = lease("n", Some("2"));
    renewed["spec"]["renewTime"] = json!("2026-11-27T10:00:10.000000Z");
    let third = book.answer(
        "n",
        "n",
        LeaseRequest::Write,
        &apis::kinds::object_content(&renewed),
    );
    assert_eq!(version(&third), Some("3"));
    let LeaseAnswer::Lease(held) = third else {
        panic!("a write answers the Lease");
    };
    assert_eq!(held["spec"], renewed["spec"], "kept as written");
}

#[test]
fn a_lease_without_metadata_is_kept_without_a_version() {
    let mut book = LeaseBook::default();
    book.answer(
        "n",
        "n",
        LeaseRequest::Write,
        &apis::kinds::object_content(&lease("n", None)),
    );
    let bare = json!({"spec": {"holderIdentity": "n"}});
    assert_eq!(
        book.answer(
            "n",
            "n",
            LeaseRequest::Write,
            &apis::kinds::object_content(&bare)
        ),
        LeaseAnswer::Lease(bare.clone())
    );
    // Counted from nothing again.
    let next = book.answer(
        "n",
        "n",
        LeaseRequest::Write,
        &apis::kinds::object_content(&lease("n", None)),
    );
    assert_eq!(version(&next), Some("1"));
}

#[test]
fn a_node_holds_only_its_own_lease() {
    let mut book = LeaseBook::default();
    book.answer(
        "edge-2",
        "edge-2",
        LeaseRequest::Write,
        &apis::kinds::object_content(&lease("edge-2", None)),
    );
    for request in [LeaseRequest::Read, LeaseRequest::Write, LeaseRequest::Other] {
        assert_eq!(
            book.answer(
                "edge-1",
                "edge-2",
                request,
                &apis::kinds::object_content(&lease("edge-2", None))
            ),
            LeaseAnswer::Refused(LeaseRefused::NotOwn),
            "{request:?}"
        );
    }
    let held = book.answer("edge-2", "edge-2", LeaseRequest::Read, &Content::Empty);
    assert_eq!(version(&held), Some("1"), "another's write changed nothing");
}

#[test]
fn other_operations_on_a_lease_are_refused_and_change_nothing() {
    let mut book = LeaseBook::default();
    assert_eq!(
        book.answer(
            "n",
            "n",
            LeaseRequest::Other,
            &apis::kinds::object_content(&lease("n", None))
        ),
        LeaseAnswer::Refused(LeaseRefused::Operation)
    );
    assert_eq!(
        book.answer("n", "n", LeaseRequest::Read, &Content::Empty),
        LeaseAnswer::Refused(LeaseRefused::NotWritten)
    );
}

#[test]
fn refusals_say_what_a_kubelet_expects() {
    let forbidden = LeaseRefused::NotOwn.refusal("n", "query");
    assert_eq!((forbidden.code, forbidden.reason), (403, "Forbidden"));
    assert_eq!(forbidden.message, "a node holds only its own lease");
    let missing = LeaseRefused::NotWritten.refusal("n", "query");
    assert_eq!((missing.code, missing.reason), (404, "NotFound"));
    assert_eq!(
        missing.message,
        "leases.coordination.k8s.io \"n\" not found"
    );
    let other = LeaseRefused::Operation.refusal("n", "delete");
    assert_eq!((other.code, other.reason), (400, "BadRequest"));
    assert_eq!(other.message, "delete of a lease");
}

/// Random reads, writes (with and without metadata, own and foreign) and
/// other requests from a few nodes, against a model: the version each
/// node's Lease is at (`None`: never written, or written without
/// metadata), and the content last written.
#[test]
fn random_lease_histories_agree_with_a_model() {
    for seed in 0..200u64 {
        let mut rng = Rng(seed * 7919 + 1);
        let mut book = LeaseBook::default();
        let nodes = ["a", "b", "c"];
        let mut model: BTreeMap<&str, (Option<u64>, Value)> = BTreeMap::new();
        for step in 0..200 {
            let node = nodes[rng.below(nodes.len())];
            let named = match rng.percent(15) {
                true => nodes[rng.below(nodes.len())],
                false => node,
            };
            let request = match rng.below(3) {
                0 => LeaseRequest::Read,
                1 => LeaseRequest::Write,
                _ if rng.percent(20) => LeaseRequest::Other,
                _ => LeaseRequest::Write,
            };
            let content = match rng.percent(10) {
                true => json!({"spec": {"step": step}}),
                false => lease(node, Some(&rng.next().to_string())),
            };
            let answer = book.answer(node, named, request, &apis::kinds::object_content(&content));
            let context = format!("seed {seed}, step {step}");
            if named != node {
                assert_eq!(
                    answer,
                    LeaseAnswer::Refused(LeaseRefused::NotOwn),
                    "{context}"
                );
                continue;
            }
            match request {
                LeaseRequest::Read => match model.get(node) {
                    Some((_, held)) => {
                        assert_eq!(answer, LeaseAnswer::Lease(held.clone()), "{context}")
                    }
                    None => assert_eq!(
                        answer,
                        LeaseAnswer::Refused(LeaseRefused::NotWritten),
                        "{context}"
                    ),
                },
                LeaseRequest::Write => {
                    let mut expected = content.clone();
                    let version = match expected.get_mut("metadata") {
                        Some(metadata) => {
                            let next = model.get(node).and_then(|(v, _)| *v).unwrap_or(0) + 1;
                            metadata["resourceVersion"] = json!(next.to_string());
                            Some(next)
                        }
                        None => None,
                    };
                    assert_eq!(answer, LeaseAnswer::Lease(expected.clone()), "{context}");
                    model.insert(node, (version, expected));
                }
                LeaseRequest::Other => assert_eq!(
                    answer,
                    LeaseAnswer::Refused(LeaseRefused::Operation),
                    "{context}"
                ),
            }
        }
    }
}

fn names(nodes: &[&str]) -> Vec<String> {
    nodes.iter().map(|node| (*node).to_owned()).collect()
}

#[test]
fn a_round_starts_only_with_nodes_connected_and_one_at_a_time() {
    let mut rounds = RenewalRounds::default();
    assert_eq!(rounds.tick(Vec::new()), Renewal::NoneConnected);
    let Renewal::Start(round) = rounds.tick(names(&["a", "b"])) else {
        panic!("a first round");
    };
    assert_eq!(round.nodes, names(&["a", "b"]));
    assert_eq!(round.in_flight, LEASES_IN_FLIGHT);
    assert_eq!(
        rounds.tick(names(&["a", "b", "c"])),
        Renewal::UnderWay(round.id)
    );
    assert_eq!(
        rounds.tick(Vec::new()),
        Renewal::NoneConnected,
        "nothing connected, under way or not"
    );
    rounds.ended(round.id);
    let Renewal::Start(next) = rounds.tick(names(&["c"])) else {
        panic!("a round once the last ended");
    };
    assert!(next.id > round.id);
    assert_eq!(next.nodes, names(&["c"]));
}

#[test]
fn a_word_about_another_round_changes_nothing() {
    let mut rounds = RenewalRounds::new(4);
    let Renewal::Start(first) = rounds.tick(names(&["a"])) else {
        panic!("a first round");
    };
    rounds.ended(first.id + 1);
    assert_eq!(rounds.tick(names(&["a"])), Renewal::UnderWay(first.id));
    rounds.ended(first.id);
    rounds.ended(first.id);
    let Renewal::Start(second) = rounds.tick(names(&["a"])) else {
        panic!("a second round");
    };
    rounds.ended(first.id);
    assert_eq!(
        rounds.tick(names(&["a"])),
        Renewal::UnderWay(second.id),
        "the first round's word, again, ends not the second"
    );
}

#[test]
fn renewals_in_flight_are_limited_to_at_least_one() {
    let limit = |in_flight| match RenewalRounds::new(in_flight).tick(names(&["a"])) {
        Renewal::Start(round) => round.in_flight,
        other => panic!("{other:?}"),
    };
    assert_eq!(limit(8), 8);
    assert_eq!(limit(0), 1);
}

/// Random ticks (with random connected sets) and ends (of the round under
/// way, or of any round before), against a model: the round under way, if
/// any. Rounds start only with nodes connected, never over one under way,
/// with fresh ids, and renew exactly the nodes connected at the tick.
#[test]
fn random_ticks_and_ends_keep_one_round_at_a_time() {
    let nodes = ["a", "b", "c", "d"];
    for seed in 0..200u64 {
        let mut rng = Rng(seed * 104_729 + 3);
        let mut rounds = RenewalRounds::new(1 + rng.below(8));
        let mut under_way: Option<u64> = None;
        let mut last = 0u64;
        for step in 0..300 {
            let context = format!("seed {seed}, step {step}");
            if rng.percent(40) {
                let id = match under_way {
                    Some(id) if rng.percent(70) => id,
                    _ => rng.next() % (last + 2),
                };
                rounds.ended(id);
                if under_way == Some(id) {
                    under_way = None;
                }
                continue;
            }
            let connected: Vec<String> = nodes
                .iter()
                .filter(|_| rng.percent(50))
                .map(|node| (*node).to_owned())
                .collect();
            match rounds.tick(connected.clone()) {
                Renewal::NoneConnected => assert!(connected.is_empty(), "{context}"),
                Renewal::UnderWay(id) => {
                    assert!(!connected.is_empty(), "{context}");
                    assert_eq!(under_way, Some(id), "{context}");
                }
                Renewal::Start(round) => {
                    assert!(under_way.is_none(), "{context}: two rounds at once");
                    assert!(round.id > last, "{context}: a fresh id");
                    assert_eq!(round.nodes, connected, "{context}");
                    assert!(round.in_flight >= 1, "{context}");
                    last = round.id;
                    under_way = Some(round.id);
                }
            }
        }
    }
}
