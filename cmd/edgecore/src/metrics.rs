//! edgecore's metrics: edgehub's counters, on the page `cmd_common::metrics`
//! writes.

use std::sync::atomic::{AtomicU64, Ordering};

use cmd_common::metrics::Exposition;
use hub::EdgeHubStats;

/// The edge's modules' counters on a metrics page.
pub(crate) trait EdgeMetrics {
    /// edgehub's counters: the link, reconnects, traffic, the offline
    /// buffer.
    fn edgehub(&mut self, stats: &EdgeHubStats, online: bool);
}

impl EdgeMetrics for Exposition {
    fn edgehub(&mut self, stats: &EdgeHubStats, online: bool) {
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
}
