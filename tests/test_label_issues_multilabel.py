"""label_issues.py on a multi-label table (task multilabel, label_file): the K-part iterative
stratification (fold sizes, every class in every fold, per-class counts near n/K,
determinism, the 2-part split unchanged), cleanlab's multi-label find_label_issues and label
quality score, the CSV and page of label sets, the fold command with --label_file through the
data-parallel launcher, bad tables refused by name (exit 2), and one end-to-end run on 60 rows
of the shipped mosaics (fold label files, sigmoid probabilities, resumption)."""
import csv
import html
import io
import os
import re
import stat
import subprocess

import numpy as np
import pytest

from tests.helpers import (
    ROOT,
    check_label_issues_resume,
    read_csv_rows,
    run_entry,
    run_in_process,
    succeeded,
)

MOSAICS = os.path.join(ROOT, "data", "cifar10_mosaics")
TINY_TABLE = ("--config_path", "configs/multilabel_quick_start.yaml", "--data_path", MOSAICS,
              "--epoch_size", "1", "--batch_size", "8", "--num_parallel_workers", "1",
              "--train_image_size", "32", "--eval_image_size", "32", "--eval_resize", "32",
              "--check_images", "false")


def noisy_multilabel(seed, count=150, classes=5):
    """Multi-hot given labels and sigmoid probabilities of a model that is mostly right, with
    one class flipped (added or removed) on 10% of the images."""
    rng = np.random.default_rng(seed)
    true = (rng.random((count, classes)) < 0.3).astype(np.uint8)
    logits = rng.normal(0, 1, true.shape) + np.where(true == 1, 2.0, -2.0)
    probs = 1 / (1 + np.exp(-logits))
    given = true.copy()
    moved = rng.choice(count, count // 10, replace=False)
    given[moved, rng.integers(0, classes, len(moved))] ^= 1
    return given, probs


def as_lists(targets):
    """cleanlab's multi-label form, written here apart from the code under test."""
    return [[k for k in range(targets.shape[1]) if targets[i, k]] for i in range(len(targets))]


def test_the_issues_are_cleanlabs_multi_label_find_label_issues_ranked_by_self_confidence():
    from cleanlab.filter import find_label_issues

    from src.deploy.label_issues import find_issues
    from src.utils.tasks import MULTILABEL

    for seed in range(3):
        given, probs = noisy_multilabel(seed)
        expected = find_label_issues(as_lists(given), probs, multi_label=True,
                                     return_indices_ranked_by="self_confidence", n_jobs=1)
        found = find_issues(given, probs, MULTILABEL)
        assert len(expected) > 5
        np.testing.assert_array_equal(found, expected)
        # and by the task's name
        np.testing.assert_array_equal(find_issues(given, probs, "multilabel"), expected)


def test_the_rows_give_label_sets_scored_by_cleanlabs_label_quality_score_in_rank_order():
    from cleanlab.multilabel_classification.rank import get_label_quality_scores

    from src.deploy.label_issues import find_issues, issue_rows, issues_csv
    from src.utils.tasks import MULTILABEL

    names = ["a", "b", "c", "d", "e"]
    given, probs = noisy_multilabel(4)
    paths = [f"img/{i}.jpg" for i in range(len(given))]
    ranked = find_issues(given, probs, MULTILABEL)
    rows = issue_rows(ranked, paths=paths, labels=given, probs=probs, class_names=names,
                      task=MULTILABEL)
    quality = get_label_quality_scores(as_lists(given), probs)
    assert [r["score"] for r in rows] == [round(float(quality[i]), 6) for i in ranked]
    assert all(a <= b for a, b in zip(quality[ranked], quality[ranked][1:]))  # the ranking's
    for row, i in zip(rows, ranked):
        assert row["path"] == paths[i]
        assert row["given_label"] == " ".join(n for n, g in zip(names, given[i]) if g)
        assert row["suggested_label"] == " ".join(n for n, p in zip(names, probs[i]) if p >= 0.5)
        assert set(row["removed"]) == set(row["given_label"].split()) - set(
            row["suggested_label"].split())
        assert set(row["added"]) == set(row["suggested_label"].split()) - set(
            row["given_label"].split())
    table = list(csv.reader(io.StringIO(issues_csv(rows))))
    assert table[0] == ["path", "given_label", "suggested_label", "score"]
    assert len(table) == len(rows) + 1


def test_an_issue_set_worked_by_hand():
    """Given {a, b}; the model: a 0.9, b 0.2, c 0.7. Suggested {a, c}: b would be removed, c
    added. Per-class self-confidence 0.9, 0.2 (given: p), 0.3 (not given: 1 - p); cleanlab's
    exponential moving average of them sorted high to low (alpha 0.8): 0.9, then
    0.8 * 0.3 + 0.2 * 0.9 = 0.42, then 0.8 * 0.2 + 0.2 * 0.42 = 0.244."""
    from src.deploy.label_issues import issue_rows
    from src.utils.tasks import MULTILABEL

    rows = issue_rows(np.array([0]), paths=["x.jpg"], labels=np.array([[1, 1, 0]]),
                      probs=np.array([[0.9, 0.2, 0.7]]), class_names=["a", "b", "c"],
                      task=MULTILABEL)
    assert {k: rows[0][k] for k in ("given_label", "suggested_label", "score", "removed",
                                    "added")} == {
        "given_label": "a b", "suggested_label": "a c", "score": 0.244, "removed": ["b"],
        "added": ["c"]}


def test_the_page_marks_the_labels_to_remove_and_add_and_counts_them_per_class():
    from src.deploy.label_issues import issue_rows, issues_page
    from src.utils.tasks import MULTILABEL

    image = os.path.join(MOSAICS, "train", "0001.jpg")
    names = ['<i>cat</i>', "dog", "ship"]
    labels = np.array([[1, 1, 0], [0, 1, 0], [1, 0, 0], [1, 0, 1]], np.uint8)
    probs = np.array([[0.9, 0.1, 0.8], [0.6, 0.9, 0.1], [0.2, 0.1, 0.9], [0.9, 0.1, 0.8]])
    ranked = np.array([2, 0, 1])
    rows = issue_rows(ranked, paths=[image] * 4, labels=labels, probs=probs, class_names=names,
                      task=MULTILABEL)
    page = issues_page(rows, summary={"images": 4, "issues": 3, "out_of_fold_mAP": 0.5},
                       labels=labels, class_names=names, shown=10, task=MULTILABEL)
    assert "<i>cat</i>" not in page and html.escape(names[0]) in page
    assert "out-of-fold mAP" in page
    cards = re.findall(r'<div class="card issue" data-rank="(\d+)">(.*?)<div class="path">',
                       page)
    assert [rank for rank, _ in cards] == ["1", "2", "3"]
    # image 2: given cat, suggested ship: cat removed, ship added
    assert re.search(r'given <span class="removed">&minus;&lt;i&gt;cat&lt;/i&gt; \(0\.200\)'
                     r"</span></div>", cards[0][1]), cards[0][1]
    assert re.search(r'suggested <span class="added">\+ship \(0\.900\)</span></div>',
                     cards[0][1]), cards[0][1]
    # per class (computed here): images holding it, issues removing it, issues adding it
    removing = {n: sum(n in r["removed"] for r in rows) for n in names}
    adding = {n: sum(n in r["added"] for r in rows) for n in names}
    assert (removing, adding) == ({names[0]: 1, "dog": 1, "ship": 0},
                                  {names[0]: 1, "dog": 0, "ship": 2})
    body = re.search(r'<table id="per-class".*?</table>', page).group(0)
    cells = re.findall(r'<tr><td class="text">(.*?)</td><td>(\d+)</td><td>(\d+)</td>'
                       r"<td>(\d+)</td></tr>", body)
    assert cells == [(html.escape(n), str(int(labels[:, k].sum())), str(removing[n]),
                      str(adding[n])) for k, n in enumerate(names)]
    assert "images holding it" in body


def random_tables():
    """(targets, K, seed) cases: varied sizes, class counts and label densities."""
    for case, (n, classes, folds) in enumerate(((150, 6, 3), (97, 4, 4), (400, 10, 5),
                                                (61, 3, 2), (250, 8, 3))):
        rng = np.random.default_rng(100 + case)
        targets = (rng.random((n, classes)) < rng.uniform(0.05, 0.5, classes)).astype(np.uint8)
        yield targets, folds, case


def test_k_fold_stratification_balances_rows_and_each_classs_positives():
    from src.data.multilabel import multilabel_folds

    for targets, folds, seed in random_tables():
        n, counts = len(targets), targets.sum(0)
        assigned = multilabel_folds(targets, folds, seed)
        assert assigned.shape == (n,) and assigned.dtype == np.int64
        sizes = np.bincount(assigned, minlength=folds)
        assert sorted(sizes.tolist()) == sorted([n // folds + (j < n % folds)
                                                 for j in range(folds)])
        per_fold = np.stack([targets[assigned == j].sum(0) for j in range(folds)])
        assert (per_fold[:, counts >= folds] >= 1).all(), per_fold
        deviation = np.abs(per_fold - counts / folds)
        rarest = int(np.argmin(counts))  # placed first: exactly n // K or one more per fold
        assert deviation[:, rarest].max() < 1, per_fold[:, rarest]
        assert deviation.mean() < 0.8, deviation.mean()  # dealt in row order: about 2
        np.testing.assert_array_equal(assigned, multilabel_folds(targets, folds, seed))
        assert (assigned != multilabel_folds(targets, folds, seed + 1)).any()


def test_the_shipped_mosaics_in_3_folds_hold_every_class_in_every_fold():
    from src.data.multilabel import multilabel_folds, read_label_file

    table = read_label_file(os.path.join(MOSAICS, "train.csv"), MOSAICS, check_images=False)
    assigned = multilabel_folds(table.targets, 3, 1)
    assert np.bincount(assigned).tolist() == [200, 200, 200]
    per_fold = np.stack([table.targets[assigned == j].sum(0) for j in range(3)])
    deviation = np.abs(per_fold - table.targets.sum(0) / 3)
    # measured: ship, the most frequent, 56/44/54 of 154 (7.3 from 51.3); most within 1
    assert deviation.max() <= 0.15 * table.targets.sum(0).max() / 3, per_fold
    assert np.median(deviation) < 1 and deviation.mean() < 1.5, deviation


# multilabel_split's outputs recorded before it shared its loop with the K-part folds
RECORDED_TARGETS = [
    [0, 0, 0, 1], [1, 0, 0, 1], [1, 0, 0, 1], [0, 0, 0, 0], [0, 0, 0, 1], [0, 1, 0, 1],
    [0, 0, 1, 0], [0, 1, 0, 1], [0, 0, 1, 1], [0, 1, 1, 0], [0, 0, 1, 1], [0, 0, 0, 1],
    [1, 0, 1, 0], [0, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0], [1, 0, 0, 0], [0, 1, 0, 0],
    [0, 0, 0, 0], [0, 0, 0, 1], [0, 0, 0, 0], [0, 0, 1, 0], [1, 0, 0, 0], [0, 1, 0, 1]]
RECORDED_SPLITS = {(0.25, 0): [1, 5, 10, 15, 18, 20],
                   (0.5, 3): [0, 2, 6, 7, 12, 13, 16, 17, 19, 20, 21, 23],
                   (0.2, 11): [2, 4, 6, 14, 18],
                   (0.1, 2): [1, 9],  # each label of 2 or more wants 1 image on each side
                   (0.9, 1): [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 13, 14, 15, 16, 18, 19,
                              20, 21, 22, 23]}


@pytest.mark.parametrize("fraction, seed", list(RECORDED_SPLITS))
def test_the_two_part_split_is_the_one_recorded_before_the_k_part_folds(fraction, seed):
    from src.data.multilabel import multilabel_split

    train, val = multilabel_split(np.array(RECORDED_TARGETS, np.uint8), fraction, seed)
    assert val.tolist() == RECORDED_SPLITS[fraction, seed]
    assert sorted(train.tolist() + val.tolist()) == list(range(len(RECORDED_TARGETS)))


@pytest.mark.parametrize("tags, folds, message", [
    (["cat dog", "cat dog", "cat dog frog", "cat", "dog frog", "cat dog"], 3,
     r"label_folds 3 is larger than the 2 images of class 'frog' in label_file T: every fold "
     r"holds out at least one image of each class; use label_folds 2 or less"),
    (["cat dog", "cat dog", "cat frog"], 2,
     "the 1 image of class 'frog' in label_file T.*add images: every class needs 2 or more"),
    (["cat dog", "cat", "cat dog"], 2, r"class 'cat' is given to all 3 images of label_file T"),
    (["cat", "cat"], 2, r"label_file T names one class \('cat'\)"),
    (["cat", "dog"], 1, r"label_folds must be 2 or more .*got 1"),
])
def test_fold_assignment_of_a_table_refuses_too_few_positives_by_name(tags, folds, message):
    from src.data.folds import multilabel_fold_assignment
    from src.utils.config import ConfigError

    names = sorted({t for row in tags for t in row.split()})
    targets = np.array([[name in row.split() for name in names] for row in tags], np.uint8)
    with pytest.raises(ConfigError, match=message):
        multilabel_fold_assignment(targets, folds, 1, names, label_file="T")


def test_a_fold_of_a_table_trains_with_its_label_file_under_either_launcher(tmp_path):
    """The command line, and the CPU launcher passing --label_file on to train.py (msrun
    replaced by a script that records its arguments)."""
    from src.training.cross_validation import fold_command

    data, recipe, out = tmp_path / "data", tmp_path / "R.yaml", tmp_path / "OUT"
    data.mkdir()
    recipe.write_text("epoch_size: 1\n")
    rows = os.path.join("fold_1", "train.csv")  # relative: passed absolute
    script = os.path.join(ROOT, "scripts", "run_distribute_train_cpu.sh")
    command = fold_command(str(recipe), str(data), str(out), fresh=False, launcher="CPU",
                           device_num=2, label_file=rows)
    assert command == ["bash", script, "--device_num", "2", str(data), str(recipe), str(out),
                       "--label_file", os.path.abspath(rows), "--resume_ckpt", "auto"]
    single = fold_command("R.yaml", "D", "O", fresh=True, label_file=rows)
    assert single[2:] == ["--config_path", "R.yaml", "--data_path", "D", "--output_dir", "O",
                          "--label_file", os.path.abspath(rows), "--resume_ckpt", "auto",
                          "--overwrite", "true"]
    fake = tmp_path / "msrun"
    fake.write_text('#!/bin/sh\nprintf "%s\\n" "$@" > "$(dirname "$0")/msrun_args"\n')
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    subprocess.run(command, env=dict(os.environ, MSRUN=str(fake)), check=True,
                   capture_output=True, timeout=60)
    passed = (tmp_path / "msrun_args").read_text().splitlines()
    train_args = passed[passed.index(os.path.join(ROOT, "train.py")) + 1:]
    at = train_args.index("--label_file")
    assert train_args[at + 1] == os.path.abspath(rows)
    assert train_args[train_args.index("--data_path") + 1] == str(data)


@pytest.fixture(scope="module")
def bad_tables(tmp_path_factory):
    """Label files over the shipped mosaics: one with a class on 2 images, one of one class."""
    root = tmp_path_factory.mktemp("label_issues_tables")
    tables = {}
    for name, tags in (("few", ["cat dog", "cat dog", "cat dog frog", "cat", "dog frog",
                                "cat dog"]),
                       ("one", ["cat", "cat", "cat"])):
        path = root / f"{name}.csv"
        path.write_text("image_name,tags\n" + "".join(
            f"train/{i + 1:04d}.jpg,{t}\n" for i, t in enumerate(tags)))
        tables[name] = str(path)
    tables["missing"] = str(root / "missing.csv")
    return tables


@pytest.mark.parametrize("table, args, message", [
    ("few", ("--label_folds", "3"),
     r"label_folds 3 is larger than the 2 images of class 'frog' in label_file .*few\.csv"),
    ("few", ("--label_folds", "1"), "label_folds must be 2 or more"),
    ("one", ("--class_num", "1"), r"label_file .*one\.csv names one class \('cat'\)"),
    ("few", ("--class_num", "10"), r"label_file .*few\.csv: 3 classes but class_num is 10"),
    ("missing", (), r"label_file '.*missing\.csv' does not exist"),
    ("few", ("--task", "multiclass", "--loss", "ce"),
     r"label_file .*few\.csv is read with task multilabel only \(task is multiclass\)"),
    (None, ("--label_file", ""), "task multilabel: label_file is empty"),
])
def test_bad_tables_are_refused_by_name_before_any_work(bad_tables, tmp_path, table, args,
                                                        message):
    out = tmp_path / "out"
    given = ("--label_file", bad_tables[table]) if table else ()
    result = run_in_process("label_issues.py", *TINY_TABLE, "--output_dir", out,
                            "--class_num", "3", *given, *args)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert re.fullmatch(f"label_issues.py: error: .*{message}.*", lines[-1]), lines[-1]
    assert not out.exists()


@pytest.fixture(scope="module")
def table_run(tmp_path_factory):
    """label_issues.py on the first 60 rows of the shipped mosaics' train.csv (rows relative
    to data/cifar10_mosaics), 2 folds of 1 epoch at 32 px."""
    root = tmp_path_factory.mktemp("label_issues_table_run")
    with open(os.path.join(MOSAICS, "train.csv"), encoding="utf-8") as f:
        lines = f.read().splitlines()[:61]
    table = root / "slice.csv"
    table.write_text("\n".join(lines) + "\n")
    out = str(root / "out")
    args = (*TINY_TABLE, "--label_file", str(table), "--output_dir", out, "--label_folds", "2")
    first = succeeded(run_entry("label_issues.py", *args))  # a process of its own, as a user's
    return {"table": str(table), "out": out, "args": args, "first": first}


@pytest.mark.slow
def test_each_fold_of_a_table_trains_on_a_label_file_of_the_other_folds_rows(table_run):
    from src.data.multilabel import read_label_file

    out = table_run["out"]
    given = read_csv_rows(table_run["table"])
    folds = read_csv_rows(os.path.join(out, "folds.csv"))
    assert list(folds[0]) == ["path", "labels", "fold"]
    assert [(r["path"], r["labels"]) for r in folds] == [(r["image_name"], r["tags"])
                                                        for r in given]
    for k in (1, 2):
        rows_file = os.path.join(out, f"fold_{k}", "train.csv")
        with open(rows_file, encoding="utf-8") as f:
            assert f.readline() == "image_name,tags\n"  # the input's header
        trained = [(r["image_name"], r["tags"]) for r in read_csv_rows(rows_file)]
        assert trained == [(r["path"], r["labels"]) for r in folds if r["fold"] != str(k)]
        assert all(not os.path.isabs(path) for path, _ in trained)
        log = open(os.path.join(out, f"fold_{k}", "train", "train.log")).read()
        assert f"label_file: {os.path.abspath(rows_file)}" in log
    table = read_label_file(table_run["table"], MOSAICS, check_images=False)
    with np.load(os.path.join(out, "out_of_fold.npz")) as saved:
        np.testing.assert_array_equal(saved["labels"], table.targets)
        assert list(saved["class_names"]) == table.class_names
        assert saved["probabilities"].shape == (60, 10)
        assert not np.allclose(saved["probabilities"].sum(1), 1, atol=0.05)  # not a softmax


@pytest.mark.slow
def test_the_held_out_probabilities_of_a_table_are_predict_pys_sigmoids(table_run):
    import json

    out = table_run["out"]
    folds = read_csv_rows(os.path.join(out, "folds.csv"))
    first_held = next(i for i, r in enumerate(folds) if r["fold"] == "1")
    checkpoint = next(os.path.join(out, "fold_1", "train", name) for name in sorted(
        os.listdir(os.path.join(out, "fold_1", "train"))) if name.endswith(".ckpt"))
    result = succeeded(run_in_process(
        "predict.py", "--checkpoint_path", checkpoint, "--top_k", "10",
        "--image_path", os.path.join(MOSAICS, folds[first_held]["path"])))
    answer = json.loads(result.stdout.strip().splitlines()[-1])
    assert "labels" in answer  # a multi-label model's answer: the record says so
    predicted = {entry["name"]: entry["probability"] for entry in answer["top"]}
    with np.load(os.path.join(out, "out_of_fold.npz")) as saved:
        ours = dict(zip(saved["class_names"], saved["probabilities"][first_held]))
    assert predicted.keys() == ours.keys()
    for name, p in ours.items():
        assert abs(predicted[name] - p) < 1e-5, (name, predicted[name], p)


@pytest.mark.slow
def test_the_outputs_of_a_table_are_cleanlabs_issues_on_its_out_of_fold_probabilities(
        table_run):
    from cleanlab.filter import find_label_issues

    out = table_run["out"]
    with np.load(os.path.join(out, "out_of_fold.npz")) as saved:
        targets, probs, paths = saved["labels"], saved["probabilities"], saved["paths"]
        names = list(saved["class_names"])
    expected = find_label_issues(as_lists(targets), probs, multi_label=True,
                                 return_indices_ranked_by="self_confidence", n_jobs=1)
    rows = read_csv_rows(os.path.join(out, "label_issues.csv"))
    assert list(rows[0]) == ["path", "given_label", "suggested_label", "score"]
    assert [os.path.relpath(r["path"], MOSAICS) for r in rows] == [paths[i] for i in expected]
    for row, i in zip(rows, expected):
        assert row["given_label"] == " ".join(n for n, t in zip(names, targets[i]) if t)
    page = open(os.path.join(out, "label_issues.html"), encoding="utf-8").read()
    assert page.count('class="card issue"') == len(rows)
    assert all(f'<td class="text">{name}</td>' in page for name in names)
    assert '"out_of_fold_mAP"' in table_run["first"].stdout


@pytest.mark.slow
def test_a_rerun_on_a_table_trains_nothing_and_predicts_a_fold_left_unpredicted(table_run):
    out, args = table_run["out"], table_run["args"]
    check_label_issues_resume(out, args)
    changed = run_in_process("label_issues.py", *args[:-2], "--label_folds", "3")
    assert changed.returncode == 2
    assert re.search(r"folds.csv assigns the images to folds otherwise than label_folds 3",
                     changed.stderr), changed.stderr
