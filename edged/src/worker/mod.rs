//! `PodWorker`: one task per pod that brings what containerd runs in line
//! with the pod's spec, one sync at a time, and reports the pod's status
//! when it changes.
//!
//! The worker is the I/O around two plain pieces: [`PodBook::plan`]
//! decides what a sync does (init order, restarts and their back-off,
//! probes' effects, image pulls; [`actions::sandbox_plan`] the sandbox) and [`pod_status`] what the
//! status says; the worker lists the runtime, runs the probes, carries the
//! actions out through CRI and tells the book how each start went.
//! Containers already running with the same spec are left alone: that is
//! how a restarted edged adopts them. A worker wakes on a new spec, on the
//! PLEG's word that something changed in the runtime, and when a back-off
//! ends.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use apis::k8s::{Container, Pod, PodSpec, PodStatus};
use beehive::constants::{group, module, operation};
use beehive::{Hive, Message as HiveMessage};
use tokio::sync::mpsc;
use tracing::{debug, info, warn};

use crate::actions::{self, Action, Limits, PodBook, PullPolicy, Removal, SandboxPlan, earliest};
use crate::config::EdgedConfig;
use crate::cri::{Cri, CriError, api};
use crate::observed::{Observed, SandboxSeen, Seen};
use crate::probes::{Prober, Verdict};
use crate::server::PodsView;
use crate::spec::{self, Objects, POD_UID};
use crate::status::{Placement, SandboxInfo, pod_status};
use crate::teardown::{Terminating, say_terminated, teardown};
use crate::volumes;

mod report;

/// What a worker is told.
#[derive(Debug)]
pub enum Signal {
    /// The pod's spec, new or changed.
    Spec(Box<Pod>),
    /// The runtime changed for this pod (from the PLEG).
    Relist,
    /// The pod was deleted: tear it down, say so to the cloud, and stop.
    Delete,
    /// A configmap or secret in the pod's namespace changed: its volume
    /// files are written again (as the kubelet does, running containers
    /// see the new content).
    Objects,
}

/// One pod's worker.
pub struct PodWorker {
    pod: Pod,
    cri: Cri,
    hive: Hive,
    config: Arc<EdgedConfig>,
    limits: Limits,
    objects: Arc<RwLock<Objects>>,
    /// The pod's decisions and what they remember between syncs.
    book: PodBook,
    sandbox: Option<SandboxInfo>,
    sandbox_error: Option<String>,
    last_status: Option<PodStatus>,
    deleting: bool,
    prober: Prober,
    /// What edged's server shows.
    view: PodsView,
    /// Whether to look for a finished status from before this edged (for
    /// pods loaded at start-up only).
    recall: bool,
    /// The pod's configmaps or secrets may have changed since its volume
    /// files were written.
    refresh_volumes: bool,
    /// Pods being torn down, by uid (garbage collection leaves them be).
    terminating: Terminating,
}

impl PodWorker {
    /// A worker for `pod`.
    pub fn new(
        pod: Pod,
        cri: Cri,
        hive: Hive,
        config: Arc<EdgedConfig>,
        objects: Arc<RwLock<Objects>>,
    ) -> Self {
        PodWorker {
            pod,
            cri,
            hive,
            limits: Limits::from(config.as_ref()),
            config,
            objects,
            book: PodBook::default(),
            sandbox: None,
            sandbox_error: None,
            last_status: None,
            deleting: false,
            prober: Prober::default(),
            view: PodsView::default(),
            recall: false,
            refresh_volumes: false,
            terminating: Terminating::default(),
        }
    }

    /// Has the worker look for a finished status from before this edged
    /// started (a pod loaded from the store at start-up).
    pub fn recalling(mut self) -> Self {
        self.recall = true;
        // A configmap may have changed while edged was down.
        self.refresh_volumes = true;
        self
    }

    /// Shows this pod, with its status, in `view`, and marks its teardown
    /// done in `terminating`.
    pub fn with_view(mut self, view: PodsView, terminating: Terminating) -> Self {
        self.view = view;
        self.terminating = terminating;
        self
    }

    /// Runs until the pod is deleted and torn down (or nobody can signal).
    pub async fn run(mut self, mut signals: mpsc::Receiver<Signal>) {
        let key = spec::pod_key(&self.pod);
        if self.recall {
            self.recall_finished().await;
        }
        loop {
            let (wake, synced) = match self.sync().await {
                Ok(wake) => (wake, true),
                Err(err) => {
                    warn!(pod = %key, error = %err, "pod sync failed; trying again");
                    (Some(Instant::now() + self.config.backoff_initial), false)
                }
            };
            // Done only once the teardown itself succeeded; until then the
            // pod stays terminating and the teardown is tried again.
            if self.deleting && synced {
                if let Ok(mut view) = self.view.write()
                    && view
                        .get(&key)
                        .is_some_and(|pod| spec::pod_uid(pod) == self.uid())
                {
                    view.remove(&key);
                }
                if let Ok(mut terminating) = self.terminating.lock() {
                    terminating.remove(&self.uid());
                }
                info!(pod = %key, "pod torn down");
                let namespace = self.pod.metadata.namespace.as_deref().unwrap_or("default");
                let name = self.pod.metadata.name.as_deref().unwrap_or_default();
                say_terminated(&self.hive, namespace, name, Some(self.uid())).await;
                return;
            }
            self.report().await;
            let sleep = async {
                match wake {
                    Some(at) => tokio::time::sleep_until(at.into()).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                signal = signals.recv() => {
                    let Some(signal) = signal else { return };
                    self.take(signal);
                    // Several signals in a row make one sync.
                    while let Ok(signal) = signals.try_recv() {
                        self.take(signal);
                    }
                }
                () = sleep => {}
            }
        }
    }

    /// One more than the highest attempt with a log on disk (0 if none):
    /// after a restart of edged and a lost sandbox, attempts go on from
    /// there rather than from 0.
    fn logged_attempts(&self, container: &str) -> u32 {
        let dir = self
            .config
            .pod_dir(&self.uid())
            .join("logs")
            .join(container);
        std::fs::read_dir(dir)
            .into_iter()
            .flatten()
            .filter_map(|entry| {
                let name = entry.ok()?.file_name().into_string().ok()?;
                name.strip_suffix(".log")?.parse::<u32>().ok()
            })
            .max()
            .map_or(0, |highest| highest + 1)
    }

    fn take(&mut self, signal: Signal) {
        match signal {
            Signal::Spec(pod) => self.pod = *pod,
            Signal::Relist => {}
            Signal::Delete => self.deleting = true,
            Signal::Objects => self.refresh_volumes = true,
        }
    }

    fn uid(&self) -> String {
        spec::pod_uid(&self.pod)
    }

    /// One pass; when to pass again without a signal (a back-off's end, a
    /// probe due).
    async fn sync(&mut self) -> Result<Option<Instant>, CriError> {
        if self.deleting {
            self.teardown().await?;
            return Ok(None);
        }
        let Some(spec) = self.pod.spec.clone() else {
            return Ok(None);
        };
        // A pod that has finished stays finished: its containers are not
        // run again, even if its sandbox is gone (after a reboot, say).
        if self.finished() {
            return Ok(None);
        }
        let sandbox = match self.ensure_sandbox().await {
            Ok(id) => {
                self.sandbox_error = None;
                id
            }
            Err(err) => {
                self.sandbox_error = Some(err.to_string());
                return Err(err);
            }
        };
        if std::mem::take(&mut self.refresh_volumes) {
            let objects = self.objects.read().map(|o| o.clone()).unwrap_or_default();
            let pod_dir = self.config.pod_dir(&self.uid());
            if let Err(err) = volumes::prepare(&self.pod, &pod_dir, &objects) {
                warn!(pod = %spec::pod_key(&self.pod), error = %err.message, "volumes not refreshed; trying again");
                self.refresh_volumes = true;
            }
        }
        let observed = self.observe(&sandbox).await?;
        let verdicts = self.probe(&spec, &observed).await;
        let plan = self.book.plan(
            &spec::pod_key(&self.pod),
            &spec,
            observed,
            &verdicts,
            Instant::now(),
            &self.limits,
        );
        let mut wake = plan.wake;
        // Each action's failure is the book's to note (a back-off, a
        // waiting reason): the rest of the plan still runs, as planned.
        for action in plan.actions {
            wake = earliest(wake, self.act(&sandbox, &spec, action).await);
        }
        Ok(wake)
    }

    /// Runs the due probes of the containers running with their spec.
    async fn probe(
        &mut self,
        spec: &PodSpec,
        observed: &HashMap<String, Observed>,
    ) -> HashMap<String, Verdict> {
        let host = match &self.sandbox {
            Some(sandbox) if !sandbox.ip.is_empty() => sandbox.ip.clone(),
            _ => "127.0.0.1".to_owned(),
        };
        let mut verdicts = HashMap::new();
        for (container, seen) in PodBook::to_probe(spec, observed) {
            let verdict = self
                .prober
                .check(&self.cri, container, &seen.id, seen.started_at, &host)
                .await;
            verdicts.insert(container.name.clone(), verdict);
        }
        verdicts
    }

    /// Carries one action out; when to look again, if it says.
    async fn act(&mut self, sandbox: &str, spec: &PodSpec, action: Action) -> Option<Instant> {
        match action {
            Action::Remove { id, grace, why } => {
                if why == Removal::SpecChanged {
                    info!(pod = %spec::pod_key(&self.pod), container = %id, "spec changed; container replaced");
                }
                self.cri.remove_container(&id, grace).await;
                None
            }
            Action::StartCreated { name, id } => {
                let mut runtime = self.cri.runtime.clone();
                let started = runtime
                    .start_container(api::StartContainerRequest { container_id: id })
                    .await;
                match started {
                    Ok(_) => {
                        self.book.started(&name);
                        None
                    }
                    Err(status) => {
                        let message = status.message().to_owned();
                        let wake = self.book.start_failed(
                            &name,
                            "RunContainerError",
                            message,
                            Instant::now(),
                            &self.limits,
                        );
                        Some(wake)
                    }
                }
            }
            Action::Kill {
                name,
                id,
                grace,
                reason,
            } => {
                info!(pod = %spec::pod_key(&self.pod), container = %name, %reason, "killing the container");
                let mut runtime = self.cri.runtime.clone();
                let _ = runtime
                    .stop_container(api::StopContainerRequest {
                        container_id: id,
                        timeout: grace,
                    })
                    .await;
                None
            }
            Action::Start {
                name,
                init,
                attempt,
                pull,
            } => {
                let found = actions::containers(spec).find(|(c, i)| c.name == name && *i == init);
                let (container, _) = found?;
                self.start(sandbox, container, attempt, pull).await
            }
        }
    }

    /// The ready sandbox of this pod, made (again) if there is none.
    async fn ensure_sandbox(&mut self) -> Result<String, CriError> {
        let sandboxes = self.cri.sandboxes(POD_UID, &self.uid()).await?;
        let seen: Vec<SandboxSeen> = sandboxes
            .iter()
            .map(|s| SandboxSeen {
                id: s.id.clone(),
                ready: s.state == api::PodSandboxState::SandboxReady as i32,
                created_at: s.created_at,
                attempt: s.metadata.as_ref().map_or(0, |m| m.attempt),
            })
            .collect();
        let attempt = match actions::sandbox_plan(&seen) {
            SandboxPlan::Keep { id, remove } => {
                for dead in &remove {
                    self.cri.remove_sandbox(dead).await;
                }
                if self.sandbox.as_ref().is_none_or(|known| known.id != id) {
                    let status = self.cri.sandbox_status(&id).await?;
                    self.sandbox = Some(SandboxInfo::of(&id, status));
                }
                return Ok(id);
            }
            SandboxPlan::Create { attempt, remove } => {
                for dead in &remove {
                    self.cri.remove_sandbox(dead).await;
                }
                attempt
            }
        };
        self.cri
            .pull(&self.config.pause_image, PullPolicy::IfNotPresent)
            .await?;
        let log_dir = self.config.pod_dir(&self.uid()).join("logs");
        if let Err(err) = std::fs::create_dir_all(&log_dir) {
            warn!(dir = %log_dir.display(), error = %err, "pod log directory");
        }
        let config = spec::sandbox_config(&self.pod, &self.config.node, &log_dir, attempt);
        let mut runtime = self.cri.runtime.clone();
        let id = runtime
            .run_pod_sandbox(api::RunPodSandboxRequest {
                config: Some(config),
                runtime_handler: String::new(),
            })
            .await
            .map_err(CriError::call("RunPodSandbox"))?
            .into_inner()
            .pod_sandbox_id;
        info!(pod = %spec::pod_key(&self.pod), sandbox = %id, "sandbox started");
        let status = self.cri.sandbox_status(&id).await?;
        if status.state != api::PodSandboxState::SandboxReady as i32 {
            // Not ready at once: the next sync, after the retry delay,
            // removes it and tries again (no tight loop).
            return Err(CriError::Call {
                call: "RunPodSandbox",
                status: tonic::Status::unavailable(format!("sandbox {id} is not ready")),
            });
        }
        self.sandbox = Some(SandboxInfo::of(&id, status));
        Ok(id)
    }

    /// This pod's containers in `sandbox`, by name.
    async fn observe(&self, sandbox: &str) -> Result<HashMap<String, Observed>, CriError> {
        let mut runtime = self.cri.runtime.clone();
        let containers = self
            .cri
            .containers(POD_UID, &self.uid(), Some(sandbox))
            .await?;
        let mut seen = Vec::with_capacity(containers.len());
        for container in containers {
            let status = runtime
                .container_status(api::ContainerStatusRequest {
                    container_id: container.id.clone(),
                    verbose: false,
                })
                .await
                .map_err(CriError::call("ContainerStatus"))?
                .into_inner()
                .status;
            if let Some(status) = status {
                seen.push((Seen::name_of(&status), Seen::from_cri(&status)));
            }
        }
        Ok(Observed::group(seen))
    }

    /// Pulls as `pull` says, makes and starts `container` as `attempt` (or
    /// past the attempts logged on disk); when to look again if it failed.
    async fn start(
        &mut self,
        sandbox: &str,
        container: &Container,
        attempt: u32,
        pull: PullPolicy,
    ) -> Option<Instant> {
        let name = &container.name;
        let attempt = attempt.max(self.logged_attempts(name));
        let image = container.image.clone().unwrap_or_default();
        let now = Instant::now();
        let image_ref = match self.cri.pull(&image, pull).await {
            Ok(image_ref) => {
                self.book.pulled(name);
                self.prober.forget(name);
                image_ref
            }
            Err(err) => {
                let wake = self
                    .book
                    .pull_failed(name, pull, err.to_string(), now, &self.limits);
                return Some(wake);
            }
        };
        let objects = self.objects.read().map(|o| o.clone()).unwrap_or_default();
        let pod_dir = self.config.pod_dir(&self.uid());
        let configured = volumes::prepare(&self.pod, &pod_dir, &objects)
            .and_then(|prepared| volumes::mounts(container, &prepared))
            .and_then(|mounts| {
                let mut config = spec::container_config(
                    &self.pod,
                    &self.config.node,
                    container,
                    &image_ref,
                    attempt,
                    &objects,
                )?;
                config.mounts = mounts;
                Ok(config)
            });
        let config = match configured {
            Ok(config) => config,
            Err(err) => {
                let wake =
                    self.book
                        .start_failed(name, &err.reason, err.message, now, &self.limits);
                return Some(wake);
            }
        };
        let log_dir = self.config.pod_dir(&self.uid()).join("logs");
        let sandbox_config = spec::sandbox_config(&self.pod, &self.config.node, &log_dir, 0);
        let mut runtime = self.cri.runtime.clone();
        let created = runtime
            .create_container(api::CreateContainerRequest {
                pod_sandbox_id: sandbox.to_owned(),
                config: Some(config),
                sandbox_config: Some(sandbox_config),
            })
            .await;
        let id = match created {
            Ok(created) => {
                self.book.created(name, attempt);
                created.into_inner().container_id
            }
            Err(status) => {
                let message = status.message().to_owned();
                let wake = self.book.start_failed(
                    name,
                    "CreateContainerError",
                    message,
                    now,
                    &self.limits,
                );
                return Some(wake);
            }
        };
        if let Err(status) = runtime
            .start_container(api::StartContainerRequest {
                container_id: id.clone(),
            })
            .await
        {
            let message = status.message().to_owned();
            let wake =
                self.book
                    .start_failed(name, "RunContainerError", message, now, &self.limits);
            return Some(wake);
        }
        self.book.started(name);
        debug!(pod = %spec::pod_key(&self.pod), container = %name, attempt, %id, "container started");
        None
    }

    fn grace(&self) -> i64 {
        self.pod.spec.as_ref().map_or(30, actions::grace)
    }

    /// Stops every container with the pod's grace period, then removes the
    /// sandboxes (and with them the containers) and the pod's directory.
    async fn teardown(&mut self) -> Result<(), CriError> {
        teardown(&self.cri, &self.config, &self.uid(), self.grace()).await
    }

    /// The pod's status from what the runtime shows now.
    async fn status(&self) -> PodStatus {
        let spec = self.pod.spec.clone().unwrap_or_default();
        let observed = match &self.sandbox {
            Some(sandbox) => self.observe(&sandbox.id).await.unwrap_or_default(),
            None => HashMap::new(),
        };
        let placement = Placement {
            sandbox: self.sandbox.as_ref(),
            sandbox_error: self.sandbox_error.as_deref(),
            node_ip: &self.config.node_ip,
        };
        pod_status(&spec, &observed, &self.book, placement)
    }
}
