//! Lists in `docs/` that a test keeps true: the steps of `scripts/test` as `docs/testing.md`
//! numbers them, and the loom models it names. (The command table of `docs/cli.md` is checked by
//! `cli.rs`, the hook's layers and the CLI's command modules by `modules.rs`.)

use gpumemhook_tests::{root, rust_files_under};

/// The `scripts/...` paths a piece of shell runs, its comments left out.
fn scripts_run(shell: &str) -> Vec<String> {
    let mut found = Vec::new();
    for line in shell.lines().filter(|l| !l.trim_start().starts_with('#')) {
        for (at, _) in line.match_indices("scripts/") {
            let path: String = line[at..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || "/_.-".contains(*c))
                .collect();
            let path = path.trim_end_matches('.').to_string();
            if !found.contains(&path) {
                found.push(path);
            }
        }
    }
    found
}

/// Each `step "..."` of a test script with the shell that follows it, up to the next step.
fn steps(script: &str) -> Vec<(String, String)> {
    let mut steps: Vec<(String, String)> = Vec::new();
    for line in script.lines() {
        if let Some(title) = line.strip_prefix("step \"") {
            steps.push((title.trim_end_matches('"').to_string(), String::new()));
        } else if let Some((_, body)) = steps.last_mut() {
            body.push_str(line);
            body.push('\n');
        }
    }
    steps
}

/// The numbered items of the list that follows `intro` in a page (an item runs on to the next one,
/// and the list ends at the first line that is neither an item, indented nor blank-then-indented).
fn numbered_items(page: &str, intro: &str) -> Vec<String> {
    let after = page
        .split_once(intro)
        .map(|(_, rest)| rest)
        .unwrap_or_else(|| panic!("no `{intro}`"));
    let mut items: Vec<String> = Vec::new();
    let mut lines = after.lines().skip_while(|l| l.trim().is_empty()).peekable();
    while let Some(line) = lines.next() {
        let numbered = line
            .split_once(". ")
            .filter(|(n, _)| n.parse::<u32>().is_ok());
        if let Some((_, text)) = numbered {
            items.push(text.to_string());
        } else if line.starts_with("   ") && !items.is_empty() {
            items.last_mut().unwrap().push_str(line);
        } else if line.trim().is_empty() && lines.peek().is_some_and(|next| next.starts_with("   "))
        {
            continue;
        } else {
            break;
        }
        items.last_mut().unwrap().push('\n');
    }
    items
}

const STEPS_INTRO: &str = "`scripts/test`'s steps, in order:";

#[test]
fn testing_md_numbers_every_step_of_scripts_test() {
    let script = std::fs::read_to_string(root().join("scripts/test")).unwrap();
    let page = std::fs::read_to_string(root().join("docs/testing.md")).unwrap();
    let steps = steps(&script);
    let items = numbered_items(&page, STEPS_INTRO);
    let titles: Vec<&str> = steps.iter().map(|(title, _)| title.as_str()).collect();
    assert_eq!(
        items.len(),
        steps.len(),
        "docs/testing.md numbers {} steps, scripts/test has {}: {titles:#?}",
        items.len(),
        steps.len()
    );
    for (n, ((title, body), item)) in steps.iter().zip(&items).enumerate() {
        for script in scripts_run(body) {
            assert!(
                item.contains(&script),
                "step {} ({title}) runs {script}, which item {} of docs/testing.md does not name",
                n + 1,
                n + 1
            );
        }
    }
}

/// Every `loom_*.rs` under a `tests/` folder of the workspace, relative to the repository.
fn loom_models() -> Vec<String> {
    let mut files = Vec::new();
    rust_files_under(&root(), &mut files);
    files
        .iter()
        .filter_map(|path| {
            let name = path.file_name()?.to_string_lossy();
            let relative = path
                .strip_prefix(root())
                .ok()?
                .to_string_lossy()
                .into_owned();
            let in_tests = relative.contains("/tests/") || relative.starts_with("tests/");
            (name.starts_with("loom_") && in_tests).then_some(relative)
        })
        .collect()
}

#[test]
fn testing_md_names_every_loom_model_and_no_other() {
    let page = std::fs::read_to_string(root().join("docs/testing.md")).unwrap();
    let models = loom_models();
    assert!(models.len() >= 3, "{models:?}");
    for model in &models {
        assert!(
            page.contains(&format!("`{model}`")),
            "docs/testing.md does not name {model}"
        );
    }
    for (at, _) in page.match_indices("loom_") {
        let start = page[..at].rfind('`').unwrap() + 1;
        let end = at + page[at..].find('`').unwrap();
        let named = &page[start..end];
        assert!(
            root().join(named).is_file(),
            "docs/testing.md names {named}, which is gone"
        );
    }
}

#[test]
fn the_list_readers_find_what_they_should() {
    let script =
        "step \"one\"\nscripts/a x\n# scripts/ignored\nstep \"two\"\nrun scripts/b/c.py.\n";
    let steps = steps(script);
    assert_eq!(steps.len(), 2);
    assert_eq!(scripts_run(&steps[0].1), ["scripts/a"]);
    assert_eq!(scripts_run(&steps[1].1), ["scripts/b/c.py"]);
    let page = "Intro:\n\n1. first\n   more\n2. second\n\n   - sub\n3. third\n\nafter\n";
    let items = numbered_items(page, "Intro:");
    assert_eq!(items.len(), 3, "{items:?}");
    assert!(items[1].contains("- sub"));
}

/// The text of a Rust struct's body in `source` (`pub struct Name {` to its closing brace).
fn struct_body<'a>(source: &'a str, name: &str) -> Option<&'a str> {
    let start = source.find(&format!("pub struct {name} {{"))?;
    let body = &source[start..];
    Some(&body[..body.find("\n}")?])
}

/// The fields `for_device_stats_fields!` lists.
fn device_stats_fields() -> Vec<String> {
    let source = std::fs::read_to_string(root().join("reader/src/snapshot.rs")).unwrap();
    let start = source.find("macro_rules! for_device_stats_fields").unwrap();
    let body = &source[start..];
    let body = &body[..body.find("\n}").unwrap()];
    body.lines()
        .map(str::trim)
        .filter(|l| !l.starts_with("//") && !l.starts_with('$'))
        .filter_map(|l| l.split_once(": ").map(|(name, _)| name))
        .filter(|name| name.chars().all(|c| c.is_ascii_lowercase() || c == '_'))
        .map(str::to_string)
        .collect()
}

/// What one row of the per-device fields table names and the code does not hold.
fn row_mismatches(row: &[String], code: &[(&str, String)]) -> Vec<String> {
    let [_, word, metric, ls, summary] = row else {
        return vec![format!("{row:?}: five cells expected")];
    };
    let mut wrong = Vec::new();
    let word = word.trim_matches('`');
    if let Some((type_name, field)) = word.split_once("::") {
        let layout = &code[0].1;
        let held = struct_body(layout, type_name)
            .is_some_and(|body| body.contains(&format!("pub {field}:")));
        if !held {
            wrong.push(format!("{word} is not a field of the segment's layout"));
        }
    }
    for ((file, source), wanted) in code[1..].iter().zip([metric, ls, summary]) {
        // A metric is registered without the suffix its unit or type gives it in the exposition.
        let wanted = wanted.trim_matches('`');
        let wanted = wanted.strip_suffix("_bytes").unwrap_or(wanted);
        let wanted = wanted.strip_suffix("_total").unwrap_or(wanted);
        if wanted != "-" && !source.contains(&format!("\"{wanted}\"")) {
            wrong.push(format!("{file} has no \"{wanted}\""));
        }
    }
    wrong
}

#[test]
fn the_table_of_per_device_fields_matches_the_code() {
    let code: Vec<(&str, String)> = [
        "reader/segment/src/layout.rs",
        "cli/src/exporter/metrics.rs",
        "cli/src/processes.rs",
        "cli/src/summary.rs",
    ]
    .into_iter()
    .map(|path| (path, std::fs::read_to_string(root().join(path)).unwrap()))
    .collect();
    let rows = gpumemhook_tests::doc_table("architecture.md", "Adding things: three checklists");
    let mut wrong = Vec::new();
    let named: Vec<String> = rows
        .iter()
        .map(|r| r[0].trim_matches('`').to_string())
        .collect();
    for field in device_stats_fields() {
        if !named.contains(&field) {
            wrong.push(format!("`{field}` has no row"));
        }
    }
    for row in &rows {
        wrong.extend(
            row_mismatches(row, &code)
                .into_iter()
                .map(|w| format!("{}: {w}", row[0])),
        );
    }
    assert!(
        wrong.is_empty(),
        "docs/architecture.md's per-device fields:\n{}",
        wrong.join("\n")
    );
    // The checks can fail: a made-up word, metric and column are each caught.
    let made_up = [
        "`x`",
        "`DeviceCounters::nothing`",
        "`gpumemhook_nothing`",
        "`NOTHING`",
        "-",
    ];
    let made_up: Vec<String> = made_up.iter().map(|c| c.to_string()).collect();
    assert_eq!(row_mismatches(&made_up, &code).len(), 3);
}
