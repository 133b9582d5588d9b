//! Test support: loopback ports that tests running side by side, in any
//! number of processes, are never both handed.
//!
//! Binding port 0 and handing the port on is not enough where a test stops
//! a listener and starts it again on the same port (a cloud restart): in
//! between, the kernel may give that port to any other process as a
//! listener's or an outgoing connection's port. Ports from here lie below
//! the kernel's ephemeral range (where it starts above 21,000, as it does
//! by default), so the kernel hands them to nobody, and each is held for its
//! process by a lock on a file named after it, so another test process
//! skips it.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::hash::{BuildHasher, RandomState};
use std::net::{Ipv4Addr, TcpListener, UdpSocket};
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::sync::{Mutex, PoisonError};

/// The locks this process holds, by port; released when it exits.
static HELD: Mutex<BTreeMap<u16, File>> = Mutex::new(BTreeMap::new());

/// Lowest port handed out: above the defaults of cloudcore and edgecore.
const LOWEST: u16 = 20_000;

/// A loopback port free for TCP and UDP, held for this process until it
/// exits: no other caller of this function, in this process or another,
/// gets it meanwhile.
///
/// # Panics
/// When the directory of lock files cannot be made, or no port of the
/// range is free (a test helper: such a machine cannot run the tests).
pub fn free_port() -> u16 {
    let dir = lock_dir();
    let span = ephemeral_range_start().max(LOWEST + 1_000) - LOWEST;
    let start = RandomState::new().hash_one(std::process::id()) % u64::from(span);
    let mut held = HELD.lock().unwrap_or_else(PoisonError::into_inner);
    // Once round the range from a random start.
    for step in 0..span {
        let offset = (start + u64::from(step)) % u64::from(span);
        let port = LOWEST + u16::try_from(offset).unwrap_or(0);
        if held.contains_key(&port) {
            continue;
        }
        // Never truncated, and one that is not ours to write is skipped.
        let Ok(file) = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .open(dir.join(port.to_string()))
        else {
            continue;
        };
        if file.try_lock().is_ok() && bindable(port) {
            held.insert(port, file);
            return port;
        }
    }
    panic!(
        "no free port from {LOWEST} on (lock files in {})",
        dir.display()
    )
}

/// `127.0.0.1:` and a port from [`free_port`].
pub fn free_address() -> String {
    format!("127.0.0.1:{}", free_port())
}

/// Where the lock files live, made if missing: one directory per user.
fn lock_dir() -> PathBuf {
    let user = std::fs::metadata("/proc/self").map_or(0, |m| m.uid());
    let dir = std::env::temp_dir().join(format!("edgehive-test-ports-{user}"));
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
        let other = File::open(lock_dir().join(port.to_string())).expect("open");
        assert!(other.try_lock().is_err(), "port {port} was not held");
    }
}
