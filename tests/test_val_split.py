"""``val_split``: one class folder split into a training and a held-out part. The folder
listing is the reader's file order; the split is deterministic, stratified, disjoint and
complete; the lists are written and read back; the pipelines read their part only (sharded
too); train.py evaluates the held-out part and eval.py ``--split_file`` evaluates it later;
bad values are errors naming the key."""
import importlib
import json
import logging
import os
import re
import shutil

import mindspore.dataset as ds
import numpy as np
import pytest

from src import recipe
from src.data.image_check import IMAGE_EXTENSIONS
from src.data.pipeline import create_dataset, image_folder_files
from src.data.settings import EvalPreprocess, Sampling, TrainAugment
from src.data.split import (
    TRAIN_SPLIT_FILE,
    VAL_SPLIT_FILE,
    read_split_file,
    split_image_folder,
    stratified_split,
    write_split_files,
)
from src.utils import device
from src.utils.config import ConfigError, parse_config
from tests.helpers import CIFAR_SAMPLE, copy_class_folders, run_in_process, succeeded

COUNTS = {"airplane": 22, "automobile": 2, "bird": 6}  # unbalanced: 22 / 1 after the split
COMMON = ["--config_path", "configs/resnet18_cifar10.yaml", "--train_image_size", "32",
          "--eval_image_size", "32", "--eval_resize", "32", "--num_parallel_workers", "2",
          "--class_num", str(len(COUNTS))]


def unbalanced_folder(root):
    """Real CIFAR-10 JPEGs, ``COUNTS`` images per class."""
    for name, count in COUNTS.items():
        copy_class_folders(os.path.join(CIFAR_SAMPLE, "train"), root, count, [name])
    return root


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return unbalanced_folder(str(tmp_path_factory.mktemp("unbalanced") / "train"))


@pytest.fixture(autouse=True)
def keep_dataset_seed():
    seed = ds.config.get_seed()
    yield
    ds.config.set_seed(seed)


def rows(dataset):
    return [label for _, labels in dataset.create_tuple_iterator(num_epochs=1, output_numpy=True)
            for label in labels.tolist()]


def test_the_folder_listing_is_the_reader_s_file_order(tmp_path):
    """Byte for byte: ImageFolderDataset (no shuffle, no decode) reads the files in
    ``image_folder_files`` order, names sorting as bytes (upper case before lower, digits
    as text, non-ASCII last), both extension cases, hidden files read, non-images skipped."""
    sources = sorted(os.path.join(CIFAR_SAMPLE, "train", "cat", n)
                     for n in os.listdir(os.path.join(CIFAR_SAMPLE, "train", "cat")))
    names = {"b": ["a10.jpg", "a9.JPEG", "B.jpg", "_x.jpg", "\u00e9t\u00e9.jpg", "a.png", ".h.jpg"],
             "A": ["z.jpg", "0.JPG"], "c": ["only.jpeg", "notes.txt"]}
    used = iter(sources)
    for cls, files in names.items():
        (tmp_path / cls).mkdir()
        for name in files:
            shutil.copy(next(used), tmp_path / cls / name)
    listed = image_folder_files(str(tmp_path))
    assert [os.path.relpath(p, tmp_path) for p, _ in listed] == [
        "A/0.JPG", "A/z.jpg", "b/.h.jpg", "b/B.jpg", "b/_x.jpg", "b/a.png", "b/a10.jpg",
        "b/a9.JPEG", "b/\u00e9t\u00e9.jpg", "c/only.jpeg"]
    read = ds.ImageFolderDataset(str(tmp_path), extensions=IMAGE_EXTENSIONS, shuffle=False)
    got = [(image.tobytes(), int(label)) for image, label in
           read.create_tuple_iterator(num_epochs=1, output_numpy=True)]
    assert got == [(open(p, "rb").read(), label) for p, label in listed]


def test_the_listing_follows_files_added_and_removed(tmp_path):
    copy_class_folders(os.path.join(CIFAR_SAMPLE, "train"), str(tmp_path), 3, ["cat", "dog"])
    assert len(image_folder_files(str(tmp_path))) == 6
    os.remove(tmp_path / "dog" / "0000.jpg")
    assert len(image_folder_files(str(tmp_path))) == 5  # not the cached listing


def test_the_split_is_stratified_disjoint_complete_and_a_function_of_the_seed():
    sizes = [40, 7, 3, 100, 2]
    labels = np.repeat(np.arange(len(sizes)), sizes)
    names = [f"class{i}" for i in range(len(sizes))]
    train_part, val = stratified_split(labels, 0.2, seed=5, class_names=names)
    assert np.array_equal(np.sort(np.concatenate([train_part, val])), np.arange(len(labels)))
    assert not set(train_part.tolist()) & set(val.tolist())
    held = np.bincount(labels[val], minlength=len(sizes)).tolist()
    assert held == [8, 1, 1, 20, 1]  # round(0.2 * n), at least 1 (7 * 0.2 = 1.4 -> 1)
    again = stratified_split(labels, 0.2, seed=5, class_names=names)
    assert all(np.array_equal(a, b) for a, b in zip((train_part, val), again))
    other = stratified_split(labels, 0.2, seed=6, class_names=names)[1]
    assert not np.array_equal(other, val)
    assert np.bincount(labels[other], minlength=len(sizes)).tolist() == held
    # not the first or last files of each class: a permutation (the 100-image class)
    big = val[labels[val] == 3] - 50
    assert big.min() < 20 and big.max() >= 80
    # a class's split depends on its own name and files only: another class added before it
    shifted = np.concatenate([np.zeros(9, np.int64), labels + 1])
    val_shifted = stratified_split(shifted, 0.2, 5, ["extra"] + names)[1]
    assert np.array_equal(val_shifted[val_shifted >= 9] - 9, val)


@pytest.mark.parametrize("sizes,value,lacks", [([5, 1], 0.2, "class1' (1 image) with no "
                                                               "training image"),
                                               ([5, 4], 0.9, "class1' (4 images) with no "
                                                             "training image"),
                                               ([5, 0], 0.2, "no validation image")])
def test_a_split_leaving_a_class_without_images_names_key_value_and_class(sizes, value, lacks):
    labels = np.repeat(np.arange(len(sizes)), sizes)
    with pytest.raises(ConfigError, match=f"val_split {value} leaves class '.*"
                                          f"{re.escape(lacks)}"):
        stratified_split(labels, value, 1, ["class0", "class1"])


@pytest.mark.parametrize("value", ["1.0", "1.5", "-0.1", "nan"])
def test_val_split_outside_0_1_is_a_config_error(value):
    with pytest.raises(ConfigError, match="val_split must be"):
        parse_config(["--val_split", value])


@pytest.mark.parametrize("extra,message", [
    (["--dataset", "cifar10"], "val_split 0.2 needs dataset imagefolder"),
    (["--split_file", "v.txt"], "split_file v.txt is read by eval.py only")])
def test_train_refuses_val_split_with_cifar10_or_a_split_file(extra, message):
    cfg = parse_config(["--data_path", "d", "--val_split", "0.2", *extra])
    with pytest.raises(ConfigError, match=message):
        recipe.check_train_config(cfg)


def test_an_explicit_eval_data_path_wins_over_val_split(folder, caplog):
    cfg = parse_config(["--config_path", "configs/quick_start.yaml", "--data_path", folder,
                        "--eval_data_path", folder, "--val_split", "0.25", "--class_num", "3",
                        "--batch_size", "4"])
    recipe.check_train_config(cfg)  # not an error
    data = recipe.build_data(cfg, 0, 1)
    assert data.train_args["sampling"].indices is None and "sampling" not in data.eval_args
    with caplog.at_level(logging.INFO):
        recipe.record_run_images(cfg, continues_here=False, class_names=data.class_names,
                                 write=False, log=logging.getLogger("t"))
    assert "val_split 0.25 not applied: eval_data_path" in caplog.text
    assert "training images per class: 3 classes, 30 images" in caplog.text  # all of them


def test_run_eval_needs_an_eval_folder_or_a_split():
    with pytest.raises(ConfigError, match="run_eval is true but eval_data_path is empty"):
        recipe.check_train_config(parse_config(["--data_path", "d", "--run_eval", "true"]))
    recipe.check_train_config(parse_config(["--data_path", "d", "--run_eval", "true",
                                           "--val_split", "0.1"]))


def test_the_lists_are_written_relative_to_the_folder_and_read_back(folder, tmp_path):
    split = split_image_folder(folder, 0.25, 3)
    train_file, val_file = write_split_files(str(tmp_path), folder, split)
    assert os.path.basename(train_file) == TRAIN_SPLIT_FILE
    lines = open(val_file, encoding="utf-8").read().splitlines()
    assert len(lines) == len(split.val) == 6 + 1 + 2 and lines == sorted(lines)
    assert all(line.count("/") == 1 and os.path.isfile(os.path.join(folder, line))
               for line in lines)
    assert not set(lines) & set(open(train_file, encoding="utf-8").read().splitlines())
    assert np.array_equal(read_split_file(val_file, folder), split.val)
    assert np.array_equal(read_split_file(train_file, folder), split.train)


@pytest.mark.parametrize("text,message", [("", "lists no image"),
                                          ("bird/nope.jpg\n", "1 of its 1 paths are no image"),
                                          ("bird/0000.jpg\nbird/0000.jpg\n", "more than once")])
def test_a_bad_split_file_is_named(folder, tmp_path, text, message):
    path = tmp_path / "v.txt"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError, match=f"split_file {path}.*{message}"):
        read_split_file(str(path), folder)


def test_the_pipelines_read_their_part_only_and_shard_it(folder):
    split = split_image_folder(folder, 0.25, 3)
    labels = np.array([label for _, label in split.files])
    ds.config.set_seed(11)
    trained = create_dataset(folder, TrainAugment(image_size=32), batch_size=1,
                             num_parallel_workers=2, sampling=Sampling(indices=split.train))
    assert sorted(rows(trained)) == sorted(labels[split.train].tolist())
    evaluated = create_dataset(folder, EvalPreprocess(image_size=32, resize=32), batch_size=4,
                               num_parallel_workers=2, sampling=Sampling(indices=split.val))
    assert rows(evaluated) == labels[split.val].tolist()  # in order
    # two shards: every held-out image once, the shorter shard padded (DistributedSampler)
    shards = [rows(create_dataset(folder, EvalPreprocess(image_size=32, resize=32), batch_size=4,
                                  num_parallel_workers=2, sampling=Sampling(
                                      indices=split.val, num_shards=2, shard_id=s)))
              for s in (0, 1)]
    assert shards[0] == labels[split.val][0::2].tolist()
    assert shards[1] == labels[split.val][1::2].tolist() + labels[split.val][:1].tolist()


@pytest.fixture(scope="module")
def split_run(folder, tmp_path_factory):
    """train.py with ``--val_split 0.25 --run_eval true --class_balance loss``: 21 images
    train (16, 1, 4), 9 are held out (6, 1, 2)."""
    out = str(tmp_path_factory.mktemp("split_run"))
    result = succeeded(run_in_process("train.py", *COMMON, "--data_path", folder, "--val_split",
                                      "0.25", "--run_eval", "true", "--class_balance", "loss",
                                      "--batch_size", "8", "--epoch_size", "1", "--output_dir",
                                      out))
    return {"out": out, "log": result.stdout + result.stderr}


@pytest.mark.slow
def test_train_evaluates_the_held_out_part_and_writes_the_lists(split_run, folder):
    out = split_run["out"]
    record = json.loads(open(os.path.join(out, "metrics.jsonl")).read().splitlines()[-1])
    assert record["eval_images"] == 9  # the held-out part, not the folder's 30
    assert record["step"] == 2  # 21 training images: 2 batches of 8
    val = open(os.path.join(out, VAL_SPLIT_FILE)).read().splitlines()
    assert np.array_equal(read_split_file(os.path.join(out, VAL_SPLIT_FILE), folder),
                          split_image_folder(folder, 0.25, 1).val)  # configs' seed 1
    assert len(val) == 9 and len(open(os.path.join(out, TRAIN_SPLIT_FILE)).readlines()) == 21
    log = split_run["log"]
    assert "val_split 0.25: 21 images train, 9 held out for run_eval" in log
    assert ("training images per class: 3 classes, 21 images: airplane 16, automobile 1, "
            "bird 4") in log
    assert "unbalanced classes: the largest has 16.0 times the images of the smallest" in log


@pytest.mark.slow
def test_eval_split_file_evaluates_the_held_out_part_only(split_run, folder, monkeypatch):
    evaluation = importlib.import_module("eval")
    monkeypatch.setattr(device, "setup_device", lambda *args, **kwargs: None)  # set once
    out = split_run["out"]
    assert evaluation.main([*COMMON, "--checkpoint_path", os.path.join(out, "resnet18-1_2.ckpt"),
                            "--data_path", folder, "--split_file",
                            os.path.join(out, VAL_SPLIT_FILE), "--batch_size", "4",
                            "--output_dir", os.path.join(out, "eval")]) == 0
    result = json.load(open(os.path.join(out, "eval", "eval_result.json")))
    assert result["images"] == 9 and np.array(result["confusion_matrix"]).sum() == 9
    held = {os.path.join(folder, line) for line in
            open(os.path.join(out, VAL_SPLIT_FILE)).read().splitlines()}
    assert {m["image"] for m in result["misclassified"]} <= held
    assert result["split_file"] == os.path.join(out, VAL_SPLIT_FILE)


def test_eval_refuses_a_split_file_for_cifar10_binaries(tmp_path):
    cfg = parse_config(["--dataset", "cifar10", "--split_file", "v.txt", "--data_path", "x"])
    with pytest.raises(ConfigError, match="split_file v.txt needs dataset imagefolder"):
        recipe.split_indices(cfg)


def test_a_resumed_run_refuses_a_changed_split(folder, tmp_path, caplog):
    """Another seed would move held-out images into training: refused unless
    resume_ignore_config, which rewrites the lists with a warning."""
    def record(seed, continues_here, *extra):
        cfg = parse_config(["--data_path", folder, "--val_split", "0.25", "--seed", str(seed),
                            "--output_dir", str(tmp_path), "--class_num", "3", *extra])
        recipe.record_run_images(cfg, continues_here=continues_here, class_names=list(COUNTS),
                                 write=True, log=logging.getLogger("t"))

    record(1, False)
    first = (tmp_path / VAL_SPLIT_FILE).read_text()
    record(1, True)  # same seed and files: fine
    with pytest.raises(ConfigError, match="val_split 0.25 with seed 2 now splits.*"
                                          "train_split.txt, val_split.txt"):
        record(2, True)
    assert (tmp_path / VAL_SPLIT_FILE).read_text() == first
    record(2, False)  # a fresh run (another output_dir's checkpoint) writes its own
    with caplog.at_level(logging.WARNING):
        record(1, True, "--resume_ignore_config", "true")
    assert "the split changed" in caplog.text and (tmp_path / VAL_SPLIT_FILE).read_text() == first


def test_run_eval_shards_count_the_held_out_part(folder):
    """Data parallel run_eval: each rank's shard of the held-out part, its own images
    counted (``eval_shard`` checks the batches against that count)."""
    from src.training.evaluator import eval_shard

    split = split_image_folder(folder, 0.25, 3)
    args = dict(settings=EvalPreprocess(image_size=32, resize=32), dataset="imagefolder",
                batch_size=2, num_parallel_workers=1, sampling=Sampling(indices=split.val))
    shards = [eval_shard(folder, args, 2, s) for s in (0, 1)]
    assert [s.image_count for s in shards] == [5, 4]  # 9 held-out images
    assert eval_shard(folder, args).dataset.get_dataset_size() == 5
