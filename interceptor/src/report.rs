//! The exit report (`GPUMEMHOOK_REPORT`): the segment's [`Snapshot`] as JSON.
//!
//! Only a process that used CUDA (found the driver, or allocated) writes a report: the shells and
//! launchers a program starts around its GPU process (each of which loads the hook too) neither
//! litter the directory nor, with a path without `%p`, overwrite the GPU process's report with an
//! empty one when they exit after it. The file is written atomically ([`crate::output`]).

use gpumemhook_reader::{Segment, Snapshot};
use std::path::Path;
use std::sync::atomic::Ordering::Relaxed;

/// True when this process used CUDA: it found the driver, or allocated through the hook.
pub fn used_gpu(segment: &Segment) -> bool {
    segment.header.devices_touched.load(Relaxed) != 0
        || segment.header.host_allocs.load(Relaxed) != 0
        || crate::driver::contacted()
}

/// Writes the report to `path`; a failure is one line on stderr, never an error of the program.
pub fn write(path: &Path, segment: &Segment, segment_path: Option<&Path>) {
    let snapshot = Snapshot::read(segment, segment_path);
    let written = crate::output::write_atomically(path, |out| {
        serde_json::to_writer_pretty(&mut *out, &snapshot).map_err(std::io::Error::other)?;
        out.write_all(b"\n")
    });
    if let Err(e) = written {
        crate::diag::warn(&format!(
            "cannot write the report to {}: {e}",
            path.display()
        ));
    }
}
