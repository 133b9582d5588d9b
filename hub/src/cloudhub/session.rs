//! Links coming in: each endpoint's admission check, the accept loop, the
//! hello that names the node (bound to its certificate), and the
//! `NodeSession` actor that reads one node's link and writes its queue's
//! window to it.

use super::sessions::{Beat, Liveness, Upstream, upstream};
use super::*;

/// The check of `endpoint`'s upgrade requests: cloudhub's own
/// ([`crate::admission::admit_upgrade`]), then the embedder's, if its
/// options carry one.
pub(super) fn admission(endpoint: &CloudEndpoint, stats: Arc<HubStats>) -> AdmissionCheck {
    let (dialect, trust_hello) = (endpoint.dialect, endpoint.trust_hello);
    let theirs = endpoint.options.admission.clone();
    Arc::new(move |peer: &PeerIdentity| {
        let admission = match crate::admission::admit_upgrade(dialect, trust_hello, peer) {
            Admission::Accept => theirs
                .as_ref()
                .map_or(Admission::Accept, |check| check(peer)),
            refused => refused,
        };
        if let Admission::Refuse { status, reason } = &admission {
            warn!(remote = %peer.remote, %dialect, status, %reason, "link refused before the upgrade");
            stats.count(&stats.refused_links);
        }
        admission
    })
}

pub(super) async fn accept_loop(
    mut listener: Listener,
    endpoint: CloudEndpoint,
    mut stop: watch::Receiver<bool>,
    hub: Addr<CloudHub>,
    hive: Hive,
    config: Arc<CloudHubConfig>,
    stats: Arc<HubStats>,
) {
    loop {
        let link = tokio::select! {
            link = listener.accept() => link,
            _ = stop.wait_for(|stop| *stop) => {
                listener.shutdown().await;
                return;
            }
        };
        let Some(link) = link else { break };
        actix::spawn(open_session(
            link,
            endpoint.trust_hello,
            endpoint.dialect,
            hub.clone(),
            hive.clone(),
            config.clone(),
            stats.clone(),
        ));
    }
    warn!(kind = %endpoint.kind, "cloudhub listener stopped");
}

/// Whether the certificate (`chain`, leaf first) of `node` was revoked.
fn revoked(config: &CloudHubConfig, node: &str, chain: &[Vec<u8>]) -> bool {
    let Some(ledger) = &config.revocations else {
        return false;
    };
    ledger.revocations().revoked(node, issued_at(chain))
}

/// When the certificate (`chain`, leaf first) was issued (0: unknown).
fn issued_at(chain: &[Vec<u8>]) -> u64 {
    chain
        .first()
        .and_then(|leaf| crate::certs::issued_at(leaf))
        .unwrap_or(0)
}

/// Learns who the node is (its hello, or on a KubeEdge link its
/// `node_id` header), checks that against its certificate, starts its
/// session.
async fn open_session(
    mut link: Link,
    trust_hello: bool,
    dialect: Dialect,
    hub: Addr<CloudHub>,
    hive: Hive,
    config: Arc<CloudHubConfig>,
    stats: Arc<HubStats>,
) {
    let remote = link.peer.remote.clone();
    let named = match dialect {
        Dialect::Native => {
            let first = tokio::time::timeout(config.hello_timeout, link.receiver.recv()).await;
            match first {
                Ok(Some(Ok(msg))) if protocol::kind(&msg) == Kind::Hello => {
                    msg.body::<Hello>().ok().map(|hello| hello.node)
                }
                _ => None,
            }
        }
        Dialect::KubeEdge => crate::admission::node_id(&link.peer).map(str::to_owned),
    };
    // A WebSocket link was checked on its upgrade request already (see
    // `admission`); this covers the hello and the other transports, and a
    // certificate revoked since (its node deleted).
    let checked = crate::admission::check_identity(
        dialect,
        trust_hello,
        named.as_deref(),
        link.peer.common_name.as_deref(),
        &crate::admission::groups_of(&link.peer),
    );
    let refusal = match (checked, &named) {
        (Err(reason), _) => Some(reason.to_string()),
        (Ok(()), None) => Some(LinkRefusal::NoHello.to_string()),
        (Ok(()), Some(named))
            if link.peer.common_name.is_some()
                && revoked(&config, named, &link.peer.certificates) =>
        {
            Some(format!(
                "the certificate of node {named:?} was revoked (the node was deleted)"
            ))
        }
        (Ok(()), Some(_)) => None,
    };
    let node = match (refusal, named) {
        (None, Some(named)) => named,
        (refusal, named) => {
            warn!(%remote, %dialect, node = %named.as_deref().unwrap_or("-"), reason = %refusal.as_deref().unwrap_or("unknown"), "link refused");
            stats.count(&stats.refused_links);
            link.sender.close().await;
            return;
        }
    };
    let claim = match &config.claims {
        None => None,
        Some(claims) => match claims.claim(&node).await {
            Ok(generation) => Some(generation),
            Err(reason) => {
                info!(%node, %reason, "link refused: another replica serves the node");
                stats.count(&stats.refused_links);
                link.sender.close().await;
                return;
            }
        },
    };
    let Ok(id) = hub.send(NewSessionId).await else {
        return;
    };
    let certificate_issued = link
        .peer
        .common_name
        .is_some()
        .then(|| issued_at(&link.peer.certificates));
    let Link {
        sender, receiver, ..
    } = link;
    // Frames of streams inside the link go to its tunnel as they come;
    // the session sees messages only. The link's end ends the streams.
    let tunnel = stream::Tunnel::for_cloud(sender.clone());
    let reader_tunnel = tunnel.clone();
    let incoming = futures_util::stream::unfold(receiver, move |mut receiver| {
        let tunnel = reader_tunnel.clone();
        async move {
            loop {
                match receiver.recv_item().await {
                    Some(Ok(Received::Raw(frame))) => tunnel.received(&frame),
                    Some(Ok(Received::Message(msg))) => return Some((Ok(msg), receiver)),
                    Some(Err(err)) => return Some((Err(err), receiver)),
                    None => {
                        tunnel.link_lost();
                        return None;
                    }
                }
            }
        }
    });
    let session_sender = sender.clone();
    let session_node = node.clone();
    let session_hub = hub.clone();
    NodeSession::create(move |ctx| {
        ctx.add_stream(incoming);
        NodeSession {
            node: session_node,
            id,
            hub: session_hub,
            hive,
            sender: session_sender,
            dialect,
            liveness: Liveness::new(config.keepalive, dialect, Instant::now()),
            stats,
        }
    });
    if dialect.cloud_keeps_alive() {
        // The node waits for a first word before it counts its link as up.
        let _ = sender.try_send(&protocol::keepalive(module::CLOUDHUB), Lane::Ordered);
    }
    // Sent before the session can report an ack: both come from this arbiter.
    hub.do_send(SessionUp {
        node,
        id,
        sender,
        dialect,
        claim,
        tunnel,
        certificate_issued,
    });
}

/// The live link of one node.
struct NodeSession {
    node: String,
    id: u64,
    hub: Addr<CloudHub>,
    hive: Hive,
    sender: LinkSender,
    dialect: Dialect,
    liveness: Liveness,
    stats: Arc<HubStats>,
}

impl Actor for NodeSession {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        ctx.run_interval(self.liveness.period(), |session, ctx| {
            match session.liveness.check(Instant::now()) {
                Beat::Quiet => {}
                Beat::Silent => {
                    warn!(node = %session.node, "no keepalive from the node; closing its link");
                    session.stats.count(&session.stats.keepalive_timeouts);
                    ctx.stop();
                }
                Beat::SpeakFirst => {
                    let _ = session
                        .sender
                        .try_send(&protocol::keepalive(module::CLOUDHUB), Lane::Ordered);
                }
            }
        });
    }

    fn stopped(&mut self, _: &mut Context<Self>) {
        self.hub.do_send(SessionDown {
            node: self.node.clone(),
            id: self.id,
        });
        let sender = self.sender.clone();
        actix::spawn(async move { sender.close().await });
    }
}

impl StreamHandler<Result<HiveMessage, TransportError>> for NodeSession {
    fn handle(&mut self, item: Result<HiveMessage, TransportError>, ctx: &mut Context<Self>) {
        let msg = match item {
            Ok(msg) => msg,
            Err(err) => {
                warn!(node = %self.node, error = %err, "link failed");
                ctx.stop();
                return;
            }
        };
        self.liveness.heard(Instant::now());
        let decided = upstream(&self.node, self.dialect, msg, |msg| {
            crate::protocol::is_answer(&self.hive, msg)
        });
        match decided {
            Upstream::Keepalive => {}
            Upstream::Ack(id) => self.hub.do_send(Acked {
                node: self.node.clone(),
                id,
            }),
            Upstream::SecondHello => debug!(node = %self.node, "second hello ignored"),
            Upstream::ReportedError(msg) => {
                let reason = msg
                    .failure()
                    .map(|failure| failure.reason)
                    .unwrap_or_default();
                warn!(node = %self.node, resource = msg.resource(), %reason, "the node reports an error");
            }
            Upstream::Answer(msg) => {
                self.hive.send_resp(msg);
            }
            Upstream::ToGroup(msg) => {
                self.stats.count(&self.stats.upstream);
                let hive = self.hive.clone();
                let stats = self.stats.clone();
                let target = msg.group().to_owned();
                // In order, and the link waits while the cloud module is full.
                ctx.wait(
                    async move {
                        if hive.send_to_group(&target, msg).await.is_err() {
                            stats.count(&stats.unroutable);
                        }
                    }
                    .into_actor(self),
                );
            }
            Upstream::Refused(reason) => {
                warn!(node = %self.node, %reason, "message refused");
                self.stats.count(&self.stats.foreign_messages);
            }
        }
    }

    fn finished(&mut self, ctx: &mut Context<Self>) {
        debug!(node = %self.node, "link closed");
        ctx.stop();
    }
}
