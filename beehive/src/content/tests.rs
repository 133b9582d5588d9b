use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::*;
use crate::Message;

fn doc(value: Value) -> Content {
    Content::of(&value).expect("encodable")
}

#[test]
fn a_body_is_sorted_into_empty_text_or_document_however_it_was_made() {
    assert_eq!(doc(Value::Null), Content::Empty);
    assert_eq!(Content::of(&()).expect("unit"), Content::Empty);
    assert_eq!(Content::of(&None::<u8>).expect("none"), Content::Empty);
    assert_eq!(doc(json!("OK")), Content::text("OK"));
    assert_eq!(Content::of("OK").expect("str"), Content::from("OK"));
    // A long string is still text (msgpack's str8/16 markers).
    let long = "x".repeat(70_000);
    assert_eq!(Content::of(&long).expect("long"), Content::Text(long));
    for value in [
        json!(1),
        json!(-3),
        json!(1.5),
        json!(true),
        json!([1, "a"]),
        json!({"a": {}}),
    ] {
        let content = doc(value.clone());
        assert!(matches!(content, Content::Document(_)), "{value}");
        assert_eq!(content.decode::<Value>().expect("decode"), value);
    }
}

#[test]
fn a_typed_body_reads_back_as_its_type_and_as_json() {
    #[derive(Serialize, Deserialize, PartialEq, Debug)]
    struct Status {
        phase: String,
        #[serde(rename = "podIP")]
        pod_ip: Option<String>,
        restarts: u32,
        #[serde(flatten)]
        rest: std::collections::BTreeMap<String, Value>,
    }
    let status = Status {
        phase: "Running".into(),
        pod_ip: None,
        restarts: 2,
        rest: [("hostIP".to_owned(), json!("10.0.0.2"))].into(),
    };
    let content = Content::of(&status).expect("encode");
    assert_eq!(content.decode::<Status>().expect("typed"), status);
    assert_eq!(
        content.decode::<Value>().expect("json"),
        json!({"phase": "Running", "podIP": null, "restarts": 2, "hostIP": "10.0.0.2"})
    );
    // Read as something it is not: a clear error, not a panic.
    assert!(matches!(
        content.decode::<Vec<u8>>(),
        Err(MessageError::Read(_))
    ));
    assert!(matches!(
        Content::text("x").decode::<u32>(),
        Err(MessageError::Read(_))
    ));
    // Text and empty read as their JSON forms.
    assert_eq!(Content::text("x").decode::<String>().expect("text"), "x");
    assert_eq!(
        Content::text("x").decode::<Value>().expect("text"),
        json!("x")
    );
    assert_eq!(
        Content::Empty.decode::<Option<String>>().expect("none"),
        None
    );
    assert_eq!(Content::Empty.decode::<Value>().expect("null"), Value::Null);
}

#[test]
fn the_wire_forms_write_the_value_and_read_back_the_same_content() {
    let object = json!({"kind": "Pod", "metadata": {"name": "web", "labels": {"a": "b"}},
        "spec": {"containers": [{"name": "c", "image": "busybox", "args": ["-c", "sleep 1"]}]},
        "n": [1, -2, 3.25, true, null]});
    for content in [Content::Empty, Content::text("OK"), doc(object.clone())] {
        // MessagePack, as the edgehive link and the stores write it: the
        // same bytes as the value itself would make.
        let packed = rmp_serde::to_vec_named(&content).expect("msgpack");
        let as_value =
            rmp_serde::to_vec_named(&content.decode::<Value>().expect("value")).expect("msgpack");
        assert_eq!(packed, as_value);
        assert_eq!(
            rmp_serde::from_slice::<Content>(&packed).expect("back"),
            content
        );
        // JSON, as KubeEdge's link writes it.
        let json = serde_json::to_vec(&content).expect("json");
        assert_eq!(
            serde_json::from_slice::<Value>(&json).expect("value"),
            content.decode::<Value>().expect("value")
        );
        assert_eq!(
            serde_json::from_slice::<Content>(&json).expect("back"),
            content
        );
    }
    // Inside a message, through its own wire form.
    let msg = Message::new().with_content(doc(object.clone()));
    let back = Message::from_bytes(&msg.to_bytes().expect("encode")).expect("decode");
    assert_eq!(back.body::<Value>().expect("body"), object);
    assert_eq!(back, msg);
}

#[test]
fn display_is_compact_json() {
    assert_eq!(Content::Empty.to_string(), "null");
    assert_eq!(Content::text("a\"b").to_string(), r#""a\"b""#);
    assert_eq!(doc(json!({"a": [1, 2]})).to_string(), r#"{"a":[1,2]}"#);
}

#[test]
fn random_json_round_trips_through_both_wire_forms() {
    fn random(rng: &mut fastrand::Rng, depth: u32) -> Value {
        match rng.u8(0..if depth > 3 { 5 } else { 7 }) {
            0 => Value::Null,
            1 => json!(rng.bool()),
            2 => json!(rng.i64(..)),
            3 => json!(rng.u64(..)),
            4 => json!(
                (0..rng.usize(0..40))
                    .map(|_| rng.alphanumeric())
                    .collect::<String>()
            ),
            5 => Value::Array(
                (0..rng.usize(0..5))
                    .map(|_| random(rng, depth + 1))
                    .collect(),
            ),
            _ => Value::Object(
                (0..rng.usize(0..5))
                    .map(|i| (format!("k{i}"), random(rng, depth + 1)))
                    .collect(),
            ),
        }
    }
    let seed = fastrand::u64(..);
    let mut rng = fastrand::Rng::with_seed(seed);
    for _ in 0..500 {
        let value = random(&mut rng, 0);
        let content = doc(value.clone());
        assert_eq!(
            content.decode::<Value>().expect("decode"),
            value,
            "seed {seed}"
        );
        let packed = rmp_serde::to_vec_named(&content).expect("msgpack");
        assert_eq!(
            rmp_serde::from_slice::<Content>(&packed).expect("back"),
            content,
            "seed {seed}"
        );
        let json = serde_json::to_vec(&content).expect("json");
        assert_eq!(
            serde_json::from_slice::<Value>(&json).expect("value"),
            value,
            "seed {seed}"
        );
    }
}
