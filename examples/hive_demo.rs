//! A small tour of beehive: two hives ("cloud" and "edge") in one process,
//! modules started from a `modules` config, the verbs, and a clean shutdown.
//!
//! `cargo run --example hive_demo` (the cloudcore / edgecore binaries arrive
//! with the hub and system issues).

use std::time::Duration;

use actix::{Actor, Context};
use anyhow::{Context as _, Result};
use beehive::constants::{group, operation, resource_type};
use beehive::resource::EdgeResource;
use beehive::{Content, Hive, HiveConfig, Message, Module, ModuleError};
use clap::Parser;

/// What the demo's store answers a query with: resource -> version.
type Listing = std::collections::BTreeMap<String, String>;

/// Command line.
#[derive(Parser, Debug)]
#[command(about = "beehive demo: modules, verbs and shutdown in two hives")]
struct Args {
    /// Messages to stream through the edge hive.
    #[arg(long, default_value_t = 100_000)]
    messages: usize,
}

/// Keeps the newest resource version per object, answers queries.
struct Store {
    hive: Hive,
    objects: Listing,
}

impl Actor for Store {
    type Context = Context<Self>;
}

impl Module for Store {
    fn name(&self) -> &str {
        "metamanager"
    }
    fn group(&self) -> &str {
        group::META
    }
    fn handle(&mut self, msg: Message, _ctx: &mut Context<Self>) -> Result<(), ModuleError> {
        match msg.operation() {
            operation::QUERY => {
                let answer = match Content::of(&self.objects) {
                    Ok(listing) => msg.response("metamanager", listing),
                    Err(err) => msg.error_response("metamanager", err.to_string()),
                };
                self.hive.send_resp(answer);
            }
            _ => {
                self.objects
                    .insert(msg.resource().to_owned(), msg.resource_version().to_owned());
            }
        }
        Ok(())
    }
}

/// Watches everything in its group and counts it.
struct Watcher {
    name: String,
    seen: usize,
}

impl Actor for Watcher {
    type Context = Context<Self>;
}

impl Module for Watcher {
    fn name(&self) -> &str {
        &self.name
    }
    fn group(&self) -> &str {
        group::EDGED
    }
    fn handle(&mut self, msg: Message, _ctx: &mut Context<Self>) -> Result<(), ModuleError> {
        self.seen += 1;
        if msg.is_sync() {
            tracing::info!(module = %self.name, seen = self.seen, "asked for a count");
        }
        Ok(())
    }
}

#[actix::main]
async fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let args = Args::parse();

    let config: HiveConfig = serde_json::from_value(serde_json::json!({
        "modules": {
            "metamanager": {"mailboxCapacity": 4096, "restart": {"policy": "onFailure"}},
            "edged-b": {"enable": false}
        }
    }))
    .context("demo config")?;
    let edge = Hive::new("edge", config);
    let cloud = Hive::new("cloud", HiveConfig::default());
    edge.start_module(|hive| Store {
        hive: hive.clone(),
        objects: Default::default(),
    })?;
    for name in ["edged-a", "edged-b"] {
        let outcome = edge.start_module(move |_| Watcher {
            name: name.to_owned(),
            seen: 0,
        })?;
        println!("edge module {name}: {outcome:?}");
    }
    cloud.start_module(|hive| Store {
        hive: hive.clone(),
        objects: Default::default(),
    })?;

    let started = std::time::Instant::now();
    for n in 0..args.messages {
        let pod = EdgeResource::new("default", resource_type::POD, format!("pod-{}", n % 100));
        let msg = Message::new()
            .build_router("demo", group::META, pod.to_string(), operation::UPDATE)
            .with_resource_version(n.to_string());
        edge.send("metamanager", msg).await?;
    }
    let query = Message::new().build_router("demo", group::META, "default/pod", operation::QUERY);
    let listing = edge
        .send_sync("metamanager", query, Duration::from_secs(5))
        .await?;
    let objects = listing
        .body::<Listing>()
        .map(|o| o.len())
        .unwrap_or_default();
    println!(
        "edge: {} updates coalesced into {objects} objects in {:?}",
        args.messages,
        started.elapsed()
    );
    edge.send_to_group(
        group::EDGED,
        Message::new().build_router("demo", group::EDGED, "default/pod", operation::UPDATE),
    )
    .await?;
    let cloud_view = cloud
        .send_sync(
            "metamanager",
            Message::new().build_router("demo", group::META, "default/pod", operation::QUERY),
            Duration::from_secs(5),
        )
        .await?;
    println!(
        "cloud: its own store holds {} objects (the hives share nothing)",
        cloud_view
            .body::<Listing>()
            .map(|o| o.len())
            .unwrap_or_default()
    );

    println!(
        "{:<14} {:<8} {:<8} {:>7} {:>9}",
        "module", "group", "running", "queued", "restarts"
    );
    for info in edge.modules() {
        println!(
            "{:<14} {:<8} {:<8} {:>7} {:>9}",
            info.name, info.group, info.running, info.queued, info.restarts
        );
    }
    let report = edge.shutdown().await;
    cloud.shutdown().await;
    println!("edge shut down in this order: {:?}", report.stopped);
    Ok(())
}
