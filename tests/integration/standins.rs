//! Every entry point the hook knows (a row of the driver's, the runtime's or NVML's table in
//! `interceptor/src/table.rs`) has a stand-in in `tests/sim` (the simulated library exports it) and
//! is exercised by some test here (its name appears in a test, or a `simrun` operation that calls
//! it does). CPython's rows are read from the real interpreter (`python/tests`), not simulated.
//! A new row fails the test until it has both.

use std::collections::BTreeSet;
use std::path::Path;

use gpumemhook_tests::root;

/// The exact names of the rows of the tables whose libraries are simulated, each with whether the
/// hook only calls it (`=> fn(...)`: no shadow, no wrapper; every run of the hook calls it).
fn table_rows() -> Vec<(String, bool)> {
    let table = read("interceptor/src/table.rs");
    ["driver_table", "runtime_table", "nvml_table"]
        .iter()
        .flat_map(|table_name| {
            let start = table
                .find(&format!("macro_rules! {table_name}"))
                .unwrap_or_else(|| panic!("table.rs defines {table_name}"));
            let body = &table[start..];
            let body = &body[..body.find("\n}\n").expect("a table ends")];
            body.lines()
                .filter_map(|l| {
                    let (name, rest) = l.split_once("= c\"")?.1.split_once('"')?;
                    Some((name.to_string(), rest.trim_start().starts_with("=> fn(")))
                })
                .collect::<Vec<_>>()
        })
        .collect()
}

fn read(relative: &str) -> String {
    std::fs::read_to_string(root().join(relative)).unwrap_or_else(|e| panic!("{relative}: {e}"))
}

/// True when `text` has `name` as a whole word followed by `after`.
fn has_word(text: &str, name: &str, after: &str) -> bool {
    text.match_indices(name).any(|(at, _)| {
        let before = text[..at].chars().next_back();
        let rest = &text[at + name.len()..];
        !before.is_some_and(|c| c.is_alphanumeric() || c == '_') && rest.starts_with(after)
    })
}

/// Whether a stand-in library exports `name`: the driver's `EXPORT(name)`, the runtime's and
/// NVML's `EXPORT type name(`.
fn has_stand_in(name: &str, libraries: &[String]) -> bool {
    libraries.iter().any(|source| {
        source.contains(&format!("EXPORT({name})"))
            || source
                .lines()
                .any(|l| l.starts_with("EXPORT ") && has_word(l, name, "("))
    })
}

/// The `simrun` operations (`IS("op")`) of the condition nearest above each call of `name`.
fn operations_calling(name: &str, simrun: &str) -> BTreeSet<String> {
    let lines: Vec<&str> = simrun.lines().collect();
    let mut ops = BTreeSet::new();
    for (i, line) in lines.iter().enumerate() {
        if !(has_word(line, name, "(") || line.contains(&format!("\"{name}\""))) {
            continue;
        }
        if let Some(condition) = lines[..=i].iter().rev().find(|l| l.contains("IS(\"")) {
            for part in condition.split("IS(\"").skip(1) {
                if let Some((op, _)) = part.split_once('"') {
                    ops.insert(op.to_string());
                }
            }
        }
    }
    ops
}

#[test]
fn every_table_row_has_a_stand_in_and_a_test() {
    let sim = root().join("tests/sim");
    let libraries: Vec<String> = ["fake_libcuda.c", "fake_libcudart.c", "fake_nvml.c"]
        .iter()
        .map(|f| read(&format!("tests/sim/{f}")))
        .collect();
    let simrun = read("tests/sim/simrun.c");
    let tests: String = std::fs::read_dir(Path::new(&root()).join("tests/integration"))
        .expect("tests/integration is readable")
        .map(|e| e.unwrap().path())
        // This file names rows in its lists, which is no test of them.
        .filter(|path| path.file_name() != Some(std::ffi::OsStr::new("standins.rs")))
        .map(|path| std::fs::read_to_string(path).unwrap())
        .collect();
    assert!(sim.is_dir());
    let rows = table_rows();
    assert!(rows.len() > 50, "the tables were read: {rows:?}");
    let mut without_stand_in = Vec::new();
    let mut untested = Vec::new();
    for (name, called_only) in &rows {
        if !has_stand_in(name, &libraries) {
            without_stand_in.push(name.as_str());
            continue;
        }
        if *called_only {
            continue;
        }
        let named = has_word(&tests, name, "");
        let run = operations_calling(name, &simrun)
            .iter()
            .any(|op| tests.contains(&format!("\"{op}:")) || tests.contains(&format!("\"{op}\"")));
        if !named && !run {
            untested.push(name.as_str());
        }
    }
    assert!(
        without_stand_in.is_empty(),
        "rows without a stand-in in tests/sim: {without_stand_in:?}"
    );
    assert!(
        untested.is_empty(),
        "rows with a stand-in that no test under tests/integration exercises: {untested:?}"
    );
}
