"""Build data/cifar10_mosaics: a small real multi-label sample of 2x2 mosaics of CIFAR-10 photos.

    python tools/make_multilabel_sample.py                       # rebuilds data/cifar10_mosaics
    python tools/make_multilabel_sample.py --output_dir /tmp/m   # the same files elsewhere
    python tools/make_multilabel_sample.py --stats               # statistics of the shipped files

Each 64x64 mosaic holds four 32x32 tiles: photos of data/cifar10_sample, unchanged pixels, or
blank mid-grey tiles; its labels are the classes of its photos (Kaggle Planet's `image_name,tags`
CSV form). The train mosaics use the train photos only, the val mosaics the test photos only.
The layout is drawn with a fixed seed, so the files are rebuilt byte for byte (the JPEG bytes
with the same Pillow build: its libjpeg-turbo encodes them). `tiles.csv` records the photo of
every tile. Design and statistics: data/README.md.
"""
import argparse
import csv
import functools
import io
import os
import shutil
import sys

import numpy as np
from PIL import Image

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCE = os.path.join(ROOT, "data", "cifar10_sample")
OUTPUT = os.path.join(ROOT, "data", "cifar10_mosaics")
SEED = 42
TILE = 32
GRID = 2                 # GRID x GRID tiles per mosaic
GREY = 128               # the blank tile's value in each channel
QUALITY = 90             # JPEG quality (4:2:0 chroma, Pillow's default at this quality)
# (output split, photo folder of data/cifar10_sample, mosaics); the photo sets are disjoint
SPLITS = (("train", "train", 600), ("val", "test", 150))
# weights of the number of distinct classes in a mosaic, 0 (blank tiles only) to GRID * GRID
CLASS_COUNT_WEIGHTS = (0.03, 0.22, 0.30, 0.25, 0.20)
BLANK_PROBABILITY = 0.5  # a tile left over once every drawn class has one: blank, else a 2nd photo
TILE_COLUMNS = ("top_left", "top_right", "bottom_left", "bottom_right")  # row-major


def photo_pools(folder: str) -> dict[str, list[str]]:
    """The photos of each class of a class folder (``SOURCE/train`` or ``SOURCE/test``).

    Returns:
        dict[str, list[str]]: Class name -> its photos' paths relative to ``SOURCE``
        (``<split>/<class>/<file>``), sorted; classes in sorted order.
    """
    split = os.path.basename(folder)
    return {name: [f"{split}/{name}/{f}" for f in sorted(os.listdir(os.path.join(folder, name)))]
            for name in sorted(os.listdir(folder)) if os.path.isdir(os.path.join(folder, name))}


def draw_layouts(pools: dict[str, list[str]], count: int, seed: int) -> list[list[str]]:
    """The tiles of ``count`` mosaics: per mosaic, a number of distinct classes drawn with
    ``CLASS_COUNT_WEIGHTS``, the classes uniformly, then the leftover tiles blank or a second
    photo of a drawn class; tile positions shuffled. Each class's photos are used in turn from
    a shuffled order, so every photo is used about equally often.

    Returns:
        list[list[str]]: Per mosaic, ``GRID * GRID`` photo paths (``""`` = blank), row-major.
    """
    rng = np.random.default_rng(seed)
    names = list(pools)
    orders = {n: [pools[n][i] for i in rng.permutation(len(pools[n]))] for n in names}
    used = dict.fromkeys(names, 0)

    def next_photo(name):
        used[name] += 1
        return orders[name][(used[name] - 1) % len(orders[name])]

    layouts = []
    for _ in range(count):
        k = int(rng.choice(len(CLASS_COUNT_WEIGHTS), p=CLASS_COUNT_WEIGHTS))
        drawn = [names[i] for i in rng.choice(len(names), size=k, replace=False)]
        tiles = [next_photo(n) for n in drawn]
        while len(tiles) < GRID * GRID:
            blank = not drawn or rng.random() < BLANK_PROBABILITY
            tiles.append("" if blank else next_photo(drawn[rng.integers(len(drawn))]))
        layouts.append([tiles[i] for i in rng.permutation(len(tiles))])
    return layouts


@functools.lru_cache(maxsize=4096)
def photo(path: str) -> np.ndarray:
    """The decoded RGB pixels of a photo, uint8 (TILE, TILE, 3); ValueError for another size."""
    with Image.open(path) as im:
        pixels = np.asarray(im.convert("RGB"))
    if pixels.shape != (TILE, TILE, 3):
        raise ValueError(f"{path}: {pixels.shape[1]}x{pixels.shape[0]}, expected {TILE}x{TILE}")
    return pixels


def compose(tiles: list[str], source: str = SOURCE) -> np.ndarray:
    """The mosaic of ``tiles`` (photo paths relative to ``source``, ``""`` = blank).

    Returns:
        np.ndarray: uint8 (GRID * TILE, GRID * TILE, 3), the photos' decoded RGB pixels.
    """
    side = GRID * TILE
    mosaic = np.full((side, side, 3), GREY, np.uint8)
    for i, tile in enumerate(tiles):
        if tile:
            row, col = divmod(i, GRID)
            mosaic[row * TILE:(row + 1) * TILE, col * TILE:(col + 1) * TILE] = \
                photo(os.path.join(source, tile))
    return mosaic


def tile_class(tile: str) -> str:
    """The class of a tile's photo (its folder name), ``""`` for a blank tile."""
    return tile.split("/")[1] if tile else ""


def tags(tiles: list[str]) -> str:
    """The labels of a mosaic: its tiles' distinct classes, sorted, separated by one space."""
    return " ".join(sorted({tile_class(t) for t in tiles if t}))


def jpeg_bytes(pixels: np.ndarray) -> bytes:
    """``pixels`` encoded as JPEG at ``QUALITY``."""
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, "JPEG", quality=QUALITY)
    return buffer.getvalue()


def write_csv(path: str, header: tuple, rows: list) -> None:
    with open(path, "w", encoding="utf-8", newline="") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(header)
        writer.writerows(rows)


def check_output_dir(output_dir: str) -> None:
    """Refuse a folder holding anything but this tool's files (it is rebuilt from scratch)."""
    if not os.path.exists(output_dir):
        return
    own = {"train", "val", "train.csv", "val.csv", "tiles.csv"}
    foreign = sorted(set(os.listdir(output_dir)) - own)
    for split in ("train", "val"):
        folder = os.path.join(output_dir, split)
        if os.path.isdir(folder):
            foreign += [f"{split}/{f}" for f in sorted(os.listdir(folder))
                        if not f.endswith(".jpg")]
    if foreign:
        raise SystemExit(f"make_multilabel_sample.py: error: {output_dir} holds files this tool "
                         f"did not write ({', '.join(foreign[:5])}); give an empty or new folder")


def build(output_dir: str, source: str = SOURCE) -> None:
    """Write the mosaics, ``train.csv``, ``val.csv`` and ``tiles.csv`` into ``output_dir``
    (replacing this tool's earlier files there)."""
    check_output_dir(output_dir)
    for name in ("train", "val"):
        shutil.rmtree(os.path.join(output_dir, name), ignore_errors=True)
    tile_rows = []
    for index, (split, photos, count) in enumerate(SPLITS):
        os.makedirs(os.path.join(output_dir, split))
        layouts = draw_layouts(photo_pools(os.path.join(source, photos)), count, seed=SEED + index)
        rows = []
        for number, tiles in enumerate(layouts, 1):
            name = f"{split}/{number:04d}.jpg"
            with open(os.path.join(output_dir, name), "wb") as f:
                f.write(jpeg_bytes(compose(tiles, source)))
            rows.append((name, tags(tiles)))
            tile_rows.append((name, *tiles))
        write_csv(os.path.join(output_dir, f"{split}.csv"), ("image_name", "tags"), rows)
    write_csv(os.path.join(output_dir, "tiles.csv"), ("image_name", *TILE_COLUMNS), tile_rows)


def read_targets(label_file: str, class_names: list[str]) -> np.ndarray:
    """The multi-hot targets of a label CSV of this tool (rows in file order).

    Returns:
        np.ndarray: uint8 (N, K), K = len(class_names).
    """
    with open(label_file, encoding="utf-8", newline="") as f:
        rows = list(csv.reader(f))[1:]
    targets = np.zeros((len(rows), len(class_names)), np.uint8)
    for i, (_, names) in enumerate(rows):
        for name in names.split():
            targets[i, class_names.index(name)] = 1
    return targets


def frequency_baseline_map(train: np.ndarray, val: np.ndarray) -> float:
    """mAP on ``val`` of scoring every image by each class's training frequency, by
    scikit-learn's ``average_precision_score`` (per class, then the mean). All images tie, so
    each class's AP is its val prevalence (checked here).

    Returns:
        float: The mean over the classes of ``val`` with a positive.
    """
    from sklearn.metrics import average_precision_score

    scores = np.broadcast_to(train.mean(axis=0), val.shape)
    present = val.sum(axis=0) > 0
    ap = average_precision_score(val[:, present], scores[:, present], average=None)
    np.testing.assert_allclose(ap, val.mean(axis=0)[present], rtol=1e-12)
    return float(np.mean(ap))


def coverage_problems(targets: dict[str, np.ndarray], class_names: list[str]) -> list[str]:
    """What a sample lacks: per file, a class with no positive or a label count (0 to
    ``GRID * GRID``) that no image has.

    Returns:
        list[str]: One line per problem; empty when every class and count occurs in every file.
    """
    problems = []
    for split, t in targets.items():
        problems += [f"{split}.csv: no image of {n}" for n, p in zip(class_names, t.sum(axis=0))
                     if not p]
        counts = set(t.sum(axis=1).tolist())
        problems += [f"{split}.csv: no image with {k} labels" for k in range(GRID * GRID + 1)
                     if k not in counts]
    return problems


def read_split_targets(output_dir: str, class_names: list[str]) -> dict[str, np.ndarray]:
    """The targets of each label CSV of a built folder, ``{"train": ..., "val": ...}``."""
    return {split: read_targets(os.path.join(output_dir, f"{split}.csv"), class_names)
            for split, _, _ in SPLITS}


def statistics(output_dir: str, class_names: list[str]) -> list[str]:
    """The label statistics of a built folder as Markdown lines: per class the positives in
    each file, the histogram of labels per image, the label-frequency baseline mAP on val."""
    targets = read_split_targets(output_dir, class_names)
    train, val = targets["train"], targets["val"]
    lines = ["| class | " + " | ".join(class_names) + " |",
             "|---|" + "---|" * len(class_names)]
    for split, t in targets.items():
        lines.append(f"| {split}.csv positives ({len(t)} images) | "
                     + " | ".join(str(int(n)) for n in t.sum(axis=0)) + " |")
    counts = range(GRID * GRID + 1)
    lines += ["", "| labels per image | " + " | ".join(map(str, counts)) + " |",
              "|---|" + "---|" * len(counts)]
    for split, t in targets.items():
        histogram = np.bincount(t.sum(axis=1, dtype=np.int64), minlength=len(counts))
        lines.append(f"| {split}.csv images | " + " | ".join(map(str, histogram)) + " |")
    baseline = frequency_baseline_map(train, val)
    lines += ["", f"Label-frequency baseline mAP on val.csv: {baseline:.4f}"]
    return lines


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--output_dir", default=OUTPUT,
                        help="folder to write (default: data/cifar10_mosaics)")
    parser.add_argument("--stats", action="store_true",
                        help="print the statistics of the folder without rebuilding it")
    args = parser.parse_args(argv)
    class_names = list(photo_pools(os.path.join(SOURCE, "train")))
    if not args.stats:
        build(args.output_dir)
        print(f"wrote {args.output_dir}")
    problems = coverage_problems(read_split_targets(args.output_dir, class_names), class_names)
    if problems:
        print("make_multilabel_sample.py: error: " + "; ".join(problems), file=sys.stderr)
        return 1
    print("\n".join(statistics(args.output_dir, class_names)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
