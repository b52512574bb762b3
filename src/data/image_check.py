"""Checking a class-folder dataset before MindSpore reads it (MindSpore stops on a corrupt file
with a C++ error or SIGFPE): a JPEG by its headers and end marker, decoded only when they fail,
any other file decoded with Pillow. See docs/data.md#image-checks.
"""
import contextlib
import logging
import os
import re
import warnings
from collections.abc import Callable, Iterator
from typing import NamedTuple

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


def set_max_image_pixels(limit: int) -> None:
    """Set ``max_image_pixels`` (width x height) as Pillow's ``Image.MAX_IMAGE_PIXELS``, the one
    limit of the image check, eval and predict, and silence ``DecompressionBombWarning`` (the
    checks' error says it); at start-up, before any image is opened."""
    Image.MAX_IMAGE_PIXELS = int(limit)
    warnings.filterwarnings("ignore", category=Image.DecompressionBombWarning)


@contextlib.contextmanager
def pillow_notes_silenced() -> Iterator[None]:
    """Keep Pillow's ``UserWarning`` notes on odd metadata (an EXIF block cut short, a tag
    pointing past the file's end) out of the output: Pillow skips what it cannot read and the
    pixels decode as before (docs/data.md#exif-orientation-exif_transpose). A decorator too."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=UserWarning, module=r"PIL\.")
        yield


def too_many_pixels(image: Image.Image) -> str | None:
    """``"W x H"`` of an opened (lazy) Pillow image above the limit, else None."""
    width, height = image.size
    limit = Image.MAX_IMAGE_PIXELS
    return f"{width} x {height}" if limit and width * height > limit else None


@pillow_notes_silenced()
def oversized(path: str) -> str | None:
    """``"W x H"`` if the image has more pixels than the limit, else None (also for files
    Pillow cannot open); reads the header only."""
    try:
        with Image.open(path) as image:
            return too_many_pixels(image)
    except Image.DecompressionBombError:  # above twice the limit: refused by Pillow itself
        return "more than twice the limit"
    except (OSError, SyntaxError, ValueError):
        return None


def scan_entries(folder: str) -> dict[str, str]:
    """Name -> kind of every entry of ``folder``, links followed: ``folder``, ``file``, ``a link
    to a missing file`` or ``not a regular file``.

    Raises:
        ImageFolderError: If ``folder`` cannot be read, or names links that cannot be followed.
    """
    kinds, unreadable = {}, []
    try:
        entries = list(os.scandir(folder))
    except OSError as err:
        raise ImageFolderError(f"cannot read folder {folder}: {err.strerror or err}") from err
    for entry in entries:
        try:
            kinds[entry.name] = ("folder" if entry.is_dir() else "file" if entry.is_file() else
                                 "a link to a missing file" if entry.is_symlink() else
                                 "not a regular file")
        except OSError as err:
            unreadable.append(f"{entry.path} ({err.strerror})")
    if unreadable:
        raise ImageFolderError(listing_text("links that cannot be followed (a link to itself or "
                                        "a loop of links): remove them", sorted(unreadable)))
    return kinds


def scan_folder(folder: str) -> tuple[list[str], list[str]]:
    """The sorted names of the sub-folders and of the other entries of ``folder``
    (``scan_entries``; raises as it)."""
    kinds = scan_entries(folder)
    return (sorted(n for n, kind in kinds.items() if kind == "folder"),
            sorted(n for n, kind in kinds.items() if kind != "folder"))


class Listing(NamedTuple):
    """A folder's entries by kind (``list_folder``), each a sorted list of names."""

    images: list[str]
    not_files: list[str]  # "PATH (a folder)": image names that are no image file
    skipped: list[str]
    folders: list[str]


def list_folder(folder: str, is_image: Callable[[str], bool] | None = None) -> Listing:
    """A folder of images as ImageFolderDataset lists it (entries directly in it, by name:
    ``is_image``, default ``is_image_name``), each part sorted.

    Returns:
        Listing: image files, image names that are no file, other files, other sub-folders.

    Raises:
        ImageFolderError: As ``scan_entries``.
    """
    is_image = is_image or is_image_name
    listing = Listing([], [], [], [])
    for name, kind in sorted(scan_entries(folder).items()):
        if is_image(name):
            if kind == "file":
                listing.images.append(name)
            else:
                what = "a folder" if kind == "folder" else kind
                listing.not_files.append(f"{os.path.join(folder, name)} ({what})")
        else:
            (listing.folders if kind == "folder" else listing.skipped).append(name)
    return listing


def nested_note(folders: list[str], is_image: Callable[[str], bool] | None = None) -> str:
    """``"N sub-folders holding M images"`` (by name, in every folder below them)."""
    is_image = is_image or is_image_name
    images = 0
    for top in folders:
        for _, _, names in os.walk(top):
            images += sum(1 for n in names if is_image(n))
    return (f"{len(folders)} sub-folder{'s' if len(folders) != 1 else ''} holding {images} "
            f"image{'s' if images != 1 else ''}")


def is_image_name(name: str) -> bool:
    """Whether the reader takes this file: an ``IMAGE_EXTENSIONS`` extension (case-sensitive)."""
    return os.path.splitext(name)[1] in IMAGE_EXTENSIONS


# Frame types every libjpeg decodes (baseline, extended sequential, progressive Huffman); a
# JPEG of another kind (lossless, hierarchical, arithmetic-coded) is decoded to be sure.
COMMON_FRAMES = (0xC0, 0xC1, 0xC2)
_FRAME_MARKERS = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}
_NO_LENGTH = {0x01} | set(range(0xD0, 0xD8))  # TEM and RSTn stand alone


def jpeg_headers(path: str) -> tuple[int, int, int, int, int] | None:
    """``(frame marker, height, width, components, offset after the scan header)`` from a JPEG's
    marker segments (ITU-T T.81 B.2), or None if they do not parse to a frame before the scan.

    Raises:
        OSError: If the file cannot be read (permission).
    """
    with open(path, "rb") as f:
        return _parse_headers(f, os.path.getsize(path))


def _parse_headers(f, size):
    """``jpeg_headers`` of the open file ``f`` of ``size`` bytes, read from its start."""
    frame = None
    if f.read(2) != JPEG_SIGNATURE[:2]:
        return None
    while True:
        byte = f.read(1)
        if byte != b"\xff":
            return None
        marker = f.read(1)
        while marker == b"\xff":  # fill bytes before a marker
            marker = f.read(1)
        if not marker:
            return None
        code = marker[0]
        if code in _NO_LENGTH:
            continue
        length = int.from_bytes(f.read(2), "big")
        start = f.tell()
        if length < 2 or start + length - 2 > size:
            return None
        if code in _FRAME_MARKERS and length >= 8:
            header = f.read(6)
            frame = (code, int.from_bytes(header[1:3], "big"),
                     int.from_bytes(header[3:5], "big"), header[5])
        if code == 0xDA:  # start of scan: the entropy-coded data follows
            return None if frame is None else (*frame, start + length - 2)
        f.seek(start + length - 2)


def _common_frame(headers):
    """Whether ``jpeg_headers`` found a ``COMMON_FRAMES`` frame, >= 1 x 1, of 1, 3 or 4
    components."""
    if headers is None:
        return False
    code, height, width, components, _ = headers
    return code in COMMON_FRAMES and height > 0 and width > 0 and components in (1, 3, 4)


def jpeg_looks_complete(path: str) -> bool:
    """Whether a JPEG has a common frame (``COMMON_FRAMES``, >= 1 x 1, 1/3/4 components) and an
    end-of-image marker after its first scan header in its last ``TAIL_BYTES`` bytes.

    Raises:
        OSError: If the file cannot be read (permission).
    """
    headers = jpeg_headers(path)
    if not _common_frame(headers):
        return False
    start = max(headers[4], os.path.getsize(path) - TAIL_BYTES)
    with open(path, "rb") as f:
        f.seek(start)
        return JPEG_END in f.read()


def decoder_safe(path: str) -> bool:
    """The check ``check_images false`` keeps: whether a file that starts as a JPEG has headers
    of a common frame (``jpeg_headers``) or else ``decodes``. MindSpore's decoder stops the
    process with SIGFPE on a JPEG cut before its scan; other files pass (it names those it
    cannot read). See docs/data.md#image-checks.

    Raises:
        OSError: If the file cannot be read (permission).
    """
    with open(path, "rb") as f:
        if f.read(2) != JPEG_SIGNATURE[:2]:
            return True
        f.seek(0)
        if _common_frame(_parse_headers(f, os.path.getsize(path))):
            return True
    return decodes(path)


# Pillow's names of the formats MindSpore's decoder (``mindspore.dataset.vision.Decode``, the
# training pipeline's) reads; WebP, GIF and ICO open in Pillow but not there (measured with
# MindSpore 2.10). MPO: a camera's JPEG with extra pictures, decoded as its first.
DECODER_FORMATS = ("JPEG", "MPO", "PNG", "BMP", "TIFF", "PPM")


@pillow_notes_silenced()
def decodes(path: str) -> bool:
    """Whether the file is in ``DECODER_FORMATS`` and Pillow verifies and fully decodes it."""
    try:
        with Image.open(path) as image:
            if image.format not in DECODER_FORMATS:
                return False
            image.verify()
        with Image.open(path) as image:  # verify() leaves the image unusable: reopen
            image.load()
        return True
    except (OSError, SyntaxError, ValueError):
        return False


def is_intact(path: str) -> bool:
    """Whether the decoder can read the file whole: ``jpeg_looks_complete`` or ``decodes``."""
    return jpeg_looks_complete(path) or decodes(path)


def listing_text(text: str, paths: list[str]) -> str:
    """``"TEXT: PATH, PATH ..."``: the first ``SHOWN`` of ``paths`` and, if more, their count."""
    shown = ", ".join(paths[:SHOWN])
    more = f" ... ({len(paths)} in all)" if len(paths) > SHOWN else ""
    return f"{text}: {shown}{more}"


def broken_images(paths: list[str], full: bool = True) -> tuple[list[str], list[str], list[str]]:
    """Of ``paths``: the unreadable (``"path (reason)"``), the oversized (``"path (W x H)"``;
    only if ``full``) and those failing ``is_intact`` (``decoder_safe`` unless ``full``);
    progress shown above ``PROGRESS_MIN_FILES`` files."""
    unreadable, large, broken = [], [], []
    intact = is_intact if full else decoder_safe
    with Progress(len(paths), "image check", quiet=len(paths) <= PROGRESS_MIN_FILES) as progress:
        for path in paths:
            try:
                size = oversized(path) if full else None
                if size:
                    large.append(f"{path} ({size})")
                elif not intact(path):
                    broken.append(path)
            except OSError as err:
                unreadable.append(f"{path} ({err.strerror or err})")
            progress.update(1)
    return unreadable, large, broken


def check_image_folder(data_path: str, check_content: bool = True) -> list[str]:
    """Check a class-folder root once per process; return its class names (sorted folders).

    Non-image files and sub-folders of class folders are skipped with one warning each; every
    JPEG's headers are checked (``decoder_safe``), and with ``check_content`` every image's
    bytes (``broken_images``).

    Raises:
        MissingFileError: If ``data_path`` is missing or holds no class folders.
        ImageFolderError: For a class folder without images, ``._*`` files, image names that
            are no file, unreadable, oversized, corrupt or truncated images (names them).
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
    skipped, nested, not_files, metadata, empty, real = [], [], [], [], [], []
    for cls in classes:
        folder = os.path.join(data_path, cls)
        listing = list_folder(folder)
        skipped += [os.path.join(folder, n) for n in listing.skipped]
        nested += [os.path.join(folder, n) for n in listing.folders]
        not_files += listing.not_files
        images = listing.images
        metadata += [os.path.join(folder, n) for n in images if n.startswith(METADATA_PREFIX)]
        kept = [os.path.join(folder, n) for n in images if not n.startswith(METADATA_PREFIX)]
        if not kept:
            empty.append(folder)
        real += kept
    if not_files:
        raise ImageFolderError(listing_text("entries with an image name that are not image files "
                                        "(the reader would fail on them): remove or rename "
                                        "them", not_files))
    if empty:
        raise ImageFolderError(listing_text(f"class folders without images "
                                        f"({', '.join(IMAGE_EXTENSIONS)}): every class needs at "
                                        f"least one", empty))
    if metadata:
        raise ImageFolderError(listing_text(f"macOS metadata files would be read as images; remove "
                                        f"them (find {data_path} -name '._*' -delete)", metadata))
    unreadable, large, broken = broken_images(real, full=check_content)
    if unreadable:
        raise ImageFolderError(listing_text("image files that cannot be read (give the run's user "
                                        "read access, or remove them)", unreadable))
    if large:
        raise ImageFolderError(listing_text(f"images with more pixels than max_image_pixels "
                                        f"{Image.MAX_IMAGE_PIXELS} (Pillow's decompression-bomb "
                                        f"limit by default): raise the key to read them",
                                        large))
    if broken and not check_content:
        raise ImageFolderError(listing_text("cannot decode JPEG files whose headers are cut short "
                                            "or corrupt (check_images false checks only JPEG "
                                            "headers); found before training, so no checkpoint "
                                            "was written and the last good one is the run's "
                                            "newest, if any: remove or replace them", broken))
    if broken:
        raise ImageFolderError(listing_text(f"corrupt or truncated image files, or of a format "
                                            f"the decoder does not read (it reads "
                                            f"{', '.join(DECODER_FORMATS)}); remove or replace "
                                            f"them", broken))
    if skipped:
        LOGGER.warning(listing_text(f"skipping {len(skipped)} files that are not images "
                                f"({', '.join(IMAGE_EXTENSIONS[:4])})", skipped))
    if nested:
        LOGGER.warning(listing_text(f"skipping {nested_note(nested)} inside class folders (only "
                                f"the images directly in a class folder are read: move them "
                                f"up to use them)", nested))
    _CHECKED[key] = (tuple(classes), check_content)
    return classes


_FAILED_FILE = re.compile(r"The corresponding data file is: (.+?)\.(?:\s|$)")


@contextlib.contextmanager
def readable_pipeline_errors() -> Iterator[None]:
    """Turn a pipeline ``RuntimeError`` that names a data file into an ImageFolderError naming
    it; other errors propagate unchanged."""
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
