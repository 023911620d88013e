#!/usr/bin/env bash
# gpu_view.sh: the GPU machine's check of `gpumemhook view` (issue 35): installs the wheel under
# dist/ (scripts/gpu-install-wheel), then scripts/gpu_view.py: the page of a GPT-2 training run, its
# figures against the exit report, its peak's flame graph naming transformers' lines and cuBLAS, the
# page (view.html), the report and, where chromium is installed, a screenshot (view.png) into $OUT.
# Prints a short table last.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu-install-wheel
export OUT="${OUT:-/tmp/gpu_view}"
echo "== $(date -u '+%Y-%m-%d %H:%M UTC'), $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)"
timeout 600 python3 scripts/gpu_view.py "$@"
