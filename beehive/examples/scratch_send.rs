//! Scratch timing of the hive's async send, as the throughput bench's
//! `beehive/send_1to1` and `beehive/send_4to1` rows measure it: one actix
//! System (one thread), a fresh message per send, a mailbox of 1,024, timing
//! from before the senders are spawned until the module has received all.
//!
//! `cargo run --release -p beehive --example scratch_send -- [n] [rounds] [scenarios]`
//! e.g. `-- 2000000 3 1to1,4to1`.

use std::time::{Duration, Instant};

use actix::{Actor, Context};
use beehive::{Hive, HiveConfig, Message, Module, ModuleError};
use tokio::sync::oneshot;

fn fresh() -> Message {
    Message::new().build_router("bench", "bench", "default/pod/bench", "update")
}

struct Counter {
    target: usize,
    seen: usize,
    done: Option<oneshot::Sender<()>>,
}

impl Actor for Counter {
    type Context = Context<Self>;
}

impl Module for Counter {
    fn name(&self) -> &str {
        "sink"
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

async fn hive_send(senders: usize, n: usize) -> Duration {
    let hive = Hive::new("bench", HiveConfig::default());
    let (done, finished) = oneshot::channel();
    let mut done = Some(done);
    hive.start_module(move |_| Counter {
        target: n,
        seen: 0,
        done: done.take(),
    })
    .expect("start sink");
    let start = Instant::now();
    for _ in 0..senders {
        let hive = hive.clone();
        actix::spawn(async move {
            for _ in 0..n / senders {
                if hive.send("sink", fresh()).await.is_err() {
                    return;
                }
            }
        });
    }
    finished.await.expect("sink saw every message");
    let elapsed = start.elapsed();
    hive.shutdown().await;
    elapsed
}

fn main() {
    let mut args = std::env::args().skip(1);
    let n: usize = args.next().map_or(2_000_000, |a| a.parse().expect("n")) / 4 * 4;
    let rounds: usize = args.next().map_or(3, |a| a.parse().expect("rounds"));
    let scenarios = args.next().unwrap_or_else(|| "1to1,4to1".to_owned());
    actix::System::new().block_on(async move {
        hive_send(1, n / 10 / 4 * 4 + 4).await;
        println!("edgehive n={n}");
        for scenario in scenarios.split(',') {
            let senders = match scenario {
                "1to1" => 1,
                "4to1" => 4,
                other => panic!("unknown scenario {other}"),
            };
            for round in 0..rounds {
                let elapsed = hive_send(senders, n).await;
                println!(
                    "rs  send_{scenario} round {round}: {:.3} M msgs/s ({elapsed:?})",
                    n as f64 / elapsed.as_secs_f64() / 1e6
                );
            }
        }
    });
}
