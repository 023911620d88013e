//! `gpumemhook env` over a stand-in set-up: a real Python whose `gpumemhook` package (and pytest,
//! and a missing ipykernel) are stand-ins on its `PYTHONPATH`, so that the test decides which
//! library the package names and which version it claims.

use gpumemhook_tests::{cli, hook_lib, python, scratch};
use std::path::Path;

const VERSION: &str = env!("CARGO_PKG_VERSION");

/// Writes the stand-in packages under `dir/site`: gpumemhook `version` naming `library`, pytest
/// 7.4.0, and an ipykernel that cannot be imported.
fn stand_in(dir: &Path, version: &str, library: &Path) {
    let site = dir.join("site");
    std::fs::create_dir_all(site.join("gpumemhook")).unwrap();
    std::fs::write(
        site.join("gpumemhook/__init__.py"),
        format!(
            "__version__ = {version:?}\ndef library_path():\n    return {:?}\n",
            library.display().to_string()
        ),
    )
    .unwrap();
    std::fs::write(site.join("pytest.py"), "__version__ = '7.4.0'\n").unwrap();
    std::fs::write(site.join("ipykernel.py"), "raise ImportError('stand-in')\n").unwrap();
}

/// `gpumemhook env --python PYTHON` with the stand-ins first on the path: status and stdout.
fn env_of(dir: &Path) -> (i32, String) {
    let python = python().display().to_string();
    let o = cli(dir, &["env", "--python", &python])
        .env("PYTHONPATH", dir.join("site"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.is_empty(), "{err}");
    (
        o.status.code().unwrap(),
        String::from_utf8_lossy(&o.stdout).into_owned(),
    )
}

#[test]
fn env_names_the_cli_library_and_python_and_says_when_they_agree() {
    let dir = scratch("env-agree");
    stand_in(&dir, VERSION, hook_lib());
    let (status, out) = env_of(&dir);
    assert_eq!(status, 0, "{out}");
    let lines: Vec<&str> = out.lines().collect();
    assert!(lines[0].starts_with("cli:") && lines[0].ends_with(&format!("(gpumemhook {VERSION})")));
    let lib = hook_lib().display().to_string();
    assert!(
        lines[1].contains(&format!("{lib} ($GPUMEMHOOK_LIB;")),
        "{out}"
    );
    assert!(
        lines[2].starts_with(&format!("python:    {}", python().display())),
        "{out}"
    );
    assert!(
        lines[3].contains(&format!("gpumemhook: {VERSION} in ")),
        "{out}"
    );
    assert!(lines[3].ends_with(&format!("its library {lib}")), "{out}");
    assert_eq!(
        lines[4].split_whitespace().collect::<Vec<_>>(),
        ["pytest:", "7.4.0"]
    );
    assert!(
        lines[5].contains("ipykernel:  not installed (`kernel install` needs it: ")
            && lines[5].ends_with("-m pip install ipykernel)"),
        "{out}"
    );
    assert!(lines[6].starts_with("ok: "), "{out}");

    // A byte-identical copy of the library is the same library.
    let copy = dir.join("copy.so");
    std::fs::copy(hook_lib(), &copy).unwrap();
    stand_in(&dir, VERSION, &copy);
    assert_eq!(env_of(&dir).0, 0);
}

#[test]
fn env_says_what_differs_when_the_package_has_another_library_or_version() {
    let dir = scratch("env-differ");
    let other = dir.join("libgpumemhook.so");
    std::fs::write(&other, b"another build").unwrap();
    stand_in(&dir, "0.0.1", &other);
    let (status, out) = env_of(&dir);
    assert_eq!(status, 1, "{out}");
    let mismatches: Vec<&str> = out
        .lines()
        .filter(|l| l.starts_with("mismatch: "))
        .collect();
    assert_eq!(mismatches.len(), 2, "{out}");
    assert!(
        mismatches[0].ends_with(&format!(
            "the CLI is gpumemhook {VERSION}, the Python package 0.0.1"
        )),
        "{out}"
    );
    assert!(
        mismatches[1].contains(&format!("preload {}", hook_lib().display()))
            && mismatches[1].ends_with(&format!("uses {}", other.display())),
        "{out}"
    );

    // Without the package, it says how to get it, and nothing agrees or differs.
    std::fs::remove_dir_all(dir.join("site/gpumemhook")).unwrap();
    let (status, out) = env_of(&dir);
    assert_eq!(status, 0, "{out}");
    assert!(
        out.contains("gpumemhook: cannot import (ModuleNotFoundError"),
        "{out}"
    );
    assert!(
        !out.lines()
            .any(|l| l.starts_with("ok:") || l.starts_with("mismatch:")),
        "{out}"
    );
}
