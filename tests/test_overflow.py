"""Overflowed steps: ``TrainStep`` skips them (weights, optimizer state, EMA and step
untouched, the loss scale divided) and counts them on the device; ``StepState`` counts them in
steps, also when one dataset-sink call covers a whole epoch, and stops a run that has stopped
training; clipping comes after unscaling.

MindSpore 2.10's overflow check (``TrainOneStepWithLossScaleCell.get_overflow_status``) has
no CPU kernel on its GPU and Ascend 910A paths. Its Ascend 910B path with AllFinite off (as
under an HCCL rank table: ``RANK_TABLE_FILE`` set) checks the gradients with ``IsFinite``,
which runs on CPU: ``force_ascend_910b_check`` selects it on a ``TrainStep`` before its graph
is compiled, so the compiled overflow branch runs here as it does on a 910B.
"""
import mindspore as ms
import mindspore.nn as nn
import numpy as np
import pytest
from mindspore.train import RunContext

from src.training.callbacks import StepState
from src.training.optimizer import create_optimizer
from src.training.resume import NOT_REQUIRED, restore_training_state
from src.training.train_step import TrainStep, WeightEma
from src.utils.checkpoint import (
    OVERFLOW_COUNTER,
    TRAINING_STATE_PREFIXES,
    atomic_save_checkpoint,
    load_into_network,
)
from tests.test_train_step import Small, graph_mode  # noqa: F401  (graph_mode: autouse)

CLASSES = 5  # Small's outputs
SCALE, SCALE_FACTOR = 1024.0, 2.0


def force_ascend_910b_check(step):
    """Select MindSpore's Ascend 910B overflow check with AllFinite off (``IsFinite`` per
    gradient), as ``TrainOneStepWithLossScaleCell.__init__`` sets these flags on a 910B under
    an HCCL rank table. Call before the first step: the graph reads them when compiled."""
    for flag in ("gpu_target", "ascend_910b_target", "enable_allfinite",
                 "_ascend_check_overflow_mode"):
        assert hasattr(step, flag), f"MindSpore's loss-scale cell has no {flag} any more"
    step.gpu_target, step.ascend_910b_target, step.enable_allfinite = False, True, False
    step._ascend_check_overflow_mode = None  # INFNAN_MODE, not SATURATION_MODE
    return step


def dynamic_step(seed=0, clip=1.0, accumulation=2, optimizer="momentum"):
    """TrainStep with a dynamic loss scale (1024, factor 2), the 910B overflow check,
    accumulation, clipping, Momentum (or ``optimizer`` "lars": LARS with weight decay, its
    BN and bias left out) and a weight EMA; soft targets (an inf can be put in a label without
    touching the forward pass)."""
    ms.set_seed(seed)
    net = Small()
    if optimizer == "momentum":
        opt = nn.Momentum(net.trainable_params(), learning_rate=0.1, momentum=0.9)
    else:
        opt = create_optimizer(net, 0.1, optimizer=optimizer, momentum=0.9, weight_decay=1e-3,
                               trust_coeff=0.02)
    with_loss = nn.WithLossCell(net, nn.SoftmaxCrossEntropyWithLogits(sparse=False,
                                                                      reduction="mean"))
    step = TrainStep(with_loss, opt,
                     scale_sense=nn.DynamicLossScaleUpdateCell(SCALE, SCALE_FACTOR, 1000),
                     check_overflow=True, grad_clip_norm=clip, accumulation_steps=accumulation,
                     ema=WeightEma(net, 0.9))
    force_ascend_910b_check(step)
    step.set_train()
    return step


def feed(step, data, k=2):
    """One optimizer step of ``step`` (accumulation ``k``) on ``data``: its k micro-batches,
    one call each, as ``Model`` feeds them; returns the last call's outputs."""
    images, targets = data
    size = images.shape[0] // k
    for i in range(k):
        outputs = step(images[i * size:(i + 1) * size], targets[i * size:(i + 1) * size])
    return outputs


def batch(seed, size=8, inf_row=None):
    """(image, one-hot soft target); ``inf_row``: that row's target is inf (an overflow in the
    backward pass only: the BatchNorm statistics of the forward stay finite)."""
    rng = np.random.default_rng(seed)
    target = np.eye(CLASSES, dtype=np.float32)[rng.integers(0, CLASSES, size)]
    if inf_row is not None:
        target[inf_row, 0] = np.inf
    return (ms.Tensor(rng.standard_normal((size, 3, 8, 8)).astype(np.float32)),
            ms.Tensor(target))


def state_of(step):
    return {p.name: p.asnumpy().copy() for p in step.get_parameters()}


def bn_statistics(name):
    """BatchNorm moving statistics (and their averages): updated by every forward pass, the
    skipped step's too (as in MindSpore's own loss-scale cell and torch's GradScaler)."""
    return "moving_" in name


@pytest.mark.parametrize("optimizer", ["momentum", "lars"])
def test_an_overflowed_step_changes_nothing_and_the_next_step_trains(optimizer):
    """GRAPH mode, 2 accumulated micro-batches, clipping, EMA, dynamic scale: an inf in the
    second micro-batch skips the step (weights, momentum buffers, step unchanged). Then the
    run continues exactly as a run that never saw that batch."""
    good_1, good_2 = batch(1), batch(3)
    step = dynamic_step(optimizer=optimizer)
    feed(step, good_1)
    before = state_of(step)
    loss, overflow, scale = feed(step, batch(2, inf_row=6))
    after = state_of(step)
    assert bool(overflow.asnumpy()) and not np.isfinite(loss.asnumpy())
    changed = {n for n in before if not np.array_equal(before[n], after[n], equal_nan=True)}
    assert changed == {"bn.moving_mean", "bn.moving_variance", "scale_sense",
                       "current_iterator_step", "last_overflow_iterator_step", OVERFLOW_COUNTER}
    assert after["scale_sense"].item() == scale.asnumpy().item() == SCALE / SCALE_FACTOR
    assert after[OVERFLOW_COUNTER].item() == 1
    assert after["global_step"].item() == 1 and after["ema_updates"].item() == 1

    _, overflow, scale = feed(step, good_2)
    assert not bool(overflow.asnumpy()) and float(scale.asnumpy()) == SCALE / SCALE_FACTOR
    trained = state_of(step)
    assert trained[OVERFLOW_COUNTER].item() == 1 and trained["global_step"].item() == 2
    reference = dynamic_step(optimizer=optimizer)
    for data in (good_1, good_2):
        feed(reference, data)
    expected = state_of(reference)
    buffers = {"momentum": "moments.", "lars": "lars_m."}[optimizer]
    compared = [n for n in expected if n.startswith(("conv.", "bn.", "fc.", buffers, "ema.",
                                                     "global_step", "ema_updates"))
                and not bn_statistics(n)]
    assert len(compared) > 10 and buffers + "fc.weight" in compared
    for name in compared:
        np.testing.assert_allclose(trained[name], expected[name], rtol=1e-6, atol=1e-7,
                                   err_msg=name)
    assert not np.allclose(trained["fc.weight"], after["fc.weight"])  # it did train


class Params(dict):
    """Stands in for ``RunContext.original_args()`` (``Model``'s callback parameters)."""
    __getattr__ = dict.__getitem__


def outputs(overflow, scale=SCALE, loss=2.0):
    """A loss-scale training cell's outputs: (loss, overflow flag, scale) of the last step."""
    return (ms.Tensor(np.float32(np.inf if overflow else loss)), ms.Tensor(overflow),
            ms.Tensor(np.float32(scale)))


def test_step_state_counts_a_real_cells_overflowed_steps_within_a_call():
    """Three compiled steps in one callback call (a sink call of 3 steps): two overflowed,
    the last did not. The call's flag says "ok"; the device counter says 2."""
    step = dynamic_step()
    state = StepState(accumulation_steps=2)
    cb = Params(net_outputs=None, train_network=step)
    context = RunContext(cb)
    state.on_train_begin(context)
    state.set_call_size(6)  # 3 optimizer steps of 2 micro-batches
    for data in (batch(2, inf_row=1), batch(4, inf_row=7), batch(1)):
        cb["net_outputs"] = feed(step, data)
    state.on_train_step_end(context)
    assert state.status == "ok" and state.overflow_steps == 2 and state.global_step == 3
    assert state.loss_scale == SCALE / SCALE_FACTOR ** 2


class CounterCell(nn.Cell):
    """A training cell's ``overflow_count`` alone, set by hand (the device counter of a sink
    call of ``steps_per_call`` steps, no ``Model`` needed)."""

    def __init__(self, value=0):
        super().__init__()
        self.overflow_count = ms.Parameter(ms.Tensor(value, ms.int32), name=OVERFLOW_COUNTER,
                                           requires_grad=False)

    def add(self, overflowed):
        self.overflow_count.set_data(ms.Tensor(int(self.overflow_count.asnumpy()) + overflowed,
                                               ms.int32))


def run_calls(state, calls, steps_per_call, cell=None):
    """Feed ``state`` one callback call per item of ``calls`` (overflowed steps of the call,
    or with ``cell`` None the flag of a step-by-step run); returns the global steps after
    which a stop was requested."""
    cb = Params(net_outputs=None, cur_epoch_num=1)
    if cell is not None:
        cb["train_network"] = cell
    context = RunContext(cb)
    state.on_train_begin(context)
    state.set_call_size(steps_per_call)
    stops = []
    for overflowed in calls:
        if cell is not None:
            cell.add(overflowed)
        cb["net_outputs"] = outputs(bool(overflowed) and steps_per_call == 1)
        state.on_train_step_end(context)
        if context.get_stop_requested():
            stops.append(state.global_step)
    return stops


@pytest.mark.parametrize("overflowed, stops", [(312, False), (313, True)])
def test_a_625_step_sink_call_stops_when_more_than_the_fraction_of_its_steps_overflowed(
        overflowed, stops):
    """One call covers an epoch of 625 steps: its overflowed steps are counted (not 1 per
    call) and the stop comes at the end of that call, not after 100 calls. The last step's
    flag is False: the call's outcome comes from the counter alone."""
    state = StepState(max_overflow_fraction=0.5)
    stopped = run_calls(state, [overflowed], 625, CounterCell())
    assert state.overflow_steps == overflowed and state.global_step == 625
    assert stopped == ([625] if stops else []) and state.must_stop == stops
    if stops:
        assert "313 of the last 625 steps overflowed" in state.overflow_stop


def test_a_resumed_run_does_not_count_the_restored_overflows_again():
    state = StepState(start_step=1250, max_overflow_fraction=0.5)
    cell = CounterCell(value=4000)  # restored from the checkpoint with the training state
    assert run_calls(state, [10], 625, cell) == []
    assert state.overflow_steps == 10 and state.global_step == 1875
    assert run_calls(state, [0, 5], 625, cell) == []  # a second Model.train reads it again
    assert state.overflow_steps == 15


def test_step_by_step_the_counter_agrees_with_the_flags_and_the_last_100_steps():
    """One step per call: the counter, the flags alone (a cell without the counter) and a
    plain count over the last 100 steps stop at the same step with the same count."""
    rng = np.random.default_rng(0)
    flags = list(rng.random(400) < np.where(np.arange(400) < 200, 0.35, 0.6))
    expected = next(i + 1 for i in range(99, len(flags)) if sum(flags[i - 99:i + 1]) > 50)
    assert 200 < expected < 400
    counted, flagged = StepState(max_overflow_fraction=0.5), StepState(max_overflow_fraction=0.5)
    by_counter = run_calls(counted, [int(f) for f in flags], 1, CounterCell())
    by_flag = run_calls(flagged, [int(f) for f in flags], 1)
    assert by_counter[0] == by_flag[0] == expected
    assert counted.overflow_steps == flagged.overflow_steps == sum(flags)
    assert counted.overflow_stop == flagged.overflow_stop
    assert (f"of the last 100 steps overflowed and were skipped (max_overflow_fraction 0.5) "
            f"at global step {expected}," in counted.overflow_stop)


def test_the_window_is_the_newest_calls_covering_100_steps():
    """Calls of 30 steps: the window is the last 4 calls (120 steps); a call leaves it when
    the newer ones cover 100 steps without it."""
    state = StepState(max_overflow_fraction=0.5)
    assert run_calls(state, [30, 30, 0, 0], 30, CounterCell()) == []  # 60 of 120: not more
    # 60 of the last 120 after each call: keeping the first call would make it 90 of 150
    assert run_calls(state, [30, 30], 30, CounterCell()) == []
    assert run_calls(state, [1], 30, CounterCell()) == [210]  # 61 of 120
    assert "61 of the last 120 steps overflowed" in state.overflow_stop
    assert StepState().OVERFLOW_WINDOW == 100


@pytest.mark.parametrize("path", ["fixed scale, no check (CPU)", "dynamic scale, 910B check"])
def test_clipping_comes_after_unscaling(path):
    """Loss scale 1024, grad_clip_norm 1: the step equals the unscaled one. Clipping the
    scaled gradients would clip at 1/1024 of the threshold (the weights would move 1024 times
    less)."""
    def sgd_step(scale_sense, check_overflow):
        ms.set_seed(0)
        net = Small()
        opt = nn.SGD(net.trainable_params(), learning_rate=0.1)
        with_loss = nn.WithLossCell(net, nn.SoftmaxCrossEntropyWithLogits(sparse=False,
                                                                          reduction="sum"))
        step = TrainStep(with_loss, opt, scale_sense=scale_sense, check_overflow=check_overflow,
                         grad_clip_norm=1.0, accumulation_steps=2)
        if check_overflow:
            force_ascend_910b_check(step)
        step.set_train()
        before = {p.name: p.asnumpy().copy() for p in net.trainable_params()}
        result = feed(step, batch(1))
        moved = np.sqrt(sum(((p.asnumpy() - before[p.name]) ** 2).sum()
                            for p in net.trainable_params()))
        return result, {p.name: p.asnumpy() for p in net.trainable_params()}, moved

    _, unscaled, moved = sgd_step(None, False)
    assert moved == pytest.approx(0.1 * 1.0, rel=1e-4)  # the gradient norm was above 1
    if path.startswith("fixed"):
        _, scaled, moved_scaled = sgd_step(ms.Tensor(SCALE, ms.float32), False)
    else:
        result, scaled, moved_scaled = sgd_step(
            nn.DynamicLossScaleUpdateCell(SCALE, SCALE_FACTOR, 1000), True)
        assert not bool(result[1].asnumpy())
    assert moved_scaled == pytest.approx(moved, rel=1e-5)
    for name, value in unscaled.items():
        np.testing.assert_allclose(scaled[name], value, rtol=1e-5, atol=1e-7, err_msg=name)


def test_the_counter_is_training_state(tmp_path, caplog):
    """``overflow_count`` is saved with the training state: eval.py and --pre_trained ignore
    it, resume restores it when present and accepts checkpoints written before it existed,
    saying so in one line."""
    assert OVERFLOW_COUNTER.startswith(TRAINING_STATE_PREFIXES)
    assert OVERFLOW_COUNTER.startswith(NOT_REQUIRED)
    step = dynamic_step()
    step.overflow_count.set_data(ms.Tensor(7, ms.int32))
    path = str(tmp_path / "net-1_1.ckpt")
    atomic_save_checkpoint(step, path, {"train_step": 1})
    load_into_network(Small(), path)  # eval.py / --pre_trained: no "not in network" error
    resumed = dynamic_step(seed=1)
    assert restore_training_state(resumed, path)[0] == 1
    assert int(resumed.overflow_count.asnumpy()) == 7
    older = str(tmp_path / "net-1_2.ckpt")
    ms.save_checkpoint([{"name": p.name, "data": p} for p in step.get_parameters()
                        if p.name != OVERFLOW_COUNTER], older, append_dict={"train_step": 2})
    fresh = dynamic_step(seed=1)
    caplog.clear()
    assert restore_training_state(fresh, older)[0] == 2
    assert int(fresh.overflow_count.asnumpy()) == 0
    said = [r.getMessage() for r in caplog.records if r.name == "src.training.resume"]
    assert said == [f"not in {older}, so kept as built: {OVERFLOW_COUNTER}"]
