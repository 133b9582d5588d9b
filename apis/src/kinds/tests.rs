//! Tests of the parent module (`kinds.rs`).

use super::*;
use serde_json::json;

#[test]
fn a_list_written_item_by_item_is_the_list_of_its_kind() {
    let cases = [
        (
            Kind::ConfigMap,
            vec![
                serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap",
                        "metadata": {"name": "a", "namespace": "default"}, "data": {"k": "v"}}),
                serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap",
                        "metadata": {"name": "b", "namespace": "shop"}}),
            ],
        ),
        (
            Kind::Pod,
            vec![
                serde_json::json!({"apiVersion": "v1", "kind": "Pod",
                        "metadata": {"name": "web", "namespace": "default"},
                        "spec": {"containers": [{"name": "c", "image": "busybox"}]}}),
                // Does not read as a Pod: left out of both.
                serde_json::json!({"apiVersion": "v1", "kind": "Pod",
                        "metadata": {"name": "bad"}, "spec": {"containers": 3}}),
            ],
        ),
        (
            Kind::Device,
            vec![
                serde_json::json!({"apiVersion": "devices.kubeedge.io/v1beta1",
                    "kind": "Device", "metadata": {"name": "sensor", "namespace": "default"},
                    "spec": {"nodeName": "n1"}}),
            ],
        ),
        (Kind::Node, vec![]),
    ];
    for (kind, items) in cases {
        let mut writer = ListWriter::new(kind);
        for item in &items {
            writer.push(item);
        }
        let written: Value =
            serde_json::from_slice(&writer.finish("42")).expect("the list is JSON");
        let whole = kind.list(items, "42".to_owned()).expect("list");
        assert_eq!(written, whole, "{kind}");
    }
}

#[test]
fn kinds_know_their_names() {
    assert_eq!(Kind::Pod.plural(), "pods");
    assert_eq!(Kind::ConfigMap.name(), "ConfigMap");
    assert_eq!(Kind::from_user("cm"), Some(Kind::ConfigMap));
    assert_eq!(Kind::from_user("Pods"), Some(Kind::Pod));
    assert_eq!(Kind::from_user("node"), Some(Kind::Node));
    assert_eq!(Kind::from_plural("endpoints"), Some(Kind::Endpoints));
    assert_eq!(Kind::from_user("deployments"), None);
}

#[test]
fn keys_map_to_edge_resources() {
    let pod = json!({"kind": "Pod", "metadata": {"name": "web"}});
    let key = ObjectKey::of(&pod).expect("key");
    assert_eq!(key.edge_resource().to_string(), "default/pod/web");
    assert_eq!(
        ObjectKey::from_edge_resource(&key.edge_resource()),
        Some(key)
    );
    let node = json!({"kind": "Node", "metadata": {"name": "n1", "namespace": "x"}});
    let key = ObjectKey::of(&node).expect("key");
    assert_eq!(key.namespace, "");
    assert_eq!(key.edge_resource().to_string(), "default/node/n1");
}

#[test]
fn lists_and_events_are_kubernetes_shaped() {
    let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web"}});
    let list = Kind::Pod.list(vec![pod.clone()], "7".into()).expect("list");
    assert_eq!(list["kind"], "PodList");
    assert_eq!(list["metadata"]["resourceVersion"], "7");
    assert_eq!(list["items"][0]["metadata"]["name"], "web");
    let event = Kind::Pod
        .watch_event(Change::Modified, &pod)
        .expect("event");
    assert_eq!(event["type"], "MODIFIED");
    assert_eq!(event["object"]["kind"], "Pod");
    assert!(
        Kind::Pod
            .readable(&json!({"spec": {"containers": 5}}))
            .is_err()
    );
}

/// Objects as the cloud stores them (written by k8s-openapi) go into
/// lists and watch events as k8s-openapi's types put them there.
#[test]
fn lists_and_events_carry_what_k8s_openapi_carried() {
    use k8s_openapi::api::core::v1 as their;
    let real: Value =
        serde_json::from_str(include_str!("../k8s/testdata/pod.json")).expect("a pod");
    let pod: their::Pod = serde_json::from_value(real).expect("reads");
    let stored = serde_json::to_value(&pod).expect("the pod as the cloud stores it");
    let their_list = k8s_openapi::List {
        items: vec![pod.clone()],
        metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ListMeta {
            resource_version: Some("9".to_owned()),
            ..Default::default()
        },
    };
    assert_eq!(
        Kind::Pod
            .list(vec![stored.clone()], "9".to_owned())
            .expect("list"),
        serde_json::to_value(&their_list).expect("theirs")
    );
    let mut writer = ListWriter::new(Kind::Pod);
    writer.push(&stored);
    let written: Value = serde_json::from_slice(&writer.finish("9")).expect("JSON");
    assert_eq!(written, serde_json::to_value(&their_list).expect("theirs"));
    let their_event = k8s_openapi::apimachinery::pkg::apis::meta::v1::WatchEvent::Added(pod);
    assert_eq!(
        Kind::Pod
            .watch_event(Change::Added, &stored)
            .expect("event"),
        serde_json::to_value(&their_event).expect("theirs")
    );
    // An object stored without `apiVersion` and `kind` gets them, as
    // k8s-openapi gave them.
    let bare = json!({"metadata": {"name": "cm"}, "data": {"k": "v"}});
    let their_cm: their::ConfigMap = serde_json::from_value(bare.clone()).expect("reads");
    assert_eq!(
        Kind::ConfigMap
            .watch_event(Change::Deleted, &bare)
            .expect("event")["object"],
        serde_json::to_value(&their_cm).expect("theirs")
    );
    // What k8s-openapi did not know is carried too, now.
    let newer = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
            "spec": {"containers": [{"name": "c", "fromAFutureRelease": true}]}});
    let event = Kind::Pod.watch_event(Change::Added, &newer).expect("event");
    assert_eq!(event["object"], newer);
}

#[test]
fn references_are_found_everywhere_a_pod_can_name_them() {
    let pod = json!({"spec": {
        "imagePullSecrets": [{"name": "pull"}],
        "volumes": [
            {"name": "a", "configMap": {"name": "cm-vol"}},
            {"name": "b", "secret": {"secretName": "s-vol"}},
            {"name": "c", "projected": {"sources": [{"configMap": {"name": "cm-proj"}}]}}
        ],
        "containers": [{"name": "c", "env": [
            {"name": "X", "valueFrom": {"configMapKeyRef": {"name": "cm-env", "key": "k"}}},
            {"name": "Y", "valueFrom": {"secretKeyRef": {"name": "s-env", "key": "k"}}}
        ], "envFrom": [{"configMapRef": {"name": "cm-from"}}]}],
        "initContainers": [{"name": "i", "envFrom": [{"secretRef": {"name": "s-init"}}]}]
    }});
    let names: Vec<String> = pod_references("ns", &pod)
        .into_iter()
        .map(|k| k.to_string())
        .collect();
    assert_eq!(
        names,
        [
            "configmaps/ns/cm-env",
            "configmaps/ns/cm-from",
            "configmaps/ns/cm-proj",
            "configmaps/ns/cm-vol",
            "secrets/ns/pull",
            "secrets/ns/s-env",
            "secrets/ns/s-init",
            "secrets/ns/s-vol",
        ]
    );
}

#[test]
fn names_follow_dns_rules() {
    assert!(valid_name("web-1.example"));
    assert!(!valid_name("Web"));
    assert!(!valid_name("-web"));
    assert!(!valid_name(""));
    assert!(valid_label("default"));
    assert!(!valid_label("a.b"));
}
