"""A multi-label evaluation set with no positive label (every row's tag list empty, or a split
that leaves every positive out): mAP is undefined, so train.py and eval.py refuse it by name
before any work, and no record holds a sentinel or NaN (docs/reliability.md)."""
import json
import math
import os

import pytest

from src.training.best import BestCheckpoint
from src.utils.tasks import MULTILABEL
from tests.helpers import ROOT, run_in_process

MOSAICS = os.path.join(ROOT, "data", "cifar10_mosaics")
RECIPE = ["--config_path", "configs/multilabel_quick_start.yaml", "--num_parallel_workers", "1"]


def unlabelled(tmp_path, rows=12):
    """The first ``rows`` val mosaics with their tags removed, as a label file."""
    with open(os.path.join(MOSAICS, "val.csv"), encoding="utf-8") as f:
        lines = f.read().splitlines()
    path = tmp_path / "unlabelled.csv"
    path.write_text("\n".join([lines[0]] + [f"{row.split(',')[0]}," for row in
                                            lines[1:rows + 1]]) + "\n", encoding="utf-8")
    return str(path)


def test_train_refuses_an_eval_label_file_without_a_label(tmp_path):
    table = unlabelled(tmp_path)
    result = run_in_process("train.py", *RECIPE, "--eval_label_file", table,
                            "--output_dir", tmp_path / "out")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert (f"eval_label_file {table}: none of its 12 images has a label, so no class has a "
            f"positive to rank and mAP is undefined") in result.stderr
    assert not (tmp_path / "out" / "metrics.jsonl").exists()


def test_eval_refuses_a_label_file_without_a_label_before_writing_anything(tmp_path):
    table = unlabelled(tmp_path)
    ckpt = tmp_path / "m.ckpt"
    import mindspore as ms

    from src.data.class_names import CIFAR10_CLASSES
    from src.models.resnet import create_network
    from src.utils.checkpoint import RECORD_KEY
    from src.utils.model_record import ModelRecord
    record = ModelRecord(net_name="resnet18", class_num=10, task="multilabel",
                         class_names=tuple(CIFAR10_CLASSES))  # as a trained run records
    ms.save_checkpoint(create_network("resnet18", class_num=10), str(ckpt),
                       append_dict={RECORD_KEY: record.to_json()})
    result = run_in_process("eval.py", *RECIPE, "--checkpoint_path", ckpt, "--label_file",
                            table, "--output_dir", tmp_path / "out")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert f"label_file {table}: none of its 12 images has a label" in result.stderr
    assert not (tmp_path / "out").exists()


def test_an_undefined_score_is_never_a_best_and_the_record_says_null(tmp_path):
    """A NaN evaluation (the run's first) sets no best: the record holds null, not a
    sentinel, and strict JSON can read it."""
    best = BestCheckpoint(str(tmp_path / "best.ckpt"), write=False, task=MULTILABEL)
    assert not best.update({"mAP": math.nan}, 1, None)
    record = best.record({"mAP": None, "eval_images": 12})
    assert record == {"mAP": None, "best_mAP": None, "eval_images": 12}
    assert json.loads(json.dumps(record, allow_nan=False)) == record
    assert best.score() is None
    with pytest.raises(ValueError):
        json.dumps({"mAP": math.nan}, allow_nan=False)  # what strict readers refuse
