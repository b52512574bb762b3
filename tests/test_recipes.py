"""The recipe features end to end, as a user runs them: the ImageNet recipe files train (with
ResNet-18 at 64 px on the shipped ImageNet JPEGs), and a run with a weight EMA (the torchvision
V2 recipe's, which is also its recipe check) reports live and EMA top-1, which eval.py,
export.py and predict.py reproduce from its checkpoint."""
import json
import os

import numpy as np
import pytest

from src.utils.config import ConfigError, parse_config
from tests.helpers import IMAGENET_SMALL, ROOT, run_in_process, succeeded, train_in_process

SMALL = ["--net_name", "resnet18", "--class_num", "26", "--train_image_size", "64",
         "--eval_image_size", "64", "--eval_resize", "72", "--batch_size", "4", "--epoch_size",
         "1", "--warmup_epochs", "0", "--num_parallel_workers", "2", "--log_interval", "1",
         "--data_path", IMAGENET_SMALL]
# the recipe with a weight EMA: trained once (ema_run) for its recipe check and the EMA checks
EMA_RECIPE = "resnet50_torchvision_v2.yaml"
EMA_CONFIG = os.path.join("configs", EMA_RECIPE)


@pytest.mark.slow
@pytest.mark.parametrize("recipe, expected", [
    ("resnet50_rsb_a3.yaml", "optimizer lamb, loss bce"),
    (EMA_RECIPE, "optimizer momentum, loss ce, weight EMA decay 0.99996585"),
    ("resnet50_lars_large_batch.yaml", "optimizer lars, loss ce"),
])
def test_imagenet_recipe_trains(recipe, expected, tmp_path, request):
    """Every feature the recipe file turns on runs (here on CPU, small, in the test process):
    RandAugment, LAMB, BCE, mixup/cutmix in one; TrivialAugment, erasing, mixup/cutmix, EMA in
    another (the EMA run of ``ema_run``, which trains that recipe); LARS in the third."""
    if recipe == EMA_RECIPE:
        out = request.getfixturevalue("ema_run")[0]
    else:
        out = tmp_path
        assert train_in_process("--config_path", os.path.join("configs", recipe), *SMALL,
                                "--output_dir", out) == 0
    assert expected in open(out / "train.log", encoding="utf-8").read()
    record = json.loads(open(out / "metrics.jsonl").readline())
    assert record["step"] == 6 and np.isfinite(record["loss"])


def test_recipe_files_name_their_source_and_figure():
    for recipe, figure in (("resnet50_torchvision_v2.yaml", "80.858%"),
                           ("resnet50_rsb_a3.yaml", "78.1%"),
                           ("resnet50_rsb_a2.yaml", "79.8%"),
                           ("resnet50_nvidia_250ep.yaml", "78.4%"),
                           ("resnet50_lars_large_batch.yaml", "75.9%")):
        path = os.path.join(ROOT, "configs", recipe)
        text = open(path, encoding="utf-8").read()
        assert figure in text and "Source:" in text
        parse_config(["--config_path", path])


def test_the_old_image_size_key_names_its_replacements(tmp_path):
    recipe = tmp_path / "old.yaml"
    recipe.write_text("image_size: 160\n")
    with pytest.raises(ConfigError, match="train_image_size .* and eval_image_size"):
        parse_config(["--config_path", str(recipe)])


@pytest.fixture(scope="module")
def ema_run(tmp_path_factory):
    """The torchvision V2 recipe (its weight EMA, decay 0.99996585 with warmup) small, for 2
    epochs with an evaluation after each: the output folder and the last metrics record."""
    out = tmp_path_factory.mktemp("ema")
    assert train_in_process("--config_path", EMA_CONFIG, *SMALL,
                            "--eval_data_path", IMAGENET_SMALL, "--run_eval", "true",
                            "--epoch_size", "2", "--output_dir", out) == 0
    records = [json.loads(line) for line in open(out / "metrics.jsonl")]
    return out, records[-1]


@pytest.mark.slow
def test_training_reports_live_and_ema_top1_and_eval_reproduces_both(ema_run, tmp_path):
    out, last = ema_run
    assert {"top1", "top5", "ema_top1", "ema_top5", "eval_loss", "ema_eval_loss"} <= set(last)
    # the two weight sets score apart (top-1 alone may tie on 26 images); eval.py at batch 13
    # (26 = 2 x 13): its mean of batch means is then the per-image mean training reports
    assert abs(last["ema_eval_loss"] - last["eval_loss"]) > 1e-3, last
    ckpt = str(out / "resnet18-2_6.ckpt")
    for use_ema, key, loss in (("true", "ema_top1", "ema_eval_loss"),
                               ("false", "top1", "eval_loss")):
        result = succeeded(run_in_process(
            "eval.py", "--config_path", EMA_CONFIG, *SMALL, "--batch_size", "13",
            "--checkpoint_path", ckpt, "--use_ema", use_ema, "--output_dir", tmp_path / use_ema))
        report = json.load(open(tmp_path / use_ema / "eval_result.json"))
        assert report["top1"] == pytest.approx(last[key], abs=1e-9), (use_ema, last)
        assert report["loss"] == pytest.approx(last[loss], rel=1e-5), (use_ema, report, last)
        assert ("its EMA weights" in result.stdout) == (use_ema == "true")


@pytest.mark.slow
def test_export_and_predict_use_the_ema_weights(ema_run, tmp_path):
    import onnxruntime as ort

    from src.data.settings import EvalPreprocess
    from src.deploy.inference import list_images, load_network, preprocess_images
    out, _ = ema_run
    ckpt = str(out / "resnet18-2_6.ckpt")
    name = str(tmp_path / "net")
    succeeded(run_in_process("export.py", "--config_path", EMA_CONFIG,
                             *SMALL, "--checkpoint_path", ckpt, "--file_format", "ONNX",
                             "--file_name", name))
    images = preprocess_images(
        list_images(IMAGENET_SMALL)[:4], EvalPreprocess(image_size=64, resize=72))
    session = ort.InferenceSession(name + ".onnx", providers=["CPUExecutionProvider"])
    exported = session.run(None, {"image": images})[0]
    import mindspore as ms
    ema = load_network("resnet18", 26, ckpt, use_ema=True)(ms.Tensor(images)).asnumpy()
    live = load_network("resnet18", 26, ckpt, use_ema=False)(ms.Tensor(images)).asnumpy()
    np.testing.assert_allclose(exported, ema, rtol=1e-4, atol=1e-4)
    assert np.abs(exported - live).max() > 1e-3  # the two weight sets differ
    result = succeeded(run_in_process("predict.py", "--config_path", EMA_CONFIG,
                                      *SMALL,
                                      "--checkpoint_path", ckpt, "--image_path",
                                      list_images(IMAGENET_SMALL)[0]))
    assert "its EMA weights" in result.stderr
    assert json.loads(result.stdout.strip().splitlines()[-1])["image"]
