//! cloudcore's metrics: the edgecontroller's, cloudhub's and the API
//! server requests' counters, on the page `cmd_common::metrics` writes.

use std::sync::atomic::{AtomicU64, Ordering};

use cmd_common::metrics::Exposition;
use hub::HubStats;

/// The cloud's modules' counters on a metrics page.
pub(crate) trait CloudMetrics {
    /// The edgecontroller's counters: messages queued for nodes, and how
    /// they were batched at cloudhub.
    fn controller(&mut self, counts: &cloud::edgecontroller::ControllerCounts);

    /// What cloudcore asked of the API server, by verb and resource, and
    /// the answers that told it to slow down.
    fn api_requests(&mut self, requests: &cloud::desired::api_requests::ApiRequests);

    /// cloudhub's counters: nodes connected, acks pending, traffic.
    fn cloudhub(&mut self, stats: &HubStats);
}

impl CloudMetrics for Exposition {
    fn controller(&mut self, counts: &cloud::edgecontroller::ControllerCounts) {
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

    fn api_requests(&mut self, requests: &cloud::desired::api_requests::ApiRequests) {
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

    fn cloudhub(&mut self, stats: &HubStats) {
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
}
