//! Every crate root's `//!` header names each module the file declares (as `` [`module`] ``), so
//! a header cannot drift from the modules again: the roots of the hook, the reader, the CLI (and its
//! `plot`) and the Python bindings are read here. And no two modules of the reader, the CLI or the
//! CLI's `plot` use each other, even around a loop (the hook's modules are held to their layers by
//! `interceptor/tests/layers.rs`; the Python bindings have one module).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The roots whose headers list their modules, relative to the repository.
const ROOTS: &[&str] = &[
    "interceptor/src/lib.rs",
    "reader/src/lib.rs",
    "cli/src/main.rs",
    "cli/src/plot/mod.rs",
    "python/src/lib.rs",
];

/// The modules `source` declares (`mod x;`, `pub mod x;`) that its header does not name.
fn unnamed_modules(source: &str) -> Vec<String> {
    let header: String = source
        .lines()
        .take_while(|l| l.starts_with("//!"))
        .collect::<Vec<_>>()
        .join("\n");
    source
        .lines()
        .filter_map(|l| {
            let l = l.trim();
            let rest = l.strip_prefix("pub ").unwrap_or(l);
            rest.strip_prefix("mod ")?.strip_suffix(';').map(str::trim)
        })
        .filter(|m| !header.contains(&format!("[`{m}`]")))
        .map(str::to_string)
        .collect()
}

#[test]
fn crate_headers_name_every_module() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut wrong = Vec::new();
    for file in ROOTS {
        let source = std::fs::read_to_string(root.join(file)).expect("a crate root is readable");
        assert!(source.contains("mod "), "{file} declares no module");
        for m in unnamed_modules(&source) {
            wrong.push(format!("{file}: its header does not name module `{m}`"));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn a_module_missing_from_the_header_is_caught() {
    let source = "//! Modules: [`a`] and [`b`].\n\nmod a;\npub mod b;\nmod c;\n#[cfg(test)]\nmod tests {\n}\n";
    assert_eq!(unnamed_modules(source), ["c"]);
}

/// The modules under `src` (a crate's sources, or a module's folder), each with the other modules
/// of that level its code (before its tests, outside `//` comments) names as `<prefix>module`
/// (`crate::` for a crate, `super::` for a module's folder).
fn module_graph(src: &Path, prefix: &str) -> BTreeMap<String, BTreeSet<String>> {
    fn files(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).expect("a source directory is readable") {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                files(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    let mut all = Vec::new();
    files(src, &mut all);
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for path in all {
        let relative = path.strip_prefix(src).expect("under src");
        let first = relative.components().next().expect("a file name");
        let module = first
            .as_os_str()
            .to_string_lossy()
            .trim_end_matches(".rs")
            .to_string();
        if ["lib", "main", "mod"].contains(&module.as_str()) {
            continue;
        }
        let text = std::fs::read_to_string(&path).expect("a source file is readable");
        let code = text.split("#[cfg(test)]").next().unwrap_or("");
        let refs = graph.entry(module.clone()).or_default();
        for line in code.lines() {
            let line = line.split("//").next().unwrap_or("");
            for (at, _) in line.match_indices(prefix) {
                if line[..at].ends_with(|c: char| c.is_alphanumeric() || c == '_' || c == '$') {
                    continue;
                }
                let name: String = line[at + prefix.len()..]
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                if !name.is_empty() && name != module {
                    refs.insert(name);
                }
            }
        }
    }
    let modules: BTreeSet<String> = graph.keys().cloned().collect();
    for refs in graph.values_mut() {
        refs.retain(|r| modules.contains(r));
    }
    graph
}

/// A cycle of `graph`, written `a -> b -> a`, if it has one.
fn a_cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<String> {
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<String> {
        if let Some(at) = path.iter().position(|n| n == node) {
            return Some(format!("{} -> {node}", path[at..].join(" -> ")));
        }
        if !done.insert(node.to_string()) {
            return None;
        }
        path.push(node.to_string());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(cycle) = visit(next, graph, path, done) {
                return Some(cycle);
            }
        }
        path.pop();
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|node| visit(node, graph, &mut Vec::new(), &mut done))
}

#[test]
fn no_two_modules_of_a_crate_use_each_other() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    for (src, prefix) in [
        ("reader/src", "crate::"),
        ("cli/src", "crate::"),
        ("cli/src/plot", "super::"),
    ] {
        let graph = module_graph(&root.join(src), prefix);
        assert!(graph.len() > 1, "{src}: read too few modules: {graph:?}");
        assert_eq!(a_cycle(&graph), None, "{src} has an import cycle");
    }
}

#[test]
fn a_cycle_is_found() {
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
    assert_eq!(a_cycle(&graph(&[("a", "b"), ("b", "c")])), None);
    assert_eq!(
        a_cycle(&graph(&[("a", "b"), ("b", "c"), ("c", "a")])).as_deref(),
        Some("a -> b -> c -> a")
    );
}
