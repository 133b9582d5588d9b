//! Objects kept compactly: a watched or recently changed object held as
//! its MessagePack encoding, not as a tree of `serde_json::Value`s.
//!
//! A pod as a `serde_json::Value` (an [`Object`]'s body) takes about six times its JSON size
//! (every map a tree of owned strings); its MessagePack encoding takes a
//! little less than its JSON. The watch caches and the change feed hold
//! [`Packed`] objects, shared between the two (one allocation per object
//! and revision, counted once), and decode one when a reader asks for it:
//! a read pays what a deep clone of the tree used to cost.

use std::sync::Arc;

use apis::kinds::ObjectKey;

use super::{DesiredError, Object, WatchEvent};

/// One object, encoded; cheap to clone (the bytes are shared).
#[derive(Clone, PartialEq, Eq)]
pub struct Packed(Arc<[u8]>);

impl std::fmt::Debug for Packed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Packed({} bytes)", self.0.len())
    }
}

impl Packed {
    /// `object`, encoded.
    pub fn pack(object: &Object) -> Result<Packed, DesiredError> {
        rmp_serde::to_vec(object)
            .map(|bytes| Packed(bytes.into()))
            .map_err(|err| DesiredError::Corrupt {
                key: object.key().to_string(),
                reason: format!("not encodable: {err}"),
            })
    }

    /// The object again.
    pub fn unpack(&self) -> Result<Object, DesiredError> {
        rmp_serde::from_slice(&self.0).map_err(|err| DesiredError::Corrupt {
            key: "(cached object)".to_owned(),
            reason: err.to_string(),
        })
    }

    /// The encoding's size in bytes.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether the encoding is empty (it never is for an object).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// What a change did to its object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChangeKind {
    /// Created (or newly kept).
    Added,
    /// Changed.
    Modified,
    /// Removed (or no longer kept): the object's last state.
    Deleted,
}

/// A [`WatchEvent`] kept compactly, with what the feed needs to order and
/// compact it without decoding.
#[derive(Debug, Clone, PartialEq)]
pub struct PackedEvent {
    /// What happened.
    pub change: ChangeKind,
    /// The object's key.
    pub key: ObjectKey,
    /// The change's revision.
    pub revision: u64,
    /// The object (for a deletion, its last state).
    pub object: Packed,
}

impl PackedEvent {
    /// `change` of `object`, packed.
    pub fn new(change: ChangeKind, object: &Object) -> Result<PackedEvent, DesiredError> {
        PackedEvent::sharing(change, object, Packed::pack(object)?)
    }

    /// `change` of `object`, whose encoding `packed` already is (shared
    /// with a cache).
    pub fn sharing(
        change: ChangeKind,
        object: &Object,
        packed: Packed,
    ) -> Result<PackedEvent, DesiredError> {
        Ok(PackedEvent {
            change,
            key: object.key().clone(),
            revision: object.revision(),
            object: packed,
        })
    }

    /// `event`, packed.
    pub fn of(event: &WatchEvent) -> Result<PackedEvent, DesiredError> {
        let change = match event {
            WatchEvent::Added(_) => ChangeKind::Added,
            WatchEvent::Modified(_) => ChangeKind::Modified,
            WatchEvent::Deleted(_) => ChangeKind::Deleted,
        };
        PackedEvent::new(change, event.object())
    }

    /// The event again, its object decoded.
    pub fn unpack(&self) -> Result<WatchEvent, DesiredError> {
        let object = self.object.unpack()?;
        Ok(match self.change {
            ChangeKind::Added => WatchEvent::Added(object),
            ChangeKind::Modified => WatchEvent::Modified(object),
            ChangeKind::Deleted => WatchEvent::Deleted(object),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn an_object_comes_back_as_it_went_in_and_smaller_than_its_json() {
        let pod = Object::new(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "namespace": "default", "resourceVersion": "42",
                         "labels": {"app": "x"}, "uid": "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"},
            "spec": {"nodeName": "edge-1", "terminationGracePeriodSeconds": 30,
                     "containers": [{"name": "c", "image": "busybox", "command": ["sleep", "1e9"],
                                     "resources": {"limits": {"cpu": "100m"}}}],
                     "tolerations": [{"key": "node.kubernetes.io/unreachable", "operator": "Exists",
                                      "effect": "NoExecute", "tolerationSeconds": 300}],
                     "priority": -5, "ratio": 0.25, "flag": true, "none": null},
        }))
        .expect("a pod");
        let packed = Packed::pack(&pod).expect("pack");
        assert_eq!(packed.unpack().expect("unpack"), pod);
        let json = serde_json::to_vec(&pod).expect("json").len();
        assert!(
            packed.len() < json,
            "{} bytes packed, {json} as JSON",
            packed.len()
        );

        let event = PackedEvent::new(ChangeKind::Modified, &pod).expect("event");
        assert_eq!(event.revision, 42);
        assert_eq!(&event.key, pod.key());
        assert_eq!(event.unpack().expect("unpack"), WatchEvent::Modified(pod));
    }

    #[test]
    fn garbage_is_a_clear_error() {
        let garbage = Packed(Arc::from(&[0xc1u8, 0xff, 0x00][..]));
        assert!(matches!(
            garbage.unpack(),
            Err(DesiredError::Corrupt { .. })
        ));
    }
}
