"""Exactness when frees come from another thread (issue 23's per-thread ledger), on a real GPU under
the hook: a PyTorch training loop whose gradients autograd's backward thread allocates and the main
thread frees, with each allocator that reaches the driver per tensor (no caching; cudaMallocAsync).

After every step the hook's `used` must stay the same distance from PyTorch's own figure (the
distance is what libraries linking the runtime statically hold beside PyTorch: a drift would be a
free counted twice or lost). Prints one RESULT line per mode, then a table.

    LD_PRELOAD=$GPUMEMHOOK_LIB python3 scripts/gpu/exact/crossthread.py no-caching
"""
import json
import os
import subprocess
import sys

MODES = {
    "no-caching": {"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"},
    "cudaMallocAsync": {"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"},
}


def worker(mode):
    import torch
    import gpumemhook

    def hook():
        s = gpumemhook.stats(0)
        get = (lambda k: s[k]) if isinstance(s, dict) else (lambda k: getattr(s, k))
        return get("used"), get("allocs"), get("frees")

    def torch_figure():
        # No caching: what PyTorch holds from the driver; cudaMallocAsync: what it has allocated.
        return torch.cuda.memory_reserved() if mode == "no-caching" else torch.cuda.memory_allocated()

    torch.cuda.synchronize()
    start_used, _, _ = hook()
    model = torch.nn.Sequential(*[torch.nn.Linear(1024, 1024) for _ in range(8)]).cuda()
    opt = torch.optim.AdamW(model.parameters())
    x = torch.randn(256, 1024, device="cuda")
    distances = []
    for step in range(20):
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)     # the main thread frees what the backward thread made
        torch.cuda.synchronize()
        used, _, _ = hook()
        distances.append(used - torch_figure())
    del model, opt, x, loss
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    end_used, allocs, frees = hook()
    print("RESULT " + json.dumps({
        "mode": mode,
        "steps": len(distances),
        "distinct_distances": sorted(set(distances)),
        "start_used": start_used,
        "end_used": end_used,
        "allocs": allocs,
        "frees": frees,
    }), flush=True)


def main():
    if len(sys.argv) > 1:
        worker(sys.argv[1])
        return
    rows = []
    for mode, extra in MODES.items():
        env = dict(os.environ, **extra)
        env["LD_PRELOAD"] = os.environ["GPUMEMHOOK_LIB"]
        p = subprocess.run([sys.executable, __file__, mode], env=env, capture_output=True, text=True,
                           timeout=180)
        lines = [l for l in p.stdout.splitlines() if l.startswith("RESULT ")]
        if p.returncode or not lines:
            rows.append((mode, "FAILED", p.stderr[-800:]))
            continue
        r = json.loads(lines[-1][7:])
        steady = len(r["distinct_distances"]) == 1
        rows.append((mode, "ok" if steady else "DRIFT",
                     "distance after each of %d steps %s; used at start %d, at end %d; allocs %d frees %d"
                     % (r["steps"], r["distinct_distances"], r["start_used"], r["end_used"], r["allocs"],
                        r["frees"])))
    print("== cross-thread frees (gpu/exact/crossthread.py)")
    for mode, verdict, text in rows:
        print("  %-16s %-7s %s" % (mode, verdict, text))
    sys.exit(0 if all(v == "ok" for _, v, _ in rows) else 1)


if __name__ == "__main__":
    main()
