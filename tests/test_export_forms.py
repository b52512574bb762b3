"""export.py's graph forms: ONNX and AIR get the zero-padding stem max pool (``MaxPoolPad1``),
MindIR keeps the network as built, and choosing AIR prints its deprecation note."""
import mindspore as ms
import numpy as np
import pytest

import export
from src.deploy import inference
from src.deploy.formats import AIR_NOTE, FORMATS, SUFFIXES, export_model
from src.models.resnet import create_network
from src.models.stem_pool import MaxPoolPad1
from src.utils import device
from src.utils.cli import run_entry_point
from src.utils.config import load_schema

ARGS = ["--config_path", "configs/resnet18_cifar10.yaml", "--batch_size", "2",
        "--eval_image_size", "32", "--fold_bn", "false"]


@pytest.fixture
def exported(monkeypatch):
    """Record (format, stem pool cell) per export call instead of writing files."""
    calls = []

    def record(file_format):
        def write(net, *inputs, file_name, **kwargs):
            fmt = kwargs.get("file_format", file_format)
            calls.append((fmt, net.maxpool))
            suffix = "" if file_name.endswith(SUFFIXES[fmt]) else SUFFIXES[fmt]  # as MindSpore
            with open(file_name + suffix, "w") as f:
                f.write("stand-in")  # for export.py's check that a file was written
        return write
    monkeypatch.setattr(ms, "export", record(None))
    monkeypatch.setattr(ms.onnx, "export", record("ONNX"))
    return calls


@pytest.mark.parametrize("file_format,swapped", [("ONNX", True), ("AIR", True),
                                                 ("MINDIR", False)])
def test_export_swaps_the_stem_pool_for_onnx_and_air(exported, file_format, swapped, tmp_path):
    net = create_network("resnet18", class_num=10)
    built = net.maxpool
    dummy = ms.Tensor(np.zeros((1, 3, 32, 32), np.float32))
    export_model(net, dummy, str(tmp_path / "unused"), file_format)
    [(fmt, pool)] = exported
    assert fmt == file_format
    assert isinstance(pool, MaxPoolPad1) if swapped else pool is built


def test_air_export_prints_the_deprecation_note(exported, monkeypatch, capsys, tmp_path):
    # Ascend stood in for: no device set up, a fresh network instead of a checkpoint
    monkeypatch.setattr(device, "setup_device", lambda *args, **kwargs: None)
    monkeypatch.setattr(inference, "load_network",
                        lambda *args, **kwargs: create_network("resnet18", class_num=10))
    with pytest.raises(SystemExit) as stop:
        run_entry_point(export.main, [*ARGS, "--device_target", "Ascend", "--file_format",
                                      "AIR", "--checkpoint_path", "unused.ckpt",
                                      "--file_name", str(tmp_path / "model")])
    assert stop.value.code == 0
    out, err = capsys.readouterr()
    assert [line for line in err.splitlines() if "AIR" in line] == [AIR_NOTE]
    assert "deprecated" in AIR_NOTE and "MINDIR" in AIR_NOTE
    assert ".air" in out and [fmt for fmt, _ in exported] == ["AIR"]
    assert isinstance(exported[0][1], MaxPoolPad1)


def test_air_note_also_precedes_the_off_ascend_error(capsys):
    with pytest.raises(SystemExit) as stop:
        run_entry_point(export.main, [*ARGS, "--device_target", "CPU", "--file_format", "AIR",
                                      "--checkpoint_path", "unused.ckpt"])
    assert stop.value.code == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0] == AIR_NOTE and "AIR needs device_target Ascend" in err[1]


def test_no_note_for_mindir(monkeypatch, capsys):
    monkeypatch.setattr(device, "setup_device", lambda *args, **kwargs: None)
    with pytest.raises(SystemExit) as stop:  # stops at the missing checkpoint
        run_entry_point(export.main, [*ARGS, "--file_format", "MINDIR", "--checkpoint_path",
                                      "missing.ckpt"])
    assert stop.value.code == 2
    assert "deprecated" not in capsys.readouterr().err


def test_the_file_format_choices_are_the_registered_formats():
    """config.yaml's ``file_format`` choices and ``src.deploy.formats.FORMATS`` name the same
    formats: a format added to one is added to the other."""
    _, _, choices = load_schema()
    assert sorted(choices["file_format"]) == sorted(FORMATS)


@pytest.mark.slow  # a real ONNX export
def test_a_file_name_with_its_suffix_is_written_once_and_another_formats_is_refused(tmp_path):
    """``--file_name m.onnx`` writes m.onnx (it wrote m.onnx.onnx), ``M.ONNX`` likewise;
    ``--file_format ONNX --file_name m.mindir`` is refused by name before any export."""
    from tests.helpers import run_in_process, succeeded

    ckpt = str(tmp_path / "r18.ckpt")
    ms.save_checkpoint(create_network("resnet18", class_num=10), ckpt)
    for given in ("m.onnx", "n.ONNX"):
        succeeded(run_in_process("export.py", *ARGS, "--checkpoint_path", ckpt, "--file_format",
                                 "ONNX", "--file_name", tmp_path / given))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx", "n.onnx", "r18.ckpt"]
    assert export.export_stem("out/m.v2", "ONNX") == "out/m.v2"  # another dot: kept
    refused = run_in_process("export.py", *ARGS, "--checkpoint_path", ckpt, "--file_format",
                             "ONNX", "--file_name", tmp_path / "m.mindir")
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert (f"file_name {tmp_path / 'm.mindir'} ends in .mindir, a MINDIR file, but file_format "
            f"ONNX writes .onnx") in refused.stderr
    assert not (tmp_path / "m.mindir.onnx").exists()
