//! `gpumemhook env`: which CLI, hook library and Python are in use, their versions, and whether
//! they agree. A user with two builds (a checkout's `target/release` and a pip-installed package)
//! otherwise finds out only when `run`, `kernel install` and `import gpumemhook` each pick another
//! library, or when `pytest` or `kernel install` is missing from the Python at hand.

use anyhow::{Context, Result};
use serde::Deserialize;
use std::path::{Path, PathBuf};

use crate::launch::{locate_library, python_probe_with};
use crate::style::{Painter, Style};

#[derive(clap::Args, Debug)]
#[command(after_help = "\
Examples:
  gpumemhook env                                  # this CLI, its library, python3 and its packages
  gpumemhook env --python .venv/bin/python        # another Python (the one that runs your programs)
  gpumemhook env --lib target/release/libgpumemhook.so

It says `ok` when the library that `run` and `kernel install` preload is the Python package's
(the same file, or a byte-identical copy) and the versions agree; otherwise it says what differs
and exits with status 1.")]
pub struct EnvArgs {
    /// The Python to ask (its gpumemhook package, pytest, ipykernel). Default: python3 on PATH.
    #[arg(long, value_name = "PATH", default_value = "python3")]
    pub python: PathBuf,
    /// The hook library, as `run --lib`. Default: as `run` finds it.
    #[arg(long, value_name = "PATH")]
    pub lib: Option<PathBuf>,
}

/// What the Python at hand says of itself (the probe prints it as one JSON line).
#[derive(Deserialize, Debug)]
struct PythonFacts {
    executable: String,
    version: String,
    pytest: Option<String>,
    ipykernel: Option<String>,
    package: Option<PackageFacts>,
    package_error: Option<String>,
}

#[derive(Deserialize, Debug)]
struct PackageFacts {
    version: String,
    path: String,
    library: String,
}

const PROBE: &str = r#"
import json, sys
facts = {"executable": sys.executable, "version": sys.version.split()[0]}
def version(name):
    try:
        return getattr(__import__(name), "__version__", "?")
    except Exception:
        return None
facts["pytest"], facts["ipykernel"] = version("pytest"), version("ipykernel")
try:
    import os, gpumemhook
    facts["package"] = {"version": gpumemhook.__version__,
                        "path": os.path.dirname(gpumemhook.__file__),
                        "library": str(gpumemhook.library_path())}
except Exception as e:
    facts["package_error"] = "%s: %s" % (type(e).__name__, e)
print(json.dumps(facts))
"#;

/// Asks `python` for its facts.
fn ask(python: &Path) -> Result<PythonFacts> {
    let (status, out, err) = python_probe_with(python, PROBE)
        .with_context(|| format!("cannot run {}", python.display()))?;
    let last = out.last().map(String::as_str).unwrap_or("");
    match serde_json::from_str(last) {
        Ok(facts) if status.success() => Ok(facts),
        _ => anyhow::bail!(
            "{} did not answer ({status}): {}",
            python.display(),
            err.last().map(String::as_str).unwrap_or(last)
        ),
    }
}

/// Whether two paths are one library: the same file, or copies with the same bytes.
fn same_library(a: &Path, b: &Path) -> bool {
    let canonical = |p: &Path| std::fs::canonicalize(p).ok();
    if canonical(a).is_some() && canonical(a) == canonical(b) {
        return true;
    }
    matches!((std::fs::read(a), std::fs::read(b)), (Ok(x), Ok(y)) if x == y)
}

/// A package's version, or what to do without it.
fn installed(version: &Option<String>, python: &str, package: &str, needed_by: &str) -> String {
    match version {
        Some(v) => v.clone(),
        None => format!("not installed ({needed_by} needs it: {python} -m pip install {package})"),
    }
}

/// What differs between the CLI's library and version and the Python package's; empty when they
/// agree.
fn mismatches(lib: &Path, facts: &PythonFacts) -> Vec<String> {
    let mut found = Vec::new();
    let Some(package) = &facts.package else {
        return found;
    };
    let cli_version = env!("CARGO_PKG_VERSION");
    if package.version != cli_version {
        found.push(format!(
            "the CLI is gpumemhook {cli_version}, the Python package {}",
            package.version
        ));
    }
    if !same_library(lib, Path::new(&package.library)) {
        found.push(format!(
            "`run` and `kernel install` preload {}, but `import gpumemhook` in {} uses {}",
            lib.display(),
            facts.executable,
            package.library
        ));
    }
    found
}

/// Prints the set-up; 1 when the CLI and the Python package disagree.
pub fn env(args: EnvArgs, painter: Painter) -> Result<i32> {
    let exe = std::env::current_exe().context("cannot tell where this program is")?;
    let (lib, source) = locate_library(args.lib.as_deref())?;
    let facts = ask(&args.python)?;
    let python = facts.executable.as_str();
    println!(
        "cli:       {} (gpumemhook {})",
        exe.display(),
        env!("CARGO_PKG_VERSION")
    );
    println!(
        "library:   {} ({source}; what `run` and `kernel install` preload)",
        lib.display()
    );
    println!("python:    {python} (Python {})", facts.version);
    match (&facts.package, &facts.package_error) {
        (Some(p), _) => println!(
            "  gpumemhook: {} in {}, its library {}",
            p.version, p.path, p.library
        ),
        (None, error) => println!(
            "  gpumemhook: cannot import ({}): install it into this Python (`{python} -m pip \
             install .` in a clone) or name another with --python",
            error.as_deref().unwrap_or("?")
        ),
    }
    let pytest = installed(&facts.pytest, python, "pytest", "`pytest --gpumem`");
    let kernel = installed(&facts.ipykernel, python, "ipykernel", "`kernel install`");
    println!("  pytest:     {pytest}");
    println!("  ipykernel:  {kernel}");
    let found = mismatches(&lib, &facts);
    if found.is_empty() && facts.package.is_some() {
        println!(
            "{} the CLI, its library and the Python package agree",
            painter.paint("ok:", Style::Heading)
        );
        return Ok(0);
    }
    for what in &found {
        println!("{} {what}", painter.paint("mismatch:", Style::Bad));
    }
    Ok(i32::from(!found.is_empty()))
}
