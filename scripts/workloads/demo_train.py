#!/usr/bin/env python3
"""A small transformer training loop: the demo workload on a real GPU.

Each step runs inside a gpumemhook scope (when the hook and the Python package are loaded), so the
timeline shows one span per step and the step's exact peak is printed.
"""

import argparse
import contextlib
import time

import torch

try:
    import gpumemhook
except ImportError:  # the loop still runs, without per-step figures
    gpumemhook = None


def step_scope(name):
    if gpumemhook is None or not gpumemhook.is_hooked():
        return contextlib.nullcontext()
    return gpumemhook.scope(name)


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--layers", type=int, default=6)
    args = parser.parse_args()

    device = "cuda"
    layer = torch.nn.TransformerEncoderLayer(args.width, 8, 4 * args.width, batch_first=True)
    model = torch.nn.TransformerEncoder(layer, args.layers).to(device)
    head = torch.nn.Linear(args.width, 1000).to(device)
    params = list(model.parameters()) + list(head.parameters())
    optimizer = torch.optim.AdamW(params, lr=1e-4)
    for i in range(args.steps):
        start = time.perf_counter()
        with step_scope(f"step {i}") as scope:
            x = torch.randn(args.batch, args.seq, args.width, device=device)
            target = torch.randint(0, 1000, (args.batch, args.seq), device=device)
            logits = head(model(x))
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 1000), target.reshape(-1))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            torch.cuda.synchronize()
        elapsed = (time.perf_counter() - start) * 1000
        peak = ""
        if scope is not None:
            peak = f"  step peak {scope.delta_peak / 2**20:8.1f} MiB above its start"
        print(f"step {i:3d}  loss {loss.item():.4f}  {elapsed:7.1f} ms{peak}", flush=True)


if __name__ == "__main__":
    main()
