//! Delivery cursors on Kubernetes: one ConfigMap per node,
//! `edgehive-acked-<node>` in cloudcore's namespace (key `cursor`),
//! written by the replica that holds the node's claim Lease
//! ([`LeaseClaims::fence`]), each write conditioned on the
//! `resourceVersion` read. The API server has no transaction over two
//! objects, so a write is fenced by the claim's trust window, as node
//! status is: the claim is checked, and held steady, until the write is
//! made.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::Client;
use kube::api::{Api, ObjectMeta, PostParams};

use super::cursor_writer::{CursorStore, CursorWriter, Put};
use super::leases::{LeaseClaims, dns_subdomain};

/// The prefix of a node's cursor ConfigMap (`edgehive-acked-<node>`).
pub const CURSOR_CONFIGMAP_PREFIX: &str = "edgehive-acked-";

/// The ConfigMap's key holding the cursor.
const KEY: &str = "cursor";

impl CursorWriter {
    /// Starts a writer keeping cursors as ConfigMaps in `namespace` under
    /// `claims` (inside a tokio runtime), writing each node's at most once
    /// per `every` while it changes.
    pub fn on_kubernetes(
        client: Client,
        namespace: &str,
        claims: LeaseClaims,
        every: Duration,
    ) -> CursorWriter {
        let store = CursorsOnConfigMaps {
            maps: Api::namespaced(client, namespace),
            claims,
        };
        CursorWriter::with_store(store, every)
    }
}

struct CursorsOnConfigMaps {
    maps: Api<ConfigMap>,
    claims: LeaseClaims,
}

/// The name of `node`'s cursor ConfigMap, if it can be one.
fn name_of(node: &str) -> Result<String, String> {
    let name = format!("{CURSOR_CONFIGMAP_PREFIX}{node}");
    dns_subdomain(&name).map(|()| name)
}

/// A ConfigMap's `resourceVersion` as a number, and its cursor's bytes.
fn record_of(map: ConfigMap) -> Result<(i64, Option<Vec<u8>>), String> {
    let revision = map
        .metadata
        .resource_version
        .as_deref()
        .and_then(|version| version.parse::<i64>().ok())
        .filter(|revision| *revision > 0)
        .ok_or("a cursor ConfigMap without a numeric resourceVersion")?;
    let value = map
        .data
        .and_then(|mut data| data.remove(KEY))
        .map(String::into_bytes);
    Ok((revision, value))
}

/// Whether the API server refused for `code`.
fn refused_with(err: &kube::Error, code: u16) -> bool {
    matches!(err, kube::Error::Api(status) if status.code == code)
}

impl CursorStore for CursorsOnConfigMaps {
    type Claim = tokio::sync::OwnedMutexGuard<()>;

    /// A ConfigMap holds at most 1 MiB.
    const MAX_RECORD: usize = 900 * 1024;

    async fn claim(&self, node: &str) -> Option<(i64, Self::Claim)> {
        self.claims.fence(node).await
    }

    async fn get(&self, node: &str) -> Result<(i64, Option<Vec<u8>>), String> {
        let name = name_of(node)?;
        match self.maps.get_opt(&name).await {
            Ok(Some(map)) => record_of(map),
            Ok(None) => Ok((0, None)),
            Err(err) => Err(format!("the API server: {err}")),
        }
    }

    async fn put(
        &self,
        node: &str,
        value: Vec<u8>,
        at: i64,
        _claim: &mut Self::Claim,
    ) -> Result<Put, String> {
        let name = name_of(node)?;
        // Held steady by the guard; still trusted now?
        if !hub::NodeClaims::holds(&self.claims, node) {
            return Ok(Put::Fenced);
        }
        let value = String::from_utf8(value).map_err(|err| format!("cursor not text: {err}"))?;
        let map = ConfigMap {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                resource_version: (at != 0).then(|| at.to_string()),
                ..ObjectMeta::default()
            },
            data: Some(BTreeMap::from([(KEY.to_owned(), value)])),
            ..ConfigMap::default()
        };
        let written = match at {
            0 => self.maps.create(&PostParams::default(), &map).await,
            _ => self.maps.replace(&name, &PostParams::default(), &map).await,
        };
        match written {
            Ok(written) => record_of(written).map(|(revision, _)| Put::Done(revision)),
            // Written meanwhile (this replica's own write whose answer was
            // lost), made meanwhile, or deleted: as it is now.
            Err(err) if refused_with(&err, 409) || refused_with(&err, 404) => {
                let (revision, value) = self.get(node).await?;
                Ok(Put::Conflict(revision, value))
            }
            Err(err) => Err(format!("the API server: {err}")),
        }
    }
}
