//! The controller's watches of the kinds it follows: each listed into the
//! reconciler, then watched from the list's revision, a burst of events
//! handled as one batch, and the revision handled per kind published for
//! the applies that wait on it.

use std::pin::Pin;
use std::task::{Context, Poll};

use apis::kinds::Kind;
use futures_util::{Stream, StreamExt};
use tracing::{debug, warn};

use super::Controller;
use super::reconciler::FOLLOWED;
use crate::desired::{DesiredError, WatchEvent, WatchStream};

/// The most watch events handled before what they call for is carried out.
const WATCH_BATCH: usize = 1024;

/// The watches of the followed kinds, polled in [`FOLLOWED`]'s order, so
/// that of changes waiting at once, what is referenced (configmaps,
/// secrets, models) is handled before what references it.
#[derive(Default)]
pub(super) struct Watches {
    streams: Vec<(Kind, WatchStream)>,
}

impl Watches {
    /// Whether `kind` is watched.
    pub(super) fn watching(&self, kind: Kind) -> bool {
        self.streams.iter().any(|(k, _)| *k == kind)
    }
}

impl Stream for Watches {
    type Item = (Kind, Result<WatchEvent, DesiredError>);

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let mut ended = None;
        for (index, (kind, stream)) in self.streams.iter_mut().enumerate() {
            match stream.poll_next_unpin(cx) {
                Poll::Ready(Some(item)) => return Poll::Ready(Some((*kind, item))),
                Poll::Ready(None) => {
                    ended = Some(index);
                    break;
                }
                Poll::Pending => {}
            }
        }
        if let Some(index) = ended {
            let (kind, _) = self.streams.remove(index);
            // A watch that ends is started again from a fresh list.
            return Poll::Ready(Some((kind, Err(DesiredError::Gone { since: 0 }))));
        }
        // Never ends: a controller without watches waits for its inbox.
        Poll::Pending
    }
}

impl Controller {
    /// Lists `kind`, hands the list to the reconciler, and watches `kind`
    /// from the list's revision; on failure, tried again on the next tick
    /// (until then nothing is withdrawn from nodes).
    pub(super) async fn list_and_watch(&mut self, kind: Kind) {
        // Object by object into the reconciler: a relist of thousands of
        // pods (a watch that fell behind) is never decoded all at once.
        let mut listing = self.reconciler.start_listing(kind);
        let (reconciler, store) = (&mut self.reconciler, &self.store);
        let listed = store
            .list_each(kind, None, &mut |object| {
                reconciler.list_item(&mut listing, object, store)
            })
            .and_then(|revision| Ok((revision, self.store.watch(kind, revision)?)));
        match listed {
            Ok((revision, watch)) => {
                let actions = self
                    .reconciler
                    .finish_listing(listing, revision, &self.store);
                self.act(actions).await;
                self.watches.streams.retain(|(k, _)| *k != kind);
                self.watches.streams.push((kind, watch));
                self.watches
                    .streams
                    .sort_by_key(|(k, _)| FOLLOWED.iter().position(|f| f == k));
                self.mark_handled(kind, revision);
                if matches!(kind, Kind::Device | Kind::DeviceModel) {
                    self.answer_waiting_twin_syncs();
                }
            }
            Err(err) => {
                warn!(kind = kind.name(), error = %err, "desired state not listed; trying again");
                let actions = self.reconciler.abandon_listing(listing);
                self.act(actions).await;
            }
        }
    }

    /// Handles a watch event and every other one already waiting (up to
    /// [`WATCH_BATCH`]), then carries out what they call for at once: a
    /// burst of changes goes to cloudhub as one batch of sends.
    pub(super) async fn on_watch(&mut self, kind: Kind, event: Result<WatchEvent, DesiredError>) {
        use futures_util::FutureExt;
        let mut next = Some((kind, event));
        let mut actions = Vec::new();
        let mut handled: Vec<(Kind, u64)> = Vec::new();
        let mut taken = 0;
        while let Some((kind, event)) = next.take() {
            match event {
                Ok(event) => {
                    taken += 1;
                    let revision = event.revision();
                    actions.extend(self.reconciler.observe(kind, &event, &self.store));
                    match handled.iter_mut().find(|(k, _)| *k == kind) {
                        Some((_, at)) => *at = (*at).max(revision),
                        None => handled.push((kind, revision)),
                    }
                }
                Err(err) => {
                    self.act(std::mem::take(&mut actions)).await;
                    for (kind, revision) in handled.drain(..) {
                        self.mark_handled(kind, revision);
                    }
                    debug!(kind = kind.name(), error = %err, "watch ended; listing again");
                    self.count(|c| c.relists += 1);
                    self.watches.streams.retain(|(k, _)| *k != kind);
                    self.list_and_watch(kind).await;
                }
            }
            if taken < WATCH_BATCH {
                next = self.watches.next().now_or_never().flatten();
            }
        }
        self.count(|c| c.watch_events += taken as u64);
        self.act(actions).await;
        for (kind, revision) in handled {
            self.mark_handled(kind, revision);
        }
    }

    fn mark_handled(&self, kind: Kind, revision: u64) {
        self.handled.send_if_modified(|handled| {
            let at = handled.entry(kind).or_default();
            let moved = revision > *at;
            *at = (*at).max(revision);
            moved
        });
    }
}
