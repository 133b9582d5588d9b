//! Prometheus metrics, as cloudcore and edgecore serve them: `GET /metrics`
//! in the text exposition format, built when scraped from the counters the
//! modules keep (no registry, no global state). The page and what both
//! halves show (the hive, pods by phase); each binary adds its own
//! modules' counters (`cloudcore::metrics`, `edgecore::metrics`).

use std::collections::{BTreeMap, HashSet};
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::Arc;

use actix_web::{App, HttpResponse, HttpServer, web};
use beehive::Hive;

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
                "Messages waiting in a module's mailbox or taken and not yet handled (up to twice its capacity in a burst).",
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
    .bind(address)
    .map_err(apis::api::bind_error(address))?;
    let bound = server.addrs();
    apis::api::spawn_server("metrics", &bound, server.run())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_taken_port_is_named_in_the_error() {
        let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("a port");
        let address = taken.local_addr().expect("its address").to_string();
        let refused = actix_web::rt::System::new()
            .block_on(async { serve(&address, std::sync::Arc::new(String::new)).map(drop) });
        let err = refused.expect_err("the port is taken");
        assert!(
            err.to_string()
                .contains(&format!("cannot listen on {address}")),
            "{err}"
        );
    }

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
