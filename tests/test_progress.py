"""Progress of long work: a tqdm bar on a terminal, plain lines otherwise (src/utils/progress.py),
and the lines eval.py writes when its output is not a terminal."""
import io
import os

import mindspore as ms
import pytest

from src.data import image_check
from src.models.resnet import create_network
from src.utils.progress import Progress, format_eta
from tests.helpers import ROOT, copy_class_folders, run_in_process

SAMPLE = os.path.join(ROOT, "data", "cifar10_sample")


class FakeClock:
    """A clock the test moves by hand: no timing in the assertions."""

    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


class FakeTerminal(io.StringIO):
    """A text stream that says it is a terminal."""

    def isatty(self):
        return True


def test_format_eta():
    assert format_eta(0) == "0:00:00"
    assert format_eta(3725.4) == "1:02:05"
    assert format_eta(90000) == "25:00:00"
    assert format_eta(None) == "unknown"


def test_lines_when_not_a_terminal_first_periodic_and_last():
    clock, stream = FakeClock(), io.StringIO()
    with Progress(100, "eval", stream=stream, interval_s=10, fraction=0.25,
                  clock=clock) as progress:
        for seconds, count in ((1, 10),    # first update: a line
                               (1, 10),    # 20 done, 2 s: nothing due
                               (12, 10),   # 30 done, 14 s: 12 s since the last line
                               (1, 25),    # 55 done: a quarter of 100 since the last line
                               (1, 5),     # 60 done, 1 s and 5 images later: nothing
                               (1, 5)):    # 65 done: nothing; the end writes the last line
            clock.now += seconds
            progress.update(count)
    assert stream.getvalue().splitlines() == [
        "eval: 10/100 images, 10.0 img/s, ETA 0:00:09",
        "eval: 30/100 images, 2.1 img/s, ETA 0:00:33",
        "eval: 55/100 images, 3.7 img/s, ETA 0:00:12",
        "eval: 65/100 images, 3.8 img/s, ETA 0:00:09",
    ]
    assert "\r" not in stream.getvalue()


def test_the_last_line_is_not_repeated_and_write_goes_to_stdout(capsys):
    clock, stream = FakeClock(), io.StringIO()
    with Progress(4, "predict", stream=stream, clock=clock) as progress:
        clock.now += 2
        progress.write("result line")
        progress.update(4)
    assert stream.getvalue().splitlines() == ["predict: 4/4 images, 2.0 img/s, ETA 0:00:00"]
    assert capsys.readouterr().out == "result line\n"


def test_a_terminal_gets_a_tqdm_bar_and_no_lines():
    stream = FakeTerminal()
    with Progress(10, "eval", stream=stream) as progress:
        for _ in range(7):
            progress.update(1)
        progress.write("a result", file=stream)
        progress.update(3)
    text = stream.getvalue()
    assert "\r" in text and "img/s" in text and "10/10" in text and "a result" in text
    assert "images, " not in text  # none of the plain lines


def test_quiet_shows_nothing_on_either_stream():
    for stream in (io.StringIO(), FakeTerminal()):
        with Progress(3, "image check", stream=stream, quiet=True) as progress:
            progress.update(3)
        assert stream.getvalue() == "" and progress.done == 3


def test_a_large_image_check_shows_progress(tmp_path, monkeypatch, capsys):
    folder = copy_class_folders(os.path.join(SAMPLE, "test"), str(tmp_path / "data"), 2,
                                classes=["cat", "dog"])
    monkeypatch.setattr(image_check, "PROGRESS_MIN_FILES", 3)
    assert image_check.check_image_folder(folder) == ["cat", "dog"]
    assert "image check: 4/4 images" in capsys.readouterr().err


@pytest.mark.slow
def test_eval_py_writes_progress_lines_when_not_a_terminal(tmp_path):
    ckpt = str(tmp_path / "r18.ckpt")
    ms.save_checkpoint(create_network("resnet18", class_num=10), ckpt)
    result = run_in_process("eval.py", "--config_path", "configs/quick_start.yaml",
                            "--num_parallel_workers", "1", "--checkpoint_path", ckpt,
                            "--data_path", os.path.join(SAMPLE, "test"), "--batch_size", "50",
                            "--output_dir", tmp_path / "out")
    assert result.returncode == 0, result.stderr[-3000:]
    lines = [line for line in result.stderr.splitlines() if line.startswith("eval: ")]
    assert lines, result.stderr[-3000:]
    assert lines[0].startswith("eval: 50/200 images, ") and "img/s, ETA " in lines[0]
    assert lines[-1].startswith("eval: 200/200 images, ")
    assert "\r" not in result.stderr
