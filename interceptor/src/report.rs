//! The reports: the exit report (`GPUMEMHOOK_REPORT`) and the out-of-memory report
//! (`GPUMEMHOOK_OOM_REPORT`), both the segment's [`Snapshot`] as JSON plus what only the hook's own
//! memory knows: the allocations still held (`live`, largest first: at exit, the leak report), and
//! for the out-of-memory report the allocation that failed and the timeline's last events.
//!
//! Only a process that used CUDA (found the driver, or allocated) writes an exit report: the shells
//! and launchers a program starts around its GPU process (each of which loads the hook too) neither
//! litter the directory nor, with a path without `%p`, overwrite the GPU process's report with an
//! empty one when they exit after it. The out-of-memory report is written once per process, at the
//! first allocation the ceiling refuses or the driver fails for want of memory, before the error
//! returns to the program: a process that dies of it right after still leaves the file. Re-armed
//! (`gpumemhook_arm_oom_report`), the next out-of-memory writes another; `%n` in the path numbers
//! them. Files are
//! written atomically ([`crate::output`]).

use gpumemhook_reader::Snapshot;
use gpumemhook_reader::{LiveAllocation, OomInfo, LIVE_LISTED};
use gpumemhook_segment::{MemKind, Segment};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering, Ordering::Relaxed};
use std::sync::OnceLock;

use crate::ledger::{self, Ledger};

/// Events of the timeline an out-of-memory report lists.
pub const RECENT_EVENTS: usize = 64;

/// True when this process used CUDA: it found the driver, or allocated through the hook.
pub fn used_gpu(segment: &Segment) -> bool {
    segment.header.devices_touched.load(Relaxed) != 0
        || segment.header.host_allocs.load(Relaxed) != 0
        || crate::driver::contacted()
}

/// Writes the exit report to `path`; a failure is one line on stderr, never an error of the program.
pub fn write(path: &Path, segment: &Segment, segment_path: Option<&Path>, ledger: &Ledger) {
    write_snapshot(path, &report(segment, segment_path, ledger), "report");
}

/// The exit report's contents: the snapshot and the live allocations.
fn report(segment: &Segment, segment_path: Option<&Path>, ledger: &Ledger) -> Snapshot {
    let mut snapshot = Snapshot::read(segment, segment_path);
    let (live, omitted) = live(ledger);
    snapshot.live = Some(live);
    snapshot.live_omitted = omitted;
    snapshot
}

/// The exit report's contents now, as compact JSON (for `gpumemhook_report_json`).
pub fn json(segment: &Segment, segment_path: Option<&Path>, ledger: &Ledger) -> String {
    serde_json::to_string(&report(segment, segment_path, ledger)).unwrap_or_default()
}

fn write_snapshot(path: &Path, snapshot: &Snapshot, what: &str) {
    let written = gpumemhook_reader::write_file(path, |out| {
        serde_json::to_writer_pretty(&mut *out, snapshot).map_err(std::io::Error::other)?;
        out.write_all(b"\n")
    });
    if let Err(e) = written {
        crate::diag::warn(&format!(
            "cannot write the {what} to {}: {e}",
            path.display()
        ));
    }
}

/// The device allocations the ledger holds, largest first (then oldest first), at most
/// [`LIVE_LISTED`], and how many more there are.
fn live(ledger: &Ledger) -> (Vec<LiveAllocation>, u64) {
    let mut all: Vec<(u64, ledger::Entry)> = Vec::new();
    ledger.for_each_live(|key, entry| {
        if entry.kind == MemKind::Device {
            all.push((key, entry));
        }
    });
    all.sort_unstable_by(|a, b| {
        b.1.bytes
            .cmp(&a.1.bytes)
            .then(a.1.born_ms.cmp(&b.1.born_ms))
            .then(a.0.cmp(&b.0))
    });
    let omitted = all.len().saturating_sub(LIVE_LISTED) as u64;
    all.truncate(LIVE_LISTED);
    let names = crate::modules::file_names();
    let now = ledger::birth_stamp_now();
    let listed = all
        .into_iter()
        .map(|(key, e)| LiveAllocation {
            device: e.device,
            bytes: e.bytes,
            module: names.of(e.module).to_string(),
            address: format!("{key:#x}"),
            age_s: if e.born_ms == 0 {
                0.0
            } else {
                now.saturating_sub(e.born_ms) as f64 / 1000.0
            },
            site: crate::stacks::describe(e.site),
        })
        .collect();
    (listed, omitted)
}

/// Where the out-of-memory report goes (the pattern, `%p` not yet expanded).
static OOM_PATH: OnceLock<PathBuf> = OnceLock::new();
/// Set by the first out-of-memory of this process image (since the last re-arm), which writes the
/// report.
static OOM_SEEN: AtomicBool = AtomicBool::new(false);
/// Out-of-memory reports this process image wrote: what `%n` in the path becomes.
static OOM_WRITTEN: AtomicU64 = AtomicU64::new(0);

/// Asks for the out-of-memory report at `pattern` (at start-up).
pub fn enable_out_of_memory_report(pattern: PathBuf) {
    let _ = OOM_PATH.set(pattern);
}

/// In a forked child (async-signal-safe: one plain store): the child is a process of its own, which
/// writes its own report at its own first out-of-memory.
pub fn forked() {
    OOM_SEEN.store(false, Relaxed);
    OOM_WRITTEN.store(0, Relaxed);
}

/// Lets the next out-of-memory write a report again (one per training step, say); false when no
/// out-of-memory report was asked for.
pub fn arm_out_of_memory_report() -> bool {
    OOM_SEEN.store(false, Ordering::Release);
    OOM_PATH.get().is_some()
}

/// Called when an allocation is refused by the ceiling or failed by the driver for want of memory:
/// the first time, writes the out-of-memory report (when one was asked for). Cold.
#[cold]
pub fn out_of_memory(
    segment: &Segment,
    segment_path: Option<&Path>,
    ledger: &Ledger,
    oom: impl FnOnce() -> OomInfo,
) {
    let Some(pattern) = OOM_PATH.get() else {
        return;
    };
    if OOM_SEEN.swap(true, Ordering::AcqRel) {
        return;
    }
    let mut snapshot = report(segment, segment_path, ledger);
    snapshot.oom = Some(oom());
    let recent = crate::trace::recent(RECENT_EVENTS, crate::stacks::describe);
    snapshot.timeline = (!recent.is_empty()).then_some(recent);
    let n = OOM_WRITTEN.fetch_add(1, Relaxed);
    write_snapshot(
        &gpumemhook_reader::expand_output_numbered(pattern, Some(n)),
        &snapshot,
        "out-of-memory report",
    );
}
