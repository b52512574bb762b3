#!/usr/bin/env bash
# Install the requirements into .venv, lint (ruff, settings in pyproject.toml), then run the test
# suite (CPU, about 15 minutes on 2 cores).
# Runs on the real images shipped in data/. The few large real-data checks also read
# ../shared/data beside the repository: without it they are skipped, each with its reason in
# the summary (with CI=true they fail instead).
#   bash scripts/run_tests.sh [pytest arguments]
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup_env.sh requirements.txt requirements-dev.txt
python -m ruff check .
python -m pytest -q "$@"
