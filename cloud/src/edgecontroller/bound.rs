//! The pods and devices bound to nodes, as the reconciler keeps them, with
//! an index of what each node's objects reference.
//!
//! A watch event of a pod asks "what does its node want now?" (to send the
//! configmaps and secrets it lacks and withdraw the ones nothing there uses
//! any more). Answered by scanning every bound object, that question made
//! each event cost as much as the cluster's pods, so a burst of N pods cost
//! N² (at 1,000 pods, a sixth of cloudcore's CPU went to it). Here every
//! insertion and removal keeps a count per node and referenced object, so
//! the answer is the node's own small map.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use apis::kinds::ObjectKey;

/// A pod or device bound to a node.
#[derive(Debug, Clone)]
pub(super) struct Bound {
    pub node: String,
    /// Its uid.
    pub uid: Option<String>,
    /// What it references.
    pub refs: BTreeSet<ObjectKey>,
    /// The revision of its last spec change: the version its node holds.
    pub spec: u64,
    /// The highest version it was sent at (a fresh one may be above
    /// `spec`): what follows must go above it.
    pub sent: u64,
    /// A digest of its desired part, to tell a spec change from a status
    /// change.
    pub digest: u64,
}

/// Bound objects by key, and per node the objects they reference with how
/// many of them do. Its node and references change only by insertion and
/// removal, which keep the index.
#[derive(Debug, Default)]
pub(super) struct BoundObjects {
    by_key: HashMap<ObjectKey, Bound>,
    /// Pods being deleted gracefully, no longer bound: their node and what
    /// they reference. They run until their node says they stopped, and a
    /// kubelet keeps a terminating pod's volumes until then, so what they
    /// use stays on the node (counted in `wanted`) until they are gone.
    ending: HashMap<ObjectKey, (String, BTreeSet<ObjectKey>)>,
    wanted: HashMap<String, BTreeMap<ObjectKey, usize>>,
}

impl BoundObjects {
    pub fn len(&self) -> usize {
        self.by_key.len()
    }

    pub fn get(&self, key: &ObjectKey) -> Option<&Bound> {
        self.by_key.get(key)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&ObjectKey, &Bound)> {
        self.by_key.iter()
    }

    pub fn keys(&self) -> impl Iterator<Item = &ObjectKey> {
        self.by_key.keys()
    }

    pub fn values(&self) -> impl Iterator<Item = &Bound> {
        self.by_key.values()
    }

    /// Binds `key`; what it replaces.
    pub fn insert(&mut self, key: ObjectKey, bound: Bound) -> Option<Bound> {
        let wanted = self.wanted.entry(bound.node.clone()).or_default();
        for reference in &bound.refs {
            *wanted.entry(reference.clone()).or_default() += 1;
        }
        let previous = self.by_key.insert(key, bound);
        if let Some(previous) = &previous {
            self.forget_refs(previous);
        }
        previous
    }

    pub fn remove(&mut self, key: &ObjectKey) -> Option<Bound> {
        let removed = self.by_key.remove(key)?;
        self.forget_refs(&removed);
        Some(removed)
    }

    /// `key`, unbound while its node stops it, keeps what it references
    /// wanted on `node` until [`BoundObjects::release_ending`].
    pub fn hold_while_ending(&mut self, key: ObjectKey, node: String, refs: BTreeSet<ObjectKey>) {
        self.release_ending(&key);
        let wanted = self.wanted.entry(node.clone()).or_default();
        for reference in &refs {
            *wanted.entry(reference.clone()).or_default() += 1;
        }
        self.ending.insert(key, (node, refs));
    }

    /// The pods being deleted that hold references: their node and what
    /// they reference.
    pub fn ending(&self) -> impl Iterator<Item = (&String, &BTreeSet<ObjectKey>)> {
        self.ending.values().map(|(node, refs)| (node, refs))
    }

    /// `key`'s graceful deletion is over: what it referenced is no longer
    /// wanted for it. Its node, if it was held.
    pub fn release_ending(&mut self, key: &ObjectKey) -> Option<String> {
        let (node, refs) = self.ending.remove(key)?;
        forget(&mut self.wanted, &node, &refs);
        Some(node)
    }

    fn forget_refs(&mut self, bound: &Bound) {
        forget(&mut self.wanted, &bound.node, &bound.refs);
    }

    /// `key` went to its node at `version`.
    pub fn note_sent(&mut self, key: &ObjectKey, version: u64) {
        if let Some(bound) = self.by_key.get_mut(key) {
            bound.sent = bound.sent.max(version);
        }
    }

    /// `key`'s desired part is now `digest`, changed at `spec`.
    pub fn note_rewritten(&mut self, key: &ObjectKey, digest: u64, spec: u64) {
        if let Some(bound) = self.by_key.get_mut(key) {
            bound.digest = digest;
            bound.spec = bound.spec.max(spec);
        }
    }

    /// What `node`'s objects reference, in key order.
    pub fn wanted(&self, node: &str) -> impl Iterator<Item = &ObjectKey> {
        self.wanted.get(node).into_iter().flat_map(BTreeMap::keys)
    }

    /// Whether anything on `node` references `key`.
    pub fn is_wanted(&self, node: &str, key: &ObjectKey) -> bool {
        self.wanted
            .get(node)
            .is_some_and(|wanted| wanted.contains_key(key))
    }

    /// The nodes where something references `key`.
    pub fn nodes_wanting(&self, key: &ObjectKey) -> BTreeSet<String> {
        self.wanted
            .iter()
            .filter(|(_, wanted)| wanted.contains_key(key))
            .map(|(node, _)| node.clone())
            .collect()
    }
}

/// `refs` are referenced once less on `node`.
fn forget(
    wanted: &mut HashMap<String, BTreeMap<ObjectKey, usize>>,
    node: &str,
    refs: &BTreeSet<ObjectKey>,
) {
    let Some(counts) = wanted.get_mut(node) else {
        return;
    };
    for reference in refs {
        if let Some(count) = counts.get_mut(reference) {
            *count -= 1;
            if *count == 0 {
                counts.remove(reference);
            }
        }
    }
    if counts.is_empty() {
        wanted.remove(node);
    }
}

#[cfg(test)]
mod tests {
    use apis::kinds::Kind;

    use super::*;
    use crate::test_rng::Rng;

    fn configmap(name: &str) -> ObjectKey {
        ObjectKey::new(Kind::ConfigMap, "default", name)
    }

    fn pod(name: &str) -> ObjectKey {
        ObjectKey::new(Kind::Pod, "default", name)
    }

    fn bound(node: &str, refs: &[&str]) -> Bound {
        Bound {
            node: node.to_owned(),
            uid: None,
            refs: refs.iter().map(|name| configmap(name)).collect(),
            spec: 1,
            sent: 1,
            digest: 0,
        }
    }

    /// The index as a scan of every bound object computes it.
    fn scanned(objects: &BoundObjects, node: &str) -> Vec<ObjectKey> {
        objects
            .values()
            .filter(|bound| bound.node == node)
            .flat_map(|bound| bound.refs.iter().cloned())
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect()
    }

    #[test]
    fn an_ending_pod_keeps_what_it_uses_until_released() {
        let mut objects = BoundObjects::default();
        objects.insert(pod("a"), bound("n1", &["own-a"]));
        let removed = objects.remove(&pod("a")).expect("bound");
        objects.hold_while_ending(pod("a"), removed.node.clone(), removed.refs.clone());
        assert!(objects.is_wanted("n1", &configmap("own-a")));
        // Held twice (listed again while ending) counts once.
        objects.hold_while_ending(pod("a"), removed.node, removed.refs);
        assert_eq!(objects.release_ending(&pod("a")).as_deref(), Some("n1"));
        assert!(!objects.is_wanted("n1", &configmap("own-a")));
        assert_eq!(objects.release_ending(&pod("a")), None);
        assert_eq!(objects.wanted("n1").count(), 0);
    }

    #[test]
    fn a_reference_is_wanted_while_one_object_on_the_node_holds_it() {
        let mut objects = BoundObjects::default();
        objects.insert(pod("a"), bound("n1", &["shared", "own-a"]));
        objects.insert(pod("b"), bound("n1", &["shared"]));
        objects.insert(pod("c"), bound("n2", &["shared"]));
        assert_eq!(
            objects.wanted("n1").cloned().collect::<Vec<_>>(),
            vec![configmap("own-a"), configmap("shared")]
        );
        assert_eq!(
            objects.nodes_wanting(&configmap("shared")),
            BTreeSet::from(["n1".to_owned(), "n2".to_owned()])
        );

        objects.remove(&pod("a"));
        assert!(!objects.is_wanted("n1", &configmap("own-a")));
        assert!(objects.is_wanted("n1", &configmap("shared")));
        objects.remove(&pod("b"));
        assert_eq!(objects.wanted("n1").count(), 0);
        assert_eq!(
            objects.nodes_wanting(&configmap("shared")),
            BTreeSet::from(["n2".to_owned()])
        );
    }

    #[test]
    fn rebinding_moves_its_references_with_it() {
        let mut objects = BoundObjects::default();
        objects.insert(pod("a"), bound("n1", &["x"]));
        let previous = objects.insert(pod("a"), bound("n2", &["y"]));
        assert_eq!(previous.map(|p| p.node), Some("n1".to_owned()));
        assert_eq!(objects.wanted("n1").count(), 0);
        assert_eq!(
            objects.wanted("n2").cloned().collect::<Vec<_>>(),
            vec![configmap("y")]
        );
        // Bound again on the same node with the same reference: one count.
        objects.insert(pod("a"), bound("n2", &["y"]));
        objects.remove(&pod("a"));
        assert_eq!(objects.wanted("n2").count(), 0);
    }

    #[test]
    fn the_index_agrees_with_a_scan_after_random_changes() {
        for seed in 0..50 {
            let mut rng = Rng(seed * 7919 + 1);
            let mut objects = BoundObjects::default();
            let nodes = ["n1", "n2", "n3"];
            let names = ["c1", "c2", "c3", "c4"];
            for _ in 0..200 {
                let key = pod(&format!("p{}", rng.below(12)));
                if rng.below(3) == 0 {
                    objects.remove(&key);
                } else {
                    let node = nodes[rng.below(nodes.len())];
                    let refs: Vec<&str> = names
                        .iter()
                        .copied()
                        .filter(|_| rng.below(2) == 0)
                        .collect();
                    objects.insert(key, bound(node, &refs));
                }
                for node in nodes {
                    assert_eq!(
                        objects.wanted(node).cloned().collect::<Vec<_>>(),
                        scanned(&objects, node),
                        "seed {seed}, node {node}"
                    );
                }
            }
        }
    }
}
