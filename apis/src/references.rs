//! What a node must hold for an object bound to it to work there: the
//! configmaps, secrets and service account tokens a pod uses, a device's
//! model. The controller sends them along with the object.

use std::collections::BTreeSet;

use serde::Deserialize as _;
use serde_json::Value;

use crate::k8s::PodSpec;
use crate::kinds::{Kind, ObjectKey};

/// The objects a node must hold for `object` (of a kind bound to a node)
/// to work there: what a pod uses (see [`pod_references`]), a device's
/// model.
pub fn references(key: &ObjectKey, object: &Value) -> BTreeSet<ObjectKey> {
    match key.kind {
        Kind::Pod => pod_references(&key.namespace, object),
        Kind::Device => object["spec"]["deviceModelRef"]["name"]
            .as_str()
            .filter(|name| !name.is_empty())
            .map(|name| ObjectKey::new(Kind::DeviceModel, key.namespace.as_str(), name))
            .into_iter()
            .collect(),
        _ => BTreeSet::new(),
    }
}

/// The configmaps and secrets a pod uses: volumes (also projected ones),
/// environment variables, `envFrom`, and image pull secrets.
pub fn pod_references(namespace: &str, pod: &Value) -> BTreeSet<ObjectKey> {
    let mut refs = BTreeSet::new();
    let Some(spec) = pod
        .get("spec")
        .and_then(|spec| PodSpec::deserialize(spec).ok())
    else {
        return refs;
    };
    let mut add = |kind: Kind, name: Option<&String>| {
        if let Some(name) = name.filter(|n| !n.is_empty()) {
            refs.insert(ObjectKey::new(kind, namespace, name.as_str()));
        }
    };
    for secret in spec.image_pull_secrets.iter().flatten() {
        add(Kind::Secret, Some(&secret.name));
    }
    for volume in spec.volumes.iter().flatten() {
        add(
            Kind::ConfigMap,
            volume.config_map.as_ref().map(|cm| &cm.name),
        );
        add(
            Kind::Secret,
            volume.secret.as_ref().and_then(|s| s.secret_name.as_ref()),
        );
        let projected = volume.projected.as_ref().and_then(|p| p.sources.as_ref());
        for source in projected.into_iter().flatten() {
            add(
                Kind::ConfigMap,
                source.config_map.as_ref().map(|cm| &cm.name),
            );
            add(Kind::Secret, source.secret.as_ref().map(|s| &s.name));
        }
    }
    let containers = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten());
    for container in containers {
        for env in container.env.iter().flatten() {
            let from = env.value_from.as_ref();
            add(
                Kind::ConfigMap,
                from.and_then(|f| f.config_map_key_ref.as_ref())
                    .map(|r| &r.name),
            );
            add(
                Kind::Secret,
                from.and_then(|f| f.secret_key_ref.as_ref())
                    .map(|r| &r.name),
            );
        }
        for source in container.env_from.iter().flatten() {
            add(
                Kind::ConfigMap,
                source.config_map_ref.as_ref().map(|r| &r.name),
            );
            add(Kind::Secret, source.secret_ref.as_ref().map(|r| &r.name));
        }
    }
    refs
}
