//! The session rules, deterministic and randomized: the book with plain
//! tokens for links (each must come back exactly once), liveness with
//! time passed in, and the fate of messages nodes send.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use beehive::Message as HiveMessage;
use beehive::constants::{group, operation};

use super::*;

fn session(id: u64, link: u32, claim: Option<u64>) -> Session<u32> {
    Session::new(id, link, Dialect::Native, claim, Some(100))
}

#[test]
fn a_newer_link_takes_over_and_the_old_one_is_handed_back() {
    let mut book = SessionBook::default();
    let (first, second) = (book.new_id(), book.new_id());
    assert!(second > first);
    assert_eq!(
        book.open("n", session(first, 1, None), true),
        Opened::Current { replaced: None }
    );
    assert_eq!(
        book.open("n", session(second, 2, None), true),
        Opened::Current { replaced: Some(1) }
    );
    assert_eq!(book.get("n").map(|s| s.sender), Some(2));
    assert_eq!(book.len(), 1);
}

#[test]
fn a_link_reporting_after_a_newer_one_is_refused() {
    let mut book = SessionBook::default();
    let (older, newer) = (book.new_id(), book.new_id());
    book.open("n", session(newer, 2, None), true);
    assert_eq!(
        book.open("n", session(older, 1, None), true),
        Opened::Refused {
            sender: 1,
            why: NotOpened::Superseded
        }
    );
    assert_eq!(book.get("n").map(|s| s.id), Some(newer));
}

#[test]
fn a_link_whose_claim_ended_on_the_way_is_refused() {
    let mut book = SessionBook::default();
    let id = book.new_id();
    assert_eq!(
        book.open("n", session(id, 1, Some(7)), false),
        Opened::Refused {
            sender: 1,
            why: NotOpened::ClaimGone
        }
    );
    assert!(!book.linked("n"));
}

#[test]
fn a_late_word_from_a_replaced_link_changes_nothing() {
    let mut book = SessionBook::default();
    let now = Instant::now();
    let (old, new) = (book.new_id(), book.new_id());
    book.open("n", session(old, 1, None), true);
    book.open("n", session(new, 2, None), true);
    assert!(book.close("n", old, now).is_none());
    assert!(book.linked("n") && !book.gone("n"));
    assert_eq!(book.close("n", new, now).map(|s| s.sender), Some(2));
    assert!(!book.linked("n") && book.gone("n"));
}

#[test]
fn a_lost_claim_ends_only_the_session_opened_under_it() {
    let mut book = SessionBook::default();
    let now = Instant::now();
    let id = book.new_id();
    book.open("n", session(id, 1, Some(5)), true);
    assert!(book.claim_lost("n", 4, now).is_none(), "an older claim");
    assert!(book.linked("n"));
    assert_eq!(book.claim_lost("n", 5, now).map(|s| s.sender), Some(1));
    assert!(book.gone("n"));
    assert!(book.claim_lost("n", 5, now).is_none(), "once");
}

#[test]
fn a_held_back_queue_goes_once_its_own_session_is_recorded() {
    let mut book = SessionBook::default();
    let (first, second) = (book.new_id(), book.new_id());
    book.open("n", session(first, 1, None), true);
    book.hold_back("n");
    assert!(book.ready("n").is_none());
    book.open("n", session(second, 2, None), true);
    book.hold_back("n");
    assert!(!book.recorded("n", first), "the replaced session's record");
    assert!(book.ready("n").is_none());
    assert!(book.recorded("n", second));
    assert_eq!(book.ready("n").map(|s| s.sender), Some(2));
}

#[test]
fn gone_nodes_are_counted_from_when_they_left_and_forgotten_once_told() {
    let mut book = SessionBook::default();
    let start = Instant::now();
    let minute = Duration::from_secs(60);
    book.absent("never-seen", start);
    book.absent("never-seen", start + minute);
    let id = book.new_id();
    book.open("left", session(id, 1, None), true);
    book.absent("left", start);
    assert!(!book.gone("left"), "a linked node is not absent");
    book.close("left", id, start + minute);
    assert_eq!(
        book.gone_longer_than(minute, start + minute),
        vec!["never-seen".to_owned()]
    );
    assert!(!book.gone("never-seen"));
    assert!(book.gone_longer_than(minute, start + minute).is_empty());
    let back = book.new_id();
    book.open("left", session(back, 2, None), true);
    assert!(!book.gone("left"), "back before it was forgotten");
    assert!(
        book.gone_longer_than(minute, start + 10 * minute)
            .is_empty()
    );
}

#[test]
fn a_revoked_certificate_closes_its_link_once() {
    let mut book = SessionBook::default();
    for (node, link) in [("a", 1), ("b", 2)] {
        let id = book.new_id();
        book.open(node, session(id, link, None), true);
    }
    let id = book.new_id();
    book.open(
        "plain",
        Session::new(id, 3, Dialect::Native, None, None),
        true,
    );
    assert!(book.any_revocable());
    let revoked: Vec<(String, u32)> = book
        .revoked(|node, issued| node == "a" && issued == 100)
        .into_iter()
        .map(|(node, link)| (node, *link))
        .collect();
    assert_eq!(revoked, vec![("a".to_owned(), 1)]);
    assert!(
        book.revoked(|node, _| node == "a").is_empty(),
        "closing already"
    );
    assert!(book.any_revocable(), "b may yet be");
    assert_eq!(book.revoked(|_, _| true).len(), 1);
    assert!(!book.any_revocable());
}

#[test]
fn a_silent_link_is_closed_within_two_intervals() {
    let start = Instant::now();
    let keepalive = Duration::from_secs(4);
    // A KubeEdge edge speaks first: the cloud only listens.
    let mut kubeedge = Liveness::new(keepalive, Dialect::KubeEdge, start);
    assert_eq!(kubeedge.period(), Duration::from_secs(1));
    assert_eq!(kubeedge.check(start + Duration::from_secs(7)), Beat::Quiet);
    kubeedge.heard(start + Duration::from_secs(6));
    assert_eq!(kubeedge.check(start + Duration::from_secs(12)), Beat::Quiet);
    assert_eq!(
        kubeedge.check(start + Duration::from_millis(13_001)),
        Beat::Silent
    );
}

#[test]
fn the_cloud_speaks_first_each_interval_on_native_links() {
    let start = Instant::now();
    let keepalive = Duration::from_secs(4);
    let mut native = Liveness::new(keepalive, Dialect::Native, start);
    assert_eq!(native.check(start + Duration::from_secs(3)), Beat::Quiet);
    assert_eq!(
        native.check(start + Duration::from_secs(4)),
        Beat::SpeakFirst
    );
    assert_eq!(native.check(start + Duration::from_secs(5)), Beat::Quiet);
    native.heard(start + Duration::from_secs(6));
    assert_eq!(
        native.check(start + Duration::from_secs(8)),
        Beat::SpeakFirst
    );
    let mut kubeedge = Liveness::new(keepalive, Dialect::KubeEdge, start);
    assert_eq!(kubeedge.check(start + Duration::from_secs(5)), Beat::Quiet);
}

fn payload(resource: &str, target: &str) -> HiveMessage {
    payload_with(resource, target, operation::UPDATE)
}

fn payload_with(resource: &str, target: &str, op: &str) -> HiveMessage {
    HiveMessage::new().build_router(
        "edged",
        beehive::SmolStr::new(target),
        beehive::SmolStr::new(resource),
        beehive::SmolStr::new(op),
    )
}

#[test]
fn a_nodes_messages_go_to_their_group_as_its_own_and_no_further() {
    let never = |_: &HiveMessage| false;
    assert!(matches!(
        upstream("n", Dialect::Native, protocol::keepalive("edgehub"), never),
        Upstream::Keepalive
    ));
    let object = payload("default/pod/web", "meta");
    let ack = protocol::ack(&object, "edgehub");
    assert!(matches!(
        upstream("n", Dialect::Native, ack, never),
        Upstream::Ack(id) if id == object.id()
    ));
    assert!(matches!(
        upstream("n", Dialect::Native, protocol::hello("n"), never),
        Upstream::SecondHello
    ));
    match upstream(
        "n",
        Dialect::Native,
        payload("default/pod/web", "meta"),
        never,
    ) {
        Upstream::ToGroup(msg) => assert_eq!(msg.resource(), "node/n/default/pod/web"),
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        upstream(
            "n",
            Dialect::Native,
            payload("node/other/default/pod/web", "meta"),
            never
        ),
        Upstream::Refused(_)
    ));
    assert!(matches!(
        upstream(
            "n",
            Dialect::Native,
            payload("default/pod/web", group::HUB),
            never
        ),
        Upstream::Refused(_)
    ));
    assert!(matches!(
        upstream(
            "n",
            Dialect::Native,
            payload("default/pod/web", "meta"),
            |_| true
        ),
        Upstream::Answer(_)
    ));
}

#[test]
fn a_kubeedge_edges_reported_error_is_only_told() {
    let error = payload_with("default/pod/web", "resource", operation::ERROR);
    assert!(matches!(
        upstream("n", Dialect::KubeEdge, error, |_| false),
        Upstream::ReportedError(_)
    ));
}

/// Random opens (in and out of order, under held and lost claims),
/// closes, lost claims, holds and records on a few nodes, checked against
/// a model: one link per node, the newest taken one, every link handed
/// back exactly once, gone exactly when not linked since it left.
#[test]
fn random_histories_keep_one_current_link_per_node_and_lose_no_link() {
    for seed in 0..300u64 {
        let mut rng = fastrand::Rng::with_seed(seed);
        let mut book: SessionBook<u32> = SessionBook::default();
        let now = Instant::now();
        let nodes = ["a", "b", "c"];
        let mut given: BTreeSet<u32> = BTreeSet::new();
        let mut back: Vec<u32> = Vec::new();
        // Links created but not yet opened: (node, id, link, claim).
        let mut pending: Vec<(&str, u64, u32, Option<u64>)> = Vec::new();
        let mut model: BTreeMap<&str, (u64, Option<u64>)> = BTreeMap::new();
        let mut left: BTreeSet<&str> = BTreeSet::new();
        let mut next_link = 0u32;
        for _ in 0..200 {
            let node = nodes[rng.usize(..nodes.len())];
            match rng.u8(..6) {
                0 | 1 => {
                    next_link += 1;
                    let claim = rng.bool().then(|| rng.u64(1..4));
                    pending.push((node, book.new_id(), next_link, claim));
                    given.insert(next_link);
                }
                2 if !pending.is_empty() => {
                    let (node, id, link, claim) = pending.swap_remove(rng.usize(..pending.len()));
                    let held = rng.u8(..5) > 0;
                    let newer_current = model.get(node).is_some_and(|(current, _)| *current > id);
                    match book.open(node, session(id, link, claim), held) {
                        Opened::Current { replaced } => {
                            assert!(held && !newer_current, "seed {seed}");
                            let old = model.insert(node, (id, claim));
                            assert_eq!(replaced.is_some(), old.is_some(), "seed {seed}");
                            back.extend(replaced);
                            left.remove(node);
                        }
                        Opened::Refused { sender, why } => {
                            assert_eq!(sender, link, "seed {seed}");
                            match why {
                                NotOpened::ClaimGone => assert!(!held, "seed {seed}"),
                                NotOpened::Superseded => assert!(newer_current, "seed {seed}"),
                            }
                            back.push(sender);
                        }
                    }
                }
                3 => {
                    let id = match model.get(node) {
                        Some((current, _)) if rng.bool() => *current,
                        _ => rng.u64(..book.last_id + 1),
                    };
                    let ended = book.close(node, id, now);
                    let was_current = model.get(node).is_some_and(|(current, _)| *current == id);
                    assert_eq!(ended.is_some(), was_current, "seed {seed}");
                    if let Some(session) = ended {
                        model.remove(node);
                        left.insert(node);
                        back.push(session.sender);
                    }
                }
                4 => {
                    let generation = rng.u64(1..4);
                    let ended = book.claim_lost(node, generation, now);
                    let under = model
                        .get(node)
                        .is_some_and(|(_, claim)| *claim == Some(generation));
                    assert_eq!(ended.is_some(), under, "seed {seed}");
                    if let Some(session) = ended {
                        model.remove(node);
                        left.insert(node);
                        back.push(session.sender);
                    }
                }
                _ => {
                    book.hold_back(node);
                    if let Some((current, _)) = model.get(node) {
                        assert!(book.ready(node).is_none(), "seed {seed}");
                        assert!(book.recorded(node, *current), "seed {seed}");
                        assert!(book.ready(node).is_some(), "seed {seed}");
                    }
                }
            }
            assert_eq!(book.len(), model.len(), "seed {seed}");
            for node in nodes {
                assert_eq!(
                    book.get(node).map(|s| s.id),
                    model.get(node).map(|(id, _)| *id),
                    "seed {seed}"
                );
                assert_eq!(book.gone(node), left.contains(node), "seed {seed}: {node}");
            }
        }
        back.extend(pending.iter().map(|(_, _, link, _)| *link));
        back.extend(book.drain());
        let returned: BTreeSet<u32> = back.iter().copied().collect();
        assert_eq!(
            returned.len(),
            back.len(),
            "seed {seed}: a link handed back twice"
        );
        assert_eq!(returned, given, "seed {seed}: a link lost");
    }
}
