"""One list of each preprocessing choice: config.yaml's allowed values and the checks'
limits are the constants the pipelines use (``src.utils.image_constants``, ``src.utils.limits``)."""
from dataclasses import fields

import pytest

from src.data.settings import EvalPreprocess, TrainAugment
from src.data.transforms import EVAL_INTERPOLATIONS
from src.recipe import TRAIN_AUGMENT_KEYS, train_augment
from src.utils.config import load_schema, parse_config
from src.utils.image_constants import INTERPOLATIONS
from src.utils.limits import RANDAUGMENT_MAX_MAGNITUDE, RANDAUGMENT_MAX_OPS


def test_config_allows_the_interpolations_the_pipeline_applies():
    _, _, choices = load_schema()
    assert choices["eval_interpolation"] == list(INTERPOLATIONS) == list(EVAL_INTERPOLATIONS)


def test_randaugment_limits_are_the_settings_limits():
    TrainAugment(auto_augment="randaugment", randaugment_num_ops=RANDAUGMENT_MAX_OPS,
                 randaugment_magnitude=RANDAUGMENT_MAX_MAGNITUDE)
    with pytest.raises(ValueError, match="randaugment_num_ops"):
        TrainAugment(auto_augment="randaugment", randaugment_num_ops=RANDAUGMENT_MAX_OPS + 1)
    with pytest.raises(ValueError, match="randaugment_magnitude"):
        TrainAugment(auto_augment="randaugment",
                     randaugment_magnitude=RANDAUGMENT_MAX_MAGNITUDE + 1)


def test_an_unknown_interpolation_is_named():
    with pytest.raises(ValueError, match="eval interpolation must be one of bilinear, bicubic, "
                                         "got 'lanczos'"):
        EvalPreprocess(interpolation="lanczos")


def test_every_training_augmentation_is_a_config_key():
    """A new ``TrainAugment`` field is read from the config key of its name (mean and std,
    the ImageNet constants, are not keys)."""
    defaults, _, _ = load_schema()
    unread = {f.name for f in fields(TrainAugment)
              if TRAIN_AUGMENT_KEYS.get(f.name, f.name) not in defaults}
    assert unread == {"mean", "std"}
    augment = train_augment(parse_config(["--train_crop_scale", "0.25,1", "--auto_augment",
                                          "randaugment", "--aug_repeats", "3"]))
    assert (augment.crop_scale, augment.auto_augment, augment.aug_repeats) == (
        (0.25, 1.0), "randaugment", 3)
