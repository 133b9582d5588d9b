//! Tests of the parent module (`defaults.rs`).

use super::*;
use serde_json::json;

/// `examples/manifests/web.yaml`'s pod, as JSON.
fn web_pod() -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": { "name": "web", "labels": { "app": "web" } },
        "spec": {
            "nodeName": "edge-1",
            "terminationGracePeriodSeconds": 5,
            "containers": [{
                "name": "web",
                "image": "127.0.0.1:5000/busybox:latest",
                "command": ["sh", "-c", "echo serving /www on :8080; exec httpd -f -p 8080 -h /www"],
                "ports": [{ "containerPort": 8080 }],
                "volumeMounts": [{ "name": "www", "mountPath": "/www" }],
                "readinessProbe": {
                    "httpGet": { "path": "/index.html", "port": 8080 },
                    "periodSeconds": 1
                }
            }],
            "volumes": [{ "name": "www", "configMap": { "name": "web-conf" } }]
        }
    })
}

fn defaulted(mut object: Value) -> Value {
    apply(&mut object).expect("defaults apply");
    object
}

fn pod_with(spec: Value) -> Value {
    json!({ "apiVersion": "v1", "kind": "Pod", "metadata": { "name": "p" }, "spec": spec })
}

fn container(image: &str) -> Value {
    json!({ "name": "c", "image": image })
}

#[test]
fn the_web_pod_gets_every_default_a_real_api_server_gives_it() {
    let pod = defaulted(web_pod());
    let spec = &pod["spec"];
    assert_eq!(spec["dnsPolicy"], "ClusterFirst");
    assert_eq!(spec["restartPolicy"], "Always");
    assert_eq!(spec["enableServiceLinks"], true);
    assert_eq!(spec["schedulerName"], "default-scheduler");
    assert_eq!(
        spec["terminationGracePeriodSeconds"], 5,
        "the manifest's value is kept"
    );
    assert_eq!(spec["securityContext"], json!({}));
    assert_eq!(spec["serviceAccountName"], "default");
    assert_eq!(spec["serviceAccount"], "default");
    assert_eq!(spec["priority"], 0);
    assert_eq!(spec["preemptionPolicy"], "PreemptLowerPriority");
    assert_eq!(spec["nodeName"], "edge-1");
    assert_eq!(
        spec["tolerations"],
        json!([
            { "key": "node.kubernetes.io/not-ready", "operator": "Exists",
              "effect": "NoExecute", "tolerationSeconds": 300 },
            { "key": "node.kubernetes.io/unreachable", "operator": "Exists",
              "effect": "NoExecute", "tolerationSeconds": 300 }
        ])
    );

    let c = &spec["containers"][0];
    assert_eq!(c["imagePullPolicy"], "Always");
    assert_eq!(c["terminationMessagePath"], "/dev/termination-log");
    assert_eq!(c["terminationMessagePolicy"], "File");
    assert_eq!(c["resources"], json!({}));
    assert_eq!(
        c["ports"],
        json!([{ "containerPort": 8080, "protocol": "TCP" }])
    );
    assert_eq!(
        c["volumeMounts"],
        json!([{ "name": "www", "mountPath": "/www" }])
    );
    assert_eq!(
        c["command"],
        json!([
            "sh",
            "-c",
            "echo serving /www on :8080; exec httpd -f -p 8080 -h /www"
        ])
    );
    assert_eq!(
        c["readinessProbe"],
        json!({
            "httpGet": { "path": "/index.html", "port": 8080, "scheme": "HTTP" },
            "periodSeconds": 1,
            "timeoutSeconds": 1,
            "successThreshold": 1,
            "failureThreshold": 3
        })
    );
    assert!(c.get("livenessProbe").is_none());

    assert_eq!(
        spec["volumes"],
        json!([{ "name": "www", "configMap": { "name": "web-conf", "defaultMode": 420 } }])
    );
    assert_eq!(
        pod["status"],
        json!({ "phase": "Pending", "qosClass": "BestEffort" })
    );
    assert_eq!(
        pod["metadata"],
        json!({ "name": "web", "labels": { "app": "web" } })
    );
}

#[test]
fn a_pod_without_volumes_or_probes_gets_no_volumes_or_probes() {
    let pod = defaulted(pod_with(json!({ "containers": [container("nginx:1.27")] })));
    let spec = &pod["spec"];
    assert!(spec.get("volumes").is_none());
    assert_eq!(spec["terminationGracePeriodSeconds"], 30);
    let c = &spec["containers"][0];
    assert_eq!(c["imagePullPolicy"], "IfNotPresent");
    for probe in [
        "livenessProbe",
        "readinessProbe",
        "startupProbe",
        "lifecycle",
        "ports",
        "env",
    ] {
        assert!(c.get(probe).is_none(), "{probe} appeared");
    }
    assert_eq!(c["resources"], json!({}));
}

#[test]
fn image_pull_policy_follows_the_tag() {
    let digest = format!("sha256:{}", "a".repeat(64));
    for (image, policy) in [
        ("busybox".to_owned(), "Always"),
        ("busybox:latest".to_owned(), "Always"),
        ("busybox:1.36".to_owned(), "IfNotPresent"),
        (format!("busybox@{digest}"), "IfNotPresent"),
        (format!("busybox:latest@{digest}"), "Always"),
        (format!("busybox:1.36@{digest}"), "IfNotPresent"),
        ("127.0.0.1:5000/busybox:latest".to_owned(), "Always"),
        ("localhost:5000/team/app".to_owned(), "Always"),
        (
            "registry.example.com/team/app:v2".to_owned(),
            "IfNotPresent",
        ),
        ("docker.io/library/busybox".to_owned(), "Always"),
        ("[::1]:5000/busybox".to_owned(), "Always"),
        // References that do not parse get IfNotPresent.
        ("Busybox".to_owned(), "IfNotPresent"),
        ("busybox:".to_owned(), "IfNotPresent"),
        ("busybox@sha256:short".to_owned(), "IfNotPresent"),
        ("a".repeat(64), "IfNotPresent"),
        (String::new(), "IfNotPresent"),
    ] {
        assert_eq!(image_pull_policy(&image), policy, "{image}");
    }
    let pod = defaulted(pod_with(json!({
        "containers": [container("busybox"), container("busybox:1.36"),
                       container(&format!("busybox@{digest}"))]
    })));
    let policies: Vec<&Value> = (0..3)
        .map(|i| &pod["spec"]["containers"][i]["imagePullPolicy"])
        .collect();
    assert_eq!(
        policies,
        [
            &json!("Always"),
            &json!("IfNotPresent"),
            &json!("IfNotPresent")
        ]
    );
}

#[test]
fn values_the_user_set_are_kept() {
    let pod = defaulted(pod_with(json!({
        "dnsPolicy": "Default",
        "restartPolicy": "Never",
        "enableServiceLinks": false,
        "terminationGracePeriodSeconds": 0,
        "schedulerName": "edge-scheduler",
        "serviceAccountName": "robot",
        "priority": 0,
        "preemptionPolicy": "Never",
        "securityContext": { "runAsUser": 1000 },
        "tolerations": [{ "key": "node.kubernetes.io/not-ready", "operator": "Exists",
                          "effect": "NoExecute", "tolerationSeconds": 60 }],
        "containers": [{
            "name": "c", "image": "busybox", "imagePullPolicy": "Never",
            "terminationMessagePolicy": "FallbackToLogsOnError",
            "ports": [{ "containerPort": 53, "protocol": "UDP" }],
            "livenessProbe": { "tcpSocket": { "port": 53 }, "timeoutSeconds": 5,
                               "periodSeconds": 30, "failureThreshold": 1 }
        }],
        "volumes": [{ "name": "s", "secret": { "secretName": "s", "defaultMode": 256,
                      "items": [{ "key": "k", "path": "p" }] } }]
    })));
    let spec = &pod["spec"];
    assert_eq!(spec["dnsPolicy"], "Default");
    assert_eq!(spec["restartPolicy"], "Never");
    assert_eq!(spec["enableServiceLinks"], false);
    assert_eq!(spec["terminationGracePeriodSeconds"], 0);
    assert_eq!(spec["schedulerName"], "edge-scheduler");
    assert_eq!(spec["serviceAccountName"], "robot");
    assert_eq!(spec["serviceAccount"], "robot");
    assert_eq!(spec["preemptionPolicy"], "Never");
    assert_eq!(spec["securityContext"], json!({ "runAsUser": 1000 }));
    assert_eq!(
        spec["tolerations"],
        json!([
            { "key": "node.kubernetes.io/not-ready", "operator": "Exists",
              "effect": "NoExecute", "tolerationSeconds": 60 },
            { "key": "node.kubernetes.io/unreachable", "operator": "Exists",
              "effect": "NoExecute", "tolerationSeconds": 300 }
        ])
    );
    let c = &spec["containers"][0];
    assert_eq!(c["imagePullPolicy"], "Never");
    assert_eq!(c["terminationMessagePolicy"], "FallbackToLogsOnError");
    assert_eq!(c["ports"][0]["protocol"], "UDP");
    assert_eq!(
        c["livenessProbe"],
        json!({ "tcpSocket": { "port": 53 }, "timeoutSeconds": 5, "periodSeconds": 30,
                    "successThreshold": 1, "failureThreshold": 1 })
    );
    assert_eq!(
        spec["volumes"][0]["secret"],
        json!({ "secretName": "s", "defaultMode": 256, "items": [{ "key": "k", "path": "p" }] })
    );
}

#[test]
fn a_toleration_of_everything_stops_the_default_tolerations() {
    let pod = defaulted(pod_with(json!({
        "tolerations": [{ "operator": "Exists" }],
        "containers": [container("busybox")]
    })));
    assert_eq!(
        pod["spec"]["tolerations"],
        json!([{ "operator": "Exists" }])
    );
}

#[test]
fn volumes_probes_env_and_lifecycle_get_their_defaults() {
    let pod = defaulted(pod_with(json!({
        "hostNetwork": true,
        "initContainers": [{ "name": "init", "image": "busybox:1.36",
                             "ports": [{ "containerPort": 9000, "hostPort": 9001 }] }],
        "containers": [{
            "name": "c", "image": "busybox:1.36",
            "ports": [{ "containerPort": 8080 }],
            "env": [
                { "name": "NODE", "valueFrom": { "fieldRef": { "fieldPath": "spec.nodeName" } } },
                { "name": "CPU", "valueFrom": { "resourceFieldRef": { "resource": "limits.cpu" } } },
                { "name": "MEM", "valueFrom": { "resourceFieldRef": { "resource": "limits.memory",
                                                                      "divisor": "1024Ki" } } }
            ],
            "livenessProbe": { "grpc": { "port": 9090 } },
            "startupProbe": { "httpGet": { "port": "http" } },
            "lifecycle": { "preStop": { "httpGet": { "port": 8080, "path": "/stop" } } }
        }],
        "volumes": [
            { "name": "scratch" },
            { "name": "host", "hostPath": { "path": "/var/log" } },
            { "name": "secret", "secret": { "secretName": "s" } },
            { "name": "labels", "downwardAPI": { "items": [
                { "path": "labels", "fieldRef": { "fieldPath": "metadata.labels" } },
                { "path": "cpu", "resourceFieldRef": { "containerName": "c", "resource": "requests.cpu" } }
            ] } },
            { "name": "all", "projected": { "sources": [
                { "configMap": { "name": "cm", "items": [{ "key": "a", "path": "a" }] } },
                { "downwardAPI": { "items": [{ "path": "ns", "fieldRef": { "fieldPath": "metadata.namespace" } }] } },
                { "serviceAccountToken": { "path": "token" } }
            ] } },
            { "name": "tmp", "emptyDir": { "sizeLimit": "1024Mi" } }
        ]
    })));
    let spec = &pod["spec"];
    let c = &spec["containers"][0];
    assert_eq!(
        c["ports"],
        json!([{ "containerPort": 8080, "hostPort": 8080, "protocol": "TCP" }])
    );
    assert_eq!(
        spec["initContainers"][0]["ports"],
        json!([{ "containerPort": 9000, "hostPort": 9001, "protocol": "TCP" }])
    );
    assert_eq!(
        c["env"][0]["valueFrom"]["fieldRef"],
        json!({ "apiVersion": "v1", "fieldPath": "spec.nodeName" })
    );
    assert_eq!(
        c["env"][1]["valueFrom"]["resourceFieldRef"],
        json!({ "resource": "limits.cpu", "divisor": "0" })
    );
    assert_eq!(
        c["env"][2]["valueFrom"]["resourceFieldRef"]["divisor"],
        "1Mi"
    );
    assert_eq!(
        c["livenessProbe"],
        json!({ "grpc": { "port": 9090, "service": "" }, "timeoutSeconds": 1, "periodSeconds": 10,
                    "successThreshold": 1, "failureThreshold": 3 })
    );
    assert_eq!(
        c["startupProbe"]["httpGet"],
        json!({ "port": "http", "path": "/", "scheme": "HTTP" })
    );
    assert_eq!(
        c["lifecycle"]["preStop"]["httpGet"],
        json!({ "port": 8080, "path": "/stop", "scheme": "HTTP" })
    );

    let volumes = &spec["volumes"];
    assert_eq!(volumes[0], json!({ "name": "scratch", "emptyDir": {} }));
    assert_eq!(
        volumes[1]["hostPath"],
        json!({ "path": "/var/log", "type": "" })
    );
    assert_eq!(
        volumes[2]["secret"],
        json!({ "secretName": "s", "defaultMode": 420 })
    );
    assert_eq!(
        volumes[3]["downwardAPI"],
        json!({ "defaultMode": 420, "items": [
                { "path": "labels", "fieldRef": { "apiVersion": "v1", "fieldPath": "metadata.labels" } },
                { "path": "cpu", "resourceFieldRef": { "containerName": "c", "resource": "requests.cpu", "divisor": "0" } }
            ] })
    );
    assert_eq!(
        volumes[4]["projected"],
        json!({ "defaultMode": 420, "sources": [
                { "configMap": { "name": "cm", "items": [{ "key": "a", "path": "a" }] } },
                { "downwardAPI": { "items": [{ "path": "ns",
                    "fieldRef": { "apiVersion": "v1", "fieldPath": "metadata.namespace" } }] } },
                { "serviceAccountToken": { "path": "token", "expirationSeconds": 3600 } }
            ] })
    );
    assert_eq!(volumes[5]["emptyDir"], json!({ "sizeLimit": "1Gi" }));
}

#[test]
fn defaulting_twice_changes_nothing() {
    let complex = pod_with(json!({
        "initContainers": [{ "name": "i", "image": "busybox", "restartPolicy": "Always",
                             "resources": { "limits": { "cpu": "0.5" } } }],
        "containers": [{ "name": "c", "image": "busybox",
                         "resources": { "limits": { "cpu": "100u", "memory": "1.5Gi" } },
                         "readinessProbe": { "exec": { "command": ["true"] } } }],
        "volumes": [{ "name": "v" }]
    }));
    for object in [
        web_pod(),
        complex,
        json!({ "apiVersion": "v1", "kind": "Service", "metadata": { "name": "s" },
                    "spec": { "type": "LoadBalancer", "ports": [{ "port": 80 }],
                              "sessionAffinity": "ClientIP" } }),
        json!({ "apiVersion": "v1", "kind": "Secret", "metadata": { "name": "s" },
                    "stringData": { "a": "b" } }),
        json!({ "apiVersion": "devices.kubeedge.io/v1beta1", "kind": "Device",
                    "metadata": { "name": "d" }, "spec": { "deviceModelRef": {} } }),
    ] {
        let once = defaulted(object);
        let twice = defaulted(once.clone());
        assert_eq!(once, twice);
    }
}

fn qos(containers: Value) -> Value {
    defaulted(pod_with(json!({ "containers": containers })))["status"]["qosClass"].clone()
}

#[test]
fn qos_classes_are_computed_as_the_server_does() {
    assert_eq!(qos(json!([container("busybox")])), "BestEffort");
    // Limits only: requests default to them, so Guaranteed.
    let pod = defaulted(pod_with(json!({ "containers": [{
            "name": "c", "image": "busybox",
            "resources": { "limits": { "cpu": "1", "memory": "64Mi" } }
        }] })));
    assert_eq!(pod["status"]["qosClass"], "Guaranteed");
    assert_eq!(
        pod["spec"]["containers"][0]["resources"],
        json!({ "limits": { "cpu": "1", "memory": "64Mi" },
                    "requests": { "cpu": "1", "memory": "64Mi" } })
    );
    // Equal values spelled differently.
    assert_eq!(
        qos(json!([{ "name": "c", "image": "busybox", "resources": {
                "limits": { "cpu": "1", "memory": "1Gi" },
                "requests": { "cpu": "1000m", "memory": "1024Mi" } } }])),
        "Guaranteed"
    );
    assert_eq!(
        qos(json!([{ "name": "c", "image": "busybox", "resources": {
                "limits": { "cpu": "1", "memory": "1Gi" },
                "requests": { "cpu": "500m", "memory": "1Gi" } } }])),
        "Burstable"
    );
    // Requests only, or a second container without limits.
    assert_eq!(
        qos(
            json!([{ "name": "c", "image": "busybox", "resources": { "requests": { "memory": "1Mi" } } }])
        ),
        "Burstable"
    );
    assert_eq!(
        qos(json!([
            { "name": "a", "image": "busybox", "resources": { "limits": { "cpu": "1", "memory": "1Gi" } } },
            container("busybox")
        ])),
        "Burstable"
    );
    // Only cpu and memory count, and zero does not.
    assert_eq!(
        qos(json!([{ "name": "c", "image": "busybox", "resources": {
                "limits": { "nvidia.com/gpu": "1", "cpu": "0" } } }])),
        "BestEffort"
    );
    // Pod-level resources decide when present.
    let pod = defaulted(pod_with(json!({
        "resources": { "limits": { "cpu": "2", "memory": "1Gi" } },
        "containers": [{ "name": "c", "image": "busybox", "resources": { "requests": { "cpu": "500m" } } }]
    })));
    assert_eq!(
        pod["spec"]["resources"]["requests"],
        json!({ "cpu": "500m", "memory": "1Gi" })
    );
    assert_eq!(pod["status"]["qosClass"], "Burstable");
    let pod = defaulted(pod_with(json!({
        "resources": { "limits": { "cpu": "2", "memory": "1Gi" } },
        "containers": [container("busybox")]
    })));
    assert_eq!(pod["status"]["qosClass"], "Guaranteed");
}

#[test]
fn a_status_the_caller_gave_is_completed_not_replaced() {
    let mut pod = pod_with(json!({ "containers": [container("busybox")] }));
    pod["status"] = json!({ "phase": "Running", "podIP": "10.0.0.5" });
    let pod = defaulted(pod);
    assert_eq!(
        pod["status"],
        json!({ "phase": "Running", "podIP": "10.0.0.5", "qosClass": "BestEffort" })
    );
}

#[test]
fn resource_quantities_are_rounded_and_canonical() {
    let pod = defaulted(pod_with(json!({ "containers": [{
            "name": "c", "image": "busybox",
            "resources": {
                "limits": { "cpu": "1.5", "memory": "1536Mi", "ephemeral-storage": "2048Ki" },
                "requests": { "cpu": "100u", "memory": "0.5Gi", "ephemeral-storage": 1000 }
            }
        }] })));
    assert_eq!(
        pod["spec"]["containers"][0]["resources"],
        json!({
            "limits": { "cpu": "1500m", "memory": "1536Mi", "ephemeral-storage": "2Mi" },
            "requests": { "cpu": "1m", "memory": "512Mi", "ephemeral-storage": "1k" }
        })
    );
}

#[test]
fn quantities_are_written_as_go_writes_them() {
    let text = |s: &str| Qty::parse(s).expect("parses").to_text();
    let rounded = |s: &str| {
        let mut q = Qty::parse(s).expect("parses");
        q.round_up_milli();
        q.to_text()
    };
    for (given, written) in [
        ("0", "0"),
        ("0m", "0"),
        ("-0", "0"),
        ("1", "1"),
        ("1000m", "1"),
        ("0.5", "500m"),
        ("1.5", "1500m"),
        ("100m", "100m"),
        ("1k", "1k"),
        ("1500k", "1500k"),
        ("2000k", "2M"),
        ("1e3", "1e3"),
        ("12e6", "12e6"),
        ("1.5e3", "1500"),
        ("1Gi", "1Gi"),
        ("10Gi", "10Gi"),
        ("8Gi", "8Gi"),
        ("1024Mi", "1Gi"),
        ("1.5Gi", "1536Mi"),
        ("1000Ki", "1000Ki"),
        ("0.1Ki", "102400m"),
        ("-1.5", "-1500m"),
        ("+1", "+1"),
        ("100n", "100n"),
        ("1E", "1E"),
    ] {
        assert_eq!(text(given), written, "{given}");
    }
    assert_eq!(rounded("100n"), "1m");
    assert_eq!(rounded("1.0001"), "1001m");
    assert_eq!(rounded("250m"), "250m");
    for bad in ["", "abc", "1ki", "1.5.5", "1 ", "--1", "1e"] {
        assert!(Qty::parse(bad).is_err(), "{bad:?} parsed");
    }
    // Binary quantities are capped at 2^63-1.
    assert_eq!(text("16Ei"), "9223372036854775807");
}

#[test]
fn sidecars_and_init_containers_add_up_to_pod_level_requests() {
    let pod = defaulted(pod_with(json!({
        "resources": { "limits": { "cpu": "4", "memory": "4Gi", "hugepages-2Mi": "4Mi" } },
        "initContainers": [
            { "name": "sidecar", "image": "busybox", "restartPolicy": "Always",
              "resources": { "requests": { "cpu": "250m" } } },
            { "name": "setup", "image": "busybox", "resources": { "requests": { "cpu": "2" } } }
        ],
        "containers": [{ "name": "c", "image": "busybox",
                         "resources": { "requests": { "cpu": "1", "memory": "1Gi" } } }]
    })));
    // cpu: max(1 + 250m, 2 + 250m) = 2250m; memory from the container;
    // hugepages from the pod's limit.
    assert_eq!(
        pod["spec"]["resources"]["requests"],
        json!({ "cpu": "2250m", "memory": "1Gi", "hugepages-2Mi": "4Mi" })
    );
}

#[test]
fn service_accounts_and_priority_classes() {
    let pod = defaulted(pod_with(json!({
        "serviceAccount": "legacy",
        "priorityClassName": "system-node-critical",
        "containers": [container("busybox")]
    })));
    assert_eq!(pod["spec"]["serviceAccountName"], "legacy");
    assert_eq!(pod["spec"]["serviceAccount"], "legacy");
    assert_eq!(pod["spec"]["priority"], 2_000_001_000);
    assert_eq!(pod["spec"]["preemptionPolicy"], "PreemptLowerPriority");

    let mut mirror =
        pod_with(json!({ "priorityClassName": "gold", "containers": [container("busybox")] }));
    mirror["metadata"]["annotations"] = json!({ "kubernetes.io/config.mirror": "abc" });
    let mirror = defaulted(mirror);
    assert!(mirror["spec"].get("serviceAccountName").is_none());
    assert!(mirror["spec"].get("serviceAccount").is_none());
    assert!(
        mirror["spec"].get("priority").is_none(),
        "an unknown class is left alone"
    );
}

#[test]
fn a_service_gets_its_defaults_but_no_cluster_ip() {
    let svc = defaulted(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": { "name": "web" },
        "spec": { "selector": { "app": "web" },
                  "ports": [{ "port": 80 }, { "name": "alt", "port": 81, "targetPort": "http" }] }
    }));
    assert_eq!(
        svc["spec"],
        json!({
            "selector": { "app": "web" },
            "ports": [
                { "port": 80, "protocol": "TCP", "targetPort": 80 },
                { "name": "alt", "port": 81, "protocol": "TCP", "targetPort": "http" }
            ],
            "type": "ClusterIP",
            "sessionAffinity": "None",
            "internalTrafficPolicy": "Cluster",
            "ipFamilyPolicy": "SingleStack"
        })
    );
    assert_eq!(svc["status"], json!({ "loadBalancer": {} }));

    let node_port = defaulted(json!({
        "apiVersion": "v1", "kind": "Service", "metadata": { "name": "np" },
        "spec": { "type": "NodePort", "ports": [{ "port": 80 }], "sessionAffinity": "ClientIP" }
    }));
    assert_eq!(node_port["spec"]["externalTrafficPolicy"], "Cluster");
    assert_eq!(
        node_port["spec"]["sessionAffinityConfig"],
        json!({ "clientIP": { "timeoutSeconds": 10800 } })
    );
    assert!(
        node_port["spec"]
            .get("allocateLoadBalancerNodePorts")
            .is_none()
    );

    let headless = defaulted(json!({
        "apiVersion": "v1", "kind": "Service", "metadata": { "name": "h" },
        "spec": { "clusterIP": "None" }
    }));
    assert_eq!(headless["spec"]["ipFamilyPolicy"], "RequireDualStack");

    let external = defaulted(json!({
        "apiVersion": "v1", "kind": "Service", "metadata": { "name": "x" },
        "spec": { "type": "ExternalName", "externalName": "example.com" }
    }));
    assert!(external["spec"].get("ipFamilyPolicy").is_none());
    assert!(external["spec"].get("internalTrafficPolicy").is_none());
}

#[test]
fn a_secret_is_opaque_and_its_string_data_lands_in_data() {
    let secret = defaulted(json!({
        "apiVersion": "v1", "kind": "Secret", "metadata": { "name": "s" },
        "data": { "a": "b2xk", "b": "Yg==" },
        "stringData": { "a": "new" }
    }));
    assert_eq!(secret["type"], "Opaque");
    assert_eq!(secret["data"], json!({ "a": "bmV3", "b": "Yg==" }));
    assert!(secret.get("stringData").is_none());
    let tls = defaulted(json!({
        "apiVersion": "v1", "kind": "Secret", "metadata": { "name": "t" }, "type": "kubernetes.io/tls"
    }));
    assert_eq!(tls["type"], "kubernetes.io/tls");
}

#[test]
fn config_maps_endpoints_and_nodes() {
    let cm = json!({ "apiVersion": "v1", "kind": "ConfigMap", "metadata": { "name": "web-conf" },
                         "data": { "index.html": "<h1>hello from the cloud</h1>\n" } });
    assert_eq!(defaulted(cm.clone()), cm);
    let ep = defaulted(json!({
        "apiVersion": "v1", "kind": "Endpoints", "metadata": { "name": "web" },
        "subsets": [{ "addresses": [{ "ip": "10.0.0.5" }], "ports": [{ "port": 8080 }] }]
    }));
    assert_eq!(
        ep["subsets"][0]["ports"],
        json!([{ "port": 8080, "protocol": "TCP" }])
    );
    let node = defaulted(json!({
        "apiVersion": "v1", "kind": "Node", "metadata": { "name": "edge-1" },
        "status": { "capacity": { "cpu": "4", "memory": "8048576Ki" } }
    }));
    assert_eq!(
        node["status"]["allocatable"],
        json!({ "cpu": "4", "memory": "8048576Ki" })
    );
}

#[test]
fn devices_get_only_their_schema_defaults() {
    let device = defaulted(json!({
        "apiVersion": "devices.kubeedge.io/v1beta1", "kind": "Device",
        "metadata": { "name": "thermo-1" },
        "spec": { "deviceModelRef": {}, "nodeName": "edge-1", "unknownField": 1 }
    }));
    assert_eq!(device["spec"]["deviceModelRef"], json!({ "name": "" }));
    assert_eq!(
        device["spec"]["unknownField"], 1,
        "custom resources are not pruned"
    );
    let model = json!({ "apiVersion": "devices.kubeedge.io/v1beta1", "kind": "DeviceModel",
                            "metadata": { "name": "m" }, "spec": { "protocol": "modbus" } });
    assert_eq!(defaulted(model.clone()), model);
}

#[test]
fn unknown_kinds_are_left_alone_and_unknown_fields_pruned() {
    for object in [
        json!({ "apiVersion": "apps/v1", "kind": "Deployment", "spec": { "replicas": "x" } }),
        json!({ "apiVersion": "example.com/v1", "kind": "Pod", "spec": 1 }),
        json!({ "no": "kind" }),
        json!("just a string"),
    ] {
        assert_eq!(defaulted(object.clone()), object);
    }
    let mut pod = web_pod();
    pod["spec"]["notAField"] = json!(true);
    assert!(defaulted(pod)["spec"].get("notAField").is_none());
}

#[test]
fn an_invalid_pod_is_an_error_and_is_left_unchanged() {
    let invalid = pod_with(json!({ "containers": "busybox" }));
    let mut object = invalid.clone();
    let err = apply(&mut object).expect_err("containers must be a list");
    assert!(
        matches!(err, DefaultsError::Invalid { kind: "Pod", .. }),
        "{err}"
    );
    assert_eq!(object, invalid);

    let bad_quantity = pod_with(json!({ "containers": [{
            "name": "c", "image": "busybox", "resources": { "limits": { "cpu": "lots" } }
        }] }));
    let mut object = bad_quantity.clone();
    let err = apply(&mut object).expect_err("not a quantity");
    assert!(
        err.to_string()
            .contains("spec.containers[0].resources.limits.cpu"),
        "{err}"
    );
    assert_eq!(object, bad_quantity);

    let mut wrong_version = pod_with(json!({ "containers": [] }));
    wrong_version["apiVersion"] = json!("v2");
    assert_eq!(defaulted(wrong_version.clone()), wrong_version);
}

#[test]
fn a_negative_grace_period_becomes_one() {
    let pod = defaulted(pod_with(json!({
        "terminationGracePeriodSeconds": -5, "containers": [container("busybox")]
    })));
    assert_eq!(pod["spec"]["terminationGracePeriodSeconds"], 1);
}
