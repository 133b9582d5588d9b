//! Tests of the parent module (`reconciler.rs`).

use std::collections::VecDeque;

use serde_json::Value;

use super::*;
use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};

use crate::desired::{SPEC_REVISION, desired_body};
use Op::{Delete, Insert, Update};
use Version::{Fresh, Of};

const NS: &str = "default";

/// The desired state as the reader sees it.
type Store = HashMap<ObjectKey, Object>;

/// A send, shortly: node, operation, `<type>/<name>`, version.
type Sent = (String, Op, String, Version);

fn cm(name: &str, rv: u64, data: &str) -> Object {
    object(json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": { "name": name, "namespace": NS, "resourceVersion": rv.to_string() },
        "data": { "key": data },
    }))
}

fn object(body: Value) -> Object {
    Object::new(body).expect("an object")
}

fn pod(name: &str, node: Option<&str>, rv: u64, cms: &[&str], image: &str) -> Object {
    let volumes: Vec<Value> = cms
        .iter()
        .map(|cm| json!({ "name": format!("v-{cm}"), "configMap": { "name": cm } }))
        .collect();
    let mut pod = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": { "name": name, "namespace": NS, "resourceVersion": rv.to_string() },
        "spec": {
            "volumes": volumes,
            "containers": [{ "name": "app", "image": image }],
        },
        "status": { "phase": "Pending" },
    });
    if let Some(node) = node {
        pod["spec"]["nodeName"] = json!(node);
    }
    object(pod)
}

/// `object` at another resource version.
fn revised(object: &Object, rv: u64) -> Object {
    let mut object = object.clone();
    object.set_revision(rv);
    object
}

fn key(kind: Kind, name: &str) -> ObjectKey {
    ObjectKey::new(kind, NS, name)
}

fn store_of(objects: &[Object]) -> Store {
    objects
        .iter()
        .map(|object| (object.key().clone(), object.clone()))
        .collect()
}

/// The stored objects of `kind`, in key order.
fn of_kind(store: &Store, kind: Kind) -> Vec<Object> {
    let mut objects: Vec<(&ObjectKey, &Object)> =
        store.iter().filter(|(key, _)| key.kind == kind).collect();
    objects.sort_by(|a, b| a.0.cmp(b.0));
    objects
        .into_iter()
        .map(|(_, object)| object.clone())
        .collect()
}

/// A reconciler that took its first list of every kind from `store`.
fn loaded(store: &Store, revision: u64) -> Reconciler {
    let mut r = Reconciler::new();
    for kind in FOLLOWED {
        let actions = r.listed(kind, of_kind(store, kind), revision, store);
        assert!(actions.is_empty(), "a first list sends nothing");
    }
    assert!(r.loaded());
    r
}

/// Stores `object` and tells the reconciler (Added or Modified).
fn put(r: &mut Reconciler, store: &mut Store, object: Object) -> Vec<Action> {
    let key = object.key().clone();
    let event = match store.insert(key.clone(), object.clone()) {
        None => WatchEvent::Added(object),
        Some(_) => WatchEvent::Modified(object),
    };
    r.observe(key.kind, &event, store)
}

/// Removes an object at revision `rv` and tells the reconciler.
fn remove(r: &mut Reconciler, store: &mut Store, kind: Kind, name: &str, rv: u64) -> Vec<Action> {
    let object = store.remove(&key(kind, name)).expect("stored");
    r.observe(kind, &WatchEvent::Deleted(revised(&object, rv)), store)
}

fn short(key: &ObjectKey) -> String {
    format!("{}/{}", key.kind.resource_type(), key.name)
}

fn sends(actions: &[Action]) -> Vec<Sent> {
    actions
        .iter()
        .filter_map(|action| match action {
            Action::Send {
                node,
                op,
                key,
                version,
                ..
            } => Some((node.clone(), *op, short(key), *version)),
            _ => None,
        })
        .collect()
}

fn sorted(mut sent: Vec<Sent>) -> Vec<Sent> {
    sent.sort_by(|a, b| (&a.0, &a.2).cmp(&(&b.0, &b.2)));
    sent
}

fn s(node: &str, op: Op, what: &str, version: Version) -> Sent {
    (node.to_owned(), op, what.to_owned(), version)
}

fn ask(node: &str) -> Action {
    Action::AskInventory {
        node: node.to_owned(),
    }
}

fn update_node(node: &str) -> Action {
    Action::UpdateNode {
        node: node.to_owned(),
    }
}

/// Reports every send as queued, a fresh version resolved to `fresh`.
fn ack(r: &mut Reconciler, actions: &[Action], fresh: u64) {
    for action in actions {
        if let Action::Send {
            node,
            op,
            key,
            version,
            ..
        } = action
        {
            let version = match version {
                Of(version) => *version,
                Fresh => fresh,
            };
            r.sent(node, *op, key, version, true);
        }
    }
}

fn inventory(held: &[(&str, u64)]) -> BTreeMap<String, String> {
    held.iter()
        .map(|(resource, version)| (format!("{NS}/{resource}"), version.to_string()))
        .collect()
}

/// What the edges hold: per node, per resource, the version and the
/// object (none for a tombstone), as edges keep them: a message is
/// applied only if its version is above the one held.
#[derive(Debug, Default)]
struct Edges {
    nodes: BTreeMap<String, BTreeMap<String, (u64, Option<Object>)>>,
}

impl Edges {
    fn apply(&mut self, node: &str, op: Op, key: &ObjectKey, object: &Object, version: u64) {
        let records = self.nodes.entry(node.to_owned()).or_default();
        let resource = key.edge_resource().to_string();
        if records
            .get(&resource)
            .is_some_and(|(held, _)| *held >= version)
        {
            return;
        }
        let object = (op != Delete).then(|| object.clone());
        records.insert(resource, (version, object));
    }

    /// Applies every send of `actions`, a fresh version as `fresh`.
    fn apply_all(&mut self, actions: &[Action], fresh: u64) {
        for action in actions {
            if let Action::Send {
                node,
                op,
                key,
                object,
                version,
            } = action
            {
                let version = match version {
                    Of(version) => *version,
                    Fresh => fresh,
                };
                self.apply(node, *op, key, object, version);
            }
        }
    }

    /// What `node` reports holding.
    fn inventory(&self, node: &str) -> BTreeMap<String, String> {
        self.live(node)
            .into_iter()
            .map(|(resource, (version, _))| (resource, version.to_string()))
            .collect()
    }

    /// The objects `node` holds, with their versions.
    fn live(&self, node: &str) -> BTreeMap<String, (u64, Object)> {
        self.nodes
            .get(node)
            .into_iter()
            .flatten()
            .filter_map(|(resource, (version, object))| {
                object
                    .clone()
                    .map(|object| (resource.clone(), (*version, object)))
            })
            .collect()
    }

    /// The resources `node` holds, shortly (`<type>/<name>`).
    fn holds(&self, node: &str) -> Vec<String> {
        self.live(node)
            .into_keys()
            .map(|resource| resource.trim_start_matches("default/").to_owned())
            .collect()
    }
}

// ----- lists -----

#[test]
fn first_lists_build_the_index_and_send_nothing() {
    let store = store_of(&[
        cm("cm", 2, "a"),
        pod("web", Some("edge-1"), 3, &["cm"], "nginx"),
        pod("idle", None, 4, &["cm"], "nginx"),
    ]);
    let mut r = Reconciler::new();
    for kind in FOLLOWED {
        assert!(!r.loaded(), "{kind} not listed yet");
        let actions = r.listed(kind, of_kind(&store, kind), 4, &store);
        assert!(actions.is_empty(), "{kind}: {actions:?}");
    }
    assert!(r.loaded());
    assert_eq!(r.bound_count(), 1, "an unbound pod waits");
    assert!(r.may_report("edge-1", &key(Kind::Pod, "web")));
    assert!(r.entitled("edge-1", &key(Kind::ConfigMap, "cm")));
    assert!(!r.may_report("edge-1", &key(Kind::Pod, "idle")));
    // The node is taken to hold what its pods reference: a change of
    // it goes there as an update.
    let mut store = store;
    let actions = put(&mut r, &mut store, cm("cm", 5, "b"));
    assert_eq!(
        sends(&actions),
        [s("edge-1", Update, "configmap/cm", Of(5))]
    );
}

#[test]
fn a_relist_that_breaks_off_withdraws_nothing_and_the_next_finishes_it() {
    let mut store = store_of(&[
        cm("a", 2, "a"),
        pod("p1", Some("edge-1"), 3, &["a"], "nginx"),
        pod("p2", Some("edge-1"), 4, &["a"], "nginx"),
    ]);
    let mut r = loaded(&store, 4);
    // While the watch is down: p1 changes, p2 goes, p3 comes.
    store.insert(
        key(Kind::Pod, "p1"),
        pod("p1", Some("edge-1"), 5, &["a"], "nginx:2"),
    );
    store.remove(&key(Kind::Pod, "p2"));
    store.insert(
        key(Kind::Pod, "p3"),
        pod("p3", Some("edge-1"), 6, &["a"], "nginx"),
    );
    // The list breaks off after its first object: that object's change
    // is carried out; p2 is not taken for gone on a partial list.
    let mut listing = r.start_listing(Kind::Pod);
    let first = of_kind(&store, Kind::Pod).into_iter().next().expect("p1");
    r.list_item(&mut listing, first, &store);
    let actions = r.abandon_listing(listing);
    assert_eq!(sends(&actions), [s("edge-1", Update, "pod/p1", Of(5))]);
    ack(&mut r, &actions, 0);
    assert!(r.may_report("edge-1", &key(Kind::Pod, "p2")));
    // Listed again whole, object by object: the rest.
    let mut listing = r.start_listing(Kind::Pod);
    for object in of_kind(&store, Kind::Pod) {
        r.list_item(&mut listing, object, &store);
    }
    let actions = r.finish_listing(listing, 7, &store);
    assert_eq!(
        sorted(sends(&actions)),
        [
            s("edge-1", Delete, "pod/p2", Of(7)),
            s("edge-1", Insert, "pod/p3", Of(6)),
        ]
    );
}

#[test]
fn a_relist_acts_on_the_differences() {
    let mut store = store_of(&[
        cm("a", 2, "a"),
        cm("b", 3, "b"),
        pod("p1", Some("edge-1"), 4, &["a"], "nginx"),
        pod("p2", Some("edge-1"), 5, &["b"], "nginx"),
        pod("p3", Some("edge-2"), 6, &["a"], "nginx"),
    ]);
    let mut r = loaded(&store, 6);
    // While the watch is down: p2 goes, p3 changes, p4 comes, p1's
    // status changes.
    store.remove(&key(Kind::Pod, "p2"));
    store.insert(
        key(Kind::Pod, "p3"),
        pod("p3", Some("edge-2"), 8, &["a"], "nginx:2"),
    );
    store.insert(
        key(Kind::Pod, "p4"),
        pod("p4", Some("edge-2"), 9, &["b"], "nginx"),
    );
    let mut p1 = pod("p1", Some("edge-1"), 10, &["a"], "nginx");
    p1.edit(|o| o["status"]["phase"] = json!("Running"));
    store.insert(key(Kind::Pod, "p1"), p1);
    let actions = r.listed(Kind::Pod, of_kind(&store, Kind::Pod), 10, &store);
    assert_eq!(
        sorted(sends(&actions)),
        [
            s("edge-1", Delete, "configmap/b", Of(10)),
            s("edge-1", Delete, "pod/p2", Of(10)),
            s("edge-2", Insert, "configmap/b", Of(9)),
            s("edge-2", Update, "pod/p3", Of(8)),
            s("edge-2", Insert, "pod/p4", Of(9)),
        ]
    );
    let position = |what: &str| sends(&actions).iter().position(|sent| sent.2 == what);
    assert!(position("configmap/b") < position("pod/p4"), "{actions:?}");
    ack(&mut r, &actions, 0);
    assert_eq!(r.bound_count(), 3);
    assert!(!r.may_report("edge-1", &key(Kind::Pod, "p2")));
    // Configmaps: a changes, b goes (edge-2 holds it for p4), c comes
    // (nobody uses it).
    store.insert(key(Kind::ConfigMap, "a"), cm("a", 11, "a2"));
    store.remove(&key(Kind::ConfigMap, "b"));
    store.insert(key(Kind::ConfigMap, "c"), cm("c", 13, "c"));
    let actions = r.listed(
        Kind::ConfigMap,
        of_kind(&store, Kind::ConfigMap),
        13,
        &store,
    );
    assert_eq!(
        sorted(sends(&actions)),
        [
            s("edge-1", Update, "configmap/a", Of(11)),
            s("edge-2", Update, "configmap/a", Of(11)),
            s("edge-2", Delete, "configmap/b", Of(13)),
        ]
    );
    // Nothing changed since: a third list sends nothing.
    ack(&mut r, &actions, 0);
    assert!(
        r.listed(Kind::Pod, of_kind(&store, Kind::Pod), 14, &store)
            .is_empty()
    );
    assert!(
        r.listed(
            Kind::ConfigMap,
            of_kind(&store, Kind::ConfigMap),
            14,
            &store
        )
        .is_empty()
    );
}

// ----- watch events -----

#[test]
fn a_bound_pod_takes_its_configmap_first_and_leaves_with_it() {
    let mut store = store_of(&[cm("cm", 2, "a")]);
    let mut r = loaded(&store, 2);
    let web = pod("web", Some("edge-1"), 3, &["cm"], "nginx:1");
    let actions = put(&mut r, &mut store, web.clone());
    assert_eq!(
        sends(&actions),
        [
            s("edge-1", Insert, "configmap/cm", Of(3)),
            s("edge-1", Insert, "pod/web", Of(3)),
        ]
    );
    let Action::Send { object, .. } = &actions[0] else {
        panic!("a send");
    };
    assert_eq!(**object, cm("cm", 2, "a"), "the configmap as stored");
    ack(&mut r, &actions, 0);
    // Only the status changes: the node has the spec.
    let mut running = revised(&web, 4);
    running.edit(|o| o["status"]["phase"] = json!("Running"));
    assert!(put(&mut r, &mut store, running).is_empty());
    // The spec changes.
    let upgraded = pod("web", Some("edge-1"), 5, &["cm"], "nginx:2");
    let actions = put(&mut r, &mut store, upgraded);
    assert_eq!(sends(&actions), [s("edge-1", Update, "pod/web", Of(5))]);
    ack(&mut r, &actions, 0);
    // Deleted: the pod goes, and the configmap nothing uses any more.
    let actions = remove(&mut r, &mut store, Kind::Pod, "web", 6);
    assert_eq!(
        sends(&actions),
        [
            s("edge-1", Delete, "pod/web", Of(6)),
            s("edge-1", Delete, "configmap/cm", Of(6)),
        ]
    );
    assert_eq!(r.bound_count(), 0);
    assert!(!r.entitled("edge-1", &key(Kind::ConfigMap, "cm")));
    // Gone from the node: a change of it stays in the cloud.
    ack(&mut r, &actions, 0);
    assert!(put(&mut r, &mut store, cm("cm", 7, "b")).is_empty());
}

#[test]
fn a_configmap_goes_to_the_nodes_that_use_it_and_only_there() {
    let mut store = store_of(&[cm("shared", 2, "a")]);
    let mut r = loaded(&store, 2);
    for (rv, node) in [(3, "edge-1"), (4, "edge-2")] {
        let actions = put(
            &mut r,
            &mut store,
            pod(&format!("app-{node}"), Some(node), rv, &["shared"], "nginx"),
        );
        assert_eq!(
            sends(&actions)[0],
            s(node, Insert, "configmap/shared", Of(rv))
        );
        ack(&mut r, &actions, 0);
    }
    let actions = put(
        &mut r,
        &mut store,
        pod("other", Some("edge-3"), 5, &[], "nginx"),
    );
    assert_eq!(sends(&actions), [s("edge-3", Insert, "pod/other", Of(5))]);
    // A change goes to both, not to edge-3.
    let actions = put(&mut r, &mut store, cm("shared", 6, "b"));
    assert_eq!(
        sorted(sends(&actions)),
        [
            s("edge-1", Update, "configmap/shared", Of(6)),
            s("edge-2", Update, "configmap/shared", Of(6)),
        ]
    );
    ack(&mut r, &actions, 0);
    // A new resource version with the same content: nothing to send.
    assert!(put(&mut r, &mut store, cm("shared", 7, "b")).is_empty());
    let mut labelled = cm("shared", 8, "b");
    labelled.edit(|o| o["metadata"]["uid"] = json!("0b6f"));
    labelled.edit(|o| o["metadata"]["annotations"] = json!({ SPEC_REVISION: "6" }));
    assert!(put(&mut r, &mut store, labelled).is_empty());
    // Deleted: both holders drop it.
    let actions = remove(&mut r, &mut store, Kind::ConfigMap, "shared", 9);
    assert_eq!(
        sorted(sends(&actions)),
        [
            s("edge-1", Delete, "configmap/shared", Of(9)),
            s("edge-2", Delete, "configmap/shared", Of(9)),
        ]
    );
    ack(&mut r, &actions, 0);
    // Created again: it goes to the nodes that use it, as new.
    let actions = put(&mut r, &mut store, cm("shared", 10, "c"));
    assert_eq!(
        sorted(sends(&actions)),
        [
            s("edge-1", Insert, "configmap/shared", Of(10)),
            s("edge-2", Insert, "configmap/shared", Of(10)),
        ]
    );
}

#[test]
fn a_configmap_stays_while_a_pod_on_the_node_uses_it() {
    let mut store = store_of(&[cm("cm", 2, "a")]);
    let mut r = loaded(&store, 2);
    let actions = put(
        &mut r,
        &mut store,
        pod("a", Some("edge-1"), 3, &["cm"], "nginx"),
    );
    assert_eq!(sends(&actions).len(), 2);
    ack(&mut r, &actions, 0);
    let actions = put(
        &mut r,
        &mut store,
        pod("b", Some("edge-1"), 4, &["cm"], "nginx"),
    );
    assert_eq!(sends(&actions), [s("edge-1", Insert, "pod/b", Of(4))]);
    ack(&mut r, &actions, 0);
    let actions = remove(&mut r, &mut store, Kind::Pod, "a", 5);
    assert_eq!(sends(&actions), [s("edge-1", Delete, "pod/a", Of(5))]);
    ack(&mut r, &actions, 0);
    let actions = remove(&mut r, &mut store, Kind::Pod, "b", 6);
    assert_eq!(
        sends(&actions),
        [
            s("edge-1", Delete, "pod/b", Of(6)),
            s("edge-1", Delete, "configmap/cm", Of(6)),
        ]
    );
}

#[test]
fn a_pod_no_longer_using_a_configmap_lets_it_go() {
    let mut store = store_of(&[cm("a", 2, "a"), cm("b", 3, "b")]);
    let mut r = loaded(&store, 3);
    let actions = put(
        &mut r,
        &mut store,
        pod("p", Some("edge-1"), 4, &["a"], "nginx"),
    );
    ack(&mut r, &actions, 0);
    let actions = put(
        &mut r,
        &mut store,
        pod("p", Some("edge-1"), 5, &["b"], "nginx"),
    );
    assert_eq!(
        sends(&actions),
        [
            s("edge-1", Insert, "configmap/b", Of(5)),
            s("edge-1", Delete, "configmap/a", Of(5)),
            s("edge-1", Update, "pod/p", Of(5)),
        ]
    );
}

#[test]
fn an_unbound_pod_waits_for_its_node() {
    let mut store = store_of(&[cm("cm", 2, "a")]);
    let mut r = loaded(&store, 2);
    let actions = put(&mut r, &mut store, pod("later", None, 3, &["cm"], "nginx"));
    assert!(actions.is_empty());
    assert_eq!(r.bound_count(), 0);
    assert!(!r.may_report("edge-2", &key(Kind::Pod, "later")));
    let actions = put(
        &mut r,
        &mut store,
        pod("later", Some("edge-2"), 4, &["cm"], "nginx"),
    );
    assert_eq!(
        sends(&actions),
        [
            s("edge-2", Insert, "configmap/cm", Of(4)),
            s("edge-2", Insert, "pod/later", Of(4)),
        ]
    );
    assert!(r.may_report("edge-2", &key(Kind::Pod, "later")));
    // Deleted before it was ever bound: nothing to tell anyone.
    put(&mut r, &mut store, pod("never", None, 5, &[], "nginx"));
    assert!(remove(&mut r, &mut store, Kind::Pod, "never", 6).is_empty());
}

#[test]
fn a_configmap_held_above_its_revision_is_updated_fresh() {
    let mut store = store_of(&[cm("cm", 2, "a")]);
    let mut r = loaded(&store, 2);
    let mut edges = Edges::default();
    // The pod goes at revision 10, its configmap with it.
    let actions = put(
        &mut r,
        &mut store,
        pod("web", Some("edge-1"), 10, &["cm"], "nginx"),
    );
    assert_eq!(
        sends(&actions)[0],
        s("edge-1", Insert, "configmap/cm", Of(10))
    );
    edges.apply_all(&actions, 0);
    ack(&mut r, &actions, 0);
    // A change at revision 9, handled after the pod's: at 9 the node
    // would take it for an old one.
    let actions = put(&mut r, &mut store, cm("cm", 9, "b"));
    assert_eq!(
        sends(&actions),
        [s("edge-1", Update, "configmap/cm", Fresh)]
    );
    edges.apply_all(&actions, 11);
    ack(&mut r, &actions, 11);
    assert_eq!(
        edges.live("edge-1")["default/configmap/cm"],
        (11, cm("cm", 9, "b"))
    );
    // Later changes go at their own revision, above the fresh one.
    let actions = put(&mut r, &mut store, cm("cm", 12, "c"));
    assert_eq!(
        sends(&actions),
        [s("edge-1", Update, "configmap/cm", Of(12))]
    );
    edges.apply_all(&actions, 0);
    assert_eq!(
        edges.live("edge-1")["default/configmap/cm"].1,
        cm("cm", 12, "c")
    );
}

#[test]
fn devices_take_their_models() {
    let model = object(json!({
        "apiVersion": "devices.kubeedge.io/v1beta1",
        "kind": "DeviceModel",
        "metadata": { "name": "thermo", "namespace": NS, "resourceVersion": "2" },
        "spec": { "protocol": "modbus" },
    }));
    let device = object(json!({
        "apiVersion": "devices.kubeedge.io/v1beta1",
        "kind": "Device",
        "metadata": { "name": "t1", "namespace": NS, "resourceVersion": "3" },
        "spec": { "nodeName": "edge-1", "deviceModelRef": { "name": "thermo" } },
    }));
    let mut store = store_of(&[model]);
    let mut r = loaded(&store, 2);
    let actions = put(&mut r, &mut store, device);
    assert_eq!(
        sends(&actions),
        [
            s("edge-1", Insert, "devicemodel/thermo", Of(3)),
            s("edge-1", Insert, "device/t1", Of(3)),
        ]
    );
    assert!(r.may_report("edge-1", &key(Kind::Device, "t1")));
    assert!(r.entitled("edge-1", &key(Kind::DeviceModel, "thermo")));
    ack(&mut r, &actions, 0);
    let actions = remove(&mut r, &mut store, Kind::Device, "t1", 4);
    assert_eq!(
        sends(&actions),
        [
            s("edge-1", Delete, "device/t1", Of(4)),
            s("edge-1", Delete, "devicemodel/thermo", Of(4)),
        ]
    );
}

/// Each action as one line, in order: `+edge-1 device/t1` (joined a
/// node's devices), `-edge-1 device/t1` (left), `edge-1 Insert
/// device/t1` (sent).
fn steps(actions: &[Action]) -> Vec<String> {
    actions
        .iter()
        .filter_map(|action| match action {
            Action::Membership {
                node,
                device,
                joined,
                object,
            } => {
                assert_eq!(object.key(), device);
                let sign = if *joined { '+' } else { '-' };
                Some(format!("{sign}{node} {}", short(device)))
            }
            Action::Send { node, op, key, .. } => Some(format!("{node} {op:?} {}", short(key))),
            _ => None,
        })
        .collect()
}

#[test]
fn a_kubeedge_nodes_twin_hears_of_devices_joining_and_leaving_first() {
    let model = object(json!({
        "apiVersion": "devices.kubeedge.io/v1beta1",
        "kind": "DeviceModel",
        "metadata": { "name": "thermo", "namespace": NS, "resourceVersion": "2" },
    }));
    let device = |node: &str, rv: u64, extra: Value| {
        let mut device = json!({
            "apiVersion": "devices.kubeedge.io/v1beta1",
            "kind": "Device",
            "metadata": { "name": "t1", "namespace": NS, "resourceVersion": rv.to_string() },
            "spec": { "nodeName": node, "deviceModelRef": { "name": "thermo" }, "extra": extra },
        });
        if extra.is_null() {
            device["spec"]
                .as_object_mut()
                .map(|spec| spec.remove("extra"));
        }
        object(device)
    };
    let mut store = store_of(&[model]);
    let mut r = loaded(&store, 2);
    r.connected("kube-1", NodeDialect::KubeEdge, &store);
    r.connected("kube-2", NodeDialect::KubeEdge, &store);
    r.connected("native", NodeDialect::Native, &store);

    // Bound to a KubeEdge node: its twin first, then the model, then
    // the device.
    let actions = put(&mut r, &mut store, device("kube-1", 3, Value::Null));
    assert_eq!(
        steps(&actions),
        [
            "+kube-1 device/t1",
            "kube-1 Insert devicemodel/thermo",
            "kube-1 Insert device/t1"
        ]
    );
    ack(&mut r, &actions, 0);
    // A spec change on the same node, or a status change: no news to
    // the twin.
    let actions = put(&mut r, &mut store, device("kube-1", 4, json!(1)));
    assert_eq!(steps(&actions), ["kube-1 Update device/t1"]);
    let mut reported = device("kube-1", 5, json!(1));
    reported.edit(|o| o["status"] = json!({"state": "online"}));
    assert_eq!(
        steps(&put(&mut r, &mut store, reported)),
        Vec::<String>::new()
    );

    // Moved (deleted and created again while the watch was down):
    // it leaves the one, then joins the other.
    let actions = put(&mut r, &mut store, device("kube-2", 6, Value::Null));
    assert_eq!(
        steps(&actions),
        [
            "-kube-1 device/t1",
            "kube-1 Delete device/t1",
            "kube-1 Delete devicemodel/thermo",
            "+kube-2 device/t1",
            "kube-2 Insert devicemodel/thermo",
            "kube-2 Insert device/t1"
        ]
    );
    ack(&mut r, &actions, 7);
    // Deleted: the twin hears of it before the device goes.
    let actions = remove(&mut r, &mut store, Kind::Device, "t1", 8);
    assert_eq!(
        steps(&actions),
        [
            "-kube-2 device/t1",
            "kube-2 Delete device/t1",
            "kube-2 Delete devicemodel/thermo"
        ]
    );
    ack(&mut r, &actions, 0);

    // An edgehive node learns from the objects; a KubeEdge node not
    // linked, from its twin sync when it links.
    let actions = put(&mut r, &mut store, device("native", 9, Value::Null));
    assert!(steps(&actions).iter().all(|s| !s.starts_with(['+', '-'])));
    remove(&mut r, &mut store, Kind::Device, "t1", 10);
    r.disconnected("kube-1");
    let actions = put(&mut r, &mut store, device("kube-1", 11, Value::Null));
    assert!(steps(&actions).iter().all(|s| !s.starts_with(['+', '-'])));
    r.connected("kube-1", NodeDialect::KubeEdge, &store);

    // Deleted gracefully: it leaves the twin when its deletion goes.
    let mut going = device("kube-1", 12, Value::Null);
    going.edit(|o| o["metadata"]["deletionTimestamp"] = json!("2026-11-26T10:00:00Z"));
    let actions = put(&mut r, &mut store, going.clone());
    assert_eq!(
        steps(&actions)[..2],
        ["-kube-1 device/t1", "kube-1 Delete device/t1"]
    );
    going.edit(|o| o["metadata"]["resourceVersion"] = json!("13"));
    let again = put(&mut r, &mut store, going);
    assert!(steps(&again).iter().all(|s| !s.starts_with(['+', '-'])));
}

/// Carries out `actions` on `edges` and reports them sent, a fresh
/// version resolved to `fresh`.
fn deliver(r: &mut Reconciler, edges: &mut Edges, actions: &[Action], fresh: u64) {
    edges.apply_all(actions, fresh);
    ack(r, actions, fresh);
}

#[test]
fn a_withdrawal_goes_above_what_the_node_holds() {
    let mut store = store_of(&[cm("cm", 2, "a")]);
    let mut r = loaded(&store, 2);
    let mut edges = Edges::default();
    let actions = put(
        &mut r,
        &mut store,
        pod("a", Some("edge-1"), 3, &["cm"], "nginx"),
    );
    deliver(&mut r, &mut edges, &actions, 0);
    assert_eq!(edges.holds("edge-1"), ["configmap/cm", "pod/a"]);
    // Pod a is deleted at 4, the configmap changed at 5, pod b (using
    // it too) created at 6. The controller takes configmaps first.
    let a = store.remove(&key(Kind::Pod, "a")).expect("stored");
    store.insert(key(Kind::ConfigMap, "cm"), cm("cm", 5, "b"));
    let b = pod("b", Some("edge-1"), 6, &["cm"], "nginx");
    store.insert(key(Kind::Pod, "b"), b.clone());
    let event = WatchEvent::Modified(cm("cm", 5, "b"));
    let actions = r.observe(Kind::ConfigMap, &event, &store);
    assert_eq!(
        sends(&actions),
        [s("edge-1", Update, "configmap/cm", Of(5))]
    );
    deliver(&mut r, &mut edges, &actions, 0);
    // The configmap is held at 5: its withdrawal at 4 would be taken
    // for an old message.
    let event = WatchEvent::Deleted(revised(&a, 4));
    let actions = r.observe(Kind::Pod, &event, &store);
    deliver(&mut r, &mut edges, &actions, 7);
    assert!(edges.holds("edge-1").is_empty(), "{edges:?}");
    // And it comes back with pod b, above its withdrawal.
    let actions = r.observe(Kind::Pod, &WatchEvent::Added(b), &store);
    deliver(&mut r, &mut edges, &actions, 8);
    assert_eq!(edges.holds("edge-1"), ["configmap/cm", "pod/b"]);
    assert_eq!(
        edges.live("edge-1")["default/configmap/cm"].1,
        cm("cm", 5, "b")
    );
}

#[test]
fn a_withdrawal_goes_above_what_an_inventory_sent() {
    let mut store = store_of(&[cm("cm", 2, "a")]);
    let mut r = loaded(&store, 2);
    let mut edges = Edges::default();
    r.connected("edge-1", NodeDialect::Native, &store);
    assert!(
        r.inventory("edge-1", Ok(BTreeMap::new()), &store)
            .is_empty()
    );
    // The pod goes, its configmap does not (cloudhub did not take it).
    let actions = put(
        &mut r,
        &mut store,
        pod("a", Some("edge-1"), 3, &["cm"], "nginx"),
    );
    edges.apply_all(&actions[1..], 0);
    r.sent("edge-1", Insert, &key(Kind::ConfigMap, "cm"), 3, false);
    r.sent("edge-1", Insert, &key(Kind::Pod, "a"), 3, true);
    assert_eq!(r.retry(&store), [ask("edge-1")]);
    // The pod is deleted at 4; the inventory is answered before the
    // deletion is seen: the configmap goes, at a fresh version (5).
    let a = store.remove(&key(Kind::Pod, "a")).expect("stored");
    let actions = r.inventory("edge-1", Ok(edges.inventory("edge-1")), &store);
    deliver(&mut r, &mut edges, &actions, 5);
    assert_eq!(edges.holds("edge-1"), ["configmap/cm"]);
    // Then the deletion: the configmap must go too.
    let actions = r.observe(Kind::Pod, &WatchEvent::Deleted(revised(&a, 4)), &store);
    deliver(&mut r, &mut edges, &actions, 6);
    assert!(edges.holds("edge-1").is_empty(), "{edges:?}");
}

#[test]
fn a_relist_hands_a_configmap_from_a_gone_pod_to_a_new_one() {
    let mut store = store_of(&[cm("cm", 2, "a")]);
    let mut r = loaded(&store, 2);
    let mut edges = Edges::default();
    let actions = put(
        &mut r,
        &mut store,
        pod("a", Some("edge-1"), 3, &["cm"], "nginx"),
    );
    deliver(&mut r, &mut edges, &actions, 0);
    // While the watch is down, a goes (4) and b comes (5), both using
    // the configmap.
    store.remove(&key(Kind::Pod, "a"));
    store.insert(
        key(Kind::Pod, "b"),
        pod("b", Some("edge-1"), 5, &["cm"], "nginx"),
    );
    let actions = r.listed(Kind::Pod, of_kind(&store, Kind::Pod), 5, &store);
    deliver(&mut r, &mut edges, &actions, 6);
    assert_eq!(
        edges.holds("edge-1"),
        ["configmap/cm", "pod/b"],
        "{actions:?}"
    );
}

#[test]
fn a_relist_takes_a_pod_from_the_node_it_left() {
    let mut store = store_of(&[cm("cm", 2, "a")]);
    let mut r = loaded(&store, 2);
    let mut edges = Edges::default();
    for object in [
        pod("moved", Some("edge-1"), 3, &["cm"], "nginx"),
        pod("unbound", Some("edge-1"), 4, &[], "nginx"),
    ] {
        let actions = put(&mut r, &mut store, object);
        deliver(&mut r, &mut edges, &actions, 0);
    }
    assert_eq!(
        edges.holds("edge-1"),
        ["configmap/cm", "pod/moved", "pod/unbound"]
    );
    // While the watch is down, both are deleted and created again with
    // the same names: one on edge-2, one not bound yet.
    store.insert(
        key(Kind::Pod, "moved"),
        pod("moved", Some("edge-2"), 6, &["cm"], "nginx"),
    );
    store.insert(
        key(Kind::Pod, "unbound"),
        pod("unbound", None, 8, &[], "nginx"),
    );
    let actions = r.listed(Kind::Pod, of_kind(&store, Kind::Pod), 8, &store);
    deliver(&mut r, &mut edges, &actions, 9);
    assert!(edges.holds("edge-1").is_empty(), "{actions:?}");
    assert_eq!(edges.holds("edge-2"), ["configmap/cm", "pod/moved"]);
    assert!(!r.may_report("edge-1", &key(Kind::Pod, "moved")));
    assert!(!r.may_report("edge-1", &key(Kind::Pod, "unbound")));
    assert!(r.may_report("edge-2", &key(Kind::Pod, "moved")));
    for action in &actions {
        if let Action::Send { node, object, .. } = action
            && let Some(bound) = node_of(object)
        {
            assert_eq!(bound, node, "{action:?}");
        }
    }
}

#[test]
fn nodes_linked_before_the_first_lists_are_brought_in_step_after() {
    let store = store_of(&[
        cm("a", 2, "a"),
        pod("p1", Some("edge-1"), 3, &["a"], "nginx"),
    ]);
    let mut r = Reconciler::new();
    // Pods could not be listed at start: the node links meanwhile.
    assert!(
        r.listed(Kind::ConfigMap, of_kind(&store, Kind::ConfigMap), 3, &store)
            .is_empty()
    );
    r.connected("edge-1", NodeDialect::Native, &store);
    assert!(
        r.inventory("edge-1", Ok(BTreeMap::new()), &store)
            .is_empty()
    );
    for kind in FOLLOWED {
        r.listed(kind, of_kind(&store, kind), 3, &store);
    }
    assert!(r.loaded());
    // The next retry asks it again, now that everything is known.
    assert_eq!(r.retry(&store), [ask("edge-1")]);
    let actions = r.inventory("edge-1", Ok(BTreeMap::new()), &store);
    assert_eq!(
        sends(&actions),
        [
            s("edge-1", Insert, "configmap/a", Fresh),
            s("edge-1", Insert, "pod/p1", Fresh),
        ]
    );
}

#[test]
fn a_relist_sends_each_object_once_per_node() {
    // Pod b uses configmap x, which does not exist yet.
    let mut store = store_of(&[pod("b", Some("edge-1"), 3, &["x"], "nginx")]);
    let mut r = loaded(&store, 3);
    let mut edges = Edges::default();
    // While the pod watch is down: a comes (5), b stops using x (6).
    store.insert(
        key(Kind::Pod, "a"),
        pod("a", Some("edge-1"), 5, &[], "nginx"),
    );
    store.insert(
        key(Kind::Pod, "b"),
        pod("b", Some("edge-1"), 6, &[], "nginx"),
    );
    // The node links and holds something it should not: withdrawn at
    // a fresh version (7).
    r.connected("edge-1", NodeDialect::Native, &store);
    let zombie = [("configmap/zombie", 1), ("pod/b", 3)];
    edges.apply(
        "edge-1",
        Insert,
        &key(Kind::ConfigMap, "zombie"),
        &cm("zombie", 1, "z"),
        1,
    );
    let actions = r.inventory("edge-1", Ok(inventory(&zombie)), &store);
    assert_eq!(
        sends(&actions),
        [s("edge-1", Delete, "configmap/zombie", Fresh)]
    );
    deliver(&mut r, &mut edges, &actions, 7);
    // x is created (8), then the pods are listed again: a, taken first,
    // finds x wanted by b as it was; b then lets it go. Only the last
    // decision goes: nothing of x.
    store.insert(key(Kind::ConfigMap, "x"), cm("x", 8, "x"));
    let actions = r.listed(Kind::Pod, of_kind(&store, Kind::Pod), 8, &store);
    deliver(&mut r, &mut edges, &actions, 9);
    assert!(
        !edges.holds("edge-1").contains(&"configmap/x".to_owned()),
        "{actions:?}"
    );
    let x = sends(&actions)
        .into_iter()
        .filter(|sent| sent.2 == "configmap/x")
        .count();
    assert!(x <= 1, "{actions:?}");
}

#[test]
fn a_fresh_update_carries_the_current_content() {
    let mut store = store_of(&[cm("cm", 2, "a")]);
    let mut r = loaded(&store, 2);
    let mut edges = Edges::default();
    r.connected("edge-1", NodeDialect::Native, &store);
    assert!(
        r.inventory("edge-1", Ok(BTreeMap::new()), &store)
            .is_empty()
    );
    // The configmap changes at 9 and 11; the pod using it, created at
    // 10, is handled first and takes it at 10.
    store.insert(key(Kind::ConfigMap, "cm"), cm("cm", 11, "c"));
    let actions = put(
        &mut r,
        &mut store,
        pod("web", Some("edge-1"), 10, &["cm"], "nginx"),
    );
    deliver(&mut r, &mut edges, &actions, 0);
    // The change at 9 goes fresh (12): as the configmap is now.
    let event = WatchEvent::Modified(cm("cm", 9, "b"));
    let actions = r.observe(Kind::ConfigMap, &event, &store);
    assert_eq!(
        sends(&actions),
        [s("edge-1", Update, "configmap/cm", Fresh)]
    );
    deliver(&mut r, &mut edges, &actions, 12);
    // The change at 11 goes fresh too (13), but is not queued.
    let event = WatchEvent::Modified(cm("cm", 11, "c"));
    let actions = r.observe(Kind::ConfigMap, &event, &store);
    assert_eq!(
        sends(&actions),
        [s("edge-1", Update, "configmap/cm", Fresh)]
    );
    r.sent("edge-1", Update, &key(Kind::ConfigMap, "cm"), 13, false);
    // The node reports it at 12, above its revision (11): in step, so
    // it must hold 11's content.
    assert_eq!(r.retry(&store), [ask("edge-1")]);
    let actions = r.inventory("edge-1", Ok(edges.inventory("edge-1")), &store);
    deliver(&mut r, &mut edges, &actions, 14);
    assert_eq!(
        edges.live("edge-1")["default/configmap/cm"].1,
        cm("cm", 11, "c")
    );
}

#[test]
fn what_an_inventory_lacks_in_flight_stays_known_as_held() {
    let mut store = store_of(&[cm("cm", 2, "a")]);
    let mut r = loaded(&store, 2);
    let mut edges = Edges::default();
    r.connected("edge-1", NodeDialect::Native, &store);
    // Sent while the inventory is on its way.
    let actions = put(
        &mut r,
        &mut store,
        pod("web", Some("edge-1"), 3, &["cm"], "nginx"),
    );
    let held_before = edges.inventory("edge-1");
    deliver(&mut r, &mut edges, &actions, 0);
    // The configmap is deleted (4); the inventory, which lacks it,
    // comes before the deletion is seen.
    let gone = store.remove(&key(Kind::ConfigMap, "cm")).expect("stored");
    let actions = r.inventory("edge-1", Ok(held_before), &store);
    deliver(&mut r, &mut edges, &actions, 5);
    // The deletion goes to the node, which holds it.
    let event = WatchEvent::Deleted(revised(&gone, 4));
    let actions = r.observe(Kind::ConfigMap, &event, &store);
    assert_eq!(
        sends(&actions),
        [s("edge-1", Delete, "configmap/cm", Of(4))]
    );
    deliver(&mut r, &mut edges, &actions, 0);
    assert_eq!(edges.holds("edge-1"), ["pod/web"]);
}

#[test]
fn an_inventory_sends_no_pod_bound_elsewhere_now() {
    let mut store = store_of(&[pod("web", Some("edge-1"), 2, &[], "nginx")]);
    let mut r = loaded(&store, 2);
    // Deleted (3) and created again on edge-2 (4), events not yet seen;
    // edge-1, which lost it, reports.
    store.insert(
        key(Kind::Pod, "web"),
        pod("web", Some("edge-2"), 4, &[], "nginx"),
    );
    r.connected("edge-1", NodeDialect::Native, &store);
    let actions = r.inventory("edge-1", Ok(BTreeMap::new()), &store);
    assert!(sends(&actions).is_empty(), "{actions:?}");
    // A KubeEdge node, assumed to hold it, is told to drop it.
    r.disconnected("edge-1");
    let actions = r.connected("edge-1", NodeDialect::KubeEdge, &store);
    assert_eq!(sends(&actions), [s("edge-1", Delete, "pod/web", Fresh)]);
}

/// A replica that has just taken a node over reads a pod bound to it
/// whose event it has not handled yet: the node holds it (another
/// replica sent it), and it is not withdrawn.
#[test]
fn an_inventory_keeps_a_pod_bound_here_whose_event_is_still_to_come() {
    let mut store = store_of(&[]);
    let mut r = loaded(&store, 1);
    store.insert(
        key(Kind::Pod, "web"),
        pod("web", Some("edge-1"), 5, &[], "nginx"),
    );
    r.connected("edge-1", NodeDialect::Native, &store);
    let held = inventory(&[("pod/web", 5)]);
    let actions = r.inventory("edge-1", Ok(held), &store);
    assert!(sends(&actions).is_empty(), "{actions:?}");
}

#[test]
fn every_answer_leaves_alone_what_was_sent_since_the_first_ask() {
    let mut store = store_of(&[pod("web", Some("edge-1"), 2, &[], "nginx")]);
    let mut r = loaded(&store, 2);
    let mut edges = Edges::default();
    edges.apply(
        "edge-1",
        Insert,
        &key(Kind::Pod, "web"),
        &store[&key(Kind::Pod, "web")],
        2,
    );
    // Asked once; the node answers with what it holds then.
    assert_eq!(
        r.connected("edge-1", NodeDialect::Native, &store)[0],
        ask("edge-1")
    );
    let first = edges.inventory("edge-1");
    // The pod is deleted (3) and sent; then asked again (a failed send).
    let actions = remove(&mut r, &mut store, Kind::Pod, "web", 3);
    deliver(&mut r, &mut edges, &actions, 0);
    r.sent("edge-1", Delete, &key(Kind::Pod, "web"), 3, false);
    assert_eq!(r.retry(&store), [ask("edge-1")]);
    // Created again (4), its event not yet seen; the second answer
    // comes first, then the first, which still shows the old pod.
    store.insert(
        key(Kind::Pod, "web"),
        pod("web", Some("edge-1"), 4, &[], "nginx:2"),
    );
    let actions = r.inventory("edge-1", Ok(edges.inventory("edge-1")), &store);
    deliver(&mut r, &mut edges, &actions, 5);
    let actions = r.inventory("edge-1", Ok(first), &store);
    assert!(sends(&actions).is_empty(), "in flight: {actions:?}");
    deliver(&mut r, &mut edges, &actions, 6);
    let event = WatchEvent::Added(store[&key(Kind::Pod, "web")].clone());
    let actions = r.observe(Kind::Pod, &event, &store);
    deliver(&mut r, &mut edges, &actions, 0);
    assert_eq!(
        edges.live("edge-1")["default/pod/web"].1,
        pod("web", Some("edge-1"), 4, &[], "nginx:2")
    );
}

// ----- nodes' links and inventories -----

#[test]
fn a_native_node_is_brought_in_step_from_its_inventory() {
    let mut store = store_of(&[
        cm("a", 2, "a"),
        cm("b", 3, "b"),
        cm("c", 4, "c"),
        cm("d", 5, "d"),
        pod("p1", Some("edge-1"), 6, &["a"], "nginx"),
        pod("p2", Some("edge-1"), 7, &["b"], "nginx"),
        pod("p3", Some("edge-1"), 8, &["c"], "nginx"),
        pod("elsewhere", Some("edge-2"), 9, &["a"], "nginx"),
    ]);
    let mut r = loaded(&store, 9);
    assert!(!r.is_connected("edge-1"));
    let actions = r.connected("edge-1", NodeDialect::Native, &store);
    assert_eq!(actions, [ask("edge-1"), update_node("edge-1")]);
    assert!(r.is_connected("edge-1"));
    assert!(!r.is_kubeedge("edge-1"));
    // Sent while the inventory is on its way: in flight.
    let actions = put(
        &mut r,
        &mut store,
        pod("p4", Some("edge-1"), 10, &["d"], "nginx"),
    );
    assert_eq!(sends(&actions).len(), 2);
    ack(&mut r, &actions, 0);
    let held = inventory(&[
        ("pod/p1", 6),           // as desired
        ("pod/p2", 1),           // older
        ("configmap/a", 6),      // above its revision (went with p1)
        ("configmap/c", 1),      // older
        ("configmap/zombie", 3), // not desired
        ("pod/ghost", 2),        // not desired
    ]);
    let actions = r.inventory("edge-1", Ok(held), &store);
    assert_eq!(
        sends(&actions),
        [
            s("edge-1", Delete, "configmap/zombie", Fresh),
            s("edge-1", Delete, "pod/ghost", Fresh),
            s("edge-1", Insert, "configmap/b", Fresh),
            s("edge-1", Update, "configmap/c", Of(4)),
            s("edge-1", Update, "pod/p2", Of(7)),
            s("edge-1", Insert, "pod/p3", Fresh),
        ]
    );
    assert_eq!(actions.len(), 6);
    let Action::Send { object, .. } = &actions[1] else {
        panic!("a send");
    };
    assert_eq!(**object, stub(&key(Kind::Pod, "ghost")));
    ack(&mut r, &actions, 11);
    // What the node holds is known again: b went at 11, so a change
    // at 12 goes at 12; c is held at 4, so one at 13 goes at 13.
    let actions = put(&mut r, &mut store, cm("b", 12, "b2"));
    assert_eq!(
        sends(&actions),
        [s("edge-1", Update, "configmap/b", Of(12))]
    );
    let actions = put(&mut r, &mut store, cm("c", 13, "c2"));
    assert_eq!(
        sends(&actions),
        [s("edge-1", Update, "configmap/c", Of(13))]
    );
}

#[test]
fn a_nodes_devices_are_known_only_once_devices_and_models_are_listed() {
    let device = |name: &str, node: &str| {
        object(json!({
            "apiVersion": "devices.kubeedge.io/v1beta1",
            "kind": "Device",
            "metadata": { "name": name, "namespace": NS, "resourceVersion": "3" },
            "spec": { "nodeName": node, "deviceModelRef": { "name": "thermo" } },
        }))
    };
    let store = store_of(&[
        device("t2", "edge-1"),
        device("t1", "edge-1"),
        device("t3", "edge-2"),
        pod("p1", Some("edge-1"), 3, &[], "nginx"),
    ]);
    let mut r = Reconciler::new();
    assert_eq!(r.devices_of("edge-1"), None);
    r.listed(Kind::Device, of_kind(&store, Kind::Device), 3, &store);
    // Devices without their models' types are not the whole answer.
    assert_eq!(r.devices_of("edge-1"), None);
    r.listed(Kind::DeviceModel, Vec::new(), 3, &store);
    assert_eq!(
        r.devices_of("edge-1"),
        Some(vec![key(Kind::Device, "t1"), key(Kind::Device, "t2")])
    );
    assert_eq!(r.devices_of("edge-2"), Some(vec![key(Kind::Device, "t3")]));
    // Listed, a node with none has none.
    assert_eq!(r.devices_of("edge-3"), Some(Vec::new()));
}

#[test]
fn nothing_is_withdrawn_before_every_kind_is_listed() {
    let store = store_of(&[
        cm("a", 2, "a"),
        pod("p1", Some("edge-1"), 3, &["a"], "nginx"),
    ]);
    let mut r = Reconciler::new();
    for kind in [Kind::ConfigMap, Kind::Pod] {
        assert!(r.listed(kind, of_kind(&store, kind), 3, &store).is_empty());
    }
    assert!(!r.loaded());
    let actions = r.connected("edge-1", NodeDialect::Native, &store);
    assert_eq!(actions, [ask("edge-1"), update_node("edge-1")]);
    let held = inventory(&[("configmap/zombie", 1), ("pod/ghost", 1)]);
    let actions = r.inventory("edge-1", Ok(held), &store);
    assert_eq!(
        sends(&actions),
        [
            s("edge-1", Insert, "configmap/a", Fresh),
            s("edge-1", Insert, "pod/p1", Fresh),
        ]
    );
}

#[test]
fn a_kubeedge_node_gets_everything_again_without_being_asked() {
    let store = store_of(&[
        cm("a", 2, "a"),
        pod("p1", Some("edge-1"), 3, &["a"], "nginx"),
        pod("p2", Some("edge-1"), 4, &[], "nginx"),
        pod("p3", Some("edge-2"), 5, &["a"], "nginx"),
    ]);
    let mut r = loaded(&store, 5);
    let actions = r.connected("edge-1", NodeDialect::KubeEdge, &store);
    assert!(!actions.contains(&ask("edge-1")), "{actions:?}");
    assert_eq!(actions.last(), Some(&update_node("edge-1")));
    assert_eq!(
        sends(&actions),
        [
            s("edge-1", Insert, "configmap/a", Fresh),
            s("edge-1", Update, "pod/p1", Of(3)),
            s("edge-1", Update, "pod/p2", Of(4)),
        ]
    );
    assert!(r.is_kubeedge("edge-1"));
    ack(&mut r, &actions, 6);
    // A retry after a failed send sends it all again, unasked.
    r.sent("edge-1", Update, &key(Kind::Pod, "p1"), 3, false);
    let actions = r.retry(&store);
    assert_eq!(sends(&actions).len(), 3, "{actions:?}");
    assert!(!actions.contains(&ask("edge-1")));
}

fn read_cursor(node: &str, session: u64) -> Action {
    Action::ReadCursor {
        node: node.to_owned(),
        session,
    }
}

/// A reconciler with delivery cursors that took its first list of
/// every kind from `store`.
fn loaded_with_cursors(store: &Store, revision: u64) -> Reconciler {
    let mut r = Reconciler::new().with_cursors(true);
    for kind in FOLLOWED {
        assert!(
            r.listed(kind, of_kind(store, kind), revision, store)
                .is_empty()
        );
    }
    r
}

fn cursor_of(acked: &[(&str, u64, i64)]) -> BTreeMap<String, Acked> {
    acked
        .iter()
        .map(|(resource, version, claim)| {
            (
                format!("{NS}/{resource}"),
                Acked {
                    version: *version,
                    claim: *claim,
                },
            )
        })
        .collect()
}

#[test]
fn a_kubeedge_node_with_a_cursor_is_sent_only_what_it_lacks() {
    let store = store_of(&[
        cm("a", 2, "a"),
        cm("b", 3, "b"),
        cm("c", 4, "c"),
        pod("p1", Some("edge-1"), 5, &["a"], "nginx"),
        pod("p2", Some("edge-1"), 6, &["b"], "nginx"),
        pod("p3", Some("edge-1"), 7, &["c"], "nginx"),
        pod("p4", Some("edge-1"), 8, &[], "nginx"),
        pod("p5", Some("edge-1"), 9, &[], "nginx"),
        pod("p6", Some("edge-1"), 10, &[], "nginx"),
    ]);
    let mut r = loaded_with_cursors(&store, 10);
    // Not assumed: the cursor is read first.
    let actions = r.connected("edge-1", NodeDialect::KubeEdge, &store);
    assert_eq!(actions, [read_cursor("edge-1", 1), update_node("edge-1")]);
    let cursor = cursor_of(&[
        ("pod/p1", 5, 40),         // held
        ("configmap/a", 2, 40),    // held: p1, which uses it, is held under claim 40
        ("pod/p2", 6, 40),         //
        ("configmap/b", 3, 30),    // recorded under another claim than p2: not sure
        ("pod/p3", 4, 40),         // older than its spec (7)
        ("configmap/c", 4, 40),    // p3, which uses it, is not held at its spec
        ("pod/p5", 0, 40),         // a message of it was on its way
        ("pod/p6", 11, 40),        // above its spec (sent at a fresh version)
        ("pod/ghost", 3, 30),      // not desired
        ("configmap/gone", 0, 40), // not desired, maybe held
    ]);
    let actions = r.cursor("edge-1", 1, Ok(cursor), &store);
    assert_eq!(
        sends(&actions),
        [
            s("edge-1", Delete, "configmap/gone", Fresh),
            s("edge-1", Delete, "pod/ghost", Fresh),
            s("edge-1", Insert, "configmap/b", Fresh),
            s("edge-1", Insert, "configmap/c", Fresh),
            s("edge-1", Update, "pod/p3", Of(7)),
            // Not in the cursor: acknowledged after it was written.
            s("edge-1", Update, "pod/p4", Of(8)),
            s("edge-1", Insert, "pod/p5", Fresh),
        ]
    );
    ack(&mut r, &actions, 12);
    // Everything acknowledged, under one claim: nothing goes.
    r.disconnected("edge-1");
    let actions = r.connected("edge-1", NodeDialect::KubeEdge, &store);
    assert_eq!(actions[0], read_cursor("edge-1", 3));
    let all = cursor_of(&[
        ("pod/p1", 5, 41),
        ("pod/p2", 6, 41),
        ("pod/p3", 7, 41),
        ("pod/p4", 8, 41),
        ("pod/p5", 12, 41),
        ("pod/p6", 11, 41),
        ("configmap/a", 2, 41),
        ("configmap/b", 12, 41),
        ("configmap/c", 12, 41),
    ]);
    let actions = r.cursor("edge-1", 3, Ok(all), &store);
    assert!(sends(&actions).is_empty(), "{actions:?}");
}

#[test]
fn a_cursor_read_for_an_earlier_link_is_not_taken() {
    let mut store = store_of(&[pod("p1", Some("edge-1"), 2, &[], "nginx")]);
    let mut r = loaded_with_cursors(&store, 2);
    r.connected("edge-1", NodeDialect::KubeEdge, &store);
    // The node leaves and links again; meanwhile p2 is created and
    // sent nowhere (the node is not linked).
    r.served_elsewhere("edge-1");
    let actions = put(
        &mut r,
        &mut store,
        pod("p2", Some("edge-1"), 3, &[], "nginx"),
    );
    assert_eq!(sends(&actions).len(), 1);
    let actions = r.connected("edge-1", NodeDialect::KubeEdge, &store);
    assert_eq!(actions[0], read_cursor("edge-1", 3));
    // The first read's answer, late: not this link's.
    let late = cursor_of(&[("pod/p1", 2, 7)]);
    assert!(r.cursor("edge-1", 1, Ok(late.clone()), &store).is_empty());
    // This link's: p2, never sent on it, goes.
    let actions = r.cursor("edge-1", 3, Ok(late.clone()), &store);
    assert_eq!(sends(&actions), [s("edge-1", Update, "pod/p2", Of(3))]);
    // Answered once.
    assert!(r.cursor("edge-1", 3, Ok(late), &store).is_empty());
}

#[test]
fn a_kubeedge_node_whose_cursor_cannot_be_read_gets_everything_again() {
    let store = store_of(&[
        cm("a", 2, "a"),
        pod("p1", Some("edge-1"), 3, &["a"], "nginx"),
        pod("p2", Some("edge-1"), 4, &[], "nginx"),
    ]);
    let mut r = loaded_with_cursors(&store, 4);
    assert_eq!(
        r.connected("edge-1", NodeDialect::KubeEdge, &store)[0],
        read_cursor("edge-1", 1)
    );
    // Sent while the cursor is read: left alone.
    let mut store = store;
    let actions = put(
        &mut r,
        &mut store,
        pod("p3", Some("edge-1"), 5, &[], "nginx"),
    );
    assert_eq!(sends(&actions), [s("edge-1", Insert, "pod/p3", Of(5))]);
    let actions = r.cursor("edge-1", 1, Err("etcd out of reach".to_owned()), &store);
    assert_eq!(
        sends(&actions),
        [
            s("edge-1", Insert, "configmap/a", Fresh),
            s("edge-1", Update, "pod/p1", Of(3)),
            s("edge-1", Update, "pod/p2", Of(4)),
        ]
    );
    // A native node is still asked; without cursors, a KubeEdge node
    // is assumed to hold its pods, as before.
    assert_eq!(
        r.connected("edge-2", NodeDialect::Native, &store)[0],
        ask("edge-2")
    );
    let mut plain = loaded(&store, 5);
    let actions = plain.connected("edge-1", NodeDialect::KubeEdge, &store);
    assert!(
        !actions
            .iter()
            .any(|a| matches!(a, Action::ReadCursor { .. }))
    );
    assert_eq!(sends(&actions).len(), 4);
}

#[test]
fn a_kubeedge_kubelet_gets_its_pod_marked_deleted_again_until_it_says_it_stopped() {
    let mut ending = pod("p1", Some("edge-1"), 3, &[], "nginx");
    ending.edit(|o| o["metadata"]["deletionTimestamp"] = json!("2024-01-01T00:00:00Z"));
    ending.edit(|o| o["metadata"]["uid"] = json!("u1"));
    let store = store_of(&[ending, pod("p2", Some("edge-1"), 4, &[], "nginx")]);
    let mut r = loaded_with_cursors(&store, 4);
    r.connected("edge-1", NodeDialect::KubeEdge, &store);
    // Missing from the cursor: it goes again marked deleted (its
    // kubelet terminates it and says so), and nothing finishes it but
    // that word.
    let actions = r.cursor("edge-1", 1, Ok(cursor_of(&[("pod/p2", 4, 7)])), &store);
    assert_eq!(sends(&actions), [s("edge-1", Update, "pod/p1", Fresh)]);
    assert!(!finishes(&actions), "{actions:?}");
    let Some(Action::Send { object, .. }) = actions.first() else {
        panic!("{actions:?}");
    };
    assert!(object.is_terminating());
}

fn finishes(actions: &[Action]) -> bool {
    actions
        .iter()
        .any(|a| matches!(a, Action::FinishDeletion { .. }))
}

fn finish(name: &str, uid: &str) -> Termination {
    Termination::Finish {
        key: key(Kind::Pod, name),
        uid: Some(uid.to_owned()),
    }
}

/// `object` marked deleted at revision `rv`, with uid `uid`.
fn deleting(object: &Object, rv: u64, uid: &str) -> Object {
    let mut object = revised(object, rv);
    object.edit(|o| o["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z"));
    object.edit(|o| o["metadata"]["uid"] = json!(uid));
    object
}

/// A loaded reconciler with pod `p1` (uid `u1`) running on native
/// node `edge-1`, in step.
fn running_pod() -> (Reconciler, Store, Object) {
    let mut running = pod("p1", Some("edge-1"), 3, &[], "nginx");
    running.edit(|o| o["metadata"]["uid"] = json!("u1"));
    let store = store_of(std::slice::from_ref(&running));
    let mut r = loaded(&store, 3);
    r.connected("edge-1", NodeDialect::Native, &store);
    let actions = r.inventory("edge-1", Ok(inventory(&[("pod/p1", 3)])), &store);
    assert!(actions.is_empty(), "in step: {actions:?}");
    (r, store, running)
}

#[test]
fn a_graceful_deletion_ends_when_the_node_says_the_pod_stopped_not_when_it_holds_it() {
    let (mut r, mut store, running) = running_pod();
    let actions = put(&mut r, &mut store, deleting(&running, 5, "u1"));
    assert_eq!(sends(&actions), [s("edge-1", Delete, "pod/p1", Of(5))]);
    ack(&mut r, &actions, 0);
    // The node holds the deletion: its containers still run (for up
    // to their grace period), so nothing is finished.
    assert!(r.delivered("edge-1", &key(Kind::Pod, "p1")).is_empty());
    assert!(r.retry(&store).is_empty());
    // Its grace period ran out at the edge, which killed the
    // containers and said so: finished, with the uid as precondition.
    assert_eq!(
        r.terminated("edge-1", &key(Kind::Pod, "p1"), Some("u1")),
        finish("p1", "u1")
    );
    // Once gone, nothing more goes to a node told with a delete, and a
    // repeated word finishes nothing.
    assert!(remove(&mut r, &mut store, Kind::Pod, "p1", 6).is_empty());
    assert_eq!(
        r.terminated("edge-1", &key(Kind::Pod, "p1"), Some("u1")),
        Termination::Gone
    );
}

#[test]
fn an_ending_pod_keeps_its_configmap_on_the_node_until_it_is_gone() {
    // A kubelet keeps a terminating pod's volumes until its containers
    // stopped: what the pod uses stays on the node until the pod is gone.
    for dialect in [NodeDialect::Native, NodeDialect::KubeEdge] {
        let mut store = store_of(&[cm("cm", 2, "a")]);
        let mut r = loaded(&store, 2);
        r.connected("edge-1", dialect, &store);
        let mut web = pod("web", Some("edge-1"), 3, &["cm"], "nginx");
        web.edit(|o| o["metadata"]["uid"] = json!("u1"));
        let actions = put(&mut r, &mut store, web.clone());
        ack(&mut r, &actions, 0);
        let marked = match dialect {
            NodeDialect::Native => Delete,
            NodeDialect::KubeEdge => Update,
        };
        let actions = put(&mut r, &mut store, deleting(&web, 4, "u1"));
        assert_eq!(
            sends(&actions),
            [s("edge-1", marked, "pod/web", Of(4))],
            "{dialect:?}"
        );
        assert!(r.entitled("edge-1", &key(Kind::ConfigMap, "cm")));
        ack(&mut r, &actions, 0);
        // An update of the configmap still reaches the ending pod.
        let actions = put(&mut r, &mut store, cm("cm", 5, "b"));
        assert_eq!(
            sends(&actions),
            [s("edge-1", Update, "configmap/cm", Of(5))]
        );
        ack(&mut r, &actions, 0);
        // Its node said it stopped; the object is gone: the configmap goes
        // (and a KubeEdge kubelet is told to drop the pod first).
        let actions = remove(&mut r, &mut store, Kind::Pod, "web", 6);
        let mut expected = vec![s("edge-1", Delete, "configmap/cm", Of(6))];
        if dialect == NodeDialect::KubeEdge {
            expected.insert(0, s("edge-1", Delete, "pod/web", Of(6)));
        }
        assert_eq!(sends(&actions), expected, "{dialect:?}");
        assert!(!r.entitled("edge-1", &key(Kind::ConfigMap, "cm")));
    }

    // A cloud restarted mid-termination keeps it too, and lets it go when
    // a relist no longer shows the pod.
    let mut web = pod("web", Some("edge-1"), 3, &["cm"], "nginx");
    web.edit(|o| o["metadata"]["uid"] = json!("u1"));
    let mut store = store_of(&[cm("cm", 2, "a"), deleting(&web, 4, "u1")]);
    let mut r = loaded(&store, 4);
    r.connected("edge-1", NodeDialect::Native, &store);
    let actions = r.inventory(
        "edge-1",
        Ok(inventory(&[("configmap/cm", 2), ("pod/web", 3)])),
        &store,
    );
    assert_eq!(sends(&actions), [s("edge-1", Delete, "pod/web", Fresh)]);
    assert!(r.entitled("edge-1", &key(Kind::ConfigMap, "cm")));
    store.remove(&key(Kind::Pod, "web"));
    let actions = r.listed(Kind::Pod, of_kind(&store, Kind::Pod), 7, &store);
    assert_eq!(
        sends(&actions),
        [s("edge-1", Delete, "configmap/cm", Of(7))]
    );
}

#[test]
fn a_node_offline_at_delete_time_is_told_again_and_finishes_it_when_it_returns() {
    let (mut r, mut store, running) = running_pod();
    r.disconnected("edge-1");
    let actions = put(&mut r, &mut store, deleting(&running, 5, "u1"));
    assert_eq!(sends(&actions), [s("edge-1", Delete, "pod/p1", Of(5))]);
    // It returns (the queued delete may or may not have reached it):
    // told again, with the uid, and still not finished.
    r.connected("edge-1", NodeDialect::Native, &store);
    for held in [vec![("pod/p1", 3)], vec![]] {
        let actions = r.inventory("edge-1", Ok(inventory(&held)), &store);
        r.connected("edge-1", NodeDialect::Native, &store);
        assert_eq!(sends(&actions), [s("edge-1", Delete, "pod/p1", Fresh)]);
        assert!(!finishes(&actions));
        let Some(Action::Send { object, .. }) = actions.first() else {
            panic!("{actions:?}");
        };
        assert_eq!(object["metadata"]["uid"], "u1");
    }
    assert_eq!(
        r.terminated("edge-1", &key(Kind::Pod, "p1"), Some("u1")),
        finish("p1", "u1")
    );
}

#[test]
fn a_pod_that_never_started_at_the_edge_finishes_at_its_word() {
    let mut fresh = pod("p1", Some("edge-1"), 3, &[], "nginx");
    fresh.edit(|o| o["metadata"]["uid"] = json!("u1"));
    let mut store = Store::new();
    let mut r = loaded(&store, 2);
    r.connected("edge-1", NodeDialect::Native, &store);
    put(&mut r, &mut store, fresh.clone());
    // Deleted before the node took it: the delete goes, the edge
    // (nothing of it running) says so at once.
    let actions = put(&mut r, &mut store, deleting(&fresh, 4, "u1"));
    assert_eq!(sends(&actions), [s("edge-1", Delete, "pod/p1", Of(4))]);
    assert_eq!(
        r.terminated("edge-1", &key(Kind::Pod, "p1"), None),
        finish("p1", "u1"),
        "a word naming no uid is for whichever pod of that name is ending"
    );
}

#[test]
fn an_edge_restarted_mid_termination_is_told_again() {
    let (mut r, mut store, running) = running_pod();
    let actions = put(&mut r, &mut store, deleting(&running, 5, "u1"));
    ack(&mut r, &actions, 0);
    // The edge restarts: it dropped the pod when told, tore down what
    // was left at start, and never said so. Its new link asks.
    r.disconnected("edge-1");
    assert_eq!(
        r.connected("edge-1", NodeDialect::Native, &store),
        [ask("edge-1"), update_node("edge-1")]
    );
    let actions = r.inventory("edge-1", Ok(inventory(&[])), &store);
    assert_eq!(sends(&actions), [s("edge-1", Delete, "pod/p1", Fresh)]);
    assert!(!finishes(&actions));
    assert_eq!(
        r.terminated("edge-1", &key(Kind::Pod, "p1"), Some("u1")),
        finish("p1", "u1")
    );
}

#[test]
fn a_restarted_cloud_rebuilds_its_deletions_and_keeps_a_word_that_came_first() {
    let mut running = pod("p1", Some("edge-1"), 3, &[], "nginx");
    running.edit(|o| o["metadata"]["uid"] = json!("u1"));
    let ending = deleting(&running, 5, "u1");
    // Restarted: the first list shows the deletion, the node links
    // and is told again (it may have said so to the cloud that died).
    let store = store_of(std::slice::from_ref(&ending));
    let mut r = loaded(&store, 5);
    r.connected("edge-1", NodeDialect::Native, &store);
    let actions = r.inventory("edge-1", Ok(inventory(&[])), &store);
    assert_eq!(sends(&actions), [s("edge-1", Delete, "pod/p1", Fresh)]);
    assert_eq!(
        r.terminated("edge-1", &key(Kind::Pod, "p1"), Some("u1")),
        finish("p1", "u1")
    );

    // A word before the first list (the node linked first): kept,
    // and taken by the list.
    let mut r = Reconciler::new();
    assert_eq!(
        r.terminated("edge-1", &key(Kind::Pod, "p1"), Some("u1")),
        Termination::Kept
    );
    let mut finished = Vec::new();
    for kind in FOLLOWED {
        finished.extend(r.listed(kind, of_kind(&store, kind), 5, &store));
    }
    assert_eq!(
        finished,
        [Action::FinishDeletion {
            key: key(Kind::Pod, "p1"),
            uid: Some("u1".to_owned())
        }]
    );

    // A word before the watch shows the deletion (another replica
    // told the node): kept, and the deletion finishes when it shows.
    let mut store = store_of(std::slice::from_ref(&running));
    let mut r = loaded(&store, 3);
    assert_eq!(
        r.terminated("edge-1", &key(Kind::Pod, "p1"), Some("u1")),
        Termination::Kept
    );
    let actions = put(&mut r, &mut store, ending.clone());
    assert_eq!(
        actions.last(),
        Some(&Action::FinishDeletion {
            key: key(Kind::Pod, "p1"),
            uid: Some("u1".to_owned())
        })
    );
    // One about an earlier pod of that name finishes nothing.
    let mut store = store_of(std::slice::from_ref(&running));
    let mut r = loaded(&store, 3);
    assert_eq!(
        r.terminated("edge-1", &key(Kind::Pod, "p1"), Some("u0")),
        Termination::Gone
    );
    assert!(!finishes(&put(&mut r, &mut store, ending)));
}

#[test]
fn a_node_never_speaks_for_another_nodes_pod() {
    let (mut r, mut store, running) = running_pod();
    let p1 = key(Kind::Pod, "p1");
    // Running on edge-1: edge-2's word is refused, and not kept.
    assert!(matches!(
        r.terminated("edge-2", &p1, Some("u1")),
        Termination::Refused(_)
    ));
    let actions = put(&mut r, &mut store, deleting(&running, 5, "u1"));
    assert!(!finishes(&actions), "{actions:?}");
    // Being deleted on edge-1: still refused, and left to edge-1.
    assert!(matches!(
        r.terminated("edge-2", &p1, Some("u1")),
        Termination::Refused(_)
    ));
    assert_eq!(r.terminated("edge-1", &p1, Some("u1")), finish("p1", "u1"));
    // A pod nobody knows (its deletion finished) is nothing to finish.
    assert_eq!(
        r.terminated("edge-2", &key(Kind::Pod, "nope"), None),
        Termination::Gone
    );
}

#[test]
fn a_kubeedge_node_is_told_with_the_pod_marked_deleted_and_drops_it_once_gone() {
    let mut running = pod("p1", Some("kube-1"), 3, &[], "nginx");
    running.edit(|o| o["metadata"]["uid"] = json!("u1"));
    let mut store = store_of(std::slice::from_ref(&running));
    let mut r = loaded(&store, 3);
    r.connected("kube-1", NodeDialect::KubeEdge, &store);
    let actions = r.inventory("kube-1", Ok(inventory(&[("pod/p1", 3)])), &store);
    assert!(actions.is_empty(), "{actions:?}");
    // As KubeEdge's cloud does: an update with the deletionTimestamp,
    // which its kubelet terminates, then deletes with grace 0.
    let actions = put(&mut r, &mut store, deleting(&running, 5, "u1"));
    assert_eq!(sends(&actions), [s("kube-1", Update, "pod/p1", Of(5))]);
    ack(&mut r, &actions, 0);
    assert!(r.delivered("kube-1", &key(Kind::Pod, "p1")).is_empty());
    // It links again holding that: nothing to send (its kubelet asks
    // until it is answered).
    r.disconnected("kube-1");
    r.connected("kube-1", NodeDialect::KubeEdge, &store);
    let actions = r.inventory("kube-1", Ok(inventory(&[("pod/p1", 5)])), &store);
    assert!(actions.is_empty(), "{actions:?}");
    assert_eq!(
        r.terminated("kube-1", &key(Kind::Pod, "p1"), Some("u1")),
        finish("p1", "u1")
    );
    // Gone from the desired state: the node drops it now.
    let actions = remove(&mut r, &mut store, Kind::Pod, "p1", 6);
    assert_eq!(sends(&actions), [s("kube-1", Delete, "pod/p1", Of(6))]);
}

#[test]
fn a_node_without_an_inventory_is_asked_again_while_connected() {
    let store = store_of(&[pod("p1", Some("edge-1"), 2, &[], "nginx")]);
    let mut r = loaded(&store, 2);
    r.connected("edge-1", NodeDialect::Native, &store);
    let actions = r.inventory("edge-1", Err("timed out".to_owned()), &store);
    assert!(actions.is_empty());
    assert_eq!(r.retry(&store), [ask("edge-1")]);
    assert!(r.retry(&store).is_empty(), "asked once");
    assert!(
        r.inventory("edge-1", Err("timed out".to_owned()), &store)
            .is_empty()
    );
    assert_eq!(r.disconnected("edge-1"), [update_node("edge-1")]);
    assert!(!r.is_connected("edge-1"));
    assert!(r.retry(&store).is_empty(), "not while disconnected");
    let actions = r.connected("edge-1", NodeDialect::Native, &store);
    assert_eq!(actions, [ask("edge-1"), update_node("edge-1")]);
    let actions = r.inventory("edge-1", Ok(inventory(&[("pod/p1", 2)])), &store);
    assert!(actions.is_empty(), "in step");
}

#[test]
fn a_send_not_queued_brings_the_node_in_step_on_the_next_retry() {
    let mut store = store_of(&[cm("a", 2, "a")]);
    let mut r = loaded(&store, 2);
    r.connected("edge-1", NodeDialect::Native, &store);
    assert!(
        r.inventory("edge-1", Ok(BTreeMap::new()), &store)
            .is_empty()
    );
    assert!(r.retry(&store).is_empty(), "in step");
    let actions = put(
        &mut r,
        &mut store,
        pod("p1", Some("edge-1"), 3, &["a"], "nginx"),
    );
    assert_eq!(sends(&actions).len(), 2);
    r.sent("edge-1", Insert, &key(Kind::ConfigMap, "a"), 3, true);
    r.sent("edge-1", Insert, &key(Kind::Pod, "p1"), 3, false);
    assert_eq!(r.retry(&store), [ask("edge-1")]);
    assert!(r.retry(&store).is_empty());
    let actions = r.inventory("edge-1", Ok(inventory(&[("configmap/a", 3)])), &store);
    assert_eq!(sends(&actions), [s("edge-1", Insert, "pod/p1", Fresh)]);
    // A failure while disconnected waits for the link.
    r.disconnected("edge-1");
    r.sent("edge-1", Insert, &key(Kind::Pod, "p1"), 4, false);
    assert!(r.retry(&store).is_empty());
    assert_eq!(
        r.connected("edge-1", NodeDialect::Native, &store)[0],
        ask("edge-1")
    );
}

// ----- what nodes say -----

#[test]
fn a_node_reports_and_reads_only_what_is_its_own() {
    let device = object(json!({
        "apiVersion": "devices.kubeedge.io/v1beta1",
        "kind": "Device",
        "metadata": { "name": "t1", "namespace": NS, "resourceVersion": "6" },
        "spec": { "nodeName": "edge-1", "deviceModelRef": { "name": "thermo" } },
    }));
    let store = store_of(&[
        cm("mine", 2, "a"),
        cm("theirs", 3, "b"),
        pod("p1", Some("edge-1"), 4, &["mine"], "nginx"),
        pod("p2", Some("edge-2"), 5, &["theirs"], "nginx"),
        device,
    ]);
    let r = loaded(&store, 6);
    assert!(r.may_report("edge-1", &key(Kind::Pod, "p1")));
    assert!(!r.may_report("edge-2", &key(Kind::Pod, "p1")));
    assert!(!r.may_report("edge-1", &key(Kind::Pod, "p2")));
    assert!(!r.may_report("edge-1", &key(Kind::Pod, "unknown")));
    assert!(r.may_report("edge-1", &key(Kind::Device, "t1")));
    assert!(!r.may_report("edge-2", &key(Kind::Device, "t1")));
    assert!(!r.may_report("edge-1", &key(Kind::ConfigMap, "mine")));
    let yes = [
        key(Kind::Pod, "p1"),
        key(Kind::Device, "t1"),
        key(Kind::ConfigMap, "mine"),
        key(Kind::DeviceModel, "thermo"),
        key(Kind::Service, "anything"),
        key(Kind::Endpoints, "anything"),
        ObjectKey::new(Kind::Node, "", "edge-1"),
    ];
    let no = [
        key(Kind::Pod, "p2"),
        key(Kind::ConfigMap, "theirs"),
        key(Kind::ConfigMap, "unused"),
        key(Kind::Secret, "unused"),
        ObjectKey::new(Kind::Node, "", "edge-2"),
    ];
    for key in yes {
        assert!(r.entitled("edge-1", &key), "{key}");
    }
    for key in no {
        assert!(!r.entitled("edge-1", &key), "{key}");
    }
}

#[test]
fn the_ready_condition_follows_the_link_and_the_report() {
    let time = |second| Time(jiff::Timestamp::from_second(second).expect("a time"));
    let store = Store::new();
    let mut r = loaded(&store, 1);
    let down = r.ready_condition("edge-1", time(100));
    assert_eq!(
        (down.type_.as_str(), down.status.as_str()),
        ("Ready", "Unknown")
    );
    assert_eq!(down.reason.as_deref(), Some("EdgeLinkDown"));
    assert_eq!(down.last_heartbeat_time, Some(time(100)));
    r.connected("edge-1", NodeDialect::Native, &store);
    let up = r.ready_condition("edge-1", time(101));
    assert_eq!(up.status, "True");
    assert_eq!(up.reason.as_deref(), Some("EdgeConnected"));
    assert_eq!(up.last_heartbeat_time, Some(time(101)));
    let reported = NodeCondition {
        type_: "Ready".to_owned(),
        status: "False".to_owned(),
        reason: Some("KubeletNotReady".to_owned()),
        message: Some("container runtime is down".to_owned()),
        last_heartbeat_time: Some(time(50)),
        last_transition_time: Some(time(40)),
    };
    r.reported_ready("edge-1", reported.clone());
    let own = r.ready_condition("edge-1", time(102));
    assert_eq!(
        own,
        NodeCondition {
            last_heartbeat_time: Some(time(102)),
            ..reported.clone()
        }
    );
    // The link goes down: Unknown, whatever the node said.
    r.disconnected("edge-1");
    assert_eq!(r.ready_condition("edge-1", time(103)).status, "Unknown");
    // Back: its last report again.
    r.connected("edge-1", NodeDialect::Native, &store);
    assert_eq!(r.ready_condition("edge-1", time(104)).status, "False");
    // The Node deleted: its report goes with it.
    let node = object(json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": { "name": "edge-1", "resourceVersion": "5" },
    }));
    assert!(
        r.observe(Kind::Node, &WatchEvent::Deleted(node), &store)
            .is_empty()
    );
    assert_eq!(r.ready_condition("edge-1", time(105)).status, "True");
    // Another node is not linked.
    assert_eq!(r.ready_condition("edge-2", time(105)).status, "Unknown");
}

// ----- a random walk -----

use crate::test_rng::Rng;

const NODES: [&str; 3] = ["edge-1", "edge-2", "edge-3"];
const CONFIGMAPS: usize = 5;
const PODS: usize = 8;

/// A desired state changing at random, a watch delivering its events
/// late (each kind in order, kinds in any order), nodes linking and
/// leaving, inventories answered late or not at all, and edges that
/// keep what they are sent as edges do.
struct Sim {
    seed: u64,
    rng: Rng,
    /// The last revision issued (by a write or a fresh version).
    revision: u64,
    store: Store,
    /// Events not yet handed to the reconciler.
    pending: BTreeMap<Kind, VecDeque<WatchEvent>>,
    /// The pods as the reconciler was told of them.
    observed: HashMap<ObjectKey, Object>,
    r: Reconciler,
    edges: Edges,
    linked: BTreeSet<String>,
    /// Inventories asked for: the node, and what it held when asked
    /// (or none: what it holds when answered).
    asks: Vec<(String, Option<BTreeMap<String, String>>)>,
    /// Whether cloudhub sometimes does not take a message, and
    /// inventories sometimes fail.
    failures: bool,
    /// Whether a message was not taken.
    failed: bool,
    /// Batches of actions carried out so far.
    batches: u64,
    log: Vec<String>,
}

impl Sim {
    fn new(seed: u64, failures: bool) -> Sim {
        let store = Store::new();
        Sim {
            seed,
            rng: Rng(seed),
            revision: 1,
            r: loaded(&store, 1),
            store,
            pending: BTreeMap::new(),
            observed: HashMap::new(),
            edges: Edges::default(),
            linked: BTreeSet::new(),
            asks: Vec::new(),
            failures,
            failed: false,
            batches: 0,
            log: Vec::new(),
        }
    }

    fn fail(&self, what: &str) -> ! {
        let recent = &self.log[self.log.len().saturating_sub(300)..];
        panic!(
            "seed {:#x}: {what}\n{}\n(seed {:#x}: {what})",
            self.seed,
            recent.join("\n"),
            self.seed
        );
    }

    /// A chance of `percent` for `what` in the current batch, the same
    /// whatever order the batch's actions come in (the reconciler's
    /// maps have no fixed order).
    fn roll(&self, what: impl Hash, percent: u64) -> bool {
        let mut hasher = DefaultHasher::new();
        (self.seed, self.batches, what).hash(&mut hasher);
        hasher.finish() % 100 < percent
    }

    fn random_node(&mut self) -> Option<String> {
        match self.rng.below(4) {
            0 => None,
            n => Some(NODES[n - 1].to_owned()),
        }
    }

    fn random_pod(&mut self, name: &str, node: Option<&str>) -> Object {
        let cms: Vec<String> = (0..CONFIGMAPS)
            .filter(|_| self.rng.percent(30))
            .map(|i| format!("cm-{i}"))
            .collect();
        let cms: Vec<&str> = cms.iter().map(String::as_str).collect();
        // Each spec its own, never one seen before.
        pod(name, node, 0, &cms, &format!("nginx:{}", self.revision))
    }

    /// Stores `object` at a new revision (its spec revision moves only
    /// if its desired part changes); its event waits for the watch.
    fn write(&mut self, mut object: Object) {
        let key = object.key().clone();
        self.revision += 1;
        let spec = match self.store.get(&key) {
            Some(old) if desired_body(old.json()) == desired_body(object.json()) => {
                spec_revision(old)
            }
            _ => self.revision,
        };
        object.edit(|o| o["metadata"]["resourceVersion"] = json!(self.revision.to_string()));
        object.edit(|o| o["metadata"]["annotations"] = json!({ SPEC_REVISION: spec.to_string() }));
        let event = match self.store.insert(key.clone(), object.clone()) {
            Some(_) => WatchEvent::Modified(object),
            None => WatchEvent::Added(object),
        };
        let object = event.object();
        let refs: Vec<String> = references(&key, object.json()).iter().map(short).collect();
        self.log.push(format!(
            "{}: write {key} (spec {spec}) on {:?} using {refs:?}",
            self.revision,
            node_of(object)
        ));
        self.pending.entry(key.kind).or_default().push_back(event);
    }

    fn delete(&mut self, key: &ObjectKey) {
        if let Some(object) = self.store.remove(key) {
            self.revision += 1;
            self.log.push(format!("{}: delete {key}", self.revision));
            let event = WatchEvent::Deleted(revised(&object, self.revision));
            self.pending.entry(key.kind).or_default().push_back(event);
        }
    }

    fn step(&mut self) {
        match self.rng.below(100) {
            0..20 => {
                // A new content, or the same one again.
                let name = format!("cm-{}", self.rng.below(CONFIGMAPS));
                let object = match self.store.get(&key(Kind::ConfigMap, &name)) {
                    Some(object) if self.rng.percent(30) => object.clone(),
                    _ => cm(&name, 0, &format!("data-{}", self.revision)),
                };
                self.write(object);
            }
            20..25 => {
                let name = format!("cm-{}", self.rng.below(CONFIGMAPS));
                self.delete(&key(Kind::ConfigMap, &name));
            }
            25..45 => {
                let name = format!("pod-{}", self.rng.below(PODS));
                let object = match self.store.get(&key(Kind::Pod, &name)).cloned() {
                    Some(mut object) if self.rng.percent(30) => {
                        object.edit(|o| {
                            o["status"]["phase"] = json!(format!("phase-{}", self.rng.next()))
                        });
                        object
                    }
                    Some(object) => {
                        // Bound once, bound for good.
                        let node = match node_of(&object) {
                            Some(node) => Some(node.to_owned()),
                            None => self.random_node(),
                        };
                        self.random_pod(&name, node.as_deref())
                    }
                    None => {
                        let node = self.random_node();
                        self.random_pod(&name, node.as_deref())
                    }
                };
                self.write(object);
            }
            45..52 => {
                let name = format!("pod-{}", self.rng.below(PODS));
                self.delete(&key(Kind::Pod, &name));
            }
            52..72 => {
                let kinds: Vec<Kind> = self
                    .pending
                    .iter()
                    .filter(|(_, events)| !events.is_empty())
                    .map(|(kind, _)| *kind)
                    .collect();
                if !kinds.is_empty() {
                    let kind = kinds[self.rng.below(kinds.len())];
                    self.deliver(kind);
                }
            }
            72..77 => {
                let node = NODES[self.rng.below(NODES.len())];
                let actions = if self.linked.remove(node) {
                    self.log.push(format!("{node} disconnected"));
                    self.r.disconnected(node)
                } else {
                    self.linked.insert(node.to_owned());
                    self.log.push(format!("{node} connected"));
                    self.r.connected(node, NodeDialect::Native, &self.store)
                };
                self.act(actions);
            }
            77..85 => {
                if !self.asks.is_empty() {
                    let index = self.rng.below(self.asks.len());
                    self.answer(index);
                }
            }
            85..90 => {
                self.log.push("retry".to_owned());
                let actions = self.r.retry(&self.store);
                self.act(actions);
            }
            90..93 => {
                let kind = [Kind::ConfigMap, Kind::Pod][self.rng.below(2)];
                self.relist(kind);
            }
            _ => {
                // What waits, as the controller takes it: configmaps
                // first.
                for kind in FOLLOWED {
                    while self.pending.get(&kind).is_some_and(|e| !e.is_empty()) {
                        self.deliver(kind);
                    }
                }
            }
        }
    }

    fn deliver(&mut self, kind: Kind) {
        let Some(event) = self.pending.get_mut(&kind).and_then(VecDeque::pop_front) else {
            return;
        };
        let key = event.object().key().clone();
        if kind == Kind::Pod {
            match &event {
                WatchEvent::Deleted(_) => self.observed.remove(&key),
                _ => self.observed.insert(key.clone(), event.object().clone()),
            };
        }
        self.log
            .push(format!("observe {key} at {}", event.revision()));
        let actions = self.r.observe(kind, &event, &self.store);
        self.act(actions);
    }

    fn relist(&mut self, kind: Kind) {
        self.pending.remove(&kind);
        let objects = of_kind(&self.store, kind);
        self.log.push(format!("relist {kind} at {}", self.revision));
        if kind == Kind::Pod {
            self.observed = store_of(&objects);
        }
        let actions = self.r.listed(kind, objects, self.revision, &self.store);
        self.act(actions);
    }

    fn answer(&mut self, index: usize) {
        let (node, held) = self.asks.remove(index);
        let lost = self.failures && self.roll(("inventory", &node), 10);
        let answer = match self.linked.contains(&node) && !lost {
            true => Ok(held.unwrap_or_else(|| self.edges.inventory(&node))),
            false => Err("no answer".to_owned()),
        };
        self.log.push(format!("inventory of {node}: {answer:?}"));
        let actions = self.r.inventory(&node, answer, &self.store);
        self.act(actions);
    }

    /// Carries out a batch of actions as the controller does: one
    /// fresh version for the batch, taken when first needed.
    fn act(&mut self, actions: Vec<Action>) {
        self.batches += 1;
        let mut fresh = None;
        for action in actions {
            match action {
                Action::Send {
                    node,
                    op,
                    key,
                    object,
                    version,
                } => {
                    self.check_send(&node, op, &key, &object);
                    let version = match (version, fresh) {
                        (Of(version), _) => version,
                        (Fresh, Some(fresh)) => fresh,
                        (Fresh, None) => {
                            self.revision += 1;
                            *fresh.insert(self.revision)
                        }
                    };
                    let queued = !(self.failures && self.roll(("send", &node, &key), 3));
                    self.log.push(format!(
                        "  {node} {op:?} {} at {version}{}",
                        short(&key),
                        if queued { "" } else { " NOT QUEUED" }
                    ));
                    match queued {
                        true => self.edges.apply(&node, op, &key, &object, version),
                        false => self.failed = true,
                    }
                    self.r.sent(&node, op, &key, version, queued);
                }
                Action::AskInventory { node } => {
                    let held = self
                        .roll(("ask", &node), 50)
                        .then(|| self.edges.inventory(&node));
                    self.log.push(format!("  ask {node}"));
                    self.asks.push((node, held));
                    // By node, in the order asked: the same whatever
                    // order the nodes were asked in.
                    self.asks.sort_by(|a, b| a.0.cmp(&b.0));
                }
                Action::ReadCursor { .. }
                | Action::Membership { .. }
                | Action::UpdateNode { .. }
                | Action::FinishDeletion { .. } => {}
            }
        }
    }

    /// A pod goes only to its node; a configmap only to a node where
    /// a pod uses it.
    fn check_send(&self, node: &str, op: Op, key: &ObjectKey, object: &Object) {
        if key.kind == Kind::Pod {
            let bound = node_of(object);
            if bound.is_some_and(|bound| bound != node) || (op != Delete && bound.is_none()) {
                self.fail(&format!(
                    "{op:?} of {key} bound to {bound:?} sent to {node}"
                ));
            }
        }
        if key.kind == Kind::ConfigMap && op != Delete {
            let used = self.observed.iter().any(|(pod, object)| {
                node_of(object) == Some(node) && references(pod, object.json()).contains(key)
            });
            if !used {
                self.fail(&format!(
                    "{op:?} of {key} sent to {node}, where no pod uses it"
                ));
            }
        }
    }

    /// Hands over every event and answers every inventory asked for.
    fn drain(&mut self) {
        loop {
            let kinds: Vec<Kind> = self
                .pending
                .iter()
                .filter(|(_, events)| !events.is_empty())
                .map(|(kind, _)| *kind)
                .collect();
            if !kinds.is_empty() {
                let kind = kinds[self.rng.below(kinds.len())];
                self.deliver(kind);
            } else if !self.asks.is_empty() {
                let index = self.rng.below(self.asks.len());
                self.answer(index);
            } else {
                break;
            }
        }
    }

    /// Each node holds exactly its pods and the configmaps they use,
    /// each in its current spec; with `versions`, at a version at or
    /// above its spec revision (a configmap sent with a pod goes at
    /// the pod's revision, which may be below the configmap's own when
    /// its change was handled first: the next inventory updates it).
    fn check_nodes(&self, when: &str, versions: bool) {
        for node in NODES {
            let mut desired: BTreeMap<String, &Object> = BTreeMap::new();
            for (key, object) in &self.store {
                if key.kind != Kind::Pod || node_of(object) != Some(node) {
                    continue;
                }
                desired.insert(key.edge_resource().to_string(), object);
                for reference in references(key, object.json()) {
                    if let Some(used) = self.store.get(&reference) {
                        desired.insert(reference.edge_resource().to_string(), used);
                    }
                }
            }
            let held = self.edges.live(node);
            if !held.keys().eq(desired.keys()) {
                self.fail(&format!(
                    "{when}: {node} holds {:?}, should hold {:?}",
                    held.keys().collect::<Vec<_>>(),
                    desired.keys().collect::<Vec<_>>()
                ));
            }
            for (resource, object) in desired {
                let (version, content) = &held[&resource];
                if versions && *version < spec_revision(object) {
                    self.fail(&format!(
                        "{when}: {node} holds {resource} at {version}, below {}",
                        spec_revision(object)
                    ));
                }
                if desired_body(content.json()) != desired_body(object.json()) {
                    self.fail(&format!(
                        "{when}: {node} holds {resource} as {}, not as {}",
                        content.json(),
                        object.json()
                    ));
                }
            }
        }
    }
}

fn random_walk(seed: u64, failures: bool) {
    let mut sim = Sim::new(seed, failures);
    for _ in 0..400 {
        sim.step();
    }
    sim.drain();
    if !sim.failed {
        sim.check_nodes("once every event is handled", false);
    }
    // Every node links (again) and reports what it holds.
    sim.failures = false;
    for node in NODES {
        sim.linked.insert(node.to_owned());
        sim.log.push(format!("{node} connected"));
        let actions = sim.r.connected(node, NodeDialect::Native, &sim.store);
        sim.act(actions);
    }
    sim.drain();
    sim.check_nodes("once every node reported what it holds", true);
}

#[test]
fn random_changes_leave_every_node_holding_what_it_should() {
    for seed in 1..=40u64 {
        random_walk(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15), false);
    }
}

#[test]
fn random_changes_and_failures_are_repaired_by_inventories() {
    for seed in 1..=40u64 {
        random_walk(seed.wrapping_mul(0x2545_f491_4f6c_dd1d), true);
    }
}
