//! The repository's house rules that no compiler checks: it tracks no built package (a wheel, a
//! tarball, a Debian package: those are built by `scripts/build/`, or fetched by pip and apt), and
//! it calls a binary timeline by what it is.

use gpumemhook_tests::root;
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
fn packages<'a>(paths: &'a [String]) -> Vec<&'a str> {
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
