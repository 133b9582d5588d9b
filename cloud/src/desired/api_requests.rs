//! What cloudcore asks of the API server, counted by verb and resource as
//! each request leaves (a tower layer on the API client), and the answers
//! that told it to slow down (429). `/metrics` shows them, so the cost of
//! each edge node and each pod on the API server is read, not guessed.
//!
//! The verb is Kubernetes' own (get, list, watch, create, update, patch,
//! delete, deletecollection), read from the method and path as the API
//! server's request info does; the resource carries its subresource
//! (`pods/status`, `serviceaccounts/token`).

use std::collections::BTreeMap;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use http::{Method, Request, Response};

/// Requests by (verb, resource), and the throttled answers.
#[derive(Debug, Default)]
pub struct ApiRequests {
    counts: Mutex<BTreeMap<(&'static str, String), u64>>,
    throttled: AtomicU64,
    /// The `Retry-After` of the last 429 that said one.
    retry_after: Mutex<Option<Duration>>,
}

impl ApiRequests {
    /// Counts one request.
    pub fn record(&self, method: &Method, path: &str, query: Option<&str>) {
        let (verb, resource) = request_info(method, path, query);
        *self
            .counts
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry((verb, resource))
            .or_default() += 1;
    }

    /// Every (verb, resource) asked so far, with its count.
    pub fn snapshot(&self) -> Vec<(&'static str, String, u64)> {
        self.counts
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .map(|((verb, resource), count)| (*verb, resource.clone(), *count))
            .collect()
    }

    /// Requests in all.
    pub fn total(&self) -> u64 {
        self.snapshot().iter().map(|(_, _, count)| count).sum()
    }

    /// Answers `429 Too Many Requests` (the API server's priority and
    /// fairness, or a rate limit) so far.
    pub fn throttled(&self) -> u64 {
        self.throttled.load(Ordering::Relaxed)
    }

    /// The pause the last 429 asked for (its `Retry-After` in seconds),
    /// if one said: kube's errors carry the answer's body, not its
    /// headers, and kube-apiserver's priority and fairness answers a 429
    /// with the header and a plain-text body.
    pub fn last_retry_after(&self) -> Option<Duration> {
        *self
            .retry_after
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Takes a 429 answer's headers: counted, and its `Retry-After` kept.
    pub fn throttled_answer(&self, headers: &http::HeaderMap) {
        self.throttled.fetch_add(1, Ordering::Relaxed);
        if let Some(pause) = retry_after(headers) {
            *self
                .retry_after
                .lock()
                .unwrap_or_else(PoisonError::into_inner) = Some(pause);
        }
    }

    /// The layer that counts an API client's requests here.
    pub fn layer(self: &Arc<Self>) -> CountLayer {
        CountLayer(self.clone())
    }
}

/// A `Retry-After` header in seconds (the form kube-apiserver sends; an
/// HTTP date is not read).
pub fn retry_after(headers: &http::HeaderMap) -> Option<Duration> {
    let seconds = headers
        .get(http::header::RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim()
        .parse::<u64>()
        .ok()?;
    Some(Duration::from_secs(seconds))
}

/// Kubernetes' verb and resource (with its subresource) of a request.
pub fn request_info(method: &Method, path: &str, query: Option<&str>) -> (&'static str, String) {
    let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    // /api/v1/... or /apis/<group>/<version>/...
    let rest = match segments.as_slice() {
        ["api", _version, rest @ ..] => rest,
        ["apis", _group, _version, rest @ ..] => rest,
        _ => return (verb_of(method, false, query), path.to_owned()),
    };
    let (resource, name, sub) = match rest {
        ["namespaces", _namespace, resource, rest @ ..] => (*resource, rest.first(), rest.get(1)),
        [resource, rest @ ..] => (*resource, rest.first(), rest.get(1)),
        [] => return (verb_of(method, false, query), path.to_owned()),
    };
    let resource = match sub {
        Some(sub) => format!("{resource}/{sub}"),
        None => resource.to_owned(),
    };
    (verb_of(method, name.is_some(), query), resource)
}

fn verb_of(method: &Method, named: bool, query: Option<&str>) -> &'static str {
    let watching = query.is_some_and(|q| {
        q.split('&')
            .any(|pair| pair == "watch=true" || pair == "watch=1")
    });
    match (method.as_str(), named) {
        ("GET", _) if watching => "watch",
        ("GET", true) => "get",
        ("GET", false) => "list",
        ("POST", _) => "create",
        ("PUT", _) => "update",
        ("PATCH", _) => "patch",
        ("DELETE", true) => "delete",
        ("DELETE", false) => "deletecollection",
        _ => "other",
    }
}

/// A tower layer counting each request in [`ApiRequests`].
#[derive(Clone)]
pub struct CountLayer(Arc<ApiRequests>);

impl<S> tower_layer::Layer<S> for CountLayer {
    type Service = Counted<S>;

    fn layer(&self, inner: S) -> Counted<S> {
        Counted {
            inner,
            requests: self.0.clone(),
        }
    }
}

/// An API client's service, counting its requests.
#[derive(Clone)]
pub struct Counted<S> {
    inner: S,
    requests: Arc<ApiRequests>,
}

impl<S, B, R> tower_service::Service<Request<B>> for Counted<S>
where
    S: tower_service::Service<Request<B>, Response = Response<R>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let uri = request.uri();
        self.requests
            .record(request.method(), uri.path(), uri.query());
        let requests = self.requests.clone();
        let answer = self.inner.call(request);
        Box::pin(async move {
            let answer = answer.await;
            if let Ok(response) = &answer
                && response.status() == http::StatusCode::TOO_MANY_REQUESTS
            {
                requests.throttled_answer(response.headers());
            }
            answer
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(method: Method, path: &str, query: Option<&str>) -> (&'static str, String) {
        request_info(&method, path, query)
    }

    #[test]
    fn requests_read_as_the_api_servers_verbs_and_resources() {
        let cases = [
            (
                Method::GET,
                "/api/v1/pods",
                Some("watch=true&resourceVersion=5"),
                ("watch", "pods"),
            ),
            (
                Method::GET,
                "/api/v1/pods",
                Some("limit=500"),
                ("list", "pods"),
            ),
            (
                Method::GET,
                "/api/v1/namespaces/a/pods/p",
                None,
                ("get", "pods"),
            ),
            (
                Method::PUT,
                "/api/v1/namespaces/a/pods/p/status",
                None,
                ("update", "pods/status"),
            ),
            (
                Method::PATCH,
                "/api/v1/nodes/n/status",
                None,
                ("patch", "nodes/status"),
            ),
            (
                Method::POST,
                "/api/v1/namespaces/a/serviceaccounts/default/token",
                None,
                ("create", "serviceaccounts/token"),
            ),
            (
                Method::PUT,
                "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/n",
                None,
                ("update", "leases"),
            ),
            (
                Method::GET,
                "/api/v1/namespaces/kubeedge",
                None,
                ("get", "namespaces"),
            ),
            (
                Method::POST,
                "/api/v1/namespaces",
                None,
                ("create", "namespaces"),
            ),
            (
                Method::DELETE,
                "/api/v1/namespaces/a/pods/p",
                None,
                ("delete", "pods"),
            ),
            (
                Method::DELETE,
                "/api/v1/namespaces/a/pods",
                None,
                ("deletecollection", "pods"),
            ),
            (
                Method::POST,
                "/apis/authorization.k8s.io/v1/subjectaccessreviews",
                None,
                ("create", "subjectaccessreviews"),
            ),
            (Method::GET, "/version", None, ("list", "/version")),
        ];
        for (method, path, query, (verb, resource)) in cases {
            assert_eq!(
                info(method, path, query),
                (verb, resource.to_owned()),
                "{path}"
            );
        }
    }

    #[test]
    fn a_429_keeps_its_retry_after() {
        let requests = ApiRequests::default();
        assert_eq!(requests.last_retry_after(), None);
        let mut headers = http::HeaderMap::new();
        requests.throttled_answer(&headers);
        assert_eq!(
            (requests.throttled(), requests.last_retry_after()),
            (1, None)
        );
        headers.insert(
            http::header::RETRY_AFTER,
            http::HeaderValue::from_static("3"),
        );
        requests.throttled_answer(&headers);
        assert_eq!(
            (requests.throttled(), requests.last_retry_after()),
            (2, Some(Duration::from_secs(3)))
        );
        // A date is not read; the last pause said stays.
        headers.insert(
            http::header::RETRY_AFTER,
            http::HeaderValue::from_static("Wed, 21 Oct 2015 07:28:00 GMT"),
        );
        requests.throttled_answer(&headers);
        assert_eq!(requests.last_retry_after(), Some(Duration::from_secs(3)));
    }

    #[test]
    fn counts_add_up_by_verb_and_resource() {
        let requests = ApiRequests::default();
        for _ in 0..3 {
            requests.record(&Method::PUT, "/api/v1/namespaces/a/pods/p/status", None);
        }
        requests.record(&Method::GET, "/api/v1/pods", Some("watch=true"));
        assert_eq!(
            requests.snapshot(),
            vec![
                ("update", "pods/status".to_owned(), 3),
                ("watch", "pods".to_owned(), 1)
            ]
        );
        assert_eq!(requests.total(), 4);
    }
}
