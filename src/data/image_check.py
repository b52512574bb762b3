"""Checking a class-folder dataset before MindSpore reads it.

MindSpore's decoders stop the pipeline on a corrupt file with a C++ error, and a truncated
JPEG crashes the OpenCV decode of the training pipeline with SIGFPE (no message at all:
measured with MindSpore 2.10 on CPU). So every file is checked here first: a JPEG (nearly
all of ImageNet) cheaply, by its end-of-image marker (searched in the last 4 KB, as some files
carry trailing data), and only decoded with Pillow when the marker is missing, to confirm; a
PNG, BMP or any other file is verified and decoded with Pillow (its chunk checksums and pixel
data: a truncated PNG or BMP fails). About a minute per million JPEGs on a local disk; a
folder of more than ``PROGRESS_MIN_FILES`` files shows progress while it is checked.
"""
import contextlib
import logging
import os
import re

from PIL import Image

from src.utils.errors import MissingFileError, UserError
from src.utils.progress import Progress

LOGGER = logging.getLogger(__name__)
_CHECKED = {}  # realpath -> (class names, whether file contents were checked)
# What the reader takes (MindSpore matches extensions case-sensitively).
IMAGE_EXTENSIONS = [".jpg", ".jpeg", ".png", ".bmp", ".JPG", ".JPEG", ".PNG", ".BMP"]
JPEG_SIGNATURE = b"\xff\xd8\xff"
JPEG_END = b"\xff\xd9"
TAIL_BYTES = 4096
METADATA_PREFIX = "._"  # macOS AppleDouble files: "._photo.jpg" is not an image
SHOWN = 5
PROGRESS_MIN_FILES = 20000  # a few seconds of checking: smaller folders show no progress
MAX_PIXELS_WORDS = "more pixels than max_image_pixels"  # in the decoder's error (transforms)


class ImageFolderError(UserError, ValueError):
    """Image files, or a class-folder dataset, cannot be read as they are; the message names
    the files."""


def set_max_image_pixels(limit):
    """The one pixel-count limit of every entry point (key ``max_image_pixels``): Pillow's own
    (``PIL.Image.MAX_IMAGE_PIXELS``, which its ``Image.open`` consults), read by the image
    check, the eval decoder and predict alike; an image above it is an error naming the file
    and the limit. Set once at start-up, before any image is opened.

    Args:
        limit (int): Width x height of the largest image accepted.
    """
    Image.MAX_IMAGE_PIXELS = int(limit)


def too_many_pixels(image):
    """``"W x H"`` of an opened (lazy) Pillow image above the limit, else None."""
    width, height = image.size
    limit = Image.MAX_IMAGE_PIXELS
    return f"{width} x {height}" if limit and width * height > limit else None


def oversized(path):
    """``"W x H"`` if the image at ``path`` has more pixels than the limit
    (``set_max_image_pixels``), else None; reads the header only. Files Pillow cannot open
    are left to the integrity check."""
    try:
        with Image.open(path) as image:
            return too_many_pixels(image)
    except Image.DecompressionBombError:  # above twice the limit: refused by Pillow itself
        return "more than twice the limit"
    except (OSError, SyntaxError, ValueError):
        return None


def scan_folder(folder):
    """The sub-folders and files of ``folder`` (names, sorted), links followed.

    Raises:
        ImageFolderError: Naming the entries whose links cannot be followed (a link to
            itself, a loop of links: ``OSError`` ELOOP), instead of a traceback.
    """
    folders, files, unreadable = [], [], []
    for entry in os.scandir(folder):
        try:
            (folders if entry.is_dir() else files if entry.is_file() else []).append(entry.name)
        except OSError as err:
            unreadable.append(f"{entry.path} ({err.strerror})")
    if unreadable:
        raise ImageFolderError(_listing("links that cannot be followed (a link to itself or "
                                        "a loop of links): remove them", sorted(unreadable)))
    return sorted(folders), sorted(files)


def is_image_name(name):
    """Whether the reader takes this file: an image extension, all lower or all upper case
    (``IMAGE_EXTENSIONS``; MindSpore's ImageFolderDataset matches them case-sensitively)."""
    return os.path.splitext(name)[1] in IMAGE_EXTENSIONS


def jpeg_looks_complete(path):
    """Cheap check: the file starts as a JPEG and its end-of-image marker is in its last
    ``TAIL_BYTES`` bytes."""
    with open(path, "rb") as f:
        if f.read(len(JPEG_SIGNATURE)) != JPEG_SIGNATURE:
            return False
        f.seek(max(0, os.path.getsize(path) - TAIL_BYTES))
        return JPEG_END in f.read()


def decodes(path):
    """Whether Pillow verifies (structure and checksums: PNG chunk CRCs) and fully decodes the
    file (all pixel data present: a truncated PNG, BMP or JPEG fails)."""
    try:
        with Image.open(path) as image:
            image.verify()
        with Image.open(path) as image:  # verify() leaves the image unusable: reopen
            image.load()
        return True
    except (OSError, SyntaxError, ValueError):
        return False


def is_intact(path):
    """Whether an image file is complete: a JPEG by its end marker (decoded only when that
    is missing), any other file by a Pillow verify and decode."""
    return jpeg_looks_complete(path) or decodes(path)


def _listing(text, paths):
    shown = ", ".join(paths[:SHOWN])
    more = f" ... ({len(paths)} in all)" if len(paths) > SHOWN else ""
    return f"{text}: {shown}{more}"


def broken_images(paths):
    """The files among ``paths`` above the pixel limit (``oversized``) and those that fail
    ``is_intact``, in order; progress is shown for more than ``PROGRESS_MIN_FILES`` files.

    Returns:
        tuple(list[str], list[str]): (too large as "path (W x H)", broken paths).
    """
    large, broken = [], []
    with Progress(len(paths), "image check", quiet=len(paths) <= PROGRESS_MIN_FILES) as progress:
        for path in paths:
            size = oversized(path)
            if size:
                large.append(f"{path} ({size})")
            elif not is_intact(path):
                broken.append(path)
            progress.update(1)
    return large, broken


def check_image_folder(data_path, check_content=True):
    """Check an ImageFolder root; return its class names in label order.

    A folder is checked once per process (a content check also covers later layout-only
    calls), so per-epoch pipelines neither rescan it nor repeat the warning.

    Files that are not images by extension (.txt, .DS_Store, .gif, ...) are skipped by the
    reader: one warning names them with their count. Greyscale, CMYK and PNG images decode to RGB.
    A content check of a large folder shows progress (``src.utils.progress``).

    Args:
        data_path (str): Root folder with one sub-folder of images per class.
        check_content (bool): Also check every image file's bytes (see the module docstring).

    Returns:
        list[str]: class names (sorted sub-folder names).

    Raises:
        MissingFileError: If ``data_path`` is missing or holds no class folders.
        ImageFolderError: For a class folder without images, macOS metadata files ("._*"),
            or corrupt or truncated images; the message names the files.
    """
    if not os.path.isdir(data_path):
        raise MissingFileError(f"data_path {data_path!r} is not a folder")
    key = os.path.realpath(data_path)
    if key in _CHECKED and (_CHECKED[key][1] or not check_content):
        return list(_CHECKED[key][0])
    classes = scan_folder(data_path)[0]
    if not classes:
        raise MissingFileError(f"data_path {data_path!r} holds no class folders: expected one "
                               f"sub-folder of images per class")
    skipped, metadata, empty, real = [], [], [], []
    for cls in classes:
        folder = os.path.join(data_path, cls)
        files = scan_folder(folder)[1]
        skipped += [os.path.join(folder, n) for n in files if not is_image_name(n)]
        images = [n for n in files if is_image_name(n)]
        metadata += [os.path.join(folder, n) for n in images if n.startswith(METADATA_PREFIX)]
        kept = [os.path.join(folder, n) for n in images if not n.startswith(METADATA_PREFIX)]
        if not kept:
            empty.append(folder)
        real += kept
    if empty:
        raise ImageFolderError(_listing(f"class folders without images "
                                        f"({', '.join(IMAGE_EXTENSIONS)}): every class needs at "
                                        f"least one", empty))
    if metadata:
        raise ImageFolderError(_listing(f"macOS metadata files would be read as images; remove "
                                        f"them (find {data_path} -name '._*' -delete)", metadata))
    large, broken = broken_images(real) if check_content else ([], [])
    if large:
        raise ImageFolderError(_listing(f"images with more pixels than max_image_pixels "
                                        f"{Image.MAX_IMAGE_PIXELS} (Pillow's decompression-bomb "
                                        f"limit by default): raise the key to read them",
                                        large))
    if broken:
        raise ImageFolderError(_listing("corrupt or truncated image files (they crash the "
                                        "decoder); remove or replace them", broken))
    if skipped:
        LOGGER.warning(_listing(f"skipping {len(skipped)} files that are not images "
                                f"({', '.join(IMAGE_EXTENSIONS[:4])})", skipped))
    _CHECKED[key] = (tuple(classes), check_content)
    return classes


_FAILED_FILE = re.compile(r"The corresponding data file is: (.+?)\.(?:\s|$)")


@contextlib.contextmanager
def readable_pipeline_errors():
    """Turn a dataset-pipeline failure that names a data file into one clear line.

    Raises:
        ImageFolderError: Naming the file, when MindSpore's error names one; other errors
            propagate unchanged.
    """
    try:
        yield
    except RuntimeError as err:
        match = _FAILED_FILE.search(str(err))
        if match is None:
            raise
        if MAX_PIXELS_WORDS in str(err):
            raise ImageFolderError(f"image {match.group(1)} has more pixels than "
                                   f"max_image_pixels {Image.MAX_IMAGE_PIXELS}: raise the key to "
                                   f"read it") from err
        raise ImageFolderError(f"cannot decode image {match.group(1)} (corrupt, truncated or "
                               f"not an image): remove or replace it") from err
