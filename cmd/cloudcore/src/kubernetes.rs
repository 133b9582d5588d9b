//! What cloudcore serves kube-apiserver in Kubernetes mode: the admission
//! webhook, the kubelet API's and the metrics API's configuration.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use anyhow::Result;
use cloud::cloudstream::metrics_api::{MetricsApiConfig, published_front_proxy};
use cloud::cloudstream::{KubeletApiConfig, KubeletEndpoint};
use cloud::desired::KubernetesStore;
use cloud::reviews::SubjectAccessReviews;
use hub::certs::CloudCa;
use transports::tls;

use crate::admin::advertised_host;
use crate::config::CloudCoreConfig;

/// The admission webhook (Kubernetes mode): served over TLS with a
/// certificate of the cloud's CA for the names the API server calls it
/// by, then registered as the `MutatingWebhookConfiguration`
/// `edgehive-cloudcore` with that CA as its `caBundle`. A registration the
/// API server refuses is logged, naming what is missing; the webhook
/// still serves (another replica's registration may name it), and pods
/// it does not see keep the controller's lengthening.
pub(crate) async fn start_admission(
    settings: &CloudCoreConfig,
    ca: &CloudCa,
    store: &KubernetesStore,
) -> Result<cloud::admission::AdmissionHandle> {
    use cloud::admission::webhook::{self, Endpoint};
    let section = &settings.modules.admission;
    let port = section
        .address
        .rsplit_once(':')
        .and_then(|(_, port)| port.parse::<u16>().ok())
        .context("modules.admission.address: no port")?;
    let endpoint = match (section.service.as_str(), section.url.as_str()) {
        ("", "") => Endpoint::on_host(
            &advertised_host(settings)
                .context("modules.admission.url: none, and no cloudHub.advertiseAddress")?,
            port,
        ),
        ("", url) => Endpoint::url(url).context("modules.admission.url")?,
        (service, _) => Endpoint::service(service).context("modules.admission.service")?,
    };
    let mut names = endpoint.server_names();
    names.extend(settings.modules.cloud_hub.advertise_address.iter().cloned());
    names.extend(std::env::var("POD_IP").ok().filter(|ip| !ip.is_empty()));
    names.sort();
    names.dedup();
    let (chain, key) = ca.issue_server(&names, Duration::from_secs(365 * 24 * 3600))?;
    let grace = settings.kube_api_config.offline_grace_seconds;
    let handle = cloud::admission::start(cloud::admission::AdmissionConfig {
        address: section.address.clone(),
        tls: tls::server_config(chain, key, None)?,
        window: (grace > 0).then(|| Duration::from_secs(grace)),
        edge_nodes: Arc::new(store.edge_node_names()),
    })
    .await
    .with_context(|| format!("modules.admission.address {}", section.address))?;
    let ca_pem = cloud::admin_client::kubeconfig::pem("CERTIFICATE", ca.root().as_ref());
    let configuration = webhook::configuration(&section.configuration_name, &endpoint, &ca_pem);
    match webhook::register(store.client().clone(), &configuration).await {
        Ok(done) => {
            tracing::info!(
                ?done,
                ?endpoint,
                name = %section.configuration_name,
                "admission webhook registered"
            )
        }
        Err(err) => tracing::error!(
            error = %err,
            "the admission webhook is not registered: pods bound to edge nodes are created with the API server's 300 s offline tolerations, which the edgecontroller then lengthens"
        ),
    }
    Ok(handle)
}

/// The kubelet API's settings (Kubernetes mode), and the endpoint edge
/// Nodes name: this cloudcore's certificate from its CA, client
/// certificates checked against kube-apiserver's kubelet-client CA (a file,
/// or the cluster's CA as the `kube-root-ca.crt` ConfigMap publishes it),
/// callers authorized by the API server.
pub(crate) async fn kubelet_api_config(
    settings: &CloudCoreConfig,
    ca: &CloudCa,
    store: &KubernetesStore,
) -> Result<(KubeletEndpoint, KubeletApiConfig)> {
    let section = &settings.modules.cloud_stream;
    let advertise = match section.advertise_address.as_str() {
        "" => advertised_host(settings).context(
            "modules.cloudStream.advertiseAddress: none, and no cloudHub.advertiseAddress",
        )?,
        address => address.to_owned(),
    };
    let port = section
        .address
        .rsplit_once(':')
        .and_then(|(_, port)| port.parse::<u16>().ok())
        .context("modules.cloudStream.address: no port")?;
    let client_ca = match section.tls_stream_ca_file.as_str() {
        "" => {
            // Published by kube-controller-manager into every namespace,
            // cloudcore's own just created perhaps: a few tries.
            let namespace = &settings.kube_api_config.namespace;
            let mut tries = 0;
            loop {
                match cloud::cloudstream::cluster_ca(store.client().clone(), namespace).await {
                    Ok(pem) => break pem.into_bytes(),
                    Err(_) if tries < 10 => {
                        tries += 1;
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                    Err(err) => anyhow::bail!(
                        "the cluster's CA ({namespace}/kube-root-ca.crt: {err}); set modules.cloudStream.tlsStreamCAFile"
                    ),
                }
            }
        }
        file => std::fs::read(file)
            .with_context(|| format!("modules.cloudStream.tlsStreamCAFile {file}"))?,
    };
    let client_roots = tls::certs_from_pem(&client_ca)?;
    anyhow::ensure!(
        !client_roots.is_empty(),
        "the kubelet-client CA holds no certificate"
    );
    let (chain, key) = ca.issue_server(
        std::slice::from_ref(&advertise),
        Duration::from_secs(365 * 24 * 3600),
    )?;
    let config = KubeletApiConfig {
        address: section.address.clone(),
        tls: tls::server_config(chain, key, Some(&client_roots))?,
        authorizer: Arc::new(SubjectAccessReviews::new(store.client().clone())),
        edge_tunnels: cloud::cloudstream::edgestream::EdgeTunnels::default(),
    };
    let endpoint = KubeletEndpoint {
        address: advertise,
        port,
    };
    Ok((endpoint, config))
}

/// The resource metrics API's settings (Kubernetes mode): this cloudcore's
/// certificate for the Service the APIService names, the front proxy as
/// the API server publishes it, callers authorized by the API server.
pub(crate) async fn metrics_server_config(
    settings: &CloudCoreConfig,
    ca: &CloudCa,
    store: &KubernetesStore,
) -> Result<MetricsApiConfig> {
    let section = &settings.modules.metrics_server;
    let (front_proxy, proxy_ca) = published_front_proxy(store.client().clone())
        .await
        .map_err(|reason| anyhow::anyhow!("the API server's front proxy: {reason}"))?;
    let client_roots = tls::certs_from_pem(proxy_ca.as_bytes())?;
    anyhow::ensure!(
        !client_roots.is_empty(),
        "the request-header CA holds no certificate"
    );
    let service = format!(
        "{}.{}.svc",
        section.service_name, settings.kube_api_config.namespace
    );
    let mut names = vec![service.clone(), format!("{service}.cluster.local")];
    names.extend(settings.modules.cloud_hub.advertise_address.iter().cloned());
    names.extend(std::env::var("POD_IP").ok().filter(|ip| !ip.is_empty()));
    let (chain, key) = ca.issue_server(&names, Duration::from_secs(365 * 24 * 3600))?;
    Ok(MetricsApiConfig {
        address: section.address.clone(),
        tls: tls::server_config(chain, key, Some(&client_roots))?,
        front_proxy,
        authorizer: Arc::new(SubjectAccessReviews::new(store.client().clone())),
    })
}
