//! The application center's API server: kube-rs's client, each request
//! made as the node (`Impersonate-User: system:node:<node>`,
//! `Impersonate-Group: system:nodes`), so the cluster authorizes it as it
//! would the node's kubelet. cloudcore's own account needs `impersonate`
//! on users and groups for that (see docs/kubernetes.md).

use futures_util::StreamExt;
use futures_util::future::BoxFuture;
use futures_util::stream::BoxStream;
use kube::Client;
use kube::core::WatchEvent;
use serde_json::Value;

use super::ApiServer;
use super::requests::ApiCall;
use super::watches::ApiEvent;
use super::wire::ApiStatus;

/// Kubernetes' group of all nodes.
const NODES_GROUP: &str = "system:nodes";

/// A kube-apiserver reached through `client`, in the nodes' names.
#[derive(Clone)]
pub struct KubernetesApi {
    client: Client,
}

impl KubernetesApi {
    /// Forwards through `client` (cloudcore's own).
    pub fn new(client: Client) -> KubernetesApi {
        KubernetesApi { client }
    }
}

/// The HTTP request for `call`, made as `node`.
fn request(node: &str, call: &ApiCall) -> Result<hyper::Request<Vec<u8>>, ApiStatus> {
    let mut builder = hyper::Request::builder()
        .method(call.method.as_str())
        .uri(&call.path)
        .header("Impersonate-User", format!("system:node:{node}"))
        .header("Impersonate-Group", NODES_GROUP)
        .header("Accept", "application/json");
    if !call.content_type.is_empty() {
        builder = builder.header("Content-Type", &call.content_type);
    }
    builder
        .body(call.body.clone())
        .map_err(|err| ApiStatus::bad_request(format!("cannot make the request: {err}")))
}

/// The Status of a failed request.
fn status_of(err: kube::Error) -> ApiStatus {
    match err {
        kube::Error::Api(status) => {
            ApiStatus::from_api(serde_json::to_value(&*status).unwrap_or(Value::Null))
        }
        other => ApiStatus::unavailable(format!("the API server: {other}")),
    }
}

impl ApiServer for KubernetesApi {
    fn call(&self, node: &str, call: ApiCall) -> BoxFuture<'static, Result<Vec<u8>, ApiStatus>> {
        let client = self.client.clone();
        let request = request(node, &call);
        Box::pin(async move {
            let text = client.request_text(request?).await.map_err(status_of)?;
            Ok(text.into_bytes())
        })
    }

    fn watch(
        &self,
        node: &str,
        path: String,
    ) -> BoxFuture<'static, Result<BoxStream<'static, Result<ApiEvent, ApiStatus>>, ApiStatus>>
    {
        let client = self.client.clone();
        let call = ApiCall::get(path, true);
        let request = request(node, &call);
        Box::pin(async move {
            let events = client
                .request_events::<Value>(request?)
                .await
                .map_err(status_of)?;
            let events = events.map(|event: Result<WatchEvent<Value>, kube::Error>| {
                match event.map_err(status_of)? {
                    WatchEvent::Added(object) => Ok(ApiEvent::Added(object)),
                    WatchEvent::Modified(object) => Ok(ApiEvent::Modified(object)),
                    WatchEvent::Deleted(object) => Ok(ApiEvent::Deleted(object)),
                    WatchEvent::Bookmark(bookmark) => {
                        Ok(ApiEvent::Bookmark(bookmark.metadata.resource_version))
                    }
                    WatchEvent::Error(status) => Err(ApiStatus::from_api(
                        serde_json::to_value(&status).unwrap_or(Value::Null),
                    )),
                }
            });
            Ok(events.boxed())
        })
    }
}
