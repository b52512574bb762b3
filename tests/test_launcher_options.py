"""The distributed launchers' options as msrun receives them (a stand-in msrun records its
arguments; nothing is trained): msrun's core binding (``--bind_core``)."""
import os
import subprocess

import pytest

from tests.helpers import CIFAR_SAMPLE, ROOT


def launch(tmp_path, script, *options):
    """Run ``scripts/<script>`` with ``options`` and a stand-in msrun; (result, msrun argv or
    None when msrun was not started)."""
    argv_file = tmp_path / "msrun_argv"
    msrun = tmp_path / "msrun"
    msrun.write_text(f'#!/usr/bin/env bash\nprintf "%s\\n" "$@" > "{argv_file}"\n')
    msrun.chmod(0o755)
    result = subprocess.run(
        ["bash", os.path.join(ROOT, "scripts", script), *options,
         os.path.join(CIFAR_SAMPLE, "train"), "configs/quick_start.yaml", str(tmp_path / "out")],
        cwd=ROOT, env=dict(os.environ, MSRUN=str(msrun), RANK_TABLE_FILE=""),
        capture_output=True, text=True, timeout=60, check=False)
    argv = argv_file.read_text().splitlines() if argv_file.exists() else None
    return result, argv


def msrun_option(argv, name):
    """The value msrun got for ``name``, or None."""
    return argv[argv.index(name) + 1] if name in argv else None


@pytest.mark.parametrize("script", ["run_distribute_train.sh", "run_distribute_train_gpu.sh",
                                    "run_distribute_train_cpu.sh"])
def test_bind_core_reaches_msrun_only_when_asked(tmp_path, script):
    result, argv = launch(tmp_path, script)
    assert result.returncode == 0, result.stderr
    assert msrun_option(argv, "--bind_core") is None  # msrun's default: no binding
    for value, passed in (("true", "True"), ("False", "False"),
                          ('{"device0": ["0-7"], "device1": ["8-15"]}',
                           '{"device0": ["0-7"], "device1": ["8-15"]}')):
        result, argv = launch(tmp_path, script, "--bind_core", value)
        assert result.returncode == 0, result.stderr
        assert msrun_option(argv, "--bind_core") == passed
        # msrun's own options come before the script it starts
        assert argv.index("--bind_core") < next(i for i, a in enumerate(argv)
                                                if a.endswith("train.py"))


def test_bind_core_errors(tmp_path):
    result, argv = launch(tmp_path, "run_distribute_train.sh", "--bind_core", "yes")
    assert result.returncode == 2 and argv is None
    assert "bind_core must be true, false or a JSON object" in result.stderr
    table = tmp_path / "hccl.json"
    table.write_text("{}")
    result, argv = launch(tmp_path, "run_distribute_train.sh", "--rank_table_file", str(table),
                          "--bind_core", "true")
    assert result.returncode == 2 and argv is None
    assert "--bind_core is an msrun option" in result.stderr
