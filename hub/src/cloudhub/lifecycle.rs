//! What a node's session tells cloudhub, as actix messages: the link is
//! up (in which dialect, with which queue), the node acknowledged an
//! object, the session recorded the queue it started from, the link is
//! down; and a claim this replica lost. The handlers keep the node's queue
//! and say so on the node events.

use super::sessions::{NotOpened, Opened};
use super::*;

/// A node's session is up.
#[derive(Message)]
#[rtype(result = "()")]
pub(super) struct SessionUp {
    pub(super) node: String,
    pub(super) id: u64,
    pub(super) sender: LinkSender,
    pub(super) dialect: Dialect,
    pub(super) claim: Option<u64>,
    pub(super) tunnel: stream::Tunnel,
    pub(super) certificate_issued: Option<u64>,
}

/// A node's session ended.
#[derive(Message)]
#[rtype(result = "()")]
pub(super) struct SessionDown {
    pub(super) node: String,
    pub(super) id: u64,
}

/// A node acknowledged a message.
#[derive(Message)]
#[rtype(result = "()")]
pub(super) struct Acked {
    pub(super) node: String,
    pub(super) id: beehive::Uuid,
}

/// Asks for a fresh session id.
#[derive(Message)]
#[rtype(result = "u64")]
pub(super) struct NewSessionId;

impl Handler<NewSessionId> for CloudHub {
    type Result = u64;
    fn handle(&mut self, _: NewSessionId, _: &mut Context<Self>) -> u64 {
        self.book.new_id()
    }
}

impl Handler<SessionUp> for CloudHub {
    type Result = ();
    fn handle(&mut self, up: SessionUp, ctx: &mut Context<Self>) {
        let claim_held = self
            .config
            .claims
            .as_ref()
            .is_none_or(|claims| claims.holds(&up.node));
        let session = Session::new(
            up.id,
            up.sender,
            up.dialect,
            up.claim,
            up.certificate_issued,
        );
        match self.book.open(&up.node, session, claim_held) {
            Opened::Refused { sender, why } => {
                match why {
                    // Its claim ended between the claim and now: another
                    // replica may serve the node already.
                    NotOpened::ClaimGone => {
                        warn!(node = %up.node, session = up.id, "claim gone before the session started; link closed")
                    }
                    // An older session reporting late: the newer one stays.
                    NotOpened::Superseded => {
                        debug!(node = %up.node, session = up.id, "a newer link is current; this one closed")
                    }
                }
                actix::spawn(async move { sender.close().await });
                return;
            }
            Opened::Current { replaced } => {
                info!(node = %up.node, session = up.id, "node connected");
                if let Some(old) = replaced {
                    // A reconnect while the old link lingers: the new one wins.
                    actix::spawn(async move { old.close().await });
                }
            }
        }
        if up.dialect == Dialect::Native {
            self.tunnels.linked(&up.node, up.id, up.tunnel);
        } else {
            self.tunnels.linked_kubeedge(&up.node, up.id);
        }
        // Counted once the session is in place (streams may be opened).
        self.stats.count(&self.stats.sessions_opened);
        self.load_from_store(&up.node);
        if let (Some(acks), Some(queue)) = (self.acks_of(&up.node), self.queues.get(&up.node))
            && !queue.is_empty()
        {
            // What was queued before (for another session, perhaps under
            // another claim, perhaps older than what the node holds now)
            // is unsure at the node, and goes once that is recorded.
            for msg in queue.objects() {
                acks.unsure(&up.node, msg.resource());
            }
            let recorded = acks.recorded(&up.node);
            let (hub, node, id) = (ctx.address(), up.node.clone(), up.id);
            actix::spawn(async move {
                if tokio::time::timeout(RECORD_TIMEOUT, recorded)
                    .await
                    .is_err()
                {
                    warn!(%node, "what the node's queue held was not recorded in time; sent anyway");
                }
                hub.do_send(Recorded { node, id });
            });
            self.book.hold_back(&up.node);
        }
        let window = up.dialect.window(self.config.window);
        let resend_after = up
            .dialect
            .resends_unacknowledged()
            .then_some(self.config.kubeedge_resend_after);
        let queue = self.queue(&up.node);
        queue.set_window(window);
        queue.set_resend_after(resend_after);
        queue.link_lost();
        self.pump(&up.node, ctx);
        self.node_event(&up.node, NodeEventKind::Connected(up.dialect));
        self.stats.set_connected(self.book.len());
    }
}

/// What a session's queue held at its start is recorded: it may go.
#[derive(Message)]
#[rtype(result = "()")]
pub(super) struct Recorded {
    pub(super) node: String,
    pub(super) id: u64,
}

impl Handler<Recorded> for CloudHub {
    type Result = ();
    fn handle(&mut self, recorded: Recorded, ctx: &mut Context<Self>) {
        if self.book.recorded(&recorded.node, recorded.id) {
            self.pump(&recorded.node, ctx);
        }
    }
}

/// This replica lost its claim on a node: it serves the node no more.
#[derive(Message)]
#[rtype(result = "()")]
pub(super) struct ClaimLost {
    pub(super) node: String,
    pub(super) generation: u64,
}

impl Handler<ClaimLost> for CloudHub {
    type Result = ();
    fn handle(&mut self, lost: ClaimLost, _: &mut Context<Self>) {
        let ClaimLost { node, generation } = lost;
        // A session claimed under a newer lease is not this claim's.
        let Some(session) = self.book.claim_lost(&node, generation, Instant::now()) else {
            return;
        };
        warn!(%node, session = session.id, "claim on the node lost; its link is closed");
        if let Some(acks) = &self.config.acks {
            acks.ended(&node);
        }
        if let Some(queue) = self.queues.get_mut(&node) {
            queue.link_lost();
        }
        self.node_gone(&node, false);
        self.stats.set_connected(self.book.len());
        actix::spawn(async move { session.sender.close().await });
    }
}

impl Handler<SessionDown> for CloudHub {
    type Result = ();
    fn handle(&mut self, down: SessionDown, _: &mut Context<Self>) {
        let Some(ended) = self.book.close(&down.node, down.id, Instant::now()) else {
            return;
        };
        info!(node = %down.node, session = down.id, "node disconnected");
        self.tunnels.unlinked(&down.node, down.id);
        let served = self.holds(&down.node);
        if let Some(acks) = &self.config.acks {
            // Before the claim is given up: what the node acknowledged is
            // recorded under it.
            acks.ended(&down.node);
        }
        if let (Some(claims), Some(generation)) = (&self.config.claims, ended.claim) {
            claims.release(&down.node, generation);
        }
        if let Some(queue) = self.queues.get_mut(&down.node) {
            queue.link_lost();
        }
        self.node_gone(&down.node, served);
        self.stats.set_connected(self.book.len());
    }
}

impl Handler<Acked> for CloudHub {
    type Result = ();
    fn handle(&mut self, acked: Acked, ctx: &mut Context<Self>) {
        let before = self.queue_len(&acked.node);
        let acks = self.acks_of(&acked.node).cloned();
        let Some(queue) = self.queues.get_mut(&acked.node) else {
            return;
        };
        let node = acked.node.as_str();
        match queue.ack(acked.id) {
            AckOutcome::Delivered {
                resource,
                operation,
                version,
            } => {
                self.stats.count(&self.stats.acked);
                if let Some(store) = &self.store {
                    store.remove(node, &resource);
                }
                if operation == operation::DELETE {
                    if let Some(acks) = &acks {
                        acks.gone(node, &resource);
                    }
                    // The node holds the deletion (persisted, at an edgehive
                    // edge): the controller may finish deleting the object.
                    self.delivered(node, &resource);
                } else if let Some(acks) = &acks {
                    acks.held(node, &resource, &version);
                }
            }
            AckOutcome::Superseded {
                resource,
                operation,
                version,
                deletion_follows,
            } => {
                self.stats.count(&self.stats.acked);
                match &acks {
                    Some(acks) if operation == operation::DELETE => acks.gone(node, &resource),
                    // Held only until the deletion behind it arrives.
                    Some(acks) if !deletion_follows => acks.held(node, &resource, &version),
                    _ => {}
                }
            }
            AckOutcome::Unknown => self.stats.count(&self.stats.duplicate_acks),
        }
        let after = self.queue_len(&acked.node);
        self.adjust_pending(before, after);
        self.pump(&acked.node, ctx);
    }
}
