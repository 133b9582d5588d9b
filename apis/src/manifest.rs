//! Reading Kubernetes manifests: YAML (one or more documents) or JSON, a
//! single object or a `List`. Every object is checked before any is used,
//! so a bad manifest changes nothing.

use serde::Deserialize;
use serde_json::Value;
use serde_json::value::RawValue;

use crate::api::ApiError;
use crate::kinds::{Kind, valid_label, valid_name};
use crate::object::Object;

/// Kinds a manifest may carry (nodes join; they are not applied).
pub const APPLICABLE: [Kind; 7] = [
    Kind::Pod,
    Kind::ConfigMap,
    Kind::Secret,
    Kind::Service,
    Kind::Endpoints,
    Kind::Device,
    Kind::DeviceModel,
];

/// How deep `[...]` and `{...}` (YAML's flow collections, and so all of
/// JSON) may nest in a manifest. The YAML scanner's work per token grows
/// with the depth of flow nesting (some 100,000 instructions per level,
/// measured with callgrind at 4,000 and 8,000 levels): 32,000 `[` cost
/// 1.7 s of CPU, 200,000 over 20 s, so a manifest at the admin API's 8 MiB
/// limit would hold a core for many minutes. Kubernetes objects nest a
/// dozen levels.
pub const MAX_FLOW_DEPTH: usize = 64;

/// The objects in `body`, each checked, with namespaces defaulted.
pub fn parse(body: &[u8]) -> Result<Vec<Object>, ApiError> {
    let mut objects = Vec::new();
    for_each(body, |object| {
        objects.push(object);
        Ok(())
    })?;
    Ok(objects)
}

/// Reads `body` object by object: each is checked (namespace defaulted) and
/// handed to `take` before the next is parsed, so a caller that keeps them
/// compactly never holds the manifest as trees all at once (a JSON List's
/// items are located first and parsed one at a time). The first error,
/// the manifest's or `take`'s, stops the read; the number of objects read.
pub fn for_each(
    body: &[u8],
    mut take: impl FnMut(Object) -> Result<(), ApiError>,
) -> Result<usize, ApiError> {
    let text = std::str::from_utf8(body)
        .map_err(|_| ApiError::BadRequest("the manifest is not UTF-8 text".to_owned()))?;
    check_flow_depth(text)?;
    let mut count = 0;
    let mut each = |object: Value| {
        count += 1;
        let object = check(object).map_err(|reason| match reason {
            ApiError::Invalid(reason) => ApiError::Invalid(format!("object {count}: {reason}")),
            other => other,
        })?;
        take(object)
    };
    match json_document(text) {
        Some(JsonDocument::List(items)) => {
            for item in items {
                let object = serde_json::from_str(item.get())
                    .map_err(|err| ApiError::BadRequest(format!("document 1: {err}")))?;
                each(object)?;
            }
        }
        Some(JsonDocument::Object(object)) => document(0, object, &mut each)?,
        None => {
            for (index, read) in serde_yaml_ng::Deserializer::from_str(text).enumerate() {
                let object = Value::deserialize(read).map_err(|err| {
                    ApiError::BadRequest(format!("document {}: {err}", index + 1))
                })?;
                document(index, object, &mut each)?;
            }
        }
    }
    if count == 0 {
        return Err(ApiError::BadRequest(
            "the manifest holds no object".to_owned(),
        ));
    }
    Ok(count)
}

/// Hands the objects of document `index` to `each`: none (an empty
/// document), a List's items, or the document itself.
fn document(
    index: usize,
    object: Value,
    each: &mut impl FnMut(Value) -> Result<(), ApiError>,
) -> Result<(), ApiError> {
    match object {
        Value::Null => Ok(()),
        Value::Object(mut map) if map.get("kind").and_then(Value::as_str) == Some("List") => {
            // Moved out, not copied: a List of thousands of objects is
            // held once.
            let Some(Value::Array(items)) = map.remove("items") else {
                return Err(ApiError::Invalid(format!(
                    "document {}: a List needs items",
                    index + 1
                )));
            };
            items.into_iter().try_for_each(each)
        }
        other => each(other),
    }
}

/// One JSON value, read as JSON (lighter and faster than through the YAML
/// parser, which holds a document's events whole).
enum JsonDocument<'a> {
    /// A `List`: where each item's text is, none of them parsed yet.
    List(Vec<&'a RawValue>),
    Object(Value),
}

/// The top of a JSON document, its items located but not parsed.
#[derive(Deserialize)]
struct JsonTop<'a> {
    #[serde(default, borrow)]
    kind: Option<std::borrow::Cow<'a, str>>,
    #[serde(default, borrow)]
    items: Option<&'a RawValue>,
}

/// `text` as one JSON value, or `None` if it is not one (it is then read
/// as YAML, whose error says what is wrong).
fn json_document(text: &str) -> Option<JsonDocument<'_>> {
    if !text.trim_start().starts_with('{') {
        return None;
    }
    let top: JsonTop<'_> = serde_json::from_str(text).ok()?;
    if top.kind.as_deref() == Some("List")
        && let Some(items) = top.items
        && let Ok(items) = serde_json::from_str::<Vec<&RawValue>>(items.get())
    {
        return Some(JsonDocument::List(items));
    }
    serde_json::from_str(text).ok().map(JsonDocument::Object)
}

/// Refuses flow collections nested deeper than [`MAX_FLOW_DEPTH`], before
/// the YAML scanner sees them. Brackets are counted wherever they are,
/// inside quoted or block scalars too: that can only overcount, so nothing
/// deeper slips through, and text rarely opens 64 brackets it never closes.
fn check_flow_depth(text: &str) -> Result<(), ApiError> {
    let mut depth = 0usize;
    for byte in text.bytes() {
        match byte {
            b'[' | b'{' => {
                depth += 1;
                if depth > MAX_FLOW_DEPTH {
                    return Err(ApiError::BadRequest(format!(
                        "the manifest nests [ ] and {{ }} deeper than {MAX_FLOW_DEPTH} levels"
                    )));
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    Ok(())
}

/// Checks one object and fills in its namespace.
pub fn check(mut object: Value) -> Result<Object, ApiError> {
    let invalid = |reason: String| ApiError::Invalid(reason);
    let Some(map) = object.as_object() else {
        return Err(invalid("not an object".to_owned()));
    };
    let kind_name = map.get("kind").and_then(Value::as_str).unwrap_or_default();
    let kind = Kind::from_name(kind_name)
        .filter(|kind| APPLICABLE.contains(kind))
        .ok_or_else(|| {
            let known: Vec<&str> = APPLICABLE.iter().map(|k| k.name()).collect();
            invalid(format!(
                "kind {kind_name:?} is not one of {}",
                known.join(", ")
            ))
        })?;
    let api_version = map.get("apiVersion").and_then(Value::as_str);
    if api_version != Some(kind.api_version()) {
        return Err(invalid(format!(
            "{kind}: apiVersion must be {:?}, not {api_version:?}",
            kind.api_version()
        )));
    }
    let name = map
        .get("metadata")
        .and_then(|m| m.get("name"))
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    let name_ok = if kind == Kind::Service {
        valid_label(&name) && name.starts_with(|c: char| c.is_ascii_lowercase())
    } else {
        valid_name(&name)
    };
    if !name_ok {
        return Err(invalid(format!(
            "{kind}: metadata.name {name:?} is not a valid name (lower-case letters, digits, '-' and '.')"
        )));
    }
    let namespace = map
        .get("metadata")
        .and_then(|m| m.get("namespace"))
        .and_then(Value::as_str)
        .unwrap_or("default")
        .to_owned();
    if !valid_label(&namespace) {
        return Err(invalid(format!(
            "{kind} {name}: metadata.namespace {namespace:?} is not a valid namespace"
        )));
    }
    kind.check(&object)
        .map_err(|err| invalid(format!("{kind} {name}: {}", err.reason)))?;
    match kind {
        Kind::Pod => check_pod(&name, &object)?,
        Kind::Device => check_device(&name, &object)?,
        Kind::ConfigMap | Kind::Secret => check_data_size(kind, &name, &object)?,
        _ => {}
    }
    if let Some(metadata) = object.get_mut("metadata").and_then(Value::as_object_mut) {
        metadata.insert("namespace".to_owned(), Value::String(namespace.clone()));
    }
    Object::new(object).map_err(|err| invalid(format!("{kind} {name}: {err}")))
}

/// What a ConfigMap's or a Secret's data may hold at most, in bytes
/// (Kubernetes' `MaxSecretSize`, which ConfigMaps share).
pub const MAX_DATA_BYTES: usize = 1024 * 1024;

/// A ConfigMap's data (its `data` values and decoded `binaryData`) or a
/// Secret's (its decoded `data`, with `stringData` in place of the keys it
/// sets) is at most [`MAX_DATA_BYTES`], refused as kube-apiserver words it.
fn check_data_size(kind: Kind, name: &str, object: &Value) -> Result<(), ApiError> {
    let values = |field: &str| {
        object
            .get(field)
            .and_then(Value::as_object)
            .into_iter()
            .flatten()
            .map(|(key, value)| (key.as_str(), value.as_str().unwrap_or_default()))
    };
    let (total, field) = match kind {
        Kind::ConfigMap => (
            values("data").map(|(_, v)| v.len()).sum::<usize>()
                + values("binaryData")
                    .map(|(_, v)| decoded_len(v))
                    .sum::<usize>(),
            "[]",
        ),
        _ => {
            let string_data: std::collections::BTreeMap<&str, usize> =
                values("stringData").map(|(k, v)| (k, v.len())).collect();
            let data = values("data")
                .filter(|(key, _)| !string_data.contains_key(key))
                .map(|(_, v)| decoded_len(v))
                .sum::<usize>();
            (data + string_data.values().sum::<usize>(), "data")
        }
    };
    if total > MAX_DATA_BYTES {
        return Err(ApiError::Invalid(format!(
            "{kind} {name:?} is invalid: {field}: Too long: may not be more than {MAX_DATA_BYTES} bytes"
        )));
    }
    Ok(())
}

/// The length of what base64 text `encoded` decodes to (not checked here).
fn decoded_len(encoded: &str) -> usize {
    let padding = encoded
        .bytes()
        .rev()
        .take_while(|b| *b == b'=')
        .count()
        .min(2);
    (encoded.len() / 4 * 3).saturating_sub(padding)
}

/// `spec.nodeName`, when set, must name a node.
fn check_node_name(kind: Kind, name: &str, object: &Value) -> Result<(), ApiError> {
    if let Some(node) = object.get("spec").and_then(|s| s.get("nodeName")) {
        let node = node.as_str().unwrap_or_default();
        if !node.is_empty() && !valid_name(node) {
            return Err(ApiError::Invalid(format!(
                "{kind} {name}: spec.nodeName {node:?} is not a valid node name"
            )));
        }
    }
    Ok(())
}

/// A device's model reference and property names must be names (they
/// appear in MQTT topics and twin documents), each property once.
fn check_device(name: &str, device: &Value) -> Result<(), ApiError> {
    check_node_name(Kind::Device, name, device)?;
    if let Some(model) = device["spec"]["deviceModelRef"]["name"].as_str()
        && !valid_name(model)
    {
        return Err(ApiError::Invalid(format!(
            "Device {name}: spec.deviceModelRef.name {model:?} is not a valid name"
        )));
    }
    let mut seen = std::collections::BTreeSet::new();
    for (index, property) in device["spec"]["properties"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
    {
        let property = property["name"].as_str().unwrap_or_default();
        if property.is_empty() || property.contains(['/', '+', '#']) {
            return Err(ApiError::Invalid(format!(
                "Device {name}: spec.properties[{index}].name {property:?} is not a property name"
            )));
        }
        if !seen.insert(property) {
            return Err(ApiError::Invalid(format!(
                "Device {name}: property {property:?} is listed twice"
            )));
        }
    }
    Ok(())
}

fn check_pod(name: &str, pod: &Value) -> Result<(), ApiError> {
    check_node_name(Kind::Pod, name, pod)?;
    let containers = pod
        .get("spec")
        .and_then(|s| s.get("containers"))
        .and_then(Value::as_array)
        .filter(|c| !c.is_empty())
        .ok_or_else(|| {
            ApiError::Invalid(format!("Pod {name}: spec.containers must not be empty"))
        })?;
    for (index, container) in containers.iter().enumerate() {
        let field = |f: &str| container.get(f).and_then(Value::as_str).unwrap_or_default();
        if !valid_label(field("name")) {
            return Err(ApiError::Invalid(format!(
                "Pod {name}: spec.containers[{index}].name {:?} is not a valid name",
                field("name")
            )));
        }
        if field("image").is_empty() {
            return Err(ApiError::Invalid(format!(
                "Pod {name}: spec.containers[{index}].image is required"
            )));
        }
    }
    // Init container and volume names end up in paths and labels at the
    // edge: DNS labels only.
    for field in ["initContainers", "volumes"] {
        let listed = pod
            .get("spec")
            .and_then(|s| s.get(field))
            .and_then(Value::as_array);
        for (index, item) in listed.into_iter().flatten().enumerate() {
            let item_name = item.get("name").and_then(Value::as_str).unwrap_or_default();
            if !valid_label(item_name) {
                return Err(ApiError::Invalid(format!(
                    "Pod {name}: spec.{field}[{index}].name {item_name:?} is not a valid name"
                )));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn configmap_and_secret_data_is_at_most_a_mebibyte_as_in_kubernetes() {
        use serde_json::json;
        let configmap = |data: Value, binary: Value| {
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "big"},
                   "data": data, "binaryData": binary})
        };
        let mib = MAX_DATA_BYTES;
        assert!(check(configmap(json!({"a": "x".repeat(mib)}), json!({}))).is_ok());
        let refused = check(configmap(
            json!({"a": "x".repeat(mib - 2)}),
            json!({"b": "AAAA"}),
        ))
        .expect_err("one byte over, counted decoded");
        assert_eq!(
            refused.to_string(),
            ApiError::Invalid(format!(
                "ConfigMap \"big\" is invalid: []: Too long: may not be more than {mib} bytes"
            ))
            .to_string()
        );
        let secret = |data: Value, string_data: Value| {
            json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "big"},
                   "data": data, "stringData": string_data})
        };
        // Base64 longer than a mebibyte that decodes to one is accepted.
        let encoded = "A".repeat(mib / 3 * 4) + "AA==";
        assert_eq!(decoded_len(&encoded), mib);
        assert!(check(secret(json!({"a": encoded}), json!({}))).is_ok());
        // stringData counts, and replaces the data key it sets.
        let over = secret(json!({"a": "AAAA"}), json!({"b": "x".repeat(mib - 2)}));
        let refused = check(over).expect_err("one byte over");
        assert!(refused.to_string().contains("data: Too long"), "{refused}");
        let replaced = secret(json!({"b": "AAAA"}), json!({"b": "x".repeat(mib)}));
        assert!(check(replaced).is_ok());
    }

    #[test]
    fn yaml_documents_and_json_lists_are_read() {
        let yaml = b"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: a\ndata:\n  k: v\n---\n---\napiVersion: v1\nkind: Pod\nmetadata:\n  name: web\n  namespace: shop\nspec:\n  nodeName: n1\n  containers:\n  - name: c\n    image: busybox\n";
        let objects = parse(yaml).expect("parse");
        let keys: Vec<String> = objects.iter().map(|o| o.key().to_string()).collect();
        assert_eq!(keys, ["configmaps/default/a", "pods/shop/web"]);
        assert_eq!(objects[0].json()["metadata"]["namespace"], "default");
        let json = br#"{"apiVersion":"v1","kind":"List","items":[{"apiVersion":"v1","kind":"Secret","metadata":{"name":"s"}}]}"#;
        assert_eq!(
            parse(json).expect("parse")[0].key().to_string(),
            "secrets/default/s"
        );
    }

    #[test]
    fn a_json_list_is_read_item_by_item_and_stops_at_the_first_refusal() {
        let cm = |name: &str| {
            format!(r#"{{"apiVersion":"v1","kind":"ConfigMap","metadata":{{"name":"{name}"}}}}"#)
        };
        // Items before kind, as kubectl prints a List.
        let json = format!(
            r#"{{"apiVersion":"v1","items":[{},{},{}],"kind":"List","metadata":{{}}}}"#,
            cm("a"),
            cm("b"),
            cm("c")
        );
        let mut seen = Vec::new();
        let err = for_each(json.as_bytes(), |object| {
            seen.push(object.key().name.clone());
            match object.key().name.as_str() {
                "b" => Err(ApiError::Conflict("stop here".to_owned())),
                _ => Ok(()),
            }
        })
        .expect_err("stopped");
        assert!(err.to_string().contains("stop here"), "{err}");
        assert_eq!(seen, ["a", "b"]);
        assert_eq!(for_each(json.as_bytes(), |_| Ok(())).expect("read"), 3);

        let bad = format!(
            r#"{{"kind":"List","items":[{},{{"apiVersion":"v1","kind":"Pod","metadata":{{"name":"x"}}}}]}}"#,
            cm("a")
        );
        let err = parse(bad.as_bytes()).expect_err("refused").to_string();
        assert!(err.contains("object 2"), "{err}");
        let err = parse(br#"{"kind":"List","items":null}"#)
            .expect_err("refused")
            .to_string();
        assert!(err.contains("a List needs items"), "{err}");
    }

    /// Found while fuzzing: deep flow nesting made the YAML scanner's
    /// work quadratic; it is refused before the scanner runs, in YAML and
    /// JSON alike, and deep but legal nesting still reads.
    #[test]
    fn deep_flow_nesting_is_refused_before_parsing() {
        for body in ["[".repeat(200_000), "{\"a\":".repeat(100_000)] {
            let started = std::time::Instant::now();
            let err = parse(body.as_bytes()).expect_err("refused").to_string();
            assert!(err.contains("deeper than 64"), "{err}");
            assert!(started.elapsed() < std::time::Duration::from_secs(1));
        }
        let nested = format!(
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: a}}\ndata: {{k: '{}{}'}}\n",
            "[".repeat(40),
            "]".repeat(40)
        );
        parse(nested.as_bytes()).expect("40 levels in a string read");
    }

    #[test]
    fn bad_manifests_say_what_is_wrong() {
        let cases: [(&[u8], &str); 10] = [
            (b"apiVersion: v1\nkind: Pod\nmetadata: {name: web}\nspec: {containers: [{name: c, image: i}], volumes: [{name: /etc, emptyDir: {}}]}\n", "spec.volumes[0].name"),
            (b"apiVersion: v1\nkind: Pod\nmetadata: {name: web}\nspec: {nodeName: a/b, containers: [{name: c, image: i}]}\n", "spec.nodeName"),
            (b"kind: [", "document 1"),
            (b"", "no object"),
            (b"apiVersion: v1\nkind: Deployment\nmetadata: {name: a}\n", "Deployment"),
            (b"apiVersion: v2\nkind: Pod\nmetadata: {name: a}\n", "apiVersion"),
            (b"apiVersion: v1\nkind: Pod\nmetadata: {name: Web}\nspec: {containers: [{name: c, image: i}]}\n", "metadata.name"),
            (b"apiVersion: v1\nkind: Pod\nmetadata: {name: web}\nspec: {containers: []}\n", "spec.containers"),
            (b"apiVersion: v1\nkind: Pod\nmetadata: {name: web}\nspec: {containers: [{name: c}]}\n", "image"),
            (b"apiVersion: v1\nkind: Pod\nmetadata: {name: web}\nspec: {containers: 3}\n", "Pod web"),
        ];
        for (body, expected) in cases {
            let err = parse(body).expect_err(expected).to_string();
            assert!(
                err.contains(expected),
                "{err:?} should mention {expected:?}"
            );
        }
    }
}
