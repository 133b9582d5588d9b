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
mod tests {
    use super::*;
    use crate::dynamiccontroller::wire::Target;

    fn services() -> ResourceKey {
        match Target::parse("/core/v1/services/default/null") {
            Ok(Target::Resource(key)) => key,
            other => panic!("a resource key: {other:?}"),
        }
    }

    fn spec() -> WatchSpec {
        WatchSpec {
            key: services(),
            options: json!({}),
        }
    }

    fn service(name: &str, rv: u64) -> Value {
        json!({"metadata": {"name": name, "namespace": "default", "resourceVersion": rv.to_string()}})
    }

    fn list(rv: u64, items: Vec<Value>) -> Value {
        json!({"apiVersion": "v1", "kind": "ServiceList",
               "metadata": {"resourceVersion": rv.to_string()}, "items": items})
    }

    fn ops(out: &[Outgoing]) -> Vec<(&str, &str)> {
        out.iter()
            .map(|o| (o.operation, o.resource.as_str()))
            .collect()
    }

    #[test]
    fn a_node_runs_each_watch_once_and_no_more_than_its_share() {
        let mut watches = Watches::new(2);
        assert_eq!(watches.admit("n1", "a", spec()), Admission::Start);
        assert_eq!(watches.admit("n1", "a", spec()), Admission::Running);
        assert_eq!(watches.admit("n1", "b", spec()), Admission::Start);
        assert_eq!(watches.admit("n1", "c", spec()), Admission::TooMany);
        // Another node has a share of its own.
        assert_eq!(watches.admit("n2", "c", spec()), Admission::Start);
        assert_eq!((watches.of("n1"), watches.len()), (2, 3));
        assert!(watches.remove("n1", "a"));
        assert!(!watches.remove("n1", "a"));
        assert_eq!(watches.admit("n1", "c", spec()), Admission::Start);
    }

    #[test]
    fn the_edges_list_of_watches_starts_and_stops_them() {
        let mut watches = Watches::new(3);
        watches.admit("n1", "a", spec());
        watches.admit("n1", "b", spec());
        watches.admit("n2", "b", spec());
        let listed = ["b", "c", "d", "e"]
            .into_iter()
            .map(|id| (id.to_owned(), spec()))
            .collect();
        let plan = watches.sync("n1", listed);
        assert_eq!(plan.stop, vec!["a".to_owned()]);
        let started: Vec<&str> = plan.start.iter().map(|(id, _)| id.as_str()).collect();
        assert_eq!(started, vec!["c", "d"]);
        assert_eq!(plan.refused, vec!["e".to_owned()]);
        // n2's are its own.
        assert_eq!(watches.of("n2"), 1);
        // An empty list stops them all.
        let plan = watches.sync("n1", BTreeMap::new());
        assert_eq!(plan.stop.len(), 3);
        assert!(plan.start.is_empty());
        assert_eq!(watches.of("n1"), 0);
    }

    #[test]
    fn a_listing_sends_what_the_node_lacks_and_withdraws_what_went() {
        let mut view = WatchView::new(services(), "edge-1");
        let out = view.listed(&list(10, vec![service("a", 5), service("b", 6)]));
        assert_eq!(
            ops(&out),
            vec![
                ("insert", "default/service/a"),
                ("insert", "default/service/b")
            ]
        );
        // Listed items get their type, which the edge files them by.
        assert_eq!(out[0].object["kind"], "Service");
        assert_eq!(out[0].object["apiVersion"], "v1");
        assert_eq!(out[0].version, Some(5));

        // Listed again (the watch expired): a changed, b gone, c new.
        let out = view.listed(&list(20, vec![service("a", 15), service("c", 18)]));
        assert_eq!(
            ops(&out),
            vec![
                ("update", "default/service/a"),
                ("insert", "default/service/c"),
                ("delete", "default/service/b")
            ]
        );
        let delete = &out[2];
        assert_eq!(
            delete.version,
            Some(20),
            "newer than anything the node holds"
        );
        assert_eq!(
            delete.object["metadata"],
            json!({"name": "b", "namespace": "default", "resourceVersion": "20"})
        );
        assert_eq!(delete.object["kind"], "Service");
        // Sent only once the API server says it is gone.
        let confirm = delete.confirm.as_ref().expect("to confirm");
        assert_eq!(
            confirm.path("").expect("path"),
            "/api/v1/namespaces/default/services/b"
        );
        // Unchanged: nothing.
        assert!(
            view.listed(&list(21, vec![service("a", 15), service("c", 18)]))
                .is_empty()
        );
        assert_eq!(view.len(), 2);
    }

    #[test]
    fn changes_reach_the_node_once_and_in_order() {
        let mut view = WatchView::new(services(), "edge-1");
        view.listed(&list(10, vec![service("a", 5)]));
        // A replay of what the listing had: nothing.
        assert_eq!(view.changed(ApiEvent::Added(service("a", 5))), None);
        let out = view
            .changed(ApiEvent::Modified(service("a", 11)))
            .expect("newer");
        assert_eq!((out.operation, out.version), ("update", Some(11)));
        let out = view
            .changed(ApiEvent::Added(service("b", 12)))
            .expect("new");
        assert_eq!(out.operation, "insert");
        assert_eq!(view.changed(ApiEvent::Bookmark("13".into())), None);
        let out = view
            .changed(ApiEvent::Deleted(service("a", 14)))
            .expect("gone");
        assert_eq!(
            (out.operation, out.resource.as_str()),
            ("delete", "default/service/a")
        );
        // A delete of what the node never got: nothing to withdraw.
        assert_eq!(view.changed(ApiEvent::Deleted(service("z", 15))), None);
        // Nameless objects are not sent.
        assert_eq!(view.changed(ApiEvent::Added(json!({"metadata": {}}))), None);
        assert_eq!(view.len(), 1);
    }

    #[test]
    fn what_the_edgecontroller_sends_is_left_to_it() {
        let pods = match Target::parse("/core/v1/pods/null/null") {
            Ok(Target::Resource(key)) => key,
            other => panic!("{other:?}"),
        };
        let mut view = WatchView::new(pods, "edge-1");
        let pod = |name: &str, node: &str, rv: u64| {
            json!({"metadata": {"name": name, "namespace": "default", "resourceVersion": rv.to_string()},
                   "spec": {"nodeName": node}})
        };
        let list = json!({"apiVersion": "v1", "kind": "PodList", "metadata": {"resourceVersion": "9"},
                          "items": [pod("mine", "edge-1", 5), pod("theirs", "edge-2", 6)]});
        let out = view.listed(&list);
        assert_eq!(ops(&out), vec![("insert", "default/pod/theirs")]);
        // Its own pod's changes are the edgecontroller's, never the watch's.
        assert_eq!(
            view.changed(ApiEvent::Modified(pod("mine", "edge-1", 10))),
            None
        );
        // A pod the watch sent that is now bound here: let go, silently.
        assert_eq!(
            view.changed(ApiEvent::Modified(pod("theirs", "edge-1", 11))),
            None
        );
        assert!(view.is_empty());
        let secrets = match Target::parse("/core/v1/secrets/default/null") {
            Ok(Target::Resource(key)) => key,
            other => panic!("{other:?}"),
        };
        let mut view = WatchView::new(secrets, "edge-1");
        let secret =
            json!({"metadata": {"name": "s", "namespace": "default", "resourceVersion": "3"}});
        assert_eq!(view.changed(ApiEvent::Added(secret)), None);
    }

    #[test]
    fn a_failed_send_is_sent_again() {
        let mut view = WatchView::new(services(), "edge-1");
        let out = view.changed(ApiEvent::Added(service("a", 5))).expect("new");
        view.forget(&out.resource);
        let again = view.listed(&list(6, vec![service("a", 5)]));
        assert_eq!(ops(&again), vec![("insert", "default/service/a")]);
    }

    #[test]
    fn cluster_scoped_objects_live_in_the_null_namespace() {
        let key = match Target::parse("/core/v1/nodes/null/null") {
            Ok(Target::Resource(key)) => key,
            other => panic!("{other:?}"),
        };
        let mut view = WatchView::new(key, "edge-1");
        let node = json!({"kind": "Node", "metadata": {"name": "edge-1", "resourceVersion": "3"}});
        let out = view.changed(ApiEvent::Added(node)).expect("new");
        assert_eq!(out.resource, "null/node/edge-1");
    }

    /// Whatever order of listings and changes, the node ends up holding
    /// exactly the objects of the last listing and the changes after it.
    #[test]
    fn randomized_listings_and_changes_leave_the_node_with_the_truth() {
        let mut seed = 0x5eed_u64;
        let mut next = move |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        for _ in 0..200 {
            let mut view = WatchView::new(services(), "edge-1");
            let mut truth: BTreeMap<String, u64> = BTreeMap::new();
            let mut node: BTreeMap<String, u64> = BTreeMap::new();
            let mut rv = 1;
            for _ in 0..40 {
                rv += 1;
                let name = format!("s{}", next(6));
                let out = match next(4) {
                    0 => {
                        let items = truth.iter().map(|(n, v)| service(n, *v)).collect();
                        view.listed(&list(rv, items))
                    }
                    1 if truth.contains_key(&name) => {
                        truth.remove(&name);
                        view.changed(ApiEvent::Deleted(service(&name, rv)))
                            .into_iter()
                            .collect()
                    }
                    _ => {
                        let added = truth.insert(name.clone(), rv).is_none();
                        let event = match added {
                            true => ApiEvent::Added(service(&name, rv)),
                            false => ApiEvent::Modified(service(&name, rv)),
                        };
                        view.changed(event).into_iter().collect()
                    }
                };
                for o in out {
                    let name = o.resource.rsplit('/').next().expect("name").to_owned();
                    match o.operation {
                        "delete" => {
                            assert!(node.remove(&name).is_some(), "deletes only what it holds")
                        }
                        _ => {
                            let held = node.insert(name, o.version.expect("numeric"));
                            assert!(held.is_none_or(|h| h < o.version.expect("numeric")));
                        }
                    }
                }
                assert_eq!(node, truth);
            }
        }
    }
}
