//! Pod volumes: emptyDir and hostPath directories, and configMap, secret
//! and projected volumes written as files under the pod's directory; each
//! mounted into containers as a CRI bind mount.
//!
//! A projected volume joins configmap and secret keys, downward API fields
//! and service account tokens. A token is not made here: edged asks the
//! cloud for it (a TokenRequest bound to the pod, see [`crate::tokens`])
//! and keeps it as a `serviceaccounttoken` object named [`token_name`],
//! renewed before it expires; the edge keeps the last one while the cloud
//! is away. A token bound to another pod of the same name (one this pod
//! replaced) is not this pod's: the volume waits for its own.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use apis::k8s::{Container, KeyToPath, Pod, Volume, VolumeProjection};
use serde_json::Value;

use crate::cri::api;
use crate::spec::{ConfigError, Objects};

/// A volume on the host, ready to mount.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostVolume {
    /// Where it is on the host.
    pub path: PathBuf,
    /// Whether containers must not write to it.
    pub read_only: bool,
}

fn volume_error(message: String) -> ConfigError {
    ConfigError {
        reason: "CreateContainerConfigError".to_owned(),
        message,
    }
}

/// Makes the pod's volumes exist on the host (configMap and secret files
/// are written, or rewritten when they changed) and says where each is.
pub fn prepare(
    pod: &Pod,
    pod_dir: &Path,
    objects: &Objects,
) -> Result<HashMap<String, HostVolume>, ConfigError> {
    let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
    let mut out = HashMap::new();
    for volume in pod.spec.iter().flat_map(|s| s.volumes.iter().flatten()) {
        if !crate::spec::valid_name(&volume.name) {
            return Err(volume_error(format!(
                "volume name {:?} is not a DNS-1123 label",
                volume.name
            )));
        }
        let io = |err: std::io::Error| volume_error(format!("volume {:?}: {err}", volume.name));
        if volume.empty_dir.is_some() {
            let path = pod_dir.join("volumes/empty-dir").join(&volume.name);
            std::fs::create_dir_all(&path).map_err(io)?;
            out.insert(
                volume.name.clone(),
                HostVolume {
                    path,
                    read_only: false,
                },
            );
        } else if let Some(host) = &volume.host_path {
            let path = PathBuf::from(&host.path);
            if matches!(host.type_.as_deref(), Some("DirectoryOrCreate")) {
                std::fs::create_dir_all(&path).map_err(io)?;
            }
            out.insert(
                volume.name.clone(),
                HostVolume {
                    path,
                    read_only: false,
                },
            );
        } else if let Some(projected) = &volume.projected {
            let path = pod_dir.join("volumes/projected").join(&volume.name);
            let sources = projected.sources.iter().flatten();
            let mut files = Vec::new();
            for (index, source) in sources.enumerate() {
                files.extend(projected_files(
                    pod,
                    namespace,
                    &volume.name,
                    index,
                    source,
                    objects,
                )?);
            }
            write_set(&path, files, projected.default_mode).map_err(io)?;
            out.insert(
                volume.name.clone(),
                HostVolume {
                    path,
                    read_only: true,
                },
            );
        } else if let Some(source) = ObjectVolume::of(volume) {
            let path = pod_dir.join("volumes").join(source.kind).join(&volume.name);
            let key = format!("{namespace}/{}/{}", source.kind, source.name);
            match objects.get(&key) {
                Some(object) => write_files(
                    &path,
                    object,
                    source.kind == "secret",
                    source.items,
                    source.default_mode,
                )
                .map_err(io)?,
                None if source.optional => std::fs::create_dir_all(&path).map_err(io)?,
                None => {
                    return Err(volume_error(format!(
                        "{} {:?} not found",
                        source.kind, source.name
                    )));
                }
            }
            out.insert(
                volume.name.clone(),
                HostVolume {
                    path,
                    read_only: true,
                },
            );
        }
    }
    Ok(out)
}

pub use apis::kinds::token_name;

/// A file of a volume: its path in the volume, contents and mode.
type VolumeFile = (String, Vec<u8>, Option<i32>);

/// The files one source of a projected volume contributes.
fn projected_files(
    pod: &Pod,
    namespace: &str,
    volume: &str,
    index: usize,
    source: &VolumeProjection,
    objects: &Objects,
) -> Result<Vec<VolumeFile>, ConfigError> {
    let missing = |what: String| volume_error(format!("volume {volume:?}: {what} not found"));
    if let Some(config_map) = &source.config_map {
        let key = format!("{namespace}/configmap/{}", config_map.name);
        return match objects.get(&key) {
            Some(object) => Ok(object_files(object, false, config_map.items.as_deref())),
            None if config_map.optional.unwrap_or(false) => Ok(Vec::new()),
            None => Err(missing(format!("configmap {:?}", config_map.name))),
        };
    }
    if let Some(secret) = &source.secret {
        let key = format!("{namespace}/secret/{}", secret.name);
        return match objects.get(&key) {
            Some(object) => Ok(object_files(object, true, secret.items.as_deref())),
            None if secret.optional.unwrap_or(false) => Ok(Vec::new()),
            None => Err(missing(format!("secret {:?}", secret.name))),
        };
    }
    if let Some(downward) = &source.downward_api {
        let mut files = Vec::new();
        for item in downward.items.iter().flatten() {
            let Some(field) = &item.field_ref else {
                // resourceFieldRef: container limits, not known here.
                continue;
            };
            let value = downward_field(pod, &field.field_path).ok_or_else(|| {
                volume_error(format!(
                    "volume {volume:?}: field {:?} is not supported",
                    field.field_path
                ))
            })?;
            files.push((item.path.clone(), value.into_bytes(), item.mode));
        }
        return Ok(files);
    }
    if let Some(token) = &source.service_account_token {
        let name = pod.metadata.name.as_deref().unwrap_or_default();
        let key = format!(
            "{namespace}/serviceaccounttoken/{}",
            token_name(name, volume, index)
        );
        let uid = pod.metadata.uid.as_deref();
        let value = objects
            .get(&key)
            .filter(|object| {
                let bound = object.pointer("/spec/boundObjectRef/uid");
                bound.is_none_or(|bound| bound.as_str() == uid)
            })
            .and_then(|object| object.pointer("/status/token"))
            .and_then(Value::as_str)
            .ok_or_else(|| {
                volume_error(format!(
                    "volume {volume:?}: the service account token is not issued yet"
                ))
            })?;
        return Ok(vec![(token.path.clone(), value.as_bytes().to_vec(), None)]);
    }
    Ok(Vec::new())
}

/// A downward API field of the pod, as text.
fn downward_field(pod: &Pod, path: &str) -> Option<String> {
    let meta = &pod.metadata;
    let map = |map: Option<&std::collections::BTreeMap<String, String>>| {
        map.into_iter()
            .flatten()
            .map(|(k, v)| format!("{k}={v:?}\n"))
            .collect::<String>()
    };
    match path {
        "metadata.name" => meta.name.clone(),
        "metadata.namespace" => Some(
            meta.namespace
                .clone()
                .unwrap_or_else(|| "default".to_owned()),
        ),
        "metadata.uid" => meta.uid.clone(),
        "metadata.labels" => Some(map(meta.labels.as_ref())),
        "metadata.annotations" => Some(map(meta.annotations.as_ref())),
        "spec.nodeName" => pod.spec.as_ref().and_then(|s| s.node_name.clone()),
        "spec.serviceAccountName" => pod
            .spec
            .as_ref()
            .and_then(|s| s.service_account_name.clone()),
        _ => {
            let key = path
                .strip_prefix("metadata.labels['")
                .map(|k| (k, true))
                .or_else(|| {
                    path.strip_prefix("metadata.annotations['")
                        .map(|k| (k, false))
                })?;
            let (name, labels) = key;
            let name = name.strip_suffix("']")?;
            let source = match labels {
                true => meta.labels.as_ref(),
                false => meta.annotations.as_ref(),
            };
            Some(
                source
                    .and_then(|m| m.get(name))
                    .cloned()
                    .unwrap_or_default(),
            )
        }
    }
}

/// A configMap or secret volume: which object, and how to write it.
struct ObjectVolume<'a> {
    /// `configmap` or `secret` (also its beehive resource type).
    kind: &'static str,
    name: String,
    items: Option<&'a [KeyToPath]>,
    default_mode: Option<i32>,
    optional: bool,
}

impl<'a> ObjectVolume<'a> {
    fn of(volume: &'a Volume) -> Option<ObjectVolume<'a>> {
        if let Some(source) = &volume.config_map {
            return Some(ObjectVolume {
                kind: "configmap",
                name: source.name.clone(),
                items: source.items.as_deref(),
                default_mode: source.default_mode,
                optional: source.optional.unwrap_or(false),
            });
        }
        let source = volume.secret.as_ref()?;
        Some(ObjectVolume {
            kind: "secret",
            name: source.secret_name.clone().unwrap_or_default(),
            items: source.items.as_deref(),
            default_mode: source.default_mode,
            optional: source.optional.unwrap_or(false),
        })
    }
}

/// Writes a configmap's or secret's keys as files in `dir` (only `items`
/// if given), changing only files whose contents differ.
fn write_files(
    dir: &Path,
    object: &Value,
    secret: bool,
    items: Option<&[KeyToPath]>,
    default_mode: Option<i32>,
) -> std::io::Result<()> {
    write_set(dir, object_files(object, secret, items), default_mode)
}

/// A configmap's or secret's keys as files (only `items` if given): path,
/// contents and mode.
fn object_files(object: &Value, secret: bool, items: Option<&[KeyToPath]>) -> Vec<VolumeFile> {
    let mut files: Vec<VolumeFile> = Vec::new();
    let value_of = |key: &str| -> Option<Vec<u8>> {
        if secret {
            if let Some(text) = object["stringData"][key].as_str() {
                return Some(text.as_bytes().to_vec());
            }
            return object["data"][key].as_str().and_then(decode);
        }
        object["data"][key]
            .as_str()
            .map(|text| text.as_bytes().to_vec())
            .or_else(|| object["binaryData"][key].as_str().and_then(decode))
    };
    match items {
        Some(items) => {
            for item in items {
                if let Some(bytes) = value_of(&item.key) {
                    files.push((item.path.clone(), bytes, item.mode));
                }
            }
        }
        None => {
            for field in ["data", "binaryData", "stringData"] {
                for (key, _) in object[field].as_object().into_iter().flatten() {
                    if let Some(bytes) = value_of(key) {
                        files.push((key.clone(), bytes, None));
                    }
                }
            }
        }
    }
    files
}

/// Writes `files` in `dir`, changing only files whose contents differ,
/// and removes the files that are not among them.
fn write_set(dir: &Path, files: Vec<VolumeFile>, default_mode: Option<i32>) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(dir)?;
    let mut written = std::collections::HashSet::new();
    for (relative, bytes, mode) in files {
        // No way out of the volume.
        if relative
            .split('/')
            .any(|part| part == ".." || part.is_empty())
        {
            continue;
        }
        let path = dir.join(&relative);
        written.insert(path.clone());
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        if std::fs::read(&path).ok().as_deref() != Some(bytes.as_slice()) {
            let staging = path.with_extension("edgehive-new");
            std::fs::write(&staging, &bytes)?;
            std::fs::rename(&staging, &path)?;
        }
        let mode = mode.or(default_mode).unwrap_or(0o644) as u32;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode & 0o777))?;
    }
    // A key the object no longer has leaves the volume too.
    remove_unlisted(dir, &written)
}

/// Removes the files under `dir` that are not in `keep`.
fn remove_unlisted(dir: &Path, keep: &std::collections::HashSet<PathBuf>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let path = entry.path();
        if entry.file_type()?.is_dir() {
            remove_unlisted(&path, keep)?;
        } else if !keep.contains(&path) {
            std::fs::remove_file(&path)?;
        }
    }
    Ok(())
}

fn decode(text: &str) -> Option<Vec<u8>> {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD
        .decode(text.trim())
        .ok()
}

/// The CRI mounts of `container`'s `volumeMounts`.
pub fn mounts(
    container: &Container,
    volumes: &HashMap<String, HostVolume>,
) -> Result<Vec<api::Mount>, ConfigError> {
    let mut out = Vec::new();
    for mount in container.volume_mounts.iter().flatten() {
        let volume = volumes
            .get(&mount.name)
            .ok_or_else(|| volume_error(format!("volume {:?} is not in the pod", mount.name)))?;
        let mut host = volume.path.clone();
        if let Some(sub) = mount.sub_path.as_deref().filter(|s| !s.is_empty()) {
            // Relative, no `..`, and no symlink on the way that could lead
            // out of the volume.
            if sub.starts_with('/') || sub.split('/').any(|part| part == "..") {
                return Err(volume_error(format!("subPath {sub:?} leaves the volume")));
            }
            let mut at = host.clone();
            for part in sub.split('/').filter(|p| !p.is_empty()) {
                at = at.join(part);
                if std::fs::symlink_metadata(&at).is_ok_and(|m| m.file_type().is_symlink()) {
                    return Err(volume_error(format!(
                        "subPath {sub:?} goes through a symlink"
                    )));
                }
            }
            host = at;
        }
        out.push(api::Mount {
            container_path: mount.mount_path.clone(),
            host_path: host.to_string_lossy().into_owned(),
            readonly: volume.read_only || mount.read_only.unwrap_or(false),
            ..Default::default()
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_projected_token_is_the_pods_own() {
        let dir = tempfile::tempdir().expect("dir");
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "ns", "uid": "u2"},
            "spec": {
                "containers": [{"name": "c"}],
                "volumes": [{"name": "kube-api-access", "projected": {"sources": [
                    {"serviceAccountToken": {"path": "token"}},
                ]}}],
            }
        }))
        .expect("pod");
        let key = format!(
            "ns/serviceaccounttoken/{}",
            token_name("web", "kube-api-access", 0)
        );
        let token = |uid: Option<&str>| {
            let mut object = json!({"status": {"token": "a.b.c"}});
            if let Some(uid) = uid {
                object["spec"] =
                    json!({"boundObjectRef": {"kind": "Pod", "name": "web", "uid": uid}});
            }
            Objects::from([(key.clone(), object)])
        };
        // None yet, or the token of the pod this one replaced: it waits.
        for objects in [Objects::new(), token(Some("u1"))] {
            let err = prepare(&pod, dir.path(), &objects).expect_err("no token");
            assert_eq!(err.reason, "CreateContainerConfigError");
            assert!(err.message.contains("not issued yet"), "{err}");
        }
        // Its own (or one that says not whose) is written.
        for objects in [token(Some("u2")), token(None)] {
            let volumes = prepare(&pod, dir.path(), &objects).expect("volumes");
            let path = volumes["kube-api-access"].path.join("token");
            assert_eq!(std::fs::read_to_string(path).expect("token"), "a.b.c");
        }
    }

    #[test]
    fn configmap_and_secret_volumes_become_files() {
        let dir = tempfile::tempdir().expect("dir");
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "ns"},
            "spec": {
                "containers": [{"name": "c", "volumeMounts": [
                    {"name": "conf", "mountPath": "/etc/conf"},
                    {"name": "creds", "mountPath": "/etc/creds", "readOnly": true},
                    {"name": "scratch", "mountPath": "/scratch"}
                ]}],
                "volumes": [
                    {"name": "conf", "configMap": {"name": "settings"}},
                    {"name": "creds", "secret": {"secretName": "token", "items": [{"key": "t", "path": "nested/token"}]}},
                    {"name": "scratch", "emptyDir": {}}
                ]
            }
        }))
        .expect("pod");
        let objects = Objects::from([
            (
                "ns/configmap/settings".to_owned(),
                json!({"data": {"mode": "fast"}}),
            ),
            (
                "ns/secret/token".to_owned(),
                json!({"data": {"t": "czNjcjN0"}}),
            ),
        ]);
        let volumes = prepare(&pod, dir.path(), &objects).expect("volumes");
        let conf = &volumes["conf"];
        assert_eq!(
            std::fs::read_to_string(conf.path.join("mode")).expect("file"),
            "fast"
        );
        assert_eq!(
            std::fs::read_to_string(volumes["creds"].path.join("nested/token")).expect("file"),
            "s3cr3t"
        );
        assert!(volumes["scratch"].path.is_dir());
        let mounts =
            mounts(&pod.spec.as_ref().expect("spec").containers[0], &volumes).expect("mounts");
        assert_eq!(mounts.len(), 3);
        assert!(mounts[0].readonly && mounts[1].readonly && !mounts[2].readonly);
        // A missing configmap is an error that says which.
        let err = prepare(&pod, dir.path(), &Objects::new()).expect_err("missing");
        assert!(err.message.contains("settings"), "{err}");

        // An update rewrites what changed and removes what went away.
        let mut updated = objects.clone();
        updated.insert(
            "ns/configmap/settings".to_owned(),
            json!({"data": {"speed": "slow"}}),
        );
        let volumes = prepare(&pod, dir.path(), &updated).expect("volumes");
        let conf = &volumes["conf"].path;
        assert_eq!(
            std::fs::read_to_string(conf.join("speed")).expect("file"),
            "slow"
        );
        assert!(!conf.join("mode").exists(), "a removed key's file stays");
        assert!(volumes["creds"].path.join("nested/token").exists());
    }
}
