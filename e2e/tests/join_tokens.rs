//! Join tokens and node revocation with real processes: `cloudcore token
//! create --node --single-use` against a running cloudcore, `edgecore join`
//! refused for another node and for a second use, stopped before the token
//! is spent when its data directory cannot hold the credentials, `token delete` revoking a
//! token (and refusing an id never recorded), an edge pointed where no
//! cloud listens saying so, `token list` showing their state; a Node deleted with edgehivectl
//! while linked has its link closed, its certificate refused at the next
//! connect and for renewal, and the node joined again with a new token is
//! served again.

use std::time::Duration;

use support::{
    Process, cloudcore_token, ctl, edgecore_join, free_address, start_cloudcore, start_edgecore,
    tempfile_dir, until,
};

mod support;

fn cloudcore(cloud_dir: &str, admin: &str, args: &[&str]) -> (bool, String, String) {
    cloudcore_token(cloud_dir, Some(admin), args)
}

fn start_edge(hub: &str, data_dir: &str) -> Process {
    start_edgecore(data_dir, hub, &[])
}

#[test]
fn restricted_tokens_and_a_deleted_nodes_certificate() {
    let dir = tempfile_dir("tokens");
    let cloud_dir = format!("{dir}/cloud");
    let (hub, certs, admin) = (free_address(), free_address(), free_address());
    let cloud = start_cloudcore(
        &cloud_dir,
        &hub,
        &certs,
        &["--admin", &admin, "--admin-insecure"],
    );
    cloud.wait_for("admin API ready", Duration::from_secs(30));

    // Bound to edge-t, single use.
    let (ok, token, err) = cloudcore(
        &cloud_dir,
        &admin,
        &[
            "create",
            "--node",
            "edge-t",
            "--single-use",
            "--ttl-secs",
            "600",
        ],
    );
    assert!(ok && err.is_empty(), "{err}");
    let (ok, err) = edgecore_join(&certs, &token, "edge-u", &format!("{dir}/u"));
    assert!(!ok);
    assert!(
        err.contains(r#"join token is for node "edge-t", not "edge-u""#),
        "{err}"
    );
    // A data directory that cannot hold the credentials (a path through a
    // regular file: refused even to root) stops the join before the token
    // is presented, so the single-use token still works below.
    std::fs::write(format!("{dir}/blocker"), "a file").expect("a file");
    let (ok, err) = edgecore_join(&certs, &token, "edge-t", &format!("{dir}/blocker/edge"));
    assert!(!ok);
    assert!(
        err.contains(&format!("{dir}/blocker/edge"))
            && err.contains("nothing was sent to the cloud, the token is unused"),
        "{err}"
    );
    // A token cut short is named as such, before anything is sent.
    let (ok, err) = edgecore_join(
        &certs,
        &token[..token.len() / 2],
        "edge-t",
        &format!("{dir}/u"),
    );
    assert!(!ok);
    assert!(err.contains("the join token is malformed"), "{err}");
    let edge_dir = format!("{dir}/edge");
    let (ok, err) = edgecore_join(&certs, &token, "edge-t", &edge_dir);
    assert!(ok, "{err}");
    // Pointed at an address where no cloud listens, the edge says so at
    // the default level, naming the address.
    let nowhere = free_address();
    let lost = start_edgecore(&edge_dir, &nowhere, &["--cri-socket", "off"]);
    let said = lost.wait_for("cannot reach the cloud", Duration::from_secs(30));
    assert!(said.contains(&nowhere) && said.contains("WARN"), "{said}");
    drop(lost);
    let (ok, err) = edgecore_join(&certs, &token, "edge-t", &format!("{dir}/again"));
    assert!(!ok);
    assert!(err.contains("used already"), "{err}");

    // Revoked with `token delete`.
    let (ok, revoked, _) = cloudcore(&cloud_dir, &admin, &["create"]);
    assert!(ok);
    let (ok, listed, _) = cloudcore(&cloud_dir, &admin, &["list"]);
    assert!(ok);
    let lines: Vec<&str> = listed.lines().collect();
    assert_eq!(lines.len(), 3, "{listed}");
    let used = lines
        .iter()
        .find(|l| l.contains("edge-t"))
        .expect("edge-t's");
    assert!(
        used.contains("once") && used.ends_with("used by edge-t"),
        "{used}"
    );
    let id = lines
        .iter()
        .find(|l| l.contains("<any>"))
        .and_then(|l| l.split_whitespace().next())
        .expect("the second token's id")
        .to_owned();
    let (ok, out, err) = cloudcore(&cloud_dir, &admin, &["delete", &id]);
    assert!(ok, "{err}");
    assert_eq!(out, format!("token {id} revoked"));
    let (ok, err) = edgecore_join(&certs, &revoked, "edge-v", &format!("{dir}/v"));
    assert!(!ok);
    assert!(
        err.contains(&format!("join token {id} was revoked")),
        "{err}"
    );
    let (_, listed, _) = cloudcore(&cloud_dir, &admin, &["list"]);
    assert!(
        listed
            .lines()
            .any(|l| l.starts_with(&id) && l.ends_with("revoked")),
        "{listed}"
    );
    // An id the ledger never recorded (a typo) is an error that changes
    // nothing; as `--unrecorded` it is revoked.
    let (ok, _, err) = cloudcore(&cloud_dir, &admin, &["delete", "ffffffffffffffff"]);
    assert!(!ok);
    assert!(
        err.contains("(NotFound)") && err.contains("\"ffffffffffffffff\" not found"),
        "{err}"
    );
    let (_, unchanged, _) = cloudcore(&cloud_dir, &admin, &["list"]);
    assert_eq!(unchanged, listed);
    let (ok, out, err) = cloudcore(
        &cloud_dir,
        &admin,
        &["delete", "ffffffffffffffff", "--unrecorded"],
    );
    assert!(ok, "{err}");
    assert_eq!(out, "token ffffffffffffffff revoked");

    // edge-t connects; its Node is deleted; its next connect is refused.
    let edge = start_edge(&hub, &edge_dir);
    cloud.wait_for("node connected node=edge-t", Duration::from_secs(30));
    until("edge-t's Node", || {
        let (ok, _, _) = ctl(&admin, &["get", "node", "edge-t"]);
        ok.then_some(())
    });
    // Deleted while linked: its link is closed, and its reconnect refused.
    let (ok, _, err) = ctl(&admin, &["delete", "node", "edge-t"]);
    assert!(ok, "{err}");
    cloud.wait_for(
        "node deleted: its certificates are revoked node=edge-t",
        Duration::from_secs(30),
    );
    let closed = cloud.wait_for(
        "the node's certificate was revoked (the node was deleted); its link is closed",
        Duration::from_secs(30),
    );
    assert!(closed.contains("node=edge-t"), "{closed}");
    let refused = cloud.wait_for("link refused", Duration::from_secs(30));
    assert!(refused.contains("node=edge-t"), "{refused}");
    assert!(refused.contains("was revoked"), "{refused}");
    drop(edge);
    let old = hub::certs::NodeCredentials::load(std::path::Path::new(&format!("{edge_dir}/pki")))
        .expect("load")
        .expect("stored");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    match runtime.block_on(hub::certs::renew(&certs, "localhost", &old)) {
        Err(hub::certs::JoinError::Refused { status, reason }) => {
            assert_eq!(status.as_u16(), 403);
            assert!(reason.contains("revoked"), "{reason}");
        }
        other => panic!("renewal not refused: {:?}", other.map(|c| c.node)),
    }

    // Joined again with a new token: served again.
    let (ok, token, _) = cloudcore(&cloud_dir, &admin, &["create", "--node", "edge-t"]);
    assert!(ok);
    let rejoined = format!("{dir}/rejoined");
    let (ok, err) = edgecore_join(&certs, &token, "edge-t", &rejoined);
    assert!(ok, "{err}");
    let edge = start_edge(&hub, &rejoined);
    cloud.wait_for("node connected node=edge-t", Duration::from_secs(30));
    edge.stop();
    cloud.stop();
}
