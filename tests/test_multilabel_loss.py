"""Multi-label losses against torch re-derivations of the published formulas: MultiLabelBCE
(torch's BCEWithLogitsLoss with pos_weight), AsymmetricLoss (Ridnik et al. 2021, the authors'
AsymmetricLoss), pos_weights, and create_loss's multi-label registry."""
import mindspore as ms
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from src.training.loss import (
    LOSSES,
    MULTILABEL_LOSSES,
    AsymmetricLoss,
    CrossEntropySmooth,
    MultiLabelBCE,
    create_loss,
    pos_weights,
)
from tests.test_distill import within_torch_float32

K = 6


def fixed_batch():
    """Logits (8, K) float32 from -25 to 12 (saturated sigmoids, probabilities under the clip
    and under eps included) and targets: hard multi-hot rows, an all-zero row, and two mixed
    rows as mixup makes them (lam y_i + (1 - lam) y_flipped)."""
    rng = np.random.default_rng(42)
    logits = (rng.standard_normal((8, K)) * 4).astype(np.float32)
    logits[0, :3] = [12.0, -9.0, -25.0]
    hard = (rng.random((8, K)) < 0.4).astype(np.float32)
    hard[0, :3] = [1, 0, 1]  # a confident hit, a negative far under the clip, p < eps
    hard[1] = 0
    targets = hard.copy()
    for row, lam in ((6, 0.7), (7, 0.35)):
        targets[row] = lam * hard[row] + (1 - lam) * hard[len(hard) - 1 - row]
    return logits, targets


def sigmoid_error(logits):
    """The relative error of MindSpore's float32 sigmoid on ``logits`` on this machine, at
    least float32's epsilon."""
    ours = ms.ops.sigmoid(ms.Tensor(logits)).asnumpy().astype(np.float64)
    exact = 1 / (1 + np.exp(-logits.astype(np.float64)))
    return max(float(np.abs(ours / exact - 1).max()), float(np.finfo(np.float32).eps))


def torch_bce(logits, targets, pos_weight, reduction):
    per_element = F.binary_cross_entropy_with_logits(logits, targets, pos_weight=pos_weight,
                                                     reduction="none")
    return {"mean": per_element.mean(), "sum": per_element.sum(),
            "none": per_element.mean(dim=1)}[reduction]


def torch_asl(logits, targets, *, gamma_neg, gamma_pos, clip, focus_grad, reduction, eps=1e-8):
    """Ridnik et al. 2021, eq. of the authors' AsymmetricLoss written out; ``mean`` divides
    their batch total by the images."""
    p = torch.sigmoid(logits)
    p_neg = (1 - p + clip).clamp(max=1)
    log_likelihood = (targets * torch.log(p.clamp(min=eps))
                      + (1 - targets) * torch.log(p_neg.clamp(min=eps)))
    pt = targets * p + (1 - targets) * p_neg
    weight = torch.pow(1 - pt, gamma_pos * targets + gamma_neg * (1 - targets))
    if not focus_grad:
        weight = weight.detach()
    per_image = -(log_likelihood * weight).sum(dim=1)
    return {"mean": per_image.mean(), "sum": per_image.sum(), "none": per_image}[reduction]


def check_against_torch(loss_fn, torch_fn, logits, targets, graph=False):
    """Loss and gradient w.r.t. the logits (of the sum, for ``none``) within torch's own
    float32 error of torch's float64 result."""
    def forward(x, y):
        return loss_fn(x, y)

    def total(x):
        return loss_fn(x, ms.Tensor(targets)).sum()
    gradient = ms.grad(total)
    if graph:
        forward, gradient = ms.jit(forward), ms.jit(gradient)
    ours = forward(ms.Tensor(logits), ms.Tensor(targets)).asnumpy()
    grad = gradient(ms.Tensor(logits))
    refs = []
    for dtype in (torch.float32, torch.float64):
        x = torch.tensor(logits, dtype=dtype, requires_grad=True)
        ref = torch_fn(x, torch.tensor(targets, dtype=dtype))
        ref.sum().backward()
        refs.append((ref.detach().numpy(), x.grad.numpy()))
    relative = sigmoid_error(logits)
    assert ours.dtype == np.float32 and ours.shape == refs[0][0].shape
    within_torch_float32(ours, refs[0][0], refs[1][0], relative)
    within_torch_float32(grad.asnumpy(), refs[0][1], refs[1][1], relative)
    return ours


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("weighted", [False, True])
def test_bce_and_gradient_equal_torch(reduction, weighted):
    logits, targets = fixed_batch()
    weight = np.linspace(0.5, 3.0, K).astype(np.float32) if weighted else None
    check_against_torch(
        MultiLabelBCE(K, pos_weight=weight, reduction=reduction),
        lambda x, y: torch_bce(x, y, None if weight is None else torch.tensor(
            weight, dtype=x.dtype), reduction), logits, targets)


ASL_SETTINGS = [
    dict(gamma_neg=4.0, gamma_pos=1.0, clip=0.05),  # the authors' defaults
    dict(gamma_neg=4.0, gamma_pos=0.0, clip=0.05),  # the paper's recommended setting
    dict(gamma_neg=2.0, gamma_pos=3.0, clip=0.2),
    dict(gamma_neg=0.0, gamma_pos=0.0, clip=0.0),  # plain BCE
]


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("settings", ASL_SETTINGS, ids=lambda s: "-".join(map(str, s.values())))
def test_asl_and_gradient_equal_torch(settings, reduction):
    logits, targets = fixed_batch()
    if not settings["clip"]:  # without the shift, 1 - p would round to 0 in float32 only
        logits = np.clip(logits, -12, 12)
    check_against_torch(
        AsymmetricLoss(**settings, reduction=reduction),
        lambda x, y: torch_asl(x, y, **settings, focus_grad=False, reduction=reduction),
        logits, targets)


def test_asl_focus_grad_matches_torch_through_the_weight():
    """``focus_grad``: the gradient flows through (1 - pt) ** g as in the authors'
    AsymmetricLossOptimized default; it differs from the detached default."""
    logits, targets = fixed_batch()
    settings = dict(gamma_neg=4.0, gamma_pos=1.0, clip=0.05)
    check_against_torch(
        AsymmetricLoss(**settings, focus_grad=True),
        lambda x, y: torch_asl(x, y, **settings, focus_grad=True, reduction="mean"),
        logits, targets)
    grads = [ms.grad(lambda x, fg=fg: AsymmetricLoss(focus_grad=fg)(x, ms.Tensor(targets)))(
        ms.Tensor(logits)).asnumpy() for fg in (False, True)]
    assert np.abs(grads[0] - grads[1]).max() > 1e-3


@pytest.mark.parametrize("name", ["bce", "asl"])
def test_graph_mode_defaults(name):
    """Compiled as training compiles them: BCE without pos_weight, ASL's detached weight."""
    logits, targets = fixed_batch()
    if name == "bce":
        loss_fn, reference = MultiLabelBCE(K), lambda x, y: torch_bce(x, y, None, "mean")
    else:
        loss_fn, reference = AsymmetricLoss(), lambda x, y: torch_asl(
            x, y, gamma_neg=4.0, gamma_pos=1.0, clip=0.05, focus_grad=False, reduction="mean")
    check_against_torch(loss_fn, reference, logits, targets, graph=True)


def test_asl_saturated_gamma_zero_has_no_nan_gradient():
    """0 ** 0 = 1 as torch.pow, and a finite gradient where 1 - pt is 0."""
    logits = np.array([[30.0, -30.0, 2.0]], np.float32)
    targets = np.array([[1.0, 0.0, 1.0]], np.float32)
    for focus_grad in (False, True):
        loss_fn = AsymmetricLoss(gamma_neg=0.0, gamma_pos=0.0, clip=0.0, focus_grad=focus_grad)
        loss, grad = ms.value_and_grad(lambda x, f=loss_fn: f(x, ms.Tensor(targets)))(
            ms.Tensor(logits))
        assert np.isfinite(loss.asnumpy()) and np.isfinite(grad.asnumpy()).all()
        assert float(loss.asnumpy()) > 0.1  # the third element's BCE, weight 1


@pytest.mark.parametrize("loss_fn", [MultiLabelBCE(K), AsymmetricLoss()],
                         ids=["bce", "asl"])
def test_float16_logits_cast_to_float32_inside(loss_fn):
    logits, targets = fixed_batch()
    half = logits.astype(np.float16)
    ours = loss_fn(ms.Tensor(half), ms.Tensor(targets))
    same = loss_fn(ms.Tensor(half.astype(np.float32)), ms.Tensor(targets))
    assert ours.dtype == ms.float32
    assert ours.asnumpy() == same.asnumpy()


def test_pos_weights_are_negatives_over_positives():
    targets = np.array([[1, 0, 1], [0, 0, 1], [1, 1, 0], [0, 0, 1], [1, 0, 1]], np.uint8)
    # positives by hand: 3, 1, 4 of 5 images
    np.testing.assert_array_equal(pos_weights(targets),
                                  np.array([2 / 3, 4 / 1, 1 / 4], np.float32))
    assert pos_weights(targets).dtype == np.float32
    assert pos_weights(targets.astype(np.float32)).tolist() == pos_weights(targets).tolist()


@pytest.mark.parametrize("column, word", [(np.zeros(4), "no positive"),
                                          (np.ones(4), "no negative")])
def test_pos_weights_class_without_positive_or_negative_named(column, word):
    targets = np.array([[1, 0, 1], [0, 1, 0], [1, 0, 0], [0, 1, 1]], np.float32)
    targets = np.insert(targets, 2, column, axis=1)
    with pytest.raises(ValueError, match=rf"class\(es\) \[2\]: {word}"):
        pos_weights(targets)
    with pytest.raises(ValueError, match="0/1"):
        pos_weights(np.full((2, 2), 0.5))


def test_create_loss_multilabel_registry():
    assert set(LOSSES) == {"ce", "bce"} and set(MULTILABEL_LOSSES) == {"bce", "asl"}
    logits, targets = fixed_batch()
    weight = np.linspace(0.5, 2.0, K).astype(np.float32)
    bce = create_loss("bce", 0.0, K, task="multilabel", class_weights=weight)
    assert type(bce) is MultiLabelBCE
    direct = MultiLabelBCE(K, pos_weight=weight)(ms.Tensor(logits), ms.Tensor(targets))
    assert bce(ms.Tensor(logits), ms.Tensor(targets)).asnumpy() == direct.asnumpy()
    asl = create_loss("asl", 0.0, K, task="multilabel", asl_gamma_neg=2.0, asl_gamma_pos=3.0,
                      asl_clip=0.2, reduction="none")
    assert type(asl) is AsymmetricLoss
    direct = AsymmetricLoss(gamma_neg=2.0, gamma_pos=3.0, clip=0.2, reduction="none")
    np.testing.assert_array_equal(asl(ms.Tensor(logits), ms.Tensor(targets)).asnumpy(),
                                  direct(ms.Tensor(logits), ms.Tensor(targets)).asnumpy())
    ce = create_loss("ce", 0.1, K, reduction="none")  # the reduction reaches multi-class too
    assert type(ce) is CrossEntropySmooth
    assert ce(ms.Tensor(logits), ms.Tensor(np.arange(8, dtype=np.int32) % K)).shape == (8,)


@pytest.mark.parametrize("loss, task, kwargs, message", [
    ("ce", "multilabel", {}, "loss 'ce' is not defined for task multilabel.*asl or bce"),
    ("asl", "multiclass", {}, "loss 'asl' is not defined for task multiclass.*bce or ce"),
    ("bce", "multilabel", {"label_smoothing": 0.1}, "label_smoothing 0.1 .*multilabel"),
    ("asl", "multilabel", {"label_smoothing": 0.2}, "label_smoothing 0.2 .*multilabel"),
    ("bce", "multilabel", {"bce_target_threshold": 0.3}, "bce_target_threshold 0.3"),
    ("asl", "multilabel", {"class_weights": np.ones(K)}, "class_weights.*asl"),
    ("bce", "multilabel", {"class_weights": np.ones(K - 1)}, "pos_weight must be 6"),
    ("asl", "multilabel", {"asl_gamma_neg": -1.0}, r"asl_gamma_neg\) must be >= 0, got -1"),
    ("asl", "multilabel", {"asl_clip": 1.0}, r"asl_clip\) must be in \[0, 1\), got 1.0"),
    ("bce", "multi-label", {}, "task must be one of multiclass, multilabel, got 'multi-label'"),
])
def test_create_loss_refusals_name_key_and_value(loss, task, kwargs, message):
    smoothing = kwargs.pop("label_smoothing", 0.0)
    with pytest.raises(ValueError, match=message):
        create_loss(loss, smoothing, K, task=task, **kwargs)


def test_create_loss_unknown_everywhere_lists_every_name():
    with pytest.raises(KeyError, match="'focal'; valid names: asl, bce, ce"):
        create_loss("focal", 0.0, K, task="multilabel")
