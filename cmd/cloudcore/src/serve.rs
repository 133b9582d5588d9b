//! `cloudcore run`: the certificate endpoints, cloudhub on every transport
//! asked for, the edgecontroller on its desired state, the application
//! center, cloudstream, the admin API and metrics, until SIGINT or SIGTERM;
//! then each is stopped in order.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use anyhow::Result;
use beehive::{Hive, HiveConfig};
use cloud::cloudstream::metrics::{OtherKubelets, ResourceMetrics};
use cloud::cloudstream::metrics_api::ClusterKubelets;
use cloud::edgecontroller::DeliveryCursors;
use cloud::ledger::StoredLedger;
use cloud::replicas::{CursorConfig, CursorWriter};
use cloud::reviews::{SubjectAccessReviews, TokenAccess, TokenReviews};
use cloud::{AdminApi, ApplicationCenter, CenterConfig, ControllerConfig, EdgeController};
use hub::certs::{CertServer, CertServerConfig, CloudCa, JoinLedger};
use hub::{CloudEndpoint, CloudHub, CloudHubConfig, Dialect};
use transports::{ListenOptions, TransportKind, tls};

use crate::admin::{admin_auth, write_admin_kubeconfig};
use crate::config::CloudCoreConfig;
use crate::desired::Desired;
use crate::kubernetes::{kubelet_api_config, metrics_server_config, start_admission};
use crate::metrics::CloudMetrics as _;
use crate::replicas::{Claims, replica_name, replica_url, start_claims};

/// Runs cloudcore with `settings` until SIGINT or SIGTERM.
pub(crate) async fn serve(ca: Arc<CloudCa>, settings: CloudCoreConfig) -> Result<()> {
    let data_dir = settings.data_dir.clone();
    let hub_settings = &settings.modules.cloud_hub;
    let names = hub_settings.advertise_address.clone();
    let (chain, key) = ca.issue_server(&names, Duration::from_secs(365 * 24 * 3600))?;
    let server_tls = tls::server_config(chain, key, Some(&[ca.root()]))?;
    let mut endpoints = Vec::new();
    for (kind, dialect, listener) in [
        (
            TransportKind::WebSocket,
            Dialect::Native,
            &hub_settings.websocket,
        ),
        (
            TransportKind::WebSocket,
            Dialect::KubeEdge,
            &hub_settings.kubeedge_websocket,
        ),
        (TransportKind::Quic, Dialect::Native, &hub_settings.quic),
    ] {
        if let Some(address) = listener.enabled() {
            endpoints.push(CloudEndpoint {
                kind,
                options: ListenOptions::new(address).with_tls(server_tls.clone()),
                trust_hello: false,
                dialect,
            });
        }
    }
    if let Some(path) = hub_settings.unixsocket.enabled() {
        endpoints.push(CloudEndpoint {
            kind: TransportKind::UnixSocket,
            options: ListenOptions::new(path),
            trust_hello: true,
            dialect: Dialect::Native,
        });
    }
    let hive = Hive::new("cloud", HiveConfig::default());
    // The controller first: it must hear cloudhub's first node events.
    let desired = Desired::open(&settings).await?;
    // Join tokens' records and deleted nodes, with the desired state (every
    // replica sees the same); a deleted Node's certificates are revoked.
    let ledger: Arc<dyn JoinLedger> = Arc::new(StoredLedger::new(
        desired.shared(),
        &settings.kube_api_config.namespace,
    ));
    let _revoker = tokio::spawn(cloud::ledger::revoke_deleted_nodes(
        desired.shared(),
        ledger.clone(),
    ));
    let certs = match hub_settings.https.enabled() {
        Some(address) => Some(
            CertServer::start(
                ca.clone(),
                CertServerConfig::new(
                    address,
                    names.clone(),
                    Duration::from_secs(hub_settings.node_certificate_days * 24 * 3600),
                )
                .with_ledger(ledger.clone()),
            )
            .await
            .context("certificate endpoints")?,
        ),
        None => None,
    };
    // Replicas serve each node under a claim.
    let claims = start_claims(&settings, &desired).await?;
    // Replicas keep what KubeEdge nodes acknowledged in their engine, so
    // the replica that takes one over sends it only what it lacks: written
    // only under the node's claim, and once more before it is given up.
    let cursors = match (&claims, &desired) {
        (Some(Claims::Etcd(claims)), Desired::Etcd(_)) => {
            let mut config = CursorConfig::new(settings.etcd.endpoints.clone());
            config.prefix = settings.etcd.prefix.clone();
            let cursors =
                CursorWriter::start(config, claims.fencing()).context("delivery cursors")?;
            claims.before_release(cursors.before_release());
            Some(cursors)
        }
        (Some(Claims::Leases(claims)), Desired::Kubernetes(store)) => {
            let cursors = CursorWriter::on_kubernetes(
                store.client().clone(),
                &settings.kube_api_config.namespace,
                claims.clone(),
                Duration::from_secs(1),
            );
            claims.before_release(cursors.before_release());
            Some(cursors)
        }
        _ => None,
    };
    let grace = settings.kube_api_config.offline_grace_seconds;
    // Kubernetes mode: kube-apiserver reaches edge nodes' kubelet API here.
    let kubelet_api = match &desired {
        Desired::Kubernetes(store) if settings.modules.cloud_stream.enable => {
            match kubelet_api_config(&settings, &ca, store).await {
                Ok(api) => Some(api),
                Err(err) => {
                    tracing::warn!(error = %format!("{err:#}"), "no kubelet API for edge nodes: kubectl logs, exec and port-forward will not reach them");
                    None
                }
            }
        }
        _ => None,
    };
    let controller_config = ControllerConfig {
        offline_grace: (grace > 0).then(|| Duration::from_secs(grace)),
        // Replicas: a node is sent to by the one that serves it.
        send_to_linked_only: desired.replicated(&settings),
        cursors: cursors
            .clone()
            .map(|cursors| Arc::new(cursors) as Arc<dyn DeliveryCursors>),
        // A node's status is written by its holder; one no replica holds
        // is marked unreachable by any, every other claim TTL.
        claims: claims.as_ref().map(Claims::holders),
        sweep_every: Duration::from_secs(2 * settings.replicas.claim_ttl_seconds),
        kubelet_endpoint: kubelet_api.as_ref().map(|(endpoint, _)| endpoint.clone()),
        // Edges' MetaServers with requireAuthorization: tokens reviewed by
        // the API server (TokenReview, then SubjectAccessReview), with
        // cloudcore's credentials. Elsewhere no token is anyone.
        token_access: match &desired {
            Desired::Kubernetes(store) => Some(TokenAccess::new(
                Arc::new(TokenReviews::new(store.client().clone())),
                Arc::new(SubjectAccessReviews::new(store.client().clone())),
            )),
            _ => None,
        },
        ..ControllerConfig::default()
    };
    let controller = EdgeController::start(&hive, desired.shared(), controller_config)?;
    let dynamic = &settings.modules.dynamic_controller;
    if dynamic.enable {
        let config = CenterConfig {
            max_watches_per_node: dynamic.max_watches_per_node,
            ..CenterConfig::default()
        };
        ApplicationCenter::start(&hive, controller.node_links(), desired.api_server(), config)?;
    }
    // Streams to edge pods (logs, exec, port-forward, stats) go through
    // the nodes' links, kept by cloudhub.
    let tunnels = stream::NodeTunnels::default();
    let mut pod_streams =
        cloud::cloudstream::streams::PodStreams::new(tunnels.clone(), controller.store().clone());
    // Replicas: what is asked of a node another replica holds is asked of
    // that replica's admin API, as this replica (its own certificate).
    if let Some(claims) = &claims {
        let replica = replica_name(&settings.replicas);
        let identity = ca.issue_client(
            &format!("{}{replica}", cloud::peers::REPLICA_USER_PREFIX),
            cloud::admin::auth::REPLICAS,
            Duration::from_secs(365 * 24 * 3600),
        )?;
        tracing::info!(url = ?replica_url(&settings), "forwarding to the replica holding a node; peers reach this one at that URL");
        let peers =
            cloud::peers::Peers::new(replica, claims.directory(), vec![ca.root()], Some(identity));
        pod_streams = pod_streams.with_peers(peers);
    }
    // KubeEdge edgecores' edgestream tunnels, for their logs, exec,
    // attach and stats through the kubelet API: on the kubelet API's host,
    // with cloudhub's certificate and node certificates required.
    let _tunnel_port = match (&kubelet_api, settings.modules.cloud_stream.tunnel_port) {
        (Some((_, config)), port) if port != 0 => {
            let host = settings
                .modules
                .cloud_stream
                .address
                .rsplit_once(':')
                .map_or("0.0.0.0", |(host, _)| host);
            let tunnel = cloud::cloudstream::edgestream::TunnelConfig {
                address: format!("{host}:{port}"),
                tls: server_tls.clone(),
            };
            match cloud::cloudstream::edgestream::start(tunnel, config.edge_tunnels.clone()).await {
                Ok(handle) => Some(handle),
                Err(err) => {
                    tracing::warn!(error = %err, port, "no edgestream tunnel port (modules.cloudStream.tunnelPort): KubeEdge edgecores get no logs or exec");
                    None
                }
            }
        }
        _ => None,
    };
    let _kubelet_api = match kubelet_api {
        Some((_, config)) => match cloud::cloudstream::start(config, pod_streams.clone()).await {
            Ok(handle) => {
                tracing::info!(address = %handle.address, "kubelet API for edge nodes ready");
                Some(handle)
            }
            // The nodes are still served; only kubectl's streams are not.
            Err(err) => {
                tracing::warn!(error = %err, "no kubelet API for edge nodes (modules.cloudStream.address): kubectl logs, exec and port-forward will not reach them");
                None
            }
        },
        None => None,
    };
    // Kubernetes mode, when asked: metrics.k8s.io for `kubectl top`.
    let _metrics_server = match &desired {
        Desired::Kubernetes(store) if settings.modules.metrics_server.enable => {
            let started = async {
                let config = metrics_server_config(&settings, &ca, store).await?;
                let others = settings.modules.metrics_server.cloud_nodes.then(|| {
                    Arc::new(ClusterKubelets::new(store.client().clone())) as Arc<dyn OtherKubelets>
                });
                let metrics = ResourceMetrics::new(pod_streams.clone(), others);
                anyhow::Ok(cloud::cloudstream::metrics_api::start(config, metrics).await?)
            };
            match started.await {
                Ok(handle) => Some(handle),
                // The nodes are still served; only kubectl top is not.
                Err(err) => {
                    tracing::warn!(error = %format!("{err:#}"), "no resource metrics API (modules.metricsServer): kubectl top will not reach edge pods");
                    None
                }
            }
        }
        _ => None,
    };
    // Kubernetes mode, when asked: pods bound to edge nodes are created
    // with their offline tolerations lengthened (no write per pod).
    let _admission = match &desired {
        Desired::Kubernetes(store) if settings.modules.admission.enable => {
            match start_admission(&settings, &ca, store).await {
                Ok(handle) => Some(handle),
                Err(err) => {
                    tracing::error!(error = %format!("{err:#}"), "no admission webhook (modules.admission)");
                    None
                }
            }
        }
        _ if settings.modules.admission.enable => {
            tracing::info!(
                "modules.admission: Kubernetes mode only; no webhook without an API server"
            );
            None
        }
        _ => None,
    };
    let admin = match settings.modules.admin.enabled() {
        Some(address) if settings.modules.admin.authentication => {
            let auth = admin_auth(&settings, &ca)?;
            let started = AdminApi::start_tls(
                controller.clone(),
                address,
                Some(pod_streams.clone()),
                auth,
                Some(ledger.clone()),
            )
            .context("admin API")?;
            write_admin_kubeconfig(&settings, &ca)?;
            Some(started)
        }
        Some(address) => {
            tracing::warn!(
                %address,
                "admin API without authentication (modules.admin.authentication: false): whoever reaches it controls every node"
            );
            Some(
                AdminApi::start_with_ledger(
                    controller.clone(),
                    address,
                    Some(pod_streams.clone()),
                    Some(ledger.clone()),
                )
                .context("admin API")?,
            )
        }
        None => None,
    };
    if let (Some(Claims::Etcd(claims)), Desired::Etcd(store)) = (&claims, &desired) {
        // A node's status is written only under this replica's claim.
        store.fence_with(claims.fencing());
        // A node taken over is served once this replica sees every apply
        // answered before.
        claims.catch_up_with(store.catching_up());
    }
    let hub = CloudHub::start(
        &hive,
        CloudHubConfig {
            node_events: controller.node_events(),
            links: controller.node_links(),
            endpoints,
            keepalive: Duration::from_secs(hub_settings.keepalive_interval),
            store: Some(data_dir.join("queues.redb")),
            claims: claims.as_ref().map(Claims::shared),
            acks: cursors
                .clone()
                .map(|cursors| Arc::new(cursors) as Arc<dyn hub::AckSink>),
            streams: tunnels,
            revocations: Some(ledger.clone()),
            ..CloudHubConfig::default()
        },
    )
    .await
    .context("cloudhub")?;
    for (kind, address) in &hub.addresses {
        tracing::info!(%kind, %address, "cloudhub ready");
    }
    let metrics = match settings.modules.metrics.enabled() {
        Some(address) => {
            let (hive, stats, store) =
                (hive.clone(), hub.stats.clone(), controller.store().clone());
            let claim_counts = claims.as_ref().map(Claims::counts);
            let cursor_counts = cursors.as_ref().map(CursorWriter::counts);
            let controller_counts = controller.counts.clone();
            let api_requests = match &desired {
                Desired::Kubernetes(store) => Some(store.api_requests().clone()),
                _ => None,
            };
            let render: cmd_common::metrics::Render = Arc::new(move || {
                let mut page = cmd_common::metrics::Exposition::default();
                page.hive(&hive);
                page.cloudhub(&stats);
                page.controller(&controller_counts.borrow());
                if let Some(requests) = &api_requests {
                    page.api_requests(requests);
                }
                if let Some(counts) = &claim_counts {
                    let c = counts.borrow().clone();
                    page.gauge(
                        "edgehive_replica_nodes_held",
                        "Nodes this replica holds a claim on.",
                        &[],
                        c.held as u64,
                    );
                    page.counter(
                        "edgehive_replica_claims_taken_total",
                        "Claims on nodes taken.",
                        &[],
                        c.taken,
                    );
                    page.counter(
                        "edgehive_replica_claims_refused_total",
                        "Claims refused (another replica serves the node, or no trusted lease).",
                        &[],
                        c.refused,
                    );
                    page.counter(
                        "edgehive_replica_claims_lost_total",
                        "Claims lost with the lease (failovers away from this replica).",
                        &[],
                        c.lost,
                    );
                    page.counter(
                        "edgehive_replica_leases_total",
                        "Claim leases granted (more than one: the replica lost etcd).",
                        &[],
                        c.leases,
                    );
                    page.counter(
                        "edgehive_replica_handed_over_total",
                        "Nodes handed over to another replica (to even the replicas out, or on SIGTERM).",
                        &[],
                        c.handed_over,
                    );
                    page.counter(
                        "edgehive_replica_engine_renewals_total",
                        "Claim lease renewals the engine (etcd, the API server) answered.",
                        &[],
                        c.renewals,
                    );
                    page.counter(
                        "edgehive_replica_engine_renewal_microseconds_total",
                        "Their round trips, summed: the engine's latency is this over the renewals.",
                        &[],
                        c.renewal_micros,
                    );
                    page.gauge(
                        "edgehive_replica_engine_last_renewal_microseconds",
                        "The last renewal's round trip.",
                        &[],
                        c.last_renewal_micros,
                    );
                    page.gauge(
                        "edgehive_replica_replicas",
                        "Replicas up, as this one last counted them.",
                        &[],
                        c.replicas as u64,
                    );
                }
                if let Some(counts) = &cursor_counts {
                    page.counter(
                        "edgehive_replica_cursor_writes_total",
                        "Delivery cursors (what a KubeEdge node acknowledged) written to the engine (etcd, or ConfigMaps).",
                        &[],
                        counts.borrow().writes,
                    );
                }
                // One pod decoded at a time: a scrape does not copy them all.
                let mut phases = Vec::new();
                let _ = store.list_each(apis::Kind::Pod, None, &mut |pod| {
                    phases.push(
                        pod["status"]["phase"]
                            .as_str()
                            .unwrap_or("Unknown")
                            .to_owned(),
                    )
                });
                page.pods_by_phase(phases.iter().map(String::as_str));
                page.finish()
            });
            let (bound, server) = cmd_common::metrics::serve(address, render).context("metrics")?;
            tracing::info!(address = %bound, "metrics ready");
            Some(server)
        }
        None => None,
    };
    if let Some(certs) = &certs {
        tracing::info!(address = %certs.address, "certificate endpoints ready");
    }
    if let Some(admin) = &admin {
        tracing::info!(address = %admin.address, "admin API ready");
    }
    Hive::signalled().await?;
    // Stop taking requests first: what is in flight is answered (each
    // object queued for its node) while the edgecontroller and cloudhub
    // still run; then what feeds cloudhub stops, draining; cloudhub last.
    if let Some(admin) = admin {
        admin.stop().await;
    }
    drop(_kubelet_api);
    drop(_metrics_server);
    drop(_admission);
    if let Some(certs) = certs {
        certs.stop().await;
    }
    for feeder in [
        cloud::dynamiccontroller::wire::MODULE,
        beehive::constants::module::EDGECONTROLLER,
    ] {
        let stopped = hive.stop_module(feeder).await;
        if !stopped.timed_out.is_empty() {
            tracing::warn!(module = feeder, "did not drain before cloudhub stops");
        }
    }
    if let Some(cursors) = &cursors {
        // What the nodes acknowledged is written while their claims are
        // still this replica's.
        if tokio::time::timeout(Duration::from_secs(2), cursors.flush_all())
            .await
            .is_err()
        {
            tracing::warn!("delivery cursors not all written before stopping");
        }
    }
    if let Some(claims) = &claims {
        // Handed over first: the nodes' links close and every other
        // replica may take them at once, while this one stops.
        claims.give_up().await;
    }
    let report = hive.shutdown().await;
    if let Some(metrics) = metrics {
        metrics.stop(true).await;
    }
    desired.close().await;
    tracing::info!(?report, "cloudcore stopped");
    Ok(())
}
