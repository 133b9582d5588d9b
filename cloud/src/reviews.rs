//! Who may call the kubelet API or the resource metrics API: the caller's
//! client certificate names it (common name the user, organizations its
//! groups; through the aggregation layer, the front proxy's headers do),
//! and the API server decides, as it does for a kubelet with webhook
//! authorization or an aggregated API server: a `SubjectAccessReview` for
//! the [`Access`] asked (`verb` on `nodes/<subresource>` of the node, or on
//! `metrics.k8s.io` pods or nodes). Decisions are kept a while (allowed 5
//! minutes, denied 30 seconds, as the kubelet's defaults).

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::pin::Pin;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The authorization attributes of a request, as the kubelet forms them:
/// `verb` on `nodes/<subresource>` of the node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attributes {
    /// `get`, `create`, ...
    pub verb: &'static str,
    /// `proxy`, `stats`, `metrics`, `log`, `healthz`.
    pub subresource: &'static str,
}

/// A caller, from its verified client certificate (or a token's review,
/// or the front proxy's headers).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct Caller {
    /// The subject's common name.
    pub user: String,
    /// The subject's organizations.
    pub groups: Vec<String>,
    /// What its authenticator adds (a TokenReview's `extra`, the front
    /// proxy's `X-Remote-Extra-*`), passed on to SubjectAccessReviews.
    pub extra: BTreeMap<String, Vec<String>>,
}

/// The extra a bound service account token carries: the node its pod
/// runs on.
pub const NODE_NAME_EXTRA: &str = "authentication.kubernetes.io/node-name";

impl Caller {
    /// `user` in `groups`, with no extra.
    pub fn new(user: impl Into<String>, groups: Vec<String>) -> Caller {
        Caller {
            user: user.into(),
            groups,
            extra: BTreeMap::new(),
        }
    }

    /// The caller a DER certificate names, if it reads.
    pub fn from_certificate(der: &[u8]) -> Option<Caller> {
        let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
        let subject = cert.subject();
        let user = subject.iter_common_name().next()?.as_str().ok()?.to_owned();
        let groups = subject
            .iter_organization()
            .filter_map(|o| o.as_str().ok().map(str::to_owned))
            .collect();
        Some(Caller::new(user, groups))
    }
}

/// What a caller asks to do, as a `SubjectAccessReview` names it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Access {
    /// `get`, `list`, `create`, ...
    pub verb: &'static str,
    /// The API group ("" the core group).
    pub group: &'static str,
    /// `nodes`, `pods`.
    pub resource: &'static str,
    /// `proxy`, `stats`, ... ("" none).
    pub subresource: &'static str,
    /// The namespace ("" cluster-wide or all).
    pub namespace: String,
    /// The object's name ("" every one).
    pub name: String,
}

impl Access {
    /// A kubelet API request's access to `node`.
    pub fn node(attributes: &Attributes, node: &str) -> Access {
        Access {
            verb: attributes.verb,
            group: "",
            resource: "nodes",
            subresource: attributes.subresource,
            namespace: String::new(),
            name: node.to_owned(),
        }
    }
}

/// A decision's future.
pub type Decision<'a> = Pin<Box<dyn Future<Output = Result<bool, String>> + Send + 'a>>;

/// Decides whether a caller may do what it asks of a node.
pub trait Authorizer: Send + Sync {
    /// Whether `caller` may have `access` (`Err`: no decision could be
    /// had; the request is refused).
    fn allowed<'a>(&'a self, caller: &'a Caller, access: &'a Access) -> Decision<'a>;
}

/// How long an allowed decision is kept.
pub const ALLOWED_FOR: Duration = Duration::from_secs(300);
/// How long a denied decision is kept.
pub const DENIED_FOR: Duration = Duration::from_secs(30);
/// The most decisions kept.
const MAX_KEPT: usize = 10_000;

type Key = (Caller, Access);

/// Decisions kept for a while (plain code: time is passed in).
#[derive(Default)]
pub struct DecisionCache {
    kept: Mutex<HashMap<Key, (bool, Instant)>>,
}

impl DecisionCache {
    /// The kept decision, if still fresh at `now`.
    pub fn get(&self, caller: &Caller, access: &Access, now: Instant) -> Option<bool> {
        let kept = self.kept.lock().ok()?;
        let (allowed, at) = kept.get(&(caller.clone(), access.clone()))?;
        let ttl = if *allowed { ALLOWED_FOR } else { DENIED_FOR };
        (now.saturating_duration_since(*at) < ttl).then_some(*allowed)
    }

    /// Keeps a decision made at `now`.
    pub fn put(&self, caller: &Caller, access: &Access, allowed: bool, now: Instant) {
        if let Ok(mut kept) = self.kept.lock() {
            if kept.len() >= MAX_KEPT {
                kept.retain(|_, (allowed, at)| {
                    let ttl = if *allowed { ALLOWED_FOR } else { DENIED_FOR };
                    now.saturating_duration_since(*at) < ttl
                });
                if kept.len() >= MAX_KEPT {
                    kept.clear();
                }
            }
            kept.insert((caller.clone(), access.clone()), (allowed, now));
        }
    }
}

/// An authentication's future: the token's caller, `None` for a token
/// that is not valid (`Err`: no answer could be had).
pub type Authentication<'a> =
    Pin<Box<dyn Future<Output = Result<Option<Caller>, String>> + Send + 'a>>;

/// Says who a bearer token is (kube-apiserver's TokenReview).
pub trait TokenAuthenticator: Send + Sync {
    /// The caller `token` stands for, if it is valid.
    fn authenticate<'a>(&'a self, token: &'a str) -> Authentication<'a>;
}

/// Who tokens are and what they may do: an edge MetaServer's
/// `requireAuthorization` reviews (Kubernetes mode).
#[derive(Clone)]
pub struct TokenAccess {
    /// Who a token is.
    pub authenticator: std::sync::Arc<dyn TokenAuthenticator>,
    /// What its caller may do.
    pub authorizer: std::sync::Arc<dyn Authorizer>,
    /// How many reviews each node may ask for.
    pub limits: std::sync::Arc<ReviewLimits>,
}

impl TokenAccess {
    /// Reviews by `authenticator` and `authorizer`, each node held to
    /// [`ReviewLimits::default`].
    pub fn new(
        authenticator: std::sync::Arc<dyn TokenAuthenticator>,
        authorizer: std::sync::Arc<dyn Authorizer>,
    ) -> TokenAccess {
        TokenAccess {
            authenticator,
            authorizer,
            limits: std::sync::Arc::new(ReviewLimits::default()),
        }
    }
}

/// How many reviews a node may ask the API server for: a bucket per node
/// of `burst` reviews, refilled at `per_second` (plain code: time is
/// passed in). An edge keeps its decisions, so a node asking more than
/// this is asked about tokens it has not seen: random ones, a peer beyond
/// its loopback trying its luck. Over the limit the node gets no decision
/// (its MetaServer answers 503) and the API server is not asked.
pub struct ReviewLimits {
    per_second: f64,
    burst: f64,
    buckets: Mutex<HashMap<String, (f64, Instant)>>,
}

/// Reviews a node may ask for each second, on average.
pub const REVIEWS_PER_SECOND: f64 = 20.0;
/// Reviews a node may ask for at once.
pub const REVIEW_BURST: f64 = 100.0;
/// The most nodes whose buckets are kept (full ones are dropped first).
const MAX_BUCKETS: usize = 100_000;

impl Default for ReviewLimits {
    fn default() -> Self {
        ReviewLimits::new(REVIEWS_PER_SECOND, REVIEW_BURST)
    }
}

impl ReviewLimits {
    /// `burst` reviews at once per node, refilled at `per_second`.
    pub fn new(per_second: f64, burst: f64) -> ReviewLimits {
        ReviewLimits {
            per_second,
            burst,
            buckets: Mutex::new(HashMap::new()),
        }
    }

    /// Whether `node` may ask for one more review at `now` (taken if so).
    pub fn take(&self, node: &str, now: Instant) -> bool {
        let mut buckets = self
            .buckets
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let refill = |(left, at): (f64, Instant)| {
            let earned = now.saturating_duration_since(at).as_secs_f64() * self.per_second;
            (self.burst.min(left + earned), now)
        };
        if buckets.len() >= MAX_BUCKETS && !buckets.contains_key(node) {
            let burst = self.burst;
            buckets.retain(|_, bucket| refill(*bucket).0 < burst);
        }
        let bucket = buckets.get(node).copied().map_or((self.burst, now), refill);
        let taken = bucket.0 >= 1.0;
        let left = if taken { bucket.0 - 1.0 } else { bucket.0 };
        buckets.insert(node.to_owned(), (left, bucket.1));
        taken
    }
}

impl std::fmt::Debug for TokenAccess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TokenAccess")
    }
}

/// What an edge's MetaServer may be asked for: a read (`get`, `list`,
/// `watch`) of a kind it holds, with no subresource.
pub fn metaserver_access(request: &apis::access::RequestAttributes) -> Option<Access> {
    let verb = ["get", "list", "watch"]
        .into_iter()
        .find(|verb| *verb == request.verb)?;
    let kind = apis::Kind::from_plural(&request.resource)?;
    let group = kind
        .api_version()
        .rsplit_once('/')
        .map_or("", |(group, _)| group);
    let wanted = request.resource_request
        && request.subresource.is_empty()
        && request.group == group
        && (kind.namespaced() || request.namespace.is_empty());
    wanted.then(|| Access {
        verb,
        group,
        resource: kind.plural(),
        subresource: "",
        namespace: request.namespace.clone(),
        name: request.name.clone(),
    })
}

/// The cloud's answer to `node`'s review of an application's request
/// (`Err`: no decision could be had). Without `access` (no API server
/// issues tokens: the embedded store), every token is unauthenticated. A
/// token bound to a pod on another node is not valid here: a token taken
/// from one node's pod opens nothing on another.
pub async fn review_edge_request(
    access: Option<&TokenAccess>,
    node: &str,
    review: &apis::access::AccessReview,
) -> Result<apis::access::ReviewAnswer, String> {
    use apis::access::ReviewAnswer;
    let Some(access) = access else {
        return Ok(ReviewAnswer::Unauthenticated {
            reason: "service account tokens need Kubernetes mode (no API server issues or reviews them here)".to_owned(),
        });
    };
    if !access.limits.take(node, Instant::now()) {
        return Err(format!(
            "node {node} asks for more than {REVIEWS_PER_SECOND} token reviews a second; try again"
        ));
    }
    let Some(caller) = access.authenticator.authenticate(&review.token).await? else {
        return Ok(ReviewAnswer::Unauthenticated {
            reason: "invalid bearer token".to_owned(),
        });
    };
    if let Some(bound) = caller.extra.get(NODE_NAME_EXTRA)
        && !bound.iter().any(|bound| bound == node)
    {
        return Ok(ReviewAnswer::Unauthenticated {
            reason: format!(
                "the token is bound to a pod on node {}, not on {node}",
                bound.join(", ")
            ),
        });
    }
    let Some(asked) = metaserver_access(&review.attributes) else {
        return Ok(ReviewAnswer::Denied {
            user: caller.user,
            reason: "MetaServer serves reads (get, list, watch) of the kinds it holds only"
                .to_owned(),
        });
    };
    Ok(match access.authorizer.allowed(&caller, &asked).await? {
        true => ReviewAnswer::Allowed { user: caller.user },
        false => ReviewAnswer::Denied {
            user: caller.user,
            reason: String::new(),
        },
    })
}

/// The API server's `TokenReview`s (made with cloudcore's credentials;
/// the API server's own audiences).
#[cfg(feature = "kubernetes")]
pub struct TokenReviews {
    client: kube::Client,
}

#[cfg(feature = "kubernetes")]
impl TokenReviews {
    /// Reviews asked of the API server `client` talks to.
    pub fn new(client: kube::Client) -> TokenReviews {
        TokenReviews { client }
    }
}

#[cfg(feature = "kubernetes")]
impl TokenAuthenticator for TokenReviews {
    fn authenticate<'a>(&'a self, token: &'a str) -> Authentication<'a> {
        use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
        Box::pin(async move {
            let review = TokenReview {
                spec: TokenReviewSpec {
                    token: Some(token.to_owned()),
                    ..TokenReviewSpec::default()
                },
                ..TokenReview::default()
            };
            let api: kube::Api<TokenReview> = kube::Api::all(self.client.clone());
            let answer = api
                .create(&kube::api::PostParams::default(), &review)
                .await
                .map_err(|err| format!("TokenReview: {err}"))?;
            let Some(status) = answer.status.filter(|s| s.authenticated == Some(true)) else {
                return Ok(None);
            };
            let Some(user) = status.user.filter(|u| u.username.is_some()) else {
                return Ok(None);
            };
            Ok(Some(Caller {
                user: user.username.unwrap_or_default(),
                groups: user.groups.unwrap_or_default(),
                extra: user.extra.unwrap_or_default().into_iter().collect(),
            }))
        })
    }
}

/// The API server's `SubjectAccessReview`s.
#[cfg(feature = "kubernetes")]
pub struct SubjectAccessReviews {
    client: kube::Client,
    cache: DecisionCache,
}

#[cfg(feature = "kubernetes")]
impl SubjectAccessReviews {
    /// Reviews asked of the API server `client` talks to.
    pub fn new(client: kube::Client) -> SubjectAccessReviews {
        SubjectAccessReviews {
            client,
            cache: DecisionCache::default(),
        }
    }
}

#[cfg(feature = "kubernetes")]
impl Authorizer for SubjectAccessReviews {
    fn allowed<'a>(&'a self, caller: &'a Caller, access: &'a Access) -> Decision<'a> {
        use k8s_openapi::api::authorization::v1::{
            ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
        };
        Box::pin(async move {
            if let Some(kept) = self.cache.get(caller, access, Instant::now()) {
                return Ok(kept);
            }
            let review = SubjectAccessReview {
                spec: SubjectAccessReviewSpec {
                    user: Some(caller.user.clone()),
                    groups: Some(caller.groups.clone()),
                    extra: (!caller.extra.is_empty())
                        .then(|| caller.extra.clone().into_iter().collect()),
                    resource_attributes: Some(ResourceAttributes {
                        verb: Some(access.verb.to_owned()),
                        group: Some(access.group.to_owned()),
                        resource: Some(access.resource.to_owned()),
                        subresource: Some(access.subresource.to_owned()),
                        namespace: Some(access.namespace.clone()),
                        name: Some(access.name.clone()),
                        ..ResourceAttributes::default()
                    }),
                    ..SubjectAccessReviewSpec::default()
                },
                ..SubjectAccessReview::default()
            };
            let api: kube::Api<SubjectAccessReview> = kube::Api::all(self.client.clone());
            let answer = api
                .create(&kube::api::PostParams::default(), &review)
                .await
                .map_err(|err| format!("SubjectAccessReview: {err}"))?;
            let allowed = answer.status.is_some_and(|s| s.allowed);
            self.cache.put(caller, access, allowed, Instant::now());
            Ok(allowed)
        })
    }
}

#[cfg(test)]
mod tests;
