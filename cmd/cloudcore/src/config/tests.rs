//! Tests of the parent module (`config.rs`).

use super::*;
use cmd_common::config::{parse, to_yaml};

#[test]
fn the_defaults_print_and_read_back() {
    let cloud = CloudCoreConfig::default();
    assert_eq!(parse::<CloudCoreConfig>(&to_yaml(&cloud)), Ok(cloud));
    assert_eq!(parse::<CloudCoreConfig>(""), Ok(CloudCoreConfig::default()));
}

#[test]
fn the_edgestream_tunnel_port_is_kubeedge_s_name_and_not_taken() {
    let cloud = CloudCoreConfig::default();
    assert_eq!(cloud.modules.cloud_stream.tunnel_port, 10014);
    let moved: CloudCoreConfig = parse(
            "modules:\n  cloudStream:\n    tunnelPort: 10004\n  metrics:\n    address: 127.0.0.1:10005\n",
        )
        .expect("KubeEdge's port, metrics moved");
    assert_eq!(moved.modules.cloud_stream.tunnel_port, 10004);
    let taken = parse::<CloudCoreConfig>("modules:\n  cloudStream:\n    tunnelPort: 10004\n")
        .expect_err("metrics are on 10004");
    assert!(
        taken.contains("modules.cloudStream.tunnelPort") && taken.contains("modules.metrics"),
        "{taken}"
    );
    let off: CloudCoreConfig = parse("modules:\n  cloudStream:\n    tunnelPort: 0\n").expect("off");
    assert_eq!(off.modules.cloud_stream.tunnel_port, 0);
}

#[test]
fn the_admission_webhook_is_off_until_asked_and_reached_one_way() {
    let cloud = CloudCoreConfig::default();
    assert!(!cloud.modules.admission.enable);
    assert_eq!(cloud.modules.admission.address, "0.0.0.0:10354");
    let on: CloudCoreConfig =
        parse("modules:\n  admission:\n    enable: true\n    service: kubeedge/cloudcore:8443\n")
            .expect("a Service");
    assert_eq!(on.modules.admission.service, "kubeedge/cloudcore:8443");
    for (file, key) in [
        (
            "modules:\n  admission:\n    enable: true\n    url: http://10.0.0.2/mutate-pods\n",
            "modules.admission.url",
        ),
        (
            "modules:\n  admission:\n    enable: true\n    service: cloudcore\n",
            "modules.admission.service",
        ),
        (
            "modules:\n  admission:\n    enable: true\n    url: https://10.0.0.2/mutate-pods\n    service: kubeedge/cloudcore\n",
            "choose one way",
        ),
        (
            "modules:\n  admission:\n    enable: true\n    address: localhost\n",
            "modules.admission.address",
        ),
    ] {
        let err = parse::<CloudCoreConfig>(file).expect_err(file);
        assert!(err.contains(key), "{file}: {err}");
    }
}

#[test]
fn the_admin_api_without_authentication_stays_on_loopback() {
    let cloud = CloudCoreConfig::default();
    assert!(cloud.modules.admin.authentication);
    let plain: CloudCoreConfig =
        parse("modules:\n  admin:\n    authentication: false\n").expect("loopback");
    assert_eq!(plain.modules.admin.address, cloud::admin::DEFAULT_ADDRESS);
    let open = parse::<CloudCoreConfig>(
        "modules:\n  admin:\n    address: 0.0.0.0:10003\n    authentication: false\n",
    )
    .expect_err("refused");
    assert!(
        open.contains("modules.admin.authentication") && open.contains("0.0.0.0:10003"),
        "{open}"
    );
    let secured: CloudCoreConfig = parse(
        "modules:\n  admin:\n    address: 0.0.0.0:10003\n    tokenFile: /etc/edgehive/tokens.csv\n",
    )
    .expect("with authentication, anywhere");
    assert_eq!(
        secured.modules.admin.token_file,
        PathBuf::from("/etc/edgehive/tokens.csv")
    );
}

#[test]
fn errors_name_what_is_wrong() {
    let none = parse::<CloudCoreConfig>(
        "modules:\n  cloudHub:\n    websocket:\n      enable: false\n      address: x:1\n",
    )
    .expect_err("refused");
    assert!(none.contains("enable at least one"), "{none}");
    let off: CloudCoreConfig =
        parse("modules:\n  metrics:\n    enable: false\n").expect("no address needed when off");
    assert!(!off.modules.metrics.enable);
}
