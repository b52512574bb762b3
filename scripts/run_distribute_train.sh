#!/usr/bin/env bash
# Data-parallel training on Ascend (8 devices by default), with msrun (or a legacy HCCL rank table).
#   bash scripts/run_distribute_train.sh /data/imagenet/train config.yaml output/r50_8p
#   bash scripts/run_distribute_train.sh --bind_core true /data/imagenet/train config.yaml output/r50_8p
#   bash scripts/run_distribute_train.sh --rank_table_file hccl_8p.json /data/imagenet/train config.yaml output/r50_8p
# Arguments after OUTPUT_DIR go to train.py (e.g. --epoch_size 90 --run_eval true ...).
set -euo pipefail
DEVICE_TARGET=Ascend
DEFAULT_DEVICE_NUM=8
LAUNCHER_HELP="  --rank_table_file F   legacy: launch one process per device from an HCCL rank table
                        (else msrun); also read from the RANK_TABLE_FILE environment variable"
ALLOWED_LAUNCHERS="msrun rank_table"
source "$(dirname "$0")/launch_lib.sh"
parse_launch_args "$@"
[[ -n "$RANK_TABLE_FILE" ]] && LAUNCHER=rank_table
launch
