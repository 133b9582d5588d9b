//! Whether another replica's Lease has ended, judged the way client-go's
//! leader election judges it: by this replica's own observation on its own
//! clock, never by comparing the other machine's clock (the Lease's
//! `renewTime`) with ours.
//!
//! Every write of a Lease gives it a new `resourceVersion`. A Lease seen at
//! the same `resourceVersion` across `leaseDurationSeconds` of local time
//! was not renewed in that time: its holder, which trusts its Lease only
//! until a margin before `leaseDurationSeconds` after it *asked* for its
//! last renewal, and waits for a renewal's answer no longer than that
//! trust ([`super::book::ClaimBook`]), no longer trusts it.
//!
//! An observation is a read of the Lease: `asked` is the instant the read
//! was sent, `answered` the instant its answer came. A version is counted
//! as seen from the `answered` of the first read that showed it (no
//! earlier than the write that made it), and a later read shows it
//! unchanged since the instant it was `asked` (no later than the API
//! server read it): so the unchanged span is never overestimated, whatever
//! the reads' latencies. No I/O here; time is passed in.

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// What was seen of each Lease, by name.
#[derive(Debug, Default)]
pub struct Observations {
    seen: HashMap<String, Seen>,
}

/// A Lease's version, and since when it is seen unchanged.
#[derive(Debug, Clone)]
struct Seen {
    resource_version: String,
    since: Instant,
}

/// A Lease's state as observed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Renewed (or seen for the first time) too recently to tell: its
    /// holder may still trust it for up to `left`.
    Live {
        /// How long it must stay unchanged yet before it has ended.
        left: Duration,
    },
    /// Seen unchanged for its whole duration: it has ended.
    Expired,
}

impl Observations {
    /// Nothing seen yet.
    pub fn new() -> Observations {
        Observations::default()
    }

    /// The Lease `name` was read at `resource_version`: the read was sent
    /// at `asked` and answered at `answered`. It has ended if that version
    /// was already seen at least `duration` before `asked`.
    pub fn observe(
        &mut self,
        name: &str,
        resource_version: &str,
        duration: Duration,
        asked: Instant,
        answered: Instant,
    ) -> Verdict {
        match self.seen.get(name) {
            Some(seen) if seen.resource_version == resource_version => {
                let unchanged = asked.saturating_duration_since(seen.since);
                match duration.checked_sub(unchanged) {
                    Some(left) if !left.is_zero() => Verdict::Live { left },
                    _ => Verdict::Expired,
                }
            }
            _ => {
                self.seen.insert(
                    name.to_owned(),
                    Seen {
                        resource_version: resource_version.to_owned(),
                        since: answered,
                    },
                );
                Verdict::Live { left: duration }
            }
        }
    }

    /// The Lease `name` is gone: what was seen of it no longer matters.
    pub fn forget(&mut self, name: &str) {
        self.seen.remove(name);
    }

    /// How many Leases are followed.
    pub fn len(&self) -> usize {
        self.seen.len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.seen.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::super::book::ClaimBook;
    use super::*;

    const TTL: Duration = Duration::from_secs(10);
    const MARGIN: Duration = Duration::from_secs(2);

    fn at(start: Instant, millis: u64) -> Instant {
        start + Duration::from_millis(millis)
    }

    #[test]
    fn a_first_sight_never_expires_a_lease() {
        let start = Instant::now();
        let mut seen = Observations::new();
        // However old the Lease's renewTime may say it is: only what this
        // replica saw counts.
        assert_eq!(
            seen.observe("a", "100", TTL, start, start),
            Verdict::Live { left: TTL }
        );
        assert_eq!(seen.len(), 1);
    }

    #[test]
    fn an_unchanged_lease_expires_after_its_duration_of_local_time() {
        let start = Instant::now();
        let mut seen = Observations::new();
        seen.observe("a", "100", TTL, start, at(start, 50));
        assert_eq!(
            seen.observe("a", "100", TTL, at(start, 4_050), at(start, 4_100)),
            Verdict::Live {
                left: Duration::from_secs(6)
            }
        );
        // Counted from the first answer to the later read's sending.
        assert_eq!(
            seen.observe("a", "100", TTL, at(start, 10_049), at(start, 10_060)),
            Verdict::Live {
                left: Duration::from_millis(1)
            }
        );
        assert_eq!(
            seen.observe("a", "100", TTL, at(start, 10_050), at(start, 10_060)),
            Verdict::Expired
        );
    }

    #[test]
    fn a_renewal_starts_the_count_again() {
        let start = Instant::now();
        let mut seen = Observations::new();
        seen.observe("a", "100", TTL, start, start);
        assert_eq!(
            seen.observe("a", "105", TTL, at(start, 9_000), at(start, 9_000)),
            Verdict::Live { left: TTL }
        );
        assert_eq!(
            seen.observe("a", "105", TTL, at(start, 12_000), at(start, 12_000)),
            Verdict::Live {
                left: Duration::from_secs(7)
            }
        );
        assert_eq!(
            seen.observe("a", "105", TTL, at(start, 19_000), at(start, 19_000)),
            Verdict::Expired
        );
    }

    #[test]
    fn slow_reads_never_stretch_the_unchanged_span() {
        let start = Instant::now();
        let mut seen = Observations::new();
        // The first read took 3 s: the version may have been written just
        // before it was answered.
        seen.observe("a", "100", TTL, start, at(start, 3_000));
        // A read sent at 12 s (answered at 14 s) may have been served at
        // 12 s: 9 s unchanged, not 11 or 14.
        assert_eq!(
            seen.observe("a", "100", TTL, at(start, 12_000), at(start, 14_000)),
            Verdict::Live {
                left: Duration::from_secs(1)
            }
        );
        // Reads are answered out of order: an earlier send never counts
        // more.
        assert_eq!(
            seen.observe("a", "100", TTL, at(start, 2_000), at(start, 15_000)),
            Verdict::Live { left: TTL }
        );
        assert_eq!(
            seen.observe("a", "100", TTL, at(start, 13_000), at(start, 13_500)),
            Verdict::Expired
        );
    }

    #[test]
    fn leases_are_followed_each_on_its_own_and_forgotten() {
        let start = Instant::now();
        let mut seen = Observations::new();
        seen.observe("a", "100", TTL, start, start);
        seen.observe("b", "100", TTL, at(start, 5_000), at(start, 5_000));
        assert_eq!(
            seen.observe("a", "100", TTL, at(start, 10_000), at(start, 10_000)),
            Verdict::Expired
        );
        assert_eq!(
            seen.observe("b", "100", TTL, at(start, 10_000), at(start, 10_000)),
            Verdict::Live {
                left: Duration::from_secs(5)
            }
        );
        seen.forget("a");
        assert_eq!(
            seen.observe("a", "100", TTL, at(start, 30_000), at(start, 30_000)),
            Verdict::Live { left: TTL },
            "a Lease seen again after it was gone is counted anew"
        );
        seen.forget("a");
        seen.forget("b");
        assert!(seen.is_empty());
    }

    /// A holder renewing its Lease as the keeper does (one renewal at a
    /// time, its answer awaited no longer than its trust, some requests
    /// lost, some writes landing after the holder stopped waiting) and an
    /// observer reading the Lease at random with random latencies: an
    /// observer's `Expired` always comes after the holder stopped trusting
    /// the Lease, by the margin at least; and a holder that stops renewing
    /// is found expired.
    #[test]
    fn randomized_an_expired_verdict_comes_after_the_holder_let_go() {
        let mut seed = 0x0b5e_77ed_u64;
        let mut next = move |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        const RUNS: usize = 3_000;
        let mut expired_verdicts = 0;
        for _ in 0..RUNS {
            let start = Instant::now();
            let mut book: ClaimBook = ClaimBook::new(TTL, MARGIN);
            // The Lease is created (asked at start, written at once).
            book.granted(1, start);
            let mut writes = vec![start];
            let mut trust_end = start + TTL - MARGIN;
            let mut now = start;
            // The holder renews until it stops trusting its Lease, or dies
            // (stops renewing) at a random round.
            for _ in 0..next(40) {
                now += Duration::from_millis(next(TTL.as_millis() as u64 / 3));
                book.expire(now);
                let Some(until) = book.trusted_until() else {
                    break;
                };
                let asked = now;
                let deadline = (asked + TTL / 3).min(until);
                let lands = next(4) > 0;
                let answered = asked + Duration::from_millis(next(TTL.as_millis() as u64 / 2));
                if lands {
                    // Written while the request was under way; perhaps
                    // after the holder stopped waiting for it.
                    let share = next(1_000) as f64 / 1_000.0;
                    writes.push(asked + (answered - asked).mul_f64(share));
                }
                if lands && answered < deadline {
                    book.renewed(asked);
                    if let Some(until) = book.trusted_until() {
                        trust_end = trust_end.max(until);
                    }
                    now = answered;
                } else {
                    now = answered.min(deadline);
                }
            }
            writes.sort();
            let last_write = writes.last().copied().unwrap_or(start);
            // The observer.
            let mut seen = Observations::new();
            let mut t = start;
            let mut found_expired = false;
            while t < last_write + TTL * 3 {
                t += Duration::from_millis(next(1_000));
                let asked = t;
                // Mostly quick reads, some slower than the margin.
                let latency = match next(4) {
                    0 => next(5_000),
                    _ => next(200),
                };
                let answered = asked + Duration::from_millis(latency);
                let served = asked + (answered - asked).mul_f64(next(1_000) as f64 / 1_000.0);
                let version = writes.iter().filter(|w| **w <= served).count().to_string();
                if seen.observe("holder", &version, TTL, asked, answered) == Verdict::Expired {
                    assert!(
                        trust_end + MARGIN <= asked,
                        "expired while the holder could still trust its Lease"
                    );
                    expired_verdicts += 1;
                    found_expired = true;
                    break;
                }
                t = answered;
            }
            assert!(found_expired, "a Lease no longer renewed is found expired");
        }
        assert_eq!(expired_verdicts, RUNS);
    }
}
