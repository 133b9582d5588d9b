//! The desired state cloudcore runs on: the embedded store, etcd or a
//! Kubernetes API server, as the configuration says.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context as _;
use anyhow::Result;
use cloud::desired::{EtcdConfig, EtcdStore, KubeAccess, KubernetesConfig, KubernetesStore};
use cloud::dynamiccontroller::ApiServer;
use cloud::dynamiccontroller::kubernetes::KubernetesApi;
use cloud::{DesiredState, EmbeddedStore};

use crate::config::CloudCoreConfig;

/// The desired state cloudcore runs on.
pub(crate) enum Desired {
    Embedded(EmbeddedStore),
    Kubernetes(Arc<KubernetesStore>),
    Etcd(Arc<EtcdStore>),
}

impl Desired {
    /// Whether this cloudcore is one of several replicas (each node sent
    /// to by the one that serves it).
    pub(crate) fn replicated(&self, settings: &CloudCoreConfig) -> bool {
        match self {
            Desired::Etcd(_) => true,
            Desired::Kubernetes(_) => settings.replicas.enable,
            Desired::Embedded(_) => false,
        }
    }

    /// How the Kubernetes API server is reached, if one is configured.
    pub(crate) fn kube_access(settings: &CloudCoreConfig) -> Option<KubeAccess> {
        let kube = &settings.kube_api_config;
        if !kube.kube_config.is_empty() {
            Some(KubeAccess::Kubeconfig(PathBuf::from(&kube.kube_config)))
        } else if kube.in_cluster && KubeAccess::in_cluster_available() {
            Some(KubeAccess::InCluster)
        } else {
            None
        }
    }

    /// A Kubernetes API server if one is configured (a kubeconfig, or the
    /// pod's service account), else the embedded store in the data dir.
    pub(crate) async fn open(settings: &CloudCoreConfig) -> Result<Desired> {
        let kube = &settings.kube_api_config;
        let access = Desired::kube_access(settings);
        if !settings.etcd.endpoints.is_empty() {
            let endpoints = settings.etcd.endpoints.clone();
            tracing::info!(?endpoints, "desired state: etcd");
            let mut config = EtcdConfig::new(endpoints);
            config.prefix = settings.etcd.prefix.clone();
            let store = EtcdStore::connect(config).await.context("etcd")?;
            return Ok(Desired::Etcd(Arc::new(store)));
        }
        match access {
            Some(access) => {
                tracing::info!(?access, "desired state: a Kubernetes API server");
                let mut config = KubernetesConfig::new(access);
                config.namespace = kube.namespace.clone();
                let store = KubernetesStore::connect(config)
                    .await
                    .context("the Kubernetes API server")?;
                Ok(Desired::Kubernetes(Arc::new(store)))
            }
            None => {
                let path = settings.data_dir.join("desired.redb");
                tracing::info!(path = %path.display(), "desired state: the embedded store");
                let store = EmbeddedStore::open(&path).context("desired-state store")?;
                Ok(Desired::Embedded(store))
            }
        }
    }

    /// The API server a KubeEdge edge's MetaServer is answered from, if
    /// there is one.
    pub(crate) fn api_server(&self) -> Option<Arc<dyn ApiServer>> {
        match self {
            Desired::Embedded(_) | Desired::Etcd(_) => None,
            Desired::Kubernetes(store) => {
                Some(Arc::new(KubernetesApi::new(store.client().clone())))
            }
        }
    }

    pub(crate) fn shared(&self) -> Arc<dyn DesiredState> {
        match self {
            Desired::Embedded(store) => store.clone().shared(),
            Desired::Kubernetes(store) => store.clone(),
            Desired::Etcd(store) => store.clone(),
        }
    }

    pub(crate) async fn close(self) {
        if let Desired::Embedded(store) = self {
            store.close().await;
        }
    }
}
