//! NVML (`libnvidia-ml.so.1`): finding its real functions (the rows of `crate::table::nvml_table`),
//! as for the driver, and the hook's own queries of it. What the wrapped functions do is
//! `crate::nvml_hooks`'s; their doors are `crate::exports`'s.
//!
//! Doors: exported shadows (programs linked to NVML; they call the next definition after this
//! library), and the transparent `dlsym` (pynvml and PyTorch `dlopen` NVML and look its functions
//! up by handle), which asks [`function_at`] which function a real address is and hands out the
//! wrapper of that function. Keyed by address, as for the driver, so a function reached through two
//! doors is still adjusted once (and every adjustment replaces figures rather than adding to them,
//! so even a wrapper called through another is harmless).
//!
//! The hook also calls NVML itself, off the allocation path, to measure the process's overhead
//! ([`process_used`]): it then loads NVML if the program has not.
//!
//! The C types come from `nvml-wrapper-sys`, the maintained raw binding of the rust-nvml project
//! (bindgen output of NVIDIA's `nvml.h`); we use its types only, never its loader. Return codes stay
//! plain integers in every exported signature.

use std::ffi::{c_char, c_int, c_uint, CStr};
use std::sync::atomic::{AtomicU8, Ordering};

use gpumemhook_segment::MAX_DEVICES;
use nvml_wrapper_sys::bindings::{
    nvmlDevice_t, nvmlMemory_t, nvmlMemory_v2_t, nvmlProcessInfo_t, nvmlProcessInfo_v1_t,
};

use crate::resolve::{Library, Via};
use crate::table::Row;

/// NVML's return code (`nvmlReturn_t`), a plain integer on the wire.
pub type NvmlReturn = c_int;
pub const NVML_SUCCESS: NvmlReturn = 0;
/// `NVML_ERROR_LIBRARY_NOT_FOUND`: what a shadow answers when no NVML can be found.
pub const NVML_ERROR_LIBRARY_NOT_FOUND: NvmlReturn = 12;
/// Room for the UUID string (`NVML_DEVICE_UUID_V2_BUFFER_SIZE`).
const UUID_BUFFER: usize = 96;
/// Processes read per device when measuring; a device with more is not measured.
const MAX_PROCESSES: usize = 256;

/// Expands NVML's table (`crate::table`) into [`NvmlFn`], `NAME_ARRAY`, `ALL` and [`rows`] (each
/// row's C signature).
macro_rules! nvml_functions {
    ($($rows:tt)*) => { crate::table::functions! { NvmlFn -> NvmlReturn; $($rows)* } };
}
crate::table::nvml_table!(nvml_functions);

/// NVML's real functions (see [`crate::resolve`]).
static NVML: Library<COUNT> = Library::new(&NAME_ARRAY, b"libnvidia-ml.so", NVML_FILE);

const UNKNOWN: u8 = 0;
const READY: u8 = 2;

/// Our own `nvmlInit_v2`, made once: `UNKNOWN`, then `READY` or `FAILED`.
static OWN_INIT: AtomicU8 = AtomicU8::new(UNKNOWN);
const FAILED: u8 = 3;

const NVML_FILE: &CStr = gpumemhook_reader::env::NVML_LIB_NAME;

/// The real NVML function of row `R`, cast to the row's C signature; `None` when no NVML can be
/// found.
pub fn real<R: Row<Library = NvmlFn>>(via: Via) -> Option<R::Fn> {
    // SAFETY: the address was resolved under `R`'s exact name, whose C signature is `R::Fn`.
    NVML.target(R::ID as usize, via)
        .map(|p| unsafe { R::cast(p) })
}

/// Resolves from an NVML the process already loaded, if any.
fn resolve_loaded() -> bool {
    NVML.ensure_loaded()
}

/// In a forked child: a resolution a parent thread had under way is started again.
pub fn forked() {
    NVML.forked();
}

/// The NVML function whose real address is `p`, the result of a lookup of `name` (the first such
/// lookup of a name the table lists is the first contact, as for the driver).
pub fn function_at(name: &[u8], p: usize) -> Option<NvmlFn> {
    if !NVML.is_ready() {
        if !NVML.knows(name) {
            return None;
        }
        NVML.contact(p);
    }
    NVML.index_of_real(p).and_then(|i| ALL.get(i)).copied()
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
pub fn ordinal_of(device: nvmlDevice_t) -> Option<u32> {
    let get_uuid = real::<rows::GetUuid>(Via::Driver)?;
    let mut text = [0u8; UUID_BUFFER];
    // SAFETY: the buffer is writable for its stated length.
    let rc = unsafe { get_uuid(device, text.as_mut_ptr().cast(), UUID_BUFFER as c_uint) };
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
    let by_uuid = real::<rows::HandleByUuid>(Via::Driver)?;
    let uuid = crate::driver::device_uuid(ordinal)?;
    let mut text = [0u8; 41];
    text[..40].copy_from_slice(&uuid_text(&uuid));
    let mut handle: nvmlDevice_t = std::ptr::null_mut();
    // SAFETY: the text is NUL-terminated and `handle` is writable.
    let rc = unsafe { by_uuid(text.as_ptr().cast(), &mut handle) };
    (rc == NVML_SUCCESS && !handle.is_null()).then_some(handle)
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
    let found = if let Some(f) =
        real::<rows::ProcessesV3>(Via::Driver).or_else(|| real::<rows::ProcessesV2>(Via::Driver))
    {
        let empty = nvmlProcessInfo_t {
            pid: 0,
            usedGpuMemory: 0,
            gpuInstanceId: 0,
            computeInstanceId: 0,
        };
        own_entry(
            // SAFETY: `count` says how many entries the array behind `infos` holds.
            |count, infos| unsafe { f(device, count, infos) },
            empty,
            |p| (p.pid, p.usedGpuMemory),
        )?
    } else {
        let f = real::<rows::Processes>(Via::Driver).ok_or(Unmeasured::NoLibrary)?;
        let empty = nvmlProcessInfo_v1_t {
            pid: 0,
            usedGpuMemory: 0,
        };
        own_entry(
            // SAFETY: `count` says how many entries the array behind `infos` holds.
            |count, infos| unsafe { f(device, count, infos) },
            empty,
            |p| (p.pid, p.usedGpuMemory),
        )?
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
    let init = real::<rows::Init>(Via::Driver).ok_or(Unmeasured::NoLibrary)?;
    // SAFETY: `nvmlInit_v2` takes nothing. NVML counts initialisations, so the program's own
    // `nvmlShutdown` never undoes ours.
    let rc = unsafe { init() };
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

/// Lists the compute processes of a device through `list` (one of the versions of
/// `nvmlDeviceGetComputeRunningProcesses`, whose entries are `T`, given the count in and out and
/// the array) and returns this process's used bytes, `None` when it is not listed; `fields` reads
/// `(pid, used)` from an entry.
fn own_entry<T: Copy>(
    list: impl FnOnce(*mut c_uint, *mut T) -> NvmlReturn,
    empty: T,
    fields: impl Fn(&T) -> (c_uint, u64),
) -> Result<Option<u64>, Unmeasured> {
    let pid = std::process::id();
    let mut infos = [empty; MAX_PROCESSES];
    let mut count = MAX_PROCESSES as c_uint;
    let rc = list(&mut count, infos.as_mut_ptr());
    if rc != NVML_SUCCESS {
        return Err(Unmeasured::QueryFailed(rc));
    }
    Ok(infos[..(count as usize).min(MAX_PROCESSES)]
        .iter()
        .map(&fields)
        .find(|&(p, _)| p == pid)
        .map(|(_, used)| used))
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
