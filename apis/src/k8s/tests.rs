//! The types against k8s-openapi: a real pod reads and is written back
//! whole, and the modelled fields are written byte for byte as k8s-openapi
//! writes them.

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use super::*;

/// A pod as kube-apiserver returns it, with many fields edgehive does not
/// model.
const REAL_POD: &str = include_str!("testdata/pod.json");

/// `value` without its `null` members: what a typed round trip (ours or
/// k8s-openapi's) writes of an unset optional field.
fn without_nulls(value: &Value) -> Value {
    match value {
        Value::Object(map) => Value::Object(
            map.iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k.clone(), without_nulls(v)))
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(without_nulls).collect()),
        other => other.clone(),
    }
}

/// `json` read and written by our type `O` and by k8s-openapi's `K`: the
/// two texts.
fn both<O, K>(json: &Value) -> (String, String)
where
    O: Serialize + DeserializeOwned,
    K: Serialize + DeserializeOwned,
{
    let ours: O = serde_json::from_value(json.clone()).expect("reads as ours");
    let theirs: K = serde_json::from_value(json.clone()).expect("reads as k8s-openapi's");
    (
        serde_json::to_string(&ours).expect("ours writes"),
        serde_json::to_string(&theirs).expect("theirs writes"),
    )
}

#[test]
fn a_real_pod_is_read_and_written_back_whole() {
    let given: Value = serde_json::from_str(REAL_POD).expect("the fixture is JSON");
    let pod: Pod = serde_json::from_value(given.clone()).expect("reads");
    let spec = pod.spec.as_ref().expect("spec");
    assert_eq!(pod.metadata.name.as_deref(), Some("web-7c9d8f6b5-x2x4z"));
    assert_eq!(spec.containers[0].name, "web");
    let limits = spec.containers[0]
        .resources
        .as_ref()
        .and_then(|r| r.limits.as_ref());
    assert_eq!(
        limits.and_then(|l| l.get("cpu")),
        Some(&Quantity("500m".to_owned()))
    );
    let liveness = spec.containers[0].liveness_probe.as_ref().expect("probe");
    let port = liveness.http_get.as_ref().map(|h| &h.port);
    assert_eq!(port, Some(&IntOrString::Int(8080)));
    let readiness = spec.containers[0].readiness_probe.as_ref().expect("probe");
    let port = readiness.tcp_socket.as_ref().map(|t| &t.port);
    assert_eq!(port, Some(&IntOrString::String("http".to_owned())));
    // Not modelled, kept where they were.
    assert!(pod.metadata.rest.contains_key("managedFields"));
    assert!(spec.rest.contains_key("tolerations"));
    assert!(spec.containers[0].rest.contains_key("securityContext"));
    let volumes = spec.volumes.as_deref().unwrap_or_default();
    assert!(
        volumes
            .iter()
            .any(|v| v.rest.contains_key("persistentVolumeClaim"))
    );

    // Written back: everything, a modelled `null` left out (as k8s-openapi
    // leaves it out).
    let back = serde_json::to_value(&pod).expect("writes");
    assert_eq!(back, without_nulls(&given));
}

#[test]
fn a_real_pod_is_what_k8s_openapi_makes_of_it_and_more() {
    use k8s_openapi::api::core::v1::Pod as TheirPod;
    let given: Value = serde_json::from_str(REAL_POD).expect("the fixture is JSON");
    let (ours, theirs) = both::<Pod, TheirPod>(&given);
    let mut ours: Value = serde_json::from_str(&ours).expect("JSON");
    let theirs: Value = serde_json::from_str(&theirs).expect("JSON");
    // k8s-openapi drops what Kubernetes does not know; edgehive keeps it.
    let init = ours["spec"]["initContainers"][0]
        .as_object_mut()
        .expect("an init container");
    assert!(init.remove("grpcProbe").is_some());
    assert_eq!(ours, theirs);
}

/// A pod with every field `Pod` models, and no other.
fn modelled_pod() -> Value {
    let probe = |handler: &str, action: Value| {
        json!({
            handler: action, "failureThreshold": 3, "initialDelaySeconds": 2, "periodSeconds": 5,
            "successThreshold": 1, "terminationGracePeriodSeconds": 7, "timeoutSeconds": 1
        })
    };
    let items = json!([{"key": "k", "mode": 256, "path": "p"}]);
    let field = json!({"apiVersion": "v1", "fieldPath": "metadata.name"});
    let resource = json!({"containerName": "c", "divisor": "1m", "resource": "limits.cpu"});
    let terminated = json!({"containerID": "containerd://1", "exitCode": 1, "finishedAt": "2025-01-07T10:00:03Z",
        "message": "m", "reason": "Error", "signal": 9, "startedAt": "2025-01-07T10:00:02Z"});
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "annotations": {"a": "1"}, "creationTimestamp": "2025-01-07T10:00:01Z",
            "deletionGracePeriodSeconds": 30, "deletionTimestamp": "2025-01-07T11:00:00Z",
            "finalizers": ["f"], "generateName": "web-", "generation": 2, "labels": {"app": "web"},
            "name": "web", "namespace": "shop", "resourceVersion": "7", "uid": "u-1"
        },
        "spec": {
            "containers": [{
                "args": ["a"], "command": ["c"],
                "env": [
                    {"name": "A", "value": "v"},
                    {"name": "B", "valueFrom": {
                        "configMapKeyRef": {"key": "k", "name": "cm", "optional": true},
                        "fieldRef": field, "resourceFieldRef": resource,
                        "secretKeyRef": {"key": "k", "name": "s", "optional": false}}}
                ],
                "envFrom": [{"configMapRef": {"name": "cm", "optional": true}, "prefix": "P_",
                             "secretRef": {"name": "s", "optional": false}}],
                "image": "nginx:1", "imagePullPolicy": "Always",
                "livenessProbe": probe("httpGet", json!({"host": "h", "httpHeaders": [{"name": "n", "value": "v"}],
                    "path": "/", "port": "http", "scheme": "HTTPS"})),
                "name": "c",
                "ports": [{"containerPort": 80, "hostIP": "1.2.3.4", "hostPort": 8080, "name": "http", "protocol": "TCP"}],
                "readinessProbe": probe("tcpSocket", json!({"host": "h", "port": 80})),
                "resources": {"limits": {"cpu": "1"}, "requests": {"memory": "1Gi"}},
                "startupProbe": probe("exec", json!({"command": ["true"]})),
                "stdin": true, "stdinOnce": false, "tty": true,
                "volumeMounts": [{"mountPath": "/m", "name": "v", "readOnly": true, "subPath": "s"}],
                "workingDir": "/w"
            }],
            "hostNetwork": false, "hostname": "h",
            "imagePullSecrets": [{"name": "pull"}],
            "initContainers": [{"name": "i", "livenessProbe": probe("grpc", json!({"port": 9000, "service": "s"}))}],
            "nodeName": "edge-1", "restartPolicy": "OnFailure", "serviceAccountName": "sa",
            "terminationGracePeriodSeconds": 30,
            "volumes": [
                {"configMap": {"defaultMode": 420, "items": items, "name": "cm", "optional": true}, "name": "a"},
                {"downwardAPI": {"defaultMode": 420, "items": [{"fieldRef": field, "mode": 256, "path": "p",
                    "resourceFieldRef": resource}]}, "name": "b"},
                {"emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}, "name": "c"},
                {"hostPath": {"path": "/h", "type": "Directory"}, "name": "d"},
                {"name": "e", "projected": {"defaultMode": 420, "sources": [
                    {"configMap": {"items": items, "name": "cm", "optional": true}},
                    {"downwardAPI": {"items": [{"fieldRef": field, "path": "p"}]}},
                    {"secret": {"items": items, "name": "s", "optional": false}},
                    {"serviceAccountToken": {"audience": "aud", "expirationSeconds": 3600, "path": "token"}}
                ]}},
                {"name": "f", "secret": {"defaultMode": 384, "items": items, "optional": true, "secretName": "s"}}
            ]
        },
        "status": {
            "conditions": [{"lastProbeTime": "2025-01-07T10:00:05Z", "lastTransitionTime": "2025-01-07T10:00:04Z",
                            "message": "m", "reason": "r", "status": "True", "type": "Ready"}],
            "containerStatuses": [{"containerID": "containerd://2", "image": "nginx:1", "imageID": "sha256:1",
                "lastState": {"terminated": terminated}, "name": "c", "ready": true, "restartCount": 1,
                "started": true, "state": {"running": {"startedAt": "2025-01-07T10:00:04Z"}}}],
            "hostIP": "192.168.1.2",
            "initContainerStatuses": [{"image": "", "imageID": "", "name": "i", "ready": false, "restartCount": 0,
                "state": {"waiting": {"message": "m", "reason": "ContainerCreating"}}}],
            "message": "m", "phase": "Running", "podIP": "10.0.0.2", "qosClass": "Burstable", "reason": "r",
            "startTime": "2025-01-07T10:00:01Z"
        }
    })
}

#[test]
fn a_modelled_pod_is_written_byte_for_byte_as_k8s_openapi_writes_it() {
    let pod = modelled_pod();
    let (ours, theirs) = both::<Pod, k8s_openapi::api::core::v1::Pod>(&pod);
    assert_eq!(ours, theirs);
    // And nothing of it fell into `rest`: every field is modelled.
    let read: Pod = serde_json::from_value(pod.clone()).expect("reads");
    assert!(read.rest.is_empty() && read.metadata.rest.is_empty());
    let spec = read.spec.expect("spec");
    assert!(spec.rest.is_empty() && spec.containers[0].rest.is_empty());
    assert_eq!(serde_json::from_str::<Value>(&ours).expect("JSON"), pod);
}

#[test]
fn a_node_status_is_written_as_k8s_openapi_writes_it() {
    let node = json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"labels": {"node-role.kubernetes.io/edge": ""}, "name": "edge-1"},
        "status": {
            "addresses": [{"address": "192.168.1.2", "type": "InternalIP"}, {"address": "edge-1", "type": "Hostname"}],
            "allocatable": {"cpu": "2", "memory": "4012Ki", "pods": "110"},
            "capacity": {"cpu": "2", "memory": "4012Ki", "pods": "110"},
            "conditions": [{"lastHeartbeatTime": "2025-01-07T10:00:00Z", "lastTransitionTime": "2025-01-07T09:00:00Z",
                "message": "edged is posting ready status", "reason": "EdgedReady", "status": "True", "type": "Ready"}],
            "nodeInfo": {"architecture": "amd64", "bootID": "b", "containerRuntimeVersion": "containerd://2.0.0",
                "kernelVersion": "6.1.0", "kubeProxyVersion": "", "kubeletVersion": "v1.34.0-edgehive-v0.1.0",
                "machineID": "m", "operatingSystem": "linux", "osImage": "Debian GNU/Linux 12 (bookworm)",
                "systemUUID": ""}
        }
    });
    let (ours, theirs) = both::<Node, k8s_openapi::api::core::v1::Node>(&node);
    assert_eq!(ours, theirs);
    let (ours, theirs) =
        both::<NodeStatus, k8s_openapi::api::core::v1::NodeStatus>(&node["status"]);
    assert_eq!(ours, theirs);
    // Required fields are written even when empty, as k8s-openapi does.
    let (ours, theirs) =
        both::<NodeSystemInfo, k8s_openapi::api::core::v1::NodeSystemInfo>(&json!({}));
    assert_eq!(ours, theirs);
}

#[test]
fn config_maps_and_secrets_are_written_as_k8s_openapi_writes_them() {
    let config_map = json!({"apiVersion": "v1", "kind": "ConfigMap", "data": {"k": "v"}, "immutable": true,
        "metadata": {"name": "cm", "namespace": "shop"}});
    let (ours, theirs) = both::<ConfigMap, k8s_openapi::api::core::v1::ConfigMap>(&config_map);
    assert_eq!(ours, theirs);
    let secret = json!({"apiVersion": "v1", "kind": "Secret", "data": {"k": "c2VjcmV0"}, "immutable": false,
        "metadata": {"name": "s"}, "stringData": {"x": "y"}, "type": "Opaque"});
    let (ours, theirs) = both::<Secret, k8s_openapi::api::core::v1::Secret>(&secret);
    assert_eq!(ours, theirs);
}

#[test]
fn lists_events_and_statuses_are_written_as_k8s_openapi_writes_them() {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1 as their;
    let pod = modelled_pod();
    let ours: Pod = serde_json::from_value(pod.clone()).expect("ours");
    let theirs: k8s_openapi::api::core::v1::Pod = serde_json::from_value(pod).expect("theirs");
    let list = List {
        items: vec![ours.clone()],
        metadata: ListMeta {
            continue_: Some("c".to_owned()),
            remaining_item_count: Some(3),
            resource_version: Some("42".to_owned()),
            self_link: None,
        },
    };
    let their_list = k8s_openapi::List {
        items: vec![theirs.clone()],
        metadata: their::ListMeta {
            continue_: Some("c".to_owned()),
            remaining_item_count: Some(3),
            resource_version: Some("42".to_owned()),
            self_link: None,
        },
    };
    assert_eq!(
        serde_json::to_string(&list).expect("ours"),
        serde_json::to_string(&their_list).expect("theirs")
    );
    assert_eq!(
        serde_json::to_string(&WatchEvent::Modified(ours)).expect("ours"),
        serde_json::to_string(&their::WatchEvent::Modified(theirs)).expect("theirs")
    );
    let status = Status {
        code: Some(410),
        message: Some("too old".to_owned()),
        reason: Some("Expired".to_owned()),
        status: Some("Failure".to_owned()),
        ..Status::default()
    };
    let their_status = their::Status {
        code: Some(410),
        message: Some("too old".to_owned()),
        reason: Some("Expired".to_owned()),
        status: Some("Failure".to_owned()),
        ..their::Status::default()
    };
    assert_eq!(
        serde_json::to_string(&WatchEvent::<Pod>::ErrorStatus(status)).expect("ours"),
        serde_json::to_string(
            &their::WatchEvent::<k8s_openapi::api::core::v1::Pod>::ErrorStatus(their_status)
        )
        .expect("theirs")
    );
}

#[test]
fn a_kind_is_written_always_and_checked_when_read() {
    let pod = Pod::default();
    assert_eq!(
        serde_json::to_value(&pod).expect("writes"),
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {}})
    );
    assert!(serde_json::from_value::<Pod>(json!({"metadata": {}})).is_ok());
    assert!(serde_json::from_value::<Pod>(json!({"kind": "Service"})).is_err());
    assert!(serde_json::from_value::<Pod>(json!({"apiVersion": "v2"})).is_err());
    // As k8s-openapi: the same refusals.
    use k8s_openapi::api::core::v1::Pod as TheirPod;
    assert!(serde_json::from_value::<TheirPod>(json!({"kind": "Service"})).is_err());
    assert!(serde_json::from_value::<TheirPod>(json!({"apiVersion": "v2"})).is_err());
}

#[test]
fn required_fields_read_null_or_missing_as_empty_as_k8s_openapi_does() {
    let container = json!({"name": null, "ports": [{"protocol": "TCP"}]});
    let (ours, theirs) = both::<Container, k8s_openapi::api::core::v1::Container>(&container);
    assert_eq!(ours, theirs);
    assert_eq!(
        ours,
        r#"{"name":"","ports":[{"containerPort":0,"protocol":"TCP"}]}"#
    );
    // A wrong type is an error for both.
    let bad = json!({"name": "c", "ports": 3});
    assert!(serde_json::from_value::<Container>(bad.clone()).is_err());
    assert!(serde_json::from_value::<k8s_openapi::api::core::v1::Container>(bad).is_err());
}

#[test]
fn times_are_written_to_the_second_in_utc_as_kubernetes_writes_them() {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time as TheirTime;
    for given in [
        "2025-01-07T10:00:01Z",
        "2025-01-07T10:00:01.987654Z",
        "2025-01-07T12:00:01+02:00",
        "1969-12-31T23:59:58.5Z",
    ] {
        let (ours, theirs) = both::<Time, TheirTime>(&json!(given));
        assert_eq!(ours, theirs, "{given}");
    }
    assert!(serde_json::from_value::<Time>(json!("yesterday")).is_err());
}

#[test]
fn the_other_kinds_keep_everything_but_their_metadata_as_it_came() {
    let service = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"},
        "spec": {"ports": [{"port": 80}]}});
    let read: Object = serde_json::from_value(service.clone()).expect("reads");
    assert_eq!(read.metadata.name.as_deref(), Some("web"));
    assert_eq!(serde_json::to_value(&read).expect("writes"), service);
}

#[test]
fn quantities_given_as_numbers_are_read_as_their_text_as_k8s_openapi_reads_them() {
    let given = json!({"limits": {"cpu": 2, "memory": 134217728_u64, "ephemeral-storage": 0.5},
                       "requests": {"cpu": "250m"}});
    let ours: ResourceRequirements = serde_json::from_value(given.clone()).expect("ours");
    let theirs: k8s_openapi::api::core::v1::ResourceRequirements =
        serde_json::from_value(given).expect("theirs");
    assert_eq!(
        serde_json::to_value(&ours).expect("ours written"),
        serde_json::to_value(&theirs).expect("theirs written")
    );
    let limits = ours.limits.expect("limits");
    assert_eq!(limits.get("cpu"), Some(&Quantity("2".to_owned())));
    assert_eq!(
        limits.get("memory"),
        Some(&Quantity("134217728".to_owned()))
    );
    assert_eq!(
        limits.get("ephemeral-storage"),
        Some(&Quantity("0.5".to_owned()))
    );
}
