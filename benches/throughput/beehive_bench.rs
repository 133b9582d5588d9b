//! `beehive` scenarios: the six verbs against the same work through raw
//! tokio channels. Everything runs on one actix arbiter (one thread), hive
//! and baseline alike, except the `_two_threads` sends: their senders run on
//! a second arbiter, as a module on its own thread sends to one on another
//! (and as Go's beehive spreads its goroutines over both cores).

use std::time::{Duration, Instant};

use actix::{Actor, Context};
use anyhow::{Context as _, Result, bail};
use beehive::{Hive, HiveConfig, Message, Module, ModuleError};
use tokio::sync::{mpsc, oneshot};

use crate::Scale;
use crate::report::{Report, median, quantile_us};

const GROUP_MEMBERS: usize = 4;
const MAILBOX: usize = 1024;

/// A fresh message per send, as a real module would build it.
fn fresh() -> Message {
    Message::new().build_router("bench", "bench", "default/pod/bench", "update")
}

/// Counts messages and reports when `target` have arrived.
struct Counter {
    name: String,
    target: usize,
    seen: usize,
    done: Option<oneshot::Sender<()>>,
}

impl Actor for Counter {
    type Context = Context<Self>;
}

impl Module for Counter {
    fn name(&self) -> &str {
        &self.name
    }
    fn group(&self) -> &str {
        "sinks"
    }
    fn handle(&mut self, _msg: Message, _ctx: &mut Context<Self>) -> Result<(), ModuleError> {
        self.seen += 1;
        if self.seen == self.target
            && let Some(done) = self.done.take()
        {
            let _ = done.send(());
        }
        Ok(())
    }
}

/// Answers every request.
struct Echo {
    hive: Hive,
}

impl Actor for Echo {
    type Context = Context<Self>;
}

impl Module for Echo {
    fn name(&self) -> &str {
        "echo"
    }
    fn group(&self) -> &str {
        "echo"
    }
    fn handle(&mut self, msg: Message, _ctx: &mut Context<Self>) -> Result<(), ModuleError> {
        self.hive
            .send_resp(msg.response("echo", beehive::Content::Empty));
        Ok(())
    }
}

fn start_counter(hive: &Hive, name: &str, target: usize) -> Result<oneshot::Receiver<()>> {
    let (done, finished) = oneshot::channel();
    let mut done = Some(done);
    let name = name.to_owned();
    hive.start_module(move |_| Counter {
        name: name.clone(),
        target,
        seen: 0,
        done: done.take(),
    })?;
    Ok(finished)
}

fn config() -> HiveConfig {
    serde_json::from_value(serde_json::json!({
        "modules": {
            "sink": {"mailboxCapacity": MAILBOX},
            "echo": {"mailboxCapacity": MAILBOX}
        }
    }))
    .unwrap_or_default()
}

/// Where the sending tasks run.
#[derive(Clone, Copy)]
enum Senders<'a> {
    /// On the receiver's arbiter: one thread does all the work.
    Beside,
    /// On an arbiter of their own: two threads.
    Apart(&'a actix::ArbiterHandle),
}

impl Senders<'_> {
    fn spawn(self, task: impl std::future::Future<Output = ()> + Send + 'static) {
        match self {
            Senders::Beside => {
                actix::spawn(task);
            }
            Senders::Apart(arbiter) => {
                arbiter.spawn(task);
            }
        }
    }
}

/// `senders` tasks send `n` messages in all to one module.
async fn hive_send(senders: usize, n: usize, place: Senders<'_>) -> Result<Duration> {
    let hive = Hive::new("bench", config());
    let finished = start_counter(&hive, "sink", n)?;
    let start = Instant::now();
    for _ in 0..senders {
        let hive = hive.clone();
        place.spawn(async move {
            for _ in 0..n / senders {
                if hive.send("sink", fresh()).await.is_err() {
                    return;
                }
            }
        });
    }
    finished.await.context("sink never saw every message")?;
    let elapsed = start.elapsed();
    hive.shutdown().await;
    Ok(elapsed)
}

/// The same through one raw bounded tokio channel.
async fn raw_send(senders: usize, n: usize, place: Senders<'_>) -> Result<Duration> {
    let (tx, mut rx) = mpsc::channel::<Message>(MAILBOX);
    let sink = actix::spawn(async move {
        let mut seen = 0;
        while rx.recv().await.is_some() {
            seen += 1;
            if seen == n {
                break;
            }
        }
        seen
    });
    let start = Instant::now();
    for _ in 0..senders {
        let tx = tx.clone();
        place.spawn(async move {
            for _ in 0..n / senders {
                if tx.send(fresh()).await.is_err() {
                    return;
                }
            }
        });
    }
    let seen = sink.await?;
    let elapsed = start.elapsed();
    if seen != n {
        bail!("raw channel delivered {seen} of {n}");
    }
    Ok(elapsed)
}

/// Round-trip latencies in nanoseconds, sorted, and the failures.
struct RoundTrips {
    sorted_ns: Vec<u64>,
    elapsed: Duration,
    lost: u64,
}

async fn hive_send_sync(n: usize) -> Result<RoundTrips> {
    let hive = Hive::new("bench", config());
    hive.start_module(|hive| Echo { hive: hive.clone() })?;
    let mut sorted_ns = Vec::with_capacity(n);
    let mut lost = 0;
    let start = Instant::now();
    for _ in 0..n {
        let t = Instant::now();
        match hive
            .send_sync("echo", fresh(), Duration::from_secs(1))
            .await
        {
            Ok(_) => sorted_ns.push(t.elapsed().as_nanos() as u64),
            Err(_) => lost += 1,
        }
    }
    let elapsed = start.elapsed();
    lost += hive.stats().late_responses;
    hive.shutdown().await;
    sorted_ns.sort_unstable();
    Ok(RoundTrips {
        sorted_ns,
        elapsed,
        lost,
    })
}

async fn raw_send_sync(n: usize) -> Result<RoundTrips> {
    let (tx, mut rx) = mpsc::channel::<(Message, oneshot::Sender<Message>)>(MAILBOX);
    actix::spawn(async move {
        while let Some((msg, reply)) = rx.recv().await {
            let _ = reply.send(msg.response("echo", beehive::Content::Empty));
        }
    });
    let mut sorted_ns = Vec::with_capacity(n);
    let mut lost = 0;
    let start = Instant::now();
    for _ in 0..n {
        let t = Instant::now();
        let (reply, response) = oneshot::channel();
        tx.send((fresh(), reply)).await?;
        match response.await {
            Ok(_) => sorted_ns.push(t.elapsed().as_nanos() as u64),
            Err(_) => lost += 1,
        }
    }
    let elapsed = start.elapsed();
    sorted_ns.sort_unstable();
    Ok(RoundTrips {
        sorted_ns,
        elapsed,
        lost,
    })
}

/// `n` group sends to four members; every member must see all `n`.
async fn hive_group(n: usize) -> Result<Duration> {
    let hive = Hive::new("bench", HiveConfig::default());
    let mut finished = Vec::new();
    for member in 0..GROUP_MEMBERS {
        finished.push(start_counter(&hive, &format!("sink{member}"), n)?);
    }
    let start = Instant::now();
    let sender = hive.clone();
    actix::spawn(async move {
        for _ in 0..n {
            if sender.send_to_group("sinks", fresh()).await.is_err() {
                return;
            }
        }
    });
    for done in finished {
        done.await.context("a member missed messages")?;
    }
    let elapsed = start.elapsed();
    hive.shutdown().await;
    Ok(elapsed)
}

async fn raw_group(n: usize) -> Result<Duration> {
    let mut txs = Vec::new();
    let mut sinks = Vec::new();
    for _ in 0..GROUP_MEMBERS {
        let (tx, mut rx) = mpsc::channel::<Message>(MAILBOX);
        txs.push(tx);
        sinks.push(actix::spawn(async move {
            let mut seen = 0;
            while rx.recv().await.is_some() {
                seen += 1;
                if seen == n {
                    break;
                }
            }
            seen
        }));
    }
    let start = Instant::now();
    actix::spawn(async move {
        for _ in 0..n {
            let msg = fresh();
            for tx in &txs {
                if tx.send(msg.clone()).await.is_err() {
                    return;
                }
            }
        }
    });
    for sink in sinks {
        if sink.await? != n {
            bail!("a raw member missed messages");
        }
    }
    Ok(start.elapsed())
}

fn rate(n: usize, elapsed: Duration) -> f64 {
    n as f64 / elapsed.as_secs_f64()
}

/// Runs every beehive scenario and adds its rows.
pub fn run(scale: Scale, report: &mut Report) -> Result<()> {
    actix::System::new().block_on(async move {
        // Warm up allocators and code paths once.
        hive_send(1, scale.messages / 10 + 4, Senders::Beside).await?;
        raw_send(1, scale.messages / 10 + 4, Senders::Beside).await?;

        let second = actix::Arbiter::new();
        let apart = Senders::Apart(&second.handle());
        for (scenario, senders, place) in [
            ("beehive/send_1to1", 1, Senders::Beside),
            ("beehive/send_4to1", 4, Senders::Beside),
            ("beehive/send_1to1_two_threads", 1, apart),
            ("beehive/send_4to1_two_threads", 4, apart),
        ] {
            let n = scale.messages / 4 * 4;
            let mut hive = Vec::new();
            let mut raw = Vec::new();
            for _ in 0..scale.runs {
                hive.push(rate(n, hive_send(senders, n, place).await?));
                raw.push(rate(n, raw_send(senders, n, place).await?));
            }
            report.with_baseline(
                scenario,
                "throughput",
                median(hive),
                "msgs/s",
                median(raw),
                "raw tokio mpsc",
            );
        }

        let mut best: Option<(RoundTrips, RoundTrips)> = None;
        for _ in 0..scale.runs {
            let hive = hive_send_sync(scale.round_trips).await?;
            let raw = raw_send_sync(scale.round_trips).await?;
            let better = best.as_ref().is_none_or(|(b, _)| hive.elapsed < b.elapsed);
            if better {
                best = Some((hive, raw));
            }
        }
        if let Some((hive, raw)) = best {
            let n = scale.round_trips;
            report.with_baseline(
                "beehive/send_sync",
                "round_trips",
                rate(hive.sorted_ns.len(), hive.elapsed),
                "rt/s",
                rate(n, raw.elapsed),
                "raw mpsc + oneshot",
            );
            report.with_baseline(
                "beehive/send_sync",
                "p50",
                quantile_us(&hive.sorted_ns, 0.50),
                "us",
                quantile_us(&raw.sorted_ns, 0.50),
                "raw mpsc + oneshot",
            );
            report.with_baseline(
                "beehive/send_sync",
                "p99",
                quantile_us(&hive.sorted_ns, 0.99),
                "us",
                quantile_us(&raw.sorted_ns, 0.99),
                "raw mpsc + oneshot",
            );
            report.with_baseline(
                "beehive/send_sync",
                "lost_responses",
                hive.lost as f64,
                "count",
                raw.lost as f64,
                "raw mpsc + oneshot",
            );
        }

        let n = scale.messages / 4;
        let mut hive = Vec::new();
        let mut raw = Vec::new();
        for _ in 0..scale.runs {
            hive.push(rate(n, hive_group(n).await?));
            raw.push(rate(n, raw_group(n).await?));
        }
        report.with_baseline(
            "beehive/group_4",
            "group_sends",
            median(hive),
            "msgs/s",
            median(raw),
            "4 raw tokio mpsc",
        );
        second.stop();
        Ok(())
    })
}
