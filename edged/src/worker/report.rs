//! What a pod's worker says of the pod: its status, sent up through
//! metamanager when it changed, and at start-up the status a pod that
//! finished before this edged had, so it is not run again.

use super::*;

impl PodWorker {
    /// A pod that finished before this edged started (its status in the
    /// store says so, and a sandbox of its uid exists, so it ran here) stays
    /// finished, even if a reboot took its sandbox: it is not run again.
    pub(super) async fn recall_finished(&mut self) {
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
        if answer.is_failure() {
            return;
        }
        let Ok(status) = answer.body::<PodStatus>() else {
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

    /// Sends the pod's status up (through metamanager) if it changed.
    pub(super) async fn report(&mut self) {
        if self.finished() {
            // Its last word stands: nothing runs any more.
            return;
        }
        let status = self.status().await;
        if self.last_status.as_ref() == Some(&status) {
            return;
        }
        let Ok(content) = beehive::Content::of(&status) else {
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

    /// Whether the pod has finished (Succeeded or Failed) here.
    pub(super) fn finished(&self) -> bool {
        self.last_status
            .as_ref()
            .and_then(|s| s.phase.as_deref())
            .is_some_and(|phase| phase == "Succeeded" || phase == "Failed")
    }
}
