//! `edgecore.yaml`: which of the edge's modules run, where they listen and
//! dial, where data lives (shaped like KubeEdge's edgecore.yaml; the
//! reading, flags and checks all configurations share are in
//! `cmd_common::config`).

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use cmd_common::config::{
    Check, CoreConfig, Listener, apply_listener_flag, check_host_port, or_under,
};

impl EdgeCoreConfig {
    /// Where the node's credentials live.
    pub fn certificate_dir(&self) -> PathBuf {
        or_under(
            &self.modules.edge_hub.certificate_dir,
            &self.data_dir,
            "pki",
        )
    }
}

/// `edgecore.yaml`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct EdgeCoreConfig {
    /// `edgecore.config.edgehive.io/v1alpha1`.
    pub api_version: String,
    /// `EdgeCore`.
    pub kind: String,
    /// Where the node's certificate, its object store and its pods' files
    /// live.
    pub data_dir: PathBuf,
    /// Log filter (RUST_LOG syntax); RUST_LOG wins when set.
    pub log: String,
    /// The modules.
    pub modules: EdgeModules,
}

/// edgecore's modules.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct EdgeModules {
    /// edgehub: the link to the cloud.
    pub edge_hub: EdgeHubSection,
    /// metamanager and its MetaServer (the edge's objects for local
    /// applications, secrets included: on loopback, or with
    /// `requireAuthorization`).
    pub meta_manager: MetaManagerSection,
    /// edged: pods on a CRI runtime.
    pub edged: EdgedSection,
    /// eventbus: the MQTT bridge.
    pub event_bus: EventBusSection,
    /// devicetwin.
    pub device_twin: DeviceTwinSection,
    /// Prometheus metrics at `/metrics`.
    pub metrics: Listener,
}

/// edgehub's settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct EdgeHubSection {
    /// The cloud's hub address (host:port, or a socket path for uds); a
    /// cloud of several replicas: their addresses, comma-separated, tried
    /// in turn.
    pub server: String,
    /// `ws`, `quic` or `uds`.
    pub transport: String,
    /// The cloud's name in its certificate.
    pub server_name: String,
    /// This node's name; needed over uds only (other transports take it
    /// from the certificate).
    pub node_name: Option<String>,
    /// Keepalive interval, seconds; a silent link is closed after two.
    pub keepalive_interval: u64,
    /// `native`, or `kubeedge` to talk to the cloud as a KubeEdge
    /// edgecore does (over `ws`, to a cloud's KubeEdge endpoint).
    pub dialect: hub::Dialect,
    /// The cloud's certificate endpoints (host:port), where the node's
    /// certificate is renewed once two thirds of its lifetime have passed.
    pub http_server: Option<String>,
    /// Where the node's credentials live (`ca.crt`, and `node.pem` with
    /// its certificate and key), written by `edgecore join`. Empty:
    /// `<dataDir>/pki`.
    pub certificate_dir: PathBuf,
}

/// metamanager's settings.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct MetaManagerSection {
    /// MetaServer.
    pub meta_server: MetaServerSection,
}

/// MetaServer's settings (KubeEdge's `modules.metaManager.metaServer`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct MetaServerSection {
    /// Whether it runs.
    pub enable: bool,
    /// host:port (KubeEdge's `server`, without its scheme).
    #[serde(alias = "server")]
    pub address: String,
    /// Off (KubeEdge's default): no authentication, so on a loopback
    /// address only. On: a request with a service account token
    /// (`Authorization: Bearer`) may read what that account may, as the
    /// cloud's kube-apiserver decides (Kubernetes mode; the embedded
    /// cloud refuses every token); a request without one is served to
    /// loopback peers only; beyond loopback MetaServer speaks TLS with the
    /// node's certificate (signed by the cloud's CA).
    pub require_authorization: bool,
    /// With `requireAuthorization` beyond loopback: the serving
    /// certificate (PEM, KubeEdge's key). Empty: a self-signed one made at
    /// first start, `<certificateDir>/metaserver.crt` (clients trust it).
    pub tls_cert_file: PathBuf,
    /// Its private key (PEM).
    pub tls_private_key_file: PathBuf,
}

impl MetaServerSection {
    /// Applies a command-line flag, as [`Listener::apply_flag`] does.
    pub fn apply_flag(&mut self, flag: Option<String>) {
        apply_listener_flag(&mut self.enable, &mut self.address, flag);
    }

    /// Its address, when it runs.
    pub fn enabled(&self) -> Option<&str> {
        self.enable.then_some(self.address.as_str())
    }
}

impl Default for MetaServerSection {
    fn default() -> Self {
        MetaServerSection {
            enable: true,
            address: meta::metaserver::DEFAULT_ADDRESS.to_owned(),
            require_authorization: false,
            tls_cert_file: PathBuf::new(),
            tls_private_key_file: PathBuf::new(),
        }
    }
}

/// edged's settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct EdgedSection {
    /// Whether pods run here.
    pub enable: bool,
    /// The CRI runtime's socket (containerd).
    pub cri_socket: String,
    /// The pod sandbox image.
    pub pod_sandbox_image: String,
    /// This node's IP, reported as its InternalIP.
    #[serde(rename = "nodeIP")]
    pub node_ip: String,
    /// edged's HTTP server (`/healthz`, `/pods`, `/containerLogs/...`);
    /// it shows every pod's logs: keep it on loopback.
    pub server: Listener,
    /// A container's log is rotated at this size (the kubelet's
    /// containerLogMaxSize: `10Mi`, `512Ki`, bytes).
    pub container_log_max_size: String,
    /// Log files kept per container, the one written included (the
    /// kubelet's containerLogMaxFiles; at least 2).
    pub container_log_max_files: usize,
}

/// Where the eventbus's broker is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MqttMode {
    /// The embedded broker, listening at `mqttServerInternal`.
    Internal,
    /// A broker elsewhere, at `mqttServerExternal`.
    External,
}

/// eventbus's settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct EventBusSection {
    /// Whether the eventbus (and in internal mode the broker) runs.
    pub enable: bool,
    /// `internal` or `external`.
    pub mqtt_mode: MqttMode,
    /// Where the embedded broker listens.
    pub mqtt_server_internal: String,
    /// The external broker, host:port.
    pub mqtt_server_external: String,
}

/// devicetwin's settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct DeviceTwinSection {
    /// Whether it runs.
    pub enable: bool,
    /// How often reported twins are written and sent up, milliseconds.
    pub report_period_ms: u64,
    /// The Unix socket KubeEdge's DMI mappers register and report on
    /// (KubeEdge's key and default; "" for none).
    #[serde(rename = "dmiSockPath")]
    pub dmi_sock_path: String,
}

impl Default for EdgeCoreConfig {
    fn default() -> Self {
        EdgeCoreConfig {
            api_version: "edgecore.config.edgehive.io/v1alpha1".to_owned(),
            kind: "EdgeCore".to_owned(),
            data_dir: PathBuf::from("/var/lib/edgehive/edge"),
            log: "info".to_owned(),
            modules: EdgeModules::default(),
        }
    }
}

impl Default for EdgeModules {
    fn default() -> Self {
        EdgeModules {
            edge_hub: EdgeHubSection::default(),
            meta_manager: MetaManagerSection::default(),
            edged: EdgedSection::default(),
            event_bus: EventBusSection::default(),
            device_twin: DeviceTwinSection::default(),
            metrics: Listener::on(DEFAULT_EDGE_METRICS),
        }
    }
}

impl Default for EdgeHubSection {
    fn default() -> Self {
        EdgeHubSection {
            server: "127.0.0.1:10000".to_owned(),
            transport: "ws".to_owned(),
            server_name: "localhost".to_owned(),
            node_name: None,
            keepalive_interval: 15,
            dialect: hub::Dialect::Native,
            http_server: None,
            certificate_dir: PathBuf::new(),
        }
    }
}

impl Default for EdgedSection {
    fn default() -> Self {
        EdgedSection {
            enable: true,
            cri_socket: "/run/edgehive/containerd/containerd.sock".to_owned(),
            pod_sandbox_image: "127.0.0.1:5000/edgehive/pause:latest".to_owned(),
            node_ip: String::new(),
            server: Listener::on(edged::server::DEFAULT_ADDRESS),
            container_log_max_size: "10Mi".to_owned(),
            container_log_max_files: 5,
        }
    }
}

impl Default for EventBusSection {
    fn default() -> Self {
        EventBusSection {
            enable: true,
            mqtt_mode: MqttMode::Internal,
            mqtt_server_internal: twin::broker::DEFAULT_ADDRESS.to_owned(),
            mqtt_server_external: String::new(),
        }
    }
}

impl Default for DeviceTwinSection {
    fn default() -> Self {
        DeviceTwinSection {
            enable: true,
            report_period_ms: 100,
            dmi_sock_path: twin::dmi::DEFAULT_SOCKET.to_owned(),
        }
    }
}

/// edgecore's metrics address by default.
pub const DEFAULT_EDGE_METRICS: &str = "127.0.0.1:10351";

impl CoreConfig for EdgeCoreConfig {
    fn data_dir_mut(&mut self) -> &mut PathBuf {
        &mut self.data_dir
    }

    fn log_mut(&mut self) -> &mut String {
        &mut self.log
    }
}

impl Check for EdgeCoreConfig {
    fn check(&self) -> Result<(), String> {
        let hub = &self.modules.edge_hub;
        if !["ws", "quic", "uds"].contains(&hub.transport.as_str()) {
            return Err(format!(
                "modules.edgeHub.transport: expected ws, quic or uds, got {:?}",
                hub.transport
            ));
        }
        if hub.dialect == hub::Dialect::KubeEdge && hub.transport != "ws" {
            return Err(format!(
                "modules.edgeHub.dialect: kubeedge runs over ws only, not {:?}",
                hub.transport
            ));
        }
        if hub.transport != "uds" {
            check_host_port("modules.edgeHub.server", &hub.server)?;
        } else if hub.server.is_empty() {
            return Err("modules.edgeHub.server: the cloud's socket path is empty".to_owned());
        }
        if hub.keepalive_interval == 0 {
            return Err(
                "modules.edgeHub.keepaliveInterval: must be at least 1 (seconds)".to_owned(),
            );
        }
        if let Some(http) = &hub.http_server {
            check_host_port("modules.edgeHub.httpServer", http)?;
        }
        let bus = &self.modules.event_bus;
        if bus.enable && bus.mqtt_mode == MqttMode::External {
            check_host_port(
                "modules.eventBus.mqttServerExternal",
                &bus.mqtt_server_external,
            )?;
        }
        let meta_server = &self.modules.meta_manager.meta_server;
        if meta_server.enable {
            check_host_port(
                "modules.metaManager.metaServer.address",
                &meta_server.address,
            )?;
            if !meta_server.require_authorization
                && !meta::metaserver::is_loopback(&meta_server.address)
            {
                return Err(format!(
                    "modules.metaManager.metaServer.requireAuthorization: false serves every object the edge holds, secrets included, to whoever reaches it, so only on a loopback address, not {:?}",
                    meta_server.address
                ));
            }
            if meta_server.require_authorization && hub.dialect == hub::Dialect::KubeEdge {
                return Err(
                    "modules.metaManager.metaServer.requireAuthorization: reviews go to an edgehive cloud; a KubeEdge cloud (modules.edgeHub.dialect: kubeedge) does not answer them"
                        .to_owned(),
                );
            }
            if meta_server.tls_cert_file.as_os_str().is_empty()
                != meta_server.tls_private_key_file.as_os_str().is_empty()
            {
                return Err(
                    "modules.metaManager.metaServer: tlsCertFile and tlsPrivateKeyFile go together"
                        .to_owned(),
                );
            }
        }
        for (key, listener) in [
            ("modules.edged.server.address", &self.modules.edged.server),
            ("modules.metrics.address", &self.modules.metrics),
        ] {
            if listener.enable {
                check_host_port(key, &listener.address)?;
            }
        }
        if self.modules.device_twin.report_period_ms == 0 {
            return Err("modules.deviceTwin.reportPeriodMs: must be at least 1".to_owned());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cmd_common::config::{parse, to_yaml};

    #[test]
    fn the_defaults_print_and_read_back() {
        let edge = EdgeCoreConfig::default();
        assert_eq!(parse::<EdgeCoreConfig>(&to_yaml(&edge)), Ok(edge));
        assert_eq!(parse::<EdgeCoreConfig>(""), Ok(EdgeCoreConfig::default()));
    }

    #[test]
    fn a_partial_file_keeps_the_other_defaults() {
        let edge: EdgeCoreConfig =
            parse("modules:\n  edgeHub:\n    transport: quic\n    server: 10.0.0.1:10001\n")
                .expect("valid");
        assert_eq!(edge.modules.edge_hub.transport, "quic");
        assert_eq!(edge.modules.edge_hub.keepalive_interval, 15);
        assert!(edge.modules.edged.enable);
    }

    #[test]
    fn metaserver_without_authorization_stays_on_loopback() {
        let edge = EdgeCoreConfig::default();
        assert!(!edge.modules.meta_manager.meta_server.require_authorization);
        let open = parse::<EdgeCoreConfig>(
            "modules:\n  metaManager:\n    metaServer:\n      server: 0.0.0.0:10550\n",
        )
        .expect_err("refused");
        assert!(
            open.contains("modules.metaManager.metaServer.requireAuthorization")
                && open.contains("0.0.0.0:10550"),
            "{open}"
        );
        let authorized: EdgeCoreConfig = parse(
            "modules:\n  metaManager:\n    metaServer:\n      address: 0.0.0.0:10550\n      requireAuthorization: true\n",
        )
        .expect("with authorization, anywhere");
        assert_eq!(
            authorized.modules.meta_manager.meta_server.address,
            "0.0.0.0:10550"
        );
    }

    #[test]
    fn errors_name_the_key_and_what_was_expected() {
        let unknown =
            parse::<EdgeCoreConfig>("modules:\n  edgeHub:\n    servr: x\n").expect_err("refused");
        assert!(
            unknown.contains("modules.edgeHub") && unknown.contains("servr"),
            "{unknown}"
        );
        let wrong_type =
            parse::<EdgeCoreConfig>("modules:\n  edgeHub:\n    keepaliveInterval: soon\n")
                .expect_err("refused");
        assert!(
            wrong_type.contains("modules.edgeHub.keepaliveInterval")
                && wrong_type.contains("expected u64"),
            "{wrong_type}"
        );
        let transport =
            parse::<EdgeCoreConfig>("modules:\n  edgeHub:\n    transport: carrier-pigeon\n")
                .expect_err("refused");
        assert!(
            transport.starts_with("modules.edgeHub.transport: expected ws, quic or uds"),
            "{transport}"
        );
        let mode = parse::<EdgeCoreConfig>("modules:\n  eventBus:\n    mqttMode: remote\n")
            .expect_err("refused");
        assert!(
            mode.contains("modules.eventBus.mqttMode") && mode.contains("internal"),
            "{mode}"
        );
    }
}
