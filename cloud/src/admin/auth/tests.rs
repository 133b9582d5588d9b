//! Tests of the parent module (`auth.rs`).

use super::*;

fn admin() -> User {
    User::new("admin", &[ADMINS])
}
fn viewer() -> User {
    User::new("bob", &[VIEWERS])
}
fn replica() -> User {
    User::new("system:edgehive:replica:b", &[REPLICAS])
}
#[test]
fn a_replica_may_forward_streams_and_metrics_and_nothing_else() {
    let forbidden = |d: &Decision| matches!(d, Decision::Forbidden(_));
    for allowed in [
        ("GET", "/api/v1/namespaces/default/pods/web/log?follow=true"),
        (
            "GET",
            "/api/v1/namespaces/default/pods/web/exec?command=sh&stdin=true",
        ),
        (
            "GET",
            "/api/v1/namespaces/default/pods/web/attach?stdout=true",
        ),
        (
            "GET",
            "/api/v1/namespaces/default/pods/web/portforward?ports=80",
        ),
        ("GET", "/apis/metrics.k8s.io/v1beta1/nodes"),
        (
            "GET",
            "/apis/metrics.k8s.io/v1beta1/namespaces/default/pods/web",
        ),
    ] {
        assert_eq!(
            authorize(allowed.0, allowed.1, &replica()),
            Decision::Allow,
            "{allowed:?}"
        );
    }
    for refused in [
        ("GET", "/api/v1/namespaces/default/pods/web"),
        ("GET", "/api/v1/namespaces/default/secrets"),
        ("POST", "/apis/edgehive.io/v1/apply"),
        ("DELETE", "/api/v1/namespaces/default/pods/web"),
        ("GET", "/apis/edgehive.io/v1/jointokens"),
    ] {
        assert!(
            forbidden(&authorize(refused.0, refused.1, &replica())),
            "{refused:?}"
        );
    }
    // The group alone is not enough: the name must be a replica's.
    let impostor = User::new("edge-1", &[REPLICAS]);
    assert!(forbidden(&authorize(
        "GET",
        "/api/v1/namespaces/default/pods/web/exec?command=sh&stdout=true",
        &impostor
    )));
}
fn nobody() -> User {
    User::new("edge-1", &["system:nodes"])
}

#[test]
fn requests_are_named_as_kube_apiserver_names_them() {
    let cases = [
        (
            "GET",
            "/api/v1/namespaces/default/pods",
            "list",
            "",
            "pods",
            "",
            "default",
            "",
        ),
        (
            "GET",
            "/api/v1/namespaces/default/pods?watch=true",
            "watch",
            "",
            "pods",
            "",
            "default",
            "",
        ),
        (
            "GET",
            "/api/v1/namespaces/default/pods/web",
            "get",
            "",
            "pods",
            "",
            "default",
            "web",
        ),
        (
            "GET",
            "/api/v1/namespaces/default/pods/web/log?follow=true",
            "get",
            "",
            "pods",
            "log",
            "default",
            "web",
        ),
        (
            "GET",
            "/api/v1/namespaces/default/pods/web/exec?command=sh",
            "create",
            "",
            "pods",
            "exec",
            "default",
            "web",
        ),
        (
            "POST",
            "/api/v1/namespaces/default/pods/web/exec",
            "create",
            "",
            "pods",
            "exec",
            "default",
            "web",
        ),
        (
            "GET",
            "/api/v1/namespaces/default/pods/web/attach",
            "create",
            "",
            "pods",
            "attach",
            "default",
            "web",
        ),
        (
            "GET",
            "/api/v1/namespaces/ns/pods/web/portforward?ports=80",
            "create",
            "",
            "pods",
            "portforward",
            "ns",
            "web",
        ),
        ("GET", "/api/v1/nodes", "list", "", "nodes", "", "", ""),
        (
            "GET",
            "/api/v1/nodes/edge-1",
            "get",
            "",
            "nodes",
            "",
            "",
            "edge-1",
        ),
        ("GET", "/api/v1/pods", "list", "", "pods", "", "", ""),
        (
            "DELETE",
            "/api/v1/namespaces/default/configmaps/page",
            "delete",
            "",
            "configmaps",
            "",
            "default",
            "page",
        ),
        (
            "DELETE",
            "/api/v1/namespaces/default/configmaps",
            "deletecollection",
            "",
            "configmaps",
            "",
            "default",
            "",
        ),
        (
            "POST",
            "/apis/edgehive.io/v1/apply",
            "create",
            "edgehive.io",
            "apply",
            "",
            "",
            "",
        ),
        (
            "POST",
            "/apis/edgehive.io/v1/delete",
            "create",
            "edgehive.io",
            "delete",
            "",
            "",
            "",
        ),
        (
            "GET",
            "/apis/metrics.k8s.io/v1beta1/nodes",
            "list",
            "metrics.k8s.io",
            "nodes",
            "",
            "",
            "",
        ),
        (
            "GET",
            "/apis/metrics.k8s.io/v1beta1/namespaces/default/pods/web",
            "get",
            "metrics.k8s.io",
            "pods",
            "",
            "default",
            "web",
        ),
        (
            "GET",
            "/apis/devices.kubeedge.io/v1beta1/namespaces/default/devices",
            "list",
            "devices.kubeedge.io",
            "devices",
            "",
            "default",
            "",
        ),
        (
            "PUT",
            "/api/v1/namespaces/default/pods/web/status",
            "update",
            "",
            "pods",
            "status",
            "default",
            "web",
        ),
        (
            "GET",
            "/api/v1/namespaces/default",
            "get",
            "",
            "namespaces",
            "",
            "default",
            "default",
        ),
    ];
    for (method, path, verb, group, resource, subresource, namespace, name) in cases {
        let got = attributes(method, path);
        assert!(got.resource_request, "{method} {path}");
        assert_eq!(
            (
                got.verb.as_str(),
                got.group.as_str(),
                got.resource.as_str(),
                got.subresource.as_str(),
                got.namespace.as_str(),
                got.name.as_str()
            ),
            (verb, group, resource, subresource, namespace, name),
            "{method} {path}"
        );
    }
    for path in [
        "/healthz",
        "/metrics",
        "/apis",
        "/api/v1",
        "/apis/edgehive.io/v1",
        "/",
    ] {
        let got = attributes("GET", path);
        assert!(!got.resource_request, "{path}");
        assert_eq!(got.verb, "get");
    }
}

#[test]
fn roles_decide_by_group() {
    use Decision::Allow;
    let forbidden = |d: &Decision| matches!(d, Decision::Forbidden(_));
    // (method, path, admin, viewer, a user of no role)
    let cases = [
        ("GET", "/api/v1/namespaces/default/pods", true, true, false),
        (
            "GET",
            "/api/v1/namespaces/default/pods?watch=1",
            true,
            true,
            false,
        ),
        (
            "GET",
            "/api/v1/namespaces/default/pods/web",
            true,
            true,
            false,
        ),
        ("GET", "/api/v1/pods", true, true, false),
        ("GET", "/api/v1/nodes/edge-1", true, true, false),
        (
            "GET",
            "/api/v1/namespaces/default/configmaps/page",
            true,
            true,
            false,
        ),
        (
            "GET",
            "/api/v1/namespaces/default/secrets",
            true,
            false,
            false,
        ),
        (
            "GET",
            "/api/v1/namespaces/default/secrets/key",
            true,
            false,
            false,
        ),
        (
            "GET",
            "/api/v1/namespaces/default/pods/web/log?follow=true",
            true,
            true,
            false,
        ),
        (
            "GET",
            "/apis/metrics.k8s.io/v1beta1/pods",
            true,
            true,
            false,
        ),
        (
            "GET",
            "/apis/devices.kubeedge.io/v1beta1/namespaces/default/devices/t",
            true,
            true,
            false,
        ),
        (
            "GET",
            "/api/v1/namespaces/default/pods/web/exec?command=sh",
            true,
            false,
            false,
        ),
        (
            "GET",
            "/api/v1/namespaces/default/pods/web/attach",
            true,
            false,
            false,
        ),
        (
            "GET",
            "/api/v1/namespaces/default/pods/web/portforward?ports=80",
            true,
            false,
            false,
        ),
        ("POST", "/apis/edgehive.io/v1/apply", true, false, false),
        ("POST", "/apis/edgehive.io/v1/delete", true, false, false),
        (
            "DELETE",
            "/api/v1/namespaces/default/pods/web",
            true,
            false,
            false,
        ),
        ("DELETE", "/api/v1/nodes/edge-1", true, false, false),
        (
            "PUT",
            "/api/v1/namespaces/default/pods/web",
            true,
            false,
            false,
        ),
        (
            "PATCH",
            "/api/v1/namespaces/default/pods/web",
            true,
            false,
            false,
        ),
        ("GET", "/version", true, true, false),
    ];
    for (method, path, admin_may, viewer_may, nobody_may) in cases {
        for (user, may) in [
            (admin(), admin_may),
            (viewer(), viewer_may),
            (nobody(), nobody_may),
        ] {
            let decision = authorize(method, path, &user);
            if may {
                assert_eq!(decision, Allow, "{} {method} {path}", user.name);
            } else {
                assert!(forbidden(&decision), "{} {method} {path}", user.name);
            }
        }
    }
    // Both groups: the wider wins.
    let both = User::new("carol", &[VIEWERS, ADMINS]);
    assert_eq!(
        authorize("POST", "/apis/edgehive.io/v1/apply", &both),
        Allow
    );
}

#[test]
fn refusals_are_worded_as_kubernetes_words_them() {
    let message = |method, path| match authorize(method, path, &viewer()) {
        Decision::Forbidden(message) => message,
        Decision::Allow => panic!("allowed: {method} {path}"),
    };
    assert_eq!(
        message("GET", "/api/v1/namespaces/default/pods/web/exec?command=sh"),
        r#"pods "web" is forbidden: User "bob" cannot create resource "pods/exec" in API group "" in the namespace "default""#
    );
    assert_eq!(
        message("POST", "/apis/edgehive.io/v1/apply"),
        r#"apply.edgehive.io is forbidden: User "bob" cannot create resource "apply" in API group "edgehive.io" at the cluster scope"#
    );
    assert_eq!(
        message("GET", "/api/v1/namespaces/default/secrets"),
        r#"secrets is forbidden: User "bob" cannot list resource "secrets" in API group "" in the namespace "default""#
    );
    assert_eq!(
        message("DELETE", "/api/v1/nodes/edge-1"),
        r#"nodes "edge-1" is forbidden: User "bob" cannot delete resource "nodes" in API group "" at the cluster scope"#
    );
    match authorize("GET", "/version", &nobody()) {
        Decision::Forbidden(m) => {
            assert_eq!(m, r#"forbidden: User "edge-1" cannot get path "/version""#)
        }
        Decision::Allow => panic!("allowed"),
    }
}

#[test]
fn token_files_read_as_kube_apiserver_reads_them() {
    let tokens = Tokens::parse(
        "# admins\n\
             s3cret,alice,1,\"edgehive:admins\"\n\
             \n\
             r3ad, bob ,2,\"edgehive:viewers, other\"\n\
             plain,carol,3\n\
             quoted,\"dave, jr\",4,\"a,\"\"b\"\"\"\n",
    )
    .expect("parses");
    assert_eq!(tokens.len(), 4);
    assert_eq!(tokens.user("s3cret"), Some(User::new("alice", &[ADMINS])));
    assert_eq!(
        tokens.user("r3ad"),
        Some(User::new("bob", &[VIEWERS, "other"]))
    );
    assert_eq!(tokens.user("plain"), Some(User::new("carol", &[])));
    assert_eq!(
        tokens.user("quoted"),
        Some(User::new("dave, jr", &["a", "\"b\""]))
    );
    assert_eq!(tokens.user("s3cre"), None);
    assert_eq!(tokens.user(""), None);
    assert_eq!(tokens.user("s3cret "), None);

    for (text, line) in [
        ("a,b\n", 1),
        ("ok,u,1\n,user,2\n", 2),
        ("t,u,1\nt,v,2\n", 2),
        ("t,\"u,1\n", 1),
        ("t,u\"x,1\n", 1),
    ] {
        let err = Tokens::parse(text).expect_err(text);
        assert_eq!(err.0, line, "{text:?}: {}", err.1);
    }
}

#[test]
fn a_certificate_comes_first_then_a_bearer_token() {
    let tokens = Tokens::parse("tok,alice,1,edgehive:admins\n").expect("parses");
    let alice = User::new("alice", &[ADMINS]);
    assert_eq!(
        authenticate(None, Some("Bearer tok"), &tokens),
        Ok(alice.clone())
    );
    let cert = viewer();
    assert_eq!(
        authenticate(Some(&cert), Some("Bearer tok"), &tokens),
        Ok(cert)
    );
    assert!(authenticate(None, None, &tokens).is_err());
    assert!(authenticate(None, Some("Bearer nope"), &tokens).is_err());
    assert!(authenticate(None, Some("Basic dG9rOg=="), &tokens).is_err());
    assert!(authenticate(None, Some("Bearer "), &tokens).is_err());
}
