//! A follower: one node's watch of one kind through the API server, in the\nnode's name, forwarded to the node as KubeEdge's MetaServer expects it,\nand started again (from where it was) when the API server ends it.

use std::sync::Arc;
use std::time::Duration;

use beehive::Message as HiveMessage;
use beehive::constants::group;
use futures_util::StreamExt as _;
use hub::NodeLinks;
use serde_json::Value;
use tokio::sync::{mpsc, watch};
use tracing::{debug, warn};

use super::requests::ApiCall;
use super::watches::{ApiEvent, Outgoing, WatchSpec, WatchView};
use super::wire::{ApiStatus, Application, MODULE};
use super::{
    ApiServer, CenterConfig, CenterCounts, Input, answer_node, form_escape, refused_for_good, wire,
};
use crate::backoff::Backoff;

/// One forwarded watch: lists, queues what the node lacks, then follows
/// the changes; lists again when the API server can no longer resume.
pub(crate) struct Follower {
    pub(crate) api: Arc<dyn ApiServer>,
    pub(crate) links: NodeLinks,
    pub(crate) counts: Arc<watch::Sender<CenterCounts>>,
    pub(crate) inbox: mpsc::Sender<Input>,
    pub(crate) config: CenterConfig,
    pub(crate) node: String,
    pub(crate) id: String,
    pub(crate) spec: WatchSpec,
    pub(crate) view: WatchView,
}

impl Follower {
    pub(crate) async fn run(mut self, mut asked: Option<(HiveMessage, Application)>) {
        let collection = wire::ResourceKey {
            name: None,
            ..self.spec.key.clone()
        };
        let Ok(path) = collection.path("") else {
            return;
        };
        let selection =
            wire::list_query(&self.spec.options, &self.spec.key, wire::Reading::Listing);
        let list_path = match selection.is_empty() {
            true => path.clone(),
            false => format!("{path}?{selection}"),
        };
        let watch_query =
            wire::list_query(&self.spec.options, &self.spec.key, wire::Reading::Watch);
        let mut backoff = Backoff::new(Duration::from_millis(500), self.config.max_backoff);
        let mut resume: Option<String> = None;
        loop {
            if resume.is_none() {
                let list = match self.get(&list_path).await {
                    Ok(list) => list,
                    Err(status) => {
                        let asker = asked.take();
                        if asker.is_some() || refused_for_good(&status) {
                            // The node may not watch this: the asker is told,
                            // a watch the edge listed again ends.
                            return self.end(asker, status).await;
                        }
                        warn!(node = %self.node, id = %self.id, %status, "forwarded watch cannot list; trying again");
                        backoff.pause().await;
                        continue;
                    }
                };
                // The objects first, then the answer (as KubeEdge's
                // cloud): the edge starts its local watch from its store's
                // newest revision once approved, and passes on only what
                // arrives above it.
                for outgoing in self.view.listed(&list) {
                    self.queue(outgoing).await;
                }
                if let Some((msg, app)) = asked.take() {
                    answer_node(
                        &self.links,
                        &self.counts,
                        &self.node,
                        &msg,
                        app,
                        Ok(Vec::new()),
                    );
                }
                resume = list["metadata"]["resourceVersion"]
                    .as_str()
                    .map(str::to_owned);
            }
            let from = resume.clone().unwrap_or_default();
            let watch_path = format!(
                "{path}?{watch_query}&resourceVersion={}",
                form_escape(&from)
            );
            let mut events = match self.api.watch(&self.node, watch_path).await {
                Ok(events) => events,
                Err(status) if status.code == 410 => {
                    resume = None;
                    backoff.pause().await;
                    continue;
                }
                Err(status) if refused_for_good(&status) => return self.end(None, status).await,
                Err(status) => {
                    warn!(node = %self.node, id = %self.id, %status, "forwarded watch cannot watch; trying again");
                    backoff.pause().await;
                    continue;
                }
            };
            let mut changes = 0usize;
            while let Some(event) = events.next().await {
                let event = match event {
                    Ok(event) => event,
                    Err(status) => {
                        if status.code == 410 {
                            // Too old to resume: list again.
                            resume = None;
                        } else {
                            warn!(node = %self.node, id = %self.id, %status, "forwarded watch failed");
                        }
                        break;
                    }
                };
                changes += 1;
                let version = match &event {
                    ApiEvent::Bookmark(version) => Some(version.clone()),
                    ApiEvent::Added(o) | ApiEvent::Modified(o) | ApiEvent::Deleted(o) => {
                        o["metadata"]["resourceVersion"].as_str().map(str::to_owned)
                    }
                };
                if let Some(outgoing) = self.view.changed(event) {
                    self.queue(outgoing).await;
                }
                if version.is_some() {
                    resume = version;
                }
            }
            // A watch that ends at once, again and again, is not retried
            // at full speed.
            match changes {
                0 => backoff.pause().await,
                _ => backoff.reset(),
            }
        }
    }

    /// The API server's answer to a GET of `path`, as the node.
    pub(crate) async fn get(&self, path: &str) -> Result<Value, ApiStatus> {
        let call = ApiCall::get(path.to_owned(), true);
        let body = self.api.call(&self.node, call).await?;
        serde_json::from_slice(&body)
            .map_err(|err| ApiStatus::unavailable(format!("unreadable answer: {err}")))
    }

    /// Ends the watch: the API server refused it for good.
    pub(crate) async fn end(self, asker: Option<(HiveMessage, Application)>, status: ApiStatus) {
        warn!(node = %self.node, id = %self.id, %status, "forwarded watch refused");
        if let Some((msg, app)) = asker {
            answer_node(
                &self.links,
                &self.counts,
                &self.node,
                &msg,
                app,
                Err(status),
            );
        }
        let _ = self
            .inbox
            .send(Input::WatchEnded {
                node: self.node,
                id: self.id,
            })
            .await;
    }

    /// Queues one object for the node (waits until cloudhub has stored it
    /// in the node's queue). A delete goes only if the object is gone
    /// from the API server (not merely out of the selector); an object
    /// the queue did not take is sent again later.
    pub(crate) async fn queue(&mut self, outgoing: Outgoing) {
        let Outgoing {
            operation,
            resource,
            version,
            mut object,
            confirm,
        } = outgoing;
        if let Some(key) = confirm
            && let Ok(path) = key.path("")
        {
            match self.get(&path).await {
                Err(status) if status.code == 404 => {}
                Ok(_) => {
                    return debug!(node = %self.node, %resource, "left the watch's selector; kept at the edge");
                }
                Err(status) => {
                    return warn!(node = %self.node, %resource, %status, "deletion not confirmed; not sent");
                }
            }
        }
        wire::point_at_metaserver(&mut object);
        // Every object is acknowledged; one without a numeric revision
        // gets the clock's, which supersedes what the node holds.
        let version = version.unwrap_or_else(crate::desired::clock_revision);
        let msg = HiveMessage::new()
            .build_router(
                MODULE,
                group::RESOURCE,
                format!("node/{}/{resource}", self.node),
                operation,
            )
            .with_resource_version(version.to_string())
            .with_content(apis::kinds::object_content(&object));
        match self.links.deliver(msg, self.config.send_timeout).await {
            Ok(_) => {
                self.counts.send_modify(|c| c.queued += 1);
                return;
            }
            Err(refusal) => {
                warn!(node = %self.node, %resource, %refusal, "a watched object was not queued")
            }
        }
        self.view.forget(&resource);
    }
}
