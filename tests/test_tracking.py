"""TensorBoard logging (``tensorboard true``, ``src/utils/tracking.py``), read back with
TensorBoard's own reader (``EventAccumulator``): the curves equal ``metrics.jsonl``, a resumed
run continues them without duplicated or missing steps, a failing writer changes nothing in
training, eval.py's confusion matrix decodes."""
import io
import json
import logging
import time
from pathlib import Path

import mindspore as ms
import numpy as np
import pytest
from PIL import Image
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from src.utils import device
from src.utils.tracking import TensorBoardLog
from tests.helpers import train_in_process

# ResNet-18, 32 px, 80 real images, batch 8: 10 steps per epoch, a checkpoint at each epoch's
# end, a progress line (and its TensorBoard scalars) every step
ARGS = ["--config_path", "configs/quick_start.yaml", "--train_image_size", "32",
        "--eval_image_size", "32", "--eval_resize", "32", "--batch_size", "8",
        "--save_checkpoint_epochs", "1", "--num_parallel_workers", "2", "--log_interval", "1"]


def read_events(folder):
    """TensorBoard's reader over ``folder``: {tag: [(step, value)]} of the scalars."""
    reader = EventAccumulator(str(folder), size_guidance={"scalars": 0, "images": 0})
    reader.Reload()
    return reader, {tag: [(e.step, e.value) for e in reader.Scalars(tag)]
                    for tag in reader.Tags()["scalars"]}


def train_here(cifar_small, out, *extra):
    """train.py with ``ARGS`` in the test process; asserts it exited 0."""
    assert train_in_process(*ARGS, "--data_path", cifar_small["train"], "--output_dir",
                            str(out), *extra) == 0


# ---- the writer alone ----

def test_a_resumed_writer_hides_the_steps_it_writes_again(tmp_path):
    """A writer opened with purge_step S (a run resumed after step S - 1) hides the events an
    earlier file holds at or after S: the reader sees every step once, in order."""
    first = TensorBoardLog(str(tmp_path))
    for step in range(1, 8):
        first.scalars(step, {"train/loss": 10.0 + step})
    first.close()
    time.sleep(1.1)  # event files are named by the second they were opened
    second = TensorBoardLog(str(tmp_path), purge_step=5)
    for step in range(5, 10):
        second.scalars(step, {"train/loss": 20.0 + step})
    second.close()
    _, scalars = read_events(tmp_path)
    assert [s for s, _ in scalars["train/loss"]] == list(range(1, 10))
    assert [v for _, v in scalars["train/loss"]] == [11, 12, 13, 14, 25, 26, 27, 28, 29]


def test_a_failing_writer_warns_once_and_stops(tmp_path, caplog):
    blocked = tmp_path / "tensorboard"
    blocked.write_text("a file where the folder should be")
    log = TensorBoardLog(str(blocked), logger=logging.getLogger("test_tracking"))
    with caplog.at_level(logging.WARNING, logger="test_tracking"):
        for step in range(1, 4):
            log.scalars(step, {"train/loss": 1.0})
        log.close()
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and "TensorBoard logging stops, training goes on" in warnings[0]
    assert log.failed and blocked.read_text() == "a file where the folder should be"


# ---- train.py and eval.py ----

@pytest.mark.slow
def test_killed_and_resumed_run_gives_one_curve_equal_to_metrics(interrupted_run):
    """tensorboard true, eval each epoch, killed with SIGKILL after it logged steps past its
    newest checkpoint, resumed with --resume_ckpt auto (and stopped again by SIGTERM and SIGINT,
    resumed each time; ``interrupted_run``): every step 1..30 appears once in train/loss, in
    order; the epoch scalars (eval loss too) equal metrics.jsonl's values at the same steps (to
    float32 rounding); a confusion-matrix picture at each new best top-1 and nowhere else; the
    hyperparameters are written at the end."""
    out = Path(interrupted_run["out"])
    killed = interrupted_run["killed"]
    assert killed["saved"] and killed["logged"], killed["stderr"]
    killed_at, logged = killed["saved"][-1], killed["logged"][-1]
    assert logged > killed_at  # an event past the checkpoint, to be hidden by the resume
    assert interrupted_run["final"]["code"] == 0, interrupted_run["final"]["stderr"]
    reader, scalars = read_events(out / "tensorboard")
    assert [s for s, _ in scalars["train/loss"]] == list(range(1, 31)), (killed_at, logged)
    assert [s for s, _ in scalars["train/lr"]] == list(range(1, 31))
    records = [json.loads(line) for line in open(out / "metrics.jsonl", encoding="utf-8")]
    assert [r["step"] for r in records] == [10, 20, 30]
    for key, tag in (("loss", "epoch/train_loss"), ("lr", "epoch/lr"), ("top1", "eval/top1"),
                     ("top5", "eval/top5"), ("eval_loss", "eval/loss"),
                     ("best_top1", "eval/best_top1")):
        assert scalars[tag] == [(r["step"], float(np.float32(r[key]))) for r in records], tag
    # the confusion matrix at each evaluation that set a new best, and only there
    best_steps = [r["step"] for i, r in enumerate(records)
                  if r["top1"] > max([-1.0] + [q["top1"] for q in records[:i]])]
    pictures = reader.Images("eval/confusion_matrix")
    assert [p.step for p in pictures] == best_steps
    for picture in pictures:
        with Image.open(io.BytesIO(picture.encoded_image_string)) as decoded:
            assert decoded.size[0] > 100 and decoded.size[1] > 100
    for tag in ("train/img_per_s", "epoch/img_per_s", "hparams/top1"):
        assert tag in scalars
    from tensorboard.plugins.hparams import plugin_data_pb2
    start = plugin_data_pb2.HParamsPluginData.FromString(
        reader.PluginTagToContent("hparams")["_hparams_/session_start_info"]).session_start_info
    assert start.hparams["epoch_size"].number_value == 3
    assert start.hparams["train_crop_scale"].string_value == "[0.35, 1.0]"  # a list, as text
    print(f"\n[tensorboard] killed after checkpoint step {killed_at} with events up to step "
          f"{logged}; the resumed runs' curve has each of steps 1..30 once")


@pytest.mark.slow
def test_a_failing_writer_leaves_training_bit_identical(tmp_path, cifar_small, capsys,
                                                        monkeypatch):
    """A file where output_dir/tensorboard/ should be: one warning, the run ends as it would
    without tracking (every parameter bit-identical); eval.py --plot true --tensorboard true
    puts a confusion matrix that decodes into TensorBoard."""
    plain, blocked = tmp_path / "plain", tmp_path / "blocked"
    train_here(cifar_small, plain, "--epoch_size", "1", "--run_eval", "false")
    blocked.mkdir()
    (blocked / "tensorboard").write_text("not a folder")
    capsys.readouterr()
    train_here(cifar_small, blocked, "--epoch_size", "1", "--run_eval", "false",
               "--tensorboard", "true")
    output = capsys.readouterr()
    assert (output.out + output.err).count("TensorBoard logging stops") == 1
    ours = ms.load_checkpoint(str(blocked / "resnet18-1_10.ckpt"))
    reference = ms.load_checkpoint(str(plain / "resnet18-1_10.ckpt"))
    tensors = [n for n, v in reference.items() if not isinstance(v, str)]
    assert tensors and all(ours[n].asnumpy().tobytes() == reference[n].asnumpy().tobytes()
                           for n in tensors)
    evaluated = tmp_path / "eval"
    import eval as evaluation
    monkeypatch.setattr(device, "setup_device", lambda *args, **kwargs: None)  # set once
    monkeypatch.chdir(tmp_path)
    assert evaluation.main([
        "--checkpoint_path", str(plain / "resnet18-1_10.ckpt"), "--net_name", "resnet18",
        "--class_num", "10", "--data_path", cifar_small["test"], "--eval_image_size", "32",
        "--eval_resize", "32", "--output_dir", str(evaluated), "--plot", "true",
        "--tensorboard", "true"]) == 0
    reader, scalars = read_events(evaluated / "tensorboard")
    result = json.load(open(evaluated / "eval_result.json", encoding="utf-8"))
    assert scalars["eval/top1"] == [(0, float(np.float32(result["top1"])))]
    picture = reader.Images("eval/confusion_matrix")[0].encoded_image_string
    with Image.open(io.BytesIO(picture)) as decoded:
        assert decoded.size == Image.open(evaluated / "confusion_matrix.png").size
