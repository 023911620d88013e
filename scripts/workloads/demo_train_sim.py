#!/usr/bin/env python3
"""The training loop of scripts/workloads/demo_train.py stood in for on the simulated CUDA stack (no GPU, no
PyTorch), for `scripts/pictures --sim`: real cudaMalloc/cudaFree calls into tests/sim's stand-in
runtime in the shape of the H100 run (weights kept from the set-up; each step's activations grow,
then are freed; the optimizer's state appears in the first step and stays), every step in a
gpumemhook scope named as scripts/workloads/demo_train.py names it ("step 0", "step 1", ...).

The pauses are the H100 run's, ten times shorter (a set-up of 0.5 s, a first step of 60 ms, then
steps of 10 ms), so the picture drawn from it has the GPU picture's proportions: its scope bars are
as wide, relative to the plot, as the real ones. Run it under the hook with LD_LIBRARY_PATH pointing
at the built stack, as scripts/pictures does.
"""

import argparse
import ctypes
import time

import gpumemhook

MIB = 1 << 20
runtime = ctypes.CDLL("libcudart.so.13")


def malloc(nbytes):
    p = ctypes.c_void_p()
    rc = runtime.cudaMalloc(ctypes.byref(p), ctypes.c_size_t(nbytes))
    if rc != 0:
        raise MemoryError(f"cudaMalloc({nbytes}) returned {rc}")
    return p


def free(p):
    runtime.cudaFree(p)


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=8)
    args = parser.parse_args()

    weights = [malloc(74 * MIB)]
    time.sleep(0.5)  # importing PyTorch and building the model
    optimizer_state = []
    for i in range(args.steps):
        first = i == 0
        with gpumemhook.scope(f"step {i}") as scope:
            activations = []
            for _ in range(36):  # forward: activations pile up
                activations.append(malloc(50 * MIB))
                time.sleep((0.03 if first else 0.005) / 36)
            if first:
                optimizer_state = [malloc(460 * MIB)]
            while activations:  # backward: they go again
                free(activations.pop())
                time.sleep((0.03 if first else 0.005) / 36)
        peak = scope.delta_peak / MIB
        print(f"step {i:3d}  step peak {peak:8.1f} MiB above its start", flush=True)
    del weights, optimizer_state  # held to the end, as the model and optimizer are


if __name__ == "__main__":
    main()
