"""Class-name files: one name per line, or ``index<TAB>wnid<TAB>name`` (ImageNet list)."""
import os

from src.utils.errors import MissingFileError
from src.utils.files import atomic_write_text

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
IMAGENET_CLASSES = os.path.join(ROOT, "data", "imagenet_classes.tsv")
# Label order of the CIFAR-10 binary release (batches.meta.txt).
CIFAR10_CLASSES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse",
                   "ship", "truck"]
CLASS_NAMES_FILE = "class_names.txt"


def read_class_names(path):
    """Read class names in label order.

    Lines are either a bare name or tab-separated ``index, wnid, name`` (the ImageNet list
    shipped in ``data/imagenet_classes.tsv``, where the last column is used).

    Raises:
        FileNotFoundError: If ``path`` does not exist.
    """
    if not os.path.isfile(path):
        raise MissingFileError(f"class names file not found: {path}")
    with open(path, encoding="utf-8") as f:
        rows = [line.rstrip("\n").split("\t") for line in f if line.strip()]
    # A tab-separated file may start with a header row ("index  wnid  name").
    return [row[-1] for row in rows if len(row) == 1 or row[0].strip().isdigit()]


def write_class_names(path, names):
    """Write one class name per line, in label order, atomically.

    Raises:
        WriteError: If the file cannot be written (names it).
    """
    atomic_write_text(path, "".join(f"{name}\n" for name in names))


def default_class_names_path(checkpoint_path, class_num):
    """Where predict looks when no ``class_names_path`` is given: ``class_names.txt`` beside
    the checkpoint (written by train.py), else the ImageNet list at 1000 classes, else None."""
    beside = os.path.join(os.path.dirname(os.path.abspath(checkpoint_path)), CLASS_NAMES_FILE)
    if os.path.isfile(beside):
        return beside
    return IMAGENET_CLASSES if class_num == 1000 else None
