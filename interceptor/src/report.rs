//! The exit report (`GPUMEMHOOK_REPORT`): the segment's [`Snapshot`] as JSON.
//!
//! `%p` in the path becomes the pid. Only a process that used CUDA (found the driver, or allocated)
//! writes a report: the shells and launchers a program starts around its GPU process (each of which
//! loads the hook too) neither litter the directory nor, with a path without `%p`, overwrite the GPU
//! process's report with an empty one when they exit after it.

use gpumemhook_reader::{Segment, Snapshot};
use std::path::Path;
use std::sync::atomic::Ordering::Relaxed;

/// True when this process used CUDA: it found the driver, or allocated through the hook.
pub fn used_gpu(segment: &Segment) -> bool {
    segment.header.devices_touched.load(Relaxed) != 0
        || segment.header.host_allocs.load(Relaxed) != 0
        || crate::driver::contacted()
}

/// Writes the report to `pattern` (`%p` becomes the pid).
pub fn write(pattern: &str, segment: &Segment, segment_path: Option<&Path>) {
    let pid = std::process::id();
    let path = pattern.replace("%p", &pid.to_string());
    let snapshot = Snapshot::read(segment, segment_path);
    let written = serde_json::to_vec_pretty(&snapshot)
        .map_err(std::io::Error::other)
        .and_then(|json| std::fs::write(&path, json));
    if let Err(e) = written {
        eprintln!("gpumemhook: cannot write the report to {path}: {e}");
    }
}
