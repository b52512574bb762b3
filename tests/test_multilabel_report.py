"""The multi-label evaluation report (``src/deploy/multilabel_report.py``): its numbers on five
images worked out by hand (and checked with scikit-learn), the tables read back, the
precision-recall picture's panels, the largest errors."""
import csv
import json
import os

import numpy as np
import pytest
from PIL import Image
from sklearn.metrics import average_precision_score

from src.deploy.multilabel_report import LARGEST_ERRORS, MultiLabelReport

NAMES = ["a", "b", "c"]
FILES = [f"x{i}.jpg" for i in range(5)]
# class c has no positive; thresholds 0.5
PROBABILITIES = np.array([[0.9, 0.2, 0.1], [0.6, 0.7, 0.4], [0.3, 0.8, 0.6], [0.7, 0.1, 0.2],
                          [0.2, 0.4, 0.05]], np.float32)
TARGETS = np.array([[1, 0, 0], [1, 1, 0], [0, 1, 0], [0, 0, 0], [1, 0, 0]], np.float32)


def fixed_report(files=FILES, thresholds=None):
    report = MultiLabelReport(NAMES, files, thresholds=thresholds)
    report.update(PROBABILITIES[:2], TARGETS[:2])
    report.update(PROBABILITIES[2:], TARGETS[2:])
    return report


def test_numbers_equal_those_worked_out_by_hand():
    out = fixed_report().summary()
    json.dumps(out, allow_nan=False)
    # a ranks +, -, +, -, +: AP = 1/3 (1 + 2/3 + 3/5); b ranks +, +: AP 1; c: no positive
    per = {c["name"]: c for c in out["per_class"]}
    assert per["a"]["ap"] == pytest.approx(34 / 45) and per["b"]["ap"] == pytest.approx(1.0)
    assert per["c"]["ap"] is None
    assert out["mAP"] == pytest.approx((34 / 45 + 1) / 2)
    assert [per[n]["ap"] for n in "ab"] == pytest.approx(
        average_precision_score(TARGETS[:, :2], PROBABILITIES[:, :2], average=None))
    # at 0.5: a TP 2 FP 1 FN 1, b TP 2, c FP 1 (image 2); images 0 and 1 all right
    assert [per[n]["precision"] for n in NAMES] == pytest.approx([2 / 3, 1, 0])
    assert [per[n]["recall"] for n in NAMES] == pytest.approx([2 / 3, 1, 0])
    assert [per[n]["f1"] for n in NAMES] == pytest.approx([2 / 3, 1, 0])
    assert [per[n]["positives"] for n in NAMES] == [3, 2, 0]
    assert [per[n]["threshold"] for n in NAMES] == [0.5] * 3
    assert out["exact_match"] == pytest.approx(2 / 5) and out["images"] == 5
    assert out["macro_f1"] == pytest.approx(5 / 9)
    assert (out["micro_precision"], out["micro_recall"], out["micro_f1"]) == pytest.approx(
        (4 / 6, 4 / 5, 8 / 11))


def test_largest_errors_come_first_with_their_mistakes_named():
    errors = fixed_report().summary()["largest_errors"]
    assert [e["image"] for e in errors] == ["x4.jpg", "x3.jpg", "x2.jpg", "x1.jpg", "x0.jpg"]
    assert [e["max_error"] for e in errors] == pytest.approx([0.8, 0.7, 0.6, 0.4, 0.2])
    assert errors[0] == {"image": "x4.jpg", "true": ["a"], "predicted": [],
                         "false_positives": [], "false_negatives": ["a"],
                         "probabilities": {"a": 0.2}, "max_error": errors[0]["max_error"]}
    assert (errors[2]["predicted"], errors[2]["false_positives"]) == (["b", "c"], ["c"])
    assert errors[1]["true"] == [] and errors[1]["false_positives"] == ["a"]
    # named by index without files; at most LARGEST_ERRORS, still in order
    rng = np.random.default_rng(0)
    many = MultiLabelReport(NAMES)
    many.update(rng.random((LARGEST_ERRORS + 10, 3)), rng.random((LARGEST_ERRORS + 10, 3)) < .5)
    listed = many.summary()["largest_errors"]
    assert len(listed) == LARGEST_ERRORS and isinstance(listed[0]["image"], int)
    assert [e["max_error"] for e in listed] == sorted((e["max_error"] for e in listed),
                                                      reverse=True)


def test_thresholds_change_the_decisions_and_are_reported():
    out = fixed_report(thresholds=[0.5, 0.5, 0.7]).summary()
    assert out["per_class"][2]["threshold"] == 0.7  # the float32's shortest form
    assert out["exact_match"] == pytest.approx(3 / 5)  # image 2 is now right


def test_largest_errors_are_decided_at_the_tuned_thresholds():
    """Thresholds 0.25, 0.5, 0.7 (not 0.5 for all): image x2 (0.3, 0.8, 0.6; true b) is
    predicted a and b, a false positive a, c below its 0.7; x4 (a 0.2, true a) still misses a;
    x3 (a 0.7) a false positive."""
    errors = {e["image"]: e for e in fixed_report(thresholds=[0.25, 0.5, 0.7]).summary()[
        "largest_errors"]}
    assert (errors["x2.jpg"]["predicted"], errors["x2.jpg"]["false_positives"],
            errors["x2.jpg"]["false_negatives"]) == (["a", "b"], ["a"], [])
    assert errors["x2.jpg"]["probabilities"] == pytest.approx({"a": 0.3, "b": 0.8})
    assert errors["x4.jpg"]["false_negatives"] == ["a"]
    assert errors["x1.jpg"]["predicted"] == ["a", "b"]  # 0.6, 0.7, and c 0.4 below 0.7
    assert errors["x3.jpg"]["false_positives"] == ["a"]
    with pytest.raises(ValueError, match="expected one or 3"):
        MultiLabelReport(NAMES, thresholds=[0.5, 0.5])


def test_batches_add_up_and_are_checked():
    report = fixed_report()
    assert report.scores.dtype == np.float32 and report.scores.tolist() == \
        PROBABILITIES.tolist()
    assert report.targets.dtype == np.float32 and (report.targets == TARGETS).all()
    whole = MultiLabelReport(NAMES, FILES)
    whole.update(PROBABILITIES, TARGETS)
    assert whole.summary() == report.summary()
    with pytest.raises(RuntimeError, match="more images evaluated than the 5 files"):
        report.update(PROBABILITIES[:1], TARGETS[:1])
    with pytest.raises(ValueError, match=r"must both be \(images, 3\)"):
        MultiLabelReport(NAMES).update(PROBABILITIES[:, :2], TARGETS[:, :2])
    empty = MultiLabelReport(NAMES).summary()
    assert empty["mAP"] is None and empty["images"] == 0 and empty["largest_errors"] == []


def test_tables_read_back_to_the_summary(tmp_path):
    report = fixed_report(thresholds=[0.5, 0.4, 0.7])
    paths = report.write_tables(str(tmp_path))
    assert sorted(os.listdir(tmp_path)) == ["per_class.csv", "per_class.md"]
    assert paths == [str(tmp_path / "per_class.csv"), str(tmp_path / "per_class.md")]
    with open(paths[0], newline="") as f:
        rows = list(csv.DictReader(f))
    for row, expected in zip(rows, report.summary()["per_class"], strict=True):
        assert row["name"] == expected["name"] and int(row["class"]) == expected["class"]
        assert int(row["positives"]) == expected["positives"]
        for key in ("ap", "precision", "recall", "f1", "threshold"):
            assert (None if row[key] == "" else float(row[key])) == expected[key]
    assert np.float32(float(rows[1]["threshold"])) == report.thresholds[1]
    markdown = open(paths[1]).read().splitlines()
    assert markdown[0].startswith("5 images, 3 classes: mAP 0.8778 (over the 2 classes")
    assert markdown[4] == "| 0 | a | 0.7556 | 0.6667 | 0.6667 | 0.6667 | 3 | 0.5000 |"
    assert markdown[6] == "| 2 | c | n/a | 0.0000 | 0.0000 | 0.0000 | 0 | 0.7000 |"


def cell_pixels(picture, column, row, columns, rows, margin=0.0):
    """The RGB pixels of one grid cell, ``margin`` (share of its side) cut off each edge."""
    width, height = picture.size
    x0, x1 = width * column / columns, width * (column + 1) / columns
    y0, y1 = height * row / rows, height * (row + 1) / rows
    dx, dy = (x1 - x0) * margin, (y1 - y0) * margin
    return np.asarray(picture.crop((int(x0 + dx), int(y0 + dy), int(x1 - dx), int(y1 - dy))))


def test_the_picture_has_one_panel_per_class_on_a_grid_of_sqrt_k_columns(tmp_path):
    classes, columns, rows = 5, 3, 2
    rng = np.random.default_rng(5)
    targets = rng.random((20, classes)) < 0.4
    targets[:, 1] = False  # its panel says "no positive" (axes, no curve)
    report = MultiLabelReport([f"class{k}" for k in range(classes)])
    report.update(rng.random((20, classes)), targets)
    path = tmp_path / "pr.png"
    report.plot_pr_curves(str(path))
    assert os.listdir(tmp_path) == ["pr.png"]
    picture = Image.open(path).convert("RGB")
    assert picture.size == (300 * columns, 300 * rows)  # 3 inch panels at 100 dpi
    for k in range(columns * rows):
        cell = cell_pixels(picture, k % columns, k // columns, columns, rows, margin=0.15)
        drawn = (cell < 200).any(axis=-1).mean()
        if k < classes:
            assert drawn > 0.005, f"panel {k} is empty"
        else:
            assert drawn == 0, f"grid cell {k} has no class but is drawn on"


def test_the_picture_marks_the_threshold_point_and_the_chance_line(tmp_path, monkeypatch):
    """The figure drawn (caught before it is saved): on class a's panel at threshold 0.65
    (predicted x0 and x3 of the positives x0, x1, x4) the point at recall 1/3 (x), precision
    1/2 (y); the dashed chance line at the positive share 3/5; class b (threshold 0.5:
    precision and recall 1) its line at 2/5; class c (no positive) neither."""
    from src.deploy import multilabel_report

    figures = []
    monkeypatch.setattr(multilabel_report, "save_png",
                        lambda fig, path, dpi: figures.append(fig))
    fixed_report(thresholds=[0.65, 0.5, 0.7]).plot_pr_curves(str(tmp_path / "pr.png"))
    (figure,) = figures
    expected = {0: ((1 / 3, 1 / 2), 3 / 5), 1: ((1.0, 1.0), 2 / 5)}
    for k, ((recall, precision), share) in expected.items():
        lines = figure.axes[k].get_lines()
        (point,) = [line for line in lines if line.get_marker() == "o"]
        assert (list(point.get_xdata()), list(point.get_ydata())) == (
            [pytest.approx(recall)], [pytest.approx(precision)]), k
        (chance,) = [line for line in lines if line.get_linestyle() == "--"]
        assert list(chance.get_ydata()) == pytest.approx([share, share]), k
    assert not figure.axes[2].get_lines()
