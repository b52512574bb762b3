#!/usr/bin/env bash
# Install the requirements (with the PyTorch reference) into .venv and run the CPU benchmark:
# ours vs PyTorch, ResNet-50, batch 32, 224 px, about 40 minutes on 2 cores.
# Needs ../shared/data/imagenet_sample (or --data_path) beside the repository.
#   bash scripts/run_benchmark.sh [--update_docs] [benchmarks/cpu_benchmark.py arguments]
# (--update_docs rewrites the CPU speed table in docs/speed.md)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup_env.sh requirements.txt requirements-dev.txt
python benchmarks/cpu_benchmark.py "$@"
