//! Delivery cursors: per node, what it acknowledged (resource to version),
//! kept for nodes that cannot report what they hold (KubeEdge's), so the
//! replica that takes one over sends it only what it lacks. Plain code,
//! time passed in; the etcd writer around it is `CursorWriter`.
//!
//! cloudhub says, in its order, what each node acknowledged and what it
//! may have dropped ([`Seen`]); the book keeps each node's changes since
//! its cursor was last written and hands out writes at most once per
//! `every` per node (sooner when a session ends or the replica stops).
//!
//! A cursor never claims more than the node acknowledged: a version only
//! grows while one claim records it; an object whose deletion (or any
//! message queued before the node's session began) is on its way becomes
//! [`Acked::UNSURE`] until acknowledged again; an acknowledged deletion
//! removes it. What was recorded under another replica's claim is read
//! back as it was written: acknowledgements after its last write are
//! missing (they go again), and only what takes away survives a change of
//! claim.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use crate::edgecontroller::Acked;

/// A node's cursor: resource (`<namespace>/<type>/<name>`) to what it
/// acknowledged.
pub type Cursor = BTreeMap<String, Acked>;

/// What cloudhub saw of one object at a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seen {
    /// Acknowledged at this version: held at it or above.
    Held(u64),
    /// A message of it is on its way whose outcome is unknown (a
    /// deletion, or one queued before the session began).
    Unsure,
    /// Its deletion was acknowledged: not held.
    Gone,
}

/// One object's change since its cursor was written: what was seen of it,
/// composed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Change {
    /// Held at this version at least (on top of what the cursor says).
    AtLeast(u64),
    /// Exactly this (after it was unsure or gone).
    Set(u64),
    /// Not held.
    Remove,
}

impl Change {
    fn of(seen: Seen) -> Change {
        match seen {
            Seen::Held(version) => Change::AtLeast(version),
            Seen::Unsure => Change::Set(Acked::UNSURE),
            Seen::Gone => Change::Remove,
        }
    }

    /// This change, then `next`.
    fn then(self, next: Change) -> Change {
        match (self, next) {
            (_, Change::Set(_) | Change::Remove) => next,
            (Change::AtLeast(a), Change::AtLeast(b)) => Change::AtLeast(a.max(b)),
            (Change::Set(a), Change::AtLeast(b)) => Change::Set(a.max(b)),
            (Change::Remove, Change::AtLeast(b)) => Change::Set(b),
        }
    }

    /// Whether it only takes away from what the node is known to hold.
    fn takes_away(self) -> bool {
        matches!(self, Change::Set(Acked::UNSURE) | Change::Remove)
    }

    /// Applies it to `resource` in `cursor`, recorded under `claim`.
    fn apply(self, cursor: &mut Cursor, resource: &str, claim: i64) {
        let set = |version| Acked { version, claim };
        match self {
            Change::Remove => {
                cursor.remove(resource);
            }
            Change::Set(version) => {
                cursor.insert(resource.to_owned(), set(version));
            }
            Change::AtLeast(version) => {
                let acked = match cursor.get(resource) {
                    // Versions grow while one claim records them; under
                    // another, the old one may be stale: only what was
                    // just acknowledged is sure.
                    Some(old) if old.claim == claim && old.version != Acked::UNSURE => {
                        set(old.version.max(version))
                    }
                    _ => set(version),
                };
                cursor.insert(resource.to_owned(), acked);
            }
        }
    }
}

/// Changes to a node's cursor, per object.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Changes(BTreeMap<String, Change>);

impl Changes {
    /// Takes what was seen of `resource`.
    pub fn see(&mut self, resource: &str, seen: Seen) {
        let next = Change::of(seen);
        match self.0.get_mut(resource) {
            Some(change) => *change = change.then(next),
            None => {
                self.0.insert(resource.to_owned(), next);
            }
        }
    }

    /// These changes, then `newer`.
    pub fn then(mut self, newer: Changes) -> Changes {
        for (resource, next) in newer.0 {
            match self.0.get_mut(&resource) {
                Some(change) => *change = change.then(next),
                None => {
                    self.0.insert(resource, next);
                }
            }
        }
        self
    }

    /// `cursor` with these changes, recorded under `claim`.
    pub fn applied_to(&self, cursor: &Cursor, claim: i64) -> Cursor {
        let mut cursor = cursor.clone();
        for (resource, change) in &self.0 {
            change.apply(&mut cursor, resource, claim);
        }
        cursor
    }

    /// Only what takes away (what stays true whoever recorded the rest).
    pub fn taking_away(self) -> Changes {
        Changes(
            self.0
                .into_iter()
                .filter(|(_, change)| change.takes_away())
                .collect(),
        )
    }

    /// Whether nothing changed.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// A cursor as read from or written to the engine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stored {
    /// The claim on the node it was read or written under.
    pub claim: i64,
    /// The revision of its key's last change (0: no key).
    pub revision: i64,
    /// What it holds.
    pub cursor: Cursor,
}

/// A write to make: `changes` on top of `base` (none: read it first).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Write {
    /// Whose cursor.
    pub node: String,
    /// The cursor as last read or written, if known.
    pub base: Option<Stored>,
    /// What changed since.
    pub changes: Changes,
}

impl Write {
    /// The base and changes to write under `claim` (the claim this
    /// replica holds now): a base read or written under another claim is
    /// read again, and only what takes away is kept of the changes (the
    /// rest was acknowledged under the other claim, and another replica
    /// may have served the node since).
    pub fn under(self, claim: i64) -> (Option<Stored>, Changes) {
        match self.base {
            Some(base) if base.claim != claim => (None, self.changes.taking_away()),
            base => (base, self.changes),
        }
    }
}

/// How a write ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Written (or nothing to write): the cursor as it stands.
    Written(Stored),
    /// This replica does not hold the node: nothing was written, and what
    /// it recorded is forgotten.
    NotHeld,
    /// The engine could not be reached: tried again later.
    Failed,
}

#[derive(Debug, Default)]
struct NodeCursor {
    /// As last read or written.
    base: Option<Stored>,
    /// Seen since, not in a write yet.
    pending: Changes,
    /// In the write under way, if one is.
    writing: Option<Changes>,
    last_write: Option<Instant>,
    /// Written as soon as possible.
    urgent: bool,
    /// Its session ended: forgotten once written.
    ending: bool,
    /// The last write found the node not held here, and nothing was seen
    /// since.
    not_held: bool,
}

impl NodeCursor {
    fn settled(&self) -> bool {
        self.pending.is_empty() && self.writing.is_none()
    }
}

/// Every node's cursor changes, and when to write them.
#[derive(Debug)]
pub struct CursorBook {
    nodes: HashMap<String, NodeCursor>,
    every: Duration,
}

impl CursorBook {
    /// A book writing each node's cursor at most once per `every`.
    pub fn new(every: Duration) -> CursorBook {
        CursorBook {
            nodes: HashMap::new(),
            every,
        }
    }

    /// cloudhub saw `seen` of `resource` at `node`.
    pub fn see(&mut self, node: &str, resource: &str, seen: Seen) {
        let state = self.nodes.entry(node.to_owned()).or_default();
        state.pending.see(resource, seen);
        state.not_held = false;
    }

    /// Writes `node`'s changes as soon as possible.
    pub fn flush(&mut self, node: &str) {
        if let Some(state) = self.nodes.get_mut(node)
            && !state.settled()
        {
            state.urgent = true;
        }
    }

    /// Writes every node's changes as soon as possible.
    pub fn flush_all(&mut self) {
        let nodes: Vec<String> = self.nodes.keys().cloned().collect();
        for node in nodes {
            self.flush(&node);
        }
    }

    /// `node`'s session ended: its changes are written as soon as
    /// possible, then it is forgotten (a next session, perhaps under
    /// another claim, reads its cursor again).
    pub fn end(&mut self, node: &str) {
        let Some(state) = self.nodes.get_mut(node) else {
            return;
        };
        if state.settled() {
            self.nodes.remove(node);
            return;
        }
        state.urgent = true;
        state.ending = true;
    }

    /// The writes due at `now`, each taken as under way.
    pub fn due(&mut self, now: Instant) -> Vec<Write> {
        let every = self.every;
        let mut writes = Vec::new();
        for (node, state) in &mut self.nodes {
            let rested = state.last_write.is_none_or(|last| now >= last + every);
            if state.writing.is_some() || state.pending.is_empty() || !(state.urgent || rested) {
                continue;
            }
            let changes = std::mem::take(&mut state.pending);
            state.writing = Some(changes.clone());
            writes.push(Write {
                node: node.clone(),
                base: state.base.clone(),
                changes,
            });
        }
        writes.sort_by(|a, b| a.node.cmp(&b.node));
        writes
    }

    /// The write of `node` under way ended with `outcome` at `now`.
    pub fn written(&mut self, node: &str, outcome: Outcome, now: Instant) {
        let Some(state) = self.nodes.get_mut(node) else {
            return;
        };
        let written = state.writing.take().unwrap_or_default();
        state.last_write = Some(now);
        match outcome {
            Outcome::Written(stored) => state.base = Some(stored),
            Outcome::NotHeld => {
                // Another replica's now, or none's: what it acknowledged
                // here is no longer sure. What takes away is kept (a
                // session that began here meanwhile needs it written),
                // until a second write in a row finds nothing new.
                let kept = written
                    .then(std::mem::take(&mut state.pending))
                    .taking_away();
                if kept.is_empty() || state.not_held {
                    self.nodes.remove(node);
                } else {
                    *state = NodeCursor {
                        pending: kept,
                        last_write: Some(now),
                        not_held: true,
                        ..NodeCursor::default()
                    };
                }
                return;
            }
            Outcome::Failed => {
                // Tried again after a rest, with what came since.
                let pending = std::mem::take(&mut state.pending);
                state.pending = written.then(pending);
                state.urgent = false;
            }
        }
        if state.pending.is_empty() {
            state.urgent = false;
        }
        if state.ending {
            // Whatever came since belongs to a next session: only what
            // takes away is kept (it must reach the cursor).
            let kept = std::mem::take(&mut state.pending).taking_away();
            if kept.is_empty() {
                self.nodes.remove(node);
            } else {
                *state = NodeCursor {
                    pending: kept,
                    urgent: true,
                    last_write: Some(now),
                    ..NodeCursor::default()
                };
            }
        }
    }

    /// `node`'s cursor as read from the engine, for a node whose cursor is
    /// not known yet (one known already is newer).
    pub fn read(&mut self, node: &str, stored: Stored) {
        let state = self.nodes.entry(node.to_owned()).or_default();
        if state.base.is_none() {
            state.base = Some(stored);
        }
    }

    /// What `node` acknowledged, as far as this replica knows: its cursor
    /// with every change seen since; none until it was read.
    pub fn view(&self, node: &str) -> Option<Cursor> {
        let state = self.nodes.get(node)?;
        let base = state.base.as_ref()?;
        let changes = state
            .writing
            .clone()
            .unwrap_or_default()
            .then(state.pending.clone());
        Some(changes.applied_to(&base.cursor, base.claim))
    }

    /// Whether `node` has nothing left to write.
    pub fn settled(&self, node: &str) -> bool {
        self.nodes.get(node).is_none_or(NodeCursor::settled)
    }

    /// Whether no node has anything left to write.
    pub fn all_settled(&self) -> bool {
        self.nodes.values().all(NodeCursor::settled)
    }

    /// Nodes with a cursor in memory.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Whether no node has a cursor in memory.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }
}

/// The cursor as stored: JSON, resource to `[version, claim]`.
pub fn encode(cursor: &Cursor) -> Vec<u8> {
    let pairs: BTreeMap<&str, (u64, i64)> = cursor
        .iter()
        .map(|(resource, acked)| (resource.as_str(), (acked.version, acked.claim)))
        .collect();
    serde_json::to_vec(&pairs).unwrap_or_default()
}

/// A stored cursor; an unreadable one is read as empty (it claims
/// nothing, so everything goes again).
pub fn decode(bytes: &[u8]) -> Cursor {
    serde_json::from_slice::<BTreeMap<String, (u64, i64)>>(bytes)
        .map(|pairs| {
            pairs
                .into_iter()
                .map(|(resource, (version, claim))| (resource, Acked { version, claim }))
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod takeovers;
