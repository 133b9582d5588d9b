//! Tests of the parent module (`leases.rs`).

use super::*;

#[test]
fn a_replica_lease_long_unrenewed_is_not_asked() {
    let lease = |renewed: &str| {
        dynamic(&json!({
            "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": "edgehive-replica-b"},
            "spec": {"holderIdentity": "b", "leaseDurationSeconds": 10, "renewTime": renewed},
        }))
        .expect("a Lease")
    };
    let now: jiff::Timestamp = "2026-11-26T10:00:30Z".parse().expect("time");
    assert!(!long_unrenewed(&lease("2026-11-26T10:00:25.000000Z"), now));
    assert!(!long_unrenewed(&lease("2026-11-26T10:00:11.000000Z"), now));
    assert!(long_unrenewed(&lease("2026-11-26T10:00:05.000000Z"), now));
    // A clock behind the writer's: never skipped for that.
    assert!(!long_unrenewed(&lease("2026-11-26T10:01:30.000000Z"), now));
}

#[test]
fn names_are_dns_subdomains() {
    assert_eq!(replica_lease_name("a").as_deref(), Ok("edgehive-replica-a"));
    assert_eq!(
        claim_lease_name("edge-1.example").as_deref(),
        Ok("edgehive-claim-edge-1.example")
    );
    assert!(replica_lease_name("Host-1").is_err(), "uppercase");
    assert!(replica_lease_name("a_1").is_err());
    assert!(replica_lease_name("a-").is_err());
    assert!(claim_lease_name("a..b").is_err());
    assert!(claim_lease_name(&"n".repeat(238)).is_ok());
    assert!(claim_lease_name(&"n".repeat(239)).is_err(), "over 253");
}
