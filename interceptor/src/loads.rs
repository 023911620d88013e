//! Policy, module loads (`cuModuleLoad*`, `cuLibraryLoad*`): the context grew, so an emulated
//! device's overhead is measured again (`crate::emulation`); nothing else is done.

use crate::driver::{self, DriverFn};
use crate::emulation;
use crate::ffi::*;
use crate::state;
use crate::table::Entry;

/// Every module and library load. (A library loads into every context; the current device is
/// measured, and the others at their next measurement.)
pub fn module_loaded(_: Entry<DriverFn>, call: impl FnOnce() -> CuResult) -> CuResult {
    let rc = call();
    if rc == CUDA_SUCCESS {
        if let Some(active) = state::active() {
            emulation::module_loaded(active.segment, driver::current_device());
        }
    }
    rc
}
