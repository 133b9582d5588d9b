//! From a Kubernetes pod to what CRI is asked for: the sandbox config, each
//! container's config (command, args, env with configmap and secret keys,
//! working dir, ports, cpu and memory limits), and the labels by which
//! edged finds its sandboxes and containers again, also after a restart.

use std::collections::HashMap;
use std::path::Path;

use apis::k8s::{Container, Pod, Quantity};
use serde_json::Value;

use crate::cri::api;

/// Label on everything edged creates.
pub const MANAGED: &str = "edgehive.io/managed";
/// The node whose edged created it: an edged touches only its own.
pub const NODE: &str = "edgehive.io/node";
/// The pod's uid.
pub const POD_UID: &str = "edgehive.io/pod-uid";
/// The pod's name.
pub const POD_NAME: &str = "edgehive.io/pod-name";
/// The pod's namespace.
pub const POD_NAMESPACE: &str = "edgehive.io/pod-namespace";
/// The container's name in the pod spec.
pub const CONTAINER_NAME: &str = "edgehive.io/container-name";
/// A hash of the container's spec: a changed spec means a new container.
pub const SPEC_HASH: &str = "edgehive.io/spec-hash";

/// Configmaps and secrets the edge holds, by `<ns>/<type>/<name>`.
pub type Objects = HashMap<String, Value>;

/// A pod's identity: its uid, or (without one) its namespace and name.
pub fn pod_uid(pod: &Pod) -> String {
    pod.metadata.uid.clone().unwrap_or_else(|| {
        format!(
            "{}.{}",
            pod.metadata.namespace.as_deref().unwrap_or("default"),
            pod.metadata.name.as_deref().unwrap_or_default()
        )
    })
}

/// `<ns>/<name>` of a pod.
pub fn pod_key(pod: &Pod) -> String {
    format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or("default"),
        pod.metadata.name.as_deref().unwrap_or_default()
    )
}

fn host_network(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.host_network)
        .unwrap_or(false)
}

fn pod_labels(pod: &Pod, node: &str) -> HashMap<String, String> {
    let mut labels: HashMap<String, String> = pod
        .metadata
        .labels
        .clone()
        .unwrap_or_default()
        .into_iter()
        .collect();
    labels.insert(MANAGED.to_owned(), "true".to_owned());
    labels.insert(NODE.to_owned(), node.to_owned());
    labels.insert(POD_UID.to_owned(), pod_uid(pod));
    labels.insert(
        POD_NAME.to_owned(),
        pod.metadata.name.clone().unwrap_or_default(),
    );
    labels.insert(
        POD_NAMESPACE.to_owned(),
        pod.metadata
            .namespace
            .clone()
            .unwrap_or_else(|| "default".to_owned()),
    );
    labels
}

/// The sandbox config of `pod` on `node`, its logs under `log_dir`.
pub fn sandbox_config(
    pod: &Pod,
    node: &str,
    log_dir: &Path,
    attempt: u32,
) -> api::PodSandboxConfig {
    let host = host_network(pod);
    let ports = pod
        .spec
        .iter()
        .flat_map(|s| s.containers.iter())
        .flat_map(|c| c.ports.iter().flatten())
        .filter(|p| p.host_port.unwrap_or(0) > 0)
        .map(|p| api::PortMapping {
            protocol: match p.protocol.as_deref() {
                Some("UDP") => api::Protocol::Udp as i32,
                Some("SCTP") => api::Protocol::Sctp as i32,
                _ => api::Protocol::Tcp as i32,
            },
            container_port: p.container_port,
            host_port: p.host_port.unwrap_or(0),
            host_ip: p.host_ip.clone().unwrap_or_default(),
        })
        .collect();
    api::PodSandboxConfig {
        metadata: Some(api::PodSandboxMetadata {
            name: pod.metadata.name.clone().unwrap_or_default(),
            uid: pod_uid(pod),
            namespace: pod
                .metadata
                .namespace
                .clone()
                .unwrap_or_else(|| "default".to_owned()),
            attempt,
        }),
        // A host-network pod has the host's name (runc refuses to set one
        // without a UTS namespace of its own).
        hostname: if host {
            String::new()
        } else {
            pod.spec
                .as_ref()
                .and_then(|s| s.hostname.clone())
                .or_else(|| pod.metadata.name.clone())
                .unwrap_or_default()
        },
        log_directory: log_dir.to_string_lossy().into_owned(),
        port_mappings: ports,
        labels: pod_labels(pod, node),
        linux: Some(api::LinuxPodSandboxConfig {
            security_context: Some(api::LinuxSandboxSecurityContext {
                namespace_options: Some(api::NamespaceOption {
                    network: if host {
                        api::NamespaceMode::Node as i32
                    } else {
                        api::NamespaceMode::Pod as i32
                    },
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The fields of a container its hash covers: Kubernetes 1.34's
/// (k8s-openapi `v1_34`, which edged hashed through before it read pods as
/// its own types). A field a newer API server adds, or defaults, is left
/// out, as it was then: an upgrade of the control plane or of edged does
/// not change the hash, and so restarts no container.
const HASHED_FIELDS: [&str; 25] = [
    "args",
    "command",
    "env",
    "envFrom",
    "image",
    "imagePullPolicy",
    "lifecycle",
    "livenessProbe",
    "name",
    "ports",
    "readinessProbe",
    "resizePolicy",
    "resources",
    "restartPolicy",
    "restartPolicyRules",
    "securityContext",
    "startupProbe",
    "stdin",
    "stdinOnce",
    "terminationMessagePath",
    "terminationMessagePolicy",
    "tty",
    "volumeDevices",
    "volumeMounts",
    "workingDir",
];

/// A hash of a container's spec that stays the same across edged builds
/// (FNV-1a of its canonical JSON, see [`canonical_json`], over
/// [`HASHED_FIELDS`]), so an upgraded edged still adopts its containers.
pub fn spec_hash(container: &Container) -> String {
    let text = serde_json::to_value(container)
        .map(|mut value| {
            if let Some(fields) = value.as_object_mut() {
                fields.retain(|key, _| HASHED_FIELDS.contains(&key.as_str()));
            }
            canonical_json(&value)
        })
        .unwrap_or_default();
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in text.bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{hash:016x}")
}

/// `value` as JSON text with the keys of every object sorted and its
/// `null` members left out: the text k8s-openapi wrote for a container
/// (its fields in sorted order, an unset one left out), which edged
/// hashed before it read pods as its own types. A container's fields that
/// edged does not model (kept in `rest`, written after the others) and
/// any serde_json build (`preserve_order` or not) give the same text.
fn canonical_json(value: &Value) -> String {
    fn write(value: &Value, out: &mut String) {
        match value {
            Value::Object(map) => {
                let mut members: Vec<(&String, &Value)> =
                    map.iter().filter(|(_, v)| !v.is_null()).collect();
                members.sort_by(|a, b| a.0.cmp(b.0));
                out.push('{');
                for (index, (key, member)) in members.into_iter().enumerate() {
                    if index > 0 {
                        out.push(',');
                    }
                    write(&Value::String(key.clone()), out);
                    out.push(':');
                    write(member, out);
                }
                out.push('}');
            }
            Value::Array(items) => {
                out.push('[');
                for (index, item) in items.iter().enumerate() {
                    if index > 0 {
                        out.push(',');
                    }
                    write(item, out);
                }
                out.push(']');
            }
            // A scalar's text cannot fail to be written.
            scalar => out.push_str(&serde_json::to_string(scalar).unwrap_or_default()),
        }
    }
    let mut out = String::new();
    write(value, &mut out);
    out
}

/// Whether `name` may name a container or a volume: a DNS-1123 label, so
/// it is safe in paths and labels.
pub use beehive::names::valid_label as valid_name;

/// Why a container cannot be configured yet.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{reason}: {message}")]
pub struct ConfigError {
    /// Kubernetes' reason, e.g. `CreateContainerConfigError`.
    pub reason: String,
    /// What is missing.
    pub message: String,
}

fn config_error(message: String) -> ConfigError {
    ConfigError {
        reason: "CreateContainerConfigError".to_owned(),
        message,
    }
}

/// The value of `key` in a configmap or secret (secrets are base64).
fn object_value(
    objects: &Objects,
    namespace: &str,
    kind: &str,
    name: &str,
    key: &str,
) -> Result<Option<String>, ConfigError> {
    let object = objects
        .get(&format!("{namespace}/{kind}/{name}"))
        .ok_or_else(|| config_error(format!("{kind} {name:?} not found")))?;
    if kind == "secret" {
        if let Some(text) = object["stringData"][key].as_str() {
            return Ok(Some(text.to_owned()));
        }
        return match object["data"][key].as_str() {
            Some(encoded) => decode_base64(encoded)
                .map(Some)
                .ok_or_else(|| config_error(format!("secret {name:?} key {key:?} is not base64"))),
            None => Ok(None),
        };
    }
    Ok(object["data"][key].as_str().map(str::to_owned))
}

fn decode_base64(text: &str) -> Option<String> {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD
        .decode(text.trim())
        .ok()
        .and_then(|bytes| String::from_utf8(bytes).ok())
}

/// The container's environment: `envFrom` first, then `env`, with values
/// from configmap and secret keys.
pub fn environment(
    container: &Container,
    namespace: &str,
    objects: &Objects,
) -> Result<Vec<api::KeyValue>, ConfigError> {
    let mut env: Vec<(String, String)> = Vec::new();
    let mut set = |key: String, value: String| {
        env.retain(|(k, _)| *k != key);
        env.push((key, value));
    };
    for source in container.env_from.iter().flatten() {
        let prefix = source.prefix.clone().unwrap_or_default();
        let (kind, name, optional) = match (&source.config_map_ref, &source.secret_ref) {
            (Some(cm), _) => ("configmap", cm.name.clone(), cm.optional.unwrap_or(false)),
            (_, Some(secret)) => (
                "secret",
                secret.name.clone(),
                secret.optional.unwrap_or(false),
            ),
            _ => continue,
        };
        let Some(object) = objects.get(&format!("{namespace}/{kind}/{name}")) else {
            if optional {
                continue;
            }
            return Err(config_error(format!("{kind} {name:?} not found")));
        };
        for field in ["data", "stringData"] {
            for (key, _) in object[field].as_object().into_iter().flatten() {
                if let Some(value) = object_value(objects, namespace, kind, &name, key)? {
                    set(format!("{prefix}{key}"), value);
                }
            }
        }
    }
    for var in container.env.iter().flatten() {
        if let Some(value) = &var.value {
            set(var.name.clone(), value.clone());
            continue;
        }
        let Some(from) = &var.value_from else {
            set(var.name.clone(), String::new());
            continue;
        };
        let (kind, name, key, optional) = match (&from.config_map_key_ref, &from.secret_key_ref) {
            (Some(r), _) => (
                "configmap",
                r.name.clone(),
                r.key.clone(),
                r.optional.unwrap_or(false),
            ),
            (_, Some(r)) => (
                "secret",
                r.name.clone(),
                r.key.clone(),
                r.optional.unwrap_or(false),
            ),
            _ => continue,
        };
        match object_value(objects, namespace, kind, &name, &key) {
            Ok(Some(value)) => set(var.name.clone(), value),
            Ok(None) if optional => {}
            Err(_) if optional => {}
            Ok(None) => {
                return Err(config_error(format!("{kind} {name:?} has no key {key:?}")));
            }
            Err(err) => return Err(err),
        }
    }
    Ok(env
        .into_iter()
        .map(|(key, value)| api::KeyValue { key, value })
        .collect())
}

/// CPU and memory limits as Linux resources.
fn resources(container: &Container) -> api::LinuxContainerResources {
    let limits = container.resources.as_ref().and_then(|r| r.limits.as_ref());
    let requests = container
        .resources
        .as_ref()
        .and_then(|r| r.requests.as_ref());
    let mut out = api::LinuxContainerResources::default();
    const PERIOD: i64 = 100_000;
    if let Some(cpu) = limits.and_then(|l| l.get("cpu")).and_then(millicores) {
        out.cpu_period = PERIOD;
        out.cpu_quota = cpu.saturating_mul(PERIOD / 1000).max(1000);
    }
    if let Some(cpu) = requests.and_then(|r| r.get("cpu")).and_then(millicores) {
        out.cpu_shares = (cpu.saturating_mul(1024) / 1000).max(2);
    }
    if let Some(memory) = limits.and_then(|l| l.get("memory")).and_then(bytes) {
        out.memory_limit_in_bytes = memory;
    }
    out
}

/// A cpu quantity in millicores (`500m`, `2`, `0.5`).
pub fn millicores(quantity: &Quantity) -> Option<i64> {
    let text = quantity.0.trim();
    if let Some(milli) = text.strip_suffix('m') {
        return milli.parse().ok();
    }
    text.parse::<f64>()
        .ok()
        .filter(|cores| cores.is_finite() && *cores >= 0.0)
        .map(|cores| (cores * 1000.0).round().min(i64::MAX as f64) as i64)
}

/// A memory quantity in bytes (`128Mi`, `1G`, `1000`).
pub fn bytes(quantity: &Quantity) -> Option<i64> {
    let text = quantity.0.trim();
    let units: [(&str, f64); 10] = [
        ("Ki", 1024.0),
        ("Mi", 1024.0 * 1024.0),
        ("Gi", 1024.0 * 1024.0 * 1024.0),
        ("Ti", 1024.0f64.powi(4)),
        ("k", 1e3),
        ("K", 1e3),
        ("M", 1e6),
        ("G", 1e9),
        ("T", 1e12),
        ("", 1.0),
    ];
    units.iter().find_map(|(suffix, factor)| {
        let number = text.strip_suffix(suffix)?;
        number
            .parse::<f64>()
            .ok()
            .filter(|n| n.is_finite() && *n >= 0.0)
            .map(|n| (n * factor).min(i64::MAX as f64) as i64)
    })
}

/// The CRI config of `container` (attempt `attempt`) in `pod` on `node`.
pub fn container_config(
    pod: &Pod,
    node: &str,
    container: &Container,
    image: &str,
    attempt: u32,
    objects: &Objects,
) -> Result<api::ContainerConfig, ConfigError> {
    if !valid_name(&container.name) {
        return Err(config_error(format!(
            "container name {:?} is not a DNS-1123 label",
            container.name
        )));
    }
    let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
    let mut labels = HashMap::from([
        (MANAGED.to_owned(), "true".to_owned()),
        (NODE.to_owned(), node.to_owned()),
        (POD_UID.to_owned(), pod_uid(pod)),
        (
            POD_NAME.to_owned(),
            pod.metadata.name.clone().unwrap_or_default(),
        ),
        (POD_NAMESPACE.to_owned(), namespace.to_owned()),
        (CONTAINER_NAME.to_owned(), container.name.clone()),
    ]);
    labels.insert(SPEC_HASH.to_owned(), spec_hash(container));
    Ok(api::ContainerConfig {
        metadata: Some(api::ContainerMetadata {
            name: container.name.clone(),
            attempt,
        }),
        image: Some(api::ImageSpec {
            image: image.to_owned(),
            ..Default::default()
        }),
        command: container.command.clone().unwrap_or_default(),
        args: container.args.clone().unwrap_or_default(),
        working_dir: container.working_dir.clone().unwrap_or_default(),
        envs: environment(container, namespace, objects)?,
        labels,
        log_path: format!("{}/{attempt}.log", container.name),
        linux: Some(api::LinuxContainerConfig {
            resources: Some(resources(container)),
            ..Default::default()
        }),
        ..Default::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// The hash an edged built on k8s-openapi gave this container (a
    /// defaulted one, with fields edged does not model): an upgraded edged
    /// gives the same, so it adopts the container instead of replacing it.
    #[test]
    fn the_spec_hash_is_the_one_edged_gave_before() {
        let container: Container = serde_json::from_value(json!({
            "name": "web", "image": "registry.example/web:1.4.2", "imagePullPolicy": "IfNotPresent",
            "command": ["/bin/web"], "args": ["--port=8080"],
            "env": [{"name": "MODE", "value": "prod"},
                    {"name": "POD", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.name"}}}],
            "ports": [{"containerPort": 8080, "name": "http", "protocol": "TCP"}],
            "resources": {"limits": {"cpu": "500m", "memory": "128Mi"},
                          "requests": {"cpu": "500m", "memory": "128Mi"}},
            "livenessProbe": {"httpGet": {"path": "/healthz", "port": 8080, "scheme": "HTTP"},
                "failureThreshold": 3, "periodSeconds": 10, "successThreshold": 1, "timeoutSeconds": 1},
            "securityContext": {"runAsNonRoot": true, "capabilities": {"drop": ["ALL"]}},
            "lifecycle": {"preStop": {"exec": {"command": ["sleep", "5"]}}},
            "terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "File",
            "volumeMounts": [{"mountPath": "/etc/web", "name": "conf", "readOnly": true}]
        }))
        .expect("container");
        assert_eq!(spec_hash(&container), "5ae447a252826e12");
        // A null member is as good as none (k8s-openapi dropped both).
        let mut with_null = container.clone();
        with_null.rest.insert("stdinOnce".to_owned(), Value::Null);
        assert_eq!(spec_hash(&with_null), spec_hash(&container));
        // A field Kubernetes 1.34 does not have (a newer API server's, or
        // one it defaults) leaves the hash as it was: k8s-openapi dropped it.
        let mut newer = container.clone();
        newer
            .rest
            .insert("someFieldAfter134".to_owned(), json!({"enabled": true}));
        assert_eq!(spec_hash(&newer), "5ae447a252826e12");
        // Any change of the spec is a new hash.
        let mut changed = container;
        changed.rest.insert(
            "terminationMessagePolicy".to_owned(),
            json!("FallbackToLogsOnError"),
        );
        assert_ne!(spec_hash(&changed), "5ae447a252826e12");
    }

    #[test]
    fn quantities_convert() {
        assert_eq!(millicores(&Quantity("500m".into())), Some(500));
        assert_eq!(millicores(&Quantity("2".into())), Some(2000));
        assert_eq!(millicores(&Quantity("0.25".into())), Some(250));
        assert_eq!(bytes(&Quantity("128Mi".into())), Some(128 << 20));
        assert_eq!(bytes(&Quantity("1G".into())), Some(1_000_000_000));
        assert_eq!(bytes(&Quantity("4096".into())), Some(4096));
    }

    #[test]
    fn environment_takes_values_and_keys_of_configmaps_and_secrets() {
        let container: Container = serde_json::from_value(json!({
            "name": "c",
            "envFrom": [{"configMapRef": {"name": "conf"}, "prefix": "CONF_"}],
            "env": [
                {"name": "PLAIN", "value": "v"},
                {"name": "FROM_CM", "valueFrom": {"configMapKeyRef": {"name": "conf", "key": "greeting"}}},
                {"name": "FROM_SECRET", "valueFrom": {"secretKeyRef": {"name": "s", "key": "password"}}},
                {"name": "MISSING_OK", "valueFrom": {"secretKeyRef": {"name": "nope", "key": "k", "optional": true}}}
            ]
        }))
        .expect("container");
        let objects = Objects::from([
            (
                "ns/configmap/conf".to_owned(),
                json!({"data": {"greeting": "hello"}}),
            ),
            (
                "ns/secret/s".to_owned(),
                json!({"data": {"password": "c2VjcmV0"}}),
            ),
        ]);
        let env: Vec<(String, String)> = environment(&container, "ns", &objects)
            .expect("env")
            .into_iter()
            .map(|kv| (kv.key, kv.value))
            .collect();
        assert_eq!(
            env,
            [
                ("CONF_greeting".to_owned(), "hello".to_owned()),
                ("PLAIN".to_owned(), "v".to_owned()),
                ("FROM_CM".to_owned(), "hello".to_owned()),
                ("FROM_SECRET".to_owned(), "secret".to_owned()),
            ]
        );
        let missing = environment(&container, "other", &objects).expect_err("missing");
        assert_eq!(missing.reason, "CreateContainerConfigError");
    }
}
