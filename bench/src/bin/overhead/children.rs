//! Running one child of `overhead`: what it is given (`Setup`, `Config`), its environment on each
//! side (hooked or not), its samples, and its instructions per pair under callgrind. Shared by the
//! orchestrator (`main.rs`) and the group comparison (`groups.rs`).

use std::path::PathBuf;
use std::process::{Command, Stdio};

use serde_json::Value;

use crate::child::Pattern;

pub(crate) struct Setup {
    pub(crate) exe: PathBuf,
    pub(crate) hook: PathBuf,
    pub(crate) shm_dir: PathBuf,
    pub(crate) pairs: u64,
    pub(crate) repeats: u64,
    /// The fast driver never reuses an address.
    pub(crate) fresh: bool,
    /// Devices the fast driver reports.
    pub(crate) devices: u64,
}

/// One child configuration (without the side).
#[derive(Clone)]
pub(crate) struct Config {
    /// `driver`: the driver library, entry points through `cuGetProcAddress_v2`; `runtime`: the
    /// runtime library, `cudaMalloc`/`cudaFree` from the global scope.
    pub(crate) api: &'static str,
    pub(crate) driver: PathBuf,
    pub(crate) threads: u64,
    pub(crate) live: u64,
    pub(crate) scopes: Vec<u64>,
    pub(crate) pattern: Pattern,
}

impl Config {
    pub(crate) fn words(&self, pairs: u64, repeats: u64, warmup: Option<u64>) -> Vec<String> {
        let mut w = vec![
            "--child".to_string(),
            "--driver".into(),
            self.driver.display().to_string(),
            "--threads".into(),
            self.threads.to_string(),
            "--live".into(),
            self.live.to_string(),
            "--scopes".into(),
            self.scopes
                .iter()
                .map(u64::to_string)
                .collect::<Vec<_>>()
                .join(","),
            "--api".into(),
            self.api.into(),
            "--pattern".into(),
            self.pattern.name().into(),
            "--pairs".into(),
            pairs.to_string(),
            "--repeats".into(),
            repeats.to_string(),
        ];
        if let Some(n) = warmup {
            w.extend(["--warmup".into(), n.to_string()]);
        }
        w
    }
}

pub(crate) fn side_env(cmd: &mut Command, setup: &Setup, hooked: bool) {
    if setup.fresh {
        cmd.env("FASTCUDA_FRESH", "1");
    }
    cmd.env("FASTCUDA_DEVICES", setup.devices.to_string());
    cmd.env_remove("LD_PRELOAD")
        .env(gpumemhook_reader::env::SHM_DIR, &setup.shm_dir)
        // The simulated driver's capacity: room for a million live allocations.
        .env("FAKECUDA_MEM_BYTES", (1u64 << 40).to_string())
        .env("FAKECUDA_DEVICES", "1");
    if hooked {
        cmd.env("LD_PRELOAD", &setup.hook);
    }
}

/// Runs one child and returns its JSON result lines.
pub(crate) fn run_child(
    setup: &Setup,
    config: &Config,
    hooked: bool,
) -> Result<Vec<Value>, String> {
    let mut cmd = Command::new(&setup.exe);
    cmd.args(config.words(setup.pairs, setup.repeats, None))
        .stdin(Stdio::null());
    side_env(&mut cmd, setup, hooked);
    let out = cmd
        .output()
        .map_err(|e| format!("{}: {e}", setup.exe.display()))?;
    if !out.status.success() {
        return Err(format!(
            "child ({}, hooked={hooked}) failed: {}",
            config.driver.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect())
}

/// Instructions executed by one child under callgrind, with `extra` variables set.
pub(crate) fn callgrind_instructions(
    setup: &Setup,
    config: &Config,
    hooked: bool,
    extra: &[(&str, &str)],
    pairs: u64,
) -> Result<u64, String> {
    let out_file = setup.shm_dir.join(format!(
        "callgrind.{}.{}.{}",
        std::process::id(),
        hooked,
        pairs
    ));
    let mut cmd = Command::new("valgrind");
    cmd.args(["--tool=callgrind", "-q"])
        .arg(format!("--callgrind-out-file={}", out_file.display()))
        .arg(&setup.exe)
        .args(config.words(pairs, 1, Some(0)))
        .stdin(Stdio::null())
        .stdout(Stdio::null());
    side_env(&mut cmd, setup, hooked);
    cmd.envs(extra.iter().copied());
    let out = cmd.output().map_err(|e| format!("valgrind: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "valgrind child failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    let text =
        std::fs::read_to_string(&out_file).map_err(|e| format!("{}: {e}", out_file.display()))?;
    let _ = std::fs::remove_file(&out_file);
    text.lines()
        .find_map(|l| {
            l.strip_prefix("summary:")
                .or_else(|| l.strip_prefix("totals:"))
        })
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .ok_or_else(|| "no instruction total in the callgrind output".to_string())
}

/// Instructions per pair: the difference of two runs that differ only in the number of pairs.
pub(crate) fn callgrind_per_pair(
    setup: &Setup,
    config: &Config,
    hooked: bool,
    extra: &[(&str, &str)],
) -> Result<f64, String> {
    let (small, large) = (20_000u64, 120_000u64);
    let a = callgrind_instructions(setup, config, hooked, extra, small)?;
    let b = callgrind_instructions(setup, config, hooked, extra, large)?;
    Ok((b as f64 - a as f64) / (large - small) as f64)
}
