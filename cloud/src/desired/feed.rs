//! The changes a desired-state backend has made or seen, kept for watches:
//! per kind, a window of recent changes in memory and a broadcast of new
//! ones. A watch from a revision the window still covers replays what
//! followed it and then streams live; one from an older revision fails
//! with [`DesiredError::Gone`], as an API server's compacted history does.
//! Both backends serve their watches from one: the embedded store
//! publishes each committed write, the Kubernetes backend what its own
//! watches of the API server bring.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};

use futures_util::StreamExt;
use tokio::sync::broadcast;

use apis::kinds::Kind;

use super::{DesiredError, WatchEvent, WatchStream};

/// A change, or the word that the kind's history starts anew (its watches
/// end with [`DesiredError::Gone`]).
#[derive(Debug)]
enum Change {
    Event(Arc<WatchEvent>),
    Reset,
}

/// Live changes a watcher may fall behind by before it must list again.
const LIVE: usize = 4096;

/// One kind's recent changes.
struct Window {
    /// Every change after this revision is in `changes`.
    complete_after: u64,
    changes: VecDeque<Arc<WatchEvent>>,
    live: broadcast::Sender<Arc<Change>>,
}

/// Recent changes per kind, for watches.
pub struct Feed {
    capacity: usize,
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
                    changes: VecDeque::new(),
                    // A watcher that falls this far behind lists again.
                    live: broadcast::channel(capacity.min(LIVE)).0,
                };
                (*kind, window)
            })
            .collect();
        Feed {
            capacity,
            windows: Mutex::new(windows),
        }
    }

    /// Publishes changes, in order.
    pub fn publish(&self, changes: impl IntoIterator<Item = (Kind, WatchEvent)>) {
        let mut windows = self.windows.lock().unwrap_or_else(PoisonError::into_inner);
        for (kind, event) in changes {
            let Some(window) = windows.get_mut(&kind) else {
                continue;
            };
            let event = Arc::new(event);
            if window.changes.len() == self.capacity
                && let Some(oldest) = window.changes.pop_front()
            {
                window.complete_after = oldest.revision();
            }
            window.changes.push_back(event.clone());
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
            window.changes.clear();
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
            let replay: Vec<WatchEvent> = window
                .changes
                .iter()
                .filter(|event| event.revision() > since)
                .map(|event| WatchEvent::clone(event))
                .collect();
            (window.live.subscribe(), replay)
        };
        let last = replay.last().map_or(since, WatchEvent::revision);
        let replayed = futures_util::stream::iter(replay.into_iter().map(Ok));
        let following = futures_util::stream::unfold(Some((live, last)), |state| async move {
            let (mut live, mut last) = state?;
            loop {
                match live.recv().await {
                    Ok(change) => match &*change {
                        Change::Event(event) if event.revision() > last => {
                            last = event.revision();
                            return Some((Ok(WatchEvent::clone(event)), Some((live, last))));
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
