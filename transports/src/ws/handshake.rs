//! The WebSocket upgrade, both sides: the server's admission of an upgrade\nrequest (a refusal is an HTTP status with a short reason) and the\nclient's request, with the headers that pick a batching and a codec.

use std::sync::Arc;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio_tungstenite::tungstenite::Error as WsError;
use tokio_tungstenite::tungstenite::handshake::server::{ErrorResponse, Request, Response};
use tokio_tungstenite::tungstenite::http;

use super::{BATCH_HEADER, config, into_link, ws_error};
use crate::admission::{Admission, AdmissionCheck};
use crate::error::TransportError;
use crate::frame::Codec;
use crate::link::{Limits, Link, PeerIdentity};

/// The HTTP answer to an upgrade request that is refused: `status` (403
/// unless it is an error status) and `reason` as a short plain-text body.
pub(crate) fn refusal(status: u16, reason: &str) -> ErrorResponse {
    let status = http::StatusCode::from_u16(status)
        .ok()
        .filter(|status| status.is_client_error() || status.is_server_error())
        .unwrap_or(http::StatusCode::FORBIDDEN);
    let body = format!("{reason}\n");
    let mut response = ErrorResponse::new(Some(body.clone()));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    headers.insert(
        http::header::CONTENT_LENGTH,
        http::HeaderValue::from(body.len()),
    );
    headers.insert(
        http::header::CONNECTION,
        http::HeaderValue::from_static("close"),
    );
    response
}

/// Longest reason kept from a refusal's body.
pub(crate) const MAX_REASON: usize = 256;

/// What an HTTP answer instead of an upgrade says: its status and reason.
pub(crate) fn refused(status: http::StatusCode, body: Option<&[u8]>) -> TransportError {
    let text = body.map(String::from_utf8_lossy).unwrap_or_default();
    let mut reason: String = text.trim().chars().take(MAX_REASON).collect();
    if reason.is_empty() {
        reason = status
            .canonical_reason()
            .unwrap_or("no reason given")
            .to_owned();
    }
    TransportError::Refused {
        status: status.as_u16(),
        reason,
    }
}

pub(crate) async fn upgrade_server<S>(
    stream: S,
    peer: PeerIdentity,
    path: Arc<str>,
    limits: Limits,
    codec: Codec,
    admission: Option<AdmissionCheck>,
) -> Result<Link, TransportError>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    // The peer, with the request's headers, once the request is accepted.
    let accepted = Arc::new(std::sync::Mutex::new(None));
    let keep = accepted.clone();
    // tungstenite's callback signature, large error variant and all.
    #[allow(clippy::result_large_err)]
    let check =
        move |request: &Request, mut response: Response| -> Result<Response, ErrorResponse> {
            let mut peer = peer;
            // A KubeEdge edge names its own path (`/<project>/<node>/events`);
            // KubeEdge's cloud takes any, and so does this endpoint.
            if codec != Codec::KubeEdgeJson && request.uri().path() != &*path {
                return Err(refusal(
                    404,
                    &format!("no WebSocket endpoint at {}", request.uri().path()),
                ));
            }
            peer.headers = request
                .headers()
                .iter()
                .filter_map(|(name, value)| {
                    Some((name.as_str().to_owned(), value.to_str().ok()?.to_owned()))
                })
                .take(crate::link::MAX_HEADERS)
                .collect();
            // Decided on what the request and the TLS handshake tell, before
            // anything is upgraded.
            if let Some(Admission::Refuse { status, reason }) =
                admission.as_ref().map(|check| check(&peer))
            {
                return Err(refusal(status, &reason));
            }
            if codec == Codec::MessagePack && request.headers().contains_key(BATCH_HEADER) {
                response
                    .headers_mut()
                    .insert(BATCH_HEADER, http::HeaderValue::from_static("1"));
            }
            if let Ok(mut kept) = keep.lock() {
                *kept = Some(peer);
            }
            Ok(response)
        };
    let ws = tokio_tungstenite::accept_hdr_async_with_config(
        stream,
        check,
        Some(config(&limits, codec)),
    )
    .await
    .map_err(|err| match err {
        WsError::Http(response) => refused(response.status(), response.body().as_deref()),
        other => ws_error(other),
    })?;
    let peer = accepted
        .lock()
        .ok()
        .and_then(|mut kept| kept.take())
        .ok_or_else(|| TransportError::WebSocket("upgrade without a request".into()))?;
    let peer_batches = peer.headers.iter().any(|(name, _)| name == BATCH_HEADER);
    Ok(into_link(ws, peer, &limits, codec, peer_batches))
}

pub(crate) async fn upgrade_client<S>(
    stream: S,
    url: String,
    headers: &[(String, String)],
    peer: PeerIdentity,
    limits: Limits,
    codec: Codec,
) -> Result<Link, TransportError>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    let mut request = url.into_client_request().map_err(ws_error)?;
    for (name, value) in headers {
        let name = http::HeaderName::from_bytes(name.as_bytes())
            .map_err(|e| TransportError::Config(format!("header name {name:?}: {e}")))?;
        let value = http::HeaderValue::from_str(value)
            .map_err(|e| TransportError::Config(format!("header value {value:?}: {e}")))?;
        request.headers_mut().append(name, value);
    }
    if codec == Codec::MessagePack {
        request
            .headers_mut()
            .insert(BATCH_HEADER, http::HeaderValue::from_static("1"));
    }
    let (ws, response) =
        tokio_tungstenite::client_async_with_config(request, stream, Some(config(&limits, codec)))
            .await
            .map_err(|err| match err {
                // The other side refused the link before upgrading it.
                WsError::Http(response) => refused(response.status(), response.body().as_deref()),
                other => ws_error(other),
            })?;
    let peer_batches = response.headers().contains_key(BATCH_HEADER);
    Ok(into_link(ws, peer, &limits, codec, peer_batches))
}
