//! The join-token ledger kept with the desired state, so that every
//! replica (etcd, the Kubernetes API server) sees one: a Secret
//! (`<namespace>/edgehive-join-ledger`, like KubeEdge's `tokensecret`)
//! holding the token records and the revoked nodes
//! ([`hub::certs::ledger::LedgerState`], JSON under `data.ledger`). Reads
//! come from the store's local view; each write replaces the Secret under
//! its resource version, so a single-use token is used once however many
//! replicas admit it at the same time (the losers read again and are
//! refused). [`revoke_deleted_nodes`] records every Node deletion.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use futures_util::StreamExt;
use futures_util::future::BoxFuture;
use serde_json::json;
use tracing::{info, warn};

use apis::kinds::{Kind, ObjectKey};
use hub::certs::ledger::{self, LedgerError, LedgerState};
use hub::certs::{JoinLedger, Revocations, TokenClaims, TokenRecord};

use crate::desired::{DesiredError, DesiredState, Object, WatchEvent};

/// The Secret's name.
pub const LEDGER_SECRET: &str = "edgehive-join-ledger";

/// Writes that lost a race are tried again this many times.
const TRIES: usize = 20;

/// The token ledger in the desired state.
#[derive(Clone)]
pub struct StoredLedger {
    store: Arc<dyn DesiredState>,
    key: ObjectKey,
}

impl StoredLedger {
    /// The ledger in `namespace` of `store`.
    pub fn new(store: Arc<dyn DesiredState>, namespace: &str) -> StoredLedger {
        StoredLedger {
            store,
            key: ObjectKey::new(Kind::Secret, namespace, LEDGER_SECRET),
        }
    }

    /// The stored Secret and the state it holds (empty when there is none).
    fn read(&self) -> Result<(Option<Object>, LedgerState), LedgerError> {
        let secret = self.store.get(&self.key).map_err(backend)?;
        let state = match secret
            .as_ref()
            .and_then(|s| s.json()["data"]["ledger"].as_str())
        {
            None => LedgerState::default(),
            Some(data) => {
                let bytes = STANDARD.decode(data).map_err(backend)?;
                serde_json::from_slice(&bytes).map_err(backend)?
            }
        };
        Ok((secret, state))
    }

    /// Changes the state with `change` (its answer: what to tell the
    /// caller, and whether to write) under the Secret's resource version,
    /// again on a conflict.
    fn update<T: Send + 'static>(
        &self,
        change: impl Fn(&mut LedgerState) -> Result<(T, bool), LedgerError> + Send + 'static,
    ) -> BoxFuture<'static, Result<T, LedgerError>> {
        let this = self.clone();
        Box::pin(async move {
            let mut tries = 0;
            loop {
                tries += 1;
                let (secret, mut state) = this.read()?;
                let (answer, write) = change(&mut state)?;
                if !write {
                    return Ok(answer);
                }
                let data = STANDARD.encode(serde_json::to_vec(&state).map_err(backend)?);
                let written = match secret {
                    Some(mut secret) => {
                        secret.edit(|body| body["data"] = json!({ "ledger": data }));
                        this.store.replace(secret).await
                    }
                    None => {
                        let mut secret = Object::stub(&this.key);
                        secret.edit(|body| {
                            body["type"] = json!("Opaque");
                            body["data"] = json!({ "ledger": data });
                        });
                        this.store.create(secret).await
                    }
                };
                match written {
                    Ok(_) => return Ok(answer),
                    Err(DesiredError::Conflict { .. } | DesiredError::AlreadyExists { .. })
                        if tries < TRIES =>
                    {
                        // Another writer won: wait for its write to reach
                        // the local view, and decide again.
                        this.caught_up().await;
                    }
                    Err(err) => return Err(backend(err)),
                }
            }
        })
    }

    /// Waits (briefly) for the local view to change.
    async fn caught_up(&self) {
        let before = self.store.get(&self.key).ok().flatten();
        for _ in 0..50 {
            tokio::time::sleep(Duration::from_millis(10 + fastrand::u64(..10))).await;
            if self.store.get(&self.key).ok().flatten() != before {
                return;
            }
        }
    }
}

fn backend(err: impl std::fmt::Display) -> LedgerError {
    LedgerError::Backend(err.to_string())
}

impl JoinLedger for StoredLedger {
    fn token(&self, id: &str) -> Option<TokenRecord> {
        self.read().ok()?.1.tokens.remove(id)
    }

    fn tokens(&self) -> Vec<TokenRecord> {
        let mut tokens: Vec<TokenRecord> = self
            .read()
            .map(|(_, state)| state.tokens.into_values().collect())
            .unwrap_or_default();
        tokens.sort_by(|a, b| a.id.cmp(&b.id));
        tokens
    }

    fn revocations(&self) -> Revocations {
        self.read()
            .map(|(_, state)| state.revoked_nodes)
            .unwrap_or_default()
    }

    fn record(&self, record: TokenRecord) -> BoxFuture<'static, Result<(), LedgerError>> {
        self.update(move |state| {
            ledger::prune_tokens(&mut state.tokens, unix_now());
            state.tokens.insert(record.id.clone(), record.clone());
            Ok(((), true))
        })
    }

    fn consume(
        &self,
        claims: TokenClaims,
        node: String,
        now: u64,
    ) -> BoxFuture<'static, Result<(), LedgerError>> {
        self.update(move |state| {
            ledger::consume(&mut state.tokens, &claims, &node, now)?;
            Ok(((), true))
        })
    }

    fn revoke_token(
        &self,
        id: String,
        now: u64,
        unrecorded: bool,
    ) -> BoxFuture<'static, Result<ledger::Revoked, LedgerError>> {
        self.update(move |state| {
            let done = ledger::revoke(&mut state.tokens, &id, now, unrecorded);
            Ok((done, done == ledger::Revoked::Now))
        })
    }

    fn revoke_node(
        &self,
        node: String,
        uid: String,
        now: u64,
    ) -> BoxFuture<'static, Result<bool, LedgerError>> {
        self.update(move |state| {
            let done = state.revoked_nodes.revoke(&node, &uid, now);
            Ok((done, done))
        })
    }
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Revokes the certificates of every Node deleted from `store` from now
/// on (listing, then watching; listing again when the watch cannot
/// resume). Runs until the task is dropped.
pub async fn revoke_deleted_nodes(store: Arc<dyn DesiredState>, ledger: Arc<dyn JoinLedger>) {
    loop {
        let since = match store.list(Kind::Node, None) {
            Ok((_, revision)) => revision,
            Err(err) => {
                warn!(error = %err, "node revocations: listing nodes failed; again in a second");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        let mut events = match store.watch(Kind::Node, since) {
            Ok(events) => events,
            Err(err) => {
                warn!(error = %err, "node revocations: watching nodes failed; again in a second");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        while let Some(event) = events.next().await {
            let node = match event {
                Ok(WatchEvent::Deleted(node)) => node,
                Ok(_) => continue,
                Err(_) => break,
            };
            let name = node.key().name.as_str();
            let uid = node.uid().unwrap_or("");
            match ledger
                .revoke_node(name.to_owned(), uid.to_owned(), unix_now())
                .await
            {
                Ok(true) => info!(node = %name, "node deleted: its certificates are revoked"),
                Ok(false) => {}
                Err(err) => {
                    warn!(node = %name, error = %err, "node deleted, its certificates NOT revoked")
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::EmbeddedStore;

    #[actix::test]
    async fn the_ledger_lives_in_a_secret_and_a_single_use_token_is_used_once() {
        let dir = tempfile::tempdir().expect("dir");
        let store = EmbeddedStore::open(&dir.path().join("d.redb")).expect("store");
        let shared = store.clone().shared();
        let ledger = StoredLedger::new(shared.clone(), "kubeedge");
        let claims = TokenClaims {
            id: Some("t1".into()),
            expires: unix_now() + 600,
            node: None,
            single_use: true,
        };
        ledger
            .record(TokenRecord::issued(&claims).expect("id"))
            .await
            .expect("recorded");
        // Two ledgers on one store (two replicas): one use wins.
        let other = StoredLedger::new(shared.clone(), "kubeedge");
        let (a, b) = futures_util::join!(
            ledger.consume(claims.clone(), "a".into(), unix_now()),
            other.consume(claims.clone(), "b".into(), unix_now()),
        );
        assert_eq!(a.is_ok() as u8 + b.is_ok() as u8, 1, "{a:?} {b:?}");
        let used_by = ledger.token("t1").expect("recorded").used_by;
        assert_eq!(used_by.as_deref(), Some(if a.is_ok() { "a" } else { "b" }));
        assert_eq!(
            ledger
                .revoke_token("t1".into(), 5, false)
                .await
                .expect("revoked"),
            ledger::Revoked::Now
        );
        assert_eq!(other.tokens()[0].revoked, Some(5));
        assert!(
            ledger
                .revoke_node("n".into(), "u".into(), 100)
                .await
                .expect("revoked")
        );
        assert!(other.revocations().revoked("n", 100));
        let secret = shared
            .get(&ObjectKey::new(Kind::Secret, "kubeedge", LEDGER_SECRET))
            .expect("read")
            .expect("a Secret");
        assert!(secret["data"]["ledger"].is_string());
        store.close().await;
    }
}
