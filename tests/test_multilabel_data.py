"""Multi-label data (src/data/multilabel.py): the label file read from a CSV of real CIFAR-10
JPEGs, each named error listing its rows, the pipeline's float32 multi-hot targets (file order
for eval, the dataset seed's permutation for training, shards and repeats as class folders),
mixup of multi-hot targets by hand, and the iterative-stratification split against a random one
by the label-distribution measure of Sechidis et al. 2011."""
import os
import shutil

import mindspore.dataset as ds
import numpy as np
import pytest

from src.data.mixing import BatchMixer
from src.data.multilabel import (
    LabelFileError,
    label_file_classes,
    multilabel_split,
    read_label_file,
)
from src.data.pipeline import count_images, create_dataset
from src.data.sampling import EpochSampler
from src.data.settings import EvalPreprocess, Sampling, TrainAugment
from src.utils.errors import MissingFileError
from tests.helpers import CIFAR_SAMPLE

CLASSES = ["bird", "cat", "dog", "ship"]  # the copied images' folders
# tags of the 13 rows: the image's own class, sometimes more, row 7 none (an all-zero target)
TAGS = ["bird", "bird cat", "bird", "cat", "cat dog", "", "dog", "dog ship dog", "dog",
        "ship", "ship bird", "ship", "cat"]
EVAL = EvalPreprocess(image_size=32, resize=32)


@pytest.fixture(scope="module")
def labelled(tmp_path_factory):
    """13 real JPEGs under ``root/img`` (and the same files as class folders under
    ``root/folders`` in the same order), ``root/train.csv`` labelling them with ``TAGS``."""
    root = tmp_path_factory.mktemp("multilabel")
    files = []
    for cls in CLASSES:
        names = sorted(os.listdir(os.path.join(CIFAR_SAMPLE, "train", cls)))
        for name in names[:4 if cls == "cat" else 3]:
            os.makedirs(root / "img", exist_ok=True)
            os.makedirs(root / "folders" / cls, exist_ok=True)
            shutil.copy(os.path.join(CIFAR_SAMPLE, "train", cls, name),
                        root / "img" / f"{cls}_{name}")
            shutil.copy(os.path.join(CIFAR_SAMPLE, "train", cls, name),
                        root / "folders" / cls / name)
            files.append(f"img/{cls}_{name}")
    assert len(files) == len(TAGS) == 13
    write_csv(root / "train.csv", "image_name,tags", list(zip(files, TAGS)))
    return {"root": str(root), "csv": str(root / "train.csv"), "files": files}


def write_csv(path, header, rows, blank_lines=False):
    lines = [header] + [f"{f},{t}" for f, t in rows]
    with open(path, "w", encoding="utf-8") as f:
        f.write(("\n\n" if blank_lines else "\n").join(lines) + "\n")
    return str(path)


def expected_targets(tags, classes):
    targets = np.zeros((len(tags), len(classes)), np.uint8)
    for i, row in enumerate(tags):
        for name in row.split():
            targets[i, classes.index(name)] = 1
    return targets


def test_table_in_row_order_with_an_all_zero_row(labelled):
    table = read_label_file(labelled["csv"], labelled["root"])
    assert table.files == labelled["files"]
    assert table.paths == [os.path.join(labelled["root"], f) for f in labelled["files"]]
    assert table.class_names == CLASSES == label_file_classes(labelled["csv"])
    assert table.targets.dtype == np.uint8
    np.testing.assert_array_equal(table.targets, expected_targets(TAGS, CLASSES))
    assert not table.targets[5].any() and table.targets[7].sum() == 2  # "dog ship dog"


def test_a_changed_file_is_read_again_and_tables_are_copies(labelled, tmp_path):
    csv = write_csv(tmp_path / "l.csv", "image_name,tags", [(labelled["files"][0], "cat")])
    first = read_label_file(csv, labelled["root"])
    first.targets[:] = 0
    first.files.append("x")
    again = read_label_file(csv, labelled["root"])  # from the cache
    assert again.files == labelled["files"][:1] and again.targets.tolist() == [[1]]
    for table in (again, read_label_file(csv, labelled["root"])):  # cached returns changed
        table.targets[:] = 0
        table.files.append("x")
        table.paths.clear()
        table.class_names.append("x")
    third = read_label_file(csv, labelled["root"])
    assert third.files == labelled["files"][:1] and third.targets.tolist() == [[1]]
    assert third.paths == [os.path.join(labelled["root"], labelled["files"][0])]
    assert third.class_names == ["cat"]
    write_csv(csv, "image_name,tags", [(labelled["files"][0], "cat dog")])
    os.utime(csv, ns=(1, 1))  # another modification time, whatever the clock's resolution
    assert read_label_file(csv, labelled["root"]).class_names == ["cat", "dog"]


def test_given_class_names_set_the_columns(labelled, tmp_path):
    order = ["ship", "plane", "dog", "cat", "bird"]  # a class no row uses: a zero column
    csv = write_csv(tmp_path / "l.csv", "path,labels",
                    list(zip(labelled["files"], TAGS)), blank_lines=True)
    table = read_label_file(csv, labelled["root"], class_names=order, check_images=False)
    np.testing.assert_array_equal(table.targets, expected_targets(TAGS, order))
    with pytest.raises(ValueError, match="distinct"):
        read_label_file(csv, labelled["root"], class_names=["cat", "cat"])


def error_cases(files):
    """(name, header, rows, class_names, message pattern) of each named error."""
    good = list(zip(files, TAGS))
    return [
        ("unknown class", "image_name,tags", good[:2] + [(files[2], "bird horse")],
         ["bird", "cat"], r"class names not among the 2 classes: row 4 \(horse\)"),
        ("duplicated row", "image_name,tags", good[:3] + [(files[1], "cat")], None,
         r"more than once.*row 5 \(img/.*, as row 3\)"),
        ("missing image", "image_name,tags", good[:2] + [("img/none.jpg", "cat")], None,
         r"do not exist.*row 4 \(.*none\.jpg\)"),
        ("empty path", "image_name,tags", good[:1] + [("", "cat")], None,
         r"row 3 \(''.*empty path\)"),
        ("absolute path", "image_name,tags", [("/etc/x.jpg", "cat")] + good[:1], None,
         r"row 2 \('/etc/x\.jpg': absolute path\)"),
        ("path leaving data_path", "image_name,tags", good[:1] + [("../x.jpg", "cat")], None,
         r"row 3 \('\.\./x\.jpg': contains '\.\.': give paths inside data_path without "
         r"'\.\.'\)"),
        ("'..' further in, leaving data_path", "image_name,tags",
         good[:1] + [("img/../../x.jpg", "cat")], None,
         r"row 3 \('img/\.\./\.\./x\.jpg': contains '\.\.'"),
        ("'..' staying inside data_path", "image_name,tags",
         good[:1] + [(files[1].replace("img/", "img/../img/"), "cat")], None,
         r"inside it: row 3 \('img/\.\./img/.*': contains '\.\.': give paths inside "
         r"data_path without '\.\.'\)$"),
        ("duplicated row through '.'", "image_name,tags",
         good[:2] + [(files[0].replace("img/", "img/./"), "cat")], None,
         r"more than once.*: row 4 \(img/\./.*, as row 2\)$"),
        ("bad header", *_no_header(good), None, r"row 1 .* is no header"),
        ("three-column header", "a,b,c", good[:2], None, r"row 1 .* is no header"),
        ("wrong column count", "image_name,tags", good[:2] + [(files[2], "cat,dog")], None,
         r"other than 2 columns.*: row 4 \(3 columns\)$"),
        ("header only", "image_name,tags", [], None, "header but no image row"),
    ]


def _no_header(rows):
    return f"{rows[0][0]},{rows[0][1]}", rows[1:3]


@pytest.mark.parametrize("case", range(13))
def test_each_error_names_its_rows(labelled, tmp_path, case):
    name, header, rows, classes, pattern = error_cases(labelled["files"])[case]
    csv = write_csv(tmp_path / "l.csv", header, rows)
    with pytest.raises(LabelFileError, match=pattern) as info:
        read_label_file(csv, labelled["root"], class_names=classes)
    assert info.value.exit_status == 2 and csv in str(info.value), name


def test_long_lists_end_with_a_count(labelled, tmp_path):
    rows = [(f"img/gone{i}.jpg", "cat") for i in range(13)]
    csv = write_csv(tmp_path / "l.csv", "image_name,tags", rows)
    with pytest.raises(LabelFileError, match=r"row 11 \(.*gone9\.jpg\) and 3 more$") as info:
        read_label_file(csv, labelled["root"])
    assert "gone10" not in str(info.value)


def test_empty_missing_and_unlabelled_files(labelled, tmp_path):
    (tmp_path / "empty.csv").write_text("\n \n", encoding="utf-8")
    with pytest.raises(LabelFileError, match="is empty"):
        read_label_file(str(tmp_path / "empty.csv"), labelled["root"])
    with pytest.raises(MissingFileError, match="does not exist"):
        read_label_file(str(tmp_path / "nope.csv"), labelled["root"])
    csv = write_csv(tmp_path / "l.csv", "image_name,tags", [(labelled["files"][0], "")])
    with pytest.raises(LabelFileError, match="no row names a class"):
        label_file_classes(csv)


def test_a_truncated_image_names_its_row(labelled, tmp_path):
    data = open(os.path.join(labelled["root"], labelled["files"][0]), "rb").read()
    (tmp_path / "img").mkdir()
    (tmp_path / "img" / "cut.jpg").write_bytes(data[:len(data) // 2])
    shutil.copy(os.path.join(labelled["root"], labelled["files"][1]), tmp_path / "img" / "a.jpg")
    csv = write_csv(tmp_path / "l.csv", "image_name,tags", [("img/a.jpg", "cat"),
                                                            ("img/cut.jpg", "dog")])
    with pytest.raises(LabelFileError, match=r"corrupt or truncated.*row 3 \(.*cut\.jpg\)"):
        read_label_file(csv, str(tmp_path))


def test_the_full_check_runs_after_a_table_read_without_it(labelled, tmp_path):
    """A PNG cut short passes ``check_images`` false (JPEG headers only) and is refused by
    the full check, also right after the same file was read (and kept) without it."""
    from PIL import Image

    (tmp_path / "img").mkdir()
    Image.open(os.path.join(labelled["root"], labelled["files"][0])).save(
        tmp_path / "img" / "whole.png")
    data = (tmp_path / "img" / "whole.png").read_bytes()
    (tmp_path / "img" / "cut.png").write_bytes(data[:len(data) // 2])
    csv = write_csv(tmp_path / "l.csv", "image_name,tags", [("img/whole.png", "cat"),
                                                            ("img/cut.png", "dog")])
    assert read_label_file(csv, str(tmp_path), check_images=False).files == [
        "img/whole.png", "img/cut.png"]
    with pytest.raises(LabelFileError, match=r"corrupt or truncated.*row 3 \(.*cut\.png\)"):
        read_label_file(csv, str(tmp_path), check_images=True)


def batches(dataset):
    return list(dataset.create_tuple_iterator(num_epochs=1, output_numpy=True))


def columns(dataset):
    out = batches(dataset)
    return np.concatenate([b[0] for b in out]), np.concatenate([b[1] for b in out])


def test_eval_reads_the_rows_in_file_order_as_class_folders_decode_them(labelled):
    table = read_label_file(labelled["csv"], labelled["root"])
    data = create_dataset(labelled["root"], EVAL, batch_size=5, labels=table,
                          num_parallel_workers=2)
    images, targets = columns(data)
    assert targets.dtype == np.float32 and targets.shape == (13, 4)
    np.testing.assert_array_equal(targets, table.targets)
    assert data.get_dataset_size() == 3
    assert count_images(labelled["root"], False, labels=table) == 13
    assert count_images(labelled["root"], False, indices=[1, 2], labels=table) == 2
    folder_images, _ = columns(create_dataset(os.path.join(labelled["root"], "folders"), EVAL,
                                              batch_size=5, num_parallel_workers=2))
    np.testing.assert_array_equal(images, folder_images)  # same files, same order, same ops
    mixer = BatchMixer(mixup_alpha=1.0, label_smoothing=0.0, class_num=4)
    _, unmixed = columns(create_dataset(labelled["root"], EVAL, batch_size=4, labels=table,
                                        batch_transform=mixer))
    np.testing.assert_array_equal(unmixed, table.targets)  # eval mixes nothing


@pytest.fixture()
def dataset_seed():
    previous = ds.config.get_seed()
    yield
    ds.config.set_seed(previous)


def image_rows(images, reference):
    """The row of ``reference`` (all rows' eval images, in order) each of ``images`` is."""
    keys = {img.tobytes(): i for i, img in enumerate(reference)}
    return [keys[img.tobytes()] for img in images]


@pytest.mark.parametrize("shuffle", [False, True])
def test_two_shards_partition_the_rows_as_class_folders(labelled, dataset_seed, shuffle):
    table = read_label_file(labelled["csv"], labelled["root"])
    everything, _ = columns(create_dataset(labelled["root"], EVAL, batch_size=13, labels=table))
    shards, folder_counts = [], []
    for shard_id in range(2):
        sampling = Sampling(num_shards=2, shard_id=shard_id, shuffle=shuffle)
        ds.config.set_seed(77)
        images, targets = columns(create_dataset(labelled["root"], EVAL, batch_size=4,
                                                 labels=table, sampling=sampling))
        rows = image_rows(images, everything)
        np.testing.assert_array_equal(targets, table.targets[rows])
        shards.append(rows)
        ds.config.set_seed(77)
        folder = create_dataset(os.path.join(labelled["root"], "folders"), EVAL, batch_size=4,
                                sampling=sampling)
        folder_counts.append(sum(len(b[1]) for b in batches(folder)))
    assert [len(s) for s in shards] == folder_counts == [7, 7]  # 13 rows: one padded
    assert sorted(set(shards[0]) | set(shards[1])) == list(range(13))
    assert len(set(shards[0]) & set(shards[1])) == 1  # the padding row, read twice
    if not shuffle:
        assert shards == [list(range(0, 13, 2)), list(range(1, 13, 2)) + [0]]


def test_training_shuffles_with_the_dataset_seed(labelled, dataset_seed):
    table = read_label_file(labelled["csv"], labelled["root"])
    everything, _ = columns(create_dataset(labelled["root"], EVAL, batch_size=13, labels=table))

    def order(seed, settings=EVAL):
        ds.config.set_seed(seed)
        return columns(create_dataset(labelled["root"], settings, batch_size=4, labels=table,
                                      sampling=Sampling(shuffle=True, drop_remainder=False)))

    images, targets = order(5)
    rows = image_rows(images, everything)
    expected = EpochSampler(np.arange(13), seed=5).shard_order(0)
    assert rows == expected.tolist() and rows != list(range(13))
    np.testing.assert_array_equal(targets, table.targets[rows])
    assert image_rows(order(6)[0], everything) != rows
    train = TrainAugment(image_size=32)
    first, again = order(5, train), order(5, train)
    np.testing.assert_array_equal(first[0], again[0])  # crops reproducible too
    np.testing.assert_array_equal(first[1], table.targets[expected])
    assert len(first[1]) == 13


def test_a_pipeline_started_later_reads_the_same_rows(labelled, dataset_seed):
    """Resume (``set_init_step``, sink mode): the passes after the skipped ones draw the rows
    of an uninterrupted pipeline's, epoch by epoch (each pass its own permutation)."""
    table = read_label_file(labelled["csv"], labelled["root"])

    def pipeline():
        ds.config.set_seed(21)
        return create_dataset(labelled["root"], TrainAugment(image_size=32), batch_size=4,
                              labels=table)

    it = pipeline().create_tuple_iterator(num_epochs=3, output_numpy=True)
    whole = [np.concatenate([y for _, y in it]) for _ in range(3)]
    resumed = pipeline()
    resumed.set_init_step(3)  # one epoch of 3 batches
    it = resumed.create_tuple_iterator(num_epochs=3, output_numpy=True)
    again = [np.concatenate([y for _, y in it]) for _ in range(2)]
    assert not np.array_equal(whole[1], whole[2])
    for expected, got in zip(whole[1:], again):
        np.testing.assert_array_equal(got, expected)


def test_aug_repeats_read_each_drawn_row_twice(labelled, dataset_seed):
    table = read_label_file(labelled["csv"], labelled["root"])
    ds.config.set_seed(9)
    data = create_dataset(labelled["root"], TrainAugment(image_size=32, aug_repeats=2),
                          batch_size=4, labels=table, sampling=Sampling(drop_remainder=False))
    images, targets = columns(data)
    rows = EpochSampler(np.arange(13), seed=9, repeats=2).shard_order(0)
    assert rows[0] == rows[1] and len(rows) == 13
    np.testing.assert_array_equal(targets, table.targets[rows])
    assert not np.array_equal(images[0], images[1])  # each copy augmented on its own


def test_indices_and_refused_options(labelled):
    table = read_label_file(labelled["csv"], labelled["root"])
    _, targets = columns(create_dataset(labelled["root"], EVAL, batch_size=4, labels=table,
                                        sampling=Sampling(indices=[3, 7, 12])))
    np.testing.assert_array_equal(targets, table.targets[[3, 7, 12]])
    with pytest.raises(ValueError, match="balance_classes"):
        create_dataset(labelled["root"], TrainAugment(), labels=table,
                       sampling=Sampling(balance_classes=True))
    with pytest.raises(ValueError, match=r"positions in \[0, 13\) \(the rows of the label"):
        create_dataset(labelled["root"], EVAL, labels=table, sampling=Sampling(indices=[13]))
    with pytest.raises(ValueError, match="dataset imagefolder"):
        create_dataset(labelled["root"], EVAL, labels=table, dataset="cifar10")


class Info:
    def __init__(self, batch_num):
        self.batch_num = batch_num

    def get_batch_num(self):
        return self.batch_num

    def get_epoch_num(self):
        return 0


@pytest.mark.parametrize("alphas", [(0.4, 0.0), (0.0, 1.0)])
def test_mixing_multi_hot_targets_by_hand(alphas):
    rng = np.random.default_rng(0)
    y = (rng.random((6, 5)) < 0.4).astype(np.float32)
    y[2] = 0  # an image without a label
    x = np.arange(1, 7, dtype=np.float32)[:, None, None, None] * np.ones((6, 3, 8, 8),
                                                                         np.float32)
    mixer = BatchMixer(mixup_alpha=alphas[0], cutmix_alpha=alphas[1], label_smoothing=0.0,
                       class_num=5, seed=3)
    images, targets = mixer(x, y, Info(4))
    lam = mixer.draw(4)[1]
    if alphas[1]:  # CutMix: lam is the share of each image's own pixels kept
        lam = float((images[0] == 1).mean())
    assert 0 < lam < 1
    np.testing.assert_allclose(targets, lam * y + (1 - lam) * y[::-1], rtol=0, atol=1e-6)
    assert targets.dtype == np.float32
    with pytest.raises(ValueError, match=r"\(N, K\) = \(6, 5\)"):
        mixer(x, y[:, :4], Info(0))
    with pytest.raises(ValueError, match=r"in \[0, 1\]"):
        mixer(x, y * 2, Info(0))
    with pytest.raises(ValueError, match="label_smoothing 0.1"):
        BatchMixer(mixup_alpha=1.0, label_smoothing=0.1, class_num=5)(x, y, Info(0))


def test_mixer_in_the_pipeline_gets_the_float_targets(labelled, dataset_seed):
    table = read_label_file(labelled["csv"], labelled["root"])
    mixer = BatchMixer(mixup_alpha=1.0, label_smoothing=0.0, class_num=4, seed=1)
    ds.config.set_seed(4)
    data = create_dataset(labelled["root"], TrainAugment(image_size=32), batch_size=4,
                          labels=table, batch_transform=mixer)
    rows = EpochSampler(np.arange(13), seed=4).shard_order(0)
    out = batches(data)
    assert len(out) == 3  # the partial batch dropped before mixing
    for batch_num, (_, targets) in enumerate(out):
        lam = mixer.draw(batch_num)[1]
        y = table.targets[rows[4 * batch_num:4 * batch_num + 4]].astype(np.float64)
        assert targets.dtype == np.float32
        np.testing.assert_allclose(targets, lam * y + (1 - lam) * y[::-1], rtol=0, atol=1e-6)


def synthetic_targets(n=300, k=10, seed=0):
    """A fixed multi-label set: label frequencies from 40 % down to 1 %, correlated pairs."""
    rng = np.random.default_rng(seed)
    freq = np.geomspace(0.4, 0.01, k)
    y = rng.random((n, k)) < freq
    y[:, 1] |= y[:, 0] & (rng.random(n) < 0.5)  # label 1 often with label 0
    return y.astype(np.uint8)


def label_distribution(targets, parts):
    """Sechidis et al. 2011's LD: the mean over labels and parts of |positive/negative ratio
    of the label in the part - the ratio in the whole set|."""
    targets = np.asarray(targets, np.float64)
    whole = targets.sum(0) / (len(targets) - targets.sum(0))
    gaps = [np.abs(targets[p].sum(0) / (len(p) - targets[p].sum(0)) - whole) for p in parts]
    return float(np.mean(gaps))


def test_split_sizes_determinism_and_errors():
    y = synthetic_targets()
    train, val = multilabel_split(y, 0.2, seed=1)
    assert train.dtype == val.dtype == np.int64 and len(val) == 60 and len(train) == 240
    assert (np.diff(train) > 0).all() and (np.diff(val) > 0).all()
    assert sorted(np.concatenate([train, val]).tolist()) == list(range(300))
    again = multilabel_split(y, 0.2, seed=1)
    assert all(np.array_equal(a, b) for a, b in zip(again, (train, val)))
    assert not np.array_equal(multilabel_split(y, 0.2, seed=2)[1], val)
    for fraction in (0.001, 0.999):
        with pytest.raises(ValueError, match="leaves no"):
            multilabel_split(y, fraction, seed=0)
    with pytest.raises(ValueError, match=r"in \(0, 1\)"):
        multilabel_split(y, 1.0, seed=0)
    with pytest.raises(ValueError, match="multi-hot"):
        multilabel_split(y[:, 0], 0.5, seed=0)


@pytest.mark.parametrize("fraction", [0.1, 0.25, 0.5])
def test_split_sizes_exact_when_every_image_has_a_label(fraction):
    y = synthetic_targets()
    y[y.sum(1) == 0, 0] = 1  # no unlabelled image to fill a side up at the end
    for seed in range(3):
        train, val = multilabel_split(y, fraction, seed=seed)
        assert (len(train), len(val)) == (300 - round(fraction * 300), round(fraction * 300))


@pytest.mark.parametrize("fraction", [0.1, 0.25, 0.5, 0.9])
def test_split_fraction_and_rare_labels_on_both_sides(fraction):
    y = synthetic_targets()
    y[:7] = 0  # images without a label
    y[7:9, -1], y[9:11] = 1, 0  # the rarest label: 2 images ...
    y[9:11, -2] = 1  # ... and another of 2 images alone in theirs
    for seed in range(3):
        train, val = multilabel_split(y, fraction, seed=seed)
        assert len(val) == round(fraction * 300)
        both = (y[train].sum(0) > 0) & (y[val].sum(0) > 0)
        assert both[y.sum(0) >= 2].all(), (fraction, seed, y.sum(0), y[val].sum(0))


def test_split_deals_the_rarest_label_first():
    """Four images, labels L0 {0, 2, 3}, L1 {1, 3}, L2 {3}, one held out (0.25): each side
    wants r * n_l of each label, a label of >= 2 images at least 1 on each side, so train
    wants (2, 1, 0.75) and validation (1, 1, 0.25), the sides take 3 and 1 images. Rarest
    first (Sechidis et al. 2011): L2 deals image 3 to train (0.75 > 0.25), leaving train's
    wants (1, 0, -0.25); L1 deals image 1 to validation (1 > 0), which is then full; L0's
    images 0 and 2 go to train. Whatever the seed, validation is image 1. In label index
    order L0 would deal 0, 2, 3 first, and validation would get one of them."""
    y = np.array([[1, 0, 0], [0, 1, 0], [1, 0, 0], [1, 1, 1]], np.uint8)
    for seed in range(10):
        train, val = multilabel_split(y, 0.25, seed=seed)
        assert (train.tolist(), val.tolist()) == ([0, 2, 3], [1]), seed


def test_split_beats_a_random_split_on_label_distribution():
    y = synthetic_targets()
    ours = [label_distribution(y, multilabel_split(y, 0.2, seed=s)) for s in range(5)]
    rng = np.random.default_rng(123)
    randoms = []
    for _ in range(20):
        order = rng.permutation(300)
        randoms.append(label_distribution(y, [np.sort(order[60:]), np.sort(order[:60])]))
    assert max(ours) < min(randoms), (ours, randoms)
