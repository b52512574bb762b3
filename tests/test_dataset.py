"""Input pipelines on real images: shapes, dtypes, greyscale, eval keeps every image."""
import os
import shutil

import mindspore.dataset as ds
import numpy as np
import pytest
from PIL import Image

from src.dataset import count_images, create_dataset
from src.inference import preprocess_images
from tests.helpers import imagenet_images


def batches(dataset):
    return list(dataset.create_tuple_iterator(num_epochs=1, output_numpy=True))


def test_train_pipeline_shapes_and_dtypes(cifar_small):
    data = create_dataset(cifar_small["train"], is_training=True, batch_size=16, image_size=32,
                          num_parallel_workers=2)
    out = batches(data)
    assert len(out) == 80 // 16 == data.get_dataset_size()
    image, label = out[0]
    assert image.shape == (16, 3, 32, 32) and image.dtype == np.float32
    assert label.shape == (16,) and label.dtype == np.int32
    # normalized with ImageNet mean/std: values roughly centered, beyond [0, 1]
    assert image.min() < -1.0 and image.max() > 1.0


def test_eval_keeps_every_image_in_order(cifar_small):
    data = create_dataset(cifar_small["test"], is_training=False, batch_size=7, image_size=32,
                          eval_resize=32, num_parallel_workers=2)
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
        data = create_dataset(str(root), is_training=training, batch_size=4, image_size=64,
                              eval_resize=73, num_parallel_workers=1)
        (image, label), = batches(data)
        assert image.shape == (4, 3, 64, 64) and label.dtype == np.int32
        if not training:  # eval order: c0/a_cmyk, c0/b_grey, c1/a_cmyk, c1/b_grey
            restored = image * np.array([0.229, 0.224, 0.225])[None, :, None, None] \
                + np.array([0.485, 0.456, 0.406])[None, :, None, None]
            red_minus_green = np.abs(restored[:, 0] - restored[:, 1]).max(axis=(1, 2))
            assert red_minus_green[[1, 3]].max() < 2 / 255  # greyscale: R = G = B
            assert red_minus_green[[0, 2]].min() > 0.1  # CMYK: colours kept


def test_eval_preprocessing_matches_predict(cifar_small):
    data = create_dataset(cifar_small["test"], is_training=False, batch_size=30, image_size=24,
                          eval_resize=28, num_parallel_workers=1)
    (image, _), = batches(data)
    paths = [os.path.join(cifar_small["test"], c, n) for c in sorted(os.listdir(cifar_small["test"]))
             for n in sorted(os.listdir(os.path.join(cifar_small["test"], c)))]
    np.testing.assert_array_equal(preprocess_images(paths, 24, 28), image)


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
    train = create_dataset(str(tmp_path), True, dataset="cifar10", batch_size=8, image_size=32,
                           num_parallel_workers=1)
    assert train.get_dataset_size() == 5 * CIFAR10_RECORDS // 8
    image, label = next(train.create_tuple_iterator(num_epochs=1, output_numpy=True))
    assert image.shape == (8, 3, 32, 32) and label.dtype == np.int32  # uint32 -> int32
    test = create_dataset(str(tmp_path), False, dataset="cifar10", batch_size=1000,
                          image_size=32, eval_resize=32, num_parallel_workers=1)
    labels = np.concatenate([lbl for _, lbl in batches(test)])
    np.testing.assert_array_equal(labels, np.arange(CIFAR10_RECORDS) % 10)


def test_cifar10_binary_missing_files_are_named(tmp_path):
    write_cifar_binary(tmp_path, ["data_batch_1.bin"])
    with pytest.raises(FileNotFoundError, match="data_batch_2.bin"):
        create_dataset(str(tmp_path), True, dataset="cifar10")


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
        return create_dataset(cifar_small["test"], False, batch_size=30, image_size=32,
                              eval_resize=32, shuffle=shuffle, num_parallel_workers=1, **shard)

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
        create_dataset(str(tmp_path / "nope"), True)
    with pytest.raises(ValueError, match="batch_size"):
        create_dataset(str(tmp_path), True, batch_size=0)
