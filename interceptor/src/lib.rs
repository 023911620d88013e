//! `libgpumemhook.so`: an `LD_PRELOAD` library that counts every CUDA device allocation of the
//! process exactly once, per device, into a shared-memory segment that readers map.
//!
//! Four doors lead to the counting (see `docs/architecture.md`): runtime shadows, a transparent `dlsym`,
//! `cuGetProcAddress`/`_v2` wrappers, and driver shadows. All of them end in the bodies of
//! the policy ([`driver_hooks`], [`runtime_hooks`]), which count at the driver (where the device is known) and fall back to counting at the
//! runtime when the runtime reached the driver out of our sight.
//!
//! Modules (they run one way, in layers declared once in `docs/architecture.md`, "Layers of the
//! hook", and enforced by `tests/integration/modules.rs`): [`ffi`] (raw CUDA types), [`diag`] (messages that
//! cannot fail), [`config`], [`spin`] (waiting for a spin lock), [`local`] (the thread-local
//! words), [`table`] (every entry point, one
//! row each); [`resolve`] (glibc's `dlsym`, a library's real functions), [`driver`], [`runtime`],
//! [`nvml`], [`cpython`] (the calling thread's Python frames, read without the GIL); [`guard`] (the thread-local runtime frame), [`modules`] (which shared object called:
//! return address → module of the breakdown), [`stacks`] (Python call sites), [`maps`] (the
//! ledger's tables and sharded maps), [`owned`] (one table of live pointers per thread), [`ledger`] (live
//! allocations), [`trace`] (the timeline), [`emulation`] (charging an emulated card's overhead),
//! [`group`] (membership of a group: one count, peak, ceiling and card for several processes),
//! [`report`] (exit and out-of-memory reports), [`state`] (start-up, fork, exit), [`account`] (what
//! counting writes); [`skeletons`] (the shapes of an allocation, a free and a view),
//! [`streams`] (a stream's device), [`loads`] (module loads), [`driver_hooks`] and
//! [`runtime_hooks`] (what each driver and runtime entry point does), [`nvml_hooks`] (NVML's
//! figures under the same view); [`exports`] (every exported symbol, the wrappers, the substitution), [`dlsym`]
//! (the `dlsym` trampoline).

// The hook lives inside other people's processes: no panic may be reachable from its code (with
// `panic = "abort"` one would kill the job), and every `unsafe` block says why it is sound.
#![cfg_attr(
    not(test),
    deny(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::panic,
        clippy::unreachable,
        clippy::todo,
        clippy::unimplemented
    )
)]
#![deny(clippy::undocumented_unsafe_blocks)]

mod account;
mod config;
mod cpython;
mod diag;
mod dlsym;
mod driver;
mod driver_hooks;
mod emulation;
mod exports;
mod ffi;
mod group;
mod guard;
mod ledger;
mod loads;
mod local;
mod maps;
mod modules;
mod nvml;
mod nvml_hooks;
mod owned;
mod report;
mod resolve;
mod runtime;
mod runtime_hooks;
mod skeletons;
mod spin;
mod stacks;
mod state;
mod streams;
mod table;
mod trace;

/// Runs start-up when the library is loaded.
#[ctor::ctor]
fn load() {
    state::init();
}
