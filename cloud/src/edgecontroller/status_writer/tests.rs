//! Tests of the parent module (`status_writer.rs`).

use super::*;
use crate::test_rng::Rng;

type Writer = StatusWriter<&'static str, u32, u32>;

fn config() -> WriterConfig {
    WriterConfig {
        per_second: 10.0,
        burst: 2,
        in_flight: 2,
        retry_first: Duration::from_secs(1),
        retry_max: Duration::from_secs(4),
        throttle_default: Duration::from_secs(1),
    }
}

fn started(writer: &mut Writer, now: Instant) -> Vec<(&'static str, u32)> {
    writer
        .poll(now)
        .into_iter()
        .map(|s| (s.key, s.write))
        .collect()
}

#[test]
fn a_newer_status_replaces_the_waiting_one_and_one_write_flies_per_object() {
    let t0 = Instant::now();
    let mut writer = Writer::new(config());
    writer.submit("a", 1, Some(10), 1, t0);
    assert_eq!(started(&mut writer, t0), [("a", 1)]);
    // In flight: newer ones wait behind it, the newest replacing.
    writer.submit("a", 2, Some(20), 1, t0);
    writer.submit("a", 3, None, 1, t0);
    assert_eq!(started(&mut writer, t0), []);
    assert_eq!(writer.counts().coalesced, 1);
    // The first lands: its own ticket is answered, and the newest
    // starts (once a token is there).
    let (answers, landed) = writer.completed(&"a", 1, Outcome::Written, t0);
    assert_eq!((answers, landed), (vec![(10, Settled::Written)], 1));
    assert_eq!(started(&mut writer, t0), [("a", 3)]);
    let (answers, landed) = writer.completed(&"a", 3, Outcome::Written, t0);
    assert_eq!((answers, landed), (vec![(20, Settled::Written)], 2));
    assert!(writer.is_idle());
    assert_eq!(writer.counts().written, 2);
}

#[test]
fn a_ticket_follows_the_write_under_way_or_is_answered_now() {
    let t0 = Instant::now();
    let mut writer = Writer::new(config());
    // Nothing under way: given back, to answer now.
    assert_eq!(writer.attach(&"a", 1), Some(1));
    writer.submit("a", 1, None, 0, t0);
    started(&mut writer, t0);
    assert_eq!(writer.attach(&"a", 2), None);
    let (answers, landed) = writer.completed(&"a", 1, Outcome::Written, t0);
    assert_eq!((answers, landed), (vec![(2, Settled::Written)], 0));
    assert_eq!(writer.attach(&"a", 3), Some(3));
}

#[test]
fn starts_follow_the_bucket_and_the_cap_in_flight() {
    let t0 = Instant::now();
    let mut writer = Writer::new(WriterConfig {
        in_flight: 10,
        ..config()
    });
    for (i, key) in ["a", "b", "c", "d"].into_iter().enumerate() {
        writer.submit(key, i as u32, None, 1, t0);
    }
    // A burst of 2, then one per 100 ms.
    assert_eq!(started(&mut writer, t0), [("a", 0), ("b", 1)]);
    assert_eq!(writer.next_wake(t0), Some(t0 + Duration::from_millis(100)));
    assert_eq!(started(&mut writer, t0 + Duration::from_millis(50)), []);
    assert_eq!(
        started(&mut writer, t0 + Duration::from_millis(100)),
        [("c", 2)]
    );
    assert_eq!(
        started(&mut writer, t0 + Duration::from_millis(200)),
        [("d", 3)]
    );
    // The cap: two in flight at most, whatever the tokens.
    let mut capped = Writer::new(WriterConfig {
        burst: 100,
        ..config()
    });
    for (i, key) in ["a", "b", "c"].into_iter().enumerate() {
        capped.submit(key, i as u32, None, 1, t0);
    }
    assert_eq!(started(&mut capped, t0).len(), 2);
    assert_eq!(capped.next_wake(t0), None);
    capped.completed(&"a", 0, Outcome::Written, t0);
    assert_eq!(started(&mut capped, t0), [("c", 2)]);
}

#[test]
fn unpaced_starts_as_fast_as_writes_land_up_to_the_cap() {
    let t0 = Instant::now();
    const OBJECTS: u32 = 1000;
    let mut writer = StatusWriter::<u32, u32, u32>::new(WriterConfig::unpaced());
    for key in 0..OBJECTS {
        writer.submit(key, key, None, 1, t0);
    }
    let mut now = t0;
    let mut written = 0;
    while !writer.is_idle() {
        let starts = writer.poll(now);
        assert_eq!(starts.len(), 256.min(OBJECTS - written) as usize);
        assert_eq!(writer.next_wake(now), None);
        for start in starts {
            writer.completed(&start.key, start.write, Outcome::Written, now);
            written += 1;
        }
        now += Duration::from_micros(1);
    }
    assert_eq!(writer.counts().written, 1000);
    assert_eq!(writer.counts().coalesced, 0);
}

#[test]
fn a_429_pauses_every_start_for_its_retry_after_then_writes_the_newest() {
    let t0 = Instant::now();
    let mut writer = Writer::new(WriterConfig {
        burst: 100,
        in_flight: 10,
        ..config()
    });
    writer.submit("a", 1, Some(1), 1, t0);
    writer.submit("b", 1, None, 1, t0);
    assert_eq!(started(&mut writer, t0).len(), 2);
    let pause = Duration::from_secs(5);
    let (answers, _) = writer.completed(&"a", 1, Outcome::Throttled(Some(pause)), t0);
    // Its waiter waits on for the retry.
    assert!(answers.is_empty());
    writer.submit("c", 1, None, 1, t0);
    writer.submit("a", 2, Some(2), 1, t0);
    assert_eq!(writer.next_wake(t0), Some(t0 + pause));
    assert_eq!(started(&mut writer, t0 + Duration::from_secs(4)), []);
    // After the pause: `a`'s newest (taking the first's waiter), `c`.
    assert_eq!(started(&mut writer, t0 + pause), [("a", 2), ("c", 1)]);
    let (answers, landed) = writer.completed(&"a", 2, Outcome::Written, t0 + pause);
    assert_eq!(
        (answers, landed),
        (vec![(1, Settled::Written), (2, Settled::Written)], 2)
    );
    // A 429 that says nothing pauses for the default.
    let t1 = t0 + pause;
    writer.completed(&"c", 1, Outcome::Throttled(None), t1);
    assert_eq!(writer.next_wake(t1), Some(t1 + Duration::from_secs(1)));
    assert_eq!(
        started(&mut writer, t1 + Duration::from_secs(1)),
        [("c", 1)]
    );
    let counts = writer.counts();
    assert_eq!((counts.throttled, counts.retried), (2, 2));
}

#[test]
fn a_failed_write_is_answered_now_and_tried_again_after_a_growing_pause() {
    let t0 = Instant::now();
    let mut writer = Writer::new(WriterConfig {
        burst: 100,
        ..config()
    });
    writer.submit("a", 1, Some(7), 1, t0);
    started(&mut writer, t0);
    let (answers, _) = writer.completed(&"a", 1, Outcome::Failed("boom".into()), t0);
    assert_eq!(
        answers,
        [(
            7,
            Settled::Failed {
                gone: false,
                reason: "boom".into()
            }
        )]
    );
    assert_eq!(writer.next_wake(t0), Some(t0 + Duration::from_secs(1)));
    assert_eq!(started(&mut writer, t0), []);
    let t1 = t0 + Duration::from_secs(1);
    assert_eq!(started(&mut writer, t1), [("a", 1)]);
    writer.completed(&"a", 1, Outcome::Failed("boom".into()), t1);
    // Doubled, capped at 4 s.
    assert_eq!(writer.next_wake(t1), Some(t1 + Duration::from_secs(2)));
    let t2 = t1 + Duration::from_secs(2);
    assert_eq!(started(&mut writer, t2), [("a", 1)]);
    writer.completed(&"a", 1, Outcome::Failed("boom".into()), t2);
    let t3 = t2 + Duration::from_secs(4);
    assert_eq!(writer.next_wake(t2), Some(t3));
    assert_eq!(started(&mut writer, t3), [("a", 1)]);
    writer.completed(&"a", 1, Outcome::Failed("boom".into()), t3);
    assert_eq!(writer.next_wake(t3), Some(t3 + Duration::from_secs(4)));
    // Another object is not held up by the pausing one.
    writer.submit("b", 1, None, 1, t3);
    assert_eq!(started(&mut writer, t3), [("b", 1)]);
    assert_eq!(writer.counts().retried, 4);
}

#[test]
fn a_gone_object_drops_its_waiting_status_and_answers_its_waiters() {
    let t0 = Instant::now();
    let mut writer = Writer::new(config());
    writer.submit("a", 1, Some(1), 1, t0);
    started(&mut writer, t0);
    writer.submit("a", 2, Some(2), 1, t0);
    let (answers, landed) = writer.completed(&"a", 1, Outcome::Gone, t0);
    let gone = Settled::Failed {
        gone: true,
        reason: "the object is gone".into(),
    };
    assert_eq!((answers, landed), (vec![(1, gone.clone()), (2, gone)], 0));
    assert!(writer.is_idle());
    assert_eq!(started(&mut writer, t0 + Duration::from_secs(9)), []);
    assert_eq!(writer.counts().dropped, 2);
    // Refused for good: dropped, a newer status still goes.
    writer.submit("b", 1, Some(3), 1, t0);
    started(&mut writer, t0 + Duration::from_secs(9));
    writer.submit("b", 2, None, 1, t0);
    let (answers, _) = writer.completed(
        &"b",
        1,
        Outcome::Refused("invalid".into()),
        t0 + Duration::from_secs(9),
    );
    assert_eq!(answers.len(), 1);
    assert_eq!(
        started(&mut writer, t0 + Duration::from_secs(9)),
        [("b", 2)]
    );
}

/// The writes in flight of a random schedule, and what came of them.
#[derive(Default)]
struct Sim {
    t0: Option<Instant>,
    in_flight: usize,
    flying: Vec<(&'static str, u32)>,
    starts: u64,
    last_written: HashMap<&'static str, u32>,
    answered: HashMap<u32, u32>,
    gone: std::collections::HashSet<&'static str>,
}

impl Sim {
    fn step(&mut self, writer: &mut Writer, now: Instant, settle_all: bool, rng: &mut Rng) {
        for start in writer.poll(now) {
            assert!(
                !self.flying.iter().any(|(k, _)| *k == start.key),
                "two writes of {} in flight",
                start.key
            );
            self.flying.push((start.key, start.write));
            self.starts += 1;
        }
        assert!(self.flying.len() <= self.in_flight);
        assert_eq!(writer.in_flight(), self.flying.len());
        // Never more than the burst plus what the rate refilled.
        let since = self
            .t0
            .map_or(0.0, |t0| now.duration_since(t0).as_secs_f64());
        let allowed = 3.0 + since * 20.0;
        assert!(
            self.starts as f64 <= allowed + 1e-9,
            "{} > {allowed}",
            self.starts
        );
        if !self.flying.is_empty() && (settle_all || rng.percent(50)) {
            let (key, write) = self.flying.remove(rng.below(self.flying.len()));
            let outcome = match (settle_all, rng.below(10)) {
                (true, _) | (_, 0..=5) => Outcome::Written,
                (_, 6) => Outcome::Throttled(Some(Duration::from_millis(200))),
                (_, 7) => Outcome::Throttled(None),
                (_, 8) => Outcome::Failed("flaky".into()),
                _ => Outcome::Gone,
            };
            if outcome == Outcome::Written {
                self.last_written.insert(key, write);
            }
            if outcome == Outcome::Gone {
                self.gone.insert(key);
            }
            let (answers, _) = writer.completed(&key, write, outcome, now);
            for (ticket, _) in answers {
                *self.answered.entry(ticket).or_default() += 1;
            }
        }
    }
}

/// Random reports, outcomes and times: per object at most one write
/// in flight, never more than the cap, never more starts than the
/// bucket allows; in the end every ticket is answered exactly once and
/// each object's last write is its newest status.
#[test]
fn random_schedules_write_every_newest_status_within_the_limits() {
    const KEYS: [&str; 6] = ["a", "b", "c", "d", "e", "f"];
    for seed in 1..200u64 {
        let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
        let config = WriterConfig {
            per_second: 20.0,
            burst: 3,
            in_flight: 3,
            retry_first: Duration::from_millis(100),
            retry_max: Duration::from_millis(800),
            throttle_default: Duration::from_millis(300),
        };
        let mut writer = Writer::new(config.clone());
        let t0 = Instant::now();
        let mut now = t0;
        let mut newest: HashMap<&str, u32> = HashMap::new();
        let mut sim = Sim {
            t0: Some(t0),
            in_flight: config.in_flight,
            ..Sim::default()
        };
        let mut tickets = 0u32;
        for _ in 0..300 {
            now += Duration::from_millis(rng.below(40) as u64);
            if rng.percent(60) {
                let key = KEYS[rng.below(KEYS.len())];
                let version = newest.get(key).map_or(1, |v| v + 1);
                newest.insert(key, version);
                sim.gone.remove(key);
                let ticket = rng.percent(50).then(|| {
                    tickets += 1;
                    tickets
                });
                writer.submit(key, version, ticket, 1, now);
            }
            sim.step(&mut writer, now, false, &mut rng);
        }
        // Everything settles once writes land.
        let mut rounds = 0;
        while !writer.is_idle() {
            rounds += 1;
            assert!(rounds < 10_000, "seed {seed}: never idle");
            now = writer
                .next_wake(now)
                .unwrap_or(now + Duration::from_millis(10))
                .max(now);
            sim.step(&mut writer, now, true, &mut rng);
        }
        let (answered, last_written, gone) = (&sim.answered, &sim.last_written, &sim.gone);
        for ticket in 1..=tickets {
            assert_eq!(
                answered.get(&ticket),
                Some(&1),
                "seed {seed}: ticket {ticket}"
            );
        }
        for (key, version) in &newest {
            if !gone.contains(key) {
                assert_eq!(last_written.get(key), Some(version), "seed {seed}: {key}");
            }
        }
    }
}
