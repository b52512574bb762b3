"""The shipped multi-label sample, data/cifar10_mosaics: its label CSVs list exactly its images,
with CIFAR-10 class names only, the labels are the classes of the photos in the tiles (checked on
the pixels), train and val photos are disjoint, every class and label count occurs in both
files, tools/make_multilabel_sample.py rebuilds it byte for byte, and data/README.md states its
statistics."""
import csv
import hashlib
import os

import numpy as np
import pytest
from PIL import Image

from tests.helpers import CIFAR_SAMPLE, ROOT
from tools import make_multilabel_sample as tool

MOSAICS = os.path.join(ROOT, "data", "cifar10_mosaics")
CLASSES = sorted(os.listdir(os.path.join(CIFAR_SAMPLE, "train")))
SPLITS = {"train": "train", "val": "test"}  # mosaic split -> photo folder of the CIFAR sample


def read_rows(name):
    with open(os.path.join(MOSAICS, name), encoding="utf-8", newline="") as f:
        return list(csv.reader(f))


@pytest.fixture(scope="module")
def tiles():
    """tiles.csv: image name -> its four tiles' photos (``""`` = blank), row-major."""
    rows = read_rows("tiles.csv")
    assert rows[0] == ["image_name", "top_left", "top_right", "bottom_left", "bottom_right"]
    return {row[0]: row[1:] for row in rows[1:]}


@pytest.mark.parametrize("split", SPLITS)
def test_the_label_file_lists_exactly_the_shipped_images(split, tiles):
    rows = read_rows(f"{split}.csv")
    assert rows[0] == ["image_name", "tags"] and all(len(row) == 2 for row in rows)
    names = [row[0] for row in rows[1:]]
    assert len(set(names)) == len(names)
    assert set(names) == {f"{split}/{f}" for f in os.listdir(os.path.join(MOSAICS, split))}
    assert all(name.endswith(".jpg") for name in names)
    assert set(names) <= set(tiles)


@pytest.mark.parametrize("split", SPLITS)
def test_every_label_is_a_cifar10_class_written_sorted_once(split):
    for name, tags in read_rows(f"{split}.csv")[1:]:
        labels = tags.split(" ") if tags else []
        assert set(labels) <= set(CLASSES), name
        assert labels == sorted(set(labels)), name  # sorted, once each, single spaces


def photo_pixels(path):
    return tool.photo(os.path.join(CIFAR_SAMPLE, path)).astype(np.float32)


@pytest.mark.parametrize("split", SPLITS)
def test_the_labels_are_the_classes_of_the_photos_in_the_tiles(split, tiles):
    """Each tile of the decoded mosaic is nearest (mean absolute difference) to the photo
    tiles.csv names for it (or the grey of a blank tile) among grey, the mosaic's other photos
    and another photo; the labels are the classes of those photos."""
    other = photo_pixels(f"{SPLITS[split]}/{CLASSES[0]}/0000.jpg")
    grey = np.full_like(other, tool.GREY)
    side = tool.TILE
    for name, tags in read_rows(f"{split}.csv")[1:]:
        sources = tiles[name]
        assert tags == " ".join(sorted({s.split("/")[1] for s in sources if s})), name
        expected = [photo_pixels(s) if s else grey for s in sources]
        with Image.open(os.path.join(MOSAICS, name)) as im:
            assert im.size == (2 * side, 2 * side) and im.format == "JPEG"
            mosaic = np.asarray(im.convert("RGB"), np.float32)
        for i, own in enumerate(expected):
            row, col = divmod(i, 2)
            tile = mosaic[row * side:(row + 1) * side, col * side:(col + 1) * side]
            rivals = [r for r in (grey, other, *expected) if not np.array_equal(r, own)]
            error = np.abs(tile - own).mean()
            assert all(error < np.abs(tile - r).mean() for r in rivals), (name, i)


def test_train_and_val_photos_are_disjoint(tiles):
    """Train mosaics take train photos only, val mosaics test photos only, and no photo of one
    set is a copy of a photo of the other."""
    used = {split: set() for split in SPLITS}
    for name, sources in tiles.items():
        split = name.split("/")[0]
        for source in filter(None, sources):
            assert source.startswith(SPLITS[split] + "/"), (name, source)
            assert os.path.isfile(os.path.join(CIFAR_SAMPLE, source)), source
            used[split].add(source)

    def digests(paths):
        return {hashlib.sha256(open(os.path.join(CIFAR_SAMPLE, p), "rb").read()).hexdigest()
                for p in paths}

    assert used["train"] and used["val"]
    assert not digests(used["train"]) & digests(used["val"])


@pytest.mark.parametrize("split", SPLITS)
def test_every_class_and_every_label_count_occurs(split):
    rows = read_rows(f"{split}.csv")[1:]
    labels = [tags.split() for _, tags in rows]
    assert {c for names in labels for c in names} == set(CLASSES)
    assert {len(names) for names in labels} == set(range(5))


SHIPPED_ENCODER = "3.2.0"  # the libjpeg-turbo of the Pillow that encoded the shipped JPEGs


def test_the_tool_rebuilds_the_sample_byte_for_byte(tmp_path):
    """The same files; the label files byte for byte, the JPEGs too when this Pillow encodes
    with the libjpeg-turbo the shipped ones were made with (another encoder's bytes differ:
    the pixel test above still checks every tile)."""
    from PIL import features
    out = tmp_path / "mosaics"
    tool.build(str(out))

    def files(root):
        return sorted(os.path.relpath(os.path.join(d, f), root)
                      for d, _, names in os.walk(root) for f in names)

    assert files(out) == files(MOSAICS)
    same_encoder = features.version("libjpeg_turbo") == SHIPPED_ENCODER
    compared = [f for f in files(MOSAICS) if same_encoder or not f.endswith(".jpg")]
    changed = [f for f in compared
               if (out / f).read_bytes() != open(os.path.join(MOSAICS, f), "rb").read()]
    assert changed == []
    if not same_encoder:
        pytest.skip(f"JPEG bytes not compared: this Pillow encodes with libjpeg-turbo "
                    f"{features.version('libjpeg_turbo')}, the shipped files with "
                    f"{SHIPPED_ENCODER} (label files compared)")


def test_the_tool_refuses_a_folder_holding_other_files(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(SystemExit, match="notes.txt"):
        tool.build(str(tmp_path))
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_data_readme_states_the_statistics_of_the_shipped_files():
    """The per-class positives, the label-count histogram and the label-frequency baseline mAP
    on val (each class's AP with every image scored by its training frequency: its val
    prevalence, all scores tying)."""
    lines = tool.statistics(MOSAICS, CLASSES)
    readme = open(os.path.join(ROOT, "data", "README.md"), encoding="utf-8").read()
    assert [line for line in lines if line not in readme] == []
    val = tool.read_targets(os.path.join(MOSAICS, "val.csv"), CLASSES)
    assert f"{val.mean(axis=0).mean():.4f}" in lines[-1]
