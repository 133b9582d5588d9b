//! The Node rules, deterministic and randomized (time passed in): a
//! node's word adopted into its Node, its status write (conditions,
//! creation, marks, the five-minute refresh of an unchanged status), and
//! the candidates for an unreachable mark.

use k8s_openapi::api::core::v1::{NodeCondition, NodeStatus, NodeSystemInfo};

use super::*;
use crate::test_rng::Rng;
use apis::kinds::object_content;
use beehive::Content;

fn at(text: &str) -> Time {
    Time(text.parse().expect("time"))
}

fn second(s: i64) -> Time {
    Time(jiff::Timestamp::from_second(s).expect("a second"))
}

fn resource(name: &str) -> EdgeResource {
    EdgeResource::new("default", "node", name)
}

fn condition(kind: &str, status: &str, now: &Time) -> NodeCondition {
    NodeCondition {
        type_: kind.to_owned(),
        status: status.to_owned(),
        reason: Some(format!("{kind}{status}")),
        message: None,
        last_heartbeat_time: Some(now.clone()),
        last_transition_time: Some(now.clone()),
    }
}

fn facts<'a>(ready: &str, link: &str, now: &Time) -> NodeFacts<'a> {
    NodeFacts {
        ready: condition("Ready", ready, now),
        link: condition(LINK_CONDITION, link, now),
        kubeedge: true,
        endpoint: None,
    }
}

fn stored_node(version: &str, status: Value) -> Object {
    node(json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": "edge-1", "resourceVersion": version, "labels": {"a": "1"}},
        "status": status,
    }))
}

/// `body` as a stored Node (its kind filled in).
fn node(body: Value) -> Object {
    Object::of_kind(apis::Kind::Node, body).expect("a node")
}

fn conditions_of(object: &Object) -> Vec<(String, String, String)> {
    object["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| {
            let text = |field: &str| c[field].as_str().unwrap_or_default().to_owned();
            (text("type"), text("status"), text("lastTransitionTime"))
        })
        .collect()
}

#[test]
fn an_unchanged_node_status_is_written_every_five_minutes_only() {
    let status = |beat: &str, ready: &str| {
        json!({"conditions": [
            {"type": "Ready", "status": ready, "lastHeartbeatTime": beat},
            {"type": "EdgeLink", "status": "True", "lastHeartbeatTime": beat},
        ], "nodeInfo": {"kubeletVersion": "v1"}})
    };
    let stored = status("2026-11-27T10:00:00Z", "True");
    // The same status with a newer heartbeat: not written within five
    // minutes, written after.
    let beat = status("2026-11-27T10:04:00Z", "True");
    assert!(node_status_current(
        &stored,
        &beat,
        at("2026-11-27T10:04:00Z")
    ));
    assert!(!node_status_current(
        &stored,
        &beat,
        at("2026-11-27T10:05:01Z")
    ));
    // Anything else changed: written at once.
    let changed = status("2026-11-27T10:00:10Z", "False");
    assert!(!node_status_current(
        &stored,
        &changed,
        at("2026-11-27T10:00:10Z")
    ));
    let mut other = stored.clone();
    other["nodeInfo"]["kubeletVersion"] = json!("v2");
    assert!(!node_status_current(
        &stored,
        &other,
        at("2026-11-27T10:00:00Z")
    ));
    assert!(node_status_current(
        &stored,
        &stored,
        at("2026-11-27T11:00:00Z")
    ));
}

#[test]
fn a_registration_adds_its_labels_and_annotations_and_keeps_the_rest() {
    let stored = node(json!({
        "metadata": {"name": "edge-1", "resourceVersion": "7", "labels": {"a": "1", "b": "2"}},
        "status": {"phase": "Running"},
    }));
    let given = json!({"metadata": {
        "labels": {"b": "3", "c": "4"},
        "annotations": {"note": "x"},
    }});
    let Adopted::Replace(object) = adopted(stored.clone(), &given) else {
        panic!("new labels are stored");
    };
    assert_eq!(
        object["metadata"]["labels"],
        json!({"a": "1", "b": "3", "c": "4"})
    );
    assert_eq!(object["metadata"]["annotations"], json!({"note": "x"}));
    assert_eq!(object["status"], stored["status"]);
    assert!(
        object["metadata"].get("resourceVersion").is_none(),
        "the node's own word: unconditional"
    );
    // Nothing new: answered as stored, versioned.
    let same = json!({"metadata": {"labels": {"a": "1"}}, "spec": {"podCIDR": "x"}});
    assert_eq!(
        adopted(stored.clone(), &same),
        Adopted::AsStored(stored.clone())
    );
    assert_eq!(
        adopted(stored.clone(), &json!({})),
        Adopted::AsStored(stored)
    );
}

#[test]
fn a_registrations_status_is_its_report_unless_null() {
    let status = json!({"conditions": []});
    assert_eq!(given_status(&json!({"status": status})), Some(&status));
    assert_eq!(given_status(&json!({"status": null})), None);
    assert_eq!(given_status(&json!({"metadata": {}})), None);
}

#[test]
fn a_node_patches_and_reports_only_its_own_node() {
    let patch = json!({"status": {"phase": "Running"}});
    assert_eq!(
        own_patch("edge-1", &resource("edge-1"), &object_content(&patch)),
        Ok(patch.clone())
    );
    assert_eq!(
        own_patch(
            "edge-1",
            &resource("edge-1"),
            &Content::text(patch.to_string())
        ),
        Ok(patch.clone()),
        "JSON text in a string"
    );
    assert_eq!(
        own_patch("edge-1", &resource("edge-2"), &object_content(&patch)),
        Err(NodeRefused::PatchesAnother)
    );
    assert!(matches!(
        own_patch("edge-1", &resource("edge-1"), &object_content(&json!([1]))),
        Err(NodeRefused::UnreadablePatch(_))
    ));
    let status = json!({"nodeInfo": {"kubeletVersion": "v1.30"}});
    let reported = own_status("edge-1", &resource("edge-1"), &status).expect("a NodeStatus");
    assert_eq!(
        reported.node_info.map(|info| info.kubelet_version),
        Some("v1.30".to_owned())
    );
    assert_eq!(
        own_status("edge-1", &resource("edge-2"), &status).err(),
        Some(NodeRefused::ReportsAnother)
    );
    assert_eq!(
        own_status("edge-1", &resource("edge-1"), &json!({"conditions": 5})).err(),
        Some(NodeRefused::NotANodeStatus)
    );
}

#[test]
fn refusals_say_what_a_kubelet_expects() {
    for (refused, code, message) in [
        (
            NodeRefused::RegistersAnother,
            403,
            "a node registers only itself",
        ),
        (
            NodeRefused::PatchesAnother,
            403,
            "a node patches only itself",
        ),
        (
            NodeRefused::ReportsAnother,
            403,
            "a node reports only its own status",
        ),
        (NodeRefused::NotANodeStatus, 422, "not a NodeStatus"),
        (NodeRefused::UnreadablePatch("bad".to_owned()), 400, "bad"),
    ] {
        let refusal = Refusal::from(refused);
        assert_eq!((refusal.code, refusal.message.as_str()), (code, message));
    }
}

#[test]
fn a_patch_applies_to_the_stored_node_or_to_nothing() {
    let stored = node(json!({"metadata": {"name": "edge-1"}, "status": {"phase": "Pending"}}));
    let patch = json!({"status": {"phase": "Running"}});
    assert_eq!(
        patched(Some(stored), &patch),
        json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "edge-1"},
               "status": {"phase": "Running"}})
    );
    assert_eq!(patched(None, &patch), patch);
}

#[test]
fn the_reported_ready_condition_is_found_by_its_type() {
    let now = second(1_000);
    let status = NodeStatus {
        conditions: Some(vec![
            condition("MemoryPressure", "False", &now),
            condition("Ready", "True", &now),
        ]),
        ..Default::default()
    };
    assert_eq!(
        reported_ready(&status).map(|c| c.status.as_str()),
        Some("True")
    );
    assert!(reported_ready(&NodeStatus::default()).is_none());
}

#[test]
fn ready_goes_first_and_the_link_second_each_keeping_its_transition_time() {
    let t0 = second(1_000);
    let t1 = second(1_010);
    let reported = NodeStatus {
        conditions: Some(vec![
            condition("DiskPressure", "False", &t0),
            condition(LINK_CONDITION, "True", &t0),
            condition("Ready", "True", &t0),
        ]),
        ..Default::default()
    };
    let existing = stored_node("5", json!({}));
    let source = StatusSource::Report(Box::new(reported.clone()));
    let NodeWrite::Write(object) = status_write(
        "edge-1",
        Some(existing.clone()),
        source,
        facts("True", "True", &t1),
        t1.clone(),
    ) else {
        panic!("written");
    };
    let t0_text = serde_json::to_value(&t0).expect("a time");
    let t1_text = serde_json::to_value(&t1).expect("a time");
    let (t0_text, t1_text) = (
        t0_text.as_str().unwrap_or_default(),
        t1_text.as_str().unwrap_or_default(),
    );
    assert_eq!(
        conditions_of(&object),
        vec![
            ("Ready".to_owned(), "True".to_owned(), t0_text.to_owned()),
            (
                LINK_CONDITION.to_owned(),
                "True".to_owned(),
                t0_text.to_owned()
            ),
            (
                "DiskPressure".to_owned(),
                "False".to_owned(),
                t0_text.to_owned()
            ),
        ]
    );
    assert!(
        object["metadata"].get("resourceVersion").is_none(),
        "the holder writes unconditionally"
    );
    assert_eq!(object["metadata"]["labels"], json!({"a": "1"}));
    // A status that changed moves its transition time.
    let NodeWrite::Write(object) = status_write(
        "edge-1",
        Some(existing),
        StatusSource::Report(Box::new(reported)),
        facts("False", "False", &t1),
        t1.clone(),
    ) else {
        panic!("written");
    };
    assert_eq!(
        conditions_of(&object)[..2],
        [
            ("Ready".to_owned(), "False".to_owned(), t1_text.to_owned()),
            (
                LINK_CONDITION.to_owned(),
                "False".to_owned(),
                t1_text.to_owned()
            ),
        ]
    );
}

#[test]
fn a_refresh_starts_from_the_stored_status() {
    let t0 = second(1_000);
    let stored_status = serde_json::to_value(NodeStatus {
        conditions: Some(vec![condition("Ready", "True", &t0)]),
        node_info: Some(NodeSystemInfo {
            kubelet_version: "v1.29-kubeedge".to_owned(),
            ..Default::default()
        }),
        ..Default::default()
    })
    .expect("a status");
    let existing = stored_node("5", stored_status);
    let t1 = second(1_020);
    let NodeWrite::Write(object) = status_write(
        "edge-1",
        Some(existing),
        StatusSource::Refresh,
        facts("True", "False", &t1),
        t1.clone(),
    ) else {
        panic!("the link went down: written");
    };
    assert_eq!(
        object["status"]["nodeInfo"]["kubeletVersion"],
        "v1.29-kubeedge"
    );
    assert_eq!(conditions_of(&object).len(), 2);
}

#[test]
fn the_holder_writes_the_kubelet_endpoint_and_a_version_until_its_edge_reports_one() {
    let now = second(1_000);
    let endpoint = KubeletEndpoint {
        address: "10.0.0.9".to_owned(),
        port: 10350,
    };
    let mut native = facts("True", "True", &now);
    native.kubeedge = false;
    native.endpoint = Some(&endpoint);
    let NodeWrite::Create { object, status } =
        status_write("edge-1", None, StatusSource::Refresh, native, now.clone())
    else {
        panic!("a new node is created");
    };
    assert_eq!(status["nodeInfo"]["kubeletVersion"], apis::KUBELET_VERSION);
    assert_eq!(status["addresses"][0]["address"], "10.0.0.9");
    assert_eq!(status["daemonEndpoints"]["kubeletEndpoint"]["Port"], 10350);
    assert_eq!(
        object["metadata"]["labels"]["node-role.kubernetes.io/edge"],
        ""
    );
    // A KubeEdge edge's own version is its edged's to report.
    let NodeWrite::Create { status, .. } = status_write(
        "edge-1",
        None,
        StatusSource::Refresh,
        facts("True", "True", &now),
        now.clone(),
    ) else {
        panic!("a new node is created");
    };
    assert_eq!(status["nodeInfo"]["kubeletVersion"], json!(null));
}

#[test]
fn a_new_node_is_created_labelled_as_an_edge_node_then_its_status_written() {
    let now = second(1_000);
    let NodeWrite::Create { object, status } = status_write(
        "edge-1",
        None,
        StatusSource::Refresh,
        facts("Unknown", "False", &now),
        now.clone(),
    ) else {
        panic!("a new node is created");
    };
    assert_eq!(object["metadata"]["name"], "edge-1");
    assert_eq!(
        object["metadata"]["labels"],
        json!({
            "node-role.kubernetes.io/edge": "",
            "kubernetes.io/hostname": "edge-1",
            "kubernetes.io/os": std::env::consts::OS,
        })
    );
    assert!(
        object.json().get("status").is_none(),
        "created without its status"
    );
    let mut created = object.clone();
    created.set_revision(1);
    let written = after_create("edge-1", Some(created), status.clone());
    assert_eq!(written["status"], status);
    assert_eq!(written["metadata"]["labels"], object["metadata"]["labels"]);
    assert!(written["metadata"].get("resourceVersion").is_none());
    // Created meanwhile by an earlier write: its status goes by name.
    assert_eq!(
        after_create("edge-1", None, status.clone()).into_json(),
        json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "edge-1"}, "status": status})
    );
}

#[test]
fn a_mark_is_written_only_over_the_version_it_read() {
    let now = second(1_000);
    let endpoint = KubeletEndpoint {
        address: "10.0.0.9".to_owned(),
        port: 10350,
    };
    let linked = json!({"conditions": [{"type": LINK_CONDITION, "status": "True"}]});
    let mark = |existing: Option<Object>, at: &str| {
        let mut facts = facts("Unknown", "False", &now);
        facts.endpoint = Some(&endpoint);
        status_write(
            "edge-1",
            existing,
            StatusSource::Mark(at),
            facts,
            now.clone(),
        )
    };
    assert_eq!(
        mark(Some(stored_node("8", linked.clone())), "7"),
        NodeWrite::WrittenSince
    );
    assert_eq!(mark(None, "7"), NodeWrite::WrittenSince, "gone since");
    let NodeWrite::Write(object) = mark(Some(stored_node("7", linked)), "7") else {
        panic!("marked");
    };
    assert_eq!(
        object["metadata"]["resourceVersion"], "7",
        "conditioned on the version read"
    );
    assert!(
        object["status"].get("addresses").is_none(),
        "the endpoint is the holder's to write"
    );
    assert_eq!(conditions_of(&object)[0].1, "Unknown");
    assert_eq!(conditions_of(&object)[1].1, "False");
}

#[test]
fn an_unchanged_status_is_not_written_again_within_five_minutes() {
    let t0 = second(1_000);
    let NodeWrite::Create { object, status } = status_write(
        "edge-1",
        None,
        StatusSource::Refresh,
        facts("True", "True", &t0),
        t0.clone(),
    ) else {
        panic!("a new node is created");
    };
    let stored = after_create("edge-1", Some(object), status);
    let refresh = |now: i64| {
        let now = second(now);
        status_write(
            "edge-1",
            Some(stored.clone()),
            StatusSource::Refresh,
            facts("True", "True", &now),
            now.clone(),
        )
    };
    assert_eq!(refresh(1_000), NodeWrite::Current);
    assert_eq!(refresh(1_299), NodeWrite::Current);
    assert!(matches!(refresh(1_300), NodeWrite::Write(_)));
}

#[test]
fn nodes_shown_linked_but_not_linked_here_are_candidates_for_a_mark() {
    let listed = |name: &str, version: &str, link: &str| {
        node(json!({
            "metadata": {"name": name, "resourceVersion": version},
            "status": {"conditions": [
                {"type": "Ready", "status": "True"},
                {"type": LINK_CONDITION, "status": link},
            ]},
        }))
    };
    let nodes = [
        listed("here", "1", "True"),
        listed("elsewhere", "2", "True"),
        listed("down", "3", "False"),
        listed("unversioned", "", "True"),
        node(json!({"metadata": {"name": "bare", "resourceVersion": "4"}})),
    ];
    assert_eq!(
        shown_linked_elsewhere(&nodes, |name| name == "here"),
        vec![("elsewhere".to_owned(), "2".to_owned())]
    );
    assert!(shown_linked_elsewhere(&[], |_| false).is_empty());
}

/// A holder's writes of one node over time, with random steps (0 to 2
/// minutes), link and Ready flips, and reports changing the kubelet
/// version, checked against a model: a write exactly when what is
/// written differs from what was last written, but for heartbeat times,
/// or when the last written heartbeat is five minutes old; Ready first,
/// the link second, each with the time of its last change.
#[test]
fn random_histories_write_a_change_at_once_and_the_same_every_five_minutes() {
    let refresh = NODE_STATUS_REFRESH.as_secs() as i64;
    // How often each case came up: (not written, changed, refreshed).
    let mut seen = (0, 0, 0);
    for seed in 0..100u64 {
        let mut rng = Rng(seed * 6_700_417 + 5);
        let mut now = 1_000_000i64;
        let (mut ready, mut link, mut version) = ("True", "True", "v1");
        let NodeWrite::Create { object, status } = status_write(
            "edge-1",
            None,
            StatusSource::Refresh,
            facts(ready, link, &second(now)),
            second(now),
        ) else {
            panic!("seed {seed}: a new node is created");
        };
        let mut stored = after_create("edge-1", Some(object), status);
        let info = serde_json::to_value(NodeSystemInfo {
            kubelet_version: version.to_owned(),
            ..Default::default()
        })
        .expect("a node info");
        stored.edit(|body| body["status"]["nodeInfo"] = info);
        // The model: what was last written, and when.
        let mut written = (ready, link, version);
        let (mut beat, mut ready_since, mut link_since) = (now, now, now);
        for step in 0..300 {
            let context = format!("seed {seed}, step {step}");
            now += rng.below(121) as i64;
            if rng.percent(10) {
                ready = ["True", "False", "Unknown"][rng.below(3)];
            }
            if rng.percent(10) {
                link = ["True", "False"][rng.below(2)];
            }
            let source = match rng.percent(30) {
                true => {
                    let mut reported =
                        NodeStatus::deserialize(&stored["status"]).expect("the stored status");
                    version = ["v1", "v2"][rng.below(2)];
                    if let Some(info) = reported.node_info.as_mut() {
                        info.kubelet_version = version.to_owned();
                    }
                    StatusSource::Report(Box::new(reported))
                }
                false => StatusSource::Refresh,
            };
            let outcome = status_write(
                "edge-1",
                Some(stored.clone()),
                source,
                facts(ready, link, &second(now)),
                second(now),
            );
            let changed = (ready, link, version) != written;
            match outcome {
                NodeWrite::Current => {
                    seen.0 += 1;
                    assert!(!changed, "{context}: a change not written");
                    assert!(now - beat < refresh, "{context}: not refreshed");
                }
                NodeWrite::Write(object) => {
                    assert!(changed || now - beat >= refresh, "{context}: written early");
                    match changed {
                        true => seen.1 += 1,
                        false => seen.2 += 1,
                    }
                    if ready != written.0 {
                        ready_since = now;
                    }
                    if link != written.1 {
                        link_since = now;
                    }
                    let time = |t: i64| {
                        serde_json::to_value(second(t))
                            .ok()
                            .and_then(|v| v.as_str().map(str::to_owned))
                            .unwrap_or_default()
                    };
                    assert_eq!(
                        conditions_of(&object),
                        vec![
                            ("Ready".to_owned(), ready.to_owned(), time(ready_since)),
                            (LINK_CONDITION.to_owned(), link.to_owned(), time(link_since)),
                        ],
                        "{context}"
                    );
                    assert_eq!(object["status"]["nodeInfo"]["kubeletVersion"], version);
                    written = (ready, link, version);
                    beat = now;
                    stored = object;
                }
                other => panic!("{context}: {other:?}"),
            }
        }
    }
    assert!(seen.0 > 0 && seen.1 > 0 && seen.2 > 0, "{seen:?}");
}
