//! edgehub's link: dialling the cloud (each of its addresses in turn,
//! with backoff and jitter), running the link until it ends, and
//! delivering what the cloud sends to the edge modules, acknowledged only
//! once the module that keeps it has persisted it.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::Addr;
use beehive::Hive;
use beehive::Message as HiveMessage;
use beehive::constants::{module, operation};
use tokio::sync::Notify;
use tracing::{debug, info, warn};
use transports::{Lane, Link, LinkSender, Received, TransportError, TransportKind};

use super::{EdgeHub, EdgeHubConfig, LinkDown, LinkUp, route};
use crate::protocol;
use crate::protocol::Kind;
use crate::stats::EdgeHubStats;

/// Dials, runs the link until it ends, waits, dials again; ends when the
/// edgehub module is gone.
pub(crate) async fn connect_loop(
    hub: Addr<EdgeHub>,
    hive: Hive,
    config: Arc<EdgeHubConfig>,
    stats: Arc<EdgeHubStats>,
    cut: Arc<Notify>,
) {
    let transport = match config.transport.transport() {
        Ok(transport) => transport,
        Err(err) => {
            warn!(error = %err, "edgehub cannot dial");
            return;
        }
    };
    let mut dial = config
        .dialect
        .dial_options(&config.node, config.dial.clone());
    let mut addresses = CloudAddresses::new(
        config.addresses(),
        config.transport != TransportKind::UnixSocket,
    );
    let mut attempt = 0u32;
    let mut id = 0u64;
    let mut failures = DialFailures::default();
    while hub.connected() {
        dial.address = addresses.next().await;
        match transport.dial(&dial).await {
            Ok(link) => {
                id += 1;
                stats.count(&stats.connects);
                info!(
                    node = %config.node,
                    address = %dial.address,
                    failed_before = failures.count(),
                    "connected to the cloud"
                );
                let up = Instant::now();
                run_link(link, id, &hub, &hive, &config, &stats, &cut).await;
                // A link refused at once (another replica serves this node)
                // is a failure too: the backoff grows.
                // Nor does it end a spell of failures: a cloud that takes
                // links and drops them at once is not warned of anew each
                // time.
                if up.elapsed() >= Duration::from_secs(1) {
                    attempt = 0;
                    failures.connected();
                }
                hub.do_send(LinkDown { id });
                info!(node = %config.node, address = %dial.address, "link to the cloud lost");
            }
            // A wrong address, port, transport or CA, or a cloud that is
            // down: said at the default level (each new cause at once, the
            // same one again once a minute), for whoever set the node up.
            Err(err) => {
                stats.count(&stats.dial_failures);
                let error = err.to_string();
                let refused = matches!(err, TransportError::Refused { .. });
                match failures.failed(&dial.address, &error, Instant::now()) {
                    true if refused => warn!(
                        node = %config.node, address = %dial.address, transport = %config.transport,
                        %error, failures = failures.count(), "the cloud refused the link; retrying"
                    ),
                    true => warn!(
                        node = %config.node, address = %dial.address, transport = %config.transport,
                        %error, failures = failures.count(), "cannot reach the cloud; retrying"
                    ),
                    false => debug!(%error, attempt, address = %dial.address, "dial failed"),
                }
            }
        }
        if !hub.connected() {
            break;
        }
        // The next replica, if there are several; the backoff grows per
        // failure as with one.
        let delay = config.backoff(attempt);
        attempt = attempt.saturating_add(1);
        tokio::time::sleep(delay).await;
    }
}

/// Which failed dials are worth a warning: each address and cause the
/// first time in a spell of failures, the same again once
/// [`DialFailures::REPEAT`] has passed since it was last said; the rest
/// at debug level. A spell ends when a link stays up (a second).
#[derive(Debug, Default)]
pub(crate) struct DialFailures {
    /// When each (address, error) was last warned of, this spell.
    warned: std::collections::HashMap<(String, String), Instant>,
    count: u32,
}

impl DialFailures {
    /// How often one unchanged cause is said again.
    pub(crate) const REPEAT: Duration = Duration::from_secs(60);

    /// A dial of `address` failed with `error` at `now`: whether to warn.
    pub(crate) fn failed(&mut self, address: &str, error: &str, now: Instant) -> bool {
        self.count = self.count.saturating_add(1);
        let said = self
            .warned
            .get(&(address.to_owned(), error.to_owned()))
            .is_some_and(|at| now.saturating_duration_since(*at) < Self::REPEAT);
        if !said {
            self.warned
                .insert((address.to_owned(), error.to_owned()), now);
        }
        !said
    }

    /// Failures this spell.
    pub(crate) fn count(&self) -> u32 {
        self.count
    }

    /// A link stayed up: how many dials failed before it; the spell ends.
    pub(crate) fn connected(&mut self) -> u32 {
        std::mem::take(self).count
    }
}

/// The cloud's addresses in the order they are dialled: each configured
/// address in turn, and a name resolving to several addresses (several
/// replicas behind one DNS name) as each of those in turn. A name is
/// resolved again each time its turn comes, so a changed record is
/// followed; one that does not resolve is dialled as given, for the
/// transport to say why.
pub(crate) struct CloudAddresses {
    configured: Vec<String>,
    /// Whether the addresses are `host:port` (not a socket's path).
    network: bool,
    next: usize,
    pending: VecDeque<String>,
    resolve: Resolver,
}

/// Resolves `host:port` to its addresses.
pub(crate) type Resolver =
    fn(
        String,
    ) -> futures_util::future::BoxFuture<'static, std::io::Result<Vec<std::net::SocketAddr>>>;

/// The system's resolver.
pub(crate) fn lookup(
    address: String,
) -> futures_util::future::BoxFuture<'static, std::io::Result<Vec<std::net::SocketAddr>>> {
    Box::pin(async move { Ok(tokio::net::lookup_host(address).await?.collect()) })
}

impl CloudAddresses {
    fn new(configured: Vec<String>, network: bool) -> CloudAddresses {
        CloudAddresses {
            configured,
            network,
            next: 0,
            pending: VecDeque::new(),
            resolve: lookup,
        }
    }

    async fn next(&mut self) -> String {
        if let Some(address) = self.pending.pop_front() {
            return address;
        }
        let Some(configured) = self
            .configured
            .get(self.next % self.configured.len().max(1))
        else {
            return String::new();
        };
        let configured = configured.clone();
        self.next = self.next.wrapping_add(1);
        if !self.network {
            return configured;
        }
        let resolved: Vec<String> = match (self.resolve)(configured.clone()).await {
            Ok(found) => {
                let mut found: Vec<String> = found.into_iter().map(|a| a.to_string()).collect();
                // One address once, whatever the resolver repeats.
                let mut seen = std::collections::HashSet::new();
                found.retain(|a| seen.insert(a.clone()));
                found
            }
            Err(err) => {
                debug!(address = %configured, error = %err, "cloud address not resolved");
                Vec::new()
            }
        };
        match resolved.len() {
            // One address (or none): dialled by its name, as given.
            0 | 1 => configured,
            _ => {
                debug!(address = %configured, addresses = ?resolved, "cloud name resolves to several addresses");
                self.pending.extend(resolved);
                self.pending.pop_front().unwrap_or(configured)
            }
        }
    }
}

pub(crate) async fn run_link(
    link: Link,
    id: u64,
    hub: &Addr<EdgeHub>,
    hive: &Hive,
    config: &Arc<EdgeHubConfig>,
    stats: &Arc<EdgeHubStats>,
    cut: &Notify,
) {
    let Link {
        sender,
        mut receiver,
        ..
    } = link;
    let dialect = config.dialect;
    let opener = dialect.opener(&config.node);
    if sender.send(&opener).await.is_err() {
        return;
    }
    // Up only once the cloud has accepted the opener (it answers at once);
    // a refused link must not take the offline backlog with it.
    let first = tokio::select! {
        first = tokio::time::timeout(config.keepalive * 7 / 4, receiver.recv()) => first,
        _ = cut.notified() => return,
    };
    let first = match first {
        Ok(Some(Ok(msg))) => msg,
        Ok(Some(Err(err))) => return warn!(error = %err, "link to the cloud failed"),
        Ok(None) => return warn!("the cloud closed the link after the hello (refused?)"),
        Err(_) => {
            // Silence, as a frozen cloud keeps it: a keepalive timeout.
            warn!("no answer from the cloud to the hello; closing the link");
            stats.count(&stats.keepalive_timeouts);
            return;
        }
    };
    hub.do_send(LinkUp {
        id,
        sender: sender.clone(),
    });
    if first.parent_id() == Some(opener.id()) {
        debug!(answer = %first.content(), "node registered");
    } else if protocol::kind(&first) == Kind::Payload {
        deliver(first, &sender, hive, config, stats).await;
    }
    // Streams the cloud opens inside the link; they end with it.
    let tunnel = stream::Tunnel::for_edge(sender.clone(), config.streams.clone());
    let _streams_end_with_the_link = tunnel.end_on_drop();
    let keepalive = config.keepalive;
    // A KubeEdge cloud sends no keepalives, but its WebSocket layer answers
    // pings: their pongs show the cloud process alive, where a frozen one
    // (its kernel still acknowledging) leaves the link silent.
    let probes = !dialect.cloud_keeps_alive() && sender.can_ping();
    let watched = dialect.cloud_keeps_alive() || probes;
    let mut pongs = receiver.pongs();
    let mut written = sender.written();
    let mut ticker = tokio::time::interval(keepalive / 4);
    let mut last_seen = Instant::now();
    let mut last_sent = Instant::now();
    loop {
        tokio::select! {
            next = receiver.recv_item() => {
                let msg = match next {
                    Some(Ok(Received::Message(msg))) => msg,
                    Some(Ok(Received::Raw(frame))) => {
                        tunnel.received(&frame);
                        last_seen = Instant::now();
                        continue;
                    }
                    Some(Err(err)) => {
                        warn!(error = %err, "link to the cloud failed");
                        break;
                    }
                    None => break,
                };
                if protocol::kind(&msg) == Kind::Payload {
                    deliver(msg, &sender, hive, config, stats).await;
                }
                // After delivering: time spent on it is ours, not the
                // cloud's silence.
                last_seen = Instant::now();
            }
            _ = cut.notified() => {
                // Gone at once: nothing flushed, nothing said.
                return;
            }
            _ = sender.closed() => {
                // Closed here (edgehub stopping): take nothing more from it.
                break;
            }
            _ = ticker.tick() => {
                let heard = receiver.pongs();
                if heard != pongs {
                    pongs = heard;
                    last_seen = Instant::now();
                }
                // A ping waits behind what is already on its way up; while
                // that backlog moves, the cloud's end is taking data. Once a
                // frozen cloud's buffers are full, it stops moving.
                let now_written = sender.written();
                if probes && now_written != written && sender.backlog() > 0 {
                    last_seen = Instant::now();
                }
                written = now_written;
                if watched && last_seen.elapsed() > keepalive * 7 / 4 {
                    warn!("nothing from the cloud, not even a pong; closing the link");
                    stats.count(&stats.keepalive_timeouts);
                    break;
                }
                if last_sent.elapsed() >= keepalive {
                    last_sent = Instant::now();
                    let _ = sender.try_send(&dialect.keepalive(), Lane::Ordered);
                    if probes {
                        let _ = sender.ping();
                    }
                }
            }
        }
    }
    let closing = sender.clone();
    actix::spawn(async move { closing.close().await });
}

/// What became of an object handed to the edge modules.
pub(crate) enum Confirmation {
    /// Stored: acknowledge.
    Persisted,
    /// Refused for good (no such module, a module said no): acknowledge and
    /// count, or the cloud would resend it forever.
    Refused(String),
    /// Not confirmed in time: the link is reset so it comes again.
    NotYet(String),
}

/// Hands a cloud message to the edge modules. An object is acknowledged
/// only once every module of its group has confirmed it (metamanager
/// confirms after its commit); a module that does not confirm resets the
/// link, so the cloud sends the object again.
pub(crate) async fn deliver(
    msg: HiveMessage,
    sender: &LinkSender,
    hive: &Hive,
    config: &Arc<EdgeHubConfig>,
    stats: &Arc<EdgeHubStats>,
) {
    stats.count(&stats.downstream);
    if crate::protocol::is_answer(hive, &msg) {
        hive.send_resp(msg);
        return;
    }
    let target = route(msg.group()).to_owned();
    if msg.operation() == operation::QUERY {
        // The cloud asks: the module that knows answers, and the answer
        // goes back up the link.
        let (hive, sender, timeout) = (hive.clone(), sender.clone(), config.persist_timeout);
        actix::spawn(async move {
            let mut answer = match hive.send_to_group_sync(&target, msg.clone(), timeout).await {
                Ok(mut answers) if !answers.is_empty() => answers.swap_remove(0).1,
                Ok(_) => msg.error_response(module::EDGEHUB, "nobody here answers that"),
                Err(err) => msg.error_response(module::EDGEHUB, err.to_string()),
            };
            // Group members answer copies with ids of their own; the cloud
            // waits for an answer to its question's id.
            answer.header.parent_id = Some(msg.id());
            if sender.try_send(&answer, Lane::Ordered).is_err() {
                debug!("answer to the cloud not sent");
            }
        });
        return;
    }
    if !protocol::needs_ack(&msg) {
        if let Err(err) = hive.send_to_group(&target, msg).await {
            debug!(error = %err, "cloud message not delivered");
        }
        return;
    }
    let ack = config.dialect.ack(&msg);
    let hive = hive.clone();
    let sender = sender.clone();
    let stats = stats.clone();
    let timeout = config.persist_timeout;
    actix::spawn(async move {
        let confirmed = match hive.send_to_group_sync(&target, msg, timeout).await {
            Ok(responses) => match responses
                .iter()
                .find_map(|(module, r)| Some((module, r.failure()?)))
            {
                // Not stored, but it may be next time: do not acknowledge.
                Some((module, failure)) if failure.retryable => {
                    Confirmation::NotYet(format!("{module}: {failure}"))
                }
                // A module looked at it and said no: resending cannot help.
                Some((module, refusal)) => Confirmation::Refused(format!("{module}: {refusal}")),
                None => Confirmation::Persisted,
            },
            // No module of that group was ever started on this edge: nobody
            // here takes this kind of object. (A group whose modules have
            // stopped, as during shutdown, is not that: the object must come
            // again.)
            Err(err @ beehive::Error::UnknownGroup(_))
                if hive.modules().iter().all(|module| module.group != target) =>
            {
                Confirmation::Refused(err.to_string())
            }
            Err(err) => Confirmation::NotYet(err.to_string()),
        };
        match confirmed {
            Confirmation::Persisted | Confirmation::Refused(_) => {
                if let Confirmation::Refused(reason) = &confirmed {
                    warn!(%reason, "object refused by the edge; acknowledged so it is not resent forever");
                    stats.count(&stats.refused);
                }
                if sender.try_send(&ack, Lane::Ordered).is_ok() || sender.send(&ack).await.is_ok() {
                    stats.count(&stats.acks_sent);
                }
            }
            Confirmation::NotYet(reason) => {
                // Not stored in time: reset the link, the cloud sends it again.
                warn!(%reason, "object not confirmed in time; resetting the link");
                stats.count(&stats.unconfirmed);
                sender.close().await;
            }
        }
    });
}

#[cfg(test)]
mod tests {
    #[test]
    fn each_new_dial_failure_is_said_and_a_repeated_one_once_a_minute() {
        use super::DialFailures;
        let start = std::time::Instant::now();
        let at = |secs: u64| start + std::time::Duration::from_secs(secs);
        let mut failures = DialFailures::default();
        assert!(failures.failed("cloud:1", "refused", at(0)), "the first");
        assert!(!failures.failed("cloud:1", "refused", at(1)), "the same");
        assert!(
            failures.failed("cloud:2", "refused", at(2)),
            "another address"
        );
        assert!(
            failures.failed("cloud:1", "timed out", at(3)),
            "another cause"
        );
        assert!(
            !failures.failed("cloud:2", "refused", at(4)),
            "replicas in turn"
        );
        assert!(!failures.failed("cloud:1", "refused", at(59)));
        assert!(failures.failed("cloud:1", "refused", at(60)), "a minute on");
        assert_eq!(failures.count(), 7);
        assert_eq!(failures.connected(), 7);
        assert_eq!(failures.count(), 0);
        assert!(failures.failed("cloud:1", "refused", at(61)), "a new spell");
    }

    use super::*;

    /// `cloud.example:10000` resolves to three replicas (one repeated),
    /// `gone.example` to nothing; anything else to itself.
    fn fake_resolver(
        address: String,
    ) -> futures_util::future::BoxFuture<'static, std::io::Result<Vec<std::net::SocketAddr>>> {
        Box::pin(async move {
            match address.as_str() {
                "cloud.example:10000" => Ok([
                    "127.0.0.2:10000",
                    "127.0.0.3:10000",
                    "127.0.0.2:10000",
                    "[::1]:10000",
                ]
                .iter()
                .filter_map(|a| a.parse().ok())
                .collect()),
                "gone.example:10000" => Err(std::io::Error::other("no such host")),
                other => Ok(other.parse().into_iter().collect()),
            }
        })
    }

    #[actix::test]
    async fn a_name_resolving_to_several_replicas_is_dialled_at_each_in_turn() {
        let configured = [
            "cloud.example:10000",
            "127.0.0.9:10001",
            "gone.example:10000",
        ];
        let mut addresses =
            CloudAddresses::new(configured.iter().map(|a| a.to_string()).collect(), true);
        addresses.resolve = fake_resolver;
        let mut dialled = Vec::new();
        for _ in 0..12 {
            dialled.push(addresses.next().await);
        }
        let round = [
            "127.0.0.2:10000",
            "127.0.0.3:10000",
            "[::1]:10000",
            "127.0.0.9:10001",
            // Unresolved: dialled as given, for the transport to say why.
            "gone.example:10000",
        ];
        let expected: Vec<&str> = round.iter().cycle().take(12).copied().collect();
        assert_eq!(dialled, expected);
    }

    #[actix::test]
    async fn socket_paths_are_not_resolved() {
        let mut addresses = CloudAddresses::new(vec!["/run/cloud.sock".to_owned()], false);
        addresses.resolve = fake_resolver;
        assert_eq!(addresses.next().await, "/run/cloud.sock");
        assert_eq!(addresses.next().await, "/run/cloud.sock");
    }
}
