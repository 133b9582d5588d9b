//! Tombstones against the real cloud queue: random interleavings of
//! creates, updates, deletes, sends, acks, overdue resends, lost links,
//! cloud restarts and a lagging sender, through hub's `NodeQueue`, with an
//! edge that decides as meta's store does and prunes at every inventory
//! question. It spans two crates (hub and meta), so it lives here.

use std::collections::HashMap;

use beehive::Message;
use hub::queue::NodeQueue;
use meta::Watermark;
use meta::store::{Record, supersedes};

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
                    object: (!delete).then(|| apis::kinds::object_content(&serde_json::json!({}))),
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
                        if !deliver(&mut edge, &mut deleted_at, &mut deleted_since_prune, &old) {
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
