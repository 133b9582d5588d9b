//! Tests of the parent module (`logs.rs`).

use super::*;

#[test]
fn a_log_over_its_size_rotates_and_the_oldest_go() {
    let limits = Rotation {
        max_size: 100,
        max_files: 3,
        every: Duration::from_secs(1),
    };
    let names = |list: &[&str]| list.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
    assert_eq!(
        plan(99, &[], &limits),
        RotationPlan {
            rotate: false,
            delete: vec![]
        }
    );
    assert!(plan(100, &[], &limits).rotate);
    // Two rotated kept beside the one written; rotating makes a third.
    let earlier = names(&["0.log.20261123-000002", "0.log.20261123-000001"]);
    assert_eq!(plan(50, &earlier, &limits).delete, Vec::<String>::new());
    assert_eq!(
        plan(150, &earlier, &limits).delete,
        names(&["0.log.20261123-000001"])
    );
    // A count of 1 keeps one rotated file all the same (as the kubelet's
    // minimum of 2).
    let one = Rotation {
        max_files: 1,
        ..limits
    };
    assert_eq!(
        plan(150, &earlier, &one).delete,
        earlier.iter().rev().cloned().collect::<Vec<_>>()
    );
}

/// Whatever the sizes and files, the files kept after a pass (the one
/// written, the rotated ones, and the one rotated now) never exceed
/// the count, and only the oldest go.
#[test]
fn never_more_files_than_the_count() {
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut next = move |below: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % below
    };
    for _ in 0..500 {
        let limits = Rotation {
            max_size: 1 + next(1000),
            max_files: next(8) as usize,
            every: Duration::from_secs(1),
        };
        let earlier: Vec<String> = (0..next(10))
            .map(|n| format!("0.log.20261123-{n:06}"))
            .collect();
        let size = next(2000);
        let plan = plan(size, &earlier, &limits);
        let kept = earlier.len() - plan.delete.len() + 1 + usize::from(plan.rotate);
        assert!(
            kept <= limits.max_files.max(2),
            "{kept} files for {limits:?}"
        );
        let mut sorted = earlier.clone();
        sorted.sort();
        assert_eq!(plan.delete, sorted[..plan.delete.len()].to_vec());
    }
}

#[test]
fn sizes_as_the_kubelet_writes_them() {
    assert_eq!(parse_size("10Mi"), Ok(10 << 20));
    assert_eq!(parse_size("512Ki"), Ok(512 << 10));
    assert_eq!(parse_size("4096"), Ok(4096));
    assert_eq!(parse_size("1G"), Ok(1_000_000_000));
    assert!(parse_size("ten").is_err());
    assert!(parse_size("10Xi").is_err());
}

fn at(time: &str) -> jiff::Timestamp {
    time.parse().expect("time")
}

#[test]
fn partial_records_make_one_line_and_garbage_is_counted() {
    let mut filter =
        LogFilter::new(&LogOptions::default(), at("2026-11-23T00:00:00Z")).expect("filter");
    assert_eq!(filter.line("2026-11-23T00:00:01.5Z stdout P hel"), None);
    assert_eq!(
        filter.line("2026-11-23T00:00:01.6Z stdout F lo"),
        Some("hello\n".to_owned())
    );
    assert_eq!(filter.line("not a record"), None);
    assert_eq!(filter.line("2026-11-23T00:00:02Z stdin F x"), None);
    assert_eq!(filter.garbled, 2);
    assert_eq!(
        filter.line("2026-11-23T00:00:03Z stderr F "),
        Some("\n".to_owned())
    );
}

#[test]
fn since_timestamps_and_the_byte_limit() {
    let options = LogOptions {
        since_seconds: Some(10),
        timestamps: true,
        limit_bytes: Some(40),
        ..LogOptions::default()
    };
    let mut filter = LogFilter::new(&options, at("2026-11-23T00:01:00Z")).expect("filter");
    assert_eq!(filter.line("2026-11-23T00:00:49Z stdout F old"), None);
    let line = filter
        .line("2026-11-23T00:00:50Z stdout F new")
        .expect("within the last 10 s");
    assert_eq!(line, "2026-11-23T00:00:50Z new\n");
    assert_eq!(filter.limit(line.clone()), (line, false));
    let (cut, full) = filter.limit("0123456789abcdefghij".to_owned());
    assert_eq!((cut.as_str(), full), ("0123456789abcde", true));
    assert!(
        LogFilter::new(
            &LogOptions {
                since_time: Some("yesterday".to_owned()),
                ..LogOptions::default()
            },
            at("2026-11-23T00:00:00Z")
        )
        .is_err()
    );
}

#[test]
fn the_latest_or_the_previous_attempt() {
    let dir = tempfile::tempdir().expect("dir");
    for attempt in [0, 2, 10] {
        std::fs::write(dir.path().join(format!("{attempt}.log")), "x").expect("write");
    }
    std::fs::write(dir.path().join("10.log.20261123-000000"), "x").expect("write");
    assert_eq!(log_file(dir.path(), false), Some(dir.path().join("10.log")));
    assert_eq!(log_file(dir.path(), true), Some(dir.path().join("2.log")));
    assert_eq!(log_file(&dir.path().join("none"), false), None);
}
