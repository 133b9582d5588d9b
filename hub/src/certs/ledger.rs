//! What the cloud remembers about join tokens and node certificates, and
//! the decisions made from it. No I/O: the token's state and the time are
//! passed in; [`JoinLedger`] is the door to wherever the state is kept
//! (in memory here, [`MemoryLedger`]; the cloud keeps it with its desired
//! state so that every replica sees the same).
//!
//! - A token carries its restrictions in its signed claims ([`TokenClaims`]):
//!   an id, an expiry, optionally the one node it may join, and whether it
//!   may be used once only. The ledger holds what changes after issuance:
//!   whether the token was revoked, and who used a single-use one
//!   ([`TokenRecord`]). [`admit`] decides.
//! - Deleting a node revokes its certificates: [`Revocations`] maps a node
//!   to the time of its deletion (and the deleted Node's uid, so that the
//!   same deletion seen by several replicas is recorded once). Every
//!   certificate of that node issued at or before that time is refused;
//!   one issued later (the node joined again) is not. Node name and time
//!   rather than serial numbers: the cloud records nothing per certificate
//!   issued (any replica issues, and renewals issue many), the list holds
//!   one entry per deleted node, and an entry can be dropped once the
//!   longest certificate lifetime has passed since.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, PoisonError};

use futures_util::future::BoxFuture;
use serde::{Deserialize, Serialize};

/// What a join token says of itself, under its signature.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TokenClaims {
    /// The token's id (`jti`); none for tokens issued before tokens had
    /// ids, and for KubeEdge's: those cannot be revoked one by one.
    pub id: Option<String>,
    /// Unix seconds after which the token is refused.
    pub expires: u64,
    /// The only node the token may join.
    pub node: Option<String>,
    /// Whether the token joins one node once.
    pub single_use: bool,
}

/// What the cloud records of a token: its restrictions (as issued, to
/// list them) and what happened to it since.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TokenRecord {
    /// The token's id.
    pub id: String,
    /// Unix seconds it expires at.
    pub expires: u64,
    /// The only node it may join.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// Whether it joins once.
    #[serde(default)]
    pub single_use: bool,
    /// Unix seconds it was revoked at.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revoked: Option<u64>,
    /// The node that used it up (single-use tokens).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub used_by: Option<String>,
}

impl TokenRecord {
    /// The record of a token just issued with `claims` (none for a token
    /// without an id).
    pub fn issued(claims: &TokenClaims) -> Option<TokenRecord> {
        Some(TokenRecord {
            id: claims.id.clone()?,
            expires: claims.expires,
            node: claims.node.clone(),
            single_use: claims.single_use,
            revoked: None,
            used_by: None,
        })
    }
}

/// Why a token does not join a node.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenRefusal {
    /// The token's expiry has passed.
    #[error("join token expired")]
    Expired,
    /// The token was revoked.
    #[error("join token {id} was revoked")]
    Revoked {
        /// Its id.
        id: String,
    },
    /// A single-use token that was used already.
    #[error("join token {id} was used already (by node {by:?})")]
    Used {
        /// Its id.
        id: String,
        /// The node that used it.
        by: String,
    },
    /// The token is bound to another node.
    #[error("join token is for node {bound:?}, not {asked:?}")]
    WrongNode {
        /// The node it is bound to.
        bound: String,
        /// The node that asked.
        asked: String,
    },
    /// A single-use token where no ledger records uses.
    #[error("single-use join tokens need a token ledger, and this cloud keeps none")]
    NoLedger,
}

/// What signing with an admitted token takes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Admission {
    /// Sign; the token stays usable.
    Sign,
    /// Sign, then use the single-use token up (atomically, in the
    /// ledger) before the certificate is handed out: a CSR the CA refuses
    /// leaves it usable.
    Consume {
        /// Its id.
        id: String,
    },
}

/// Whether a token with `claims`, recorded as `record` (none: not in the
/// ledger), joins `node` at `now` (Unix seconds). `ledger` says whether
/// the cloud keeps a ledger at all.
pub fn admit(
    claims: &TokenClaims,
    record: Option<&TokenRecord>,
    ledger: bool,
    node: &str,
    now: u64,
) -> Result<Admission, TokenRefusal> {
    if claims.expires <= now {
        return Err(TokenRefusal::Expired);
    }
    if let Some(record) = record {
        if record.revoked.is_some() {
            return Err(TokenRefusal::Revoked {
                id: record.id.clone(),
            });
        }
        if let Some(by) = &record.used_by {
            return Err(TokenRefusal::Used {
                id: record.id.clone(),
                by: by.clone(),
            });
        }
    }
    if let Some(bound) = &claims.node
        && bound != node
    {
        return Err(TokenRefusal::WrongNode {
            bound: bound.clone(),
            asked: node.to_owned(),
        });
    }
    match (&claims.id, claims.single_use) {
        (_, false) => Ok(Admission::Sign),
        (Some(id), true) if ledger => Ok(Admission::Consume { id: id.clone() }),
        _ => Err(TokenRefusal::NoLedger),
    }
}

/// Uses up single-use token `id` for `node` in `records` (the ledger's
/// state), if nobody has and it is not revoked: the one write a ledger
/// makes atomically.
pub fn consume(
    records: &mut HashMap<String, TokenRecord>,
    claims: &TokenClaims,
    node: &str,
    now: u64,
) -> Result<(), TokenRefusal> {
    let id = claims.id.clone().ok_or(TokenRefusal::NoLedger)?;
    admit(claims, records.get(&id), true, node, now)?;
    let record = records.entry(id.clone()).or_insert(TokenRecord {
        id,
        expires: claims.expires,
        node: claims.node.clone(),
        single_use: true,
        revoked: None,
        used_by: None,
    });
    record.used_by = Some(node.to_owned());
    Ok(())
}

/// What a revocation of a token did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Revoked {
    /// Revoked now.
    Now,
    /// It was revoked already.
    Already,
    /// The ledger never recorded that id, and was not asked to revoke an
    /// unrecorded one: nothing changed (a typo must not read as done).
    Unknown,
}

/// Revokes token `id` in `records` at `now`. A token the ledger never
/// recorded (one made while the ledger could not be reached) is recorded
/// revoked only with `unrecorded` (its expiry unknown: it is kept until
/// pruned by hand); without it, an unknown id changes nothing.
pub fn revoke(
    records: &mut HashMap<String, TokenRecord>,
    id: &str,
    now: u64,
    unrecorded: bool,
) -> Revoked {
    if !unrecorded && !records.contains_key(id) {
        return Revoked::Unknown;
    }
    let record = records.entry(id.to_owned()).or_insert(TokenRecord {
        id: id.to_owned(),
        expires: u64::MAX,
        node: None,
        single_use: false,
        revoked: None,
        used_by: None,
    });
    match record.revoked {
        Some(_) => Revoked::Already,
        None => {
            record.revoked = Some(now);
            Revoked::Now
        }
    }
}

/// Drops the records of tokens expired before `now`: they are refused for
/// their expiry anyway.
pub fn prune_tokens(records: &mut HashMap<String, TokenRecord>, now: u64) {
    records.retain(|_, record| record.expires > now);
}

/// One deleted node: when (Unix seconds) and which Node object (uid).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Revocation {
    /// Unix seconds of the deletion: certificates issued then or before
    /// are refused.
    pub at: u64,
    /// The deleted Node's uid (empty if unknown).
    #[serde(default)]
    pub uid: String,
}

/// The node certificates the cloud refuses: per node, the time it was
/// deleted.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Revocations {
    nodes: BTreeMap<String, Revocation>,
}

impl Revocations {
    /// Records the deletion of `node` (the Node object `uid`) at `now`;
    /// false if that deletion is recorded already (another replica saw it
    /// first: its time stands, so a node that joined again since is not
    /// revoked anew).
    pub fn revoke(&mut self, node: &str, uid: &str, now: u64) -> bool {
        match self.nodes.get(node) {
            Some(known) if !uid.is_empty() && known.uid == uid => false,
            Some(known) if known.at >= now && known.uid.is_empty() => false,
            _ => {
                self.nodes.insert(
                    node.to_owned(),
                    Revocation {
                        at: now,
                        uid: uid.to_owned(),
                    },
                );
                true
            }
        }
    }

    /// Whether a certificate of `node` issued at `issued` (Unix seconds)
    /// is revoked.
    pub fn revoked(&self, node: &str, issued: u64) -> bool {
        self.nodes.get(node).is_some_and(|r| issued <= r.at)
    }

    /// The time to issue a certificate for `node` at, given the time is
    /// `now`: never at or before its revocation (a node joined again in
    /// the second of its deletion, or signed by a replica whose clock is
    /// behind, still gets a certificate that is not revoked).
    pub fn issue_time(&self, node: &str, now: u64) -> u64 {
        match self.nodes.get(node) {
            Some(r) if r.at >= now => r.at + 1,
            _ => now,
        }
    }

    /// Drops entries older than `lifetime` at `now`: every certificate
    /// they revoked has expired.
    pub fn prune(&mut self, now: u64, lifetime: u64) {
        self.nodes
            .retain(|_, r| r.at.saturating_add(lifetime) > now);
    }

    /// The deleted nodes and when.
    pub fn entries(&self) -> impl Iterator<Item = (&str, &Revocation)> {
        self.nodes.iter().map(|(node, r)| (node.as_str(), r))
    }
}

/// Why the ledger did not answer or write.
#[derive(Debug, Clone, thiserror::Error)]
pub enum LedgerError {
    /// The token may not be used.
    #[error(transparent)]
    Refused(#[from] TokenRefusal),
    /// Where the ledger is kept failed.
    #[error("token ledger: {0}")]
    Backend(String),
}

/// Where the cloud keeps its token records and revoked nodes. Reads come
/// from a local view and do not wait; [`JoinLedger::consume`] is atomic
/// across everything that shares the ledger (two joins with one
/// single-use token: exactly one is admitted).
pub trait JoinLedger: Send + Sync + 'static {
    /// The record of token `id`, if any.
    fn token(&self, id: &str) -> Option<TokenRecord>;

    /// Every token record.
    fn tokens(&self) -> Vec<TokenRecord>;

    /// The revoked nodes, now.
    fn revocations(&self) -> Revocations;

    /// Records a token just issued.
    fn record(&self, record: TokenRecord) -> BoxFuture<'static, Result<(), LedgerError>>;

    /// Uses up the single-use token with `claims` for `node` at `now`
    /// ([`consume`], atomically).
    fn consume(
        &self,
        claims: TokenClaims,
        node: String,
        now: u64,
    ) -> BoxFuture<'static, Result<(), LedgerError>>;

    /// Revokes token `id` at `now` ([`revoke`]; an id never recorded only
    /// with `unrecorded`).
    fn revoke_token(
        &self,
        id: String,
        now: u64,
        unrecorded: bool,
    ) -> BoxFuture<'static, Result<Revoked, LedgerError>>;

    /// Revokes the certificates of `node` (the deleted Node `uid`) at `now`
    /// ([`Revocations::revoke`]).
    fn revoke_node(
        &self,
        node: String,
        uid: String,
        now: u64,
    ) -> BoxFuture<'static, Result<bool, LedgerError>>;
}

/// Everything a ledger keeps, as one document (how the cloud stores it).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LedgerState {
    /// Token records by id.
    #[serde(default)]
    pub tokens: HashMap<String, TokenRecord>,
    /// Revoked nodes.
    #[serde(default)]
    pub revoked_nodes: Revocations,
}

/// A ledger in this process's memory: for one cloud process, and tests.
#[derive(Clone, Default)]
pub struct MemoryLedger {
    state: Arc<Mutex<LedgerState>>,
}

impl MemoryLedger {
    fn with<T>(&self, f: impl FnOnce(&mut LedgerState) -> T) -> T {
        f(&mut self.state.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

impl JoinLedger for MemoryLedger {
    fn token(&self, id: &str) -> Option<TokenRecord> {
        self.with(|s| s.tokens.get(id).cloned())
    }

    fn tokens(&self) -> Vec<TokenRecord> {
        self.with(|s| s.tokens.values().cloned().collect())
    }

    fn revocations(&self) -> Revocations {
        self.with(|s| s.revoked_nodes.clone())
    }

    fn record(&self, record: TokenRecord) -> BoxFuture<'static, Result<(), LedgerError>> {
        self.with(|s| s.tokens.insert(record.id.clone(), record));
        Box::pin(async { Ok(()) })
    }

    fn consume(
        &self,
        claims: TokenClaims,
        node: String,
        now: u64,
    ) -> BoxFuture<'static, Result<(), LedgerError>> {
        let done = self.with(|s| consume(&mut s.tokens, &claims, &node, now));
        Box::pin(async move { Ok(done?) })
    }

    fn revoke_token(
        &self,
        id: String,
        now: u64,
        unrecorded: bool,
    ) -> BoxFuture<'static, Result<Revoked, LedgerError>> {
        let done = self.with(|s| revoke(&mut s.tokens, &id, now, unrecorded));
        Box::pin(async move { Ok(done) })
    }

    fn revoke_node(
        &self,
        node: String,
        uid: String,
        now: u64,
    ) -> BoxFuture<'static, Result<bool, LedgerError>> {
        let done = self.with(|s| s.revoked_nodes.revoke(&node, &uid, now));
        Box::pin(async move { Ok(done) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claims(node: Option<&str>, single_use: bool) -> TokenClaims {
        TokenClaims {
            id: Some("t1".into()),
            expires: 1_000,
            node: node.map(str::to_owned),
            single_use,
        }
    }

    #[test]
    fn expiry_node_revocation_and_use_decide() {
        let plain = claims(None, false);
        assert_eq!(admit(&plain, None, false, "a", 999), Ok(Admission::Sign));
        assert_eq!(
            admit(&plain, None, false, "a", 1_000),
            Err(TokenRefusal::Expired)
        );
        let bound = claims(Some("a"), false);
        assert_eq!(admit(&bound, None, true, "a", 10), Ok(Admission::Sign));
        assert_eq!(
            admit(&bound, None, true, "b", 10),
            Err(TokenRefusal::WrongNode {
                bound: "a".into(),
                asked: "b".into()
            })
        );
        let mut records = HashMap::new();
        assert_eq!(revoke(&mut records, "t1", 5, false), Revoked::Unknown);
        assert!(records.is_empty(), "an unknown id changes nothing");
        assert_eq!(revoke(&mut records, "t1", 5, true), Revoked::Now);
        assert_eq!(revoke(&mut records, "t1", 6, false), Revoked::Already);
        assert_eq!(
            admit(&plain, records.get("t1"), true, "a", 10),
            Err(TokenRefusal::Revoked { id: "t1".into() })
        );
        // Expiry is told before anything else.
        assert_eq!(
            admit(&plain, records.get("t1"), true, "a", 2_000),
            Err(TokenRefusal::Expired)
        );
    }

    #[test]
    fn a_single_use_token_is_used_once() {
        let once = claims(Some("a"), true);
        assert_eq!(
            admit(&once, None, false, "a", 10),
            Err(TokenRefusal::NoLedger)
        );
        assert_eq!(
            admit(&once, None, true, "a", 10),
            Ok(Admission::Consume { id: "t1".into() })
        );
        let mut records = HashMap::new();
        // Another node cannot use it up.
        assert!(matches!(
            consume(&mut records, &once, "b", 10),
            Err(TokenRefusal::WrongNode { .. })
        ));
        assert_eq!(consume(&mut records, &once, "a", 10), Ok(()));
        assert_eq!(
            consume(&mut records, &once, "a", 11),
            Err(TokenRefusal::Used {
                id: "t1".into(),
                by: "a".into()
            })
        );
        assert_eq!(records["t1"].used_by.as_deref(), Some("a"));
        // A revoked single-use token is not used.
        let mut records = HashMap::new();
        revoke(&mut records, "t1", 3, true);
        assert!(matches!(
            consume(&mut records, &once, "a", 10),
            Err(TokenRefusal::Revoked { .. })
        ));
        // A revoked token of unknown expiry stays; an expired record goes.
        let mut used = HashMap::new();
        consume(&mut used, &once, "a", 10).expect("used");
        used.extend(records);
        prune_tokens(&mut used, 1_000);
        assert_eq!(used.keys().collect::<Vec<_>>(), ["t1"]);
        assert_eq!(used["t1"].revoked, Some(3));
    }

    #[test]
    fn a_deleted_nodes_certificates_are_revoked_and_its_next_are_not() {
        let mut revoked = Revocations::default();
        assert!(!revoked.revoked("a", 100));
        assert!(revoked.revoke("a", "uid-1", 100));
        // The same deletion, seen later by another replica: no change.
        assert!(!revoked.revoke("a", "uid-1", 130));
        assert!(revoked.revoked("a", 40));
        assert!(revoked.revoked("a", 100));
        assert!(!revoked.revoked("a", 101));
        assert!(!revoked.revoked("b", 40));
        // Joined again in the same second, or on a replica behind: issued after.
        assert_eq!(revoked.issue_time("a", 100), 101);
        assert_eq!(revoked.issue_time("a", 90), 101);
        assert_eq!(revoked.issue_time("a", 120), 120);
        assert_eq!(revoked.issue_time("b", 90), 90);
        // Deleted again (a new Node object): the later time stands.
        assert!(revoked.revoke("a", "uid-2", 200));
        assert!(revoked.revoked("a", 150));
        revoked.prune(200 + 50, 50);
        assert!(!revoked.revoked("a", 150));
    }

    #[test]
    fn random_joins_with_one_single_use_token_admit_one() {
        for _ in 0..200 {
            let mut records = HashMap::new();
            let once = TokenClaims {
                id: Some("x".into()),
                expires: 100,
                node: None,
                single_use: true,
            };
            let tries = fastrand::usize(1..10);
            let admitted = (0..tries)
                .filter(|i| {
                    consume(&mut records, &once, &format!("n{i}"), fastrand::u64(0..100)).is_ok()
                })
                .count();
            assert_eq!(admitted, 1);
        }
    }
}
