#!/usr/bin/env python3
"""gpu/rounds/bench.py: gpumemhook's benchmarks on a real GPU (items 2-5 of BENCHMARKS.md).

    GPUMEMHOOK_LIB=/path/to/libgpumemhook.so PYTHONPATH=/path/to/wheel-dir python3 scripts/gpu/rounds/bench.py
    python3 scripts/gpu/rounds/bench.py /path/to/libgpumemhook.so [--quick] [--only 2,3,4,5]

Runs unattended (about 3-4 minutes on an H100; `--quick` about 1) and prints a table last; with
`OUT` set, writes every sample to `$OUT/bench.json`. Every measurement that compares "with" and
"without" the hook runs both variants as child processes of this script (with and without
`LD_PRELOAD`), alternating their order round by round, so that drift of the machine falls on both.

 2. `cudaMalloc`+`cudaFree` pairs (1 MiB, 64 MiB) and `cudaMallocAsync`+`cudaFreeAsync` pairs from a
    warm pool on a created stream, through the `libcudart.so.13` that PyTorch ships, reached through
    the global symbol scope as PyTorch reaches it (so, under the hook, through its runtime shadows).
    The timed loop is C when a C compiler exists (compiled here at start-up), else Python ctypes.
 3. A small transformer training step in PyTorch (default caching allocator, and
    `PYTORCH_NO_CUDA_MEMORY_CACHING=1`): step time with and without the hook.
 4. Latency of one read from Python: gpumemhook (`used`, `peak`, `stats`, the `Process` methods),
    `torch.cuda.memory_allocated()`, NVML's device memory query (what fastai polls).
 5. Peak capture: short spikes (allocate, touch, hold, free), each measured by a gpumemhook scope and
    by a fastai-style thread polling NVML every 1 ms; how many spikes each caught.

Needs: python3, a CUDA GPU, PyTorch (items 3, 4; item 2 only needs its libcudart), pynvml /
nvidia-ml-py or libnvidia-ml.so.1 (items 4, 5), the gpumemhook Python package on PYTHONPATH
(items 4, 5; a raw reader of the segment is used if it is missing). Whatever is missing is reported
and skipped, never fatal.
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import datetime
import glob
import importlib.util
import json
import mmap
import os
import platform
import random
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time

MiB = 1 << 20
RESULT_PREFIX = "GPU_BENCH_RESULT "
HERE = os.path.abspath(__file__)


def log(msg: str) -> None:
    print("gpu_bench: " + msg, file=sys.stderr, flush=True)


def median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


# ---- finding things ---------------------------------------------------------------------------


def find_hook(argv_hook):
    """The hook library: argv, then GPUMEMHOOK_LIB, then the gpumemhook package's bundled copy."""
    for candidate in (argv_hook, os.environ.get("GPUMEMHOOK_LIB")):
        if candidate:
            return os.path.abspath(candidate)
    try:
        import gpumemhook  # noqa: PLC0415

        return gpumemhook.library_path()
    except Exception:
        return None


def package_dirs(name):
    try:
        spec = importlib.util.find_spec(name)
    except Exception:
        return []
    if spec is None or not spec.submodule_search_locations:
        return []
    return list(spec.submodule_search_locations)


def find_cudart(explicit=None):
    """libcudart.so.13: PyTorch's lib dir, the nvidia-* wheels (nvidia/cuda_runtime/lib,
    nvidia/cu13/lib), then the system's."""
    if explicit:
        return explicit
    found = []
    for d in package_dirs("torch"):
        found += sorted(glob.glob(os.path.join(d, "lib", "libcudart.so.13*")))
    for d in package_dirs("nvidia"):
        found += sorted(glob.glob(os.path.join(d, "*", "lib", "libcudart.so.13*")))
        found += sorted(glob.glob(os.path.join(d, "*", "*", "lib", "libcudart.so.13*")))
    for d in ("/usr/local/cuda/lib64", "/usr/local/cuda/targets/x86_64-linux/lib"):
        found += sorted(glob.glob(os.path.join(d, "libcudart.so.13*")))
    if not found:
        name = ctypes.util.find_library("cudart")
        if name:
            found.append(name)
    return found[0] if found else None


# ---- the CUDA runtime through ctypes ----------------------------------------------------------


class Cudart:
    """The runtime functions, looked up in the global scope (`dlsym(RTLD_DEFAULT)`) after loading
    libcudart with RTLD_GLOBAL: under the hook that finds the hook's shadows first, exactly as a
    program linked to libcudart (PyTorch) reaches them. Functions the runtime lacks are None."""

    def __init__(self, path):
        self.path = path
        self.lib = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
        self.scope = ctypes.CDLL(None)
        P = ctypes.POINTER(ctypes.c_void_p)
        vp, sz, i = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int
        sigs = {
            "cudaSetDevice": [i],
            "cudaFree": [vp],
            "cudaMalloc": [P, sz],
            "cudaMallocAsync": [P, sz, vp],
            "cudaFreeAsync": [vp, vp],
            "cudaMemset": [vp, i, sz],
            "cudaDeviceSynchronize": [],
            "cudaStreamSynchronize": [vp],
            "cudaStreamCreate": [P],
            "cudaDeviceGetDefaultMemPool": [P, i],
            "cudaMemPoolSetAttribute": [vp, i, vp],
            "cudaMemGetInfo": [ctypes.POINTER(sz), ctypes.POINTER(sz)],
        }
        for name, args in sigs.items():
            try:
                f = getattr(self.scope, name)
            except AttributeError:
                f = None
            if f is not None:
                f.argtypes = args
                f.restype = ctypes.c_int
            setattr(self, name, f)

    def check(self, name, *args):
        f = getattr(self, name)
        if f is None:
            raise RuntimeError("%s: not in %s" % (name, self.path))
        rc = f(*args)
        if rc != 0:
            raise RuntimeError("%s returned %d" % (name, rc))

    def maybe(self, name, *args):
        f = getattr(self, name)
        return None if f is None else f(*args)

    def address(self, name):
        f = getattr(self, name)
        return None if f is None else ctypes.cast(f, ctypes.c_void_p).value

    def init(self):
        self.check("cudaSetDevice", 0)
        self.check("cudaFree", None)


C_LOOP_SOURCE = r"""
#include <stddef.h>
#include <time.h>
typedef int (*malloc_t)(void **, size_t);
typedef int (*free_t)(void *);
typedef int (*malloc_async_t)(void **, size_t, void *);
typedef int (*free_async_t)(void *, void *);
typedef int (*sync_t)(void *);
static double now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e9 + t.tv_nsec;
}
/* ns per cudaMalloc+cudaFree pair, negative on an error. */
double pairs(void *m, void *f, size_t bytes, long n) {
    malloc_t ma = (malloc_t)m;
    free_t fr = (free_t)f;
    double t0 = now_ns();
    for (long i = 0; i < n; i++) {
        void *p = 0;
        if (ma(&p, bytes)) return -1;
        if (fr(p)) return -2;
    }
    return (now_ns() - t0) / n;
}
/* ns per cudaMallocAsync+cudaFreeAsync pair on `stream`, the final synchronisation included. */
double pairs_async(void *m, void *f, void *sync, void *stream, size_t bytes, long n) {
    malloc_async_t ma = (malloc_async_t)m;
    free_async_t fr = (free_async_t)f;
    double t0 = now_ns();
    for (long i = 0; i < n; i++) {
        void *p = 0;
        if (ma(&p, bytes, stream)) return -1;
        if (fr(p, stream)) return -2;
    }
    if (sync && ((sync_t)sync)(stream)) return -3;
    return (now_ns() - t0) / n;
}
"""


def build_c_loop(workdir):
    """Compiles the timed loops (a ctypes loop would add ~0.3 us of Python per pair, which hides
    what the hook adds to a ~1 us stream-ordered pair). None when there is no C compiler."""
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if not cc:
        return None
    src = os.path.join(workdir, "loop.c")
    out = os.path.join(workdir, "libgpubenchloop.so")
    with open(src, "w") as f:
        f.write(C_LOOP_SOURCE)
    try:
        subprocess.run(
            [cc, "-O2", "-shared", "-fPIC", "-o", out, src],
            check=True,
            capture_output=True,
            timeout=60,
        )
    except Exception as e:
        log("no C loop (%s); timing in Python instead" % e)
        return None
    return out


# ---- reading gpumemhook ------------------------------------------------------------------------


class RawSegment:
    """Fallback reader of this process's segment when the gpumemhook package cannot be imported:
    the layout's header stores its own size at offset 16; device counters follow, 128 bytes each,
    `used` then `peak` (reader/segment/src/layout.rs)."""

    def __init__(self):
        d = os.environ.get("GPUMEMHOOK_SHM_DIR", "/dev/shm")
        self.path = os.path.join(d, "gpumemhook-%d-%d" % (os.getuid(), os.getpid()))
        with open(self.path, "rb") as f:
            self.map = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
        if self.map[:8] != b"GPUMEMHK":
            raise RuntimeError("%s: not a gpumemhook segment" % self.path)
        self.devices = struct.unpack_from("<I", self.map, 16)[0]

    def used(self, device=0):
        return struct.unpack_from("<Q", self.map, self.devices + 128 * device)[0]

    def peak(self, device=0):
        return struct.unpack_from("<Q", self.map, self.devices + 128 * device + 8)[0]


def hook_reader():
    """(module or None, Process-like object or None, note)."""
    try:
        import gpumemhook  # noqa: PLC0415
    except Exception as e:
        gpumemhook, note = None, "gpumemhook not importable (%s)" % e
    else:
        try:
            return gpumemhook, gpumemhook.current(), "gpumemhook package"
        except Exception as e:
            note = "gpumemhook.current() failed (%s)" % e
    try:
        return gpumemhook, RawSegment(), note + "; raw segment reader"
    except Exception as e:
        return gpumemhook, None, note + "; no segment (%s)" % e


# ---- NVML ---------------------------------------------------------------------------------------


class Nvml:
    """Device memory `used` from NVML: pynvml / nvidia-ml-py, else libnvidia-ml.so.1 by ctypes."""

    def __init__(self):
        index = 0
        visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
        if visible.strip().isdigit():
            index = int(visible.strip())
        self.kind = None
        try:
            import pynvml  # noqa: PLC0415

            pynvml.nvmlInit()
            self.pynvml = pynvml
            self.handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            self.kind = "pynvml"
            return
        except Exception:
            pass

        class Memory(ctypes.Structure):
            _fields_ = [(f, ctypes.c_ulonglong) for f in ("total", "free", "used")]

        lib = ctypes.CDLL("libnvidia-ml.so.1")
        if lib.nvmlInit_v2() != 0:
            raise RuntimeError("nvmlInit_v2 failed")
        self.handle = ctypes.c_void_p()
        if lib.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(self.handle)) != 0:
            raise RuntimeError("nvmlDeviceGetHandleByIndex_v2 failed")
        self.lib, self.mem = lib, Memory()
        self.kind = "ctypes libnvidia-ml"

    def used(self):
        if self.kind == "pynvml":
            return self.pynvml.nvmlDeviceGetMemoryInfo(self.handle).used
        self.lib.nvmlDeviceGetMemoryInfo(self.handle, ctypes.byref(self.mem))
        return self.mem.used

    def name(self):
        try:
            if self.kind == "pynvml":
                n = self.pynvml.nvmlDeviceGetName(self.handle)
                return n.decode() if isinstance(n, bytes) else n
            buf = ctypes.create_string_buffer(96)
            self.lib.nvmlDeviceGetName(self.handle, buf, 96)
            return buf.value.decode()
        except Exception:
            return None


# ---- workers (child processes) ------------------------------------------------------------------


def hooked_side():
    """True in the child the orchestrator started with the hook preloaded."""
    return os.environ.get("GPU_BENCH_SIDE") == "hooked"


def emit(result):
    print(RESULT_PREFIX + json.dumps(result), flush=True)


def worker_alloc(args):
    """Item 2 in one process: per repeat, ns per pair for each case."""
    rt = Cudart(args.cudart)
    rt.init()
    loop = ctypes.CDLL(args.c_loop) if args.c_loop else None
    if loop:
        loop.pairs.restype = ctypes.c_double
        loop.pairs.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_long]
        loop.pairs_async.restype = ctypes.c_double
        loop.pairs_async.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_size_t, ctypes.c_long]
    out = {"loop": "C" if loop else "python ctypes", "hooked": hooked_side(), "cases": {}}

    # Is the hook counting these very calls? (Only meaningful under the hook.)
    mod, reader, note = hook_reader() if out["hooked"] else (None, None, "not hooked")
    if reader is not None:
        before = reader.used(0)
        p = ctypes.c_void_p()
        rt.check("cudaMalloc", ctypes.byref(p), 64 * MiB)
        during = reader.used(0)
        rt.check("cudaFree", p)
        out["hook_counted_64MiB"] = during - before == 64 * MiB
    out["reader"] = note

    def timed_pairs(bytes_, n):
        if loop:
            r = loop.pairs(rt.address("cudaMalloc"), rt.address("cudaFree"), bytes_, n)
            if r < 0:
                raise RuntimeError("C loop failed (%d)" % r)
            return r
        p = ctypes.c_void_p()
        ref = ctypes.byref(p)
        m, f = rt.cudaMalloc, rt.cudaFree
        t0 = time.perf_counter_ns()
        for _ in range(n):
            if m(ref, bytes_) or f(p):
                raise RuntimeError("cudaMalloc/cudaFree failed")
        return (time.perf_counter_ns() - t0) / n

    cases = [
        ("cudaMalloc+cudaFree 1 MiB", 1 * MiB, args.n_malloc),
        ("cudaMalloc+cudaFree 64 MiB", 64 * MiB, max(args.n_malloc // 2, 10)),
    ]
    for name, b, n in cases:
        timed_pairs(b, max(n // 10, 5))  # warm-up
        out["cases"][name] = [timed_pairs(b, n) for _ in range(args.repeats)]

    # Stream-ordered, from the device's default pool kept warm (release threshold: never).
    if rt.cudaMallocAsync is None or rt.cudaFreeAsync is None:
        out["async_skipped"] = "no cudaMallocAsync in this runtime"
    else:
        stream = ctypes.c_void_p()
        if rt.maybe("cudaStreamCreate", ctypes.byref(stream)) not in (0, None):
            stream = ctypes.c_void_p()
        pool = ctypes.c_void_p()
        if rt.maybe("cudaDeviceGetDefaultMemPool", ctypes.byref(pool), 0) == 0:
            keep = ctypes.c_uint64(2**64 - 1)
            # 4: cudaMemPoolAttrReleaseThreshold
            rt.maybe("cudaMemPoolSetAttribute", pool, 4, ctypes.byref(keep))

        def timed_async(bytes_, n):
            if loop:
                r = loop.pairs_async(
                    rt.address("cudaMallocAsync"),
                    rt.address("cudaFreeAsync"),
                    rt.address("cudaStreamSynchronize"),
                    stream.value,
                    bytes_,
                    n,
                )
                if r < 0:
                    raise RuntimeError("C async loop failed (%d)" % r)
                return r
            p = ctypes.c_void_p()
            ref = ctypes.byref(p)
            m, f = rt.cudaMallocAsync, rt.cudaFreeAsync
            t0 = time.perf_counter_ns()
            for _ in range(n):
                if m(ref, bytes_, stream) or f(p, stream):
                    raise RuntimeError("cudaMallocAsync/cudaFreeAsync failed")
            rt.maybe("cudaStreamSynchronize", stream)
            return (time.perf_counter_ns() - t0) / n

        timed_async(MiB, max(args.n_async // 10, 100))  # warm the pool
        name = "cudaMallocAsync+cudaFreeAsync 1 MiB (warm pool)"
        out["cases"][name] = [timed_async(MiB, args.n_async) for _ in range(args.repeats)]
    emit(out)


def build_model(torch):
    nn = torch.nn
    V, D, H, L = 8192, 512, 8, 4

    class TinyLM(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(V, D)
            layer = nn.TransformerEncoderLayer(D, H, 4 * D, dropout=0.1, batch_first=True, norm_first=True)
            self.body = nn.TransformerEncoder(layer, L, enable_nested_tensor=False)
            self.head = nn.Linear(D, V)

        def forward(self, x, mask):
            return self.head(self.body(self.emb(x), mask=mask, is_causal=True))

    return TinyLM(), V


def worker_train(args):
    """Item 3 in one process: ms per training step (fwd+bwd+AdamW), synchronised."""
    import torch  # noqa: PLC0415

    torch.manual_seed(0)
    dev = torch.device("cuda")
    model, V = build_model(torch)
    model = model.to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    B, S = 16, 256
    x = torch.randint(V, (B, S), device=dev)
    y = torch.randint(V, (B, S), device=dev)
    mask = torch.nn.Transformer.generate_square_subsequent_mask(S, device=dev)
    loss_fn = torch.nn.CrossEntropyLoss()

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(x, mask)
            loss = loss_fn(logits.view(-1, V).float(), y.view(-1))
        loss.backward()
        opt.step()

    for _ in range(args.warmup):
        step()
    torch.cuda.synchronize()
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        step()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    out = {
        "hooked": hooked_side(),
        "mode": args.mode,
        "step_ms": times,
        "torch_max_memory_reserved": torch.cuda.max_memory_reserved(),
        "torch_max_memory_allocated": torch.cuda.max_memory_allocated(),
    }
    if out["hooked"]:
        _, reader, note = hook_reader()
        out["reader"] = note
        if reader is not None:
            out["hook_peak"] = reader.peak(torch.cuda.current_device())
    emit(out)


def per_call_ns(f, n, repeats, budget_s=5.0):
    """ns per call of `f`: `repeats` samples of `n` calls; `n` shrinks for a slow `f` so that one
    row takes about `budget_s` at most (a slow NVML query must not stall the whole run)."""
    t0 = time.perf_counter_ns()
    f()
    first = max(time.perf_counter_ns() - t0, 1)
    n = max(10, min(n, int(budget_s * 1e9 / repeats / first)))
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter_ns()
        for _ in range(n):
            f()
        samples.append((time.perf_counter_ns() - t0) / n)
    return samples


def worker_reader(args):
    """Item 4, under the hook: ns per call of each read, in a process that uses the GPU."""
    rows = {}
    notes = []
    torch = None
    try:
        import torch  # noqa: PLC0415

        keep = torch.empty(256 * MiB, dtype=torch.uint8, device="cuda")
        torch.cuda.synchronize()
    except Exception as e:
        torch, keep = None, None
        notes.append("torch unavailable (%s)" % e)
    n, r = args.n_read, args.repeats

    def noop():
        return 0

    rows["Python floor: calling a function that returns 0"] = per_call_ns(noop, n, r)
    mod, reader, note = hook_reader()
    notes.append("reader: " + note)
    if mod is not None and reader is not None and hasattr(reader, "device_stats"):
        p = reader
        for label, f in [
            ("gpumemhook.used(0)", lambda: mod.used(0)),
            ("gpumemhook.peak(0)", lambda: mod.peak(0)),
            ("gpumemhook.used() (current device)", lambda: mod.used()),
            ("gpumemhook.stats(0) (every counter)", lambda: mod.stats(0)),
            ("Process.used(0) (gpumemhook.current())", lambda: p.used(0)),
            ("Process.peak(0)", lambda: p.peak(0)),
        ]:
            try:
                f()
                rows[label] = per_call_ns(f, n, r)
            except Exception as e:
                notes.append("%s: %s" % (label, e))
        try:
            s = p.open_scope("latency", 0)
            rows["Scope.reading(0)"] = per_call_ns(lambda: s.reading(0), n, r)
            s.close()
        except Exception as e:
            notes.append("Scope.reading: %s" % e)
    try:
        raw = RawSegment()
        label = "raw mmap + struct.unpack_from of used (floor for Python)"
        rows[label] = per_call_ns(lambda: raw.used(0), n, r)
    except Exception as e:
        notes.append("raw segment: %s" % e)
    if torch is not None:
        rows["torch.cuda.memory_allocated()"] = per_call_ns(torch.cuda.memory_allocated, n, r)
        rows["torch.cuda.max_memory_allocated()"] = per_call_ns(torch.cuda.max_memory_allocated, n, r)
        rows["torch.cuda.memory_reserved()"] = per_call_ns(torch.cuda.memory_reserved, n, r)
    try:
        nv = Nvml()
        rows["NVML nvmlDeviceGetMemoryInfo (%s)" % nv.kind] = per_call_ns(nv.used, max(n // 20, 1000), r)
    except Exception as e:
        notes.append("NVML unavailable (%s)" % e)
    del keep
    emit({"rows": rows, "notes": notes})


class NvmlPeakPoller(threading.Thread):
    """fastai's peak monitor (fastai.utils.mem / ipyexperiments): a thread that reads NVML's
    device `used` every 1 ms and keeps the largest value seen since the last reset."""

    def __init__(self, nvml, interval_s=0.001):
        super().__init__(daemon=True)
        self.nvml, self.interval = nvml, interval_s
        self.peak = 0
        self.samples = 0
        self.running = True

    def reset(self):
        self.peak = 0

    def run(self):
        while self.running:
            u = self.nvml.used()
            self.samples += 1
            if u > self.peak:
                self.peak = u
            time.sleep(self.interval)


def worker_spikes(args):
    """Item 5, under the hook: spikes measured by a scope and by the NVML poller."""
    rt = Cudart(args.cudart)
    rt.init()
    mod, reader, note = hook_reader()
    out = {"reader": note, "spikes": []}
    try:
        nvml = Nvml()
    except Exception as e:
        nvml = None
        out["nvml"] = "unavailable (%s)" % e
    poller = None
    if nvml is not None:
        poller = NvmlPeakPoller(nvml)
        poller.start()

    # How the hook measures one spike: a scope per spike when the API exists, else the device peak
    # (spike sizes grow, so a never-reset device peak is still exact per spike).
    def hook_window():
        if mod is not None and hasattr(mod, "scope"):
            s = mod.scope("spike", 0)
            s.__enter__()
            return lambda: (s.__exit__(None, None, None), s.delta_peak)[1]
        if reader is not None and hasattr(reader, "open_scope"):
            s = reader.open_scope("spike", 0)
            return lambda: (lambda r: (s.close(), r.peak - r.base)[1])(s.reading(0))
        if reader is not None:
            base = reader.used(0)
            return lambda: reader.peak(0) - base
        return lambda: None

    if mod is not None and hasattr(mod, "scope"):
        out["hook_method"] = "gpumemhook.scope"
    elif reader is not None and hasattr(reader, "open_scope"):
        out["hook_method"] = "Process.open_scope"
    else:
        out["hook_method"] = "device peak" if reader is not None else "none"
    holds_ms = [0.1, 0.25, 0.5, 1.0, 2.0, 5.0]
    rng = random.Random(5)
    base_size = 128 * MiB
    memset = rt.cudaMemset
    sync = rt.cudaDeviceSynchronize
    time.sleep(0.05)
    for i in range(args.spikes):
        size = base_size + 2 * MiB * i
        hold = holds_ms[i % len(holds_ms)]
        time.sleep(0.004 + rng.random() * 0.002)  # the gap: the poller sees the baseline
        nv_base = nvml.used() if nvml else None
        if poller:
            poller.reset()
        finish = hook_window()
        p = ctypes.c_void_p()
        rt.check("cudaMalloc", ctypes.byref(p), size)
        t_alloc = time.perf_counter()
        if memset is not None:
            memset(p, 1, size)  # touch it
            if sync is not None:
                sync()
        time.sleep(hold / 1e3)
        t_free = time.perf_counter()
        rt.check("cudaFree", p)
        delta = finish()
        nv_peak = poller.peak if poller else None
        out["spikes"].append(
            {
                "bytes": size,
                "hold_ms": hold,
                "held_ms": (t_free - t_alloc) * 1e3,
                "hook_delta_peak": delta,
                "hook_caught": delta is not None and delta >= size,
                "nvml_delta_peak": None if nv_peak is None else nv_peak - nv_base,
                # NVML counts whole 2 MiB pages and other processes: allow one page of slack.
                "nvml_caught": None if nv_peak is None else nv_peak - nv_base >= size - 2 * MiB,
            }
        )
    if poller:
        poller.running = False
        poller.join(1)
        out["nvml_samples"] = poller.samples
    emit(out)


# ---- the orchestrator ---------------------------------------------------------------------------


def run_worker(name, extra, hooked, hook, timeout, env_extra=None):
    env = dict(os.environ)
    if hooked:
        env["LD_PRELOAD"] = hook + ((" " + env["LD_PRELOAD"]) if env.get("LD_PRELOAD") else "")
    elif env.get("LD_PRELOAD"):
        # Keep any other preloads the user has; drop only ours.
        env["LD_PRELOAD"] = " ".join(w for w in env["LD_PRELOAD"].split() if "gpumemhook" not in w)
        if not env["LD_PRELOAD"]:
            del env["LD_PRELOAD"]
    env["GPU_BENCH_SIDE"] = "hooked" if hooked else "plain"
    env.update(env_extra or {})
    cmd = [sys.executable, HERE, "--worker", name] + extra
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, "timed out after %d s" % timeout
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(RESULT_PREFIX):
            return json.loads(line[len(RESULT_PREFIX):]), None
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-6:]
    return None, "exit %d: %s" % (proc.returncode, " | ".join(tail))


def ab_rounds(name, extra, hook, rounds, timeout, env_extra=None, label=None):
    """Runs a worker `rounds` times per side, alternating which side goes first."""
    runs = {False: [], True: []}
    errors = []
    for r in range(rounds):
        for hooked in ((False, True) if r % 2 == 0 else (True, False)):
            log("%s: round %d/%d, %s" % (label or name, r + 1, rounds, "hooked" if hooked else "no hook"))
            res, err = run_worker(name, extra, hooked, hook, timeout, env_extra)
            if err:
                errors.append("%s (%s): %s" % (label or name, "hooked" if hooked else "no hook", err))
                log(errors[-1])
            else:
                runs[hooked].append(res)
    return runs, errors


def fmt(x, digits=1):
    if x is None:
        return "-"
    return ("%." + str(digits) + "f") % x


def verdict(ok):
    return "-" if ok is None else ("met" if ok else "MISSED")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("hook", nargs="?", help="libgpumemhook.so (default: $GPUMEMHOOK_LIB, then the package's)")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--cudart", help="libcudart.so.13 to use (default: PyTorch's)")
    ap.add_argument("--c-loop", help=argparse.SUPPRESS)
    ap.add_argument("--only", default="2,3,4,5", help="items to run (default 2,3,4,5)")
    ap.add_argument("--quick", action="store_true", help="fewer repeats (about a minute)")
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--repeats", type=int, default=None)
    ap.add_argument("--n-malloc", type=int, default=None)
    ap.add_argument("--n-async", type=int, default=None)
    ap.add_argument("--n-read", type=int, default=None)
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--mode", default="default")
    ap.add_argument("--spikes", type=int, default=None)
    args = ap.parse_args()
    q = args.quick
    args.rounds = args.rounds or (1 if q else 3)
    args.repeats = args.repeats or (3 if q else 5)
    args.n_malloc = args.n_malloc or (300 if q else 1000)
    args.n_async = args.n_async or (5000 if q else 20000)
    args.n_read = args.n_read or (20000 if q else 200000)
    args.spikes = args.spikes or (60 if q else 240)

    if args.worker:
        workers = {"alloc": worker_alloc, "train": worker_train, "reader": worker_reader, "spikes": worker_spikes}
        workers[args.worker](args)
        return 0

    started = time.time()
    only = {s.strip() for s in args.only.split(",")}
    hook = find_hook(args.hook)
    if not hook or not os.path.isfile(hook):
        log("the hook library was not found (pass it as the first argument or set GPUMEMHOOK_LIB)")
        return 2
    cudart = find_cudart(args.cudart)
    have_torch = bool(package_dirs("torch"))
    info = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "host": platform.node(),
        "python": sys.version.split()[0],
        "hook": hook,
        "cudart": cudart,
        "cpu": platform.processor() or platform.machine(),
    }
    try:
        info["gpu"] = Nvml().name()
    except Exception:
        info["gpu"] = None
    if have_torch:
        try:
            v = subprocess.run(
                [sys.executable, "-c", "import torch as t;print(t.__version__, t.version.cuda, t.cuda.get_device_name(0))"],
                capture_output=True, text=True, timeout=120,
            ).stdout.strip()
            info["torch"] = v
        except Exception as e:
            info["torch"] = "unknown (%s)" % e
    log("hook %s; cudart %s; gpu %s" % (hook, cudart, info.get("gpu")))
    results = {"info": info, "errors": [], "notes": []}
    table = []  # (item, what, no hook, hook, comparison, goal, verdict)
    workdir = tempfile.mkdtemp(prefix="gpu_bench.")
    common = ["--repeats", str(args.repeats)]

    # Item 2 ---------------------------------------------------------------------------------
    if "2" in only:
        if not cudart:
            results["errors"].append("item 2: no libcudart.so.13 found (pass --cudart)")
        else:
            c_loop = build_c_loop(workdir)
            extra = common + ["--cudart", cudart, "--n-malloc", str(args.n_malloc)]
            extra += ["--n-async", str(args.n_async)]
            if c_loop:
                extra += ["--c-loop", c_loop]
            runs, errors = ab_rounds("alloc", extra, hook, args.rounds, 240, label="item 2")
            results["errors"] += errors
            item2 = {"runs": runs}
            counted = [r.get("hook_counted_64MiB") for r in runs[True]]
            item2["hook_counted"] = counted
            if any(c is False for c in counted):
                results["errors"].append("item 2: the hooked run did not count its cudaMalloc: not the hook's path")
            names = []
            for r in runs[False] + runs[True]:
                for n in r["cases"]:
                    if n not in names:
                        names.append(n)
            for n in names:
                base = [x for r in runs[False] for x in r["cases"].get(n, [])]
                hooked = [x for r in runs[True] for x in r["cases"].get(n, [])]
                mb, mh = median(base), median(hooked)
                ratio = mh / mb if mb and mh else None
                goal = 1.02 if "Async" in n else 1.01
                # Every round on its own too: round r pairs the r-th run of each side (their order
                # alternated), so drift between rounds shows instead of averaging away.
                per_round = []
                for b_run, h_run in zip(runs[False], runs[True]):
                    rb, rh = median(b_run["cases"].get(n, [])), median(h_run["cases"].get(n, []))
                    per_round.append(rh / rb if rb and rh else None)
                item2[n] = {"no_hook_ns": base, "hook_ns": hooked, "ratio": ratio, "round_ratios": per_round}
                loop = (runs[True] or runs[False])[0]["loop"]
                table.append(
                    ("2", n + " (us/pair, %s loop)" % loop, fmt(mb and mb / 1e3, 2), fmt(mh and mh / 1e3, 2),
                     "x%s (+%s ns)" % (fmt(ratio, 4), fmt(mh - mb if mb and mh else None, 0)),
                     "ratio <= %.2f" % goal,
                     verdict(None if ratio is None else ratio <= goal))
                )
                table.append(
                    ("2", "  rounds: " + " ".join("x" + fmt(r, 4) for r in per_round), "", "", "", "", "")
                )
                # The median of the rounds' ratios, and the ratio of the sums over every round (each
                # sample weighs the same): the two figures issue 23's goal names.
                valid = [r for r in per_round if r is not None]
                summed = sum(hooked) / sum(base) if base and hooked else None
                table.append(
                    ("2", "  median of %d rounds x%s, all rounds summed x%s"
                     % (len(valid), fmt(median(valid), 4), fmt(summed, 4)), "", "", "", "", "")
                )
            results["item2"] = item2

    # Item 3 ---------------------------------------------------------------------------------
    if "3" in only:
        if not have_torch:
            results["errors"].append("item 3: torch is not installed")
        else:
            item3 = {}
            for mode, env_extra, steps in (
                ("default allocator", {}, args.steps or (20 if q else 60)),
                ("PYTORCH_NO_CUDA_MEMORY_CACHING=1", {"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"},
                 args.steps or (10 if q else 30)),
            ):
                extra = ["--mode", mode, "--steps", str(steps), "--warmup", str(args.warmup)]
                rounds = max(1, min(args.rounds, 2))
                runs, errors = ab_rounds("train", extra, hook, rounds, 300, env_extra, label="item 3 " + mode)
                results["errors"] += errors
                base = [x for r in runs[False] for x in r["step_ms"]]
                hooked = [x for r in runs[True] for x in r["step_ms"]]
                # Per process, the median step; the figure is the median over processes and steps.
                mb, mh = median(base), median(hooked)
                ratio = mh / mb if mb and mh else None
                item3[mode] = {"runs": runs, "ratio": ratio}
                table.append(
                    ("3", "transformer training step, %s (ms)" % mode, fmt(mb, 2), fmt(mh, 2),
                     "x%s" % fmt(ratio, 4),
                     "ratio <= 1.01", verdict(None if ratio is None else ratio <= 1.01))
                )
                for r in runs[True]:
                    if r.get("hook_peak") is not None:
                        results["notes"].append(
                            "item 3 %s: hook peak %.1f MiB, torch max_memory_reserved %.1f MiB (the difference "
                            "is memory allocated beside torch's allocator, e.g. cuBLAS workspaces)"
                            % (mode, r["hook_peak"] / MiB, r["torch_max_memory_reserved"] / MiB)
                        )
                        break
            results["item3"] = item3

    # Item 4 ---------------------------------------------------------------------------------
    if "4" in only:
        res, err = run_worker("reader", common + ["--n-read", str(args.n_read)], True, hook, 240)
        if err:
            results["errors"].append("item 4: " + err)
        else:
            results["item4"] = res
            results["notes"] += ["item 4: " + n for n in res["notes"]]
            for label, samples in res["rows"].items():
                m = median(samples)
                is_hook = label.startswith(("gpumemhook.used(0)", "gpumemhook.peak(0)", "Process."))
                table.append(
                    ("4", "read: " + label + " (ns/call)", "", fmt(m, 0), "", "<= 1000 ns" if is_hook else "",
                     verdict(m <= 1000) if is_hook else "")
                )

    # Item 5 ---------------------------------------------------------------------------------
    if "5" in only:
        if not cudart:
            results["errors"].append("item 5: no libcudart.so.13 found")
        else:
            extra = ["--cudart", cudart, "--spikes", str(args.spikes)]
            res, err = run_worker("spikes", extra, True, hook, 240)
            if err:
                results["errors"].append("item 5: " + err)
            else:
                results["item5"] = res
                spikes = res["spikes"]
                holds = sorted({s["hold_ms"] for s in spikes})
                for h in holds + [None]:
                    sel = [s for s in spikes if h is None or s["hold_ms"] == h]
                    hook_c = sum(1 for s in sel if s["hook_caught"])
                    nv = [s for s in sel if s["nvml_caught"] is not None]
                    nv_c = sum(1 for s in nv if s["nvml_caught"])
                    what = "spikes caught, %s" % ("all holds" if h is None else "held %g ms" % h)
                    table.append(
                        ("5", what + " (NVML 1 ms poll vs gpumemhook %s)" % res.get("hook_method"),
                         "%d/%d" % (nv_c, len(nv)) if nv else "-", "%d/%d" % (hook_c, len(sel)), "",
                         "hook: all" if h is None else "",
                         verdict(hook_c == len(sel)) if h is None else "")
                    )

    results["elapsed_s"] = time.time() - started
    shutil.rmtree(workdir, ignore_errors=True)
    out_dir = os.environ.get("OUT")
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
        with open(os.path.join(out_dir, "bench.json"), "w") as f:
            json.dump(results, f, indent=1)

    # The table, last.
    print()
    print("gpumemhook GPU benchmarks, %s; GPU %s; torch %s; python %s; %.0f s" % (
        info["date"], info.get("gpu"), info.get("torch", "-"), info["python"], results["elapsed_s"]))
    for n in results["notes"]:
        print("note: " + n)
    for e in results["errors"]:
        print("ERROR: " + e)
    header = ("item", "measurement", "no hook (or NVML)", "hook", "comparison", "goal", "verdict")
    rows = [header] + table
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(header))]
    for k, r in enumerate(rows):
        print("| " + " | ".join(str(c).ljust(widths[i]) for i, c in enumerate(r)) + " |")
        if k == 0:
            print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return 0


if __name__ == "__main__":
    sys.exit(main())
