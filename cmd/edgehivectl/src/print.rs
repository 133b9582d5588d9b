//! Objects printed as kubectl prints them: tables (`get`, with `-o wide`)
//! and `describe`.

use apis::kinds::Kind;
use serde_json::Value;

pub(crate) fn str_at<'a>(value: &'a Value, path: &[&str]) -> &'a str {
    let mut at = value;
    for key in path {
        at = &at[*key];
    }
    at.as_str().unwrap_or("")
}

pub(crate) fn age(object: &Value) -> String {
    let created = str_at(object, &["metadata", "creationTimestamp"]);
    let Ok(created) = created.parse::<jiff::Timestamp>() else {
        return "<unknown>".to_owned();
    };
    let secs = (jiff::Timestamp::now().as_second() - created.as_second()).max(0);
    match secs {
        s if s < 120 => format!("{s}s"),
        s if s < 7200 => format!("{}m", s / 60),
        s if s < 172_800 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86_400),
    }
}

pub(crate) fn ready_status(node: &Value) -> String {
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

pub(crate) fn pod_columns(pod: &Value) -> (String, String, u64) {
    let statuses = pod["status"]["containerStatuses"]
        .as_array()
        .cloned()
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

pub(crate) fn print_table(kind: Kind, items: &[Value], with_namespace: bool, wide: bool) {
    let mut header: Vec<&str> = Vec::new();
    if with_namespace && kind.namespaced() {
        header.push("NAMESPACE");
    }
    header.push("NAME");
    let extra: &[&str] = match kind {
        Kind::Pod if wide => &["READY", "STATUS", "RESTARTS", "AGE", "IP", "NODE"],
        Kind::Pod => &["READY", "STATUS", "RESTARTS", "AGE", "NODE"],
        Kind::Node if wide => &[
            "STATUS",
            "ROLES",
            "AGE",
            "VERSION",
            "INTERNAL-IP",
            "OS-IMAGE",
        ],
        Kind::Node => &["STATUS", "ROLES", "AGE", "VERSION"],
        Kind::ConfigMap => &["DATA", "AGE"],
        Kind::Secret => &["TYPE", "DATA", "AGE"],
        Kind::Service => &["TYPE", "CLUSTER-IP", "PORT(S)", "AGE"],
        Kind::Endpoints => &["ENDPOINTS", "AGE"],
        Kind::Device if wide => &["MODEL", "NODE", "STATE", "TWINS", "AGE", "PROTOCOL"],
        Kind::Device => &["MODEL", "NODE", "STATE", "TWINS", "AGE"],
        Kind::DeviceModel => &["PROPERTIES", "PROTOCOL", "AGE"],
    };
    header.extend_from_slice(extra);
    let mut rows = vec![header.iter().map(|h| h.to_string()).collect::<Vec<_>>()];
    for item in items {
        let mut row = Vec::new();
        if with_namespace && kind.namespaced() {
            row.push(str_at(item, &["metadata", "namespace"]).to_owned());
        }
        row.push(str_at(item, &["metadata", "name"]).to_owned());
        match kind {
            Kind::Pod => {
                let (ready, status, restarts) = pod_columns(item);
                row.extend([ready, status, restarts.to_string(), age(item)]);
                if wide {
                    row.push(or_none(str_at(item, &["status", "podIP"])));
                }
                row.push(or_none(str_at(item, &["spec", "nodeName"])));
            }
            Kind::Node => {
                row.extend([
                    ready_status(item),
                    "edge".to_owned(),
                    age(item),
                    or_none(str_at(item, &["status", "nodeInfo", "kubeletVersion"])),
                ]);
                if wide {
                    let ip = item["status"]["addresses"]
                        .as_array()
                        .and_then(|a| a.iter().find(|a| a["type"] == "InternalIP"))
                        .map(|a| str_at(a, &["address"]).to_owned())
                        .unwrap_or_default();
                    row.push(or_none(&ip));
                    row.push(or_none(str_at(item, &["status", "nodeInfo", "osImage"])));
                }
            }
            Kind::ConfigMap => {
                let data = count(&item["data"]) + count(&item["binaryData"]);
                row.extend([data.to_string(), age(item)]);
            }
            Kind::Secret => {
                let kind = str_at(item, &["type"]);
                row.extend([
                    if kind.is_empty() { "Opaque" } else { kind }.to_owned(),
                    (count(&item["data"]) + count(&item["stringData"])).to_string(),
                    age(item),
                ]);
            }
            Kind::Service => {
                let kind = str_at(item, &["spec", "type"]);
                let ports: Vec<String> = item["spec"]["ports"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|p| {
                        let protocol = p["protocol"].as_str().unwrap_or("TCP");
                        format!("{}/{protocol}", p["port"])
                    })
                    .collect();
                row.extend([
                    if kind.is_empty() { "ClusterIP" } else { kind }.to_owned(),
                    or_none(str_at(item, &["spec", "clusterIP"])),
                    or_none(&ports.join(",")),
                    age(item),
                ]);
            }
            Kind::Endpoints => {
                let mut addresses = Vec::new();
                for subset in item["subsets"].as_array().into_iter().flatten() {
                    for address in subset["addresses"].as_array().into_iter().flatten() {
                        for port in subset["ports"].as_array().into_iter().flatten() {
                            addresses.push(format!(
                                "{}:{}",
                                str_at(address, &["ip"]),
                                port["port"]
                            ));
                        }
                    }
                }
                row.extend([or_none(&addresses.join(",")), age(item)]);
            }
            Kind::Device => {
                let twins = item["status"]["twins"].as_array().map_or(0, Vec::len);
                row.extend([
                    or_none(str_at(item, &["spec", "deviceModelRef", "name"])),
                    or_none(str_at(item, &["spec", "nodeName"])),
                    or_none(str_at(item, &["status", "state"])),
                    twins.to_string(),
                    age(item),
                ]);
                if wide {
                    row.push(or_none(str_at(item, &["spec", "protocol", "protocolName"])));
                }
            }
            Kind::DeviceModel => {
                let properties = item["spec"]["properties"].as_array().map_or(0, Vec::len);
                row.extend([
                    properties.to_string(),
                    or_none(str_at(item, &["spec", "protocol"])),
                    age(item),
                ]);
            }
        }
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

pub(crate) fn count(value: &Value) -> usize {
    value.as_object().map_or(0, serde_json::Map::len)
}

pub(crate) fn or_none(text: &str) -> String {
    if text.is_empty() {
        "<none>".to_owned()
    } else {
        text.to_owned()
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
