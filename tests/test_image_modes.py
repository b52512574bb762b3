"""Image modes beyond 8-bit RGB (16-bit greyscale, palette, LA, RGBA, CMYK) and the pixel
limit: training (OpenCV, fused with the crop), eval and predict (Pillow) see the same pixels
of one picture, and an image above ``max_image_pixels`` is one error naming it everywhere."""
import io
import os

import mindspore.dataset.vision as vision
import numpy as np
import pytest
from PIL import Image

from src.data.image_check import ImageFolderError, check_image_folder, set_max_image_pixels
from src.data.settings import EvalPreprocess
from src.data.transforms import create_transforms, decode_rgb
from src.deploy.inference import preprocess_images
from tests.helpers import ROOT

SIDE = 48


def picture():
    folder = os.path.join(ROOT, "data", "cifar10_sample", "train", "cat")
    path = os.path.join(folder, sorted(os.listdir(folder))[0])
    return Image.open(path).convert("RGB").resize((SIDE, SIDE))


def encoded(image, fmt="PNG"):
    buffer = io.BytesIO()
    image.save(buffer, format=fmt)
    return buffer.getvalue()


def variants():
    """{name: (encoded file, the 8-bit RGB pixels it holds)} of one picture."""
    rgb = picture()
    grey = rgb.convert("L")
    grey16 = Image.fromarray(np.asarray(grey).astype(np.uint16) * 257)  # 16-bit, same picture
    rgba = np.dstack([np.asarray(rgb), np.full((SIDE, SIDE), 77, np.uint8)])
    palette = rgb.convert("P", palette=Image.ADAPTIVE)
    return {"grey16": (encoded(grey16), np.asarray(grey.convert("RGB"))),
            "palette": (encoded(palette), np.asarray(palette.convert("RGB"))),
            "grey_alpha": (encoded(grey.convert("LA")), np.asarray(grey.convert("RGB"))),
            "rgba": (encoded(Image.fromarray(rgba)), np.asarray(rgb)),
            "cmyk_jpeg": (encoded(rgb.convert("CMYK"), "JPEG"), None)}


@pytest.mark.parametrize("name", ["grey16", "palette", "grey_alpha", "rgba", "cmyk_jpeg"])
def test_train_eval_and_predict_decode_the_same_pixels(name, tmp_path):
    data, expected = variants()[name]
    raw = np.frombuffer(data, np.uint8)
    # training: the fused decode-and-crop, here cropping the whole image at its own size
    train = vision.RandomCropDecodeResize(SIDE, scale=(1.0, 1.0), ratio=(1.0, 1.0))(raw)
    evaluation = np.asarray(decode_rgb(raw))
    np.testing.assert_array_equal(train, evaluation)
    if expected is not None:
        np.testing.assert_array_equal(evaluation, expected)
    # predict: files through the eval transforms, the same as the pipeline's
    path = tmp_path / f"{name}.img"
    path.write_bytes(data)
    ops = create_transforms(EvalPreprocess(image_size=SIDE, resize=SIDE))
    pipeline = raw
    for op in ops:
        pipeline = op(pipeline)
    np.testing.assert_array_equal(preprocess_images(
        [str(path)], EvalPreprocess(image_size=SIDE, resize=SIDE))[0], pipeline)


def test_sixteen_bit_greyscale_is_not_read_as_white():
    data, expected = variants()["grey16"]
    pillow_own = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
    assert pillow_own.min() == 255  # what eval and predict used to see: every pixel clipped
    assert np.asarray(decode_rgb(np.frombuffer(data, np.uint8))).mean() == expected.mean()


@pytest.fixture
def pixel_limit():
    previous = Image.MAX_IMAGE_PIXELS
    yield set_max_image_pixels
    Image.MAX_IMAGE_PIXELS = previous


def test_an_image_above_max_image_pixels_is_named_by_the_check_and_predict(tmp_path,
                                                                          pixel_limit, recwarn):
    for cls in ("a", "b"):
        (tmp_path / cls).mkdir()
        picture().save(tmp_path / cls / "small.png")
    Image.new("RGB", (80, 60)).save(tmp_path / "b" / "large.png")  # 4800 pixels
    pixel_limit(3000)
    with pytest.raises(ImageFolderError, match="more pixels than max_image_pixels 3000.*"
                                               "large.png \\(80 x 60\\)"):
        check_image_folder(str(tmp_path))
    with pytest.raises(ImageFolderError, match="large.png: 80 x 60 pixels: more pixels than "
                                               "max_image_pixels 3000"):
        preprocess_images(
            [str(tmp_path / "b" / "large.png")], EvalPreprocess(image_size=32, resize=32))
    pixel_limit(5000)
    assert check_image_folder(str(tmp_path)) == ["a", "b"]
    # the error says it: no Pillow warning printed beside it (recwarn records every warning)
    assert not [w for w in recwarn if issubclass(w.category, Image.DecompressionBombWarning)]


def test_an_image_far_above_the_limit_is_named_not_a_traceback(tmp_path, pixel_limit):
    # Pillow itself refuses above twice the limit (DecompressionBombError, not an OSError)
    pixel_limit(1000)
    Image.new("RGB", (80, 60)).save(tmp_path / "huge.png")
    with pytest.raises(ImageFolderError, match="huge.png: more pixels than max_image_pixels"):
        preprocess_images([str(tmp_path / "huge.png")], EvalPreprocess(image_size=32, resize=32))


def test_the_eval_pipeline_reads_sixteen_bit_greyscale_as_its_eight_bit_twin(tmp_path):
    from src.data.pipeline import create_dataset
    data, _ = variants()["grey16"]
    for cls, payload in (("a_grey8", encoded(picture().convert("L"))), ("b_grey16", data)):
        (tmp_path / cls).mkdir()
        (tmp_path / cls / "image.png").write_bytes(payload)
    dataset = create_dataset(str(tmp_path), EvalPreprocess(image_size=SIDE, resize=SIDE),
                             batch_size=2, num_parallel_workers=1)
    images, labels = next(dataset.create_tuple_iterator(num_epochs=1, output_numpy=True))
    assert labels.tolist() == [0, 1]
    np.testing.assert_array_equal(images[0], images[1])
