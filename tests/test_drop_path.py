"""Stochastic depth (``drop_path_rate``) against timm's definition, re-derived here in torch
(timm does not import in the test environment): ``timm/models/resnet.py`` ``make_blocks`` (the
per-block rate ``drop_path_rate * i / (n - 1)``, no DropPath where it is 0, applied to the
residual branch before the shortcut is added) and ``timm/layers/drop.py`` ``drop_path`` (a
Bernoulli(keep_prob) draw per sample, kept samples divided by keep_prob), commit
aa4b5850c1543fa488abf260f18390eda46cf85d. Also: the draws are a function of (seed, rank, step,
sample); inference mode and a rate of 0 add nothing; the training cell advances the counter.
"""
import copy
import math

import mindspore as ms
import mindspore.nn as nn
import numpy as np
import pytest
import torch

from src.models.drop_path import (
    HASH_MODULUS,
    HASH_MULTIPLIERS,
    DropPathScales,
    block_key,
    hash_mix,
)
from src.models.freeze import freeze_batchnorm
from src.models.resnet import BasicBlock, Bottleneck, ResNet, batch_norm, conv1x1, create_network
from src.training.loss import CrossEntropySmooth
from src.training.optimizer import create_optimizer
from src.training.train_step import TrainStep
from src.utils.checkpoint import DROP_PATH_STEP
from tests.alignment_utils import load_torch_weights, max_rel_diff
from tests.torch_resnet import BasicBlock as TorchBasicBlock
from tests.torch_resnet import Bottleneck as TorchBottleneck
from tests.torch_resnet import torch_resnet
from tools.convert_torch_checkpoint import ms_to_torch_names, torch_to_ms_names

BLOCKS = {"resnet18": [2, 2, 2, 2], "resnet50": [3, 4, 6, 3]}


@pytest.fixture
def graph_mode():
    """Compiled, as train.py runs; PyNative (the tests' default) restored after."""
    ms.set_context(mode=ms.GRAPH_MODE)
    yield
    ms.set_context(mode=ms.PYNATIVE_MODE)


def timm_drop_path(x, drop_prob, training, keep=None):
    """timm's ``drop_path`` (scale_by_keep True), written out; ``keep`` (0/1 per sample)
    replaces its ``bernoulli_(keep_prob)`` draw when given."""
    if drop_prob == 0.0 or not training:
        return x
    keep_prob = 1 - drop_prob
    shape = (x.shape[0],) + (1,) * (x.ndim - 1)
    if keep is None:
        random_tensor = x.new_empty(shape).bernoulli_(keep_prob)
    else:
        random_tensor = keep.reshape(shape).to(x.dtype).clone()
    if keep_prob > 0.0:
        random_tensor.div_(keep_prob)
    return x * random_tensor


def timm_block_rates(drop_path_rate, block_repeats):
    """The DropPath rate of each block as timm's ``make_blocks`` builds them (None: no
    DropPath module), in network order."""
    rates = []
    net_num_blocks = sum(block_repeats)
    net_block_idx = 0
    for num_blocks in block_repeats:
        for _ in range(num_blocks):
            block_dpr = drop_path_rate * net_block_idx / (net_num_blocks - 1)
            rates.append(block_dpr if block_dpr > 0.0 else None)
            net_block_idx += 1
    return rates


def our_block_rates(net):
    """The rate each block of ``net`` applies (None: the block has no stochastic depth)."""
    blocks = [cell for _, cell in net.cells_and_names() if isinstance(cell, (BasicBlock,
                                                                              Bottleneck))]
    scales = getattr(net, "drop_path_scales", None)
    return [None if b.drop_path_index < 0 else scales.rates[b.drop_path_index] for b in blocks]


@pytest.mark.parametrize("net_name, rate", [("resnet18", 0.05), ("resnet18", 0.1),
                                            ("resnet18", 0.3), ("resnet50", 0.05),
                                            ("resnet50", 0.3)])
def test_per_block_rates_are_timms(net_name, rate):
    net = create_network(net_name, class_num=10, drop_path_rate=rate)
    assert our_block_rates(net) == timm_block_rates(rate, BLOCKS[net_name])
    assert net.drop_path_scales.blocks == [i for i, r in enumerate(
        timm_block_rates(rate, BLOCKS[net_name])) if r is not None]


def test_scaling_of_kept_samples_is_timms():
    """Our scales, given our draws, equal timm's ``random_tensor`` for the same keep
    decisions, bit for bit: 0 for a dropped sample, 1 / keep_prob (float32) for a kept one."""
    rates = timm_block_rates(0.3, BLOCKS["resnet50"])
    blocks = [i for i, r in enumerate(rates) if r is not None]
    cell = DropPathScales([rates[i] for i in blocks], blocks, seed=5, shard_id=0)
    for step in (0, 1, 2):
        ours = cell(ms.Tensor(step, ms.int32), 64).asnumpy()
        assert ours.shape == (len(blocks), 64, 1, 1, 1)
        for row, block in enumerate(blocks):
            keep = torch.from_numpy((ours[row] > 0).astype(np.float32))
            ones = torch.ones(64, 1, 1, 1)
            timm = timm_drop_path(ones, rates[block], True, keep=keep).numpy()
            np.testing.assert_array_equal(ours[row], timm)
        assert (ours == 0).any() and (ours > 1).any()


def block_pair(kind, seed=0):
    """A downsampling block of the twin (torchvision's layout) with non-trivial BatchNorm, and
    ours (scales row 1) with its weights; BatchNorm on running statistics in both."""
    torch.manual_seed(seed)
    block_type, torch_type, width = {"basic": (BasicBlock, TorchBasicBlock, 32),
                                     "bottleneck": (Bottleneck, TorchBottleneck, 8)}[kind]
    tblock = torch_type(16, width, 2, torch.nn.Sequential(
        torch.nn.Conv2d(16, 32, 1, 2, bias=False), torch.nn.BatchNorm2d(32)))
    with torch.no_grad():
        for m in tblock.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.5, 0.5)
    tblock.eval()
    block = block_type(16, width, 2,
                       downsample=nn.SequentialCell([conv1x1(16, 32, 2), batch_norm(32)]),
                       drop_path_index=1)
    state = tblock.state_dict()
    params = {ms_name: ms.Parameter(ms.Tensor(state[t_name].numpy()), name=ms_name)
              for t_name, ms_name in torch_to_ms_names(list(state)).items()}
    assert ms.load_param_into_net(block, params, strict_load=True)[0] == []
    block.set_train(False)
    return tblock, block


@pytest.mark.parametrize("kind", ["basic", "bottleneck"])
def test_block_output_given_the_same_mask_is_timms(kind):
    """A block with stochastic depth, given one Bernoulli draw, against the twin's block with
    timm's ``drop_path`` on its residual branch (before the shortcut add) given the same draw:
    equal to float32 rounding; a wrong place (after the add, before the last BN) is not."""
    tblock, block = block_pair(kind)
    rate = 0.4
    x = np.random.default_rng(0).standard_normal((6, 16, 8, 8)).astype(np.float32)
    keep = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 1.0])
    tblock.drop_path = lambda out: timm_drop_path(out, rate, True, keep=keep)
    with torch.no_grad():
        ref = tblock(torch.from_numpy(x)).numpy()
        tblock.drop_path = None
        undropped = tblock(torch.from_numpy(x)).numpy()
    scales = np.zeros((2, 6, 1, 1, 1), np.float32)
    scales[1] = (keep / np.float32(1 - rate)).numpy().reshape(6, 1, 1, 1)
    ours = block(ms.Tensor(x), ms.Tensor(scales)).asnumpy()
    assert max_rel_diff(ours, ref) < 1e-5
    assert max_rel_diff(ours, undropped) > 0.05  # the draw matters
    assert max_rel_diff(block(ms.Tensor(x)).asnumpy(), undropped) < 1e-5  # None: no drop


def numpy_scales(rates, blocks, seed, shard_id, step, batch):
    """``DropPathScales`` recomputed with numpy (Python-int keys, int64 arithmetic)."""
    keys = np.array([[block_key(seed, shard_id, b)] for b in blocks], np.int64)
    draws = hash_mix(hash_mix(keys, np.int64(step)), np.arange(batch, dtype=np.int64)[None])
    keep = 1.0 - np.array(rates, np.float64).reshape(-1, 1)
    kept = draws < np.round(keep * (2 ** 31 - 1)).astype(np.int64)
    return kept.astype(np.float32) / keep.astype(np.float32)


def test_draws_are_a_function_of_seed_rank_step_and_sample(graph_mode):
    """In a compiled graph the scales are the hash computed with numpy (int32 arithmetic
    without overflow gives the same bits), for steps up to the int32 range; another rank,
    seed or step draws otherwise, the same ones again alike."""
    rates, blocks = [0.2, 0.5], [1, 7]
    cell = DropPathScales(rates, blocks, seed=2 ** 32 - 1, shard_id=3)
    for step in (0, 1, 12345, 2 ** 31 - 2):
        got = cell(ms.Tensor(step, ms.int32), 32).asnumpy().reshape(2, 32)
        np.testing.assert_array_equal(got, numpy_scales(rates, blocks, 2 ** 32 - 1, 3, step, 32))
    draw = lambda seed, rank, step: numpy_scales(rates, blocks, seed, rank, step, 256)  # noqa
    assert np.array_equal(draw(1, 0, 5), draw(1, 0, 5))
    for other in (draw(1, 1, 5), draw(2, 0, 5), draw(1 + 2 ** 16, 0, 5), draw(1, 0, 6)):
        assert not np.array_equal(draw(1, 0, 5), other)


def test_drop_frequency_is_the_rate_and_draws_are_independent():
    """Over 2,000 steps of 64 samples each block drops with its rate (within 5 standard
    errors of the binomial); drops of two blocks, of neighbouring samples, of consecutive
    steps and of two ranks are uncorrelated (|r| < 5 / sqrt(n)). Schrage's condition holds
    for every multiplier (no product reaches 2**31)."""
    for a in HASH_MULTIPLIERS:
        assert HASH_MODULUS % a < HASH_MODULUS // a and a * (HASH_MODULUS // a) < 2 ** 31
    rates = timm_block_rates(0.5, BLOCKS["resnet18"])
    blocks = [i for i, r in enumerate(rates) if r is not None]
    steps, batch = 2000, 64
    dropped = np.stack([numpy_scales([rates[b] for b in blocks], blocks, 0, 0, s, batch) == 0
                        for s in range(steps)])  # (steps, blocks, batch)
    n = steps * batch
    for row, block in enumerate(blocks):
        p = rates[block]
        assert abs(dropped[:, row].mean() - p) < 5 * math.sqrt(p * (1 - p) / n), block
    other_rank = np.stack([numpy_scales([rates[b] for b in blocks], blocks, 0, 1, s, batch) == 0
                           for s in range(steps)])
    last = dropped[:, -1].astype(np.float64)
    pairs = {"blocks": (dropped[:, -2], last), "samples": (last[:, :-1], last[:, 1:]),
             "samples 2 apart": (last[:, :-2], last[:, 2:]), "steps": (last[:-1], last[1:]),
             "ranks": (other_rank[:, -1], last)}
    for what, (a, b) in pairs.items():
        r = np.corrcoef(np.ravel(a).astype(np.float64), np.ravel(b))[0, 1]
        assert abs(r) < 5 / math.sqrt(a.size), (what, r)


def same_weights(rate, net_name="resnet18", class_num=10):
    """Networks with and without stochastic depth holding the same weights."""
    ms.set_seed(1)
    with_dp = create_network(net_name, class_num=class_num, drop_path_rate=rate)
    plain = create_network(net_name, class_num=class_num)
    params = {p.name: p for p in with_dp.get_parameters() if p.name != DROP_PATH_STEP}
    assert ms.load_param_into_net(plain, params, strict_load=True)[0] == []
    return with_dp, plain


def test_zero_rate_adds_nothing_and_inference_never_drops(graph_mode):
    with_dp, plain = same_weights(0.5)
    zero = create_network("resnet18", class_num=10, drop_path_rate=0.0)
    assert [p.name for p in zero.get_parameters()] == [p.name for p in plain.get_parameters()]
    assert not hasattr(zero, "drop_path_scales") and not hasattr(zero, "drop_path_step")
    assert [p.name for p in with_dp.get_parameters()] == [DROP_PATH_STEP] + [
        p.name for p in plain.get_parameters()]
    x = ms.Tensor(np.random.default_rng(0).standard_normal((8, 3, 32, 32)).astype(np.float32))
    with_dp.set_train(False)
    plain.set_train(False)
    np.testing.assert_array_equal(with_dp(x).asnumpy(), plain(x).asnumpy())
    ms.set_context(mode=ms.PYNATIVE_MODE)  # the control, uncompiled: training mode drops
    with_dp.set_train(True)
    plain.set_train(True)
    assert max_rel_diff(with_dp(x).asnumpy(), plain(x).asnumpy()) > 1e-3


@pytest.mark.slow
def test_training_cell_advances_the_counter_after_each_call(graph_mode):
    """Call n of the training cell (micro-batches counted, with accumulation too) draws with
    counter n: its loss is the network's loss with ``drop_path_step`` set to n (BatchNorm
    frozen and LR 0, so nothing else changes between calls). The network is a ResNet of one
    BasicBlock per stage (3 of its 4 blocks drop), its loss with counter n computed in
    PyNative mode: the two training cells are the compiled graphs under test."""
    net = ResNet(BasicBlock, [1, 1, 1, 1], class_num=10, drop_path_rate=0.9, drop_path_seed=4)
    assert net.drop_path_blocks == [1, 2, 3]
    freeze_batchnorm(net)
    rng = np.random.default_rng(0)
    x = ms.Tensor(rng.standard_normal((8, 3, 32, 32)).astype(np.float32))
    y = ms.Tensor(rng.integers(0, 10, 8).astype(np.int32))
    probe = nn.WithLossCell(net, CrossEntropySmooth(0.0, 10))
    probe.set_train()
    drawn = []  # the network's loss with the counter set to n (LR 0: the weights stay)
    ms.set_context(mode=ms.PYNATIVE_MODE)
    for n in range(4):
        net.drop_path_step.set_data(ms.Tensor(n, ms.int32))
        drawn.append(float(probe(x, y).asnumpy()))
    ms.set_context(mode=ms.GRAPH_MODE)
    for accumulation in (1, 2):
        net.drop_path_step.set_data(ms.Tensor(0, ms.int32))
        step = TrainStep(nn.WithLossCell(net, CrossEntropySmooth(0.0, 10)),
                         create_optimizer(net, 0.0, 0.9, 0.0), accumulation_steps=accumulation)
        step.set_train()
        losses = [float(step(x, y).asnumpy()) for _ in range(4)]
        assert int(net.drop_path_step.asnumpy()) == 4
        expected = list(drawn)
        if accumulation == 2:  # the stepping call returns the mean of the two micro-batches
            expected[1] = (expected[0] + expected[1]) / 2
            expected[3] = (expected[2] + expected[3]) / 2
        np.testing.assert_allclose(losses, expected, rtol=1e-6)
        assert len(set(np.round(losses, 5))) > 1  # the draws change between calls


def test_loading_weights_leaves_the_counter_alone(tmp_path):
    """Weights load into a network with or without stochastic depth whatever the file holds:
    the counter is training state (not loaded, not required; a resumed run restores it)."""
    from src.utils.checkpoint import load_into_network
    with_dp, plain = same_weights(0.2)
    with_dp.drop_path_step.set_data(ms.Tensor(7, ms.int32))
    ms.save_checkpoint(with_dp, str(tmp_path / "dp.ckpt"))
    ms.save_checkpoint(plain, str(tmp_path / "plain.ckpt"))
    load_into_network(plain, str(tmp_path / "dp.ckpt"))
    fresh = create_network("resnet18", class_num=10, drop_path_rate=0.2)
    load_into_network(fresh, str(tmp_path / "plain.ckpt"))
    load_into_network(fresh, str(tmp_path / "dp.ckpt"))
    assert int(fresh.drop_path_step.asnumpy()) == 0
    np.testing.assert_array_equal(fresh.fc.weight.asnumpy(), with_dp.fc.weight.asnumpy())


# ---- slow: a training step against torch, exported graphs ----

class FixedScales(nn.Cell):
    """Stands in for ``DropPathScales``: always the given scales (a test's chosen draw)."""

    def __init__(self, scales):
        super().__init__()
        self.scales = ms.Tensor(scales)

    def construct(self, step, batch_size):
        return self.scales


@pytest.mark.slow
def test_training_step_with_drop_path_equals_torch(graph_mode):
    """One SGD step of ResNet-18 with stochastic depth 0.5 (frozen BatchNorm: no batch
    coupling, so float32 rounding is all that differs), the same draw injected in both: loss,
    every gradient and every updated weight equal timm's rule in torch (float64) to 1e-4.
    Negative control: torch with another draw differs from ours by far more."""
    rate, batch = 0.5, 6
    rng = np.random.default_rng(3)
    images = rng.standard_normal((batch, 3, 32, 32)).astype(np.float32)
    labels = rng.integers(0, 10, batch).astype(np.int32)
    torch.manual_seed(3)
    tnet = torch_resnet("resnet18", 10)
    net = create_network("resnet18", class_num=10, drop_path_rate=rate)
    load_torch_weights(net, tnet)
    rates = timm_block_rates(rate, BLOCKS["resnet18"])
    blocks = [i for i, r in enumerate(rates) if r is not None]
    keep = rng.random((len(blocks), batch)) >= np.array([rates[b] for b in blocks])[:, None]
    keep[:, 0] = True  # at least one sample kept and one dropped per block
    keep[:, 1] = False
    net.drop_path_scales = FixedScales((keep / np.array(
        [1 - rates[b] for b in blocks], np.float32)[:, None]).astype(np.float32).reshape(
            len(blocks), batch, 1, 1, 1))
    freeze_batchnorm(net)
    step = TrainStep(nn.WithLossCell(net, CrossEntropySmooth(0.1, 10)),
                     create_optimizer(net, 0.1, 0.9, 1e-4))
    step.set_train()
    to_torch = ms_to_torch_names([p.name for p in net.trainable_params()])
    initial = {k: v.detach().double().numpy().copy() for k, v in tnet.state_dict().items()}
    loss = float(step(ms.Tensor(images), ms.Tensor(labels)).asnumpy())
    ours = {to_torch[p.name]: p.asnumpy() - initial[to_torch[p.name]]
            for p in net.trainable_params()}

    def torch_step(draw):
        """One step of the twin in float64 with timm's drop_path given ``draw``; returns
        (loss, the update of every trained tensor)."""
        model = copy.deepcopy(tnet).double()
        model.train()
        tblocks = [m for m in model.modules() if isinstance(m, (TorchBasicBlock,
                                                                 TorchBottleneck))]
        for row, block in enumerate(blocks):
            keep_row = torch.from_numpy(draw[row].astype(np.float64))
            tblocks[block].drop_path = (lambda r, k: lambda out: timm_drop_path(
                out, r, True, keep=k))(rates[block], keep_row)
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.eval()  # frozen BatchNorm, as ours
        decay = [p for n, p in model.named_parameters() if n.endswith("weight") and p.dim() > 1]
        rest = [p for n, p in model.named_parameters()
                if not (n.endswith("weight") and p.dim() > 1)]
        opt = torch.optim.SGD([{"params": decay, "weight_decay": 1e-4},
                               {"params": rest, "weight_decay": 0.0}], lr=0.1, momentum=0.9)
        t_loss = torch.nn.CrossEntropyLoss(label_smoothing=0.1)(
            model(torch.from_numpy(images).double()), torch.from_numpy(labels).long())
        opt.zero_grad()
        t_loss.backward()
        opt.step()
        state = model.state_dict()
        return t_loss.item(), {k: state[k].numpy() - initial[k] for k in ours}

    def rel_l2(a, b):
        return math.sqrt(sum(float(((a[k] - b[k]) ** 2).sum()) for k in b)
                         / sum(float((b[k] ** 2).sum()) for k in b))

    t_loss, t_update = torch_step(keep)
    o_loss, o_update = torch_step(np.ones_like(keep))
    diff, control = rel_l2(ours, t_update), rel_l2(ours, o_update)
    print(f"\n[drop path] resnet18 one SGD step, rate {rate}, frozen BN: loss {loss:.7f} vs "
          f"torch float64 {t_loss:.7f} (nothing dropped: {o_loss:.7f}); {len(ours)} updates "
          f"rel L2 {diff:.2e} (against nothing dropped: {control:.2e})")
    assert loss == pytest.approx(t_loss, rel=1e-5)
    assert diff < 1e-4
    assert control > 100 * diff and abs(o_loss - t_loss) > 100 * abs(loss - t_loss)


@pytest.mark.slow
def test_exported_graphs_are_equal_with_and_without_drop_path(tmp_path, graph_mode):
    """The ONNX and MindIR exports of a network built with drop_path_rate 0.1 equal those of
    the same weights built without it: node for node, initializer for initializer."""
    import onnx

    from src.deploy.formats import export_model
    with_dp, plain = same_weights(0.1)
    dummy = ms.Tensor(np.zeros((1, 3, 32, 32), np.float32))
    files = {}
    for name, net in (("dp", with_dp), ("plain", plain)):
        net.set_train(False)
        for fmt, suffix in (("ONNX", ".onnx"), ("MINDIR", ".mindir")):
            export_model(net, dummy, str(tmp_path / name), fmt)
            files[name, fmt] = str(tmp_path / name) + suffix
    a, b = onnx.load(files["dp", "ONNX"]), onnx.load(files["plain", "ONNX"])
    assert [n.op_type for n in a.graph.node] == [n.op_type for n in b.graph.node]
    assert a.graph.node == b.graph.node
    assert {i.name: i.raw_data for i in a.graph.initializer} == {
        i.name: i.raw_data for i in b.graph.initializer}
    assert not any("drop" in i.name for i in a.graph.initializer)
    graphs = [ms.load(files[name, "MINDIR"]) for name in ("dp", "plain")]
    x = ms.Tensor(np.random.default_rng(0).standard_normal((1, 3, 32, 32)).astype(np.float32))
    outputs = [nn.GraphCell(g)(x).asnumpy() for g in graphs]
    np.testing.assert_array_equal(outputs[0], outputs[1])
    protos = [mindir_graph(files[name, "MINDIR"]) for name in ("dp", "plain")]
    assert protos[0] == protos[1]
    assert not any("drop_path" in name for name in protos[0][1])


def mindir_graph(path):
    """(operator types in order, parameter names) of a MindIR file's graph; names without
    the graph's own prefix (``<id>_..._construct_<n>:``), which differs between exports."""
    from mindspore.train import mind_ir_pb2
    model = mind_ir_pb2.ModelProto()
    with open(path, "rb") as f:
        model.ParseFromString(f.read())
    return ([node.op_type for node in model.graph.node],
            sorted(p.name.split(":", 1)[-1] for p in model.graph.parameter))
