//! KubeEdge's names for operations, resource types, groups and modules.

/// Operations (`router.operation`).
pub mod operation {
    /// Create an object.
    pub const INSERT: &str = "insert";
    /// Replace an object.
    pub const UPDATE: &str = "update";
    /// Patch an object.
    pub const PATCH: &str = "patch";
    /// Remove an object.
    pub const DELETE: &str = "delete";
    /// Ask for an object or a list.
    pub const QUERY: &str = "query";
    /// Push data up (status, reports).
    pub const UPLOAD: &str = "upload";
    /// A response to a request (`parent_id` names the request).
    pub const RESPONSE: &str = "response";
    /// An error response.
    pub const ERROR: &str = "error";
    /// Link keepalive.
    pub const KEEPALIVE: &str = "keepalive";
    /// Publish on the event bus.
    pub const PUBLISH: &str = "publish";
    /// Subscribe on the event bus.
    pub const SUBSCRIBE: &str = "subscribe";
    /// A node connected (hub event).
    pub const NODE_CONNECTED: &str = "connect";
    /// A node disconnected (hub event).
    pub const NODE_DISCONNECTED: &str = "disconnect";
}

/// The resource of an inventory query: every controlled object the edge
/// holds, with its version (`{"<ns>/<type>/<name>": "<version>"}`).
pub const INVENTORY: &str = "*/inventory";

/// Resource types (the `<type>` in a resource string).
pub mod resource_type {
    /// A pod.
    pub const POD: &str = "pod";
    /// A list of pods.
    pub const POD_LIST: &str = "podlist";
    /// A pod's status.
    pub const POD_STATUS: &str = "podstatus";
    /// A pod patch.
    pub const POD_PATCH: &str = "podpatch";
    /// A configmap.
    pub const CONFIGMAP: &str = "configmap";
    /// A secret.
    pub const SECRET: &str = "secret";
    /// A service.
    pub const SERVICE: &str = "service";
    /// A list of services.
    pub const SERVICE_LIST: &str = "servicelist";
    /// Endpoints of a service.
    pub const ENDPOINTS: &str = "endpoints";
    /// A list of endpoints.
    pub const ENDPOINTS_LIST: &str = "endpointslist";
    /// A node.
    pub const NODE: &str = "node";
    /// A node's status.
    pub const NODE_STATUS: &str = "nodestatus";
    /// A node patch.
    pub const NODE_PATCH: &str = "nodepatch";
    /// A node lease.
    pub const LEASE: &str = "lease";
    /// A service account token the cloud issued for a pod (a
    /// `TokenRequest` with its status), for the pod's projected volume.
    pub const SERVICE_ACCOUNT_TOKEN: &str = "serviceaccounttoken";
    /// A MetaServer's question to the cloud: may this service account
    /// token do what an edge application asks (`apis::access`)?
    pub const ACCESS_REVIEW: &str = "accessreview";
    /// A device.
    pub const DEVICE: &str = "device";
    /// A device model.
    pub const DEVICE_MODEL: &str = "devicemodel";
    /// A device's status (its reported twins and state).
    pub const DEVICE_STATUS: &str = "devicestatus";
    /// A device twin.
    pub const TWIN: &str = "twin";
    /// Device membership of a node.
    pub const MEMBERSHIP: &str = "membership";
    /// A router rule.
    pub const RULE: &str = "rule";
    /// A router rule endpoint.
    pub const RULE_ENDPOINT: &str = "ruleendpoint";
}

/// Module groups (`router.group`).
pub mod group {
    /// Cloud-side resource messages.
    pub const RESOURCE: &str = "resource";
    /// Metadata (metamanager).
    pub const META: &str = "meta";
    /// Device twins.
    pub const TWIN: &str = "twin";
    /// The pod agent.
    pub const EDGED: &str = "edged";
    /// The MQTT event bus.
    pub const BUS: &str = "bus";
    /// The hubs.
    pub const HUB: &str = "hub";
    /// User applications.
    pub const USER: &str = "user";
}

/// Module names.
pub mod module {
    /// Edge link to the cloud.
    pub const EDGEHUB: &str = "edgehub";
    /// Edge metadata store.
    pub const METAMANAGER: &str = "metamanager";
    /// Edge pod agent.
    pub const EDGED: &str = "edged";
    /// Edge device twin.
    pub const DEVICETWIN: &str = "twin";
    /// Edge MQTT bridge.
    pub const EVENTBUS: &str = "eventbus";
    /// Cloud side of the links.
    pub const CLOUDHUB: &str = "cloudhub";
    /// Cloud desired state for pods and their objects.
    pub const EDGECONTROLLER: &str = "edgecontroller";
    /// Cloud desired state for devices.
    pub const DEVICECONTROLLER: &str = "devicecontroller";
}
