#!/usr/bin/env bash
# Data-parallel training on CPU with msrun: N local worker processes (2 by default).
#   bash scripts/run_distribute_train_cpu.sh data/cifar10_sample/train configs/quick_start.yaml output/cpu2p
# Two hosts (run on each, node_rank 0 on the master host):
#   bash scripts/run_distribute_train_cpu.sh --device_num 1 --worker_num 2 --node_rank 0 \
#       --master_addr HOST0 --master_port 8118 DATA CONFIG OUT
set -euo pipefail
DEVICE_TARGET=CPU
DEFAULT_DEVICE_NUM=2
LAUNCHER_HELP=""
ALLOWED_LAUNCHERS="msrun"
source "$(dirname "$0")/launch_lib.sh"
parse_launch_args "$@"
launch
