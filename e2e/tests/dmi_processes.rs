//! Devices through KubeEdge's DMI, as a user runs them: cloudcore, edgecore
//! and edgehive-mapper in DMI mode as separate processes, the mapper and
//! the edge talking gRPC over Unix sockets. The mapper registers and gets
//! its device; the cloud's desired value reaches it and its reported
//! values the cloud's Device status; a restarted mapper gets its device
//! back; an edge restarted while the cloud is down knows the mapper still
//! and gives it its device again from what it holds.

use std::time::Duration;

use serde_json::Value;
use support::{
    EdgecoreRun, Process, ctl, free_address, join_node, start_cloudcore, tempfile_dir, until,
};

mod support;

fn manifest(node: &str, setpoint: &str) -> String {
    include_str!("../../examples/manifests/thermometer.yaml")
        .replace("nodeName: edge-1", &format!("nodeName: {node}"))
        .replace("value: \"21\"", &format!("value: \"{setpoint}\""))
}

/// The reported value of `property` in the cloud's copy of `device`.
fn reported(admin: &str, device: &str, property: &str) -> Option<String> {
    let (ok, out, _) = ctl(admin, &["get", "device", device, "-o", "json"]);
    let device: Value = ok.then(|| serde_json::from_str(&out).ok()).flatten()?;
    device["status"]["twins"]
        .as_array()?
        .iter()
        .find(|t| t["propertyName"] == property)?["reported"]["value"]
        .as_str()
        .map(str::to_owned)
}

#[test]
fn a_dmi_mapper_process_drives_a_device_from_the_cloud() {
    let node = "dmi-edge".to_owned();
    let dir = tempfile_dir(&node);
    let (hub, certs, admin) = (free_address(), free_address(), free_address());
    let (cloud_dir, edge_dir) = (format!("{dir}/cloud"), format!("{dir}/edge"));
    let cloud_flags = [
        "--admin",
        &admin,
        "--admin-insecure",
        "--keepalive-secs",
        "2",
    ];
    let cloud = start_cloudcore(&cloud_dir, &hub, &certs, &cloud_flags);
    cloud.wait_for("certificate endpoints ready", Duration::from_secs(30));
    join_node(&cloud_dir, &certs, &node, &edge_dir);
    let dmi_socket = format!("{dir}/kubeedge/dmi.sock");
    let edge_run = EdgecoreRun::new(&edge_dir, &hub)
        .with("--transport", "ws")
        .with("--metaserver", &free_address())
        .with("--edged-server", &free_address())
        .with("--mqtt-broker", &free_address())
        .with("--keepalive-secs", "2")
        .with("--cri-socket", "off")
        .with("--dmi-socket", &dmi_socket);
    let edge = edge_run.start();
    cloud.wait_for(
        &format!("node connected node={node}"),
        Duration::from_secs(30),
    );
    let file = format!("{dir}/thermometer.yaml");
    std::fs::write(&file, manifest(&node, "21")).expect("manifest");
    let (ok, _, err) = ctl(&admin, &["apply", "-f", &file]);
    assert!(ok, "{err}");

    // The mapper registers over DMI, gets thermo-1, drives the setpoint
    // and reads the temperature; both reach the cloud.
    let mapper_socket = format!("{dir}/mapper.sock");
    let mapper_args = [
        "--dmi",
        &dmi_socket,
        "--socket",
        &mapper_socket,
        "--protocol",
        "virtual",
        "--period-ms",
        "200",
    ];
    let mapper = Process::start(env!("CARGO_BIN_EXE_e2e-mapper"), &mapper_args);
    // Listed at its registration, or registered with it once it reaches
    // the edge.
    mapper.wait_for_any(
        &["registered devices=1", "device registered"],
        Duration::from_secs(30),
    );
    until("the setpoint and temperature reported in the cloud", || {
        let setpoint = reported(&admin, "thermo-1", "setpoint")?;
        let temperature = reported(&admin, "thermo-1", "temperature")?;
        (setpoint == "21" && temperature.parse::<f64>().is_ok()).then_some(())
    });

    // A new desired value reaches the mapper (UpdateDevice) and comes back
    // reported.
    std::fs::write(&file, manifest(&node, "25")).expect("manifest");
    let (ok, _, err) = ctl(&admin, &["apply", "-f", &file]);
    assert!(ok, "{err}");
    mapper.wait_for("device updated", Duration::from_secs(30));
    until("the new setpoint reported in the cloud", || {
        (reported(&admin, "thermo-1", "setpoint")? == "25").then_some(())
    });

    // A mapper that restarts gets its device back, with the new value.
    drop(mapper);
    let mapper = Process::start(env!("CARGO_BIN_EXE_e2e-mapper"), &mapper_args);
    mapper.wait_for("registered devices=1", Duration::from_secs(30));

    // The cloud goes, then the edge restarts: it serves the mapper from
    // what it holds, and the mapper registers with it again.
    drop(cloud);
    drop(edge);
    let edge = edge_run.start();
    edge.wait_for("DMI server listening", Duration::from_secs(30));
    // It knows the mapper still (kept across its restart) and gives it its
    // device again.
    edge.wait_for(
        "mapper registered before the restart",
        Duration::from_secs(30),
    );
    mapper.wait_for("device registered", Duration::from_secs(30));
    // The cloud back: the node links again and the reports go on.
    let cloud = start_cloudcore(&cloud_dir, &hub, &certs, &cloud_flags);
    cloud.wait_for(
        &format!("node connected node={node}"),
        Duration::from_secs(30),
    );
    until("the setpoint still reported", || {
        (reported(&admin, "thermo-1", "setpoint")? == "25").then_some(())
    });
    drop(mapper);
    drop(edge);
    drop(cloud);
}
