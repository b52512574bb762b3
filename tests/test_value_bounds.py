"""Upper bounds of the numeric keys: checked with the other ranges, before anything is
allocated (a huge epoch_size once built an LR array of one value per step, 20 GB and more);
the seed in MindSpore's range; the total step count once the steps per epoch are known."""
import mindspore as ms
import mindspore.dataset as ds
import pytest

from src.training.resume import epoch_seed
from src.utils.config import ConfigError, parse_config
from tests.helpers import CIFAR_SAMPLE, copy_class_folders, run_entry


@pytest.mark.parametrize("key, value, message", [
    ("epoch_size", "10000000000000000000",
     "epoch_size must be at most 2147483647 (MindSpore's optimizer step counter is int32), "
     "got 10000000000000000000"),
    ("seed", "-1", "seed must be in 0..4294967295 (MindSpore's seed range), got -1"),
    ("seed", "4294967296", "seed must be in 0..4294967295 (MindSpore's seed range), got "
                           "4294967296"),
    ("device_id", "4096", "device_id must be at most 4095"),
    ("batch_size", "100000", "batch_size must be at most 65536"),
    ("class_num", "2000000", "class_num must be at most 1048576"),
    ("train_image_size", "5000", "train_image_size must be at most 4096"),
    ("eval_resize", "100000", "eval_resize must be at most 4096"),
    ("scale_window", "2147483648", "scale_window must be at most 2147483647"),
    ("log_interval", "99999999999", "log_interval must be at most 2147483647"),
    ("base_lr", "1e39", "base_lr must be at most 3.4028234663852886e+38 in magnitude"),
    ("lr_decay_epochs", "30,99999999999", "lr_decay_epochs must hold integers of at most "
                                          "2147483647"),
    ("aug_repeats", "65", "aug_repeats must be at most 64 (copies of each image drawn"),
    # timm's fractional repeats (RepeatAugSampler's num_repeats 1.5) are not supported
    ("aug_repeats", "1.5", "command line: key 'aug_repeats' expects an integer, got '1.5'"),
])
def test_values_above_their_bound_are_refused_naming_the_key(key, value, message):
    with pytest.raises(ConfigError) as info:
        parse_config([f"--{key}", value])
    assert str(info.value).startswith(message), str(info.value)
    assert "\n" not in str(info.value)


def test_the_bounds_themselves_are_accepted():
    cfg = parse_config(["--epoch_size", "2147483647", "--seed", "4294967295",
                        "--device_id", "4095", "--batch_size", "65536",
                        "--train_image_size", "4096", "--eval_image_size", "4096",
                        "--eval_resize", "4096", "--class_num", "1048576", "--seed", "0",
                        "--aug_repeats", "64"])
    assert cfg.epoch_size == 2 ** 31 - 1 and cfg.seed == 0 and cfg.aug_repeats == 64
    ms.set_seed(4294967295)  # the top of the range is MindSpore's too
    ms.set_seed(1)


@pytest.mark.parametrize("seed", [0, 1, 42948, 4294967295])
def test_every_epoch_seed_is_a_dataset_seed(seed):
    """The data pipeline's seed, from (seed, epoch), stays in the dataset seed's range
    (0..2**32 - 1) for every seed config accepts; the seeds of earlier runs are kept."""
    before = ds.config.get_seed()
    try:
        for epoch in (0, 1, 89):
            ds.config.set_seed(epoch_seed(seed, epoch))
    finally:
        ds.config.set_seed(before)
    assert epoch_seed(1, 3) == 100006 and epoch_seed(42948, 0) == 42948 * 100003


def test_the_total_step_count_is_checked_before_the_lr_schedule(tmp_path):
    from src import recipe
    folder = copy_class_folders(f"{CIFAR_SAMPLE}/train", str(tmp_path / "data"), 4,
                                classes=["cat", "dog"])
    cfg = parse_config(["--config_path", "configs/quick_start.yaml", "--data_path", folder,
                        "--class_num", "2", "--batch_size", "4", "--run_eval", "false",
                        "--epoch_size", "2147483647"])
    with pytest.raises(ConfigError, match=r"^epoch_size 2147483647 x 2 optimizer steps per "
                                          r"epoch = 4294967294 steps: more than 2147483647"):
        recipe.build_data(cfg, 0, 1)


@pytest.mark.slow
def test_train_py_refuses_a_huge_epoch_size_in_one_line():
    result = run_entry("train.py", "--config_path", "configs/quick_start.yaml",
                       "--epoch_size", "10000000000000000000", timeout=300)
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr.strip().splitlines()[-1] == (
        "train.py: error: epoch_size must be at most 2147483647 (MindSpore's optimizer step "
        "counter is int32), got 10000000000000000000")
