//! Offline tolerations written by the controller, for the pods admission
//! did not lengthen, off the delivery path.
//!
//! cloudcore's admission webhook lengthens a pod's default offline
//! tolerations when the API server creates it (see [`super::eviction`] for
//! the rule), so nothing is written twice. A pod it did not see (created
//! before the webhook was registered, with cloudcore down, or placed on an
//! edge node by the scheduler without asking for one) still reaches its
//! node at once, and its tolerations are written here afterwards: one pod
//! at a time on a task of its own, so these writes never delay a delivery
//! and never pile up on the API server. The pod as written comes back
//! through the watch and goes to its node again.

use std::collections::{HashSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tracing::{debug, info};

use apis::kinds::ObjectKey;

use super::eviction;
use super::{ControllerConfig, ControllerCounts};
use crate::desired::{DesiredState, Object};

/// Queues pods whose tolerations are to be lengthened for a task that
/// writes them one at a time.
pub(super) struct TolerationWriter {
    /// `None` where the desired state does not evict (nothing to write).
    queue: Option<mpsc::UnboundedSender<ObjectKey>>,
    window: Option<Duration>,
}

impl TolerationWriter {
    /// Starts the writer's task, where `store` evicts pods of NotReady
    /// nodes (Kubernetes).
    pub(super) fn start(
        store: Arc<dyn DesiredState>,
        config: &ControllerConfig,
        counts: Arc<watch::Sender<ControllerCounts>>,
    ) -> Self {
        let window = config.offline_grace;
        if !store.evicts() {
            return TolerationWriter {
                queue: None,
                window,
            };
        }
        let (queue, keys) = mpsc::unbounded_channel();
        tokio::spawn(write_in_turn(store, window, counts, keys));
        TolerationWriter {
            queue: Some(queue),
            window,
        }
    }

    /// Queues `pod` if its offline tolerations are not yet lengthened.
    pub(super) fn lengthen_if_needed(&self, key: &ObjectKey, pod: &Object) {
        if let Some(queue) = &self.queue
            && eviction::lengthened(pod.json(), self.window).is_some()
        {
            let _ = queue.send(key.clone());
        }
    }
}

/// Writes the queued pods' tolerations, one at a time, each pod once
/// however often it was queued meanwhile; ends with the controller.
async fn write_in_turn(
    store: Arc<dyn DesiredState>,
    window: Option<Duration>,
    counts: Arc<watch::Sender<ControllerCounts>>,
    mut keys: mpsc::UnboundedReceiver<ObjectKey>,
) {
    let mut waiting = VecDeque::new();
    let mut queued = HashSet::new();
    loop {
        while let Ok(key) = keys.try_recv() {
            if queued.insert(key.clone()) {
                waiting.push_back(key);
            }
        }
        let Some(key) = waiting.pop_front() else {
            match keys.recv().await {
                Some(key) => {
                    queued.insert(key.clone());
                    waiting.push_back(key);
                    continue;
                }
                None => return,
            }
        };
        queued.remove(&key);
        // The pod as held now: it may have changed, or be gone.
        let Some(lengthened) = store.get(&key).ok().flatten().and_then(|mut pod| {
            let lengthened = eviction::lengthened(pod.json(), window)?;
            pod.edit(|body| *body = lengthened);
            Some(pod)
        }) else {
            continue;
        };
        match store.replace(lengthened).await {
            Ok(_) => {
                counts.send_modify(|c| c.tolerations_written += 1);
                info!(pod = %key, "offline tolerations lengthened (admission had not)");
            }
            // Changed meanwhile: its next change is queued again.
            Err(err) => debug!(pod = %key, error = %err, "offline tolerations not lengthened"),
        }
    }
}
