//! MetaServer's `requireAuthorization` against a real cloudcore in
//! embedded mode: no API server issues service account tokens there, so
//! a token is refused with 401 (saying so), while a request without one
//! from loopback is served as before; beyond loopback MetaServer speaks
//! TLS with its own certificate and wants a token; without
//! `requireAuthorization` it refuses to start beyond loopback. (Allowed
//! and forbidden tokens, with kube-apiserver: e2e/tests/kubernetes.rs.)

use std::io::{Read, Write};
use std::time::Duration;

use cloud::AdminClient;
use cloud::admin_client::kubeconfig::AdminCredentials;
use serde_json::Value;
use support::{EdgecoreRun, free_address, join_node, start_cloudcore, tempfile_dir, until};
use transports::testing::free_port;

mod support;

/// `GET path` on `address` in plain HTTP, with `token` as a bearer token if
/// given: the status code and the body as JSON (Null if it is not).
fn get(address: &str, path: &str, token: Option<&str>) -> (u16, Value) {
    let mut stream = std::net::TcpStream::connect(address).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    let authorization = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {address}\r\n{authorization}Connection: close\r\n\r\n"
    )
    .expect("request");
    let mut answer = String::new();
    stream.read_to_string(&mut answer).expect("answer");
    let code = answer
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .expect("a status line");
    let body = answer.split_once("\r\n\r\n").map_or("", |(_, body)| body);
    (code, serde_json::from_str(body).unwrap_or(Value::Null))
}

fn edgecore(edge_dir: &str, hub: &str, metaserver: &str, authorization: bool) -> EdgecoreRun {
    let run = EdgecoreRun::new(edge_dir, hub)
        .with("--metaserver", metaserver)
        .with("--cri-socket", "off")
        .with("--keepalive-secs", "2");
    match authorization {
        true => run.flag("--metaserver-require-authorization"),
        false => run,
    }
}

#[test]
fn metaserver_authorization_with_an_embedded_cloud() {
    let node = "metaauth-1";
    let dir = tempfile_dir("metaauth");
    let (cloud_dir, edge_dir) = (format!("{dir}/cloud"), format!("{dir}/edge"));
    let (hub, certs) = (free_address(), free_address());
    let cloud = start_cloudcore(
        &cloud_dir,
        &hub,
        &certs,
        &["--admin", "off", "--keepalive-secs", "2"],
    );
    cloud.wait_for("certificate endpoints ready", Duration::from_secs(30));
    join_node(&cloud_dir, &certs, node, &edge_dir);

    // Without requireAuthorization, never beyond loopback.
    let open = format!("0.0.0.0:{}", free_port());
    let refused = edgecore(&edge_dir, &hub, &open, false).output();
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "edgecore started on {open}");
    assert!(
        stderr.contains("modules.metaManager.metaServer.requireAuthorization")
            && stderr.contains(&open),
        "{stderr}"
    );

    // With it, on loopback.
    let metaserver = free_address();
    let args = edgecore(&edge_dir, &hub, &metaserver, true);
    let edge = args.start();
    cloud.wait_for(
        &format!("node connected node={node}"),
        Duration::from_secs(30),
    );
    let ready = edge.wait_for("metaserver ready", Duration::from_secs(30));
    assert!(ready.contains("require_authorization=true"), "{ready}");
    // Reviews need the link (before it is up they get 503).
    edge.wait_for("connected to the cloud", Duration::from_secs(30));

    // No token, from loopback: served as without requireAuthorization.
    let path = "/api/v1/namespaces/default/configmaps";
    let (code, list) = get(&metaserver, path, None);
    assert_eq!(code, 200, "{list}");
    assert_eq!(list["kind"], "ConfigMapList");

    // A token: the embedded cloud issues none, so none is anyone.
    // (edgehub logs its connection a moment before it takes questions;
    // until then a review gets 503.)
    let (code, status) = until("a review answered by the cloud", || {
        let (code, status) = get(&metaserver, path, Some("some-token"));
        (code != 503).then_some((code, status))
    });
    assert_eq!(code, 401, "{status}");
    assert_eq!(status["kind"], "Status");
    assert_eq!(status["reason"], "Unauthorized");
    let message = status["message"].as_str().unwrap_or_default();
    assert!(message.contains("Kubernetes mode"), "{message}");
    // The token is never logged.
    edge.wait_for("metaserver: refused", Duration::from_secs(10));
    assert!(
        !edge
            .take_lines()
            .iter()
            .chain(cloud.take_lines().iter())
            .any(|line| line.contains("some-token")),
        "a token in the logs"
    );
    edge.stop();

    // Beyond loopback: TLS with a certificate of its own (written for
    // clients to trust), and a token wanted from every peer there.
    let port = free_port();
    let everywhere = format!("0.0.0.0:{port}");
    let args = edgecore(&edge_dir, &hub, &everywhere, true);
    let edge = args.start();
    let ready = edge.wait_for("metaserver ready", Duration::from_secs(30));
    assert!(ready.contains("tls=true"), "{ready}");
    edge.wait_for("connected to the cloud", Duration::from_secs(30));
    let pem = std::fs::read(format!("{edge_dir}/pki/metaserver.crt")).expect("metaserver.crt");
    let roots = transports::tls::certs_from_pem(&pem).expect("pem");
    let client = |token: Option<&str>| {
        let credentials = AdminCredentials {
            server: format!("https://127.0.0.1:{port}"),
            roots: roots.clone(),
            tls_server_name: Some(node.to_owned()),
            identity: None,
            token: token.map(str::to_owned),
            namespace: None,
        };
        AdminClient::from_credentials(&credentials, None).expect("client")
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let ask = |client: AdminClient| {
        let (code, body) = runtime
            .block_on(client.raw("GET".parse().expect("method"), path, None))
            .expect("an answer over TLS");
        (
            code,
            serde_json::from_slice::<Value>(&body).unwrap_or(Value::Null),
        )
    };
    // Over TLS from loopback, the same: served without a token, a token
    // refused as the cloud says.
    let (code, status) = until("a review answered by the cloud", || {
        let (code, status) = ask(client(Some("some-token")));
        (code != 503).then_some((code, status))
    });
    assert_eq!(code, 401, "{status}");
    let (code, _) = ask(client(None));
    assert_eq!(code, 200);
    // From a peer that is not on loopback (this machine's own address, if
    // it has one), a token is wanted.
    let own = std::net::UdpSocket::bind("0.0.0.0:0")
        .and_then(|socket| {
            socket.connect("10.255.255.255:9")?;
            socket.local_addr()
        })
        .map(|address| address.ip())
        .ok()
        .filter(|ip| !ip.is_loopback() && !ip.is_unspecified());
    if let Some(ip) = own {
        let credentials = AdminCredentials {
            server: format!("https://{ip}:{port}"),
            roots: roots.clone(),
            tls_server_name: Some(node.to_owned()),
            identity: None,
            token: None,
            namespace: None,
        };
        let remote = AdminClient::from_credentials(&credentials, None).expect("client");
        let (code, status) = ask(remote);
        assert_eq!(code, 401, "{status}");
        let message = status["message"].as_str().unwrap_or_default();
        assert!(message.contains("requires a bearer token"), "{message}");
    }
    // Plain HTTP is not spoken there.
    let plain = std::net::TcpStream::connect(format!("127.0.0.1:{port}")).and_then(|mut s| {
        s.set_read_timeout(Some(Duration::from_secs(10)))?;
        write!(
            s,
            "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )?;
        let mut answer = Vec::new();
        let _ = s.read_to_end(&mut answer);
        Ok(answer)
    });
    assert!(
        !plain.unwrap_or_default().starts_with(b"HTTP/1.1 200"),
        "plain HTTP served beyond loopback"
    );
    edge.stop();
    cloud.stop();
}
