//! The one reader of the repository's module graphs, and the rules checked on them: no crate
//! (the hook, the reader, the CLI, the Python bindings, the benchmarks, these tests) has an import
//! cycle; the hook's modules use only their own layer and those below; no function of the CLI is
//! longer than [`LONGEST_FUNCTION`] lines; no crate names another's modules, and the reader's and
//! the timeline crate's roots rename nothing they export. And the crates' own graph, read with
//! `cargo metadata`: it is the table under "The crates" in `docs/architecture.md`, the hook does
//! not link the timeline crate, and the CLI holds no encoder (no prost, serde-pickle or
//! hand-built Chrome event: the exports are the timeline crate's).
//!
//! A crate's modules are found from its root by their declarations (`mod x;` in `x.rs` or
//! `x/mod.rs`), so the crate root and each `mod.rs` are nodes like any other module. A module uses
//! another when its code (outside comments and strings) names it or an item in it: `crate::x::y`,
//! `super::x`, `self::x`, a child by its bare name (`x::f()`, `use x::T`), and each element of a
//! group (`use super::{a, b}`, `use crate::{x::y, z}`). A path is charged to the deepest module it
//! reaches, so `crate::UsageError` from a module is a use of the crate root. Inline modules
//! (`mod tests { use super::*; }`) belong to their file's module.
//!
//! The hook's layers are declared once, in `docs/architecture.md` ("Layers of the hook"), and read
//! from there ([`layers`]); its crate root declares the modules and runs start-up, and stands above
//! every layer.

use gpumemhook_tests::{doc_table, quoted_names, rust_files_under};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The longest a function of any crate may be, in lines from its `fn` to its closing brace.
const LONGEST_FUNCTION: usize = 80;

/// The source the rule covers: every crate's code (its unit tests included), its build script and
/// its models. Two folders are left out, each for what it is: `bench/`, whose benchmarks are each
/// one straight script of timed steps, read top to bottom beside its table in BENCHMARKS.md; and
/// `tests/integration`, whose tests are each one scenario (start programs, act, assert what a user
/// would see), where a helper per step would hide the order that the scenario is about. Their
/// shared steps are the harness's (`tests/integration/main.rs`).
const MEASURED_SOURCE: &[&str] = &[
    "interceptor/src",
    "reader/src",
    "reader/tests",
    "reader/segment/src",
    "reader/segment/tests",
    "reader/timeline/src",
    "cli/src",
    "python/src",
    "python/build.rs",
];

/// A module graph: each module (`crate`, `plot`, `plot::draw`) with the modules it uses.
type Graph = BTreeMap<String, BTreeSet<String>>;

fn repository() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The workspace's members, as the top-level Cargo.toml lists them (so that a new crate is read
/// without anyone remembering to add it here).
fn workspace_members() -> Vec<String> {
    let manifest =
        std::fs::read_to_string(repository().join("Cargo.toml")).expect("Cargo.toml is readable");
    let list = manifest
        .split_once("\nmembers = [")
        .and_then(|(_, rest)| rest.split_once(']'))
        .expect("Cargo.toml lists the workspace's members")
        .0;
    let members: Vec<String> = list
        .split(',')
        .map(|m| m.trim().trim_matches('"').to_string())
        .filter(|m| !m.is_empty())
        .collect();
    assert!(
        members.iter().any(|m| m == "reader/segment"),
        "read the members wrong: {members:?}"
    );
    members
}

/// Every crate root of the workspace, relative to the repository: each member's library and
/// binaries, its benchmark binaries, its integration tests and this test harness.
fn crate_roots() -> Vec<PathBuf> {
    let root = repository();
    let mut roots = Vec::new();
    for member in workspace_members() {
        let member = member.as_str();
        for file in ["src/lib.rs", "src/main.rs", "integration/main.rs"] {
            if root.join(member).join(file).is_file() {
                roots.push(Path::new(member).join(file));
            }
        }
        for dir in ["src/bin", "tests"] {
            let Ok(entries) = std::fs::read_dir(root.join(member).join(dir)) else {
                continue;
            };
            for entry in entries {
                let path = entry.expect("a directory entry").path();
                let relative = path.strip_prefix(&root).expect("under the repository");
                if path.extension().is_some_and(|e| e == "rs") {
                    roots.push(relative.to_path_buf());
                } else if path.join("main.rs").is_file() {
                    roots.push(relative.join("main.rs"));
                }
            }
        }
    }
    roots.sort();
    roots
}

/// `text` without its comments and the contents of its string and character literals (raw strings
/// too), so that neither a `//` in a string nor a `'{'` is taken for code. Line breaks are kept, so
/// that a line of the result is the same line of the source.
fn strip_comments(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    let ident = |c: char| c.is_alphanumeric() || c == '_';
    // What a skipped stretch leaves: its line breaks only.
    let keep_lines = |out: &mut String, skipped: &[char]| {
        out.extend(skipped.iter().filter(|&&c| c == '\n'));
    };
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        let prev_ident = i > 0 && ident(chars[i - 1]);
        if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let start = i;
            i += 2;
            while i < chars.len() && !(chars[i] == '*' && chars.get(i + 1) == Some(&'/')) {
                i += 1;
            }
            i = (i + 2).min(chars.len());
            keep_lines(&mut out, &chars[start..i]);
        } else if c == 'r' && !prev_ident && matches!(next, Some('"') | Some('#')) {
            // r"..." or r#"..."#: ends at a quote followed by as many hashes.
            let mut j = i + 1;
            while chars.get(j) == Some(&'#') {
                j += 1;
            }
            if chars.get(j) != Some(&'"') {
                out.push(c);
                i += 1;
                continue;
            }
            let hashes = j - i - 1;
            let start = i;
            i = j + 1;
            while i < chars.len() {
                if chars[i] == '"' && (0..hashes).all(|k| chars.get(i + 1 + k) == Some(&'#')) {
                    i += 1 + hashes;
                    break;
                }
                i += 1;
            }
            out.push_str("\"\"");
            keep_lines(&mut out, &chars[start..i.min(chars.len())]);
        } else if c == '"' {
            let start = i;
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                i += if chars[i] == '\\' { 2 } else { 1 };
            }
            i = (i + 1).min(chars.len());
            out.push_str("\"\"");
            keep_lines(&mut out, &chars[start..i]);
        } else if c == '\'' && next == Some('\\') {
            // '\n', '\'', '\u{7f}'
            i += 2;
            while i < chars.len() && chars[i] != '\'' {
                i += 1;
            }
            i += 1;
            out.push_str("' '");
        } else if c == '\'' && chars.get(i + 2) == Some(&'\'') {
            i += 3;
            out.push_str("' '");
        } else {
            // Code, or a lifetime's quote.
            out.push(c);
            i += 1;
        }
    }
    out
}

/// One module of a crate: its path (`crate`, `plot::draw`), its file, and its children.
struct Module {
    path: String,
    code: String,
    children: Vec<String>,
}

/// The modules a file declares (`mod x;`, `pub(crate) mod x;`), outside inline modules.
fn declared_modules(code: &str) -> Vec<String> {
    code.lines()
        .filter_map(|l| {
            let l = l.trim();
            let at = l.find("mod ")?;
            let before = l[..at].trim();
            if !(before.is_empty() || before.starts_with("pub") || before.ends_with(']')) {
                return None;
            }
            l[at + 4..]
                .trim()
                .strip_suffix(';')
                .map(|m| m.trim().to_string())
        })
        .collect()
}

/// Every module of the crate whose root is `root` (relative to the repository), found through
/// their declarations.
fn crate_modules(root: &Path) -> Vec<Module> {
    let repo = repository();
    let mut modules = Vec::new();
    // (module path, its file, the folder its children live in)
    let root_dir = root
        .parent()
        .expect("a crate root lies in a folder")
        .to_path_buf();
    let mut pending = vec![("crate".to_string(), root.to_path_buf(), root_dir)];
    while let Some((path, file, dir)) = pending.pop() {
        let text = std::fs::read_to_string(repo.join(&file))
            .unwrap_or_else(|e| panic!("{} is readable: {e}", file.display()));
        let code = strip_comments(&text);
        let children = declared_modules(&code);
        for child in &children {
            let flat = dir.join(format!("{child}.rs"));
            let nested = dir.join(child).join("mod.rs");
            let child_file = if repo.join(&flat).is_file() {
                flat
            } else if repo.join(&nested).is_file() {
                nested
            } else {
                panic!("{}: module `{child}` has no file", file.display());
            };
            let child_path = if path == "crate" {
                child.clone()
            } else {
                format!("{path}::{child}")
            };
            pending.push((child_path, child_file, dir.join(child)));
        }
        modules.push(Module {
            path,
            code,
            children,
        });
    }
    modules
}

fn ident_at(s: &str) -> &str {
    let end = s
        .find(|c: char| !(c.is_alphanumeric() || c == '_'))
        .unwrap_or(s.len());
    &s[..end]
}

/// Each path of a `use` tree or an expression that starts at `s` (just after `crate::`, `super::`
/// or a module's name and its `::`), its groups expanded: `{a, b::{c, d}}` gives `a`, `b::c`,
/// `b::d`.
fn paths_at(s: &str) -> Vec<String> {
    let s = s.trim_start();
    if let Some(group) = s.strip_prefix('{') {
        let mut paths = Vec::new();
        let mut depth = 0usize;
        let mut element = 0;
        for (i, c) in group.char_indices() {
            match c {
                '{' => depth += 1,
                '}' if depth == 0 => {
                    paths.extend(paths_at(&group[element..i]));
                    break;
                }
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    paths.extend(paths_at(&group[element..i]));
                    element = i + 1;
                }
                _ => {}
            }
        }
        return paths;
    }
    let name = ident_at(s);
    if name.is_empty() {
        return Vec::new();
    }
    match s[name.len()..].trim_start().strip_prefix("::") {
        Some(rest) => {
            let tails = paths_at(rest);
            if tails.is_empty() {
                return vec![name.to_string()];
            }
            tails
                .into_iter()
                .map(|tail| match tail.as_str() {
                    "self" => name.to_string(),
                    _ => format!("{name}::{tail}"),
                })
                .collect()
        }
        None => vec![name.to_string()],
    }
}

/// The modules `module`'s code uses, among `known` (every module of its crate), each path charged
/// to the deepest module it reaches.
fn uses(module: &Module, known: &BTreeSet<String>) -> BTreeSet<String> {
    let parent = match module.path.rsplit_once("::") {
        Some((parent, _)) => parent.to_string(),
        None => "crate".to_string(),
    };
    let join = |base: &str, rest: &str| {
        if base == "crate" {
            rest.to_string()
        } else {
            format!("{base}::{rest}")
        }
    };
    // An inline module's `super::` is its file's module: whether a `super::` is inside one is
    // known from the braces around it.
    let inline_starts = inline_module_bodies(&module.code);
    let mut found = BTreeSet::new();
    let code = &module.code;
    let mut prefixes: Vec<(String, String)> = vec![
        ("crate::".into(), "crate".into()),
        ("super::".into(), parent.clone()),
        ("self::".into(), module.path.clone()),
    ];
    for child in &module.children {
        prefixes.push((format!("{child}::"), join(&module.path, child)));
    }
    for (prefix, base) in &prefixes {
        for (at, _) in code.match_indices(prefix.as_str()) {
            let before = code[..at].chars().next_back();
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '$' || c == ':') {
                continue; // `$crate::`, `std::fs::`, or part of a longer name
            }
            let base = if prefix == "super::" && inside(&inline_starts, at) {
                module.path.clone()
            } else {
                base.clone()
            };
            for path in paths_at(&code[at + prefix.len()..]) {
                let full = if path == "self" {
                    base.clone()
                } else {
                    join(&base, &path)
                };
                // The deepest module the path reaches; the base itself when it names an item.
                let mut reached = base.clone();
                let mut candidate = String::new();
                for segment in full.split("::") {
                    candidate = if candidate.is_empty() || candidate == "crate" {
                        segment.to_string()
                    } else {
                        format!("{candidate}::{segment}")
                    };
                    if known.contains(&candidate) {
                        reached = candidate.clone();
                    }
                }
                found.insert(reached);
            }
        }
    }
    // A declared child is used by `use child;`, `mod child;` alone is no use.
    found.remove(&module.path);
    found
}

/// The byte ranges of `code` that are bodies of inline modules (`mod tests { .. }`).
fn inline_module_bodies(code: &str) -> Vec<(usize, usize)> {
    let mut bodies = Vec::new();
    for (at, _) in code.match_indices("mod ") {
        if code[..at]
            .chars()
            .next_back()
            .is_some_and(|c| c.is_alphanumeric() || c == '_')
        {
            continue;
        }
        let rest = &code[at + 4..];
        let name = ident_at(rest.trim_start());
        let after = rest.trim_start()[name.len()..].trim_start();
        if name.is_empty() || !after.starts_with('{') {
            continue;
        }
        let open = code.len() - after.len();
        if let Some(close) = matching_brace(code, open) {
            bodies.push((open, close));
        }
    }
    bodies
}

fn inside(ranges: &[(usize, usize)], at: usize) -> bool {
    ranges.iter().any(|&(start, end)| start < at && at < end)
}

/// Where the brace that closes the one at `open` is (comments and strings already stripped).
fn matching_brace(code: &str, open: usize) -> Option<usize> {
    let mut depth = 0usize;
    for (i, c) in code[open..].char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return Some(open + i);
                }
            }
            _ => {}
        }
    }
    None
}

/// The module graph of the crate whose root is `root`.
fn graph(root: &Path) -> Graph {
    let modules = crate_modules(root);
    let mut known: BTreeSet<String> = modules.iter().map(|m| m.path.clone()).collect();
    known.insert("crate".into());
    modules
        .iter()
        .map(|m| (m.path.clone(), uses(m, &known)))
        .collect()
}

/// A cycle of `graph`, written `a -> b -> a`, for each place the search meets one.
fn cycles(graph: &Graph) -> Vec<String> {
    fn visit<'a>(
        node: &'a str,
        graph: &'a Graph,
        path: &mut Vec<&'a str>,
        done: &mut BTreeSet<&'a str>,
        found: &mut Vec<String>,
    ) {
        if let Some(at) = path.iter().position(|&n| n == node) {
            found.push(format!("{} -> {node}", path[at..].join(" -> ")));
            return;
        }
        if !done.insert(node) {
            return;
        }
        path.push(node);
        for next in graph.get(node).into_iter().flatten() {
            visit(next, graph, path, done, found);
        }
        path.pop();
    }
    let mut done = BTreeSet::new();
    let mut found = Vec::new();
    for node in graph.keys() {
        visit(node, graph, &mut Vec::new(), &mut done, &mut found);
    }
    found
}

/// A graph from its edges, for the checker's own tests.
fn graph_of(edges: &[(&str, &str)]) -> Graph {
    let mut g = Graph::new();
    for (from, to) in edges {
        g.entry(from.to_string())
            .or_default()
            .insert(to.to_string());
        g.entry(to.to_string()).or_default();
    }
    g
}

#[test]
fn no_crate_has_an_import_cycle() {
    let roots = crate_roots();
    assert!(roots.len() >= 8, "found too few crate roots: {roots:?}");
    let mut wrong = Vec::new();
    for root in &roots {
        let graph = graph(root);
        for cycle in cycles(&graph) {
            wrong.push(format!("{}: cycle {cycle}", root.display()));
        }
    }
    let cli = graph(Path::new("cli/src/main.rs"));
    assert!(
        cli.contains_key("plot::draw") && cli["crate"].contains("run"),
        "the CLI's graph was read wrong: {cli:?}"
    );
    assert!(wrong.is_empty(), "import cycles:\n{}", wrong.join("\n"));
}

#[test]
fn the_reader_of_uses_resolves_groups_super_children_and_the_root() {
    let module = |path: &str, code: &str, children: &[&str]| Module {
        path: path.into(),
        code: strip_comments(code),
        children: children.iter().map(|c| c.to_string()).collect(),
    };
    let known: BTreeSet<String> = [
        "crate",
        "plot",
        "plot::draw",
        "plot::palette",
        "usage",
        "fit",
        "fit::trial",
        "style",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let names = |set: BTreeSet<String>| set.into_iter().collect::<Vec<_>>();
    let draw = module(
        "plot::draw",
        "use super::{device_color, palette::{A, B}};\n\
         // super::fit in a comment\n\
         let s = \"crate::fit\"; let q = '{'; let r = r#\"crate::style\"#;\n\
         crate::{usage::UsageError, style};\n\
         #[cfg(test)] mod tests { use super::*; }\n",
        &[],
    );
    assert_eq!(
        names(uses(&draw, &known)),
        ["plot", "plot::palette", "style", "usage"]
    );
    let root = module(
        "crate",
        "use usage::UsageError;\nfn main() { fit::fit(); }\n",
        &["usage", "fit"],
    );
    assert_eq!(names(uses(&root, &known)), ["fit", "usage"]);
    let trial = module(
        "fit::trial",
        "use crate::UsageError; use super::STDERR_LINES;",
        &[],
    );
    assert_eq!(names(uses(&trial, &known)), ["crate", "fit"]);
}

#[test]
fn a_cycle_is_found() {
    assert!(cycles(&graph_of(&[("a", "b"), ("b", "c")])).is_empty());
    assert_eq!(
        cycles(&graph_of(&[("a", "b"), ("b", "c"), ("c", "a")])),
        ["a -> b -> c -> a"]
    );
    // Through a crate root and a folder's `mod.rs`, as `main` -> `fit` -> `main` was.
    assert_eq!(
        cycles(&graph_of(&[
            ("crate", "fit"),
            ("fit", "fit::trial"),
            ("fit::trial", "crate")
        ])),
        ["crate -> fit -> fit::trial -> crate"]
    );
}

/// The hook's layers, lowest first: (name, modules), read from their one declaration, the table
/// under "## Layers of the hook" in `docs/architecture.md` (one row per layer, `| n | name |
/// `module`, `module` | does |`).
fn layers() -> Vec<(String, Vec<String>)> {
    doc_table("architecture.md", "Layers of the hook")
        .into_iter()
        .map(|cells| (cells[1].clone(), quoted_names(&cells[2])))
        .collect()
}

/// What breaks the layers in the hook's `graph`: upward uses and modules in no layer. The crate
/// root stands above every layer; a submodule is in its top module's layer.
fn layer_violations(graph: &Graph, layers: &[(String, Vec<String>)]) -> Vec<String> {
    let layer_of = |module: &str| {
        let top = module.split("::").next().unwrap_or(module);
        layers
            .iter()
            .position(|(_, modules)| modules.iter().any(|m| m == top))
    };
    let mut wrong = Vec::new();
    for (from, used) in graph.iter().filter(|(from, _)| *from != "crate") {
        let Some(from_layer) = layer_of(from) else {
            wrong.push(format!("module `{from}` is in no layer"));
            continue;
        };
        for to in used {
            match layer_of(to) {
                Some(to_layer) if to_layer > from_layer => wrong.push(format!(
                    "`{from}` ({}) uses `{to}` ({}), a higher layer",
                    layers[from_layer].0, layers[to_layer].0
                )),
                _ => {}
            }
        }
    }
    wrong
}

#[test]
fn the_hooks_modules_use_only_their_own_layer_and_those_below() {
    let graph = graph(Path::new("interceptor/src/lib.rs"));
    assert!(graph.len() > 10, "read too few modules: {graph:?}");
    let layers = layers();
    assert!(layers.len() >= 5, "read too few layers: {layers:?}");
    let wrong = layer_violations(&graph, &layers);
    assert!(wrong.is_empty(), "layering broken:\n{}", wrong.join("\n"));
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
fn an_upward_use_or_a_module_in_no_layer_is_caught() {
    let layers: Vec<(String, Vec<String>)> = vec![
        ("low".into(), vec!["ffi".into(), "driver".into()]),
        ("high".into(), vec!["exports".into()]),
    ];
    let fine = graph_of(&[("exports", "driver"), ("crate", "exports")]);
    assert!(layer_violations(&fine, &layers).is_empty());
    let up = layer_violations(&graph_of(&[("driver", "exports")]), &layers);
    assert!(up.iter().any(|w| w.contains("higher layer")), "{up:?}");
    let unknown = layer_violations(&graph_of(&[("newthing", "ffi")]), &layers);
    assert!(
        unknown.iter().any(|w| w.contains("no layer")),
        "{unknown:?}"
    );
}

/// Each function of `code` (comments and strings stripped) as (name, first line, lines from its
/// `fn` to its closing brace); a declaration without a body is none.
fn function_lengths(code: &str) -> Vec<(String, usize, usize)> {
    let mut found = Vec::new();
    for (at, _) in code.match_indices("fn ") {
        if code[..at]
            .chars()
            .next_back()
            .is_some_and(|c| c.is_alphanumeric() || c == '_')
        {
            continue;
        }
        let name = ident_at(code[at + 3..].trim_start());
        if name.is_empty() {
            continue; // `fn(u32) -> u32`, a pointer type
        }
        let Some(body) = code[at..].find(['{', ';']).map(|i| at + i) else {
            continue;
        };
        if code.as_bytes()[body] == b';' {
            continue;
        }
        let Some(close) = matching_brace(code, body) else {
            continue;
        };
        let first = code[..at].matches('\n').count() + 1;
        let lines = code[at..=close].matches('\n').count() + 1;
        found.push((name.to_string(), first, lines));
    }
    found
}

#[test]
fn no_function_of_any_crate_is_longer_than_80_lines() {
    let mut all = Vec::new();
    for source in MEASURED_SOURCE {
        let path = repository().join(source);
        assert!(
            path.exists(),
            "MEASURED_SOURCE names {source}, which is gone"
        );
        rust_files_under(&path, &mut all);
    }
    all.sort();
    let mut read = 0;
    let mut wrong = Vec::new();
    for path in &all {
        let code = strip_comments(&std::fs::read_to_string(path).expect("a source file"));
        for (name, line, lines) in function_lengths(&code) {
            read += 1;
            let file = path.strip_prefix(repository()).unwrap_or(path);
            if lines > LONGEST_FUNCTION {
                wrong.push(format!(
                    "{}:{line}: fn {name} is {lines} lines",
                    file.display()
                ));
            }
        }
    }
    assert!(read > 1000, "read too few functions: {read}");
    assert!(
        wrong.is_empty(),
        "functions over {LONGEST_FUNCTION} lines:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn a_long_function_is_measured_from_its_fn_to_its_closing_brace() {
    let code = strip_comments(
        "fn short() { let c = '}'; let s = \"}\"; }\n\
         trait T { fn declared(&self); }\n\
         pub fn long(x: impl Fn(u32) -> u32) -> u32 {\n    if x(1) > 0 {\n        1\n    } else {\n        2\n    }\n}\n",
    );
    let lengths: Vec<(String, usize, usize)> = function_lengths(&code);
    assert_eq!(
        lengths,
        [("short".to_string(), 1, 1), ("long".to_string(), 3, 7)]
    );
}

/// The CLI's command modules, read from their one declaration, the table under "## The command's
/// shape" in `docs/architecture.md` (`| `module` | `command`, ... |`): each holds its commands,
/// their arguments and their steps. What two commands share lives in a module of its own
/// (`processes`, `groups`, `page`, `snapshots`, `summary`, `replay`, `launch`, `style`, ...).
fn command_modules() -> Vec<String> {
    doc_table("architecture.md", "The command's shape")
        .iter()
        .flat_map(|cells| quoted_names(&cells[0]))
        .collect()
}

/// The command module that `module` is or lies inside, if any.
fn command_of<'a>(module: &str, commands: &'a [String]) -> Option<&'a str> {
    let top = module.split("::").next()?;
    commands.iter().map(String::as_str).find(|&c| c == top)
}

/// Every use, in `graph`, of one command module (or a module inside it) by another's.
fn commands_using_commands(graph: &Graph, commands: &[String]) -> Vec<String> {
    let mut wrong = Vec::new();
    for (from, uses) in graph {
        let Some(user) = command_of(from, commands) else {
            continue;
        };
        for to in uses {
            if command_of(to, commands).is_some_and(|used| used != user) {
                wrong.push(format!("`{from}` uses `{to}`, another command's module"));
            }
        }
    }
    wrong
}

#[test]
fn no_command_module_of_the_cli_uses_another() {
    let root = Path::new("cli/src/main.rs");
    let graph = graph(root);
    let commands = command_modules();
    for command in &commands {
        assert!(graph.contains_key(command), "no module `{command}`");
    }
    // A new command (a module with clap arguments) must be named above, so that the rule holds
    // for it too.
    for module in crate_modules(root) {
        if module.code.contains("clap::Args") {
            assert!(
                command_of(&module.path, &commands).is_some(),
                "`{}` takes a command's arguments: add it to the table of command modules in \
                 docs/architecture.md",
                module.path
            );
        }
    }
    let wrong = commands_using_commands(&graph, &commands);
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn a_command_using_another_is_caught_and_a_shared_module_is_not() {
    let commands = command_modules();
    let caught = commands_using_commands(
        &graph_of(&[("top", "list"), ("fit::trial", "group")]),
        &commands,
    );
    assert_eq!(caught.len(), 2, "{caught:?}");
    let fine = graph_of(&[
        ("top", "processes"),
        ("fit::trial", "fit"),
        ("crate", "run"),
    ]);
    assert!(commands_using_commands(&fine, &commands).is_empty());
}

/// The library crates of the workspace a consumer may use: (member folder, the name code uses,
/// the modules its root declares).
fn library_crates() -> Vec<(String, String, Vec<String>)> {
    let mut libraries = Vec::new();
    for member in workspace_members() {
        let folder = repository().join(&member);
        let Ok(lib) = std::fs::read_to_string(folder.join("src/lib.rs")) else {
            continue;
        };
        let manifest = std::fs::read_to_string(folder.join("Cargo.toml")).unwrap_or_default();
        // The [lib] name where there is one, else the package's, as code spells it.
        let name = manifest
            .split("[lib]")
            .nth(1)
            .unwrap_or(&manifest)
            .lines()
            .find_map(|l| l.trim().strip_prefix("name = "))
            .map(|n| n.trim_matches('"').replace('-', "_"))
            .expect("a crate name");
        let modules = strip_comments(&lib)
            .lines()
            .filter_map(|l| {
                let l = l.trim();
                let l = l.strip_prefix("pub ").unwrap_or(l);
                l.strip_prefix("mod ")?
                    .strip_suffix(';')
                    .map(str::to_string)
            })
            .collect();
        libraries.push((member, name, modules));
    }
    libraries
}

/// The modules of a library that its consumers may name: the reader's `env` (the table of the
/// variables' names, read as `env::LIMIT`). Everything else they take from the crate's root.
const FACADE_MODULES: &[(&str, &str)] = &[("gpumemhook_reader", "env")];

/// Where `code` (of a crate other than `library`'s) names a module of `library`'s insides:
/// `library::module::` or, through an alias (`use library as alias;`), `alias::module::`.
fn inside_paths(code: &str, library: &str, modules: &[String]) -> Vec<String> {
    let mut names = vec![library.to_string()];
    let alias_use = format!("use {library} as ");
    for line in code.lines() {
        if let Some(alias) = line.trim().strip_prefix(&alias_use) {
            names.push(alias.trim_end_matches(';').to_string());
        }
    }
    let mut found = Vec::new();
    for name in &names {
        for module in modules {
            if FACADE_MODULES.contains(&(library, module.as_str())) {
                continue;
            }
            let path = format!("{name}::{module}::");
            let named = code.match_indices(&path).any(|(at, _)| {
                !code[..at].ends_with(|c: char| c.is_alphanumeric() || c == '_' || c == ':')
            });
            if named {
                found.push(format!("{library}::{module}::"));
            }
        }
    }
    found
}

/// A library's consumers reach it through its root (`pub use` there; the modules private), so
/// that what a crate offers is one list, and its insides can move without touching its users.
/// The reader, built on the segment crate's protocols (it is the segment's upper half, in the same
/// folder and shipped with it), and the timeline crate, the reader of the recording format the
/// segment crate's `recording` module defines, are the crates that use the segment's modules.
#[test]
fn no_crate_names_the_modules_of_another() {
    let mut wrong = Vec::new();
    let libraries = library_crates();
    assert!(libraries
        .iter()
        .any(|(_, name, _)| name == "gpumemhook_segment"));
    for member in workspace_members() {
        let mut files = Vec::new();
        rust_files_under(&repository().join(&member), &mut files);
        for (folder, library, modules) in &libraries {
            let below = member.starts_with(&format!("{folder}/")) || folder == &member;
            let built_on = (member == "reader" || member == "reader/timeline")
                && library == "gpumemhook_segment";
            if below || built_on {
                continue;
            }
            for file in &files {
                let code = strip_comments(&std::fs::read_to_string(file).unwrap_or_default());
                for path in inside_paths(&code, library, modules) {
                    let file = file.strip_prefix(repository()).unwrap_or(file);
                    wrong.push(format!("{}: {path}", file.display()));
                }
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "modules named past a crate's root:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn a_module_named_past_the_root_is_caught() {
    let modules = ["group".to_string(), "env".to_string()];
    let code = "use gpumemhook_reader::group::open;\nlet x = gpumemhook_reader::env::LIMIT;\n";
    assert_eq!(
        inside_paths(code, "gpumemhook_reader", &modules),
        ["gpumemhook_reader::group::"]
    );
    let aliased = "use gpumemhook_reader as reader;\nreader::group::open();\n";
    assert_eq!(
        inside_paths(aliased, "gpumemhook_reader", &modules).len(),
        1
    );
    assert!(inside_paths(
        "gpumemhook_reader::open_group()",
        "gpumemhook_reader",
        &modules
    )
    .is_empty());
}

/// Each `x as y` of the `pub use` lines of `code` (a crate root): a name its users would grep for
/// in vain in the module that defines it.
fn renamed_exports(code: &str) -> Vec<String> {
    let mut found = Vec::new();
    for statement in code.split(';') {
        let Some(at) = statement.find("pub use ") else {
            continue;
        };
        let items = statement[at + "pub use ".len()..].replace(['{', '}', '\n'], ",");
        for item in items.split(',') {
            let words: Vec<&str> = item.split_whitespace().collect();
            if let [name, "as", alias] = words[..] {
                found.push(format!("{name} as {alias}"));
            }
        }
    }
    found
}

/// The roots the rule covers: every library crate's (the segment crate's, the reader's and the
/// timeline crate's).
const ROOTS_WITHOUT_RENAMES: &[&str] = &[
    "reader/segment/src/lib.rs",
    "reader/src/lib.rs",
    "reader/timeline/src/lib.rs",
];

#[test]
fn a_library_root_exports_each_name_under_its_own_name() {
    let mut wrong = Vec::new();
    for root in ROOTS_WITHOUT_RENAMES {
        let text = std::fs::read_to_string(repository().join(root)).expect("a crate root");
        for rename in renamed_exports(&strip_comments(&text)) {
            wrong.push(format!("{root}: pub use ... {rename}"));
        }
    }
    assert!(
        wrong.is_empty(),
        "renamed at a crate's root (rename the item itself):\n{}",
        wrong.join("\n")
    );
}

#[test]
fn a_rename_at_a_root_is_caught() {
    let code =
        "pub use a::{b, c as d, e::{f as g}};\npub use h as i;\npub use j::K;\nuse l as m;\n";
    assert_eq!(renamed_exports(code), ["c as d", "f as g", "h as i"]);
}

/// Each workspace crate (by package name) and the workspace crates it depends on (normal and
/// build dependencies), as `cargo metadata` reads the manifests.
fn workspace_dependencies() -> BTreeMap<String, BTreeSet<String>> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = std::process::Command::new(cargo)
        .args([
            "metadata",
            "--no-deps",
            "--offline",
            "--format-version",
            "1",
        ])
        .current_dir(repository())
        .output()
        .expect("cargo metadata runs");
    assert!(out.status.success(), "cargo metadata failed: {out:?}");
    let metadata: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let packages = metadata["packages"].as_array().expect("a package list");
    let members: BTreeSet<&str> = packages.iter().filter_map(|p| p["name"].as_str()).collect();
    let mut graph = BTreeMap::new();
    for p in packages {
        let uses = p["dependencies"].as_array().into_iter().flatten();
        let uses = uses
            .filter(|d| d["kind"].as_str() != Some("dev"))
            .filter_map(|d| d["name"].as_str())
            .filter(|d| members.contains(d))
            .map(str::to_string)
            .collect();
        graph.insert(p["name"].as_str().expect("a name").to_string(), uses);
    }
    graph
}

/// The crates `name` depends on, directly or through others.
fn depends_on(graph: &BTreeMap<String, BTreeSet<String>>, name: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let mut pending = vec![name.to_string()];
    while let Some(next) = pending.pop() {
        for d in graph.get(&next).into_iter().flatten() {
            if found.insert(d.clone()) {
                pending.push(d.clone());
            }
        }
    }
    found
}

/// docs/architecture.md's table of the crates is the workspace's, dependency for dependency, and
/// the hook links no timeline code: its dependencies, through all of theirs, are the segment and
/// the reader (the timeline crate is the reader's and the CLI's user, never the hook's).
#[test]
fn the_crates_depend_as_the_architecture_says_and_the_hook_not_on_the_timeline() {
    let graph = workspace_dependencies();
    let documented: BTreeMap<String, BTreeSet<String>> = doc_table("architecture.md", "The crates")
        .into_iter()
        .map(|cells| {
            let name = quoted_names(&cells[0]).remove(0);
            (name, quoted_names(&cells[2]).into_iter().collect())
        })
        .collect();
    assert_eq!(documented, graph, "docs/architecture.md, \"The crates\"");
    let hook = depends_on(&graph, "gpumemhook");
    assert!(hook.contains("gpumemhook-reader"), "read wrong: {hook:?}");
    assert!(
        !hook.contains("gpumemhook-timeline"),
        "the hook links the timeline: {hook:?}"
    );
    let manifest = std::fs::read_to_string(repository().join("interceptor/Cargo.toml")).unwrap();
    assert!(
        !manifest.contains("timeline"),
        "interceptor/Cargo.toml names the timeline crate"
    );
}

#[test]
fn a_dependency_through_another_crate_is_found() {
    let graph: BTreeMap<String, BTreeSet<String>> = [("hook", "reader"), ("reader", "timeline")]
        .into_iter()
        .map(|(a, b)| (a.to_string(), BTreeSet::from([b.to_string()])))
        .collect();
    assert!(depends_on(&graph, "hook").contains("timeline"));
    assert!(depends_on(&graph, "timeline").is_empty());
}

/// What in `code` (a source file, comments left in) encodes a format of the timeline's exports:
/// prost or serde-pickle named, or a Chrome trace event's `"ph"` key (each event has one) written.
fn encoders_in(code: &str) -> Vec<String> {
    let mut found = Vec::new();
    for (n, line) in code.lines().enumerate() {
        if line.trim_start().starts_with("//") {
            continue;
        }
        for marker in ["prost", "serde_pickle", "\"ph\""] {
            if line.contains(marker) {
                found.push(format!("{marker} (line {})", n + 1));
            }
        }
    }
    found
}

/// The CLI encodes nothing itself: the Chrome, Perfetto and PyTorch exports are the timeline
/// crate's (`write_chrome_trace`, `write_perfetto`, `write_pytorch`), and the encoders' crates are
/// its dependencies, not the CLI's.
#[test]
fn the_cli_holds_no_encoder() {
    let mut files = Vec::new();
    rust_files_under(&repository().join("cli/src"), &mut files);
    assert!(files.len() > 20, "read too few files: {files:?}");
    let mut wrong = Vec::new();
    for file in &files {
        for found in encoders_in(&std::fs::read_to_string(file).expect("a source file")) {
            let file = file.strip_prefix(repository()).unwrap_or(file);
            wrong.push(format!("{}: {found}", file.display()));
        }
    }
    let manifest = std::fs::read_to_string(repository().join("cli/Cargo.toml")).unwrap();
    for encoder in ["prost", "serde-pickle"] {
        if manifest
            .lines()
            .any(|l| l.trim_start().starts_with(encoder))
        {
            wrong.push(format!("cli/Cargo.toml: depends on {encoder}"));
        }
    }
    assert!(wrong.is_empty(), "the CLI encodes:\n{}", wrong.join("\n"));
}

#[test]
fn an_encoder_in_the_cli_is_caught() {
    let code = "// prost in a comment\nuse prost::Message;\nlet e = json!({\"ph\": \"C\"});\n";
    assert_eq!(encoders_in(code), ["prost (line 2)", "\"ph\" (line 3)"]);
}
