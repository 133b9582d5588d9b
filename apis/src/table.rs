//! Objects as rows of kubectl's tables: the columns each kind shows (as
//! kube-apiserver's printers give them, `-o wide`'s marked) and each
//! object's cells. One piece serving two: the Kubernetes-shaped APIs answer
//! kubectl's `as=Table` requests with a `meta.k8s.io/v1` `Table` built
//! here, and edgehivectl prints its tables from the same columns.
//!
//! One concern: what a kind's table shows.

use serde_json::{Value, json};

use crate::kinds::Kind;

/// One column after NAME.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Column {
    /// Its heading, as kube-apiserver names it (kubectl upper-cases it).
    pub name: &'static str,
    /// `string` or `integer`.
    pub kind: &'static str,
    /// Shown only with `-o wide` (priority 1).
    pub wide: bool,
    /// What it shows.
    pub description: &'static str,
}

const fn column(name: &'static str, description: &'static str) -> Column {
    Column {
        name,
        kind: "string",
        wide: false,
        description,
    }
}

const fn wide(name: &'static str, description: &'static str) -> Column {
    Column {
        name,
        kind: "string",
        wide: true,
        description,
    }
}

const AGE: Column = column("Age", "Time since the object was created.");

/// The columns of `kind` after NAME, `-o wide`'s among them.
pub fn columns(kind: Kind) -> &'static [Column] {
    const POD: &[Column] = &[
        column("Ready", "Ready containers of all."),
        column("Status", "The pod's phase, or why a container waits."),
        Column {
            name: "Restarts",
            kind: "integer",
            wide: false,
            description: "Container restarts.",
        },
        AGE,
        wide("IP", "The pod's IP address."),
        wide("Node", "The node it is bound to."),
    ];
    const NODE: &[Column] = &[
        column("Status", "Ready, NotReady or Unknown."),
        column("Roles", "The node's roles."),
        AGE,
        column("Version", "The node's kubelet version."),
        wide("Internal-IP", "The node's internal address."),
        wide("OS-Image", "The node's operating system."),
    ];
    const CONFIGMAP: &[Column] = &[column("Data", "Keys held."), AGE];
    const SECRET: &[Column] = &[
        column("Type", "The secret's type."),
        column("Data", "Keys held."),
        AGE,
    ];
    const SERVICE: &[Column] = &[
        column("Type", "The service's type."),
        column("Cluster-IP", "Its cluster IP."),
        column("Port(s)", "Its ports."),
        AGE,
    ];
    const ENDPOINTS: &[Column] = &[column("Endpoints", "Addresses and ports."), AGE];
    const DEVICE: &[Column] = &[
        column("Model", "Its device model."),
        column("Node", "The node it is bound to."),
        column("State", "The state its mapper reports."),
        column("Twins", "Reported twins."),
        AGE,
        wide("Protocol", "The protocol its mapper speaks."),
    ];
    const DEVICE_MODEL: &[Column] = &[
        column("Properties", "Properties defined."),
        column("Protocol", "The protocol of its devices."),
        AGE,
    ];
    match kind {
        Kind::Pod => POD,
        Kind::Node => NODE,
        Kind::ConfigMap => CONFIGMAP,
        Kind::Secret => SECRET,
        Kind::Service => SERVICE,
        Kind::Endpoints => ENDPOINTS,
        Kind::Device => DEVICE,
        Kind::DeviceModel => DEVICE_MODEL,
    }
}

/// `object`'s cells for [`columns`] of `kind`, one per column, at `now`
/// (seconds since the epoch, for AGE).
pub fn cells(kind: Kind, object: &Value, now: i64) -> Vec<Value> {
    let text = |path: &[&str]| Value::String(or_none(str_at(object, path)));
    let age = Value::String(age(object, now));
    match kind {
        Kind::Pod => {
            let (ready, status, restarts) = pod_state(object);
            vec![
                ready.into(),
                status.into(),
                restarts.into(),
                age,
                text(&["status", "podIP"]),
                text(&["spec", "nodeName"]),
            ]
        }
        Kind::Node => {
            let ip = object["status"]["addresses"]
                .as_array()
                .and_then(|a| a.iter().find(|a| a["type"] == "InternalIP"))
                .map(|a| str_at(a, &["address"]).to_owned())
                .unwrap_or_default();
            vec![
                ready_status(object).into(),
                "edge".into(),
                age,
                text(&["status", "nodeInfo", "kubeletVersion"]),
                or_none(&ip).into(),
                text(&["status", "nodeInfo", "osImage"]),
            ]
        }
        Kind::ConfigMap => vec![
            (count(&object["data"]) + count(&object["binaryData"])).into(),
            age,
        ],
        Kind::Secret => {
            let kind = str_at(object, &["type"]);
            vec![
                if kind.is_empty() { "Opaque" } else { kind }.into(),
                secret_keys(object).into(),
                age,
            ]
        }
        Kind::Service => {
            let kind = str_at(object, &["spec", "type"]);
            let ports: Vec<String> = object["spec"]["ports"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|p| {
                    let protocol = p["protocol"].as_str().unwrap_or("TCP");
                    format!("{}/{protocol}", p["port"])
                })
                .collect();
            vec![
                if kind.is_empty() { "ClusterIP" } else { kind }.into(),
                text(&["spec", "clusterIP"]),
                or_none(&ports.join(",")).into(),
                age,
            ]
        }
        Kind::Endpoints => {
            let mut addresses = Vec::new();
            for subset in object["subsets"].as_array().into_iter().flatten() {
                for address in subset["addresses"].as_array().into_iter().flatten() {
                    for port in subset["ports"].as_array().into_iter().flatten() {
                        addresses.push(format!("{}:{}", str_at(address, &["ip"]), port["port"]));
                    }
                }
            }
            vec![or_none(&addresses.join(",")).into(), age]
        }
        Kind::Device => vec![
            text(&["spec", "deviceModelRef", "name"]),
            text(&["spec", "nodeName"]),
            text(&["status", "state"]),
            object["status"]["twins"]
                .as_array()
                .map_or(0, Vec::len)
                .into(),
            age,
            text(&["spec", "protocol", "protocolName"]),
        ],
        Kind::DeviceModel => vec![
            object["spec"]["properties"]
                .as_array()
                .map_or(0, Vec::len)
                .into(),
            text(&["spec", "protocol"]),
            age,
        ],
    }
}

/// A `meta.k8s.io/v1` `Table` of `objects` of `kind`, as kube-apiserver
/// answers `Accept: application/json;as=Table;v=v1;g=meta.k8s.io`: NAME
/// and [`columns`], a row per object with its metadata
/// (`PartialObjectMetadata`, which kubectl reads namespaces and labels
/// from).
pub fn table<'a>(
    kind: Kind,
    objects: impl IntoIterator<Item = &'a Value>,
    resource_version: &str,
    now: i64,
) -> Value {
    let mut definitions = vec![json!({
        "name": "Name", "type": "string", "format": "name", "priority": 0,
        "description": "The object's name.",
    })];
    definitions.extend(columns(kind).iter().map(|column| {
        json!({
            "name": column.name, "type": column.kind, "format": "",
            "priority": u8::from(column.wide), "description": column.description,
        })
    }));
    let rows: Vec<Value> = objects
        .into_iter()
        .map(|object| {
            let mut cells = vec![Value::String(
                str_at(object, &["metadata", "name"]).to_owned(),
            )];
            cells.extend(self::cells(kind, object, now));
            json!({
                "cells": cells,
                "object": {
                    "kind": "PartialObjectMetadata",
                    "apiVersion": "meta.k8s.io/v1",
                    "metadata": object["metadata"],
                },
            })
        })
        .collect();
    json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {"resourceVersion": resource_version},
        "columnDefinitions": definitions,
        "rows": rows,
    })
}

/// Whether an `Accept` header asks for a `Table` (kubectl's `get`).
pub fn wants_table(accept: &str) -> bool {
    accept
        .split(',')
        .next()
        .is_some_and(|first| first.contains("as=Table") && first.contains("g=meta.k8s.io"))
}

/// The string at `path` of `value`, or "".
pub fn str_at<'a>(value: &'a Value, path: &[&str]) -> &'a str {
    let mut at = value;
    for key in path {
        at = &at[*key];
    }
    at.as_str().unwrap_or("")
}

/// How long ago the object was created, as kubectl shows it.
pub fn age(object: &Value, now: i64) -> String {
    let created = str_at(object, &["metadata", "creationTimestamp"]);
    let Ok(created) = created.parse::<jiff::Timestamp>() else {
        return "<unknown>".to_owned();
    };
    match (now - created.as_second()).max(0) {
        s if s < 120 => format!("{s}s"),
        s if s < 7200 => format!("{}m", s / 60),
        s if s < 172_800 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86_400),
    }
}

/// A node's `Ready` condition as `Ready`, `NotReady` or `Unknown`.
pub fn ready_status(node: &Value) -> String {
    let ready = node["status"]["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == "Ready"))
        .map(|c| str_at(c, &["status"]).to_owned());
    match ready.as_deref() {
        Some("True") => "Ready".to_owned(),
        Some("False") => "NotReady".to_owned(),
        _ => "Unknown".to_owned(),
    }
}

/// A pod's READY (`ready/all`), STATUS (the phase, or why a container
/// waits) and RESTARTS.
pub fn pod_state(pod: &Value) -> (String, String, u64) {
    let statuses = pod["status"]["containerStatuses"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default();
    let total = pod["spec"]["containers"].as_array().map_or(0, Vec::len);
    let ready = statuses.iter().filter(|s| s["ready"] == true).count();
    let restarts = statuses
        .iter()
        .filter_map(|s| s["restartCount"].as_u64())
        .sum();
    let waiting = statuses
        .iter()
        .find_map(|s| s["state"]["waiting"]["reason"].as_str());
    let phase = waiting
        .or_else(|| pod["status"]["phase"].as_str())
        .unwrap_or("Unknown");
    (format!("{ready}/{total}"), phase.to_owned(), restarts)
}

/// The keys a Secret holds: `data`'s, and `stringData`'s not among them.
fn secret_keys(secret: &Value) -> usize {
    let data = secret["data"].as_object();
    let extra = secret["stringData"]
        .as_object()
        .into_iter()
        .flatten()
        .filter(|(key, _)| data.is_none_or(|data| !data.contains_key(*key)))
        .count();
    count(&secret["data"]) + extra
}

/// The entries of a JSON object (0 for anything else).
pub fn count(value: &Value) -> usize {
    value.as_object().map_or(0, serde_json::Map::len)
}

/// `text`, or `<none>` when empty, as kubectl shows a missing value.
pub fn or_none(text: &str) -> String {
    if text.is_empty() {
        "<none>".to_owned()
    } else {
        text.to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_has_a_cell_per_column() {
        let object =
            json!({"metadata": {"name": "x", "creationTimestamp": "2026-01-01T00:00:00Z"}});
        for kind in Kind::ALL {
            assert_eq!(
                cells(kind, &object, 0).len(),
                columns(kind).len(),
                "{kind:?}"
            );
        }
    }

    #[test]
    fn a_pod_row_reads_as_kubectl_shows_it() {
        let pod = json!({
            "metadata": {"name": "web", "namespace": "shop", "labels": {"app": "web"},
                         "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"nodeName": "edge-1", "containers": [{"name": "a"}, {"name": "b"}]},
            "status": {"phase": "Running", "podIP": "10.0.0.5", "containerStatuses": [
                {"name": "a", "ready": true, "restartCount": 2},
                {"name": "b", "ready": false, "restartCount": 1,
                 "state": {"waiting": {"reason": "CrashLoopBackOff"}}}]},
        });
        let now = "2026-01-01T00:05:00Z"
            .parse::<jiff::Timestamp>()
            .expect("a time")
            .as_second();
        let table = table(Kind::Pod, [&pod], "7", now);
        let names: Vec<&str> = table["columnDefinitions"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|c| c["name"].as_str())
            .collect();
        assert_eq!(
            names,
            ["Name", "Ready", "Status", "Restarts", "Age", "IP", "Node"]
        );
        assert_eq!(table["columnDefinitions"][5]["priority"], 1);
        assert_eq!(
            table["rows"][0]["cells"],
            json!([
                "web",
                "1/2",
                "CrashLoopBackOff",
                3,
                "5m",
                "10.0.0.5",
                "edge-1"
            ])
        );
        assert_eq!(
            table["rows"][0]["object"]["metadata"]["labels"]["app"],
            "web"
        );
        assert_eq!(table["metadata"]["resourceVersion"], "7");
    }

    #[test]
    fn kubectls_accept_header_asks_for_a_table() {
        assert!(wants_table(
            "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json"
        ));
        assert!(!wants_table("application/json"));
        assert!(!wants_table(
            "application/json, application/json;as=Table;v=v1;g=meta.k8s.io"
        ));
    }
}
