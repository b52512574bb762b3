#!/usr/bin/env bash
# Install the requirements into .venv and run the test suite (CPU, about 8-9 minutes on 2 cores).
# Needs the real test images in ../shared/data beside the repository.
#   bash scripts/run_tests.sh [pytest arguments]
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup_env.sh requirements.txt requirements-dev.txt
python -m pytest -q "$@"
