#!/usr/bin/env bash
# Create (once) and activate the virtual environment .venv at the repository root, then install
# the requirements files given as arguments. Sourced by the other scripts:
#   source scripts/setup_env.sh requirements.txt [requirements-dev.txt]
# Needs Python 3.11 (the version the README requires and the tests run on): .venv is created by
# python3, or by the interpreter named in PYTHON (e.g. PYTHON=python3.11 bash scripts/run_tests.sh);
# any other version is an error before anything is installed.
# Set USE_CURRENT_PYTHON=1 to install into the active Python environment (`python`) instead.
set -euo pipefail
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
REQUIRED_PYTHON="3.11"

# Exit with status 2 and a message unless interpreter $1 is Python $REQUIRED_PYTHON; the other
# arguments say what to do about it.
_require_python() {
    local version="" pattern='^Python ([0-9]+\.[0-9]+)'
    if command -v "$1" >/dev/null 2>&1; then
        version="$("$1" --version 2>&1 || true)"
    fi
    if [[ "$version" =~ $pattern ]] && [[ "${BASH_REMATCH[1]}" == "$REQUIRED_PYTHON" ]]; then
        return 0
    fi
    echo "setup_env.sh: error: Python $REQUIRED_PYTHON is required, but $1 is" \
         "${version:-not found}. ${*:2}" >&2
    exit 2
}

if [[ "${USE_CURRENT_PYTHON:-0}" == "1" ]]; then
    _require_python python "Activate a Python $REQUIRED_PYTHON environment, or unset" \
        "USE_CURRENT_PYTHON to have .venv created."
else
    if [[ ! -x "$REPO_ROOT/.venv/bin/python" ]]; then
        _require_python "${PYTHON:-python3}" "Install Python $REQUIRED_PYTHON and name it in" \
            "PYTHON (e.g. PYTHON=python$REQUIRED_PYTHON), which then creates .venv."
        "${PYTHON:-python3}" -m venv "$REPO_ROOT/.venv"
    fi
    _require_python "$REPO_ROOT/.venv/bin/python" "Delete $REPO_ROOT/.venv to have it created" \
        "again with Python $REQUIRED_PYTHON."
    # shellcheck disable=SC1091
    source "$REPO_ROOT/.venv/bin/activate"
fi
# One pip call for all files: pip resolves their pins together (installing them one after
# another let requirements-dev.txt's packages upgrade numpy past requirements.txt's numpy<2).
if [[ $# -gt 0 ]]; then
    _requirements=()
    for req in "$@"; do
        _requirements+=(-r "$REPO_ROOT/$req")
    done
    python -m pip install --disable-pip-version-check -q "${_requirements[@]}"
fi
