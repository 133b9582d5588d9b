//! A replica's claims on nodes, as decisions with no I/O: the lease they
//! live under, how long this replica may trust it, and which nodes it
//! holds. Time is passed in.
//!
//! The engine (etcd) ends a lease `ttl` after the last renewal it
//! granted. The replica counts from when it *asked* for that renewal, an
//! instant no later than the engine's grant, and stops trusting the lease
//! a `margin` before `ttl` has passed: so it gives up its nodes before
//! another replica could claim them, whatever the network did meanwhile.
//!
//! A claim's record (`R`) is what the engine needs to fence or remove it:
//! etcd's claims keep the key's create revision (an `i64`, the default);
//! Kubernetes Leases keep the claim Lease's uid and resourceVersion.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// The lease and the claims under it; `R`, each claim's record.
#[derive(Debug)]
pub struct ClaimBook<R = i64> {
    ttl: Duration,
    margin: Duration,
    /// The lease, and until when it is trusted.
    lease: Option<(i64, Instant)>,
    /// Nodes held: their claim's revision (the fencing token) and which
    /// session of the node it serves.
    held: BTreeMap<String, Claim<R>>,
    /// The last generation handed out.
    generations: u64,
}

/// One node's claim.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Claim<R> {
    revision: R,
    generation: u64,
}

impl<R: Clone> ClaimBook<R> {
    /// No lease yet; leases of `ttl`, trusted until `margin` before they
    /// could end.
    pub fn new(ttl: Duration, margin: Duration) -> ClaimBook<R> {
        ClaimBook {
            ttl,
            margin: margin.min(ttl / 2),
            lease: None,
            held: BTreeMap::new(),
            generations: 0,
        }
    }

    fn trust_from(&self, asked: Instant) -> Instant {
        asked + self.ttl - self.margin
    }

    /// A lease was granted, asked for at `asked`. Claims under an earlier
    /// lease end with it: the nodes lost.
    pub fn granted(&mut self, lease: i64, asked: Instant) -> Vec<(String, u64)> {
        self.lease = Some((lease, self.trust_from(asked)));
        std::mem::take(&mut self.held)
            .into_iter()
            .map(|(node, claim)| (node, claim.generation))
            .collect()
    }

    /// The lease was renewed, asked at `asked`.
    pub fn renewed(&mut self, asked: Instant) {
        let until = self.trust_from(asked);
        if let Some((_, trusted)) = &mut self.lease {
            *trusted = (*trusted).max(until);
        }
    }

    /// The lease to claim under, if it is trusted at `now`.
    pub fn lease(&self, now: Instant) -> Option<i64> {
        self.lease
            .filter(|(_, until)| now < *until)
            .map(|(lease, _)| lease)
    }

    /// Until when the lease is trusted, if there is one.
    pub fn trusted_until(&self) -> Option<Instant> {
        self.lease.map(|(_, until)| until)
    }

    /// Whether a lease is held (trusted or not).
    pub fn has_lease(&self) -> bool {
        self.lease.is_some()
    }

    /// `node` is claimed at `revision`, for a new session of it: the
    /// claim's generation, which only that session's release gives up.
    pub fn claimed(&mut self, node: &str, revision: R) -> u64 {
        self.generations += 1;
        let generation = self.generations;
        self.held.insert(
            node.to_owned(),
            Claim {
                revision,
                generation,
            },
        );
        generation
    }

    /// The session of generation `generation` gave `node` up; its claim's
    /// revision, if that session's claim was the one held (a newer
    /// session's claim is kept).
    pub fn released(&mut self, node: &str, generation: u64) -> Option<R> {
        match self.held.get(node) {
            Some(claim) if claim.generation == generation => {
                self.held.remove(node).map(|claim| claim.revision)
            }
            _ => None,
        }
    }

    /// The revision of `node`'s claim, if it is held (the fencing token).
    pub fn revision(&self, node: &str) -> Option<R> {
        self.held.get(node).map(|claim| claim.revision.clone())
    }

    /// Whether `node` is held.
    pub fn holds(&self, node: &str) -> bool {
        self.held.contains_key(node)
    }

    /// The generation of `node`'s claim, if it is held.
    pub fn generation(&self, node: &str) -> Option<u64> {
        self.held.get(node).map(|claim| claim.generation)
    }

    /// The nodes held, with their claims' generations.
    pub fn held(&self) -> Vec<(String, u64)> {
        self.held
            .iter()
            .map(|(node, claim)| (node.clone(), claim.generation))
            .collect()
    }

    /// How many nodes are held.
    pub fn len(&self) -> usize {
        self.held.len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }

    /// At `now`: if the lease is no longer trusted, it and every claim are
    /// gone; the nodes lost, with their claims' generations.
    pub fn expire(&mut self, now: Instant) -> Vec<(String, u64)> {
        match self.lease {
            Some((_, until)) if now >= until => self.lease_gone(),
            _ => Vec::new(),
        }
    }

    /// The engine says the lease has ended: every claim is gone; the nodes
    /// lost, with their claims' generations.
    pub fn lease_gone(&mut self) -> Vec<(String, u64)> {
        self.lease = None;
        std::mem::take(&mut self.held)
            .into_iter()
            .map(|(node, claim)| (node, claim.generation))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TTL: Duration = Duration::from_secs(10);
    const MARGIN: Duration = Duration::from_secs(2);

    #[test]
    fn a_lease_is_trusted_until_a_margin_before_it_could_end() {
        let start = Instant::now();
        let mut book: ClaimBook = ClaimBook::new(TTL, MARGIN);
        assert_eq!(book.lease(start), None, "nothing to claim under yet");
        book.granted(7, start);
        assert_eq!(book.lease(start + Duration::from_secs(7)), Some(7));
        assert_eq!(
            book.lease(start + Duration::from_secs(8)),
            None,
            "ttl - margin"
        );
        // Renewed, as asked at 5 s: trusted until 13 s.
        book.renewed(start + Duration::from_secs(5));
        assert_eq!(book.lease(start + Duration::from_secs(12)), Some(7));
        // A late answer to an older renewal never shortens it.
        book.renewed(start + Duration::from_secs(1));
        assert_eq!(book.lease(start + Duration::from_secs(12)), Some(7));
    }

    #[test]
    fn every_node_is_lost_with_the_lease_and_before_it_ends() {
        let start = Instant::now();
        let mut book: ClaimBook = ClaimBook::new(TTL, MARGIN);
        book.granted(7, start);
        let first = book.claimed("n1", 100);
        let second = book.claimed("n2", 101);
        assert!(book.expire(start + Duration::from_secs(7)).is_empty());
        let lost = book.expire(start + TTL - MARGIN);
        assert_eq!(
            lost,
            vec![("n1".to_owned(), first), ("n2".to_owned(), second)]
        );
        assert!(!book.has_lease() && book.is_empty());
        // Nothing more to lose.
        assert!(book.expire(start + TTL * 2).is_empty());
    }

    #[test]
    fn a_released_node_is_no_longer_held() {
        let start = Instant::now();
        let mut book: ClaimBook = ClaimBook::new(TTL, MARGIN);
        book.granted(7, start);
        let old = book.claimed("n1", 100);
        // The node links again before its old session's release comes.
        let new = book.claimed("n1", 100);
        assert_eq!(
            book.released("n1", old),
            None,
            "the new session's claim stays"
        );
        assert!(book.holds("n1"));
        assert_eq!(book.released("n1", new), Some(100));
        assert_eq!(book.released("n1", new), None);
        assert!(book.lease_gone().is_empty());
    }

    #[test]
    fn claims_under_an_earlier_lease_end_with_it() {
        let start = Instant::now();
        let mut book: ClaimBook = ClaimBook::new(TTL, MARGIN);
        book.granted(7, start);
        let generation = book.claimed("n1", 100);
        let lost = book.granted(8, start + TTL);
        assert_eq!(lost, vec![("n1".to_owned(), generation)]);
        assert!(!book.holds("n1"));
    }

    /// Whatever the renewals' timing, the replica never trusts its lease
    /// past the instant the engine could end it.
    #[test]
    fn randomized_renewals_never_outlive_the_engines_lease() {
        let mut seed = 0x00c1_a1e5_u64;
        let mut next = move |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        for _ in 0..500 {
            let start = Instant::now();
            let mut book: ClaimBook = ClaimBook::new(TTL, MARGIN);
            book.granted(1, start);
            // The engine's view: the lease ends ttl after its last grant,
            // which comes after the replica asked.
            let mut engine_ends = start + TTL;
            let mut now = start;
            for _ in 0..30 {
                now += Duration::from_millis(next(4_000));
                let asked = now;
                let granted = asked + Duration::from_millis(next(3_000));
                if next(3) > 0 && granted < engine_ends {
                    engine_ends = granted + TTL;
                    book.renewed(asked);
                }
                now = granted;
                if book.lease(now).is_some() {
                    assert!(now < engine_ends, "trusted after the engine ended it");
                }
                book.expire(now);
                if !book.has_lease() {
                    break;
                }
            }
        }
    }
}
