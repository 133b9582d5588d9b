//! cloudcore's admission webhook (Kubernetes mode; KubeEdge's `admission`
//! component has the same place): a mutating webhook kube-apiserver calls
//! as it creates a pod, so a pod bound to an edge node is created with its
//! offline tolerations already lengthened, and nothing is written to the
//! API server afterwards to lengthen them.
//!
//! - [`review`]: the decision, with no I/O (which pods, which patch).
//! - [`webhook`]: the `MutatingWebhookConfiguration` that points the API
//!   server here, created or updated at cloudcore's start.
//! - [`start`]: `POST /mutate-pods` over HTTPS (the cloud CA's serving
//!   certificate, the configuration's `caBundle`), on the same TLS server
//!   code as the kubelet API; `GET /healthz`. A review is read up to
//!   [`MAX_BODY`] (a larger one is refused before more is read) and within
//!   [`BODY_TIMEOUT`]; a body that is not a review is answered 400; every
//!   review is answered `allowed: true`.

pub mod review;
pub mod webhook;

use std::sync::Arc;
use std::time::Duration;

use http_body_util::{BodyExt, LengthLimitError, Limited};
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use tracing::{debug, info, info_span, warn};

use crate::cloudstream::{Body, Handler, KubeletApiHandle, full, serve_tls, status};
use review::EdgeNodes;

/// Where the webhook listens by default: beside the kubelet API (10352)
/// and the metrics API (10353), clear of cloudhub's 10000-10004 and
/// KubeEdge's 10010-10014, and of the edge's 10350, 10351 and 10550.
pub const DEFAULT_ADDRESS: &str = "0.0.0.0:10354";

/// The webhook's path.
pub const PATH: &str = "/mutate-pods";

/// The largest review read: twice what etcd keeps of one object (a review
/// carries the object, an update its old one too), with room for the rest.
pub const MAX_BODY: usize = 3 * 1024 * 1024;

/// How long a review's body may take to arrive (the API server gives up
/// on the webhook after [`webhook::TIMEOUT_SECONDS`] anyway).
pub const BODY_TIMEOUT: Duration = Duration::from_secs(10);

/// The running webhook server (stops when dropped).
pub type AdmissionHandle = KubeletApiHandle;

/// The webhook's settings.
pub struct AdmissionConfig {
    /// host:port to listen on.
    pub address: String,
    /// TLS: the serving certificate (no client certificate asked).
    pub tls: Arc<rustls::ServerConfig>,
    /// How long an offline edge node's pods are tolerated (`None`: for
    /// ever): `kubeAPIConfig.offlineGraceSeconds`.
    pub window: Option<Duration>,
    /// Which nodes are edge nodes (the Kubernetes backend's Node cache).
    pub edge_nodes: Arc<dyn EdgeNodes>,
}

/// Starts the webhook server.
pub async fn start(config: AdmissionConfig) -> std::io::Result<AdmissionHandle> {
    let served = Arc::new(Served {
        window: config.window,
        edge_nodes: config.edge_nodes,
    });
    let handler: Handler = Arc::new(move |request, _caller, _permit| {
        let served = served.clone();
        Box::pin(async move { serve(request, &served).await })
    });
    let handle = serve_tls(&config.address, config.tls, handler, "admission").await?;
    info!(address = %handle.address, window = ?config.window, "admission webhook listening");
    Ok(handle)
}

struct Served {
    window: Option<Duration>,
    edge_nodes: Arc<dyn EdgeNodes>,
}

async fn serve(request: Request<Incoming>, served: &Served) -> Response<Body> {
    let path = request.uri().path();
    match (request.method(), path) {
        (&Method::GET, "/healthz") => return Response::new(full("ok")),
        (&Method::POST, PATH) => {}
        (_, PATH) => {
            return status(
                StatusCode::METHOD_NOT_ALLOWED,
                &format!("{PATH} takes POST of an AdmissionReview"),
            );
        }
        (_, other) => {
            return status(StatusCode::NOT_FOUND, &format!("no such path: {other}"));
        }
    }
    let declared = request
        .headers()
        .get(hyper::header::CONTENT_LENGTH)
        .and_then(|length| length.to_str().ok())
        .and_then(|length| length.parse::<u64>().ok());
    if declared.is_some_and(|length| length > MAX_BODY as u64) {
        return too_large();
    }
    let body = Limited::new(request.into_body(), MAX_BODY).collect();
    let body = match tokio::time::timeout(BODY_TIMEOUT, body).await {
        Ok(Ok(body)) => body.to_bytes(),
        Ok(Err(err)) if err.downcast_ref::<LengthLimitError>().is_some() => return too_large(),
        Ok(Err(err)) => {
            return status(
                StatusCode::BAD_REQUEST,
                &format!("the review could not be read: {err}"),
            );
        }
        Err(_) => {
            return status(
                StatusCode::REQUEST_TIMEOUT,
                &format!("the review did not arrive within {BODY_TIMEOUT:?}"),
            );
        }
    };
    let answer = match review::answer(&body, served.window, served.edge_nodes.as_ref()) {
        Ok(answer) => answer,
        Err(err) => {
            warn!(error = %err, "malformed admission review");
            return status(StatusCode::BAD_REQUEST, &err.to_string());
        }
    };
    info_span!("admission_review", uid = %answer.uid, pod = %answer.pod).in_scope(|| match answer
        .patch
        .len()
    {
        0 => debug!("allowed as it is"),
        ops => debug!(ops, "offline tolerations lengthened"),
    });
    let mut response = Response::new(full(answer.review.to_string()));
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    response
}

fn too_large() -> Response<Body> {
    status(
        StatusCode::PAYLOAD_TOO_LARGE,
        &format!("an admission review may be at most {MAX_BODY} bytes"),
    )
}
