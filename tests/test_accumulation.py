"""Gradient accumulation across ``Model`` steps (``grad_accumulation_steps`` k): the pipeline
gives batches of ``batch_size``, each epoch cut to whole optimizer steps; the callbacks after
``StepState`` see optimizer steps only, so a stop signal that comes between the micro-batches
of an optimizer step saves after it, never inside it; the accumulation buffers are not saved
and a checkpoint without them resumes.

The ``TrainStep`` side (k calls = one step on the whole batch, buffers cleared) is in
``test_train_step.py`` (here: the same for LARS, whose trust ratio takes the norm of the
averaged gradient); overflow with accumulation in ``test_overflow.py``; data parallel in
``test_distributed.py``; bit-exact resume of a run with k = 2 in ``test_resume.py``.
"""
import logging
import os
import signal

import mindspore as ms
import mindspore.nn as nn
import numpy as np
import pytest
from mindspore.train import Callback, RunContext

from src.recipe import build_data, epoch_dataset
from src.training.callbacks import OptimizerStepCallbacks, StepState
from src.training.optimizer import create_optimizer
from src.training.resume import restore_training_state
from src.training.saver import CheckpointSaver
from src.training.signals import StopSignals
from src.training.train_step import TrainStep
from src.utils.checkpoint import GRAD_ACCUM_PREFIX
from src.utils.config import ConfigError, parse_config
from tests.test_train_step import Small, batches, graph_mode  # noqa: F401  (autouse)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SAMPLE = os.path.join(ROOT, "data", "cifar10_sample", "train")  # 1000 images, 10 classes


class Params(dict):
    """Stands in for ``RunContext.original_args()``."""
    __getattr__ = dict.__getitem__


class Recorder(Callback):
    """Records the step hooks it is called with, and the global step then."""

    def __init__(self, state):
        super().__init__()
        self.state, self.seen = state, []

    def on_train_step_begin(self, run_context):
        self.seen.append(("begin", self.state.global_step))

    def on_train_step_end(self, run_context):
        self.seen.append(("end", self.state.global_step))

    def on_train_epoch_end(self, run_context):
        self.seen.append(("epoch_end", self.state.global_step))


def drive(state, callbacks, context, calls):
    """``calls`` step-by-step ``Model`` steps: begin and end hooks, state first."""
    for _ in range(calls):
        for callback in [state] + callbacks:
            callback.on_train_step_begin(context)
        for callback in [state] + callbacks:
            callback.on_train_step_end(context)


def test_callbacks_after_the_state_see_whole_optimizer_steps():
    """k = 3, 7 Model steps: the callbacks see 3 step starts (Model steps 1, 4, 7) and 2 step
    ends (after Model steps 3 and 6), the global step counts optimizer steps, and the other
    hooks pass as they come."""
    state = StepState(start_step=10, accumulation_steps=3)
    recorder = Recorder(state)
    gate = OptimizerStepCallbacks(state, [recorder])
    context = RunContext(Params(net_outputs=ms.Tensor(np.float32(2.5)), cur_epoch_num=1))
    drive(state, [gate], context, 7)
    assert recorder.seen == [("begin", 10), ("end", 11), ("begin", 11), ("end", 12),
                             ("begin", 12)]
    assert state.global_step == 12 and state.micro_steps == 1 and not state.step_ended
    gate.on_train_epoch_end(context)
    assert recorder.seen[-1] == ("epoch_end", 12)
    # a sink call of 2 optimizer steps (6 Model steps) after the 7th: ends steps 13 and 14
    state.micro_steps = 0
    state.set_call_size(6)
    drive(state, [gate], context, 1)
    assert state.global_step == 14 and state.steps_per_call == 2 and state.step_ended
    assert recorder.seen[-2:] == [("begin", 12), ("end", 14)]


def test_without_accumulation_every_call_is_passed_on():
    state = StepState()
    recorder = Recorder(state)
    drive(state, [OptimizerStepCallbacks(state, [recorder])],
          RunContext(Params(net_outputs=ms.Tensor(np.float32(1.0)))), 3)
    assert recorder.seen == [("begin", 0), ("end", 1), ("begin", 1), ("end", 2), ("begin", 2),
                             ("end", 3)]


def test_a_signal_between_micro_batches_saves_after_the_optimizer_step(tmp_path):
    """k = 2, a SIGTERM after the first micro-batch: nothing is saved and training goes on
    until the second has stepped the optimizer; the checkpoint then holds the step, not the
    accumulation buffers (zero then), and a fresh cell resumes from it."""
    log = logging.getLogger("test")
    _, step = make_step()
    state = StepState(accumulation_steps=2)
    stop = StopSignals(log, exit_now=lambda status: None)
    saver = CheckpointSaver(state, stop, output_dir=str(tmp_path), prefix="net", steps_per_epoch=10,
                            total_steps=20, keep_max=5)
    callbacks = [OptimizerStepCallbacks(state, [stop, saver])]
    cb = Params(net_outputs=None, train_network=step, cur_epoch_num=1)
    context = RunContext(cb)
    for callback in [state] + callbacks:
        callback.on_train_begin(context)
    image, label = batches(1, batch=8)[0]
    cb["net_outputs"] = step(image[:4], label[:4])
    stop._handle(signal.SIGTERM, None)  # arrives while the first micro-batch's call ends
    for callback in [state] + callbacks:
        callback.on_train_step_end(context)
    assert not context.get_stop_requested() and not os.listdir(tmp_path)
    assert int(step.grad_accum_step.asnumpy()) == 1
    cb["net_outputs"] = step(image[4:], label[4:])
    for callback in [state] + callbacks:
        callback.on_train_step_end(context)
    assert context.get_stop_requested() and state.global_step == 1
    path = tmp_path / "net-1_1.ckpt"
    assert os.listdir(tmp_path) == [path.name]
    saved = ms.load_checkpoint(str(path))
    assert not [n for n in saved if n.startswith(GRAD_ACCUM_PREFIX)]
    assert int(saved["global_step"].asnumpy()) == 1
    _, fresh = make_step(seed=5)
    assert restore_training_state(fresh, str(path))[0] == 1
    for p in fresh.network.trainable_params():
        np.testing.assert_array_equal(p.asnumpy(), saved[p.name].asnumpy(), err_msg=p.name)


def make_step(seed=0):
    ms.set_seed(seed)
    net = Small()
    opt = nn.Momentum(net.trainable_params(), learning_rate=0.1, momentum=0.9)
    step = TrainStep(nn.WithLossCell(net, nn.SoftmaxCrossEntropyWithLogits(
        sparse=True, reduction="mean")), opt, accumulation_steps=2)
    return net, step.set_train()


def sample_config(*args):
    return parse_config(["--data_path", SAMPLE, "--class_num", "10", "--num_parallel_workers",
                         "1", "--check_images", "false", *args])


def test_the_pipeline_gives_batch_size_batches_cut_to_whole_optimizer_steps():
    """1000 images in batches of 32: 31 batches; k = 2 makes 15 optimizer steps, so each
    epoch reads 30 batches (the 31st would start a step the epoch cannot finish); a resumed
    epoch skips k batches per optimizer step done."""
    cfg = sample_config("--batch_size", "32", "--grad_accumulation_steps", "2")
    data = build_data(cfg, 0, 1)
    assert (data.steps_per_epoch, data.batches_per_epoch, data.cut_epochs) == (15, 30, True)
    dataset = epoch_dataset(cfg, 0, 0, data)
    assert dataset.get_dataset_size() == 30
    assert next(dataset.create_tuple_iterator(output_numpy=True))[0].shape[0] == 32
    assert epoch_dataset(cfg, 0, 4, data).get_dataset_size() == 22
    cfg = sample_config("--batch_size", "50", "--grad_accumulation_steps", "4")
    data = build_data(cfg, 0, 1)
    assert (data.steps_per_epoch, data.batches_per_epoch, data.cut_epochs) == (5, 20, False)


def test_fewer_batches_than_one_optimizer_step_is_an_error_naming_both():
    cfg = sample_config("--batch_size", "400", "--grad_accumulation_steps", "3")
    with pytest.raises(ConfigError, match="gives 2 full batches of batch_size 400 per device, "
                                          "fewer than the grad_accumulation_steps 3"):
        build_data(cfg, 0, 1)


def lars_train_step(accumulation, seed=0):
    """Small with frozen BatchNorm statistics, LARS (weight decay, BN and bias left out) over a
    per-step LR array of two optimizer steps, in a TrainStep accumulating ``accumulation``
    micro-batches."""
    ms.set_seed(seed)
    net = Small(use_batch_statistics=False)
    opt = create_optimizer(net, np.array([0.2, 0.1], np.float32), optimizer="lars",
                           momentum=0.9, weight_decay=1e-3, trust_coeff=0.02)
    loss = nn.WithLossCell(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"))
    return TrainStep(loss, opt, accumulation_steps=accumulation).set_train()


def test_lars_accumulated_micro_batches_equal_one_step_on_the_whole_batch():
    """Two optimizer steps: 3 micro-batches of 4 per step give the parameters and LARS buffers
    of one step on the batch of 12 (the trust ratio sees the mean gradient, and the LR array
    is indexed by optimizer steps)."""
    whole, accumulated = lars_train_step(1), lars_train_step(3)
    start = {p.name: p.asnumpy().copy() for p in whole.get_parameters()}
    for image, label in batches(2, batch=12):
        whole(image, label)
        for i in range(3):
            accumulated(image[i * 4:(i + 1) * 4], label[i * 4:(i + 1) * 4])
    ours = {p.name: p.asnumpy() for p in accumulated.get_parameters()}
    compared = [p.name for p in whole.get_parameters()
                if p.name.startswith(("conv.", "bn.", "fc.", "lars_m.", "global_step"))
                and "moving_" not in p.name]
    assert "lars_m.conv.weight" in compared and "lars_m.bn.gamma" in compared
    for p in whole.get_parameters():
        if p.name in compared:
            np.testing.assert_allclose(ours[p.name], p.asnumpy(), rtol=1e-6, atol=1e-7,
                                       err_msg=p.name)
    assert ours["global_step"].item() == 2
    assert not np.allclose(ours["fc.weight"], start["fc.weight"])  # it trained


class CountingReducer(nn.Cell):
    """Stands in for the data-parallel gradient all-reduce (``DistributedGradReducer``):
    passes the gradients through and counts, in a parameter, the times the graph runs it."""

    def __init__(self):
        super().__init__()
        self.calls = ms.Parameter(ms.Tensor(0, ms.int32), name="reducer_calls",
                                  requires_grad=False)

    def construct(self, grads):
        return ms.ops.depend(grads, ms.ops.assign_add(self.calls, ms.Tensor(1, ms.int32)))


@pytest.mark.parametrize("k, allreduce_per, per_step", [(1, "step", 1), (3, "step", 1),
                                                         (1, "micro_batch", 1),
                                                         (3, "micro_batch", 3)])
def test_the_gradients_are_all_reduced_once_per_optimizer_step(k, allreduce_per, per_step):
    """With k micro-batches per optimizer step, the compiled step runs the gradient all-reduce
    on the call that steps the optimizer only (k times fewer collectives than micro-batches),
    not on every micro-batch; with ``allreduce_per`` "micro_batch" on every call (k per
    optimizer step, outside the branch)."""
    ms.set_seed(0)
    net = Small()
    opt = nn.Momentum(net.trainable_params(), learning_rate=0.1, momentum=0.9)
    step = TrainStep(nn.WithLossCell(net, nn.SoftmaxCrossEntropyWithLogits(
        sparse=True, reduction="mean")), opt, accumulation_steps=k,
        allreduce_per=allreduce_per)
    step.grad_reducer = CountingReducer()
    step.set_train()
    for image, label in batches(2 * k):
        step(image, label)
    assert int(step.grad_reducer.calls.asnumpy()) == 2 * per_step


def test_an_unknown_allreduce_form_is_refused_naming_the_key():
    with pytest.raises(ValueError, match="grad_accumulation_allreduce must be one of step, "
                                         "micro_batch, got 'epoch'"):
        TrainStep(nn.WithLossCell(Small(), nn.SoftmaxCrossEntropyWithLogits()),
                  nn.Momentum(Small().trainable_params(), 0.1, 0.9), allreduce_per="epoch")


def test_auto_reduces_per_step_on_cpu_and_per_micro_batch_on_gpu_and_ascend():
    from src.training.model import resolve_allreduce_per
    assert [resolve_allreduce_per("auto", d) for d in ("CPU", "GPU", "Ascend")] == [
        "step", "micro_batch", "micro_batch"]
    assert resolve_allreduce_per("step", "Ascend") == "step"
    assert resolve_allreduce_per("micro_batch", "CPU") == "micro_batch"
