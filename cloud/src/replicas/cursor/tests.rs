//! Tests of the parent module (`cursor.rs`).

use super::*;

const SECOND: Duration = Duration::from_secs(1);

fn acked(version: u64, claim: i64) -> Acked {
    Acked { version, claim }
}

fn cursor(entries: &[(&str, u64, i64)]) -> Cursor {
    entries
        .iter()
        .map(|(resource, version, claim)| (resource.to_string(), acked(*version, *claim)))
        .collect()
}

fn changes(seen: &[(&str, Seen)]) -> Changes {
    let mut changes = Changes::default();
    for (resource, seen) in seen {
        changes.see(resource, *seen);
    }
    changes
}

#[test]
fn versions_only_grow_under_one_claim_and_a_deletion_takes_away() {
    let base = cursor(&[("a", 5, 7), ("b", 5, 7), ("c", 5, 3), ("d", 5, 7)]);
    let seen = changes(&[
        ("a", Seen::Held(3)),  // older: a stays at 5
        ("b", Seen::Held(9)),  // newer
        ("c", Seen::Held(4)),  // under another claim: only 4 is sure
        ("d", Seen::Unsure),   // a deletion on its way
        ("e", Seen::Held(2)),  // new
        ("f", Seen::Held(2)),  // acknowledged, then deleted
        ("f", Seen::Unsure),   //
        ("f", Seen::Gone),     //
        ("g", Seen::Unsure),   // deleted, then created again
        ("g", Seen::Gone),     //
        ("g", Seen::Held(11)), //
    ]);
    assert_eq!(
        seen.applied_to(&base, 7),
        cursor(&[
            ("a", 5, 7),
            ("b", 9, 7),
            ("c", 4, 7),
            ("d", 0, 7),
            ("e", 2, 7),
            ("g", 11, 7),
        ])
    );
    // An older acknowledgement after the object was unsure: exactly it.
    let seen = changes(&[("a", Seen::Unsure), ("a", Seen::Held(3))]);
    assert_eq!(seen.applied_to(&base, 7)["a"], acked(3, 7));
    // Split in two writes, the same.
    let (first, second) = (
        changes(&[("b", Seen::Held(9)), ("f", Seen::Held(2))]),
        changes(&[("f", Seen::Gone), ("b", Seen::Held(8))]),
    );
    let once = first.clone().then(second.clone()).applied_to(&base, 7);
    let twice = second.applied_to(&first.applied_to(&base, 7), 7);
    assert_eq!(once, twice);
    assert_eq!(once["b"], acked(9, 7));
    assert!(!once.contains_key("f"));
}

#[test]
fn under_another_claim_only_what_takes_away_is_written() {
    let write = Write {
        node: "n1".into(),
        base: Some(Stored {
            claim: 3,
            revision: 10,
            cursor: cursor(&[("a", 5, 3)]),
        }),
        changes: changes(&[("a", Seen::Held(9)), ("b", Seen::Unsure), ("c", Seen::Gone)]),
    };
    let (base, kept) = write.clone().under(3);
    assert!(base.is_some());
    assert_eq!(kept, write.changes);
    let (base, kept) = write.under(4);
    assert_eq!(base, None, "read again");
    assert_eq!(kept, changes(&[("b", Seen::Unsure), ("c", Seen::Gone)]));
}

fn stored(claim: i64, revision: i64, cursor: Cursor) -> Stored {
    Stored {
        claim,
        revision,
        cursor,
    }
}

#[test]
fn a_nodes_changes_are_written_at_most_once_a_second() {
    let mut book = CursorBook::new(SECOND);
    let t0 = Instant::now();
    book.see("n1", "default/pod/a", Seen::Held(3));
    // The first change goes at once.
    let writes = book.due(t0);
    assert_eq!(writes.len(), 1);
    assert_eq!(writes[0].base, None, "read first");
    assert!(book.due(t0).is_empty(), "one write at a time");
    book.see("n1", "default/pod/b", Seen::Held(4));
    let written = writes[0].changes.applied_to(&Cursor::new(), 7);
    book.written("n1", Outcome::Written(stored(7, 20, written)), t0);
    // The next waits a second.
    book.see("n1", "default/pod/c", Seen::Held(5));
    assert!(book.due(t0 + SECOND / 2).is_empty());
    let writes = book.due(t0 + SECOND);
    assert_eq!(writes.len(), 1);
    assert_eq!(writes[0].base.as_ref().map(|b| b.revision), Some(20));
    assert_eq!(
        writes[0].changes,
        changes(&[
            ("default/pod/b", Seen::Held(4)),
            ("default/pod/c", Seen::Held(5))
        ])
    );
    // Meanwhile the view has everything.
    book.see("n1", "default/pod/a", Seen::Unsure);
    assert_eq!(
        book.view("n1"),
        Some(cursor(&[
            ("default/pod/a", 0, 7),
            ("default/pod/b", 4, 7),
            ("default/pod/c", 5, 7),
        ]))
    );
    // A failed write is tried again after a rest, with what came since.
    book.written("n1", Outcome::Failed, t0 + SECOND);
    assert!(book.due(t0 + SECOND).is_empty());
    let writes = book.due(t0 + SECOND * 2);
    assert_eq!(
        writes[0].changes,
        changes(&[
            ("default/pod/a", Seen::Unsure),
            ("default/pod/b", Seen::Held(4)),
            ("default/pod/c", Seen::Held(5))
        ])
    );
    assert!(!book.settled("n1"));
    // Not held here: only what takes away is kept, until a second
    // write finds nothing new.
    book.written("n1", Outcome::NotHeld, t0 + SECOND * 2);
    assert_eq!(book.view("n1"), None, "read again first");
    assert!(book.due(t0 + SECOND * 2).is_empty(), "after a rest");
    let writes = book.due(t0 + SECOND * 3);
    assert_eq!(
        writes[0].changes,
        changes(&[("default/pod/a", Seen::Unsure)])
    );
    book.written("n1", Outcome::NotHeld, t0 + SECOND * 3);
    assert!(book.settled("n1") && book.is_empty(), "forgotten");
}

#[test]
fn a_session_end_or_a_flush_writes_at_once() {
    let mut book = CursorBook::new(SECOND);
    let t0 = Instant::now();
    book.read("n1", stored(7, 20, Cursor::new()));
    book.see("n1", "default/pod/a", Seen::Held(3));
    let first = book.due(t0);
    book.written(
        "n1",
        Outcome::Written(stored(
            7,
            21,
            first[0].changes.applied_to(&Cursor::new(), 7),
        )),
        t0,
    );
    book.see("n1", "default/pod/b", Seen::Held(4));
    assert!(book.due(t0).is_empty());
    book.flush("n1");
    assert_eq!(book.due(t0).len(), 1, "flushed");
    book.written("n1", Outcome::Failed, t0);
    book.see("n2", "default/pod/c", Seen::Held(1));
    book.flush_all();
    assert_eq!(book.due(t0).len(), 2, "every node");
    // The session ends while a write is under way; a next session's
    // unsure object is kept, its acknowledgements are not.
    book.end("n1");
    book.see("n1", "default/pod/d", Seen::Held(6));
    book.see("n1", "default/pod/e", Seen::Unsure);
    book.written("n1", Outcome::Failed, t0);
    assert_eq!(book.view("n1"), None, "read again first");
    let writes = book.due(t0);
    assert_eq!(
        writes[0].changes,
        changes(&[("default/pod/e", Seen::Unsure)])
    );
    book.written("n1", Outcome::Written(stored(7, 30, Cursor::new())), t0);
    assert!(book.settled("n1"));
    // A settled node's end forgets it at once.
    book.read("n3", stored(7, 5, Cursor::new()));
    book.end("n3");
    assert_eq!(book.view("n3"), None);
    book.written("n2", Outcome::Written(stored(7, 31, Cursor::new())), t0);
    assert!(book.all_settled());
}

#[test]
fn a_cursor_read_back_is_what_was_written() {
    let written = cursor(&[("default/pod/a", 12, 7), ("default/configmap/c", 0, 9)]);
    assert_eq!(decode(&encode(&written)), written);
    assert_eq!(
        String::from_utf8(encode(&written)).expect("utf-8"),
        r#"{"default/configmap/c":[0,9],"default/pod/a":[12,7]}"#
    );
    assert_eq!(decode(b"not json"), Cursor::new());
}
