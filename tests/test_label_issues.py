"""label_issues.py: the folds (disjoint, covering, stratified), the issues (cleanlab's
``find_label_issues`` ranked by self-confidence, and a case worked by hand), the CSV and the
page (exactly the ranked issues, names escaped), bad input refused by name (exit 2), the
data-parallel fold command, and one end-to-end run on shipped images with labels swapped on
purpose (the plumbing, resumption: a finished fold is not trained again)."""
import csv
import html
import io
import os
import re
import shutil

import numpy as np
import pytest

from tests.helpers import (
    CIFAR_SAMPLE,
    ROOT,
    check_label_issues_resume,
    copy_class_folders,
    read_csv_rows,
    run_entry,
    run_in_process,
    succeeded,
)

TRAIN_SAMPLE = os.path.join(CIFAR_SAMPLE, "train")
TINY = ("--config_path", "configs/quick_start.yaml", "--epoch_size", "1", "--batch_size", "8",
        "--num_parallel_workers", "1", "--check_images", "false")


def noisy_probabilities(seed=0, count=120, classes=4):
    """Given labels and probabilities of a classifier that is right about 80% of the time,
    with 10% of the labels moved to another class: the input of confident learning."""
    rng = np.random.default_rng(seed)
    true = np.repeat(np.arange(classes), count // classes)
    logits = rng.normal(0, 1, (len(true), classes))
    logits[np.arange(len(true)), true] += 2.0
    probs = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    given = true.copy()
    moved = rng.choice(len(true), len(true) // 10, replace=False)
    given[moved] = (true[moved] + rng.integers(1, classes, len(moved))) % classes
    return given, probs


def test_the_issues_are_cleanlabs_find_label_issues_ranked_by_self_confidence():
    from cleanlab.filter import find_label_issues

    from src.deploy.label_issues import find_issues

    for seed in range(3):
        labels, probs = noisy_probabilities(seed)
        expected = find_label_issues(labels, probs, return_indices_ranked_by="self_confidence",
                                     n_jobs=1)  # no fork of a process holding MindSpore
        found = find_issues(labels, probs)
        assert len(expected) > 5
        np.testing.assert_array_equal(found, expected)


def test_an_issue_worked_by_hand():
    """Two classes, four images each; image 3 is labelled 0 but the model gives class 1 0.9
    and image 7 labelled 1 gives class 0 0.8. Per-class thresholds (mean self-confidence): 0:
    (0.9*3 + 0.1)/4 = 0.7, 1: (0.9*3 + 0.2)/4 = 0.725; confident joint off the diagonal:
    image 3 (p1 0.9 >= 0.725) and image 7 (p0 0.8 >= 0.7), one each, so one issue per class
    is pruned: the largest margin p_other - p_given in each (images 3 and 7). Ranked by
    self-confidence: image 3 (0.1) before image 7 (0.2)."""
    from src.deploy.label_issues import find_issues

    p_one = np.array([0.1, 0.1, 0.1, 0.9, 0.9, 0.9, 0.9, 0.2])
    probs = np.stack([1 - p_one, p_one], 1)
    labels = np.array([0, 0, 0, 0, 1, 1, 1, 1])
    assert find_issues(labels, probs).tolist() == [3, 7]


def test_folds_are_disjoint_cover_every_image_and_hold_each_class_evenly():
    from src.data.folds import fold_assignment

    labels = np.repeat([0, 1, 2], [7, 5, 9])
    names = ["a", "b", "c"]
    assigned = fold_assignment(labels, 3, 1, names, data_path="D")
    assert assigned.shape == labels.shape and set(assigned.tolist()) == {0, 1, 2}
    for label, count in enumerate((7, 5, 9)):
        per_fold = np.bincount(assigned[labels == label], minlength=3)
        assert per_fold.sum() == count and per_fold.max() - per_fold.min() <= 1, per_fold
    np.testing.assert_array_equal(assigned, fold_assignment(labels, 3, 1, names, data_path="D"))
    assert (assigned != fold_assignment(labels, 3, 2, names, data_path="D")).any()


def test_out_of_fold_takes_each_image_from_the_fold_that_held_it_out():
    from src.data.folds import out_of_fold

    first = (np.array([0, 3]), np.array([[0.1, 0.9], [0.2, 0.8]], np.float32))
    second = (np.array([1, 2]), np.array([[0.7, 0.3], [0.6, 0.4]], np.float32))
    np.testing.assert_array_equal(out_of_fold([first, second], 4), np.array(
        [[0.1, 0.9], [0.7, 0.3], [0.6, 0.4], [0.2, 0.8]], np.float32))
    with pytest.raises(ValueError, match="2 images held out by no fold, 0 by several"):
        out_of_fold([first], 4)
    with pytest.raises(ValueError, match="0 images held out by no fold, 2 by several"):
        out_of_fold([first, second, first], 4)


def test_the_csv_and_the_page_list_exactly_the_ranked_issues_names_escaped():
    from src.deploy.label_issues import issue_rows, issues_csv, issues_page

    paths = [os.path.join(TRAIN_SAMPLE, c, "0000.jpg") for c in ("cat", "dog", "ship", "frog")]
    names = ['<b>cat</b> & "co"', "dog", "ship"]
    labels = np.array([0, 1, 2, 0])
    probs = np.array([[0.1, 0.6, 0.3], [0.5, 0.4, 0.1], [0.2, 0.2, 0.6], [0.05, 0.15, 0.8]])
    # as ranked: image 3 (0.05 for its label), 0 (0.1), then 2, whose given class is its most
    # probable: the suggestion is the most probable other one (the first of a tie)
    ranked = np.array([3, 0, 2])
    rows = issue_rows(ranked, paths=paths, labels=labels, probs=probs, class_names=names)
    table = list(csv.reader(io.StringIO(issues_csv(rows))))
    assert table == [["path", "given_label", "suggested_label", "score"],
                     [paths[3], names[0], "ship", "0.05"], [paths[0], names[0], "dog", "0.1"],
                     [paths[2], "ship", names[0], "0.6"]]
    page = issues_page(rows, summary={"images": 4, "issues": 3, "folds": 2}, labels=labels,
                       class_names=names, shown=10)
    cards = re.findall(r'<div class="card issue" data-rank="(\d+)">.*?<div class="path">(.*?)'
                       r"</div></div>", page)
    assert cards == [(str(rank), html.escape(paths[i])) for rank, i in enumerate(ranked, 1)]
    assert "<b>cat</b>" not in page and html.escape(names[0]) in page
    assert page.count("data:image/jpeg;base64,") == 3 and "http" not in page
    assert len(re.findall(r'class="card issue"', issues_page(
        rows, summary={}, labels=labels, class_names=names, shown=1))) == 1


def test_a_data_parallel_fold_runs_under_the_launcher_of_its_device():
    from src.training.cross_validation import fold_command

    script = os.path.join(ROOT, "scripts", "run_distribute_train_cpu.sh")
    assert fold_command("R.yaml", "IMG", "OUT", fresh=False, launcher="CPU", device_num=2) == [
        "bash", script, "--device_num", "2", "IMG", "R.yaml", "OUT", "--resume_ckpt", "auto"]
    single = fold_command("R.yaml", "IMG", "OUT", fresh=True)
    assert single[1:] == [os.path.join(ROOT, "train.py"), "--config_path", "R.yaml",
                          "--data_path", "IMG", "--output_dir", "OUT", "--resume_ckpt", "auto",
                          "--overwrite", "true"]


def test_a_failed_fold_ends_the_command_with_its_status_naming_its_log(tmp_path):
    import sys

    from src.training.cross_validation import FoldError, run_fold

    log = tmp_path / "train.log"
    log.write_text("a line\n")
    with pytest.raises(FoldError, match=rf"^fold 2 of 3: training ended with status 3; .* in "
                                        rf"{re.escape(str(log))}\. Rerun the same command"
                       ) as failed:
        run_fold([sys.executable, "-c", "raise SystemExit(3)"], "fold 2 of 3", str(log))
    assert failed.value.exit_status == 3
    # refused before it trained: no log to name, and nothing to resume
    with pytest.raises(FoldError, match=r"^fold 1 of 2: training ended with status 2; its lines "
                                        r"are above \(it ended before training, without a "
                                        r"train.log\): fix what they name and run the command "
                                        r"again$"):
        run_fold([sys.executable, "-c", "raise SystemExit(2)"], "fold 1 of 2",
                 str(tmp_path / "none" / "train.log"))


@pytest.mark.slow
def test_training_keys_may_change_until_a_fold_has_trained(uneven_data, tmp_path):
    """A fold that refuses its keys (a batch larger than its images) trained nothing: the
    command run again with other keys takes them (fold_train.yaml rewritten, one log line);
    once a fold has a checkpoint, other keys are refused naming the file and that fold."""
    out = tmp_path / "out"
    args = (*TINY, "--data_path", uneven_data["three"], "--output_dir", out, "--class_num", "3",
            "--label_folds", "2")
    for batch in ("64", "32"):
        result = run_in_process("label_issues.py", *args, "--batch_size", batch)
        assert result.returncode == 2, result.stderr
        assert result.stderr.strip().splitlines()[-1].endswith(
            "fix what they name and run the command again"), result.stderr
        assert f"batch_size: {batch}" in (out / "fold_train.yaml").read_text()
    assert "no fold has trained yet, the training keys are taken as given now: batch_size " \
           "64 -> 32" in result.stdout + result.stderr
    (out / "fold_1" / "train").mkdir(parents=True, exist_ok=True)
    (out / "fold_1" / "train" / "resnet18-1_1.ckpt").write_bytes(b"")  # a fold has trained
    refused = run_in_process("label_issues.py", *args, "--batch_size", "16")
    assert refused.returncode == 2
    assert re.search(r"fold_train.yaml holds the training keys this output_dir's folds were "
                     r"started with \(.*fold_1 has a checkpoint or its predictions\); now "
                     r"batch_size 32 -> 16", refused.stderr), refused.stderr


def test_a_stop_signal_is_passed_on_to_the_fold_which_ends_before_the_command(tmp_path):
    """SIGTERM to the command while a fold trains: the fold's process (a group of its own)
    gets it, ends in its own time (here it writes a file first), then the command stops."""
    import signal
    import sys
    import threading

    from src.training.cross_validation import run_fold
    from src.utils import cli

    ready, ended = tmp_path / "ready", tmp_path / "ended"
    child = ("import pathlib, signal, sys, time\n"
             "def stop(signum, frame):\n"
             "    time.sleep(0.3)\n"
             "    pathlib.Path(sys.argv[2]).write_text(str(signum))\n"
             "    sys.exit(143)\n"
             "signal.signal(signal.SIGTERM, stop)\n"
             "pathlib.Path(sys.argv[1]).write_text('up')\n"
             "time.sleep(20)\n")

    def signal_when_ready():
        for _ in range(500):
            if ready.exists():
                break
            threading.Event().wait(0.02)
        os.kill(os.getpid(), signal.SIGTERM)

    previous = signal.signal(signal.SIGTERM, cli._raise_stop)
    try:
        threading.Thread(target=signal_when_ready, daemon=True).start()
        with pytest.raises(cli.StopSignal) as stop:
            run_fold([sys.executable, "-c", child, str(ready), str(ended)], "fold 1 of 2", "L")
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert stop.value.signum == signal.SIGTERM
    assert ended.read_text() == str(int(signal.SIGTERM))


def test_a_rerun_with_other_weights_or_training_keys_is_told_apart_from_other_workers(tmp_path):
    from src.recipe import changed_training_keys
    from src.utils.config import Config, load_schema

    defaults = load_schema()[0]
    recipe = tmp_path / "fold_train.yaml"
    assert changed_training_keys(str(recipe), Config({"epoch_size": 4}), defaults) == []
    recipe.write_text(Config({"epoch_size": 3, "num_parallel_workers": 2}).to_yaml())
    assert changed_training_keys(str(recipe), Config({"epoch_size": 3, "num_parallel_workers": 4}),
                                 defaults) == []
    changed = changed_training_keys(str(recipe), Config({"pre_trained": "w.ckpt",
                                                         "use_ema": False}), defaults)
    assert sorted(changed) == ["epoch_size 3 -> 90", "pre_trained '' -> 'w.ckpt'",
                               "use_ema True -> False"]


@pytest.fixture(scope="module")
def uneven_data(tmp_path_factory):
    """Class folders of 4, 4 and 2 shipped CIFAR-10 images, and one of a single class."""
    root = tmp_path_factory.mktemp("label_issues_data")
    data = copy_class_folders(TRAIN_SAMPLE, str(root / "three"), 4, ["bird", "cat", "deer"])
    for name in sorted(os.listdir(os.path.join(data, "deer")))[2:]:
        os.remove(os.path.join(data, "deer", name))
    one = copy_class_folders(TRAIN_SAMPLE, str(root / "one"), 4, ["cat"])
    return {"three": data, "one": one}


@pytest.mark.parametrize("case, args, message", [
    ("three", ("--label_folds", "1"), "label_folds must be 2 or more .*got 1"),
    ("three", ("--label_folds", "3"),
     r"label_folds 3 is larger than the 2 images of class 'deer' in data_path .*three"),
    ("one", ("--class_num", "1"), r"data_path .*one holds one class folder \('cat'\)"),
    ("three", ("--epoch_size", "0"), "epoch_size must be a positive integer, got 0"),
    ("three", ("--class_num", "5"), r"data_path .*three has 3 classes but class_num is 5"),
    ("three", ("--task", "multilabel"), "task multilabel: label_file is empty"),
    ("three", ("--dataset", "cifar10"), "dataset cifar10: label_issues.py reads class folders"),
    ("three", ("--resume_ckpt", "x.ckpt"), "resume_ckpt x.ckpt: the command resumes each fold"),
    ("three", ("--overwrite", "true"), "overwrite true: give a new output_dir"),
])
def test_bad_input_is_refused_by_name_before_any_work(uneven_data, tmp_path, case, args,
                                                      message):
    out = tmp_path / "out"
    result = run_in_process("label_issues.py", *TINY, "--data_path", uneven_data[case],
                            "--output_dir", out, "--class_num", "3", *args)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert re.fullmatch(f"label_issues.py: error: .*{message}.*", lines[-1]), lines[-1]
    assert not out.exists()


def test_an_output_dir_in_use_or_of_other_folds_is_refused(uneven_data, tmp_path):
    from src.data.folds import record_folds
    from src.utils.config import ConfigError
    from src.utils.files import FileLock

    out = tmp_path / "out"
    out.mkdir()
    held = FileLock(str(out / ".label_issues.lock"), in_use=str, what="test")
    held.acquire()
    try:
        result = run_in_process("label_issues.py", *TINY, "--data_path", uneven_data["three"],
                                "--output_dir", out, "--class_num", "3", "--label_folds", "2")
    finally:
        held.release()
    assert result.returncode == 2
    assert re.search(r"error: output_dir .*out is in use by another label_issues.py \(\S+ \d+\)",
                     result.stderr), result.stderr
    assert not (out / "folds.csv").exists()
    assert record_folds(str(out), "path,label,fold\na/1.jpg,a,1\n", folds=2, seed=1,
                        data_path="D") is False
    assert record_folds(str(out), "path,label,fold\na/1.jpg,a,1\n", folds=2, seed=1,
                        data_path="D") is True
    with pytest.raises(ConfigError, match=r"folds.csv assigns the images to folds otherwise than "
                                          r"label_folds 3 with seed 1 does for data_path D"):
        record_folds(str(out), "path,label,fold\na/1.jpg,a,2\n", folds=3, seed=1, data_path="D")


@pytest.fixture(scope="module")
def swapped_run(tmp_path_factory):
    """label_issues.py on 30 shipped CIFAR-10 images (10 of bird, cat, deer) of which 3 were
    moved into another class folder, 2 folds of 1 epoch at 32 px."""
    root = tmp_path_factory.mktemp("label_issues_run")
    data = copy_class_folders(TRAIN_SAMPLE, str(root / "data"), 10, ["bird", "cat", "deer"])
    swapped = []
    for source, target in (("bird", "cat"), ("cat", "deer"), ("deer", "bird")):
        name = sorted(os.listdir(os.path.join(data, source)))[0]
        new = os.path.join(data, target, f"moved_{name}")
        shutil.move(os.path.join(data, source, name), new)
        swapped.append(new)
    out = str(root / "out")
    args = (*TINY, "--data_path", data, "--output_dir", out, "--class_num", "3",
            "--label_folds", "2")
    first = succeeded(run_entry("label_issues.py", *args))  # a process of its own, as a user's
    return {"data": data, "out": out, "args": args, "first": first, "swapped": swapped}


def read_folds(out):
    return read_csv_rows(os.path.join(out, "folds.csv"))


@pytest.mark.slow
def test_each_fold_trains_on_the_others_and_every_image_gets_one_held_out_prediction(
        swapped_run):
    data, out = swapped_run["data"], swapped_run["out"]
    folds = read_folds(out)
    every = {os.path.join(c, n) for c in os.listdir(data) for n in os.listdir(
        os.path.join(data, c))}
    assert {row["path"] for row in folds} == every and len(folds) == 30
    for row in folds:  # the given label is the folder's, the moved images' too
        assert row["label"] == row["path"].split("/")[0]
    for k in (1, 2):
        linked = {os.path.join(c, n) for c in os.listdir(os.path.join(out, f"fold_{k}", "images"))
                  for n in os.listdir(os.path.join(out, f"fold_{k}", "images", c))}
        held = {row["path"] for row in folds if row["fold"] == str(k)}
        assert linked == every - held and held
        with np.load(os.path.join(out, f"fold_{k}", "held_out.npz")) as saved:
            order = sorted(every)  # the reader's order: class folders, then names
            assert {order[i] for i in saved["positions"]} == held
    with np.load(os.path.join(out, "out_of_fold.npz")) as saved:
        assert saved["probabilities"].shape == (30, 3)
        np.testing.assert_allclose(saved["probabilities"].sum(1), 1, atol=1e-5)
        assert list(saved["paths"]) == sorted(every)


@pytest.mark.slow
def test_the_outputs_name_the_issues_found_on_the_out_of_fold_probabilities(swapped_run):
    from cleanlab.filter import find_label_issues

    out = swapped_run["out"]
    with np.load(os.path.join(out, "out_of_fold.npz")) as saved:
        labels, probs, paths = saved["labels"], saved["probabilities"], saved["paths"]
    expected = find_label_issues(labels, probs, return_indices_ranked_by="self_confidence",
                                 n_jobs=1)  # no fork of a process holding MindSpore
    with open(os.path.join(out, "label_issues.csv"), encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert [os.path.relpath(r["path"], swapped_run["data"]) for r in rows] == [
        paths[i] for i in expected]
    page = open(os.path.join(out, "label_issues.html"), encoding="utf-8").read()
    assert page.count('class="card issue"') == len(rows)
    assert f'"issues": {len(rows)}' in swapped_run["first"].stdout


@pytest.mark.slow
def test_a_rerun_trains_no_finished_fold_and_predicts_a_fold_left_unpredicted(swapped_run):
    out, args = swapped_run["out"], swapped_run["args"]
    check_label_issues_resume(out, args)
    changed = run_in_process("label_issues.py", *args, "--weight_decay", "0.001")
    assert changed.returncode == 2
    assert re.search(r"fold_train.yaml holds the training keys .* weight_decay 0.0005 -> 0.001",
                     changed.stderr)
