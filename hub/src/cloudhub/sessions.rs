//! cloudhub's session rules as plain state machines, with time passed in
//! and no I/O: which link is a node's current one ([`SessionBook`]), when
//! a silent link is closed and when the cloud speaks first on it
//! ([`Liveness`]), and what becomes of a message a node sends
//! ([`upstream`]). The hub and session actors (`mod.rs`, `lifecycle.rs`,
//! `session.rs`) carry out what these return: they close the links handed
//! back, send the keepalives, route the messages.
//!
//! A link's sender is a type parameter, so the tests hand in plain tokens
//! and check that every link given to the book comes back exactly once, to
//! be closed or still current.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use beehive::Message as HiveMessage;
use beehive::constants::{group, operation};

use crate::dialect::Dialect;
use crate::protocol::{self, Kind};

/// One node's live link, as the hub keeps it.
#[derive(Debug)]
pub(crate) struct Session<S> {
    /// Its id: later links have larger ids.
    pub(crate) id: u64,
    /// Where messages for the node go.
    pub(crate) sender: S,
    /// The dialect the link speaks.
    pub(crate) dialect: Dialect,
    /// The generation of this session's claim on the node (replicas).
    pub(crate) claim: Option<u64>,
    /// Nothing is sent from the queue until what it held at the start was
    /// recorded as unsure (see [`crate::AckSink::recorded`]).
    pub(crate) held_back: bool,
    /// When the node's certificate was issued (a link without one: none).
    pub(crate) certificate_issued: Option<u64>,
    /// Being closed: its certificate was revoked.
    pub(crate) closing: bool,
}

impl<S> Session<S> {
    /// A session that is not held back nor closing.
    pub(crate) fn new(
        id: u64,
        sender: S,
        dialect: Dialect,
        claim: Option<u64>,
        certificate_issued: Option<u64>,
    ) -> Session<S> {
        Session {
            id,
            sender,
            dialect,
            claim,
            held_back: false,
            certificate_issued,
            closing: false,
        }
    }
}

/// What [`SessionBook::open`] made of a new link.
#[derive(Debug, PartialEq)]
pub(crate) enum Opened<S> {
    /// It is the node's link now; `replaced` is the link it took over
    /// from (a reconnect while the old one lingers), to be closed.
    Current {
        /// The older link, if there was one.
        replaced: Option<S>,
    },
    /// It is not taken, and is to be closed.
    Refused {
        /// The new link.
        sender: S,
        /// Why.
        why: NotOpened,
    },
}

/// Why a new link was not taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NotOpened {
    /// The claim it was opened under ended before it reached the hub:
    /// another replica may serve the node already.
    ClaimGone,
    /// A newer link of the node is current already (this one reported
    /// late).
    Superseded,
}

/// Which link is each node's current one, and since when each node
/// without one has been gone.
#[derive(Debug)]
pub(crate) struct SessionBook<S> {
    sessions: HashMap<String, Session<S>>,
    gone_since: HashMap<String, Instant>,
    last_id: u64,
}

impl<S> Default for SessionBook<S> {
    fn default() -> Self {
        SessionBook {
            sessions: HashMap::new(),
            gone_since: HashMap::new(),
            last_id: 0,
        }
    }
}

impl<S> SessionBook<S> {
    /// A fresh session id, larger than every one before.
    pub(crate) fn new_id(&mut self) -> u64 {
        self.last_id += 1;
        self.last_id
    }

    /// A new link of `node` reached the hub; `claim_held`: whether this
    /// replica still holds the node (always, without replicas).
    pub(crate) fn open(&mut self, node: &str, session: Session<S>, claim_held: bool) -> Opened<S> {
        if !claim_held {
            return Opened::Refused {
                sender: session.sender,
                why: NotOpened::ClaimGone,
            };
        }
        if self
            .sessions
            .get(node)
            .is_some_and(|current| current.id > session.id)
        {
            return Opened::Refused {
                sender: session.sender,
                why: NotOpened::Superseded,
            };
        }
        self.gone_since.remove(node);
        let replaced = self
            .sessions
            .insert(node.to_owned(), session)
            .map(|old| old.sender);
        Opened::Current { replaced }
    }

    /// Holds `node`'s queue back while what it held at the start is
    /// recorded.
    pub(crate) fn hold_back(&mut self, node: &str) {
        if let Some(session) = self.sessions.get_mut(node) {
            session.held_back = true;
        }
    }

    /// What session `id`'s queue held at its start is recorded: whether
    /// that session is still current (its queue may go now).
    pub(crate) fn recorded(&mut self, node: &str, id: u64) -> bool {
        match self.sessions.get_mut(node).filter(|s| s.id == id) {
            Some(session) => {
                session.held_back = false;
                true
            }
            None => false,
        }
    }

    /// Session `id` of `node` ended: it, if it was the current one (a
    /// late word from a replaced link changes nothing).
    pub(crate) fn close(&mut self, node: &str, id: u64, now: Instant) -> Option<Session<S>> {
        if self.sessions.get(node).is_none_or(|s| s.id != id) {
            return None;
        }
        self.gone_since.insert(node.to_owned(), now);
        self.sessions.remove(node)
    }

    /// This replica lost claim `generation` on `node`: the session opened
    /// under it, to be closed (one opened under a newer claim stays).
    pub(crate) fn claim_lost(
        &mut self,
        node: &str,
        generation: u64,
        now: Instant,
    ) -> Option<Session<S>> {
        if self
            .sessions
            .get(node)
            .is_none_or(|s| s.claim != Some(generation))
        {
            return None;
        }
        self.gone_since.insert(node.to_owned(), now);
        self.sessions.remove(node)
    }

    /// Something was queued for `node`, which has no link: it counts as
    /// gone from now, unless it was gone already.
    pub(crate) fn absent(&mut self, node: &str, now: Instant) {
        if !self.sessions.contains_key(node) {
            self.gone_since.entry(node.to_owned()).or_insert(now);
        }
    }

    /// The nodes gone at least `after` by `now`, forgotten here (their
    /// queues may leave memory).
    pub(crate) fn gone_longer_than(&mut self, after: Duration, now: Instant) -> Vec<String> {
        let gone: Vec<String> = self
            .gone_since
            .iter()
            .filter(|(_, since)| now.saturating_duration_since(**since) >= after)
            .map(|(node, _)| node.clone())
            .collect();
        for node in &gone {
            self.gone_since.remove(node);
        }
        gone
    }

    /// Marks closing, and hands back, the links whose node's certificate
    /// `revoked(node, issued)` says was revoked since they connected.
    pub(crate) fn revoked(&mut self, revoked: impl Fn(&str, u64) -> bool) -> Vec<(String, &S)> {
        self.sessions
            .iter_mut()
            .filter(|(_, s)| !s.closing)
            .filter_map(|(node, s)| {
                let issued = s.certificate_issued?;
                revoked(node, issued).then(|| {
                    s.closing = true;
                    (node.clone(), &s.sender)
                })
            })
            .collect()
    }

    /// Whether some link has a certificate that may yet be revoked.
    pub(crate) fn any_revocable(&self) -> bool {
        self.sessions
            .values()
            .any(|s| !s.closing && s.certificate_issued.is_some())
    }

    /// `node`'s current session.
    pub(crate) fn get(&self, node: &str) -> Option<&Session<S>> {
        self.sessions.get(node)
    }

    /// `node`'s current session, if its queue may go.
    pub(crate) fn ready(&self, node: &str) -> Option<&Session<S>> {
        self.get(node).filter(|s| !s.held_back)
    }

    /// Whether `node` has a link.
    pub(crate) fn linked(&self, node: &str) -> bool {
        self.sessions.contains_key(node)
    }

    /// How many nodes have a link.
    pub(crate) fn len(&self) -> usize {
        self.sessions.len()
    }

    /// Every node's current session.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&String, &Session<S>)> {
        self.sessions.iter()
    }

    /// Every link, the book emptied (cloudhub stops).
    pub(crate) fn drain(&mut self) -> Vec<S> {
        self.sessions.drain().map(|(_, s)| s.sender).collect()
    }

    /// Whether `node` counts as gone (tests).
    #[cfg(test)]
    fn gone(&self, node: &str) -> bool {
        self.gone_since.contains_key(node)
    }
}

/// What a session's check of its link says to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Beat {
    /// The node was silent too long: close its link.
    Silent,
    /// Send the node a keepalive now.
    SpeakFirst,
    /// Nothing.
    Quiet,
}

/// When a link is silent too long, and when the cloud sends a keepalive on
/// it (the native dialect: its edges wait for the cloud's first word;
/// KubeEdge's edges speak first and the cloud only listens).
#[derive(Debug, Clone)]
pub(crate) struct Liveness {
    keepalive: Duration,
    cloud_speaks: bool,
    last_heard: Instant,
    last_spoken: Instant,
}

impl Liveness {
    /// A link opened at `now`, with keepalives every `keepalive`.
    pub(crate) fn new(keepalive: Duration, dialect: Dialect, now: Instant) -> Liveness {
        Liveness {
            keepalive,
            cloud_speaks: dialect.cloud_keeps_alive(),
            last_heard: now,
            last_spoken: now,
        }
    }

    /// How often to [`Liveness::check`]: four times an interval, so a
    /// link silent for 1.75 intervals is closed within two.
    pub(crate) fn period(&self) -> Duration {
        self.keepalive / 4
    }

    /// The node said something at `now`.
    pub(crate) fn heard(&mut self, now: Instant) {
        self.last_heard = now;
    }

    /// What to do at `now`; a [`Beat::SpeakFirst`] counts as spoken.
    pub(crate) fn check(&mut self, now: Instant) -> Beat {
        if now.saturating_duration_since(self.last_heard) > self.keepalive * 7 / 4 {
            return Beat::Silent;
        }
        if self.cloud_speaks && now.saturating_duration_since(self.last_spoken) >= self.keepalive {
            self.last_spoken = now;
            return Beat::SpeakFirst;
        }
        Beat::Quiet
    }
}

/// What becomes of a message a node sent.
#[derive(Debug)]
pub(crate) enum Upstream {
    /// A keepalive (the link is alive; nothing else).
    Keepalive,
    /// The node acknowledged an object.
    Ack(beehive::Uuid),
    /// A second hello: ignored.
    SecondHello,
    /// A KubeEdge edge reports a failure: KubeEdge's cloud only logs it.
    ReportedError(HiveMessage),
    /// The answer to a request a cloud module waits for.
    Answer(HiveMessage),
    /// For the cloud modules of its group.
    ToGroup(HiveMessage),
    /// Refused: it speaks for another node, names nothing, or is for the
    /// hub's own group.
    Refused(String),
}

/// What becomes of `msg` from `node` on a link speaking `dialect`;
/// `is_answer` says whether a cloud module waits for it as an answer.
pub(crate) fn upstream(
    node: &str,
    dialect: Dialect,
    msg: HiveMessage,
    is_answer: impl Fn(&HiveMessage) -> bool,
) -> Upstream {
    match dialect.kind(&msg) {
        Kind::Keepalive => Upstream::Keepalive,
        Kind::Ack(id) => Upstream::Ack(id),
        Kind::Hello => Upstream::SecondHello,
        Kind::Payload if dialect == Dialect::KubeEdge && msg.operation() == operation::ERROR => {
            Upstream::ReportedError(msg)
        }
        Kind::Payload => match protocol::to_cloud(node, msg).map(|m| dialect.to_cloud_modules(m)) {
            Ok(msg) if is_answer(&msg) => Upstream::Answer(msg),
            // The hub's own groups are the cloud's to speak in.
            Ok(msg) if msg.group() == group::HUB => {
                Upstream::Refused(format!("message to the reserved group {}", msg.group()))
            }
            Ok(msg) => Upstream::ToGroup(msg),
            Err(refusal) => Upstream::Refused(refusal.to_string()),
        },
    }
}

#[cfg(test)]
mod tests;
