//! How the replicas even out their nodes, as decisions with no I/O.
//!
//! Every replica knows how many replicas are up and how many nodes are
//! claimed in all (two counts in the engine). One holding more than its
//! fair share, `ceil(claimed / replicas)`, by more than a slack hands the
//! surplus over: it closes those nodes' links and, for a while, refuses
//! them when they link again, so their edges go on to the cloud's next
//! address, another replica. A few at a time, so that a new replica takes
//! its share without a stampede, and the others never overshoot.
//!
//! Time is passed in.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// At most this many nodes handed over per round, however large the
/// share: their edges link again all at once.
pub const MAX_PER_ROUND: usize = 500;

/// A replica's view of the spread, and the nodes it is handing over.
#[derive(Debug)]
pub struct Share {
    /// How long a handed-over node is refused here.
    hold: Duration,
    /// At most this fraction of a fair share is handed over per round.
    step: f64,
    /// Handed over: refused here until then.
    handing: BTreeMap<String, Instant>,
}

impl Share {
    /// Nodes handed over are refused for `hold`; at most `step` (0 to 1)
    /// of a fair share goes per round.
    pub fn new(hold: Duration, step: f64) -> Share {
        Share {
            hold,
            step: step.clamp(0.01, 1.0),
            handing: BTreeMap::new(),
        }
    }

    /// A replica's fair share of `claimed` nodes over `replicas`.
    pub fn fair(claimed: usize, replicas: usize) -> usize {
        claimed.div_ceil(replicas.max(1))
    }

    /// One round at `now`: of the nodes this replica holds (`held`, in any
    /// order), those it hands over now, given `claimed` nodes claimed by
    /// all and `replicas` replicas up (this one among them). Each is
    /// refused here for a while after.
    pub fn round(
        &mut self,
        held: &[String],
        claimed: usize,
        replicas: usize,
        now: Instant,
    ) -> Vec<String> {
        self.handing.retain(|_, until| *until > now);
        if replicas <= 1 {
            // Alone: nothing to hand over, and nowhere for a node handed
            // over to go.
            self.handing.clear();
            return Vec::new();
        }
        let fair = Share::fair(claimed.max(held.len()), replicas);
        // A little above the fair share is fine: with the counts read at
        // different instants, replicas would otherwise trade nodes back
        // and forth.
        let slack = (fair / 20).max(1);
        if held.len() <= fair + slack {
            return Vec::new();
        }
        let per_round = ((fair as f64 * self.step).ceil() as usize).clamp(1, MAX_PER_ROUND);
        let surplus = (held.len() - fair).min(per_round);
        let going: Vec<String> = held
            .iter()
            .filter(|node| !self.handing.contains_key(*node))
            .take(surplus)
            .cloned()
            .collect();
        for node in &going {
            self.handing.insert(node.clone(), now + self.hold);
        }
        going
    }

    /// Whether `node` is being handed over at `now` (refused here).
    pub fn refuses(&self, node: &str, now: Instant) -> bool {
        self.handing.get(node).is_some_and(|until| *until > now)
    }

    /// Forgets every hand-over (this replica is alone, or lost its lease).
    pub fn clear(&mut self) {
        self.handing.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOLD: Duration = Duration::from_secs(10);

    fn nodes(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("n{i:03}")).collect()
    }

    #[test]
    fn a_lone_replica_or_a_fair_one_keeps_its_nodes() {
        let now = Instant::now();
        let mut share = Share::new(HOLD, 0.25);
        assert!(share.round(&nodes(100), 100, 1, now).is_empty());
        assert!(share.round(&nodes(50), 100, 2, now).is_empty());
        // Within the slack.
        assert!(share.round(&nodes(35), 100, 3, now).is_empty());
        assert_eq!(share.round(&nodes(36), 100, 3, now).len(), 2);
    }

    #[test]
    fn a_new_replica_gets_a_share_a_few_at_a_time() {
        let start = Instant::now();
        let mut share = Share::new(HOLD, 0.25);
        let held = nodes(100);
        // A second replica came up: fair is 50, a quarter of it per round.
        let first = share.round(&held, 100, 2, start);
        assert_eq!(first.len(), 13);
        assert!(first.iter().all(|node| share.refuses(node, start)));
        // Next round: those 13 are gone, 13 more go.
        let held: Vec<String> = held.into_iter().filter(|n| !first.contains(n)).collect();
        let second = share.round(&held, 100, 2, start + Duration::from_secs(1));
        assert_eq!(second.len(), 13);
        assert!(second.iter().all(|node| !first.contains(node)));
        // Refused for `hold`, then welcome again.
        assert!(!share.refuses(&first[0], start + HOLD));
    }

    #[test]
    fn nodes_still_being_handed_over_are_not_counted_twice() {
        let now = Instant::now();
        let mut share = Share::new(HOLD, 1.0);
        let held = nodes(10);
        let first = share.round(&held, 10, 2, now);
        assert_eq!(first.len(), 5);
        // Their links have not closed yet: the same 10 held.
        let again = share.round(&held, 10, 2, now + Duration::from_millis(10));
        assert!(again.iter().all(|node| !first.contains(node)));
    }

    /// Replicas that each run their rounds on the counts they read end
    /// up even, and hand over no more than the surplus in all.
    #[test]
    fn randomized_rounds_even_the_replicas_out() {
        let mut seed = 0x5eed_5a1e_u64;
        let mut next = move |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        for _ in 0..200 {
            let replicas = 2 + next(4) as usize;
            let total = 1 + next(2_000) as usize;
            let mut held: Vec<Vec<String>> = vec![Vec::new(); replicas];
            // Everything on the first, as after a restart of the others.
            held[0] = nodes(total);
            let mut shares: Vec<Share> = (0..replicas).map(|_| Share::new(HOLD, 0.25)).collect();
            let mut now = Instant::now();
            let mut moved = 0;
            for _ in 0..200 {
                now += Duration::from_secs(1 + next(3));
                let r = next(replicas as u64) as usize;
                let going = shares[r].round(&held[r], total, replicas, now);
                moved += going.len();
                held[r].retain(|node| !going.contains(node));
                // Each goes to the least-loaded other replica that takes it.
                for node in going {
                    let target = (0..replicas)
                        .filter(|&t| t != r && !shares[t].refuses(&node, now))
                        .min_by_key(|&t| held[t].len())
                        .unwrap_or(r);
                    held[target].push(node);
                }
            }
            let fair = Share::fair(total, replicas);
            let slack = (fair / 20).max(1);
            for (r, nodes) in held.iter().enumerate() {
                assert!(
                    nodes.len() <= fair + slack,
                    "replica {r} holds {} of {total} over {replicas}",
                    nodes.len()
                );
            }
            assert_eq!(held.iter().map(Vec::len).sum::<usize>(), total);
            assert!(moved <= total, "moved {moved} of {total}");
        }
    }
}
