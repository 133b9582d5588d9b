//! Objects printed as kubectl prints them: tables (`get`, with `-o wide`)
//! and `describe`.

use apis::kinds::Kind;
use serde_json::Value;

pub(crate) use apis::table::{or_none, ready_status, str_at};

/// `items` as kubectl's table of `kind` (the columns `apis::table` gives,
/// the server's too), NAMESPACE first with `with_namespace`, `-o wide`'s
/// columns with `wide`.
pub(crate) fn print_table(kind: Kind, items: &[Value], with_namespace: bool, wide: bool) {
    let shown: Vec<bool> = apis::table::columns(kind)
        .iter()
        .map(|column| wide || !column.wide)
        .collect();
    let mut header: Vec<String> = Vec::new();
    if with_namespace && kind.namespaced() {
        header.push("NAMESPACE".to_owned());
    }
    header.push("NAME".to_owned());
    header.extend(
        apis::table::columns(kind)
            .iter()
            .zip(&shown)
            .filter(|(_, shown)| **shown)
            .map(|(column, _)| column.name.to_ascii_uppercase()),
    );
    let now = jiff::Timestamp::now().as_second();
    let mut rows = vec![header];
    for item in items {
        let mut row = Vec::new();
        if with_namespace && kind.namespaced() {
            row.push(str_at(item, &["metadata", "namespace"]).to_owned());
        }
        row.push(str_at(item, &["metadata", "name"]).to_owned());
        row.extend(
            apis::table::cells(kind, item, now)
                .into_iter()
                .zip(&shown)
                .filter(|(_, shown)| **shown)
                .map(|(cell, _)| match cell {
                    Value::String(text) => text,
                    other => other.to_string(),
                }),
        );
        rows.push(row);
    }
    let widths: Vec<usize> = (0..rows[0].len())
        .map(|c| {
            rows.iter()
                .map(|r| r.get(c).map_or(0, String::len))
                .max()
                .unwrap_or(0)
        })
        .collect();
    for row in rows {
        let line: Vec<String> = row
            .iter()
            .zip(&widths)
            .map(|(cell, width)| format!("{cell:<width$}"))
            .collect();
        println!("{}", line.join("   ").trim_end());
    }
}

pub(crate) fn labels(object: &Value) -> String {
    let labels: Vec<String> = object["metadata"]["labels"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or("")))
        .collect();
    or_none(&labels.join(","))
}

/// kubectl-style detail: the fields people look for first, then the
/// conditions.
pub(crate) fn describe(kind: Kind, object: &Value) -> String {
    let mut out = String::new();
    let mut line = |key: &str, value: String| out.push_str(&format!("{key:<16}{value}\n"));
    line("Name:", str_at(object, &["metadata", "name"]).to_owned());
    if kind.namespaced() {
        line(
            "Namespace:",
            str_at(object, &["metadata", "namespace"]).to_owned(),
        );
    }
    line("Labels:", labels(object));
    line(
        "Created:",
        or_none(str_at(object, &["metadata", "creationTimestamp"])),
    );
    line(
        "Version:",
        str_at(object, &["metadata", "resourceVersion"]).to_owned(),
    );
    match kind {
        Kind::Pod => {
            line("Node:", or_none(str_at(object, &["spec", "nodeName"])));
            line("Status:", or_none(str_at(object, &["status", "phase"])));
            line("IP:", or_none(str_at(object, &["status", "podIP"])));
            line("Containers:", String::new());
            let statuses = object["status"]["containerStatuses"].as_array();
            for container in object["spec"]["containers"]
                .as_array()
                .into_iter()
                .flatten()
            {
                let name = str_at(container, &["name"]);
                line(&format!("  {name}:"), String::new());
                line("    Image:", str_at(container, &["image"]).to_owned());
                let status = statuses.into_iter().flatten().find(|s| s["name"] == name);
                if let Some(status) = status {
                    let state = status["state"]
                        .as_object()
                        .and_then(|s| s.keys().next().cloned())
                        .unwrap_or_default();
                    line("    State:", or_none(&state));
                    line("    Ready:", status["ready"].to_string());
                    line("    Restarts:", status["restartCount"].to_string());
                }
            }
        }
        Kind::Node => {
            line("Status:", ready_status(object));
            for address in object["status"]["addresses"]
                .as_array()
                .into_iter()
                .flatten()
            {
                line(
                    &format!("{}:", str_at(address, &["type"])),
                    str_at(address, &["address"]).to_owned(),
                );
            }
        }
        Kind::ConfigMap | Kind::Secret => {
            let keys: Vec<&String> = object["data"]
                .as_object()
                .into_iter()
                .flatten()
                .map(|(k, _)| k)
                .collect();
            line(
                "Data keys:",
                or_none(
                    &keys
                        .iter()
                        .map(|k| k.as_str())
                        .collect::<Vec<_>>()
                        .join(", "),
                ),
            );
        }
        Kind::Device => {
            line(
                "Model:",
                or_none(str_at(object, &["spec", "deviceModelRef", "name"])),
            );
            line("Node:", or_none(str_at(object, &["spec", "nodeName"])));
            line("State:", or_none(str_at(object, &["status", "state"])));
            line(
                "Last online:",
                or_none(str_at(object, &["status", "lastOnlineTime"])),
            );
            line("Twins:", String::new());
            line(
                "  PROPERTY",
                format!("{:<14}{:<14}OBSERVED DESIRED", "DESIRED", "REPORTED"),
            );
            let reported = object["status"]["twins"].as_array();
            let mut names: Vec<String> = Vec::new();
            for property in object["spec"]["properties"]
                .as_array()
                .into_iter()
                .flatten()
            {
                names.push(str_at(property, &["name"]).to_owned());
            }
            for twin in reported.into_iter().flatten() {
                let name = str_at(twin, &["propertyName"]).to_owned();
                if !names.contains(&name) {
                    names.push(name);
                }
            }
            for name in names {
                let desired = object["spec"]["properties"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .find(|p| p["name"] == name.as_str())
                    .map(|p| str_at(p, &["desired", "value"]).to_owned())
                    .unwrap_or_default();
                let twin = reported
                    .into_iter()
                    .flatten()
                    .find(|t| t["propertyName"] == name.as_str());
                let (value, observed) = twin.map_or((String::new(), String::new()), |t| {
                    (
                        str_at(t, &["reported", "value"]).to_owned(),
                        str_at(t, &["observedDesired", "value"]).to_owned(),
                    )
                });
                line(
                    &format!("  {name}"),
                    format!(
                        "{:<14}{:<14}{}",
                        or_none(&desired),
                        or_none(&value),
                        or_none(&observed)
                    ),
                );
            }
            return out;
        }
        Kind::DeviceModel | Kind::Service | Kind::Endpoints => {
            if let Ok(spec) = serde_yaml_ng::to_string(&object["spec"]) {
                line("Spec:", String::new());
                for spec_line in spec.lines() {
                    line("", format!("  {spec_line}"));
                }
            }
        }
    }
    if let Some(conditions) = object["status"]["conditions"].as_array() {
        out.push_str("Conditions:\n  TYPE              STATUS    REASON            MESSAGE\n");
        for c in conditions {
            out.push_str(&format!(
                "  {:<18}{:<10}{:<18}{}\n",
                str_at(c, &["type"]),
                str_at(c, &["status"]),
                str_at(c, &["reason"]),
                str_at(c, &["message"]),
            ));
        }
    }
    out
}
