//! Tests of the parent module (`message.rs`).

use super::*;
use serde_json::{Value, json};

fn doc(value: Value) -> Content {
    Content::of(&value).expect("encodable")
}

#[test]
fn fresh_ids_are_random_version_4_uuids_each_its_own() {
    let ids: std::collections::HashSet<Uuid> = (0..10_000).map(|_| Message::new().id()).collect();
    assert_eq!(ids.len(), 10_000, "no id comes twice");
    for id in &ids {
        assert_eq!(id.get_version(), Some(uuid::Version::Random));
        assert_eq!(id.get_variant(), uuid::Variant::RFC4122);
    }
    // Drawn in batches, yet another thread draws other ids.
    let there: Vec<Uuid> = std::thread::spawn(|| (0..100).map(|_| Message::new().id()).collect())
        .join()
        .unwrap_or_default();
    assert_eq!(there.len(), 100);
    assert!(there.iter().all(|id| !ids.contains(id)));
}

#[test]
fn now_millis_is_the_clock_in_milliseconds() {
    let before = i64::try_from(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis())
            .unwrap_or(0),
    )
    .unwrap_or(i64::MAX);
    let now = now_millis();
    let after = i64::try_from(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis())
            .unwrap_or(0),
    )
    .unwrap_or(i64::MAX);
    assert!(
        before <= now && now <= after,
        "{before} <= {now} <= {after}"
    );
}

#[test]
fn a_failure_reads_back_as_it_was_written_and_a_peers_in_any_form() {
    let request = Message::new().build_router("edged", "meta", "default/pod/web", "query");
    for failure in [
        Failure::refused("not held"),
        Failure::retryable("disk full"),
    ] {
        let answer = request.failed("metamanager", failure.clone());
        assert_eq!(answer.operation(), operation::ERROR);
        assert_eq!(answer.parent_id(), Some(request.id()));
        assert_eq!(answer.failure(), Some(failure.clone()));
        assert_eq!(answer.is_retryable(), failure.retryable);
        assert_eq!(answer.into_answer(), Err(failure));
    }
    // A final refusal's content is its reason, as KubeEdge writes one.
    let refused = request.error_response("metamanager", "not held");
    assert_eq!(refused.content(), &Content::text("not held"));
    // A peer's error of another shape is read as its text.
    for (content, reason) in [
        (json!({"code": 404}), r#"{"code":404}"#),
        (Value::Null, ""),
        (json!({"reason": 7}), r#"{"reason":7}"#),
        (json!(["x", true]), r#"["x",true]"#),
    ] {
        let mut odd = request.response("cloud", doc(content));
        odd.router.operation = SmolStr::new_static(operation::ERROR);
        assert_eq!(odd.failure(), Some(Failure::refused(reason)));
    }
    // Any other answer is no failure, whatever it carries.
    let answer = request.response(
        "metamanager",
        doc(json!({"reason": "x", "retryable": true})),
    );
    assert_eq!(answer.failure(), None);
    assert!(!answer.is_retryable());
    assert!(answer.into_answer().is_ok());
}

#[test]
fn builder_sets_every_field() {
    let m = Message::new()
        .build_router("edged", "meta", "default/pod/a", "update")
        .with_destination("metamanager")
        .with_resource_version("42")
        .with_content(doc(json!({"k": 1})));
    assert_eq!(m.source(), "edged");
    assert_eq!(m.group(), "meta");
    assert_eq!(m.resource(), "default/pod/a");
    assert_eq!(m.operation(), "update");
    assert_eq!(m.destination(), "metamanager");
    assert_eq!(m.resource_version(), "42");
    assert_eq!(m.body::<Value>().expect("body"), json!({"k": 1}));
    assert!(!m.is_sync());
    assert!(m.timestamp() > 0);
}

#[test]
fn fresh_messages_have_distinct_ids() {
    assert_ne!(Message::new().id(), Message::new().id());
}

#[test]
fn typed_body_round_trips() {
    #[derive(Serialize, Deserialize, PartialEq, Debug)]
    struct Pod {
        name: String,
        replicas: u32,
    }
    let pod = Pod {
        name: "web".into(),
        replicas: 3,
    };
    let m = Message::new().fill_body(&pod).expect("fill");
    assert_eq!(m.body::<Pod>().expect("body"), pod);
    assert!(m.body::<Vec<u8>>().is_err());
}

#[test]
fn wire_form_round_trips_and_uses_named_fields() {
    let m = Message::new()
        .build_router("a", "b", "ns/pod/x", "insert")
        .with_content(doc(
            json!({"spec": {"containers": [{"name": "c", "image": "busybox"}]}}),
        ));
    let bytes = m.to_bytes().expect("encode");
    assert_eq!(Message::from_bytes(&bytes).expect("decode"), m);
    // Named fields: the field names travel on the wire.
    let needle = b"resource_version";
    assert!(bytes.windows(needle.len()).any(|w| w == needle));
}

#[test]
fn the_wire_form_is_rmp_serdes_named_encoding_whatever_the_content() {
    let long = "x".repeat(70_000);
    for content in [
        Content::Empty,
        Content::text("OK"),
        Content::text(long.as_str()),
        doc(json!({"spec": {"containers": [{"name": "c", "image": "busybox"}]}})),
        doc(json!([1, -2, 3.5, null, {"k": "v"}])),
    ] {
        let m = Message::new()
            .build_router("a", "b", "ns/pod/x", "insert")
            .with_parent(Uuid::new_v4())
            .with_content(content);
        let bytes = m.to_bytes().expect("encode");
        assert_eq!(bytes, rmp_serde::to_vec_named(&m).expect("rmp-serde"));
        assert_eq!(Message::from_bytes(&bytes).expect("decode"), m);
    }
}

#[test]
fn garbage_is_a_decode_error_not_a_panic() {
    for bad in [
        &b""[..],
        b"\xff\xff\xff",
        b"\x93\x01\x02",
        b"\xdf\xff\xff\xff\xff",
    ] {
        assert!(matches!(
            Message::from_bytes(bad),
            Err(MessageError::Decode(_))
        ));
    }
}

#[test]
fn error_response_names_the_reason() {
    let req = Message::new().build_router("edged", "meta", "default/pod/a", "query");
    let err = req.error_response("metamanager", "not found");
    assert_eq!(err.operation(), operation::ERROR);
    assert_eq!(err.parent_id(), Some(req.id()));
    assert_eq!(err.destination(), "edged");
    assert_eq!(err.content(), &Content::text("not found"));
}
