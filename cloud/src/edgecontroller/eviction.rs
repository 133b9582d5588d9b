//! Offline autonomy without eviction surprises: an edge node whose link is
//! down shows NotReady, and Kubernetes' taint manager would evict its pods
//! once their tolerations of the `not-ready` and `unreachable` NoExecute
//! taints run out (300 s, as the API server's DefaultTolerationSeconds
//! admission sets them). KubeEdge users ask for their edge pods to outlive
//! a longer outage (kubeedge/kubeedge#2128), so cloudcore lengthens those
//! default tolerations of pods bound to edge nodes to a configurable
//! window, or drops their limit altogether. Tolerations a user wrote with
//! another duration are left alone. No I/O here: the controller writes the
//! pod.

use std::time::Duration;

use serde_json::{Value, json};

/// The taints the node lifecycle controller puts on a NotReady node.
pub const OFFLINE_TAINTS: [&str; 2] = [
    "node.kubernetes.io/not-ready",
    "node.kubernetes.io/unreachable",
];

/// The toleration the API server's admission adds by default, in seconds.
pub const ADMISSION_DEFAULT_SECONDS: i64 = 300;

/// `pod` with its default offline tolerations lengthened to `window`
/// (`None`: no limit), or `None` if nothing is to change.
pub fn lengthened(pod: &Value, window: Option<Duration>) -> Option<Value> {
    let wanted = window.map(|w| i64::try_from(w.as_secs()).unwrap_or(i64::MAX));
    if wanted == Some(ADMISSION_DEFAULT_SECONDS) {
        return None;
    }
    let mut pod = pod.clone();
    let tolerations = pod.pointer_mut("/spec/tolerations")?.as_array_mut()?;
    let mut changed = false;
    for toleration in tolerations.iter_mut() {
        let key = toleration["key"].as_str().unwrap_or_default();
        if !OFFLINE_TAINTS.contains(&key)
            || toleration["effect"] != "NoExecute"
            || toleration["tolerationSeconds"].as_i64() != Some(ADMISSION_DEFAULT_SECONDS)
        {
            continue;
        }
        match (wanted, toleration.as_object_mut()) {
            (Some(seconds), Some(map)) => {
                map.insert("tolerationSeconds".to_owned(), json!(seconds));
            }
            (None, Some(map)) => {
                map.remove("tolerationSeconds");
            }
            (_, None) => continue,
        }
        changed = true;
    }
    changed.then_some(pod)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(tolerations: Value) -> Value {
        json!({"metadata": {"name": "p"}, "spec": {"nodeName": "edge-1", "tolerations": tolerations}})
    }

    fn admitted() -> Value {
        pod(json!([
            {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
            {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
            {"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"},
        ]))
    }

    #[test]
    fn default_tolerations_are_lengthened_to_the_window() {
        let day = Some(Duration::from_secs(86_400));
        let changed = lengthened(&admitted(), day).expect("changed");
        let tolerations = changed["spec"]["tolerations"].as_array().expect("list");
        assert_eq!(tolerations[0]["tolerationSeconds"], 86_400);
        assert_eq!(tolerations[1]["tolerationSeconds"], 86_400);
        assert_eq!(tolerations[2], admitted()["spec"]["tolerations"][2]);
        // Once lengthened, nothing more to do.
        assert!(lengthened(&changed, day).is_none());
    }

    #[test]
    fn no_window_tolerates_for_ever_and_user_choices_stay() {
        let forever = lengthened(&admitted(), None).expect("changed");
        assert!(
            forever["spec"]["tolerations"][0]
                .get("tolerationSeconds")
                .is_none()
        );
        assert!(lengthened(&forever, None).is_none());
        let chosen = pod(json!([
            {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 30},
        ]));
        assert!(lengthened(&chosen, None).is_none());
        assert!(lengthened(&pod(json!(null)), None).is_none());
        // A window equal to the default changes nothing.
        assert!(lengthened(&admitted(), Some(Duration::from_secs(300))).is_none());
    }
}
