//! How a pod leaves the node: its containers stopped together with the
//! pod's grace period, its sandboxes and directory removed, and the cloud
//! told (through edgehub, which keeps the word while the cloud is away)
//! that it stopped, which finishes its graceful deletion.

use apis::termination::PodTerminated;
use beehive::Hive;
use beehive::constants::module;
use tracing::warn;

use crate::config::EdgedConfig;
use crate::cri::{Cri, CriError, api};
use crate::spec::POD_UID;

/// Uids of pods being torn down.
pub type Terminating = std::sync::Arc<std::sync::Mutex<std::collections::HashSet<String>>>;

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
