//! Symbol versions: the hook's `dlsym` must be found by a lookup that asks for glibc's symbol version
//! (`dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34")`), as another preloaded library that interposes `dlsym`
//! may make, in either `LD_PRELOAD` order; and its other exports must still take the place of the
//! CUDA libraries' functions.

use gpumemhook_tests::{sim_dir, Run};

/// Device 0: 3 allocations through `dlsym`, 1 through the driver shadow; device 1: 10 through `dlsym`
/// (one freed), 1 through the driver shadow. Every `dl.alloc` looks `cuMemAlloc_v2` up with `dlsym` on
/// the driver's handle, which the second library's `dlsym` answers first when it is preloaded first.
const SCENARIO: &[&str] = &[
    "drv.init",
    "drv.ctx:0",
    "dl.alloc:a0:1000",
    "dl.alloc:a1:2000",
    "drv.alloc:a2:3000",
    "dl.alloc:a3:4000",
    "drv.ctx:1",
    "dl.alloc:b0:100",
    "dl.alloc:b1:200",
    "dl.alloc:b2:300",
    "dl.alloc:b3:400",
    "dl.alloc:b4:500",
    "dl.alloc:b5:600",
    "dl.alloc:b6:700",
    "dl.alloc:b7:800",
    "dl.alloc:b8:900",
    "dl.alloc:b9:1000",
    "drv.alloc:b10:5000",
    "drv.free:b0",
    "print.used:0",
    "print.used:1",
];

fn versioned_chain() -> std::path::PathBuf {
    sim_dir().join("libversionedchain.so")
}

/// Runs [`SCENARIO`] and checks the hook's counts on both devices against the scenario and against
/// the stand-in driver's own count of bytes in use.
fn check_counts(run: Run, chain_lookups: &str) {
    let ran = run.run().ok();
    let r = ran.report();
    let (d0, d1) = (r.device(0), r.device(1));
    assert_eq!(
        (d0.used, d0.peak, d0.allocs, d0.frees),
        (10_000, 10_000, 4, 0),
        "device 0"
    );
    assert_eq!(
        (d1.used, d1.peak, d1.allocs, d1.frees),
        (10_400, 10_500, 11, 1),
        "device 1"
    );
    // The driver's truth, printed by the scenario (print.used), agrees with the hook.
    let out = ran.stdout();
    assert!(out.contains("used dev=0 bytes=10000"), "{out}");
    assert!(out.contains("used dev=1 bytes=10400"), "{out}");
    let err = ran.stderr();
    assert!(
        err.contains(&format!("versionedchain lookups={chain_lookups}")),
        "{err}"
    );
}

#[test]
fn versioned_dlsym_chain_preloaded_before_the_hook() {
    // The chain's dlsym answers the program's lookups and forwards each one to the next dlsym that
    // carries version GLIBC_2.34: that must be the hook's, or the driver's bare functions come back.
    // 13 lookups: 13 dl.alloc.
    check_counts(
        Run::sim("simrun", SCENARIO).preload_before(versioned_chain()),
        "13",
    );
}

#[test]
fn versioned_dlsym_chain_preloaded_after_the_hook() {
    // The hook's dlsym comes first and answers everything; the chain (after it, and unversioned) is
    // never reached by the program's lookups.
    check_counts(
        Run::sim("simrun", SCENARIO).preload_after(versioned_chain()),
        "0",
    );
}

/// The one version (workspace `Cargo.toml`, `[workspace.package] version`), as this test crate got it.
const VERSION: &str = env!("CARGO_PKG_VERSION");

#[test]
fn the_library_and_the_cli_report_the_workspace_version() {
    // The preloaded library's gpumemhook_version(), looked up in the running process.
    let script = r#"
import ctypes
f = ctypes.CDLL(None).gpumemhook_version
f.restype = ctypes.c_char_p
print("hook-version=" + f().decode())
"#;
    let ran = Run::program(gpumemhook_tests::python(), "python-version")
        .arg("-c")
        .arg(script)
        .run()
        .ok();
    assert!(
        ran.stdout().contains(&format!("hook-version={VERSION}\n")),
        "{}",
        ran.stdout()
    );

    let dir = gpumemhook_tests::scratch("cli-version");
    let out = gpumemhook_tests::cli(&dir, &["--version"])
        .output()
        .expect("gpumemhook --version runs");
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(text.trim(), format!("gpumemhook {VERSION}"), "{text}");
}

/// The exported symbols, as the dynamic linker sees them: `dlsym` twice, under glibc's two versions
/// (the newest the default), and everything else unversioned. Needs binutils' `readelf`; says so
/// and checks nothing more when it is missing.
#[test]
fn dlsym_carries_glibc_versions_and_nothing_else_does() {
    let lib = gpumemhook_tests::hook_lib();
    let out = match std::process::Command::new("readelf")
        .args(["--dyn-syms", "--wide"])
        .arg(lib)
        .output()
    {
        Ok(out) if out.status.success() => out,
        other => {
            println!("skipped: readelf (binutils) cannot run here: {other:?}");
            return;
        }
    };
    let text = String::from_utf8_lossy(&out.stdout);
    let defined: Vec<&str> = text
        .lines()
        .filter(|l| l.contains(" GLOBAL ") && !l.contains(" UND "))
        .filter_map(|l| l.split_whitespace().nth(7))
        .collect();
    // glibc's first version of dlsym on the library's own architecture (ELF e_machine, which is
    // the test's architecture except under scripts/check/aarch64).
    let elf = std::fs::read(lib).expect("the hook library");
    let first = match u16::from_le_bytes([elf[18], elf[19]]) {
        62 => "GLIBC_2.2.5", // EM_X86_64
        183 => "GLIBC_2.17", // EM_AARCH64
        other => panic!("the hook is built for ELF machine {other}, which has no trampoline"),
    };
    let mut dlsyms: Vec<&str> = defined
        .iter()
        .copied()
        .filter(|s| s.starts_with("dlsym@"))
        .collect();
    dlsyms.sort();
    assert_eq!(
        dlsyms,
        ["dlsym@@GLIBC_2.34".to_string(), format!("dlsym@{first}")],
        "{text}"
    );
    for name in ["cudaMalloc", "cuMemAlloc_v2", "gpumemhook_version"] {
        assert!(defined.contains(&name), "{name} unversioned in:\n{text}");
    }
    assert!(
        !defined
            .iter()
            .any(|s| s.contains('@') && !s.starts_with("dlsym@")),
        "{text}"
    );
}
