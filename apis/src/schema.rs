//! The cloud's checks of objects against the whole Kubernetes schema
//! (k8s-openapi's types; the `kubernetes` feature): a manifest applied
//! through the admin API, a status an edge reports. The edge never needs
//! them: it reads objects as [`crate::k8s`]'s types.

use k8s_openapi::api::core::v1::{
    ConfigMap, Endpoints, Node, NodeStatus, Pod, PodStatus, Secret, Service,
};
use serde::Deserialize as _;
use serde_json::Value;

use crate::devices::{Device, DeviceModel, DeviceStatus};
use crate::kinds::{InvalidObject, Kind, parse};

impl Kind {
    /// Checks that `object` is a valid instance of this kind: it reads as
    /// the kind's k8s-openapi type (or [`crate::devices`]'s, for KubeEdge's
    /// kinds).
    pub fn check(self, object: &Value) -> Result<(), InvalidObject> {
        match self {
            Kind::Pod => parse::<Pod>(self, object),
            Kind::ConfigMap => parse::<ConfigMap>(self, object),
            Kind::Secret => parse::<Secret>(self, object),
            Kind::Service => parse::<Service>(self, object),
            Kind::Endpoints => parse::<Endpoints>(self, object),
            Kind::Node => parse::<Node>(self, object),
            Kind::Device => parse::<Device>(self, object),
            Kind::DeviceModel => parse::<DeviceModel>(self, object),
        }
    }

    /// Checks that `status` is a valid status of this kind.
    pub fn check_status(self, status: &Value) -> Result<(), InvalidObject> {
        let fails = |reason: String| InvalidObject {
            kind: self.name(),
            reason,
        };
        if !status.is_object() {
            return Err(fails("a status is an object".to_owned()));
        }
        let read = match self {
            Kind::Pod => PodStatus::deserialize(status).map(drop),
            Kind::Device => DeviceStatus::deserialize(status).map(drop),
            Kind::Node => NodeStatus::deserialize(status).map(drop),
            _ => return Err(fails("this kind has no status".to_owned())),
        };
        read.map_err(|err| fails(err.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::ListableResource;
    use serde_json::json;

    /// The kinds' names, plurals and versions, written out in
    /// [`crate::kinds`], are k8s-openapi's.
    #[test]
    fn the_kind_table_is_kubernetes_own() {
        fn same<T: ListableResource>(kind: Kind) {
            assert_eq!(kind.name(), T::KIND);
            assert_eq!(kind.list_name(), T::LIST_KIND);
            assert_eq!(kind.plural(), T::URL_PATH_SEGMENT);
            assert_eq!(kind.api_version(), T::API_VERSION);
        }
        same::<Pod>(Kind::Pod);
        same::<ConfigMap>(Kind::ConfigMap);
        same::<Secret>(Kind::Secret);
        same::<Service>(Kind::Service);
        same::<Endpoints>(Kind::Endpoints);
        same::<Node>(Kind::Node);
    }

    #[test]
    fn the_whole_schema_is_checked() {
        // `dnsPolicy` is not modelled at the edge, but checked here.
        let pod = json!({"spec": {"containers": [], "dnsPolicy": 5}});
        assert!(Kind::Pod.readable(&pod).is_ok());
        assert!(Kind::Pod.check(&pod).is_err());
        assert!(Kind::Pod.check_status(&json!({"qosClass": 5})).is_err());
        assert!(
            Kind::Node
                .check_status(&json!({"phase": "Running"}))
                .is_ok()
        );
        assert!(Kind::Secret.check_status(&json!({})).is_err());
    }
}
