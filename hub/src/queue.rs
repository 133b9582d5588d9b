//! The per-node downstream queue: a plain state machine with no I/O.
//!
//! Every object for a node is kept until the node acknowledges it. Only the
//! newest version of an object matters: a newer version replaces an older
//! one that has not been sent, and one that is in flight is followed by the
//! newest once its ack arrives. At most one version of an object is in
//! flight at a time (so the edge never sees versions out of order), and up
//! to `window` objects are in flight together (not stop-and-wait). When the
//! link drops, everything in flight is sent again on the next link.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use beehive::{Message, Uuid};

/// What [`NodeQueue::push`] did with a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PushOutcome {
    /// A new object, queued.
    Queued,
    /// Replaced an older version of the same object.
    Coalesced,
    /// Older than the version already held: ignored.
    Stale,
    /// The node holds `max_objects` objects already: refused.
    Full,
}

/// What an ack settled.
#[derive(Debug, Clone, PartialEq)]
pub enum AckOutcome {
    /// The object's newest version is delivered; it left the queue.
    Delivered {
        /// The object.
        resource: String,
        /// What the delivered message did to it (`insert`, `delete`, ...).
        operation: String,
        /// The delivered message's resource version.
        version: String,
    },
    /// An older version was delivered; the newest is queued to follow.
    Superseded {
        /// The object.
        resource: String,
        /// What the delivered message did to it.
        operation: String,
        /// The delivered message's resource version.
        version: String,
        /// Whether the newest, still to follow, deletes the object.
        deletion_follows: bool,
    },
    /// No message with that id is in flight (a duplicate or late ack).
    Unknown,
}

#[derive(Debug)]
struct Entry {
    newest: Message,
    /// Id of the version on the wire, if one is.
    in_flight: Option<Uuid>,
    /// The operation and resource version of the message on the wire.
    on_wire: (String, String),
    /// Whether the resource sits in the pending list.
    queued: bool,
    /// When the version in flight was sent (kept only with resends on).
    sent_at: Option<Instant>,
    /// How often this object was sent again for want of an ack; each
    /// time the next resend waits twice as long.
    resends: u32,
}

/// Objects waiting for one node's acknowledgement.
#[derive(Debug)]
pub struct NodeQueue {
    window: usize,
    max_objects: usize,
    entries: HashMap<String, Entry>,
    /// Resources to send, oldest first.
    pending: VecDeque<String>,
    /// Message id on the wire -> resource.
    in_flight: HashMap<Uuid, String>,
    /// An object unacknowledged this long is sent again (for peers that
    /// may drop what they received), then after twice, four and eight
    /// times as long; none waits for the link to drop.
    resend_after: Option<Duration>,
}

/// Whether version `a` is older than `b`. Kubernetes resource versions are
/// opaque strings, numeric in practice: compared as numbers when both are,
/// otherwise the later arrival counts as newer.
pub fn is_older(a: &str, b: &str) -> bool {
    match (a.parse::<u64>(), b.parse::<u64>()) {
        (Ok(a), Ok(b)) => a < b,
        _ => false,
    }
}

impl NodeQueue {
    /// A queue with up to `window` objects in flight and at most
    /// `max_objects` objects held.
    pub fn new(window: usize, max_objects: usize) -> Self {
        NodeQueue {
            window: window.max(1),
            max_objects: max_objects.max(1),
            entries: HashMap::new(),
            pending: VecDeque::new(),
            in_flight: HashMap::new(),
            resend_after: None,
        }
    }

    /// Sends an object again when unacknowledged for `after` (`None`: only
    /// after the link drops).
    pub fn set_resend_after(&mut self, after: Option<Duration>) {
        self.resend_after = after;
    }

    /// Puts what waited too long for its ack back in front of the queue,
    /// the longest waiting first; returns how many. The caller calls this
    /// only while the link has sent everything it was given, so the wait
    /// is the peer's, not the link's.
    pub fn resend_overdue(&mut self, now: Instant) -> usize {
        let Some(after) = self.resend_after else {
            return 0;
        };
        let mut overdue: Vec<(Instant, Uuid)> = self
            .in_flight
            .iter()
            .filter_map(|(id, resource)| {
                let entry = self.entries.get(resource)?;
                let sent_at = entry.sent_at?;
                let wait = after.saturating_mul(1 << entry.resends.min(3));
                (now.saturating_duration_since(sent_at) >= wait).then_some((sent_at, *id))
            })
            .collect();
        overdue.sort();
        for (_, id) in overdue.iter().rev() {
            if let Some(entry) = self
                .in_flight
                .get(id)
                .and_then(|resource| self.entries.get_mut(resource))
            {
                entry.resends = entry.resends.saturating_add(1);
            }
            self.requeue(*id);
        }
        overdue.len()
    }

    /// Changes how many objects may be in flight (from the next batch on).
    pub fn set_window(&mut self, window: usize) {
        self.window = window.max(1);
    }

    /// Adds an object (keyed by its resource string) for the node.
    pub fn push(&mut self, msg: Message) -> PushOutcome {
        let held = self.entries.len();
        match self.entries.get_mut(msg.resource()) {
            Some(entry) => {
                if is_older(msg.resource_version(), entry.newest.resource_version()) {
                    return PushOutcome::Stale;
                }
                entry.newest = msg;
                if entry.in_flight.is_none() && !entry.queued {
                    entry.queued = true;
                    self.pending.push_back(entry.newest.resource().to_owned());
                }
                PushOutcome::Coalesced
            }
            None if held >= self.max_objects => PushOutcome::Full,
            None => {
                let resource = msg.resource().to_owned();
                self.pending.push_back(resource.clone());
                self.entries.insert(
                    resource,
                    Entry {
                        newest: msg,
                        in_flight: None,
                        on_wire: (String::new(), String::new()),
                        queued: true,
                        sent_at: None,
                        resends: 0,
                    },
                );
                PushOutcome::Queued
            }
        }
    }

    /// The messages to put on the wire now, filling the window.
    pub fn next_batch(&mut self) -> Vec<Message> {
        let mut batch = Vec::new();
        while self.in_flight.len() < self.window {
            let Some(resource) = self.pending.pop_front() else {
                break;
            };
            let Some(entry) = self.entries.get_mut(&resource) else {
                continue;
            };
            entry.queued = false;
            if entry.in_flight.is_some() {
                // Its ack will queue it again.
                continue;
            }
            let id = entry.newest.id();
            entry.in_flight = Some(id);
            entry.on_wire = (
                entry.newest.operation().to_owned(),
                entry.newest.resource_version().to_owned(),
            );
            self.in_flight.insert(id, resource);
            entry.sent_at = self.resend_after.map(|_| Instant::now());
            batch.push(entry.newest.clone());
        }
        batch
    }

    /// Settles the message `id` that the node acknowledged.
    pub fn ack(&mut self, id: Uuid) -> AckOutcome {
        let Some(resource) = self.in_flight.remove(&id) else {
            return AckOutcome::Unknown;
        };
        let Some(entry) = self.entries.get_mut(&resource) else {
            return AckOutcome::Unknown;
        };
        entry.in_flight = None;
        entry.sent_at = None;
        entry.resends = 0;
        let (operation, version) = std::mem::take(&mut entry.on_wire);
        if entry.newest.id() == id {
            self.entries.remove(&resource);
            AckOutcome::Delivered {
                resource,
                operation,
                version,
            }
        } else {
            if !entry.queued {
                entry.queued = true;
                self.pending.push_back(resource.clone());
            }
            let deletion_follows =
                entry.newest.operation() == beehive::constants::operation::DELETE;
            AckOutcome::Superseded {
                resource,
                operation,
                version,
                deletion_follows,
            }
        }
    }

    /// Takes message `id` back off the wire before it was sent (the
    /// transport had no room): it goes out first next time.
    pub fn requeue(&mut self, id: Uuid) {
        let Some(resource) = self.in_flight.remove(&id) else {
            return;
        };
        if let Some(entry) = self.entries.get_mut(&resource) {
            entry.in_flight = None;
            entry.sent_at = None;
            if !entry.queued {
                entry.queued = true;
                self.pending.push_front(resource);
            }
        }
    }

    /// The link is gone: everything in flight goes out again, first, on the
    /// next link, in the order it was first sent.
    pub fn link_lost(&mut self) {
        let mut resend: Vec<(Uuid, String)> = self.in_flight.drain().collect();
        // Message ids are random; keep the pending order stable instead.
        resend.sort_by(|a, b| a.1.cmp(&b.1));
        for (_, resource) in resend.into_iter().rev() {
            if let Some(entry) = self.entries.get_mut(&resource) {
                entry.in_flight = None;
                entry.sent_at = None;
                if !entry.queued {
                    entry.queued = true;
                    self.pending.push_front(resource);
                }
            }
        }
    }

    /// Objects not yet acknowledged (queued or in flight).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether every object is acknowledged.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Messages on the wire awaiting their ack.
    pub fn in_flight(&self) -> usize {
        self.in_flight.len()
    }

    /// The newest version held of every object, for persisting or inspection.
    pub fn objects(&self) -> impl Iterator<Item = &Message> {
        self.entries.values().map(|e| &e.newest)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn object(name: &str, version: u64) -> Message {
        Message::new()
            .build_router(
                "edgecontroller",
                "resource",
                format!("node/n1/default/pod/{name}"),
                "update",
            )
            .with_resource_version(version.to_string())
    }

    fn names(batch: &[Message]) -> Vec<(String, String)> {
        batch
            .iter()
            .map(|m| {
                let name = m
                    .resource()
                    .rsplit('/')
                    .next()
                    .unwrap_or_default()
                    .to_owned();
                (name, m.resource_version().to_owned())
            })
            .collect()
    }

    #[test]
    fn what_waits_too_long_for_its_ack_goes_again_first() {
        let mut q = NodeQueue::new(8, 100);
        q.set_resend_after(Some(Duration::from_secs(10)));
        for name in ["a", "b", "c"] {
            q.push(object(name, 1));
        }
        let sent = q.next_batch();
        assert_eq!(sent.len(), 3);
        q.ack(sent[1].id());
        q.push(object("d", 1));
        let now = Instant::now();
        assert_eq!(q.resend_overdue(now), 0, "not yet due");
        assert_eq!(q.resend_overdue(now + Duration::from_secs(11)), 2);
        let again = q.next_batch();
        let names: Vec<&str> = again.iter().map(|m| m.resource()).collect();
        assert_eq!(
            names,
            [
                "node/n1/default/pod/a",
                "node/n1/default/pod/c",
                "node/n1/default/pod/d"
            ]
        );
        // The same versions, so an ack of either send settles them.
        assert_eq!(again[0].id(), sent[0].id());
        assert!(matches!(q.ack(sent[0].id()), AckOutcome::Delivered { .. }));
        // A second resend of c waits twice as long; d (sent once) is due.
        let later = Instant::now() + Duration::from_secs(11);
        assert_eq!(q.resend_overdue(later), 1, "only d");
        assert_eq!(
            q.resend_overdue(later + Duration::from_secs(10)),
            1,
            "then c"
        );
        // Taken back unsent (no room on the link), nothing is due.
        let mut full = NodeQueue::new(8, 100);
        full.set_resend_after(Some(Duration::from_secs(10)));
        full.push(object("a", 1));
        let batch = full.next_batch();
        full.requeue(batch[0].id());
        assert_eq!(full.resend_overdue(later + Duration::from_secs(3600)), 0);
        let mut plain = NodeQueue::new(8, 100);
        plain.push(object("a", 1));
        plain.next_batch();
        assert_eq!(plain.resend_overdue(now + Duration::from_secs(3600)), 0);
    }

    #[test]
    fn a_narrower_window_holds_back_the_rest() {
        let mut q = NodeQueue::new(8, 100);
        for i in 0..8 {
            q.push(object(&format!("p{i}"), 1));
        }
        q.set_window(3);
        assert_eq!(q.next_batch().len(), 3);
        assert!(q.next_batch().is_empty(), "window full");
        q.set_window(5);
        assert_eq!(q.next_batch().len(), 2);
    }

    #[test]
    fn fills_the_window_and_no_more() {
        let mut q = NodeQueue::new(3, 100);
        for n in 0..5 {
            assert_eq!(q.push(object(&format!("p{n}"), 1)), PushOutcome::Queued);
        }
        let first = q.next_batch();
        assert_eq!(first.len(), 3);
        assert!(q.next_batch().is_empty(), "window full");
        assert!(matches!(q.ack(first[0].id()), AckOutcome::Delivered { .. }));
        assert_eq!(names(&q.next_batch()), [("p3".into(), "1".into())]);
        assert_eq!(q.len(), 4);
    }

    #[test]
    fn newer_versions_replace_unsent_ones() {
        let mut q = NodeQueue::new(10, 100);
        q.push(object("a", 1));
        assert_eq!(q.push(object("a", 2)), PushOutcome::Coalesced);
        assert_eq!(q.push(object("a", 3)), PushOutcome::Coalesced);
        assert_eq!(q.push(object("a", 2)), PushOutcome::Stale);
        assert_eq!(names(&q.next_batch()), [("a".into(), "3".into())]);
    }

    #[test]
    fn one_version_in_flight_then_the_newest_follows() {
        let mut q = NodeQueue::new(10, 100);
        q.push(object("a", 1));
        let v1 = q.next_batch();
        q.push(object("a", 2));
        q.push(object("a", 3));
        assert!(q.next_batch().is_empty(), "v1 still in flight");
        assert!(matches!(q.ack(v1[0].id()), AckOutcome::Superseded { .. }));
        let v3 = q.next_batch();
        assert_eq!(names(&v3), [("a".into(), "3".into())]);
        assert!(matches!(q.ack(v3[0].id()), AckOutcome::Delivered { .. }));
        assert!(q.is_empty());
    }

    #[test]
    fn duplicate_and_unknown_acks_change_nothing() {
        let mut q = NodeQueue::new(10, 100);
        q.push(object("a", 1));
        let sent = q.next_batch();
        assert!(matches!(q.ack(sent[0].id()), AckOutcome::Delivered { .. }));
        assert_eq!(q.ack(sent[0].id()), AckOutcome::Unknown);
        assert_eq!(q.ack(Uuid::new_v4()), AckOutcome::Unknown);
        assert!(q.is_empty());
    }

    #[test]
    fn a_lost_link_resends_what_was_in_flight_first() {
        let mut q = NodeQueue::new(2, 100);
        for name in ["a", "b", "c"] {
            q.push(object(name, 1));
        }
        let sent = q.next_batch();
        assert_eq!(sent.len(), 2);
        q.link_lost();
        assert_eq!(q.in_flight(), 0);
        let again = q.next_batch();
        let mut resent = names(&again);
        resent.sort();
        assert_eq!(resent, [("a".into(), "1".into()), ("b".into(), "1".into())]);
        // The newest version goes out if it changed while the link was down.
        q.link_lost();
        q.push(object("a", 5));
        let newest = q.next_batch();
        assert!(names(&newest).contains(&("a".into(), "5".into())));
    }

    #[test]
    fn an_ack_names_the_version_and_operation_it_settles() {
        let mut q = NodeQueue::new(10, 100);
        q.push(object("a", 1));
        let v1 = q.next_batch();
        let mut deletion = object("a", 2);
        deletion.router.operation = beehive::SmolStr::new_static("delete");
        q.push(deletion);
        // v1 is held until the deletion behind it arrives.
        assert_eq!(
            q.ack(v1[0].id()),
            AckOutcome::Superseded {
                resource: "node/n1/default/pod/a".into(),
                operation: "update".into(),
                version: "1".into(),
                deletion_follows: true,
            }
        );
        let v2 = q.next_batch();
        assert_eq!(
            q.ack(v2[0].id()),
            AckOutcome::Delivered {
                resource: "node/n1/default/pod/a".into(),
                operation: "delete".into(),
                version: "2".into(),
            }
        );
        // An older version acknowledged after a newer one was queued.
        q.push(object("b", 3));
        let v3 = q.next_batch();
        q.push(object("b", 4));
        assert!(matches!(
            q.ack(v3[0].id()),
            AckOutcome::Superseded { version, deletion_follows: false, .. } if version == "3"
        ));
    }

    #[test]
    fn a_full_queue_refuses_new_objects_but_takes_new_versions() {
        let mut q = NodeQueue::new(1, 2);
        q.push(object("a", 1));
        q.push(object("b", 1));
        assert_eq!(q.push(object("c", 1)), PushOutcome::Full);
        assert_eq!(q.push(object("a", 2)), PushOutcome::Coalesced);
        assert_eq!(q.len(), 2);
    }

    #[test]
    fn random_schedules_deliver_every_final_version() {
        // A deterministic random walk over push / send / ack / link loss:
        // in the end every object's newest version is delivered exactly as
        // the last delivery of that object.
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let mut q = NodeQueue::new(4, 1_000);
        let mut newest: HashMap<String, u64> = HashMap::new();
        let mut delivered: HashMap<String, u64> = HashMap::new();
        let mut wire: Vec<Message> = Vec::new();
        for step in 0..20_000u64 {
            match next() % 4 {
                0 => {
                    let name = format!("p{}", next() % 20);
                    q.push(object(&name, step));
                    newest.insert(format!("node/n1/default/pod/{name}"), step);
                }
                1 => wire.extend(q.next_batch()),
                2 if !wire.is_empty() => {
                    let msg = wire.remove((next() as usize) % wire.len());
                    // The edge applies it, then acks.
                    let v: u64 = msg.resource_version().parse().unwrap_or_default();
                    let seen = delivered.entry(msg.resource().to_owned()).or_default();
                    assert!(v >= *seen, "versions never go backwards at the edge");
                    *seen = v;
                    q.ack(msg.id());
                }
                3 if next() % 50 == 0 => {
                    wire.clear();
                    q.link_lost();
                }
                _ => {}
            }
        }
        // Drain.
        loop {
            wire.extend(q.next_batch());
            let Some(msg) = wire.pop() else { break };
            let v: u64 = msg.resource_version().parse().unwrap_or_default();
            delivered.insert(msg.resource().to_owned(), v);
            q.ack(msg.id());
        }
        assert!(q.is_empty());
        assert_eq!(delivered, newest);
    }
}
