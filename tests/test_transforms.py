"""One list of each preprocessing choice: config.yaml's allowed values and the checks'
limits are the constants the pipelines use (``src.utils.image_constants``)."""
import pytest

from src.data.settings import EvalPreprocess, TrainAugment
from src.data.transforms import EVAL_INTERPOLATIONS
from src.utils.config import load_schema
from src.utils.image_constants import (
    INTERPOLATIONS,
    RANDAUGMENT_MAX_MAGNITUDE,
    RANDAUGMENT_MAX_OPS,
)


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
