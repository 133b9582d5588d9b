//! cloudcore as one of several replicas: the URL its peers reach it at, its
//! name, and its claims on the nodes it serves (etcd keys or Leases).

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use anyhow::Result;
use cloud::NodeHolders;
use cloud::replicas::leases::{LeaseClaims, LeaseClaimsConfig};
use cloud::replicas::{ClaimCounts, ClaimsConfig, EtcdClaims};

use crate::config::CloudCoreConfig;
use crate::desired::Desired;

/// The URL the other replicas reach this one's admin API at
/// (`replicas.advertiseAddress`; by default `$POD_IP`, else the admin
/// API's listen host, else the first advertised name, at its port). `None`
/// without an admin API.
pub(crate) fn replica_url(settings: &CloudCoreConfig) -> Option<String> {
    let admin = &settings.modules.admin;
    let address = admin.enabled()?;
    let given = &settings.replicas.advertise_address;
    if !given.is_empty() {
        return Some(given.clone());
    }
    let scheme = if admin.authentication {
        "https"
    } else {
        "http"
    };
    let (host, port) = address.rsplit_once(':').unwrap_or((address, "10003"));
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    let pod_ip = std::env::var("POD_IP").ok().filter(|ip| !ip.is_empty());
    let host = match (pod_ip, bare.parse::<std::net::IpAddr>()) {
        (Some(ip), _) => ip,
        (None, Ok(ip)) if ip.is_unspecified() => settings
            .modules
            .cloud_hub
            .advertise_address
            .first()
            .cloned()
            .unwrap_or_else(|| "127.0.0.1".to_owned()),
        (None, _) => bare.to_owned(),
    };
    Some(if host.contains(':') {
        format!("{scheme}://[{host}]:{port}")
    } else {
        format!("{scheme}://{host}:{port}")
    })
}

/// This replica's claims on the nodes it serves.
#[derive(Clone)]
pub(crate) enum Claims {
    /// Keys in etcd, under the replica's etcd lease.
    Etcd(EtcdClaims),
    /// Kubernetes Leases in cloudcore's namespace.
    Leases(LeaseClaims),
}

impl Claims {
    pub(crate) fn counts(&self) -> tokio::sync::watch::Receiver<ClaimCounts> {
        match self {
            Claims::Etcd(claims) => claims.counts(),
            Claims::Leases(claims) => claims.counts(),
        }
    }

    pub(crate) fn shared(&self) -> Arc<dyn hub::NodeClaims> {
        match self {
            Claims::Etcd(claims) => Arc::new(claims.clone()),
            Claims::Leases(claims) => Arc::new(claims.clone()),
        }
    }

    pub(crate) fn directory(&self) -> Arc<dyn cloud::peers::PeerDirectory> {
        match self {
            Claims::Etcd(claims) => Arc::new(claims.clone()),
            Claims::Leases(claims) => Arc::new(claims.clone()),
        }
    }

    pub(crate) fn holders(&self) -> Arc<dyn NodeHolders> {
        match self {
            Claims::Etcd(claims) => Arc::new(claims.clone()),
            Claims::Leases(claims) => Arc::new(claims.clone()),
        }
    }

    pub(crate) async fn give_up(&self) {
        match self {
            Claims::Etcd(claims) => claims.give_up().await,
            Claims::Leases(claims) => claims.give_up().await,
        }
    }
}

/// This replica's name: the configured one, or the host's name and the
/// process id (lowercase: it names Kubernetes Leases).
pub(crate) fn replica_name(replicas: &crate::config::ReplicasSection) -> String {
    match replicas.name.is_empty() {
        false => replicas.name.clone(),
        true => {
            let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
                .map(|h| h.trim().to_lowercase())
                .unwrap_or_else(|_| "cloudcore".to_owned());
            format!("{host}-{}", std::process::id())
        }
    }
}

/// The claims this replica serves nodes under, if it is one of several:
/// in etcd with the desired state there, as Leases on a Kubernetes
/// cluster with `replicas.enable`.
pub(crate) async fn start_claims(
    settings: &CloudCoreConfig,
    desired: &Desired,
) -> Result<Option<Claims>> {
    let replicas = &settings.replicas;
    let ttl = Duration::from_secs(replicas.claim_ttl_seconds);
    match desired {
        Desired::Etcd(_) => {
            let replica = replica_name(replicas);
            tracing::info!(%replica, "serving nodes under claims in etcd");
            let mut config = ClaimsConfig::new(settings.etcd.endpoints.clone(), replica);
            config.prefix = settings.etcd.prefix.clone();
            config.ttl = ttl;
            config.advertise = replica_url(settings).unwrap_or_default();
            let claims = EtcdClaims::start(config).context("etcd claims")?;
            Ok(Some(Claims::Etcd(claims)))
        }
        Desired::Kubernetes(store) if replicas.enable => {
            let replica = replica_name(replicas);
            tracing::info!(%replica, "serving nodes under Lease claims");
            let mut config = LeaseClaimsConfig::new(replica);
            config.namespace = settings.kube_api_config.namespace.clone();
            config.ttl = ttl;
            config.advertise = replica_url(settings).unwrap_or_default();
            // The Lease keeper: its own thread and connection.
            if let Some(access) = Desired::kube_access(settings) {
                config.keeper_client = Some(access.config().await.context("the Lease keeper")?);
            }
            let claims = LeaseClaims::start(store.client().clone(), config)
                .await
                .context("Lease claims")?;
            Ok(Some(Claims::Leases(claims)))
        }
        Desired::Kubernetes(_) => Ok(None),
        Desired::Embedded(_) if replicas.enable => anyhow::bail!(
            "replicas.enable: replicas share their desired state in etcd (etcd.endpoints) or a Kubernetes API server (kubeAPIConfig)"
        ),
        Desired::Embedded(_) => Ok(None),
    }
}
