//! Prometheus metrics of cloudcore and edgecore: `GET /metrics` in the text
//! exposition format, built when scraped from the counters the modules
//! keep (no registry, no global state).

use std::collections::{BTreeMap, HashSet};
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use actix_web::{App, HttpResponse, HttpServer, web};
use beehive::Hive;
use hub::{EdgeHubStats, HubStats};

/// A page of metrics being written.
#[derive(Default)]
pub struct Exposition {
    text: String,
    described: HashSet<&'static str>,
}

/// How a metric behaves.
#[derive(Clone, Copy)]
enum MetricType {
    Counter,
    Gauge,
}

impl Exposition {
    fn sample(
        &mut self,
        kind: MetricType,
        name: &'static str,
        help: &str,
        labels: &[(&str, &str)],
        value: u64,
    ) {
        if self.described.insert(name) {
            let kind = match kind {
                MetricType::Counter => "counter",
                MetricType::Gauge => "gauge",
            };
            let _ = writeln!(self.text, "# HELP {name} {help}\n# TYPE {name} {kind}");
        }
        self.text.push_str(name);
        if !labels.is_empty() {
            let labels: Vec<String> = labels
                .iter()
                .map(|(key, value)| format!("{key}=\"{}\"", escape(value)))
                .collect();
            let _ = write!(self.text, "{{{}}}", labels.join(","));
        }
        let _ = writeln!(self.text, " {value}");
    }

    /// A counter (only goes up).
    pub fn counter(&mut self, name: &'static str, help: &str, labels: &[(&str, &str)], value: u64) {
        self.sample(MetricType::Counter, name, help, labels, value);
    }

    /// A gauge (goes up and down).
    pub fn gauge(&mut self, name: &'static str, help: &str, labels: &[(&str, &str)], value: u64) {
        self.sample(MetricType::Gauge, name, help, labels, value);
    }

    /// Messages each module handled by operation, mailbox depths and
    /// restarts.
    pub fn hive(&mut self, hive: &Hive) {
        for (module, operation, count) in hive.handled() {
            self.counter(
                "edgehive_module_messages_total",
                "Messages a module handled, by operation.",
                &[("module", &module), ("operation", operation)],
                count,
            );
        }
        let modules = hive.modules();
        for module in &modules {
            self.gauge(
                "edgehive_module_queue_depth",
                "Messages waiting in a module's mailbox.",
                &[("module", &module.name)],
                module.queued as u64,
            );
        }
        // Each metric's samples stay together, as the format requires.
        for module in &modules {
            self.counter(
                "edgehive_module_restarts_total",
                "Times a module was restarted.",
                &[("module", &module.name)],
                u64::from(module.restarts),
            );
        }
        let stats = hive.stats();
        self.counter(
            "edgehive_sync_timeouts_total",
            "send_sync calls that timed out.",
            &[],
            stats.sync_timeouts,
        );
    }

    /// The edgecontroller's counters: messages queued for nodes, and how
    /// they were batched at cloudhub.
    pub fn controller(&mut self, counts: &cloud::controller::ControllerCounts) {
        self.counter(
            "edgehive_controller_sent_total",
            "Messages the edgecontroller queued for nodes.",
            &[],
            counts.sent,
        );
        self.counter(
            "edgehive_controller_send_failures_total",
            "Messages cloudhub did not take.",
            &[],
            counts.send_failures,
        );
        self.counter(
            "edgehive_controller_send_batches_total",
            "Batches of messages queued at cloudhub and awaited together.",
            &[],
            counts.send_batches,
        );
        self.counter(
            "edgehive_controller_batched_sends_total",
            "Messages in those batches (over the batches: the mean batch size).",
            &[],
            counts.batched_sends,
        );
        self.gauge(
            "edgehive_controller_largest_send_batch",
            "The largest batch of sends so far.",
            &[],
            counts.largest_send_batch,
        );
        self.counter(
            "edgehive_controller_watch_events_total",
            "Watch events of the desired state handled.",
            &[],
            counts.watch_events,
        );
        self.counter(
            "edgehive_controller_tolerations_written_total",
            "Pods whose offline tolerations the controller wrote (admission had not lengthened them).",
            &[],
            counts.tolerations_written,
        );
        self.counter(
            "edgehive_controller_leases_renewed_total",
            "Node heartbeat Leases renewed.",
            &[],
            counts.leases_renewed,
        );
        self.counter(
            "edgehive_controller_status_written_total",
            "Status writes (pods', devices', nodes') that landed, off the delivery path.",
            &[],
            counts.status_written,
        );
        self.counter(
            "edgehive_controller_status_coalesced_total",
            "Statuses replaced by a newer one of the same object before they were written.",
            &[],
            counts.status_coalesced,
        );
        self.counter(
            "edgehive_controller_status_throttled_total",
            "Status writes the API server answered 429 (Too Many Requests).",
            &[],
            counts.status_throttled,
        );
        self.counter(
            "edgehive_controller_status_retried_total",
            "Status writes tried again (after a 429 or a failure).",
            &[],
            counts.status_retried,
        );
        self.counter(
            "edgehive_controller_status_dropped_total",
            "Statuses dropped (their object gone, or refused for good).",
            &[],
            counts.status_dropped,
        );
    }

    /// What cloudcore asked of the API server, by verb and resource, and
    /// the answers that told it to slow down.
    pub fn api_requests(&mut self, requests: &cloud::desired::api_requests::ApiRequests) {
        for (verb, resource, count) in requests.snapshot() {
            self.counter(
                "edgehive_apiserver_requests_total",
                "Requests to the Kubernetes API server, by verb and resource.",
                &[("verb", verb), ("resource", &resource)],
                count,
            );
        }
        self.counter(
            "edgehive_apiserver_throttled_total",
            "Answers 429 Too Many Requests from the API server.",
            &[],
            requests.throttled(),
        );
    }

    /// cloudhub's counters: nodes connected, acks pending, traffic.
    pub fn cloudhub(&mut self, stats: &HubStats) {
        let get = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        self.gauge(
            "edgehive_cloudhub_nodes_connected",
            "Nodes linked to this cloud now.",
            &[],
            get(&stats.connected),
        );
        self.gauge(
            "edgehive_cloudhub_acks_pending",
            "Objects in node queues not yet acknowledged.",
            &[],
            get(&stats.pending),
        );
        for (name, help, counter) in [
            (
                "edgehive_cloudhub_sessions_total",
                "Node sessions established (reconnects included).",
                &stats.sessions_opened,
            ),
            (
                "edgehive_cloudhub_refused_links_total",
                "Links refused (no or a mismatching certificate, bad name).",
                &stats.refused_links,
            ),
            (
                "edgehive_cloudhub_foreign_messages_total",
                "Messages refused because a node spoke for another.",
                &stats.foreign_messages,
            ),
            (
                "edgehive_cloudhub_downstream_sent_total",
                "Objects sent to nodes (resends included).",
                &stats.downstream_sent,
            ),
            (
                "edgehive_cloudhub_acked_total",
                "Objects acknowledged by nodes.",
                &stats.acked,
            ),
            (
                "edgehive_cloudhub_resent_total",
                "Objects sent again because their ack was overdue (KubeEdge nodes).",
                &stats.resent,
            ),
            (
                "edgehive_cloudhub_upstream_total",
                "Messages from nodes passed to cloud modules.",
                &stats.upstream,
            ),
            (
                "edgehive_cloudhub_queue_full_total",
                "Objects refused because a node's queue was full.",
                &stats.queue_full,
            ),
            (
                "edgehive_cloudhub_keepalive_timeouts_total",
                "Links closed for silence.",
                &stats.keepalive_timeouts,
            ),
        ] {
            self.counter(name, help, &[], get(counter));
        }
    }

    /// edgehub's counters: the link, reconnects, traffic, the offline
    /// buffer.
    pub fn edgehub(&mut self, stats: &EdgeHubStats, online: bool) {
        let get = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        self.gauge(
            "edgehive_edgehub_connected",
            "1 while the link to the cloud is up.",
            &[],
            u64::from(online),
        );
        self.counter(
            "edgehive_edgehub_reconnects_total",
            "Links established after the first.",
            &[],
            get(&stats.connects).saturating_sub(1),
        );
        for (name, help, counter) in [
            (
                "edgehive_edgehub_dial_failures_total",
                "Failed attempts to reach the cloud.",
                &stats.dial_failures,
            ),
            (
                "edgehive_edgehub_downstream_total",
                "Objects from the cloud passed to edge modules.",
                &stats.downstream,
            ),
            (
                "edgehive_edgehub_acks_sent_total",
                "Acknowledgements sent after an object was persisted.",
                &stats.acks_sent,
            ),
            (
                "edgehive_edgehub_upstream_sent_total",
                "Messages sent up to the cloud.",
                &stats.upstream_sent,
            ),
            (
                "edgehive_edgehub_offline_buffered_total",
                "Messages kept while the cloud was unreachable.",
                &stats.offline_buffered,
            ),
            (
                "edgehive_edgehub_offline_dropped_total",
                "Messages dropped from a full offline buffer.",
                &stats.offline_dropped,
            ),
            (
                "edgehive_edgehub_keepalive_timeouts_total",
                "Links closed for silence.",
                &stats.keepalive_timeouts,
            ),
        ] {
            self.counter(name, help, &[], get(counter));
        }
    }

    /// Pods by phase (every phase shown, zeros too).
    pub fn pods_by_phase<'a>(&mut self, phases: impl IntoIterator<Item = &'a str>) {
        let mut counts: BTreeMap<&str, u64> =
            ["Pending", "Running", "Succeeded", "Failed", "Unknown"]
                .into_iter()
                .map(|phase| (phase, 0))
                .collect();
        for phase in phases {
            *counts.entry(phase).or_default() += 1;
        }
        for (phase, count) in counts {
            self.gauge(
                "edgehive_pods",
                "Pods by phase.",
                &[("phase", phase)],
                count,
            );
        }
    }

    /// The page.
    pub fn finish(self) -> String {
        self.text
    }
}

fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// What renders the page on each scrape.
pub type Render = Arc<dyn Fn() -> String + Send + Sync>;

/// Serves `GET /metrics` on `address` (inside an actix System); the bound
/// address and a handle to stop it.
pub fn serve(
    address: &str,
    render: Render,
) -> std::io::Result<(SocketAddr, actix_web::dev::ServerHandle)> {
    let render = web::Data::new(render);
    let server = HttpServer::new(move || {
        App::new().app_data(render.clone()).route(
            "/metrics",
            web::get().to(|render: web::Data<Render>| async move {
                HttpResponse::Ok()
                    .content_type("text/plain; version=0.0.4")
                    .body(render())
            }),
        )
    })
    .workers(1)
    .disable_signals()
    .shutdown_timeout(1)
    .bind(address)?;
    let bound = server.addrs();
    apis::api::spawn_server("metrics", &bound, server.run())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_is_prometheus_text() {
        let mut page = Exposition::default();
        page.counter("x_total", "Xs.", &[("module", "a\"b")], 3);
        page.counter("x_total", "Xs.", &[("module", "c")], 4);
        page.pods_by_phase(["Running", "Running", "Pending"]);
        let text = page.finish();
        assert!(text.starts_with("# HELP x_total Xs.\n# TYPE x_total counter\nx_total{module=\"a\\\"b\"} 3\nx_total{module=\"c\"} 4\n"), "{text}");
        assert_eq!(text.matches("# TYPE x_total").count(), 1);
        assert!(
            text.contains("edgehive_pods{phase=\"Running\"} 2\n"),
            "{text}"
        );
        assert!(
            text.contains("edgehive_pods{phase=\"Failed\"} 0\n"),
            "{text}"
        );
    }
}
