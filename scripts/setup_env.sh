#!/usr/bin/env bash
# Create (once) and activate the virtual environment .venv at the repository root, then install
# the requirements given as arguments. Sourced by the other scripts:
#   source scripts/setup_env.sh requirements.txt [requirements-dev.txt]
# Set USE_CURRENT_PYTHON=1 to install into the active Python environment instead.
set -euo pipefail
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [[ "${USE_CURRENT_PYTHON:-0}" != "1" ]]; then
    if [[ ! -x "$REPO_ROOT/.venv/bin/python" ]]; then
        python3 -m venv "$REPO_ROOT/.venv"
    fi
    # shellcheck disable=SC1091
    source "$REPO_ROOT/.venv/bin/activate"
fi
for req in "$@"; do
    python -m pip install --disable-pip-version-check -q -r "$REPO_ROOT/$req"
done
