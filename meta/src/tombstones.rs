//! When a deletion's tombstone may leave the edge store: a plain rule with
//! no I/O (the revisions are passed in), so it can be tested on its own.
//!
//! # Why tombstones exist
//!
//! A deletion of `<ns>/<type>/<name>` at version `D` leaves a record with
//! no object and version `D`; an upsert of that resource at a version `<= D`
//! is then refused as stale. Without it, an older upsert arriving after the
//! deletion would bring the object back (and edged would start the pod
//! again).
//!
//! # Where an older message could come from
//!
//! - The link: cloudhub's per-node queue ([`hub::queue::NodeQueue`]) keeps
//!   only the newest version of an object, has at most one version of it
//!   in flight, and sends the newest after the ack of the one before. The
//!   transports deliver a link's frames in order, and the edge has one
//!   link at a time (a new one is dialled only after the old one ended),
//!   so a resend of an older version (after `resend_overdue` or a lost
//!   link) reaches the edge *before* the deletion that replaced it, never
//!   after. After the deletion is acknowledged the queue holds nothing of
//!   that object.
//! - A cloud restart: the queue is restored from redb, newest version per
//!   object (a deletion pushed replaced the older version before it was
//!   sent), so nothing older than `D` comes back from it.
//! - The edgecontroller: it sends from its view of the desired state, in
//!   revision order per kind. A replica whose view lags behind the deletion
//!   (one that took the node over and has not handled the deletion's
//!   event yet) can still send the object at an older version. This is the
//!   case the tombstone is for.
//!
//! # The rule
//!
//! A tombstone may go once no message carrying an older version of its
//! resource can still arrive. The edge learns that from the cloud: when the
//! edgecontroller asks a node for its inventory (on every link, before it
//! brings the node in step), it says up to which revision it has handled
//! each resource type's changes (a [`Watermark`]). That replica is the one
//! sending to this node; having handled a type up to `W`, it knows of every
//! deletion of that type at or below `W`; it sends such a resource again
//! only where its view wants it on the node, at a version above the
//! deletion (a re-created object's own, later revision, or a fresh
//! revision above every one issued so far). So
//! a tombstone of type `t` at version `D` goes once a watermark with
//! `W[t] >= D` has been received. A type the watermark does not name, or a
//! tombstone whose version is not a number, is kept.
//!
//! A replica that takes the node over later asks for the inventory again;
//! the inventory never lists tombstones, so whatever it finds missing and
//! wants there it sends at a fresh revision, above any tombstone — with the
//! tombstone kept or pruned alike. Pruning therefore never lets an object
//! come back that a kept tombstone would have kept away.
//!
//! The number of tombstones held is then bounded by the deletions not yet
//! covered by the last watermark. Types the cloud does not follow
//! (services, endpoints), and an edge talking to a KubeEdge cloud (which
//! asks for no inventory), get no watermark: their tombstones are kept.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Up to which revision the cloud has handled each resource type's changes
/// (`pod`, `configmap`, ...), as it says when it asks for the inventory.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Watermark {
    /// Resource type -> revision handled.
    pub handled: BTreeMap<String, u64>,
}

impl Watermark {
    /// A watermark of `(type, revision)` pairs.
    pub fn of<'a>(handled: impl IntoIterator<Item = (&'a str, u64)>) -> Watermark {
        Watermark {
            handled: handled
                .into_iter()
                .map(|(kind, revision)| (kind.to_owned(), revision))
                .collect(),
        }
    }

    /// Whether nothing is covered.
    pub fn is_empty(&self) -> bool {
        self.handled.is_empty()
    }

    /// Takes the higher of each type's revisions (watermarks only grow:
    /// a lower one, from an older question, covers less).
    pub fn merge(&mut self, other: &Watermark) {
        for (kind, revision) in &other.handled {
            let at = self.handled.entry(kind.clone()).or_default();
            *at = (*at).max(*revision);
        }
    }

    /// Whether the tombstone of `resource` (`<ns>/<type>/<name>`) at
    /// `version` may go: its type is handled at or above `version`.
    pub fn covers(&self, resource: &str, version: &str) -> bool {
        let Some(kind) = resource.split('/').nth(1) else {
            return false;
        };
        let Ok(version) = version.parse::<u64>() else {
            return false;
        };
        self.handled.get(kind).is_some_and(|at| *at >= version)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{Record, supersedes};
    use beehive::Message;
    use hub::queue::NodeQueue;
    use std::collections::HashMap;

    #[test]
    fn a_watermark_covers_its_types_up_to_their_revisions() {
        let w = Watermark::of([("pod", 10), ("configmap", 3)]);
        assert!(w.covers("default/pod/a", "10"));
        assert!(w.covers("default/pod/a", "2"));
        assert!(!w.covers("default/pod/a", "11"));
        assert!(!w.covers("default/configmap/c", "4"));
        assert!(!w.covers("default/secret/s", "1"), "a type not named");
        assert!(!w.covers("default/pod/a", "abc"), "not a number");
        assert!(!w.covers("nonsense", "1"));
        let mut merged = Watermark::of([("pod", 12)]);
        merged.merge(&w);
        assert_eq!(merged, Watermark::of([("pod", 12), ("configmap", 3)]));
        assert!(Watermark::default().is_empty());
    }

    /// The edge store's decision, in memory.
    #[derive(Default)]
    struct Edge {
        held: HashMap<String, Record>,
    }

    impl Edge {
        fn apply(&mut self, resource: &str, record: Record) -> bool {
            let fresh = self
                .held
                .get(resource)
                .is_none_or(|held| supersedes(&record.version, &held.version));
            if fresh {
                self.held.insert(resource.to_owned(), record);
            }
            fresh
        }

        fn prune(&mut self, watermark: &Watermark) -> usize {
            let before = self.held.len();
            self.held
                .retain(|resource, r| !(r.is_deleted() && watermark.covers(resource, &r.version)));
            before - self.held.len()
        }

        fn tombstones(&self) -> usize {
            self.held.values().filter(|r| r.is_deleted()).count()
        }
    }

    fn xorshift(mut seed: u64) -> impl FnMut() -> u64 {
        move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        }
    }

    fn message(name: &str, version: u64, delete: bool) -> Message {
        Message::new()
            .build_router(
                "edgecontroller",
                "resource",
                format!("node/n1/default/pod/{name}"),
                if delete { "delete" } else { "update" },
            )
            .with_resource_version(version.to_string())
    }

    fn edge_resource(msg: &Message) -> String {
        msg.resource().trim_start_matches("node/n1/").to_owned()
    }

    /// Random interleavings of creates, updates, deletes, sends, acks,
    /// overdue resends, lost links, cloud restarts (the queue rebuilt from
    /// what it held) and a lagging sender replaying old versions, through
    /// the real [`NodeQueue`], with the edge pruning at every inventory
    /// question (the watermark lagging one link behind): an object deleted
    /// at the edge comes back only with a version above its deletion, and
    /// the tombstones held never exceed the deletions applied during the
    /// last two links.
    #[test]
    fn random_schedules_never_revive_a_deleted_object_and_bound_tombstones() {
        for seed in [0x2545_f491_4f6c_dd1du64, 7, 0xdead_beef, 42, 1 << 40] {
            let mut next = xorshift(seed);
            let new_queue = || {
                let mut queue = NodeQueue::new(4, 10_000);
                queue.set_resend_after(Some(std::time::Duration::from_secs(1)));
                queue
            };
            let mut queue = new_queue();
            let mut clock = std::time::Instant::now();
            let mut edge = Edge::default();
            // The cloud's desired state: name -> (revision, live).
            let mut desired: HashMap<String, (u64, bool)> = HashMap::new();
            let mut revision = 0u64;
            // Every message the cloud queued, and each resource's deletions.
            let mut history: Vec<Message> = Vec::new();
            let mut deletions: HashMap<String, Vec<u64>> = HashMap::new();
            let (mut watermark, mut handled) = (0u64, 0u64);
            // Frames on the wire of the current link, in order.
            let mut wire: std::collections::VecDeque<Message> = Default::default();
            // The highest deletion applied per resource, pruned or not.
            let mut deleted_at: HashMap<String, u64> = HashMap::new();
            let mut deleted_since_prune: std::collections::HashSet<String> = Default::default();
            let mut deleted_before: std::collections::HashSet<String> = Default::default();
            let (mut pruned, mut replays, mut refused_replays) = (0, 0, 0);
            let deliver = |edge: &mut Edge,
                           deleted_at: &mut HashMap<String, u64>,
                           deleted_since_prune: &mut std::collections::HashSet<String>,
                           msg: &Message| {
                let resource = edge_resource(msg);
                let version: u64 = msg.resource_version().parse().unwrap_or(0);
                let delete = msg.operation() == "delete";
                let applied = edge.apply(
                    &resource,
                    Record {
                        version: msg.resource_version().to_owned(),
                        object: (!delete).then(|| serde_json::json!({})),
                    },
                );
                if applied && delete {
                    let at = deleted_at.entry(resource.clone()).or_default();
                    *at = (*at).max(version);
                    deleted_since_prune.insert(resource);
                } else if applied {
                    let at = deleted_at.get(&resource).copied().unwrap_or(0);
                    assert!(
                        version > at,
                        "{resource} revived at {version} after its deletion at {at}"
                    );
                }
                applied
            };
            for _ in 0..30_000 {
                match next() % 11 {
                    // The cloud changes an object and queues it.
                    0..=2 => {
                        let name = format!("p{}", next() % 64);
                        revision += 1;
                        let delete = next().is_multiple_of(2);
                        desired.insert(name.clone(), (revision, !delete));
                        if delete {
                            deletions
                                .entry(format!("default/pod/{name}"))
                                .or_default()
                                .push(revision);
                        }
                        let msg = message(&name, revision, delete);
                        history.push(msg.clone());
                        queue.push(msg);
                    }
                    3 | 4 => wire.extend(queue.next_batch()),
                    // The edge takes the next frame, in order, and acks.
                    5..=7 => {
                        if let Some(msg) = wire.pop_front() {
                            deliver(&mut edge, &mut deleted_at, &mut deleted_since_prune, &msg);
                            queue.ack(msg.id());
                        }
                    }
                    // Time passes: what waited too long goes again, on the
                    // same link, behind what is there already.
                    8 => {
                        clock += std::time::Duration::from_secs(2);
                        queue.resend_overdue(clock);
                    }
                    // A sender that has not handled a later deletion of the
                    // object replays an old version of it (what the rule
                    // allows: no watermark covers that deletion yet).
                    9 => {
                        if history.is_empty() {
                            continue;
                        }
                        let old = &history[(next() as usize) % history.len()];
                        let v: u64 = old.resource_version().parse().unwrap_or(0);
                        let resource = edge_resource(old);
                        let covered = deletions
                            .get(&resource)
                            .is_some_and(|d| d.iter().any(|d| *d > v && *d <= watermark));
                        if !covered {
                            replays += 1;
                            let old = old.clone();
                            if !deliver(&mut edge, &mut deleted_at, &mut deleted_since_prune, &old)
                            {
                                refused_replays += 1;
                            }
                        }
                    }
                    // The link drops (what was on it is lost), or the cloud
                    // restarts (its queue restored with the newest of each
                    // object); the next link asks for the inventory with
                    // the revision handled so far, and the edge prunes.
                    _ => {
                        wire.clear();
                        if next().is_multiple_of(4) {
                            let held: Vec<Message> = queue.objects().cloned().collect();
                            queue = new_queue();
                            for msg in held {
                                queue.push(msg);
                            }
                        } else {
                            queue.link_lost();
                        }
                        // The watermark lags: the cloud had handled up
                        // to where it was at the link before.
                        watermark = handled;
                        handled = revision;
                        pruned += edge.prune(&Watermark::of([("pod", watermark)]));
                        deleted_before = std::mem::take(&mut deleted_since_prune);
                    }
                }
                assert!(
                    edge.tombstones() <= deleted_since_prune.union(&deleted_before).count(),
                    "tombstones beyond the deletions of the last two links"
                );
            }
            // Drain: the edge ends with exactly the desired state.
            loop {
                wire.extend(queue.next_batch());
                let Some(msg) = wire.pop_front() else { break };
                deliver(&mut edge, &mut deleted_at, &mut deleted_since_prune, &msg);
                queue.ack(msg.id());
            }
            for (name, (version, live)) in &desired {
                match edge.held.get(&format!("default/pod/{name}")) {
                    Some(record) => {
                        assert_eq!(record.version, version.to_string(), "{name}");
                        assert_eq!(!record.is_deleted(), *live, "{name}");
                    }
                    // Pruned: only a deletion may be missing.
                    None => assert!(!live, "{name} lost"),
                }
            }
            assert!(pruned > 100, "seed {seed}: pruned {pruned}");
            assert!(
                refused_replays > 0 && replays > refused_replays,
                "seed {seed}"
            );
        }
    }

    /// What the tombstone is for: a sender whose view lags behind a
    /// deletion sends an older version. Before the watermark covers the
    /// deletion it is refused; after pruning, only a sender whose
    /// watermark covered the deletion is speaking, and it sends above it.
    #[test]
    fn a_late_older_upsert_is_refused_until_a_watermark_covers_the_deletion() {
        let mut edge = Edge::default();
        assert!(edge.apply(
            "default/pod/a",
            Record {
                version: "5".into(),
                object: Some(serde_json::json!(5)),
            }
        ));
        assert!(edge.apply(
            "default/pod/a",
            Record {
                version: "9".into(),
                object: None,
            }
        ));
        // A lagging replica's older version.
        assert!(!edge.apply(
            "default/pod/a",
            Record {
                version: "5".into(),
                object: Some(serde_json::json!(5)),
            }
        ));
        // A watermark below the deletion prunes nothing.
        assert_eq!(edge.prune(&Watermark::of([("pod", 8)])), 0);
        assert!(!edge.apply(
            "default/pod/a",
            Record {
                version: "7".into(),
                object: Some(serde_json::json!(7)),
            }
        ));
        assert_eq!(
            edge.prune(&Watermark::of([("pod", 9), ("configmap", 100)])),
            1
        );
        assert_eq!(edge.tombstones(), 0);
    }
}
