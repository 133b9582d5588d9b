//! Kubernetes API discovery for the Kubernetes-shaped APIs edgehive serves
//! (the cloud's admin API, the edge's MetaServer): `/version`, `/api`,
//! `/api/v1`, `/apis` and `/apis/<group>/<version>`, built from
//! [`Kind`], so that kubectl (which asks these before anything else) finds
//! the kinds, their scope and short names. Aggregated discovery is not
//! served: kubectl asks for it first and falls back to these documents.
//!
//! One concern: describing what a server serves, as kube-apiserver does.

use actix_web::web;
use actix_web::{HttpResponse, Responder};
use serde_json::{Value, json};

use crate::devices;
use crate::kinds::Kind;

/// The Kubernetes minor version whose API edgehive speaks (its k8s-openapi
/// types), reported by `/version`.
pub const KUBERNETES_MINOR: &str = "34";

/// What a server does with its kinds: the verbs its discovery lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verbs {
    /// Reads only: get, list, watch (an edge's MetaServer).
    Read,
    /// Reads and delete (the cloud's admin API).
    ReadDelete,
}

impl Verbs {
    fn names(self) -> &'static [&'static str] {
        match self {
            Verbs::Read => &["get", "list", "watch"],
            Verbs::ReadDelete => &["delete", "get", "list", "watch"],
        }
    }
}

/// The discovery routes, answering for a server that does `verbs`.
pub fn routes(cfg: &mut web::ServiceConfig, verbs: Verbs) {
    let core = resource_list("v1", verbs);
    let devices = resource_list(devices::API_VERSION, verbs);
    cfg.route("/version", web::get().to(version))
        .route("/api", web::get().to(core_versions))
        .route("/apis", web::get().to(groups))
        .route(
            "/api/v1",
            web::get().to(move || {
                let core = core.clone();
                async move { HttpResponse::Ok().json(core) }
            }),
        )
        .route(
            &format!("/apis/{}", devices::API_VERSION),
            web::get().to(move || {
                let devices = devices.clone();
                async move { HttpResponse::Ok().json(devices) }
            }),
        )
        .route(
            &format!("/apis/{}", devices::GROUP),
            web::get().to(devices_group),
        );
}

/// kubectl's short names for a kind, as kube-apiserver lists them.
pub fn short_names(kind: Kind) -> &'static [&'static str] {
    match kind {
        Kind::Pod => &["po"],
        Kind::ConfigMap => &["cm"],
        Kind::Service => &["svc"],
        Kind::Endpoints => &["ep"],
        Kind::Node => &["no"],
        Kind::Device => &["dev"],
        Kind::DeviceModel => &["dm"],
        Kind::Secret => &[],
    }
}

/// The `APIResourceList` of `group_version` (`v1` or a group's).
pub fn resource_list(group_version: &str, verbs: Verbs) -> Value {
    let resources: Vec<Value> = Kind::ALL
        .into_iter()
        .filter(|kind| kind.api_version() == group_version)
        .map(|kind| {
            json!({
                "name": kind.plural(),
                "singularName": kind.name().to_ascii_lowercase(),
                "namespaced": kind.namespaced(),
                "kind": kind.name(),
                "verbs": verbs.names(),
                "shortNames": short_names(kind),
                // kubectl's `get all`, as kube-apiserver groups them.
                "categories": match kind {
                    Kind::Pod | Kind::Service => &["all"][..],
                    _ => &[][..],
                },
            })
        })
        .collect();
    json!({
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": group_version,
        "resources": resources,
    })
}

async fn version() -> impl Responder {
    HttpResponse::Ok().json(json!({
        "major": "1",
        "minor": KUBERNETES_MINOR,
        "gitVersion": format!("v1.{KUBERNETES_MINOR}.0-edgehive.{}", env!("CARGO_PKG_VERSION")),
        "gitCommit": "",
        "gitTreeState": "",
        "buildDate": "",
        "goVersion": "",
        "compiler": "rustc",
        "platform": format!("{}/{}", std::env::consts::OS, go_arch()),
    }))
}

/// The architecture as Go names it (kubectl shows it so).
fn go_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

async fn core_versions() -> impl Responder {
    HttpResponse::Ok().json(json!({
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [],
    }))
}

fn devices_group_value() -> Value {
    let version = devices::API_VERSION
        .rsplit_once('/')
        .map_or(devices::API_VERSION, |(_, version)| version);
    let group_version = json!({"groupVersion": devices::API_VERSION, "version": version});
    json!({
        "kind": "APIGroup",
        "apiVersion": "v1",
        "name": devices::GROUP,
        "versions": [group_version],
        "preferredVersion": group_version,
    })
}

async fn devices_group() -> impl Responder {
    HttpResponse::Ok().json(devices_group_value())
}

async fn groups() -> impl Responder {
    let mut group = devices_group_value();
    if let Some(group) = group.as_object_mut() {
        group.remove("kind");
        group.remove("apiVersion");
    }
    HttpResponse::Ok().json(json!({
        "kind": "APIGroupList",
        "apiVersion": "v1",
        "groups": [group],
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kind_is_listed_once_under_its_group_version() {
        let core = resource_list("v1", Verbs::Read);
        let devices = resource_list(devices::API_VERSION, Verbs::ReadDelete);
        let names = |list: &Value| -> Vec<String> {
            list["resources"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|r| r["name"].as_str().unwrap_or_default().to_owned())
                .collect()
        };
        let mut all = names(&core);
        all.extend(names(&devices));
        all.sort();
        let mut expected: Vec<String> = Kind::ALL.iter().map(|k| k.plural().to_owned()).collect();
        expected.sort();
        assert_eq!(all, expected);
        let nodes = core["resources"]
            .as_array()
            .and_then(|r| r.iter().find(|r| r["name"] == "nodes"))
            .cloned()
            .unwrap_or_default();
        assert_eq!(nodes["namespaced"], false);
        assert_eq!(nodes["shortNames"], json!(["no"]));
        assert_eq!(
            devices["resources"][0]["verbs"],
            json!(["delete", "get", "list", "watch"])
        );
    }
}
