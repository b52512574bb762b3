"""TrainStep against its definitions: bit-identical to MindSpore's own training cell with no
option on; EMA equal to the formula; accumulation equal to one step on the whole batch;
clipping to the threshold."""
import mindspore as ms
import mindspore.nn as nn
import mindspore.ops as ops
import numpy as np
import pytest

from src.training.train_step import EMA_COUNTER, TrainStep, WeightEma, clip_by_global_norm
from src.utils.checkpoint import OVERFLOW_COUNTER


class Small(nn.Cell):
    """Conv + BN + dense: every kind of parameter ResNet has, small enough for many steps."""

    def __init__(self, use_batch_statistics=None):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, pad_mode="pad", padding=1, has_bias=False)
        self.bn = nn.BatchNorm2d(4, use_batch_statistics=use_batch_statistics)
        self.fc = nn.Dense(4 * 8 * 8, 5)

    def construct(self, x):
        y = ops.relu(self.bn(self.conv(x)))
        return self.fc(y.reshape(y.shape[0], -1))


@pytest.fixture(autouse=True)
def graph_mode():
    """Compiled, as train.py runs the step; PyNative (the tests' default) restored after."""
    ms.set_context(mode=ms.GRAPH_MODE)
    yield
    ms.set_context(mode=ms.PYNATIVE_MODE)


def make(seed=0, use_batch_statistics=None):
    ms.set_seed(seed)
    net = Small(use_batch_statistics)
    opt = nn.Momentum(net.trainable_params(), learning_rate=0.1, momentum=0.9)
    return net, opt, nn.WithLossCell(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True,
                                                                            reduction="mean"))


def batches(n, batch=8, seed=1):
    rng = np.random.default_rng(seed)
    return [(ms.Tensor(rng.standard_normal((batch, 3, 8, 8)).astype(np.float32)),
             ms.Tensor(rng.integers(0, 5, batch).astype(np.int32))) for _ in range(n)]


def params(net):
    return {p.name: p.asnumpy().copy() for p in net.get_parameters()}


def test_no_option_is_bit_identical_to_mindspore_train_cell():
    data = batches(4)
    net_a, opt_a, loss_a = make()
    ours = TrainStep(loss_a, opt_a)
    net_b, opt_b, loss_b = make()
    theirs = nn.TrainOneStepCell(loss_b, opt_b)
    for step in (ours, theirs):
        step.set_train()
    for image, label in data:
        assert ours(image, label).asnumpy() == theirs(image, label).asnumpy()
    a, b = params(net_a), params(net_b)
    assert a.keys() == b.keys()
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)


@pytest.mark.parametrize("warmup", [False, True])
def test_ema_equals_the_formula_over_steps(warmup):
    decay = 0.9
    net, opt, with_loss = make()
    ema = WeightEma(net, decay, warmup)
    step = TrainStep(with_loss, opt, ema=ema)
    step.set_train()
    expected = None
    for n, (image, label) in enumerate(batches(5)):
        step(image, label)
        weights = params(net)
        if warmup:
            d = 0.0 if n == 0 else min(decay, 1.0 - (1.0 + n) ** (-2.0 / 3.0))
        else:
            d = 0.0 if n == 0 else decay
        expected = {k: v.copy() for k, v in weights.items()} if expected is None else {
            k: d * expected[k] + (1.0 - d) * weights[k] for k in weights}
    averages = {p.name: p.asnumpy() for p in ema.averages}
    assert sorted(averages) == sorted("ema." + k for k in expected)  # weights and BN stats
    for name, value in expected.items():
        np.testing.assert_allclose(averages["ema." + name], value, rtol=1e-5, atol=1e-7,
                                   err_msg=name)
    assert float(ema.updates.asnumpy()) == 5
    assert any(not np.allclose(averages["ema." + k], v) for k, v in params(net).items())


def test_ema_and_overflow_parameters_are_named_for_checkpoints():
    net, opt, with_loss = make()
    step = TrainStep(with_loss, opt, ema=WeightEma(net, 0.99))
    names = {p.name for p in step.get_parameters()}
    assert "ema.conv.weight" in names and "ema.bn.moving_mean" in names and EMA_COUNTER in names
    assert OVERFLOW_COUNTER in names and not step.overflow_count.requires_grad


def accumulated(step, image, label, k):
    """Feed ``image``/``label`` to ``step`` as k micro-batches, one call each (as ``Model``
    feeds them); returns the outputs of every call."""
    size = image.shape[0] // k
    return [step(image[i * size:(i + 1) * size], label[i * size:(i + 1) * size])
            for i in range(k)]


def test_accumulation_equals_one_step_on_the_whole_batch():
    """With BatchNorm in inference mode (frozen statistics) k calls on micro-batches of B/k
    give the step of one batch of B: the mean of micro-batch means is the batch mean. The
    optimizer steps on every k-th call only and the buffers are zero again after it; two
    optimizer steps in a row (the second starts from cleared buffers)."""
    data = batches(2, batch=12)
    net_1, opt_1, with_loss_1 = make(use_batch_statistics=False)
    whole = TrainStep(with_loss_1, opt_1).set_train()
    net_3, opt_3, with_loss_3 = make(use_batch_statistics=False)
    step = TrainStep(with_loss_3, opt_3, accumulation_steps=3).set_train()
    for n, (image, label) in enumerate(data):
        loss_1 = whole(image, label).asnumpy()
        before = params(net_3)
        for i in range(3):
            loss_3 = step(image[i * 4:(i + 1) * 4], label[i * 4:(i + 1) * 4]).asnumpy()
            moved = any(not np.array_equal(v, before[k]) for k, v in params(net_3).items())
            assert moved == (i == 2), f"step {n + 1}, call {i + 1} of 3: weights moved {moved}"
            assert int(opt_3.global_step.asnumpy()) == n + (i == 2)
        np.testing.assert_allclose(loss_3, loss_1, rtol=1e-6)
        p_1, p_3 = params(net_1), params(net_3)
        for name in p_1:
            np.testing.assert_allclose(p_3[name], p_1[name], rtol=1e-6, atol=1e-7,
                                       err_msg=f"step {n + 1}: {name}")
        assert int(step.grad_accum_step.asnumpy()) == 0
        assert float(step.grad_accum_loss.asnumpy()) == 0
        assert all(not p.asnumpy().any() for p in step.grad_accum)


def test_accumulation_differs_from_single_micro_batch():
    """The accumulated step is not just the last micro-batch's step (guards the sum)."""
    image, label = batches(1, batch=12)[0]
    net_a, opt_a, loss_a = make(use_batch_statistics=False)
    accumulated(TrainStep(loss_a, opt_a, accumulation_steps=3).set_train(), image, label, 3)
    net_b, opt_b, loss_b = make(use_batch_statistics=False)
    TrainStep(loss_b, opt_b).set_train()(image[8:], label[8:])
    assert not np.allclose(params(net_a)["fc.weight"], params(net_b)["fc.weight"])


def test_clip_leaves_global_norm_at_threshold():
    rng = np.random.default_rng(0)
    grads = tuple(ms.Tensor(rng.standard_normal(s).astype(np.float32)) for s in [(3, 4), (7,)])
    norm = np.sqrt(sum((g.asnumpy() ** 2).sum() for g in grads))
    clipped = clip_by_global_norm(grads, 0.5)
    new_norm = np.sqrt(sum((g.asnumpy() ** 2).sum() for g in clipped))
    assert norm > 1.0 and new_norm == pytest.approx(0.5, rel=1e-6)
    np.testing.assert_allclose(clipped[0].asnumpy(), grads[0].asnumpy() * 0.5 / norm, rtol=1e-6)
    unchanged = clip_by_global_norm(grads, 2 * norm)
    for g, c in zip(grads, unchanged):
        np.testing.assert_array_equal(g.asnumpy(), c.asnumpy())


def test_clipped_step_moves_weights_by_lr_times_threshold():
    """Plain SGD (no momentum) with clipping to c moves the weights by exactly lr * c in
    global norm when the gradient norm exceeds c."""
    ms.set_seed(0)
    net = Small(use_batch_statistics=False)
    opt = nn.SGD(net.trainable_params(), learning_rate=0.1)
    with_loss = nn.WithLossCell(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True,
                                                                      reduction="sum"))
    step = TrainStep(with_loss, opt, grad_clip_norm=0.01)
    step.set_train()
    before = {p.name: p.asnumpy().copy() for p in net.trainable_params()}
    step(*batches(1)[0])
    moved = np.sqrt(sum(((p.asnumpy() - before[p.name]) ** 2).sum()
                        for p in net.trainable_params()))
    assert moved == pytest.approx(0.1 * 0.01, rel=1e-4)


def test_bad_arguments():
    net, opt, with_loss = make()
    with pytest.raises(ValueError, match="grad_accumulation_steps"):
        TrainStep(with_loss, opt, accumulation_steps=0)
    with pytest.raises(ValueError, match="grad_clip_norm"):
        TrainStep(with_loss, opt, grad_clip_norm=-1.0)
    with pytest.raises(ValueError, match="ema_decay"):
        WeightEma(net, 1.0)


@pytest.mark.parametrize("amp_level", ["O0", "O2"])
def test_ema_evaluation_is_measured_as_the_live_network(amp_level):
    """train.py's evaluation of the EMA weights uses the training Model's evaluation cell:
    under O2 both cast the logits to float32 before loss and metrics."""
    from src.models.resnet import create_network
    from src.recipe import build_evaluator, training_model
    from src.utils.config import parse_config
    cfg = parse_config(["--net_name", "resnet18", "--class_num", "10", "--ema_decay", "0.99"])
    net = create_network("resnet18", class_num=10)
    live, ema = training_model(cfg, net, 0.1, amp_level)
    evaluator = build_evaluator(cfg, model=live, net=net, ema=ema, shard=None,
                                amp_level=amp_level)
    for model in (live, evaluator.ema_model):
        assert isinstance(model._eval_network, nn.WithEvalCell)
        assert model._eval_network.add_cast_fp32 == (amp_level == "O2")
        assert sorted(model._metric_fns) == ["top1", "top5"]


@pytest.mark.parametrize("k", [1, 2])
def test_an_fp32_step_compiles_without_the_eliminated_side_effect_warning(capfd, k):
    """With no overflow check (fp32, CPU) the step builds no overflow flag: MindSpore's
    compiler warned "Some side effect nodes were eliminated by mistake ... overflow" at every
    fp32 start while an unused flag was built."""
    net, opt, loss = make()
    step = TrainStep(loss, opt, accumulation_steps=k)
    step.set_train()
    for image, label in batches(k):
        step(image, label)
    assert "side effect nodes were eliminated" not in capfd.readouterr().err
