#!/usr/bin/env bash
# Single-device training on Ascend, GPU or CPU.
#   bash scripts/run_standalone_train.sh DEVICE_TARGET DATA_PATH [OUTPUT_DIR] [train.py args...]
# e.g. bash scripts/run_standalone_train.sh GPU /data/imagenet/train output/r50 --device_id 1
set -euo pipefail
usage() { echo "usage: bash $0 DEVICE_TARGET(Ascend|GPU|CPU) DATA_PATH [OUTPUT_DIR] [train.py args...]" >&2; exit 2; }
[[ $# -ge 2 ]] || usage
DEVICE_TARGET="$1"; DATA_PATH="$2"; shift 2
[[ "$DEVICE_TARGET" =~ ^(Ascend|GPU|CPU)$ ]] || usage
[[ -d "$DATA_PATH" ]] || { echo "error: DATA_PATH $DATA_PATH is not a folder" >&2; exit 2; }
OUTPUT_DIR="./output/standalone_${DEVICE_TARGET,,}"
if [[ $# -ge 1 && "$1" != --* ]]; then OUTPUT_DIR="$1"; shift; fi
REPO_ROOT="$(cd "$(dirname "$0")/.." && pwd)"
mkdir -p "$OUTPUT_DIR"
python "$REPO_ROOT/train.py" --device_target "$DEVICE_TARGET" --data_path "$DATA_PATH" \
    --output_dir "$OUTPUT_DIR" "$@" 2>&1 | tee "$OUTPUT_DIR/stdout.log"
