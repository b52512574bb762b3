"""``create_optimizer``: AdamW against ``torch.optim.AdamW``, LAMB against the paper written
out in torch, LARS against the MLPerf reference's rule written out in torch, the weight-decay
groups of all four optimizers, the moments' checkpoint names,
the unchanged Momentum and the argument errors.

The network is a Dense and a BatchNorm (so both groups exist: dense.weight is decayed,
dense.bias, bn.gamma and bn.beta are not) whose "loss" is ``sum_i <p_i, G_i>``: its gradient
with respect to each parameter is exactly the input ``G_i``. The same given gradients then reach
the optimizer whether it is called directly (PyNative) or inside ``nn.TrainOneStepCell``
compiled in GRAPH mode, and the torch side uses them as they are. Torch references run in
float64 from the same float32 initial values, with the hyper-parameters MindSpore actually uses
(betas, eps, LR and weight decay rounded to float32, as MindSpore stores them).

Momentum against ``torch.optim.SGD`` is ``tests/test_alignment.py::
test_momentum_steps_equal_torch_sgd``; here only "Momentum is built exactly as before".
"""
import mindspore as ms
import mindspore.nn as nn
import numpy as np
import pytest
import torch

from src.training.optimizer import (
    MAX_BIAS_CORRECTION_STEPS,
    OPTIMIZERS,
    bias_correction_table,
    create_optimizer,
    split_weight_decay,
)

NAMES = ("dense.weight", "dense.bias", "bn.gamma", "bn.beta")
DECAYED = ("dense.weight",)
LRS = np.array([0.05, 0.1, 0.02, 0.08, 0.03], np.float32)  # one LR per step
WD = 0.1
TOL = 1e-6  # parameters are O(1): absolute float32-level agreement after 5 steps


def f32(x):
    """``x`` rounded to float32, as a Python float (the value MindSpore computes with)."""
    return float(np.float32(x))


class LinearLossNet(nn.Cell):
    """Dense(4, 3) + BatchNorm1d(3) parameters; loss = sum_i <p_i, G_i>, so d loss/d p_i = G_i."""

    def __init__(self, init):
        super().__init__()
        self.dense = nn.Dense(4, 3)
        self.bn = nn.BatchNorm1d(3)
        for p in self.trainable_params():
            p.set_data(ms.Tensor(init[p.name]))

    def construct(self, g_weight, g_bias, g_gamma, g_beta):
        return ((self.dense.weight * g_weight).sum() + (self.dense.bias * g_bias).sum()
                + (self.bn.gamma * g_gamma).sum() + (self.bn.beta * g_beta).sum())


def initial_values(seed=0, beta_zero=True):
    """Random float32 parameters; BN beta at its zero initialisation unless ``beta_zero`` is
    False (a zero ||w|| exercises LAMB's zero-norm rule)."""
    rng = np.random.default_rng(seed)
    init = {"dense.weight": rng.standard_normal((3, 4)), "dense.bias": rng.standard_normal(3),
            "bn.gamma": 1 + 0.3 * rng.standard_normal(3), "bn.beta": rng.standard_normal(3)}
    if beta_zero:
        init["bn.beta"] = np.zeros(3)
    return {k: v.astype(np.float32) for k, v in init.items()}


def gradient_steps(init, steps=None, seed=1, scale=1.0):
    """One dict of float32 gradients per step (``steps`` defaults to one per LR of ``LRS``)."""
    rng = np.random.default_rng(seed)
    steps = len(LRS) if steps is None else steps
    return [{k: (scale * rng.standard_normal(v.shape)).astype(np.float32) for k, v in init.items()}
            for _ in range(steps)]


def ms_run(init, grads, lr, mode, **kwargs):
    """``create_optimizer(**kwargs)`` over ``LinearLossNet(init)``, one step per gradient dict;
    ``mode`` "pynative": the optimizer is called with the gradients; "graph": through
    ``nn.TrainOneStepCell`` compiled in GRAPH mode. Returns the parameters by name."""
    net = LinearLossNet(init)
    optimizer = create_optimizer(net, lr, **kwargs)
    assert [p.name for p in optimizer.parameters] == list(NAMES)
    step = nn.TrainOneStepCell(net, optimizer) if mode == "graph" else None
    for g in grads:
        tensors = tuple(ms.Tensor(g[name]) for name in NAMES)
        if step is None:
            optimizer(tensors)
        else:
            step(*tensors)
    return {p.name: p.asnumpy() for p in net.trainable_params()}


@pytest.fixture(params=["pynative", "graph"])
def mode(request):
    """Run the MindSpore side in PyNative and in GRAPH mode (restored afterwards)."""
    previous = ms.get_context("mode")
    ms.set_context(mode=ms.GRAPH_MODE if request.param == "graph" else ms.PYNATIVE_MODE)
    yield request.param
    ms.set_context(mode=previous)


def max_abs_diff(ours, ref):
    return max(float(np.max(np.abs(ours[k].astype(np.float64) - ref[k]))) for k in NAMES)


def distances(tag, ours, **others):
    """``max_abs_diff`` of ``ours`` to each named result, printed on one line."""
    found = {name: max_abs_diff(ours, other) for name, other in others.items()}
    print(f"\n[{tag}] max |ours - x|: " + "; ".join(f"{n} {d:.1e}" for n, d in found.items()))
    return found


# ---- torch references (float64) ----

def adamw_reference(init, grads, lrs, wd, beta1, beta2, eps, bias_correction=True,
                    eps_in_sqrt=False):
    """Adam with decoupled weight decay, written out:
    m = b1 m + (1-b1) g, v = b2 v + (1-b2) g^2, (m, v) -> (m/(1-b1^t), v/(1-b2^t)) only if
    ``bias_correction``, w <- w - lr (m / (sqrt(v) + eps) + wd_group w); with ``eps_in_sqrt``
    the denominator is sqrt(v + eps) instead. The variants exist only to show that the tests
    tell them apart from torch.optim.AdamW."""
    params = {k: torch.tensor(v, dtype=torch.float64) for k, v in init.items()}
    m = {k: torch.zeros_like(p) for k, p in params.items()}
    v = {k: torch.zeros_like(p) for k, p in params.items()}
    for t, (lr, step_grads) in enumerate(zip(lrs, grads), start=1):
        for k, p in params.items():
            g = torch.tensor(step_grads[k], dtype=torch.float64)
            m[k] = beta1 * m[k] + (1 - beta1) * g
            v[k] = beta2 * v[k] + (1 - beta2) * g * g
            m_hat, v_hat = m[k], v[k]
            if bias_correction:
                m_hat, v_hat = m_hat / (1 - beta1 ** t), v_hat / (1 - beta2 ** t)
            denominator = (v_hat + eps).sqrt() if eps_in_sqrt else v_hat.sqrt() + eps
            decay = wd if k in DECAYED else 0.0
            params[k] = p - float(lr) * (m_hat / denominator + decay * p)
    return {k: p.numpy() for k, p in params.items()}


def torch_adamw(init, grads, lrs, wd, beta1, beta2, eps):
    """``torch.optim.AdamW`` with the same two groups (weight decay on dense.weight only)."""
    params = {k: torch.tensor(v, dtype=torch.float64, requires_grad=True) for k, v in init.items()}
    opt = torch.optim.AdamW(
        [{"params": [params[k] for k in NAMES if k in DECAYED], "weight_decay": wd},
         {"params": [params[k] for k in NAMES if k not in DECAYED], "weight_decay": 0.0}],
        lr=float(lrs[0]), betas=(beta1, beta2), eps=eps)
    for lr, step_grads in zip(lrs, grads):
        for k, p in params.items():
            p.grad = torch.tensor(step_grads[k], dtype=torch.float64)
        for group in opt.param_groups:
            group["lr"] = float(lr)
        opt.step()
    return {k: p.detach().numpy() for k, p in params.items()}


def lamb_reference(init, grads, lrs, wd, beta1, beta2, eps, adapt_no_decay=True,
                   eps_inside_norm=False):
    """LAMB, You et al. 2020 (arXiv:1904.00962) Algorithm 2 with phi = identity, per tensor:
    m = b1 m + (1-b1) g, v = b2 v + (1-b2) g^2, m_hat = m/(1-b1^t), v_hat = v/(1-b2^t),
    r = m_hat/(sqrt(v_hat)+eps) + wd_group w, w <- w - lr ||w||/||r|| r, the ratio being 1 when
    either norm is 0. Variants, used only to show that the tests tell them apart:
    ``adapt_no_decay=False`` is timm's default (no trust ratio where the weight decay is 0);
    ``eps_inside_norm=True`` is MindSpore's GPU kernel (ratio denominator
    ||m_hat/sqrt(v_hat+eps) + wd w||, ratio clipped to [0, 10])."""
    params = {k: torch.tensor(v, dtype=torch.float64) for k, v in init.items()}
    m = {k: torch.zeros_like(p) for k, p in params.items()}
    v = {k: torch.zeros_like(p) for k, p in params.items()}
    for t, (lr, step_grads) in enumerate(zip(lrs, grads), start=1):
        for k, p in params.items():
            g = torch.tensor(step_grads[k], dtype=torch.float64)
            m[k] = beta1 * m[k] + (1 - beta1) * g
            v[k] = beta2 * v[k] + (1 - beta2) * g * g
            m_hat = m[k] / (1 - beta1 ** t)
            v_hat = v[k] / (1 - beta2 ** t)
            decay = wd if k in DECAYED else 0.0
            r = m_hat / (v_hat.sqrt() + eps) + decay * p
            r_for_norm = m_hat / (v_hat + eps).sqrt() + decay * p if eps_inside_norm else r
            w_norm, r_norm = float(p.norm()), float(r_for_norm.norm())
            ratio = w_norm / r_norm if w_norm > 0 and r_norm > 0 else 1.0
            if eps_inside_norm:
                ratio = min(max(ratio, 0.0), 10.0)
            if decay == 0.0 and not adapt_no_decay:
                ratio = 1.0
            params[k] = p - float(lr) * ratio * r
    return {k: p.numpy() for k, p in params.items()}


BETA1, BETA2 = 0.9, 0.999
# 1e-8: create_optimizer's default; 1e-3: large enough for eps's placement to show at 1e-6
EPSILONS = [1e-8, 1e-3]


def hyper(eps, wd=WD, beta1=BETA1, beta2=BETA2):
    """The hyper-parameters as MindSpore computes with them (float32), for the references."""
    return dict(wd=f32(wd), beta1=f32(beta1), beta2=f32(beta2), eps=f32(eps))


# ---- AdamW ----

@pytest.mark.parametrize("eps", EPSILONS)
def test_adamw_reference_formula_is_torch_adamw(eps):
    """The written-out reference (bias correction, eps added to sqrt(v_hat)) is
    torch.optim.AdamW (same groups, LR per step, eps and betas): so its variants in the next
    test depart from torch only by the switched-off bias correction or the moved eps."""
    init = initial_values()
    grads = gradient_steps(init)
    ref = adamw_reference(init, grads, LRS, **hyper(eps))
    assert max_abs_diff(ref, torch_adamw(init, grads, LRS, **hyper(eps))) < 1e-12


@pytest.mark.parametrize("eps", EPSILONS)
def test_adamw_equals_torch_adamw(mode, eps):
    """AdamW = torch.optim.AdamW with the same groups (weight decay on dense.weight only), betas,
    eps and LR per step (torch's group LR set before each step), to 1e-6 after 5 steps,
    PyNative and compiled. Without bias correction (MindSpore's nn.AdamWeightDecay) the result
    is far off; so is it without weight decay, and (at eps 1e-3) with eps inside the square
    root."""
    init = initial_values()
    grads = gradient_steps(init)
    ours = ms_run(init, grads, LRS, mode, optimizer="adamw", weight_decay=WD,
                  beta1=BETA1, beta2=BETA2, eps=eps)
    d = distances(f"adamw/{mode}/eps {eps:g}", ours,
                  torch_adamw=torch_adamw(init, grads, LRS, **hyper(eps)),
                  no_bias_correction=adamw_reference(init, grads, LRS, bias_correction=False,
                                                     **hyper(eps)),
                  eps_in_sqrt=adamw_reference(init, grads, LRS, eps_in_sqrt=True, **hyper(eps)),
                  no_decay=torch_adamw(init, grads, LRS, **hyper(eps, wd=0.0)))
    assert d["torch_adamw"] < TOL
    assert d["no_bias_correction"] > 1e-2  # bias correction matters here
    assert d["no_decay"] > 1e-3  # the comparison sees the weight decay
    if eps >= 1e-3:
        assert d["eps_in_sqrt"] > 1e-4  # ... and eps's placement


def test_adamw_equals_torch_adamw_with_large_eps_and_decay():
    """Betas ~ 0 (each step replaces the moments, so every step depends on eps's placement at
    full weight: 1e-3 against |g| >= 0.5), weight decay 0.5 and nonzero BN beta: still
    torch.optim.AdamW, and the decoupled decay lr * wd * w_{t-1} shows."""
    init = initial_values(beta_zero=False)
    # |g| in [0.5, 1.5]: with betas ~ 0 each step replaces the moments, and a gradient ~1000x
    # smaller than the previous one would leave float32 rounding of the old v (~1e-7 of it) in
    # the new v, a conditioning effect, not a formula difference.
    rng = np.random.default_rng(2)
    grads = [{k: (rng.choice([-1.0, 1.0], v.shape) * rng.uniform(0.5, 1.5, v.shape)
                  ).astype(np.float32) for k, v in init.items()} for _ in LRS]
    tiny = dict(eps=1e-3, wd=0.5, beta1=1e-9, beta2=1e-9)
    ours = ms_run(init, grads, LRS, "pynative", optimizer="adamw", weight_decay=tiny["wd"],
                  beta1=tiny["beta1"], beta2=tiny["beta2"], eps=tiny["eps"])
    d = distances("adamw/betas~0", ours, torch_adamw=torch_adamw(init, grads, LRS, **hyper(**tiny)),
                  no_decay=torch_adamw(init, grads, LRS, **hyper(**{**tiny, "wd": 0.0})))
    assert d["torch_adamw"] < TOL
    assert d["no_decay"] > 1e-3


@pytest.mark.parametrize("name, prefixes", [("adamw", ("adam_m.", "adam_v.")),
                                            ("lamb", ("lamb_m.", "lamb_v."))])
def test_moment_names_are_checkpoint_optimizer_state(name, prefixes):
    """AdamW's moments are adam_m.* / adam_v.*, Lamb's lamb_m.* / lamb_v.*: prefixes that
    src.utils.checkpoint lists as optimizer state (not network parameters)."""
    from src.utils.checkpoint import TRAINING_STATE_PREFIXES
    optimizer = create_optimizer(LinearLossNet(initial_values()), 0.1, optimizer=name)
    for moments, prefix in zip((optimizer.moments1, optimizer.moments2), prefixes):
        assert [p.name for p in moments] == [prefix + n for n in NAMES]
        assert prefix in TRAINING_STATE_PREFIXES


# ---- LAMB ----

@pytest.mark.parametrize("eps", EPSILONS)
def test_lamb_equals_paper_algorithm(mode, eps):
    """Lamb = the paper's Algorithm 2 written out in torch (bias correction, eps outside the
    square root, weight decay inside the trust ratio, ratio 1 when a norm is 0: bn.beta starts
    at 0) to 1e-6 after 5 steps, PyNative and compiled. The trust ratio is applied to the
    no-decay group too: timm's default (no ratio where wd = 0) is far off, and so (at eps 1e-3)
    is MindSpore's GPU denominator with eps inside the square root."""
    init = initial_values()
    grads = gradient_steps(init)
    ours = ms_run(init, grads, LRS, mode, optimizer="lamb", weight_decay=WD,
                  beta1=BETA1, beta2=BETA2, eps=eps)
    d = distances(f"lamb/{mode}/eps {eps:g}", ours,
                  paper=lamb_reference(init, grads, LRS, **hyper(eps)),
                  no_ratio_on_no_decay_group=lamb_reference(init, grads, LRS,
                                                            adapt_no_decay=False, **hyper(eps)),
                  mindspore_gpu_denominator=lamb_reference(init, grads, LRS,
                                                           eps_inside_norm=True, **hyper(eps)),
                  no_decay=lamb_reference(init, grads, LRS, **hyper(eps, wd=0.0)))
    assert d["paper"] < TOL
    assert d["no_ratio_on_no_decay_group"] > 1e-2
    assert d["no_decay"] > 1e-3
    if eps >= 1e-3:
        assert d["mindspore_gpu_denominator"] > 1e-4


def test_lamb_zero_weight_norm_takes_the_full_step():
    """||w|| = 0 (bn.beta at init, no decay): ratio 1, so at t = 1 beta moves by
    lr * m_hat / (sqrt(v_hat) + eps) = lr * g / (|g| + eps), not 0 (||w|| / ||r|| would be 0)."""
    init = initial_values()
    grads = gradient_steps(init, steps=1)
    first = ms_run(init, grads, LRS, "pynative", optimizer="lamb", weight_decay=WD)
    g = grads[0]["bn.beta"].astype(np.float64)
    np.testing.assert_allclose(first["bn.beta"], -LRS[0] * g / (np.abs(g) + 1e-8),
                               rtol=0, atol=1e-7)


# ---- bias corrections: host tables (no float64 in the graph, tests/test_graph_dtypes.py) ----

@pytest.mark.parametrize("beta, length", [(0.9, 165), (0.999, 17321), (0.9999, 173250)])
def test_bias_correction_table_is_torchs_python_floats_in_float32(beta, length):
    """Entry i is float32(1 - beta^(i+1)) with beta**t in Python floats (torch.optim.AdamW's
    bias_correction = 1 - beta ** step), for the float32 beta; the table ends at the first
    1.0 (every later step is 1.0 too); max_steps cuts it short."""
    b = f32(beta)
    table = bias_correction_table(np.float32(beta))
    expected = np.array([1.0 - b ** t for t in range(1, length + 1)]).astype(np.float32)
    np.testing.assert_array_equal(table, expected)
    assert table[-1] == 1.0 > table[-2]
    assert np.float32(1.0 - b ** (length + 1000)) == 1.0
    np.testing.assert_array_equal(bias_correction_table(np.float32(beta), 7), expected[:7])


@pytest.mark.parametrize("lr", [0.05, "array"])
@pytest.mark.parametrize("t", [1, 2, 5, 165, 166, 17321, 17322, 300000])
def test_bias_correction_of_a_resumed_step(t, lr):
    """A run resumed at step t (global_step t - 1 restored from its checkpoint, moments 0) takes
    torch.optim.AdamW's step t: bias corrections 1 - beta^t of that step, also where the float32
    tables end (beta1's at 165, beta2's at 17321) and beyond, with a constant LR or a per-step
    LR array (whose table ends at its last step, here t)."""
    init = initial_values(beta_zero=False)
    g = gradient_steps(init, steps=1)[0]
    lrs = np.full(t, 0.05, np.float32) if lr == "array" else lr
    net = LinearLossNet(init)
    optimizer = create_optimizer(net, lrs, optimizer="adamw", weight_decay=WD)
    optimizer.global_step.set_data(ms.Tensor(np.array([t - 1], np.int32)))
    optimizer(tuple(ms.Tensor(g[k]) for k in NAMES))
    assert int(optimizer.global_step.asnumpy()[0]) == t
    h = hyper(1e-8)
    for k in NAMES:
        w, grad = init[k].astype(np.float64), g[k].astype(np.float64)
        m_hat = (1 - h["beta1"]) * grad / (1 - h["beta1"] ** t)
        v_hat = (1 - h["beta2"]) * grad ** 2 / (1 - h["beta2"] ** t)
        decay = h["wd"] if k in DECAYED else 0.0
        expected = w - f32(0.05) * (m_hat / (np.sqrt(v_hat) + h["eps"]) + decay * w)
        np.testing.assert_allclose(net.parameters_dict()[k].asnumpy(), expected, rtol=0,
                                   atol=TOL, err_msg=f"{k} at step {t}")


@pytest.mark.parametrize("name", ["adamw", "lamb"])
def test_bias_corrections_add_no_parameters(name):
    """The tables are graph constants: the optimizer's Parameters (what checkpoints hold) are
    the network's, the two moments, global_step and learning_rate, as before."""
    optimizer = create_optimizer(LinearLossNet(initial_values()), LRS, optimizer=name)
    first, second = (m[0].name.split(".")[0] for m in (optimizer.moments1, optimizer.moments2))
    expected = {*NAMES, *(f"{p}.{n}" for p in (first, second) for n in NAMES), "global_step",
                "learning_rate"}
    assert set(optimizer.parameters_dict()) == expected


def test_beta_too_close_to_one_needs_the_lr_per_step():
    """beta2 = 0.99999: float32 1 - beta2^t stays below 1.0 for 1.7 million steps, more than
    MAX_BIAS_CORRECTION_STEPS: with a constant LR (no number of steps) that is an error; with
    an LR per step the table ends at the last step. A beta that is 1.0 in float32 is refused."""
    net = LinearLossNet(initial_values())
    assert MAX_BIAS_CORRECTION_STEPS < 1_700_000
    with pytest.raises(ValueError, match="give the learning rate per step"):
        create_optimizer(net, 0.1, optimizer="adamw", beta2=0.99999)
    optimizer = create_optimizer(net, LRS, optimizer="adamw", beta2=0.99999)
    assert optimizer.bias_correction2.shape == (len(LRS),)
    with pytest.raises(ValueError, match="must be in"):
        create_optimizer(net, LRS, optimizer="lamb", beta2=1 - 1e-9)


# ---- LARS ----

def lars_reference(init, grads, lrs, wd, momentum, trust_coeff, eps, form="mlperf",
                   adapt_all=False, lr_scales=None):
    """LARS as the MLPerf reference ResNet-50 applies it (mlcommons/training
    retired_benchmarks/resnet-tf2/tensorflow2/lars_optimizer.py, ``compute_lr`` and
    ``_resource_apply_dense``), per tensor: for dense.weight (not in the reference's
    skip_list) ratio = tc ||w|| / (||g|| + wd ||w|| + eps) when both norms are > 0, else 1, and
    g <- g + wd w; bias and BN (skipped) keep ratio 1 and no decay; then m = mu m + lr ratio g,
    w <- w - m. Variants, used only to show that the tests tell them apart:
    ``form="timm"`` keeps the LR outside the buffer (timm's Lars, NVIDIA's MXNet rescaled
    momentum): v = mu v + ratio g, w <- w - lr v; ``adapt_all`` gives every tensor the trust
    ratio (MindSpore's nn.LARS default filter adapts BN gamma/beta). ``lr_scales``: name ->
    multiple of the LR (a parameter group's LR array)."""
    params = {k: torch.tensor(v, dtype=torch.float64) for k, v in init.items()}
    buffers = {k: torch.zeros_like(p) for k, p in params.items()}
    for step_lr, step_grads in zip(lrs, grads):
        for k, p in params.items():
            lr = float(step_lr) * (lr_scales or {}).get(k, 1.0)
            g = torch.tensor(step_grads[k], dtype=torch.float64)
            ratio, decay = 1.0, (wd if k in DECAYED else 0.0)
            if k in DECAYED or adapt_all:
                w_norm, g_norm = float(p.norm()), float(g.norm())
                if w_norm > 0 and g_norm > 0:
                    ratio = trust_coeff * w_norm / (g_norm + decay * w_norm + eps)
                g = g + decay * p
            if form == "mlperf":
                buffers[k] = momentum * buffers[k] + float(lr) * ratio * g
                params[k] = p - buffers[k]
            else:
                buffers[k] = momentum * buffers[k] + ratio * g
                params[k] = p - float(lr) * buffers[k]
    return {k: p.numpy() for k, p in params.items()}


# A trust coefficient large enough that the trust ratio is O(0.1-1) here (0.001 would make
# every step ~1e-4 and the variants indistinguishable at float32 level); eps large enough to
# show in the denominator.
LARS_HYPER = {"momentum": 0.9, "trust_coeff": 0.5, "eps": 1e-2}


def lars_hyper(wd=WD, **changes):
    """LARS_HYPER (and ``wd``) rounded to float32, as MindSpore computes with them."""
    return {k: f32(v) for k, v in dict(LARS_HYPER, wd=wd, **changes).items()}


def test_lars_equals_mlperf_reference(mode):
    """Lars = the MLPerf reference's rule written out in torch to 1e-6 after 5 steps of a
    changing LR, PyNative and compiled; bn.gamma, bn.beta (at 0) and dense.bias neither
    adapted nor decayed. Each departure shows: timm's / NVIDIA's momentum form (LR outside
    the buffer), the trust ratio on every tensor, no weight decay, the eps left out."""
    init = initial_values()
    grads = gradient_steps(init)
    ours = ms_run(init, grads, LRS, mode, optimizer="lars", weight_decay=WD, **LARS_HYPER)
    d = distances(f"lars/{mode}", ours,
                  mlperf=lars_reference(init, grads, LRS, **lars_hyper()),
                  lr_outside_buffer=lars_reference(init, grads, LRS, form="timm",
                                                   **lars_hyper()),
                  ratio_on_every_tensor=lars_reference(init, grads, LRS, adapt_all=True,
                                                       **lars_hyper()),
                  no_decay=lars_reference(init, grads, LRS, **lars_hyper(wd=0.0)),
                  no_eps=lars_reference(init, grads, LRS, **lars_hyper(eps=0.0)))
    assert d["mlperf"] < TOL
    for variant in ("lr_outside_buffer", "ratio_on_every_tensor", "no_decay", "no_eps"):
        assert d[variant] > 1e-4, variant


def test_lars_with_lr_groups_scales_each_step():
    """One LR array per group, as ``parameter_groups`` makes them for layer_decay and
    head_lr_scale (here dense.weight 3x, dense.bias 1x, BN 0.5x; compiled): each parameter's
    step is the reference's at its own LR."""
    init = initial_values()
    grads = gradient_steps(init)
    scales = {"dense.weight": 3.0, "dense.bias": 1.0, "bn.gamma": 0.5, "bn.beta": 0.5}
    net = LinearLossNet(init)
    by_name = {p.name: p for p in net.trainable_params()}
    groups = [{"params": [by_name[k] for k in keys], "weight_decay": wd,
               "lr": ms.Tensor((LRS.astype(np.float64) * scales[keys[0]]).astype(np.float32))}
              for keys, wd in ((["dense.weight"], WD), (["dense.bias"], 0.0),
                               (["bn.gamma", "bn.beta"], 0.0))]
    optimizer = OPTIMIZERS["lars"].build(groups + [{"order_params": net.trainable_params()}],
                                         ms.Tensor(LRS), **LARS_HYPER)
    previous = ms.get_context("mode")
    ms.set_context(mode=ms.GRAPH_MODE)
    try:
        step = nn.TrainOneStepCell(net, optimizer)
        for g in grads:
            step(*(ms.Tensor(g[name]) for name in NAMES))
    finally:
        ms.set_context(mode=previous)
    ours = {p.name: p.asnumpy() for p in net.trainable_params()}
    d = distances("lars/group LRs", ours,
                  reference=lars_reference(init, grads, LRS, lr_scales=scales, **lars_hyper()),
                  one_lr=lars_reference(init, grads, LRS * 3, **lars_hyper()))
    assert d["reference"] < TOL and d["one_lr"] > 1e-3


def test_lars_zero_weight_norm_takes_the_full_step():
    """||w|| = 0 on an adapted tensor (dense.weight at 0): ratio 1, so the first step moves it
    by lr * g (the ratio's formula would give 0)."""
    init = dict(initial_values(), **{"dense.weight": np.zeros((3, 4), np.float32)})
    grads = gradient_steps(init, steps=1)
    first = ms_run(init, grads, LRS, "pynative", optimizer="lars", weight_decay=WD,
                   **LARS_HYPER)
    np.testing.assert_allclose(first["dense.weight"], -LRS[0] * grads[0]["dense.weight"],
                               rtol=1e-6)


def test_lars_accepts_momentum_0_and_takes_the_plain_trust_ratio_step():
    """momentum 0 (no buffer carried over) is a valid LARS: each step is the reference's."""
    init = initial_values()
    grads = gradient_steps(init, steps=2)
    ours = ms_run(init, grads, LRS[:2], "pynative", optimizer="lars", weight_decay=WD,
                  **dict(LARS_HYPER, momentum=0.0))
    d = distances("lars/momentum 0", ours,
                  reference=lars_reference(init, grads, LRS[:2], **lars_hyper(momentum=0.0)),
                  with_momentum=lars_reference(init, grads, LRS[:2], **lars_hyper()))
    assert d["reference"] < TOL and d["with_momentum"] > 1e-4


def test_lars_buffer_names_are_checkpoint_optimizer_state():
    from src.utils.checkpoint import TRAINING_STATE_PREFIXES
    optimizer = create_optimizer(LinearLossNet(initial_values()), 0.1, optimizer="lars")
    assert [p.name for p in optimizer.moments] == ["lars_m." + n for n in NAMES]
    assert "lars_m." in TRAINING_STATE_PREFIXES


@pytest.mark.parametrize("kwargs, message", [({"momentum": -0.1}, "momentum must be >= 0"),
                                             ({"trust_coeff": 0.0}, "trust_coeff must be > 0"),
                                             ({"eps": 0.0}, "eps must be > 0")])
def test_lars_rejects_bad_hyperparameters(kwargs, message):
    net = LinearLossNet(initial_values())
    with pytest.raises(ValueError, match=message):
        create_optimizer(net, 0.1, optimizer="lars", **kwargs)


# ---- groups ----

@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_weight_decay_only_on_conv_and_dense_weights(name):
    """Zero gradients, large weight decay, two steps of LR 0.1 (a float): dense.weight shrinks by
    the optimizer's decay factor, bias, BN gamma and beta (all nonzero) stay exactly."""
    init = initial_values(beta_zero=False)
    zero = [{k: np.zeros_like(v) for k, v in init.items()}] * 2
    ours = ms_run(init, zero, 0.1, "pynative", optimizer=name, weight_decay=0.5, momentum=0.9)
    lr, wd, w0 = 0.1, 0.5, init["dense.weight"].astype(np.float64)
    expected = {  # two steps of the update with g = 0
        "momentum": w0 * (1 - lr * wd) - lr * (0.9 * wd * w0 + wd * w0 * (1 - lr * wd)),
        "adamw": w0 * (1 - lr * wd) ** 2,  # m = v = 0: w <- w - lr * wd * w
        "lamb": w0 * (1 - lr) ** 2,  # r = wd * w, ratio ||w|| / ||wd w|| = 1 / wd
        # ||g|| = 0: ratio 1; m1 = lr wd w0, w1 = w0 (1 - lr wd); m2 = 0.9 m1 + lr wd w1
        "lars": w0 * (1 - lr * wd) - (0.9 * lr * wd * w0 + lr * wd * w0 * (1 - lr * wd)),
    }[name]
    np.testing.assert_allclose(ours["dense.weight"], expected, rtol=1e-6)
    for k in ("dense.bias", "bn.gamma", "bn.beta"):
        np.testing.assert_array_equal(ours[k], init[k], err_msg=f"{name}: {k} was decayed")


def test_split_names():
    net = LinearLossNet(initial_values())
    decay, no_decay = split_weight_decay(net.trainable_params())
    assert [p.name for p in decay] == ["dense.weight"]
    assert [p.name for p in no_decay] == ["dense.bias", "bn.gamma", "bn.beta"]


# ---- Momentum unchanged ----

def todays_momentum(net, lr, momentum, weight_decay, loss_scale=1.0):
    """The construction create_optimizer had before AdamW and LAMB were added (verbatim)."""
    decay, no_decay = split_weight_decay(net.trainable_params())
    groups = [{"params": decay, "weight_decay": weight_decay},
              {"params": no_decay, "weight_decay": 0.0},
              {"order_params": net.trainable_params()}]
    learning_rate = lr if isinstance(lr, float) else ms.Tensor(np.asarray(lr, np.float32))
    return nn.Momentum(groups, learning_rate=learning_rate, momentum=momentum,
                       loss_scale=loss_scale)


@pytest.mark.parametrize("loss_scale", [1.0, 128.0])
def test_momentum_bit_identical_to_todays_construction(loss_scale):
    """Default, keyword and today's positional calls give bit-identical parameters after three
    steps with a per-step LR array (gradients scaled by loss_scale, as the training cell gives
    them)."""
    init = initial_values(beta_zero=False)
    grads = gradient_steps(init, steps=3, scale=loss_scale)
    lrs, results = LRS[:3], []
    builders = [lambda net: todays_momentum(net, lrs, 0.875, 1 / 32768, loss_scale),
                lambda net: create_optimizer(net, lrs, 0.875, 1 / 32768, loss_scale),
                lambda net: create_optimizer(net, lrs, momentum=0.875, weight_decay=1 / 32768,
                                             loss_scale=loss_scale, optimizer="momentum")]
    for build in builders:
        net = LinearLossNet(init)
        optimizer = build(net)
        assert type(optimizer) is nn.Momentum
        for g in grads:
            optimizer(tuple(ms.Tensor(g[k]) for k in NAMES))
        results.append({p.name: p.asnumpy() for p in net.trainable_params()})
    for other in results[1:]:
        for k in NAMES:
            np.testing.assert_array_equal(other[k], results[0][k])
    assert max(np.max(np.abs(results[0][k] - init[k])) for k in NAMES) > 1e-3  # it moved


# ---- errors ----

def test_unknown_hyperparameter_keyword_raises_type_error():
    """A keyword no optimizer takes is refused, not ignored, whichever optimizer is chosen."""
    for name in sorted(OPTIMIZERS):
        with pytest.raises(TypeError, match="unexpected keyword argument 'some_unknown'"):
            create_optimizer(LinearLossNet(initial_values()), 0.1, optimizer=name,
                             some_unknown=1)


def test_unknown_name_raises_key_error_listing_names():
    net = LinearLossNet(initial_values())
    with pytest.raises(KeyError, match="valid names: adamw, lamb, lars, momentum"):
        create_optimizer(net, 0.1, optimizer="sgd")


@pytest.mark.parametrize("name", ["adamw", "lamb", "lars"])
def test_loss_scale_rejected_without_momentum(name):
    net = LinearLossNet(initial_values())
    with pytest.raises(ValueError, match="cannot divide out a fixed loss scale"):
        create_optimizer(net, 0.1, loss_scale=128.0, optimizer=name)
    create_optimizer(net, 0.1, loss_scale=1.0, optimizer=name)  # no scaling: fine
