//! The transparent `dlsym`.
//!
//! glibc decides what `RTLD_NEXT` means from its caller's return address. If our `dlsym` called the
//! real one for such a lookup, glibc would take *us* for the caller, and another preloaded library's
//! `dlsym(RTLD_NEXT, ...)` could skip us or get its own function back (infinite recursion). So
//! `RTLD_NEXT` lookups leave through a tail jump (a naked trampoline): glibc sees the true caller.
//! Every other lookup goes to the `$lookup` function the doors name (`crate::exports`'s
//! `dlsym_lookup`, which hands out our wrapper where the result is a driver function we wrap). The
//! trampoline exists for x86-64 and AArch64. This module defines it (the macro
//! [`exported_dlsym`]); `crate::exports`, the one list of exported symbols, instantiates it.
//!
//! Symbol versions: `dlsym` is exported under glibc's versions of it (x86-64: `GLIBC_2.2.5` and
//! `GLIBC_2.34`; AArch64: `GLIBC_2.17` and `GLIBC_2.34`; the default is the newest), so that
//! another preloaded library that forwards with `dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34")` reaches
//! us rather than glibc; `build.rs` explains how, and when the linker cannot do it.
//!
//! glibc's own `dlsym`, which the trampoline jumps to and the resolution layer calls, is found in
//! [`crate::resolve`] (below the doors).

/// Defines the exported `dlsym` trampoline, named `$name`, with the extra assembler lines `$symver`
/// (the `.symver` bindings) placed before its code. With `cfg(gpumemhook_dlsym_versions)` (set by
/// build.rs when the linker takes the version script) the function is `gpumemhook_dlsym`, exported
/// as `dlsym@<glibc's first version>` and `dlsym@@GLIBC_2.34` (the default, which unversioned
/// references bind to): a lookup by version (`dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34")`) finds it.
/// Without it the function is plain `dlsym`, which versioned lookups skip.
///
/// The `.symver` lines must sit in the same object as the definition, hence inside the function's
/// own assembly rather than in a `global_asm!` of another codegen unit.
macro_rules! exported_dlsym {
    ($name:literal, [$($symver:literal),*], $lookup:path) => {
        /// The exported `dlsym`: `RTLD_NEXT` (-1) jumps to glibc with the caller's return address and
        /// stack untouched (glibc must see the true caller); anything else goes to `$lookup`.
        ///
        /// # Safety
        /// glibc's `dlsym` contract: a valid handle (or `RTLD_DEFAULT`/`RTLD_NEXT`) and a
        /// NUL-terminated name.
        #[cfg(target_arch = "x86_64")]
        #[unsafe(naked)]
        #[export_name = $name]
        pub unsafe extern "C" fn exported_dlsym(
            handle: *mut c_void,
            symbol: *const c_char,
        ) -> *mut c_void {
            core::arch::naked_asm!(
                $($symver,)*
                "cmp rdi, -1",
                "jne {lookup}",
                "mov rax, qword ptr [rip + {real}]",
                "test rax, rax",
                "jz 2f",
                "jmp rax",
                // First use before our constructor ran: resolve glibc's dlsym, keeping the arguments
                // and a 16-byte aligned stack across the call, then jump as above.
                "2:",
                "push rdi",
                "push rsi",
                "sub rsp, 8",
                "call {resolve}",
                "add rsp, 8",
                "pop rsi",
                "pop rdi",
                "jmp rax",
                lookup = sym $lookup,
                real = sym $crate::resolve::GPUMEMHOOK_REAL_DLSYM,
                resolve = sym $crate::resolve::resolve_real_dlsym,
            )
        }

        /// The exported `dlsym` (AArch64): as on x86-64, `RTLD_NEXT` (-1) leaves by `br` with the
        /// caller's x30 (link register), frame pointer and stack as they came in; anything else goes
        /// to `$lookup` by a plain tail branch. x16/x17 (IP0/IP1) are free to clobber at
        /// a call boundary.
        ///
        /// # Safety
        /// As for the x86-64 version.
        #[cfg(target_arch = "aarch64")]
        #[unsafe(naked)]
        #[export_name = $name]
        pub unsafe extern "C" fn exported_dlsym(
            handle: *mut c_void,
            symbol: *const c_char,
        ) -> *mut c_void {
            core::arch::naked_asm!(
                $($symver,)*
                "cmn x0, #1",
                "b.eq 1f",
                "b {lookup}",
                "1:",
                "adrp x16, {real}",
                "ldr x16, [x16, :lo12:{real}]",
                "cbz x16, 2f",
                "br x16",
                // First use before our constructor ran: resolve glibc's dlsym in a frame of our own
                // (saving x29/x30 and the two arguments), restore everything, then branch as above.
                "2:",
                "stp x29, x30, [sp, #-32]!",
                "mov x29, sp",
                "stp x0, x1, [sp, #16]",
                "bl {resolve}",
                "mov x16, x0",
                "ldp x0, x1, [sp, #16]",
                "ldp x29, x30, [sp], #32",
                "br x16",
                lookup = sym $lookup,
                real = sym $crate::resolve::GPUMEMHOOK_REAL_DLSYM,
                resolve = sym $crate::resolve::resolve_real_dlsym,
            )
        }
    };
}

pub(crate) use exported_dlsym;
