"""A run's files: nothing written by a run refused at start-up, an old checkpoint that cannot
be deleted leaves the run going, files written atomically get the mode a plain write gives."""
import logging
import os

import pytest
from mindspore import nn
from mindspore.train import RunContext

from src.training.callbacks import StepState
from src.training.saver import CheckpointSaver
from src.training.signals import StopSignals
from src.utils.checkpoint import checkpoint_name
from src.utils.files import append_line, atomic_write_text
from tests.helpers import CIFAR_SAMPLE, copy_class_folders, run_in_process, train_in_process

LOG = logging.getLogger("test")


class Params(dict):
    """Stands in for ``RunContext.original_args()``."""
    __getattr__ = dict.__getitem__


def folder_bytes(folder):
    """Every file of ``folder`` (but the lock file) -> its bytes."""
    out = {}
    for name in sorted(os.listdir(folder)):
        path = os.path.join(folder, name)
        if os.path.isfile(path) and name != ".run.lock":
            with open(path, "rb") as f:
                out[name] = f.read()
    return out


@pytest.mark.slow
def test_a_refused_resume_writes_nothing(tmp_path):
    """A val_split run with a checkpoint before its last epoch, resumed after an image was
    renamed: the split check refuses it, and config.yaml, metrics.jsonl, train.log and the
    lists are as the run left them (another seed is refused by the recipe check)."""
    data = copy_class_folders(os.path.join(CIFAR_SAMPLE, "train"), str(tmp_path / "data"), 8,
                              classes=["cat", "dog"])
    out = str(tmp_path / "run")
    common = ["--config_path", "configs/quick_start.yaml", "--data_path", data,
              "--class_num", "2", "--batch_size", "4", "--val_split", "0.25",
              "--eval_data_path", "",
              "--run_eval", "false", "--num_parallel_workers", "1", "--output_dir", out,
              "--save_checkpoint_epochs", "1", "--keep_checkpoint_max", "5"]
    assert train_in_process(*common, "--epoch_size", "2") == 0
    os.remove(os.path.join(out, checkpoint_name("resnet18", 6, 3)))  # as if killed in epoch 2
    before = folder_bytes(out)
    assert {"config.yaml", "metrics.jsonl", "train.log", "val_split.txt"} <= set(before)
    cat = os.path.join(data, "cat")
    first = sorted(os.listdir(cat))[0]
    os.rename(os.path.join(cat, first), os.path.join(cat, "renamed_" + first))
    result = run_in_process("train.py", *common, "--epoch_size", "2", "--resume_ckpt", "auto")
    assert result.returncode == 2, result.stderr[-2000:]
    assert "val_split 0.25 with seed 1 now splits" in result.stderr.strip().splitlines()[-1]
    assert folder_bytes(out) == before


def test_an_old_checkpoint_that_cannot_be_deleted_is_a_warning(tmp_path, monkeypatch, caplog):
    real_remove = os.remove
    stuck = str(tmp_path / checkpoint_name("net", 2, 10))

    def remove(path, *args, **kwargs):
        if os.path.abspath(path) == stuck:
            raise PermissionError(1, "Operation not permitted", path)
        return real_remove(path, *args, **kwargs)

    monkeypatch.setattr(os, "remove", remove)
    state = StepState()
    saver = CheckpointSaver(state, StopSignals(LOG), output_dir=str(tmp_path), prefix="net",
                            steps_per_epoch=10, total_steps=100, save_steps=2, keep_max=1)
    context = RunContext(Params(train_network=nn.Dense(2, 2), cur_epoch_num=1,
                                net_outputs=None))
    with caplog.at_level(logging.WARNING):
        for _ in range(6):  # saves at steps 2, 4 and 6; the one of step 2 cannot go
            state.global_step += 1
            saver.on_train_step_end(context)
    assert saver.error is None and not context.get_stop_requested()
    assert saver.last_saved == str(tmp_path / checkpoint_name("net", 6, 10))
    assert sorted(os.listdir(tmp_path)) == sorted([os.path.basename(stuck),
                                                   checkpoint_name("net", 6, 10)])
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and warnings[0].startswith(
        f"keep_checkpoint_max 1: cannot delete the old checkpoint {stuck} "
        f"(Operation not permitted); it is left in place, delete it by hand"), warnings


@pytest.mark.parametrize("umask", [0o022, 0o077, 0o002])
def test_files_written_atomically_get_the_mode_of_a_plain_write(tmp_path, umask):
    from src.data.class_names import write_class_names
    from src.deploy.report import plot_confusion
    from tools.gen_config_docs import write_atomically

    previous = os.umask(umask)
    try:
        with open(tmp_path / "plain.txt", "w") as f:
            f.write("x")
        atomic_write_text(str(tmp_path / "config.yaml"), "seed: 1\n")
        append_line(str(tmp_path / "metrics.jsonl"), "{}")
        write_class_names(str(tmp_path / "class_names.txt"), ["cat", "dog"])
        write_atomically(str(tmp_path / "configuration.md"), "# page\n")
        plot_confusion([[1, 0], [1, 1]], ["cat", "dog"], str(tmp_path / "confusion_matrix.png"))
    finally:
        os.umask(previous)
    modes = {p.name: oct(p.stat().st_mode & 0o777) for p in tmp_path.iterdir()}
    assert set(modes.values()) == {oct(0o666 & ~umask)}, modes
