//! The hook's own in-process interface: one row per `gpumemhook_*` function the hook exports, the
//! one place its C signatures are written. The hook checks its exports against these rows at
//! compile time (each row's function must exist under the row's name, of the row's type:
//! `interceptor/src/exports.rs`); a reader in the hooked process looks a function up by its row
//! ([`lookup_export`]), so a name and its signature cannot drift apart.
//!
//! Shaped like the hook's entry-point tables (`interceptor/src/table.rs`): [`hook_exports`] hands its
//! rows to a macro its caller names, `Id = exported_name: fn(C types) -> C type;`.

use std::ffi::CStr;

/// The hook's exports, as rows handed to the macro `$then` (see the module docs).
#[macro_export]
macro_rules! hook_exports {
    ($then:ident) => {
        $then! {
            // This process's segment; null while the hook is not counting.
            Segment = gpumemhook_segment: fn() -> *const $crate::Segment;
            // The segment file's path; null when the segment is private memory.
            SegmentPath = gpumemhook_segment_path: fn() -> *const ::std::ffi::c_char;
            // Lets the next out-of-memory write a report again; nonzero when one was asked for.
            ArmOomReport = gpumemhook_arm_oom_report: fn() -> ::std::ffi::c_int;
            // The exit report's JSON into (buf, cap) when it fits; its length either way, 0 while
            // not counting.
            ReportJson = gpumemhook_report_json: fn(*mut u8, usize) -> usize;
            // Marks a scope's span (open nonzero: opened) on the timeline.
            TraceScope = gpumemhook_trace_scope: fn(::std::ffi::c_int, u32, *const ::std::ffi::c_char) -> ();
            // The hook's version, a static NUL-terminated string.
            Version = gpumemhook_version: fn() -> *const ::std::ffi::c_char;
        }
    };
}

/// One of the hook's exports as a type (`rows::Segment`, ...): its name and its C signature.
pub trait Export {
    /// The exported name.
    const NAME: &'static CStr;
    /// The C signature, as a function pointer.
    type Fn: Copy;
}

/// Expands the rows into one type per row.
macro_rules! export_rows {
    ($( $id:ident = $sym:ident : fn( $($ty:ty),* ) -> $ret:ty; )*) => {
        $(
            #[doc = concat!("The hook's `", stringify!($sym), "`.")]
            pub struct $id;
            impl $crate::exports::Export for $id {
                const NAME: &'static ::std::ffi::CStr =
                    match ::std::ffi::CStr::from_bytes_with_nul(concat!(stringify!($sym), "\0").as_bytes()) {
                        Ok(name) => name,
                        Err(_) => panic!("an export's name has no NUL inside"),
                    };
                type Fn = unsafe extern "C" fn($($ty),*) -> $ret;
            }
        )*
    };
}

/// One type per export, each an [`Export`].
pub mod export_rows {
    hook_exports!(export_rows);
}

/// The hook's export `E` in this process, `None` when the hook is not loaded here.
pub fn lookup_export<E: Export>() -> Option<E::Fn> {
    let this = libloading::os::unix::Library::this();
    // SAFETY: a symbol of this name is the hook's export, whose C signature is `E::Fn` (checked
    // against this row when the hook is compiled).
    unsafe { this.get::<E::Fn>(E::NAME.to_bytes_with_nul()) }
        .ok()
        .map(|f| *f)
}
