//! A probe module for the beehive tests: reports what it sees on a channel
//! and behaves as the content of each message tells it.
#![allow(dead_code)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix::{Actor, ActorContext, AsyncContext, Context, ResponseActFuture, WrapFuture};
use beehive::{Hive, Message, Module, ModuleError, ResponseOutcome};
use serde_json::{Value, json};
use tokio::sync::{mpsc, oneshot};

/// What a probe reports.
#[derive(Debug)]
#[allow(clippy::large_enum_variant)] // A test recorder; clarity over size.
pub enum Event {
    /// A new instance was made (`instance` counts from 1).
    Born { module: String, instance: usize },
    /// A message was handled.
    Got { module: String, msg: Message },
    /// Cleanup ran.
    Cleaned { module: String },
    /// A delayed response was handed to the hive.
    Responded { outcome: ResponseOutcome },
}

/// Shared wiring for probes of one test.
#[derive(Clone)]
pub struct Probes {
    pub events: mpsc::UnboundedSender<Event>,
    /// Gates a stalled probe waits on, opened by the test.
    pub gates: Arc<Mutex<Vec<oneshot::Receiver<()>>>>,
    pub births: Arc<AtomicUsize>,
}

impl Probes {
    pub fn new() -> (Probes, mpsc::UnboundedReceiver<Event>) {
        let (events, rx) = mpsc::unbounded_channel();
        (
            Probes {
                events,
                gates: Arc::default(),
                births: Arc::default(),
            },
            rx,
        )
    }

    /// A gate for the next `stall` command; send on the returned sender to open it.
    pub fn gate(&self) -> oneshot::Sender<()> {
        let (open, gate) = oneshot::channel();
        self.gates.lock().expect("gates").push(gate);
        open
    }

    /// A factory for a probe module named `name` in `group`.
    pub fn factory(
        &self,
        name: &str,
        group: &str,
        cleanup: Cleanup,
    ) -> impl FnMut(&Hive) -> Probe + 'static {
        let probes = self.clone();
        let (name, group) = (name.to_owned(), group.to_owned());
        move |hive| {
            let instance = probes.births.fetch_add(1, Ordering::SeqCst) + 1;
            let _ = probes.events.send(Event::Born {
                module: name.clone(),
                instance,
            });
            Probe {
                name: name.clone(),
                group: group.clone(),
                hive: hive.clone(),
                probes: probes.clone(),
                cleanup,
            }
        }
    }
}

/// How a probe's cleanup behaves.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Cleanup {
    /// Reports and finishes.
    Quick,
    /// Never finishes.
    Hang,
}

pub struct Probe {
    name: String,
    group: String,
    hive: Hive,
    probes: Probes,
    cleanup: Cleanup,
}

impl Actor for Probe {
    type Context = Context<Self>;
}

/// A command message for a probe.
pub fn cmd(cmd: &str) -> Message {
    Message::new()
        .build_router("test", "", "default/probe/x", "update")
        .with_content(beehive::Content::of(&json!({ "cmd": cmd })).expect("json body"))
}

/// A numbered message from sender `from`.
pub fn seq(from: usize, n: usize) -> Message {
    Message::new()
        .build_router("test", "", "default/probe/x", "update")
        .with_content(beehive::Content::of(&json!({ "from": from, "n": n })).expect("json body"))
}

impl Module for Probe {
    fn name(&self) -> &str {
        &self.name
    }
    fn group(&self) -> &str {
        &self.group
    }
    fn handle(&mut self, msg: Message, ctx: &mut Context<Self>) -> Result<(), ModuleError> {
        let command = msg
            .body::<Value>()
            .ok()
            .and_then(|body| body.get("cmd").and_then(Value::as_str).map(str::to_owned));
        let sync = msg.is_sync();
        let reply = msg.response(
            self.name.clone(),
            beehive::Content::of(&json!({ "from": self.name })).expect("json body"),
        );
        let _ = self.probes.events.send(Event::Got {
            module: self.name.clone(),
            msg,
        });
        match command.as_deref() {
            Some("fail") => return Err(ModuleError::new("told to fail")),
            Some("panic") => panic!("told to panic"),
            Some("stop") => ctx.stop(),
            Some("silent") => return Ok(()),
            Some("stall") => {
                let gate = self.probes.gates.lock().expect("gates").pop();
                if let Some(gate) = gate {
                    ctx.wait(
                        async move {
                            let _ = gate.await;
                        }
                        .into_actor(self),
                    );
                }
            }
            Some("respond-later") => {
                let hive = self.hive.clone();
                let events = self.probes.events.clone();
                let gate = self.probes.gates.lock().expect("gates").pop();
                actix::spawn(async move {
                    if let Some(gate) = gate {
                        let _ = gate.await;
                    }
                    let outcome = hive.send_resp(reply);
                    let _ = events.send(Event::Responded { outcome });
                });
                return Ok(());
            }
            _ => {}
        }
        if sync {
            self.hive.send_resp(reply);
        }
        Ok(())
    }
    fn cleanup(&mut self, _ctx: &mut Context<Self>) -> ResponseActFuture<Self, ()> {
        let _ = self.probes.events.send(Event::Cleaned {
            module: self.name.clone(),
        });
        match self.cleanup {
            Cleanup::Quick => Box::pin(actix::fut::ready(())),
            Cleanup::Hang => Box::pin(std::future::pending::<()>().into_actor(self)),
        }
    }
}

/// The next event, or a panic if none comes within 20 s (a hang, not a timing assertion).
pub async fn next(events: &mut mpsc::UnboundedReceiver<Event>) -> Event {
    tokio::time::timeout(Duration::from_secs(20), events.recv())
        .await
        .expect("no event within 20 s")
        .expect("event channel closed")
}

/// The next `Got` event's message, skipping other events.
pub async fn next_got(events: &mut mpsc::UnboundedReceiver<Event>) -> (String, Message) {
    loop {
        if let Event::Got { module, msg } = next(events).await {
            return (module, msg);
        }
    }
}
