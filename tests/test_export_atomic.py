"""Exports are written whole or not at all: a failed ONNX, MindIR or int8 export (here a full
disk) exits 4 naming the cause and leaves the earlier file as it was."""
import json
import os
import subprocess
import sys

import mindspore as ms
import pytest

from src.models.resnet import create_network
from tests.helpers import ROOT, file_size_limit, run_in_process

EARLIER = b"the earlier, good export"
COMMON = ["--config_path", "configs/quick_start.yaml", "--batch_size", "1"]


@pytest.fixture(scope="module")
def r18_ckpt(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("ckpt") / "r18.ckpt")
    ms.save_checkpoint(create_network("resnet18", class_num=10), path)
    return path


# export.py's cases on a full disk: (file format, suffix, more arguments)
CASES = {"ONNX": ("ONNX", ".onnx", []), "MINDIR": ("MINDIR", ".mindir", []),
         "int8 ONNX": ("ONNX", ".onnx", ["--quantize", "int8", "--calibration_images", "8",
                                         "--calibration_data_path",
                                         os.path.join(ROOT, "data", "cifar10_sample", "train")])}
# Runs each argument list of argv[1] (JSON) through tests.helpers.run_in_process, one after the
# other in this interpreter; any other exception: its traceback and status 1, as the interpreter
# would end; prints each run's exit status, stdout and stderr as JSON.
EXPORTS = """
import json, sys, traceback
from tests.helpers import run_in_process
results = []
for argv in json.loads(sys.argv[1]):
    try:
        done = run_in_process("export.py", *argv)
        results.append({"returncode": done.returncode, "stdout": done.stdout,
                        "stderr": done.stderr})
    except Exception:
        results.append({"returncode": 1, "stdout": "", "stderr": traceback.format_exc()})
print(json.dumps(results))
"""


@pytest.fixture(scope="module")
def full_disk_exports(tmp_path_factory, r18_ckpt):
    """Each case of ``CASES`` exported on a full disk (files capped at 1 MB; a ResNet-18 export
    is 45 MB) into a folder of its own that holds an earlier file of that name: the three
    exports in one fresh interpreter (the limit is set on a process), one after the other.

    Returns:
        dict: case -> (its folder, its run's ``returncode``, ``stdout`` and ``stderr``).
    """
    root = tmp_path_factory.mktemp("full_disk")
    folders, runs = {}, []
    for case, (file_format, suffix, extra) in CASES.items():
        folders[case] = root / case.replace(" ", "_")
        folders[case].mkdir()
        (folders[case] / f"model{suffix}").write_bytes(EARLIER)
        runs.append([*COMMON, "--checkpoint_path", r18_ckpt, "--file_format", file_format,
                     "--file_name", str(folders[case] / "model"), *extra])
    result = subprocess.run([sys.executable, "-c", EXPORTS, json.dumps(runs)], cwd=ROOT,
                            text=True, capture_output=True,
                            preexec_fn=file_size_limit(1 << 20), timeout=900)
    assert result.returncode == 0, result.stdout[-1500:] + result.stderr[-1500:]
    reports = json.loads(result.stdout.strip().splitlines()[-1])
    return {case: (folders[case], report) for case, report in zip(CASES, reports)}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_a_failed_export_exits_4_and_keeps_the_earlier_file(full_disk_exports, case):
    out, result = full_disk_exports[case]
    suffix = CASES[case][1]
    assert result["returncode"] == 4, result["stdout"][-1500:] + result["stderr"][-1500:]
    assert "export.py: error:" in result["stderr"] and "exported" not in result["stdout"]
    assert any(cause in result["stderr"] for cause in ("export wrote no", "File too large"))
    assert (out / f"model{suffix}").read_bytes() == EARLIER
    assert os.listdir(out) == [f"model{suffix}"]  # no temporary file left


def test_an_export_folder_that_is_a_file_is_named_before_exporting(tmp_path, r18_ckpt):
    (tmp_path / "models").write_text("a file")
    result = run_in_process("export.py", *COMMON, "--checkpoint_path", r18_ckpt, "--file_name",
                            tmp_path / "models" / "model")
    assert result.returncode == 2
    assert f"file_name's folder {tmp_path / 'models'} is a file, not a folder" in result.stderr
