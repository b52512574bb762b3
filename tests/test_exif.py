"""EXIF orientation (``exif_transpose``): with it on, training's decode, the eval pipeline,
predict's reader and the int8 calibration reader all see a photo stored sideways upright
(Pillow's ``ImageOps.exif_transpose`` of the file); with it off all of them see the stored
pixels, as before. Real photos (the shipped ImageNet JPEGs) saved with an Orientation tag.

Tolerance: ``LEVELS`` of 255 per pixel between a pipeline's output (un-normalized) and Pillow's
decode of the file. Pillow and MindSpore's decoder are both libjpeg-turbo and agree exactly on
these files, but another build's IDCT or chroma upsampling may round a level or two apart; a
wrong orientation is tens of levels away on average (``test_the_photos_differ_when_turned``).
"""
import io

import mindspore.dataset as ds
import mindspore.dataset.vision as vision
import numpy as np
import pytest
from PIL import Image, ImageOps

import eval as eval_entry
import export as export_entry
import predict as predict_entry
from src import recipe
from src.data import pipeline
from src.data.pipeline import create_dataset
from src.data.settings import EvalPreprocess, Sampling, TrainAugment
from src.data.transforms import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    DecodeRGB,
    create_transforms,
    decode_rgb,
)
from src.deploy import formats, inference, quantize
from src.deploy.inference import preprocess_images
from src.deploy.quantize import ImageCalibrationReader
from src.training.resume import check_same_recipe
from src.utils import device
from src.utils.config import ConfigError, parse_config
from tests.helpers import IMAGENET_SMALL, imagenet_images

SIDE = 64
ORIENTATIONS = (3, 6, 8)  # 180 degrees, 90 clockwise, 90 counter-clockwise
EXIF_ORIENTATION = 0x0112
LEVELS = 2.0


def save_with_orientation(image, path, orientation):
    exif = Image.Exif()
    exif[EXIF_ORIENTATION] = orientation
    image.save(path, "JPEG", quality=90, exif=exif)
    return str(path)


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    """A class folder of three real photos, square (so the fused crop of the whole image is
    the image itself), each stored with one of ``ORIENTATIONS``: the root and the paths in
    reader order."""
    root = tmp_path_factory.mktemp("exif")
    folder = root / "photos"
    folder.mkdir()
    paths = []
    for source, orientation in zip(imagenet_images(), ORIENTATIONS):
        image = Image.open(source).convert("RGB")
        side = min(image.size)
        square = image.crop((0, 0, side, side)).resize((SIDE, SIDE), Image.BILINEAR)
        paths.append(save_with_orientation(square, folder / f"o{orientation}.jpg", orientation))
    return str(root), paths


@pytest.fixture(autouse=True)
def keep_dataset_seed():
    seed = ds.config.get_seed()
    yield
    ds.config.set_seed(seed)


def upright(path):
    return np.asarray(ImageOps.exif_transpose(Image.open(path)).convert("RGB"), np.float64)


def stored(path):
    return np.asarray(Image.open(path).convert("RGB"), np.float64)


def expected(path, exif_transpose):
    return upright(path) if exif_transpose else stored(path)


def pixels(chw):
    """A normalized float32 (3, H, W) image back in 0-255 HWC."""
    return chw.transpose(1, 2, 0) * np.array(IMAGENET_STD) + np.array(IMAGENET_MEAN)


def max_difference(image, reference):
    return float(np.abs(image - reference).max())


def pipeline_images(root, is_training, exif_transpose):
    """Every image of ``root`` through ``create_dataset``, in reader order: training with a
    crop of the whole image (area 1, the square's own aspect ratio) at its own size."""
    ds.config.set_seed(7)
    settings = (TrainAugment(image_size=SIDE, crop_scale=(1.0, 1.0),
                             exif_transpose=exif_transpose) if is_training
                else EvalPreprocess(image_size=SIDE, resize=SIDE, exif_transpose=exif_transpose))
    dataset = create_dataset(root, settings, batch_size=1, sampling=Sampling(shuffle=False),
                             num_parallel_workers=1)
    return [pixels(batch[0][0]) for batch in dataset.create_tuple_iterator(output_numpy=True)]


def test_the_photos_differ_when_turned(photos):
    for path in photos[1]:
        assert upright(path).shape == stored(path).shape == (SIDE, SIDE, 3)
        assert np.abs(upright(path) - stored(path)).mean() > 20
        assert np.abs(upright(path) - stored(path)[:, ::-1]).mean() > 20


@pytest.mark.parametrize("exif_transpose", [True, False])
@pytest.mark.parametrize("is_training", [True, False], ids=["training", "eval"])
def test_pipeline_decode(photos, is_training, exif_transpose):
    """The training pipeline (the Pillow decode when on, the fused crop-decode when off) and
    the eval pipeline give the photo as ``expected``: turned upright only with the option."""
    root, paths = photos
    images = pipeline_images(root, is_training, exif_transpose)
    assert len(images) == len(paths)
    for path, image in zip(paths, images):
        reference = expected(path, exif_transpose)
        # training's random flip may have mirrored it
        candidates = (reference, reference[:, ::-1]) if is_training else (reference,)
        assert min(max_difference(image, c) for c in candidates) <= LEVELS, path


@pytest.mark.parametrize("exif_transpose", [True, False])
def test_predict_reader(photos, exif_transpose):
    paths = photos[1]
    images = preprocess_images(paths, EvalPreprocess(image_size=SIDE, resize=SIDE,
                                                     exif_transpose=exif_transpose))
    for path, image in zip(paths, images):
        assert max_difference(pixels(image), expected(path, exif_transpose)) <= LEVELS, path


@pytest.mark.parametrize("exif_transpose", [True, False])
def test_calibration_reader(photos, exif_transpose):
    paths = photos[1]
    reader = ImageCalibrationReader(paths, "image", len(paths), EvalPreprocess(
        image_size=SIDE, resize=SIDE, exif_transpose=exif_transpose))
    images = reader.get_next()["image"]
    assert reader.get_next() is None
    for path, image in zip(paths, images):
        assert max_difference(pixels(image), expected(path, exif_transpose)) <= LEVELS, path


def test_eval_and_predict_agree_on_a_turned_photo(tmp_path):
    """A non-square photo stored with orientation 6 (height and width swap), at the default
    eval sizes: the eval pipeline and predict's reader give the same array, and it is not
    the one without the option."""
    folder = tmp_path / "photos"
    folder.mkdir()
    path = save_with_orientation(Image.open(imagenet_images()[0]).convert("RGB"),
                                 folder / "photo.jpg", 6)
    assert Image.open(path).size[0] != Image.open(path).size[1]
    dataset = create_dataset(str(tmp_path), EvalPreprocess(exif_transpose=True), batch_size=1,
                             num_parallel_workers=1)
    evaluated = next(dataset.create_tuple_iterator(output_numpy=True))[0][0]
    predicted = preprocess_images([path], EvalPreprocess(exif_transpose=True))[0]
    np.testing.assert_array_equal(evaluated, predicted)
    assert np.abs(predicted - preprocess_images([path])[0]).mean() > 0.1


def training_epoch(root, size, exif_transpose):
    """One epoch of the training pipeline of ``root`` (seed fixed, read in order), 0-255 HWC."""
    ds.config.set_seed(11)
    dataset = create_dataset(root, TrainAugment(image_size=size, exif_transpose=exif_transpose),
                             batch_size=8, sampling=Sampling(shuffle=False),
                             num_parallel_workers=1)
    return np.stack([pixels(image) for batch in dataset.create_tuple_iterator(output_numpy=True)
                     for image in batch[0]])


@pytest.mark.parametrize("sample", ["cifar", "imagenet"])
def test_untagged_images_train_on_the_same_crops(sample, cifar_small):
    """With the option on, JPEGs without an Orientation tag get the same crop draws and resize
    as the fused crop-decode: each training image is the same as with it off but near the
    crop's edges, where the fused op, decoding the crop alone, upsamples the chroma without
    the pixels beyond it (measured: at most 0.37 levels on average in an image, 12 % of its
    pixels off by more than half a level; another draw is 7 levels or more away on average,
    over 80 % of its pixels). The ImageNet sample holds greyscale and CMYK JPEGs."""
    root, size = (cifar_small["train"], 32) if sample == "cifar" else (IMAGENET_SMALL, 224)
    off, on = training_epoch(root, size, False), training_epoch(root, size, True)
    assert len(off) == len(on) >= 24
    difference = np.abs(on - off).reshape(len(on), -1)
    assert difference.mean(axis=1).max() <= 1.0
    assert (difference > 0.5).mean(axis=1).max() <= 0.25


def test_train_py_hands_the_key_to_both_pipelines(photos):
    cfg = parse_config(["--data_path", photos[0], "--class_num", "1", "--batch_size", "1",
                        "--exif_transpose", "true", "--num_parallel_workers", "1"])
    data = recipe.build_data(cfg, 0, 1)
    assert data.train_args["settings"].exif_transpose is True
    assert data.eval_args["settings"].exif_transpose is True


class Captured(Exception):
    """Raised by a stand-in once it has recorded its arguments."""


def capture(monkeypatch, module, name):
    calls = []

    def record(*args, **kwargs):
        calls.append((args, kwargs))
        raise Captured

    monkeypatch.setattr(module, name, record)
    return calls


def test_eval_py_hands_the_key_to_its_pipeline(photos, monkeypatch, tmp_path):
    # in-process: the session's MindSpore runtime is up, set_device may not run again
    monkeypatch.setattr(device, "setup_device", lambda *args, **kwargs: None)
    calls = capture(monkeypatch, pipeline, "create_dataset")
    with pytest.raises(Captured):
        eval_entry.main(["--data_path", photos[0], "--class_num", "1", "--exif_transpose",
                         "true", "--output_dir", str(tmp_path), "--device_target", "CPU"])
    assert calls[0][0][1].exif_transpose is True


def test_predict_py_hands_the_key_to_its_reader(photos, monkeypatch):
    monkeypatch.setattr(device, "setup_device", lambda *args, **kwargs: None)
    monkeypatch.setattr(formats, "load_predictor", lambda *args, **kwargs: None)
    calls = capture(monkeypatch, inference, "preprocess_images")
    with pytest.raises(Captured):
        predict_entry.main(["--image_path", photos[1][0], "--checkpoint_path", "model.onnx",
                            "--class_num", "1", "--exif_transpose", "true",
                            "--device_target", "CPU"])
    assert calls[0][0][-1].exif_transpose is True


def test_export_py_hands_the_key_to_calibration(monkeypatch, tmp_path):
    monkeypatch.setattr(formats, "export_model", lambda *a, **k: None)
    monkeypatch.setattr(formats, "check_exported", lambda *a, **k: None)
    calls = capture(monkeypatch, quantize, "export_int8")
    cfg = parse_config(["--exif_transpose", "true", "--file_format", "ONNX"])
    with pytest.raises(Captured):
        export_entry.export_int8_onnx(
            None, None, cfg, ["image.jpg"], str(tmp_path / "model.onnx"),
            preprocess=recipe.model_preprocess(cfg, recipe.resolve_model(cfg)))
    assert calls[0][0][4].exif_transpose is True


def test_the_fused_decode_stays_without_the_option():
    """The default training pipeline keeps MindSpore's fused crop-decode (C++), the one it had
    before the option; the Pillow decode comes only with the option on."""
    off = create_transforms(TrainAugment(image_size=SIDE))
    on = create_transforms(TrainAugment(image_size=SIDE, exif_transpose=True))
    assert isinstance(off[0], vision.RandomCropDecodeResize)
    assert not any(isinstance(op, DecodeRGB) for op in off)
    assert isinstance(on[0], DecodeRGB) and on[0].exif_transpose


def test_a_sixteen_bit_png_is_turned_too():
    """The tag is read before the 16-bit greyscale conversion (which keeps no EXIF)."""
    grey = Image.open(imagenet_images()[0]).convert("L").resize((SIDE, SIDE // 2))
    exif = Image.Exif()
    exif[EXIF_ORIENTATION] = 6
    buffer = io.BytesIO()
    Image.fromarray(np.asarray(grey).astype(np.uint16) * 257).save(buffer, "PNG", exif=exif)
    data = np.frombuffer(buffer.getvalue(), np.uint8)
    turned = np.asarray(grey.transpose(Image.Transpose.ROTATE_270).convert("RGB"))  # 6: upright
    assert turned.shape == (SIDE, SIDE // 2, 3)
    np.testing.assert_array_equal(np.asarray(decode_rgb(data, exif_transpose=True)), turned)
    np.testing.assert_array_equal(np.asarray(decode_rgb(data)), np.asarray(grey.convert("RGB")))


def test_a_resume_with_the_other_value_is_refused():
    """The key changes what is trained: not one a resumed run may change."""
    stored = dict(parse_config([]), exif_transpose=False)
    check_same_recipe("run.ckpt", stored, dict(stored))
    with pytest.raises(ConfigError, match="exif_transpose True"):
        check_same_recipe("run.ckpt", stored, dict(stored, exif_transpose=True))
