"""BatchNorm folding for export: the folded network gives the unfolded one's logits (and the
PyTorch reference's) to float32 rounding, with no BatchNorm left."""
import mindspore as ms
import mindspore.nn as nn
import numpy as np
import pytest
import torch
from mindspore.nn.utils import no_init_parameters

from src.data.settings import EvalPreprocess
from src.deploy.inference import preprocess_images
from src.models.bn_fold import fold_batchnorm, folded_conv
from src.models.resnet import create_network
from tests.alignment_utils import load_torch_weights, max_rel_diff, reference_pair
from tests.helpers import slow_beyond
from tests.test_alignment import imagenet_paths, torch_on_one_thread  # noqa: F401 (autouse)

BN_COUNT = {"resnet18": 20, "resnet50": 53}  # stem + 2 or 3 per block + one per downsample


@pytest.mark.parametrize("net_name", slow_beyond(["resnet18", "resnet50"], ("resnet18",)))
def test_folded_network_gives_the_same_logits(net_name):
    tnet, net = reference_pair(net_name, 1000, seed=3)  # gamma, beta, mean, var all non-trivial
    images = preprocess_images(
        imagenet_paths(4, step=7), EvalPreprocess(image_size=224, resize=256))
    net.set_train(False)
    before = net(ms.Tensor(images)).asnumpy()
    tnet.eval()
    with torch.no_grad():
        reference = tnet(torch.from_numpy(images)).numpy()

    with no_init_parameters():  # a fresh cell (no compiled graph reused), every weight loaded
        net = create_network(net_name, class_num=1000)
    load_torch_weights(net, tnet)
    assert fold_batchnorm(net) == BN_COUNT[net_name]
    assert not [name for name, cell in net.cells_and_names() if isinstance(cell, nn.BatchNorm2d)]
    assert not [p.name for p in net.get_parameters() if "moving_" in p.name]
    after = net(ms.Tensor(images)).asnumpy()
    diff, ref_diff = max_rel_diff(after, before), max_rel_diff(after, reference)
    print(f"\n[bn_fold] {net_name}: folded vs unfolded max |diff| / max |logit| = {diff:.2e}; "
          f"vs PyTorch {ref_diff:.2e}")
    assert 0 < diff < 1e-5 and ref_diff < 1e-4  # > 0: the folded graph did run
    np.testing.assert_array_equal(after.argmax(1), before.argmax(1))


def test_folding_a_conv_with_bias_keeps_it():
    conv = nn.Conv2d(3, 4, 3, has_bias=True, bias_init="normal", weight_init="normal")
    bn = nn.BatchNorm2d(4, eps=1e-5)
    rng = np.random.default_rng(0)
    for param, values in ((bn.gamma, rng.uniform(0.5, 1.5, 4)), (bn.beta, rng.normal(0, 1, 4)),
                          (bn.moving_mean, rng.normal(0, 1, 4)),
                          (bn.moving_variance, rng.uniform(0.5, 2, 4))):
        param.set_data(ms.Tensor(values.astype(np.float32)))
    bn.set_train(False)
    x = ms.Tensor(rng.normal(0, 1, (2, 3, 8, 8)).astype(np.float32))
    expected = bn(conv(x)).asnumpy()
    got = folded_conv(conv, bn)(x).asnumpy()
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_channel_mismatch_is_an_error_naming_both():
    with pytest.raises(ValueError, match="8 channels.*4 outputs"):
        folded_conv(nn.Conv2d(3, 4, 1), nn.BatchNorm2d(8))
