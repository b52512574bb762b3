#!/usr/bin/env bash
# Data-parallel training on GPUs (8 by default), with msrun, or mpirun where installed.
#   bash scripts/run_distribute_train_gpu.sh /data/imagenet/train config.yaml output/r50_gpu8p
#   bash scripts/run_distribute_train_gpu.sh --launcher mpirun /data/imagenet/train config.yaml output/r50_gpu8p
set -euo pipefail
DEVICE_TARGET=GPU
DEFAULT_DEVICE_NUM=8
LAUNCHER_HELP="  --launcher L          msrun (default) or mpirun"
ALLOWED_LAUNCHERS="msrun mpirun"
source "$(dirname "$0")/launch_lib.sh"
parse_launch_args "$@"
launch
