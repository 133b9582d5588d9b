//! Tests of the parent module (`tokens.rs`).

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
