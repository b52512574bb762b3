"""The image check of class folders (src/data/image_check.py): truncated PNG and BMP files are named
like truncated JPEGs; its errors are user errors."""
import os

import pytest
from PIL import Image

from src.data import image_check
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


def with_thumbnail(source, path, thumbnail_side=48):
    """A copy of the JPEG ``source`` with an APP1 (Exif) segment holding a complete JPEG
    thumbnail, as cameras write it (before the frame and the scan); returns its bytes."""
    import io
    with Image.open(source) as image:
        thumb = io.BytesIO()
        image.resize((thumbnail_side, thumbnail_side)).save(thumb, "JPEG")
    payload = b"Exif\x00\x00MM\x00\x2a\x00\x00\x00\x08\x00\x00" + thumb.getvalue()
    with open(source, "rb") as f:
        data = f.read()
    data = data[:2] + b"\xff\xe1" + (len(payload) + 2).to_bytes(2, "big") + payload + data[2:]
    with open(path, "wb") as f:
        f.write(data)
    return data


def mindspore_decodes(path):
    import mindspore.dataset.vision as vision
    import numpy as np
    try:
        vision.Decode()(np.fromfile(path, np.uint8))
        return True
    except RuntimeError:
        return False


def test_images_the_decoder_rejects_are_named_even_when_their_tail_looks_complete(
        folder, tmp_path, monkeypatch):
    """Files the old check passed and MindSpore's decoder stops on (issue: training died in
    epoch 1): a JPEG cut inside its first scan whose last 4 KB still hold its thumbnail's end
    marker, a frame of height 0, a WebP and a GIF named .jpg. A complete JPEG with a
    thumbnail, a TIFF and a PPM (which the decoder reads) pass."""
    cat, dog = os.path.join(folder, "cat"), os.path.join(folder, "dog")
    source = os.path.join(cat, "0000.jpg")
    whole = with_thumbnail(source, os.path.join(cat, "thumbnail.jpg"))
    cut = os.path.join(cat, "cut_in_scan.jpg")
    scan = whole.index(b"\xff\xda", whole.index(b"\xff\xd9"))  # the image's, after the thumbnail
    with open(cut, "wb") as f:
        f.write(whole[:scan + 40])
    with open(cut, "rb") as f:
        assert b"\xff\xd9" in f.read()[-4096:]  # the thumbnail's end marker, before the scan
    with open(source, "rb") as f:
        data = bytearray(f.read())
    frame = data.index(b"\xff\xc0")
    data[frame + 5:frame + 7] = b"\x00\x00"  # height 0
    zero = os.path.join(dog, "zero_height.jpg")
    with open(zero, "wb") as f:
        f.write(bytes(data))
    webp, gif = os.path.join(dog, "webp.jpg"), os.path.join(dog, "gif.jpg")
    with Image.open(source) as image:
        image.save(webp, "WEBP")
        image.save(gif, "GIF")
    tiff = os.path.join(dog, "tiff.jpg")
    ppm = os.path.join(dog, "ppm.png")
    with Image.open(source) as image:
        image.save(tiff, "TIFF")
        image.save(ppm, "PPM")
    broken = [cut, zero, webp, gif]
    monkeypatch.chdir(tmp_path)  # MindSpore's decoder writes what it rejects to ./abnormal_image.*
    assert not any(mindspore_decodes(p) for p in broken)  # what the pipeline would hit
    assert all(mindspore_decodes(p) for p in (tiff, ppm, os.path.join(cat, "thumbnail.jpg")))
    with pytest.raises(ImageFolderError) as err:
        check_image_folder(folder)
    message = str(err.value)
    assert message.startswith("corrupt or truncated image files")
    for path in broken:
        assert path in message
    for path in (tiff, ppm, os.path.join(cat, "thumbnail.jpg")):
        assert path not in message


def jpeg_variant(folder, name, size=None, patch=None):
    """A copy of the sample JPEG cat/0000.jpg as cat/NAME: its first ``size`` bytes, or with
    ``patch`` (offset from its frame marker -> byte) applied; returns (path, frame offset)."""
    with open(os.path.join(SAMPLE, "cat", "0000.jpg"), "rb") as f:
        data = bytearray(f.read())
    frame = data.index(b"\xff\xc0")
    for offset, byte in (patch or {}).items():
        data[frame + offset] = byte
    path = os.path.join(folder, "cat", name)
    with open(path, "wb") as f:
        f.write(bytes(data[:size]))
    return path, frame


@pytest.mark.parametrize("cut", ["frame", "tables", "scan_header"])
def test_a_jpeg_cut_before_its_scan_is_named_with_the_check_off(folder, cut):
    """MindSpore's decoder stops the process with SIGFPE on a JPEG cut in its frame or tables
    (the 443-byte cut of this file is one); ``check_images false`` still reads the headers."""
    with open(os.path.join(SAMPLE, "cat", "0000.jpg"), "rb") as f:
        data = f.read()
    ends = {"frame": data.index(b"\xff\xc0") + 6, "tables": data.rindex(b"\xff\xc4") + 17,
            "scan_header": data.index(b"\xff\xda") + 6}
    path, _ = jpeg_variant(folder, "cut.jpg", size=ends[cut])
    with pytest.raises(ImageFolderError, match="cannot decode JPEG files whose headers are cut "
                                               "short .* the last good one is the run's newest, "
                                               "if any: remove or replace them: " + path):
        check_image_folder(folder, check_content=False)


def test_the_check_off_reads_only_jpeg_headers(folder):
    """A JPEG cut inside its scan data and a cut PNG pass (the decoder names them itself, with
    the last good checkpoint); the full check names both."""
    with open(os.path.join(SAMPLE, "cat", "0000.jpg"), "rb") as f:
        data = f.read()
    jpeg_variant(folder, "cut_in_scan.jpg", size=data.index(b"\xff\xda") + 40)
    png = save_as(os.path.join(folder, "cat", "0000.jpg"), os.path.join(folder, "dog", "cut.png"))
    truncate(png)
    assert check_image_folder(folder, check_content=False) == ["cat", "dog"]
    with pytest.raises(ImageFolderError, match="corrupt or truncated image files.*cut"):
        check_image_folder(folder)


@pytest.mark.parametrize("check_content", [True, False])
@pytest.mark.parametrize("patch", [{1: 0xC3}, {1: 0xC9}, {9: 2}],
                         ids=["lossless_sof3", "arithmetic_sof9", "two_components"])
def test_uncommon_frames_and_component_counts_go_to_the_decode_check(folder, monkeypatch,
                                                                    check_content, patch):
    """Headers that parse but of a frame kind not every libjpeg reads, or a component count
    other than 1, 3, 4: only a decode tells; the intact files are not decoded."""
    path, _ = jpeg_variant(folder, "odd.jpg", patch=patch)
    decoded = []
    monkeypatch.setattr(image_check, "decodes", lambda p: decoded.append(p) or False)
    with pytest.raises(ImageFolderError, match="odd.jpg"):
        check_image_folder(folder, check_content=check_content)
    assert decoded == [path]
