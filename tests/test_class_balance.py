"""``class_balance``: the class-weighted losses against PyTorch, the "balanced" weights of the
training images, the class-balanced sampler's frequencies (drawn from train.py's pipelines),
its order a function of (seed, epoch) (resume, sink mode, data-parallel shards), and the
MindSpore sampler behaviour that made it necessary."""
import os

import mindspore as ms
import mindspore.dataset as ds
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from src import recipe
from src.data.sampling import (
    EpochSampler,
    balanced_class_weights,
    balanced_sample_weights,
    class_count_summary,
)
from src.recipe import loss_class_weights
from src.training.loss import (
    BinaryCrossEntropy,
    CrossEntropySmooth,
    SoftTargetCrossEntropy,
    create_loss,
)
from src.utils.config import ConfigError, parse_config
from tests.helpers import CIFAR_SAMPLE, copy_class_folders

COUNTS = {"airplane": 20, "automobile": 2, "bird": 4}
WEIGHTS = np.array([0.3, 2.5, 1.2, 0.7], np.float32)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("unbalanced") / "train")
    for name, count in COUNTS.items():
        copy_class_folders(os.path.join(CIFAR_SAMPLE, "train"), root, count, [name])
    return root


@pytest.fixture(autouse=True)
def keep_dataset_seed():
    seed = ds.config.get_seed()
    yield
    ds.config.set_seed(seed)


def batch(soft=False, n=12, k=4, seed=0):
    rng = np.random.default_rng(seed)
    logits = (rng.standard_normal((n, k)) * 2).astype(np.float32)
    if soft:
        target = rng.dirichlet(np.ones(k), n).astype(np.float32)
    else:
        target = rng.integers(0, k, n).astype(np.int32)
        target[:k] = np.arange(k)  # every class present
    return logits, target


def ours(loss, logits, target):
    return loss(ms.Tensor(logits), ms.Tensor(target)).asnumpy()


@pytest.mark.parametrize("eps", [0.0, 0.1, 0.3])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_weighted_cross_entropy_is_torch_s(eps, reduction):
    logits, labels = batch()
    expected = F.cross_entropy(torch.tensor(logits), torch.tensor(labels).long(),
                               weight=torch.tensor(WEIGHTS), label_smoothing=eps,
                               reduction=reduction).numpy()
    got = ours(CrossEntropySmooth(eps, 4, reduction, class_weights=WEIGHTS), logits, labels)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    plain = ours(CrossEntropySmooth(eps, 4, reduction), logits, labels)
    assert np.abs(plain - got).max() > 1e-3  # the weights matter


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_weighted_soft_target_cross_entropy_is_torch_s_with_probability_targets(reduction):
    logits, target = batch(soft=True)
    expected = F.cross_entropy(torch.tensor(logits), torch.tensor(target),
                               weight=torch.tensor(WEIGHTS), reduction=reduction).numpy()
    got = ours(SoftTargetCrossEntropy(reduction, class_weights=WEIGHTS, class_num=4), logits,
               target)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("soft", [False, True])
def test_weighted_bce_is_torch_s_per_class_column(soft):
    logits, target = batch(soft=soft)
    loss = BinaryCrossEntropy(0.1, 4, soft_targets=soft, class_weights=WEIGHTS)
    dense = target if soft else np.full((len(target), 4), 0.1 / 4, np.float32)
    if not soft:
        dense[np.arange(len(target)), target] += 0.9
    expected = F.binary_cross_entropy_with_logits(
        torch.tensor(logits), torch.tensor(dense), weight=torch.tensor(WEIGHTS)).numpy()
    np.testing.assert_allclose(ours(loss, logits, target), expected, rtol=1e-5)


def test_create_loss_passes_the_weights_to_every_loss():
    logits, labels = batch()
    soft_logits, soft = batch(soft=True)
    for name, soft_targets, (x, y) in (("ce", False, (logits, labels)),
                                       ("ce", True, (soft_logits, soft)),
                                       ("bce", False, (logits, labels)),
                                       ("bce", True, (soft_logits, soft))):
        weighted = create_loss(name, 0.1, 4, soft_targets=soft_targets, class_weights=WEIGHTS)
        plain = create_loss(name, 0.1, 4, soft_targets=soft_targets)
        assert abs(float(ours(weighted, x, y)) - float(ours(plain, x, y))) > 1e-3, name
    with pytest.raises(ValueError, match="class_weights must be 4 finite positive"):
        create_loss("ce", 0.1, 4, class_weights=[1.0, 2.0])


def test_balanced_weights_are_scikit_learn_s_and_average_one():
    counts = np.array([20, 2, 4])
    weights = balanced_class_weights(counts)
    np.testing.assert_allclose(weights, 26 / (3 * counts), rtol=1e-6)
    assert float((weights * counts).sum() / counts.sum()) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="at least one image"):
        balanced_class_weights([3, 0])
    labels = np.repeat([0, 1, 2], counts)
    np.testing.assert_allclose(np.bincount(labels, balanced_sample_weights(labels)), 1.0)


def test_the_loss_weights_count_the_training_images_only(folder):
    cfg = parse_config(["--data_path", folder, "--class_num", "3", "--class_balance", "loss",
                        "--val_split", "0.25"])
    np.testing.assert_allclose(loss_class_weights(cfg), 19 / (3 * np.array([15, 1, 3])),
                               rtol=1e-6)  # held out: 5, 1, 1
    cfg = parse_config(["--data_path", folder, "--class_num", "3", "--class_balance", "loss"])
    np.testing.assert_allclose(loss_class_weights(cfg), 26 / (3 * np.array([20, 2, 4])),
                               rtol=1e-6)
    assert loss_class_weights(parse_config(["--data_path", folder])) is None
    bench = parse_config(["--class_balance", "loss", "--benchmark_steps", "2"])
    assert (loss_class_weights(bench) == 1).all()  # data_path not read


def sampler_config(folder, *extra):
    return parse_config(["--config_path", "configs/resnet18_cifar10.yaml", "--data_path", folder,
                         "--class_num", "3", "--batch_size", "13", "--num_parallel_workers", "1",
                         "--class_balance", "sampler", *extra])


def epoch_labels(cfg, data, epoch, skip=0):
    dataset = recipe.epoch_dataset(cfg, epoch, skip, data)
    return [y.tolist() for _, y in dataset.create_tuple_iterator(num_epochs=1, output_numpy=True)]


def test_the_sampler_draws_every_class_equally_often(folder):
    """30 epochs of train.py's pipelines (26 images each: 20, 2, 4): each class about 1/3 of
    the draws; unweighted, airplane would be 77%."""
    cfg = sampler_config(folder)
    data = recipe.build_data(cfg, 0, 1)
    assert data.steps_per_epoch == 2  # an epoch draws as many images as it holds
    drawn = np.concatenate([np.ravel(epoch_labels(cfg, data, e)) for e in range(30)])
    frequencies = np.bincount(drawn, minlength=3) / len(drawn)
    assert len(drawn) == 30 * 26
    np.testing.assert_allclose(frequencies, 1 / 3, atol=0.06)  # 4 standard deviations


def test_the_sampler_order_is_a_function_of_seed_and_epoch(folder):
    cfg = sampler_config(folder)
    data = recipe.build_data(cfg, 0, 1)
    first = epoch_labels(cfg, data, 3)
    assert epoch_labels(cfg, data, 3) == first  # rebuilt: the same draws
    assert epoch_labels(cfg, data, 3, skip=1) == first[1:]  # a resume mid-epoch
    assert epoch_labels(cfg, data, 4) != first
    other = sampler_config(folder, "--seed", "2")
    assert epoch_labels(other, recipe.build_data(other, 0, 1), 3) != first


def test_the_sink_mode_pipeline_draws_anew_every_epoch_and_resumes_exactly(folder):
    cfg = sampler_config(folder, "--val_split", "0.25")
    data = recipe.build_data(cfg, 0, 1)

    def epochs(dataset, count):
        it = dataset.create_tuple_iterator(num_epochs=cfg.epoch_size, output_numpy=True)
        return [[y.tolist() for _, y in it] for _ in range(count)]

    uninterrupted = epochs(recipe.run_dataset(cfg, data), 3)
    resumed = recipe.run_dataset(cfg, data)
    resumed.set_init_step(data.steps_per_epoch)
    assert epochs(resumed, 2) == uninterrupted[1:]
    assert uninterrupted[0] != uninterrupted[1] != uninterrupted[2]


@pytest.mark.parametrize("weighted", [False, True])
def test_shards_split_one_draw(weighted):
    """Data parallel: every rank draws the same epoch order (same seed) and reads its own
    positions of it, so the ranks together read one class-balanced draw."""
    indices = np.arange(3, 40, 2)  # 19 images
    weights = np.linspace(1, 3, len(indices)) if weighted else None
    whole = EpochSampler(indices, seed=9, weights=weights)
    shards = [EpochSampler(indices, seed=9, weights=weights, num_shards=3, shard_id=s)
              for s in range(3)]
    for epoch in range(2):
        order = shards[0].epoch_order(epoch)
        assert len(order) == (21 if weighted else 19)
        parts = [s.shard_order(epoch) for s in shards]
        assert all(len(p) == 7 for p in parts)
        padded = np.concatenate([order, order[:21 - len(order)]])
        np.testing.assert_array_equal(np.stack(parts, axis=1).ravel(), padded)
        if not weighted:
            np.testing.assert_array_equal(np.sort(order), indices)
            np.testing.assert_array_equal(whole.epoch_order(epoch), order)
    assert not np.array_equal(shards[0].shard_order(0), shards[0].shard_order(1))


def test_data_parallel_with_the_sampler_builds_its_shard(folder):
    cfg = sampler_config(folder)
    shards = [recipe.build_data(cfg, rank, 2) for rank in (0, 1)]
    assert [d.steps_per_epoch for d in shards] == [1, 1]  # 13 images per rank


def test_class_balance_needs_class_folders():
    cfg = parse_config(["--data_path", "d", "--dataset", "cifar10", "--class_balance", "loss"])
    with pytest.raises(ConfigError, match="class_balance loss needs dataset imagefolder"):
        recipe.check_train_config(cfg)
    with pytest.raises(ConfigError, match="class_balance.*must be one of"):
        parse_config(["--class_balance", "weights"])


def test_the_class_count_line_and_its_imbalance():
    line, ratio = class_count_summary([20, 2, 4], ["a", "b", "c"])
    assert line == "3 classes, 26 images: a 20, b 2, c 4" and ratio == 10.0
    line, ratio = class_count_summary(np.arange(1, 31), [f"c{i}" for i in range(30)])
    assert line == "30 classes, 465 images: smallest 1 (c0), median 15, largest 30 (c29)"


def test_mindspore_s_samplers_repeat_themselves_over_the_epochs_of_one_pipeline():
    """Why ``EpochSampler`` exists (MindSpore 2.10): in one pipeline over several epochs,
    ``WeightedRandomSampler`` draws the same images every epoch and ``SubsetRandomSampler``'s
    later epochs are powers of its first permutation. If this fails after an upgrade, the
    built-in samplers may do."""
    def epochs(sampler, count=4):
        data = ds.NumpySlicesDataset({"x": np.arange(8)}, sampler=sampler)
        it = data.create_tuple_iterator(num_epochs=count, output_numpy=True)
        return [[int(x[0]) for x in it] for _ in range(count)]

    ds.config.set_seed(5)
    weighted = epochs(ds.WeightedRandomSampler([1.0] * 8, 8))
    assert all(e == weighted[0] for e in weighted)
    ds.config.set_seed(5)
    first, second, *_ = epochs(ds.SubsetRandomSampler(list(range(8))))
    assert second == [first[i] for i in first]  # the permutation applied twice
