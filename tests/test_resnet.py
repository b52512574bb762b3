"""ResNet cells: shapes for every depth, parameter counts, names, stride placement, init, the
stem max pool's forms (torchvision's padding 1, MindCV's pad_mode 'same') and which device
target and export get which."""
import os

import mindspore as ms
import mindspore.nn as nn
import mindspore.ops as ops
import numpy as np
import pytest
import yaml
from mindspore.common.initializer import initializer
from mindspore.nn.utils import no_init_parameters

from src.data.settings import EvalPreprocess
from src.deploy.inference import preprocess_images
from src.models.resnet import NETWORK_REGISTRY, Bottleneck, batch_norm, create_network
from src.models.stem_pool import (
    STEM_MAX_POOLS,
    MaxPoolPad1,
    same_max_pool,
    use_device_max_pool,
    use_exportable_max_pool,
)
from src.utils.architectures import ARCHITECTURES
from tests.helpers import ROOT, imagenet_images, slow_beyond

# torchvision's parameter counts (trainable) at 1000 classes.
TORCHVISION_PARAMS = {"resnet18": 11_689_512, "resnet34": 21_797_672, "resnet50": 25_557_032,
                      "resnet101": 44_549_160, "resnet152": 60_192_808}


def count(net):
    return sum(p.size for p in net.trainable_params())


def structure(*args, **kwargs):
    """``create_network(*args, **kwargs)`` with its parameters not initialized (shapes, names
    and cells only): for the checks that never run the network nor read a weight."""
    with no_init_parameters():
        return create_network(*args, **kwargs)


def runnable(*args, **kwargs):
    """``structure(*args, **kwargs)`` made runnable: convolution and fc weights zero (no random
    draw: the largest cost of building a deep network), every other parameter (BatchNorm's,
    fc's bias) initialized as built. For the checks of output and feature-map shapes, which
    read no value."""
    net = structure(*args, **kwargs)
    for param in net.get_parameters():
        if param.name.endswith(".weight"):
            param.set_data(initializer("zeros", param.shape, param.dtype))
        else:
            param.init_data()
    return net


@pytest.mark.parametrize("name", slow_beyond(NETWORK_REGISTRY,
                                              ("resnet18", "resnet34", "resnet50")))
def test_parameter_count_equals_torchvision(name):
    assert count(structure(name)) == TORCHVISION_PARAMS[name]


@pytest.mark.parametrize("name", slow_beyond(NETWORK_REGISTRY,
                                              ("resnet18", "resnet34", "resnet50")))
def test_output_shape_every_depth(name):
    net = runnable(name, class_num=7)
    net.set_train(False)
    out = net(ms.Tensor(np.random.default_rng(0).standard_normal((2, 3, 64, 64)), ms.float32))
    assert out.shape == (2, 7) and out.dtype == ms.float32


def test_resnet50_224_output_and_names():
    net = structure("resnet50")
    names = [p.name for p in net.trainable_params()]
    assert len(names) == 161
    for expected in ("conv1.weight", "bn1.gamma", "layer1.0.conv1.weight",
                     "layer1.0.downsample.0.weight", "layer1.0.downsample.1.beta",
                     "layer4.2.bn3.gamma", "fc.weight", "fc.bias"):
        assert expected in names
    moving = [p.name for p in net.get_parameters() if not p.requires_grad]
    assert "layer3.5.bn2.moving_variance" in moving and len(moving) == 2 * 53


def test_stride_sits_on_the_3x3_conv_v1_5():
    net = structure("resnet50")
    first = net.layer2[0]
    assert isinstance(first, Bottleneck)
    assert first.conv1.stride == (1, 1) and first.conv1.kernel_size == (1, 1)
    assert first.conv2.stride == (2, 2) and first.conv2.kernel_size == (3, 3)
    assert first.downsample[0].stride == (2, 2)
    assert net.layer1[0].conv2.stride == (1, 1)  # layer1 keeps the resolution
    assert net.conv1.stride == (2, 2) and net.conv1.padding == 3
    assert first.conv2.pad_mode == "pad" and first.conv2.padding == 1


def test_feature_map_sizes_match_torch():
    net = runnable("resnet50")
    net.set_train(False)
    x = ms.Tensor(np.zeros((1, 3, 224, 224), np.float32))
    x = net.maxpool(net.relu(net.bn1(net.conv1(x))))
    assert x.shape == (1, 64, 56, 56)
    sizes = []
    for layer in (net.layer1, net.layer2, net.layer3, net.layer4):
        x = layer(x)
        sizes.append(tuple(x.shape[1:]))
    assert sizes == [(256, 56, 56), (512, 28, 28), (1024, 14, 14), (2048, 7, 7)]


def test_bn_running_statistics_follow_torch():
    # torch BatchNorm2d(momentum=0.1): running = 0.9 * running + 0.1 * batch statistic,
    # with the unbiased batch variance; eps 1e-5.
    bn = batch_norm(3)
    bn.set_train(True)
    x = (np.random.default_rng(0).standard_normal((4, 3, 5, 5)) * 2 + 1).astype(np.float32)
    out = bn(ms.Tensor(x)).asnumpy()
    np.testing.assert_allclose(bn.moving_mean.asnumpy(), 0.1 * x.mean((0, 2, 3)), rtol=1e-5)
    np.testing.assert_allclose(bn.moving_variance.asnumpy(),
                               0.9 + 0.1 * x.var((0, 2, 3), ddof=1), rtol=1e-5)
    normalized = (x - x.mean((0, 2, 3), keepdims=True)) / np.sqrt(
        x.var((0, 2, 3), keepdims=True) + 1e-5)
    np.testing.assert_allclose(out, normalized, atol=1e-5)


def test_init_as_torchvision():
    net = create_network("resnet50", zero_init_residual=True)
    bn = net.layer1[0].bn3
    assert np.all(bn.gamma.asnumpy() == 0)  # zero-init of the block's last BN
    assert np.all(net.layer1[0].bn2.gamma.asnumpy() == 1)
    assert np.all(net.bn1.beta.asnumpy() == 0)
    # Kaiming normal, fan_out, ReLU gain: std = sqrt(2 / (out * k * k))
    w = net.layer3[0].conv2.weight.asnumpy()
    assert w.std() == pytest.approx(np.sqrt(2.0 / (256 * 9)), rel=0.05)
    fc = net.fc.weight.asnumpy()
    assert np.abs(fc).max() <= 1 / np.sqrt(2048)


def torch_max_pool(x):
    """torch.nn.functional.max_pool2d(x, 3, 2, 1) and the gradient of sum(y^2) by x."""
    import torch
    tx = torch.from_numpy(x).requires_grad_(True)
    y = torch.nn.functional.max_pool2d(tx, 3, 2, 1)
    (y * y).sum().backward()
    return y.detach().numpy(), tx.grad.numpy()


def max_pool_grad(pool, x):
    """Gradient of sum(pool(x)^2) by x, in MindSpore."""
    return ms.grad(lambda t: (pool(t) * pool(t)).sum())(ms.Tensor(x)).asnumpy()


@pytest.mark.parametrize("relu", [False, True])
def test_maxpool_equals_torch_forward_and_gradient(relu):
    """The network's stem pool is torch's MaxPool2d(3, 2, padding=1): -inf padding (exact
    on negative input too, where zero padding is not) and the gradient to the maximum (also
    with the ties of a ReLU's zeros)."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, 10, 9)).astype(np.float32)
    if relu:
        x = np.maximum(x, 0)
    pool = structure("resnet18").maxpool  # no parameters of its own
    ref, ref_grad = torch_max_pool(x)
    np.testing.assert_array_equal(pool(ms.Tensor(x)).asnumpy(), ref)
    np.testing.assert_array_equal(max_pool_grad(pool, x), ref_grad)


def test_exportable_maxpool_gives_the_same_network_output():
    # zero padding + valid pooling == -inf padding on the non-negative input after the ReLU
    net = create_network("resnet18", class_num=10)
    net.set_train(False)
    x = ms.Tensor(np.random.default_rng(1).standard_normal((2, 3, 64, 64)), ms.float32)
    before = net(x).asnumpy()
    assert isinstance(use_exportable_max_pool(net).maxpool, MaxPoolPad1)
    np.testing.assert_array_equal(net(x).asnumpy(), before)
    rng = np.random.default_rng(0)
    x = np.maximum(rng.standard_normal((1, 2, 9, 9)), 0).astype(np.float32)
    np.testing.assert_array_equal(MaxPoolPad1()(ms.Tensor(x)).asnumpy(), torch_max_pool(x)[0])


def is_torch_form(pool):
    """``nn.MaxPool2d(pad_mode='pad', padding=1)``: MaxPool3DWithArgmax on a 5-D view."""
    return (isinstance(pool, nn.MaxPool2d) and isinstance(pool.max_pool, ops.MaxPool3DWithArgmax)
            and pool.padding == (0, 1, 1))


def test_stem_pool_form_per_device_target():
    # a table, not an if-chain: every pad mode and every target MindSpore runs on has one entry
    assert set(STEM_MAX_POOLS) == {"pad", "same"}
    assert all(set(forms) == {"CPU", "GPU", "Ascend"} for forms in STEM_MAX_POOLS.values())
    for target, form in (("CPU", is_torch_form), ("GPU", is_torch_form),
                         ("Ascend", lambda pool: isinstance(pool, MaxPoolPad1))):
        net = structure("resnet18", class_num=10)
        assert is_torch_form(net.maxpool)  # no target: torch's form, as before
        assert use_device_max_pool(net, target) is net and form(net.maxpool), target
        assert form(structure("resnet18", class_num=10, device_target=target).maxpool), target
    # the swap adds or removes no parameter: checkpoints load into either form
    assert count(structure("resnet18", device_target="Ascend")) == 11_689_512
    with pytest.raises(ValueError, match="device_target 'NPU'.*CPU, GPU, Ascend"):
        use_device_max_pool(structure("resnet18", class_num=10), "NPU")


def test_pool_forms_equal_after_relu_on_real_images():
    """On the stem's ReLU output of real images (flat regions give ties), the Ascend form
    (zero padding + 'valid') equals torch's form (-inf padding): forward exactly; gradients
    through the ReLU exactly here on CPU. Before the ReLU's backward they differ only where a
    window's maximum is 0 (ties between zeros, padding included), which the ReLU's gradient
    (0 at 0) discards."""
    images = ms.Tensor(preprocess_images(
        imagenet_images()[:4], EvalPreprocess(image_size=224, resize=256)))
    net = create_network("resnet18", class_num=10)
    net.set_train(False)
    stem = net.bn1(net.conv1(images))  # pre-ReLU, (4, 64, 112, 112)
    relu = ops.ReLU()
    torch_form, ascend_form = structure("resnet18", class_num=10).maxpool, MaxPoolPad1()
    out = torch_form(relu(stem)).asnumpy()
    assert out.shape == (4, 64, 56, 56) and (out == 0).any()  # all-zero windows exist
    np.testing.assert_array_equal(ascend_form(relu(stem)).asnumpy(), out)
    weights = ms.Tensor(np.random.default_rng(0).standard_normal(out.shape).astype(np.float32))

    def grad(pool, at, through_relu):
        head = (lambda t: pool(relu(t))) if through_relu else pool
        return ms.grad(lambda t: (head(t) * weights).sum())(at).asnumpy()

    np.testing.assert_array_equal(grad(ascend_form, stem, True), grad(torch_form, stem, True))
    activations = relu(stem)
    differ = grad(ascend_form, activations, False) != grad(torch_form, activations, False)
    assert not (differ & (activations.asnumpy() != 0)).any()


def test_unknown_name_lists_valid_names():
    with pytest.raises(KeyError, match="resnet18, resnet34, resnet50, resnet101, resnet152"):
        create_network("resnet51")


def tf_same_max_pool(x):
    """TensorFlow's 'same' 3x3 / stride-2 max pool in torch: the padding a side needs
    (1 when even, 2 when odd), the extra one at the bottom/right, -inf padding."""
    import torch
    pad_h, pad_w = 1 + x.shape[2] % 2, 1 + x.shape[3] % 2
    padded = torch.nn.functional.pad(torch.from_numpy(x), (pad_w // 2, pad_w - pad_w // 2,
                                                           pad_h // 2, pad_h - pad_h // 2),
                                     value=-float("inf"))
    return torch.nn.functional.max_pool2d(padded, 3, 2).numpy()


def is_same_form(pool):
    """MindCV's stem pool: ``nn.MaxPool2d(3, 2, pad_mode='same')``."""
    return (isinstance(pool, nn.MaxPool2d) and isinstance(pool.max_pool, ops.MaxPool)
            and pool.max_pool.pad_mode == "SAME")


def test_same_pool_is_tensorflow_same_and_differs_from_torch_on_even_sides():
    """``stem_pool_pad_mode same`` (MindCV's pool): asymmetric on an even side (nothing at the
    top/left, one at the bottom/right), as torch's padding 1 on an odd side; negative input
    too (-inf padding)."""
    x = np.random.default_rng(0).standard_normal((2, 3, 10, 9)).astype(np.float32)  # even, odd
    pool = create_network("resnet18", class_num=10, stem_pool_pad_mode="same").maxpool
    assert is_same_form(pool)
    out = pool(ms.Tensor(x)).asnumpy()
    np.testing.assert_array_equal(out, tf_same_max_pool(x))
    torch_form = torch_max_pool(x)[0]
    assert out.shape == torch_form.shape == (2, 3, 5, 5)
    odd = np.ascontiguousarray(x[:, :, :9, :])  # 9 x 9: both forms pad one on each side
    np.testing.assert_array_equal(pool(ms.Tensor(odd)).asnumpy(), torch_max_pool(odd)[0])
    assert (out != torch_form).any()  # even height: the windows are shifted by one row


@pytest.mark.slow
def test_same_pool_kept_on_every_device_and_in_export(tmp_path):
    """With ``same`` every device target and the ONNX/AIR export keep MindCV's pool (a plain
    MaxPool, exported as MaxPool auto_pad SAME_UPPER): ONNX Runtime gives MindSpore's output,
    on the stem's ReLU output of real images (even side 16)."""
    import onnxruntime

    for target in STEM_MAX_POOLS["same"]:
        assert is_same_form(structure("resnet18", class_num=10, device_target=target,
                                      stem_pool_pad_mode="same").maxpool), target
        net = structure("resnet18", class_num=10, stem_pool_pad_mode="same")
        assert is_same_form(use_device_max_pool(net, target).maxpool), target
    net = create_network("resnet18", class_num=10, stem_pool_pad_mode="same")  # runs below
    assert is_same_form(use_exportable_max_pool(net).maxpool)
    assert isinstance(use_exportable_max_pool(structure("resnet18", class_num=10)).maxpool,
                      MaxPoolPad1)  # pad: zero padding + 'valid', as before

    images = ms.Tensor(preprocess_images(
        imagenet_images()[:2], EvalPreprocess(image_size=32, resize=32)))
    net.set_train(False)
    stem = ops.ReLU()(net.bn1(net.conv1(images)))  # (2, 64, 16, 16), >= 0
    want = net.maxpool(stem).asnumpy()
    np.testing.assert_array_equal(want, same_max_pool()(stem).asnumpy())
    np.testing.assert_array_equal(want, tf_same_max_pool(stem.asnumpy()))
    ms.onnx.export(net.maxpool, stem, file_name=str(tmp_path / "pool"))
    session = onnxruntime.InferenceSession(str(tmp_path / "pool.onnx"),
                                           providers=["CPUExecutionProvider"])
    got = session.run(None, {session.get_inputs()[0].name: stem.asnumpy()})[0]
    np.testing.assert_array_equal(got, want)


def test_unknown_stem_pool_pad_mode_lists_valid_ones():
    with pytest.raises(ValueError, match="stem_pool_pad_mode must be one of pad, same, got "
                                         "'valid'"):
        create_network("resnet18", class_num=10, stem_pool_pad_mode="valid")


def test_config_allows_the_architectures_built():
    """config.yaml's third document (allowed values) lists exactly ``ARCHITECTURES``' names."""
    with open(os.path.join(ROOT, "config.yaml"), encoding="utf-8") as f:
        choices = list(yaml.safe_load_all(f))[2]
    assert choices["net_name"] == list(ARCHITECTURES)
    assert list(NETWORK_REGISTRY) == list(ARCHITECTURES)
