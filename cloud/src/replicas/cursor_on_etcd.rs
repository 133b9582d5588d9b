//! Delivery cursors in etcd: one key per node, `<prefix>/acked/<node>`,
//! written in a transaction that requires this replica's claim on the
//! node ([`EtcdClaims::fencing`](super::EtcdClaims::fencing)), as node
//! status is.

use std::time::Duration;

use etcd::{Etcd, Written};

use super::cursor_writer::{CursorStore, CursorWriter, Put};
use crate::desired::{FenceHold, FenceOf};

/// Where the cursors live and how often they are written.
#[derive(Debug, Clone)]
pub struct CursorConfig {
    /// The etcd members' client URLs.
    pub endpoints: Vec<String>,
    /// The key prefix (`/edgehive`): cursors live under `<prefix>/acked/`.
    pub prefix: String,
    /// Each node's cursor is written at most once per this while it
    /// changes.
    pub every: Duration,
}

impl CursorConfig {
    /// Defaults: under `/edgehive`, once a second.
    pub fn new(endpoints: Vec<String>) -> CursorConfig {
        CursorConfig {
            endpoints,
            prefix: "/edgehive".to_owned(),
            every: Duration::from_secs(1),
        }
    }
}

impl CursorWriter {
    /// Connects to etcd and starts the writer (inside a tokio runtime): a
    /// node's cursor is written under the claim `fencing` gives
    /// (`EtcdClaims::fencing`).
    pub fn start(config: CursorConfig, fencing: FenceOf) -> Result<CursorWriter, etcd::EtcdError> {
        let store = CursorsOnEtcd {
            etcd: Etcd::connect(&config.endpoints)?,
            keys: format!("{}/acked/", config.prefix.trim_end_matches('/')),
            fencing,
        };
        Ok(CursorWriter::with_store(store, config.every))
    }
}

struct CursorsOnEtcd {
    etcd: Etcd,
    /// `<prefix>/acked/`.
    keys: String,
    fencing: FenceOf,
}

impl CursorsOnEtcd {
    fn key(&self, node: &str) -> Vec<u8> {
        format!("{}{node}", self.keys).into_bytes()
    }
}

impl CursorStore for CursorsOnEtcd {
    type Claim = (etcd::Fence, FenceHold);

    /// Under etcd's request limit (1.5 MiB by default).
    const MAX_RECORD: usize = 1 << 20;

    async fn claim(&self, node: &str) -> Option<(i64, Self::Claim)> {
        let (fence, hold) = (self.fencing)(node.to_owned()).await?;
        // 0: no replica holds it; then none may write its cursor.
        (fence.create_revision != 0).then_some((fence.create_revision, (fence, hold)))
    }

    async fn get(&self, node: &str) -> Result<(i64, Option<Vec<u8>>), String> {
        let (entry, _) = self
            .etcd
            .get(&self.key(node))
            .await
            .map_err(|err| err.to_string())?;
        Ok(match entry {
            Some(entry) => (entry.mod_revision, Some(entry.value)),
            None => (0, None),
        })
    }

    async fn put(
        &self,
        node: &str,
        value: Vec<u8>,
        at: i64,
        (fence, _): &mut Self::Claim,
    ) -> Result<Put, String> {
        let key = self.key(node);
        let written = match at {
            0 => self.etcd.create_fenced(&key, value, fence).await,
            at => self.etcd.replace_fenced(&key, value, at, fence).await,
        };
        Ok(match written.map_err(|err| err.to_string())? {
            Written::Done(revision) => Put::Done(revision),
            Written::Conflict(entry) => match entry {
                Some(entry) => Put::Conflict(entry.mod_revision, Some(entry.value)),
                None => Put::Conflict(0, None),
            },
            Written::Fenced => Put::Fenced,
        })
    }
}
