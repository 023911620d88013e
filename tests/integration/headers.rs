//! Every crate root's `//!` header names each module the file declares (as `` [`module`] ``), so
//! a header cannot drift from the modules again: the roots of the hook, the reader, the segment, the CLI (and its
//! `plot`) and the Python bindings are read here. (Import cycles and the hook's layers are checked
//! by `modules.rs`.)

use std::path::Path;

/// The roots whose headers list their modules, relative to the repository.
const ROOTS: &[&str] = &[
    "interceptor/src/lib.rs",
    "reader/src/lib.rs",
    "reader/segment/src/lib.rs",
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
