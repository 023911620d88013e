//! The repository's house rules that no compiler checks: it tracks no built package (a wheel, a
//! tarball, a Debian package: those are built by `scripts/build/`, or fetched by pip and apt), and
//! its pages and help texts call a binary timeline by what it is.

use gpumemhook_tests::{cli_ok, root, scratch};
use std::process::Command;

/// How a built or downloaded package's file name ends. Such files are outputs of a build or of a
/// registry, never sources: a repository holding one ships bytes that nothing reviews or rebuilds.
const PACKAGE_ENDINGS: &[&str] = &[
    ".whl", ".egg", ".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tar.xz", ".tar.zst", ".zip", ".deb",
    ".rpm", ".apk", ".conda", ".jar", ".gem", ".crate", ".nupkg", ".snap",
];

/// The files git tracks in this checkout, relative to its root.
fn tracked_files() -> Vec<String> {
    let out = Command::new("git")
        .arg("-C")
        .arg(root())
        .args(["ls-files", "-z"])
        .output()
        .expect("git runs (these tests read the checkout's own list of files)");
    assert!(
        out.status.success(),
        "git ls-files (these tests run in a git checkout): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .split('\0')
        .filter(|path| !path.is_empty())
        .map(str::to_string)
        .collect()
}

/// The paths among `paths` whose names end as a package's do.
fn packages(paths: &[String]) -> Vec<&str> {
    paths
        .iter()
        .map(String::as_str)
        .filter(|path| {
            let lower = path.to_ascii_lowercase();
            PACKAGE_ENDINGS.iter().any(|ending| lower.ends_with(ending))
        })
        .collect()
}

#[test]
fn the_repository_tracks_no_package_file() {
    let tracked = tracked_files();
    assert!(
        tracked.iter().any(|path| path == "Cargo.toml"),
        "git ls-files listed {} files, without Cargo.toml",
        tracked.len()
    );
    let found = packages(&tracked);
    assert!(
        found.is_empty(),
        "package files are tracked (remove them with `git rm`; build them or install them \
         instead): {found:?}"
    );
}

#[test]
fn a_package_file_is_told_from_a_source() {
    let paths: Vec<String> = [
        "a-1.0-py3-none-any.whl",
        "dist/b-2.tar.gz",
        "c.DEB",
        "d.zip",
        "docs/e.md",
        "scripts/build/wheels",
        "scripts/build/wheels.py",
        "reader/src/tar.rs",
    ]
    .map(String::from)
    .to_vec();
    assert_eq!(
        packages(&paths),
        [
            "a-1.0-py3-none-any.whl",
            "dist/b-2.tar.gz",
            "c.DEB",
            "d.zip"
        ]
    );
}

/// Where a page or a help text hands a timeline a path: after `--trace` and `GPUMEMHOOK_TRACE=`,
/// and as the file that `plot` and `export` read (they read timelines only; `report` and `view`
/// read JSON reports too).
const TIMELINE_PATH_BEFORE: &[&str] = &[
    "--trace ",
    "--trace=",
    "GPUMEMHOOK_TRACE=",
    "gpumemhook plot ",
    "gpumemhook export ",
];

/// What says that a timeline is JSON or that a viewer opens it as it is. A sentence saying so is
/// true only of `export`'s output (`--chrome`, `--perfetto`) or of an earlier version's timeline.
const VIEWER_CLAIMS: &[&str] = &[
    "chrome trace json",
    "json trace",
    "perfetto",
    "chrome://tracing",
];
const ABOUT_EXPORT: &[&str] = &["export", "--chrome", "--perfetto", "earlier version"];

/// The timeline paths ending `.json` in `text`, each with its line.
fn json_timeline_paths(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    for line in text.lines() {
        for before in TIMELINE_PATH_BEFORE {
            for (at, _) in line.match_indices(before) {
                let rest = line[at + before.len()..].trim_start_matches(['\'', '"', '`']);
                let path = rest
                    .split([' ', '\'', '"', '`', ')', ',', ';'])
                    .next()
                    .unwrap_or("");
                if path.ends_with(".json") {
                    found.push(format!("{path}: {}", line.trim()));
                }
            }
        }
    }
    found
}

/// The sentences of `text` that say a timeline is JSON or opens in a viewer as it is, without
/// naming `export` or an earlier version. A paragraph's lines are joined (a claim may be wrapped),
/// then cut at each full stop; a table row, a heading and a help text's option are each their own.
fn viewer_claims(text: &str) -> Vec<String> {
    let mut sentences = Vec::new();
    for paragraph in text.split("\n\n") {
        let mut joined = String::new();
        for line in paragraph.lines().map(str::trim) {
            if line.starts_with(['|', '#', '-']) {
                sentences.push(line.to_string());
            } else {
                joined.push(' ');
                joined.push_str(line);
            }
        }
        sentences.extend(joined.split(". ").map(|s| s.trim().to_string()));
    }
    sentences
        .into_iter()
        .filter(|sentence| {
            let lower = sentence.to_lowercase().replace("--json", "");
            VIEWER_CLAIMS.iter().any(|claim| lower.contains(claim))
                && !ABOUT_EXPORT.iter().any(|about| lower.contains(about))
        })
        .collect()
}

/// README.md, each page of docs/ and each command's help, with their names.
fn pages_and_help_texts() -> Vec<(String, String)> {
    let mut texts = Vec::new();
    let root = root();
    let mut pages = vec![root.join("README.md")];
    for entry in std::fs::read_dir(root.join("docs")).unwrap().flatten() {
        if entry.path().extension().is_some_and(|e| e == "md") {
            pages.push(entry.path());
        }
    }
    for page in pages {
        let name = page.strip_prefix(&root).unwrap().display().to_string();
        texts.push((name, std::fs::read_to_string(&page).unwrap()));
    }
    let dir = scratch("house-help");
    let mut commands = vec![Vec::new()];
    commands.extend(
        crate::cli::every_command(&dir)
            .into_iter()
            .map(|(path, _)| path),
    );
    for path in commands {
        let mut args: Vec<&str> = path.iter().map(String::as_str).collect();
        args.push("--help");
        let help = String::from_utf8_lossy(&cli_ok(&dir, &args).stdout).into_owned();
        texts.push((format!("gpumemhook {}", args.join(" ")), help));
    }
    texts
}

/// The timeline is the hook's binary format (`GMHTRACE`): its pages and help texts name it
/// `.trace`, and say that viewers open what `export` writes, not the timeline itself.
#[test]
fn pages_and_help_texts_call_the_timeline_binary() {
    let texts = pages_and_help_texts();
    assert!(texts.len() > 20, "{} texts", texts.len());
    let mut wrong = Vec::new();
    for (name, text) in &texts {
        for path in json_timeline_paths(text) {
            wrong.push(format!("{name}: a timeline named .json: {path}"));
        }
        // `export`'s own help is about what it writes, which viewers do open.
        let claims = if name.starts_with("gpumemhook export") {
            Vec::new()
        } else {
            viewer_claims(text)
        };
        for claim in claims {
            wrong.push(format!(
                "{name}: says the timeline is JSON or opens as is: {claim}"
            ));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn a_json_timeline_and_a_viewer_claim_are_caught() {
    let page = "$ gpumemhook run --trace 't.%p.json' -- x\n`GPUMEMHOOK_TRACE=t.json`; \
                gpumemhook plot mem.json -o m.png\ngpumemhook run --trace t.trace --report r.json\n\
                gpumemhook export t.trace --chrome t.json";
    assert_eq!(
        json_timeline_paths(page).len(),
        3,
        "{:?}",
        json_timeline_paths(page)
    );
    let claims = "The timeline is Chrome trace\nJSON. The same trace opens in Perfetto. \
                  `export --perfetto` writes what Perfetto opens. Timelines of earlier versions \
                  (Chrome trace JSON) read as before.";
    assert_eq!(
        viewer_claims(claims),
        [
            "The timeline is Chrome trace JSON",
            "The same trace opens in Perfetto"
        ]
    );
}
