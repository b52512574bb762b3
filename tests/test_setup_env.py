"""scripts/setup_env.sh: Python 3.11 or a clear error before anything is installed; all
requirement files in one pip call. Runs the script in a scratch copy of the repository layout
with fake interpreters first on PATH, which log their calls and install nothing."""
import os
import shutil
import subprocess

import pytest

from tests.helpers import ROOT

REQUIREMENTS = ["requirements.txt", "requirements-dev.txt"]

FAKE_PYTHON = """#!/usr/bin/env bash
# A fake interpreter that reports Python {version} and only logs any other call.
echo "$0 $*" >> "$FAKE_LOG"
if [[ "$1" == "--version" ]]; then
    echo "Python {version}"
elif [[ "$1" == "-m" && "$2" == "venv" ]]; then  # a venv whose python is this fake again
    mkdir -p "$3/bin"
    cp "$0" "$3/bin/python"
    echo "export PATH=\\"$3/bin:\\$PATH\\"" > "$3/bin/activate"
fi
"""


def write_fake(path, version):
    """A fake interpreter at ``path`` that reports ``version``."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(FAKE_PYTHON.format(version=version))
    os.chmod(path, 0o755)


@pytest.fixture()
def scratch(tmp_path):
    """A repository layout holding setup_env.sh and empty requirement files, a folder of fake
    interpreters, and a runner of the script with that folder first on PATH."""
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    shutil.copy(os.path.join(ROOT, "scripts", "setup_env.sh"), repo / "scripts")
    for name in REQUIREMENTS:
        (repo / name).write_text("")
    bin_dir, log = tmp_path / "bin", tmp_path / "calls.log"
    bin_dir.mkdir()
    log.write_text("")

    def run(**env_vars):
        env = {k: v for k, v in os.environ.items()
               if k not in ("USE_CURRENT_PYTHON", "PYTHON", "VIRTUAL_ENV")}
        env.update(env_vars, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
                   FAKE_LOG=str(log))
        result = subprocess.run(["bash", str(repo / "scripts" / "setup_env.sh"), *REQUIREMENTS],
                                env=env, capture_output=True, text=True, timeout=60,
                                check=False)
        return result, log.read_text().splitlines()

    return {"repo": repo, "bin": bin_dir, "run": run}


def only_version_queries(calls):
    return all(line.endswith(" --version") for line in calls)


@pytest.mark.parametrize("version", ["3.10.12", "3.12.3"])
def test_python3_of_another_version_is_a_clear_error_and_no_venv_is_made(scratch, version):
    write_fake(scratch["bin"] / "python3", version)
    result, calls = scratch["run"]()
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Python 3.11 is required" in result.stderr and f"Python {version}" in result.stderr
    assert "PYTHON=python3.11" in result.stderr  # what to do about it
    assert calls and only_version_queries(calls), calls  # no venv, no pip
    assert not (scratch["repo"] / ".venv").exists()


def test_current_python_of_another_version_is_a_clear_error(scratch):
    write_fake(scratch["bin"] / "python", "3.10.12")
    write_fake(scratch["bin"] / "python3", "3.11.9")  # not the one used with the flag
    result, calls = scratch["run"](USE_CURRENT_PYTHON="1")
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Python 3.11 is required, but python is Python 3.10.12" in result.stderr
    assert calls and only_version_queries(calls), calls


def test_an_existing_venv_of_another_version_is_named(scratch):
    write_fake(scratch["repo"] / ".venv" / "bin" / "python", "3.10.12")
    result, calls = scratch["run"]()
    assert result.returncode == 2, result.stdout + result.stderr
    assert f"Delete {scratch['repo'] / '.venv'}" in result.stderr
    assert calls and only_version_queries(calls), calls


def pip_calls(calls):
    return [line for line in calls if " -m pip install " in line]


def test_python_named_in_PYTHON_creates_the_venv_and_one_pip_call_installs_all(scratch):
    write_fake(scratch["bin"] / "python3", "3.10.12")
    write_fake(scratch["bin"] / "python3.11", "3.11.9")
    result, calls = scratch["run"](PYTHON="python3.11")
    assert result.returncode == 0, result.stdout + result.stderr
    assert any(line.endswith(f"-m venv {scratch['repo'] / '.venv'}") for line in calls), calls
    repo = scratch["repo"]
    installs = pip_calls(calls)
    assert len(installs) == 1, calls
    assert installs[0].startswith(str(repo / ".venv" / "bin" / "python"))  # inside the venv
    assert installs[0].endswith(f"-r {repo / REQUIREMENTS[0]} -r {repo / REQUIREMENTS[1]}")


def test_current_python_3_11_gets_one_pip_call_for_all_files(scratch):
    write_fake(scratch["bin"] / "python", "3.11.9")
    result, calls = scratch["run"](USE_CURRENT_PYTHON="1")
    assert result.returncode == 0, result.stdout + result.stderr
    installs = pip_calls(calls)
    assert len(installs) == 1, calls
    assert installs[0].endswith(f"-r {scratch['repo'] / REQUIREMENTS[0]} "
                                f"-r {scratch['repo'] / REQUIREMENTS[1]}")
    assert not (scratch["repo"] / ".venv").exists()
