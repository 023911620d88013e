//! Policy, which device a stream is on: asked of the driver once per stream and cached in the
//! ledger, forgotten when the stream or any context dies (a later stream may get the same handle).
//! The bodies of `cuStreamDestroy*`, `cuCtxDestroy*` and the primary-context resets and releases
//! are here.

use crate::driver::{self, DriverFn};
use crate::ffi::*;
use crate::state;
use crate::table::Entry;

/// The device of `stream`: device 0 when the process sees one device; otherwise the cached answer
/// of the driver, asked once per stream (the cache forgets a stream when it or any context is
/// destroyed, so a recycled stream handle is asked again).
#[inline]
pub fn device_of_stream(active: &state::Active, stream: CuStream) -> Option<u32> {
    if driver::single_device() {
        return Some(0);
    }
    if driver::is_special_stream(stream) {
        return driver::current_device();
    }
    if let Some(d) = active.ledger.stream_device(stream as u64) {
        return Some(d);
    }
    let device = driver::stream_device(stream)?;
    active.ledger.set_stream_device(stream as u64, device);
    Some(device)
}

/// `cuStreamDestroy*`: the stream's cached device is forgotten first, so a later stream that
/// receives the same handle is asked again.
pub fn stream_destroy(
    _: Entry<DriverFn>,
    call: impl FnOnce() -> CuResult,
    stream: CuStream,
) -> CuResult {
    if let Some(active) = state::active() {
        active.ledger.forget_stream(stream as u64);
    }
    call()
}

/// `cuCtxDestroy*`, `cuDevicePrimaryCtxReset*` and `cuDevicePrimaryCtxRelease*`: every stream of a
/// destroyed context dies with it (and the primary context may be destroyed), so every cached
/// stream is forgotten.
pub fn streams_gone(_: Entry<DriverFn>, call: impl FnOnce() -> CuResult) -> CuResult {
    forget_streams();
    call()
}

#[cold]
fn forget_streams() {
    if let Some(active) = state::active() {
        active.ledger.forget_all_streams();
    }
}
