"""Input pipelines on real images: shapes, dtypes, greyscale, eval keeps every image."""
import os
import shutil

import numpy as np
import pytest
from PIL import Image

from src.dataset import count_images, create_dataset
from src.inference import preprocess_images


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


def test_greyscale_and_cmyk_jpeg_give_three_channels(shared_data, tmp_path):
    src = os.path.join(shared_data, "imagenet_sample")
    grey = []
    for wnid in sorted(os.listdir(src)):
        name = os.listdir(os.path.join(src, wnid))[0]
        path = os.path.join(src, wnid, name)
        with Image.open(path) as im:
            if im.mode == "L":
                grey.append(path)
        if len(grey) == 2:
            break
    assert len(grey) == 2
    root = tmp_path / "mixed"
    for i, path in enumerate(grey):
        (root / f"c{i}").mkdir(parents=True)
        shutil.copy(path, root / f"c{i}" / "grey.JPEG")
        with Image.open(path) as im:
            im.convert("CMYK").save(root / f"c{i}" / "cmyk.jpg")
    for training in (True, False):
        data = create_dataset(str(root), is_training=training, batch_size=4, image_size=64,
                              eval_resize=73, num_parallel_workers=1)
        (image, label), = batches(data)
        assert image.shape == (4, 3, 64, 64) and label.dtype == np.int32
        if not training:
            # a greyscale image becomes R = G = B before normalization
            restored = image * np.array([0.229, 0.224, 0.225])[None, :, None, None] \
                + np.array([0.485, 0.456, 0.406])[None, :, None, None]
            assert np.abs(restored[:, 0] - restored[:, 1]).max() < 2 / 255


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


def test_sharding_splits_the_data(cifar_small):
    seen = []
    for shard in range(2):
        data = create_dataset(cifar_small["test"], False, batch_size=30, image_size=32,
                              eval_resize=32, num_shards=2, shard_id=shard, num_parallel_workers=1)
        seen.append(np.concatenate([lbl for _, lbl in batches(data)]))
    assert len(seen[0]) == len(seen[1]) == 15


def test_bad_arguments(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a folder"):
        create_dataset(str(tmp_path / "nope"), True)
    with pytest.raises(ValueError, match="batch_size"):
        create_dataset(str(tmp_path), True, batch_size=0)
