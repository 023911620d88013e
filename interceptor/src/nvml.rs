//! NVML (`libnvidia-ml.so.1`), wrapped the way the driver is, so that its memory figures agree with
//! the CUDA views under a ceiling or an emulated card (`docs/emulation.md`).
//!
//! Doors: exported shadows (programs linked to NVML; they call the next definition after this
//! library), and the transparent `dlsym` (pynvml and PyTorch `dlopen` NVML and look its functions
//! up by handle): [`crate::driver::substitute`] hands any `nvml*` result to [`substitute`], which
//! gives our wrapper of the real function at that address. Keyed by address, as for the driver, so
//! a function reached through two doors is still adjusted once (and every adjustment replaces
//! figures rather than adding to them, so even a wrapper called through another is harmless).
//!
//! The hook also calls NVML itself, off the allocation path, to measure the process's overhead
//! ([`process_used`]): it then loads NVML if the program has not.
//!
//! The C types come from `nvml-wrapper-sys`, the maintained raw binding of the rust-nvml project
//! (bindgen output of NVIDIA's `nvml.h`); we use its types only, never its loader. Return codes stay
//! plain integers in every exported signature.

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::sync::atomic::{AtomicU8, Ordering};

use gpumemhook_reader::MAX_DEVICES;
use nvml_wrapper_sys::bindings::{
    nvmlDevice_t, nvmlMemory_t, nvmlMemory_v2_t, nvmlProcessInfo_t, nvmlProcessInfo_v1_t,
};

use crate::exports;
use crate::resolve::{Library, Via};

/// NVML's return code (`nvmlReturn_t`), a plain integer on the wire.
pub type NvmlReturn = c_int;
pub const NVML_SUCCESS: NvmlReturn = 0;
/// `NVML_ERROR_LIBRARY_NOT_FOUND`: what a shadow answers when no NVML can be found.
pub const NVML_ERROR_LIBRARY_NOT_FOUND: NvmlReturn = 12;
/// Room for the UUID string (`NVML_DEVICE_UUID_V2_BUFFER_SIZE`).
const UUID_BUFFER: usize = 96;
/// Processes read per device when measuring; a device with more is not measured.
const MAX_PROCESSES: usize = 256;

/// Declares the NVML functions: index, name, and the wrapper handed out in place of the real one
/// (`0` for those the hook only calls).
macro_rules! nvml_functions {
    ($( $id:ident = $name:literal => $wrapper:expr ),* $(,)?) => {
        /// An NVML function the hook knows.
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        #[repr(usize)]
        pub enum NvmlFn { $( $id ),* }

        const COUNT: usize = [ $( stringify!($id) ),* ].len();
        const NAME_ARRAY: [&CStr; COUNT] = [ $( $name ),* ];

        fn wrapper_address(f: NvmlFn) -> usize {
            match f { $( NvmlFn::$id => $wrapper ),* }
        }

        const ALL: [NvmlFn; COUNT] = [ $( NvmlFn::$id ),* ];
    };
}

nvml_functions! {
    MemoryInfo = c"nvmlDeviceGetMemoryInfo" => exports::nvml_wrap::nvmlDeviceGetMemoryInfo as *const () as usize,
    MemoryInfoV2 = c"nvmlDeviceGetMemoryInfo_v2" => exports::nvml_wrap::nvmlDeviceGetMemoryInfo_v2 as *const () as usize,
    Processes = c"nvmlDeviceGetComputeRunningProcesses" => exports::nvml_wrap::nvmlDeviceGetComputeRunningProcesses as *const () as usize,
    ProcessesV2 = c"nvmlDeviceGetComputeRunningProcesses_v2" => exports::nvml_wrap::nvmlDeviceGetComputeRunningProcesses_v2 as *const () as usize,
    ProcessesV3 = c"nvmlDeviceGetComputeRunningProcesses_v3" => exports::nvml_wrap::nvmlDeviceGetComputeRunningProcesses_v3 as *const () as usize,
    Init = c"nvmlInit_v2" => 0,
    GetUuid = c"nvmlDeviceGetUUID" => 0,
    HandleByUuid = c"nvmlDeviceGetHandleByUUID" => 0,
}

/// NVML's real functions (see [`crate::resolve`]).
static NVML: Library<COUNT> = Library::new(&NAME_ARRAY, b"libnvidia-ml.so", NVML_FILE);

const UNKNOWN: u8 = 0;
const READY: u8 = 2;

/// Our own `nvmlInit_v2`, made once: `UNKNOWN`, then `READY` or `FAILED`.
static OWN_INIT: AtomicU8 = AtomicU8::new(UNKNOWN);
const FAILED: u8 = 3;

const NVML_FILE: &CStr = c"libnvidia-ml.so.1";

/// The function to call for `f`, `None` when no NVML can be found.
fn target(f: NvmlFn, via: Via) -> Option<usize> {
    NVML.target(f as usize, via)
}

/// Resolves from an NVML the process already loaded, if any.
fn resolve_loaded() -> bool {
    NVML.ensure_loaded()
}

/// In a forked child: a resolution a parent thread had under way is started again.
pub fn forked() {
    NVML.forked();
}

/// The `dlsym` door for `nvml*` names: our wrapper when `p` is a real NVML function we wrap.
pub fn substitute(name: &[u8], p: *mut c_void) -> *mut c_void {
    if !NVML.is_ready() {
        if !NVML.knows(name) {
            return p;
        }
        NVML.contact(p as usize);
    }
    NVML.index_of_real(p as usize)
        .and_then(|i| ALL.get(i))
        .map(|&f| wrapper_address(f))
        .filter(|&w| w != 0)
        .map_or(p, |w| w as *mut c_void)
}

/// The real function `f`, or an early return of "library not found".
macro_rules! real_nvml {
    ($f:expr, $via:expr, $ty:ty) => {
        match target($f, $via) {
            // SAFETY: the address was resolved under the exact name of `$f`, whose C signature is
            // `$ty`.
            Some(p) => unsafe { std::mem::transmute::<usize, $ty>(p) },
            None => return NVML_ERROR_LIBRARY_NOT_FOUND,
        }
    };
}

// ---- which CUDA device an NVML handle is ----

/// The CUDA device `uuid` written as NVML writes UUIDs (`GPU-8-4-4-4-12` lower-case hex).
fn uuid_text(uuid: &[u8; 16]) -> [u8; 40] {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut out = [0u8; 40];
    out[..4].copy_from_slice(b"GPU-");
    let mut at = 4;
    for (i, b) in uuid.iter().enumerate() {
        if matches!(i, 4 | 6 | 8 | 10) {
            out[at] = b'-';
            at += 1;
        }
        out[at] = HEX[(b >> 4) as usize];
        out[at + 1] = HEX[(b & 15) as usize];
        at += 2;
    }
    out
}

/// The CUDA ordinal of an NVML device handle (matched by UUID), `None` when the process's CUDA
/// driver is not initialised or does not see that device (then the figures pass unchanged).
fn ordinal_of(device: nvmlDevice_t) -> Option<u32> {
    let get_uuid = target(NvmlFn::GetUuid, Via::Driver)?;
    let mut text = [0u8; UUID_BUFFER];
    // SAFETY: `get_uuid` is `nvmlDeviceGetUUID(nvmlDevice_t, char *, unsigned)`, resolved by its
    // exact name; the buffer is writable for its stated length.
    let rc = unsafe {
        std::mem::transmute::<
            usize,
            unsafe extern "C" fn(nvmlDevice_t, *mut c_char, c_uint) -> NvmlReturn,
        >(get_uuid)(device, text.as_mut_ptr().cast(), UUID_BUFFER as c_uint)
    };
    if rc != NVML_SUCCESS {
        return None;
    }
    let len = text.iter().position(|&b| b == 0).unwrap_or(UUID_BUFFER);
    let wanted = &text[..len];
    (0..crate::driver::device_count()?.min(MAX_DEVICES as u32)).find(|&d| {
        crate::driver::device_uuid(d).is_some_and(|u| uuid_text(&u).eq_ignore_ascii_case(wanted))
    })
}

/// The NVML handle of CUDA device `ordinal` (the hook's own lookup, through the real functions).
fn handle_of(ordinal: u32) -> Option<nvmlDevice_t> {
    let by_uuid = target(NvmlFn::HandleByUuid, Via::Driver)?;
    let uuid = crate::driver::device_uuid(ordinal)?;
    let mut text = [0u8; 41];
    text[..40].copy_from_slice(&uuid_text(&uuid));
    let mut handle: nvmlDevice_t = std::ptr::null_mut();
    // SAFETY: `by_uuid` is `nvmlDeviceGetHandleByUUID(const char *, nvmlDevice_t *)`; the text is
    // NUL-terminated and `handle` is writable.
    let rc = unsafe {
        std::mem::transmute::<
            usize,
            unsafe extern "C" fn(*const c_char, *mut nvmlDevice_t) -> NvmlReturn,
        >(by_uuid)(text.as_ptr().cast(), &mut handle)
    };
    (rc == NVML_SUCCESS && !handle.is_null()).then_some(handle)
}

/// The counters whose view applies to the NVML device `device`, if it has one.
fn view_of(device: nvmlDevice_t) -> Option<&'static gpumemhook_reader::layout::DeviceCounters> {
    let active = crate::state::active()?;
    let counters = active.segment.device(ordinal_of(device)?)?;
    counters.has_view().then_some(counters)
}

// ---- measuring ----

/// Why the overhead could not be measured, for the one line that says so.
pub enum Unmeasured {
    NoLibrary,
    InitFailed(NvmlReturn),
    NoDevice,
    QueryFailed(NvmlReturn),
    NotListed,
}

/// NVML's figure of this process's use of CUDA device `ordinal`, in bytes. Loads and initialises
/// NVML if the program has not (once).
pub fn process_used(ordinal: u32) -> Result<u64, Unmeasured> {
    if !resolve_loaded() {
        // SAFETY: loads NVML by its soname, locally: its constructors are NVIDIA's own.
        let handle =
            unsafe { libc::dlopen(NVML_FILE.as_ptr(), libc::RTLD_LAZY | libc::RTLD_LOCAL) };
        if handle.is_null() || !NVML.resolve_all(handle) {
            return Err(Unmeasured::NoLibrary);
        }
    }
    own_init()?;
    let device = handle_of(ordinal).ok_or(Unmeasured::NoDevice)?;
    let found = if let Some(f) = target(NvmlFn::ProcessesV3, Via::Driver)
        .or_else(|| target(NvmlFn::ProcessesV2, Via::Driver))
    {
        let empty = nvmlProcessInfo_t {
            pid: 0,
            usedGpuMemory: 0,
            gpuInstanceId: 0,
            computeInstanceId: 0,
        };
        // SAFETY: `f` is `nvmlDeviceGetComputeRunningProcesses_v3` (or `_v2`), both taking
        // `nvmlProcessInfo_t` (`_v2` layout) entries.
        unsafe { own_entry(f, device, empty, |p| (p.pid, p.usedGpuMemory)) }?
    } else {
        let f = target(NvmlFn::Processes, Via::Driver).ok_or(Unmeasured::NoLibrary)?;
        let empty = nvmlProcessInfo_v1_t {
            pid: 0,
            usedGpuMemory: 0,
        };
        // SAFETY: `f` is `nvmlDeviceGetComputeRunningProcesses` (v1 layout entries).
        unsafe { own_entry(f, device, empty, |p| (p.pid, p.usedGpuMemory)) }?
    };
    // NVML_VALUE_NOT_AVAILABLE (all ones) means it cannot say.
    found
        .filter(|&b| b != u64::MAX)
        .ok_or(Unmeasured::NotListed)
}

fn own_init() -> Result<(), Unmeasured> {
    match OWN_INIT.load(Ordering::Acquire) {
        READY => return Ok(()),
        FAILED => return Err(Unmeasured::InitFailed(0)),
        _ => {}
    }
    let init = target(NvmlFn::Init, Via::Driver).ok_or(Unmeasured::NoLibrary)?;
    // SAFETY: `init` is `nvmlInit_v2(void)`. NVML counts initialisations, so the program's own
    // `nvmlShutdown` never undoes ours.
    let rc = unsafe { std::mem::transmute::<usize, unsafe extern "C" fn() -> NvmlReturn>(init)() };
    OWN_INIT.store(
        if rc == NVML_SUCCESS { READY } else { FAILED },
        Ordering::Release,
    );
    if rc == NVML_SUCCESS {
        Ok(())
    } else {
        Err(Unmeasured::InitFailed(rc))
    }
}

// ---- the wrapped functions' bodies ----

type ProcessesFn<T> = unsafe extern "C" fn(nvmlDevice_t, *mut c_uint, *mut T) -> NvmlReturn;

/// Lists the compute processes of `device` through `f` (one of the versions of
/// `nvmlDeviceGetComputeRunningProcesses`, whose entries are `T`) and returns this process's used
/// bytes, `None` when it is not listed; `fields` reads `(pid, used)` from an entry.
///
/// # Safety
/// `f` must be a version of that function whose entries have `T`'s layout.
unsafe fn own_entry<T: Copy>(
    f: usize,
    device: nvmlDevice_t,
    empty: T,
    fields: impl Fn(&T) -> (c_uint, u64),
) -> Result<Option<u64>, Unmeasured> {
    let pid = std::process::id();
    let mut infos = [empty; MAX_PROCESSES];
    let mut count = MAX_PROCESSES as c_uint;
    // SAFETY: the caller guarantees `f`'s signature; `count` says how many entries `infos` holds.
    let rc = unsafe {
        std::mem::transmute::<usize, ProcessesFn<T>>(f)(device, &mut count, infos.as_mut_ptr())
    };
    if rc != NVML_SUCCESS {
        return Err(Unmeasured::QueryFailed(rc));
    }
    Ok(infos[..(count as usize).min(MAX_PROCESSES)]
        .iter()
        .map(&fields)
        .find(|&(p, _)| p == pid)
        .map(|(_, used)| used))
}

/// `nvmlDeviceGetMemoryInfo`: the device as the CUDA views show it.
pub fn memory_info(
    f: NvmlFn,
    via: Via,
    device: nvmlDevice_t,
    memory: *mut nvmlMemory_t,
) -> NvmlReturn {
    let real = real_nvml!(
        f,
        via,
        unsafe extern "C" fn(nvmlDevice_t, *mut nvmlMemory_t) -> NvmlReturn
    );
    // SAFETY: forwards the caller's arguments unchanged.
    let rc = unsafe { real(device, memory) };
    if rc == NVML_SUCCESS && !memory.is_null() {
        if let Some(counters) = view_of(device) {
            // SAFETY: `memory` is non-null and was filled by the successful call.
            let m = unsafe { &mut *memory };
            let (free, total) = counters.ceiling_view(m.free, m.total);
            (m.total, m.free, m.used) = (total, free, total - free);
        }
    }
    rc
}

/// `nvmlDeviceGetMemoryInfo_v2`: as v1; the view has no reserved memory (what a card reserves is
/// outside the total it reports).
pub fn memory_info_v2(
    f: NvmlFn,
    via: Via,
    device: nvmlDevice_t,
    memory: *mut nvmlMemory_v2_t,
) -> NvmlReturn {
    let real = real_nvml!(
        f,
        via,
        unsafe extern "C" fn(nvmlDevice_t, *mut nvmlMemory_v2_t) -> NvmlReturn
    );
    // SAFETY: forwards the caller's arguments unchanged.
    let rc = unsafe { real(device, memory) };
    if rc == NVML_SUCCESS && !memory.is_null() {
        if let Some(counters) = view_of(device) {
            // SAFETY: as in `memory_info`.
            let m = unsafe { &mut *memory };
            let (free, total) = counters.ceiling_view(m.free, m.total);
            (m.total, m.reserved, m.free, m.used) = (total, 0, free, total - free);
        }
    }
    rc
}

/// A process entry whose figure the view may replace.
pub trait ProcessEntry {
    fn pid(&self) -> u32;
    fn set_used(&mut self, bytes: u64);
}

impl ProcessEntry for nvmlProcessInfo_v1_t {
    fn pid(&self) -> u32 {
        self.pid
    }
    fn set_used(&mut self, bytes: u64) {
        self.usedGpuMemory = bytes;
    }
}

impl ProcessEntry for nvmlProcessInfo_t {
    fn pid(&self) -> u32 {
        self.pid
    }
    fn set_used(&mut self, bytes: u64) {
        self.usedGpuMemory = bytes;
    }
}

/// `nvmlDeviceGetComputeRunningProcesses` (every version): this process's entry shows its use as
/// the views count it (allocations, plus the charged overhead under emulation).
pub fn processes<T: ProcessEntry>(
    f: NvmlFn,
    via: Via,
    device: nvmlDevice_t,
    count: *mut c_uint,
    infos: *mut T,
) -> NvmlReturn {
    let real = real_nvml!(f, via, ProcessesFn<T>);
    // SAFETY: forwards the caller's arguments unchanged.
    let rc = unsafe { real(device, count, infos) };
    if rc != NVML_SUCCESS || count.is_null() || infos.is_null() {
        return rc;
    }
    let Some(counters) = view_of(device) else {
        return rc;
    };
    let (_, total) = counters.ceiling_view(u64::MAX, u64::MAX);
    let own = counters.process_view(total);
    let pid = std::process::id();
    // SAFETY: the successful call wrote `*count` entries into the caller's array.
    let entries = unsafe { std::slice::from_raw_parts_mut(infos, *count as usize) };
    for entry in entries.iter_mut().filter(|e| e.pid() == pid) {
        entry.set_used(own);
    }
    rc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuids_are_written_as_nvml_writes_them() {
        let uuid: [u8; 16] = [
            0x12, 0x34, 0x56, 0x78, 0x9a, 0xbc, 0xde, 0xf0, 0x01, 0x23, 0x45, 0x67, 0x89, 0xab,
            0xcd, 0xef,
        ];
        assert_eq!(
            &uuid_text(&uuid)[..],
            b"GPU-12345678-9abc-def0-0123-456789abcdef"
        );
    }
}
