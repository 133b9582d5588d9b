//! Status writes to the desired state (pod, device and node status),
//! coalesced per object and paced, off the controller's loop.
//!
//! [`StatusWriter`] is the decision part, a state machine with no I/O and
//! the time passed in (as hub's `NodeQueue`):
//!
//! - **Coalescing.** A newer status for an object replaces the one still
//!   waiting: at most one write per object is in flight, and one waits
//!   behind it. A node reports latest-wins; only the newest matters.
//! - **Pacing.** Writes start as a token bucket allows ([`WriterConfig`]),
//!   and no more than a cap are in flight at once, whatever the number of
//!   nodes reporting.
//! - **429.** An answer `Too Many Requests` stops every start until its
//!   `Retry-After` has passed (a default where the answer carries none),
//!   and the write is tried again (its newer status, if one came).
//! - **Failures.** Another failure that may pass is tried again after a
//!   pause that doubles (capped); an object that is gone (404) drops its
//!   waiting status; a refusal that will not pass (a conflict of a
//!   conditioned write, an invalid status) is dropped.
//! - **Answers.** What waits for a write (a KubeEdge edge's report waiting
//!   for its answer) rides with it as a ticket and is handed back once the
//!   write landed or failed, never before.
//!
//! The task around it, `StatusWrites`, is in `status_writes.rs`. One
//! concern: the writer's decisions, with their deterministic and seeded
//! tests.

use std::collections::{HashMap, VecDeque};
use std::hash::Hash;
use std::time::{Duration, Instant};

use crate::desired::DesiredError;

/// How status writes are paced.
#[derive(Debug, Clone, PartialEq)]
pub struct WriterConfig {
    /// Writes started per second, on average.
    pub per_second: f64,
    /// Writes that may start at once after a quiet spell.
    pub burst: u32,
    /// Writes in flight at most.
    pub in_flight: usize,
    /// The first pause before a failed write is tried again (doubled each
    /// time, up to `retry_max`).
    pub retry_first: Duration,
    /// The longest pause between attempts of a failing write.
    pub retry_max: Duration,
    /// How long starts stop after a 429 that says nothing of when to come
    /// back.
    pub throttle_default: Duration,
}

impl Default for WriterConfig {
    /// A kubelet's own client budget (`kubeAPIQPS` 50, `kubeAPIBurst` 100
    /// since Kubernetes 1.27): cloudcore writes the status of many nodes,
    /// but the API server's priority and fairness gives each flow (the
    /// service account's, here one) a share of a priority level's seats,
    /// so more in flight buys queueing there, not throughput. 8 in flight
    /// keep a round trip's latency hidden at 50 writes/s below ~160 ms; 1
    /// s after a bare 429 is what kube-apiserver's APF filter sends as
    /// `Retry-After`.
    fn default() -> Self {
        WriterConfig {
            per_second: 50.0,
            burst: 100,
            in_flight: 8,
            retry_first: Duration::from_millis(500),
            retry_max: Duration::from_secs(30),
            throttle_default: Duration::from_secs(1),
        }
    }
}

impl WriterConfig {
    /// For a local store (the embedded one, etcd): no bucket, only a cap in
    /// flight, wide enough for the store to batch what arrives together
    /// into one transaction. Coalescing per object stays.
    pub fn unpaced() -> Self {
        WriterConfig {
            per_second: f64::INFINITY,
            burst: u32::MAX,
            in_flight: 256,
            ..WriterConfig::default()
        }
    }
}

/// What became of a write, as the writer needs to know it.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// Written.
    Written,
    /// The object is gone: its waiting status is dropped.
    Gone,
    /// 429: nothing starts until the pause (the server's `Retry-After`,
    /// else the default) has passed; the write is tried again.
    Throttled(Option<Duration>),
    /// A failure that may pass: tried again after a pause.
    Failed(String),
    /// A refusal that will not pass: dropped.
    Refused(String),
}

impl Outcome {
    /// The outcome a desired-state error means.
    pub fn of_error(err: &DesiredError) -> Outcome {
        match err {
            DesiredError::NotFound { .. } => Outcome::Gone,
            DesiredError::TooManyRequests { retry_after } => Outcome::Throttled(*retry_after),
            DesiredError::Conflict { .. }
            | DesiredError::Invalid { .. }
            | DesiredError::AlreadyExists { .. }
            | DesiredError::Unsupported(_)
            | DesiredError::Corrupt { .. } => Outcome::Refused(err.to_string()),
            DesiredError::Gone { .. } | DesiredError::Backend(_) | DesiredError::Stopped => {
                Outcome::Failed(err.to_string())
            }
        }
    }
}

/// How a write that tickets waited for ended, for their answers.
#[derive(Debug, Clone, PartialEq)]
pub enum Settled {
    /// It landed.
    Written,
    /// It did not (the object is gone, or the write failed; a write that
    /// failed is still tried again, but its waiters are answered now).
    Failed {
        /// The object is gone.
        gone: bool,
        /// Why.
        reason: String,
    },
}

/// What the writer has done.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WriterCounts {
    /// Statuses replaced by a newer one of the same object before they
    /// were written.
    pub coalesced: u64,
    /// Writes that landed.
    pub written: u64,
    /// 429 answers seen.
    pub throttled: u64,
    /// Writes tried again (after a 429 or a failure).
    pub retried: u64,
    /// Statuses dropped (their object gone, or refused for good).
    pub dropped: u64,
}

/// A write to start now.
#[derive(Debug, Clone, PartialEq)]
pub struct Start<K, W> {
    /// Whose.
    pub key: K,
    /// What.
    pub write: W,
}

/// A status waiting (or in flight), with what waits for it.
#[derive(Debug)]
struct Held<W, T> {
    write: W,
    tickets: Vec<T>,
    /// Reports it stands for (more than one once coalesced).
    reports: u64,
}

/// A write in flight: what waits for it (the caller holds the write and
/// hands it back with the outcome).
#[derive(Debug)]
struct Flying<T> {
    tickets: Vec<T>,
    reports: u64,
}

#[derive(Debug)]
struct Entry<W, T> {
    waiting: Option<Held<W, T>>,
    flying: Option<Flying<T>>,
    /// A failed write is not started again before this.
    not_before: Option<Instant>,
    /// Failed attempts in a row.
    failures: u32,
    /// Whether the key is in the ready queue.
    queued: bool,
}

/// How far below a whole token still counts as one.
const TOKEN_SLACK: f64 = 1e-9;

/// A token bucket: `per_second` tokens a second, `burst` at most.
#[derive(Debug)]
struct Bucket {
    tokens: f64,
    at: Option<Instant>,
    per_second: f64,
    burst: f64,
}

impl Bucket {
    fn refill(&mut self, now: Instant) {
        if let Some(at) = self.at
            && now > at
        {
            let gained = now.duration_since(at).as_secs_f64() * self.per_second;
            self.tokens = (self.tokens + gained).min(self.burst);
        }
        if self.at.is_none_or(|at| now > at) {
            self.at = Some(now);
        }
    }

    fn take(&mut self, now: Instant) -> bool {
        self.refill(now);
        // Within rounding of a whole token (the refill's float arithmetic
        // may land a hair below it at the very instant it is due).
        if self.tokens >= 1.0 - TOKEN_SLACK {
            self.tokens -= 1.0;
            return true;
        }
        false
    }

    /// When the next token is there.
    fn next_token(&self, now: Instant) -> Instant {
        if self.tokens >= 1.0 - TOKEN_SLACK || self.per_second <= 0.0 {
            return now;
        }
        // Rounded up to a whole microsecond: never a wake that comes
        // before the token does.
        let wait = ((1.0 - self.tokens) / self.per_second * 1e6).ceil() / 1e6;
        self.at.unwrap_or(now).max(now) + Duration::from_secs_f64(wait)
    }
}

/// The status writer's decisions: what to write when, per object `K`, of
/// writes `W`, with tickets `T` waiting for them.
#[derive(Debug)]
pub struct StatusWriter<K, W, T> {
    config: WriterConfig,
    bucket: Bucket,
    entries: HashMap<K, Entry<W, T>>,
    /// Keys with a status waiting to start, in the order they became so.
    ready: VecDeque<K>,
    in_flight: usize,
    /// No write starts before this (a 429's pause).
    throttled_until: Option<Instant>,
    counts: WriterCounts,
}

impl<K: Eq + Hash + Clone, W, T> StatusWriter<K, W, T> {
    /// A writer paced by `config`.
    pub fn new(config: WriterConfig) -> Self {
        let bucket = Bucket {
            tokens: f64::from(config.burst.max(1)),
            at: None,
            per_second: config.per_second,
            burst: f64::from(config.burst.max(1)),
        };
        StatusWriter {
            config,
            bucket,
            entries: HashMap::new(),
            ready: VecDeque::new(),
            in_flight: 0,
            throttled_until: None,
            counts: WriterCounts::default(),
        }
    }

    /// What it has done so far.
    pub fn counts(&self) -> WriterCounts {
        self.counts
    }

    /// Writes in flight.
    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// Whether nothing waits and nothing is in flight.
    pub fn is_idle(&self) -> bool {
        self.entries.is_empty()
    }

    /// Takes `write` for `key`, standing for `reports` reports of nodes,
    /// with `ticket` waiting for it: it replaces a status of `key` still
    /// waiting (whose tickets and reports are this one's now).
    pub fn submit(&mut self, key: K, write: W, ticket: Option<T>, reports: u64, now: Instant) {
        let entry = self.entries.entry(key.clone()).or_insert_with(|| Entry {
            waiting: None,
            flying: None,
            not_before: None,
            failures: 0,
            queued: false,
        });
        match &mut entry.waiting {
            Some(held) => {
                held.write = write;
                held.tickets.extend(ticket);
                held.reports += reports;
                self.counts.coalesced += 1;
            }
            None => {
                entry.waiting = Some(Held {
                    write,
                    tickets: ticket.into_iter().collect(),
                    reports,
                })
            }
        }
        if entry.flying.is_none() && !entry.queued {
            entry.queued = true;
            self.ready.push_back(key);
        }
        let _ = now;
    }

    /// `ticket` waits for the write of `key` under way (the waiting one,
    /// else the one in flight); given back if there is none (nothing to
    /// wait for: answer now).
    pub fn attach(&mut self, key: &K, ticket: T) -> Option<T> {
        let Some(entry) = self.entries.get_mut(key) else {
            return Some(ticket);
        };
        match (&mut entry.waiting, &mut entry.flying) {
            (Some(held), _) => held.tickets.push(ticket),
            (None, Some(flying)) => flying.tickets.push(ticket),
            (None, None) => return Some(ticket),
        }
        None
    }

    /// The writes to start at `now`: as many as the pacing, the cap on
    /// writes in flight and any 429 pause allow, oldest first.
    pub fn poll(&mut self, now: Instant) -> Vec<Start<K, W>> {
        let mut started = Vec::new();
        if self.throttled_until.is_some_and(|until| now < until) {
            return started;
        }
        self.throttled_until = None;
        let mut deferred = Vec::new();
        while self.in_flight < self.config.in_flight.max(1) {
            let Some(key) = self.ready.pop_front() else {
                break;
            };
            let Some(entry) = self.entries.get_mut(&key) else {
                continue;
            };
            if entry.not_before.is_some_and(|at| now < at) {
                deferred.push(key);
                continue;
            }
            if !self.bucket.take(now) {
                self.ready.push_front(key);
                break;
            }
            entry.queued = false;
            entry.not_before = None;
            let Some(held) = entry.waiting.take() else {
                continue;
            };
            self.in_flight += 1;
            entry.flying = Some(Flying {
                tickets: held.tickets,
                reports: held.reports,
            });
            started.push(Start {
                key: key.clone(),
                write: held.write,
            });
        }
        // Keys still pausing after a failure keep their place behind.
        self.ready.extend(deferred);
        started
    }

    /// When [`StatusWriter::poll`] may start something not startable at
    /// `now` (`None`: nothing waits, or only for writes in flight).
    pub fn next_wake(&self, now: Instant) -> Option<Instant> {
        if self.ready.is_empty() || self.in_flight >= self.config.in_flight.max(1) {
            return None;
        }
        if let Some(until) = self.throttled_until.filter(|until| now < *until) {
            return Some(until);
        }
        let token = self.bucket.next_token(now);
        let earliest_pause = self
            .ready
            .iter()
            .filter_map(|key| self.entries.get(key))
            .map(|entry| entry.not_before.unwrap_or(now))
            .min()?;
        Some(token.max(earliest_pause))
    }

    /// The write of `key` in flight ended with `outcome` (at `now`); the
    /// tickets whose answer it is, with that answer, and the reports that
    /// landed (when it was written).
    pub fn completed(
        &mut self,
        key: &K,
        write: W,
        outcome: Outcome,
        now: Instant,
    ) -> (Vec<(T, Settled)>, u64) {
        let Some(entry) = self.entries.get_mut(key) else {
            return (Vec::new(), 0);
        };
        let Some(flown) = entry.flying.take() else {
            return (Vec::new(), 0);
        };
        self.in_flight = self.in_flight.saturating_sub(1);
        let tickets = flown.tickets;
        let answer = |tickets: Vec<T>, settled: Settled| {
            tickets
                .into_iter()
                .map(|t| (t, settled.clone()))
                .collect::<Vec<_>>()
        };
        let (answers, landed) = match outcome {
            Outcome::Written => {
                self.counts.written += 1;
                entry.failures = 0;
                (answer(tickets, Settled::Written), flown.reports)
            }
            Outcome::Gone | Outcome::Refused(_) => {
                let (gone, reason) = match &outcome {
                    Outcome::Refused(reason) => (false, reason.clone()),
                    _ => (true, "the object is gone".to_owned()),
                };
                let mut tickets = tickets;
                self.counts.dropped += 1;
                entry.failures = 0;
                if gone && let Some(waiting) = entry.waiting.take() {
                    // Nothing to write a status to.
                    self.counts.dropped += 1;
                    tickets.extend(waiting.tickets);
                }
                (answer(tickets, Settled::Failed { gone, reason }), 0)
            }
            Outcome::Throttled(pause) => {
                self.counts.throttled += 1;
                self.counts.retried += 1;
                let pause = pause.unwrap_or(self.config.throttle_default);
                let until = now + pause;
                self.throttled_until = Some(self.throttled_until.map_or(until, |u| u.max(until)));
                // Tried again: its waiters wait on for the retry.
                Self::again(entry, write, tickets, flown.reports);
                (Vec::new(), 0)
            }
            Outcome::Failed(reason) => {
                self.counts.retried += 1;
                entry.failures = entry.failures.saturating_add(1);
                let pause = self
                    .config
                    .retry_first
                    .saturating_mul(1 << (entry.failures - 1).min(16))
                    .min(self.config.retry_max);
                entry.not_before = Some(now + pause);
                Self::again(entry, write, Vec::new(), flown.reports);
                (
                    answer(
                        tickets,
                        Settled::Failed {
                            gone: false,
                            reason,
                        },
                    ),
                    0,
                )
            }
        };
        if entry.waiting.is_some() {
            if !entry.queued {
                entry.queued = true;
                self.ready.push_back(key.clone());
            }
        } else {
            self.entries.remove(key);
        }
        (answers, landed)
    }

    /// `write` goes again, unless a newer status waits already (which then
    /// takes its tickets and reports).
    fn again(entry: &mut Entry<W, T>, write: W, tickets: Vec<T>, reports: u64) {
        match &mut entry.waiting {
            Some(newer) => {
                newer.tickets.extend(tickets);
                newer.reports += reports;
            }
            None => {
                entry.waiting = Some(Held {
                    write,
                    tickets,
                    reports,
                })
            }
        }
    }
}

#[cfg(test)]
mod tests;
