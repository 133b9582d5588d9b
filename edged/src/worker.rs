//! `PodWorker`: one task per pod that brings what containerd runs in line
//! with the pod's spec, one sync at a time, and reports the pod's status
//! when it changes.
//!
//! A sync: the sandbox (created, or re-created if it died), then init
//! containers one by one, then the containers; a container that exited is
//! restarted as `restartPolicy` says, after a crash-loop backoff; an image
//! is pulled as `imagePullPolicy` says. Containers already running with the
//! same spec are left alone: that is how a restarted edged adopts them.
//! A worker wakes on a new spec, on the PLEG's word that something changed
//! in the runtime, and when a backoff ends.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use apis::termination::PodTerminated;
use beehive::constants::{group, module, operation};
use beehive::{Hive, Message as HiveMessage};
use k8s_openapi::api::core::v1::{
    Container, ContainerState, ContainerStateRunning, ContainerStateTerminated,
    ContainerStateWaiting, ContainerStatus, Pod, PodCondition, PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use tokio::sync::mpsc;
use tracing::{debug, info, warn};

use crate::config::EdgedConfig;
use crate::cri::{Cri, CriError, api};
use crate::probes::Prober;
use crate::server::PodsView;
use crate::spec::{self, CONTAINER_NAME, Objects, POD_UID, SPEC_HASH};
use crate::volumes;

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

/// A container that is not running for a reason of edged's (a pull that
/// failed, a config that cannot be made, a backoff).
#[derive(Debug, Clone, PartialEq)]
struct Waiting {
    reason: String,
    message: String,
}

/// Per container: restarts and pulls that failed, and when the next may be
/// tried.
#[derive(Debug, Default, Clone)]
struct Backoff {
    failures: u32,
    until: Option<Instant>,
}

impl Backoff {
    fn ready(&self, now: Instant) -> bool {
        self.until.is_none_or(|until| until <= now)
    }

    fn fail(&mut self, now: Instant, initial: Duration, max: Duration) {
        let delay = initial
            .saturating_mul(2u32.saturating_pow(self.failures.min(16)))
            .min(max);
        self.failures += 1;
        self.until = Some(now + delay);
    }
}

/// The latest container of one name, and the ones before it.
#[derive(Debug, Default)]
struct Observed {
    latest: Option<api::ContainerStatus>,
    older: Vec<String>,
}

/// One pod's worker.
pub struct PodWorker {
    pod: Pod,
    cri: Cri,
    hive: Hive,
    config: Arc<EdgedConfig>,
    objects: Arc<RwLock<Objects>>,
    waiting: HashMap<String, Waiting>,
    restarts: HashMap<String, Backoff>,
    pulls: HashMap<String, Backoff>,
    sandbox: Option<(String, String, i64)>,
    sandbox_error: Option<String>,
    last_status: Option<PodStatus>,
    deleting: bool,
    prober: Prober,
    /// What the probes say of each container's readiness.
    ready: HashMap<String, bool>,
    /// What edged's server shows.
    view: PodsView,
    /// Whether to look for a finished status from before this edged (for
    /// pods loaded at start-up only).
    recall: bool,
    /// The pod's configmaps or secrets may have changed since its volume
    /// files were written.
    refresh_volumes: bool,
    /// The last attempt started of each container.
    attempts: HashMap<String, u32>,
    /// Pods being torn down, by uid (garbage collection leaves them be).
    terminating: Terminating,
}

/// Uids of pods being torn down.
pub type Terminating = Arc<std::sync::Mutex<std::collections::HashSet<String>>>;

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
            config,
            objects,
            waiting: HashMap::new(),
            restarts: HashMap::new(),
            pulls: HashMap::new(),
            sandbox: None,
            sandbox_error: None,
            last_status: None,
            deleting: false,
            prober: Prober::default(),
            ready: HashMap::new(),
            view: PodsView::default(),
            recall: false,
            refresh_volumes: false,
            attempts: HashMap::new(),
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

    /// Whether the pod has finished (Succeeded or Failed) here.
    fn finished(&self) -> bool {
        self.last_status
            .as_ref()
            .and_then(|s| s.phase.as_deref())
            .is_some_and(|phase| phase == "Succeeded" || phase == "Failed")
    }

    /// A pod that finished before this edged started (its status in the
    /// store says so, and a sandbox of its uid exists, so it ran here) stays
    /// finished, even if a reboot took its sandbox: it is not run again.
    async fn recall_finished(&mut self) {
        let namespace = self
            .pod
            .metadata
            .namespace
            .clone()
            .unwrap_or_else(|| "default".to_owned());
        let name = self.pod.metadata.name.clone().unwrap_or_default();
        let query = HiveMessage::new().build_router(
            module::EDGED,
            group::META,
            format!("{namespace}/podstatus/{name}"),
            operation::QUERY,
        );
        let Ok(answer) = self
            .hive
            .send_sync(module::METAMANAGER, query, Duration::from_secs(10))
            .await
        else {
            return;
        };
        if answer.operation() == operation::ERROR {
            return;
        }
        let Ok(status) = <PodStatus as serde::Deserialize>::deserialize(answer.content()) else {
            return;
        };
        let terminal = matches!(status.phase.as_deref(), Some("Succeeded" | "Failed"));
        let ran_here = self
            .cri
            .sandboxes(POD_UID, &self.uid())
            .await
            .is_ok_and(|sandboxes| !sandboxes.is_empty());
        if terminal && ran_here {
            info!(pod = %spec::pod_key(&self.pod), "finished before this edged started; not run again");
            self.last_status = Some(status);
        }
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

    fn restart_policy(&self) -> &str {
        self.pod
            .spec
            .as_ref()
            .and_then(|s| s.restart_policy.as_deref())
            .unwrap_or("Always")
    }

    /// One pass; when to pass again without a signal (a backoff's end).
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
        let sandbox_id = match self.ensure_sandbox().await {
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
        let mut observed = self.observe(&sandbox_id).await?;
        let mut wake: Option<Instant> = None;
        let mut earliest = |at: Option<Instant>| {
            if let Some(at) = at {
                wake = Some(wake.map_or(at, |w: Instant| w.min(at)));
            }
        };
        // Containers of names no longer in the spec go.
        let names: Vec<&str> = spec
            .init_containers
            .iter()
            .flatten()
            .chain(spec.containers.iter())
            .map(|c| c.name.as_str())
            .collect();
        let strays: Vec<String> = observed
            .keys()
            .filter(|name| !names.contains(&name.as_str()))
            .cloned()
            .collect();
        for name in strays {
            if let Some(seen) = observed.remove(&name) {
                let ids = seen.latest.iter().map(|s| s.id.clone()).chain(seen.older);
                for id in ids {
                    self.remove_container(&id, 0).await;
                }
            }
        }
        let mut initialized = true;
        for container in spec.init_containers.iter().flatten() {
            let seen = observed.remove(&container.name).unwrap_or_default();
            let state = seen.latest.as_ref().map(|s| (s.state, s.exit_code));
            match state {
                Some((state, 0)) if state == api::ContainerState::ContainerExited as i32 => {
                    continue;
                }
                Some((state, _))
                    if state == api::ContainerState::ContainerExited as i32
                        && self.restart_policy() == "Never" =>
                {
                    initialized = false;
                    break;
                }
                _ => {
                    initialized = false;
                    earliest(
                        self.run_container(&sandbox_id, container, seen, true)
                            .await?,
                    );
                    break;
                }
            }
        }
        if initialized {
            for container in &spec.containers {
                let seen = observed.remove(&container.name).unwrap_or_default();
                earliest(
                    self.run_container(&sandbox_id, container, seen, false)
                        .await?,
                );
            }
        }
        Ok(wake)
    }

    /// The ready sandbox of this pod, created (again) if there is none.
    async fn ensure_sandbox(&mut self) -> Result<String, CriError> {
        let mut runtime = self.cri.runtime.clone();
        let sandboxes = self.cri.sandboxes(POD_UID, &self.uid()).await?;
        let ready = sandboxes
            .iter()
            .filter(|s| s.state == api::PodSandboxState::SandboxReady as i32)
            .max_by_key(|s| s.created_at);
        if let Some(sandbox) = ready {
            let id = sandbox.id.clone();
            for dead in sandboxes.iter().filter(|s| s.id != id) {
                self.remove_sandbox(&dead.id).await;
            }
            if self
                .sandbox
                .as_ref()
                .is_none_or(|(known, _, _)| *known != id)
            {
                let status = self.cri.sandbox_status(&id).await?;
                let ip = status.network.map(|n| n.ip).unwrap_or_default();
                self.sandbox = Some((id.clone(), ip, status.created_at));
            }
            return Ok(id);
        }
        let attempt = sandboxes
            .iter()
            .filter_map(|s| s.metadata.as_ref().map(|m| m.attempt + 1))
            .max()
            .unwrap_or(0);
        for dead in &sandboxes {
            self.remove_sandbox(&dead.id).await;
        }
        self.pull(&self.config.pause_image.clone(), "IfNotPresent")
            .await?;
        let log_dir = self.config.pod_dir(&self.uid()).join("logs");
        if let Err(err) = std::fs::create_dir_all(&log_dir) {
            warn!(dir = %log_dir.display(), error = %err, "pod log directory");
        }
        let config = spec::sandbox_config(&self.pod, &self.config.node, &log_dir, attempt);
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
        let ip = status.network.map(|n| n.ip).unwrap_or_default();
        self.sandbox = Some((id.clone(), ip, status.created_at));
        Ok(id)
    }

    /// This pod's containers in `sandbox`, by name.
    async fn observe(&mut self, sandbox: &str) -> Result<HashMap<String, Observed>, CriError> {
        let mut runtime = self.cri.runtime.clone();
        let containers = self
            .cri
            .containers(POD_UID, &self.uid(), Some(sandbox))
            .await?;
        let mut by_name: HashMap<String, Vec<api::ContainerStatus>> = HashMap::new();
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
                let name = status
                    .labels
                    .get(CONTAINER_NAME)
                    .cloned()
                    .unwrap_or_default();
                by_name.entry(name).or_default().push(status);
            }
        }
        Ok(by_name
            .into_iter()
            .map(|(name, mut all)| {
                all.sort_by_key(|s| s.metadata.as_ref().map_or(0, |m| m.attempt));
                let latest = all.pop();
                let older = all.into_iter().map(|s| s.id).collect();
                (name, Observed { latest, older })
            })
            .collect())
    }

    /// Brings one container to what the spec wants; when to look again.
    async fn run_container(
        &mut self,
        sandbox: &str,
        container: &Container,
        seen: Observed,
        init: bool,
    ) -> Result<Option<Instant>, CriError> {
        // Dead containers beyond the policy's number go, oldest first (the
        // latest is always kept, for its logs).
        let keep = self.config.max_dead_per_container.saturating_sub(1);
        let excess = seen.older.len().saturating_sub(keep);
        for id in &seen.older[..excess] {
            self.remove_container(id, 0).await;
        }
        let now = Instant::now();
        let Some(latest) = seen.latest else {
            return self.start(sandbox, container, 0).await;
        };
        let attempt = latest.metadata.as_ref().map_or(0, |m| m.attempt);
        let same_spec = latest.labels.get(SPEC_HASH) == Some(&spec::spec_hash(container));
        let state = latest.state;
        if state == api::ContainerState::ContainerRunning as i32 {
            if same_spec {
                self.waiting.remove(&container.name);
                // Stable long enough: the crash-loop backoff starts over.
                let ran_for = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap_or_default()
                    .saturating_sub(Duration::from_nanos(
                        u64::try_from(latest.started_at).unwrap_or(0),
                    ));
                if ran_for > self.config.backoff_max * 2 {
                    self.restarts.remove(&container.name);
                }
                let host = match &self.sandbox {
                    Some((_, ip, _)) if !ip.is_empty() => ip.clone(),
                    _ => "127.0.0.1".to_owned(),
                };
                let verdict = self
                    .prober
                    .check(&self.cri, container, &latest.id, latest.started_at, &host)
                    .await;
                self.ready.insert(container.name.clone(), verdict.ready);
                if let Some(reason) = verdict.kill {
                    info!(pod = %spec::pod_key(&self.pod), container = %container.name, %reason, "killing the container");
                    let mut runtime = self.cri.runtime.clone();
                    let _ = runtime
                        .stop_container(api::StopContainerRequest {
                            container_id: latest.id.clone(),
                            timeout: self.grace(),
                        })
                        .await;
                    // The next pass restarts it as the policy says.
                    return Ok(Some(Instant::now()));
                }
                return Ok(verdict.next);
            }
            info!(container = %container.name, "spec changed; container replaced");
            self.remove_container(&latest.id, self.grace()).await;
            return self.start(sandbox, container, attempt + 1).await;
        }
        if state == api::ContainerState::ContainerCreated as i32 {
            let mut runtime = self.cri.runtime.clone();
            runtime
                .start_container(api::StartContainerRequest {
                    container_id: latest.id.clone(),
                })
                .await
                .map_err(CriError::call("StartContainer"))?;
            return Ok(None);
        }
        // Exited (or unknown): restart if the policy says so.
        let restart = match self.restart_policy() {
            "Never" => false,
            "OnFailure" => latest.exit_code != 0,
            _ => !init || latest.exit_code != 0,
        } || !same_spec;
        if !restart {
            self.waiting.remove(&container.name);
            return Ok(None);
        }
        let backoff = self.restarts.entry(container.name.clone()).or_default();
        if !backoff.ready(now) {
            self.waiting.insert(
                container.name.clone(),
                Waiting {
                    reason: "CrashLoopBackOff".to_owned(),
                    message: format!(
                        "back-off restarting failed container {} in pod {}",
                        container.name,
                        spec::pod_key(&self.pod)
                    ),
                },
            );
            return Ok(backoff.until);
        }
        backoff.fail(now, self.config.backoff_initial, self.config.backoff_max);
        let next = backoff.until;
        // The new one first: if it cannot be made, the old one (and its
        // attempt number and log) stays.
        // The old one stays, as the latest dead one, until the policy's
        // count of dead containers trims it on a later pass.
        let wake = self.start(sandbox, container, attempt + 1).await?;
        // Look again when the next restart would be allowed.
        Ok(match (wake, next) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        })
    }

    /// Pulls (as the policy says), creates and starts attempt `attempt`.
    async fn start(
        &mut self,
        sandbox: &str,
        container: &Container,
        attempt: u32,
    ) -> Result<Option<Instant>, CriError> {
        // Attempts only grow, also across a lost container or sandbox, so
        // restart counts and log files stay right.
        let attempt = attempt
            .max(
                self.attempts
                    .get(&container.name)
                    .map_or(0, |last| last + 1),
            )
            .max(self.logged_attempts(&container.name));
        let image = container.image.clone().unwrap_or_default();
        let policy = container.image_pull_policy.clone().unwrap_or_else(|| {
            if image.ends_with(":latest") || !image.rsplit('/').next().unwrap_or("").contains(':') {
                "Always".to_owned()
            } else {
                "IfNotPresent".to_owned()
            }
        });
        let now = Instant::now();
        let pulls = self
            .pulls
            .entry(container.name.clone())
            .or_default()
            .clone();
        if !pulls.ready(now) {
            self.waiting.insert(
                container.name.clone(),
                Waiting {
                    reason: "ImagePullBackOff".to_owned(),
                    message: format!("back-off pulling image {image:?}"),
                },
            );
            return Ok(pulls.until);
        }
        let image_ref = match self.pull(&image, &policy).await {
            Ok(image_ref) => {
                self.pulls.remove(&container.name);
                image_ref
            }
            Err(err) => {
                let backoff = self.pulls.entry(container.name.clone()).or_default();
                backoff.fail(now, self.config.backoff_initial, self.config.backoff_max);
                let reason = if policy == "Never" {
                    "ErrImageNeverPull"
                } else {
                    "ErrImagePull"
                };
                self.waiting.insert(
                    container.name.clone(),
                    Waiting {
                        reason: reason.to_owned(),
                        message: err.to_string(),
                    },
                );
                // Look again soon, to say it is backing off, and once the
                // backoff ends.
                let soon = now
                    + self
                        .config
                        .relist_period
                        .min(self.config.backoff_initial / 2);
                return Ok(Some(backoff.until.map_or(soon, |until| until.min(soon))));
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
        self.prober.forget(&container.name);
        self.ready.remove(&container.name);
        let config = match configured {
            Ok(config) => config,
            Err(err) => {
                self.waiting.insert(
                    container.name.clone(),
                    Waiting {
                        reason: err.reason.clone(),
                        message: err.message.clone(),
                    },
                );
                return Ok(Some(now + self.config.backoff_initial));
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
                self.attempts.insert(container.name.clone(), attempt);
                created.into_inner().container_id
            }
            Err(status) => {
                self.waiting.insert(
                    container.name.clone(),
                    Waiting {
                        reason: "CreateContainerError".to_owned(),
                        message: status.message().to_owned(),
                    },
                );
                return Ok(Some(now + self.config.backoff_initial));
            }
        };
        if let Err(status) = runtime
            .start_container(api::StartContainerRequest {
                container_id: id.clone(),
            })
            .await
        {
            self.waiting.insert(
                container.name.clone(),
                Waiting {
                    reason: "RunContainerError".to_owned(),
                    message: status.message().to_owned(),
                },
            );
            return Ok(Some(now + self.config.backoff_initial));
        }
        self.waiting.remove(&container.name);
        debug!(pod = %spec::pod_key(&self.pod), container = %container.name, attempt, %id, "container started");
        Ok(None)
    }

    /// The image's reference after pulling as `policy` says.
    async fn pull(&self, image: &str, policy: &str) -> Result<String, CriError> {
        let mut images = self.cri.images.clone();
        let spec = api::ImageSpec {
            image: image.to_owned(),
            ..Default::default()
        };
        if policy != "Always" {
            let present = images
                .image_status(api::ImageStatusRequest {
                    image: Some(spec.clone()),
                    verbose: false,
                })
                .await
                .map_err(CriError::call("ImageStatus"))?
                .into_inner()
                .image;
            if let Some(present) = present {
                return Ok(present.id);
            }
            if policy == "Never" {
                return Err(CriError::Call {
                    call: "ImageStatus",
                    status: tonic::Status::not_found(format!(
                        "image {image:?} is not present and imagePullPolicy is Never"
                    )),
                });
            }
        }
        images
            .pull_image(api::PullImageRequest {
                image: Some(spec),
                ..Default::default()
            })
            .await
            .map(|r| r.into_inner().image_ref)
            .map_err(CriError::call("PullImage"))
    }

    fn grace(&self) -> i64 {
        self.pod
            .spec
            .as_ref()
            .and_then(|s| s.termination_grace_period_seconds)
            .unwrap_or(30)
    }

    async fn remove_container(&self, id: &str, grace: i64) {
        let mut runtime = self.cri.runtime.clone();
        let _ = runtime
            .stop_container(api::StopContainerRequest {
                container_id: id.to_owned(),
                timeout: grace,
            })
            .await;
        if let Err(status) = runtime
            .remove_container(api::RemoveContainerRequest {
                container_id: id.to_owned(),
            })
            .await
        {
            warn!(container = id, %status, "container not removed");
        }
    }

    async fn remove_sandbox(&self, id: &str) {
        let mut runtime = self.cri.runtime.clone();
        let _ = runtime
            .stop_pod_sandbox(api::StopPodSandboxRequest {
                pod_sandbox_id: id.to_owned(),
            })
            .await;
        if let Err(status) = runtime
            .remove_pod_sandbox(api::RemovePodSandboxRequest {
                pod_sandbox_id: id.to_owned(),
            })
            .await
        {
            warn!(sandbox = id, %status, "sandbox not removed");
        }
    }

    /// Stops every container with the pod's grace period, then removes the
    /// sandboxes (and with them the containers) and the pod's directory.
    async fn teardown(&mut self) -> Result<(), CriError> {
        teardown(&self.cri, &self.config, &self.uid(), self.grace()).await
    }

    /// The pod's status from what the runtime shows now.
    async fn status(&mut self) -> PodStatus {
        let spec = self.pod.spec.clone().unwrap_or_default();
        let observed = match &self.sandbox {
            Some((id, _, _)) => {
                let id = id.clone();
                self.observe(&id).await.unwrap_or_default()
            }
            None => HashMap::new(),
        };
        let status_of = |container: &Container| -> ContainerStatus {
            let latest = observed
                .get(&container.name)
                .and_then(|o| o.latest.as_ref());
            let waiting = self.waiting.get(&container.name);
            let state = match (latest, waiting) {
                (_, Some(waiting)) => ContainerState {
                    waiting: Some(ContainerStateWaiting {
                        reason: Some(waiting.reason.clone()),
                        message: Some(waiting.message.clone()),
                    }),
                    ..Default::default()
                },
                (Some(s), None) if s.state == api::ContainerState::ContainerRunning as i32 => {
                    ContainerState {
                        running: Some(ContainerStateRunning {
                            started_at: time(s.started_at),
                        }),
                        ..Default::default()
                    }
                }
                (Some(s), None) if s.state == api::ContainerState::ContainerExited as i32 => {
                    ContainerState {
                        terminated: Some(ContainerStateTerminated {
                            exit_code: s.exit_code,
                            reason: Some(if s.reason.is_empty() {
                                if s.exit_code == 0 {
                                    "Completed".to_owned()
                                } else {
                                    "Error".to_owned()
                                }
                            } else {
                                s.reason.clone()
                            }),
                            message: Some(s.message.clone()).filter(|m| !m.is_empty()),
                            started_at: time(s.started_at),
                            finished_at: time(s.finished_at),
                            container_id: Some(format!("containerd://{}", s.id)),
                            ..Default::default()
                        }),
                        ..Default::default()
                    }
                }
                _ => ContainerState {
                    waiting: Some(ContainerStateWaiting {
                        reason: Some("ContainerCreating".to_owned()),
                        message: None,
                    }),
                    ..Default::default()
                },
            };
            let probed = self.ready.get(&container.name).copied().unwrap_or(
                container.readiness_probe.is_none() && container.startup_probe.is_none(),
            );
            let running = state.running.is_some();
            ContainerStatus {
                name: container.name.clone(),
                image: container.image.clone().unwrap_or_default(),
                image_id: latest.map(|s| s.image_ref.clone()).unwrap_or_default(),
                container_id: latest.map(|s| format!("containerd://{}", s.id)),
                restart_count: latest
                    .and_then(|s| s.metadata.as_ref())
                    .map_or(0, |m| m.attempt as i32),
                ready: running && probed,
                started: Some(running),
                state: Some(state),
                ..Default::default()
            }
        };
        let init_statuses: Vec<ContainerStatus> = spec
            .init_containers
            .iter()
            .flatten()
            .map(status_of)
            .collect();
        let statuses: Vec<ContainerStatus> = spec.containers.iter().map(status_of).collect();
        let terminated = |s: &ContainerStatus| {
            s.state
                .as_ref()
                .and_then(|st| st.terminated.as_ref())
                .map(|t| t.exit_code)
        };
        let initialized = init_statuses.iter().all(|s| terminated(s) == Some(0));
        let policy = self.restart_policy().to_owned();
        let init_failed = policy == "Never"
            && init_statuses
                .iter()
                .any(|s| terminated(s).is_some_and(|c| c != 0));
        let all_done = !statuses.is_empty() && statuses.iter().all(|s| terminated(s).is_some());
        let any_failed = statuses
            .iter()
            .any(|s| terminated(s).is_some_and(|c| c != 0));
        let phase = if init_failed || (policy == "Never" && all_done && any_failed) {
            "Failed"
        } else if policy != "Always" && all_done && !any_failed {
            "Succeeded"
        } else if initialized
            && statuses.iter().any(|s| {
                s.state
                    .as_ref()
                    .is_some_and(|st| st.running.is_some() || st.terminated.is_some())
            })
        {
            "Running"
        } else {
            "Pending"
        };
        let ready = !statuses.is_empty() && statuses.iter().all(|s| s.ready);
        let condition = |kind: &str, ok: bool| PodCondition {
            type_: kind.to_owned(),
            status: if ok { "True" } else { "False" }.to_owned(),
            ..Default::default()
        };
        let (ip, started) = match &self.sandbox {
            Some((_, ip, created)) => (
                if ip.is_empty() {
                    self.config.node_ip.clone()
                } else {
                    ip.clone()
                },
                time(*created),
            ),
            None => (String::new(), None),
        };
        PodStatus {
            phase: Some(phase.to_owned()),
            conditions: Some(vec![
                condition("PodScheduled", true),
                condition("Initialized", initialized),
                condition("ContainersReady", ready),
                condition("Ready", ready),
            ]),
            pod_ip: Some(ip).filter(|ip| !ip.is_empty()),
            host_ip: Some(self.config.node_ip.clone()).filter(|ip| !ip.is_empty()),
            start_time: started,
            container_statuses: Some(statuses),
            init_container_statuses: Some(init_statuses).filter(|s| !s.is_empty()),
            message: self.sandbox_error.clone(),
            ..Default::default()
        }
    }

    /// Sends the pod's status up (through metamanager) if it changed.
    async fn report(&mut self) {
        if self.finished() {
            // Its last word stands: nothing runs any more.
            return;
        }
        let status = self.status().await;
        if self.last_status.as_ref() == Some(&status) {
            return;
        }
        let Ok(content) = serde_json::to_value(&status) else {
            return;
        };
        let namespace = self
            .pod
            .metadata
            .namespace
            .clone()
            .unwrap_or_else(|| "default".to_owned());
        let name = self.pod.metadata.name.clone().unwrap_or_default();
        let msg = HiveMessage::new()
            .build_router(
                module::EDGED,
                group::META,
                format!("{namespace}/podstatus/{name}"),
                operation::UPDATE,
            )
            .with_content(content);
        if let Ok(mut view) = self.view.write() {
            let mut pod = self.pod.clone();
            pod.status = Some(status.clone());
            view.insert(spec::pod_key(&self.pod), pod);
        }
        match self.hive.send(module::METAMANAGER, msg).await {
            Ok(()) => self.last_status = Some(status),
            Err(err) => debug!(error = %err, "pod status not reported"),
        }
    }
}

/// Tells the cloud, through edgehub (which keeps it while the cloud is
/// away), that pod `namespace/name` of `uid` stopped here: its containers
/// stopped and its sandbox is gone, or it never ran. That finishes its
/// graceful deletion.
pub async fn say_terminated(hive: &Hive, namespace: &str, name: &str, uid: Option<String>) {
    let stopped = PodTerminated::new(namespace, name, uid);
    if let Err(err) = hive
        .send(module::EDGEHUB, stopped.message(module::EDGED))
        .await
    {
        warn!(pod = %stopped.resource(), error = %err, "that the pod stopped is not said");
    }
}

/// Tears a pod down by uid: its containers get `grace` seconds, then its
/// sandboxes and directory go.
pub async fn teardown(
    cri: &Cri,
    config: &EdgedConfig,
    uid: &str,
    grace: i64,
) -> Result<(), CriError> {
    let mut runtime = cri.runtime.clone();
    let containers = cri.containers(POD_UID, uid, None).await?;
    // Stopped together, so the grace periods run side by side.
    let stops = containers.iter().map(|c| {
        let mut runtime = runtime.clone();
        let id = c.id.clone();
        async move {
            let _ = runtime
                .stop_container(api::StopContainerRequest {
                    container_id: id,
                    timeout: grace,
                })
                .await;
        }
    });
    futures_util::future::join_all(stops).await;
    let sandboxes = cri.sandboxes(POD_UID, uid).await?;
    for sandbox in sandboxes {
        let _ = runtime
            .stop_pod_sandbox(api::StopPodSandboxRequest {
                pod_sandbox_id: sandbox.id.clone(),
            })
            .await;
        runtime
            .remove_pod_sandbox(api::RemovePodSandboxRequest {
                pod_sandbox_id: sandbox.id,
            })
            .await
            .map_err(CriError::call("RemovePodSandbox"))?;
    }
    let dir = config.pod_dir(uid);
    // A large emptyDir takes a while: off the actor thread.
    let removed = tokio::task::spawn_blocking(move || {
        if dir.exists()
            && let Err(err) = std::fs::remove_dir_all(&dir)
        {
            warn!(dir = %dir.display(), error = %err, "pod directory not removed");
        }
    });
    let _ = removed.await;
    Ok(())
}

/// A CRI time (nanoseconds since the epoch) as a Kubernetes time.
fn time(nanos: i64) -> Option<Time> {
    if nanos <= 0 {
        return None;
    }
    let at = jiff::Timestamp::from_second(nanos / 1_000_000_000).ok()?;
    Some(Time(at))
}
