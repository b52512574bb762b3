"""``aug_repeats`` (repeated augmentation): the sampler's index streams against timm's
``RepeatAugSampler`` and, on ImageNet with torchvision's V2 recipe, torchvision's
``RASampler``; the shards together are the epoch's sample list; steps per epoch are the cut
epoch's; each copy of an image is augmented on its own; the config checks. A run with
repeats killed mid-epoch resumes bit-identical: ``tests/test_resume.py``'s modern recipe has
``aug_repeats`` 3."""
import math
import os

import mindspore.dataset as ds
import numpy as np
import pytest
import torch

from src import recipe
from src.data.sampling import EpochSampler
from src.training.resume import check_same_recipe, epoch_seed
from src.utils.config import ConfigError, parse_config
from tests.helpers import CIFAR_SAMPLE, ROOT, copy_class_folders


@pytest.fixture(autouse=True)
def keep_dataset_seed():
    seed = ds.config.get_seed()
    yield
    ds.config.set_seed(seed)


def timm_repeat_aug(base, num_replicas, rank, num_repeats):
    """timm's ``RepeatAugSampler.__iter__`` with ``selected_round=0`` and ``selected_ratio=0``
    (``timm/data/distributed_sampler.py``, pytorch-image-models commit 372ad5fa, unchanged up
    to aa4b5850), re-derived in torch; ``base`` stands where timm draws
    ``torch.randperm(len(dataset), generator=g)``."""
    n = len(base)
    num_samples = math.ceil(n * num_repeats / num_replicas)
    total_size = num_samples * num_replicas
    num_selected = math.ceil(n / num_replicas)  # selected_round 0: ceil(n / selected_ratio)
    indices = torch.repeat_interleave(torch.as_tensor(base), repeats=num_repeats, dim=0).tolist()
    padding = total_size - len(indices)
    if padding > 0:
        indices += indices[:padding]
    return indices[rank:total_size:num_replicas][:num_selected]


def torchvision_ra_sampler(base, num_replicas, rank, repetitions):
    """torchvision's ``RASampler.__iter__`` (``references/classification/sampler.py``, vision
    commit 775e7604), re-derived in torch; ``base`` stands where torchvision draws
    ``torch.randperm(len(dataset), generator=g)`` seeded with seed + epoch."""
    n = len(base)
    num_samples = math.ceil(n * float(repetitions) / num_replicas)
    total_size = num_samples * num_replicas
    num_selected = math.floor(n // 256 * 256 / num_replicas)
    indices = torch.repeat_interleave(torch.as_tensor(base), repeats=repetitions, dim=0)
    indices = torch.cat([indices, indices[:total_size - len(indices)]])
    return indices[rank:total_size:num_replicas][:num_selected]


CASES = [  # (images, seed, epoch, num_replicas, rank, repeats)
    (10, 0, 0, 1, 0, 3), (19, 7, 2, 2, 0, 3), (19, 7, 2, 2, 1, 3), (19, 7, 5, 3, 2, 4),
    (300, 3, 1, 4, 3, 4), (300, 3, 9, 8, 5, 2), (7, 1, 0, 8, 7, 3), (256, 11, 4, 3, 1, 3)]


@pytest.mark.parametrize("n, seed, epoch, num_replicas, rank, repeats", CASES)
def test_the_index_stream_is_timm_s_repeat_aug_sampler(n, seed, epoch, num_replicas, rank,
                                                       repeats):
    """Each rank's positions equal timm's ``RepeatAugSampler(num_repeats=repeats,
    selected_round=0)`` fed the same base permutation. The base is fed rather than drawn:
    this project draws every epoch's order in numpy from (seed, epoch) (``EpochSampler``),
    timm in torch from the epoch alone (torchvision from seed + epoch), so only the layout
    after the permutation (repeat, pad, stride by rank, cut) can be compared. Also over a
    subset of the rows (``val_split``): timm's positions then index the subset."""
    sampler = EpochSampler(np.arange(n), seed=seed, num_shards=num_replicas, shard_id=rank,
                           repeats=repeats)
    base = sampler.epoch_order(epoch)
    expected = timm_repeat_aug(base, num_replicas, rank, repeats)
    np.testing.assert_array_equal(sampler.shard_order(epoch), expected)
    assert len(sampler) == len(expected) == math.ceil(n / num_replicas)
    subset = np.arange(3, 3 + 2 * n, 2)
    sub = EpochSampler(subset, seed=seed, num_shards=num_replicas, shard_id=rank,
                       repeats=repeats)
    positions = np.searchsorted(subset, sub.epoch_order(epoch))
    np.testing.assert_array_equal(
        sub.shard_order(epoch), subset[timm_repeat_aug(positions, num_replicas, rank, repeats)])
    in_order = EpochSampler(np.arange(n), shuffle=False, num_shards=num_replicas,
                            shard_id=rank, repeats=repeats)  # timm's shuffle=False
    np.testing.assert_array_equal(in_order.shard_order(epoch),
                                  timm_repeat_aug(np.arange(n), num_replicas, rank, repeats))


def test_imagenet_with_the_v2_recipe_trains_torchvision_s_samples():
    """ImageNet-1k (1,281,167 images), 8 ranks x batch 128, ``--ra-reps 4``: torchvision cuts
    every rank to 160,128 samples (1,281,024 / 8, exactly 1,251 batches), this sampler to
    160,146 of which the pipeline keeps 1,251 full batches: the same samples on every rank,
    given the same base permutation."""
    n, replicas, batch = 1281167, 8, 128
    for rank in (0, 5):
        sampler = EpochSampler(np.arange(n), seed=4, num_shards=replicas, shard_id=rank,
                               repeats=4)
        ours = sampler.shard_order(2)
        theirs = torchvision_ra_sampler(sampler.epoch_order(2), replicas, rank, 4).numpy()
        assert len(ours) // batch == len(theirs) // batch == len(theirs) / batch == 1251
        np.testing.assert_array_equal(ours[:1251 * batch], theirs)


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("shards, repeats", [(2, 3), (3, 3), (4, 2)])
def test_the_shards_together_are_the_epoch_s_sample_list(weighted, shards, repeats):
    """Data parallel (rank shards built in one process): the ranks' positions, interleaved,
    are the epoch's one list (the base order, or the class-balanced draws, each written
    ``repeats`` times in a row), its first ``ceil(n / shards) * shards`` positions; the
    copies of an image sit on different ranks; an epoch reads about n / repeats images."""
    indices = np.arange(3, 40, 2)  # 19 images
    weights = np.linspace(1, 3, len(indices)) if weighted else None
    parts = [EpochSampler(indices, seed=9, weights=weights, num_shards=shards, shard_id=s,
                          repeats=repeats) for s in range(shards)]
    per_shard = math.ceil(19 / shards)
    for epoch in range(2):
        order = parts[0].epoch_order(epoch)
        together = np.stack([p.shard_order(epoch) for p in parts], axis=1).ravel()
        np.testing.assert_array_equal(together, np.repeat(order, repeats)[:per_shard * shards])
        if not weighted:  # a permutation: each image's copies are consecutive positions
            on_ranks = np.stack([p.shard_order(epoch) for p in parts], axis=1)
            for image in order[:len(together) // repeats]:  # the images read k times
                ranks = np.nonzero(on_ranks == image)[1]
                assert len(ranks) == repeats
                assert len(set(ranks.tolist())) == min(repeats, shards), (image, ranks)
        if not weighted:
            assert len(np.unique(together)) == math.ceil(per_shard * shards / repeats)


@pytest.fixture(scope="module")
def one_image_per_class(tmp_path_factory):
    """10 real CIFAR-10 images, one per class: a label names its image."""
    root = str(tmp_path_factory.mktemp("one_per_class") / "train")
    return copy_class_folders(os.path.join(CIFAR_SAMPLE, "train"), root, 1)


def ra_config(folder, *extra):
    return parse_config(["--config_path", "configs/resnet18_cifar10.yaml", "--data_path", folder,
                         "--batch_size", "3", "--num_parallel_workers", "2", "--aug_repeats",
                         "3", *extra])


def test_each_copy_of_an_image_is_augmented_on_its_own(one_image_per_class):
    """train.py's epoch pipeline with aug_repeats 3 on one device: every batch of 3 holds the
    3 copies of one image (one label, the sampler's order), and no two copies are the same
    tensor (each its own random crop and flip)."""
    cfg = ra_config(one_image_per_class)
    data = recipe.build_data(cfg, 0, 1)
    for epoch in (0, 1):
        batches = list(recipe.epoch_dataset(cfg, epoch, 0, data).create_tuple_iterator(
            num_epochs=1, output_numpy=True))
        expected = EpochSampler(np.arange(10), seed=epoch_seed(cfg.seed, epoch),
                                repeats=3).shard_order(0)[:9]
        np.testing.assert_array_equal(np.concatenate([y for _, y in batches]), expected)
        for images, labels in batches:
            assert len(set(labels.tolist())) == 1
            for i, j in ((0, 1), (0, 2), (1, 2)):
                assert np.abs(images[i] - images[j]).max() > 0.1, (epoch, labels[0], i, j)


def test_the_sink_mode_pipeline_repeats_anew_every_epoch_and_resumes_exactly(
        one_image_per_class):
    """The one pipeline of a dataset-sink-mode run (``run_dataset``): every epoch is that
    pass's list of copies (labels in threes), each epoch another, and a pipeline started at an
    epoch with ``set_init_step`` reads the same epochs from there."""
    cfg = ra_config(one_image_per_class)
    data = recipe.build_data(cfg, 0, 1)

    def epochs(dataset, count):
        it = dataset.create_tuple_iterator(num_epochs=cfg.epoch_size, output_numpy=True)
        return [[y.tolist() for _, y in it] for _ in range(count)]

    uninterrupted = epochs(recipe.run_dataset(cfg, data), 3)
    for epoch in uninterrupted:
        assert all(len(set(labels)) == 1 for labels in epoch)
    resumed = recipe.run_dataset(cfg, data)
    resumed.set_init_step(data.steps_per_epoch)
    assert epochs(resumed, 2) == uninterrupted[1:]
    assert uninterrupted[0] != uninterrupted[1] != uninterrupted[2]


def test_steps_per_epoch_are_the_cut_epoch_s(cifar_small):
    """80 images, batch 8: an epoch with aug_repeats 3 is as long as without (10 steps on one
    device, 5 per rank on 2), not 3 times as long, so the LR schedule, the checkpoints' steps
    per epoch and the progress lines count the cut epoch."""
    cfg = ra_config(cifar_small["train"], "--batch_size", "8")
    assert recipe.build_data(cfg, 0, 1).steps_per_epoch == 10
    assert [recipe.build_data(cfg, rank, 2).steps_per_epoch for rank in (0, 1)] == [5, 5]
    balanced = ra_config(cifar_small["train"], "--batch_size", "8", "--class_balance",
                         "sampler", "--val_split", "0.25")
    assert recipe.build_data(balanced, 0, 2).steps_per_epoch == 3  # 60 images: 30 per rank


def test_aug_repeats_values_and_resume():
    assert parse_config([]).aug_repeats == 0  # off by default (timm's 0)
    v2 = parse_config(["--config_path", os.path.join(ROOT, "configs",
                                                     "resnet50_torchvision_v2.yaml")])
    assert v2.aug_repeats == 4  # torchvision's --ra-reps 4
    for value, message in (("-1", "aug_repeats must be 0 or positive, got -1"),
                           ("65", "aug_repeats must be at most 64"),
                           ("2.5", "aug_repeats' expects an integer")):
        with pytest.raises(ConfigError, match=message):
            parse_config(["--aug_repeats", value])
    stored = dict(parse_config(["--aug_repeats", "3"]), device_num=1)
    with pytest.raises(ConfigError, match="with other aug_repeats 0 .checkpoint: 3."):
        check_same_recipe("net-1_5.ckpt", stored, dict(parse_config([]), device_num=1))
    with pytest.raises(ValueError, match="repeats must be 0 or more"):
        EpochSampler([1, 2], repeats=-1)
