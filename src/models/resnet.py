"""ResNet-18/34/50/101/152 in the torchvision layout (ResNet v1.5).

Reference: He et al., "Deep Residual Learning for Image Recognition" (CVPR 2016) and
torchvision ``models/resnet.py``. As in torchvision (and NVIDIA's "ResNet-50 v1.5"), the
stride of a downsampling Bottleneck sits on its 3x3 convolution, not on the first 1x1.

Parameter names follow torchvision so that weights map one to one: ``conv1``, ``bn1``,
``layer1.0.conv1``, ``layer1.0.downsample.0``, ``fc``. MindSpore names the BatchNorm
tensors ``gamma``/``beta``/``moving_mean``/``moving_variance`` where torch says
``weight``/``bias``/``running_mean``/``running_var``.

MindCV's ResNets (``mindcv/models/resnet.py``) hold the same tensors in the same order under
``classifier`` (our ``fc``) and ``down_sample`` (our ``downsample``); their stem max pool is
``nn.MaxPool2d(3, 2, pad_mode="same")``: ``stem_pool_pad_mode="same"`` builds that form, so that
their checkpoints give their logits here (``src.utils.checkpoint.SOURCE_LAYOUTS`` renames them).

Stochastic depth (``drop_path_rate``) follows timm (``timm/models/resnet.py`` ``make_blocks`` and
``timm/layers/drop.py`` ``drop_path``, commit aa4b5850c1543fa488abf260f18390eda46cf85d); its
random draws are a hash of (seed, data-parallel rank, block, training call, sample), so a resumed
run draws what an uninterrupted one does (docs/network.md, "Stochastic depth").
"""
import math

import mindspore as ms
import mindspore.nn as nn
import mindspore.ops as ops
import numpy as np
from mindspore import Parameter, Tensor
from mindspore.common.initializer import HeNormal, HeUniform, Uniform

from src.utils.checkpoint import DROP_PATH_STEP

# torch.nn.BatchNorm2d(momentum=0.1) updates running = 0.9 * running + 0.1 * batch;
# MindSpore's momentum is the weight of the old value, so the same update is momentum=0.9.
BN_MOMENTUM = 0.9
BN_EPS = 1e-5


def conv3x3(in_channels, out_channels, stride=1):
    """3x3 convolution, padding 1 on every side (as torch), no bias."""
    return nn.Conv2d(in_channels, out_channels, kernel_size=3, stride=stride, pad_mode="pad",
                     padding=1, has_bias=False,
                     weight_init=HeNormal(mode="fan_out", nonlinearity="relu"))


def conv1x1(in_channels, out_channels, stride=1):
    """1x1 convolution, no padding, no bias."""
    return nn.Conv2d(in_channels, out_channels, kernel_size=1, stride=stride, pad_mode="valid",
                     has_bias=False, weight_init=HeNormal(mode="fan_out", nonlinearity="relu"))


def batch_norm(num_features, zero_init=False):
    """BatchNorm2d equal to torch's defaults (eps 1e-5, momentum 0.1); gamma 1 (or 0), beta 0."""
    return nn.BatchNorm2d(num_features, eps=BN_EPS, momentum=BN_MOMENTUM,
                          gamma_init="zeros" if zero_init else "ones", beta_init="zeros")


class BasicBlock(nn.Cell):
    """Two 3x3 convolutions with an identity (or projected) shortcut; ResNet-18/34.

    Args:
        in_channels (int): Channels of the input feature map.
        channels (int): Channels of both convolutions (``expansion`` is 1).
        stride (int): Stride of the first 3x3 convolution (1 or 2).
        downsample (nn.Cell, optional): Projection of the shortcut when shape changes.
        zero_init_residual (bool): Start ``bn2.gamma`` at 0, so the block starts as identity.
        drop_path_index (int): This block's row of the stochastic depth scales (``ResNet``
            passes them), or -1: no stochastic depth (its rate is 0).

    Inputs:
        - **x** (Tensor) - float32 or float16, shape (N, in_channels, H, W).
        - **drop_path_scales** (Tensor, optional) - float32, (blocks with stochastic depth,
          N, 1, 1, 1) (``DropPathScales``): row ``drop_path_index`` multiplies the residual
          branch before the shortcut is added. None: no stochastic depth (no extra operator).

    Outputs:
        Tensor of shape (N, channels, H / stride, W / stride).
    """

    expansion = 1

    def __init__(self, in_channels, channels, stride=1, downsample=None, zero_init_residual=False,
                 drop_path_index=-1):
        super().__init__()
        self.conv1 = conv3x3(in_channels, channels, stride)
        self.bn1 = batch_norm(channels)
        self.relu = nn.ReLU()
        self.conv2 = conv3x3(channels, channels)
        self.bn2 = batch_norm(channels, zero_init=zero_init_residual)
        self.downsample = downsample
        self.drop_path_index = drop_path_index

    def construct(self, x, drop_path_scales=None):
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        if drop_path_scales is not None and self.drop_path_index >= 0:
            out = out * drop_path_scales[self.drop_path_index].astype(out.dtype)
        if self.downsample is not None:
            identity = self.downsample(x)
        return self.relu(out + identity)


class Bottleneck(nn.Cell):
    """1x1 reduce, 3x3 (carrying the stride: v1.5), 1x1 expand by 4; ResNet-50/101/152.

    Args:
        in_channels (int): Channels of the input feature map.
        channels (int): Width of the 3x3 convolution; the block outputs ``4 * channels``.
        stride (int): Stride of the 3x3 convolution (1 or 2).
        downsample (nn.Cell, optional): Projection of the shortcut when shape changes.
        zero_init_residual (bool): Start ``bn3.gamma`` at 0, so the block starts as identity.
        drop_path_index (int): As ``BasicBlock``'s.

    Inputs:
        - **x** (Tensor) - float32 or float16, shape (N, in_channels, H, W).
        - **drop_path_scales** (Tensor, optional) - As ``BasicBlock``'s.

    Outputs:
        Tensor of shape (N, 4 * channels, H / stride, W / stride).
    """

    expansion = 4

    def __init__(self, in_channels, channels, stride=1, downsample=None, zero_init_residual=False,
                 drop_path_index=-1):
        super().__init__()
        out_channels = channels * self.expansion
        self.conv1 = conv1x1(in_channels, channels)
        self.bn1 = batch_norm(channels)
        self.conv2 = conv3x3(channels, channels, stride)
        self.bn2 = batch_norm(channels)
        self.conv3 = conv1x1(channels, out_channels)
        self.bn3 = batch_norm(out_channels, zero_init=zero_init_residual)
        self.relu = nn.ReLU()
        self.downsample = downsample
        self.drop_path_index = drop_path_index

    def construct(self, x, drop_path_scales=None):
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        if drop_path_scales is not None and self.drop_path_index >= 0:
            out = out * drop_path_scales[self.drop_path_index].astype(out.dtype)
        if self.downsample is not None:
            identity = self.downsample(x)
        return self.relu(out + identity)


def stem_max_pool():
    """The stem's 3x3 / stride-2 max pool with padding 1, ``torch.nn.MaxPool2d(3, 2, 1)``.

    ``stem_pool_pad_mode: pad``, the form for CPU and GPU (``STEM_MAX_POOLS``). MindSpore
    lowers ``nn.MaxPool2d(pad_mode='pad')`` to ``MaxPool3DWithArgmax`` on a 5-D view (padding
    with -inf, gradient to the first maximum, as torch). On CPU it is the fast form in
    training: a ResNet-18 train step at 128 px, batch 64, took 11% less time with it than with
    ``MaxPoolPad1``, whose 'valid' pooling runs oneDNN's plain NCHW kernel
    (``benchmarks/onednn_breakdown.py``). GPU has a CUDA kernel for it (not measured here).
    On Ascend it is an AI CPU operator only (see ``STEM_MAX_POOLS``), and the ONNX exporter
    rejects it.

    Returns:
        nn.MaxPool2d: float (N, C, H, W) -> (N, C, (H + 1) // 2, (W + 1) // 2).
    """
    return nn.MaxPool2d(kernel_size=3, stride=2, pad_mode="pad", padding=1)


class MaxPoolPad1(nn.Cell):
    """3x3 / stride-2 max pool with padding 1, written as zero padding + 'valid' pooling.

    ``stem_pool_pad_mode: pad`` on Ascend (``STEM_MAX_POOLS``), in ONNX and AIR export
    (``use_exportable_max_pool``): ``Pad`` and ``MaxPool`` (``MaxPoolGrad`` backward) have AI
    Core kernels on Ascend and export to ONNX. Equal to ``torch.nn.MaxPool2d(3, 2, padding=1)``
    on non-negative input (it follows a ReLU in ResNet). Gradients through that ReLU are equal
    too: the two forms route a window's gradient differently only when the window's maximum
    is tied, and a tie at 0 (padding included) meets the ReLU's zero gradient; ties between
    equal positive values go to the first maximum in both forms on CPU (MindSpore does not
    document the rule of Ascend's ``MaxPoolGrad``).
    """

    def __init__(self):
        super().__init__()
        # ops.Pad (not nn.ZeroPad2d / PadV3, which the ONNX exporter also rejects).
        self.pad = ops.Pad(((0, 0), (0, 0), (1, 1), (1, 1)))
        self.pool = nn.MaxPool2d(kernel_size=3, stride=2, pad_mode="valid")

    def construct(self, x):
        return self.pool(self.pad(x))


def same_max_pool():
    """The stem's 3x3 / stride-2 max pool of MindCV's ResNets: ``nn.MaxPool2d(kernel_size=3,
    stride=2, pad_mode="same")`` (``mindcv/models/resnet.py``), ``stem_pool_pad_mode: same``.

    TensorFlow's "same" padding: the output has ceil(H / 2) rows and the padding a window
    needs is split with the extra row at the end. For an even side (the stem's 112 at 224 px,
    any image side that is a multiple of 4) that is no padding at the top/left and one
    row/column at the bottom/right, where torch's form pads one on each side: the windows are
    shifted by one pixel, so a network trained with one form gives other logits with the
    other. For an odd side both forms pad one on each side. It lowers to the ``MaxPool``
    operator of ``MaxPoolPad1`` (``MaxPoolGrad`` backward; only its pad_mode attribute
    differs), so it runs natively where that one does (Ascend's AI Core included: not run
    here), and exports to ONNX as ``MaxPool(auto_pad="SAME_UPPER")``, equal in ONNX Runtime:
    the one form serves every device and export format.

    Returns:
        nn.MaxPool2d: float (N, C, H, W) -> (N, C, ceil(H / 2), ceil(W / 2)).
    """
    return nn.MaxPool2d(kernel_size=3, stride=2, pad_mode="same")


STEM_POOL_PAD_MODES = ("pad", "same")
"""Values of ``stem_pool_pad_mode`` (MindSpore's ``pad_mode`` terms): ``pad`` = torchvision's
``MaxPool2d(3, 2, padding=1)``; ``same`` = MindCV's ``MaxPool2d(3, 2, pad_mode="same")``."""

# The form a network is built with (``create_network`` without ``device_target``).
BUILT_MAX_POOLS = {"pad": stem_max_pool, "same": same_max_pool}

# The stem pool form per stem_pool_pad_mode and device target: where each form has native
# kernels in MindSpore 2.10. ``pad``: ``MaxPool3DWithArgmax`` (torch's form) is registered for
# Ascend only as an AI CPU operator (ops/_op_impl/aicpu/max_pool3d_with_argmax.py; the graph
# adapter maps it to the custom AI CPU op CustMaxPool3DWithArgmax, engine DNN_VM_AICPU), so on
# Ascend it would run on the host CPU in every step, forward and backward
# (MaxPool3DGradWithArgmax likewise). GPU has CUDA kernels for both; on CPU it is the faster
# form (``stem_max_pool``). ``same``: a plain ``MaxPool`` everywhere (``same_max_pool``). No
# form holds parameters: checkpoints load into any.
STEM_MAX_POOLS = {
    "pad": {"CPU": stem_max_pool, "GPU": stem_max_pool, "Ascend": MaxPoolPad1},
    "same": {"CPU": same_max_pool, "GPU": same_max_pool, "Ascend": same_max_pool},
}

# The form ONNX and AIR exports get (``use_exportable_max_pool``), equal after the ReLU.
EXPORTABLE_MAX_POOLS = {"pad": MaxPoolPad1, "same": same_max_pool}


def drop_path_rates(drop_path_rate, num_blocks):
    """Stochastic depth rate of each residual block, timm's linear rule: block ``i`` (0-based
    over the whole network) drops with ``drop_path_rate * i / (num_blocks - 1)``, the first
    block never, the last with ``drop_path_rate`` (``timm/models/resnet.py`` ``make_blocks``,
    commit aa4b5850c1543fa488abf260f18390eda46cf85d; Huang et al. 2016's linear decay).

    Args:
        drop_path_rate (float): The last block's rate, in [0, 1).
        num_blocks (int): Residual blocks in the network (ResNet-50: 16), at least 2.

    Returns:
        list[float]: One rate per block, in network order.
    """
    return [drop_path_rate * i / (num_blocks - 1) for i in range(num_blocks)]


# The hash behind the stochastic depth draws: int32 arithmetic that never overflows (products
# below 2**31 by Schrage's method), so numpy and every MindSpore backend compute the same bits.
HASH_MODULUS = 2 ** 31 - 1  # the Mersenne prime of Park and Miller's "minimal standard" generator
# Multiplication by each is a bijection modulo the prime (16807 and 48271: Park and Miller's;
# 69621: Park, Miller and Stockmeyer's; 39373 a fourth); each meets Schrage's condition
# HASH_MODULUS % a < HASH_MODULUS // a.
HASH_MULTIPLIERS = (48271, 69621, 16807, 39373)
HASH_START = 0x2545F491  # any nonzero 31-bit value: an all-zero key does not hash to 0


def _mulmod(h, a):
    """``a * h mod HASH_MODULUS`` for 0 <= h < 2**31 without a product of 2**31 or more."""
    q, r = divmod(HASH_MODULUS, a)
    return (a * (h % q) - r * (h // q)) % HASH_MODULUS


def hash_mix(h, value):
    """Fold ``value`` into the hash ``h``: both non-negative integers below 2**31 (Python
    ints, numpy or MindSpore int32 arrays, broadcast); the result is one too.

    Xor, then one round per ``HASH_MULTIPLIERS`` entry: an xor of the upper bits into the
    lower (the nonlinear step), then a multiplication modulo the prime ``HASH_MODULUS``.
    With 2 rounds neighbouring sample indices drew correlated (r = -0.33 at rate 0.5); with
    4 every correlation ``tests/test_drop_path.py`` measures is at noise level.
    Only ``^``, ``//``, ``%``, ``*`` and ``-``, on values whose products stay below 2**31:
    the same bits in numpy and in a MindSpore graph on any backend.
    """
    h = h ^ value
    for a in HASH_MULTIPLIERS:
        h = _mulmod(h ^ (h // 65536), a)
    return h ^ (h // 65536)


def block_key(seed, shard_id, block):
    """The hash of (``seed``, ``shard_id``, ``block``): the start of one block's draws on one
    data-parallel rank (a Python int below 2**31).

    Args:
        seed (int): The run's seed, 0 .. 2**32 - 1 (``seed``).
        shard_id (int): The data-parallel rank, >= 0.
        block (int): The block's 0-based index in the network.
    """
    h = HASH_START
    for value in (seed % 65536, seed // 65536, shard_id, block):
        h = hash_mix(h, value)
    return h


class DropPathScales(nn.Cell):
    """The stochastic depth scales of one training call: for every block with a rate ``p`` > 0
    and every sample, ``1 / (1 - p)`` (kept: timm's ``drop_path`` scales kept samples by
    ``1 / keep_prob``) or 0 (dropped, with probability ``p``).

    A sample's draw is the hash (``hash_mix``) of (seed, rank, block, call, sample index)
    compared with ``(1 - p) * (2**31 - 1)``: a function of those values alone, with no random
    state; the call counter is the network's ``drop_path_step``, which ``TrainStep`` advances
    after every call and checkpoints store, so a resumed run draws what an uninterrupted one
    does. Data-parallel ranks draw apart (their rank is hashed in) for their different samples.

    Args:
        rates (list[float]): Rates of the blocks with stochastic depth, each in (0, 1).
        blocks (list[int]): Their 0-based indices in the network.
        seed (int): The run's seed.
        shard_id (int): The data-parallel rank.

    Inputs:
        - **step** (Tensor) - int32 scalar, the training call (``ResNet.drop_path_step``).
        - **batch_size** (int) - N, the per-device batch.

    Outputs:
        Tensor: float32, (len(rates), N, 1, 1, 1): 0 or 1 / (1 - rate).
    """

    def __init__(self, rates, blocks, seed, shard_id):
        super().__init__()
        self.rates, self.blocks = list(rates), list(blocks)
        keep = 1.0 - np.array(rates, np.float64).reshape(-1, 1)
        self.keys = Tensor(np.array([[block_key(seed, shard_id, b)] for b in blocks], np.int32))
        self.thresholds = Tensor(np.round(keep * HASH_MODULUS).astype(np.int32))
        self.keep_probs = Tensor(keep.astype(np.float32))

    def construct(self, step, batch_size):
        samples = ops.arange(batch_size, dtype=ms.int32).reshape((1, -1))
        draws = hash_mix(hash_mix(self.keys, step), samples)
        kept = (draws < self.thresholds).astype(ms.float32)
        return (kept / self.keep_probs).reshape((self.keys.shape[0], -1, 1, 1, 1))


class ResidualStage(nn.SequentialCell):
    """A stage (``layer1`` .. ``layer4``): its blocks in sequence, each given the stochastic
    depth scales when there are (parameter names as ``nn.SequentialCell``'s: ``layer1.0...``).

    Inputs:
        - **x** (Tensor) - float, (N, C, H, W).
        - **drop_path_scales** (Tensor, optional) - ``DropPathScales``'s output, or None.
    """

    def construct(self, x, drop_path_scales=None):
        for block in self.cell_list:
            x = block(x, drop_path_scales)
        return x


class ResNet(nn.Cell):
    """ResNet backbone and classifier, torchvision layout and initialization.

    Initialization as torchvision: Kaiming-normal (fan_out, ReLU gain) convolutions,
    BatchNorm gamma 1 and beta 0, ``fc`` uniform in +-1/sqrt(fan_in) (torch ``nn.Linear``).

    Args:
        block (type): ``BasicBlock`` or ``Bottleneck``.
        layers (list[int]): Number of blocks in ``layer1`` .. ``layer4``.
        class_num (int): Number of output classes. Default: 1000.
        zero_init_residual (bool): Zero the last BN gamma of every block (Goyal et al. 2017).
        stem_pool_pad_mode (str): ``pad`` (torchvision's stem max pool, padding 1) or
            ``same`` (MindCV's, ``same_max_pool``); kept as the attribute of that name, which
            ``use_device_max_pool`` and ``use_exportable_max_pool`` follow. Default: ``pad``.
        drop_path_rate (float): Stochastic depth (timm's ``drop_path_rate``), in [0, 1): block
            ``i`` of ``n`` drops its residual branch per sample with probability
            ``drop_path_rate * i / (n - 1)`` (``drop_path_rates``) in training mode; never in
            inference mode. 0 (default): no stochastic depth, nothing added to the graph.
        drop_path_seed (int): The seed of the stochastic depth draws (the run's ``seed``).
        shard_id (int): The data-parallel rank (draws differ per rank).

    With ``drop_path_rate`` > 0 the network holds the int32 counter ``drop_path_step`` (the
    training calls so far; not trained, advanced by ``TrainStep``, saved in checkpoints) and
    the cell ``drop_path_scales`` (``DropPathScales``) that turns it into the scales: a test
    may replace that cell with one giving chosen scales.

    Inputs:
        - **x** (Tensor) - float32, shape (N, 3, H, W), normalized images. H and W of at
          least 32 (the network downsamples by 32).

    Outputs:
        Tensor of shape (N, class_num): logits (no softmax).

    Raises:
        ValueError: If ``class_num`` is not positive, ``layers`` does not have 4 entries,
            ``stem_pool_pad_mode`` is not one of ``STEM_POOL_PAD_MODES`` or ``drop_path_rate``
            is not in [0, 1).
    """

    def __init__(self, block, layers, class_num=1000, zero_init_residual=False,
                 stem_pool_pad_mode="pad", drop_path_rate=0.0, drop_path_seed=0, shard_id=0):
        super().__init__()
        if class_num < 1:
            raise ValueError(f"class_num must be a positive integer, got {class_num}")
        if len(layers) != 4:
            raise ValueError(f"layers must give 4 block counts, got {layers}")
        if stem_pool_pad_mode not in STEM_POOL_PAD_MODES:
            raise ValueError(f"stem_pool_pad_mode must be one of {', '.join(STEM_POOL_PAD_MODES)}, "
                             f"got {stem_pool_pad_mode!r}")
        if not 0.0 <= drop_path_rate < 1.0:
            raise ValueError(f"drop_path_rate must be in [0, 1), got {drop_path_rate}")
        self.stem_pool_pad_mode = stem_pool_pad_mode
        self.in_channels = 64
        self.zero_init_residual = zero_init_residual
        self.drop_path_rate = float(drop_path_rate)
        rates = drop_path_rates(self.drop_path_rate, sum(layers))
        # the blocks with a rate > 0, in network order (timm adds no DropPath to the others),
        # and each block's row of the scales (-1: none)
        self.drop_path_blocks = [i for i, rate in enumerate(rates) if rate > 0]
        rows = [self.drop_path_blocks.index(i) if rate > 0 else -1
                for i, rate in enumerate(rates)]
        ends = np.cumsum(layers).tolist()
        stage_rows = [rows[end - n:end] for n, end in zip(layers, ends)]
        self.conv1 = nn.Conv2d(3, 64, kernel_size=7, stride=2, pad_mode="pad", padding=3,
                               has_bias=False,
                               weight_init=HeNormal(mode="fan_out", nonlinearity="relu"))
        self.bn1 = batch_norm(64)
        self.relu = nn.ReLU()
        self.maxpool = BUILT_MAX_POOLS[stem_pool_pad_mode]()
        self.layer1 = self._make_layer(block, 64, stage_rows[0])
        self.layer2 = self._make_layer(block, 128, stage_rows[1], stride=2)
        self.layer3 = self._make_layer(block, 256, stage_rows[2], stride=2)
        self.layer4 = self._make_layer(block, 512, stage_rows[3], stride=2)
        fc_in = 512 * block.expansion
        self.fc = nn.Dense(fc_in, class_num, weight_init=HeUniform(negative_slope=math.sqrt(5)),
                           bias_init=Uniform(1.0 / math.sqrt(fc_in)))
        if self.drop_path_blocks:
            self.drop_path_step = Parameter(Tensor(0, ms.int32), name=DROP_PATH_STEP,
                                            requires_grad=False)
            self.drop_path_scales = DropPathScales([rates[i] for i in self.drop_path_blocks],
                                                   self.drop_path_blocks, drop_path_seed,
                                                   shard_id)

    def _make_layer(self, block, channels, rows, stride=1):
        """A stage of ``len(rows)`` blocks; ``rows``: each block's ``drop_path_index``."""
        downsample = None
        if stride != 1 or self.in_channels != channels * block.expansion:
            downsample = nn.SequentialCell([
                conv1x1(self.in_channels, channels * block.expansion, stride),
                batch_norm(channels * block.expansion),
            ])
        cells = [block(self.in_channels, channels, stride, downsample, self.zero_init_residual,
                       rows[0])]
        self.in_channels = channels * block.expansion
        for row in rows[1:]:
            cells.append(block(self.in_channels, channels,
                               zero_init_residual=self.zero_init_residual, drop_path_index=row))
        return ResidualStage(cells)

    def construct(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        if self.training and self.drop_path_blocks:
            scales = self.drop_path_scales(self.drop_path_step.value(), x.shape[0])
            x = self.layer4(self.layer3(self.layer2(self.layer1(x, scales), scales), scales),
                            scales)
        else:
            x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        x = ops.mean(x, (2, 3))
        return self.fc(x)


def use_exportable_max_pool(net):
    """Give ``net``'s stem the exportable max pool of its ``stem_pool_pad_mode``, in place:
    ``pad``: ``MaxPoolPad1``; ``same``: ``same_max_pool`` (already exportable, kept as is).

    The output is unchanged: the pool follows a ReLU, so zero padding equals torch's -inf
    padding. ``export.export_model`` calls it before every ONNX and AIR export.

    Args:
        net (ResNet): The network; its ``maxpool`` cell is replaced.

    Returns:
        ResNet: ``net``.
    """
    net.maxpool = EXPORTABLE_MAX_POOLS[net.stem_pool_pad_mode]()
    return net


def use_device_max_pool(net, device_target):
    """Give ``net``'s stem the max pool form of its ``stem_pool_pad_mode`` on
    ``device_target`` (``STEM_MAX_POOLS``), in place.

    Call it before ``auto_mixed_precision`` and before compiling (``create_network`` does when
    given ``device_target``). The output after the stem's ReLU is the same in either form.

    Args:
        net (ResNet): The network; its ``maxpool`` cell is replaced.
        device_target (str): ``CPU``, ``GPU`` or ``Ascend``.

    Returns:
        ResNet: ``net``.

    Raises:
        ValueError: If ``device_target`` is not a key of ``STEM_MAX_POOLS`` (lists them).
    """
    forms = STEM_MAX_POOLS[net.stem_pool_pad_mode]
    if device_target not in forms:
        raise ValueError(f"no stem max pool for device_target {device_target!r}; valid: "
                         f"{', '.join(forms)}")
    net.maxpool = forms[device_target]()
    return net


NETWORKS = {
    "resnet18": (BasicBlock, (2, 2, 2, 2)),  # 11,689,512 parameters at 1000 classes
    "resnet34": (BasicBlock, (3, 4, 6, 3)),  # 21,797,672
    "resnet50": (Bottleneck, (3, 4, 6, 3)),  # v1.5: 25,557,032
    "resnet101": (Bottleneck, (3, 4, 23, 3)),  # v1.5: 44,549,160
    "resnet152": (Bottleneck, (3, 8, 36, 3)),  # v1.5: 60,192,808
}
"""``net_name`` -> (block type, blocks in ``layer1`` .. ``layer4``), He et al. 2016, Table 1."""


def create_network(net_name, class_num=1000, zero_init_residual=False, device_target=None,
                   stem_pool_pad_mode="pad", drop_path_rate=0.0, drop_path_seed=0, shard_id=0):
    """Build a ResNet by name.

    Args:
        net_name (str): One of ``NETWORKS``: resnet18, resnet34, resnet50, resnet101, resnet152.
        class_num (int): Number of output classes.
        zero_init_residual (bool): Zero the last BN gamma of every residual block.
        device_target (str, optional): ``CPU``, ``GPU`` or ``Ascend``: the stem max pool form
            that runs natively there (``use_device_max_pool``). None: the built form
            (``BUILT_MAX_POOLS``; for ``pad`` torch's, the CPU and GPU form).
        stem_pool_pad_mode (str): ``pad`` (torchvision's stem max pool) or ``same`` (MindCV's:
            for MindCV checkpoints and networks fine-tuned from them). Default: ``pad``.
        drop_path_rate (float): Stochastic depth in training, [0, 1) (``ResNet``); 0 for
            networks that only infer (evaluation, export: inference mode never drops).
        drop_path_seed (int): Seed of the stochastic depth draws (the run's ``seed``).
        shard_id (int): The data-parallel rank (its draws differ from the other ranks').

    Returns:
        ResNet: the network (``set_train(False)`` for inference; ``Model`` sets the mode).

    Raises:
        KeyError: If ``net_name`` is not a known network; the message lists the valid names.
        ValueError: If ``device_target`` is not None, CPU, GPU or Ascend,
            ``stem_pool_pad_mode`` is not pad or same, or ``drop_path_rate`` not in [0, 1).
    """
    if net_name not in NETWORKS:
        raise KeyError(f"unknown net_name {net_name!r}; valid names: {', '.join(NETWORKS)}")
    block, layers = NETWORKS[net_name]
    net = ResNet(block, list(layers), class_num, zero_init_residual, stem_pool_pad_mode,
                 drop_path_rate, drop_path_seed, shard_id)
    return net if device_target is None else use_device_max_pool(net, device_target)


def last_feature_map_side(image_size):
    """Side in pixels of ResNet's last feature map (``layer4``) for square inputs of
    ``image_size`` pixels: the stem convolution, the max-pool and ``layer2``-``layer4`` each
    halve it, rounding up (stride 2, "same"-like padding)."""
    side = image_size
    for _ in range(5):
        side = -(-side // 2)
    return side
