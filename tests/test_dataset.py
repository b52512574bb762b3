"""Input pipelines on real images: shapes, dtypes, greyscale, eval keeps every image; the
augmentation arguments (tests/test_augment.py checks the augmentations themselves): off by
default, the batch transform hook, ignored for eval, bad values named."""
import os
import re
import shutil

import mindspore as ms
import mindspore.dataset as ds
import mindspore.dataset.transforms as transforms
import mindspore.dataset.vision as vision
import numpy as np
import pytest
from PIL import Image

from src.data.image_check import IMAGE_EXTENSIONS
from src.data.pipeline import count_images, create_dataset
from src.data.settings import EvalPreprocess, Sampling, TrainAugment
from src.data.transforms import IMAGENET_MEAN, IMAGENET_STD, create_transforms
from src.deploy.inference import preprocess_images
from tests.helpers import IMAGENET_SMALL, imagenet_images


def batches(dataset):
    return list(dataset.create_tuple_iterator(num_epochs=1, output_numpy=True))


def test_train_pipeline_shapes_and_dtypes(cifar_small):
    data = create_dataset(cifar_small["train"], TrainAugment(image_size=32), batch_size=16,
                          num_parallel_workers=2)
    out = batches(data)
    assert len(out) == 80 // 16 == data.get_dataset_size()
    image, label = out[0]
    assert image.shape == (16, 3, 32, 32) and image.dtype == np.float32
    assert label.shape == (16,) and label.dtype == np.int32
    # normalized with ImageNet mean/std: values roughly centered, beyond [0, 1]
    assert image.min() < -1.0 and image.max() > 1.0


def test_eval_keeps_every_image_in_order(cifar_small):
    data = create_dataset(cifar_small["test"], EvalPreprocess(image_size=32, resize=32),
                          batch_size=7, num_parallel_workers=2)
    labels = np.concatenate([label for _, label in batches(data)])
    assert len(labels) == 30 == count_images(cifar_small["test"], is_training=False)
    np.testing.assert_array_equal(labels, np.repeat(np.arange(10), 3))  # never shuffled
    again = np.concatenate([img for img, _ in batches(data)])
    first = np.concatenate([img for img, _ in batches(data)])
    np.testing.assert_array_equal(first, again)  # deterministic


def shipped_images_of_mode(mode, count):
    """The first ``count`` shipped ImageNet JPEGs whose Pillow mode is ``mode``."""
    found = []
    for path in imagenet_images():
        with Image.open(path) as im:
            if im.mode == mode:
                found.append(path)
    assert len(found) >= count, f"data/ ships {len(found)} {mode} JPEGs, the test needs {count}"
    return found[:count]


def test_greyscale_and_cmyk_jpeg_give_three_channels(tmp_path):
    """Real greyscale and CMYK JPEGs in both pipelines: 3 channels; greyscale gives R = G = B,
    CMYK keeps its colours (a decoder reading one channel would give grey)."""
    root = tmp_path / "mixed"
    pairs = zip(shipped_images_of_mode("CMYK", 2), shipped_images_of_mode("L", 2))
    for i, (cmyk, grey) in enumerate(pairs):
        (root / f"c{i}").mkdir(parents=True)
        shutil.copy(cmyk, root / f"c{i}" / "a_cmyk.JPEG")
        shutil.copy(grey, root / f"c{i}" / "b_grey.JPEG")
    for training in (True, False):
        settings = (TrainAugment(image_size=64) if training
                    else EvalPreprocess(image_size=64, resize=73))
        data = create_dataset(str(root), settings, batch_size=4, num_parallel_workers=1)
        (image, label), = batches(data)
        assert image.shape == (4, 3, 64, 64) and label.dtype == np.int32
        if not training:  # eval order: c0/a_cmyk, c0/b_grey, c1/a_cmyk, c1/b_grey
            restored = image * np.array([0.229, 0.224, 0.225])[None, :, None, None] \
                + np.array([0.485, 0.456, 0.406])[None, :, None, None]
            red_minus_green = np.abs(restored[:, 0] - restored[:, 1]).max(axis=(1, 2))
            assert red_minus_green[[1, 3]].max() < 2 / 255  # greyscale: R = G = B
            assert red_minus_green[[0, 2]].min() > 0.1  # CMYK: colours kept


def test_eval_preprocessing_matches_predict(cifar_small):
    data = create_dataset(cifar_small["test"], EvalPreprocess(image_size=24, resize=28),
                          batch_size=30, num_parallel_workers=1)
    (image, _), = batches(data)
    root = cifar_small["test"]
    paths = [os.path.join(root, c, n) for c in sorted(os.listdir(root))
             for n in sorted(os.listdir(os.path.join(root, c)))]
    np.testing.assert_array_equal(preprocess_images(
        paths, EvalPreprocess(image_size=24, resize=28)), image)


CIFAR10_RECORDS = 10000  # images per .bin file of the binary release


def write_cifar_binary(folder, names):
    """Files in the CIFAR-10 binary format: records of 1 label byte + 3072 pixel bytes."""
    records = np.zeros((CIFAR10_RECORDS, 3073), np.uint8)
    records[:, 0] = np.arange(CIFAR10_RECORDS) % 10
    records[:, 1:] = np.arange(3072) % 256
    for name in names:
        records.tofile(os.path.join(folder, name))


def test_cifar10_binary_reader(tmp_path):
    write_cifar_binary(tmp_path, [f"data_batch_{i}.bin" for i in range(1, 6)] + ["test_batch.bin"])
    train = create_dataset(str(tmp_path), TrainAugment(image_size=32), dataset="cifar10",
                           batch_size=8, num_parallel_workers=1)
    assert train.get_dataset_size() == 5 * CIFAR10_RECORDS // 8
    image, label = next(train.create_tuple_iterator(num_epochs=1, output_numpy=True))
    assert image.shape == (8, 3, 32, 32) and label.dtype == np.int32  # uint32 -> int32
    test = create_dataset(str(tmp_path), EvalPreprocess(image_size=32, resize=32),
                          dataset="cifar10", batch_size=1000, num_parallel_workers=1)
    labels = np.concatenate([lbl for _, lbl in batches(test)])
    np.testing.assert_array_equal(labels, np.arange(CIFAR10_RECORDS) % 10)


def test_cifar10_binary_missing_files_are_named(tmp_path):
    write_cifar_binary(tmp_path, ["data_batch_1.bin"])
    with pytest.raises(FileNotFoundError, match="data_batch_2.bin"):
        create_dataset(str(tmp_path), TrainAugment(), dataset="cifar10")


def image_keys(dataset):
    """The images of an eval dataset as (bytes of the image tensor, label) pairs, in order."""
    return [(img.tobytes(), int(lbl)) for images, labels in batches(dataset)
            for img, lbl in zip(images, labels)]


@pytest.mark.parametrize("shuffle", [False, True])
def test_shards_are_disjoint_and_cover_the_data(cifar_small, shuffle):
    """Two shards (two devices) of the 30 test images: each gets 15, no image is in both, and
    together they hold every image once. Shuffled, every rank seeds its pipeline alike (as
    train.py does), modelled here by the same dataset seed before each shard."""
    def build(**shard):
        return create_dataset(cifar_small["test"], EvalPreprocess(image_size=32, resize=32),
                              batch_size=30, sampling=Sampling(shuffle=shuffle, **shard),
                              num_parallel_workers=1)

    everything = image_keys(build())
    assert len(set(everything)) == len(everything) == 30  # 30 distinct images to tell apart
    previous_seed = ds.config.get_seed()
    try:
        shards = []
        for shard_id in range(2):
            ds.config.set_seed(1234)
            shards.append(image_keys(build(num_shards=2, shard_id=shard_id)))
    finally:
        ds.config.set_seed(previous_seed)
    assert len(shards[0]) == len(shards[1]) == 15
    assert not set(shards[0]) & set(shards[1])  # disjoint
    assert sorted(shards[0] + shards[1]) == sorted(everything)  # together: every image once


def test_bad_arguments(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a folder"):
        create_dataset(str(tmp_path / "nope"), TrainAugment())
    with pytest.raises(ValueError, match="batch_size"):
        create_dataset(str(tmp_path), TrainAugment(), batch_size=0)


@pytest.fixture()
def dataset_seed():
    """Restores the dataset seed (and Python's / numpy's, which ``set_seed`` also sets)."""
    previous = ds.config.get_seed()
    yield
    ds.config.set_seed(previous)


def pipeline_before_augmentations(data_path, batch_size, workers):
    """The training pipeline as it was before the augmentation arguments existed."""
    source = ds.ImageFolderDataset(data_path, extensions=IMAGE_EXTENSIONS, shuffle=True,
                                   num_parallel_workers=workers)
    ops = [vision.RandomCropDecodeResize(224, scale=(0.08, 1.0), ratio=(3.0 / 4.0, 4.0 / 3.0)),
           vision.RandomHorizontalFlip(prob=0.5),
           vision.Normalize(mean=IMAGENET_MEAN, std=IMAGENET_STD), vision.HWC2CHW()]
    data = source.map(operations=ops, input_columns="image", num_parallel_workers=workers)
    data = data.map(operations=transforms.TypeCast(ms.int32), input_columns="label",
                    num_parallel_workers=workers)
    return data.batch(batch_size, drop_remainder=True)


@pytest.mark.parametrize("augment", [{}, dict(auto_augment="none", random_erasing=0.0)])
def test_augmentation_off_is_the_previous_pipeline_bit_for_bit(dataset_seed, augment):
    """Real ImageNet JPEGs, 2 workers, one seed: the default (and explicitly off) training
    pipeline gives exactly the batches of the pipeline before augmentations were added."""
    ds.config.set_seed(17)
    before = batches(pipeline_before_augmentations(IMAGENET_SMALL, 8, 2))
    ds.config.set_seed(17)
    now = batches(create_dataset(IMAGENET_SMALL, TrainAugment(**augment), batch_size=8,
                                 num_parallel_workers=2, batch_transform=None))
    assert len(now) == len(before) == 26 // 8
    for (image, label), (old_image, old_label) in zip(now, before):
        np.testing.assert_array_equal(image, old_image)
        np.testing.assert_array_equal(label, old_label)
    for decoded in (False, True):
        assert [type(op) for op in create_transforms(TrainAugment(), decoded=decoded)] == [
            vision.RandomResizedCrop if decoded else vision.RandomCropDecodeResize,
            vision.RandomHorizontalFlip, vision.Normalize, vision.HWC2CHW]


def test_batch_transform_runs_on_every_training_batch(cifar_small, dataset_seed):
    """A trivial batch op (labels -> one-hot float32): called once per kept batch, in order,
    with numpy images float32 (N, 3, H, W) and labels int32 (N,); its outputs, dtypes
    included, become the columns; the images pass through untouched."""
    calls = []

    def one_hot(images, labels, batch_info):
        calls.append((images.shape, images.dtype, labels.shape, labels.dtype,
                      batch_info.get_batch_num()))
        return images, np.eye(10, dtype=np.float32)[labels]

    def build(**extra):
        ds.config.set_seed(3)
        return batches(create_dataset(cifar_small["train"], TrainAugment(image_size=32),
                                      batch_size=12, num_parallel_workers=2, **extra))

    plain, mixed = build(), build(batch_transform=one_hot)
    assert len(mixed) == len(plain) == 80 // 12  # the last partial batch is still dropped
    assert [call[4] for call in calls] == list(range(len(plain)))
    assert all(call[:4] == ((12, 3, 32, 32), np.float32, (12,), np.int32) for call in calls)
    for (image, label), (mixed_image, target) in zip(plain, mixed):
        np.testing.assert_array_equal(mixed_image, image)
        assert target.dtype == np.float32 and target.shape == (12, 10)
        np.testing.assert_array_equal(target, np.eye(10)[label])


def test_eval_ignores_augmentation_arguments(cifar_small):
    called = []

    def build(**extra):
        return batches(create_dataset(cifar_small["test"], EvalPreprocess(image_size=32, resize=32),
                                      batch_size=10, num_parallel_workers=1, **extra))

    augmented = build(batch_transform=lambda *args: called.append(args))
    for (image, label), (plain_image, plain_label) in zip(augmented, build()):
        np.testing.assert_array_equal(image, plain_image)
        np.testing.assert_array_equal(label, plain_label)
    assert not called


@pytest.mark.parametrize("augment, message", [
    (dict(auto_augment="trivialaugment"), "unknown auto_augment 'trivialaugment'; valid: none, "
                                          "trivialaugment_wide, randaugment, autoaugment"),
    (dict(auto_augment="randaugment", randaugment_num_ops=4),
     "randaugment_num_ops must be an integer in [0, 3], got 4"),
    (dict(auto_augment="randaugment", randaugment_magnitude=31),
     "randaugment_magnitude must be an integer in [0, 30], got 31"),
    (dict(auto_augment="randaugment", randaugment_magnitude=9.0),
     "randaugment_magnitude must be an integer in [0, 30], got 9.0"),
    (dict(random_erasing=1.5), "random_erasing must be a probability in [0, 1], got 1.5"),
    (dict(batch_transform="mixup"), "batch_transform must be callable, got 'mixup'"),
])
def test_bad_augmentation_arguments_are_named(tmp_path, augment, message):
    augment = dict(augment)  # the pipeline's keyword apart from TrainAugment's fields
    batch_transform = augment.pop("batch_transform", None)
    for settings in (TrainAugment, EvalPreprocess):  # training and eval
        with pytest.raises(ValueError, match=re.escape(message)):
            create_dataset(str(tmp_path), TrainAugment(**augment) if augment else settings(),
                           batch_transform=batch_transform)
