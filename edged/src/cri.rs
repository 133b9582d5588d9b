//! The Kubernetes CRI v1 API (runtime and image services), generated from
//! `proto/api.proto` at build time, and a connection to a runtime's socket.

use std::path::{Path, PathBuf};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tonic::transport::{Channel, Endpoint};
use tracing::warn;

use crate::actions::PullPolicy;

/// The generated CRI v1 types and clients (`runtime.v1`).
#[allow(missing_docs, clippy::all, clippy::unwrap_used)]
pub mod api {
    tonic::include_proto!("runtime.v1");
}

pub use api::image_service_client::ImageServiceClient;
pub use api::runtime_service_client::RuntimeServiceClient;

/// containerd's default CRI socket.
pub const DEFAULT_SOCKET: &str = "/run/containerd/containerd.sock";

/// A failure to reach a CRI runtime.
#[derive(Debug, thiserror::Error)]
pub enum CriError {
    /// The socket could not be connected.
    #[error("cannot connect to the CRI runtime at {path}: {reason}")]
    Connect {
        /// The socket.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// A call failed.
    #[error("CRI {call}: {status}")]
    Call {
        /// Which call.
        call: &'static str,
        /// The runtime's answer.
        status: tonic::Status,
    },
}

impl CriError {
    /// Makes a failed `call`'s status into an error (for `map_err`).
    pub fn call(call: &'static str) -> impl FnOnce(tonic::Status) -> CriError {
        move |status| CriError::Call { call, status }
    }
}

/// Both CRI services over one channel; cheap to clone.
#[derive(Clone)]
pub struct Cri {
    /// The runtime service (sandboxes, containers, exec, status).
    pub runtime: RuntimeServiceClient<Channel>,
    /// The image service (pull, list, remove, filesystem info).
    pub images: ImageServiceClient<Channel>,
}

impl Cri {
    /// Connects to the runtime listening on the Unix socket at `path`.
    pub async fn connect(path: &Path) -> Result<Cri, CriError> {
        let socket = path.to_path_buf();
        // The URI is required by tonic and ignored by the connector.
        let endpoint = Endpoint::from_static("http://[::1]:50051")
            .connect_timeout(Duration::from_secs(5))
            .timeout(Duration::from_secs(300));
        let channel = endpoint
            .connect_with_connector(tower::service_fn(move |_| {
                let socket = socket.clone();
                async move {
                    let stream = tokio::net::UnixStream::connect(socket).await?;
                    Ok::<_, std::io::Error>(TokioIo::new(stream))
                }
            }))
            .await
            .map_err(|err| CriError::Connect {
                path: path.to_path_buf(),
                reason: err.to_string(),
            })?;
        Ok(Cri::from_channel(channel))
    }

    /// Both services over an existing channel (tests point it anywhere).
    pub fn from_channel(channel: Channel) -> Cri {
        Cri {
            runtime: RuntimeServiceClient::new(channel.clone()),
            images: ImageServiceClient::new(channel),
        }
    }

    /// The sandboxes labelled `label=value`.
    pub async fn sandboxes(
        &self,
        label: &str,
        value: &str,
    ) -> Result<Vec<api::PodSandbox>, CriError> {
        let mut runtime = self.runtime.clone();
        runtime
            .list_pod_sandbox(api::ListPodSandboxRequest {
                filter: Some(api::PodSandboxFilter {
                    label_selector: std::collections::HashMap::from([(
                        label.to_owned(),
                        value.to_owned(),
                    )]),
                    ..Default::default()
                }),
            })
            .await
            .map(|listed| listed.into_inner().items)
            .map_err(CriError::call("ListPodSandbox"))
    }

    /// The containers labelled `label=value`, in `sandbox` if given.
    pub async fn containers(
        &self,
        label: &str,
        value: &str,
        sandbox: Option<&str>,
    ) -> Result<Vec<api::Container>, CriError> {
        let mut runtime = self.runtime.clone();
        runtime
            .list_containers(api::ListContainersRequest {
                filter: Some(api::ContainerFilter {
                    pod_sandbox_id: sandbox.unwrap_or_default().to_owned(),
                    label_selector: std::collections::HashMap::from([(
                        label.to_owned(),
                        value.to_owned(),
                    )]),
                    ..Default::default()
                }),
            })
            .await
            .map(|listed| listed.into_inner().containers)
            .map_err(CriError::call("ListContainers"))
    }

    /// A sandbox's status.
    pub async fn sandbox_status(&self, id: &str) -> Result<api::PodSandboxStatus, CriError> {
        let mut runtime = self.runtime.clone();
        runtime
            .pod_sandbox_status(api::PodSandboxStatusRequest {
                pod_sandbox_id: id.to_owned(),
                verbose: false,
            })
            .await
            .map(|answer| answer.into_inner().status.unwrap_or_default())
            .map_err(CriError::call("PodSandboxStatus"))
    }

    /// The runtime's name and version, as CRI reports them.
    pub async fn version(&self) -> Result<api::VersionResponse, CriError> {
        let mut runtime = self.runtime.clone();
        runtime
            .version(api::VersionRequest {
                version: "v1".to_owned(),
            })
            .await
            .map(tonic::Response::into_inner)
            .map_err(CriError::call("Version"))
    }

    /// The image's reference after pulling it as `policy` says.
    pub async fn pull(&self, image: &str, policy: PullPolicy) -> Result<String, CriError> {
        let mut images = self.images.clone();
        let spec = api::ImageSpec {
            image: image.to_owned(),
            ..Default::default()
        };
        if policy != PullPolicy::Always {
            let present = images
                .image_status(api::ImageStatusRequest {
                    image: Some(spec.clone()),
                    verbose: false,
                })
                .await
                .map_err(CriError::call("ImageStatus"))?
                .into_inner()
                .image;
            if let Some(present) = present {
                return Ok(present.id);
            }
            if policy == PullPolicy::Never {
                return Err(CriError::Call {
                    call: "ImageStatus",
                    status: tonic::Status::not_found(format!(
                        "image {image:?} is not present and imagePullPolicy is Never"
                    )),
                });
            }
        }
        images
            .pull_image(api::PullImageRequest {
                image: Some(spec),
                ..Default::default()
            })
            .await
            .map(|r| r.into_inner().image_ref)
            .map_err(CriError::call("PullImage"))
    }

    /// Stops container `id` with `grace` seconds and removes it; a failure
    /// is logged (the next sync sees what is left).
    pub async fn remove_container(&self, id: &str, grace: i64) {
        let mut runtime = self.runtime.clone();
        let _ = runtime
            .stop_container(api::StopContainerRequest {
                container_id: id.to_owned(),
                timeout: grace,
            })
            .await;
        if let Err(status) = runtime
            .remove_container(api::RemoveContainerRequest {
                container_id: id.to_owned(),
            })
            .await
        {
            warn!(container = id, %status, "container not removed");
        }
    }

    /// Stops and removes sandbox `id`; a failure is logged.
    pub async fn remove_sandbox(&self, id: &str) {
        let mut runtime = self.runtime.clone();
        let _ = runtime
            .stop_pod_sandbox(api::StopPodSandboxRequest {
                pod_sandbox_id: id.to_owned(),
            })
            .await;
        if let Err(status) = runtime
            .remove_pod_sandbox(api::RemovePodSandboxRequest {
                pod_sandbox_id: id.to_owned(),
            })
            .await
        {
            warn!(sandbox = id, %status, "sandbox not removed");
        }
    }
}
