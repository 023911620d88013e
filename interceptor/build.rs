//! Build script of the hook: exports `dlsym` under glibc's symbol versions.
//!
//! A lookup by version (`dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34")`, made by other preloaded
//! libraries that interpose `dlsym`) skips every `dlsym` that does not carry that version, so the
//! hook's must carry glibc's: `src/dlsym.rs` binds its trampoline to `dlsym@<first version>` and
//! `dlsym@@GLIBC_2.34` with `.symver`, and this script hands the linker the version script that
//! defines those version nodes (`dlsym-<arch>.map`) and turns on `cfg(gpumemhook_dlsym_versions)`.
//!
//! rustc passes a version script of its own (an anonymous one listing the exports); lld (rustc's
//! default linker on x86-64 since 1.90, and zig's) merges the two, GNU ld refuses to ("anonymous
//! version tag cannot be combined with other version tags"). So the script first links a tiny
//! probe library with the same rustc, target, linker and flags; if that fails, the hook is built with
//! an unversioned `dlsym` (as before: every unversioned lookup still finds it) and a warning says so.
//! `GPUMEMHOOK_DLSYM_VERSIONS=1` (or `0`) skips the probe and forces the choice.

use std::env;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

const CFG: &str = "gpumemhook_dlsym_versions";
/// Set when the compiler keeps frame pointers, so the hook may read its caller's return address
/// from its frame record (`src/modules.rs`).
const FRAME_POINTERS_CFG: &str = "gpumemhook_frame_pointers";

/// Turns on [`FRAME_POINTERS_CFG`] when `-C force-frame-pointers=yes` reaches the compiler (from
/// `.cargo/config.toml` or the caller's flags); warns otherwise.
fn frame_pointers() {
    println!("cargo:rustc-check-cfg=cfg({FRAME_POINTERS_CFG})");
    let flags = env::var("CARGO_ENCODED_RUSTFLAGS").unwrap_or_default();
    let flags: Vec<&str> = flags.split('\x1f').collect();
    let forced = flags.iter().enumerate().any(|(i, f)| {
        let value = f
            .strip_prefix("-Cforce-frame-pointers=")
            .or_else(|| f.strip_prefix("force-frame-pointers="))
            .filter(|_| f.starts_with("-C") || i > 0 && flags[i - 1] == "-C");
        matches!(value, Some("yes" | "y" | "on" | "true"))
    });
    if forced {
        println!("cargo:rustc-cfg={FRAME_POINTERS_CFG}");
    } else {
        println!(
            "cargo:warning=gpumemhook: built without -C force-frame-pointers=yes (RUSTFLAGS replaces \
             .cargo/config.toml's flags): every allocation is charged to module `other`"
        );
    }
}

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    frame_pointers();
    println!("cargo:rerun-if-env-changed=GPUMEMHOOK_DLSYM_VERSIONS");
    println!("cargo:rustc-check-cfg=cfg({CFG})");
    let arch = env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default();
    let os = env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    let env_ = env::var("CARGO_CFG_TARGET_ENV").unwrap_or_default();
    // glibc's versions of dlsym exist only for these (Linux, glibc).
    if os != "linux" || env_ != "gnu" || !matches!(arch.as_str(), "x86_64" | "aarch64") {
        return;
    }
    let manifest_dir = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default());
    let map = manifest_dir.join(format!("dlsym-{arch}.map"));
    println!("cargo:rerun-if-changed={}", map.display());

    let versioned = match env::var("GPUMEMHOOK_DLSYM_VERSIONS").as_deref() {
        Ok("1") => true,
        Ok("0") => false,
        _ => match probe(&map) {
            Probe::Links => true,
            Probe::Refused(why) => {
                println!(
                    "cargo:warning=gpumemhook: this linker cannot combine rustc's version script with \
                     {} ({why}); dlsym is exported without symbol versions, so a dlvsym(RTLD_NEXT, \
                     \"dlsym\", \"GLIBC_2.34\") made by another preloaded library will skip the hook. \
                     Link with lld (e.g. -C link-arg=-fuse-ld=lld) to fix.",
                    map.display()
                );
                false
            }
            // No probe possible (e.g. `-Zbuild-std`, where the target has no `core` in the sysroot):
            // the build links with lld in every setup the project's scripts use.
            Probe::Unknown => true,
        },
    };
    if versioned {
        println!("cargo:rustc-cfg={CFG}");
        // Names the version definitions' base entry (otherwise the build path) and the library.
        println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libgpumemhook.so");
        println!(
            "cargo:rustc-cdylib-link-arg=-Wl,--version-script={}",
            map.display()
        );
    }
}

enum Probe {
    Links,
    Refused(String),
    Unknown,
}

/// Links a `no_std` cdylib with a `.symver`ed export and `map`, the way the hook will be linked.
fn probe(map: &Path) -> Probe {
    let Some(out_dir) = env::var_os("OUT_DIR").map(PathBuf::from) else {
        return Probe::Unknown;
    };
    let src = out_dir.join("dlsym_versions_probe.rs");
    let version = if map.to_string_lossy().contains("aarch64") {
        "GLIBC_2.17"
    } else {
        "GLIBC_2.2.5"
    };
    let code = format!(
        "#![no_std]\n\
         #[panic_handler]\n\
         fn panic(_: &core::panic::PanicInfo) -> ! {{ loop {{}} }}\n\
         #[no_mangle]\n\
         pub extern \"C\" fn gpumemhook_probe() {{}}\n\
         core::arch::global_asm!(\n\
             \".symver gpumemhook_probe, gpumemhook_probed@{version}\",\n\
             \".symver gpumemhook_probe, gpumemhook_probed@@GLIBC_2.34\",\n\
         );\n"
    );
    if fs::write(&src, code).is_err() {
        return Probe::Unknown;
    }
    let rustc = env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let mut command = Command::new(rustc);
    command
        .arg(&src)
        .args([
            "--crate-type",
            "cdylib",
            "--crate-name",
            "dlsym_versions_probe",
        ])
        .args([
            "--edition",
            "2021",
            "-C",
            "panic=abort",
            "-C",
            "codegen-units=1",
        ])
        .arg("--out-dir")
        .arg(&out_dir)
        .arg(format!("-Clink-arg=-Wl,--version-script={}", map.display()));
    if let Ok(target) = env::var("TARGET") {
        command.args(["--target", &target]);
    }
    if let Some(linker) = env::var_os("RUSTC_LINKER") {
        command
            .arg("-C")
            .arg(format!("linker={}", linker.to_string_lossy()));
    }
    if let Ok(flags) = env::var("CARGO_ENCODED_RUSTFLAGS") {
        command.args(flags.split('\x1f').filter(|f| !f.is_empty()));
    }
    let output = match command.output() {
        Ok(output) => output,
        Err(_) => return Probe::Unknown,
    };
    if output.status.success() {
        return Probe::Links;
    }
    let stderr = String::from_utf8_lossy(&output.stderr);
    if stderr.contains("can't find crate for `core`") || stderr.contains("E0463") {
        return Probe::Unknown;
    }
    // GNU ld: "anonymous version tag cannot be combined with other version tags".
    let why = stderr
        .lines()
        .find(|l| l.contains("version tag") || l.contains("version node"))
        .or_else(|| stderr.lines().rfind(|l| !l.trim().is_empty()))
        .unwrap_or("the probe failed to link")
        .trim()
        .trim_start_matches("= note:")
        .trim()
        .to_string();
    Probe::Refused(why)
}
