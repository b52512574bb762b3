"""eval.py's per-class report (``src/deploy/report.py``): numbers against a confusion matrix
worked out by hand, images named by path in the pipeline's order, the picture."""
import importlib
import json
import os

import numpy as np
import pytest

from src.data.pipeline import create_dataset, image_folder_files
from src.data.settings import EvalPreprocess
from src.deploy import formats
from src.deploy.report import ClassReport, plot_confusion, top_confusions
from src.utils import device


def test_report_numbers_equal_a_confusion_matrix_worked_out_by_hand():
    # 3 classes, 6 images in two batches; predictions: 0->0, 0->1, 1->1, 1->1, 2->0, 2->2
    labels = [0, 0, 1], [1, 2, 2]
    logits = [[[3, 0, 0], [0, 2, 0], [0, 1, 0]], [[0, 5, 1], [4, 0, 0], [0, 0, 1]]]
    report = ClassReport(3, ["a", "b", "c"])
    for x, y in zip(logits, labels):
        report.update(np.array(x, np.float32), np.array(y))
    out = report.summary()
    assert out["confusion_matrix"] == [[1, 1, 0], [0, 2, 0], [1, 0, 1]]
    # by hand: precision a 1/2, b 2/3, c 1/1; recall a 1/2, b 2/2, c 1/2
    per = {c["name"]: c for c in out["per_class"]}
    assert [per[n]["precision"] for n in "abc"] == pytest.approx([0.5, 2 / 3, 1.0])
    assert [per[n]["recall"] for n in "abc"] == pytest.approx([0.5, 1.0, 0.5])
    assert [per[n]["accuracy"] for n in "abc"] == [per[n]["recall"] for n in "abc"]
    assert [per[n]["f1"] for n in "abc"] == pytest.approx([0.5, 0.8, 2 / 3])
    assert [per[n]["images"] for n in "abc"] == [2, 2, 2]
    # mistakes: image 1 (a as b, p = e^2 / (e^2 + 2)), image 4 (c as a, p = e^4 / (e^4 + 2))
    mistakes = out["misclassified"]
    assert [(m["image"], m["true_name"], m["predicted_name"]) for m in mistakes] == [
        (4, "c", "a"), (1, "a", "b")]  # most confident first
    assert mistakes[0]["probability"] == round(np.e ** 4 / (np.e ** 4 + 2), 6)


def test_images_are_named_by_path_and_their_order_is_checked():
    images = [("x/a/1.jpg", 0), ("x/b/2.jpg", 1)]
    report = ClassReport(2, ["a", "b"], images)
    report.update(np.array([[0.0, 1.0], [0.0, 1.0]]), np.array([0, 1]))
    assert report.summary()["misclassified"][0]["image"] == "x/a/1.jpg"
    with pytest.raises(RuntimeError, match="not in the order of the folder listing"):
        ClassReport(2, ["a", "b"], images).update(np.zeros((2, 2)), np.array([1, 0]))


def test_the_folder_listing_is_the_eval_pipeline_s_order(cifar_small):
    data = create_dataset(cifar_small["test"], EvalPreprocess(image_size=32, resize=32),
                          batch_size=7, num_parallel_workers=2)
    labels = np.concatenate([y for _, y in data.create_tuple_iterator(num_epochs=1,
                                                                      output_numpy=True)])
    listed = image_folder_files(cifar_small["test"])
    assert [label for _, label in listed] == labels.tolist()
    assert all(os.path.isfile(path) for path, _ in listed)


def test_eval_writes_the_report_and_the_picture(cifar_small, tmp_path, monkeypatch, capsys):
    evaluation = importlib.import_module("eval")
    monkeypatch.setattr(device, "setup_device", lambda *args, **kwargs: None)
    # any model file: a stand-in that always answers class 0 ("airplane")
    monkeypatch.setattr(formats, "load_predictor", lambda *args, **kwargs: lambda x: np.tile(
        np.eye(10, dtype=np.float32)[0], (len(x), 1)))
    assert evaluation.main(["--config_path", "configs/quick_start.yaml", "--checkpoint_path",
                            str(tmp_path / "model.onnx"), "--data_path", cifar_small["test"],
                            "--output_dir", str(tmp_path), "--plot", "true"]) == 0
    result = json.load(open(tmp_path / "eval_result.json"))
    matrix = np.array(result["confusion_matrix"])
    assert (matrix[:, 0] == 3).all() and matrix.sum() == 30 and result["top1"] == 0.1
    assert len(result["misclassified"]) == 27
    assert all(m["predicted_name"] == "airplane" and os.path.isfile(m["image"])
               for m in result["misclassified"])
    assert result["per_class"][0]["precision"] == 0.1 and result["per_class"][0]["recall"] == 1
    assert open(tmp_path / "confusion_matrix.png", "rb").read(8) == b"\x89PNG\r\n\x1a\n"


def test_beyond_fifty_classes_the_picture_lists_the_top_confusions(tmp_path):
    k = 60
    confusion = np.eye(k, dtype=np.int64) * 5
    confusion[3, 7], confusion[10, 2] = 9, 4
    names = [f"class{i}" for i in range(k)]
    assert top_confusions(confusion, names, top=2) == ["class3 -> class7: 9",
                                                       "class10 -> class2: 4"]
    plot_confusion(confusion.tolist(), names, str(tmp_path / "cm.png"))
    assert os.listdir(tmp_path) == ["cm.png"]
