#!/usr/bin/env bash
# Install the requirements into .venv, lint (ruff, settings in pyproject.toml), then run the test
# suite: all of it by default (what CI runs), or with -m "not slow" the fast tier for the edit
# loop (no whole training runs, msrun launches, exports or PyTorch parity runs). Times and
# counts by CPU: docs/tests.md.
# Runs on the real images shipped in data/. The few large real-data checks also read
# ../shared/data beside the repository: without it they are skipped, each with its reason in
# the summary (with CI=true they fail instead).
#   bash scripts/run_tests.sh [pytest arguments]      e.g. -m "not slow", tests/test_resume.py
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup_env.sh requirements.txt requirements-dev.txt
python -m ruff check .
# Two worker processes (pytest-xdist), each test file on one of them: a file's module fixtures
# are built once. TEST_WORKERS=0 runs everything in this process (e.g. with -s to see prints).
python -m pytest -q -n "${TEST_WORKERS:-2}" --dist loadfile "$@"
