"""The image check of class folders (src/data/image_check.py): truncated PNG and BMP files are named
like truncated JPEGs; its errors are user errors."""
import os

import pytest
from PIL import Image

from src.data.image_check import ImageFolderError, check_image_folder
from src.utils.errors import MissingFileError, UserError
from tests.helpers import ROOT, copy_class_folders

SAMPLE = os.path.join(ROOT, "data", "cifar10_sample", "train")


@pytest.fixture()
def folder(tmp_path):
    """Two real classes, 3 JPEGs each."""
    return copy_class_folders(SAMPLE, str(tmp_path / "data"), 3, classes=["cat", "dog"])


def save_as(source, path):
    """Save a real JPEG under another format (by the suffix of ``path``); return ``path``."""
    with Image.open(source) as image:
        image.save(path)
    return path


def truncate(path, keep=0.5):
    """Cut a file to ``keep`` of its bytes, as an interrupted copy leaves it."""
    with open(path, "rb") as f:
        data = f.read()
    with open(path, "wb") as f:
        f.write(data[:int(len(data) * keep)])


def test_truncated_png_and_bmp_are_named_and_intact_ones_pass(folder):
    cat, dog = os.path.join(folder, "cat"), os.path.join(folder, "dog")
    source = os.path.join(cat, "0000.jpg")
    save_as(source, os.path.join(cat, "intact.png"))
    save_as(source, os.path.join(dog, "intact.bmp"))
    broken = [save_as(source, os.path.join(cat, "cut.png")),
              save_as(source, os.path.join(dog, "cut.bmp"))]
    for path in broken:
        truncate(path)
    with pytest.raises(ImageFolderError, match="corrupt or truncated image files") as info:
        check_image_folder(folder)
    message = str(info.value)
    assert "cut.png" in message and "cut.bmp" in message
    assert "intact.png" not in message and "intact.bmp" not in message

    for path in broken:
        os.remove(path)
    assert check_image_folder(folder) == ["cat", "dog"]


def test_a_png_cut_after_its_pixel_data_is_named(folder):
    """A PNG that lost only its last chunk (IEND) still decodes: verify() catches it."""
    path = save_as(os.path.join(folder, "cat", "0000.jpg"), os.path.join(folder, "cat", "a.png"))
    with open(path, "rb") as f:
        data = f.read()
    with open(path, "wb") as f:
        f.write(data[:-12])  # IEND: 4 bytes length, 4 type, 4 CRC
    with pytest.raises(ImageFolderError, match="a.png"):
        check_image_folder(folder)


def test_errors_are_user_errors(folder, tmp_path):
    with pytest.raises(MissingFileError, match="is not a folder"):
        check_image_folder(str(tmp_path / "missing"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(MissingFileError, match="holds no class folders"):
        check_image_folder(str(tmp_path / "empty"))
    assert issubclass(MissingFileError, FileNotFoundError)
    truncate(os.path.join(folder, "dog", os.listdir(os.path.join(folder, "dog"))[0]), 0.3)
    with pytest.raises(UserError):
        check_image_folder(folder)
    assert issubclass(ImageFolderError, ValueError)  # callers that catch ValueError still do


@pytest.mark.parametrize("link, target", [("cat/self.jpg", "self.jpg"), ("loop", "loop")])
def test_links_that_cannot_be_followed_are_named(folder, link, target):
    from src.deploy.inference import list_images
    os.symlink(target, os.path.join(folder, link))  # a link to itself: ELOOP when followed
    for check in (check_image_folder, list_images):
        with pytest.raises(ImageFolderError, match=f"links that cannot be followed .*"
                                                   f"{os.path.basename(link)} \\(Too many "
                                                   f"levels of symbolic links\\)"):
            check(folder)
