//! How edged runs.

use std::path::PathBuf;
use std::time::Duration;

use crate::gc::ImageGcPolicy;

/// edged's settings.
#[derive(Debug, Clone)]
pub struct EdgedConfig {
    /// This node's name.
    pub node: String,
    /// The CRI runtime's socket.
    pub cri_socket: PathBuf,
    /// Where pods' directories (logs, volumes) live.
    pub root_dir: PathBuf,
    /// The sandbox image, pulled before the first sandbox.
    pub pause_image: String,
    /// This node's IP, reported as host IP (and pod IP of host-network pods).
    pub node_ip: String,
    /// How often the PLEG lists the runtime.
    pub relist_period: Duration,
    /// How often node status is sent (it is also sent when it changes).
    pub node_status_period: Duration,
    /// First crash-loop and image-pull backoff; doubles per failure.
    pub backoff_initial: Duration,
    /// Backoffs never exceed this.
    pub backoff_max: Duration,
    /// Pods this node runs at most (reported as capacity).
    pub max_pods: u32,
    /// Where edged's HTTP server listens (`/healthz`, `/pods`, logs); none
    /// runs no server.
    pub server_address: Option<String>,
    /// How often garbage is collected.
    pub gc_period: Duration,
    /// When unused images are removed.
    pub image_gc: ImageGcPolicy,
    /// Dead containers kept per container (the latest at least, for its
    /// logs); the container garbage-collection policy.
    pub max_dead_per_container: usize,
    /// Container logs rotate by size and count (the kubelet's
    /// containerLogMaxSize and containerLogMaxFiles).
    pub log_rotation: crate::logs::Rotation,
    /// How pods' service account tokens are asked of the cloud.
    pub tokens: crate::tokens::TokenPolicy,
}

impl EdgedConfig {
    /// Kubernetes' defaults for `node`, with pods under `root_dir`.
    pub fn new(
        node: impl Into<String>,
        cri_socket: impl Into<PathBuf>,
        root_dir: impl Into<PathBuf>,
    ) -> Self {
        EdgedConfig {
            node: node.into(),
            cri_socket: cri_socket.into(),
            root_dir: root_dir.into(),
            pause_image: "127.0.0.1:5000/edgehive/pause:latest".to_owned(),
            node_ip: String::new(),
            relist_period: Duration::from_secs(1),
            node_status_period: Duration::from_secs(10),
            backoff_initial: Duration::from_secs(10),
            backoff_max: Duration::from_secs(300),
            max_pods: 110,
            server_address: None,
            gc_period: Duration::from_secs(60),
            image_gc: ImageGcPolicy::default(),
            max_dead_per_container: 1,
            log_rotation: crate::logs::Rotation::default(),
            tokens: crate::tokens::TokenPolicy::default(),
        }
    }

    /// A pod's directory.
    pub fn pod_dir(&self, uid: &str) -> PathBuf {
        self.root_dir.join("pods").join(uid)
    }
}
