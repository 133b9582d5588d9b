//! When a deletion's tombstone may leave the edge store: a plain rule with
//! no I/O (the revisions are passed in), so it can be tested on its own.
//!
//! # Why tombstones exist
//!
//! A deletion of `<ns>/<type>/<name>` at version `D` leaves a record with
//! no object and version `D`; an upsert of that resource at a version `<= D`
//! is then refused as stale. Without it, an older upsert arriving after the
//! deletion would bring the object back (and edged would start the pod
//! again).
//!
//! # Where an older message could come from
//!
//! - The link: cloudhub's per-node queue ([`hub::queue::NodeQueue`]) keeps
//!   only the newest version of an object, has at most one version of it
//!   in flight, and sends the newest after the ack of the one before. The
//!   transports deliver a link's frames in order, and the edge has one
//!   link at a time (a new one is dialled only after the old one ended),
//!   so a resend of an older version (after `resend_overdue` or a lost
//!   link) reaches the edge *before* the deletion that replaced it, never
//!   after. After the deletion is acknowledged the queue holds nothing of
//!   that object.
//! - A cloud restart: the queue is restored from redb, newest version per
//!   object (a deletion pushed replaced the older version before it was
//!   sent), so nothing older than `D` comes back from it.
//! - The edgecontroller: it sends from its view of the desired state, in
//!   revision order per kind. A replica whose view lags behind the deletion
//!   (one that took the node over and has not handled the deletion's
//!   event yet) can still send the object at an older version. This is the
//!   case the tombstone is for.
//!
//! # The rule
//!
//! A tombstone may go once no message carrying an older version of its
//! resource can still arrive. The edge learns that from the cloud: when the
//! edgecontroller asks a node for its inventory (on every link, before it
//! brings the node in step), it says up to which revision it has handled
//! each resource type's changes (a [`Watermark`]). That replica is the one
//! sending to this node; having handled a type up to `W`, it knows of every
//! deletion of that type at or below `W`; it sends such a resource again
//! only where its view wants it on the node, at a version above the
//! deletion (a re-created object's own, later revision, or a fresh
//! revision above every one issued so far). So
//! a tombstone of type `t` at version `D` goes once a watermark with
//! `W[t] >= D` has been received. A type the watermark does not name, or a
//! tombstone whose version is not a number, is kept.
//!
//! A replica that takes the node over later asks for the inventory again;
//! the inventory never lists tombstones, so whatever it finds missing and
//! wants there it sends at a fresh revision, above any tombstone — with the
//! tombstone kept or pruned alike. Pruning therefore never lets an object
//! come back that a kept tombstone would have kept away.
//!
//! The number of tombstones held is then bounded by the deletions not yet
//! covered by the last watermark. Types the cloud does not follow
//! (services, endpoints), and an edge talking to a KubeEdge cloud (which
//! asks for no inventory), get no watermark: their tombstones are kept.

pub use apis::inventory::Watermark;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{Record, supersedes};
    use std::collections::HashMap;

    #[test]
    fn a_watermark_covers_its_types_up_to_their_revisions() {
        let w = Watermark::of([("pod", 10), ("configmap", 3)]);
        assert!(w.covers("default/pod/a", "10"));
        assert!(w.covers("default/pod/a", "2"));
        assert!(!w.covers("default/pod/a", "11"));
        assert!(!w.covers("default/configmap/c", "4"));
        assert!(!w.covers("default/secret/s", "1"), "a type not named");
        assert!(!w.covers("default/pod/a", "abc"), "not a number");
        assert!(!w.covers("nonsense", "1"));
        let mut merged = Watermark::of([("pod", 12)]);
        merged.merge(&w);
        assert_eq!(merged, Watermark::of([("pod", 12), ("configmap", 3)]));
        assert!(Watermark::default().is_empty());
    }

    /// The edge store's decision, in memory.
    #[derive(Default)]
    struct Edge {
        held: HashMap<String, Record>,
    }

    impl Edge {
        fn apply(&mut self, resource: &str, record: Record) -> bool {
            let fresh = self
                .held
                .get(resource)
                .is_none_or(|held| supersedes(&record.version, &held.version));
            if fresh {
                self.held.insert(resource.to_owned(), record);
            }
            fresh
        }

        fn prune(&mut self, watermark: &Watermark) -> usize {
            let before = self.held.len();
            self.held
                .retain(|resource, r| !(r.is_deleted() && watermark.covers(resource, &r.version)));
            before - self.held.len()
        }

        fn tombstones(&self) -> usize {
            self.held.values().filter(|r| r.is_deleted()).count()
        }
    }

    /// What the tombstone is for: a sender whose view lags behind a
    /// deletion sends an older version. Before the watermark covers the
    /// deletion it is refused; after pruning, only a sender whose
    /// watermark covered the deletion is speaking, and it sends above it.
    #[test]
    fn a_late_older_upsert_is_refused_until_a_watermark_covers_the_deletion() {
        let mut edge = Edge::default();
        assert!(edge.apply(
            "default/pod/a",
            Record {
                version: "5".into(),
                object: Some(beehive::Content::of(&5).expect("number")),
            }
        ));
        assert!(edge.apply(
            "default/pod/a",
            Record {
                version: "9".into(),
                object: None,
            }
        ));
        // A lagging replica's older version.
        assert!(!edge.apply(
            "default/pod/a",
            Record {
                version: "5".into(),
                object: Some(beehive::Content::of(&5).expect("number")),
            }
        ));
        // A watermark below the deletion prunes nothing.
        assert_eq!(edge.prune(&Watermark::of([("pod", 8)])), 0);
        assert!(!edge.apply(
            "default/pod/a",
            Record {
                version: "7".into(),
                object: Some(beehive::Content::of(&7).expect("number")),
            }
        ));
        assert_eq!(
            edge.prune(&Watermark::of([("pod", 9), ("configmap", 100)])),
            1
        );
        assert_eq!(edge.tombstones(), 0);
    }
}
