#!/usr/bin/env python3
"""Checks card emulation on a real GPU (issue 12): under a 16 GB-class preset (T4 by default),

1. every view in the process shows the same card: `torch.cuda.mem_get_info()`, the device
   properties, NVML's device memory (v1 and v2) and NVML's per-process figure (pynvml when
   installed, else ctypes on libnvidia-ml.so.1), with total = used + free and the process's own use
   within the total;
2. PyTorch's out-of-memory message shows the card's capacity and an in-use figure within it;
3. the largest GPT-2-sized (124M parameters) training batch under the preset is smaller than the
   largest under a plain ceiling of the same size, by about the charged overhead.

Each part runs in its own process under LD_PRELOAD of the hook (settings are read at start) and
prints one `RESULT {json}` line; the parent prints a table last (and writes $OUT/gpu_emulate.json
when OUT is set). No network is needed: the model is built from a config (transformers' GPT2Config
when installed, else a plain torch transformer of the same size).

    GPUMEMHOOK_LIB=dist/libgpumemhook.so PYTHONPATH=/tmp/site python3 scripts/gpu/exact/emulate.py [CARD]
"""

import ctypes
import json
import os
import subprocess
import sys
import textwrap
import time

MIB = 1 << 20

PRELUDE = textwrap.dedent(
    """
    import ctypes, json, os, sys, gc
    import gpumemhook

    def result(**fields):
        print("RESULT " + json.dumps(fields), flush=True)

    def hook_figures(device=0):
        d = [d for d in gpumemhook.snapshot()["devices"] if d["device"] == device]
        d = d[0] if d else {"used": 0}
        em = d.get("emulated") or {}
        return d["used"], em.get("card"), em.get("total"), em.get("overhead")

    class Nvml:
        '''NVML through pynvml (nvidia-ml-py) when installed, else ctypes: both dlopen
        libnvidia-ml.so.1 and look functions up on its handle, as PyTorch does.'''

        def __init__(self, torch_device=0):
            try:
                import pynvml
                pynvml.nvmlInit()
                self.py = pynvml
                self.via = "pynvml"
            except Exception:
                self.py = None
                self.via = "ctypes"
                self.lib = ctypes.CDLL("libnvidia-ml.so.1")
                assert self.lib.nvmlInit_v2() == 0
            self.handle = self._handle(torch_device)

        def _handle(self, torch_device):
            import torch
            uuid = getattr(torch.cuda.get_device_properties(torch_device), "uuid", None)
            wanted = ("GPU-" + str(uuid)) if uuid is not None else None
            if self.py:
                n = self.py.nvmlDeviceGetCount()
                handles = [self.py.nvmlDeviceGetHandleByIndex(i) for i in range(n)]
                uuids = [self.py.nvmlDeviceGetUUID(h) for h in handles]
                uuids = [u.decode() if isinstance(u, bytes) else u for u in uuids]
            else:
                n = ctypes.c_uint()
                assert self.lib.nvmlDeviceGetCount_v2(ctypes.byref(n)) == 0
                handles, uuids = [], []
                for i in range(n.value):
                    h = ctypes.c_void_p()
                    assert self.lib.nvmlDeviceGetHandleByIndex_v2(i, ctypes.byref(h)) == 0
                    buf = ctypes.create_string_buffer(96)
                    assert self.lib.nvmlDeviceGetUUID(h, buf, 96) == 0
                    handles.append(h)
                    uuids.append(buf.value.decode())
            for h, u in zip(handles, uuids):
                if wanted and u.lower() == wanted.lower():
                    return h
            return handles[0]

        def memory(self):
            if self.py:
                m = self.py.nvmlDeviceGetMemoryInfo(self.handle)
                return m.total, m.free, m.used
            class Mem(ctypes.Structure):
                _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong),
                            ("used", ctypes.c_ulonglong)]
            m = Mem()
            assert self.lib.nvmlDeviceGetMemoryInfo(self.handle, ctypes.byref(m)) == 0
            return m.total, m.free, m.used

        def memory_v2(self):
            class Mem2(ctypes.Structure):
                _fields_ = [("version", ctypes.c_uint), ("total", ctypes.c_ulonglong),
                            ("reserved", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong),
                            ("used", ctypes.c_ulonglong)]
            lib = ctypes.CDLL("libnvidia-ml.so.1")
            m = Mem2(version=ctypes.sizeof(Mem2) | (2 << 24))
            h = ctypes.cast(self.handle, ctypes.c_void_p)
            rc = lib.nvmlDeviceGetMemoryInfo_v2(h, ctypes.byref(m))
            return None if rc else (m.total, m.reserved, m.free, m.used)

        def own_use(self):
            pid = os.getpid()
            if self.py:
                procs = self.py.nvmlDeviceGetComputeRunningProcesses(self.handle)
                mine = [p.usedGpuMemory for p in procs if p.pid == pid]
                return mine[0] if mine else None
            class Proc(ctypes.Structure):
                _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong),
                            ("gpuInstanceId", ctypes.c_uint), ("computeInstanceId", ctypes.c_uint)]
            arr = (Proc * 64)()
            n = ctypes.c_uint(64)
            rc = self.lib.nvmlDeviceGetComputeRunningProcesses_v3(self.handle, ctypes.byref(n), arr)
            if rc:
                return None
            mine = [arr[i].usedGpuMemory for i in range(n.value) if arr[i].pid == pid]
            return mine[0] if mine else None
    """
)

VIEWS_AND_OOM = PRELUDE + textwrap.dedent(
    """
    import torch
    x = torch.randn(4096, 4096, device="cuda")
    y = x @ x                                              # loads cuBLAS's kernels
    held = [torch.empty(512 * 2**20, dtype=torch.uint8, device="cuda") for _ in range(4)]
    torch.cuda.synchronize()
    nvml = Nvml()
    free, total = torch.cuda.mem_get_info()
    n_total, n_free, n_used = nvml.memory()
    v2 = nvml.memory_v2()
    own = nvml.own_use()
    used, card, card_total, overhead = hook_figures()
    props_total = torch.cuda.get_device_properties(0).total_memory
    views = dict(cuda_free=free, cuda_total=total, props_total=props_total, nvml_total=n_total,
                 nvml_free=n_free, nvml_used=n_used, nvml_v2=v2, nvml_own=own, hook_used=used,
                 card=card, card_total=card_total, overhead=overhead, nvml_via=nvml.via)
    message = None
    chunks = []
    try:
        while True:
            chunks.append(torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda"))
    except torch.cuda.OutOfMemoryError as e:
        message = str(e)
    used_at_oom, _, _, overhead_at_oom = hook_figures()
    result(part="views+oom", views=views, oom_message=message, used_at_oom=used_at_oom,
           overhead_at_oom=overhead_at_oom, chunks=len(chunks))
    """
)

LARGEST_BATCH = PRELUDE + textwrap.dedent(
    """
    import time
    import torch
    seq = int(sys.argv[1])
    torch.manual_seed(0)
    try:
        from transformers import GPT2Config, GPT2LMHeadModel
        config = GPT2Config(n_positions=1024, n_embd=768, n_layer=12, n_head=12, vocab_size=50257)
        model = GPT2LMHeadModel(config).cuda()
        kind = "transformers GPT2LMHeadModel"
        def loss_of(tokens):
            return model(tokens, labels=tokens).loss
    except ImportError:
        class Gpt2Sized(torch.nn.Module):
            def __init__(self, vocab=50257, d=768, layers=12, heads=12, positions=1024):
                super().__init__()
                self.tok = torch.nn.Embedding(vocab, d)
                self.pos = torch.nn.Embedding(positions, d)
                layer = torch.nn.TransformerEncoderLayer(d, heads, 4 * d, dropout=0.0,
                                                         batch_first=True, norm_first=True)
                self.blocks = torch.nn.TransformerEncoder(layer, layers)
                self.norm = torch.nn.LayerNorm(d)
                self.head = torch.nn.Linear(d, vocab, bias=False)
                self.head.weight = self.tok.weight
            def forward(self, tokens):
                t = tokens.shape[1]
                h = self.tok(tokens) + self.pos(torch.arange(t, device=tokens.device))
                mask = torch.nn.Transformer.generate_square_subsequent_mask(t, device=tokens.device)
                return self.head(self.norm(self.blocks(h, mask=mask, is_causal=True)))
        model = Gpt2Sized().cuda()
        kind = "torch transformer, GPT-2 sized"
        def loss_of(tokens):
            logits = model(tokens)
            return torch.nn.functional.cross_entropy(
                logits[:, :-1].reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))
    params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def fits(batch):
        try:
            for _ in range(2):
                tokens = torch.randint(0, 50257, (batch, seq), device="cuda")
                loss = loss_of(tokens)
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
                del loss, tokens
            torch.cuda.synchronize()
            return True
        except torch.cuda.OutOfMemoryError:
            return False
        finally:
            gc.collect()
            torch.cuda.empty_cache()

    start = time.time()
    good, bad = 0, None
    batch = 8
    while bad is None:                     # grow until the first failure
        if fits(batch):
            good, batch = batch, batch * 2
        else:
            bad = batch
        if batch > 4096:
            break
    while bad is not None and bad - good > 1:   # then bisect
        mid = (good + bad) // 2
        if fits(mid):
            good = mid
        else:
            bad = mid
    used, card, card_total, overhead = hook_figures()
    result(part="largest batch", setting=os.environ.get("GPUMEMHOOK_EMULATE")
           or ("limit " + os.environ.get("GPUMEMHOOK_LIMIT", "-")), model=kind, params=params,
           seq=seq, largest_batch=good, overhead=overhead, card=card, seconds=round(time.time() - start, 1))
    """
)


def run(code, args, extra_env, timeout=300):
    env = dict(os.environ)
    env.update(extra_env)
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    env["LD_PRELOAD"] = os.environ["GPUMEMHOOK_LIB"]
    try:
        proc = subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True,
                              text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"args": args, "error": "timed out after {} s".format(timeout)}
    lines = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        return {"args": args, "error_exit": proc.returncode, "stderr": proc.stderr[-3000:]}
    out = json.loads(lines[-1][len("RESULT "):])
    out["hook_lines"] = [l for l in proc.stderr.splitlines() if l.startswith("gpumemhook:")]
    return out


def real_nvml_total():
    """The real card's total as nvidia-smi shows it (this parent process is not hooked)."""
    try:
        lib = ctypes.CDLL("libnvidia-ml.so.1")
        class Mem(ctypes.Structure):
            _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong),
                        ("used", ctypes.c_ulonglong)]
        h = ctypes.c_void_p()
        m = Mem()
        if lib.nvmlInit_v2() or lib.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(h)):
            return None
        name = ctypes.create_string_buffer(96)
        lib.nvmlDeviceGetName(h, name, 96)
        lib.nvmlDeviceGetMemoryInfo(h, ctypes.byref(m))
        return name.value.decode(), m.total
    except OSError:
        return None


def mib(b):
    return "-" if b is None else "{:.1f} MiB".format(b / MIB)


def main():
    card = sys.argv[1] if len(sys.argv) > 1 else "t4"
    lib = os.environ.get("GPUMEMHOOK_LIB")
    if not lib or not os.path.exists(lib):
        sys.exit("set GPUMEMHOOK_LIB to libgpumemhook.so")
    sys.path.insert(0, os.environ.get("PYTHONPATH", "").split(":")[0])
    import gpumemhook

    card_total = {c["name"]: c["total"] for c in gpumemhook.cards()}.get(card)
    if card_total is None:
        sys.exit("unknown card {}; gpumemhook cards lists them".format(card))
    started = time.time()
    real = real_nvml_total()
    views = run(VIEWS_AND_OOM, [], {"GPUMEMHOOK_EMULATE": card})
    seq = "128"  # short sequences: a batch step is small, so the overhead shows in the batch size
    preset = run(LARGEST_BATCH, [seq], {"GPUMEMHOOK_EMULATE": card})
    ceiling = run(LARGEST_BATCH, [seq], {"GPUMEMHOOK_LIMIT": "{}B".format(card_total)})
    results = {"card": card, "card_total": card_total, "real": real, "views": views,
               "preset": preset, "ceiling": ceiling, "seconds": round(time.time() - started, 1)}
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "gpu_emulate.json"), "w") as f:
            json.dump(results, f, indent=1)
    print(json.dumps(results, indent=1))

    rows = []
    def row(what, value, ok=None):
        rows.append((what, value, "" if ok is None else ("ok" if ok else "FAIL")))

    row("real card (unhooked NVML)", "{} {}".format(real[0], mib(real[1])) if real else "-")
    v = views.get("views")
    if v:
        total = v["cuda_total"]
        row("card total: cuda / props / nvml", " / ".join(mib(x) for x in
            (v["cuda_total"], v["props_total"], v["nvml_total"])),
            v["cuda_total"] == v["props_total"] == v["nvml_total"] == card_total)
        row("free: cuda / nvml", "{} / {}".format(mib(v["cuda_free"]), mib(v["nvml_free"])),
            v["cuda_free"] == v["nvml_free"])
        row("nvml used + free = total", mib(v["nvml_used"] + v["nvml_free"]),
            v["nvml_used"] + v["nvml_free"] == v["nvml_total"])
        if v["nvml_v2"]:
            t2, r2, f2, u2 = v["nvml_v2"]
            row("nvml v2 total / reserved / free", "{} / {} / {}".format(mib(t2), mib(r2), mib(f2)),
                t2 == total and f2 == v["cuda_free"])
        row("overhead charged (hook)", mib(v["overhead"]), (v["overhead"] or 0) > 0)
        row("nvml own ({}) = used + overhead".format(v["nvml_via"]),
            "{} = {} + {}".format(mib(v["nvml_own"]), mib(v["hook_used"]), mib(v["overhead"])),
            v["nvml_own"] == v["hook_used"] + (v["overhead"] or 0) and v["nvml_own"] <= total)
    else:
        row("views", views.get("error_exit", views.get("error")), False)
    msg = views.get("oom_message") or ""
    first = msg.split("Of the allocated")[0].strip().replace("\n", " ")
    row("PyTorch OOM", first[:200] or "-",
        "total capacity of {:.2f} GiB".format(card_total / (1 << 30)) in msg)
    for name, r in (("largest batch, preset", preset), ("largest batch, plain ceiling", ceiling)):
        if "largest_batch" in r:
            row(name, "{} (seq {}, {} params, {}, {} s)".format(
                r["largest_batch"], r["seq"], r["params"], r["model"], r["seconds"]))
        else:
            row(name, r.get("error_exit", r.get("error")), False)
    if "largest_batch" in preset and "largest_batch" in ceiling:
        row("preset smaller than ceiling by the overhead", "{} < {} (overhead {})".format(
            preset["largest_batch"], ceiling["largest_batch"], mib(preset["overhead"])),
            preset["largest_batch"] < ceiling["largest_batch"])
    row("wall time", "{} s".format(round(time.time() - started, 1)), time.time() - started < 360)
    width = max(len(r[0]) for r in rows)
    print()
    for what, value, ok in rows:
        print("{:<{w}}  {:<4}  {}".format(what, ok, value, w=width))


if __name__ == "__main__":
    main()
