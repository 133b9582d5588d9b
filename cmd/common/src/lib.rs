//! What edgehive's binaries share and nothing else: reading their
//! configuration files with flags over them, logging, and the Prometheus
//! metrics page. Each binary's own configuration schema and metrics live
//! in its crate (`cloudcore`, `edgecore`), so that neither half builds the
//! other.

pub mod config;
pub mod metrics;
