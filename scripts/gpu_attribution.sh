#!/usr/bin/env bash
# gpu_attribution.sh: the GPU machine's checks of who holds the memory (issue 11), in one run:
#   1. scripts/gpu_attribution.py: PyTorch, NCCL, JAX, an out-of-memory report, Python sites;
#   2. the hot path's cost with attribution against the hook before it, on this machine's CPU
#      (dist/bench/overhead over the fast stand-in driver, alternating the two hooks).
# Expects, under dist/: the wheel (gpumemhook-*manylinux2014*.whl) and, for item 2,
# bench/{overhead,libcuda.so.1,libcudart.so.13,libgpumemhook-before.so}, built on the development
# machine. Prints a short table last.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu-install-wheel

echo "== 1. attribution (gpu_attribution.py)"
timeout 420 python3 scripts/gpu_attribution.py 2>&1 | tee /tmp/attribution.log | tail -60

echo "== 2. hot path: before attribution / with it, alternating (1 thread, 1k live, 0 scopes)"
if [[ -x dist/bench/overhead && -f dist/bench/libgpumemhook-before.so ]]; then
    for round in 1 2 3; do
        for hook in dist/bench/libgpumemhook-before.so "$GPUMEMHOOK_LIB"; do
            name=after; [[ $hook == *before* ]] && name=before
            timeout 60 dist/bench/overhead --driver dist/bench/libcuda.so.1 \
                --runtime dist/bench/libcudart.so.13 --hook "$hook" --threads 1 --live 1k \
                --scopes 0 --rounds 3 2>/dev/null | grep -E '^\| 1 ' | sed "s/^/$name round $round /"
        done
    done | tee /tmp/overhead.log
fi
echo
echo "== $(date -u '+%Y-%m-%d %H:%M UTC'), $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
sed -n '/^== summary/,$p' /tmp/attribution.log
echo "  overhead (rows per round: driver pair, driver replace, runtime pair; | threads | live | scopes | no hook ns | hook ns | added ns | added of minima | p25-p75 | ratio |):"
sed 's/^/    /' /tmp/overhead.log
