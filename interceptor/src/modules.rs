//! Which shared object asked: a return address into the caller becomes the module slot charged
//! with a device allocation (the segment's breakdown, `gpumemhook_segment::Modules`).
//!
//! - **Hot path** ([`slot_of`]): the address is checked against the ranges registered so far, one
//!   per module that ever allocated (a handful), with plain atomic loads: no lock, no allocation,
//!   no system call.
//! - **Cold path** (an address in no registered range: once per module): the loader's list of
//!   objects (`dl_iterate_phdr`) gives the object holding the address and its extent. Then, under a
//!   short registration lock inside which nothing is called, the module gets a slot by its path
//!   (`other` past [`MODULE_SLOTS`]) and its range is published. The loader is asked *outside* the
//!   lock: a thread that holds the loader's lock (a library constructor that allocates) can never
//!   wait for ours while we wait for it. A forked child resets the lock (a parent thread may have
//!   held it at the instant of `fork`) and names the slots again in its own segment ([`publish`]).
//!
//! The main program is named by its executable (`/proc/self/exe`). An unknown caller (return
//! address 0: built without frame pointers, see [`return_address!`]) and an address in no loaded
//! object are charged to `other`. A module unloaded and another loaded at its addresses would keep
//! the first one's slot: CUDA libraries are not unloaded in practice.

use std::cell::UnsafeCell;
use std::ffi::{c_int, c_void, CStr};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use gpumemhook_segment::Segment;
use gpumemhook_segment::{MODULE_CELLS, MODULE_PATH_LEN, MODULE_SLOTS, OTHER_MODULE};

/// The return address of the function this expands in (the address in its caller that the call
/// returns to), or 0 where the hook is built without frame pointers.
///
/// The workspace builds with `-C force-frame-pointers=yes` (`.cargo/config.toml`), which makes
/// every function keep its frame record at the frame pointer: `[rbp + 8]` (x86-64) and
/// `[x29 + 8]` (aarch64) hold the return address. `build.rs` turns on
/// `cfg(gpumemhook_frame_pointers)` only when those flags reach the compiler, so a build without
/// them never reads through a register that is not a frame pointer.
macro_rules! return_address {
    () => {{
        #[cfg(all(gpumemhook_frame_pointers, target_arch = "x86_64"))]
        let address: usize = {
            let address: usize;
            // SAFETY: with frame pointers forced, rbp points at this function's frame record, whose
            // second word is the return address; the load reads our own stack.
            unsafe {
                std::arch::asm!(
                    "mov {}, qword ptr [rbp + 8]",
                    out(reg) address,
                    options(nostack, readonly, preserves_flags)
                )
            };
            address
        };
        #[cfg(all(gpumemhook_frame_pointers, target_arch = "aarch64"))]
        let address: usize = {
            let address: usize;
            // SAFETY: with frame pointers forced, x29 points at this function's frame record
            // (saved x29, saved x30 = the return address); the load reads our own stack.
            unsafe {
                std::arch::asm!(
                    "ldr {}, [x29, #8]",
                    out(reg) address,
                    options(nostack, readonly, preserves_flags)
                )
            };
            address
        };
        #[cfg(not(all(
            gpumemhook_frame_pointers,
            any(target_arch = "x86_64", target_arch = "aarch64")
        )))]
        let address: usize = 0;
        address
    }};
}

pub(crate) use return_address;

/// Where a shadow's or wrapper's caller resumes: the return address it was called from (0 when
/// unknown), for the module charged with an allocation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Caller(pub usize);

/// The [`Caller`] of the function this expands in: a row of `crate::table` passes `caller!()` to a
/// body that charges an allocation to its caller's module, and it expands inside the generated
/// shadow or wrapper.
macro_rules! caller {
    () => {
        $crate::modules::Caller($crate::modules::return_address!())
    };
}
pub(crate) use caller;

/// Ranges the registry can hold (one per module that allocated; further ones are looked up again
/// each time, and still charged correctly).
const RANGES: usize = 128;

/// One object's extent in memory and its slot.
struct Range {
    start: AtomicUsize,
    end: AtomicUsize,
    slot: AtomicUsize,
}

/// The modules named so far, in process memory (a forked child's new segment is named from it).
struct Names {
    paths: [[u8; MODULE_PATH_LEN]; MODULE_SLOTS],
    lens: [usize; MODULE_SLOTS],
    count: usize,
}

struct Registry {
    ranges: [Range; RANGES],
    /// Ranges published: entries below it are complete (stored before the release increment).
    published: AtomicUsize,
    /// The registration lock: taken only on the cold path, around plain copies.
    lock: AtomicBool,
    names: UnsafeCell<Names>,
}

// SAFETY: `names` is only touched while `lock` is held; everything else is atomic.
unsafe impl Sync for Registry {}

static REGISTRY: Registry = Registry {
    ranges: [const {
        Range {
            start: AtomicUsize::new(0),
            end: AtomicUsize::new(0),
            slot: AtomicUsize::new(0),
        }
    }; RANGES],
    published: AtomicUsize::new(0),
    lock: AtomicBool::new(false),
    names: UnsafeCell::new(Names {
        paths: [[0; MODULE_PATH_LEN]; MODULE_SLOTS],
        lens: [0; MODULE_SLOTS],
        count: 0,
    }),
};

/// The slot of the module holding `address`, registering the module on first sight (its name then
/// goes into `segment`).
#[inline]
pub fn slot_of(address: usize, segment: &Segment) -> u8 {
    if address == 0 {
        return OTHER_MODULE as u8;
    }
    let published = REGISTRY.published.load(Ordering::Acquire).min(RANGES);
    for range in &REGISTRY.ranges[..published] {
        if address >= range.start.load(Ordering::Relaxed)
            && address < range.end.load(Ordering::Relaxed)
        {
            return range.slot.load(Ordering::Relaxed) as u8;
        }
    }
    register(address, segment)
}

/// A path and the extent of the object found for an address.
struct Found {
    path: [u8; MODULE_PATH_LEN],
    len: usize,
    start: usize,
    end: usize,
}

#[cold]
fn register(address: usize, segment: &Segment) -> u8 {
    let Some(found) = find_object(address) else {
        return OTHER_MODULE as u8;
    };
    let Some(_held) = Lock::take() else {
        return OTHER_MODULE as u8;
    };
    // SAFETY: the registration lock is held (`_held`), so no other thread touches `names`.
    let names = unsafe { &mut *REGISTRY.names.get() };
    let path = &found.path[..found.len];
    let existing = (0..names.count).find(|&i| &names.paths[i][..names.lens[i]] == path);
    let slot = match existing {
        Some(i) => i,
        None if names.count < MODULE_SLOTS => {
            let i = names.count;
            names.paths[i] = found.path;
            names.lens[i] = found.len;
            names.count += 1;
            segment.modules.name(i, path);
            i
        }
        None => OTHER_MODULE,
    };
    let published = REGISTRY.published.load(Ordering::Relaxed);
    let already = REGISTRY.ranges[..published.min(RANGES)]
        .iter()
        .any(|r| r.start.load(Ordering::Relaxed) == found.start);
    if !already && published < RANGES {
        let range = &REGISTRY.ranges[published];
        range.start.store(found.start, Ordering::Relaxed);
        range.end.store(found.end, Ordering::Relaxed);
        range.slot.store(slot, Ordering::Relaxed);
        REGISTRY.published.store(published + 1, Ordering::Release);
    }
    slot as u8
}

/// The registration lock, held until dropped. Taking it spins (its holders only copy a few hundred
/// bytes); `None` after a very long wait, which only a bug could cause: the caller then charges
/// `other` rather than hang the program.
struct Lock;

impl Lock {
    fn take() -> Option<Lock> {
        for spin in 0..1_000_000u32 {
            if REGISTRY
                .lock
                .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
            {
                return Some(Lock);
            }
            crate::spin::back_off(spin);
        }
        None
    }
}

impl Drop for Lock {
    fn drop(&mut self) {
        REGISTRY.lock.store(false, Ordering::Release);
    }
}

/// The loaded object whose segments hold `address`: its path (the executable's for the main
/// program) and its extent.
fn find_object(address: usize) -> Option<Found> {
    struct Search {
        address: usize,
        found: Option<Found>,
    }
    unsafe extern "C" fn visit(
        info: *mut libc::dl_phdr_info,
        _size: usize,
        data: *mut c_void,
    ) -> c_int {
        // SAFETY: the loader passes a valid `dl_phdr_info`, and `data` is our `Search`.
        let (info, search) = unsafe { (&*info, &mut *(data as *mut Search)) };
        let base = info.dlpi_addr as usize;
        let (mut start, mut end) = (usize::MAX, 0usize);
        for i in 0..usize::from(info.dlpi_phnum) {
            // SAFETY: `dlpi_phdr` points at `dlpi_phnum` program headers.
            let header = unsafe { &*info.dlpi_phdr.add(i) };
            if header.p_type != libc::PT_LOAD {
                continue;
            }
            let from = base.wrapping_add(header.p_vaddr as usize);
            start = start.min(from);
            end = end.max(from.wrapping_add(header.p_memsz as usize));
        }
        if search.address < start || search.address >= end {
            return 0;
        }
        let mut found = Found {
            path: [0; MODULE_PATH_LEN],
            len: 0,
            start,
            end,
        };
        let name = if info.dlpi_name.is_null() {
            &[][..]
        } else {
            // SAFETY: `dlpi_name` is a NUL-terminated string owned by the loader.
            unsafe { CStr::from_ptr(info.dlpi_name) }.to_bytes()
        };
        found.len = if name.is_empty() {
            executable_path(&mut found.path)
        } else {
            copy_path(&mut found.path, name)
        };
        search.found = Some(found);
        1
    }
    let mut search = Search {
        address,
        found: None,
    };
    // SAFETY: `visit` matches the callback type and `search` outlives the call.
    unsafe { libc::dl_iterate_phdr(Some(visit), (&mut search as *mut Search).cast()) };
    search.found
}

/// Copies `name` into `path` (keeping a final NUL), returning the length kept.
fn copy_path(path: &mut [u8; MODULE_PATH_LEN], name: &[u8]) -> usize {
    let len = name.len().min(MODULE_PATH_LEN - 1);
    path[..len].copy_from_slice(&name[..len]);
    len
}

/// The executable's path, from `/proc/self/exe` (`"program"` when it cannot be read).
fn executable_path(path: &mut [u8; MODULE_PATH_LEN]) -> usize {
    // SAFETY: the link name is NUL-terminated and `path` has room for `MODULE_PATH_LEN - 1` bytes.
    let n = unsafe {
        libc::readlink(
            c"/proc/self/exe".as_ptr(),
            path.as_mut_ptr().cast(),
            MODULE_PATH_LEN - 1,
        )
    };
    match usize::try_from(n) {
        Ok(n) if n > 0 => n,
        _ => copy_path(path, b"program"),
    }
}

/// Names every module registered so far in `segment` (a forked child's new segment).
pub fn publish(segment: &Segment) {
    let Some(_held) = Lock::take() else {
        return;
    };
    // SAFETY: the registration lock is held.
    let names = unsafe { &*REGISTRY.names.get() };
    for i in 0..names.count {
        segment.modules.name(i, &names.paths[i][..names.lens[i]]);
    }
}

/// In a forked child (async-signal-safe: one plain store): a registration a parent thread had under
/// way at the instant of `fork` never finishes here, so its lock is released. What it had not yet
/// published is simply registered again.
pub fn forked() {
    REGISTRY.lock.store(false, Ordering::Relaxed);
}

/// The file names of every cell as the breakdown shows them, by cell index: for reports and
/// timelines, never on the allocation path.
pub struct ModuleNames(Vec<String>);

impl ModuleNames {
    /// The name of cell `slot`: `other` past the named ones, `""` for a slot not named in this
    /// process or no module at all (`trace::NO_MODULE`).
    pub fn of(&self, slot: u8) -> &str {
        self.0.get(usize::from(slot)).map_or("", String::as_str)
    }
}

/// Copies the file name of cell `slot` into `out` (cut to fit) and returns its length, 0 for a slot
/// not named: for the timeline, which writes each name once. Takes the registration lock, never
/// allocates.
pub fn file_name_into(slot: u8, out: &mut [u8]) -> usize {
    let slot = usize::from(slot);
    let name: &[u8] = if slot == OTHER_MODULE {
        gpumemhook_reader::OTHER_MODULE_NAME.as_bytes()
    } else {
        let Some(_held) = Lock::take() else {
            return 0;
        };
        // SAFETY: the registration lock is held.
        let names = unsafe { &*REGISTRY.names.get() };
        if slot >= names.count {
            return 0;
        }
        let path = &names.paths[slot][..names.lens[slot]];
        let start = path.iter().rposition(|&b| b == b'/').map_or(0, |i| i + 1);
        let len = (path.len() - start).min(out.len());
        out[..len].copy_from_slice(&path[start..start + len]);
        return len;
    };
    let len = name.len().min(out.len());
    out[..len].copy_from_slice(&name[..len]);
    len
}

/// The names of every cell now (takes the registration lock).
pub fn file_names() -> ModuleNames {
    let mut all = vec![String::new(); MODULE_CELLS];
    all[OTHER_MODULE] = gpumemhook_reader::OTHER_MODULE_NAME.to_string();
    let Some(_held) = Lock::take() else {
        return ModuleNames(all);
    };
    // SAFETY: the registration lock is held.
    let names = unsafe { &*REGISTRY.names.get() };
    for (i, name) in all.iter_mut().enumerate().take(names.count) {
        let path = String::from_utf8_lossy(&names.paths[i][..names.lens[i]]).into_owned();
        *name = gpumemhook_reader::module_file_name(&path).to_string();
    }
    ModuleNames(all)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Returns its own caller, as a shadow does.
    #[inline(never)]
    extern "C" fn whoami() -> usize {
        return_address!()
    }

    /// Calls [`whoami`]: the address it returns must lie inside this small function.
    #[inline(never)]
    extern "C" fn calls_whoami() -> usize {
        std::hint::black_box(whoami as extern "C" fn() -> usize)()
    }

    #[test]
    fn the_return_address_lies_in_the_caller() {
        #[cfg(not(gpumemhook_frame_pointers))]
        panic!(
            "built without frame pointers: .cargo/config.toml's flags did not reach the compiler"
        );
        let start = calls_whoami as *const () as usize;
        let ra = std::hint::black_box(calls_whoami as extern "C" fn() -> usize)();
        assert!(
            ra > start && ra < start + 256,
            "{ra:#x} is not inside calls_whoami at {start:#x}"
        );
    }

    #[test]
    fn the_test_binary_and_libc_get_their_own_slots_and_unknown_callers_go_to_other() {
        // SAFETY: every field of `Segment` is an atomic integer, for which zero is valid.
        let seg: Box<Segment> = unsafe { Box::new_zeroed().assume_init() };
        let here = the_test_binary_and_libc_get_their_own_slots_and_unknown_callers_go_to_other
            as *const () as usize;
        let libc_fn = libc::getpid as *const () as usize;
        let own = slot_of(here, &seg);
        let lib = slot_of(libc_fn, &seg);
        assert_ne!(own, lib);
        assert_eq!(slot_of(here + 1, &seg), own, "cached range");
        assert_eq!(slot_of(0, &seg), OTHER_MODULE as u8);
        assert_eq!(slot_of(8, &seg), OTHER_MODULE as u8, "in no object");
        let exe = std::fs::read_link("/proc/self/exe").unwrap();
        assert_eq!(
            seg.modules.path(own.into()).unwrap(),
            exe.display().to_string()
        );
        let names = file_names();
        assert!(names.of(lib).starts_with("libc"), "{}", names.of(lib));
        assert_eq!(names.of(OTHER_MODULE as u8), "other");
        assert_eq!(names.of(u8::MAX), "", "no module");
        // A second segment (a forked child's) gets the same names.
        // SAFETY: as above.
        let child: Box<Segment> = unsafe { Box::new_zeroed().assume_init() };
        publish(&child);
        assert_eq!(child.modules.path(lib.into()), seg.modules.path(lib.into()));
    }
}
