//! What cloudhub tells the cloud's modules about its nodes: typed events
//! on a channel of their own, not beehive messages. A node cannot speak on
//! this channel, and the controller reads no JSON keys.
//!
//! The events: a node linked here (in its dialect), its link ended,
//! another replica serves it now, and the node holds the deletion of an
//! object.

use std::sync::{Arc, Mutex, PoisonError};

use beehive::resource::EdgeResource;
use tokio::sync::mpsc;

use crate::Dialect;

/// Something that happened to one node's link.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeEvent {
    /// The node's name.
    pub node: String,
    /// What happened.
    pub kind: NodeEventKind,
}

/// What happened to a node's link.
#[derive(Debug, Clone, PartialEq)]
pub enum NodeEventKind {
    /// The node linked here and speaks this dialect.
    Connected(Dialect),
    /// Its link here ended; this replica still holds the node.
    Disconnected,
    /// Its link here ended and another replica holds the node now: nothing
    /// is to be said about it from here.
    ServedElsewhere,
    /// The node acknowledged the deletion of this object (an edgehive edge
    /// has persisted it), so the controller may finish deleting it.
    Deleted(EdgeResource),
}

/// The channel: cloudhub publishes, each subscriber gets every event in
/// the order published. Clones share the subscribers.
#[derive(Clone, Default)]
pub struct NodeEvents {
    subscribers: Arc<Mutex<Vec<mpsc::UnboundedSender<NodeEvent>>>>,
}

impl std::fmt::Debug for NodeEvents {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let subscribers = self
            .subscribers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len();
        f.debug_struct("NodeEvents")
            .field("subscribers", &subscribers)
            .finish()
    }
}

impl NodeEvents {
    /// The events published from now on.
    ///
    /// The channel is unbounded: events come at the rate nodes link and
    /// unlink, and the old hive route queued them without a bound too (one
    /// task per event).
    pub fn subscribe(&self) -> mpsc::UnboundedReceiver<NodeEvent> {
        let (tx, rx) = mpsc::unbounded_channel();
        self.subscribers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(tx);
        rx
    }

    /// Tells every subscriber; those that went away are dropped (only
    /// cloudhub publishes).
    pub(crate) fn publish(&self, event: NodeEvent) {
        self.subscribers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|subscriber| subscriber.send(event.clone()).is_ok());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(node: &str, kind: NodeEventKind) -> NodeEvent {
        NodeEvent {
            node: node.to_owned(),
            kind,
        }
    }

    #[test]
    fn every_subscriber_gets_every_event_in_order_and_the_gone_are_dropped() {
        let events = NodeEvents::default();
        let mut first = events.subscribe();
        let second = events.subscribe();
        drop(second);
        events.publish(event("a", NodeEventKind::Connected(Dialect::KubeEdge)));
        events.publish(event("a", NodeEventKind::Disconnected));
        assert_eq!(format!("{events:?}"), "NodeEvents { subscribers: 1 }");
        assert_eq!(
            first.try_recv().ok(),
            Some(event("a", NodeEventKind::Connected(Dialect::KubeEdge)))
        );
        assert_eq!(
            first.try_recv().ok(),
            Some(event("a", NodeEventKind::Disconnected))
        );
        assert!(first.try_recv().is_err());
    }
}
