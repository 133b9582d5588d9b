//! The CRI client against the real containerd that `scripts/setup-containerd`
//! runs (socket from `EDGEHIVE_CRI_SOCKET`, else edgehive's default): a pod
//! sandbox and a container, pulled from the local registry, run, logged and
//! removed, with nothing left behind (also when the test fails: its
//! sandbox carries a test node's label, removed on drop).

use std::collections::HashMap;
use std::time::Duration;

use edged::Cri;
use edged::cri::api;
use edged::testing::{TestNode, cri_socket};

async fn cri() -> Cri {
    Cri::connect(&cri_socket())
        .await
        .unwrap_or_else(|err| panic!("{err}; run ./scripts/setup-containerd first"))
}

async fn pull(cri: &Cri, image: &str) -> String {
    let mut images = cri.images.clone();
    images
        .pull_image(api::PullImageRequest {
            image: Some(api::ImageSpec {
                image: image.to_owned(),
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
        .unwrap_or_else(|status| panic!("pull {image}: {status}"))
        .into_inner()
        .image_ref
}

#[tokio::test]
async fn a_container_runs_logs_and_leaves_nothing_behind() {
    let node = TestNode::new(cri_socket(), "cri");
    let cri = cri().await;
    let version = cri.version().await.expect("version");
    assert_eq!(version.runtime_name, "containerd");
    assert_eq!(version.runtime_api_version, "v1");

    pull(&cri, "127.0.0.1:5000/edgehive/pause:latest").await;
    let image = pull(&cri, "127.0.0.1:5000/edgehive/busybox:latest").await;
    assert!(image.starts_with("sha256:"), "{image}");

    let uid = format!("cri-test-{}", std::process::id());
    let logs = tempfile::tempdir().expect("log dir");
    let config = api::PodSandboxConfig {
        metadata: Some(api::PodSandboxMetadata {
            name: "cri-test".to_owned(),
            uid: uid.clone(),
            namespace: "edgehive-tests".to_owned(),
            attempt: 0,
        }),
        // Host network: the host's name (runc refuses one without a UTS namespace).
        hostname: String::new(),
        log_directory: logs.path().to_string_lossy().into_owned(),
        linux: Some(api::LinuxPodSandboxConfig {
            security_context: Some(api::LinuxSandboxSecurityContext {
                namespace_options: Some(api::NamespaceOption {
                    network: api::NamespaceMode::Node as i32,
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
        labels: HashMap::from([
            ("edgehive.io/test".to_owned(), uid.clone()),
            (edged::spec::NODE.to_owned(), node.name().to_owned()),
        ]),
        ..Default::default()
    };
    let mut runtime = cri.runtime.clone();
    let sandbox = runtime
        .run_pod_sandbox(api::RunPodSandboxRequest {
            config: Some(config.clone()),
            runtime_handler: String::new(),
        })
        .await
        .expect("sandbox")
        .into_inner()
        .pod_sandbox_id;
    let container = runtime
        .create_container(api::CreateContainerRequest {
            pod_sandbox_id: sandbox.clone(),
            config: Some(api::ContainerConfig {
                metadata: Some(api::ContainerMetadata {
                    name: "hello".to_owned(),
                    attempt: 0,
                }),
                image: Some(api::ImageSpec {
                    image: image.clone(),
                    ..Default::default()
                }),
                command: vec![
                    "sh".to_owned(),
                    "-c".to_owned(),
                    "echo hello from edgehive".to_owned(),
                ],
                log_path: "hello.log".to_owned(),
                labels: HashMap::from([(edged::spec::NODE.to_owned(), node.name().to_owned())]),
                ..Default::default()
            }),
            sandbox_config: Some(config),
        })
        .await
        .expect("create")
        .into_inner()
        .container_id;
    runtime
        .start_container(api::StartContainerRequest {
            container_id: container.clone(),
        })
        .await
        .expect("start");

    // CRI v1 on containerd 1.6 has no container events: ask until it exited.
    let mut status = None;
    for _ in 0..300 {
        let answer = runtime
            .container_status(api::ContainerStatusRequest {
                container_id: container.clone(),
                verbose: false,
            })
            .await
            .expect("status")
            .into_inner()
            .status
            .expect("a status");
        if answer.state == api::ContainerState::ContainerExited as i32 {
            status = Some(answer);
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let status = status.expect("the container exited");
    assert_eq!(status.exit_code, 0);
    let log = tokio::fs::read_to_string(logs.path().join("hello.log"))
        .await
        .expect("log");
    assert!(log.contains("stdout F hello from edgehive"), "{log}");

    runtime
        .stop_pod_sandbox(api::StopPodSandboxRequest {
            pod_sandbox_id: sandbox.clone(),
        })
        .await
        .expect("stop");
    runtime
        .remove_pod_sandbox(api::RemovePodSandboxRequest {
            pod_sandbox_id: sandbox.clone(),
        })
        .await
        .expect("remove");
    let left = runtime
        .list_pod_sandbox(api::ListPodSandboxRequest {
            filter: Some(api::PodSandboxFilter {
                label_selector: HashMap::from([("edgehive.io/test".to_owned(), uid)]),
                ..Default::default()
            }),
        })
        .await
        .expect("list")
        .into_inner()
        .items;
    assert!(left.is_empty(), "{left:?}");
    let containers = runtime
        .list_containers(api::ListContainersRequest {
            filter: Some(api::ContainerFilter {
                pod_sandbox_id: sandbox,
                ..Default::default()
            }),
        })
        .await
        .expect("list")
        .into_inner()
        .containers;
    assert!(containers.is_empty(), "{containers:?}");
}
