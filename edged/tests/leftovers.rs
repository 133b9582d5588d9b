//! The check that ends the test suite: nothing any test started is left in
//! the test containerd (`EDGEHIVE_CRI_SOCKET`, else edgehive's default).
//! `scripts/test` runs it after every other test; it is ignored otherwise,
//! as it would fail while other tests' pods run. What is the tests' is
//! decided by the node label (`edged::testing`, docs/testing.md); whatever
//! else containerd holds is listed and left alone.
//!
//! By hand, after a run: `cargo nextest run --workspace --all-features
//! --run-ignored only -E 'binary_id(edged::leftovers)' --no-capture`.

use edged::Cri;
use edged::testing::{NODE_PREFIX, cri_socket, inventory};

#[tokio::test]
#[ignore = "the end of the suite's check: scripts/test runs it after every other test"]
async fn nothing_the_tests_started_is_left_in_containerd() {
    let socket = cri_socket();
    let cri = Cri::connect(&socket)
        .await
        .unwrap_or_else(|err| panic!("{err}; run ./scripts/setup-containerd first"));
    let held = inventory(&cri).await.expect("containerd lists");
    for other in &held.others {
        println!("not the tests' (no {NODE_PREFIX} node), left alone: {other}");
    }
    let left: Vec<String> = held.tests.iter().map(ToString::to_string).collect();
    assert!(
        left.is_empty(),
        "the tests left {} sandboxes and containers in containerd at {}:\n{}",
        left.len(),
        socket.display(),
        left.join("\n")
    );
    println!(
        "containerd at {}: nothing the tests started is left ({} sandboxes and containers of other nodes)",
        socket.display(),
        held.others.len()
    );
}
