//! Forwarded watches, as decisions with no I/O: which watches run for
//! which node ([`Watches`]), and what one watch sends its node
//! ([`WatchView`]).
//!
//! A KubeEdge edge's MetaServer asks the cloud to watch for it; the
//! changes then come down the node's reliable queue as ordinary objects
//! (insert, update, delete), which the edge stores and passes on to its
//! local watchers. The edge lists its watches now and then (when one
//! ends); the cloud stops those no longer on the list. A watch that has to
//! list again (its revision expired) sends only what changed since, and a
//! delete for each object gone meanwhile.
//!
//! Objects the edgecontroller sends the node itself (its own pods and
//! devices, and configmaps and secrets, which it sends only where pods use
//! them) are left to it: the two must not race on one queue entry. And a
//! delete is only a candidate ([`Outgoing::confirm`]): an object that left
//! a watch's selector is reported deleted too, and the caller sends the
//! delete only once the API server says the object is gone.

use std::collections::{BTreeMap, HashMap};

use serde_json::{Value, json};

use super::wire::ResourceKey;

/// What a watch is of: objects of one resource, filtered by the options
/// (ListOptions as JSON: label and field selectors).
#[derive(Debug, Clone, PartialEq)]
pub struct WatchSpec {
    /// The resource, perhaps one namespace or object of it.
    pub key: ResourceKey,
    /// The edge's ListOptions.
    pub options: Value,
}

/// Whether a new watch may start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// It is new: start it.
    Start,
    /// It runs already (the edge asked again): nothing to do.
    Running,
    /// The node runs as many as it may.
    TooMany,
}

/// What an edge's list of its watches asks for.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct SyncPlan {
    /// Watches to start.
    pub start: Vec<(String, WatchSpec)>,
    /// Watches to stop: the edge no longer has them.
    pub stop: Vec<String>,
    /// Watches not started: over the node's limit.
    pub refused: Vec<String>,
}

/// The watches that run, per node, by the edge's application id.
#[derive(Debug)]
pub struct Watches {
    by_node: HashMap<String, BTreeMap<String, WatchSpec>>,
    max_per_node: usize,
}

impl Watches {
    /// No watches; at most `max_per_node` for any node.
    pub fn new(max_per_node: usize) -> Watches {
        Watches {
            by_node: HashMap::new(),
            max_per_node,
        }
    }

    /// A node asks for watch `id`.
    pub fn admit(&mut self, node: &str, id: &str, spec: WatchSpec) -> Admission {
        let watches = self.by_node.entry(node.to_owned()).or_default();
        if watches.contains_key(id) {
            return Admission::Running;
        }
        if watches.len() >= self.max_per_node {
            return Admission::TooMany;
        }
        watches.insert(id.to_owned(), spec);
        Admission::Start
    }

    /// Watch `id` of `node` has ended (failed, or stopped); whether it ran.
    pub fn remove(&mut self, node: &str, id: &str) -> bool {
        let Some(watches) = self.by_node.get_mut(node) else {
            return false;
        };
        let removed = watches.remove(id).is_some();
        if watches.is_empty() {
            self.by_node.remove(node);
        }
        removed
    }

    /// A node lists every watch it holds: those missing here start, those
    /// not on the list stop.
    pub fn sync(&mut self, node: &str, listed: BTreeMap<String, WatchSpec>) -> SyncPlan {
        let running: Vec<String> = self
            .by_node
            .get(node)
            .map(|w| w.keys().cloned().collect())
            .unwrap_or_default();
        let mut plan = SyncPlan::default();
        for id in running {
            if !listed.contains_key(&id) {
                self.remove(node, &id);
                plan.stop.push(id);
            }
        }
        for (id, spec) in listed {
            match self.admit(node, &id, spec.clone()) {
                Admission::Start => plan.start.push((id, spec)),
                Admission::Running => {}
                Admission::TooMany => plan.refused.push(id),
            }
        }
        plan
    }

    /// How many watches run for `node`.
    pub fn of(&self, node: &str) -> usize {
        self.by_node.get(node).map_or(0, BTreeMap::len)
    }

    /// How many watches run in all.
    pub fn len(&self) -> usize {
        self.by_node.values().map(BTreeMap::len).sum()
    }

    /// Whether none runs.
    pub fn is_empty(&self) -> bool {
        self.by_node.is_empty()
    }
}

/// One change as the API server's watch reports it.
#[derive(Debug, Clone, PartialEq)]
pub enum ApiEvent {
    /// An object appeared.
    Added(Value),
    /// An object changed.
    Modified(Value),
    /// An object went; its last state.
    Deleted(Value),
    /// Nothing changed up to this revision.
    Bookmark(String),
}

/// An object to queue for the node.
#[derive(Debug, Clone, PartialEq)]
pub struct Outgoing {
    /// `insert`, `update` or `delete`.
    pub operation: &'static str,
    /// The edge's resource: `<namespace or null>/<type>/<name>`.
    pub resource: String,
    /// Its revision, where it has a numeric one (the queue drops older).
    pub version: Option<u64>,
    /// The object.
    pub object: Value,
    /// For a delete: the object's key, to confirm with the API server
    /// that it is gone (and not merely out of the selector) first.
    pub confirm: Option<ResourceKey>,
}

/// What one watch has sent its node: each object's resource and revision.
#[derive(Debug)]
pub struct WatchView {
    key: ResourceKey,
    node: String,
    sent: BTreeMap<String, Option<u64>>,
}

fn revision(object: &Value) -> Option<u64> {
    object["metadata"]["resourceVersion"].as_str()?.parse().ok()
}

impl WatchView {
    /// Nothing sent yet for `node`'s watch of `key`.
    pub fn new(key: ResourceKey, node: &str) -> WatchView {
        WatchView {
            key,
            node: node.to_owned(),
            sent: BTreeMap::new(),
        }
    }

    /// Whether the edgecontroller sends `object` to the node itself.
    fn controller_sends(&self, object: &Value) -> bool {
        let bound_here = || super::super::desired::bound_node(object) == Some(self.node.as_str());
        match (self.key.group.as_str(), self.key.resource.as_str()) {
            ("", "configmaps" | "secrets") => true,
            ("", "pods") | ("devices.kubeedge.io", "devices") => bound_here(),
            _ => false,
        }
    }

    /// The queue did not take `resource`: it counts as not sent, so the
    /// next listing or change sends it again.
    pub fn forget(&mut self, resource: &str) {
        self.sent.remove(resource);
    }

    /// The key of the object at `resource` (`<namespace>/<type>/<name>`).
    fn key_of(&self, resource: &str) -> ResourceKey {
        let mut parts = resource.splitn(3, '/');
        let namespace = parts.next().filter(|n| *n != "null").map(str::to_owned);
        let name = parts.nth(1).map(str::to_owned);
        ResourceKey {
            namespace,
            name,
            ..self.key.clone()
        }
    }

    /// How many objects the node holds from this watch.
    pub fn len(&self) -> usize {
        self.sent.len()
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.sent.is_empty()
    }

    fn resource_of(&self, object: &Value) -> Option<String> {
        let metadata = &object["metadata"];
        let name = metadata["name"].as_str().filter(|n| !n.is_empty())?;
        let namespace = metadata["namespace"].as_str().filter(|n| !n.is_empty());
        Some(format!(
            "{}/{}/{name}",
            namespace.unwrap_or("null"),
            self.key.edge_type()
        ))
    }

    /// A listing (the API server's List answer): what the node must get to
    /// hold exactly the listed objects: each new or newer object, and a
    /// delete for each it holds that is no longer listed.
    pub fn listed(&mut self, list: &Value) -> Vec<Outgoing> {
        let list_revision = revision(list);
        let api_version = list["apiVersion"].as_str().unwrap_or("v1");
        let kind = list["kind"].as_str().and_then(|k| k.strip_suffix("List"));
        let mut out = Vec::new();
        let mut listed = BTreeMap::new();
        for item in list["items"].as_array().into_iter().flatten() {
            let mut object = item.clone();
            // A list's items carry no type of their own; the edge files
            // objects by it.
            if object.get("kind").is_none()
                && let (Some(fields), Some(kind)) = (object.as_object_mut(), kind)
            {
                fields.insert("apiVersion".to_owned(), json!(api_version));
                fields.insert("kind".to_owned(), json!(kind));
            }
            let Some(resource) = self.resource_of(&object) else {
                continue;
            };
            if self.controller_sends(&object) {
                continue;
            }
            let version = revision(&object);
            listed.insert(resource.clone(), version);
            let operation = match self.sent.get(&resource) {
                None => "insert",
                Some(held) if newer(version, *held) => "update",
                Some(_) => continue,
            };
            out.push(Outgoing {
                operation,
                resource,
                version,
                object,
                confirm: None,
            });
        }
        for (resource, _) in std::mem::take(&mut self.sent) {
            if listed.contains_key(&resource) {
                continue;
            }
            let key = self.key_of(&resource);
            let mut metadata = json!({ "name": key.name });
            if let Some(namespace) = &key.namespace {
                metadata["namespace"] = json!(namespace);
            }
            if let Some(version) = list_revision {
                // Local watchers at the edge order events by it.
                metadata["resourceVersion"] = json!(version.to_string());
            }
            out.push(Outgoing {
                operation: "delete",
                resource,
                version: list_revision,
                object: json!({
                    "apiVersion": api_version,
                    "kind": kind.map_or_else(|| super::wire::resource_to_kind(&self.key.resource), str::to_owned),
                    "metadata": metadata,
                }),
                confirm: Some(key),
            });
        }
        self.sent = listed;
        out
    }

    /// A change from the watch: what the node must get, if anything (not
    /// what it holds already, nor a bookmark).
    pub fn changed(&mut self, event: ApiEvent) -> Option<Outgoing> {
        let (object, deleted) = match event {
            ApiEvent::Added(object) | ApiEvent::Modified(object) => (object, false),
            ApiEvent::Deleted(object) => (object, true),
            ApiEvent::Bookmark(_) => return None,
        };
        let resource = self.resource_of(&object)?;
        let version = revision(&object);
        if deleted {
            self.sent.remove(&resource)?;
            let confirm = Some(self.key_of(&resource));
            return Some(Outgoing {
                operation: "delete",
                resource,
                version,
                object,
                confirm,
            });
        }
        if self.controller_sends(&object) {
            // Now the edgecontroller's (a pod newly bound here): the watch
            // lets go of it without a word.
            self.sent.remove(&resource);
            return None;
        }
        let operation = match self.sent.get(&resource) {
            None => "insert",
            Some(held) if newer(version, *held) => "update",
            Some(_) => return None,
        };
        self.sent.insert(resource.clone(), version);
        Some(Outgoing {
            operation,
            resource,
            version,
            object,
            confirm: None,
        })
    }
}

/// Whether `version` supersedes `held` (unknown revisions always do).
fn newer(version: Option<u64>, held: Option<u64>) -> bool {
    match (version, held) {
        (Some(version), Some(held)) => version > held,
        _ => true,
    }
}

#[cfg(test)]
mod tests;
