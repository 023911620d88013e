//! The environment of a hooked program, in one place: the name of every `GPUMEMHOOK_*` variable
//! (who reads it, what it means), what the hook says of one that is no setting (a misspelling),
//! the hook library's file name, and how a launcher (`gpumemhook run`, the Python fallback
//! `gpumemhook run`) puts the hook into `LD_PRELOAD`.
//!
//! The hook (`interceptor/src/config.rs`), the CLI and the Python package (through
//! `gpumemhook._native`, every entry of [`ALL`] as `ENV_<NAME>`) take the names from here, so that
//! a variable is spelt once. `SHM_DIR` keeps its historical home beside the code that reads it
//! ([`crate::shm::SHM_DIR_ENV`]) and is re-exported here.

use std::ffi::{OsStr, OsString};
use std::path::Path;

/// What every variable name starts with.
pub const PREFIX: &str = "GPUMEMHOOK_";

/// Writes each setting once: its constant (a doc comment, `NAME = "GPUMEMHOOK_..."`) and its row of
/// [`ALL`] (what it means), in the order given.
macro_rules! settings {
    ($( $(#[$doc:meta])* $id:ident = $name:expr => $meaning:literal; )*) => {
        $( $(#[$doc])* pub const $id: &str = $name; )*

        /// Every setting with what it means, for documentation and checks. A per-device setting
        /// appears as its prefix.
        pub const ALL: &[(&str, &str)] = &[ $( ($id, $meaning) ),* ];

        /// Every setting's constant name with its value, for the test that they agree.
        #[cfg(test)]
        const CONSTANT_NAMES: &[(&str, &str)] = &[ $( (stringify!($id), $id) ),* ];
    };
}

settings! {
    /// The hook: ceiling for every device (`8GiB`, `8G`, `8000MB`, `4096B`: a size with its unit).
    LIMIT = "GPUMEMHOOK_LIMIT" => "ceiling for every device";
    /// The hook: `GPUMEMHOOK_LIMIT_<i>` is the ceiling of device `i`; it wins over [`LIMIT`].
    LIMIT_DEVICE_PREFIX = "GPUMEMHOOK_LIMIT_" => "ceiling for one device: append its index";
    /// The hook: write the JSON exit report there; `%p` becomes the pid.
    REPORT = "GPUMEMHOOK_REPORT" => "exit report path";
    /// The hook: at the first allocation refused by the ceiling or failed by the driver for want of
    /// memory, write the forensic report there (`%p` becomes the pid).
    OOM_REPORT = "GPUMEMHOOK_OOM_REPORT" => "out-of-memory report path";
    /// The hook: `python:<min bytes>[:depth=<n>]` records the innermost Python frames (`n`, default
    /// [`STACKS_DEFAULT_DEPTH`]) of every device allocation of at least that size; `python` alone
    /// (or `python:`, `python:0`) records every allocation. Read by [`parse_stacks`].
    STACKS = "GPUMEMHOOK_STACKS" => "Python call sites of allocations (python:<min bytes>[:depth=<frames>])";
    /// The hook: record the timeline there (its binary format, `.trace` by convention) as events
    /// come; `%p` becomes the pid.
    TRACE = "GPUMEMHOOK_TRACE" => "timeline path";
    /// The hook: the timeline file's largest size (`16MiB`, `1GB`): its chunks become a ring that
    /// keeps every event of the last part, with a summary of the whole run (`crate::recording`;
    /// the format's `ring` module). At least 1 MiB.
    TRACE_MAX = "GPUMEMHOOK_TRACE_MAX" => "largest size of the timeline file (a ring)";
    /// The hook and every reader: directory of segment files (default `/dev/shm`).
    SHM_DIR = crate::shm::SHM_DIR_ENV => "directory of segment files";
    /// The hook: `1` passes every call straight through and counts nothing.
    DISABLE = "GPUMEMHOOK_DISABLE" => "count nothing";
    /// Card emulation for every device (a preset or a size).
    EMULATE = "GPUMEMHOOK_EMULATE" => "emulate a card on every device";
    /// Card emulation for device `i`: this prefix, then the index.
    EMULATE_DEVICE_PREFIX = "GPUMEMHOOK_EMULATE_" => "emulate a card on one device: append its index";
    /// The group this process joins (`crate::group`, `docs/groups.md`).
    GROUP = "GPUMEMHOOK_GROUP" => "group of processes sharing one count, ceiling and card";
    /// The group's ceiling: what all its members may hold together, per device.
    GROUP_LIMIT = "GPUMEMHOOK_GROUP_LIMIT" => "ceiling for the whole group, every device";
    /// The hook: the job this process belongs to, as `ls --by-job`, `top` and the exporter's
    /// `job_id` show it; wins over every job the hook finds by itself ([`crate::labels`]).
    JOB = "GPUMEMHOOK_JOB" => "job label";
    /// The hook: this process's rank within [`JOB`]; wins over torchrun's `RANK`.
    RANK = "GPUMEMHOOK_RANK" => "rank label";
    /// `gpumemhook run` and the Python console script: the preload library to use.
    LIB = "GPUMEMHOOK_LIB" => "preload library for launchers";
    /// The Python package and `gpumemhook fit`: the NVML library to load (`none`: no NVML).
    NVML_LIB = "GPUMEMHOOK_NVML_LIB" => "NVML library for the Python package and fit";
    /// The Python console script: `1` uses its Python fallback even when the CLI binary is bundled.
    PYTHON_CLI = "GPUMEMHOOK_PYTHON_CLI" => "Python fallback CLI";
    /// The pytest plugin: set in a pytest it restarted under the hook (`pytest --gpumem` started
    /// without it), so that a restart happens once and the session can say it was restarted.
    PYTEST_RESTARTED = "GPUMEMHOOK_PYTEST_RESTARTED" => "set by the pytest plugin in a pytest it restarted";
}

/// The value [`STACKS`] starts with.
pub const STACKS_PYTHON: &str = "python:";
/// What follows the size in [`STACKS`] to set the frames kept per site.
pub const STACKS_DEPTH: &str = ":depth=";
/// Frames per site when [`STACKS_DEPTH`] is not given.
pub const STACKS_DEFAULT_DEPTH: u64 = 3;
/// The most frames per site.
pub const STACKS_MAX_DEPTH: u64 = 16;

/// What a [`STACKS`] value asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StacksSetting {
    /// Allocations of at least this many bytes have their call site recorded.
    pub min_bytes: u64,
    /// Python frames kept per site.
    pub depth: u64,
}

/// Why a [`STACKS`] value was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StacksError {
    /// Not of the expected form: says what is expected, then why.
    Form(String),
    /// The minimum size could not be read.
    Size(crate::size::SizeError),
}

impl std::fmt::Display for StacksError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let why = match self {
            // A bare number: the size's own one-line fix says it all.
            StacksError::Size(e) if e.is_missing_unit() => return e.fmt(f),
            StacksError::Size(e) => e.to_string(),
            StacksError::Form(why) => why.clone(),
        };
        write!(
            f,
            "expected {STACKS_PYTHON}<min bytes>, as in {STACKS_PYTHON}1MiB ({why})"
        )
    }
}

impl std::error::Error for StacksError {}

/// Reads a [`STACKS`] value (`python:1MiB`, `python:2MiB:depth=5`, `python`): the one reader, for
/// the hook and for `gpumemhook run --stacks`.
pub fn parse_stacks(value: &str) -> Result<StacksSetting, StacksError> {
    let python = STACKS_PYTHON.trim_end_matches(':');
    let rest = match value.strip_prefix(STACKS_PYTHON) {
        Some(rest) => rest,
        None if value == python => "",
        None => {
            return Err(StacksError::Form(
                "only Python call sites are recorded".into(),
            ))
        }
    };
    let (bytes, depth) = match rest.split_once(STACKS_DEPTH) {
        Some((bytes, depth)) => (
            bytes,
            crate::size::parse_count(depth, 1, STACKS_MAX_DEPTH).map_err(|e| {
                StacksError::Form(format!("{} {e}", STACKS_DEPTH.trim_matches(':')))
            })?,
        ),
        None => (rest, STACKS_DEFAULT_DEPTH),
    };
    let min_bytes = match bytes {
        "" | "0" => 0,
        b => crate::size::parse_size(b).map_err(StacksError::Size)?,
    };
    Ok(StacksSetting { min_bytes, depth })
}

/// `GPUMEMHOOK_*` variables of this project's own build, tests and scripts: no settings of the hook
/// or the CLI, but names the hook must not call misspelt settings ([`not_a_setting`]), since they
/// reach hooked programs (the test harness sets them in the environment of every program it runs).
pub const PROJECT_VARIABLES: &[&str] = &[
    // The integration tests' harness (tests/src/lib.rs) and scripts/check/aarch64.
    "GPUMEMHOOK_TEST_RUNNER",
    "GPUMEMHOOK_TEST_PRELOAD",
    "GPUMEMHOOK_TEST_SIM_DIR",
    "GPUMEMHOOK_TEST_HAMMER",
    "GPUMEMHOOK_AARCH64_SYSROOT",
    "GPUMEMHOOK_SKIP_AARCH64",
    "GPUMEMHOOK_ZIG_VENV",
    // The hook's test of a Python version it does not know (interceptor/src/cpython.rs).
    "GPUMEMHOOK_TEST_PYTHON_VERSION",
    // The Python tests (test_docs.py runs the docs' commands under it), scripts/check/prometheus
    // and scripts/pictures.
    "GPUMEMHOOK_TEST_WHEEL",
    "GPUMEMHOOK_DOCS_UPDATE",
    "GPUMEMHOOK_SKIP_PROMETHEUS",
    "GPUMEMHOOK_CLI",
    // Builds (interceptor/build.rs, python/build.rs, scripts/build/wheels) and the benchmarks.
    "GPUMEMHOOK_DLSYM_VERSIONS",
    "GPUMEMHOOK_BUNDLE_TARGET_DIR",
    "GPUMEMHOOK_NO_BUNDLE",
    "GPUMEMHOOK_BENCH_RERUN",
    // scripts/lib/steps: how often a long step says it is still going (its test sets it short).
    "GPUMEMHOOK_STEP_TICK_S",
    // scripts/test's steps that install a real thing, and scripts/pictures' browser.
    "GPUMEMHOOK_SKIP_SLURM",
    "GPUMEMHOOK_SKIP_BROWSER",
    "GPUMEMHOOK_SKIP_NODE",
    "GPUMEMHOOK_VIEW_PYTHON",
];

/// Settings of earlier versions, and why none is needed now.
pub const RETIRED: [(&str, &str); 1] = [(
    "GPUMEMHOOK_TRACE_EVENTS",
    "the timeline is written as events happen and has no length limit",
)];

/// The one line the hook says at start of a variable `name` that looks like a setting (it starts
/// with [`PREFIX`] in any case) but is none: `GPUMEMHOOK_LIMITS is not a setting; did you mean
/// GPUMEMHOOK_LIMIT?`, the nearest name of [`ALL`] when one is near. `None` for a setting, a
/// device's setting (`GPUMEMHOOK_LIMIT_1`, whose index the hook checks itself), one of
/// [`PROJECT_VARIABLES`], and every other name.
pub fn not_a_setting(name: &str) -> Option<String> {
    let Some(bare) = name
        .get(..PREFIX.len())
        .filter(|head| head.eq_ignore_ascii_case(PREFIX))
        .map(|_| &name[PREFIX.len()..])
    else {
        return misspelt_prefix(name);
    };
    let is_per_device = |setting: &str| setting.ends_with('_');
    let known = ALL.iter().any(|&(setting, _)| {
        setting == name || (is_per_device(setting) && name.starts_with(setting))
    }) || PROJECT_VARIABLES.contains(&name);
    if known {
        return None;
    }
    if let Some((_, why)) = RETIRED.iter().find(|(retired, _)| *retired == name) {
        return Some(format!(
            "{name} is no longer a setting: {why}; it is ignored"
        ));
    }
    let upper = bare.to_ascii_uppercase();
    // The same name in another case is the answer; else the nearest by edit distance, when it is
    // near (two edits, or a third of the name); else a setting the name begins with
    // (`GPUMEMHOOK_REPORT_PATH`).
    let same_case = ALL.iter().map(|&(setting, _)| setting).find(|setting| {
        let stem = &setting[PREFIX.len()..];
        stem == upper || (is_per_device(setting) && upper.starts_with(stem))
    });
    let nearest = || {
        ALL.iter()
            .map(|&(setting, _)| setting)
            .filter(|setting| !is_per_device(setting))
            .map(|setting| {
                let distance = strsim::levenshtein(&setting[PREFIX.len()..], &upper);
                (distance, setting)
            })
            .min()
            .filter(|&(distance, _)| distance <= 2.max(upper.len() / 3))
            .map(|(_, setting)| setting)
    };
    let begun = || {
        ALL.iter()
            .map(|&(setting, _)| setting)
            .filter(|setting| !is_per_device(setting))
            .filter(|setting| upper.starts_with(&setting[PREFIX.len()..]))
            .max_by_key(|setting| setting.len())
    };
    Some(match same_case.or_else(nearest).or_else(begun) {
        Some(setting) if is_per_device(setting) => {
            format!("{name} is not a setting; did you mean {PREFIX}{upper}?")
        }
        Some(setting) => format!("{name} is not a setting; did you mean {setting}?"),
        None => format!("{name} is not a setting of gpumemhook; it is ignored"),
    })
}

/// The line for a name whose prefix is a near miss of [`PREFIX`] (`GPUMEMHOK_LIMIT`,
/// `GPUMEMHOOOK_GROUP`: at most two edits before its first `_`), which would otherwise be ignored
/// without a word: the setting it most likely meant, when the rest names one.
fn misspelt_prefix(name: &str) -> Option<String> {
    let (head, rest) = name.split_once('_')?;
    let stem = &PREFIX[..PREFIX.len() - 1];
    let near = !rest.is_empty()
        && head.len() + 2 >= stem.len()
        && strsim::levenshtein(&head.to_ascii_uppercase(), stem) <= 2;
    if !near {
        return None;
    }
    let meant = format!("{PREFIX}{}", rest.to_ascii_uppercase());
    Some(match not_a_setting(&meant) {
        None => format!("{name} is not a setting; did you mean {meant}?"),
        Some(_) => format!(
            "{name} looks like a setting of gpumemhook with its prefix misspelt ({PREFIX}); it is \
             ignored"
        ),
    })
}

/// The file name of the preload library.
pub const HOOK_LIB_NAME: &str = "libgpumemhook.so";

/// The NVML library's file name, as the hook and the Python package open it (unless [`NVML_LIB`]
/// names another).
pub const NVML_LIB_NAME: &std::ffi::CStr = c"libnvidia-ml.so.1";

/// The attribute a variable's name has in Python's `gpumemhook._native` (and the name of its
/// constant here): `ENV_` and the name without [`PREFIX`], a per-device prefix (ending in `_`)
/// as `..._DEVICE_PREFIX`: `GPUMEMHOOK_LIMIT_` is `ENV_LIMIT_DEVICE_PREFIX`.
pub fn attribute_name(name: &str) -> String {
    let bare = name.strip_prefix(PREFIX).unwrap_or(name);
    match bare.strip_suffix('_') {
        Some(stem) => format!("ENV_{stem}_DEVICE_PREFIX"),
        None => format!("ENV_{bare}"),
    }
}

/// `LD_PRELOAD` for a program started under the hook `lib`: the hook first, then whatever was
/// preloaded already (`existing`), minus any other copy of the hook (two copies would both
/// interpose and count everything twice).
///
/// ```
/// use std::ffi::OsStr;
/// use gpumemhook_reader::env::preload_value;
/// let value = preload_value(Some(OsStr::new("/old/libgpumemhook.so:/a/liba.so")), "/h/libgpumemhook.so".as_ref());
/// assert_eq!(value, "/h/libgpumemhook.so:/a/liba.so");
/// ```
pub fn preload_value(existing: Option<&OsStr>, lib: &Path) -> OsString {
    let mut value = OsString::from(lib.as_os_str());
    if let Some(existing) = existing {
        let existing = existing.to_string_lossy();
        // The dynamic linker splits LD_PRELOAD on colons and spaces.
        for entry in existing.split([':', ' ']).filter(|e| !e.is_empty()) {
            if Path::new(entry).file_name() == Some(OsStr::new(HOOK_LIB_NAME)) {
                continue;
            }
            value.push(":");
            value.push(entry);
        }
    }
    value
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_has_the_prefix_and_is_listed_once() {
        let mut names: Vec<&str> = ALL.iter().map(|(name, _)| *name).collect();
        assert!(names
            .iter()
            .all(|n| n.starts_with(PREFIX) && n.len() > PREFIX.len()));
        let count = names.len();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), count, "a name is listed twice");
        assert_eq!(count, CONSTANT_NAMES.len());
    }

    #[test]
    fn every_setting_is_spelt_as_its_constant_is_named() {
        // `GPUMEMHOOK_LIMIT` is `LIMIT`, `GPUMEMHOOK_LIMIT_` is `LIMIT_DEVICE_PREFIX`: the Python
        // attribute (`ENV_` and the constant's name) is then the constant's name too.
        for &(constant, name) in CONSTANT_NAMES {
            assert_eq!(attribute_name(name), format!("ENV_{constant}"), "{name}");
        }
    }

    #[test]
    fn misspelt_settings_are_named_with_the_nearest_setting() {
        for (name, meant) in [
            ("GPUMEMHOOK_LIMITS", "GPUMEMHOOK_LIMIT"),
            ("GPUMEMHOOK_limit", "GPUMEMHOOK_LIMIT"),
            ("gpumemhook_report", "GPUMEMHOOK_REPORT"),
            ("GPUMEMHOOK_limit_1", "GPUMEMHOOK_LIMIT_1"),
            ("GPUMEMHOOK_SHMDIR", "GPUMEMHOOK_SHM_DIR"),
            ("GPUMEMHOOK_TRAC", "GPUMEMHOOK_TRACE"),
            ("GPUMEMHOOK_REPORT_PATH_FOR_ALL", "GPUMEMHOOK_REPORT"),
            // A near miss of the prefix itself, which would otherwise pass without a word.
            ("GPUMEMHOK_LIMIT", "GPUMEMHOOK_LIMIT"),
            ("GPUMEMHOOOK_GROUP", "GPUMEMHOOK_GROUP"),
            ("gpumemhok_limit_1", "GPUMEMHOOK_LIMIT_1"),
            ("GPUMEMHOKK_EMULATE", "GPUMEMHOOK_EMULATE"),
        ] {
            assert_eq!(
                not_a_setting(name).as_deref(),
                Some(format!("{name} is not a setting; did you mean {meant}?").as_str())
            );
        }
        assert_eq!(
            not_a_setting("GPUMEMHOOK_XYZZY_PLUGH").as_deref(),
            Some("GPUMEMHOOK_XYZZY_PLUGH is not a setting of gpumemhook; it is ignored")
        );
        assert_eq!(
            not_a_setting("GPUMEMHOOK_TRACE_EVENTS").as_deref(),
            Some(
                "GPUMEMHOOK_TRACE_EVENTS is no longer a setting: the timeline is written as \
                 events happen and has no length limit; it is ignored"
            )
        );
        assert!(not_a_setting("GPUMEMHOK_XYZZY")
            .is_some_and(|l| l.contains("with its prefix misspelt")));
        for other in [
            "CUDA_VISIBLE_DEVICES",
            "GPU_LIMIT",
            "PYTORCH_CUDA_ALLOC_CONF",
            "HOME",
            "_",
        ] {
            assert_eq!(not_a_setting(other), None, "{other}");
        }
        for fine in [
            LIMIT,
            "GPUMEMHOOK_LIMIT_3",
            "GPUMEMHOOK_EMULATE_x",
            REPORT,
            "GPUMEMHOOK_TEST_RUNNER",
            "PATH",
            "GPUMEMHOO",
        ] {
            assert_eq!(not_a_setting(fine), None, "{fine}");
        }
        for (name, _) in ALL {
            assert_eq!(not_a_setting(name), None, "{name}");
        }
    }

    #[test]
    fn attribute_names_are_the_constants_names() {
        assert_eq!(attribute_name(LIMIT), "ENV_LIMIT");
        assert_eq!(
            attribute_name(LIMIT_DEVICE_PREFIX),
            "ENV_LIMIT_DEVICE_PREFIX"
        );
        assert_eq!(
            attribute_name(EMULATE_DEVICE_PREFIX),
            "ENV_EMULATE_DEVICE_PREFIX"
        );
        assert_eq!(attribute_name(OOM_REPORT), "ENV_OOM_REPORT");
    }

    #[test]
    fn preload_keeps_other_libraries_and_drops_other_hooks() {
        let lib = Path::new("/opt/hook/libgpumemhook.so");
        assert_eq!(preload_value(None, lib), OsString::from(lib));
        assert_eq!(
            preload_value(Some(OsStr::new("")), lib),
            OsString::from(lib)
        );
        assert_eq!(
            preload_value(
                Some(OsStr::new("/a/liba.so /old/libgpumemhook.so:/b/libb.so")),
                lib
            ),
            OsString::from("/opt/hook/libgpumemhook.so:/a/liba.so:/b/libb.so")
        );
        // A library whose name only contains the hook's is kept.
        assert_eq!(
            preload_value(Some(OsStr::new("/x/libgpumemhook.so.bak")), lib),
            OsString::from("/opt/hook/libgpumemhook.so:/x/libgpumemhook.so.bak")
        );
    }

    #[test]
    fn stacks_values_read_once_for_the_hook_and_the_cli() {
        for (value, min_bytes, depth) in [
            ("python", 0, STACKS_DEFAULT_DEPTH),
            ("python:", 0, STACKS_DEFAULT_DEPTH),
            ("python:0", 0, STACKS_DEFAULT_DEPTH),
            ("python:1MiB", 1 << 20, STACKS_DEFAULT_DEPTH),
            ("python:2MiB:depth=5", 2 << 20, 5),
        ] {
            assert_eq!(
                parse_stacks(value),
                Ok(StacksSetting { min_bytes, depth }),
                "{value}"
            );
        }
        for (bad, says) in [
            ("native:1MiB", "only Python"),
            ("pythonic", "only Python"),
            ("python:lots", "\"lots\" is not a size"),
            ("python:1MiB:depth=0", "depth"),
        ] {
            let e = parse_stacks(bad).unwrap_err().to_string();
            assert!(
                e.starts_with("expected python:<min bytes>") && e.contains(says),
                "{e}"
            );
        }
        // A bare number: the size's own one-line fix, nothing around it.
        assert_eq!(
            parse_stacks("python:1048576").unwrap_err().to_string(),
            "1048576 what? write 1048576GiB, or 1048576B for bytes"
        );
    }

    /// Every `GPUMEMHOOK_` name that the scripts, the launchers (CLI, Python package), the
    /// benchmarks and the test harness set or read is a setting or one of the project's own
    /// variables: a new one that is neither would make the hook warn in every process that inherits
    /// it. (The hook's own sources, the tests and the pages also spell misspelt names on purpose.)
    #[test]
    fn every_name_the_launchers_and_scripts_use_is_known() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let mut unknown = std::collections::BTreeSet::new();
        let mut dirs: Vec<_> = [
            "scripts",
            "cli/src",
            "python/gpumemhook",
            "bench",
            "tests/src",
        ]
        .iter()
        .map(|d| root.join(d))
        .collect();
        while let Some(dir) = dirs.pop() {
            for entry in std::fs::read_dir(&dir).unwrap().flatten() {
                let path = entry.path();
                let name = entry.file_name().to_string_lossy().into_owned();
                if path.is_dir() {
                    if !name.starts_with('.') && name != "target" && name != "node_modules" {
                        dirs.push(path);
                    }
                    continue;
                }
                let Ok(text) = std::fs::read_to_string(&path) else {
                    continue;
                };
                for (at, _) in text.match_indices(PREFIX) {
                    let word: String = text[at..]
                        .chars()
                        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                        .collect();
                    // A prefix written as such (`GPUMEMHOOK_LIMIT_<i>`, `GPUMEMHOOK_*`) ends in `_`.
                    if !word.ends_with('_') && not_a_setting(&word).is_some() {
                        unknown.insert(format!("{word} ({})", path.display()));
                    }
                }
            }
        }
        assert!(
            unknown.is_empty(),
            "neither settings nor PROJECT_VARIABLES: {unknown:?}"
        );
    }
}
