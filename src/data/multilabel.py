"""Multi-label data: the label file (a CSV with a header, one row per image: its path relative to
``data_path`` and its class names separated by spaces, Kaggle Planet's ``image_name,tags``),
read into a ``LabelTable`` of multi-hot targets, and the iterative-stratification split of such
targets. See docs/data.md#multi-label-data-label_file.
"""
import csv
import io
import os
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from src.data.image_check import DECODER_FORMATS, broken_images
from src.utils.errors import MissingFileError, UserError

LISTED_ROWS = 10  # rows named in an error before "and N more"
SPLIT_STREAM = 3  # tags the split's random stream apart from split.py's (1) and sampling's (2)
FOLD_STREAM = 4  # and label_issues.py's folds (multilabel_folds) apart from the split's
# a header cell with one of these suffixes is an image row: the header is missing
_IMAGE_SUFFIXES = {"JPG", "JPEG", "PNG", "BMP", "TIF", "TIFF", "PPM"}
_TABLES = {}  # (label file stat, data_path, class names, check_images) -> LabelTable


class LabelFileError(UserError, ValueError):
    """A label file cannot be read as it is; the message names the file and its rows."""


class LabelTable(NamedTuple):
    """A label file read: ``files`` as written (relative to ``data_path``) and their ``paths``,
    in the file's row order; ``targets`` uint8 (N, K) multi-hot; ``class_names`` K names in
    label order."""

    files: list[str]
    paths: list[str]
    targets: np.ndarray
    class_names: list[str]


class _Row(NamedTuple):
    number: int  # the row's line in the file, 1 = header
    file: str
    names: list[str]


def _rows_text(label_file: str, what: str, rows: list[str]) -> str:
    """``"label_file FILE: WHAT: ROW, ROW ... and N more"``."""
    more = f" and {len(rows) - LISTED_ROWS} more" if len(rows) > LISTED_ROWS else ""
    return f"label_file {label_file}: {what}: {'; '.join(rows[:LISTED_ROWS])}{more}"


def _read_rows(label_file: str) -> list[_Row]:
    """The image rows of a label file (``_read_table``)."""
    return _read_table(label_file)[1]


def label_file_header(label_file: str) -> list[str]:
    """The 2 cells of a label file's header row, as written (e.g. ``["image_name", "tags"]``).

    Raises:
        MissingFileError, LabelFileError: As ``read_label_file``'s structure checks.
    """
    return _read_table(label_file)[0]


def label_file_text(header: Sequence[str], files: Sequence[str], names: Sequence[str]) -> str:
    """A label file (the module docstring's form, which ``read_label_file`` reads back): the
    ``header`` row (2 cells), then per image its path as given in ``files`` (relative to the
    data_path the file is read with) and its class names separated by spaces (``names``, as
    ``row_names`` gives them); CSV text with ``\\n`` line ends."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(zip(files, names))
    return out.getvalue()


def row_names(targets: np.ndarray, class_names: Sequence[str]) -> list[str]:
    """Per row of multi-hot ``targets`` (N, K): the names of its positive classes in label
    order, separated by spaces (a label file's ``tags`` cell; "" for none)."""
    return [" ".join(class_names[k] for k in np.flatnonzero(row)) for row in targets]


def _read_table(label_file: str) -> tuple[list[str], list[_Row]]:
    """The header cells and the image rows of a label file (blank lines skipped), its
    structure checked.

    Raises:
        MissingFileError: If ``label_file`` is not a file.
        LabelFileError: If it cannot be read, is not UTF-8, holds no header or no image row, a
            header or rows of other than 2 columns (names the rows).
    """
    if not os.path.isfile(label_file):
        raise MissingFileError(f"label_file {label_file!r} does not exist")
    try:
        with open(label_file, encoding="utf-8-sig", newline="") as f:
            reader = csv.reader(f)
            table = [(reader.line_num, row) for row in reader if any(c.strip() for c in row)]
    except OSError as err:
        raise LabelFileError(f"label_file {label_file}: cannot be read "
                             f"({err.strerror or err})") from err
    except UnicodeDecodeError as err:
        raise LabelFileError(f"label_file {label_file}: not UTF-8 text ({err.reason})") from err
    except csv.Error as err:
        raise LabelFileError(f"label_file {label_file}: not a CSV file ({err})") from err
    if not table:
        raise LabelFileError(f"label_file {label_file} is empty: expected a header "
                             f"(e.g. image_name,tags) and one row per image")
    header = table[0][1]
    if len(header) != 2 or not all(c.strip() for c in header) \
            or os.path.splitext(header[0].strip())[1].upper().lstrip(".") in _IMAGE_SUFFIXES:
        raise LabelFileError(f"label_file {label_file}: row {table[0][0]} "
                             f"{','.join(header)!r} is no header: the first row must name the "
                             f"2 columns (e.g. image_name,tags), the image rows follow it")
    wrong = [f"row {n} ({len(row)} columns)" for n, row in table[1:] if len(row) != 2]
    if wrong:
        raise LabelFileError(_rows_text(label_file, "rows of other than 2 columns (image path, "
                                        "class names separated by spaces; quote a path "
                                        "holding a comma)", wrong))
    if len(table) == 1:
        raise LabelFileError(f"label_file {label_file} has a header but no image row")
    return header, [_Row(n, row[0].strip(), row[1].split()) for n, row in table[1:]]


def label_file_classes(label_file: str) -> list[str]:
    """The sorted set of the class names a label file uses (a run's classes without a
    class-names file).

    Raises:
        MissingFileError, LabelFileError: As ``read_label_file``; LabelFileError also if no
            row names a class.
    """
    names = sorted({name for row in _read_rows(label_file) for name in row.names})
    if not names:
        raise LabelFileError(f"label_file {label_file}: no row names a class; give the class "
                             f"names (class_names file) or label the images")
    return names


def _bad_paths(rows: list[_Row]) -> list[str]:
    """``"row N (PATH: why)"`` of empty, absolute or ``..`` image paths (any ``..``
    component, wherever it leads: docs/data.md#multi-label-data-label_file)."""
    bad = []
    for row in rows:
        parts = row.file.replace("\\", "/").split("/")
        why = ("empty path" if not row.file else
               "absolute path" if os.path.isabs(row.file) or row.file.startswith(("/", "\\")) else
               "contains '..': give paths inside data_path without '..'" if ".." in parts
               else None)
        if why:
            bad.append(f"row {row.number} ({row.file!r}: {why})")
    return bad


def _duplicated(rows: list[_Row]) -> list[str]:
    """``"row N (PATH, as row M)"`` of rows naming an image an earlier row names."""
    first, twice = {}, []
    for row in rows:
        key = os.path.normpath(row.file)
        if key in first:
            twice.append(f"row {row.number} ({row.file}, as row {first[key]})")
        else:
            first[key] = row.number
    return twice


def _check_images(label_file: str, rows: list[_Row], paths: list[str], full: bool) -> None:
    """Raise LabelFileError naming the rows of missing, unreadable, oversized or broken images
    (``broken_images`` of the class-folder check; ``full``: decode every image)."""
    missing = [f"row {r.number} ({p})" for r, p in zip(rows, paths) if not os.path.isfile(p)]
    if missing:
        raise LabelFileError(_rows_text(label_file, "image files that do not exist (paths are "
                                        "relative to data_path)", missing))
    row_of = {p: r.number for r, p in zip(rows, paths)}
    unreadable, large, broken = broken_images(paths, full=full)
    for what, found in (("image files that cannot be read", unreadable),
                        ("images with more pixels than max_image_pixels (raise the key to "
                         "read them)", large),
                        (f"corrupt or truncated images, or of a format the decoder does not "
                         f"read (it reads {', '.join(DECODER_FORMATS)})", broken)):
        if found:
            named = [f"row {row_of[_path_of(entry, row_of)]} ({entry})" for entry in found]
            raise LabelFileError(_rows_text(label_file, what, named))


def _path_of(entry: str, row_of: dict[str, int]) -> str:
    """The path ``broken_images`` reported as ``entry`` (``"path"`` or ``"path (reason)"``)."""
    if entry in row_of:
        return entry
    return next(p for p in row_of if entry.startswith(f"{p} ("))


def read_label_file(label_file: str, data_path: str, *, class_names: list[str] | None = None,
                    check_images: bool = True) -> LabelTable:
    """Read a label file (module docstring) into a ``LabelTable``; read once per process while
    the file is unchanged.

    Args:
        label_file: The CSV.
        data_path: Folder the image paths are relative to.
        class_names: The label order; None: ``label_file_classes(label_file)``.
        check_images: Decode-check every image as the class-folder check does; False: JPEG
            headers only (``src.data.image_check``).

    Raises:
        MissingFileError: If ``label_file`` or ``data_path`` does not exist.
        LabelFileError: As ``label_file_classes``, and for empty, absolute or ``..`` paths,
            duplicated rows, class names not in ``class_names``, missing or broken images
            (names the rows).
        ValueError: If ``class_names`` is empty or repeats a name.
    """
    if not os.path.isdir(data_path):
        raise MissingFileError(f"data_path {data_path!r} is not a folder")
    if class_names is not None:
        if not class_names or len(set(class_names)) != len(class_names):
            raise ValueError(f"class_names must be distinct names, at least one, got "
                             f"{len(class_names)} with {len(set(class_names))} distinct")
        class_names = list(class_names)
    stat = os.stat(label_file) if os.path.isfile(label_file) else None
    key = (os.path.realpath(label_file), stat and (stat.st_mtime_ns, stat.st_size),
           os.path.realpath(data_path), tuple(class_names or ()), bool(check_images))
    if stat is not None and key in _TABLES:
        return _copy(_TABLES[key])
    rows = _read_rows(label_file)
    class_names = class_names or label_file_classes(label_file)
    for what, bad in (("image paths must be relative to data_path, inside it", _bad_paths(rows)),
                      ("images listed more than once (one row per image)", _duplicated(rows))):
        if bad:
            raise LabelFileError(_rows_text(label_file, what, bad))
    position = {name: k for k, name in enumerate(class_names)}
    unknown = [f"row {r.number} ({' '.join(sorted({n for n in r.names if n not in position}))})"
               for r in rows if any(n not in position for n in r.names)]
    if unknown:
        raise LabelFileError(_rows_text(label_file, f"class names not among the "
                                        f"{len(class_names)} classes", unknown))
    paths = [os.path.join(data_path, r.file) for r in rows]
    _check_images(label_file, rows, paths, check_images)
    targets = np.zeros((len(rows), len(class_names)), np.uint8)
    for i, row in enumerate(rows):
        targets[i, [position[n] for n in row.names]] = 1
    _TABLES[key] = LabelTable([r.file for r in rows], paths, targets, class_names)
    return _copy(_TABLES[key])


def _copy(table: LabelTable) -> LabelTable:
    return LabelTable(list(table.files), list(table.paths), table.targets.copy(),
                      list(table.class_names))


def multilabel_split(targets: np.ndarray, val_fraction: float, seed: int
                     ) -> tuple[np.ndarray, np.ndarray]:
    """Ascending int64 (train_rows, val_rows) of multi-hot ``targets`` (N, K): iterative
    stratification (``iterative_stratification``) into ``round(val_fraction * N)`` and the
    rest, a function of (targets, val_fraction, seed); a label of >= 2 images wants at least 1
    image on each side (docs/data.md#the-split-iterative-stratification).

    Raises:
        ValueError: If ``targets`` is not 2-D, ``val_fraction`` is outside (0, 1), or a side
            would be empty.
    """
    targets = _multi_hot(targets)
    if not 0 < val_fraction < 1:
        raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction}")
    n = len(targets)
    held = round(val_fraction * n)
    if held < 1 or held >= n:
        raise ValueError(f"val_fraction {val_fraction} of {n} images leaves "
                         f"{'no validation' if held < 1 else 'no training'} image")
    per_label = targets.sum(0).astype(np.float64)
    wanted_val = np.where(per_label >= 2, np.clip(val_fraction * per_label, 1, per_label - 1),
                          val_fraction * per_label)
    side = iterative_stratification(targets, [n - held, held],
                                    np.stack([per_label - wanted_val, wanted_val]),
                                    np.random.default_rng([int(seed) % 2 ** 64, SPLIT_STREAM]))
    return np.flatnonzero(side == 0).astype(np.int64), np.flatnonzero(side == 1).astype(np.int64)


def multilabel_folds(targets: np.ndarray, folds: int, seed: int) -> np.ndarray:
    """The fold (0..folds-1) of each row of multi-hot ``targets`` (N, K): iterative
    stratification (``iterative_stratification``) into ``folds`` parts of desired proportion
    1/folds each, i.e. ``N // folds`` or one more rows (the first ``N % folds`` folds take
    the one more) and ``n_k / folds`` of the ``n_k`` positives of each label k; a function of
    (targets, folds, seed), drawn from a stream of its own (``FOLD_STREAM``).

    Args:
        targets: (N, K) multi-hot, any numeric or bool dtype (non-zero: positive).
        folds: The number of parts, 2 to N.
        seed: The run's seed.

    Returns:
        numpy.ndarray: int64 (N,).

    Raises:
        ValueError: If ``targets`` is not 2-D, or ``folds`` is under 2 or above N.
    """
    targets = _multi_hot(targets)
    n = len(targets)
    if not 2 <= folds <= n:
        raise ValueError(f"folds must be 2 to the {n} rows, got {folds}")
    sizes = n // folds + (np.arange(folds) < n % folds)
    wanted = np.tile(targets.sum(0) / folds, (folds, 1))
    return iterative_stratification(targets, sizes, wanted,
                                    np.random.default_rng([int(seed) % 2 ** 64, FOLD_STREAM]))


def iterative_stratification(targets: np.ndarray, sizes, wanted: np.ndarray,
                             rng: np.random.Generator) -> np.ndarray:
    """Sechidis, Tsoumakas and Vlahavas 2011 ("On the stratification of multi-label data",
    ECML PKDD, Algorithm 1): the part of each row of ``targets``. Rows are taken in the order
    of a permutation drawn first from ``rng`` (ties are broken by it too); while a label has
    rows left, the label with the fewest rows left (a tie: one drawn) places each of its rows
    still unplaced into the part with room that wants that label most (``wanted``), then the
    one with most room, then one drawn; a placed row takes one of its part's room and one of
    its part's want of each of its labels. Rows without a label go last, where room is left.

    Args:
        targets: bool (N, K) multi-hot.
        sizes: int (P,) rows each part takes, summing to N.
        wanted: float (P, K) positives of each label each part is to take (copied).
        rng: The stream of the choices; drawn from in a fixed order.

    Returns:
        numpy.ndarray: int64 (N,) part of each row, 0..P-1.
    """
    n = len(targets)
    order = rng.permutation(n)  # the order examples are taken in, ties broken by it too
    wanted = np.array(wanted, np.float64)
    room = np.array(sizes, np.int64)  # rows each part still takes
    side = np.full(n, -1, np.int64)
    members = [order[targets[order, k]] for k in range(targets.shape[1])]
    remaining = targets.sum(0).astype(np.int64)
    while remaining.any():
        counts = np.where(remaining > 0, remaining, np.iinfo(np.int64).max)
        rarest = np.flatnonzero(counts == counts.min())
        label = int(rarest[rng.integers(len(rarest))]) if len(rarest) > 1 else int(rarest[0])
        for i in members[label]:
            if side[i] >= 0:
                continue
            open_sides = np.flatnonzero(room > 0)
            j = _pick(rng, open_sides, wanted[open_sides, label], room[open_sides])
            side[i] = j
            room[j] -= 1
            wanted[j, targets[i]] -= 1
            remaining[targets[i]] -= 1
    for i in order[side[order] < 0]:  # images without a label: where room is left
        j = _pick(rng, np.flatnonzero(room > 0), room[room > 0], room[room > 0])
        side[i] = j
        room[j] -= 1
    return side


def _multi_hot(targets: np.ndarray) -> np.ndarray:
    """``targets`` as a bool (N, K) array.

    Raises:
        ValueError: If it is not 2-D.
    """
    targets = np.asarray(targets) != 0
    if targets.ndim != 2:
        raise ValueError(f"targets must be (N, K) multi-hot, got shape {targets.shape}")
    return targets


def _pick(rng, sides, wanted, room):
    """Of ``sides``: the one wanting the label most, then with most room, then at random."""
    best = sides[wanted == wanted.max()]
    room = room[wanted == wanted.max()]
    best = best[room == room.max()]
    return int(best[rng.integers(len(best))]) if len(best) > 1 else int(best[0])
