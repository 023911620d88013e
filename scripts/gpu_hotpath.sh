#!/usr/bin/env bash
# gpu_hotpath.sh: the GPU machine's checks of the hot path (issue 23), in one run:
#   1. exactness against the frameworks' own counters (scripts/gpu_check.py): must be unchanged;
#   2. frees from another thread (autograd's backward thread): scripts/gpu_crossthread.py;
#   3. fork under a busy PyTorch process (scripts/gpu_fork_check.py): nothing may hang;
#   4. cudaMallocAsync+cudaFreeAsync and cudaMalloc+cudaFree against the no-hook baseline, 9
#      alternating rounds (scripts/gpu_bench.py item 2: every round, their median, their sum);
#   5. the CPU cost per pair on this machine, the hook before issue 23 and after it alternating
#      (dist/bench/overhead over the fast stand-in driver): driver and runtime pairs, 1k and 100k
#      live, reused and fresh addresses, 1 and 4 threads.
# Expects, under dist/: the wheel (gpumemhook-*manylinux2014*.whl) and bench/{overhead,
# libcuda.so.1, libcudart.so.13, libgpumemhook-before.so}, built on the development machine
# (scripts/gpu-dist --before REV). STEPS="1 2 3" runs only those steps (all by default). Prints a
# short table last; with OUT set, keeps the logs there.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-/tmp/gpu_hotpath}"
mkdir -p "$out"
source scripts/gpu-install-wheel
steps=" ${STEPS:-1 2 3 4 5} "
step() { [[ $steps == *" $1 "* ]]; }
touch "$out/check.log" "$out/crossthread.log" "$out/fork.log" "$out/bench.log" "$out/overhead.log"

step 1 && echo "== 1. exactness (gpu_check.py)" &&
timeout 240 python3 scripts/gpu_check.py 2>&1 | tee "$out/check.log" | tail -25

step 2 && echo "== 2. frees from another thread" &&
timeout 300 python3 scripts/gpu_crossthread.py 2>&1 | tee "$out/crossthread.log" | tail -8

step 3 && echo "== 3. fork while allocating" &&
LD_PRELOAD="$GPUMEMHOOK_LIB" timeout 90 python3 scripts/gpu_fork_check.py 2>&1 | tail -3 | tee "$out/fork.log"

# Both sides of every comparison run on the same CPUs: between processes placed on different cores
# this host's round-to-round spread was -40% to +80%.
pin=""
command -v taskset >/dev/null && pin="taskset -c 2"
step 4 && echo "== 4. allocation pairs against no hook (gpu_bench.py item 2, 15 rounds, $pin)" &&
$pin timeout 300 python3 scripts/gpu_bench.py "$GPUMEMHOOK_LIB" --only 2 --rounds 15 2>"$out/bench.err" \
    | tee "$out/bench.log" | tail -14

run_overhead() { # hook-name hook extra-args...
    local name="$1" hook="$2"
    shift 2
    $pin timeout 120 dist/bench/overhead --driver dist/bench/libcuda.so.1 \
        --runtime dist/bench/libcudart.so.13 --hook "$hook" --scopes 0 --rounds 3 "$@" 2>/dev/null \
        | grep -E '^\| [0-9]' | sed "s/^/$name $* /"
}
step 5 && echo "== 5. CPU cost per pair: before issue 23 / after, alternating" &&
for round in 1 2 3; do
    for hook in dist/bench/libgpumemhook-before.so "$GPUMEMHOOK_LIB"; do
        name=after; [[ $hook == *before* ]] && name=before
        run_overhead "$name" "$hook" --threads 1 --live 1k,100k
        run_overhead "$name" "$hook" --threads 1 --live 1k,100k --fresh
        [[ $round == 1 ]] && pin="${pin:+taskset -c 2-5}" run_overhead "$name" "$hook" --threads 4 --live 1k
    done
done | tee "$out/overhead.log"

echo
echo "== summary ($(date -u '+%Y-%m-%d %H:%M UTC'), $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1),$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2))"
echo "  exactness: $(grep -c '^FAILED' "$out/check.log") workloads failed"
sed -n '/^== cross-thread/,$p' "$out/crossthread.log" | sed 's/^/  /'
echo "  fork: $(grep FORK_RESULT "$out/fork.log" || echo 'no result')"
grep -E "^\| *2 " "$out/bench.log" | sed 's/^/  /'
echo "  overhead rows (| threads | live | scopes | no hook ns | hook ns | added ns | added of minima | p25-p75 | ratio |):"
sed 's/^/    /' "$out/overhead.log"
