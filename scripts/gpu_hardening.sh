#!/usr/bin/env bash
# gpu_hardening.sh: the GPU machine's checks of the hook's hardening (issue 9), in one run.
#   1. exactness against the frameworks' own counters (scripts/gpu_check.py): must be unchanged;
#   2. cudaMallocAsync+cudaFreeAsync and cudaMalloc+cudaFree against the no-hook baseline, several
#      alternating rounds, every round reported (scripts/gpu_bench.py item 2);
#   3. fork under a busy PyTorch process: DataLoader workers (fork) while the main thread allocates,
#      and forked children touching CUDA (the driver refuses them): nothing may hang;
#   4. the CPU overhead benchmark (bench/) on this machine's quiet cores;
#   5. the timeline's cost at exit (scripts/bench_timeline.py over the simulated stack).
# Expects, under dist/: the wheel (gpumemhook-*.whl; the manylinux one when several), for item 4
# bench/{overhead,libcuda.so.1,libcudart.so.13} and for item 5 sim/ (scripts/build-sim's output),
# built on the development machine. Prints a short table last; with OUT set, keeps logs.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-/tmp/gpu_hardening}"
mkdir -p "$out"
source scripts/gpu-install-wheel
summary=()

echo "== 1. exactness (gpu_check.py)"
timeout 240 python3 scripts/gpu_check.py 2>&1 | tee "$out/check.log" | tail -40
summary+=("exactness: $(grep -c '^FAILED' "$out/check.log") workloads failed (table above)")

echo "== 2. allocation pairs (gpu_bench.py item 2, 5 rounds)"
timeout 150 python3 scripts/gpu_bench.py "$GPUMEMHOOK_LIB" --only 2 --rounds 7 2>"$out/bench.err" | tee "$out/bench.log" | tail -20

echo "== 3. fork while allocating"
LD_PRELOAD="$GPUMEMHOOK_LIB" timeout 90 python3 scripts/gpu_fork_check.py 2>&1 | tail -5 | tee "$out/fork.log"
summary+=("fork: $(grep FORK_RESULT "$out/fork.log" || echo 'no result (see fork.log)')")

echo "== 4. CPU overhead of the hook on this machine"
if [[ -x dist/bench/overhead ]]; then
    for fresh in "" --fresh; do
        timeout 100 dist/bench/overhead --driver dist/bench/libcuda.so.1 --runtime dist/bench/libcudart.so.13 \
            --hook "$GPUMEMHOOK_LIB" --threads 1,4 --live 1k,100k --scopes 0,64 --rounds 3 $fresh \
            2>/dev/null | tee -a "$out/overhead.log"
    done
    summary+=("overhead (reused, then fresh addresses): $(grep -c '' "$out/overhead.log") lines in overhead.log")
fi

echo "== 5. the timeline at exit"
if [[ -x dist/sim/simrun ]]; then
    timeout 120 python3 scripts/bench_timeline.py --lib "$GPUMEMHOOK_LIB" --sim dist/sim 2>&1 | tee "$out/timeline.log"
    summary+=("timeline: $(tail -1 "$out/timeline.log")")
fi

if [[ -n "${GPU_EMULATE:-}" && -f scripts/gpu_emulate.py ]]; then
    echo "== 6. card emulation (scripts/gpu_emulate.py $GPU_EMULATE)"
    timeout 200 python3 scripts/gpu_emulate.py "$GPU_EMULATE" 2>&1 | tee "$out/emulate.log" | tail -30
fi

echo
echo "== summary ($(date -u '+%Y-%m-%d %H:%M UTC'), $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1))"
grep -E "^\| *2 " "$out/bench.log" | sed 's/^/  /'
for line in "${summary[@]}"; do echo "  $line"; done
