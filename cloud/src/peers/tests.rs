//! Tests of the parent module (`peers.rs`).

use super::*;

fn peer(replica: &str, url: Option<&str>) -> Peer {
    Peer {
        replica: replica.to_owned(),
        url: url.map(str::to_owned),
    }
}

struct NoDirectory;

impl PeerDirectory for NoDirectory {
    fn holder(&self, _: &str) -> BoxFuture<'static, Result<Option<Peer>, String>> {
        Box::pin(async { Ok(None) })
    }
    fn replicas(&self) -> BoxFuture<'static, Result<Vec<Peer>, String>> {
        Box::pin(async { Ok(Vec::new()) })
    }
}

#[test]
fn a_replica_with_an_identity_reaches_peers_over_https_only() {
    let dir = tempfile::tempdir().expect("dir");
    let ca = hub::certs::CloudCa::load_or_create(dir.path()).expect("CA");
    let identity = ca
        .issue_client(
            "system:edgehive:replica:a",
            REPLICAS,
            std::time::Duration::from_secs(60),
        )
        .expect("identity");
    let peers = Peers::new("a", Arc::new(NoDirectory), vec![ca.root()], Some(identity));
    let refused = peers.client("b", "http://10.0.0.2:10003");
    assert!(
        matches!(&refused, Err(ForwardError::Settings { reason, .. }) if reason.contains("not https://")),
        "{:?}",
        refused.err()
    );
    assert!(peers.client("b", "https://10.0.0.2:10003").is_ok());
    // Without authentication (loopback only) plain HTTP is what peers
    // serve.
    let plain = Peers::new("a", Arc::new(NoDirectory), Vec::new(), None);
    assert!(plain.client("b", "http://127.0.0.1:10003").is_ok());
}

#[test]
fn a_node_held_by_a_peer_is_forwarded_to_it() {
    let held = || Ok(Some(peer("b", Some("https://10.0.0.2:10003"))));
    assert!(matches!(
        route("edge-1", false, false, "a", held),
        Route::Forward { replica, url } if replica == "b" && url == "https://10.0.0.2:10003"
    ));
}

#[test]
fn linked_here_or_forwarded_is_answered_here_without_a_lookup() {
    let never = || -> Result<Option<Peer>, String> { panic!("looked up") };
    assert!(matches!(
        route("edge-1", true, false, "a", never),
        Route::Here
    ));
    // A forwarded request is never forwarded again, whoever holds it.
    assert!(matches!(
        route("edge-1", false, true, "a", never),
        Route::Here
    ));
}

#[test]
fn a_node_nobody_holds_or_this_replica_holds_is_answered_here() {
    assert!(matches!(
        route("edge-1", false, false, "a", || Ok(None)),
        Route::Here
    ));
    let mine = || Ok(Some(peer("a", Some("https://10.0.0.1:10003"))));
    assert!(matches!(
        route("edge-1", false, false, "a", mine),
        Route::Here
    ));
}

#[test]
fn a_holder_without_address_or_a_failed_lookup_is_a_503_naming_node_and_replica() {
    for url in [None, Some("")] {
        let Route::Refuse(err) = route("edge-1", false, false, "a", || Ok(Some(peer("b", url))))
        else {
            panic!("not refused");
        };
        assert!(matches!(err, ApiError::Unavailable(_)));
        let text = err.to_string();
        assert!(
            text.contains("edge-1") && text.contains("replica b"),
            "{text}"
        );
    }
    let Route::Refuse(err) = route("edge-1", false, false, "a", || Err("etcd: down".into())) else {
        panic!("not refused");
    };
    assert!(err.to_string().contains("etcd: down"), "{err}");
}

#[test]
fn lists_are_asked_of_every_other_replica_with_an_address() {
    let replicas = vec![
        peer("a", Some("https://a:1")),
        peer("b", Some("https://b:1")),
        peer("c", None),
        peer("d", Some("")),
    ];
    assert_eq!(
        others(replicas, "a"),
        [("b".to_owned(), "https://b:1".to_owned())]
    );
}

#[test]
fn merged_lists_hold_each_object_once_this_replicas_first() {
    let item = |ns: &str, name: &str, cpu: &str| json!({"metadata": {"namespace": ns, "name": name}, "usage": {"cpu": cpu}});
    let own = vec![item("default", "web", "1n"), item("", "edge-1", "2n")];
    let theirs = vec![
        vec![item("default", "db", "3n"), item("default", "web", "9n")],
        vec![],
        vec![item("prod", "web", "4n")],
    ];
    let merged = merge_items(own, theirs);
    let names: Vec<String> = merged
        .iter()
        .map(|i| {
            format!(
                "{}/{}={}",
                i["metadata"]["namespace"].as_str().unwrap_or(""),
                i["metadata"]["name"].as_str().unwrap_or(""),
                i["usage"]["cpu"].as_str().unwrap_or("")
            )
        })
        .collect();
    assert_eq!(
        names,
        [
            "default/web=1n",
            "/edge-1=2n",
            "default/db=3n",
            "prod/web=4n"
        ]
    );
}

#[test]
fn a_peers_refusal_keeps_its_code_and_a_silent_peer_is_a_503() {
    let refused = ForwardError::of(
        ClientError::Server {
            code: 404,
            reason: "NotFound".to_owned(),
            message: "pods \"x\" not found".to_owned(),
        },
        "edge-1",
        "b",
        "https://b:1",
    );
    assert_eq!(refused.status_code(), StatusCode::NOT_FOUND);
    let silent = ForwardError::of(
        ClientError::Unreachable {
            address: "b:1".to_owned(),
            reason: "connection refused".to_owned(),
        },
        "edge-1",
        "b",
        "https://b:1",
    );
    assert_eq!(silent.status_code(), StatusCode::SERVICE_UNAVAILABLE);
    let text = silent.to_string();
    assert!(
        text.contains("node edge-1") && text.contains("replica b"),
        "{text}"
    );
}
