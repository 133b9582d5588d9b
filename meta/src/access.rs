//! Who may read from MetaServer (KubeEdge's `requireAuthorization`).
//!
//! With it on, an edge application presents a service account token
//! (`Authorization: Bearer <token>`) and may read what that account may
//! read: the edge asks the cloud to review the request ([`AccessReview`]:
//! the token and the request's verb, resource, namespace and name), and
//! the cloud answers through kube-apiserver's TokenReview and
//! SubjectAccessReview, for the node on the link only. A request without a
//! token is served only from a loopback peer, as with
//! `requireAuthorization` off.
//!
//! Decisions are kept at the edge a while ([`Decisions`]: allowed 5
//! minutes, denied or unauthenticated 30 seconds, at most 10,000), keyed
//! by the SHA-256 of the token ([`TokenHash`]; the token itself is never
//! kept or logged). While the cloud is unreachable a kept decision still
//! answers; a request with none is refused with 503: authorization needs
//! the cloud. [`Decisions`] is plain code, with the time passed in.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::future::BoxFuture;
use tracing::{debug, info};

use apis::access::{AccessReview, RequestAttributes, ReviewAnswer};
use apis::api::ApiError;
use beehive::constants::{group, module, operation, resource_type};
use beehive::{Content, Hive, Message as HiveMessage};

/// The SHA-256 of a bearer token: what identifies it in the cache.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct TokenHash([u8; 32]);

impl TokenHash {
    /// The hash of `token`.
    pub fn of(token: &str) -> TokenHash {
        let digest = ring::digest::digest(&ring::digest::SHA256, token.as_bytes());
        let mut hash = [0; 32];
        hash.copy_from_slice(digest.as_ref());
        TokenHash(hash)
    }
}

impl std::fmt::Debug for TokenHash {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Enough to tell tokens apart in a log, nothing to replay.
        write!(
            f,
            "TokenHash({:02x}{:02x}{:02x}{:02x}..)",
            self.0[0], self.0[1], self.0[2], self.0[3]
        )
    }
}

/// What happens to a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Served.
    Allowed,
    /// 403, with kube-apiserver's wording.
    Forbidden(String),
    /// 401.
    Unauthenticated(String),
    /// 503: no decision could be had (never kept).
    Unavailable(String),
}

impl Verdict {
    /// The refusal, if it is one.
    pub fn refusal(self) -> Option<ApiError> {
        match self {
            Verdict::Allowed => None,
            Verdict::Forbidden(message) => Some(ApiError::Forbidden(message)),
            Verdict::Unauthenticated(message) => Some(ApiError::Unauthorized(message)),
            Verdict::Unavailable(message) => Some(ApiError::Unavailable(message)),
        }
    }
}

/// How long decisions are kept, and how many.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecisionLimits {
    /// An allowed request (the kubelet's webhook default: 5 minutes).
    pub allowed_for: Duration,
    /// A denied or unauthenticated one (30 seconds).
    pub denied_for: Duration,
    /// The most decisions kept.
    pub max_kept: usize,
}

impl Default for DecisionLimits {
    fn default() -> Self {
        DecisionLimits {
            allowed_for: Duration::from_secs(300),
            denied_for: Duration::from_secs(30),
            max_kept: 10_000,
        }
    }
}

/// A request as the cache knows it: whose token, asking what.
pub type DecisionKey = (TokenHash, RequestAttributes);

/// Decisions the cloud made, kept a while (no I/O; `now` passed in).
#[derive(Debug)]
pub struct Decisions {
    limits: DecisionLimits,
    kept: HashMap<DecisionKey, (Verdict, Instant)>,
}

impl Decisions {
    /// An empty cache with `limits`.
    pub fn new(limits: DecisionLimits) -> Decisions {
        Decisions {
            limits,
            kept: HashMap::new(),
        }
    }

    /// How many decisions are kept.
    pub fn len(&self) -> usize {
        self.kept.len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.kept.is_empty()
    }

    fn fresh(&self, verdict: &Verdict, at: Instant, now: Instant) -> bool {
        let ttl = match verdict {
            Verdict::Allowed => self.limits.allowed_for,
            _ => self.limits.denied_for,
        };
        now.saturating_duration_since(at) < ttl
    }

    /// The decision kept for `key`, if still fresh at `now`.
    pub fn kept(&self, key: &DecisionKey, now: Instant) -> Option<Verdict> {
        let (verdict, at) = self.kept.get(key)?;
        self.fresh(verdict, *at, now).then(|| verdict.clone())
    }

    /// Takes the cloud's `answer` for `key` (`Err`: no answer, the cloud
    /// unreachable or unable to review), keeps it unless it is no answer,
    /// and says what happens to the request.
    pub fn answered(
        &mut self,
        key: DecisionKey,
        answer: Result<ReviewAnswer, String>,
        now: Instant,
    ) -> Verdict {
        let verdict = match answer {
            Ok(ReviewAnswer::Allowed { .. }) => Verdict::Allowed,
            Ok(ReviewAnswer::Denied { user, reason }) => {
                Verdict::Forbidden(forbidden_message(&user, &key.1, &reason))
            }
            Ok(ReviewAnswer::Unauthenticated { reason }) => {
                Verdict::Unauthenticated(format!("Unauthorized: {reason}"))
            }
            Err(reason) => {
                return Verdict::Unavailable(format!(
                    "authorization needs the cloud, and it gave no decision: {reason}"
                ));
            }
        };
        if self.kept.len() >= self.limits.max_kept && !self.kept.contains_key(&key) {
            self.make_room(now);
        }
        self.kept.insert(key, (verdict.clone(), now));
        verdict
    }

    /// Drops what is stale at `now`; if still full, the oldest decisions.
    fn make_room(&mut self, now: Instant) {
        let limits = self.limits;
        self.kept.retain(|_, (verdict, at)| {
            let ttl = match verdict {
                Verdict::Allowed => limits.allowed_for,
                _ => limits.denied_for,
            };
            now.saturating_duration_since(*at) < ttl
        });
        if self.kept.len() >= self.limits.max_kept {
            // A tenth at once, so a full cache of fresh decisions does not
            // sort on every request.
            let mut ages: Vec<(Instant, DecisionKey)> = self
                .kept
                .iter()
                .map(|(key, (_, at))| (*at, key.clone()))
                .collect();
            ages.sort_by_key(|(at, _)| *at);
            let drop = (self.limits.max_kept / 10).max(1);
            for (_, key) in ages.into_iter().take(drop) {
                self.kept.remove(&key);
            }
        }
    }
}

/// kube-apiserver's wording of a refusal.
fn forbidden_message(user: &str, request: &RequestAttributes, reason: &str) -> String {
    let object = match request.name.as_str() {
        "" => request.resource.clone(),
        name => format!("{} {name:?}", request.resource),
    };
    let scope = match request.namespace.as_str() {
        "" => "at the cluster scope".to_owned(),
        namespace => format!("in the namespace {namespace:?}"),
    };
    let mut message = format!(
        "{object} is forbidden: User {user:?} cannot {} resource {:?} in API group {:?} {scope}",
        request.verb, request.resource, request.group
    );
    if !reason.is_empty() {
        message.push_str(": ");
        message.push_str(reason);
    }
    message
}

/// Who a request says it is.
#[derive(PartialEq, Eq)]
pub enum Credentials {
    /// A bearer token.
    Bearer(String),
    /// Nothing.
    Anonymous,
}

impl Credentials {
    /// The credentials in an `Authorization` header's value; 401 for a
    /// header that holds no bearer token.
    pub fn from_header(authorization: Option<&str>) -> Result<Credentials, ApiError> {
        let Some(value) = authorization else {
            return Ok(Credentials::Anonymous);
        };
        value
            .strip_prefix("Bearer ")
            .or_else(|| value.strip_prefix("bearer "))
            .map(str::trim)
            .filter(|token| !token.is_empty())
            .map(|token| Credentials::Bearer(token.to_owned()))
            .ok_or_else(|| {
                ApiError::Unauthorized("Unauthorized: only bearer tokens are taken".into())
            })
    }
}

/// Asks the cloud to review an application's request.
pub trait AccessReviewer: Send + Sync + 'static {
    /// The cloud's answer, or why there is none.
    fn review(&self, review: AccessReview) -> BoxFuture<'static, Result<ReviewAnswer, String>>;
}

/// Reviews asked of the cloud over the hub link (edgehub answers at once,
/// with an error, while the link is down).
pub struct HubReviewer {
    hive: Hive,
    timeout: Duration,
}

impl HubReviewer {
    /// Reviews sent through `hive`'s edgehub, each waited for at most
    /// `timeout`.
    pub fn new(hive: Hive, timeout: Duration) -> HubReviewer {
        HubReviewer { hive, timeout }
    }
}

/// Where a review question goes: the edge resource `default/accessreview`,
/// which the cloud's edgecontroller answers.
pub fn review_resource() -> String {
    format!("default/{}", resource_type::ACCESS_REVIEW)
}

impl AccessReviewer for HubReviewer {
    fn review(&self, review: AccessReview) -> BoxFuture<'static, Result<ReviewAnswer, String>> {
        let (hive, timeout) = (self.hive.clone(), self.timeout);
        Box::pin(async move {
            let content = Content::of(&review).map_err(|err| err.to_string())?;
            let query = HiveMessage::new()
                .build_router(
                    module::METAMANAGER,
                    group::RESOURCE,
                    review_resource(),
                    operation::QUERY,
                )
                .with_content(content);
            let reply = hive
                .send_sync(module::EDGEHUB, query, timeout)
                .await
                .map_err(|err| err.to_string())?;
            if let Some(refused) = reply.failure() {
                return Err(match refused.reason.is_empty() {
                    true => "the cloud refused the review".to_owned(),
                    false => refused.reason,
                });
            }
            reply
                .body()
                .map_err(|err| format!("the cloud's answer does not read: {err}"))
        })
    }
}

/// MetaServer's gate: the reviewer and the decisions kept.
pub struct Gate {
    reviewer: Arc<dyn AccessReviewer>,
    decisions: Mutex<Decisions>,
}

impl Gate {
    /// A gate asking `reviewer`, keeping decisions within `limits`.
    pub fn new(reviewer: Arc<dyn AccessReviewer>, limits: DecisionLimits) -> Gate {
        Gate {
            reviewer,
            decisions: Mutex::new(Decisions::new(limits)),
        }
    }

    fn decisions(&self) -> std::sync::MutexGuard<'_, Decisions> {
        self.decisions
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Whether the request `method path_and_query`, with `authorization`
    /// (the header's value) from a loopback peer or not, may be served.
    pub async fn admit(
        &self,
        authorization: Option<&str>,
        loopback_peer: bool,
        method: &str,
        path_and_query: &str,
    ) -> Result<(), ApiError> {
        let token = match Credentials::from_header(authorization)? {
            Credentials::Anonymous if loopback_peer => return Ok(()),
            Credentials::Anonymous => {
                return Err(ApiError::Unauthorized(
                    "Unauthorized: MetaServer requires a bearer token (a service account token) from a peer that is not on loopback".into(),
                ));
            }
            Credentials::Bearer(token) => token,
        };
        let attributes = apis::access::attributes(method, path_and_query);
        let key = (TokenHash::of(&token), attributes.clone());
        let kept = self.decisions().kept(&key, Instant::now());
        let verdict = match kept {
            Some(verdict) => verdict,
            None => {
                let answer = self
                    .reviewer
                    .review(AccessReview { token, attributes })
                    .await;
                self.decisions()
                    .answered(key.clone(), answer, Instant::now())
            }
        };
        match verdict.refusal() {
            None => {
                debug!(token = ?key.0, verb = %key.1.verb, path = %key.1.path, "metaserver: allowed");
                Ok(())
            }
            Some(refusal) => {
                info!(token = ?key.0, verb = %key.1.verb, path = %key.1.path, reason = %refusal, "metaserver: refused");
                Err(refusal)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(token: &str, path: &str) -> DecisionKey {
        (TokenHash::of(token), apis::access::attributes("GET", path))
    }

    fn allowed() -> Result<ReviewAnswer, String> {
        Ok(ReviewAnswer::Allowed {
            user: "system:serviceaccount:apps:reader".to_owned(),
        })
    }

    fn denied() -> Result<ReviewAnswer, String> {
        Ok(ReviewAnswer::Denied {
            user: "system:serviceaccount:apps:reader".to_owned(),
            reason: String::new(),
        })
    }

    #[test]
    fn decisions_are_kept_for_their_time() {
        let mut decisions = Decisions::new(DecisionLimits::default());
        let t0 = Instant::now();
        let (config, secret) = (
            key("a", "/api/v1/namespaces/apps/configmaps/settings"),
            key("a", "/api/v1/namespaces/apps/secrets/keys"),
        );
        assert_eq!(decisions.kept(&config, t0), None);
        assert_eq!(
            decisions.answered(config.clone(), allowed(), t0),
            Verdict::Allowed
        );
        let Verdict::Forbidden(message) = decisions.answered(secret.clone(), denied(), t0) else {
            panic!("denied is forbidden");
        };
        assert_eq!(
            message,
            "secrets \"keys\" is forbidden: User \"system:serviceaccount:apps:reader\" cannot get resource \"secrets\" in API group \"\" in the namespace \"apps\""
        );
        let later = |s| t0 + Duration::from_secs(s);
        assert_eq!(decisions.kept(&config, later(299)), Some(Verdict::Allowed));
        assert_eq!(decisions.kept(&config, later(300)), None);
        assert!(matches!(
            decisions.kept(&secret, later(29)),
            Some(Verdict::Forbidden(_))
        ));
        assert_eq!(decisions.kept(&secret, later(30)), None);
        // Another token, another request: nothing kept for them.
        assert_eq!(
            decisions.kept(&key("b", "/api/v1/namespaces/apps/configmaps/settings"), t0),
            None
        );
        assert_eq!(
            decisions.kept(&key("a", "/api/v1/namespaces/apps/configmaps"), t0),
            None
        );
    }

    #[test]
    fn an_invalid_token_is_kept_as_briefly_as_a_denial() {
        let mut decisions = Decisions::new(DecisionLimits::default());
        let t0 = Instant::now();
        let k = key("forged", "/api/v1/pods");
        let answer = Ok(ReviewAnswer::Unauthenticated {
            reason: "invalid bearer token".to_owned(),
        });
        assert_eq!(
            decisions.answered(k.clone(), answer, t0),
            Verdict::Unauthenticated("Unauthorized: invalid bearer token".to_owned())
        );
        assert!(decisions.kept(&k, t0 + Duration::from_secs(29)).is_some());
        assert!(decisions.kept(&k, t0 + Duration::from_secs(30)).is_none());
    }

    #[test]
    fn no_answer_is_503_and_never_kept_but_a_kept_decision_still_answers() {
        let mut decisions = Decisions::new(DecisionLimits::default());
        let t0 = Instant::now();
        let (held, new) = (key("a", "/api/v1/pods"), key("a", "/api/v1/nodes"));
        decisions.answered(held.clone(), allowed(), t0);
        // The cloud is gone now.
        let gone = Err("the cloud is unreachable".to_owned());
        let verdict = decisions.answered(new.clone(), gone, t0 + Duration::from_secs(1));
        assert!(
            matches!(&verdict, Verdict::Unavailable(m) if m.contains("authorization needs the cloud")),
            "{verdict:?}"
        );
        assert_eq!(decisions.kept(&new, t0 + Duration::from_secs(1)), None);
        assert_eq!(
            decisions.kept(&held, t0 + Duration::from_secs(60)),
            Some(Verdict::Allowed)
        );
        assert_eq!(decisions.len(), 1);
    }

    #[test]
    fn the_cache_stays_bounded_dropping_stale_then_oldest() {
        let limits = DecisionLimits {
            max_kept: 100,
            ..DecisionLimits::default()
        };
        let mut decisions = Decisions::new(limits);
        let t0 = Instant::now();
        // Randomized order of tokens and times (fixed seed: reproducible).
        let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let mut clock = 0;
        for i in 0..5_000 {
            clock += next() % 3;
            let token = format!("token-{}", next() % 400);
            let answer = if next() % 2 == 0 { allowed() } else { denied() };
            let now = t0 + Duration::from_secs(clock);
            let k = key(&token, &format!("/api/v1/namespaces/n{}/pods", i % 7));
            let verdict = decisions.answered(k.clone(), answer, now);
            assert!(decisions.len() <= 100, "{} kept", decisions.len());
            // What was just decided is what is kept for it.
            assert_eq!(decisions.kept(&k, now), Some(verdict));
        }
        // Everything stale after the longest time to live.
        let end = t0 + Duration::from_secs(clock + 300);
        decisions.answered(key("last", "/api/v1/pods"), allowed(), end);
        let kept = decisions
            .kept
            .keys()
            .filter(|k| decisions.kept(k, end).is_some())
            .count();
        assert_eq!(kept, 1);
    }

    #[test]
    fn credentials_are_a_bearer_token_or_nothing() {
        assert!(matches!(
            Credentials::from_header(None),
            Ok(Credentials::Anonymous)
        ));
        assert!(matches!(
            Credentials::from_header(Some("Bearer abc")),
            Ok(Credentials::Bearer(t)) if t == "abc"
        ));
        assert!(matches!(
            Credentials::from_header(Some("Basic dTpw")),
            Err(ApiError::Unauthorized(_))
        ));
        assert!(matches!(
            Credentials::from_header(Some("Bearer  ")),
            Err(ApiError::Unauthorized(_))
        ));
    }
}
