"""train.py wires the recipe into its training pipeline: ``build_data`` (``train_data_args``)
hands the augmentation keys to ``create_dataset``, and ``epoch_dataset`` seeds every epoch
with its own randomness (crop, flip, policy, erasing, mixup/CutMix), the same on a re-run.

On the shipped CIFAR-10 images: one image per class, so a batch of 10 is the whole epoch and
its labels name its images (the order is shuffled). Seconds in all.
"""
import inspect
import os

import mindspore.dataset as ds
import numpy as np
import pytest

import src.data.pipeline as pipeline
from src import recipe
from src.data.augment import RandomErasing, auto_augment_ops
from src.data.mixing import BatchMixer
from src.data.settings import TrainAugment
from src.recipe import data as recipe_data
from src.utils.config import parse_config
from tests.helpers import CIFAR_SAMPLE, ROOT, copy_class_folders

CONFIG = os.path.join(ROOT, "configs", "resnet18_cifar10.yaml")
CLASSES = 10
RECIPE = ["--auto_augment", "trivialaugment_wide", "--random_erasing", "0.5"]
MIXING = ["--mixup_alpha", "0.2", "--cutmix_alpha", "1.0", "--mix_prob", "1.0"]


@pytest.fixture(scope="module")
def one_per_class(tmp_path_factory):
    root = tmp_path_factory.mktemp("one_per_class")
    return copy_class_folders(os.path.join(CIFAR_SAMPLE, "train"), str(root / "train"), 1)


@pytest.fixture(autouse=True)
def keep_dataset_seed():
    """``epoch_dataset`` sets the global dataset seed: put it back for the other tests."""
    seed = ds.config.get_seed()
    yield
    ds.config.set_seed(seed)


def config(data_path, *extra):
    return parse_config(["--config_path", CONFIG, "--data_path", data_path, "--batch_size",
                         str(CLASSES), "--num_parallel_workers", "1", *extra])


def epoch_batch(cfg, epoch):
    """The one batch of ``epoch`` as train.py builds it: ``build_data`` then ``epoch_dataset``;
    images and targets in label order (each label is one image)."""
    data = recipe.build_data(cfg, 0, 1)
    assert data.steps_per_epoch == 1
    dataset = recipe.epoch_dataset(cfg, epoch, 0, data)
    batches = list(dataset.create_tuple_iterator(output_numpy=True))
    assert len(batches) == 1
    images, targets = batches[0]
    if targets.ndim == 1:  # hard labels: sort the images by label
        order = np.argsort(targets)
        np.testing.assert_array_equal(targets[order], np.arange(CLASSES))
        return images[order], targets[order]
    return images, targets  # mixed: soft targets, the batch's own order


@pytest.fixture
def transforms_made(monkeypatch):
    """Every call of ``create_transforms`` by the pipeline: (its arguments by name, the ops)."""
    calls = []
    real = pipeline.create_transforms

    def spy(*args, **kwargs):
        ops = real(*args, **kwargs)
        bound = inspect.signature(real).bind(*args, **kwargs)
        bound.apply_defaults()
        calls.append((dict(bound.arguments), ops))
        return ops

    monkeypatch.setattr(pipeline, "create_transforms", spy)
    return calls


@pytest.mark.parametrize("policy", ["trivialaugment_wide", "randaugment", "autoaugment"])
def test_the_pipeline_gets_the_configured_policy_and_erasing(one_per_class, transforms_made,
                                                             policy):
    cfg = config(one_per_class, "--auto_augment", policy, "--randaugment_num_ops", "1",
                 "--randaugment_magnitude", "7", "--random_erasing", "0.25")
    epoch_batch(cfg, 0)
    training = [(args["settings"], ops) for args, ops in transforms_made
                if isinstance(args["settings"], TrainAugment)]
    assert training, "create_dataset built no training transforms"
    for args, ops in training:  # build_data's pipeline and the epoch's
        assert (args.auto_augment, args.randaugment_num_ops, args.randaugment_magnitude,
                args.random_erasing) == (policy, 1, 7, 0.25)
        expected = auto_augment_ops(policy, cfg.train_image_size, 1, 7)
        assert expected and all(any(type(op) is type(e) for op in ops) for e in expected), (
            f"{policy}: the policy's ops {expected} are not in the pipeline {ops}")
        erasing = [op for op in ops if isinstance(op, RandomErasing)]
        assert len(erasing) == 1 and erasing[0].prob == 0.25


def test_without_the_keys_the_pipeline_has_neither(one_per_class, transforms_made):
    epoch_batch(config(one_per_class), 0)
    policy_types = {type(op) for name in ("trivialaugment_wide", "autoaugment")
                    for op in auto_augment_ops(name, 32)}
    for args, ops in transforms_made:
        assert (args["settings"].auto_augment, args["settings"].random_erasing) == ("none", 0.0)
        assert not any(isinstance(op, RandomErasing) or type(op) in policy_types for op in ops)


def test_the_augmentations_change_the_batch(one_per_class):
    """The same epoch (same seed) with and without the recipe's augmentations: other pixels."""
    plain, _ = epoch_batch(config(one_per_class), 0)
    augmented, _ = epoch_batch(config(one_per_class, *RECIPE), 0)
    differs = [not np.array_equal(a, b) for a, b in zip(plain, augmented)]
    assert sum(differs) >= CLASSES // 2, differs


def test_each_epoch_draws_its_own_augmentation(one_per_class):
    """The same image (by its label) is cropped/flipped/augmented/erased otherwise in epoch 1
    than in epoch 0, and exactly alike when epoch 0 is built again (a resumed run)."""
    cfg = config(one_per_class, *RECIPE)
    first, labels = epoch_batch(cfg, 0)
    again, _ = epoch_batch(cfg, 0)
    second, _ = epoch_batch(cfg, 1)
    np.testing.assert_array_equal(again, first)
    same = [bool(np.array_equal(a, b)) for a, b in zip(first, second)]
    assert sum(same) <= 1, f"images alike in epochs 0 and 1 (by label): {labels[same]}"


@pytest.fixture
def mixers(monkeypatch):
    """The ``batch_transform`` each ``create_dataset`` call of train.py gets."""
    made = []
    real = recipe_data.create_dataset

    def spy(*args, **kwargs):
        made.append(kwargs.get("batch_transform"))
        return real(*args, **kwargs)

    monkeypatch.setattr(recipe_data, "create_dataset", spy)
    return made


def test_each_epoch_draws_its_own_mixup_and_cutmix(one_per_class, mixers):
    """Epoch 1's mixer draws other (lam, mixup or CutMix) than epoch 0's, and the batches
    differ; epoch 0 built again draws and gives exactly the same."""
    cfg = config(one_per_class, *MIXING)
    first = epoch_batch(cfg, 0)
    epoch0 = mixers[-1]
    again = epoch_batch(cfg, 0)
    epoch0_again = mixers[-1]
    second = epoch_batch(cfg, 1)
    epoch1 = mixers[-1]
    assert all(isinstance(m, BatchMixer) for m in (epoch0, epoch0_again, epoch1))

    def draws(mixer):
        return [mixer.draw(batch)[1:] for batch in range(8)]  # (lam, CutMix?) of 8 batches

    assert draws(epoch0_again) == draws(epoch0)
    assert draws(epoch1) != draws(epoch0), "epochs 0 and 1 draw the same mixup/CutMix"
    assert first[1].shape == (CLASSES, CLASSES)  # soft targets: the batch was mixed
    for a, b in zip(again, first):
        np.testing.assert_array_equal(a, b)
    assert not np.array_equal(second[0], first[0]) and not np.array_equal(second[1], first[1])
