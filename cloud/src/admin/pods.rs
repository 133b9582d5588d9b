//! A pod's streams through the admin API, at the Kubernetes API's paths:
//! `GET /api/v1/namespaces/{ns}/pods/{name}/log` (the container's log,
//! streamed while `follow`), and the node's figures for `top`. Each goes
//! through the pod's node link ([`crate::streams::PodStreams`]).

use actix_web::{HttpRequest, HttpResponse, web};
use apis::api::ApiError;
use apis::kinds::{Kind, ObjectKey};
use apis::streams::{LogOptions, PodRef, StreamRequest, channel};
use futures_util::stream;
use hub::tunnel::{Chunk, TunnelStream};
use serde_json::Value;

use crate::streams::PodStreams;

/// The routes, when the admin API has streams.
pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.route(
        "/api/v1/namespaces/{namespace}/pods/{name}/log",
        web::get().to(log),
    );
}

/// The query's pairs, decoded.
pub(crate) fn query_pairs(request: &HttpRequest) -> Vec<(String, String)> {
    form_urlencoded::parse(request.query_string().as_bytes())
        .into_owned()
        .collect()
}

/// The container a request means: the one named, or the pod's only one.
pub(crate) fn container_of(pod: &Value, named: Option<&str>) -> Result<String, ApiError> {
    let names: Vec<&str> = pod
        .pointer("/spec/containers")
        .and_then(Value::as_array)
        .map(|containers| {
            containers
                .iter()
                .filter_map(|c| c["name"].as_str())
                .collect()
        })
        .unwrap_or_default();
    let pod_name = pod
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("");
    match named.filter(|name| !name.is_empty()) {
        Some(name) if names.contains(&name) => Ok(name.to_owned()),
        Some(name) => Err(ApiError::BadRequest(format!(
            "container {name} is not valid for pod {pod_name}"
        ))),
        None => match names.as_slice() {
            [only] => Ok((*only).to_owned()),
            _ => Err(ApiError::BadRequest(format!(
                "a container name must be specified for pod {pod_name}, choose one of: {names:?}"
            ))),
        },
    }
}

/// The pod at `namespace`/`name`, as stored.
pub(crate) fn pod_of(streams: &PodStreams, namespace: &str, name: &str) -> Result<Value, ApiError> {
    let key = ObjectKey::new(Kind::Pod, namespace, name);
    streams
        .store()
        .get(&key)
        .map_err(|err| ApiError::Unavailable(err.to_string()))?
        .ok_or(ApiError::NotFound(key))
}

/// Bytes a stream carries on `wanted`, as a response body; a stream that
/// ends badly ends the body with an error (the client sees it cut).
pub(crate) fn body_of(
    stream: TunnelStream,
    wanted: u8,
) -> impl futures_util::Stream<Item = Result<bytes::Bytes, actix_web::Error>> {
    stream::unfold(Some(stream), move |stream| async move {
        let mut stream = stream?;
        loop {
            match stream.recv().await {
                Some(Ok(Chunk::Data(channel, bytes))) if channel == wanted => {
                    return Some((Ok(bytes), Some(stream)));
                }
                Some(Ok(_)) => continue,
                Some(Err(err)) => {
                    let error = actix_web::error::ErrorBadGateway(err.to_string());
                    return Some((Err(error), None));
                }
                None => return None,
            }
        }
    })
}

async fn log(
    request: HttpRequest,
    streams: web::Data<PodStreams>,
    path: web::Path<(String, String)>,
) -> Result<HttpResponse, ApiError> {
    let (namespace, name) = path.into_inner();
    let pairs = query_pairs(&request);
    let options = LogOptions::from_query(pairs.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .map_err(|err| ApiError::BadRequest(err.to_string()))?;
    let pod = pod_of(&streams, &namespace, &name)?;
    let named = pairs
        .iter()
        .find(|(k, _)| k == "container")
        .map(|(_, v)| v.as_str());
    let container = container_of(&pod, named)?;
    let request = StreamRequest::Logs {
        pod: PodRef { namespace, name },
        container,
        options,
    };
    let stream = streams.open(&request).await?;
    Ok(HttpResponse::Ok()
        .content_type("text/plain")
        .streaming(body_of(stream, channel::STDOUT)))
}
