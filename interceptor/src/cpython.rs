//! The calling thread's own Python frames, read from CPython's memory without the GIL.
//!
//! PyTorch, JAX and CuPy release the GIL before they allocate, so asking CPython through its C API
//! (which needs the GIL) would find nothing, and waiting for the GIL could deadlock. But the thread
//! that allocates is the one whose frames are read, and it is inside the CUDA call: its chain of
//! frames cannot change while the hook reads it, and no other thread frees a frame that is still
//! executing. So the chain is walked with plain loads: no reference taken, nothing allocated through
//! Python, no lock.
//!
//! What is read, per interpreter version (offsets of 64-bit builds, x86-64 and aarch64 alike; taken
//! from each version's headers, `Include/internal`, and checked against the running interpreter):
//! - the thread state: `PyGILState_GetThisThreadState()`, a read of the thread's TSS slot that is
//!   documented to work on a thread that released the GIL;
//! - 3.9 and 3.10: `tstate->frame`, a chain of `PyFrameObject` (`f_back`, `f_code`, `f_lasti`);
//! - 3.11 and 3.12: `tstate->cframe->current_frame`, a chain of `_PyInterpreterFrame` (`previous`,
//!   `f_code`, `prev_instr`, `owner`: frames owned by the C stack are the interpreter's shims);
//! - 3.13: the offsets CPython publishes for debuggers (`_PyRuntime.debug_offsets`, checked by its
//!   cookie and version): `tstate->current_frame`, `previous`, `f_executable`, `instr_ptr`, `owner`,
//!   and the code object's and str's fields;
//! - a later version (3.14 changed the debug offsets' own layout), an earlier one, a free-threaded
//!   or a debug build: said once on stderr, and no site is recorded. Never a guess.
//!
//! The line is CPython's `PyCode_Addr2Line(code, byte offset)`, which in 3.9–3.13 only reads the
//! code object's line table (`co_lnotab` / `co_linetable`, or 3.11's line array when present) and
//! returns: no allocation, no GIL, no error set. File and function names are read from `str`
//! objects only when they are compact ASCII, or compact with their UTF-8 form cached; anything else
//! is `?`.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::OnceLock;

use crate::resolve::real_dlsym;
use crate::table::Row;

/// Expands CPython's table (`crate::table::cpython_table`) into `CpythonFn`, `NAME_ARRAY` and
/// `rows` (each function's C signature).
macro_rules! cpython_functions {
    ($($rows:tt)*) => { crate::table::functions! { CpythonFn -> c_int; $($rows)* } };
}
crate::table::cpython_table!(cpython_functions);

/// The most frames walked past (shims, frames without a code object) before giving up: a guard
/// against a corrupted chain.
const MAX_WALK: usize = 256;
/// The longest file or function name copied; longer ones are cut.
const MAX_NAME: usize = 1024;

/// One Python frame: `file:line in function`.
pub struct Frame {
    pub file: String,
    pub line: i32,
    pub function: String,
}

/// One Python frame as found, before its line and names are read: what a site is looked up by.
/// The code object's file and function name objects are kept with it, so that a code object freed
/// and another made at its address is told apart unless it has the same file, name and offset.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct RawFrame {
    code: usize,
    offset: i32,
    file: usize,
    name: usize,
}

/// How a version's frames are chained.
#[derive(Clone, Copy, Debug)]
enum Chain {
    /// 3.9, 3.10: `PyFrameObject`s. `lasti_bytes`: the byte offset is `f_lasti` times this.
    Objects {
        tstate_frame: usize,
        back: usize,
        code: usize,
        lasti: usize,
        lasti_bytes: i32,
    },
    /// 3.11+: `_PyInterpreterFrame`s. `cframe`: the offset of `tstate->cframe` (3.11, 3.12), whose
    /// `current_frame` is then at `current_frame`; `None`: `current_frame` is in the thread state.
    Interpreter {
        cframe: Option<usize>,
        current_frame: usize,
        previous: usize,
        code: usize,
        instr: usize,
        owner: usize,
        /// The owner of the interpreter's shim frames (`FRAME_OWNED_BY_CSTACK`), if the version has them.
        shim_owner: Option<u8>,
        /// Where the bytecode starts inside the code object (`co_code_adaptive`).
        code_start: usize,
    },
}

/// A version's layout: its frames, and the fields of code objects and strings read.
#[derive(Clone, Copy, Debug)]
struct Layout {
    chain: Chain,
    co_filename: usize,
    co_name: usize,
    /// `tp_basicsize` of `PyCode_Type` and `PyUnicode_Type` in this layout: compared with the
    /// running interpreter's, they catch a build whose structs differ (a debug build, say).
    code_size: isize,
    str_size: isize,
    str_length: usize,
    str_state: usize,
    /// `sizeof(PyASCIIObject)`: where a compact ASCII string's characters start.
    ascii_size: usize,
    /// `PyCompactUnicodeObject`'s `utf8_length` and `utf8`.
    utf8_length: usize,
    utf8: usize,
}

/// Bits of a str's `state` (the same in 3.9–3.13).
const STATE_COMPACT: u32 = 0x20;
const STATE_ASCII: u32 = 0x40;
/// `ob_type` in every object header of a default (not free-threaded, not trace-refs) build.
const OB_TYPE: usize = 8;
/// `ob_size` of a variable-size object (a code object's bytecode length in code units, 3.11+).
const OB_SIZE: usize = 16;

/// The layouts of 3.9–3.12, from their headers (probed with `offsetof` for 64-bit builds).
fn known_layout(minor: u32) -> Option<Layout> {
    let old_str = |chain, co_filename, co_name, code_size| Layout {
        chain,
        co_filename,
        co_name,
        code_size,
        str_size: 80,
        str_length: 16,
        str_state: 32,
        ascii_size: 48,
        utf8_length: 48,
        utf8: 56,
    };
    match minor {
        9 | 10 => Some(old_str(
            Chain::Objects {
                tstate_frame: 24,
                back: 24,
                code: 32,
                lasti: if minor == 9 { 104 } else { 96 },
                // 3.9 counts bytes; 3.10 counts code units of 2 bytes.
                lasti_bytes: if minor == 9 { 1 } else { 2 },
            },
            104,
            112,
            176,
        )),
        11 => Some(old_str(
            Chain::Interpreter {
                cframe: Some(56),
                current_frame: 8,
                previous: 48,
                code: 32,
                instr: 56,
                owner: 69,
                shim_owner: None,
                code_start: 184,
            },
            112,
            120,
            184,
        )),
        12 => Some(Layout {
            chain: Chain::Interpreter {
                cframe: Some(56),
                current_frame: 0,
                previous: 8,
                code: 0,
                instr: 56,
                owner: 70,
                shim_owner: Some(3),
                code_start: 192,
            },
            co_filename: 112,
            co_name: 120,
            code_size: 192,
            str_size: 64,
            str_length: 16,
            str_state: 32,
            ascii_size: 40,
            utf8_length: 40,
            utf8: 48,
        }),
        _ => None,
    }
}

/// The C functions and objects used.
struct Api {
    /// `Py_IsInitialized`: before start-up and after finalisation the thread-state key is not
    /// valid (reading it could return another library's thread-specific value).
    initialized: <rows::IsInitialized as Row>::Fn,
    /// `Py_IsFinalizing` (3.13) or `_Py_IsFinalizing` (3.9-3.12), where found: once finalisation
    /// has begun, other threads' thread states and code objects are being freed, so no frame is
    /// read (a daemon thread allocating at interpreter exit).
    finalizing: Option<<rows::IsFinalizing as Row>::Fn>,
    this_thread_state: <rows::ThisThreadState as Row>::Fn,
    addr2line: <rows::Addr2Line as Row>::Fn,
    code_type: usize,
    str_type: usize,
}

struct Reader {
    api: Api,
    layout: Layout,
}

/// Found once: `None` when the process has no CPython or one whose layout is not known.
static READER: OnceLock<Option<Reader>> = OnceLock::new();

/// Test hook: `GPUMEMHOOK_TEST_PYTHON_VERSION=3.99` makes the check see that version instead of the
/// interpreter's (tests of an unknown interpreter).
const TEST_VERSION: &CStr = c"GPUMEMHOOK_TEST_PYTHON_VERSION";

fn symbol(name: &CStr) -> usize {
    // SAFETY: RTLD_DEFAULT lookup of a NUL-terminated name.
    unsafe { real_dlsym(libc::RTLD_DEFAULT, name.as_ptr()) as usize }
}

/// CPython's function of row `R`, found in the process under the row's exact name, cast to the
/// row's C signature; `None` when the process has none.
fn function<R: Row<Library = CpythonFn>>() -> Option<R::Fn> {
    let address = symbol(NAME_ARRAY[R::ID as usize]);
    // SAFETY: the address was found under `R`'s exact name, whose C signature is `R::Fn`.
    (address != 0).then(|| unsafe { R::cast(address) })
}

/// Reads a `T` at `address`, `None` for a null address.
///
/// # Safety
/// `address`, when not null, must point to readable memory holding a `T` (an object of the running
/// interpreter at an offset of the checked layout).
unsafe fn read<T: Copy>(address: usize) -> Option<T> {
    (address != 0).then(|| std::ptr::read_unaligned(address as *const T))
}

/// The interpreter's version as (major, minor, hex), from `Py_Version` (3.11+) or `Py_GetVersion()`.
fn interpreter_version() -> Option<(u32, u32, u64)> {
    // SAFETY: getenv of a NUL-terminated name; the value is copied at once (start-up, tests only).
    let forced = unsafe { libc::getenv(TEST_VERSION.as_ptr()) };
    let text = if !forced.is_null() {
        // SAFETY: a NUL-terminated string from the environment.
        unsafe { CStr::from_ptr(forced) }
            .to_string_lossy()
            .into_owned()
    } else {
        let hex = symbol(c"Py_Version");
        if hex != 0 {
            // SAFETY: `Py_Version` is CPython's `const unsigned long` (64 bits on the LP64 targets
            // whose layouts are known), set at build time.
            let v = unsafe { read::<u64>(hex) }?;
            return Some(((v >> 24) as u32 & 0xff, (v >> 16) as u32 & 0xff, v));
        }
        let get = function::<rows::GetVersion>()?;
        // SAFETY: `Py_GetVersion` formats constants into a static buffer, callable before
        // initialisation and without the GIL; it returns a NUL-terminated static string.
        unsafe { CStr::from_ptr(get()) }
            .to_string_lossy()
            .into_owned()
    };
    let mut parts = text.split(|c: char| !c.is_ascii_digit());
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((
        major,
        minor,
        (u64::from(major) << 24) | (u64::from(minor) << 16),
    ))
}

/// 3.13's layout, from the debug offsets CPython keeps at the start of `_PyRuntime`.
fn debug_offsets_layout(version_hex: u64) -> Result<Layout, String> {
    let runtime = symbol(c"_PyRuntime");
    if runtime == 0 {
        return Err("it exports no _PyRuntime".into());
    }
    // SAFETY: `_PyRuntime` starts with `_Py_DebugOffsets`, statically initialised: its cookie,
    // version and the 64-bit offsets read below (3.13's field order), valid before start-up too.
    let word = |index: usize| unsafe { read::<u64>(runtime + 8 * index) }.unwrap_or(u64::MAX);
    // SAFETY: the first 8 bytes of `_PyRuntime` (the cookie).
    let cookie = unsafe { read::<[u8; 8]>(runtime) };
    if cookie != Some(*b"xdebugpy") {
        return Err("its _PyRuntime has no debug offsets cookie".into());
    }
    if word(1) != version_hex {
        return Err(format!(
            "its debug offsets are for version {:#x}, not {version_hex:#x}",
            word(1)
        ));
    }
    if word(2) != 0 {
        return Err("it is a free-threaded build".into());
    }
    let at = |index: usize| usize::try_from(word(index)).ok().filter(|&o| o < 4096);
    // Indices of the 64-bit words of 3.13's `_Py_DebugOffsets`: cookie 0, version 1,
    // free_threaded 2, runtime_state 3..6, interpreter_state 6..19, thread_state 19..28,
    // interpreter_frame 28..34, code_object 34..44, pyobject 44..46, type_object 46..50, tuple
    // 50..53, list 53..56, dict 56..59, float 59..61, long 61..64, bytes 64..67, unicode 67..71.
    let missing = || String::from("its debug offsets are out of range");
    let ob_type = at(45).ok_or_else(missing)?;
    if ob_type != OB_TYPE {
        return Err(format!("its objects keep their type at {ob_type}"));
    }
    let ascii_size = at(70).ok_or_else(missing)?;
    Ok(Layout {
        chain: Chain::Interpreter {
            cframe: None,
            current_frame: at(23).ok_or_else(missing)?,
            previous: at(29).ok_or_else(missing)?,
            code: at(30).ok_or_else(missing)?,
            instr: at(31).ok_or_else(missing)?,
            owner: at(33).ok_or_else(missing)?,
            shim_owner: Some(3),
            code_start: at(43).ok_or_else(missing)?,
        },
        co_filename: at(35).ok_or_else(missing)?,
        co_name: at(36).ok_or_else(missing)?,
        // 3.11+ gives code objects a basic size up to their bytecode.
        code_size: at(43).ok_or_else(missing)? as isize,
        str_size: 0,
        str_length: at(69).ok_or_else(missing)?,
        str_state: at(68).ok_or_else(missing)?,
        ascii_size,
        // `PyCompactUnicodeObject` is `PyASCIIObject` then `utf8_length` and `utf8`.
        utf8_length: ascii_size,
        utf8: ascii_size + 8,
    })
}

/// Finds CPython in the process and checks its layout. `Err` says why sites cannot be read;
/// `Ok(None)`: no CPython here.
fn find() -> Result<Option<Reader>, String> {
    let code_type = symbol(c"PyCode_Type");
    let str_type = symbol(c"PyUnicode_Type");
    let (Some(initialized), Some(this_thread_state), Some(addr2line)) = (
        function::<rows::IsInitialized>(),
        function::<rows::ThisThreadState>(),
        function::<rows::Addr2Line>(),
    ) else {
        return Ok(None);
    };
    if code_type == 0 || str_type == 0 {
        return Ok(None);
    }
    let finalizing =
        function::<rows::IsFinalizing>().or_else(function::<rows::IsFinalizingPrivate>);
    let (major, minor, hex) =
        interpreter_version().ok_or_else(|| String::from("its version cannot be read"))?;
    let layout = match (major, minor) {
        (3, 9..=12) => known_layout(minor).ok_or_else(String::new)?,
        (3, 13) => debug_offsets_layout(hex)?,
        _ => {
            return Err(format!(
                "version {major}.{minor} is not one whose frames it knows (3.9 to 3.13)"
            ))
        }
    };
    // SAFETY: `tp_basicsize` of a static type object: after `PyObject_VAR_HEAD` (24 bytes) and
    // `tp_name` in every version.
    let basic_size = |t: usize| unsafe { read::<isize>(t + 32) }.unwrap_or(-1);
    if basic_size(code_type) != layout.code_size
        || (layout.str_size != 0 && basic_size(str_type) != layout.str_size)
    {
        return Err(format!(
            "its code or str objects are not laid out as in {major}.{minor} (a debug build?)"
        ));
    }
    let api = Api {
        initialized,
        finalizing,
        this_thread_state,
        addr2line,
        code_type,
        str_type,
    };
    Ok(Some(Reader { api, layout }))
}

fn reader() -> Option<&'static Reader> {
    READER
        .get_or_init(|| match find() {
            Ok(found) => found,
            Err(why) => {
                crate::diag::warn(&format!(
                    "GPUMEMHOOK_STACKS: this Python cannot be read without its lock ({why}); no \
                     call sites will be recorded"
                ));
                None
            }
        })
        .as_ref()
}

/// Whether this process has a CPython whose frames can be read (found and checked once; an unknown
/// version is said once on stderr).
pub fn available() -> bool {
    reader().is_some()
}

/// Up to `out.len()` of this thread's innermost Python frames, innermost first; how many were
/// written. 0 for a thread without Python frames (or a process without a readable CPython).
pub fn frames(out: &mut [RawFrame]) -> usize {
    let Some(r) = reader() else {
        return 0;
    };
    // SAFETY: `Py_IsInitialized` and `(_)Py_IsFinalizing` read one flag each, callable at any
    // time; then the thread state lookup reads this thread's TSS slot only, of a key that start-up
    // created.
    let running =
        || unsafe { (r.api.initialized)() != 0 && r.api.finalizing.is_none_or(|f| f() == 0) };
    if !running() {
        return 0;
    }
    // SAFETY: as above.
    let tstate = unsafe { (r.api.this_thread_state)() } as usize;
    if tstate == 0 {
        return 0;
    }
    // SAFETY: (every read below) the thread state and the frames are this thread's own, alive
    // while it runs inside the CUDA call that led here; each address is checked for null, each code
    // object and str for its exact type before its fields are read, at the offsets of the layout
    // checked at start-up.
    let n = unsafe { walk(r, tstate, out) };
    // Finalisation may have begun during the walk, freeing what it read: keep nothing then.
    if running() {
        n
    } else {
        0
    }
}

/// # Safety
/// `tstate` is this thread's live thread state of the interpreter `r` was checked against.
unsafe fn walk(r: &Reader, tstate: usize, out: &mut [RawFrame]) -> usize {
    let l = &r.layout;
    let mut n = 0;
    match l.chain {
        Chain::Objects {
            tstate_frame,
            back,
            code,
            lasti,
            lasti_bytes,
        } => {
            let mut frame = read::<usize>(tstate + tstate_frame).unwrap_or(0);
            for _ in 0..MAX_WALK {
                if frame == 0 || n == out.len() {
                    break;
                }
                let co = read::<usize>(frame + code).unwrap_or(0);
                let offset = read::<c_int>(frame + lasti).unwrap_or(-1);
                if let Some(f) = found(r, co, offset.saturating_mul(lasti_bytes)) {
                    out[n] = f;
                    n += 1;
                }
                frame = read::<usize>(frame + back).unwrap_or(0);
            }
        }
        Chain::Interpreter {
            cframe,
            current_frame,
            previous,
            code,
            instr,
            owner,
            shim_owner,
            code_start,
        } => {
            let holder = match cframe {
                Some(c) => read::<usize>(tstate + c).unwrap_or(0),
                None => tstate,
            };
            let mut frame = read::<usize>(holder + current_frame).unwrap_or(0);
            for _ in 0..MAX_WALK {
                if frame == 0 || n == out.len() {
                    break;
                }
                let shim = shim_owner.is_some_and(|o| read::<u8>(frame + owner) == Some(o));
                let co = read::<usize>(frame + code).unwrap_or(0);
                if !shim && is_a(co, r.api.code_type) {
                    let start = co + code_start;
                    let at = read::<usize>(frame + instr).unwrap_or(0);
                    // Bytes from the start of the bytecode to the instruction executing, within
                    // the bytecode (`ob_size` code units of 2 bytes): 3.11's line array is
                    // indexed by it unchecked.
                    let units = read::<isize>(co + OB_SIZE).unwrap_or(0);
                    let offset = at
                        .checked_sub(start)
                        .filter(|&b| (b as isize) < units.saturating_mul(2))
                        .and_then(|b| c_int::try_from(b).ok())
                        .unwrap_or(-1);
                    if let Some(f) = found(r, co, offset) {
                        out[n] = f;
                        n += 1;
                    }
                }
                frame = read::<usize>(frame + previous).unwrap_or(0);
            }
        }
    }
    n
}

/// True when `object` is non-null and of exactly type `t`.
///
/// # Safety
/// `object` is null or a live object.
unsafe fn is_a(object: usize, t: usize) -> bool {
    object != 0 && read::<usize>(object + OB_TYPE) == Some(t)
}

/// # Safety
/// `co` is null or a live object; `offset` a byte offset into its bytecode (negative: none).
unsafe fn found(r: &Reader, co: usize, offset: c_int) -> Option<RawFrame> {
    if !is_a(co, r.api.code_type) {
        return None;
    }
    Some(RawFrame {
        code: co,
        offset,
        file: read::<usize>(co + r.layout.co_filename).unwrap_or(0),
        name: read::<usize>(co + r.layout.co_name).unwrap_or(0),
    })
}

/// The line and names of a frame [`frames`] found on this thread, during the same CUDA call (its
/// code object is alive: the frame executing it still is).
pub fn describe(f: &RawFrame) -> Frame {
    let Some(r) = reader() else {
        return Frame {
            file: "?".into(),
            line: 0,
            function: "?".into(),
        };
    };
    // SAFETY: `f` was found by `frames` on this thread, whose frames have not changed since: its
    // code object was checked for its type and is alive, its name objects with it; a negative
    // offset makes `PyCode_Addr2Line` return `co_firstlineno`.
    unsafe {
        Frame {
            file: text(r, f.file),
            line: (r.api.addr2line)(f.code as *mut c_void, f.offset),
            function: text(r, f.name),
        }
    }
}

/// A str's text when it is compact ASCII or has its UTF-8 form cached; `?` otherwise.
///
/// # Safety
/// `s` is null or a live object.
unsafe fn text(r: &Reader, s: usize) -> String {
    let l = &r.layout;
    if !is_a(s, r.api.str_type) {
        return "?".into();
    }
    let state = read::<u32>(s + l.str_state).unwrap_or(0);
    let (data, len) = if state & STATE_COMPACT == 0 {
        return "?".into();
    } else if state & STATE_ASCII != 0 {
        (
            s + l.ascii_size,
            read::<isize>(s + l.str_length).unwrap_or(-1),
        )
    } else {
        (
            read::<usize>(s + l.utf8).unwrap_or(0),
            read::<isize>(s + l.utf8_length).unwrap_or(-1),
        )
    };
    let Ok(len) = usize::try_from(len) else {
        return "?".into();
    };
    if data == 0 {
        return "?".into();
    }
    let bytes = std::slice::from_raw_parts(data as *const u8, len.min(MAX_NAME));
    String::from_utf8_lossy(bytes).into_owned()
}
