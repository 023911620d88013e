#!/usr/bin/env bash
# selfcheck.sh: checks the simulated CUDA stack by itself (no hook involved). Builds it into a temporary
# directory with scripts/build/sim, then runs scenarios through simrun, simrun_rtonly, Python ctypes
# and libnextprobe.so, asserting on their output and exit status. Prints one line per check; exits
# non-zero on the first failure.
#
#   tests/sim/selfcheck.sh            (CC=clang tests/sim/selfcheck.sh to try another compiler)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
O="$work/sim"
"$here/../../scripts/build/sim" "$O"

# Run from an unrelated directory, with no library path: everything must be found through $ORIGIN.
cd "$work"
unset LD_LIBRARY_PATH LD_PRELOAD FAKECUDA_DEVICES FAKECUDA_MEM_BYTES FAKECUDART_HIDDEN

n=0
ok() { n=$((n + 1)); printf 'ok %2d  %s\n' "$n" "$1"; }
fail() {
    printf 'FAIL    %s\n' "$1" >&2
    [[ -f "$work/out" ]] && { echo "--- stdout" >&2; cat "$work/out" >&2; }
    [[ -f "$work/err" ]] && { echo "--- stderr" >&2; cat "$work/err" >&2; }
    exit 1
}

# expect DESC RC EXPECTED_STDOUT CMD...: CMD exits with RC and prints exactly EXPECTED_STDOUT.
expect() {
    local desc="$1" rc="$2" want="$3" got=0
    shift 3
    "$@" >"$work/out" 2>"$work/err" || got=$?
    [[ "$got" == "$rc" ]] || fail "$desc: exit $got, expected $rc"
    [[ "$(cat "$work/out")" == "$want" ]] || fail "$desc: stdout differs from: $want"
    ok "$desc"
}

# stderr_has DESC TEXT: the last command's stderr contains TEXT.
stderr_has() { grep -qF -- "$2" "$work/err" || fail "$1: stderr lacks '$2'"; }

S="$O/simrun"
R="$O/simrun_rtonly"

expect "runtime alloc from any cwd, no LD_LIBRARY_PATH" 0 "used dev=0 bytes=1024" \
    env LD_LIBRARY_PATH= "$S" rt.malloc:a:1024 print.used:0

expect "used bytes on two devices, frees through either API" 0 "used dev=0 bytes=3048
used dev=1 bytes=4096
used dev=0 bytes=2048
used dev=1 bytes=0" \
    "$S" drv.init drv.ctx:0 drv.alloc:a:1000 rt.malloc:b:2048 drv.ctx:1 drv.alloc:c:4096 print.used:0 \
    print.used:1 drv.free:a rt.free:c print.used:0 print.used:1

expect "meminfo and total under FAKECUDA_MEM_BYTES" 0 "rt.meminfo free=1047576 total=1048576
drv.meminfo free=1047576 total=1048576
drv.total dev=1 total=1048576" \
    env FAKECUDA_MEM_BYTES=1048576 "$S" rt.malloc:a:1000 rt.meminfo drv.meminfo drv.total:1

expect "pitch allocations count pitch*height (rows padded to 512)" 0 "used dev=0 bytes=10240
used dev=0 bytes=12288
used dev=0 bytes=0" \
    "$S" rt.malloc_pitch:p:1000:10 print.used:0 drv.alloc_pitch:q:513:2:4 print.used:0 rt.free:p \
    drv.free:q print.used:0

expect "cuMemCreate on device 1 while device 0 is current; host location not counted" 0 "used dev=0 bytes=0
used dev=1 bytes=2097152
used dev=1 bytes=0" \
    "$S" drv.ctx:0 drv.create:h:2097152:1 drv.create_host:hh:4096 print.used:0 print.used:1 drv.release:h \
    drv.release:hh print.used:1 drv.release:h=1

expect "streams and pools allocate on their own device" 0 "used dev=1 bytes=4196
used dev=0 bytes=0" \
    "$S" drv.ctx:0 drv.stream:s:1 drv.alloc_async_on:a:4096:s drv.alloc_pool:p:100:1 print.used:1 \
    print.used:0 drv.free_async:a drv.free_async_ptsz:p

expect "every door: dlsym, gpa v1, gpa v2, entry point, async, ptsz" 0 "used dev=0 bytes=1023
used dev=0 bytes=0" \
    "$S" drv.ctx:0 dl.alloc:a:1 gpa1.alloc:b:2 gpa2.alloc:c:4 ep.alloc:d:8 gpa2.alloc_async_ptsz:e:16 \
    rt.malloc_async:f:32 rt.malloc_async_ptsz:g:64 drv.alloc_async:h:128 drv.alloc_async_ptsz:i:256 \
    rt.malloc_pool:j:512 print.used:0 gpa2.free:a gpa2.free_async_ptsz:b rt.free_async:c \
    rt.free_async_ptsz:d drv.free_async:e drv.free_async_ptsz:f drv.free:g rt.free:h rt.free:i drv.free:j \
    print.used:0

expect "gpa2.create / gpa2.release" 0 "used dev=1 bytes=65536
used dev=1 bytes=0" \
    "$S" gpa2.create:h:65536:1 print.used:1 gpa2.release:h print.used:1

expect "managed and pinned host memory never count as device memory" 0 "used dev=0 bytes=0" \
    "$S" rt.malloc_managed:m:4096 rt.malloc_host:h:4096 rt.host_alloc:h2:100 drv.host_alloc:h3:10 \
    drv.alloc_host:h4:20 drv.alloc_managed:m2:64 print.used:0 rt.free:m drv.free:m2 rt.free_host:h \
    rt.free_host:h2 drv.free_host:h3 drv.free_host:h4 drv.free_host:h4=1

expect "unknown frees give 1, NULL frees give 0" 0 "" \
    "$S" drv.ctx:0 drv.free:0x1234=1 rt.free:0xdead00=1 drv.free:0 rt.free:0 gpa2.free:0x200=1

expect "NULL out-pointers give 1; no context gives 201" 0 "" \
    "$S" drv.alloc:a:1=201 drv.meminfo_null drv.alloc_null:16 drv.ctx:0 drv.meminfo_null drv.alloc_null:16 \
    drv.alloc:z:0=1

expect "addresses: device ranges, 512-byte rounding, freed blocks reused" 0 "" \
    "$S" drv.ctx:0 drv.alloc:a:1000 drv.alloc:b:1 drv.free:0x100000000000 drv.free:0x100000000400 \
    drv.alloc:c:1024 drv.free:0x100000000000 drv.ctx:1 drv.alloc:d:1 drv.free:0x110000000000

expect "out of memory changes nothing (driver 2, runtime 2)" 0 "used dev=0 bytes=4096
used dev=0 bytes=0" \
    env FAKECUDA_MEM_BYTES=4096 "$S" drv.ctx:0 drv.alloc:a:4096 drv.alloc:b:1=2 rt.malloc:c:1=2 \
    gpa2.create:h:1:0=2 print.used:0 drv.free:a print.used:0

expect "FAKECUDA_DEVICES" 0 "drv.total dev=2 total=17179869184" \
    env FAKECUDA_DEVICES=3 "$S" drv.ctx:2 drv.total:2 drv.ctx:3=101 rt.setdev:3=101

# The runtime's path to the driver, seen through the dynamic linker's own trace of symbol lookups.
expect "runtime reaches the driver only through cuGetProcAddress_v2" 0 "used dev=0 bytes=100" \
    env LD_DEBUG=symbols "$R" rt.malloc:a:100 print.used:0
stderr_has "cuGetProcAddress_v2 lookup" "symbol=cuGetProcAddress_v2;"
if grep -qE 'symbol=(cuMemAlloc_v2|fakecuda_hidden_alloc);' "$work/err"; then
    fail "runtime looked up an allocation function by dlsym"
fi

expect "FAKECUDART_HIDDEN=1 allocates through fakecuda_hidden_alloc" 0 "used dev=0 bytes=100
used dev=0 bytes=0" \
    env FAKECUDART_HIDDEN=1 LD_DEBUG=symbols "$R" rt.malloc:a:100 print.used:0 rt.free:a print.used:0
stderr_has "hidden lookup" "symbol=fakecuda_hidden_alloc;"

expect "a forked child's calls are refused with 3, as by a real driver" 0 "used dev=0 bytes=100" \
    "$S" rt.malloc:a:100 fork rt.malloc:b:200=3 drv.free:0x10=3 endfork print.used:0

# FAKECUDA_FORK_OK=1: the child keeps a working copy of the driver.
expect "fork/endfork: child has its own copy, parent continues" 0 "used dev=0 bytes=300
used dev=0 bytes=100" \
    env FAKECUDA_FORK_OK=1 "$S" rt.malloc:a:100 fork rt.malloc:b:200 print.used:0 endfork print.used:0

expect "a failing forked child fails the parent" 1 "" \
    env FAKECUDA_FORK_OK=1 "$S" drv.ctx:0 fork drv.free:0x10 endfork print.used:0
stderr_has "mismatch message" "simrun: drv.free:0x10 returned 1, expected 0"

expect "context teardown frees what the context owns; stream-ordered memory survives" 0 "used dev=0 bytes=1500
used dev=0 bytes=500
used dev=0 bytes=0" \
    "$S" drv.ctx:0 drv.alloc:a:1000 drv.alloc_async:d:500 drv.stream:s:0 drv.alloc_async_on:e:24:s \
    drv.free_async:e print.used:0 drv.ctx_reset:0 print.used:0 drv.free:a=1 drv.alloc_async_on:e:1:s=400 \
    drv.free_async:d print.used:0
expect "the last release destroys a primary context; a created context's destruction pops it" 0 \
    "used dev=1 bytes=8
used dev=1 bytes=0
used dev=0 bytes=0" \
    "$S" drv.ctx:1 drv.ctx:1 drv.alloc:a:8 drv.ctx_release:1 print.used:1 drv.ctx_release_v1:1 print.used:1 \
    drv.ctx_release:1=201 drv.ctx_create:c:0 drv.alloc:b:5 drv.ctx_destroy:c drv.ctx_destroy_v1:c=201 \
    print.used:0
expect "a destroyed pool's allocations live until freed" 0 "used dev=1 bytes=1000
used dev=1 bytes=0" \
    "$S" drv.ctx:0 drv.pool_create:p:1 drv.alloc_from:a:1000:p drv.pool_destroy:p print.used:1 \
    drv.alloc_from_ptsz:b:1:p=400 drv.free_async:a print.used:1 drv.pool_get:q:0 drv.pool_destroy:q=1
echo 'image' >"$work/kernels.cubin"
expect "module loads grow the context; its teardown unloads them" 0 "nvml.procs dev=0 version=3 count=1 self=28 others=0
nvml.procs dev=0 version=3 count=1 self=0 others=0" \
    env FAKECUDA_MODULE_BYTES=7 "$S" drv.ctx:0 drv.module_file:"$work/kernels.cubin" drv.module_ex \
    drv.module_fatbin drv.library_file:"$work/kernels.cubin" drv.module_file:"$work/none.cubin"=301 \
    nvml.procs:0:3:dl drv.ctx_reset:0 nvml.procs:0:3:dl

expect "simrun_rtonly refuses driver operations with 3" 3 "" "$R" rt.malloc:a:1 drv.alloc:b:1

expect "malformed scenario exits 2" 2 "" "$S" rt.free:nosuchvar

expect "print.segment without a hook" 0 "segment=none" "$S" print.segment

# touch / wait / sleep: two processes meet through files.
("$S" wait:"$work/go" print.used:0 touch:"$work/done" >"$work/bg" 2>&1) &
bg=$!
expect "touch, sleep" 0 "" "$S" sleep:50 touch:"$work/go" wait:"$work/done"
wait "$bg" || fail "background simrun failed"
[[ "$(cat "$work/bg")" == "used dev=0 bytes=0" ]] || fail "background simrun output"

# Without libcuda.so.1 next to it the runtime returns cudaErrorInsufficientDriver (35).
mkdir "$work/nodrv"
cp "$O/libcudart.so.13" "$O/simrun_rtonly" "$work/nodrv/"
expect "no driver: runtime entry points give 35" 0 "" "$work/nodrv/simrun_rtonly" rt.malloc:a:1=35 rt.free:0=35

# threads: the driver's table stays exact under concurrency. The expected numbers come from replaying
# each thread's deterministic xorshift64 stream here (see the comment above worker_main in simrun.c).
cat >"$work/threads.py" <<'EOF'
import sys
n, iters, seed, maxb = map(int, sys.argv[1:5])
M = (1 << 64) - 1
A = F = L = T = used = 0
for t in range(n):
    x = (seed + t) & M or 0x9E3779B97F4A7C15
    live = []
    for _ in range(iters):
        x ^= (x << 13) & M; x ^= x >> 7; x ^= (x << 17) & M
        if not live or (len(live) < 16 and x & 1):
            x ^= (x << 13) & M; x ^= x >> 7; x ^= (x << 17) & M
            s = 1 + x % maxb
            live.append(s); A += 1; T += s
        else:
            x ^= (x << 13) & M; x ^= x >> 7; x ^= (x << 17) & M
            k = x % len(live)
            live[k] = live[-1]; live.pop(); F += 1
    L += len(live); used += sum(live)
print(f"threads allocs={A} frees={F} live={L} total={T}")
print(f"used dev=0 bytes={used}")
EOF
want="$(python3 "$work/threads.py" 8 100000 42 1048576)"
start=$(date +%s%N)
expect "threads:8:100000:42:1048576 (simrun)" 0 "$want" "$S" threads:8:100000:42:1048576 print.used:0
ms=$((($(date +%s%N) - start) / 1000000))
[[ $ms -lt 5000 ]] || fail "threads op took ${ms} ms"
expect "threads:8:100000:42:1048576 (simrun_rtonly)" 0 "$want" "$R" threads:8:100000:42:1048576 print.used:0
want="$(python3 "$work/threads.py" 3 1000 0 100)"
expect "threads with seed 0 and tiny blocks" 0 "$want" "$S" threads:3:1000:0:100 print.used:0

# cuGetProcAddress answers by version and flags, and hands out the driver's own addresses.
cat >"$work/gpa.py" <<'EOF'
import ctypes, sys
cu = ctypes.CDLL(sys.argv[1] + "/libcuda.so.1")
P = ctypes.c_void_p
def gpa(name, ver, flags=0):
    fn, st = P(), ctypes.c_int(-1)
    r = cu.cuGetProcAddress_v2(name.encode(), ctypes.byref(fn), ver, ctypes.c_ulonglong(flags), ctypes.byref(st))
    return r, fn.value, st.value
def addr(name):
    return ctypes.cast(getattr(cu, name), P).value
v1, v2 = gpa("cuGetProcAddress", 11030)[1], gpa("cuGetProcAddress", 12000)[1]
assert v1 == addr("cuGetProcAddress") and v2 == addr("cuGetProcAddress_v2") and v1 != v2, (v1, v2)
assert gpa("cuMemAlloc", 12000) == (0, addr("cuMemAlloc_v2"), 0)
assert gpa("cuMemAlloc", 3010)[::2] == (500, 2)
assert gpa("cuMemFree", 3020)[1] == addr("cuMemFree_v2")
assert gpa("cuMemAllocAsync", 12000, 2)[1] == addr("cuMemAllocAsync_ptsz") != addr("cuMemAllocAsync")
assert gpa("cuMemAllocAsync", 12000, 1)[1] == addr("cuMemAllocAsync")
assert gpa("cuMemFreeAsync", 12000, 2)[1] == addr("cuMemFreeAsync_ptsz")
assert gpa("cuMemAllocFromPoolAsync", 12000, 2)[1] == addr("cuMemAllocFromPoolAsync_ptsz")
assert gpa("cuMemCreate", 12000, 2)[1] == addr("cuMemCreate")
assert gpa("cuStreamDestroy", 4000)[1] == addr("cuStreamDestroy_v2")
assert gpa("cuStreamDestroy", 3020)[1] == addr("cuStreamDestroy") != addr("cuStreamDestroy_v2")
assert gpa("cuCtxDestroy", 12000)[1] == addr("cuCtxDestroy_v2")
assert gpa("cuDevicePrimaryCtxReset", 11000)[1] == addr("cuDevicePrimaryCtxReset_v2")
assert gpa("cuDevicePrimaryCtxRelease", 10020)[1] == addr("cuDevicePrimaryCtxRelease")
assert gpa("cuCtxPushCurrent", 3020)[::2] == (500, 2)
assert gpa("cuNoSuchThing", 12000) == (500, None, 1)
assert gpa("fakecuda_hidden_alloc", 12000) == (500, None, 1)
# v1 through its own signature
g1 = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_char_p, ctypes.POINTER(P), ctypes.c_int, ctypes.c_ulonglong)(v1)
fn = P()
assert g1(b"cuMemAlloc", ctypes.byref(fn), 12000, 0) == 0 and fn.value == addr("cuMemAlloc_v2")
assert cu.cuGetProcAddress_v2(b"cuMemAlloc", None, 12000, ctypes.c_ulonglong(0), None) == 1
print("gpa ok")
EOF
expect "cuGetProcAddress v1/v2 addresses, versions, ptsz, not found" 0 "gpa ok" python3 "$work/gpa.py" "$O"

# Python loads the runtime by path; the runtime finds the driver through its own RPATH.
cat >"$work/ctypes_rt.py" <<'EOF'
import ctypes, sys
rt = ctypes.CDLL(sys.argv[1] + "/libcudart.so.13")
p = ctypes.c_void_p()
assert rt.cudaMalloc(ctypes.byref(p), ctypes.c_size_t(1 << 20)) == 0 and p.value
cu = ctypes.CDLL(sys.argv[1] + "/libcuda.so.1")  # the same object the runtime dlopen()ed
cu.fakecuda_used.restype = ctypes.c_ulonglong
print("used", cu.fakecuda_used(0))
assert rt.cudaFree(p) == 0
assert rt.cudaFree(p) == 1
print("used", cu.fakecuda_used(0))
EOF
expect "python3 ctypes: cudaMalloc/cudaFree through libcudart.so.13 by path" 0 "used 1048576
used 0" python3 "$work/ctypes_rt.py" "$O"

expect "libnextprobe chains to the real cudaMalloc and cuMemAlloc_v2" 0 "used dev=0 bytes=1536" \
    env LD_PRELOAD="$O/libnextprobe.so" "$S" rt.malloc:a:1024 drv.alloc:b:512 print.used:0
stderr_has "nextprobe count" "nextprobe calls=2"

expect "libnextprobe under simrun_rtonly (dlsym by handle bypasses it)" 0 "used dev=0 bytes=1536" \
    env LD_PRELOAD="$O/libnextprobe.so" "$R" rt.malloc:a:1024 dl.alloc:b:512 print.used:0
stderr_has "nextprobe count" "nextprobe calls=1"

cat >"$work/nvml.py" <<'EOF'
import ctypes, sys
nv = ctypes.CDLL(sys.argv[1] + "/libnvidia-ml.so.1")
rt = ctypes.CDLL(sys.argv[1] + "/libcudart.so.13")
class Mem(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]
n = ctypes.c_uint()
assert nv.nvmlDeviceGetCount_v2(ctypes.byref(n)) == 1  # before nvmlInit_v2
assert nv.nvmlInit_v2() == 0 and nv.nvmlDeviceGetCount_v2(ctypes.byref(n)) == 0
h, m, i = ctypes.c_void_p(), Mem(), ctypes.c_uint()
assert nv.nvmlDeviceGetHandleByIndex_v2(n.value, ctypes.byref(h)) == 2
assert nv.nvmlDeviceGetHandleByIndex_v2(1, ctypes.byref(h)) == 0
assert nv.nvmlDeviceGetIndex(h, ctypes.byref(i)) == 0 and i.value == 1
p = ctypes.c_void_p()
assert rt.cudaSetDevice(1) == 0 and rt.cudaMalloc(ctypes.byref(p), ctypes.c_size_t(1000)) == 0
assert nv.nvmlDeviceGetMemoryInfo(h, ctypes.byref(m)) == 0
print(n.value, m.total, m.free, m.used)
assert nv.nvmlShutdown() == 0 and nv.nvmlShutdown() == 1
EOF
expect "libnvidia-ml.so.1 reports the driver's capacity and used, plus other processes'" 0 \
    "3 1000000 998500 1500" env FAKECUDA_DEVICES=3 FAKECUDA_MEM_BYTES=1000000 FAKENVML_OTHER_USED=500 \
    python3 "$work/nvml.py" "$O"
expect "libnvidia-ml.so.1 with FAKENVML_FAIL=1: nvmlInit_v2 fails (driver not loaded)" 0 "9" \
    env FAKENVML_FAIL=1 python3 -c 'import ctypes, sys; print(ctypes.CDLL(sys.argv[1] + "/libnvidia-ml.so.1").nvmlInit_v2())' "$O"

expect "scripts/build/sim is idempotent and quiet" 0 "" "$here/../../scripts/build/sim" "$O"

echo "selfcheck: all $n checks passed"
