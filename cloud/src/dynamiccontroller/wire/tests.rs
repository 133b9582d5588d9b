//! Tests of the parent module (`wire.rs`).

use super::*;

fn doc(value: Value) -> Content {
    Content::of(&value).expect("json")
}

/// An application as KubeEdge's edge writes it (Go's encoding/json).
fn from_the_edge() -> Value {
    json!({
        "ID": "4f2a", "Key": "/core/v1/services/default/null", "Verb": "list",
        "Nodename": "edge-1", "Option": STANDARD.encode(br#"{"labelSelector":"app=web"}"#),
        "ReqBody": null, "Subresource": "", "RespBody": null, "Status": "InApplying",
        "Reason": "", "Error": {"ErrStatus": {"metadata": {}}},
        "Timestamp": "0001-01-01T00:00:00Z"
    })
}

#[test]
fn an_application_reads_as_the_edge_wrote_it() {
    let app = Application::from_content(&doc(from_the_edge())).expect("readable");
    assert_eq!(app.verb, "list");
    assert_eq!(app.options().expect("options")["labelSelector"], "app=web");
    assert!(app.request_body.is_empty());
    // As a string too (some edges send the JSON text).
    let text = Content::text(from_the_edge().to_string());
    assert_eq!(Application::from_content(&text).expect("readable"), app);
    assert!(Application::from_content(&doc(json!({"Option": "not base64!"}))).is_err());
}

#[test]
fn an_answer_keeps_what_the_edge_sent_and_adds_the_result() {
    let app = Application::from_content(&doc(from_the_edge())).expect("readable");
    let list = json!({"kind": "ServiceList", "items": []});
    let answer = app
        .clone()
        .approved(list.to_string().into_bytes())
        .to_content()
        .decode::<Value>()
        .expect("json");
    assert_eq!(answer["Status"], "Approved");
    assert_eq!(answer["Timestamp"], "0001-01-01T00:00:00Z");
    let body = STANDARD
        .decode(answer["RespBody"].as_str().expect("base64"))
        .expect("b64");
    assert_eq!(serde_json::from_slice::<Value>(&body).expect("json"), list);

    let refused = app
        .rejected(&ApiStatus::forbidden("no"))
        .to_content()
        .decode::<Value>()
        .expect("json");
    assert_eq!(refused["Status"], "Rejected");
    assert_eq!(refused["RespBody"], Value::Null);
    assert_eq!(refused["Error"]["ErrStatus"]["code"], 403);
    assert_eq!(refused["Error"]["ErrStatus"]["reason"], "Forbidden");
}

#[test]
fn keys_name_resources_namespaces_and_objects() {
    let Target::Resource(pods) = Target::parse("/core/v1/pods/default/web").expect("key") else {
        panic!("a resource");
    };
    assert_eq!(
        pods.path("").expect("path"),
        "/api/v1/namespaces/default/pods/web"
    );
    assert_eq!(
        pods.path("status").expect("path"),
        "/api/v1/namespaces/default/pods/web/status"
    );
    assert_eq!(pods.edge_type(), "pod");
    let Target::Resource(all) = Target::parse("/apps/v1/deployments/null/null").expect("key")
    else {
        panic!("a resource");
    };
    assert_eq!(all.path("").expect("path"), "/apis/apps/v1/deployments");
    assert!(all.path("status").is_err(), "a subresource of no object");
    let Target::Resource(nodes) = Target::parse("/core/v1/nodes/null/edge-1").expect("key") else {
        panic!("a resource");
    };
    assert_eq!(nodes.path("").expect("path"), "/api/v1/nodes/edge-1");
    let Target::Resource(namespace) =
        Target::parse("/core/v1/namespaces/null/kube-system").expect("key")
    else {
        panic!("a resource");
    };
    assert_eq!(
        namespace.path("").expect("path"),
        "/api/v1/namespaces/kube-system"
    );
    for discovery in ["/version", "/api", "/apis/apps", "/apis/apps/v1", "/api/v1"] {
        assert_eq!(
            Target::parse(discovery),
            Ok(Target::Discovery(discovery.to_owned()))
        );
    }
}

#[test]
fn keys_that_could_leave_the_api_are_refused() {
    for key in [
        "",
        "core/v1/pods",
        "/core/v1/pods/../secrets",
        "/core/v1/pods/default/web?watch=1",
        "/core/v1/pods/default/a b",
        "/core/v1/pods/default/web/extra/more",
        "/core/v1/pods/default/%2e%2e",
    ] {
        assert!(Target::parse(key).is_err(), "{key:?} refused");
    }
}

#[test]
fn kinds_follow_kubeedges_guess() {
    for (resource, kind) in [
        ("pods", "Pod"),
        ("services", "Service"),
        ("endpoints", "Endpoints"),
        ("ingresses", "Ingress"),
        ("networkpolicies", "Networkpolicy"),
        ("configmaps", "Configmap"),
        ("leases", "Leases"),
    ] {
        assert_eq!(resource_to_kind(resource), kind);
    }
}

#[test]
fn queries_carry_selectors_and_paging() {
    let Target::Resource(key) = Target::parse("/core/v1/pods/default/web").expect("key") else {
        panic!("a resource");
    };
    let options = json!({"labelSelector": "app in (web,db)", "limit": 5, "continue": "x"});
    let query = list_query(&options, &key, Reading::List);
    assert_eq!(
        query,
        "labelSelector=app+in+%28web%2Cdb%29&fieldSelector=metadata.name%3Dweb&continue=x&limit=5"
    );
    // A client's watch-list request (Kubernetes 1.32's clients at the
    // edge): the match goes only with a version, and a watch's own
    // listing takes neither.
    let watch_list = json!({"resourceVersionMatch": "NotOlderThan", "sendInitialEvents": true,
                                "labelSelector": "a=b"});
    assert_eq!(
        list_query(&watch_list, &key, Reading::List),
        "labelSelector=a%3Db&fieldSelector=metadata.name%3Dweb"
    );
    let mut versioned = watch_list.clone();
    versioned["resourceVersion"] = json!("42");
    assert_eq!(
        list_query(&versioned, &key, Reading::List),
        "labelSelector=a%3Db&fieldSelector=metadata.name%3Dweb&resourceVersion=42&resourceVersionMatch=NotOlderThan"
    );
    assert_eq!(
        list_query(&versioned, &key, Reading::Listing),
        "labelSelector=a%3Db&fieldSelector=metadata.name%3Dweb"
    );
    let query = list_query(
        &json!({"fieldSelector": "spec.nodeName=n"}),
        &key,
        Reading::Watch,
    );
    assert_eq!(
        query,
        "fieldSelector=spec.nodeName%3Dn%2Cmetadata.name%3Dweb&watch=true&allowWatchBookmarks=true"
    );
    assert_eq!(
        write_query(&json!({"fieldManager": "kubelet", "dryRun": ["All"]})),
        "fieldManager=kubelet&dryRun=All"
    );
}

#[test]
fn the_default_master_points_at_the_metaserver() {
    let slice = json!({
        "kind": "EndpointSlice", "addressType": "IPv4",
        "metadata": {"name": "kubernetes", "namespace": "default"},
        "endpoints": [{"addresses": ["10.0.0.1"]}, {"addresses": ["10.0.0.2"]}],
        "ports": [{"name": "https", "port": 6443}]
    });
    let mut one = slice.clone();
    point_at_metaserver(&mut one);
    assert_eq!(one["endpoints"], json!([{"addresses": ["127.0.0.1"]}]));
    assert_eq!(one["ports"][0]["port"], 10550);
    let mut list = json!({"kind": "EndpointSliceList", "items": [slice.clone()]});
    point_at_metaserver(&mut list);
    assert_eq!(list["items"][0]["ports"][0]["port"], 10550);
    // Another slice is left as it is.
    let mut other = slice;
    other["metadata"]["name"] = json!("web");
    let before = other.clone();
    point_at_metaserver(&mut other);
    assert_eq!(other, before);
}
