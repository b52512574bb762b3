"""Exports are written whole or not at all: a failed ONNX, MindIR or int8 export (here a full
disk) exits 4 naming the cause and leaves the earlier file as it was."""
import os
import subprocess
import sys

import mindspore as ms
import pytest

from src.models.resnet import create_network
from tests.helpers import ROOT, run_entry

EARLIER = b"the earlier, good export"
COMMON = ["--config_path", "configs/quick_start.yaml", "--batch_size", "1"]


@pytest.fixture(scope="module")
def r18_ckpt(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("ckpt") / "r18.ckpt")
    ms.save_checkpoint(create_network("resnet18", 10), path)
    return path


def full_disk():
    """``preexec_fn``: no file may grow past 1 MB (a ResNet-18 export is 45 MB); a write past
    it fails with EFBIG (SIGXFSZ ignored)."""
    import resource
    import signal
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))


@pytest.mark.slow
@pytest.mark.parametrize("file_format, suffix, extra", [
    ("ONNX", ".onnx", []), ("MINDIR", ".mindir", []),
    ("ONNX", ".onnx", ["--quantize", "int8", "--calibration_images", "8",
                       "--calibration_data_path", os.path.join(ROOT, "data", "cifar10_sample",
                                                               "train")])])
def test_a_failed_export_exits_4_and_keeps_the_earlier_file(tmp_path, r18_ckpt, file_format,
                                                             suffix, extra):
    out = tmp_path / "models"
    out.mkdir()
    (out / f"model{suffix}").write_bytes(EARLIER)
    result = subprocess.run(
        [sys.executable, "export.py", *COMMON, "--checkpoint_path", r18_ckpt, "--file_format",
         file_format, "--file_name", str(out / "model"), *extra], cwd=ROOT, text=True,
        capture_output=True, preexec_fn=full_disk, timeout=600)
    assert result.returncode == 4, result.stdout[-1500:] + result.stderr[-1500:]
    assert "export.py: error:" in result.stderr and "exported" not in result.stdout
    assert any(cause in result.stderr for cause in ("export wrote no", "File too large"))
    assert (out / f"model{suffix}").read_bytes() == EARLIER
    assert os.listdir(out) == [f"model{suffix}"]  # no temporary file left


def test_an_export_folder_that_is_a_file_is_named_before_exporting(tmp_path, r18_ckpt):
    (tmp_path / "models").write_text("a file")
    result = run_entry("export.py", *COMMON, "--checkpoint_path", r18_ckpt, "--file_name",
                       tmp_path / "models" / "model")
    assert result.returncode == 2
    assert f"file_name's folder {tmp_path / 'models'} is a file, not a folder" in result.stderr
