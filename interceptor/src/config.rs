//! Configuration, read once when the library loads: never on the hot path.
//!
//! | variable | meaning |
//! | --- | --- |
//! | `GPUMEMHOOK_LIMIT` | ceiling for every device (`8GiB`, `8G`, `8000MB`, bytes) |
//! | `GPUMEMHOOK_LIMIT_<i>` | ceiling for device `i`; wins over `GPUMEMHOOK_LIMIT` |
//! | `GPUMEMHOOK_REPORT` | write the JSON exit report there; `%p` becomes the pid |
//! | `GPUMEMHOOK_TRACE` | write the timeline (Chrome trace JSON) there at exit; `%p` becomes the pid |
//! | `GPUMEMHOOK_TRACE_EVENTS` | timeline buffer size in events (default 4194304) |
//! | `GPUMEMHOOK_SHM_DIR` | directory of segment files (default `/dev/shm`) |
//! | `GPUMEMHOOK_DISABLE` | `1`: pass every call straight through, count nothing |

use gpumemhook_reader::{parse_size, MAX_DEVICES};

/// What the environment asked for.
#[derive(Debug, Default)]
pub struct Config {
    pub disabled: bool,
    pub limit_all: Option<u64>,
    /// `(device, bytes)` pairs from `GPUMEMHOOK_LIMIT_<i>`.
    pub limit_per_device: Vec<(u32, u64)>,
    pub report_path: Option<String>,
    pub trace_path: Option<String>,
    pub trace_events: u64,
}

/// Default timeline capacity: 4 Mi events (192 MiB of address space, used as it fills).
pub const DEFAULT_TRACE_EVENTS: u64 = 1 << 22;

/// A variable that holds something the hook cannot honour: the process must not run without what
/// the user asked for.
#[derive(Debug)]
pub struct ConfigError(pub String);

impl Config {
    /// Reads the configuration from the environment.
    pub fn from_env() -> Result<Config, ConfigError> {
        Self::from_vars(
            std::env::vars_os()
                .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?))),
        )
    }

    /// Reads the configuration from `(name, value)` pairs.
    pub fn from_vars(
        vars: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Config, ConfigError> {
        let mut config = Config {
            trace_events: DEFAULT_TRACE_EVENTS,
            ..Config::default()
        };
        for (name, value) in vars {
            let Some(key) = name.strip_prefix("GPUMEMHOOK_") else {
                continue;
            };
            let size = |value: &str| {
                parse_size(value).map_err(|e| ConfigError(format!("{name}={value}: {e}")))
            };
            match key {
                "DISABLE" => config.disabled = matches!(value.as_str(), "1" | "true" | "yes"),
                "LIMIT" => config.limit_all = Some(size(&value)?),
                "REPORT" if !value.is_empty() => config.report_path = Some(value),
                "TRACE" if !value.is_empty() => config.trace_path = Some(value),
                "TRACE_EVENTS" => {
                    config.trace_events =
                        value.parse().ok().filter(|&n| n > 0).ok_or_else(|| {
                            ConfigError(format!(
                                "{name}={value}: a positive number of events, as in 1000000"
                            ))
                        })?
                }
                _ => {
                    if let Some(index) = key.strip_prefix("LIMIT_") {
                        let device: u32 = index
                            .parse()
                            .ok()
                            .filter(|&d| (d as usize) < MAX_DEVICES)
                            .ok_or_else(|| {
                                ConfigError(format!(
                                    "{name}: the device index must be a number below {MAX_DEVICES}, \
                                     as in GPUMEMHOOK_LIMIT_0=8GiB"
                                ))
                            })?;
                        config.limit_per_device.push((device, size(&value)?));
                    }
                }
            }
        }
        config.limit_per_device.sort_unstable();
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn limits_and_report() {
        let c = Config::from_vars(vars(&[
            ("GPUMEMHOOK_LIMIT", "8GiB"),
            ("GPUMEMHOOK_LIMIT_1", "1000MB"),
            ("GPUMEMHOOK_REPORT", "/tmp/r.%p.json"),
            ("OTHER", "x"),
        ]))
        .unwrap();
        assert_eq!(c.limit_all, Some(8 << 30));
        assert_eq!(c.limit_per_device, vec![(1, 1_000_000_000)]);
        assert_eq!(c.report_path.as_deref(), Some("/tmp/r.%p.json"));
        assert!(!c.disabled);
    }

    #[test]
    fn bad_values_name_the_variable() {
        for (k, v) in [
            ("GPUMEMHOOK_LIMIT", "lots"),
            ("GPUMEMHOOK_LIMIT", "0"),
            ("GPUMEMHOOK_LIMIT", "-5G"),
            ("GPUMEMHOOK_LIMIT_x", "1G"),
            ("GPUMEMHOOK_LIMIT_99", "1G"),
        ] {
            let e = Config::from_vars(vars(&[(k, v)])).unwrap_err();
            assert!(e.0.starts_with(k), "{}", e.0);
        }
    }
}
