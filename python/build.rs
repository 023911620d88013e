//! Build script of the Python bindings: bundles the preload library (and the CLI, when it builds)
//! into the wheel, so that `pip install .` gives a package whose `library_path()` exists.
//!
//! maturin builds only this crate (PEP 517 has no notion of "also build these other crates"), so
//! when the wheel is being built (feature `extension-module`, which maturin turns on) this script
//! runs a nested `cargo build --release -p gpumemhook [-p gpumemhook-cli]` and copies the results into
//! this crate's `OUT_DIR` (`libgpumemhook.so` and `bin/gpumemhook`), from where the `from = "out-dir"`
//! entries of `[tool.maturin] include` pack them as `gpumemhook/libgpumemhook.so` and
//! `gpumemhook/bin/gpumemhook`. Nothing is written into the source tree: `OUT_DIR` lies in the
//! build's own target directory, so two builds at once (scripts/build/wheels and a `pip install .`)
//! each pack their own files, and no earlier build's copy can reach a wheel (docs/building.md).
//!
//! The nested build uses its own target directory, `target/bundle`: the outer cargo holds the lock of
//! `target/` for the whole build, and a nested cargo on the same directory would wait for it forever.
//! Plain `cargo build`/`clippy`/`test` of the workspace leave the feature off and bundle nothing, and
//! so does `GPUMEMHOOK_NO_BUNDLE=1` (scripts/build/python-env: `maturin develop` would copy the
//! `OUT_DIR` files into `python/gpumemhook/`). `GPUMEMHOOK_BUNDLE_TARGET_DIR` names another
//! directory for the nested build (scripts/build/wheels keeps its glibc-2.17 builds apart from the
//! development ones that way).
//!
//! The nested cargo inherits the environment the outer one runs in: the linker maturin's `--zig`
//! sets for the target, and `-Zbuild-std` given as `CARGO_UNSTABLE_BUILD_STD` (aarch64, see
//! scripts/build/aarch64-toolchain), so the hook and the CLI are linked exactly like the native
//! module. An sdist carries the hook's and the CLI's crates (see `[tool.maturin] include` in
//! pyproject.toml), so `pip install` of it bundles them too.

use std::env;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The preload library's file name (crate `gpumemhook`, cdylib).
const HOOK: &str = "libgpumemhook.so";
/// The CLI's file name (crate `gpumemhook-cli`, bin `gpumemhook`).
const CLI: &str = "gpumemhook";

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=GPUMEMHOOK_NO_BUNDLE");
    println!("cargo:rerun-if-env-changed=GPUMEMHOOK_BUNDLE_TARGET_DIR");
    // maturin's `include` entries with `from = "out-dir"` name these paths relative to OUT_DIR.
    let Some(bundle_dir) = env::var_os("OUT_DIR").map(PathBuf::from) else {
        fail("cargo did not set OUT_DIR");
    };
    remove_stale(&bundle_dir);
    if env::var_os("CARGO_FEATURE_EXTENSION_MODULE").is_none()
        || env::var_os("GPUMEMHOOK_NO_BUNDLE").is_some_and(|v| !v.is_empty() && v != "0")
    {
        return;
    }
    let Some(workspace) = workspace() else {
        return;
    };
    let nested = Nested::new(workspace);
    if !nested.build("gpumemhook") {
        fail("building the preload library (cargo build --release -p gpumemhook) failed");
    }
    if let Err(e) = copy_into(&nested.out_dir.join(HOOK), &bundle_dir.join(HOOK)) {
        fail(&format!("copying {HOOK} into OUT_DIR: {e}"));
    }
    // The CLI is optional for the Python package: a wheel without it still serves the library and
    // the Python API, and `python -m gpumemhook` falls back to a small Python CLI.
    let cli_built =
        nested.workspace.join("cli").join("Cargo.toml").is_file() && nested.build("gpumemhook-cli");
    let bin_dir = bundle_dir.join("bin");
    let cli_copied = cli_built && copy_into(&nested.out_dir.join(CLI), &bin_dir.join(CLI)).is_ok();
    if !cli_copied {
        println!(
            "cargo:warning=gpumemhook: the CLI (crate gpumemhook-cli) was not built; the wheel \
             will not contain the gpumemhook binary"
        );
    }
}

/// cargo keeps OUT_DIR between runs: what an earlier run bundled must not outlive a run that
/// bundles nothing (or fails), or maturin would pack it.
fn remove_stale(bundle_dir: &Path) {
    for stale in [bundle_dir.join(HOOK), bundle_dir.join("bin").join(CLI)] {
        match fs::remove_file(&stale) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                fail(&format!("removing {} from OUT_DIR: {e}", stale.display()))
            }
            _ => {}
        }
    }
}

/// The workspace above python/, when this is a checkout (or an sdist) that has the hook's crate.
fn workspace() -> Option<PathBuf> {
    let manifest_dir = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default());
    let Some(workspace) = manifest_dir.parent().map(Path::to_path_buf) else {
        fail("cannot find the workspace above python/");
    };
    if !workspace.join("interceptor").join("Cargo.toml").is_file() {
        // Built from a copy that has only this crate and its dependencies.
        println!(
            "cargo:warning=gpumemhook: the workspace (interceptor/) is not here; the wheel will not \
             contain libgpumemhook.so. Build from a git checkout or the project's sdist to bundle it."
        );
        return None;
    }
    for input in ["interceptor", "reader", "cli", "Cargo.toml", "Cargo.lock"] {
        println!("cargo:rerun-if-changed={}", workspace.join(input).display());
    }
    Some(workspace)
}

/// The nested build: its own target directory, the outer build's target triple.
struct Nested {
    workspace: PathBuf,
    target_dir: PathBuf,
    /// Where the nested build leaves its files.
    out_dir: PathBuf,
    /// The target triple, when it is not the host's.
    cross: Option<String>,
}

impl Nested {
    fn new(workspace: PathBuf) -> Nested {
        let target_dir = env::var_os("GPUMEMHOOK_BUNDLE_TARGET_DIR")
            .filter(|d| !d.is_empty())
            .map_or_else(|| workspace.join("target").join("bundle"), PathBuf::from);
        let target = env::var("TARGET").unwrap_or_default();
        let host = env::var("HOST").unwrap_or_default();
        let cross = (!target.is_empty() && target != host).then_some(target);
        let out_dir = match &cross {
            Some(target) => target_dir.join(target).join("release"),
            None => target_dir.join("release"),
        };
        Nested {
            workspace,
            target_dir,
            out_dir,
            cross,
        }
    }

    /// `cargo build --release -p PACKAGE` in the nested target directory; whether it succeeded.
    fn build(&self, package: &str) -> bool {
        let cargo = env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let mut command = Command::new(cargo);
        command
            .current_dir(&self.workspace)
            .args(["build", "--release", "-p", package, "--target-dir"])
            .arg(&self.target_dir)
            // The wheel ships without DWARF (the workspace keeps `debug = 1` for profiling):
            // symbol names stay, so backtraces still name functions, at a fraction of the size.
            .args(["--config", "profile.release.strip=\"debuginfo\""]);
        if let Some(target) = &self.cross {
            command.args(["--target", target]);
        }
        // The outer build's target dir must not leak in; ours is given on the command line.
        command.env_remove("CARGO_TARGET_DIR");
        match command.status() {
            Ok(status) => status.success(),
            Err(e) => {
                println!("cargo:warning=gpumemhook: cannot run cargo: {e}");
                false
            }
        }
    }
}

/// Copies `from` to `to`, making `to`'s folder first. Keeps the executable bits. OUT_DIR belongs to
/// this build alone (cargo holds its target directory's lock), so no reader can see a half-written
/// file and no temporary name is needed.
fn copy_into(from: &Path, to: &Path) -> std::io::Result<()> {
    if let Some(dir) = to.parent() {
        fs::create_dir_all(dir)?;
    }
    fs::copy(from, to).map(drop)
}

fn fail(message: &str) -> ! {
    eprintln!("gpumemhook build: {message}");
    std::process::exit(1);
}
