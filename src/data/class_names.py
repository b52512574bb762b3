"""Class-name files: one name per line, or ``index<TAB>wnid<TAB>name`` (ImageNet list)."""
import os

from src.utils.errors import MissingFileError, UserError
from src.utils.files import atomic_write_text
from src.utils.hub import is_pretrained_source, resolve_weights

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
IMAGENET_CLASSES = os.path.join(ROOT, "data", "imagenet_classes.tsv")
# Label order of the CIFAR-10 binary release (batches.meta.txt).
CIFAR10_CLASSES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse",
                   "ship", "truck"]
CLASS_NAMES_FILE = "class_names.txt"


def read_class_names(path: str) -> list[str]:
    """Class names in label order: a name a line, or ``index<TAB>wnid<TAB>name`` lines.

    Raises:
        MissingFileError: If ``path`` does not exist.
        ClassNamesError: If it is not UTF-8 text (names the file).
    """
    if not os.path.isfile(path):
        raise MissingFileError(f"class names file not found: {path}")
    try:
        with open(path, encoding="utf-8") as f:
            rows = [line.rstrip("\n").split("\t") for line in f if line.strip()]
    except UnicodeDecodeError as err:
        raise ClassNamesError(f"class names file {path} is not UTF-8 text ({err.reason} at "
                              f"byte {err.start}): save it as UTF-8") from err
    # A tab-separated file may start with a header row ("index  wnid  name").
    return [row[-1] for row in rows if len(row) == 1 or row[0].strip().isdigit()]


def write_class_names(path: str, names: list[str]) -> None:
    """Write one class name per line, atomically; raises WriteError naming the file."""
    atomic_write_text(path, "".join(f"{name}\n" for name in names))


class ClassNamesError(UserError, ValueError):
    """A class-names list cannot be read, or does not have one name per class of the model."""


def model_class_names(checkpoint_path: str, class_num: int,
                      class_names_path: str = "") -> list[str] | None:
    """A model's class names: ``class_names_path`` if given, else Hub weights' ``label_names``,
    else ``default_class_names_path``; None when none is known.

    Raises:
        ClassNamesError: If the names found are not ``class_num`` (names the source).
        MissingFileError: If ``class_names_path`` does not exist.
    """
    names, source = None, class_names_path
    if not class_names_path and is_pretrained_source(checkpoint_path):
        names = resolve_weights(checkpoint_path).label_names
        source = f"{checkpoint_path} (config.json label_names)"
    if names is None:
        source = class_names_path or default_class_names_path(checkpoint_path, class_num)
        if source is None:
            return None
        names = read_class_names(source)
    if len(names) != class_num:
        raise ClassNamesError(f"class names {source} list {len(names)} names but the model has "
                              f"{class_num} classes")
    return names


def default_class_names_path(checkpoint_path: str, class_num: int) -> str | None:
    """``class_names.txt`` beside the checkpoint (in it, for a folder), else the ImageNet list
    at 1000 classes, else None."""
    folder = checkpoint_path if os.path.isdir(checkpoint_path) else os.path.dirname(
        os.path.abspath(checkpoint_path))
    beside = os.path.join(folder, CLASS_NAMES_FILE)
    if os.path.isfile(beside):
        return beside
    return IMAGENET_CLASSES if class_num == 1000 else None
