//! The Kubernetes scenarios' writing client, apart from what it measures,
//! and where the cores went while it wrote.
//!
//! - [`ApiWriter`]: the bare kube-rs client that creates and patches the
//!   pods, on a thread and a runtime of its own, as a user's client is a
//!   process of its own. The cloud and the edge this process also runs
//!   (on its main thread, as cloudcore runs on one) never delay its
//!   requests, and its CPU time is read apart from theirs.
//! - [`CpuShares`]: the CPU seconds of the API server and etcd (when they
//!   run on this machine), of this process, and of the writer's thread,
//!   between two snapshots.
//!
//! One concern: driving the API server from outside the cloud under test.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context as _, Result, anyhow};
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use tokio::sync::{mpsc, oneshot};

use crate::cloudcore_memory::cpu_seconds;
use crate::controller_bench::kubernetes::{client, create_pods, patch_all};

/// One batch of writes.
enum Job {
    Create {
        namespace: String,
        pods: Vec<Pod>,
    },
    Label {
        namespace: String,
        names: Vec<String>,
        label: String,
    },
}

/// What a batch took: until the API server answered its last request, and
/// the writer thread's CPU seconds meanwhile.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Written {
    pub took: Duration,
    pub cpu: f64,
}

type Reply = oneshot::Sender<Result<Written>>;

/// The writing client on its own thread; stopped when dropped.
pub(crate) struct ApiWriter {
    jobs: Option<mpsc::UnboundedSender<(Job, Reply)>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl ApiWriter {
    /// Starts the thread and its client of the cluster `kubeconfig` names.
    pub(crate) async fn start(kubeconfig: &Path) -> Result<ApiWriter> {
        let (jobs, mut queue) = mpsc::unbounded_channel::<(Job, Reply)>();
        let (ready, connected) = oneshot::channel::<Result<()>>();
        let kubeconfig: PathBuf = kubeconfig.to_owned();
        let thread = std::thread::Builder::new()
            .name("api-writer".into())
            .spawn(move || {
                let runtime = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(runtime) => runtime,
                    Err(err) => {
                        let _ = ready.send(Err(err.into()));
                        return;
                    }
                };
                runtime.block_on(async move {
                    let client = match client(&kubeconfig).await {
                        Ok(client) => client,
                        Err(err) => {
                            let _ = ready.send(Err(err));
                            return;
                        }
                    };
                    let _ = ready.send(Ok(()));
                    while let Some((job, reply)) = queue.recv().await {
                        let _ = reply.send(run(&client, job).await);
                    }
                });
            })
            .context("start the writer thread")?;
        connected
            .await
            .map_err(|_| anyhow!("the writer thread ended before its client connected"))??;
        Ok(ApiWriter {
            jobs: Some(jobs),
            thread: Some(thread),
        })
    }

    /// Creates `pods` in `namespace`, 16 at a time.
    pub(crate) async fn create(&self, namespace: &str, pods: Vec<Pod>) -> Result<Written> {
        self.submit(Job::Create {
            namespace: namespace.to_owned(),
            pods,
        })
        .await
    }

    /// Labels each of `names` in `namespace` `round=label`, 16 at a time.
    pub(crate) async fn label(
        &self,
        namespace: &str,
        names: &[String],
        label: &str,
    ) -> Result<Written> {
        self.submit(Job::Label {
            namespace: namespace.to_owned(),
            names: names.to_vec(),
            label: label.to_owned(),
        })
        .await
    }

    async fn submit(&self, job: Job) -> Result<Written> {
        let (reply, answer) = oneshot::channel();
        self.jobs
            .as_ref()
            .ok_or_else(|| anyhow!("the writer is stopped"))?
            .send((job, reply))
            .map_err(|_| anyhow!("the writer thread ended"))?;
        answer
            .await
            .map_err(|_| anyhow!("the writer thread ended mid-job"))?
    }
}

impl Drop for ApiWriter {
    fn drop(&mut self) {
        // Closing the queue ends the thread's loop.
        self.jobs.take();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

async fn run(client: &kube::Client, job: Job) -> Result<Written> {
    let before = thread_cpu_seconds()?;
    let took = match job {
        Job::Create { namespace, pods } => {
            create_pods(&Api::namespaced(client.clone(), &namespace), pods).await?
        }
        Job::Label {
            namespace,
            names,
            label,
        } => patch_all(&Api::namespaced(client.clone(), &namespace), &names, &label).await?,
    };
    Ok(Written {
        took,
        cpu: thread_cpu_seconds()? - before,
    })
}

/// The calling thread's CPU time so far, user and system, in seconds.
fn thread_cpu_seconds() -> Result<f64> {
    crate::cloudcore_memory::stat_cpu_seconds(Path::new("/proc/thread-self/stat"))
}

/// CPU seconds so far of the processes that share these cores during a
/// Kubernetes scenario.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct CpuShares {
    /// The API server, if one runs on this machine.
    pub api_server: Option<f64>,
    /// etcd, if it runs on this machine.
    pub etcd: Option<f64>,
    /// This process: the writer, and the cloud and edge under test.
    pub bench: f64,
}

impl CpuShares {
    /// The CPU seconds of each so far.
    pub(crate) fn now() -> Result<CpuShares> {
        Ok(CpuShares {
            api_server: process_named("kube-apiserver").and_then(|pid| cpu_seconds(pid).ok()),
            etcd: process_named("etcd").and_then(|pid| cpu_seconds(pid).ok()),
            bench: cpu_seconds(std::process::id())?,
        })
    }

    /// Each one's CPU seconds from `earlier` to `self`.
    pub(crate) fn since(&self, earlier: &CpuShares) -> CpuShares {
        let delta = |now: Option<f64>, then: Option<f64>| Some(now? - then?);
        CpuShares {
            api_server: delta(self.api_server, earlier.api_server),
            etcd: delta(self.etcd, earlier.etcd),
            bench: self.bench - earlier.bench,
        }
    }

    /// "API server X ms, etcd Y ms, ..." per object of `objects`, with
    /// the writer's own share taken out of this process's as `writer`.
    pub(crate) fn per_object(&self, objects: usize, writer: f64) -> String {
        let ms = |seconds: f64| seconds * 1000.0 / objects as f64;
        let shown =
            |seconds: Option<f64>| seconds.map_or("-".to_owned(), |s| format!("{:.2}", ms(s)));
        format!(
            "API server {} ms, etcd {} ms, the writing client {:.2} ms, the rest of this process \
             (cloud and edge) {:.2} ms",
            shown(self.api_server),
            shown(self.etcd),
            ms(writer),
            ms(self.bench - writer),
        )
    }
}

/// The pid of a process whose command name is `name` (the first, by
/// pid), if any.
fn process_named(name: &str) -> Option<u32> {
    let mut found: Vec<u32> = std::fs::read_dir("/proc")
        .ok()?
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .is_ok_and(|comm| comm.trim_end() == name)
        })
        .collect();
    found.sort_unstable();
    found.first().copied()
}
