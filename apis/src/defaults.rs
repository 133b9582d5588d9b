//! API-server defaulting: the fields kube-apiserver (v1.34) fills in when an
//! object is created, filled in the same way by edgehive's embedded
//! desired-state backend.
//!
//! Everything an edge node reads comes from that backend, and KubeEdge's
//! edgecore (like the kubelet it embeds) expects objects as a real API server
//! returns them: it refuses a pod whose `configMap` volume has no
//! `defaultMode`, whose `enableServiceLinks` is nil or whose `dnsPolicy` is
//! empty. So before an object is stored, [`apply`] gives it every default
//! the API server would give it, read from Kubernetes' own code (paths are
//! in kubernetes/kubernetes, tag v1.34):
//!
//! | what | where it comes from |
//! |---|---|
//! | field defaults of every core kind | `pkg/apis/core/v1/defaults.go` (`SetDefaults_*`) and the generated walk over nested types, `pkg/apis/core/v1/zz_generated.defaults.go` |
//! | declarative `+default=` markers (container and service port `protocol: TCP`, gRPC probe `service: ""`, RBD/iSCSI/ScaleIO/AzureDisk volume fields, `fileKeyRef.optional`) | `staging/src/k8s.io/api/core/v1/types.go`, applied by the same generated file |
//! | `serviceAccount` mirrored from `serviceAccountName`, negative `terminationGracePeriodSeconds` forced to 1, `stringData` merged into a secret's `data` | `pkg/apis/core/v1/conversion.go` |
//! | image pull policy (`Always` for `:latest` or no tag) | `SetDefaults_Container` with `pkg/util/parsers/parsers.go` over `github.com/distribution/reference` |
//! | resource quantities rounded up to milli-units and written in canonical form | `SetDefaults_ResourceList`; `staging/src/k8s.io/apimachinery/pkg/api/resource/quantity.go` |
//! | pod-level resources: requests from limits and container totals, hugepage limits (feature `PodLevelResources`, beta and on in 1.34) | `defaultPodRequests` and `defaultHugePagePodLimits` in `defaults.go`, with `staging/src/k8s.io/component-helpers/resource/helpers.go` |
//! | `tolerations` for `node.kubernetes.io/not-ready` and `unreachable`, `NoExecute`, 300 s | admission plugin `DefaultTolerationSeconds`, `plugin/pkg/admission/defaulttolerationseconds/admission.go` |
//! | `priority: 0` and `preemptionPolicy: PreemptLowerPriority`, and the built-in `system-node-critical`/`system-cluster-critical` classes | admission plugin `Priority`, `plugin/pkg/admission/priority/admission.go`, classes from `pkg/apis/scheduling/v1/helpers.go` |
//! | `serviceAccountName: default` (not on mirror pods) | admission plugin `ServiceAccount`, `plugin/pkg/admission/serviceaccount/admission.go` |
//! | pod `status` `{phase: Pending, qosClass}` | `PrepareForCreate` in `pkg/registry/core/pod/strategy.go`; QoS from `pkg/apis/core/helper/qos/qos.go` |
//! | service `ipFamilyPolicy` | `initIPFamilyFields` in `pkg/registry/core/service/storage/alloc.go` |
//! | service `status: {loadBalancer: {}}` | `PrepareForCreate` in `pkg/registry/core/service/strategy.go` |
//! | `Device` `spec.deviceModelRef.name: ""` | KubeEdge's CRD schema, `build/crds/devices/devices_v1beta1_device.yaml` |
//!
//! Some fields a real server returns are empty structs that Go always
//! writes out (`resources: {}` on a container, `securityContext: {}` on a
//! pod, `divisor: "0"` on a `resourceFieldRef`); they are filled in too, so
//! the JSON looks the same.
//!
//! The core kinds go through k8s-openapi's typed structs: the object is read
//! as, say, a `Pod`, its `Option` fields are filled, and it is written back.
//! That drops any field the type does not know, which is what the API server
//! does as well: it prunes unknown fields of built-in kinds. An object that
//! does not read as its kind is an error ([`DefaultsError`]) and is left as
//! it was.
//!
//! Defaulting is idempotent (a second [`apply`] changes nothing) and keeps
//! every value the caller set. Where Go cannot tell an empty string or a
//! zero from "unset" (a non-pointer field), an empty string or zero is
//! treated as unset, as the server does. The only values rewritten are
//! those the server itself rewrites on every write: `serviceAccount` (an
//! alias that always shows `serviceAccountName`), a service's
//! `sessionAffinityConfig` when `sessionAffinity` is `None`, a negative
//! `terminationGracePeriodSeconds`, a secret's `stringData` (moved into
//! `data`), quantities (same value, canonical spelling) and empty
//! `limits`/`requests` maps (which Go omits).
//!
//! Left out, because they are not defaulting or need state this module has
//! not got:
//! - what the registry owns: `uid`, `resourceVersion`, `creationTimestamp`,
//!   `generation` (a pod starts at 1) and the status of an existing object
//!   (the server resets a created pod's status to `{phase, qosClass}`; here
//!   a status the caller gave is kept and only completed);
//! - the service IP allocator: `clusterIP`/`clusterIPs`, `ipFamilies` (the
//!   family of the cluster's service CIDR), node ports and
//!   `healthCheckNodePort`;
//! - the service-account token: the `ServiceAccount` admission plugin also
//!   adds a projected `kube-api-access-*` volume and its mounts; that volume
//!   is the caller's business (it needs a token), as are `imagePullSecrets`
//!   taken from a service account;
//! - admission that reads other objects: a `priorityClassName` other than
//!   the two built-in classes (its value lives in a `PriorityClass`),
//!   `LimitRanger`, `RuntimeClass` overhead, mutating webhooks;
//! - scheduler-only rewrites in the pod strategy (`matchLabelKeys` merged
//!   into affinity and topology-spread selectors, the `SchedulingGated`
//!   condition: a gated pod is never bound, so no edge sees it) and the
//!   AppArmor annotation-to-field sync;
//! - fields of alpha features (off by default), which the server drops and
//!   this module keeps; image volumes' `pullPolicy`, defaulted only with the
//!   `ImageVolume` feature, off in 1.34;
//! - custom resources are not pruned: `Device` and `DeviceModel` are kept as
//!   JSON, with only what their CRD schema defaults filled in.
//!
//! One concern: the API server's defaults for the kinds edgehive carries,
//! table by table; long because Kubernetes has many defaults, not because it
//! does several things (image references and quantities are its submodules).

use std::cmp::Ordering;
use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{
    ClientIPConfig, ConfigMap, ContainerPort, EnvVar, Lifecycle, Node, Pod, PodSpec, PodStatus,
    Probe, ResourceFieldSelector, ResourceRequirements, Secret, Service, SessionAffinityConfig,
    Toleration, Volume,
};
use k8s_openapi::api::core::v1::{Endpoints, HTTPGetAction, ObjectFieldSelector};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

mod image_ref;
mod quantity;

use image_ref::image_tag;
use quantity::Qty;

/// An object defaulting could not handle; the object is left unchanged.
#[derive(Debug, thiserror::Error)]
pub enum DefaultsError {
    /// The object does not read as the kind it names (a required field is
    /// missing, a field has the wrong type, ...); the real API server
    /// rejects it too.
    #[error("not a valid {kind}: {source}")]
    Invalid {
        /// The kind the object named.
        kind: &'static str,
        /// What serde found wrong.
        #[source]
        source: serde_json::Error,
    },
    /// A resource quantity that does not parse, or lies beyond what this
    /// module computes with (38 significant digits).
    #[error("not a valid {kind}: {path}: {value:?} is not a quantity edgehive accepts: {reason}")]
    Quantity {
        /// The kind of the object.
        kind: &'static str,
        /// Where the quantity is, e.g. `spec.containers[0].resources.limits.cpu`.
        path: String,
        /// The quantity as given.
        value: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The defaulted object could not be turned back into JSON.
    #[error("{kind} could not be written back: {source}")]
    Serialize {
        /// The kind of the object.
        kind: &'static str,
        /// The serializer's error.
        #[source]
        source: serde_json::Error,
    },
}

/// Fills in the defaults the API server gives `object` on creation,
/// choosing by its `apiVersion` and `kind`: `v1` `Pod`, `ConfigMap`,
/// `Secret`, `Service`, `Endpoints` and `Node`, and
/// `devices.kubeedge.io/v1beta1` `Device` and `DeviceModel`. A missing
/// `apiVersion` is taken to be that kind's. Any other object is left
/// untouched. On error `object` is unchanged.
pub fn apply(object: &mut Value) -> Result<(), DefaultsError> {
    let api_version = object.get("apiVersion").map(Value::as_str);
    let kind = object.get("kind").and_then(Value::as_str);
    let core = matches!(api_version, None | Some(Some("v1")));
    let devices = matches!(api_version, None | Some(Some(crate::devices::API_VERSION)));
    match kind {
        Some("Pod") if core => typed(object, "Pod", pod),
        Some("ConfigMap") if core => typed(object, "ConfigMap", |c| {
            config_map(c);
            Ok(())
        }),
        Some("Secret") if core => typed(object, "Secret", |s| {
            secret(s);
            Ok(())
        }),
        Some("Service") if core => typed(object, "Service", |s| {
            service(s);
            Ok(())
        }),
        Some("Endpoints") if core => typed(object, "Endpoints", |e| {
            endpoints(e);
            Ok(())
        }),
        Some("Node") if core => typed(object, "Node", node),
        Some("Device") if devices => {
            device(object);
            Ok(())
        }
        Some("DeviceModel") if devices => {
            device_model(object);
            Ok(())
        }
        _ => Ok(()),
    }
}

/// Reads `object` as `T`, runs `defaults` on it and writes it back.
fn typed<T: DeserializeOwned + Serialize>(
    object: &mut Value,
    kind: &'static str,
    defaults: impl FnOnce(&mut T) -> Result<(), DefaultsError>,
) -> Result<(), DefaultsError> {
    let mut typed =
        T::deserialize(&*object).map_err(|source| DefaultsError::Invalid { kind, source })?;
    defaults(&mut typed)?;
    *object =
        serde_json::to_value(&typed).map_err(|source| DefaultsError::Serialize { kind, source })?;
    Ok(())
}

// ---------------------------------------------------------------------------
// Pod
// ---------------------------------------------------------------------------

/// The annotation that marks a mirror pod (a static pod's API copy); the
/// `ServiceAccount` admission plugin leaves those alone.
const MIRROR_POD_ANNOTATION: &str = "kubernetes.io/config.mirror";
/// The taint a node gets when it is not ready.
const TAINT_NOT_READY: &str = "node.kubernetes.io/not-ready";
/// The taint a node gets when the node controller cannot reach it.
const TAINT_UNREACHABLE: &str = "node.kubernetes.io/unreachable";
/// `--default-not-ready-toleration-seconds` and
/// `--default-unreachable-toleration-seconds` at their defaults.
const DEFAULT_TOLERATION_SECONDS: i64 = 300;
/// `defaultMode` of configMap, secret, downwardAPI and projected volumes
/// (0644).
const DEFAULT_VOLUME_MODE: i32 = 0o644;

/// The fields `SetDefaults_Container` and the generated walk default, for
/// regular, init and ephemeral containers alike.
struct ContainerFields<'a> {
    image: Option<&'a str>,
    image_pull_policy: &'a mut Option<String>,
    termination_message_path: &'a mut Option<String>,
    termination_message_policy: &'a mut Option<String>,
    ports: &'a mut Option<Vec<ContainerPort>>,
    env: &'a mut Option<Vec<EnvVar>>,
    resources: &'a mut Option<ResourceRequirements>,
    probes: [&'a mut Option<Probe>; 3],
    lifecycle: &'a mut Option<Lifecycle>,
}

/// Borrows the [`ContainerFields`] of a `Container` or `EphemeralContainer`.
macro_rules! container_fields {
    ($c:expr) => {{
        let c = $c;
        ContainerFields {
            image: c.image.as_deref(),
            image_pull_policy: &mut c.image_pull_policy,
            termination_message_path: &mut c.termination_message_path,
            termination_message_policy: &mut c.termination_message_policy,
            ports: &mut c.ports,
            env: &mut c.env,
            resources: &mut c.resources,
            probes: [
                &mut c.liveness_probe,
                &mut c.readiness_probe,
                &mut c.startup_probe,
            ],
            lifecycle: &mut c.lifecycle,
        }
    }};
}

/// Fills in what kube-apiserver fills in when `pod` is created: the
/// `SetDefaults_*` functions of the pod, its spec, volumes, containers and
/// probes, the `ServiceAccount`, `Priority` and `DefaultTolerationSeconds`
/// admission plugins, and the created pod's status (`phase: Pending` and its
/// QoS class). The projected service-account token volume is not added: it
/// is the caller's business (see the module docs).
///
/// Fails only on a resource quantity that does not parse; `pod` may then
/// be partly defaulted ([`apply`] leaves the JSON untouched).
pub fn pod(pod: &mut Pod) -> Result<(), DefaultsError> {
    let mirror = pod
        .metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(MIRROR_POD_ANNOTATION));
    let spec = pod.spec.get_or_insert_with(PodSpec::default);

    // conversion.go: the deprecated alias is read when the name is unset;
    // a negative grace period becomes 1.
    if is_unset(&spec.service_account_name) && !is_unset(&spec.service_account) {
        spec.service_account_name = spec.service_account.clone();
    }
    if let Some(grace) = &mut spec.termination_grace_period_seconds
        && *grace < 0
    {
        *grace = 1;
    }

    // SetDefaults_Pod: requests default to limits (regular and init
    // containers, not a pod template's), then pod-level resources.
    for container in spec
        .containers
        .iter_mut()
        .chain(spec.init_containers.iter_mut().flatten())
    {
        if let Some(resources) = &mut container.resources {
            requests_from_limits(resources);
        }
    }
    pod_level_resources(spec)?;
    spec.enable_service_links.get_or_insert(true);
    if spec.host_network == Some(true) {
        for container in spec
            .containers
            .iter_mut()
            .chain(spec.init_containers.iter_mut().flatten())
        {
            for port in container.ports.iter_mut().flatten() {
                if matches!(port.host_port, None | Some(0)) {
                    port.host_port = Some(port.container_port);
                }
            }
        }
    }

    // SetDefaults_PodSpec.
    default_str(&mut spec.dns_policy, "ClusterFirst");
    default_str(&mut spec.restart_policy, "Always");
    spec.security_context.get_or_insert_with(Default::default);
    spec.termination_grace_period_seconds.get_or_insert(30);
    default_str(&mut spec.scheduler_name, "default-scheduler");

    // The generated walk: volumes, containers, overhead, pod resources.
    for (i, volume) in spec.volumes.iter_mut().flatten().enumerate() {
        volume_defaults(volume, &format!("spec.volumes[{i}]"))?;
    }
    for (i, c) in spec.init_containers.iter_mut().flatten().enumerate() {
        container_defaults(container_fields!(c), &format!("spec.initContainers[{i}]"))?;
    }
    for (i, c) in spec.containers.iter_mut().enumerate() {
        container_defaults(container_fields!(c), &format!("spec.containers[{i}]"))?;
    }
    for (i, c) in spec.ephemeral_containers.iter_mut().flatten().enumerate() {
        container_defaults(
            container_fields!(c),
            &format!("spec.ephemeralContainers[{i}]"),
        )?;
    }
    round_list(&mut spec.overhead, "Pod", "spec.overhead")?;
    if let Some(resources) = &mut spec.resources {
        round_list(&mut resources.limits, "Pod", "spec.resources.limits")?;
        round_list(&mut resources.requests, "Pod", "spec.resources.requests")?;
    }

    // Admission: ServiceAccount, Priority, DefaultTolerationSeconds.
    if !mirror && is_unset(&spec.service_account_name) {
        spec.service_account_name = Some("default".to_owned());
    }
    if is_unset(&spec.service_account_name) {
        spec.service_account_name = None;
    }
    spec.service_account = spec.service_account_name.clone();
    priority(spec);
    default_tolerations(spec);

    // The pod strategy's PrepareForCreate: a new pod is Pending, with the
    // QoS class of its (defaulted) spec.
    let status = pod.status.get_or_insert_with(PodStatus::default);
    default_str(&mut status.phase, "Pending");
    if is_unset(&status.qos_class) {
        status.qos_class = Some(qos_class(spec)?.to_owned());
    }
    Ok(())
}

/// `SetDefaults_Pod`: every resource with a limit and no request gets the
/// limit as its request.
fn requests_from_limits(resources: &mut ResourceRequirements) {
    let Some(limits) = resources.limits.as_ref().filter(|l| !l.is_empty()) else {
        return;
    };
    let requests = resources.requests.get_or_insert_with(BTreeMap::new);
    for (name, limit) in limits {
        requests
            .entry(name.clone())
            .or_insert_with(|| limit.clone());
    }
}

/// The `Priority` admission plugin, with no `PriorityClass` marked
/// `globalDefault` (none is, out of the box): a pod without a class gets
/// priority 0; the two built-in classes have fixed values. Any other class
/// is left to whoever knows its value.
fn priority(spec: &mut PodSpec) {
    if is_unset(&spec.priority_class_name) {
        spec.priority_class_name = None;
    }
    let value = match spec.priority_class_name.as_deref() {
        None => 0,
        Some("system-node-critical") => 2_000_001_000,
        Some("system-cluster-critical") => 2_000_000_000,
        Some(_) => return,
    };
    spec.priority.get_or_insert(value);
    spec.preemption_policy
        .get_or_insert_with(|| "PreemptLowerPriority".to_owned());
}

/// The `DefaultTolerationSeconds` admission plugin: a pod that does not
/// already tolerate `not-ready` (or `unreachable`) `NoExecute` taints
/// tolerates them for 300 seconds. A toleration with no key or no effect
/// counts as tolerating them, as in the plugin.
fn default_tolerations(spec: &mut PodSpec) {
    let tolerates = |taint: &str| {
        spec.tolerations.iter().flatten().any(|t| {
            let key = t.key.as_deref().unwrap_or("");
            let effect = t.effect.as_deref().unwrap_or("");
            (key == taint || key.is_empty()) && (effect == "NoExecute" || effect.is_empty())
        })
    };
    let missing: Vec<&str> = [TAINT_NOT_READY, TAINT_UNREACHABLE]
        .into_iter()
        .filter(|taint| !tolerates(taint))
        .collect();
    for taint in missing {
        spec.tolerations
            .get_or_insert_with(Vec::new)
            .push(Toleration {
                key: Some(taint.to_owned()),
                operator: Some("Exists".to_owned()),
                effect: Some("NoExecute".to_owned()),
                toleration_seconds: Some(DEFAULT_TOLERATION_SECONDS),
                value: None,
            });
    }
}

fn container_defaults(c: ContainerFields<'_>, path: &str) -> Result<(), DefaultsError> {
    if is_unset(c.image_pull_policy) {
        *c.image_pull_policy = Some(image_pull_policy(c.image.unwrap_or("")).to_owned());
    }
    default_str(c.termination_message_path, "/dev/termination-log");
    default_str(c.termination_message_policy, "File");
    for port in c.ports.iter_mut().flatten() {
        default_str(&mut port.protocol, "TCP");
    }
    for (i, var) in c.env.iter_mut().flatten().enumerate() {
        let Some(from) = &mut var.value_from else {
            continue;
        };
        if let Some(field) = &mut from.field_ref {
            field_selector(field);
        }
        if let Some(resource) = &mut from.resource_field_ref {
            resource_selector(
                resource,
                &format!("{path}.env[{i}].valueFrom.resourceFieldRef"),
            )?;
        }
        if let Some(file) = &mut from.file_key_ref {
            file.optional.get_or_insert(false);
        }
    }
    // A Go container always shows its (non-pointer) resources, `{}` if
    // empty; empty maps are omitted.
    let resources = c.resources.get_or_insert_with(Default::default);
    round_list(
        &mut resources.limits,
        "Pod",
        &format!("{path}.resources.limits"),
    )?;
    round_list(
        &mut resources.requests,
        "Pod",
        &format!("{path}.resources.requests"),
    )?;
    for probe in c.probes.into_iter().flatten() {
        probe_defaults(probe);
    }
    if let Some(lifecycle) = c.lifecycle {
        for handler in [&mut lifecycle.post_start, &mut lifecycle.pre_stop]
            .into_iter()
            .flatten()
        {
            if let Some(get) = &mut handler.http_get {
                http_get(get);
            }
        }
    }
    Ok(())
}

/// The image pull policy the API server gives a container whose
/// `imagePullPolicy` is unset: `Always` when the image reference parses and
/// its tag is `latest` or it has neither tag nor digest, else
/// `IfNotPresent` (`SetDefaults_Container`, `parsers.ParseImageName`).
pub fn image_pull_policy(image: &str) -> &'static str {
    match image_tag(image) {
        Some(tag) if tag == "latest" => "Always",
        _ => "IfNotPresent",
    }
}

/// `SetDefaults_Probe`, `SetDefaults_HTTPGetAction` and the gRPC probe's
/// `service: ""`. Zero counts as unset (the Go fields are plain ints).
fn probe_defaults(probe: &mut Probe) {
    default_int(&mut probe.timeout_seconds, 1);
    default_int(&mut probe.period_seconds, 10);
    default_int(&mut probe.success_threshold, 1);
    default_int(&mut probe.failure_threshold, 3);
    if let Some(get) = &mut probe.http_get {
        http_get(get);
    }
    if let Some(grpc) = &mut probe.grpc {
        grpc.service.get_or_insert_with(String::new);
    }
}

fn http_get(get: &mut HTTPGetAction) {
    default_str(&mut get.path, "/");
    default_str(&mut get.scheme, "HTTP");
}

/// `SetDefaults_ObjectFieldSelector`.
fn field_selector(field: &mut ObjectFieldSelector) {
    default_str(&mut field.api_version, "v1");
}

/// A `resourceFieldRef`'s `divisor` is a non-pointer quantity in Go, so the
/// server always shows it: `"0"` when unset, else in canonical form.
fn resource_selector(
    selector: &mut ResourceFieldSelector,
    path: &str,
) -> Result<(), DefaultsError> {
    match &mut selector.divisor {
        None => selector.divisor = Some(Quantity("0".to_owned())),
        Some(divisor) => canonical_quantity(divisor, "Pod", &format!("{path}.divisor"))?,
    }
    Ok(())
}

/// `SetDefaults_Volume` and the defaults of each volume source.
fn volume_defaults(volume: &mut Volume, path: &str) -> Result<(), DefaultsError> {
    let sourceless = Volume {
        name: volume.name.clone(),
        ..Volume::default()
    };
    if *volume == sourceless {
        volume.empty_dir = Some(Default::default());
    }
    if let Some(host_path) = &mut volume.host_path {
        host_path.type_.get_or_insert_with(String::new);
    }
    if let Some(empty_dir) = &mut volume.empty_dir
        && let Some(limit) = &mut empty_dir.size_limit
    {
        canonical_quantity(limit, "Pod", &format!("{path}.emptyDir.sizeLimit"))?;
    }
    if let Some(secret) = &mut volume.secret {
        secret.default_mode.get_or_insert(DEFAULT_VOLUME_MODE);
    }
    if let Some(config_map) = &mut volume.config_map {
        config_map.default_mode.get_or_insert(DEFAULT_VOLUME_MODE);
    }
    if let Some(downward) = &mut volume.downward_api {
        downward.default_mode.get_or_insert(DEFAULT_VOLUME_MODE);
        for (i, item) in downward.items.iter_mut().flatten().enumerate() {
            if let Some(field) = &mut item.field_ref {
                field_selector(field);
            }
            if let Some(resource) = &mut item.resource_field_ref {
                resource_selector(
                    resource,
                    &format!("{path}.downwardAPI.items[{i}].resourceFieldRef"),
                )?;
            }
        }
    }
    if let Some(projected) = &mut volume.projected {
        projected.default_mode.get_or_insert(DEFAULT_VOLUME_MODE);
        for (i, source) in projected.sources.iter_mut().flatten().enumerate() {
            if let Some(downward) = &mut source.downward_api {
                for (j, item) in downward.items.iter_mut().flatten().enumerate() {
                    if let Some(field) = &mut item.field_ref {
                        field_selector(field);
                    }
                    if let Some(resource) = &mut item.resource_field_ref {
                        let at = format!(
                            "{path}.projected.sources[{i}].downwardAPI.items[{j}].resourceFieldRef"
                        );
                        resource_selector(resource, &at)?;
                    }
                }
            }
            if let Some(token) = &mut source.service_account_token {
                token.expiration_seconds.get_or_insert(3600);
            }
        }
    }
    if let Some(iscsi) = &mut volume.iscsi {
        default_str(&mut iscsi.iscsi_interface, "default");
    }
    if let Some(rbd) = &mut volume.rbd {
        default_str(&mut rbd.pool, "rbd");
        default_str(&mut rbd.user, "admin");
        default_str(&mut rbd.keyring, "/etc/ceph/keyring");
    }
    if let Some(azure) = &mut volume.azure_disk {
        azure
            .caching_mode
            .get_or_insert_with(|| "ReadWrite".to_owned());
        azure.fs_type.get_or_insert_with(|| "ext4".to_owned());
        azure.read_only.get_or_insert(false);
        azure.kind.get_or_insert_with(|| "Shared".to_owned());
    }
    if let Some(scale_io) = &mut volume.scale_io {
        default_str(&mut scale_io.storage_mode, "ThinProvisioned");
        default_str(&mut scale_io.fs_type, "xfs");
    }
    if let Some(template) = volume
        .ephemeral
        .as_mut()
        .and_then(|e| e.volume_claim_template.as_mut())
    {
        let claim = &mut template.spec;
        claim
            .volume_mode
            .get_or_insert_with(|| "Filesystem".to_owned());
        let resources = claim.resources.get_or_insert_with(Default::default);
        let at = format!("{path}.ephemeral.volumeClaimTemplate.spec.resources");
        round_list(&mut resources.limits, "Pod", &format!("{at}.limits"))?;
        round_list(&mut resources.requests, "Pod", &format!("{at}.requests"))?;
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// Pod-level resources and QoS
// ---------------------------------------------------------------------------

/// Resource totals by name.
type Totals = BTreeMap<String, Qty>;

/// `defaultHugePagePodLimits` and `defaultPodRequests` (`PodLevelResources`
/// is on in 1.34): with pod-level resources partly given, hugepage limits
/// come from the containers' total, and requests from the containers'
/// total (cpu, memory) or else the pod-level limit.
fn pod_level_resources(spec: &mut PodSpec) -> Result<(), DefaultsError> {
    let Some(pod_resources) = &spec.resources else {
        return Ok(());
    };
    let mut limits = pod_resources.limits.clone().unwrap_or_default();
    let mut requests = pod_resources.requests.clone().unwrap_or_default();
    if limits.is_empty() && requests.is_empty() {
        return Ok(());
    }
    for (name, total) in aggregate(spec, |r| r.limits.as_ref())? {
        if name.starts_with("hugepages-") && !requests.contains_key(&name) {
            limits
                .entry(name)
                .or_insert_with(|| Quantity(total.to_text()));
        }
    }
    if limits.is_empty() {
        return Ok(());
    }
    for (name, total) in aggregate(spec, |r| r.requests.as_ref())? {
        if matches!(name.as_str(), "cpu" | "memory") {
            requests
                .entry(name)
                .or_insert_with(|| Quantity(total.to_text()));
        }
    }
    for (name, limit) in &limits {
        if pod_level_resource(name) {
            requests
                .entry(name.clone())
                .or_insert_with(|| limit.clone());
        }
    }
    let resources = spec.resources.get_or_insert_with(Default::default);
    resources.limits = Some(limits);
    if !requests.is_empty() {
        resources.requests = Some(requests);
    }
    Ok(())
}

/// The resources pod-level `resources` may name.
fn pod_level_resource(name: &str) -> bool {
    matches!(name, "cpu" | "memory") || name.starts_with("hugepages-")
}

/// `AggregateContainerRequests`/`AggregateContainerLimits`: the sum over
/// regular containers and restartable (sidecar) init containers, or, if
/// larger, what the pod needs while each init container runs (it plus the
/// sidecars started before it).
fn aggregate(
    spec: &PodSpec,
    pick: impl Fn(&ResourceRequirements) -> Option<&BTreeMap<String, Quantity>>,
) -> Result<Totals, DefaultsError> {
    let list = |resources: &Option<ResourceRequirements>, path: String| {
        parse_list(resources.as_ref().and_then(&pick), &path)
    };
    let mut total = Totals::new();
    for (i, c) in spec.containers.iter().enumerate() {
        add_totals(
            &mut total,
            &list(&c.resources, format!("spec.containers[{i}].resources"))?,
        )?;
    }
    let mut sidecars = Totals::new();
    let mut init_peak = Totals::new();
    for (i, c) in spec.init_containers.iter().flatten().enumerate() {
        let own = list(&c.resources, format!("spec.initContainers[{i}].resources"))?;
        let running = if c.restart_policy.as_deref() == Some("Always") {
            add_totals(&mut total, &own)?;
            add_totals(&mut sidecars, &own)?;
            sidecars.clone()
        } else {
            let mut running = own;
            add_totals(&mut running, &sidecars)?;
            running
        };
        max_totals(&mut init_peak, &running);
    }
    max_totals(&mut total, &init_peak);
    Ok(total)
}

fn parse_list(
    list: Option<&BTreeMap<String, Quantity>>,
    path: &str,
) -> Result<Totals, DefaultsError> {
    list.into_iter()
        .flatten()
        .map(|(name, q)| {
            Qty::parse(&q.0)
                .map(|parsed| (name.clone(), parsed))
                .map_err(|reason| quantity_error("Pod", format!("{path}.{name}"), &q.0, reason))
        })
        .collect()
}

fn add_totals(total: &mut Totals, add: &Totals) -> Result<(), DefaultsError> {
    for (name, q) in add {
        match total.get_mut(name) {
            Some(sum) => sum.add(q).map_err(|reason| {
                quantity_error("Pod", format!("total {name}"), &q.to_text(), reason)
            })?,
            None => {
                total.insert(name.clone(), q.clone());
            }
        }
    }
    Ok(())
}

fn max_totals(total: &mut Totals, other: &Totals) {
    for (name, q) in other {
        if total
            .get(name)
            .is_none_or(|t| q.cmp_value(t) == Ordering::Greater)
        {
            total.insert(name.clone(), q.clone());
        }
    }
}

/// The QoS class kube-apiserver records in a new pod's status, computed
/// from its (defaulted) spec as `ComputePodQOS` does: `BestEffort` when no
/// container (or, with pod-level resources, the pod) requests or limits cpu
/// or memory; `Guaranteed` when every container limits both and the
/// requests equal the limits (summed over containers); `Burstable`
/// otherwise. Ephemeral containers do not count.
pub fn qos_class(spec: &PodSpec) -> Result<&'static str, DefaultsError> {
    let mut requests = Totals::new();
    let mut limits = Totals::new();
    let mut guaranteed = true;
    // Adds the positive cpu/memory quantities of `list`; returns which
    // were there.
    let collect = |into: &mut Totals, list: Option<&BTreeMap<String, Quantity>>, path: &str| {
        let mut found = (false, false);
        for (name, q) in parse_list(list, path)? {
            if !matches!(name.as_str(), "cpu" | "memory") || !q.is_positive() {
                continue;
            }
            if name == "cpu" {
                found.0 = true;
            } else {
                found.1 = true;
            }
            add_totals(into, &Totals::from([(name, q)]))?;
        }
        Ok::<_, DefaultsError>(found)
    };
    if let Some(pod_resources) = &spec.resources {
        collect(
            &mut requests,
            pod_resources.requests.as_ref(),
            "spec.resources.requests",
        )?;
        let limited = pod_resources.limits.as_ref().filter(|l| !l.is_empty());
        if limited.is_some()
            && collect(&mut limits, limited, "spec.resources.limits")? != (true, true)
        {
            guaranteed = false;
        }
    } else {
        let containers = spec
            .containers
            .iter()
            .enumerate()
            .map(|(i, c)| (format!("spec.containers[{i}]"), c));
        let init = spec
            .init_containers
            .iter()
            .flatten()
            .enumerate()
            .map(|(i, c)| (format!("spec.initContainers[{i}]"), c));
        for (path, c) in containers.chain(init) {
            let resources = c.resources.as_ref();
            let at = format!("{path}.resources.requests");
            collect(
                &mut requests,
                resources.and_then(|r| r.requests.as_ref()),
                &at,
            )?;
            let at = format!("{path}.resources.limits");
            if collect(&mut limits, resources.and_then(|r| r.limits.as_ref()), &at)? != (true, true)
            {
                guaranteed = false;
            }
        }
    }
    if requests.is_empty() && limits.is_empty() {
        return Ok("BestEffort");
    }
    let equal = requests.iter().all(|(name, request)| {
        limits
            .get(name)
            .is_some_and(|limit| limit.cmp_value(request) == Ordering::Equal)
    });
    if guaranteed && equal && requests.len() == limits.len() {
        Ok("Guaranteed")
    } else {
        Ok("Burstable")
    }
}

// ---------------------------------------------------------------------------
// ConfigMap, Secret, Service, Endpoints, Node
// ---------------------------------------------------------------------------

/// `SetDefaults_ConfigMap` makes a nil `data` an empty map, which Go then
/// omits from the JSON, so nothing visible changes: this does nothing.
/// ([`apply`] still reads the object as a `ConfigMap`, so an invalid one is
/// refused and unknown fields are pruned.)
pub fn config_map(_config_map: &mut ConfigMap) {}

/// `SetDefaults_Secret`: `type: Opaque`. And, as the v1 conversion does,
/// `stringData` is merged into `data` (overriding the same keys) and never
/// stored.
pub fn secret(secret: &mut Secret) {
    default_str(&mut secret.type_, "Opaque");
    if let Some(strings) = secret.string_data.take().filter(|s| !s.is_empty()) {
        let data = secret.data.get_or_insert_with(BTreeMap::new);
        for (key, value) in strings {
            data.insert(key, ByteString(value.into_bytes()));
        }
    }
}

/// `SetDefaults_Service`: `type: ClusterIP`, `sessionAffinity: None` (and
/// the ClientIP timeout, 10800 s), each port's `protocol: TCP` and
/// `targetPort` = `port`, `internalTrafficPolicy: Cluster`,
/// `externalTrafficPolicy: Cluster` for externally reachable services,
/// `allocateLoadBalancerNodePorts: true` and ingress `ipMode: VIP` for load
/// balancers. Then what the service REST storage sets before allocation:
/// `ipFamilyPolicy` (`SingleStack`, or `RequireDualStack` for a headless
/// service without selector; none for `ExternalName`), and the empty
/// `status.loadBalancer` a new service shows.
///
/// Allocation is left out: `clusterIP`/`clusterIPs`, `ipFamilies` (the
/// family of the cluster's service CIDR), node ports and
/// `healthCheckNodePort` are the allocator's, not defaulting.
pub fn service(service: &mut Service) {
    let spec = service.spec.get_or_insert_with(Default::default);
    default_str(&mut spec.session_affinity, "None");
    match spec.session_affinity.as_deref() {
        Some("None") => spec.session_affinity_config = None,
        Some("ClientIP") => {
            let timeout = spec
                .session_affinity_config
                .as_ref()
                .and_then(|c| c.client_ip.as_ref())
                .and_then(|c| c.timeout_seconds);
            if timeout.is_none() {
                spec.session_affinity_config = Some(SessionAffinityConfig {
                    client_ip: Some(ClientIPConfig {
                        timeout_seconds: Some(10800),
                    }),
                });
            }
        }
        _ => {}
    }
    default_str(&mut spec.type_, "ClusterIP");
    for port in spec.ports.iter_mut().flatten() {
        default_str(&mut port.protocol, "TCP");
        let unset = match &port.target_port {
            None => true,
            Some(IntOrString::Int(n)) => *n == 0,
            Some(IntOrString::String(s)) => s.is_empty(),
        };
        if unset {
            port.target_port = Some(IntOrString::Int(port.port));
        }
    }
    let type_ = spec.type_.clone().unwrap_or_default();
    let external_ips = spec
        .external_ips
        .as_ref()
        .is_some_and(|ips| !ips.is_empty());
    let externally_accessible = matches!(type_.as_str(), "LoadBalancer" | "NodePort")
        || (type_ == "ClusterIP" && external_ips);
    if externally_accessible {
        default_str(&mut spec.external_traffic_policy, "Cluster");
    }
    if spec.internal_traffic_policy.is_none()
        && matches!(type_.as_str(), "ClusterIP" | "NodePort" | "LoadBalancer")
    {
        spec.internal_traffic_policy = Some("Cluster".to_owned());
    }
    if type_ == "LoadBalancer" {
        spec.allocate_load_balancer_node_ports.get_or_insert(true);
    }
    if type_ != "ExternalName" && spec.ip_family_policy.is_none() {
        let headless = spec.cluster_ip.as_deref() == Some("None")
            || spec
                .cluster_ips
                .as_ref()
                .and_then(|ips| ips.first())
                .is_some_and(|ip| ip == "None");
        let selectorless = spec.selector.as_ref().is_none_or(BTreeMap::is_empty);
        let policy = if headless && selectorless {
            "RequireDualStack"
        } else {
            "SingleStack"
        };
        spec.ip_family_policy = Some(policy.to_owned());
    }
    let status = service.status.get_or_insert_with(Default::default);
    let load_balancer = status.load_balancer.get_or_insert_with(Default::default);
    if type_ == "LoadBalancer" {
        for ingress in load_balancer.ingress.iter_mut().flatten() {
            if !is_unset(&ingress.ip) && ingress.ip_mode.is_none() {
                ingress.ip_mode = Some("VIP".to_owned());
            }
        }
    }
}

/// `SetDefaults_Endpoints`: each port's `protocol: TCP`.
pub fn endpoints(endpoints: &mut Endpoints) {
    for subset in endpoints.subsets.iter_mut().flatten() {
        for port in subset.ports.iter_mut().flatten() {
            default_str(&mut port.protocol, "TCP");
        }
    }
}

/// `SetDefaults_NodeStatus` (`allocatable` defaults to `capacity`) and the
/// rounding of both to milli-units. Fails only on a quantity that does not
/// parse (`node` may then be partly defaulted).
pub fn node(node: &mut Node) -> Result<(), DefaultsError> {
    if let Some(status) = &mut node.status {
        if status.allocatable.is_none() && status.capacity.is_some() {
            status.allocatable = status.capacity.clone();
        }
        round_list(&mut status.capacity, "Node", "status.capacity")?;
        round_list(&mut status.allocatable, "Node", "status.allocatable")?;
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// KubeEdge devices
// ---------------------------------------------------------------------------

/// A `devices.kubeedge.io/v1beta1` `Device` is a custom resource: the API
/// server fills in only what its CRD's OpenAPI schema defaults, which is
/// `spec.deviceModelRef.name: ""` when the reference is there without a
/// name. The object stays JSON: edgehive's [`crate::devices::Device`] does
/// not carry every field of the CRD, so reading it would lose some.
pub fn device(device: &mut Value) {
    if let Some(reference) = device
        .pointer_mut("/spec/deviceModelRef")
        .and_then(Value::as_object_mut)
    {
        reference
            .entry("name")
            .or_insert_with(|| Value::String(String::new()));
    }
}

/// A `devices.kubeedge.io/v1beta1` `DeviceModel`: its CRD schema defaults
/// nothing, so there is nothing to fill in.
pub fn device_model(_model: &mut Value) {}

// ---------------------------------------------------------------------------
// Small helpers
// ---------------------------------------------------------------------------

/// An unset Go string: missing or empty.
fn is_unset(field: &Option<String>) -> bool {
    field.as_deref().is_none_or(str::is_empty)
}

/// Sets a Go (non-pointer) string field that is missing or empty.
fn default_str(field: &mut Option<String>, value: &str) {
    if is_unset(field) {
        *field = Some(value.to_owned());
    }
}

/// Sets a Go (non-pointer) int field that is missing or zero.
fn default_int(field: &mut Option<i32>, value: i32) {
    if matches!(field, None | Some(0)) {
        *field = Some(value);
    }
}

fn quantity_error(
    kind: &'static str,
    path: String,
    value: &str,
    reason: &'static str,
) -> DefaultsError {
    DefaultsError::Quantity {
        kind,
        path,
        value: value.to_owned(),
        reason,
    }
}

/// `SetDefaults_ResourceList`: every quantity rounded up to milli-units,
/// written in canonical form; an empty list is dropped (Go omits it).
fn round_list(
    list: &mut Option<BTreeMap<String, Quantity>>,
    kind: &'static str,
    path: &str,
) -> Result<(), DefaultsError> {
    if list.as_ref().is_some_and(BTreeMap::is_empty) {
        *list = None;
    }
    for (name, q) in list.iter_mut().flatten() {
        let mut parsed = Qty::parse(&q.0)
            .map_err(|reason| quantity_error(kind, format!("{path}.{name}"), &q.0, reason))?;
        parsed.round_up_milli();
        q.0 = parsed.to_text();
    }
    Ok(())
}

/// A quantity as the server writes it back (no rounding).
fn canonical_quantity(
    q: &mut Quantity,
    kind: &'static str,
    path: &str,
) -> Result<(), DefaultsError> {
    let parsed =
        Qty::parse(&q.0).map_err(|reason| quantity_error(kind, path.to_owned(), &q.0, reason))?;
    q.0 = parsed.to_text();
    Ok(())
}

#[cfg(test)]
mod tests;
