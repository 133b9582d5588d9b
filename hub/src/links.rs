//! How the cloud's modules hand cloudhub messages for nodes and hear what
//! became of each: a typed channel ([`NodeLinks`]) with a typed answer,
//! [`Delivery`] or [`Refusal`], instead of beehive messages answered with
//! JSON.
//!
//! An object (a message with a resource version) is answered once it is
//! committed to the node's queue store, so a [`Delivery::Queued`] object
//! survives a crash of the cloud (with a queue store configured; without
//! one the queues live in memory). Anything else is sent on the node's
//! link now or never ([`Delivery::Sent`] or [`Refusal::NotLinked`]).
//! Queries, whose answer is the node's, go through beehive's `send_sync`;
//! cloudhub refuses them in the same terms ([`Refusal::reply`]).
//!
//! Unlike a beehive mailbox, the channel is not drained when cloudhub
//! stops: what is still in it is dropped, and its senders hear
//! [`Refusal::Stopped`]. Nothing acknowledged is lost by that, since an
//! object is acknowledged only once committed, and the controller sends
//! again what it did not see taken.

use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use beehive::Content;
use beehive::IntoRouteName as _;
use beehive::Message as HiveMessage;
use beehive::constants::operation;
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, oneshot};
use tokio::time::{Instant, timeout_at};

/// What became of a message cloudhub took.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Delivery {
    /// An object, committed to the node's queue: it reaches the node,
    /// also after a crash of the cloud.
    Queued,
    /// An object that replaced an older version of itself in the queue,
    /// committed likewise.
    Coalesced,
    /// An object older than the version the queue holds: dropped.
    Stale,
    /// Not an object: sent on the node's link.
    Sent,
}

/// cloudhub's answer, through beehive, to a message it took:
/// `{"outcome": "queued"}` and the like.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Delivered {
    /// What became of it.
    pub outcome: Delivery,
}

impl Delivered {
    /// As a message's content.
    pub fn content(self) -> Content {
        Content::of(&self).expect("a name encodes")
    }
}

impl Delivery {
    /// Its name, as answers through beehive say it.
    pub fn as_str(self) -> &'static str {
        match self {
            Delivery::Queued => "queued",
            Delivery::Coalesced => "coalesced",
            Delivery::Stale => "stale",
            Delivery::Sent => "sent",
        }
    }
}

/// Why cloudhub did not take a message for a node.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// The message names no node (`node/<node>/...`).
    #[error("no node/<node>/ in the resource")]
    NoNode,
    /// Not an object, and the node has no link here.
    #[error("node {0} is not connected")]
    NotLinked(String),
    /// The node's queue holds its most objects.
    #[error("node {0}'s queue is full; the node needs a resync")]
    QueueFull(String),
    /// The queue store could not commit the object.
    #[error("the object was not made durable: {0}")]
    NotDurable(String),
    /// cloudhub did not take it in time.
    #[error("cloudhub did not answer within {0:?}")]
    TimedOut(Duration),
    /// cloudhub stopped, or never started.
    #[error("cloudhub is not running")]
    Stopped,
}

impl Refusal {
    /// The refusal as an answer to `request` through beehive: an `error`
    /// operation with the reason as its content (the one shape cloudhub
    /// refuses in).
    pub fn reply(&self, mut request_reply: HiveMessage) -> HiveMessage {
        request_reply.router.operation = operation::ERROR.into_route_name();
        request_reply.with_content(self.to_string())
    }
}

/// What one message to a node comes to.
pub type Outcome = Result<Delivery, Refusal>;

/// A message on its way to cloudhub, with where its outcome goes.
#[derive(Debug)]
pub struct ToNode {
    /// The message, `node/<node>/...` in its resource.
    pub msg: HiveMessage,
    /// Told the outcome, if anyone waits for it.
    pub outcome: Option<oneshot::Sender<Outcome>>,
}

impl actix::Message for ToNode {
    type Result = ();
}

/// The channel to cloudhub. Clones share it; cloudhub takes its receiving
/// end when it starts ([`CloudHubConfig::links`](crate::CloudHubConfig)).
#[derive(Clone)]
pub struct NodeLinks {
    tx: mpsc::Sender<ToNode>,
    rx: Arc<Mutex<Option<mpsc::Receiver<ToNode>>>>,
}

impl std::fmt::Debug for NodeLinks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeLinks")
            .field("waiting", &(self.tx.max_capacity() - self.tx.capacity()))
            .finish()
    }
}

impl Default for NodeLinks {
    fn default() -> Self {
        NodeLinks::new(1024)
    }
}

impl NodeLinks {
    /// A channel that holds `capacity` messages before senders wait (as a
    /// beehive mailbox does).
    pub fn new(capacity: usize) -> Self {
        let (tx, rx) = mpsc::channel(capacity.max(1));
        NodeLinks {
            tx,
            rx: Arc::new(Mutex::new(Some(rx))),
        }
    }

    /// Hands `msg` to cloudhub without waiting for its outcome, waiting at
    /// most `timeout` for room in the channel.
    pub async fn send(&self, msg: HiveMessage, timeout: Duration) -> Result<(), Refusal> {
        let sent = self.tx.send(ToNode { msg, outcome: None });
        match tokio::time::timeout(timeout, sent).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(_)) => Err(Refusal::Stopped),
            Err(_) => Err(Refusal::TimedOut(timeout)),
        }
    }

    /// Hands `msg` to cloudhub and returns once it is in cloudhub's channel
    /// (messages queued one after another arrive in that order), with its
    /// outcome to await, within `timeout` from now: a sender of many does
    /// not wait a commit for each.
    pub async fn queue(
        &self,
        msg: HiveMessage,
        timeout: Duration,
    ) -> Result<impl Future<Output = Outcome> + Send + 'static, Refusal> {
        let deadline = Instant::now() + timeout;
        let (tx, rx) = oneshot::channel();
        let sent = self.tx.send(ToNode {
            msg,
            outcome: Some(tx),
        });
        match timeout_at(deadline, sent).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) => return Err(Refusal::Stopped),
            Err(_) => return Err(Refusal::TimedOut(timeout)),
        }
        Ok(async move {
            match timeout_at(deadline, rx).await {
                Ok(Ok(outcome)) => outcome,
                Ok(Err(_)) => Err(Refusal::Stopped),
                Err(_) => Err(Refusal::TimedOut(timeout)),
            }
        })
    }

    /// [`NodeLinks::queue`], and its outcome.
    pub async fn deliver(&self, msg: HiveMessage, timeout: Duration) -> Outcome {
        self.queue(msg, timeout).await?.await
    }

    /// The receiving end, for the cloudhub that starts first.
    pub(crate) fn take_inbox(&self) -> Option<mpsc::Receiver<ToNode>> {
        self.rx
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg() -> HiveMessage {
        HiveMessage::new().build_router(
            "edgecontroller",
            "resource",
            "node/a/default/pod/p",
            "update",
        )
    }

    #[tokio::test]
    async fn outcomes_come_back_typed_and_in_the_order_sent() {
        let links = NodeLinks::new(4);
        let mut inbox = links.take_inbox().expect("inbox");
        assert!(links.take_inbox().is_none(), "taken once");
        let first = links
            .queue(msg(), Duration::from_secs(5))
            .await
            .expect("queued");
        let second = links
            .queue(msg(), Duration::from_secs(5))
            .await
            .expect("queued");
        let a = inbox.recv().await.expect("first");
        let b = inbox.recv().await.expect("second");
        let _ = b
            .outcome
            .expect("waited")
            .send(Err(Refusal::QueueFull("a".to_owned())));
        let _ = a.outcome.expect("waited").send(Ok(Delivery::Queued));
        assert_eq!(first.await, Ok(Delivery::Queued));
        assert_eq!(second.await, Err(Refusal::QueueFull("a".to_owned())));
    }

    #[tokio::test]
    async fn no_answer_is_a_timeout_and_a_dropped_hub_is_stopped() {
        let links = NodeLinks::new(1);
        let mut inbox = links.take_inbox().expect("inbox");
        let unanswered = links.deliver(msg(), Duration::from_millis(50)).await;
        assert_eq!(
            unanswered,
            Err(Refusal::TimedOut(Duration::from_millis(50)))
        );
        drop(inbox.recv().await);
        let pending = links
            .queue(msg(), Duration::from_secs(5))
            .await
            .expect("queued");
        drop(inbox.recv().await);
        assert_eq!(pending.await, Err(Refusal::Stopped));
        drop(inbox);
        assert_eq!(
            links.send(msg(), Duration::from_secs(5)).await,
            Err(Refusal::Stopped)
        );
    }
}
