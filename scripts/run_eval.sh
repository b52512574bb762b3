#!/usr/bin/env bash
# Evaluate a checkpoint (top-1/top-5) on Ascend, GPU or CPU.
#   bash scripts/run_eval.sh DEVICE_TARGET DATA_PATH CHECKPOINT_PATH [eval.py args...]
set -euo pipefail
usage() { echo "usage: bash $0 DEVICE_TARGET(Ascend|GPU|CPU) DATA_PATH CHECKPOINT_PATH [eval.py args...]" >&2; exit 2; }
[[ $# -ge 3 ]] || usage
DEVICE_TARGET="$1"; DATA_PATH="$2"; CHECKPOINT_PATH="$3"; shift 3
[[ "$DEVICE_TARGET" =~ ^(Ascend|GPU|CPU)$ ]] || usage
REPO_ROOT="$(cd "$(dirname "$0")/.." && pwd)"
python "$REPO_ROOT/eval.py" --device_target "$DEVICE_TARGET" --data_path "$DATA_PATH" \
    --checkpoint_path "$CHECKPOINT_PATH" "$@"
