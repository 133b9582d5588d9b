//! KubeEdge's Device Management Interface (DMI, `v1beta1`): the gRPC API
//! between an edge core and its device mappers over Unix sockets, as
//! KubeEdge v1.15+ mappers (built on its mapper-framework) speak it.
//!
//! - [`api`]: the messages and both services, generated from
//!   `proto/dmi/v1beta1/api.proto` (written from the wire schema's facts;
//!   see `docs/design/dmi-facts.md`).
//! - [`convert`]: devices and models as a mapper gets them, and a mapper's
//!   reports as devicetwin takes them (its MQTT payloads), plain code;
//! - [`server`]: the edge's `DeviceManagerService` on a Unix socket;
//! - [`dispatch`]: the cloud's device and model changes to the mapper of
//!   their protocol (`DeviceMapperService` calls);
//! - [`authority`]: Go's gRPC clients, which name a Unix socket's path as
//!   the request's authority, taken by the servers on either side.

pub mod authority;
pub mod convert;
pub mod dispatch;
pub mod server;

pub use server::{DmiConfig, DmiError, DmiServerHandle, Mapper, Mappers};

/// The generated DMI messages and services (package `v1beta1`).
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod api {
    tonic::include_proto!("v1beta1");
}

/// Where KubeEdge's edgecore serves DMI, and so where its mappers look.
pub const DEFAULT_SOCKET: &str = "/etc/kubeedge/dmi.sock";

/// A gRPC channel to the Unix socket at `path` (the edge's, or a
/// mapper's), each call and the connection within `timeout`.
pub async fn dial(
    path: &std::path::Path,
    timeout: std::time::Duration,
) -> Result<tonic::transport::Channel, tonic::transport::Error> {
    let path = path.to_path_buf();
    // The URI is required by tonic and ignored by the connector.
    tonic::transport::Endpoint::from_static("http://[::1]:50051")
        .timeout(timeout)
        .connect_timeout(timeout)
        .connect_with_connector(tower::service_fn(move |_| {
            let path = path.clone();
            async move {
                let stream = tokio::net::UnixStream::connect(path).await?;
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
            }
        }))
        .await
}

/// The connections `listener` accepts, as tonic's server takes them, a
/// socket path given as a request's authority taken too
/// ([`authority::LenientAuthority`]).
pub fn incoming(
    listener: tokio::net::UnixListener,
) -> impl futures_util::Stream<Item = std::io::Result<authority::LenientAuthority>> {
    futures_util::stream::unfold(listener, |listener| async move {
        let accepted = listener
            .accept()
            .await
            .map(|(stream, _)| authority::LenientAuthority::new(stream));
        Some((accepted, listener))
    })
}
