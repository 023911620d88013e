//! `gpumemhook limit` and `gpumemhook reset-peak`: changing a running process's ceiling and peaks
//! through its segment (the hook reads both at its next allocation; nothing is restarted).

use anyhow::Result;
use gpumemhook_reader::{format_size, parse_size, MAX_DEVICES};

use crate::processes::attach_or_descendant;
use crate::usage::UsageError;

#[derive(clap::Args, Debug)]
#[command(after_help = "\
Examples:
  gpumemhook limit 4242 8GiB             # every device of process 4242
  gpumemhook limit 4242 6G --device 1    # device 1 only
  gpumemhook limit 4242 none             # lift the ceiling

Allocations past the ceiling fail with out-of-memory; memory already held is never taken back.")]
pub struct LimitArgs {
    /// Process id of a program started under gpumemhook (`gpumemhook ls` lists them), or of a
    /// process that is not hooked itself but runs one hooked program (`gpumemhook run`, a script).
    pub pid: u32,
    /// A size with its unit (8GiB, 8G, 8000MB, 4096B), or `none` to lift the ceiling.
    #[arg(value_name = "SIZE|none")]
    pub size: String,
    /// Only this device (default: all).
    #[arg(long, short, value_name = "N")]
    pub device: Option<u32>,
}

#[derive(clap::Args, Debug)]
#[command(after_help = "\
Examples:
  gpumemhook reset-peak 4242              # every device: peak := used now
  gpumemhook reset-peak 4242 --device 0")]
pub struct ResetPeakArgs {
    /// Process id of a program started under gpumemhook (`gpumemhook ls` lists them).
    pub pid: u32,
    /// Only this device (default: all).
    #[arg(long, short, value_name = "N")]
    pub device: Option<u32>,
}

/// A ceiling as people say it.
fn ceiling(limit: Option<u64>) -> String {
    limit.map_or_else(|| "none".to_string(), format_size)
}

fn check_device(device: Option<u32>) -> Result<()> {
    if let Some(d) = device {
        if gpumemhook_reader::check_device(d).is_err() {
            return Err(UsageError(format!(
                "--device {d}: devices are numbered 0 to {}",
                MAX_DEVICES - 1
            ))
            .into());
        }
    }
    Ok(())
}

/// Refuses `--device N` for a device the process has not shown (no allocation there and no
/// ceiling of its own): most likely a typo, and a ceiling set there would go unnoticed.
fn check_known_device(p: &gpumemhook_reader::Process, device: Option<u32>) -> Result<()> {
    let Some(d) = device else { return Ok(()) };
    let known: Vec<u32> = p.snapshot().devices.iter().map(|s| s.device).collect();
    if known.contains(&d) {
        return Ok(());
    }
    let has = match known.as_slice() {
        [] => "has used no device yet (leave out --device to cover every device)".to_string(),
        [one] => format!("has used only device {one}"),
        many => format!(
            "has used devices {}",
            many.iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    Err(UsageError(format!("--device {d}: process {} {has}", p.pid())).into())
}

pub fn limit(args: LimitArgs) -> Result<i32> {
    let new = match args.size.trim().to_ascii_lowercase().as_str() {
        "none" | "off" | "unlimited" => None,
        _ => Some(parse_size(&args.size).map_err(|e| UsageError(e.to_string()))?),
    };
    check_device(args.device)?;
    let p = attach_or_descendant(args.pid)?;
    check_known_device(&p, args.device)?;
    let devices: Vec<u32> = match args.device {
        Some(d) => vec![d],
        None => {
            let active = p.snapshot().devices.iter().map(|d| d.device).collect();
            active
        }
    };
    let before: Vec<_> = devices
        .iter()
        .map(|&d| p.device(d).map(|s| s.limit))
        .collect::<Result<_, _>>()?;
    p.set_limit(args.device, new)?;
    let target = match args.device {
        Some(d) => format!("device {d}"),
        None => "every device".to_string(),
    };
    println!(
        "process {}: ceiling of {target} set to {}",
        p.pid(),
        ceiling(new)
    );
    for (&d, was) in devices.iter().zip(before) {
        let stats = p.device(d)?;
        let over = new.is_some_and(|l| stats.used > l);
        println!(
            "  device {d}: was {}, {} used now{}",
            ceiling(was),
            format_size(stats.used),
            if over {
                " (already above the new ceiling: allocations fail until memory is freed)"
            } else {
                ""
            }
        );
    }
    Ok(0)
}

pub fn reset_peak(args: ResetPeakArgs) -> Result<i32> {
    check_device(args.device)?;
    let p = attach_or_descendant(args.pid)?;
    check_known_device(&p, args.device)?;
    let devices: Vec<u32> = match args.device {
        Some(d) => vec![d],
        None => p.snapshot().devices.iter().map(|d| d.device).collect(),
    };
    let before: Vec<u64> = devices.iter().map(|&d| p.peak(d)).collect();
    p.reset_peak(args.device)?;
    println!("process {}: peak reset", p.pid());
    for (&d, was) in devices.iter().zip(before) {
        println!(
            "  device {d}: peak was {}, now {} (used now)",
            format_size(was),
            format_size(p.peak(d))
        );
    }
    Ok(0)
}
