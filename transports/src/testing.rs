//! Test support: loopback ports that tests running side by side, in any
//! number of processes, are never both handed.
//!
//! Binding port 0 and handing the port on is not enough where a test stops
//! a listener and starts it again on the same port (a cloud restart): in
//! between, the kernel may give that port to any other process as a
//! listener's or an outgoing connection's port. Ports from here lie below
//! the kernel's ephemeral range, so the kernel hands them to nobody, and
//! each is held for its process by a lock on a file named after it, so
//! another test process skips it.

use std::collections::BTreeMap;
use std::fs::File;
use std::hash::{BuildHasher, RandomState};
use std::net::{Ipv4Addr, TcpListener, UdpSocket};
use std::path::PathBuf;
use std::sync::{Mutex, PoisonError};

/// The locks this process holds, by port; released when it exits.
static HELD: Mutex<BTreeMap<u16, File>> = Mutex::new(BTreeMap::new());

/// Lowest port handed out.
const LOWEST: u16 = 10_000;

/// A loopback port free for TCP and UDP, held for this process until it
/// exits: no other caller of this function, in this process or another,
/// gets it meanwhile.
///
/// # Panics
/// When the directory of lock files cannot be made (a test helper: a
/// machine without a writable temporary directory cannot run the tests).
pub fn free_port() -> u16 {
    let dir = lock_dir();
    let below = ephemeral_range_start().max(LOWEST + 1_000);
    let random = RandomState::new();
    let mut held = HELD.lock().unwrap_or_else(PoisonError::into_inner);
    let mut attempt = 0u64;
    loop {
        attempt += 1;
        let span = u64::from(below - LOWEST);
        let port = LOWEST + u16::try_from(random.hash_one(attempt) % span).unwrap_or(0);
        if held.contains_key(&port) {
            continue;
        }
        let Ok(file) = File::create(dir.join(port.to_string())) else {
            continue;
        };
        if file.try_lock().is_err() || !bindable(port) {
            continue;
        }
        held.insert(port, file);
        return port;
    }
}

/// `127.0.0.1:` and a port from [`free_port`].
pub fn free_address() -> String {
    format!("127.0.0.1:{}", free_port())
}

/// Where the lock files live, made if missing.
fn lock_dir() -> PathBuf {
    let dir = std::env::temp_dir().join("edgehive-test-ports");
    if let Err(err) = std::fs::create_dir_all(&dir) {
        panic!("{}: {err}", dir.display());
    }
    dir
}

/// Whether nobody holds `port` on loopback, for TCP or UDP (QUIC).
fn bindable(port: u16) -> bool {
    TcpListener::bind((Ipv4Addr::LOCALHOST, port)).is_ok()
        && UdpSocket::bind((Ipv4Addr::LOCALHOST, port)).is_ok()
}

/// The first port of the kernel's ephemeral range.
fn ephemeral_range_start() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse().ok())
        .unwrap_or(32_768)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_below_the_ephemeral_range_and_never_handed_out_twice() {
        let ports: Vec<u16> = (0..50).map(|_| free_port()).collect();
        let below = ephemeral_range_start().max(LOWEST + 1_000);
        assert!(
            ports.iter().all(|p| (LOWEST..below).contains(p)),
            "{ports:?}"
        );
        let mut distinct = ports.clone();
        distinct.sort_unstable();
        distinct.dedup();
        assert_eq!(distinct.len(), ports.len(), "{ports:?}");
    }

    #[test]
    fn a_port_held_by_another_process_is_skipped() {
        let port = free_port();
        // Another process's lock, as seen from here: a second open file
        // description cannot take it either.
        let other = File::create(lock_dir().join(port.to_string())).expect("open");
        assert!(other.try_lock().is_err(), "port {port} was not held");
    }
}
