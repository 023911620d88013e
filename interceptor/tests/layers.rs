//! The hook's modules run one way: each may use only modules of its own layer or of a layer below,
//! and no two modules use each other, directly or around a loop. This test reads the hook's sources
//! (`interceptor/src/*.rs`), collects every `crate::module` reference outside comments (`use
//! crate::x`, `use crate::{x, y::z}`, `crate::x::f(..)`), and fails on a reference upwards, on a
//! cycle, and on a module no layer lists.
//!
//! The layers are declared once, in `docs/architecture.md` ("Layers of the hook"), and read from
//! there ([`layers`]); the crate root's header lists the modules without repeating the layers.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The layers, lowest first: (name, modules), read from their one declaration, the table under
/// "## Layers of the hook" in `docs/architecture.md` (one row per layer, `| n | name | `module`,
/// `module` | does |`). The crate root (`lib.rs`) declares the modules and runs start-up; it stands
/// above every layer.
fn layers() -> Vec<(String, Vec<String>)> {
    let doc = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/architecture.md"),
    )
    .expect("docs/architecture.md is readable");
    let section = doc
        .split("## Layers of the hook")
        .nth(1)
        .expect("docs/architecture.md has a section `## Layers of the hook`");
    let section = section.split("\n## ").next().unwrap_or(section);
    section
        .lines()
        .filter_map(|line| {
            let cells: Vec<&str> = line.split('|').map(str::trim).collect();
            // ["", n, name, modules, does, ""]
            if cells.len() < 5 || cells[1].parse::<usize>().is_err() {
                return None;
            }
            let modules = cells[3]
                .split(',')
                .map(|m| m.trim().trim_matches('`').to_string())
                .filter(|m| !m.is_empty())
                .collect();
            Some((cells[2].to_string(), modules))
        })
        .collect()
}

fn src_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// `text` without its comments (`//` to the end of the line, `/* ... */`), string literals kept
/// apart so that a `//` inside one is not taken for a comment.
fn strip_comments(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    let mut in_string = false;
    while i < bytes.len() {
        let c = bytes[i];
        if in_string {
            if c == b'\\' {
                i += 2;
                continue;
            }
            if c == b'"' {
                in_string = false;
            }
            i += 1;
            continue;
        }
        // A character literal of a quote is no string.
        if bytes[i..].starts_with(b"'\"'") || bytes[i..].starts_with(b"'\\\"'") {
            i += if bytes[i + 1] == b'"' { 3 } else { 4 };
            continue;
        }
        if c == b'"' {
            in_string = true;
            i += 1;
            continue;
        }
        if bytes[i..].starts_with(b"//") {
            while i < bytes.len() && bytes[i] != b'\n' {
                i += 1;
            }
            continue;
        }
        if bytes[i..].starts_with(b"/*") {
            i += 2;
            while i < bytes.len() && !bytes[i..].starts_with(b"*/") {
                i += 1;
            }
            i += 2;
            continue;
        }
        out.push(c as char);
        i += 1;
    }
    out
}

fn ident_at(s: &str) -> &str {
    let end = s
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(s.len());
    &s[..end]
}

/// The modules `code` (comments already stripped) refers to through `crate::`.
fn references(code: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let mut rest = code;
    while let Some(at) = rest.find("crate::") {
        let before = rest[..at].chars().next_back();
        rest = &rest[at + "crate::".len()..];
        if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == '$') {
            continue; // `$crate::` or part of a longer name
        }
        let rest_trimmed = rest.trim_start();
        if let Some(group) = rest_trimmed.strip_prefix('{') {
            // `crate::{a, b::c, d::{e, f}}`: the first name of each top-level element.
            let mut depth = 0usize;
            let mut element_start = true;
            for (i, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => element_start = true,
                    c if element_start && (c.is_ascii_alphabetic() || c == '_') => {
                        found.insert(ident_at(&group[i..]).to_string());
                        element_start = false;
                    }
                    _ => {}
                }
            }
        } else {
            let name = ident_at(rest_trimmed);
            if !name.is_empty() {
                found.insert(name.to_string());
            }
        }
    }
    found
}

fn layer_of(layers: &[(String, Vec<String>)], module: &str) -> Option<usize> {
    layers
        .iter()
        .position(|(_, modules)| modules.iter().any(|m| m == module))
}

/// Every reference `from → to` between the crate's modules, read from the sources.
fn graph() -> BTreeMap<String, BTreeSet<String>> {
    let mut graph = BTreeMap::new();
    for entry in std::fs::read_dir(src_dir()).expect("interceptor/src is readable") {
        let path = entry.expect("a directory entry").path();
        if path.extension().and_then(|e| e.to_str()) != Some("rs") {
            continue;
        }
        let module = path.file_stem().unwrap().to_str().unwrap().to_string();
        if module == "lib" {
            continue;
        }
        let text = std::fs::read_to_string(&path).expect("a source file is readable");
        let mut refs = references(&strip_comments(&text));
        refs.remove(&module);
        graph.insert(module, refs);
    }
    graph
}

/// What is wrong with `graph` under [`layers`]: upward references, unknown modules, cycles.
fn violations(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<String> {
    let layers = layers();
    let layer_of = |m: &str| layer_of(&layers, m);
    let mut wrong = Vec::new();
    for (from, refs) in graph {
        let Some(from_layer) = layer_of(from) else {
            wrong.push(format!("module `{from}` is in no layer"));
            continue;
        };
        for to in refs {
            match layer_of(to) {
                None if graph.contains_key(to) => {
                    wrong.push(format!("module `{to}` is in no layer"))
                }
                // Not a module (an item of the crate root, or a name the compiler will reject).
                None => {}
                Some(to_layer) if to_layer > from_layer => wrong.push(format!(
                    "`{from}` ({}) uses `{to}` ({}), a higher layer",
                    layers[from_layer].0, layers[to_layer].0
                )),
                Some(_) => {}
            }
        }
    }
    // Cycles, within a layer too: depth-first search with the path on a stack.
    fn visit<'a>(
        node: &'a str,
        graph: &'a BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<&'a str>,
        done: &mut BTreeSet<&'a str>,
        wrong: &mut Vec<String>,
    ) {
        if let Some(at) = path.iter().position(|&n| n == node) {
            wrong.push(format!("cycle: {} -> {node}", path[at..].join(" -> ")));
            return;
        }
        if !done.insert(node) {
            return;
        }
        path.push(node);
        for next in graph.get(node).into_iter().flatten() {
            visit(next, graph, path, done, wrong);
        }
        path.pop();
    }
    let mut done = BTreeSet::new();
    for node in graph.keys() {
        visit(node, graph, &mut Vec::new(), &mut done, &mut wrong);
    }
    wrong
}

#[test]
fn modules_use_only_their_own_layer_and_those_below_without_cycles() {
    let graph = graph();
    assert!(graph.len() > 10, "read too few modules: {graph:?}");
    let wrong = violations(&graph);
    assert!(wrong.is_empty(), "layering broken:\n{}", wrong.join("\n"));
    let layers = layers();
    assert!(layers.len() >= 5, "read too few layers: {layers:?}");
    for (_, modules) in &layers {
        for m in modules {
            assert!(
                graph.contains_key(m),
                "layer lists `{m}`, which is no module"
            );
        }
    }
}

#[test]
fn the_reader_of_references_finds_every_form_and_ignores_comments() {
    let code = strip_comments(
        "use crate::driver::{self, DriverFn};\n\
         use crate::{ffi::*, state, trace::{self, EntryCode}};\n\
         // crate::exports in a comment\n\
         /* crate::dlsym in a block comment */\n\
         let s = \"// not a comment\"; let q = '\"'; crate::hooks::mem_alloc(); $crate::nvml::x();\n",
    );
    let refs = references(&code);
    let want: BTreeSet<String> = ["driver", "ffi", "state", "trace", "hooks"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    assert_eq!(refs, want);
}

#[test]
fn an_upward_reference_or_a_cycle_is_caught() {
    let graph = |edges: &[(&str, &str)]| {
        let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (from, to) in edges {
            g.entry(from.to_string())
                .or_default()
                .insert(to.to_string());
            g.entry(to.to_string()).or_default();
        }
        g
    };
    assert!(violations(&graph(&[
        ("driver_hooks", "driver"),
        ("exports", "driver_hooks")
    ]))
    .is_empty());
    let up = violations(&graph(&[("driver", "exports")]));
    assert!(up.iter().any(|w| w.contains("higher layer")), "{up:?}");
    let cycle = violations(&graph(&[("trace", "report"), ("report", "trace")]));
    assert!(cycle.iter().any(|w| w.starts_with("cycle")), "{cycle:?}");
    let unknown = violations(&graph(&[("newthing", "ffi")]));
    assert!(
        unknown.iter().any(|w| w.contains("no layer")),
        "{unknown:?}"
    );
}
