#!/usr/bin/env bash
# gpu_round.sh: this round's GPU checks in one call, from the repository root, with the wheel under
# dist/ (scripts/wheels --arch x86_64 --no-sdist-build; copy it there):
#
#   scripts/gpu_round.sh fit      # issue 32: GPT-2's largest batch on T4, L4, A100 40 GB, peaks vs bisection
#   scripts/gpu_round.sh view     # issue 35: the page of a GPT-2 training run (scripts/gpu_view.sh)
#   scripts/gpu_round.sh group    # issue 34: two PyTorch processes in one group under --emulate t4
#   scripts/gpu_round.sh pitch    # issue 33: a pitched allocation refused where a plain one is, on a T4
#   scripts/gpu_round.sh structure  # issue 33: layout 3.0, exactness, run/plot/ls/exporter after the split
#   scripts/gpu_round.sh fitgroup  # issue 34: fit of a two-process PyTorch program on a T4, against one process
#
# Several names run in that order. Logs go under $OUT (the device tool brings them back); each
# check prints its own short table last.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu-install-wheel
export OUT="${OUT:-/tmp/gpu_round}"
mkdir -p "$OUT"
echo "== $(date -u '+%Y-%m-%d %H:%M UTC'), $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)"
python3 -c 'import torch; print("torch", torch.__version__)'
for check in "$@"; do
    case "$check" in
    fit) timeout 560 python3 scripts/gpu_fit.py --mode search 2>&1 | tee "$OUT/fit.log" | tail -25 ;;
    view) OUT="$OUT" timeout 400 scripts/gpu_view.sh 2>&1 | tee "$OUT/view.log" | tail -25 ;;
    group) GPUMEMHOOK_CLI="${PYTHONPATH%%:*}/gpumemhook/bin/gpumemhook" timeout 300 \
        python3 scripts/gpu_group.py 2>&1 | tee "$OUT/group.log" | tail -25 ;;
    pitch) timeout 200 python3 scripts/gpu_pitch_refusal.py t4 2>&1 | tee "$OUT/pitch.log" | tail -12 ;;
    structure) OUT="$OUT/structure" timeout 400 scripts/gpu_structure.sh 2>&1 | tee "$OUT/structure.log" | tail -15 ;;
    fitgroup) timeout 500 python3 scripts/gpu_fit_group.py 2>&1 | tee "$OUT/fitgroup.log" | tail -8 ;;
    *) echo "gpu_round.sh: no check named $check" >&2; exit 2 ;;
    esac
done
