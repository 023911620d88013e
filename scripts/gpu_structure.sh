#!/usr/bin/env bash
# gpu_structure.sh: the GPU machine's checks after issue 33's restructuring of the reader (layout.rs
# types only; the ceiling, the counting and the scope protocol in their own modules; layout 3.0, 4.0 since the one scope protocol) and
# of the CLI (run, kernel install, top, plot in steps; the exporter as serve / metrics):
#   1. the installed package's layout version is 4.0 and the segment a CUDA process writes says so;
#   2. exactness against the frameworks' own counters (scripts/gpu_check.py): must be unchanged;
#   3. `gpumemhook run` under a ceiling and an emulated card: the summary's lines, the refusal
#      counted, the exit status the program's own;
#   4. `gpumemhook run --trace` then `gpumemhook plot` (SVG and PNG) of the timeline;
#   5. `gpumemhook ls --json` and `gpumemhook exporter --once` while a PyTorch process holds
#      memory: its used bytes in both, equal to what it reads itself.
# Expects the wheel under dist/ (scripts/gpu-dist). STEPS="1 3" runs only those steps (all by
# default). Prints a short table last; with OUT set, keeps the logs there.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-/tmp/gpu_structure}"
mkdir -p "$out"
source scripts/gpu-install-wheel
cli="$PYTHONPATH"
cli="${cli%%:*}/gpumemhook/bin/gpumemhook"
steps=" ${STEPS:-1 2 3 4 5} "
step() { [[ $steps == *" $1 "* ]]; }
declare -A result

# 1. The layout version: the package's constants, and the header of a live CUDA process's segment.
if step 1; then
    echo "== 1. layout version"
    LD_PRELOAD="$GPUMEMHOOK_LIB" timeout 120 python3 - >"$out/version.log" 2>&1 <<'EOF'
import gpumemhook, gpumemhook._native as n, torch
x = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
torch.cuda.synchronize()
print("constants", n.LAYOUT_MAJOR, n.LAYOUT_MINOR)
import glob, os, struct
path = glob.glob(f"/dev/shm/gpumemhook-{os.getuid()}-{os.getpid()}")[0]
with open(path, "rb") as f:
    head = f.read(16)
print("segment", *struct.unpack_from("<II", head, 8))
EOF
    cat "$out/version.log"
    grep -q "^constants 4 0$" "$out/version.log" && grep -q "^segment 4 0$" "$out/version.log" \
        && result[1]=ok || result[1]=FAILED
fi

# 2. Exactness, unchanged by the reader's split.
if step 2; then
    echo "== 2. exactness (gpu_check.py)"
    timeout 300 python3 scripts/gpu_check.py >"$out/check.log" 2>&1
    rc=$?
    tail -25 "$out/check.log"
    [[ $rc == 0 ]] && ! grep -q "^FAILED" "$out/check.log" && result[2]=ok || result[2]="FAILED (exit $rc)"
fi

# 3. run under a ceiling, then under an emulated card: the summary, the refusal, the exit status.
if step 3; then
    echo "== 3. gpumemhook run --limit / --emulate"
    prog='import torch, sys
a = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
try:
    b = torch.empty(2 << 30, dtype=torch.uint8, device="cuda")
except torch.OutOfMemoryError:
    print("refused", flush=True)
sys.exit(3)'
    timeout 120 "$cli" --color never run --limit 2GiB -- python3 -c "$prog" >"$out/run.log" 2>&1
    rc=$?
    timeout 120 "$cli" --color never run --emulate t4 -- python3 -c 'import torch; torch.empty(1 << 30, dtype=torch.uint8, device="cuda")' >"$out/emulate.log" 2>&1
    rc_emulate=$?
    cat "$out/run.log" "$out/emulate.log"
    if [[ $rc == 3 && $rc_emulate == 0 ]] && grep -q "^refused$" "$out/run.log" \
        && grep -q "ceiling: 2.00 GiB per device" "$out/run.log" \
        && grep -q "refused by the ceiling" "$out/run.log" \
        && grep -q "emulated card: " "$out/emulate.log"; then
        result[3]=ok
    else
        result[3]="FAILED (exit $rc, $rc_emulate)"
    fi
fi

# 4. A timeline, drawn.
if step 4; then
    echo "== 4. run --trace, plot"
    rm -f "$out/t.json" "$out/t.svg" "$out/t.png"
    timeout 120 "$cli" --color never run --trace "$out/t.json" -- python3 -c 'import torch
import gpumemhook
with gpumemhook.scope("step"):
    x = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    del x' >"$out/trace.log" 2>&1
    "$cli" plot "$out/t.json" -o "$out/t.svg" >>"$out/trace.log" 2>&1 &&
        "$cli" plot "$out/t.json" -o "$out/t.png" >>"$out/trace.log" 2>&1
    rc=$?
    cat "$out/trace.log"
    [[ $rc == 0 && -s "$out/t.png" ]] && grep -q "<svg" "$out/t.svg" && grep -q "scopes opened" "$out/trace.log" \
        && result[4]=ok || result[4]="FAILED (exit $rc)"
fi

# 5. ls and the exporter see a live process's memory as it sees it itself.
if step 5; then
    echo "== 5. ls --json, exporter --once"
    LD_PRELOAD="$GPUMEMHOOK_LIB" python3 -c 'import torch, gpumemhook, time, sys
x = torch.empty(300 << 20, dtype=torch.uint8, device="cuda")
torch.cuda.synchronize()
s = gpumemhook.stats(0)
used = s["used"] if isinstance(s, dict) else s.used
print(used, flush=True)
time.sleep(20)' >"$out/holder.log" 2>&1 &
    holder=$!
    for _ in $(seq 1 100); do [[ -s "$out/holder.log" ]] && break; sleep 0.2; done
    used="$(head -1 "$out/holder.log")"
    "$cli" ls --json >"$out/ls.json" 2>&1
    "$cli" exporter --once >"$out/metrics.txt" 2>&1
    kill "$holder" 2>/dev/null
    wait "$holder" 2>/dev/null
    echo "the process reads used = $used"
    grep "gpumemhook_used_bytes{.*pid=\"$holder\"" "$out/metrics.txt"
    if [[ -n $used ]] && grep -q "\"used\": *$used\b\|\"used\":$used\b" "$out/ls.json" \
        && grep -q "gpumemhook_used_bytes{.*pid=\"$holder\".*} $used$" "$out/metrics.txt"; then
        result[5]=ok
    else
        result[5]=FAILED
    fi
fi

echo
echo "step  check                                         result"
names=([1]="layout 4.0 in the package and the segment" [2]="exactness (gpu_check.py)"
    [3]="run --limit / --emulate summary and status" [4]="run --trace, plot svg/png"
    [5]="ls --json and exporter --once: used bytes")
for n in 1 2 3 4 5; do
    step "$n" && printf '%-5s %-45s %s\n' "$n" "${names[$n]}" "${result[$n]:-not run}"
done
