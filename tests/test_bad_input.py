"""Bad input: each case is handled (decoded, or skipped with a warning naming the file and a
count) or is an error naming the file or key and what was expected; never a bare C++ trace."""
import logging
import os
import shutil

import mindspore as ms
import pytest
from PIL import Image

from src.data.image_check import ImageFolderError, check_image_folder
from src.models.resnet import create_network
from tests.helpers import (
    GREYSCALE_JPEG,
    ROOT,
    copy_class_folders,
    run_entry,
    run_in_process,
    slow_beyond,
)

COMMON = ["--config_path", os.path.join(ROOT, "configs", "quick_start.yaml"),
          "--num_parallel_workers", "1", "--run_eval", "false"]
SAMPLE = os.path.join(ROOT, "data", "cifar10_sample", "train")


@pytest.fixture()
def folder(tmp_path):
    """Two real classes, 4 JPEGs each."""
    return copy_class_folders(SAMPLE, str(tmp_path / "data"), 4, classes=["cat", "dog"])


def error_of(script, *args, fresh=False, cwd=ROOT):
    """stderr of an entry point that must stop with exit status 2 and no traceback: run
    in-process (``run_in_process``: any other exception fails the test), or in a fresh
    interpreter with ``fresh`` (one case per entry point, the end-to-end behaviour); from
    ``cwd``."""
    if fresh:
        result = run_entry(script, *args, timeout=300, cwd=cwd)
    else:
        result = run_in_process(script, *args, cwd=cwd)
    assert result.returncode == 2, result.stdout[-2000:] + result.stderr[-2000:]
    assert "Traceback" not in result.stderr and "C++" not in result.stderr
    return result.stderr


def train_error(data, *args, fresh=False):
    """``error_of`` train.py on the class folders ``data``, from the folder above them (where
    MindSpore's decoder writes what it rejects)."""
    parent = os.path.dirname(data)
    return error_of("train.py", *COMMON, "--class_num", "2", "--batch_size", "4",
                    "--data_path", data, "--output_dir", os.path.join(parent, "out"), *args,
                    fresh=fresh, cwd=parent)


# ---- the folder layout ----

def test_data_path_missing_or_without_class_folders(tmp_path):
    assert "is not a folder" in train_error(str(tmp_path / "missing"))
    (tmp_path / "empty").mkdir()
    assert "holds no class folders" in train_error(str(tmp_path / "empty"))


def test_class_folder_without_images_is_named(folder):
    os.makedirs(os.path.join(folder, "empty_class"))
    with open(os.path.join(folder, "empty_class", "readme.txt"), "w") as f:
        f.write("no images here")
    with pytest.raises(ImageFolderError, match="class folders without images.*empty_class"):
        check_image_folder(folder)


def test_non_image_files_are_skipped_with_a_warning_and_count(folder, caplog):
    for name in ("notes.txt", ".DS_Store", "anim.gif"):
        with open(os.path.join(folder, "cat", name), "w") as f:
            f.write("x")
    with caplog.at_level(logging.WARNING):
        assert check_image_folder(folder) == ["cat", "dog"]
    assert "skipping 3 files that are not images" in caplog.text
    for name in ("notes.txt", ".DS_Store", "anim.gif"):
        assert name in caplog.text


def test_macos_metadata_files_are_named(folder):
    with open(os.path.join(folder, "dog", "._0000.jpg"), "wb") as f:
        f.write(b"\x00\x05\x16\x07 AppleDouble")
    with pytest.raises(ImageFolderError, match=r"macOS metadata.*\._0000\.jpg"):
        check_image_folder(folder)


# ---- image content ----

def test_corrupt_and_truncated_jpegs_are_named_before_training(folder):
    with open(os.path.join(folder, "cat", "corrupt.jpg"), "w") as f:
        f.write("not an image")
    with open(os.path.join(SAMPLE, "dog", "0010.jpg"), "rb") as f:
        head = f.read(300)
    with open(os.path.join(folder, "dog", "truncated.jpg"), "wb") as f:
        f.write(head)  # a truncated JPEG crashes MindSpore's decoder with SIGFPE
    message = train_error(folder, fresh=True)  # a missed truncated file would crash the process
    assert "corrupt or truncated image files" in message
    assert "corrupt.jpg" in message and "truncated.jpg" in message


@pytest.mark.slow  # a fresh train.py process
def test_a_jpeg_cut_in_its_headers_is_named_with_the_check_off(folder):
    """The 443-byte cut of a CIFAR JPEG (inside its Huffman tables): MindSpore's decoder stopped
    the process with SIGFPE (exit 136, no message); the headers are read with the check off."""
    with open(os.path.join(SAMPLE, "cat", "0000.jpg"), "rb") as f:
        head = f.read(443)
    with open(os.path.join(folder, "cat", "cut.jpg"), "wb") as f:
        f.write(head)
    message = train_error(folder, "--check_images", "false", "--epoch_size", "1", fresh=True)
    assert "cannot decode JPEG files whose headers are cut short" in message
    assert "last good one is the run's newest" in message and "cut.jpg" in message


@pytest.mark.slow
def test_corrupt_file_with_the_check_off_is_still_named(folder, capfd):
    """In-process (train.py's fresh case is the one above); what the pipeline's C++ code
    writes to the process's stderr is read too (capfd), as a fresh process's stderr holds it."""
    with open(os.path.join(folder, "cat", "corrupt.jpg"), "w") as f:
        f.write("not an image")
    message = train_error(folder, "--check_images", "false", "--epoch_size", "1",
                          "--batch_size", "3")
    assert "cannot decode image" in message and "corrupt.jpg" in message
    native = capfd.readouterr().err  # MindSpore's own log lines are there, as in a process's
    assert "Traceback" not in native and "C++" not in native, native[-2000:]


@pytest.mark.slow
def test_png_cmyk_greyscale_decode_and_gif_is_skipped(folder):
    cat = os.path.join(folder, "cat")
    with Image.open(os.path.join(cat, "0000.jpg")) as im:
        im.save(os.path.join(cat, "as_png.png"))
        im.convert("CMYK").save(os.path.join(cat, "cmyk.jpg"))
        im.save(os.path.join(cat, "anim.gif"))
    shutil.copy(GREYSCALE_JPEG, os.path.join(folder, "dog", "grey.JPEG"))
    out = os.path.join(os.path.dirname(folder), "ok")
    result = run_in_process("train.py", *COMMON, "--class_num", "2", "--data_path", folder,
                            "--eval_data_path", folder, "--run_eval", "true", "--epoch_size", "1",
                            "--batch_size", "2", "--output_dir", out, cwd=os.path.dirname(folder))
    assert result.returncode == 0, result.stderr[-2000:]
    # the warning goes through the train logger: stdout and train.log
    assert "skipping 1 files that are not images" in result.stdout and "anim.gif" in result.stdout
    assert "anim.gif" in open(os.path.join(out, "train.log")).read()
    assert "(global 5)" in result.stdout  # 4 + 3 cat images and 5 dog images, batch 2: 5 steps


# ---- checkpoints and model files ----

@pytest.fixture(scope="module")
def r18_1000(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("ckpt") / "r18.ckpt")
    ms.save_checkpoint(create_network("resnet18", class_num=1000), path)
    return path


@pytest.mark.parametrize("script,args", slow_beyond([
    ("eval.py", ["--data_path", SAMPLE]),
    ("export.py", ["--file_name", "unused"]),
    ("predict.py", ["--image_path", os.path.join(SAMPLE, "cat", "0000.jpg")]),
], ("eval.py",)))
def test_checkpoint_of_another_depth_or_class_count(script, args, r18_1000):
    depth = error_of(script, "--net_name", "resnet34", "--class_num", "10", "--checkpoint_path",
                     r18_1000, *args)
    assert "does not fit the network" in depth and "layer1.2" in depth
    classes = error_of(script, "--net_name", "resnet18", "--class_num", "10",
                       "--checkpoint_path", r18_1000, *args)
    assert "fc.weight: checkpoint (1000, 512) vs network (10, 512)" in classes


@pytest.mark.slow
def test_pre_trained_of_another_depth_is_named(folder, r18_1000):
    message = train_error(folder, "--net_name", "resnet34", "--pre_trained", r18_1000)
    assert "does not fit the network" in message and "missing in checkpoint" in message


@pytest.mark.slow
def test_model_files_that_do_not_exist(tmp_path):
    assert "MindIR file not found" in error_of(  # fresh: MindSpore's loader must not print
        "predict.py", "--checkpoint_path", tmp_path / "none.mindir", "--image_path", SAMPLE,
        fresh=True)
    assert "ONNX file not found" in error_of(
        "predict.py", "--checkpoint_path", tmp_path / "none.onnx", "--image_path", SAMPLE)
    assert "expected a .ckpt, .mindir, .onnx file" in error_of(
        "predict.py", "--checkpoint_path", tmp_path / "model.pb", "--image_path", SAMPLE)
    assert "checkpoint not found" in error_of(
        "export.py", "--checkpoint_path", tmp_path / "none.ckpt")


# ---- config values ----

@pytest.mark.parametrize("key,value,expected", slow_beyond([
    ("batch_size", "0", "batch_size must be a positive integer"),
    ("batch_size", "-8", "batch_size must be a positive integer"),
    ("epoch_size", "0", "epoch_size must be a positive integer"),
    ("base_lr", "0", "base_lr must be positive"),
    ("base_lr", "-0.1", "base_lr must be positive"),
    ("batch_size", "1000", "0 full batches of batch_size 1000"),
    ("batch_sise", "8", "unrecognized arguments: --batch_sise"),
    ("base_lr_batch_size", "0", "base_lr_batch_size must be a positive integer"),
    ("warmup_epochs", "-1", "warmup_epochs must be 0 or positive"),
    ("train_crop_scale", "0.5", "train_crop_scale must be [min, max]"),
    ("train_crop_scale", "0.9,0.2", "train_crop_scale must be [min, max]"),
    ("epoch_size", "ten", "'epoch_size' expects an integer, got 'ten'"),
], ("epoch_size",)))
def test_bad_values_name_the_key(folder, key, value, expected):
    assert expected in train_error(folder, f"--{key}", value)


@pytest.mark.slow
def test_unknown_key_in_a_recipe_file(folder, tmp_path):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("net_name: resnet18\nlearning_rate: 0.1\n")
    message = error_of("train.py", "--config_path", recipe, "--data_path", folder)
    assert "unknown config key 'learning_rate'" in message and "recipe.yaml" in message


@pytest.mark.slow
def test_short_cifar10_binary_file_is_named(tmp_path):
    for i in range(1, 6):
        (tmp_path / f"data_batch_{i}.bin").write_bytes(b"\x00" * 3073 * 10000)
    (tmp_path / "data_batch_3.bin").write_bytes(b"\x00" * 3073 * 10)
    message = error_of("train.py", "--config_path", "configs/quick_start.yaml", "--dataset",
                       "cifar10", "--data_path", tmp_path, "--output_dir", tmp_path / "out")
    assert "data_batch_3.bin (30730 bytes)" in message and "10000 records of 3073 bytes" in message


@pytest.mark.slow
def test_predict_counts_must_be_positive(r18_1000):
    for key in ("top_k", "batch_size"):
        message = error_of("predict.py", "--net_name", "resnet18", "--checkpoint_path", r18_1000,
                           "--image_path", SAMPLE, f"--{key}", "0")
        assert f"{key} must be a positive integer, got 0" in message


@pytest.mark.slow
def test_eval_folders_must_match_the_classes(folder, tmp_path):
    message = error_of("eval.py", *COMMON, "--checkpoint_path", tmp_path / "unused.ckpt",
                       "--data_path", folder)  # 2 class folders, class_num 10
    assert "has 2 class folders but class_num is 10" in message
    other = copy_class_folders(SAMPLE, str(tmp_path / "other"), 2, classes=["cat", "frog"])
    message = train_error(folder, "--run_eval", "true", "--eval_data_path", other)
    assert "has other class folders than data_path" in message


@pytest.mark.slow
def test_converter_names_an_unreadable_file(tmp_path, capsys):
    """In-process (the command line in a fresh interpreter: test_converter.py); an exception
    other than the tool's own error would fail here as the traceback would there."""
    from tools import convert_torch_checkpoint
    bad = tmp_path / "broken.pth"
    bad.write_bytes(b"not a torch file")
    assert convert_torch_checkpoint.main([str(bad), str(tmp_path / "x.ckpt")]) == 2
    stderr = capsys.readouterr().err
    assert "cannot read" in stderr and "broken.pth" in stderr
    assert "Traceback" not in stderr
