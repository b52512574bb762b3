"""Issue 40's remaining items: an ``lr_end`` above the peak LR refused by name, Pillow's EXIF
warnings kept out of the output, the epoch's loss record of a run resumed mid-epoch equal to an
uninterrupted run's, an evaluation failing on one rank agreed over the ranks; and the checks
that make mutations of the best score, the signal agreement and TensorBoard logging fail."""
import io
import logging
import os
import signal
import struct
import threading
import warnings

import numpy as np
import pytest
from PIL import Image

from src.training.lr_schedule import create_lr
from src.utils.config import ConfigError
from tests.helpers import run_in_process
from tests.test_train_safety import ThreadGather


class Params(dict):
    """Stands in for ``RunContext.original_args()``."""
    __getattr__ = dict.__getitem__


# ---- item 7: lr_end above the peak LR ----

def lr_of(schedule, lr_end, *, base_lr=0.1, global_batch=512):
    return create_lr(lr_schedule=schedule, base_lr=base_lr, base_lr_batch_size=256,
                     global_batch_size=global_batch, epoch_size=3, steps_per_epoch=4,
                     warmup_epochs=1, lr_end=lr_end)


@pytest.mark.parametrize("schedule", ["cosine", "linear", "poly"])
def test_an_lr_end_above_the_linearly_scaled_peak_is_refused_naming_both(schedule):
    # base_lr 0.1 at a global batch of 512 peaks at 0.2: an lr_end of 0.15 decays (below the
    # peak, above base_lr), 0.25 would climb
    lr, peak = lr_of(schedule, 0.15)
    assert peak == pytest.approx(0.2) and lr.max() == pytest.approx(0.2)
    assert np.all(np.diff(lr[4:]) <= 0)  # after warmup: never rising
    with pytest.raises(ConfigError) as info:
        lr_of(schedule, 0.25)
    message = str(info.value)
    assert message.startswith("lr_end 0.25 is above the peak LR 0.2 (base_lr 0.1 x global "
                              "batch 512 / base_lr_batch_size 256)"), message
    assert f"lr_schedule {schedule}" in message and "\n" not in message
    lr, _ = lr_of(schedule, 0.2)  # a flat schedule at the peak is allowed
    assert np.allclose(lr[4:], 0.2)


def test_the_step_schedule_takes_no_lr_end():
    lr, peak = lr_of("step", 5.0)
    assert lr.max() == pytest.approx(peak)


def test_train_exits_2_on_an_lr_end_above_the_peak(cifar_small, tmp_path):
    result = run_in_process("train.py", "--config_path", "configs/quick_start.yaml",
                            "--data_path", cifar_small["train"], "--output_dir",
                            tmp_path / "out", "--train_image_size", "32", "--batch_size", "8",
                            "--epoch_size", "1", "--run_eval", "false",
                            "--lr_schedule", "poly", "--lr_end", "5.0")
    assert result.returncode == 2, result.stderr[-2000:]
    assert "error: lr_end 5.0 is above the peak LR " in result.stderr
    assert "Traceback" not in result.stderr
    assert not [n for n in os.listdir(tmp_path / "out") if n.endswith(".ckpt")]


# ---- item 19: Pillow's EXIF warnings ----

def jpeg_with_a_cut_exif_block(orientation=6):
    """A JPEG whose EXIF block holds an Orientation tag and an ImageDescription pointing past
    the block's end: Pillow warns ``Tag data larger than file`` when it reads the EXIF."""
    entries = [struct.pack("<HHII", 0x0112, 3, 1, orientation),
               struct.pack("<HHII", 0x010E, 2, 100, 2000)]
    ifd = struct.pack("<H", len(entries)) + b"".join(entries) + struct.pack("<I", 0)
    exif = b"Exif\x00\x00II*\x00" + struct.pack("<I", 8) + ifd
    buffer = io.BytesIO()
    Image.new("RGB", (16, 8), (200, 10, 10)).save(buffer, "JPEG", exif=exif)
    return buffer.getvalue()


def test_pillow_warns_on_the_crafted_exif_block():
    """The file is what it claims: Pillow's own EXIF transpose warns on it."""
    from PIL import ImageOps

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ImageOps.exif_transpose(Image.open(io.BytesIO(jpeg_with_a_cut_exif_block())))
    assert any(issubclass(w.category, UserWarning) and "Tag data" in str(w.message)
               for w in caught)


def test_exif_transpose_turns_the_photo_without_pillows_warning():
    from src.data.transforms import decode_rgb

    with warnings.catch_warnings():
        warnings.filterwarnings("error", category=UserWarning)
        upright = decode_rgb(jpeg_with_a_cut_exif_block(), exif_transpose=True)
    assert upright.size == (8, 16)  # the Orientation tag is still applied


def folder_of_odd_exif(root):
    for name in ("cat", "dog"):
        os.makedirs(root / name)
        (root / name / "odd_exif.jpg").write_bytes(jpeg_with_a_cut_exif_block())
    return str(root)


def test_the_image_check_reads_the_files_without_pillows_warning(tmp_path):
    from src.data.image_check import check_image_folder

    folder = folder_of_odd_exif(tmp_path)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", category=UserWarning)
        assert check_image_folder(folder, check_content=True) == ["cat", "dog"]


def test_no_raw_pillow_warning_reaches_the_output_of_an_eval_pipeline(tmp_path, capfd):
    from src.data.pipeline import create_dataset
    from src.data.settings import EvalPreprocess

    folder_of_odd_exif(tmp_path)
    dataset = create_dataset(str(tmp_path), batch_size=2,
                             settings=EvalPreprocess(image_size=8, resize=8,
                                                     exif_transpose=True),
                             num_parallel_workers=1, check_images=False)
    capfd.readouterr()
    with warnings.catch_warnings(record=True) as caught:  # the pipeline's threads' too
        warnings.simplefilter("always")
        batches = list(dataset.create_tuple_iterator(num_epochs=1, output_numpy=True))
    assert batches[0][0].shape == (2, 3, 8, 8)
    assert not [w for w in caught if issubclass(w.category, UserWarning)
                and "Tag data" in str(w.message)]
    output = capfd.readouterr()
    assert "UserWarning" not in output.err + output.out, output.err[-2000:]


# ---- mutations: the best score, the signal agreement, TensorBoard ----

def test_an_evaluation_at_0_percent_still_writes_a_best_checkpoint(tmp_path):
    from mindspore import nn

    from src.training.best import BestCheckpoint

    best = BestCheckpoint(str(tmp_path / "net-best.ckpt"))
    assert best.update({"top1": 0.0}, 1, nn.Dense(2, 2))
    assert (tmp_path / "net-best.ckpt").exists() and best.score() == {"top1": 0.0, "epoch": 1}
    assert not best.update({"top1": 0.0}, 2, nn.Dense(2, 2))  # a tie is not a new best


def test_each_rank_exits_with_its_own_signal():
    """SIGTERM on rank 0 and SIGINT on rank 1 in the same step: both stop, rank 1 with its own
    signal (exit 130), not rank 0's."""
    from mindspore.train import RunContext

    from src.training.signals import StopSignals

    rank1 = StopSignals(logging.getLogger("test"),
                        gather=lambda mine: [int(signal.SIGTERM), mine])
    try:
        rank1._handle(signal.SIGINT, None)
        context = RunContext(Params())
        rank1.on_train_step_end(context)
    finally:
        rank1.restore()
    assert context.get_stop_requested()
    assert rank1.received == "SIGINT" and 128 + rank1.signum == 130


def test_the_lowest_failed_rank_is_named(caplog):
    from mindspore.train import RunContext

    from src.training.callbacks import NONFINITE_LOSS, NOT_WRITTEN, StepState
    from src.training.signals import StopSignals

    unit = StopSignals.REASON_UNIT
    stop = StopSignals(logging.getLogger("test"),
                       gather=lambda mine: [mine, unit * NOT_WRITTEN, unit * NONFINITE_LOSS])
    state = StepState(start_step=7)
    stop.watch(state)
    context = RunContext(Params())
    with caplog.at_level(logging.ERROR):
        stop.agree_failures(context)
    assert state.stopped_by == (1, NOT_WRITTEN, 7) and context.get_stop_requested()
    assert "rank 1 stopped (a file not written" in caplog.text
    assert "rank 2 stopped (non-finite loss)" in caplog.text


def test_none_scalars_are_skipped(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from src.utils.tracking import TensorBoardLog

    log = TensorBoardLog(str(tmp_path / "tb"))
    log.scalars(3, {"eval/top1": 0.5, "epoch/train_loss": None})
    log.close()
    assert not log.failed
    reader = EventAccumulator(str(tmp_path / "tb"), size_guidance={"scalars": 0})
    reader.Reload()
    assert reader.Tags()["scalars"] == ["eval/top1"]
    assert [(e.step, e.value) for e in reader.Scalars("eval/top1")] == [(3, 0.5)]


def test_a_failing_picture_is_not_drawn_again(tmp_path, caplog):
    from src.utils.tracking import TensorBoardLog

    log = TensorBoardLog(str(tmp_path / "tb"), logger=logging.getLogger("test"))
    calls = []

    def draw(path):
        calls.append(path)
        raise OSError("no fonts")

    with caplog.at_level(logging.WARNING):
        for step in (1, 2, 3):
            log.drawn_image("eval/confusion_matrix", step, draw)
            log.scalars(step, {"eval/top1": 0.1 * step})
    log.close()
    assert len(calls) == 1 and log.drawing_failed and not log.failed
    assert caplog.text.count("no eval/confusion_matrix picture (no fonts)") == 1


# ---- item 21b: an evaluation failing on one rank ----

def evaluate_on_ranks(counts):
    """An ``Evaluator`` per rank whose ``count`` returns ``counts[r]`` or raises it, its
    collectives between threads; returns what each rank's evaluation returned or raised."""
    from src.training.evaluator import EvalCounts, EvalShard, Evaluator

    group = ThreadGather(len(counts), timeout=20)
    outcomes = [None] * len(counts)

    def rank_main(rank):
        def sum_ints(values):
            return [sum(column) for column in zip(*group.gather(rank, list(values)))]

        def sum_arrays(array):
            return np.sum(group.gather(rank, np.asarray(array)), axis=0)

        def count(model, confusion=False):
            if isinstance(counts[rank], Exception):
                raise counts[rank]
            return EvalCounts(*counts[rank])

        shard = EvalShard(None, sum_over_ranks=sum_ints, sum_arrays=sum_arrays,
                          gather=lambda value: group.gather(rank, value))
        evaluator = Evaluator(None, shard, None)
        evaluator.count = count
        try:
            outcomes[rank] = evaluator()
        except Exception as err:  # noqa: BLE001  the outcome checked
            outcomes[rank] = err

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(len(counts))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not any(thread.is_alive() for thread in threads), "a rank waits in a collective"
    return outcomes


def test_an_evaluation_failing_on_some_ranks_stops_every_rank_naming_the_lowest():
    from src.data.image_check import ImageFolderError
    from src.training.evaluator import EvalFailedOnRank

    undecodable = RuntimeError("Exception thrown from dataset pipeline. Refer to 'Dataset "
                               "Pipeline Error Message'. The corresponding data file is: "
                               "/data/val/cat/cut.jpg.")  # MindSpore's words
    other = MemoryError("out of memory")
    outcomes = evaluate_on_ranks([(3, 5, 6, 1.5), undecodable, other, (2, 4, 6, 1.0)])
    for rank in (0, 3):  # not waiting in the sum of the counts
        assert isinstance(outcomes[rank], EvalFailedOnRank), outcomes[rank]
        assert str(outcomes[rank]).startswith("evaluation failed on rank 1 (failed ranks: 1, 2;")
        assert outcomes[rank].exit_status == 2  # rank 1's, an ImageFolderError's
    assert isinstance(outcomes[1], ImageFolderError), outcomes[1]  # its own, named
    assert "cut.jpg" in str(outcomes[1])
    assert outcomes[2] is other


def test_an_evaluation_without_failures_is_summed_over_the_ranks():
    outcomes = evaluate_on_ranks([(3, 5, 6, 1.5), (2, 4, 6, 1.5)])
    for result in outcomes:
        assert result == {"top1": 5 / 12, "top5": 9 / 12, "eval_loss": 3.0 / 12,
                          "eval_images": 12}


# ---- item 21a: the epoch's loss record of a run resumed mid-epoch ----

class _Part:
    """A distilling cell's loss-part Parameter as the monitor reads it (``asnumpy``)."""

    def __init__(self):
        self.value = np.float32(0)

    def asnumpy(self):
        return np.asarray(self.value)


def monitored_records(tmp_path, losses, *, start_step=0, resumed=None, stop_at=None,
                      parts=None):
    """A ``TrainMonitor`` (4 steps per epoch) fed ``losses`` from ``start_step`` on, a run
    resumed with ``resumed`` (a checkpoint's ``epoch_loss``); returns the records and, at
    ``stop_at``, what a checkpoint there stores (``epoch_loss``, through JSON). ``parts``: a
    distillation task-loss part per step (as ``kd_teacher`` runs give)."""
    import json

    from mindspore.train import RunContext

    from src.training.callbacks import StepState, TrainMonitor

    tmp_path.mkdir()
    path = tmp_path / "metrics.jsonl"
    state = StepState(start_step)
    monitor = TrainMonitor(state, lr=np.full(8, 0.1, np.float32), global_batch_size=8,
                           steps_per_epoch=4, log_interval=100, metrics_path=str(path),
                           logger=logging.getLogger("test"))
    monitor.resumed_loss = resumed
    context, stored = RunContext(Params()), None
    monitor.on_train_begin(context)
    part = _Part()
    if parts is not None:
        monitor.loss_parts = {"task_loss": part}
    monitor.on_train_epoch_begin(context)
    for i, loss in enumerate(losses):
        state.global_step += 1
        state.status, state.loss = "ok", loss
        part.value = np.float32(parts[i]) if parts is not None else part.value
        monitor.on_train_step_end(context)
        if state.global_step == stop_at:
            stored = json.loads(json.dumps(monitor.epoch_loss()))
            break
        if state.global_step % 4 == 0:
            monitor.on_train_epoch_end(context)
            monitor.on_train_epoch_begin(context)
    records = [json.loads(line) for line in open(path)] if path.exists() else []
    return records, stored


def test_a_run_resumed_mid_epoch_records_the_mean_loss_of_the_whole_epoch(tmp_path):
    losses = [2.3, 2.1, 1.9, 1.7, 0.1, 0.7, 1e-3, 0.30000000000000004]
    whole, _ = monitored_records(tmp_path / "whole", losses)
    first, stored = monitored_records(tmp_path / "first", losses, stop_at=6)
    assert stored == {"sum": 0.1 + 0.7, "count": 2}
    rest, _ = monitored_records(tmp_path / "rest", losses[6:], start_step=6, resumed=stored)
    assert [r["loss"] for r in first + rest] == [r["loss"] for r in whole]  # exactly
    assert rest[0]["loss"] != sum(losses[6:]) / 2  # not the steps after the resume alone
    # an older checkpoint without the sum: the steps after the resume, as before
    older, _ = monitored_records(tmp_path / "older", losses[6:], start_step=6)
    assert older[0]["loss"] == sum(losses[6:]) / 2


def test_a_distilling_run_resumed_mid_epoch_records_the_parts_of_the_whole_epoch(tmp_path):
    losses = [2.3, 2.1, 1.9, 1.7, 0.1, 0.7, 1e-3, 0.30000000000000004]
    parts = [1.5, 1.25, 1.0, 0.75, 0.0625, 0.5, 0.25, 0.125]
    whole, _ = monitored_records(tmp_path / "whole", losses, parts=parts)
    first, stored = monitored_records(tmp_path / "first", losses, stop_at=6, parts=parts)
    assert stored["parts"] == {"task_loss": {"sum": 0.0625 + 0.5, "count": 2}}
    rest, _ = monitored_records(tmp_path / "rest", losses[6:], start_step=6, resumed=stored,
                                parts=parts[6:])
    assert [r["task_loss"] for r in first + rest] == [r["task_loss"] for r in whole]
    assert rest[0]["task_loss"] == (0.0625 + 0.5 + 0.25 + 0.125) / 4
