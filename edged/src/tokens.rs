//! Service account tokens, asked for where a kubelet asks for them: at the
//! edge, when a pod is about to start, and again when a token is due.
//!
//! [`TokenBook`] makes every decision and does no I/O (the time is passed
//! in): pods' needs in ([`TokenBook::need`], [`TokenBook::gone`]), the
//! questions to ask now out ([`TokenBook::to_ask`]), the cloud's answers
//! in ([`TokenBook::answered`]), and when to look again
//! ([`TokenBook::next_wake`]). edged's core does the I/O around it: it
//! asks the cloud through edgehub (the question a KubeEdge edge's kubelet
//! asks, [`apis::tokens::TokenRequest::query`]), writes each token through
//! metamanager as the `serviceaccounttoken` object the pod's volume reads
//! (so a restarted edge with the cloud away still mounts it), and deletes
//! it with the pod.
//!
//! - A token is asked for once its pod needs it, unless the edge holds one
//!   for that pod already; it is due again at 80 % of its life or after a
//!   day (the kubelet's rule, [`apis::tokens::renew_in`]).
//! - At most [`TokenPolicy::max_in_flight`] questions are out at once:
//!   a thousand pods starting together ask a few at a time. Tokens no pod
//!   has yet go before renewals of tokens held.
//! - A question refused or unanswered (the cloud unreachable) is asked
//!   again after a back-off that doubles up to [`TokenPolicy::retry_max`];
//!   a held token stays in use meanwhile.
//! - No pod waits for another's token: a pod whose token has not come
//!   waits in `CreateContainerConfigError`, as for a missing configmap,
//!   and starts once its token is written.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::time::{Duration, Instant};

use apis::tokens::{TokenRequestObject, TokenRequestStatus, TokenSource, renew_in};
use serde::Deserialize as _;
use serde_json::Value;

/// How tokens are asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenPolicy {
    /// Questions out at once, at most.
    pub max_in_flight: usize,
    /// The first back-off after a refusal; it doubles per refusal.
    pub retry_initial: Duration,
    /// Back-offs never exceed this.
    pub retry_max: Duration,
    /// A token is never due again sooner than this after it came (a clock
    /// far from the API server's could make a fresh token look expired).
    pub min_renewal: Duration,
    /// How long one question may take.
    pub ask_timeout: Duration,
}

impl Default for TokenPolicy {
    fn default() -> Self {
        TokenPolicy {
            max_in_flight: 4,
            retry_initial: Duration::from_secs(1),
            retry_max: Duration::from_secs(30),
            min_renewal: Duration::from_secs(10),
            ask_timeout: Duration::from_secs(30),
        }
    }
}

/// One question's identity: an answer counts only for the question still
/// awaited for its token.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AskId(u64);

/// A token a pod needs, and what the edge holds for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Want {
    /// The token.
    pub source: TokenSource,
    /// How long the token the edge holds for it still lives, if it holds
    /// one for this pod ([`TokenSource::held_in`]).
    pub kept: Option<Duration>,
}

/// A question to ask the cloud now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ask {
    /// Which question.
    pub id: AskId,
    /// The token's resource at the edge ([`TokenSource::key`]).
    pub key: String,
    /// What to ask for.
    pub source: TokenSource,
}

/// What became of a question.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// A token came, living `remaining` from now.
    Issued {
        /// How long it holds (its `expirationTimestamp` less the time;
        /// `None`: the answer does not say, so its whole life).
        remaining: Option<Duration>,
    },
    /// None came: refused, or the cloud did not answer.
    Failed,
}

/// What to do with an answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Keep the token: write it for `source`; due again at `renew`.
    Keep {
        /// The token it is.
        source: TokenSource,
        /// When it is due again.
        renew: Instant,
    },
    /// None came; asked again at `at`.
    Retry {
        /// When.
        at: Instant,
        /// Refusals in a row.
        failures: u32,
    },
    /// Nobody waits for it any more (its pod went, or was replaced).
    Stale,
}

#[derive(Debug)]
struct Entry {
    /// The pod's `<ns>/<name>`.
    pod: String,
    source: TokenSource,
    /// The edge holds a token for it (its pod can run).
    held: bool,
    /// Refusals in a row.
    failures: u32,
    /// When it is due (`None` while asked).
    due: Option<Instant>,
    /// The question out for it.
    asked: Option<AskId>,
    /// The question whose answer was kept last.
    kept_from: Option<AskId>,
}

/// Which tokens are needed, held, asked for and due (see the module's
/// documentation).
#[derive(Debug)]
pub struct TokenBook {
    policy: TokenPolicy,
    /// By token key.
    entries: HashMap<String, Entry>,
    /// Token keys by pod.
    by_pod: HashMap<String, Vec<String>>,
    /// Tokens no pod has yet, by when they are due.
    waiting: BTreeSet<(Instant, String)>,
    /// Held tokens, by when they are due.
    renewals: BTreeSet<(Instant, String)>,
    /// Questions out (also those nobody waits for any more: they still
    /// take the cloud's time).
    in_flight: HashSet<AskId>,
    next_id: u64,
}

impl TokenBook {
    /// An empty book asking as `policy` says.
    pub fn new(policy: TokenPolicy) -> TokenBook {
        TokenBook {
            policy,
            entries: HashMap::new(),
            by_pod: HashMap::new(),
            waiting: BTreeSet::new(),
            renewals: BTreeSet::new(),
            in_flight: HashSet::new(),
            next_id: 0,
        }
    }

    /// The policy it asks by.
    pub fn policy(&self) -> &TokenPolicy {
        &self.policy
    }

    /// Pod `pod` (`<ns>/<name>`) needs `wants` (all its tokens). A token
    /// it needed already, asked alike, is left as it is; a new one is due
    /// now, or when the one kept for it is. Returns the keys of the
    /// tokens the pod no longer needs (to delete).
    pub fn need(&mut self, pod: &str, wants: Vec<Want>, now: Instant) -> Vec<String> {
        let before = self.by_pod.remove(pod).unwrap_or_default();
        let mut keys = Vec::with_capacity(wants.len());
        for want in wants {
            let key = want.source.key();
            let same = self
                .entries
                .get(&key)
                .is_some_and(|entry| entry.pod == pod && entry.source == want.source);
            if !same {
                self.forget(&key);
                let (held, due) = match want.kept {
                    Some(remaining) => (
                        true,
                        now + renew_in(want.source.request.expiration_seconds, remaining),
                    ),
                    None => (false, now),
                };
                let entry = Entry {
                    pod: pod.to_owned(),
                    source: want.source,
                    held,
                    failures: 0,
                    due: None,
                    asked: None,
                    kept_from: None,
                };
                self.entries.insert(key.clone(), entry);
                self.schedule(&key, due);
            }
            keys.push(key);
        }
        let dropped: Vec<String> = before.into_iter().filter(|k| !keys.contains(k)).collect();
        for key in &dropped {
            self.forget(key);
        }
        if !keys.is_empty() {
            self.by_pod.insert(pod.to_owned(), keys);
        }
        dropped
    }

    /// Pod `pod` is gone: the keys of its tokens (to delete).
    pub fn gone(&mut self, pod: &str) -> Vec<String> {
        let keys = self.by_pod.remove(pod).unwrap_or_default();
        for key in &keys {
            self.forget(key);
        }
        keys
    }

    /// The questions to ask now: due ones, tokens no pod has before
    /// renewals, earliest first, as many as may be out.
    pub fn to_ask(&mut self, now: Instant) -> Vec<Ask> {
        let mut asks = Vec::new();
        while self.in_flight.len() < self.policy.max_in_flight {
            let next = [&self.waiting, &self.renewals]
                .into_iter()
                .find_map(|due| due.first().filter(|(at, _)| *at <= now).cloned());
            let Some((_, key)) = next else { break };
            self.unschedule(&key);
            let id = AskId(self.next_id);
            self.next_id += 1;
            let Some(entry) = self.entries.get_mut(&key) else {
                continue;
            };
            entry.asked = Some(id);
            self.in_flight.insert(id);
            asks.push(Ask {
                id,
                key,
                source: entry.source.clone(),
            });
        }
        asks
    }

    /// The answer to question `id` for token `key`.
    pub fn answered(&mut self, key: &str, id: AskId, outcome: Outcome, now: Instant) -> Verdict {
        self.in_flight.remove(&id);
        let policy = self.policy;
        let Some(entry) = self
            .entries
            .get_mut(key)
            .filter(|entry| entry.asked == Some(id))
        else {
            return Verdict::Stale;
        };
        entry.asked = None;
        match outcome {
            Outcome::Issued { remaining } => {
                entry.held = true;
                entry.failures = 0;
                entry.kept_from = Some(id);
                let seconds = entry.source.request.expiration_seconds;
                let life = Duration::from_secs(u64::try_from(seconds).unwrap_or(0));
                let wait = renew_in(seconds, remaining.unwrap_or(life)).max(policy.min_renewal);
                let source = entry.source.clone();
                self.schedule(key, now + wait);
                Verdict::Keep {
                    source,
                    renew: now + wait,
                }
            }
            Outcome::Failed => {
                let at = now + backoff(&policy, entry.failures);
                entry.failures += 1;
                let failures = entry.failures;
                self.schedule(key, at);
                Verdict::Retry { at, failures }
            }
        }
    }

    /// The token that question `id` brought for `key` could not be
    /// written: it is not held, and asked again after a back-off. Returns
    /// when, unless nobody waits for it any more.
    pub fn not_kept(&mut self, key: &str, id: AskId, now: Instant) -> Option<Instant> {
        let policy = self.policy;
        let entry = self
            .entries
            .get_mut(key)
            .filter(|entry| entry.kept_from == Some(id) && entry.asked.is_none())?;
        entry.held = false;
        entry.kept_from = None;
        let at = now + backoff(&policy, entry.failures);
        entry.failures += 1;
        self.schedule(key, at);
        Some(at)
    }

    /// When to call [`TokenBook::to_ask`] next, unless an answer comes
    /// first (`None`: only an answer or a new need changes anything).
    pub fn next_wake(&self) -> Option<Instant> {
        if self.in_flight.len() >= self.policy.max_in_flight {
            return None;
        }
        let first = |due: &BTreeSet<(Instant, String)>| due.first().map(|(at, _)| *at);
        match (first(&self.waiting), first(&self.renewals)) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Questions out now.
    pub fn in_flight(&self) -> usize {
        self.in_flight.len()
    }

    /// Whether the edge holds a token for `key` (as far as the book knows).
    pub fn is_held(&self, key: &str) -> bool {
        self.entries.get(key).is_some_and(|entry| entry.held)
    }

    /// When `key` is due (`None`: unknown, or asked now).
    pub fn due(&self, key: &str) -> Option<Instant> {
        self.entries.get(key).and_then(|entry| entry.due)
    }

    /// Tokens needed.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    fn schedule(&mut self, key: &str, at: Instant) {
        self.unschedule(key);
        let Some(entry) = self.entries.get_mut(key) else {
            return;
        };
        entry.due = Some(at);
        let due = match entry.held {
            true => &mut self.renewals,
            false => &mut self.waiting,
        };
        due.insert((at, key.to_owned()));
    }

    fn unschedule(&mut self, key: &str) {
        if let Some(at) = self.entries.get_mut(key).and_then(|entry| entry.due.take()) {
            let item = (at, key.to_owned());
            self.waiting.remove(&item);
            self.renewals.remove(&item);
        }
    }

    fn forget(&mut self, key: &str) {
        self.unschedule(key);
        if let Some(entry) = self.entries.remove(key)
            && let Some(keys) = self.by_pod.get_mut(&entry.pod)
        {
            keys.retain(|k| k != key);
        }
    }
}

/// The back-off after `failures` refusals in a row.
fn backoff(policy: &TokenPolicy, failures: u32) -> Duration {
    policy
        .retry_initial
        .saturating_mul(2u32.saturating_pow(failures.min(20)))
        .min(policy.retry_max)
}

/// How long a token whose status is `status` still lives at `now`, from
/// its `expirationTimestamp` (zero once past); `None` if it says none.
pub fn remaining(status: &TokenRequestStatus, now: jiff::Timestamp) -> Option<Duration> {
    let expires: jiff::Timestamp = status.expiration_timestamp.parse().ok()?;
    let seconds = expires.as_second().saturating_sub(now.as_second());
    Some(Duration::from_secs(u64::try_from(seconds).unwrap_or(0)))
}

/// What pod `pod` (as JSON) needs, with the tokens `held` finds for it
/// (the `serviceaccounttoken` objects the edge holds, by key) and how long
/// each still lives at `now`.
pub fn wants<'a>(
    pod: &Value,
    held: impl Fn(&str) -> Option<&'a Value>,
    now: jiff::Timestamp,
) -> Vec<Want> {
    apis::tokens::sources(pod)
        .into_iter()
        .map(|source| {
            let kept = held(&source.key())
                .and_then(|object| TokenRequestObject::deserialize(object).ok())
                .filter(|object| source.held_in(object))
                .map(|object| {
                    let status = object.status.unwrap_or_default();
                    remaining(&status, now).unwrap_or(Duration::ZERO)
                });
            Want { source, kept }
        })
        .collect()
}

#[cfg(test)]
mod tests;
