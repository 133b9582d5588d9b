//! The cloud's inventory question to an edge and the edge's answer: what
//! the edge holds of the kinds the cloud controls, and up to which
//! revision the cloud has handled each kind's changes (so the edge may drop
//! its tombstones below it; see the meta crate's `tombstones` module).
//!
//! The question: resource `node/<node>/inventory`, operation `query`,
//! content a [`Watermark`] (`{"handled": {"pod": 42, ...}}`). The answer:
//! [`Held`], each object's edge resource with the version held.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// What an edge holds: each object's resource (`<ns>/<type>/<name>`) and
/// the version it holds it at.
pub type Held = BTreeMap<String, String>;

/// Up to which revision the cloud has handled each resource type's changes
/// (`pod`, `configmap`, ...), as it says when it asks for the inventory.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Watermark {
    /// Resource type -> revision handled.
    pub handled: BTreeMap<String, u64>,
}

impl Watermark {
    /// A watermark of `(type, revision)` pairs.
    pub fn of<'a>(handled: impl IntoIterator<Item = (&'a str, u64)>) -> Watermark {
        Watermark {
            handled: handled
                .into_iter()
                .map(|(kind, revision)| (kind.to_owned(), revision))
                .collect(),
        }
    }

    /// Whether nothing is covered.
    pub fn is_empty(&self) -> bool {
        self.handled.is_empty()
    }

    /// Takes the higher of each type's revisions (watermarks only grow:
    /// a lower one, from an older question, covers less).
    pub fn merge(&mut self, other: &Watermark) {
        for (kind, revision) in &other.handled {
            let at = self.handled.entry(kind.clone()).or_default();
            *at = (*at).max(*revision);
        }
    }

    /// Whether the tombstone of `resource` (`<ns>/<type>/<name>`) at
    /// `version` may go: its type is handled at or above `version`.
    pub fn covers(&self, resource: &str, version: &str) -> bool {
        let Some(kind) = resource.split('/').nth(1) else {
            return false;
        };
        let Ok(version) = version.parse::<u64>() else {
            return false;
        };
        self.handled.get(kind).is_some_and(|at| *at >= version)
    }
}
