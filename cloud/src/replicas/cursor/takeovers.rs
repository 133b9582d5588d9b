//! Replicas taking a KubeEdge node over from each other, at random, on
//! the real reconciler, cloudhub's real queue and this book: whatever the
//! cursor missed (a replica died before writing it, a link closed before
//! acknowledgements came back), the node ends up holding exactly what it
//! should.

use std::collections::BTreeMap;

use apis::kinds::{Kind, ObjectKey, references};
use beehive::Message;
use hub::queue::{AckOutcome, NodeQueue, PushOutcome};
use serde_json::{Value, json};

use super::*;
use crate::desired::{Object, SPEC_REVISION, WatchEvent, desired_body, spec_revision};
use crate::edgecontroller::reconciler::{Action, FOLLOWED, NodeDialect, Op, Reconciler, Version};

const NODE: &str = "edge-1";
const CONFIGMAPS: usize = 4;
const PODS: usize = 8;

type Store = HashMap<ObjectKey, Object>;

use crate::test_rng::Rng;

/// One replica: its reconciler, its queue for the node, its book.
struct Replica {
    r: Reconciler,
    queue: NodeQueue,
    book: CursorBook,
    /// The claim it holds on the node, if any.
    claim: Option<i64>,
    /// Sent on the node's link, not acknowledged yet.
    wire: Vec<Message>,
    /// Writes under way.
    writes: Vec<Write>,
    /// Cursor reads asked for and not answered yet, by session.
    reads: Vec<u64>,
    /// Its queue waits for what it held at the session's start to be
    /// recorded (cloudhub's `AckSink::recorded`).
    held_back: bool,
}

impl Replica {
    fn new(store: &Store, cursors: bool) -> Replica {
        let mut r = Reconciler::new().with_cursors(cursors);
        for kind in FOLLOWED {
            let objects: Vec<Object> = store
                .iter()
                .filter(|(key, _)| key.kind == kind)
                .map(|(_, object)| object.clone())
                .collect();
            r.listed(kind, objects, 1, store);
        }
        Replica {
            r,
            queue: NodeQueue::new(4, 1_000),
            book: CursorBook::new(Duration::from_secs(1)),
            claim: None,
            wire: Vec::new(),
            writes: Vec::new(),
            reads: Vec::new(),
            held_back: false,
        }
    }
}

struct Sim {
    rng: Rng,
    /// etcd's revision: of writes, fresh versions, claims and cursors.
    revision: u64,
    store: Store,
    replicas: Vec<Replica>,
    /// Which replica serves the node.
    serving: Option<usize>,
    /// The claim key: its holder and creation.
    claim: Option<(usize, i64)>,
    /// The cursor in etcd and its key's revision.
    stored: (Cursor, i64),
    /// What the edge holds: resource to version and object (none: a
    /// deletion).
    edge: BTreeMap<String, (u64, Option<Value>)>,
    /// Whether the edge keeps only newer versions (else it applies
    /// whatever comes, in order).
    comparing: bool,
    /// Whether the replicas keep cursors (else a KubeEdge node that
    /// links gets everything again, as before them).
    cursors: bool,
    now: Instant,
    /// Messages the taking-over replicas sent right after reading a
    /// cursor, and the objects desired at the node then.
    resent: Vec<(usize, usize)>,
    log: Vec<String>,
    seed: u64,
}

impl Sim {
    fn fail(&self, what: &str) -> ! {
        let recent = &self.log[self.log.len().saturating_sub(200)..];
        panic!("seed {:#x}: {what}\n{}", self.seed, recent.join("\n"));
    }

    fn write(&mut self, object: Value) {
        let mut object = Object::new(object).expect("an object");
        let key = object.key().clone();
        self.revision += 1;
        let spec = match self.store.get(&key) {
            Some(old) if desired_body(old.json()) == desired_body(object.json()) => {
                spec_revision(old)
            }
            _ => self.revision,
        };
        object.set_revision(self.revision);
        object.edit(|o| o["metadata"]["annotations"] = json!({ SPEC_REVISION: spec.to_string() }));
        self.log.push(format!("{}: write {key}", self.revision));
        let event = match self.store.insert(key.clone(), object.clone()) {
            Some(_) => WatchEvent::Modified(object),
            None => WatchEvent::Added(object),
        };
        self.observe(key.kind, &event);
    }

    fn delete(&mut self, key: &ObjectKey) {
        if let Some(mut object) = self.store.remove(key) {
            self.revision += 1;
            self.log.push(format!("{}: delete {key}", self.revision));
            object.set_revision(self.revision);
            self.observe(key.kind, &WatchEvent::Deleted(object));
        }
    }

    /// Every replica sees each change at once (one that takes the
    /// node over waits for its mirror anyway).
    fn observe(&mut self, kind: Kind, event: &WatchEvent) {
        for index in 0..self.replicas.len() {
            let actions = self.replicas[index].r.observe(kind, event, &self.store);
            self.act(index, actions);
        }
    }

    /// Carries actions out as the controller and cloudhub do.
    fn act(&mut self, index: usize, actions: Vec<Action>) -> usize {
        let mut fresh = None;
        let mut sent = 0;
        for action in actions {
            match action {
                Action::Send {
                    node,
                    op,
                    key,
                    object,
                    version,
                } => {
                    if self.serving != Some(index) {
                        // Sent only to nodes linked here.
                        continue;
                    }
                    let version = match version {
                        Version::Of(version) => version,
                        Version::Fresh => *fresh.get_or_insert_with(|| {
                            self.revision += 1;
                            self.revision
                        }),
                    };
                    let resource = key.edge_resource().to_string();
                    let msg = Message::new()
                        .build_router(
                            "edgecontroller",
                            "resource",
                            resource.clone(),
                            op.operation(),
                        )
                        .with_resource_version(version.to_string())
                        .with_content(object.content());
                    let replica = &mut self.replicas[index];
                    let outcome = replica.queue.push(msg);
                    if op == Op::Delete
                        && matches!(outcome, PushOutcome::Queued | PushOutcome::Coalesced)
                    {
                        replica.book.see(NODE, &resource, Seen::Unsure);
                    }
                    replica.r.sent(&node, op, &key, version, true);
                    sent += 1;
                    self.log.push(format!(
                        "  {index}: {op:?} {resource} at {version} ({outcome:?})"
                    ));
                }
                Action::ReadCursor { session, .. } => self.replicas[index].reads.push(session),
                Action::AskInventory { .. } => self.fail("a KubeEdge node asked"),
                Action::Membership { .. }
                | Action::UpdateNode { .. }
                | Action::FinishDeletion { .. } => {}
            }
        }
        sent
    }

    /// Answers a cursor read as the writer does: its view, else etcd's
    /// cursor under its claim.
    fn answer_read(&mut self, index: usize) {
        let claim = self.claim;
        let stored = self.stored.clone();
        let replica = &mut self.replicas[index];
        if replica.reads.is_empty() {
            return;
        }
        let session = replica.reads.remove(0);
        let cursor = match replica.book.view(NODE) {
            Some(cursor) => Ok(cursor),
            None => match (replica.claim, claim) {
                (Some(mine), Some((holder, held))) if holder == index && held == mine => {
                    replica.book.read(
                        NODE,
                        Stored {
                            claim: mine,
                            revision: stored.1,
                            cursor: stored.0,
                        },
                    );
                    replica.book.view(NODE).ok_or_else(|| "unread".to_owned())
                }
                _ => Err("not held here".to_owned()),
            },
        };
        self.log.push(format!("{index}: cursor {cursor:?}"));
        let desired = self.desired().len();
        let actions = self.replicas[index]
            .r
            .cursor(NODE, session, cursor, &self.store);
        let taken = !actions.is_empty();
        let sent = self.act(index, actions);
        if taken {
            self.resent.push((sent, desired));
        }
    }

    /// Takes the writes due, as the writer's tick does.
    fn tick(&mut self, index: usize) {
        let now = self.now;
        let due = self.replicas[index].book.due(now);
        self.replicas[index].writes.extend(due);
    }

    /// Makes a write under way, fenced by the claim in etcd.
    fn perform(&mut self, index: usize, at: usize) {
        let write = self.replicas[index].writes.remove(at);
        let held = match (self.replicas[index].claim, self.claim) {
            (Some(mine), Some((holder, claim))) if holder == index && claim == mine => Some(claim),
            _ => None,
        };
        let outcome = match held {
            None => Outcome::NotHeld,
            Some(_) if self.rng.percent(10) => Outcome::Failed,
            Some(claim) => {
                let (base, changes) = write.under(claim);
                // A base written since (a conflict) is read again.
                let current = match base {
                    Some(base) if base.revision == self.stored.1 => base,
                    _ => Stored {
                        claim,
                        revision: self.stored.1,
                        cursor: self.stored.0.clone(),
                    },
                };
                let next = changes.applied_to(&current.cursor, claim);
                if next != current.cursor {
                    self.revision += 1;
                    self.stored = (next.clone(), self.revision as i64);
                }
                Outcome::Written(Stored {
                    claim,
                    revision: self.stored.1,
                    cursor: next,
                })
            }
        };
        self.log.push(format!("{index}: write {outcome:?}"));
        let now = self.now;
        let replica = &mut self.replicas[index];
        replica.book.written(NODE, outcome, now);
        if replica.book.settled(NODE) {
            replica.held_back = false;
        }
    }

    /// The edge takes one message (or drops it); its ack, if it gets
    /// back, is told as cloudhub tells it.
    fn deliver(&mut self, ack: bool) {
        let Some(index) = self.serving.filter(|i| !self.replicas[*i].held_back) else {
            return;
        };
        let batch = self.replicas[index].queue.next_batch();
        self.replicas[index].wire.extend(batch);
        if self.replicas[index].wire.is_empty() {
            return;
        }
        let at = self.rng.below(self.replicas[index].wire.len());
        let msg = self.replicas[index].wire.remove(at);
        if ack && self.rng.percent(5) {
            // Dropped by the edge: sent again.
            self.replicas[index].queue.requeue(msg.id());
            return;
        }
        self.apply(&msg);
        if ack {
            self.acked(index, &msg);
        }
    }

    fn apply(&mut self, msg: &Message) {
        let version: u64 = msg.resource_version().parse().expect("a version");
        let resource = msg.resource().to_owned();
        if self.comparing
            && self
                .edge
                .get(&resource)
                .is_some_and(|(held, _)| *held >= version)
        {
            return;
        }
        let object = (msg.operation() != "delete").then(|| msg.body::<Value>().unwrap_or_default());
        self.log
            .push(format!("edge: {} {resource} at {version}", msg.operation()));
        self.edge.insert(resource, (version, object));
    }

    fn acked(&mut self, index: usize, msg: &Message) {
        let replica = &mut self.replicas[index];
        let seen = match replica.queue.ack(msg.id()) {
            AckOutcome::Delivered {
                resource,
                operation,
                version,
            } => Some((resource, operation, version, false)),
            AckOutcome::Superseded {
                resource,
                operation,
                version,
                deletion_follows,
            } => Some((resource, operation, version, deletion_follows)),
            AckOutcome::Unknown => None,
        };
        if let Some((resource, operation, version, deletion_follows)) = seen {
            if operation == "delete" {
                replica.book.see(NODE, &resource, Seen::Gone);
            } else if !deletion_follows {
                let version = version.parse().expect("a version");
                replica.book.see(NODE, &resource, Seen::Held(version));
            }
        }
    }

    /// The node's session at its replica ends: gracefully (its cursor
    /// written before the claim goes), or the replica dies.
    fn leave(&mut self) {
        let Some(index) = self.serving.take() else {
            return;
        };
        // What was on the wire: some reached the edge, whose acks
        // never came back.
        let wire = std::mem::take(&mut self.replicas[index].wire);
        for msg in &wire {
            if self.rng.percent(30) {
                self.apply(msg);
            }
        }
        if self.rng.percent(50) {
            self.log.push(format!("{index} dies"));
            let queue_kept = self.rng.percent(50);
            let mut fresh = Replica::new(&self.store, self.cursors);
            if queue_kept {
                // Persisted: it comes back with the replica.
                fresh.queue =
                    std::mem::replace(&mut self.replicas[index].queue, NodeQueue::new(4, 1));
                fresh.queue.link_lost();
            }
            self.replicas[index] = fresh;
        } else {
            self.log.push(format!("{index} lets the node go"));
            let replica = &mut self.replicas[index];
            replica.queue.link_lost();
            replica.book.end(NODE);
            replica.r.served_elsewhere(NODE);
            // Before the claim is given up: the final write.
            self.tick(index);
            while let Some(at) = self.replicas[index].writes.len().checked_sub(1) {
                if self.rng.percent(80) {
                    self.perform(index, at);
                } else {
                    // Still under way when the claim goes.
                    break;
                }
            }
            self.replicas[index].claim = None;
        }
        self.claim = None;
    }

    /// The node links to replica `index`, which claims it.
    fn link(&mut self, index: usize) {
        self.revision += 1;
        let claim = self.revision as i64;
        self.claim = Some((index, claim));
        self.serving = Some(index);
        self.log
            .push(format!("{index} takes the node (claim {claim})"));
        let replica = &mut self.replicas[index];
        replica.claim = Some(claim);
        for msg in replica.queue.objects() {
            replica.book.see(NODE, msg.resource(), Seen::Unsure);
        }
        if !replica.queue.is_empty() {
            replica.held_back = true;
            replica.book.flush(NODE);
        }
        let actions = replica
            .r
            .connected(NODE, NodeDialect::KubeEdge, &self.store);
        let desired = self.desired().len();
        let sent = self.act(index, actions);
        if !self.cursors {
            self.resent.push((sent, desired));
        }
    }

    fn random_pod(&mut self, name: &str) -> Value {
        let cms: Vec<Value> = (0..CONFIGMAPS)
            .filter(|_| self.rng.percent(40))
            .map(|i| json!({"name": format!("v{i}"), "configMap": {"name": format!("cm-{i}")}}))
            .collect();
        let node = match self.rng.below(3) {
            0 => "elsewhere",
            _ => NODE,
        };
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"nodeName": node, "volumes": cms,
                     "containers": [{"name": "c", "image": format!("img:{}", self.revision)}]},
        })
    }

    fn step(&mut self) {
        self.now += Duration::from_millis(100);
        match self.rng.below(100) {
            0..12 => {
                let name = format!("cm-{}", self.rng.below(CONFIGMAPS));
                let object = json!({"apiVersion": "v1", "kind": "ConfigMap",
                        "metadata": {"name": name, "namespace": "default"},
                        "data": {"k": format!("v{}", self.revision)}});
                self.write(object);
            }
            12..15 => {
                let name = format!("cm-{}", self.rng.below(CONFIGMAPS));
                self.delete(&ObjectKey::new(Kind::ConfigMap, "default", name));
            }
            15..30 => {
                let name = format!("pod-{}", self.rng.below(PODS));
                let key = ObjectKey::new(Kind::Pod, "default", name.as_str());
                let object = match self.store.get(&key).cloned() {
                    // Bound once, bound for good: a change keeps it.
                    Some(old) => {
                        let mut changed = self.random_pod(&name);
                        changed["spec"]["nodeName"] = old["spec"]["nodeName"].clone();
                        changed
                    }
                    None => self.random_pod(&name),
                };
                self.write(object);
            }
            30..35 => {
                let name = format!("pod-{}", self.rng.below(PODS));
                self.delete(&ObjectKey::new(Kind::Pod, "default", name));
            }
            35..70 => self.deliver(true),
            70..75 => self.deliver(false),
            75..82 => {
                let index = self.rng.below(self.replicas.len());
                self.tick(index);
            }
            82..90 => {
                let index = self.rng.below(self.replicas.len());
                if !self.replicas[index].writes.is_empty() {
                    let at = self.rng.below(self.replicas[index].writes.len());
                    self.perform(index, at);
                }
            }
            90..95 => {
                let index = self.rng.below(self.replicas.len());
                self.answer_read(index);
            }
            _ => {
                self.leave();
                let index = self.rng.below(self.replicas.len());
                self.link(index);
            }
        }
    }

    /// What the node should hold: its pods and what they use.
    fn desired(&self) -> BTreeMap<String, &Object> {
        let mut desired = BTreeMap::new();
        for (key, object) in &self.store {
            if key.kind != Kind::Pod || object.node_name() != Some(NODE) {
                continue;
            }
            desired.insert(key.edge_resource().to_string(), object);
            for used in references(key, object.json()) {
                if let Some(object) = self.store.get(&used) {
                    desired.insert(used.edge_resource().to_string(), object);
                }
            }
        }
        desired
    }

    /// Everything delivered and acknowledged, every read answered.
    fn drain(&mut self) {
        let Some(index) = self.serving else { return };
        for _ in 0..10_000 {
            if !self.replicas[index].reads.is_empty() {
                self.answer_read(index);
                continue;
            }
            if self.replicas[index].held_back {
                self.now += Duration::from_millis(100);
                self.tick(index);
                if let Some(at) = self.replicas[index].writes.len().checked_sub(1) {
                    self.perform(index, at);
                }
                continue;
            }
            let batch = self.replicas[index].queue.next_batch();
            self.replicas[index].wire.extend(batch);
            let Some(msg) = self.replicas[index].wire.pop() else {
                return;
            };
            self.apply(&msg);
            self.acked(index, &msg);
        }
        let replica = &self.replicas[index];
        self.fail(&format!(
            "never drained: held back {}, {} writes under way, settled {}, {:?}",
            replica.held_back,
            replica.writes.len(),
            replica.book.settled(NODE),
            replica.book.nodes.get(NODE)
        ));
    }

    /// Nothing desired is missing or old at the node. (It may hold
    /// what is no longer desired: an object deleted while its deletion
    /// never reached the node, nor any record of the node holding it,
    /// stays there, as with no cursor at all.) How many such it holds.
    fn check(&self) -> usize {
        let desired = self.desired();
        let held: BTreeMap<&String, &Value> = self
            .edge
            .iter()
            .filter_map(|(resource, (_, object))| object.as_ref().map(|o| (resource, o)))
            .collect();
        for (resource, object) in &desired {
            match held.get(resource) {
                None => self.fail(&format!(
                    "{resource} is missing at the node, which holds {:?}",
                    held.keys().collect::<Vec<_>>()
                )),
                Some(content) if desired_body(content) != desired_body(object.json()) => self.fail(
                    &format!("{resource} held as {content}, not {}", object.json()),
                ),
                Some(_) => {}
            }
        }
        held.keys().filter(|r| !desired.contains_key(**r)).count()
    }
}

/// A walk: what each replica that took the node over sent once it
/// read the cursor, with the objects desired then; and how many
/// objects no longer desired the node holds at the end.
fn walk(seed: u64, comparing: bool, cursors: bool) -> (Vec<(usize, usize)>, usize) {
    let store = Store::new();
    let mut sim = Sim {
        rng: Rng(seed),
        revision: 1,
        replicas: vec![Replica::new(&store, cursors), Replica::new(&store, cursors)],
        store,
        serving: None,
        claim: None,
        stored: (Cursor::new(), 0),
        edge: BTreeMap::new(),
        comparing,
        cursors,
        now: Instant::now(),
        resent: Vec::new(),
        log: Vec::new(),
        seed,
    };
    sim.link(0);
    for _ in 0..600 {
        sim.step();
    }
    // Last, the node moves once more, and is brought in step.
    sim.leave();
    let index = sim.rng.below(2);
    sim.link(index);
    sim.drain();
    let leftover = sim.check();
    (sim.resent, leftover)
}

#[test]
fn a_node_taken_over_at_random_ends_up_holding_what_it_should() {
    for (comparing, cursors) in [(true, true), (false, true), (true, false)] {
        let (mut resent, mut desired, mut leftovers, mut count) = (0, 0, 0, 0);
        for seed in 1..=40u64 {
            let seed = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15);
            let (takeovers, leftover) = walk(seed, comparing, cursors);
            count += takeovers.len();
            for (sent, wanted) in takeovers {
                resent += sent;
                desired += wanted;
            }
            leftovers += leftover;
        }
        println!(
            "cursors {cursors}, edge comparing versions {comparing}: {count} takeovers sent \
                 {resent} messages (withdrawals included) for {desired} objects desired; \
                 {leftovers} objects no longer desired left at the node in 40 walks"
        );
    }
}
