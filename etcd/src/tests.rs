//! Tests of the parent module (`lib.rs`).

use super::*;

#[test]
fn a_call_whose_connection_broke_goes_to_another_member_a_timed_out_one_not() {
    use tonic::{Code, Status};
    assert!(try_another(&Status::new(Code::Unavailable, "no leader")));
    assert!(try_another(&Status::new(Code::Unknown, "transport error")));
    // A member killed while the call waited on its connection
    // (seen under load: the kill lands between connect and answer).
    assert!(try_another(&Status::new(
        Code::Cancelled,
        "operation was canceled"
    )));
    assert!(!try_another(&Status::new(
        Code::Cancelled,
        "Timeout expired"
    )));
    assert!(!try_another(&Status::new(
        Code::DeadlineExceeded,
        "deadline"
    )));
}

#[test]
fn a_prefix_ends_just_after_its_last_key() {
    assert_eq!(prefix_end(b"/a/"), b"/a0".to_vec());
    assert_eq!(prefix_end(b"a\xff"), b"b".to_vec());
    assert_eq!(prefix_end(b"\xff\xff"), vec![0]);
}

#[test]
fn endpoints_must_be_urls() {
    assert!(matches!(
        Etcd::connect(&["not a url".to_owned()]),
        Err(EtcdError::Endpoint { .. })
    ));
    assert!(Etcd::connect(&[]).is_err());
}
