"""Checks what scripts/build/wheels built (run by it; stdlib only, plus binutils' readelf and auditwheel).

    wheels.py wheel WHEEL ARCH VERSION   manylinux2014 tag, contents, metadata, and for each
                                              shipped ELF file: machine, newest glibc version needed
                                              (at most 2.17), no strong symbol left without a version,
                                              and the hook's dlsym under glibc's versions
    wheels.py sdist SDIST VERSION        the hook's and the CLI's crates inside, and workspace
                                              members that name only crates that are there

Prints one line per finding; exits 1 on the first failed check."""

from __future__ import annotations

import re
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

GLIBC_MAX = (2, 17)
MACHINES = {"x86_64": "Advanced Micro Devices X86-64", "aarch64": "AArch64"}
FIRST_DLSYM = {"x86_64": "GLIBC_2.2.5", "aarch64": "GLIBC_2.17"}
HOOK, CLI, NATIVE = "gpumemhook/libgpumemhook.so", "gpumemhook/bin/gpumemhook", "gpumemhook/_native.abi3.so"


def fail(message: str) -> None:
    print(f"FAIL: {message}")
    sys.exit(1)


def readelf(*args: str) -> str:
    return subprocess.run(["readelf", "--wide", *args], check=True, capture_output=True, text=True).stdout


def glibc_needed(path: Path) -> list[tuple[int, ...]]:
    """The GLIBC_x.y versions in the file's version needs (what it requires, not what it defines)."""
    text = readelf("--version-info", str(path))
    needs = text.split("Version needs section", 1)[1] if "Version needs section" in text else ""
    return sorted({tuple(int(p) for p in v.split(".")) for v in re.findall(r"Name: GLIBC_([0-9.]+)", needs)})


def check_elf(name: str, path: Path, arch: str) -> None:
    header = readelf("--file-header", str(path))
    machine = re.search(r"Machine:\s+(.*)", header)
    if not machine or machine.group(1).strip() != MACHINES[arch]:
        fail(f"{name}: machine {machine and machine.group(1)!r}, expected {MACHINES[arch]!r}")
    versions = glibc_needed(path)
    if not versions:
        fail(f"{name}: needs no GLIBC version at all (not linked against glibc?)")
    newest = versions[-1]
    newest_text = "GLIBC_" + ".".join(map(str, newest))
    if newest > GLIBC_MAX:
        fail(f"{name}: needs {newest_text}, more than GLIBC_2.17")
    # A strong reference without a version is a function the glibc 2.17 stubs did not have (e.g.
    # gettid, 2.30): the library would link here and fail to load there. The native module's Python
    # C API references are unversioned by nature.
    unversioned = []
    for line in readelf("--dyn-syms", str(path)).splitlines():
        f = line.split()
        if len(f) >= 8 and f[6] == "UND" and f[4] == "GLOBAL" and "@" not in f[7]:
            if name == NATIVE and (f[7].startswith("Py") or f[7].startswith("_Py")):
                continue
            unversioned.append(f[7])
    if unversioned:
        fail(f"{name}: strong references without a symbol version (absent from glibc 2.17?): {unversioned}")
    print(f"  {name}: {arch}, newest glibc symbol version needed: {newest_text}")


def check_wheel(wheel: Path, arch: str, version: str) -> None:
    print(f"{wheel.name}")
    if f"-{version}-cp39-abi3-" not in wheel.name:
        fail(f"{wheel.name}: expected version {version} and tag cp39-abi3")
    if not re.search(rf"manylinux(2014|_2_17)_{arch}", wheel.name):
        fail(f"{wheel.name}: not tagged manylinux2014 / manylinux_2_17 for {arch}")
    with zipfile.ZipFile(wheel) as z, tempfile.TemporaryDirectory() as tmp:
        names = set(z.namelist())
        for required in (HOOK, CLI, NATIVE, "gpumemhook/__init__.py", "gpumemhook/py.typed"):
            if required not in names:
                fail(f"{wheel.name}: {required} missing")
        (meta_name,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        meta = z.read(meta_name).decode()
        for field in (f"Version: {version}", "Requires-Python: >=3.9", "License: MIT OR Apache-2.0"):
            if field not in meta:
                fail(f"{wheel.name}: METADATA lacks {field!r}")
        if "Description-Content-Type: text/markdown" not in meta:
            fail(f"{wheel.name}: METADATA has no README as description")
        for name in (HOOK, CLI, NATIVE):
            check_elf(name, Path(z.extract(name, tmp)), arch)
        hook = Path(tmp) / HOOK
        syms = {line.split()[7] for line in readelf("--dyn-syms", str(hook)).splitlines()
                if len(line.split()) >= 8 and line.split()[6] != "UND"}
        want = {f"dlsym@{FIRST_DLSYM[arch]}", "dlsym@@GLIBC_2.34"}
        if not want <= syms:
            fail(f"{HOOK}: dlsym is not exported as {sorted(want)}")
        print(f"  {HOOK}: exports {' and '.join(sorted(want))}")


def check_sdist(sdist: Path, version: str) -> None:
    print(f"{sdist.name}")
    with tarfile.open(sdist) as t:
        names = {n.split("/", 1)[1] for n in t.getnames() if "/" in n}
        top = t.getnames()[0].split("/")[0]
        for required in ("interceptor/Cargo.toml", "interceptor/build.rs", "interceptor/src/lib.rs",
                         "interceptor/dlsym-x86_64.map", "interceptor/dlsym-aarch64.map",
                         "cli/Cargo.toml", "cli/src/main.rs", "reader/Cargo.toml",
                         "reader/segment/Cargo.toml", "reader/segment/src/lib.rs",
                         "reader/timeline/Cargo.toml", "reader/timeline/src/lib.rs", "python/build.rs",
                         "Cargo.lock", "README.md"):
            if required not in names:
                fail(f"{sdist.name}: {required} missing")
        cargo = t.extractfile(f"{top}/Cargo.toml").read().decode()
        members = re.search(r"members\s*=\s*\[([^\]]*)\]", cargo)
        for m in re.findall(r'"([^"]+)"', members.group(1) if members else ""):
            if f"{m}/Cargo.toml" not in names:
                fail(f"{sdist.name}: workspace member {m} is not in the sdist")
        for m in ("interceptor", "cli", "reader", "reader/segment", "reader/timeline", "python"):
            if f'"{m}"' not in (members.group(1) if members else ""):
                fail(f"{sdist.name}: {m} is not a workspace member")
        pkg = t.extractfile(f"{top}/PKG-INFO").read().decode()
        if f"Version: {version}" not in pkg:
            fail(f"{sdist.name}: PKG-INFO lacks Version: {version}")
    print("  carries the hook's, the CLI's, the reader's, the segment's and the timeline's crates; "
          "workspace members all present")


if __name__ == "__main__":
    if sys.argv[1] == "wheel":
        check_wheel(Path(sys.argv[2]), sys.argv[3], sys.argv[4])
    elif sys.argv[1] == "sdist":
        check_sdist(Path(sys.argv[2]), sys.argv[3])
    else:
        fail(f"unknown check {sys.argv[1]!r}")
