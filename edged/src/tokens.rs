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
mod tests {
    use super::*;
    use apis::tokens::TokenRequest;
    use serde_json::json;

    const HOUR: Duration = Duration::from_secs(3600);

    fn source(pod: &str, uid: &str, index: usize) -> TokenSource {
        TokenSource {
            name: apis::kinds::token_name(pod, "kube-api-access", index),
            request: TokenRequest {
                namespace: "shop".into(),
                service_account: "default".into(),
                audiences: Vec::new(),
                expiration_seconds: 3600,
                pod: (pod.into(), uid.into()),
            },
        }
    }

    fn want(pod: &str, uid: &str, index: usize) -> Want {
        Want {
            source: source(pod, uid, index),
            kept: None,
        }
    }

    fn key(pod: &str, index: usize) -> String {
        source(pod, "", index).key()
    }

    fn issued() -> Outcome {
        Outcome::Issued {
            remaining: Some(HOUR),
        }
    }

    fn book() -> TokenBook {
        TokenBook::new(TokenPolicy::default())
    }

    #[test]
    fn a_pod_about_to_start_asks_for_each_token_once() {
        let t0 = Instant::now();
        let mut book = book();
        assert!(
            book.need(
                "shop/web",
                vec![want("web", "u1", 0), want("web", "u1", 2)],
                t0
            )
            .is_empty()
        );
        assert_eq!(book.next_wake(), Some(t0));
        let asks = book.to_ask(t0);
        assert_eq!(asks.len(), 2);
        assert_eq!(
            asks[0].key,
            "shop/serviceaccounttoken/web.kube-api-access.0"
        );
        assert_eq!(asks[0].source.request.pod, ("web".into(), "u1".into()));
        // Asked: not again, however often it is looked at.
        assert!(book.to_ask(t0 + HOUR).is_empty());
        assert_eq!(book.next_wake(), None);
        // The same need again (a spec update) changes nothing.
        assert!(
            book.need(
                "shop/web",
                vec![want("web", "u1", 0), want("web", "u1", 2)],
                t0
            )
            .is_empty()
        );
        assert!(book.to_ask(t0).is_empty());
        let verdict = book.answered(&asks[0].key, asks[0].id, issued(), t0);
        assert_eq!(
            verdict,
            Verdict::Keep {
                source: source("web", "u1", 0),
                renew: t0 + Duration::from_secs(2880)
            }
        );
        assert!(book.is_held(&asks[0].key));
        assert!(!book.is_held(&asks[1].key));
        // An answer that does not say when it expires: its whole life.
        let verdict = book.answered(
            &asks[1].key,
            asks[1].id,
            Outcome::Issued { remaining: None },
            t0,
        );
        assert!(
            matches!(verdict, Verdict::Keep { renew, .. } if renew == t0 + Duration::from_secs(2880))
        );
    }

    #[test]
    fn a_token_kept_from_before_is_used_until_it_is_due() {
        let t0 = Instant::now();
        let mut book = book();
        let kept = Want {
            kept: Some(Duration::from_secs(1000)),
            ..want("web", "u1", 0)
        };
        book.need("shop/web", vec![kept], t0);
        assert!(book.is_held(&key("web", 0)));
        // Due when a fifth of its life is left: 1000 - 720 s from now.
        assert_eq!(book.next_wake(), Some(t0 + Duration::from_secs(280)));
        assert!(book.to_ask(t0 + Duration::from_secs(279)).is_empty());
        assert_eq!(book.to_ask(t0 + Duration::from_secs(280)).len(), 1);
        // One about to expire is due at once.
        let mut book = TokenBook::new(TokenPolicy::default());
        let expired = Want {
            kept: Some(Duration::ZERO),
            ..want("web", "u1", 0)
        };
        book.need("shop/web", vec![expired], t0);
        assert_eq!(book.to_ask(t0).len(), 1);
    }

    #[test]
    fn tokens_are_renewed_at_four_fifths_of_their_life() {
        let t0 = Instant::now();
        let mut book = book();
        book.need("shop/web", vec![want("web", "u1", 0)], t0);
        let ask = book.to_ask(t0).remove(0);
        book.answered(&ask.key, ask.id, issued(), t0);
        let due = t0 + Duration::from_secs(2880);
        assert_eq!(book.next_wake(), Some(due));
        assert!(book.to_ask(due - Duration::from_secs(1)).is_empty());
        let renewal = book.to_ask(due).remove(0);
        assert_eq!(renewal.key, ask.key);
        assert_ne!(renewal.id, ask.id);
        // Still held while it is renewed.
        assert!(book.is_held(&ask.key));
        // An answer to the old question counts for nothing.
        assert_eq!(
            book.answered(&ask.key, ask.id, issued(), due),
            Verdict::Stale
        );
        assert!(matches!(
            book.answered(&renewal.key, renewal.id, issued(), due),
            Verdict::Keep { .. }
        ));
        // A token whose clock says it is expired already is not asked for
        // again at once.
        let late = due + HOUR;
        let again = book.to_ask(late).remove(0);
        let verdict = book.answered(
            &again.key,
            again.id,
            Outcome::Issued {
                remaining: Some(Duration::ZERO),
            },
            late,
        );
        assert_eq!(
            verdict,
            Verdict::Keep {
                source: source("web", "u1", 0),
                renew: late + TokenPolicy::default().min_renewal
            }
        );
    }

    #[test]
    fn refusals_back_off_doubling_up_to_a_cap() {
        let t0 = Instant::now();
        let mut book = book();
        book.need("shop/web", vec![want("web", "u1", 0)], t0);
        let mut now = t0;
        let mut waits = Vec::new();
        for _ in 0..8 {
            let ask = book.to_ask(now).remove(0);
            let Verdict::Retry { at, .. } = book.answered(&ask.key, ask.id, Outcome::Failed, now)
            else {
                panic!("a refusal is retried");
            };
            assert!(book.to_ask(at - Duration::from_millis(1)).is_empty());
            waits.push((at - now).as_secs());
            now = at;
        }
        assert_eq!(waits, [1, 2, 4, 8, 16, 30, 30, 30]);
        assert!(!book.is_held(&key("web", 0)));
        // An answer at last: held, and the back-off starts over.
        let ask = book.to_ask(now).remove(0);
        assert!(matches!(
            book.answered(&ask.key, ask.id, issued(), now),
            Verdict::Keep { .. }
        ));
        let renewal = book.to_ask(now + Duration::from_secs(2880)).remove(0);
        let Verdict::Retry { at, failures } =
            book.answered(&renewal.key, renewal.id, Outcome::Failed, now)
        else {
            panic!("retried");
        };
        assert_eq!((at - now, failures), (Duration::from_secs(1), 1));
        // A renewal refused leaves the token held.
        assert!(book.is_held(&renewal.key));
    }

    #[test]
    fn a_thousand_pods_starting_ask_a_few_at_a_time() {
        let t0 = Instant::now();
        let mut book = book();
        for n in 0..1000 {
            let pod = format!("p{n}");
            book.need(
                &format!("shop/{pod}"),
                vec![want(&pod, &format!("u{n}"), 0)],
                t0,
            );
        }
        let mut asks = book.to_ask(t0);
        assert_eq!(asks.len(), 4);
        assert!(book.to_ask(t0).is_empty());
        assert_eq!(book.next_wake(), None, "nothing to do until an answer");
        let mut answered = 0;
        while let Some(ask) = asks.pop() {
            book.answered(&ask.key, ask.id, issued(), t0);
            answered += 1;
            assert!(book.in_flight() <= 4);
            asks.extend(book.to_ask(t0));
        }
        assert_eq!(answered, 1000);
        assert!((0..1000).all(|n| book.is_held(&key(&format!("p{n}"), 0))));
    }

    #[test]
    fn a_pod_waiting_for_its_token_goes_before_renewals() {
        let t0 = Instant::now();
        let mut book = TokenBook::new(TokenPolicy {
            max_in_flight: 1,
            ..TokenPolicy::default()
        });
        // Held tokens, long due.
        for n in 0..3 {
            let pod = format!("old{n}");
            let kept = Want {
                kept: Some(Duration::ZERO),
                ..want(&pod, "u", 0)
            };
            book.need(&format!("shop/{pod}"), vec![kept], t0);
        }
        // A new pod, its token due later than theirs.
        let later = t0 + Duration::from_secs(5);
        book.need("shop/new", vec![want("new", "u", 0)], later);
        let ask = book.to_ask(later).remove(0);
        assert_eq!(ask.key, key("new", 0));
        book.answered(&ask.key, ask.id, issued(), later);
        // Then the renewals, earliest first, one at a time.
        let ask = book.to_ask(later).remove(0);
        assert_eq!(ask.key, key("old0", 0));
    }

    #[test]
    fn a_pod_gone_takes_its_tokens_and_their_answers() {
        let t0 = Instant::now();
        let mut book = book();
        book.need(
            "shop/web",
            vec![want("web", "u1", 0), want("web", "u1", 1)],
            t0,
        );
        let asks = book.to_ask(t0);
        let mut gone = book.gone("shop/web");
        gone.sort();
        assert_eq!(gone, vec![key("web", 0), key("web", 1)]);
        assert!(book.is_empty());
        // Its question still takes a slot until answered; the answer is
        // not kept.
        assert_eq!(book.in_flight(), 2);
        assert_eq!(
            book.answered(&asks[0].key, asks[0].id, issued(), t0),
            Verdict::Stale
        );
        assert_eq!(book.in_flight(), 1);
        // A new pod of the same name (another uid) asks anew; the old
        // question's answer is not its token.
        book.need("shop/web", vec![want("web", "u2", 0)], t0);
        let new = book.to_ask(t0).remove(0);
        assert_eq!(new.source.request.pod.1, "u2");
        assert_eq!(
            book.answered(&asks[1].key, asks[1].id, issued(), t0),
            Verdict::Stale
        );
        assert!(!book.is_held(&new.key));
        // Replaced while asked: the new pod's token is asked for, the old
        // answer is stale, and the token it no longer needs is returned.
        let dropped = book.need("shop/web", vec![want("web", "u3", 1)], t0);
        assert_eq!(dropped, vec![key("web", 0)]);
        assert_eq!(
            book.answered(&new.key, new.id, issued(), t0),
            Verdict::Stale
        );
        assert_eq!(book.to_ask(t0)[0].source.request.pod.1, "u3");
    }

    #[test]
    fn a_token_that_could_not_be_written_is_asked_for_again() {
        let t0 = Instant::now();
        let mut book = book();
        book.need("shop/web", vec![want("web", "u1", 0)], t0);
        let ask = book.to_ask(t0).remove(0);
        book.answered(&ask.key, ask.id, issued(), t0);
        assert_eq!(
            book.not_kept(&ask.key, ask.id, t0),
            Some(t0 + Duration::from_secs(1))
        );
        assert!(!book.is_held(&ask.key));
        // Said twice, or of another question: nothing.
        assert_eq!(book.not_kept(&ask.key, ask.id, t0), None);
        let again = book.to_ask(t0 + Duration::from_secs(1)).remove(0);
        assert_eq!(again.key, ask.key);
    }

    #[test]
    fn wants_find_the_token_kept_for_the_pod() {
        let pod = json!({
            "metadata": {"name": "web", "namespace": "shop", "uid": "u1"},
            "spec": {"volumes": [{"name": "kube-api-access", "projected": {"sources": [
                {"serviceAccountToken": {"path": "token", "expirationSeconds": 3600}},
            ]}}]},
        });
        let now: jiff::Timestamp = "2030-01-01T00:00:00Z".parse().expect("time");
        let as_json = |object| serde_json::to_value(object).expect("json");
        let held = as_json(source("web", "u1", 0).object(TokenRequestStatus {
            token: "a.b.c".into(),
            expiration_timestamp: "2030-01-01T00:10:00Z".into(),
        }));
        let other = as_json(source("web", "u0", 0).object(TokenRequestStatus {
            token: "x.y.z".into(),
            expiration_timestamp: String::new(),
        }));
        let found = wants(&pod, |_| Some(&held), now);
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].source, source("web", "u1", 0));
        assert_eq!(found[0].kept, Some(Duration::from_secs(600)));
        assert_eq!(wants(&pod, |_| Some(&other), now)[0].kept, None);
        assert_eq!(wants(&pod, |_| None, now)[0].kept, None);
        // Past its expiry: kept, due at once.
        let later: jiff::Timestamp = "2030-01-02T00:00:00Z".parse().expect("time");
        assert_eq!(
            wants(&pod, |_| Some(&held), later)[0].kept,
            Some(Duration::ZERO)
        );
    }

    // ----- a random walk -----

    /// xorshift64: randomness reproducible from a seed.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            let mut x = self.0;
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            self.0 = x;
            x
        }

        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
    }

    /// A question out, answered at `at`.
    struct Pending {
        ask: Ask,
        at: Instant,
    }

    /// Pods coming, changing and going, the cloud up and down and
    /// sometimes refusing, questions answered late and out of order, and
    /// an edge store that keeps what the verdicts say.
    struct Sim {
        seed: u64,
        rng: Rng,
        now: Instant,
        book: TokenBook,
        /// Pods by `<ns>/<name>`: uid and how many tokens.
        pods: HashMap<String, (String, usize)>,
        /// The store: token key -> (pod uid, when it expires).
        store: HashMap<String, (String, Instant)>,
        pending: Vec<Pending>,
        cloud_up: bool,
        /// Percent of answers refused while the cloud is up.
        refusals: u64,
        next_uid: u64,
        log: Vec<String>,
    }

    impl Sim {
        fn new(seed: u64) -> Sim {
            Sim {
                seed,
                rng: Rng(seed),
                now: Instant::now(),
                book: TokenBook::new(TokenPolicy::default()),
                pods: HashMap::new(),
                store: HashMap::new(),
                pending: Vec::new(),
                cloud_up: true,
                refusals: 10,
                next_uid: 0,
                log: Vec::new(),
            }
        }

        fn fail(&self, what: &str) -> ! {
            let recent = &self.log[self.log.len().saturating_sub(200)..];
            panic!(
                "seed {:#x}: {what}\n{}\n(seed {:#x}: {what})",
                self.seed,
                recent.join("\n"),
                self.seed
            );
        }

        fn wants(&self, pod: &str) -> Vec<Want> {
            let (uid, count) = &self.pods[pod];
            let name = pod.trim_start_matches("shop/");
            (0..*count)
                .map(|index| {
                    let source = source(name, uid, index);
                    // What the store holds for this very pod, as edged
                    // finds it.
                    let kept = self
                        .store
                        .get(&source.key())
                        .filter(|(held_uid, _)| held_uid == uid)
                        .map(|(_, expires)| expires.saturating_duration_since(self.now));
                    Want { source, kept }
                })
                .collect()
        }

        fn need(&mut self, pod: &str) {
            let wants = self.wants(pod);
            for key in self.book.need(pod, wants, self.now) {
                self.store.remove(&key);
            }
        }

        fn step(&mut self) {
            let names = ["a", "b", "c", "d", "e", "f"];
            match self.rng.below(10) {
                0..=2 => {
                    // A pod arrives (perhaps replacing one of its name).
                    let name = names[self.rng.below(names.len() as u64) as usize];
                    let pod = format!("shop/{name}");
                    self.next_uid += 1;
                    let count = 1 + self.rng.below(3) as usize;
                    self.log
                        .push(format!("pod {pod} u{} x{count}", self.next_uid));
                    self.pods
                        .insert(pod.clone(), (format!("u{}", self.next_uid), count));
                    self.need(&pod);
                }
                3 => {
                    let name = names[self.rng.below(names.len() as u64) as usize];
                    let pod = format!("shop/{name}");
                    if self.pods.remove(&pod).is_some() {
                        self.log.push(format!("pod {pod} gone"));
                        for key in self.book.gone(&pod) {
                            self.store.remove(&key);
                        }
                    }
                }
                4 => {
                    // The same pod again (a spec update): nothing changes.
                    let name = names[self.rng.below(names.len() as u64) as usize];
                    let pod = format!("shop/{name}");
                    if self.pods.contains_key(&pod) {
                        let (in_flight, wake) = (self.book.in_flight(), self.book.next_wake());
                        let wants = self.wants(&pod);
                        if !self.book.need(&pod, wants, self.now).is_empty()
                            || self.book.in_flight() != in_flight
                            || self.book.next_wake() != wake
                        {
                            self.fail(&format!("the same need of {pod} changed something"));
                        }
                    }
                }
                5 if self.rng.below(4) == 0 => {
                    self.cloud_up = !self.cloud_up;
                    self.log.push(format!("cloud up: {}", self.cloud_up));
                }
                _ => {
                    let step = Duration::from_millis(self.rng.below(120_000));
                    self.advance(self.now + step);
                }
            }
            self.ask();
            self.check();
        }

        /// Moves the time to `until`, answering what is answered on the
        /// way, in the order the answers come.
        fn advance(&mut self, until: Instant) {
            loop {
                self.pending.sort_by_key(|p| p.at);
                let first = self.pending.first().map(|p| p.at);
                match (first, self.book.next_wake()) {
                    (Some(at), wake) if at <= until && wake.is_none_or(|w| at <= w) => {
                        self.now = self.now.max(at);
                        let pending = self.pending.remove(0);
                        self.answer(pending.ask);
                        // As edged does after every answer.
                        self.ask();
                    }
                    (_, Some(wake)) if wake <= until => {
                        self.now = self.now.max(wake);
                        let asks = self.book.to_ask(self.now);
                        if asks.is_empty() {
                            self.fail("woken for nothing");
                        }
                        self.take(asks);
                    }
                    _ => break,
                }
                self.check();
            }
            self.now = until;
        }

        fn ask(&mut self) {
            let asks = self.book.to_ask(self.now);
            self.take(asks);
        }

        fn take(&mut self, asks: Vec<Ask>) {
            for ask in asks {
                // Each asked only by a pod that needs it, as it needs it.
                let pod = format!("shop/{}", ask.source.request.pod.0);
                match self.pods.get(&pod) {
                    Some((uid, _)) if *uid == ask.source.request.pod.1 => {}
                    _ => self.fail(&format!("{} asked for a pod not there", ask.key)),
                }
                let delay = Duration::from_millis(self.rng.below(3000));
                self.log.push(format!("ask {} {:?}", ask.key, ask.id));
                self.pending.push(Pending {
                    ask,
                    at: self.now + delay,
                });
            }
        }

        fn answer(&mut self, ask: Ask) {
            let refused = !self.cloud_up || self.rng.below(100) < self.refusals;
            let outcome = match refused {
                true => Outcome::Failed,
                false => Outcome::Issued {
                    remaining: Some(Duration::from_secs(3600)),
                },
            };
            let verdict = self.book.answered(&ask.key, ask.id, outcome, self.now);
            self.log
                .push(format!("answer {} {:?}: {verdict:?}", ask.key, ask.id));
            match verdict {
                Verdict::Keep { source, .. } => {
                    // The token the cloud issued is bound to what was asked.
                    if source != ask.source {
                        self.fail(&format!("{} kept for another question", ask.key));
                    }
                    let pod = format!("shop/{}", source.request.pod.0);
                    match self.pods.get(&pod) {
                        Some((uid, _)) if *uid == source.request.pod.1 => {}
                        _ => self.fail(&format!("{} kept for a pod not there", ask.key)),
                    }
                    self.store.insert(
                        source.key(),
                        (source.request.pod.1.clone(), self.now + HOUR),
                    );
                }
                Verdict::Retry { at, .. } if at <= self.now => self.fail("retried at once"),
                _ => {}
            }
        }

        fn check(&self) {
            let max = self.book.policy().max_in_flight;
            if self.book.in_flight() > max || self.pending.len() > max {
                self.fail("more questions out than allowed");
            }
            if self.book.in_flight() != self.pending.len() {
                self.fail("the book lost count of its questions");
            }
            // Every token a pod needs is known, and nothing else.
            let needed: usize = self.pods.values().map(|(_, count)| count).sum();
            if self.book.len() != needed {
                self.fail(&format!(
                    "{} tokens needed, {} known",
                    needed,
                    self.book.len()
                ));
            }
            // The store holds tokens of pods that are there only (a pod
            // that replaced one of its name finds the old one's token
            // under its key until its own comes, and does not use it).
            let keys: HashSet<String> = self
                .pods
                .iter()
                .flat_map(|(pod, (_, count))| {
                    let name = pod.trim_start_matches("shop/").to_owned();
                    (0..*count).map(move |i| key(&name, i))
                })
                .collect();
            for (key, (uid, _)) in &self.store {
                if !keys.contains(key) {
                    self.fail(&format!("{key} of {uid} kept for no pod"));
                }
            }
            // A wake that is due has something to ask.
            if let Some(wake) = self.book.next_wake()
                && wake < self.now
            {
                self.fail("a due wake was missed");
            }
        }

        /// With the cloud up and no refusals, every token comes soon and
        /// is renewed before it expires, for four hours.
        fn settle(&mut self) {
            self.cloud_up = true;
            self.refusals = 0;
            self.log.push("settle".to_owned());
            let start = self.now;
            // The longest back-off, and the answers' delays, a few at a time.
            let soon = start + TokenPolicy::default().retry_max + Duration::from_secs(60);
            self.advance(soon);
            for (pod, (uid, count)) in &self.pods {
                let name = pod.trim_start_matches("shop/");
                for index in 0..*count {
                    let key = source(name, uid, index).key();
                    if self.store.get(&key).is_none_or(|(held, _)| held != uid) {
                        self.fail(&format!("{key} never came"));
                    }
                }
            }
            for _ in 0..(4 * 60) {
                let next = self.now + Duration::from_secs(60);
                self.advance(next);
                if let Some((key, _)) = self.store.iter().find(|(_, (_, at))| *at <= self.now) {
                    self.fail(&format!("{key} expired"));
                }
            }
        }
    }

    fn random_walk(seed: u64) {
        let mut sim = Sim::new(seed);
        for _ in 0..400 {
            sim.step();
        }
        sim.settle();
    }

    #[test]
    fn random_pods_outages_and_refusals_keep_every_pod_supplied_and_paced() {
        for seed in 1..=30u64 {
            random_walk(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        }
    }
}
