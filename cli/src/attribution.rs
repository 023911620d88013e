//! Who holds the memory, for people: the breakdown by module of each device, the allocations a
//! report lists as still held (the leak report), and what an out-of-memory report says about the
//! allocation that failed. `report` prints all of it; `run` names the largest modules; `ls
//! --by-module` and `top` print the breakdown of live processes. A module a Python distribution
//! installed is shown by its package beside its file name (`torch (libc10_cuda.so)`,
//! [`gpumemhook_reader::module_label`]).

use crate::style::{count, counted, Cell, Painter, Style, Table};
use gpumemhook_reader::module_label;
use gpumemhook_reader::{env, format_size, DeviceStats, Snapshot};
use gpumemhook_reader::{LiveAllocation, ModuleStats, OomInfo};

/// Live allocations `report` prints (the JSON has up to 1000).
pub const LIVE_SHOWN: usize = 20;
/// Modules `run` names per device.
pub const MODULES_NAMED: usize = 3;

/// One table of the breakdown of every device of `s` that has one.
pub fn module_table(s: &Snapshot, painter: Painter, indent: usize) -> String {
    let mut t = Table::new(&[
        ("DEVICE", true),
        ("MODULE", false),
        ("USED", true),
        ("PEAK", true),
        // Its allocations held now (the process's own ALLOCS counts every one ever made).
        ("LIVE", true),
        ("PATH", false),
    ])
    .indent(indent);
    let mut rows = 0;
    for d in &s.devices {
        for m in &d.by_module {
            rows += 1;
            t.push(module_row(d.device, m));
        }
    }
    if rows == 0 {
        return String::new();
    }
    t.render(painter)
}

fn module_row(device: u32, m: &ModuleStats) -> Vec<Cell> {
    vec![
        Cell::right(device.to_string()),
        Cell::left(module_label(&m.module, &m.path)).styled(Style::Name),
        Cell::right(format_size(m.used)),
        Cell::right(format_size(m.peak)).styled(Style::Peak),
        Cell::right(count(m.live_allocs)),
        Cell::left(m.path.clone()).styled(Style::Dim),
    ]
}

/// `libc10_cuda.so 1.20 GiB, libcublasLt.so 64.00 MiB, +2 more`: the modules holding the most of
/// one device now (by peak when nothing is held), for one-line summaries.
pub fn largest_modules(d: &DeviceStats, named: usize) -> String {
    let mut modules: Vec<&ModuleStats> = d.by_module.iter().collect();
    let held: u64 = modules.iter().map(|m| m.used).sum();
    if held == 0 {
        modules.sort_by_key(|m| std::cmp::Reverse(m.peak));
    }
    let mut parts: Vec<String> = modules
        .iter()
        .take(named)
        .map(|m| {
            let bytes = if held == 0 { m.peak } else { m.used };
            format!(
                "{} {}",
                module_label(&m.module, &m.path),
                format_size(bytes)
            )
        })
        .collect();
    if modules.len() > named {
        parts.push(format!("+{} more", modules.len() - named));
    }
    parts.join(", ")
}

/// The lines `run` prints under its device table: per device, the modules holding the most.
pub fn largest_modules_lines(s: &Snapshot, painter: Painter, indent: usize) -> String {
    let mut out = String::new();
    for d in s.devices.iter().filter(|d| !d.by_module.is_empty()) {
        let what = if d.by_module.iter().any(|m| m.used > 0) {
            "held at exit by"
        } else {
            "peaks by module"
        };
        out.push_str(&format!(
            "{:indent$}device {} {what}: {}\n",
            "",
            d.device,
            painter.paint(&largest_modules(d, MODULES_NAMED), Style::Name),
        ));
    }
    out
}

/// The setting that records Python call sites, as a user types it: `GPUMEMHOOK_STACKS=python:<min
/// bytes>`.
pub fn stacks_setting() -> String {
    format!("{}={}<min bytes>", env::STACKS, env::STACKS_PYTHON)
}

/// `report --by-site`: device memory by Python call site (all devices together), every site.
pub fn site_table(s: &Snapshot, painter: Painter, indent: usize) -> String {
    let Some(sites) = &s.by_site else {
        return format!(
            "{:indent$}{}\n",
            "",
            painter.paint(
                &format!(
                    "no per-site figures: the program ran without {}",
                    stacks_setting()
                ),
                Style::Dim
            )
        );
    };
    let mut out = format!(
        "{:indent$}{}\n",
        "",
        painter.paint(
            "by Python call site (all devices; innermost frame first):",
            Style::Heading
        )
    );
    let mut t = Table::new(&[
        ("USED", true),
        ("PEAK", true),
        ("LIVE", true),
        ("SITE", false),
    ])
    .indent(indent + 2);
    for row in sites {
        t.push(vec![
            Cell::right(format_size(row.used)),
            Cell::right(format_size(row.peak)).styled(Style::Peak),
            Cell::right(count(row.live_allocs)),
            Cell::left(row.site.clone()).styled(Style::Name),
        ]);
    }
    out.push_str(&t.render(painter));
    out
}

/// The allocations a report lists as still held, largest first, at most [`LIVE_SHOWN`] rows.
pub fn live_table(s: &Snapshot, painter: Painter, indent: usize) -> String {
    let Some(live) = &s.live else {
        return String::new();
    };
    let total = live.len() as u64 + s.live_omitted;
    if total == 0 {
        return format!(
            "{:indent$}{}\n",
            "",
            painter.paint("no device allocation was still held", Style::Dim)
        );
    }
    let held: u64 = live.iter().map(|a| a.bytes).sum();
    let mut out = format!(
        "{:indent$}{}\n",
        "",
        painter.paint(
            &format!(
                "{} still held{}:",
                counted(total, "allocation was", "allocations were"),
                if s.live_omitted == 0 {
                    format!(" ({})", format_size(held))
                } else {
                    String::new()
                }
            ),
            Style::Heading
        )
    );
    let with_sites = live.iter().any(|a| a.site.is_some());
    let mut header = vec![
        ("DEVICE", true),
        ("BYTES", true),
        ("MODULE", false),
        ("AGE", true),
        ("ADDRESS", false),
    ];
    if with_sites {
        header.push(("SITE", false));
    }
    let mut t = Table::new(&header).indent(indent + 2);
    for a in live.iter().take(LIVE_SHOWN) {
        // The live list names a module by its file; the device's breakdown knows its path.
        let path = s
            .devices
            .iter()
            .filter(|d| d.device == a.device)
            .flat_map(|d| &d.by_module)
            .find(|m| m.module == a.module)
            .map_or("", |m| m.path.as_str());
        t.push(live_row(a, path, with_sites));
    }
    out.push_str(&t.render(painter));
    let rest = total - live.len().min(LIVE_SHOWN) as u64;
    if rest > 0 {
        out.push_str(&format!(
            "{:w$}{}\n",
            "",
            painter.paint(
                &format!(
                    "… and {} more (all listed ones are in the JSON)",
                    count(rest)
                ),
                Style::Dim
            ),
            w = indent + 2
        ));
    }
    out
}

fn live_row(a: &LiveAllocation, path: &str, with_sites: bool) -> Vec<Cell> {
    let mut row = vec![
        Cell::right(a.device.to_string()),
        Cell::right(format_size(a.bytes)),
        Cell::left(module_label(&a.module, path)).styled(Style::Name),
        Cell::right(format!("{:.1} s", a.age_s)),
        Cell::left(a.address.clone()).styled(Style::Dim),
    ];
    if with_sites {
        row.push(Cell::left(a.site.clone().unwrap_or_default()));
    }
    row
}

/// What an out-of-memory report says about the allocation that failed.
pub fn oom_lines(oom: &OomInfo, painter: Painter, indent: usize) -> String {
    let why = match oom.reason.as_str() {
        "ceiling" => "refused by the ceiling",
        "driver" => "failed in the driver (out of memory)",
        other => other,
    };
    let limit = oom.limit.map_or_else(
        || "no ceiling".to_string(),
        |l| format!("ceiling {}", format_size(l)),
    );
    let mut asker = if oom.module.is_empty() {
        String::new()
    } else {
        format!(" by {}", oom.module)
    };
    if let Some(site) = &oom.site {
        asker.push_str(&format!(" at {site}"));
    }
    format!(
        "{:indent$}{}\n",
        "",
        painter.paint(
            &format!(
                "out of memory: {} asked{asker} on device {} with {}, {why} ({} in use, {limit})",
                format_size(oom.bytes),
                oom.device,
                if oom.entry.is_empty() {
                    "?"
                } else {
                    &oom.entry
                },
                format_size(oom.used),
            ),
            Style::Bad
        )
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::style::ColorChoice;

    fn device() -> DeviceStats {
        let m = |module: &str, used, peak| ModuleStats {
            module: module.into(),
            path: format!("/lib/{module}"),
            used,
            peak,
            live_allocs: 1,
        };
        DeviceStats {
            device: 0,
            by_module: vec![
                m("libc10_cuda.so", 3 << 30, 4 << 30),
                m("libcublasLt.so.13", 64 << 20, 64 << 20),
                m("libnccl.so.2", 1 << 20, 1 << 20),
                m("python3.12", 0, 512),
            ],
            ..DeviceStats::default()
        }
    }

    #[test]
    fn the_largest_modules_are_named_with_a_count_of_the_rest() {
        assert_eq!(
            largest_modules(&device(), 2),
            "libc10_cuda.so 3.00 GiB, libcublasLt.so.13 64.00 MiB, +2 more"
        );
        let mut gone = device();
        gone.by_module.iter_mut().for_each(|m| m.used = 0);
        assert!(largest_modules(&gone, 1).starts_with("libc10_cuda.so 4.00 GiB"));
    }

    #[test]
    fn the_live_table_says_how_many_more_are_held_than_shown() {
        let painter = Painter::new(ColorChoice::Never, false);
        let a = LiveAllocation {
            device: 0,
            bytes: 1 << 20,
            module: "libc10_cuda.so".into(),
            address: "0x7f0000000000".into(),
            age_s: 2.5,
            site: Some("train.py:12 in step".into()),
        };
        let s = Snapshot {
            live: Some(vec![a; 25]),
            live_omitted: 5,
            ..Snapshot::default()
        };
        let text = live_table(&s, painter, 2);
        assert!(text.contains("30 allocations were still held:"), "{text}");
        assert!(text.contains("train.py:12 in step"), "{text}");
        assert!(text.contains("and 10 more"), "{text}");
        assert_eq!(text.matches("0x7f0000000000").count(), LIVE_SHOWN);
        let none = Snapshot {
            live: Some(Vec::new()),
            ..Snapshot::default()
        };
        assert!(live_table(&none, painter, 0).contains("no device allocation"));
        assert_eq!(live_table(&Snapshot::default(), painter, 0), "");
    }

    #[test]
    fn the_site_table_lists_every_site_or_says_none_was_recorded() {
        let painter = Painter::new(ColorChoice::Never, false);
        let none = site_table(&Snapshot::default(), painter, 0);
        assert!(none.contains("GPUMEMHOOK_STACKS=python:"), "{none}");
        let s = Snapshot {
            by_site: Some(vec![gpumemhook_reader::SiteStats {
                site: "train.py:12 in step < train.py:40 in main".into(),
                used: 3 << 20,
                peak: 5 << 20,
                live_allocs: 2,
            }]),
            ..Snapshot::default()
        };
        let text = site_table(&s, painter, 0);
        assert!(
            text.contains("train.py:12 in step < train.py:40 in main"),
            "{text}"
        );
        assert!(
            text.contains("3.00 MiB") && text.contains("5.00 MiB"),
            "{text}"
        );
    }
}
