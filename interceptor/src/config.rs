//! Configuration, read once when the library loads: never on the hot path, never again later (a
//! forked child keeps what its parent read).
//!
//! The variables, their names and what each means are listed once, in the reader's
//! `gpumemhook_reader::env` (`env::ALL`); this module reads those the hook honours: the ceilings
//! (`LIMIT`, `LIMIT_DEVICE_PREFIX`), the emulated cards (`EMULATE`, `EMULATE_DEVICE_PREFIX`), the
//! reports (`REPORT`, `OOM_REPORT`), `STACKS`, the timeline (`TRACE`), `SHM_DIR`,
//! the group (`GROUP`, `GROUP_LIMIT`) and `DISABLE`.
//!
//! A `GPUMEMHOOK_*` name that is no setting (`GPUMEMHOOK_LIMITS`, `GPUMEMHOOK_limit`) is said once
//! at start, with the setting it most likely meant, and otherwise ignored.
//!
//! Relative paths are resolved against the working directory at load, so a later `chdir` changes
//! nothing. A value the hook cannot honour (not a size, zero, not UTF-8, an unknown device index)
//! stops the program at load with one line naming the variable: it never runs without what was
//! asked for.

use gpumemhook_reader::parse_card;
use std::ffi::OsString;
use std::path::{Path, PathBuf};

use gpumemhook_reader::env::{self, PREFIX};
use gpumemhook_reader::Emulation;
use gpumemhook_reader::{check_device, parse_size, MAX_DEVICES};

/// What the environment asked for.
#[derive(Debug, Default)]
pub struct Config {
    pub disabled: bool,
    pub limit_all: Option<u64>,
    /// `(device, bytes)` pairs from `GPUMEMHOOK_LIMIT_<i>`.
    pub limit_per_device: Vec<(u32, u64)>,
    /// The card every device emulates (`GPUMEMHOOK_EMULATE`).
    pub emulate_all: Option<Emulation>,
    /// `(device, card)` pairs from `GPUMEMHOOK_EMULATE_<i>`.
    pub emulate_per_device: Vec<(u32, Emulation)>,
    pub report_path: Option<PathBuf>,
    pub oom_report_path: Option<PathBuf>,
    /// `GPUMEMHOOK_STACKS=python:<bytes>`: the smallest allocation whose Python frame is recorded.
    pub python_stacks_from: Option<u64>,
    /// `:depth=<n>` of `GPUMEMHOOK_STACKS`: frames kept per site.
    pub python_stacks_depth: usize,
    pub trace_path: Option<PathBuf>,
    /// `GPUMEMHOOK_TRACE_MAX`: the timeline file's largest size (a ring), at least
    /// `gpumemhook_segment::MIN_RING_BYTES`.
    pub trace_max: Option<u64>,
    /// Absolute directory of segment files.
    pub shm_dir: PathBuf,
    /// The group to join (`GPUMEMHOOK_GROUP`), its name checked.
    pub group: Option<String>,
    /// The group's ceiling on every device (`GPUMEMHOOK_GROUP_LIMIT`).
    pub group_limit: Option<u64>,
    /// What to say, once at start, of each `GPUMEMHOOK_*` variable (in any case) that is no
    /// setting: a misspelt ceiling must not pass for one in force (`env::not_a_setting`).
    pub not_settings: Vec<String>,
}

/// A variable that holds something the hook cannot honour, as the one line to print.
#[derive(Debug)]
pub struct ConfigError(pub String);

impl Config {
    /// Reads the configuration from the environment, resolving relative paths against the current
    /// directory.
    pub fn from_env() -> Result<Config, ConfigError> {
        let cwd = std::env::current_dir().ok();
        Self::from_vars(std::env::vars_os(), cwd.as_deref())
    }

    /// Reads the configuration from `(name, value)` pairs.
    pub fn from_vars(
        vars: impl IntoIterator<Item = (OsString, OsString)>,
        cwd: Option<&Path>,
    ) -> Result<Config, ConfigError> {
        let mut config = Config {
            shm_dir: PathBuf::from("/dev/shm"),
            ..Config::default()
        };
        let absolute = |p: PathBuf| match cwd {
            Some(dir) if p.is_relative() => dir.join(p),
            _ => p,
        };
        for (name, value) in vars {
            let Some(name) = name.to_str() else {
                continue;
            };
            if let Some(line) = env::not_a_setting(name) {
                config.not_settings.push(line);
                continue;
            }
            if !name.starts_with(PREFIX) {
                continue;
            }
            let Some(value) = value.to_str() else {
                return Err(ConfigError(format!(
                    "{name} is not valid UTF-8 ({}); {}",
                    value.to_string_lossy(),
                    consequence(name)
                )));
            };
            config.apply(name, value, &absolute)?;
        }
        config.limit_per_device.sort_unstable();
        config.emulate_per_device.sort_unstable_by_key(|&(d, _)| d);
        if config.group_limit.is_some() && config.group.is_none() {
            return Err(ConfigError(format!(
                "{} is set without {}; {}",
                env::GROUP_LIMIT,
                env::GROUP,
                consequence(env::GROUP_LIMIT)
            )));
        }
        Ok(config)
    }

    /// Takes one `GPUMEMHOOK_*` variable; `absolute` resolves a relative path.
    fn apply(
        &mut self,
        name: &str,
        value: &str,
        absolute: &dyn Fn(PathBuf) -> PathBuf,
    ) -> Result<(), ConfigError> {
        let config = self;
        let refused = |e: &dyn std::fmt::Display| {
            ConfigError(format!("{name}={value}: {e}; {}", consequence(name)))
        };
        let card = |value: &str| parse_card(value).map_err(|e| refused(&e));
        let size = |value: &str| parse_size(value).map_err(|e| refused(&e));
        match name {
            env::DISABLE => config.disabled = matches!(value, "1" | "true" | "yes"),
            env::LIMIT => config.limit_all = Some(size(value)?),
            env::REPORT if !value.is_empty() => {
                config.report_path = Some(absolute(PathBuf::from(value)))
            }
            env::OOM_REPORT if !value.is_empty() => {
                config.oom_report_path = Some(absolute(PathBuf::from(value)))
            }
            env::STACKS if !value.is_empty() => {
                let setting = env::parse_stacks(value).map_err(|e| refused(&e))?;
                config.python_stacks_from = Some(setting.min_bytes);
                config.python_stacks_depth = setting.depth as usize;
            }
            env::TRACE if !value.is_empty() => {
                config.trace_path = Some(absolute(PathBuf::from(value)))
            }
            env::TRACE_MAX => {
                let bytes = size(value)?;
                let min = gpumemhook_segment::MIN_RING_BYTES;
                if bytes < min {
                    return Err(refused(&format!(
                        "a timeline's ring needs at least {}",
                        gpumemhook_reader::format_size(min)
                    )));
                }
                config.trace_max = Some(bytes);
            }
            env::SHM_DIR if !value.is_empty() => config.shm_dir = absolute(PathBuf::from(value)),
            env::EMULATE => config.emulate_all = Some(card(value)?),
            env::GROUP if !value.is_empty() => {
                gpumemhook_reader::check_group_name(value)
                    .map_err(|e| ConfigError(format!("{name}: {e}; {}", consequence(name))))?;
                config.group = Some(value.to_string());
            }
            env::GROUP_LIMIT => config.group_limit = Some(size(value)?),
            _ => {
                if let Some(index) = name.strip_prefix(env::EMULATE_DEVICE_PREFIX) {
                    let device = device_index(name, env::EMULATE_DEVICE_PREFIX, index)?;
                    config.emulate_per_device.push((device, card(value)?));
                } else if let Some(index) = name.strip_prefix(env::LIMIT_DEVICE_PREFIX) {
                    let device = device_index(name, env::LIMIT_DEVICE_PREFIX, index)?;
                    config.limit_per_device.push((device, size(value)?));
                }
            }
        }
        Ok(())
    }
}

/// The device of a per-device variable `name` (`prefix` then `index`).
fn device_index(name: &str, prefix: &str, index: &str) -> Result<u32, ConfigError> {
    index
        .parse::<u32>()
        .ok()
        .filter(|&d| check_device(d).is_ok())
        .ok_or_else(|| {
            ConfigError(format!(
                "{name}: the device index must be a number below {MAX_DEVICES}, as in {prefix}0; {}",
                consequence(name)
            ))
        })
}

/// What refusing the variable `name` protects: said in the one line printed.
fn consequence(name: &str) -> &'static str {
    match name {
        n if n == env::LIMIT || n.starts_with(env::LIMIT_DEVICE_PREFIX) => {
            "refusing to run without the ceiling asked for"
        }
        n if n == env::EMULATE || n.starts_with(env::EMULATE_DEVICE_PREFIX) => {
            "refusing to run without the card asked for"
        }
        env::TRACE | env::TRACE_MAX => "refusing to run without the timeline asked for",
        env::SHM_DIR => "refusing to run with a segment directory it cannot name",
        env::REPORT | env::OOM_REPORT => "refusing to run without the report asked for",
        env::STACKS => "refusing to run without the call sites asked for",
        env::JOB | env::RANK => "refusing to run without the job label asked for",
        env::GROUP | env::GROUP_LIMIT => "refusing to run outside the group asked for",
        _ => "refusing to run with a setting it cannot read",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::ffi::OsStringExt;

    fn vars(pairs: &[(&str, &str)]) -> Vec<(OsString, OsString)> {
        pairs
            .iter()
            .map(|(k, v)| (OsString::from(k), OsString::from(v)))
            .collect()
    }

    #[test]
    fn limits_and_report() {
        let c = Config::from_vars(
            vars(&[
                ("GPUMEMHOOK_LIMIT", "8GiB"),
                ("GPUMEMHOOK_LIMIT_1", "1000MB"),
                ("GPUMEMHOOK_REPORT", "/tmp/r.%p.json"),
                ("OTHER", "x"),
            ]),
            None,
        )
        .unwrap();
        assert_eq!(c.limit_all, Some(8 << 30));
        assert_eq!(c.limit_per_device, vec![(1, 1_000_000_000)]);
        assert_eq!(c.report_path.as_deref(), Some(Path::new("/tmp/r.%p.json")));
        assert!(!c.disabled);
    }

    #[test]
    fn stacks_and_the_oom_report() {
        let c = Config::from_vars(
            vars(&[
                ("GPUMEMHOOK_STACKS", "python:1MiB"),
                ("GPUMEMHOOK_OOM_REPORT", "oom.%p.json"),
            ]),
            Some(Path::new("/work")),
        )
        .unwrap();
        assert_eq!(c.python_stacks_from, Some(1 << 20));
        assert_eq!(
            c.oom_report_path.as_deref(),
            Some(Path::new("/work/oom.%p.json"))
        );
        assert_eq!(c.python_stacks_depth, 3);
        for every in ["python", "python:", "python:0"] {
            let c = Config::from_vars(vars(&[("GPUMEMHOOK_STACKS", every)]), None).unwrap();
            assert_eq!(c.python_stacks_from, Some(0), "{every}");
        }
        let c =
            Config::from_vars(vars(&[("GPUMEMHOOK_STACKS", "python:2MiB:depth=5")]), None).unwrap();
        assert_eq!(
            (c.python_stacks_from, c.python_stacks_depth),
            (Some(2 << 20), 5)
        );
        for bad in [
            "python:1MiB:depth=0",
            "python:1MiB:depth=17",
            "python:1MiB:depth=x",
        ] {
            let e = Config::from_vars(vars(&[("GPUMEMHOOK_STACKS", bad)]), None).unwrap_err();
            assert!(e.0.contains("depth"), "{bad}: {}", e.0);
        }
        let e = Config::from_vars(vars(&[("GPUMEMHOOK_STACKS", "python:lots")]), None).unwrap_err();
        assert!(
            e.0.contains("GPUMEMHOOK_STACKS=python:lots: expected python:"),
            "{}",
            e.0
        );
    }

    #[test]
    fn bad_values_name_the_variable_and_what_they_protect() {
        for (k, v, says) in [
            ("GPUMEMHOOK_STACKS", "native:1MiB", "call sites"),
            ("GPUMEMHOOK_STACKS", "python:lots", "call sites"),
            ("GPUMEMHOOK_LIMIT", "lots", "ceiling"),
            ("GPUMEMHOOK_LIMIT", "0", "ceiling"),
            ("GPUMEMHOOK_LIMIT", "-5G", "ceiling"),
            ("GPUMEMHOOK_LIMIT_x", "1G", "ceiling"),
            ("GPUMEMHOOK_LIMIT_99", "1G", "ceiling"),
            ("GPUMEMHOOK_LIMIT", "0.5B", "whole number of bytes"),
            (
                "GPUMEMHOOK_LIMIT",
                "8",
                "8 what? write 8GiB, or 8B for bytes",
            ),
            (
                "GPUMEMHOOK_LIMIT_1",
                "512",
                "512 what? write 512GiB, or 512B for bytes",
            ),
            (
                "GPUMEMHOOK_STACKS",
                "python:1048576",
                "1048576 what? write 1048576GiB",
            ),
            (
                "GPUMEMHOOK_EMULATE",
                "12",
                "12 what? write 12GiB, or 12B for bytes",
            ),
            ("GPUMEMHOOK_LIMIT", "1e3", "exponents"),
            ("GPUMEMHOOK_EMULATE", "t5", "card"),
            ("GPUMEMHOOK_EMULATE", "0", "card"),
            ("GPUMEMHOOK_EMULATE_1", "", "card"),
            ("GPUMEMHOOK_EMULATE_x", "t4", "card"),
            ("GPUMEMHOOK_EMULATE_64", "t4", "card"),
        ] {
            let e = Config::from_vars(vars(&[(k, v)]), None).unwrap_err();
            assert!(e.0.starts_with(k), "{}", e.0);
            assert!(e.0.contains(says), "{}", e.0);
        }
    }

    #[test]
    fn names_that_are_no_setting_are_kept_to_be_said_and_change_nothing() {
        let c = Config::from_vars(
            vars(&[
                ("GPUMEMHOOK_LIMITS", "1GiB"),
                ("GPUMEMHOOK_limit", "lots"),
                ("GPUMEMHOOK_TEST_RUNNER", "x"),
                ("GPUMEMHOOK_LIMIT_0", "2GiB"),
            ]),
            None,
        )
        .unwrap();
        assert_eq!(c.limit_all, None);
        assert_eq!(c.limit_per_device, vec![(0, 2 << 30)]);
        assert_eq!(
            c.not_settings,
            vec![
                "GPUMEMHOOK_LIMITS is not a setting; did you mean GPUMEMHOOK_LIMIT?",
                "GPUMEMHOOK_limit is not a setting; did you mean GPUMEMHOOK_LIMIT?",
            ]
        );
    }

    #[test]
    fn emulation_per_device_and_for_all() {
        let c = Config::from_vars(
            vars(&[
                ("GPUMEMHOOK_EMULATE", "T4"),
                ("GPUMEMHOOK_EMULATE_1", "12GiB"),
            ]),
            None,
        )
        .unwrap();
        assert_eq!(c.emulate_all.unwrap().total, 15360 << 20);
        assert_eq!(c.emulate_per_device.len(), 1);
        assert_eq!(c.emulate_per_device[0].0, 1);
        assert_eq!(c.emulate_per_device[0].1.total, 12 << 30);
    }

    #[test]
    fn values_that_are_not_utf8_are_refused() {
        for k in [
            "GPUMEMHOOK_LIMIT",
            "GPUMEMHOOK_REPORT",
            "GPUMEMHOOK_SHM_DIR",
        ] {
            let bad = vec![(OsString::from(k), OsString::from_vec(vec![0xff, 0xfe]))];
            let e = Config::from_vars(bad, None).unwrap_err();
            assert!(e.0.starts_with(k) && e.0.contains("UTF-8"), "{}", e.0);
        }
    }

    #[test]
    fn relative_paths_are_resolved_once_against_the_start_directory() {
        let c = Config::from_vars(
            vars(&[
                ("GPUMEMHOOK_SHM_DIR", "segs"),
                ("GPUMEMHOOK_REPORT", "out/r.json"),
                ("GPUMEMHOOK_TRACE", "/abs/t.json"),
            ]),
            Some(Path::new("/work/job")),
        )
        .unwrap();
        assert_eq!(c.shm_dir, Path::new("/work/job/segs"));
        assert_eq!(
            c.report_path.as_deref(),
            Some(Path::new("/work/job/out/r.json"))
        );
        assert_eq!(c.trace_path.as_deref(), Some(Path::new("/abs/t.json")));
    }
}
