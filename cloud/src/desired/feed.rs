//! The changes a desired-state backend has made or seen, kept for watches:
//! per kind, a window of recent changes in memory and a broadcast of new
//! ones. A watch from a revision the window still covers replays what
//! followed it and then streams live; one from an older revision fails
//! with [`DesiredError::Gone`], as an API server's compacted history does.
//! Both backends serve their watches from one: the embedded store
//! publishes each committed write, the Kubernetes backend what its own
//! watches of the API server bring.
//!
//! The window is compacted by object: a change supersedes the one before
//! it of the same object, unless that was a deletion (a watcher resuming
//! from an older revision sees each object's newest state, and every
//! deletion). Watchers here act on the newest state only (the
//! edgecontroller's reconciler), and churn on the same objects does not
//! grow the window: it holds at most one change per object changed since
//! the oldest it covers, and at most `capacity` changes and
//! [`WINDOW_BYTES`] of encoded objects in all (so churn that keeps
//! deleting new objects cannot grow it without bound: past that, the
//! oldest go, and a watch from before them lists again).
//!
//! Changes are held packed ([`PackedEvent`]): the window and the live
//! broadcast share one encoding of each, which a watcher decodes as it
//! takes the change.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, PoisonError};

use futures_util::StreamExt;
use tokio::sync::broadcast;

use apis::kinds::{Kind, ObjectKey};

use super::packed::{ChangeKind, PackedEvent};
use super::{DesiredError, WatchEvent, WatchStream};

/// A change, or the word that the kind's history starts anew (its watches
/// end with [`DesiredError::Gone`]).
#[derive(Debug)]
enum Change {
    Event(Arc<PackedEvent>),
    Reset,
}

/// Live changes a watcher may fall behind by before it must list again.
const LIVE: usize = 4096;

/// The most a kind's window holds of encoded objects, in bytes.
pub const WINDOW_BYTES: usize = 4 * 1024 * 1024;

/// One kind's recent changes.
struct Window {
    /// Every object's newest change after this revision is in `changes`.
    complete_after: u64,
    /// By revision, then by arrival (revisions of one kind are unique in
    /// every backend; the count keeps two apart if not).
    changes: BTreeMap<(u64, u64), Arc<PackedEvent>>,
    /// Where each object's newest change that is not a deletion sits in
    /// `changes` (the one a newer change supersedes).
    newest: HashMap<ObjectKey, (u64, u64)>,
    /// The encoded size of the objects in `changes`.
    bytes: usize,
    arrivals: u64,
    live: broadcast::Sender<Arc<Change>>,
}

impl Window {
    fn push(&mut self, event: Arc<PackedEvent>, capacity: usize, max_bytes: usize) {
        if let Some(superseded) = self.newest.remove(&event.key)
            && let Some(gone) = self.changes.remove(&superseded)
        {
            self.bytes -= gone.object.len();
        }
        self.arrivals += 1;
        let at = (event.revision, self.arrivals);
        if event.change != ChangeKind::Deleted {
            self.newest.insert(event.key.clone(), at);
        }
        self.bytes += event.object.len();
        self.changes.insert(at, event);
        while self.changes.len() > capacity || (self.bytes > max_bytes && self.changes.len() > 1) {
            let Some((_, oldest)) = self.changes.pop_first() else {
                break;
            };
            self.bytes -= oldest.object.len();
            self.complete_after = oldest.revision;
            if self
                .newest
                .get(&oldest.key)
                .is_some_and(|(revision, _)| *revision == oldest.revision)
            {
                self.newest.remove(&oldest.key);
            }
        }
    }

    fn clear(&mut self) {
        self.changes.clear();
        self.newest.clear();
        self.bytes = 0;
    }
}

/// Recent changes per kind, for watches.
pub struct Feed {
    capacity: usize,
    max_bytes: usize,
    windows: Mutex<HashMap<Kind, Window>>,
}

impl Feed {
    /// A feed keeping `capacity` changes per kind, complete after
    /// `revision` for every kind.
    pub fn new(capacity: usize, revision: u64) -> Self {
        let capacity = capacity.max(1);
        let windows = Kind::ALL
            .iter()
            .map(|kind| {
                let window = Window {
                    complete_after: revision,
                    changes: BTreeMap::new(),
                    newest: HashMap::new(),
                    bytes: 0,
                    arrivals: 0,
                    // A watcher that falls this far behind lists again.
                    live: broadcast::channel(capacity.min(LIVE)).0,
                };
                (*kind, window)
            })
            .collect();
        Feed {
            capacity,
            max_bytes: WINDOW_BYTES,
            windows: Mutex::new(windows),
        }
    }

    /// The feed, its windows holding at most `max_bytes` of encoded
    /// objects per kind (rather than [`WINDOW_BYTES`]).
    pub fn holding_bytes(mut self, max_bytes: usize) -> Self {
        self.max_bytes = max_bytes;
        self
    }

    /// Publishes changes, in order.
    pub fn publish(&self, changes: impl IntoIterator<Item = (Kind, WatchEvent)>) {
        let packed =
            changes
                .into_iter()
                .filter_map(|(kind, event)| match PackedEvent::of(&event) {
                    Ok(packed) => Some((kind, packed)),
                    Err(err) => {
                        tracing::warn!(kind = kind.name(), error = %err, "change not published");
                        None
                    }
                });
        self.publish_packed(packed);
    }

    /// Publishes changes already packed (their objects' encodings shared
    /// with a cache), in order.
    pub fn publish_packed(&self, changes: impl IntoIterator<Item = (Kind, PackedEvent)>) {
        let mut windows = self.windows.lock().unwrap_or_else(PoisonError::into_inner);
        for (kind, event) in changes {
            let Some(window) = windows.get_mut(&kind) else {
                continue;
            };
            let event = Arc::new(event);
            window.push(event.clone(), self.capacity, self.max_bytes);
            // Sent while the window is locked, so a watch that subscribed
            // and then read the window sees each change once.
            let _ = window.live.send(Arc::new(Change::Event(event)));
        }
    }

    /// Forgets `kind`'s history: its watches end with
    /// [`DesiredError::Gone`], and new ones start at `revision` or later.
    pub fn reset(&self, kind: Kind, revision: u64) {
        let mut windows = self.windows.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(window) = windows.get_mut(&kind) {
            window.clear();
            window.complete_after = revision;
            let _ = window.live.send(Arc::new(Change::Reset));
        }
    }

    /// Every change of `kind` after `since`, then live ones.
    pub fn watch(&self, kind: Kind, since: u64) -> Result<WatchStream, DesiredError> {
        let (live, replay) = {
            let windows = self.windows.lock().unwrap_or_else(PoisonError::into_inner);
            let Some(window) = windows.get(&kind) else {
                return Err(DesiredError::Gone { since });
            };
            if since < window.complete_after {
                return Err(DesiredError::Gone { since });
            }
            let replay: Vec<Arc<PackedEvent>> = window
                .changes
                .range((since.saturating_add(1), 0)..)
                .map(|(_, event)| event.clone())
                .collect();
            (window.live.subscribe(), replay)
        };
        let last = replay.last().map_or(since, |event| event.revision);
        // Decoded one at a time as the watcher takes them.
        let replayed = futures_util::stream::iter(replay).map(|event| event.unpack());
        let following = futures_util::stream::unfold(Some((live, last)), |state| async move {
            let (mut live, mut last) = state?;
            loop {
                match live.recv().await {
                    Ok(change) => match &*change {
                        Change::Event(event) if event.revision > last => {
                            last = event.revision;
                            return Some((event.unpack(), Some((live, last))));
                        }
                        Change::Event(_) => {}
                        Change::Reset => {
                            return Some((Err(DesiredError::Gone { since: last }), None));
                        }
                    },
                    // Fell behind the broadcast: the watcher lists again.
                    Err(broadcast::error::RecvError::Lagged(_)) => {
                        return Some((Err(DesiredError::Gone { since: last }), None));
                    }
                    Err(broadcast::error::RecvError::Closed) => return None,
                }
            }
        });
        Ok(replayed.chain(following).boxed())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn cm(name: &str, revision: u64) -> crate::desired::Object {
        crate::desired::Object::new(json!({"apiVersion": "v1", "kind": "ConfigMap",
               "metadata": {"name": name, "namespace": "a", "resourceVersion": revision.to_string()}}))
        .expect("a configmap")
    }

    async fn replayed(feed: &Feed, since: u64) -> Vec<(String, u64)> {
        let mut watch = feed.watch(Kind::ConfigMap, since).expect("watch");
        let mut seen = Vec::new();
        while let Some(Some(Ok(event))) = futures_util::FutureExt::now_or_never(watch.next()) {
            let kind = match &event {
                WatchEvent::Added(_) => "added",
                WatchEvent::Modified(_) => "modified",
                WatchEvent::Deleted(_) => "deleted",
            };
            let name = event.object().key().name.clone();
            seen.push((format!("{kind} {name}"), event.revision()));
        }
        seen
    }

    #[tokio::test]
    async fn a_change_supersedes_the_one_before_of_the_same_object_but_not_a_deletion() {
        let feed = Feed::new(100, 0);
        feed.publish([
            (Kind::ConfigMap, WatchEvent::Added(cm("x", 1))),
            (Kind::ConfigMap, WatchEvent::Added(cm("y", 2))),
            (Kind::ConfigMap, WatchEvent::Modified(cm("x", 3))),
            (Kind::ConfigMap, WatchEvent::Deleted(cm("y", 4))),
            (Kind::ConfigMap, WatchEvent::Added(cm("y", 5))),
            (Kind::ConfigMap, WatchEvent::Modified(cm("x", 6))),
        ]);
        assert_eq!(
            replayed(&feed, 0).await,
            vec![
                ("deleted y".to_owned(), 4),
                ("added y".to_owned(), 5),
                ("modified x".to_owned(), 6)
            ]
        );
        assert_eq!(replayed(&feed, 5).await, vec![("modified x".to_owned(), 6)]);
    }

    #[tokio::test]
    async fn churn_on_the_same_objects_keeps_the_window_small_and_complete() {
        let feed = Feed::new(10, 0);
        for round in 0..100u64 {
            for (i, name) in ["a", "b", "c"].iter().enumerate() {
                let revision = round * 3 + i as u64 + 1;
                feed.publish([(Kind::ConfigMap, WatchEvent::Modified(cm(name, revision)))]);
            }
        }
        // Three objects: three changes held, and a watch from the start
        // is still served (nothing it needs was dropped).
        assert_eq!(replayed(&feed, 0).await.len(), 3);
        // Past the capacity of distinct objects, the oldest go, and a
        // watch from before them must list again.
        for i in 0..20u64 {
            feed.publish([(
                Kind::ConfigMap,
                WatchEvent::Added(cm(&format!("n{i}"), 1_000 + i)),
            )]);
        }
        assert!(matches!(
            feed.watch(Kind::ConfigMap, 0),
            Err(DesiredError::Gone { .. })
        ));
        assert_eq!(replayed(&feed, 1_009).await.len(), 10);
    }

    #[tokio::test]
    async fn deletions_of_ever_new_objects_are_held_up_to_the_byte_limit() {
        let one = PackedEvent::of(&WatchEvent::Deleted(cm("n00000", 1_000)))
            .expect("pack")
            .object
            .len();
        let feed = Feed::new(100_000, 0).holding_bytes(50 * one);
        for i in 0..1_000u64 {
            let name = format!("n{i:05}");
            feed.publish([
                (Kind::ConfigMap, WatchEvent::Added(cm(&name, 2 * i + 1))),
                (Kind::ConfigMap, WatchEvent::Deleted(cm(&name, 2 * i + 2))),
            ]);
        }
        // Only the newest 50 deletions (each superseded its object's add).
        let held = replayed(&feed, 1_900).await;
        assert_eq!(held.len(), 50);
        assert!(held.iter().all(|(what, _)| what.starts_with("deleted")));
        assert!(matches!(
            feed.watch(Kind::ConfigMap, 1_899),
            Err(DesiredError::Gone { .. })
        ));
    }
}
