#!/usr/bin/env bash
# Export a checkpoint to MINDIR, ONNX or AIR (AIR on Ascend only).
#   bash scripts/run_export.sh DEVICE_TARGET CHECKPOINT_PATH FILE_FORMAT FILE_NAME [export.py args...]
set -euo pipefail
usage() { echo "usage: bash $0 DEVICE_TARGET(Ascend|GPU|CPU) CHECKPOINT_PATH FILE_FORMAT(MINDIR|ONNX|AIR) FILE_NAME [export.py args...]" >&2; exit 2; }
[[ $# -ge 4 ]] || usage
DEVICE_TARGET="$1"; CHECKPOINT_PATH="$2"; FILE_FORMAT="$3"; FILE_NAME="$4"; shift 4
[[ "$DEVICE_TARGET" =~ ^(Ascend|GPU|CPU)$ && "$FILE_FORMAT" =~ ^(MINDIR|ONNX|AIR)$ ]] || usage
REPO_ROOT="$(cd "$(dirname "$0")/.." && pwd)"
python "$REPO_ROOT/export.py" --device_target "$DEVICE_TARGET" --checkpoint_path "$CHECKPOINT_PATH" \
    --file_format "$FILE_FORMAT" --file_name "$FILE_NAME" "$@"
