//! The cloud crate's top-level folders (KubeEdge's module names:
//! edgecontroller, devicecontroller, dynamiccontroller, cloudstream, admin,
//! desired, ...) use each other in one direction only. A use is a
//! `crate::<module>` path in code (comments and doc links do not count);
//! a circle between two folders fails this test, which names it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Each top-level module of `src/` and the other top-level modules its
/// code names.
fn uses(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut files = vec![src.to_path_buf()];
    while let Some(path) = files.pop() {
        if path.is_dir() {
            for entry in std::fs::read_dir(&path).expect("src is readable") {
                files.push(entry.expect("a directory entry").path());
            }
            continue;
        }
        if path.extension().is_none_or(|ext| ext != "rs") {
            continue;
        }
        let module = module_path(path.strip_prefix(src).expect("under src"));
        let Some(first) = module.first().cloned() else {
            continue; // lib.rs
        };
        let text = std::fs::read_to_string(&path).expect("a readable source file");
        let used = graph.entry(first.clone()).or_default();
        for line in text.lines() {
            for name in named_modules(&code_of(line), &module) {
                if name != first {
                    used.insert(name);
                }
            }
        }
    }
    graph
}

/// The module a file under `src/` is: `a/b.rs` and `a/b/mod.rs` are
/// `[a, b]`; `lib.rs` is the root, `[]`.
fn module_path(relative: &Path) -> Vec<String> {
    let mut parts: Vec<String> = relative
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if let Some(last) = parts.pop() {
        match last.trim_end_matches(".rs") {
            "mod" | "lib" => {}
            stem => parts.push(stem.to_owned()),
        }
    }
    parts
}

/// A line without its comment and its string literals.
fn code_of(line: &str) -> String {
    let mut code = String::new();
    let mut in_string = false;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match (in_string, c) {
            (false, '/') if chars.peek() == Some(&'/') => break,
            (false, '"') => in_string = true,
            (true, '\\') => {
                chars.next();
            }
            (true, '"') => in_string = false,
            (false, c) => code.push(c),
            (true, _) => {}
        }
    }
    code
}

/// The top-level modules that the paths in `code`, written in `module`,
/// name: `crate::x`, `crate::{x, y::z}`, and `super::` chains that climb to
/// the root (`super::super::x` in `a/b.rs`).
fn named_modules(code: &str, module: &[String]) -> Vec<String> {
    let ident = |s: &str| -> String {
        s.trim_start()
            .chars()
            .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_')
            .collect()
    };
    let mut names = Vec::new();
    let mut rest = code;
    while let Some(at) = rest.find("crate::") {
        let after = &rest[at + "crate::".len()..];
        if let Some(group) = after.strip_prefix('{') {
            let group = group.split('}').next().unwrap_or("");
            names.extend(group.split(',').map(ident));
        } else {
            names.push(ident(after));
        }
        rest = after;
    }
    let mut rest = code;
    while let Some(at) = rest.find("super::") {
        // Only the start of a chain: not a `super::` inside one.
        let before = &rest[..at];
        let mut after = &rest[at..];
        let mut up = 0;
        while let Some(next) = after.strip_prefix("super::") {
            up += 1;
            after = next;
        }
        if !before.ends_with("::") && up == module.len() {
            names.push(ident(after));
        }
        rest = &rest[at + "super::".len() * up..];
    }
    names.retain(|name| !name.is_empty());
    names
}

/// A circle in `graph`, as the modules along it, if there is one.
fn circle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|n| n == node) {
            let mut found = path[at..].to_vec();
            found.push(node.to_owned());
            return Some(found);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_owned());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(found) = visit(next, graph, path, done) {
                return Some(found);
            }
        }
        path.pop();
        done.insert(node.to_owned());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|node| visit(node, graph, &mut Vec::new(), &mut done))
}

#[test]
fn the_top_level_folders_use_each_other_one_way() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let graph = uses(&src);
    for name in [
        "edgecontroller",
        "devicecontroller",
        "dynamiccontroller",
        "cloudstream",
        "admin",
        "desired",
    ] {
        assert!(graph.contains_key(name), "src/{name} is missing");
    }
    assert_eq!(circle(&graph), None, "a circle between folders: {graph:#?}");
}

#[test]
fn paths_are_read_however_they_are_written() {
    let in_ab = ["a".to_owned(), "b".to_owned()];
    assert_eq!(named_modules("use crate::x::Y;", &in_ab), vec!["x"]);
    assert_eq!(
        named_modules("use crate::{x, y::Z};", &in_ab),
        vec!["x", "y"]
    );
    assert_eq!(named_modules("use super::super::z;", &in_ab), vec!["z"]);
    assert!(named_modules("use super::sibling;", &in_ab).is_empty());
    assert_eq!(named_modules("use super::x;", &["a".to_owned()]), vec!["x"]);
    assert!(named_modules(&code_of("let s = \"crate::x\"; // crate::y"), &in_ab).is_empty());
    assert_eq!(
        module_path(Path::new("a/b/mod.rs")),
        vec!["a".to_owned(), "b".to_owned()]
    );
    assert_eq!(module_path(Path::new("a.rs")), vec!["a".to_owned()]);
    assert!(module_path(Path::new("lib.rs")).is_empty());
}

#[test]
fn a_circle_is_found_and_named() {
    let graph: BTreeMap<String, BTreeSet<String>> = [
        ("a", vec!["b"]),
        ("b", vec!["c"]),
        ("c", vec!["a"]),
        ("d", vec![]),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.into_iter().map(str::to_owned).collect()))
    .collect();
    assert_eq!(
        circle(&graph),
        Some(vec!["a".into(), "b".into(), "c".into(), "a".into()])
    );
    let line: BTreeMap<String, BTreeSet<String>> = [("a", vec!["b"]), ("b", vec![])]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.into_iter().map(str::to_owned).collect()))
        .collect();
    assert_eq!(circle(&line), None);
}
