//! Tests of the parent module (`watches.rs`).

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
    let secret = json!({"metadata": {"name": "s", "namespace": "default", "resourceVersion": "3"}});
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
