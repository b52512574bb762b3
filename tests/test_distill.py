"""Knowledge distillation (src/training/distill.py): the losses against a torch re-derivation
of timm's ``LogitDistillationTask`` / ``FeatureDistillationTask``, timm's three weighting
modes, the frozen teacher inside ``TrainStep``, what training checkpoints hold, bad input,
a run killed with SIGKILL resumed bit-exact, its exports those of a run without a teacher.
Data parallel: tests/test_distributed.py."""
import json
import os
import signal

import mindspore as ms
import numpy as np
import pytest
import torch
import torch.nn.functional as F
import yaml

from src.models.resnet import create_network
from src.training.distill import (
    Distillation,
    DistillationLoss,
    Teacher,
    build_teacher,
    feature_distillation,
    feature_projection,
    logit_distillation,
    loss_weights,
    tensors_digest,
)
from src.training.loss import create_loss
from src.training.model import StepRecipe, build_train_step
from src.training.resume import restore_training_state
from src.utils.checkpoint import atomic_save_checkpoint, load_into_network, read_checkpoint
from src.utils.image_constants import IMAGENET_MEAN, IMAGENET_STD
from tests.helpers import (
    ROOT,
    copy_class_folders,
    run_in_process,
    sigkill_train_when,
    succeeded,
    train_in_process,
)
from tests.interrupted_run import saved_steps

SAMPLE = os.path.join(ROOT, "data", "cifar10_sample", "train")


def kernel_error(values):
    """The relative error of MindSpore's float32 ``exp`` (under ``softmax``) on ``values`` on
    this machine, at least float32's epsilon."""
    ours = ms.ops.exp(ms.Tensor(values.astype(np.float32))).asnumpy().astype(np.float64)
    exact = np.exp(values.astype(np.float32).astype(np.float64))
    return max(float(np.abs(ours / exact - 1).max()), float(np.finfo(np.float32).eps))


def within_torch_float32(ours, t32, t64, relative):
    """Our float32 result is as close to torch's float64 one as torch's float32 one is, to
    8x, floored at 8x the ``relative`` float32 kernel error of the value's scale."""
    scale = max(float(np.abs(t64).max()), 1e-30)
    bound = 8 * max(float(np.abs(t32 - t64).max()), relative * scale)
    assert float(np.abs(ours - t64).max()) <= bound, (ours, t64, bound)


def torch_logit_kd(student, teacher, temperature):
    """timm's ``LogitDistillationTask`` formula."""
    log_s = F.log_softmax(student / temperature, dim=-1)
    log_t = F.log_softmax(teacher / temperature, dim=-1)
    return F.kl_div(log_s, log_t, reduction="batchmean", log_target=True) * temperature ** 2


def logit_pair(seed, noise):
    """(student, teacher) float32 logits (8, 10) of scale 3: independent (``noise`` None), or
    the student the teacher plus ``noise`` times standard normal noise (near-equal)."""
    rng = np.random.default_rng(seed)
    teacher = (rng.standard_normal((8, 10)) * 3).astype(np.float32)
    if noise is None:
        return (rng.standard_normal((8, 10)) * 3).astype(np.float32), teacher
    return (teacher + noise * rng.standard_normal((8, 10))).astype(np.float32), teacher


def torch_logit_refs(student, teacher, temperature):
    """[(loss, gradient w.r.t. the student's logits)] of timm's formula in torch float32 and
    float64, on the same float32 logits."""
    refs = []
    for dtype in (torch.float32, torch.float64):
        s = torch.tensor(student, dtype=dtype, requires_grad=True)
        ref = torch_logit_kd(s, torch.tensor(teacher, dtype=dtype), temperature)
        ref.backward()
        refs.append((ref.detach().numpy(), s.grad.numpy()))
    return refs


@pytest.mark.parametrize("temperature", [1.0, 3.0, 4.0])
@pytest.mark.parametrize("noise", [None, 1e-3, 1e-1])
def test_logit_loss_and_gradient_equal_torch(temperature, noise):
    """Independent logits, and a student near the teacher (the teacher plus noise): within 8x
    torch float32's own error against float64; independent logits floored at MindSpore's
    ``exp`` kernel error (about 5e-6 relative on CPU, 40x float32's epsilon), near-equal ones
    at float32's epsilon (the series form uses no exp of the difference). At noise 0.1 the
    log-softmax difference was 2.5e-4 (T 1) and 6.6e-3 (T 4) relative off, torch 2e-6 and
    1.3e-4."""
    student, teacher = logit_pair(3, noise)
    loss, grad = ms.value_and_grad(lambda s: logit_distillation(
        s, ms.Tensor(teacher), temperature))(ms.Tensor(student))
    refs = torch_logit_refs(student, teacher, temperature)
    if noise is None:
        relative = kernel_error(np.concatenate([student, teacher]) / temperature)
    else:
        relative = float(np.finfo(np.float32).eps)
    within_torch_float32(loss.asnumpy(), refs[0][0], refs[1][0], relative)
    within_torch_float32(grad.asnumpy(), refs[0][1], refs[1][1], relative)


@pytest.mark.parametrize("temperature", [1.0, 3.0, 4.0])
def test_near_equal_logit_loss_at_float32_level(temperature):
    """Student = teacher + 1e-3 noise: the KL (about 3e-7) is a second-order quantity that
    torch float32's log-softmax difference gets 11% to 150% wrong; ours stays within 8x
    MindSpore's exp kernel error of the float64 value (measured 1e-7 to 6e-7 relative; the
    log-softmax difference was 8e-2 to 1.0 off), its gradient within 8x float32's epsilon
    of the largest entry."""
    student, teacher = logit_pair(5, 1e-3)
    loss, grad = ms.value_and_grad(lambda s: logit_distillation(
        s, ms.Tensor(teacher), temperature))(ms.Tensor(student))
    (t32, g32), (t64, g64) = torch_logit_refs(student, teacher, temperature)
    relative = kernel_error(np.concatenate([student, teacher]) / temperature)
    ours = float(loss.asnumpy())
    print(f"\n[kd T={temperature}] float64 {float(t64):.4e}; relative error ours "
          f"{abs(ours / t64 - 1):.1e}, torch float32 {abs(t32 / t64 - 1):.1e}")
    assert abs(ours / t64 - 1) <= 8 * relative, (ours, t64, t32)
    scale = float(np.abs(g64).max())
    assert float(np.abs(grad.asnumpy() - g64).max()) <= 8 * np.finfo(np.float32).eps * scale


def test_feature_loss_and_gradient_equal_torch():
    rng = np.random.default_rng(4)
    student = rng.standard_normal((8, 16)).astype(np.float32)
    teacher = rng.standard_normal((8, 16)).astype(np.float32)
    loss, grad = ms.value_and_grad(lambda s: feature_distillation(s, ms.Tensor(teacher)))(
        ms.Tensor(student))
    refs = []
    for dtype in (torch.float32, torch.float64):
        s = torch.tensor(student, dtype=dtype, requires_grad=True)
        ref = F.mse_loss(s, torch.tensor(teacher, dtype=dtype))
        ref.backward()
        refs.append((ref.detach().numpy(), s.grad.numpy()))
    relative = float(np.finfo(np.float32).eps)
    within_torch_float32(loss.asnumpy(), refs[0][0], refs[1][0], relative)
    within_torch_float32(grad.asnumpy(), refs[0][1], refs[1][1], relative)


@pytest.mark.parametrize("distill, task, expected", [
    (None, None, (1.0, 1.0)),  # neither: both 1.0
    (None, 0.3, (0.3, 0.7)),  # only the task weight: complementary
    (2.0, None, (1.0, 2.0)),  # the distill weight: independent, task 1.0
    (0.5, 0.25, (0.25, 0.5)),  # both: independent
    (0.0, 1.0, (1.0, 0.0)),
])
def test_timms_three_weighting_modes(distill, task, expected):
    assert loss_weights(distill, task) == expected


def test_complementary_weight_below_zero_refused():
    with pytest.raises(ValueError, match="1 - task"):
        loss_weights(None, 1.5)


def test_teacher_renormalizes_as_timm_normalize_input():
    net = create_network("resnet18", class_num=10)
    rng = np.random.default_rng(5)
    image = rng.standard_normal((2, 3, 32, 32)).astype(np.float32)
    t_mean, t_std = (0.5, 0.5, 0.5), (0.5, 0.5, 0.5)
    teacher = Teacher(net, teacher_norm=(t_mean, t_std))
    teacher.set_train(False)
    s_mean = np.reshape(IMAGENET_MEAN, (1, 3, 1, 1))
    s_std = np.reshape(IMAGENET_STD, (1, 3, 1, 1))
    timm_input = (image * s_std + s_mean - np.reshape(t_mean, (1, 3, 1, 1))) / np.reshape(
        t_std, (1, 3, 1, 1))
    expected = net(ms.Tensor(timm_input.astype(np.float32))).asnumpy()
    ours = teacher(ms.Tensor(image)).asnumpy()
    np.testing.assert_allclose(ours, expected, rtol=1e-4, atol=1e-5)
    same = Teacher(create_network("resnet18", class_num=10))
    assert not same.renormalize and teacher.renormalize


def test_total_is_weighted_task_plus_distill_loss():
    """PyNative: ``DistillationLoss`` = 0.3 CE(student) + 0.7 KL(teacher || student) as
    timm's, both networks in eval mode (the teacher always is)."""
    student = create_network("resnet18", class_num=10)
    teacher_net = create_network("resnet18", class_num=10)
    student.set_train(False)
    rng = np.random.default_rng(6)
    image = rng.standard_normal((2, 3, 32, 32)).astype(np.float32)
    label = np.array([1, 7], np.int32)
    s_logits = student(ms.Tensor(image)).asnumpy()
    t_logits = teacher_net(ms.Tensor(image)).asnumpy()
    cell = DistillationLoss(student, create_loss("ce", 0.1, 10), Teacher(teacher_net),
                            distill_type="logit", temperature=2.0, task_weight=0.3,
                            distill_weight=0.7)
    cell.set_train(False)
    total = float(cell(ms.Tensor(image), ms.Tensor(label)).asnumpy())
    task, distill = (float(p.asnumpy()) for p in cell.parts)
    ce = F.cross_entropy(torch.tensor(s_logits, dtype=torch.float64),
                         torch.tensor(label).long(), label_smoothing=0.1)
    assert task == pytest.approx(float(ce), rel=1e-5)  # as tests/test_loss.py
    kd = logit_distillation(ms.Tensor(s_logits), ms.Tensor(t_logits), 2.0)  # checked above
    assert distill == pytest.approx(float(kd.asnumpy()), rel=1e-6)
    assert total == pytest.approx(0.3 * task + 0.7 * distill, rel=1e-6)


# ---- the teacher inside TrainStep ----

def distillation(teacher_net, *, distill_type="logit", task_weight=1.0, distill_weight=1.0,
                 projection=None):
    teacher = Teacher(teacher_net, features=distill_type == "feature")
    return Distillation(teacher=teacher, distill_type=distill_type, temperature=4.0,
                        task_weight=task_weight, distill_weight=distill_weight,
                        projection=projection, source="test", digest=tensors_digest(teacher))


def recipe(distill=None, accumulation=1):
    return StepRecipe(amp_level="O0", device_target="CPU", class_num=10,
                      loss_kwargs={"loss": "ce"}, distill=distill,
                      grad_accumulation_steps=accumulation)


def test_frozen_teacher_and_zero_weight_step_equals_a_plain_step():
    """Two accumulated micro-batches per step, 2 steps: the teacher's tensors (BatchNorm
    statistics included) stay bit-identical, it has no optimizer state, and with distill
    weight 0 the student ends where a plain ``TrainStep`` does."""
    ms.set_seed(0)
    student = create_network("resnet18", class_num=10)
    twin = create_network("resnet18", class_num=10)
    ms.load_param_into_net(twin, {p.name: ms.Parameter(p.value().copy(), name=p.name)
                                  for p in student.get_parameters()})
    teacher_net = create_network("resnet18", class_num=10)
    distill = distillation(teacher_net, distill_weight=0.0)
    before = {p.name: p.asnumpy().copy() for p in teacher_net.get_parameters()}
    step = build_train_step(student, 0.05, recipe(distill, accumulation=2))
    plain = build_train_step(twin, 0.05, recipe(accumulation=2))
    assert not [p.name for p in step.optimizer.parameters if p.name.startswith("kd_teacher.")]
    assert all(not p.requires_grad for p in teacher_net.get_parameters())
    rng = np.random.default_rng(7)
    step.set_train()
    plain.set_train()
    for _ in range(4):
        image = ms.Tensor(rng.standard_normal((4, 3, 32, 32)).astype(np.float32))
        label = ms.Tensor(rng.integers(0, 10, 4).astype(np.int32))
        loss, plain_loss = step(image, label), plain(image, label)
        assert float(loss.asnumpy()) == float(plain_loss.asnumpy())
    task, distilled = (float(p.asnumpy()) for p in step.network.parts)
    assert distilled > 0 and task > 0
    for p in teacher_net.get_parameters():
        np.testing.assert_array_equal(p.asnumpy(), before[p.name], err_msg=p.name)
    twin_params = {p.name: p.asnumpy() for p in twin.get_parameters()}
    for p in student.get_parameters():
        np.testing.assert_array_equal(p.asnumpy(), twin_params[p.name], err_msg=p.name)


def test_projection_checkpointed_and_restored_teacher_never_saved(tmp_path):
    """A feature-distilling training cell (ResNet-18 student, ResNet-50 teacher: 512 -> 2048):
    its checkpoint holds the projection and its optimizer state, no teacher tensor and no
    loss part; a fresh cell restores the projection; the student loads strictly from it."""
    student = create_network("resnet18", class_num=10)
    projection = feature_projection(512, 2048)
    distill = distillation(create_network("resnet50", class_num=10), distill_type="feature",
                           projection=projection)
    step = build_train_step(student, 0.05, recipe(distill))
    assert {p.name for p in step.optimizer.parameters} >= {"kd_proj.weight", "kd_proj.bias"}
    projection.weight.set_data(ms.Tensor(np.full((2048, 512), 0.25, np.float32)))
    path = str(tmp_path / "step.ckpt")
    atomic_save_checkpoint(step, path, {"train_step": 0, "run_config": "{}"})
    names = set(read_checkpoint(path))
    assert {"kd_proj.weight", "kd_proj.bias", "moments.kd_proj.weight"} <= names
    assert not [n for n in names if n.startswith(("kd_teacher.", "kd_loss."))]
    fresh_projection = feature_projection(512, 2048)
    fresh = build_train_step(create_network("resnet18", class_num=10), 0.05, recipe(
        distillation(create_network("resnet50", class_num=10), distill_type="feature",
                     projection=fresh_projection)))
    restore_training_state(fresh, path)
    np.testing.assert_array_equal(fresh_projection.weight.asnumpy(), 0.25)
    plain_student = create_network("resnet18", class_num=10)
    load_into_network(plain_student, path)  # strict: the student's names, nothing more
    assert feature_projection(512, 512) is None


class FixedOutput(ms.nn.Cell):
    """A stand-in network: its output is a tensor of its own (a Parameter when ``trainable``),
    whatever the image; ``pre_logits`` gives the same and ``fc`` maps it to ``classes``."""

    def __init__(self, value, *, trainable=False, classes=None):
        super().__init__()
        if trainable:
            self.value = ms.Parameter(ms.Tensor(value), name="value")
        else:
            self.value = ms.Tensor(value)
        if classes is not None:
            self.fc = ms.nn.Dense(value.shape[1], classes)

    def construct(self, image):
        return self.value * 1.0

    def pre_logits(self, image):
        return self.value * 1.0


@pytest.mark.parametrize("distill_type", ["logit", "feature"])
@pytest.mark.parametrize("noise", [None, 1e-2])
def test_gradient_through_the_cell_reaches_the_student_as_torch(distill_type, noise):
    """``DistillationLoss`` (task weight 0, distill weight 1) of a student whose logits, or
    pooled features (through a 6 -> 4 projection), are a parameter: their gradient equals
    torch's of timm's formula (KL at T 4; MSE of the projected features) within 8x torch
    float32's own error against float64 (floored as in the loss tests above)."""
    student_out, teacher_out = logit_pair(11, noise)
    rng = np.random.default_rng(12)
    label = ms.Tensor(np.arange(8, dtype=np.int32) % 10)
    image = ms.Tensor(np.zeros((8, 3, 32, 32), np.float32))
    projection = None
    if distill_type == "feature":
        student_out = student_out[:, :6].copy()
        teacher_out = teacher_out[:, :4].copy()
        weight = (rng.standard_normal((4, 6)) * 0.5).astype(np.float32)
        bias = (rng.standard_normal(4) * 0.1).astype(np.float32)
        projection = ms.nn.Dense(6, 4, weight_init=ms.Tensor(weight),
                                 bias_init=ms.Tensor(bias))
    student = FixedOutput(student_out, trainable=True, classes=10)
    teacher = Teacher(FixedOutput(teacher_out, classes=10), features=distill_type == "feature")
    cell = DistillationLoss(student, create_loss("ce", 0.0, 10), teacher,
                            distill_type=distill_type, temperature=4.0, task_weight=0.0,
                            distill_weight=1.0, projection=projection)
    grad = ms.grad(cell, grad_position=None, weights=[student.value])(image, label)[0]
    refs = []
    for dtype in (torch.float32, torch.float64):
        s = torch.tensor(student_out, dtype=dtype, requires_grad=True)
        t = torch.tensor(teacher_out, dtype=dtype)
        if distill_type == "logit":
            ref = torch_logit_kd(s, t, 4.0)
        else:
            ref = F.mse_loss(F.linear(s, torch.tensor(weight, dtype=dtype),
                                      torch.tensor(bias, dtype=dtype)), t)
        ref.backward()
        refs.append(s.grad.numpy())
    assert float(np.abs(refs[1]).max()) > 0
    relative = float(np.finfo(np.float32).eps)
    if distill_type == "logit" and noise is None:  # softmax's exp, as above
        relative = kernel_error(np.concatenate([student_out, teacher_out]) / 4.0)
    within_torch_float32(grad.asnumpy(), refs[0], refs[1], relative)


@pytest.mark.parametrize("distill_type", ["logit", "feature"])
def test_one_distillation_step_moves_the_student_and_projection(distill_type):
    """One ``TrainStep`` with task weight 0 and distill weight 1 (ResNet-18 student at 32
    px; a ResNet-18 teacher for logits, a ResNet-50 one for features, 512 -> 2048): every
    trainable tensor of the student on the distillation's path moves (all of them for
    logits; all but ``fc`` for features, which only the task loss reaches), and the
    projection; the gradient is the distillation's alone."""
    ms.set_seed(1)
    student = create_network("resnet18", class_num=10)
    teacher_net = create_network("resnet50" if distill_type == "feature" else "resnet18",
                                 class_num=10)
    projection = feature_projection(512, 2048) if distill_type == "feature" else None
    distill = distillation(teacher_net, distill_type=distill_type, task_weight=0.0,
                           projection=projection)
    step = build_train_step(student, 0.05, recipe(distill))
    moving = [p for p in student.trainable_params()
              if distill_type == "logit" or not p.name.startswith("fc.")]
    if projection is not None:
        moving += list(projection.trainable_params())
    before = {p.name: p.asnumpy().copy() for p in moving}
    fc_before = student.fc.weight.asnumpy().copy()
    rng = np.random.default_rng(8)
    step.set_train()
    step(ms.Tensor(rng.standard_normal((4, 3, 32, 32)).astype(np.float32)),
         ms.Tensor(rng.integers(0, 10, 4).astype(np.int32)))
    still = [p.name for p in moving if np.array_equal(p.asnumpy(), before[p.name])]
    assert not still, f"not moved by the distillation loss: {still}"
    if distill_type == "feature":  # task weight 0: nothing reaches fc
        np.testing.assert_array_equal(student.fc.weight.asnumpy(), fc_before)


def test_resume_says_the_teacher_is_not_loaded_in_one_line(tmp_path, capfd, caplog):
    """Restoring a distilling training cell: one log line says the teacher's 102 tensors (a
    ResNet-18's) are not loaded from the checkpoint and why, instead of MindSpore's warning
    naming each of them (about 10 KB for a ResNet-50 teacher); nothing else is said."""
    def step():
        return build_train_step(create_network("resnet18", class_num=10), 0.05, recipe(
            distillation(create_network("resnet18", class_num=10))))

    path = str(tmp_path / "step.ckpt")
    atomic_save_checkpoint(step(), path, {"train_step": 0, "run_config": "{}"})
    fresh = step()
    capfd.readouterr()
    with caplog.at_level("INFO"):
        restore_training_state(fresh, path)
    err = capfd.readouterr().err
    assert "kd_teacher.conv1.weight" not in err and "are not loaded" not in err, err[:2000]
    lines = [r.getMessage() for r in caplog.records if "not loaded" in r.getMessage()]
    assert lines == ["the 102 parameters of the distillation teacher (kd_teacher.*) are not "
                     "loaded from the checkpoint: the teacher is loaded from kd_teacher"]
    assert not [r for r in caplog.records if r.levelname == "WARNING"
                and r.name.startswith("src.")]


# ---- the teacher's weights ----

@pytest.mark.parametrize("args, weights", [
    ([], (1.0, 1.0)),  # neither set: both 1
    (["--task_loss_weight", "0.25"], (0.25, 0.75)),  # the task weight alone: distill = 1 - it
    (["--distill_loss_weight", "2.0"], (1.0, 2.0)),  # the distill weight: independent
    (["--distill_loss_weight", "2.0", "--task_loss_weight", "0.5"], (0.5, 2.0))])
def test_distill_config_is_a_new_config_with_timms_loss_weights(args, weights):
    """The weights by timm's rules (its train.py: ``--distill-loss-weight`` set makes the two
    independent, else distill = 1 - task), in a new config; the parsed one keeps its values."""
    from src.recipe import distill_config
    from src.utils.config import parse_config

    cfg = parse_config(["--kd_teacher", "teacher.ckpt", *args])
    before = dict(cfg)
    resolved = distill_config(cfg)
    assert (resolved.task_loss_weight, resolved.distill_loss_weight) == weights
    assert dict(cfg) == before and resolved.user_keys == cfg.user_keys
    no_teacher = parse_config(args)
    assert distill_config(no_teacher) is no_teacher  # nothing to resolve


def test_build_teacher_checks_network_and_class_count(tmp_path):
    path = str(tmp_path / "teacher.ckpt")
    ms.save_checkpoint(create_network("resnet18", class_num=10), path)
    teacher, arch, width = build_teacher(path, net_name="", class_num=10, amp_level="O0",
                                         device_target="CPU")
    assert (arch, width) == ("resnet18", 512)
    assert all(p.name.startswith("kd_teacher.") for p in teacher.get_parameters())
    with pytest.raises(ValueError, match="kd_teacher .* has 10 classes but class_num is 5"):
        build_teacher(path, net_name="", class_num=5, amp_level="O0", device_target="CPU")
    with pytest.raises(ValueError, match="holds a resnet18 but kd_net_name is resnet50"):
        build_teacher(path, net_name="resnet50", class_num=10, amp_level="O0",
                      device_target="CPU")


def timm_folder_teacher(folder):
    """A random 10-class ResNet-18 and ``folder`` holding it in timm's form (model.safetensors in
    torchvision's names, config.json asking for mean/std 0.5)."""
    from safetensors.numpy import save_file

    from src.deploy.publish import torchvision_state

    net = create_network("resnet18", class_num=10)
    folder.mkdir()
    save_file(torchvision_state(net), str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps({
        "architecture": "resnet18", "num_classes": 10,
        "pretrained_cfg": {"mean": [0.5, 0.5, 0.5], "std": [0.5, 0.5, 0.5]}}))
    return net, folder


def test_safetensors_folder_teacher_with_its_own_normalization(tmp_path):
    """A timm-form folder (model.safetensors in torchvision's names, config.json asking for
    mean/std 0.5): loaded as the teacher, renormalized for; its digest is that of its tensors."""
    net, folder = timm_folder_teacher(tmp_path / "teacher")
    teacher, arch, _ = build_teacher(str(folder), net_name="resnet18", class_num=10,
                                     amp_level="O0", device_target="CPU")
    assert arch == "resnet18" and teacher.renormalize
    np.testing.assert_allclose(teacher.shift.asnumpy().ravel(),
                               (np.array(IMAGENET_MEAN) - 0.5) / 0.5, rtol=1e-6)
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "model.safetensors").write_bytes((folder / "model.safetensors").read_bytes())
    (bad / "config.json").write_text(json.dumps({"pretrained_cfg": {"std": [0.5, 0, 0.5]}}))
    with pytest.raises(ValueError, match=r"pretrained_cfg std \[0.5, 0, 0.5\]; expected 3"):
        build_teacher(str(bad), net_name="", class_num=10, amp_level="O0", device_target="CPU")
    same = Teacher(net)
    assert tensors_digest(teacher) == tensors_digest(same)



def test_hub_teacher_from_an_offline_cache(tmp_path, monkeypatch):
    """``kd_teacher hf-hub:ORG/NAME`` with HF_HUB_OFFLINE=1, from a cache in huggingface_hub's
    own layout: the same teacher as the folder it was made from (network, normalization,
    tensors)."""
    from huggingface_hub import constants

    from src.utils import hub
    from tests.test_hub import add_to_hub_cache

    net, folder = timm_folder_teacher(tmp_path / "teacher")
    cache = tmp_path / "cache"
    add_to_hub_cache(str(cache), "someone/resnet18-teacher", str(folder))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    hub._download.cache_clear()
    try:
        teacher, arch, width = build_teacher("hf-hub:someone/resnet18-teacher", net_name="",
                                             class_num=10, amp_level="O0",
                                             device_target="CPU")
    finally:
        hub._download.cache_clear()
    assert (arch, width) == ("resnet18", 512) and teacher.renormalize
    assert tensors_digest(teacher) == tensors_digest(Teacher(net))

def test_digest_changes_with_any_tensor():
    net = create_network("resnet18", class_num=10)
    first = tensors_digest(net)
    assert tensors_digest(net) == first and len(first) == 64
    net.fc.bias.set_data(net.fc.bias.value() + 1e-3)
    assert tensors_digest(net) != first


# ---- bad input: named, exit 2, nothing written ----

@pytest.fixture(scope="module")
def teacher_file(tmp_path_factory):
    folder = tmp_path_factory.mktemp("teacher")
    path = str(folder / "teacher.ckpt")
    ms.save_checkpoint(create_network("resnet18", class_num=2), path)
    return path


@pytest.mark.parametrize("args, message", [
    (["--kd_teacher", "{missing}"], "not found"),
    (["--kd_teacher", "{teacher}", "--class_num", "3"], "has 2 classes but class_num is 3"),
    (["--kd_teacher", "{teacher}", "--kd_net_name", "resnet34"], "kd_net_name is resnet34"),
    (["--kd_teacher", "{teacher}", "--kd_temperature", "0"], "kd_temperature"),
    (["--kd_teacher", "{teacher}", "--distill_loss_weight", "-1"], "distill_loss_weight"),
    (["--kd_teacher", "{teacher}", "--task_loss_weight", "1.5"], "1 - task"),
])
def test_bad_distillation_input_named_nothing_written(tmp_path, teacher_file, args, message):
    data = copy_class_folders(SAMPLE, str(tmp_path / "data"), 4, classes=["cat", "dog"])
    out = tmp_path / "out"
    args = [a.format(missing=tmp_path / "none.ckpt", teacher=teacher_file) for a in args]
    class_num = [] if "--class_num" in args else ["--class_num", "2"]
    result = run_in_process(
        "train.py", "--config_path", os.path.join(ROOT, "configs", "quick_start.yaml"),
        "--run_eval", "false", "--batch_size", "4", "--num_parallel_workers", "1",
        "--data_path", data, "--output_dir", out, *class_num, *args)
    assert result.returncode == 2, result.stderr[-2000:]
    assert message in result.stderr and "Traceback" not in result.stderr
    assert not out.exists() or not [f for f in os.listdir(out) if not f.startswith(".")]


# ---- end to end ----

# ResNet-18 student, 16 real images of 2 classes at 32 px, batch 4: 4 steps, 1 epoch.
STEPS_PER_EPOCH = 4


@pytest.fixture(scope="module")
def feature_distilled(tmp_path_factory):
    """train.py distilling a ResNet-50 teacher's pooled features into a ResNet-18 (a 512 ->
    2048 projection), uninterrupted: {"common": train.py's arguments but ``--output_dir``,
    "teacher": the teacher's .ckpt, "whole": the run's output folder}."""
    root = tmp_path_factory.mktemp("feature_distilled")
    data = copy_class_folders(SAMPLE, str(root / "data"), 8, classes=["cat", "dog"])
    teacher = str(root / "teacher.ckpt")
    ms.save_checkpoint(create_network("resnet50", class_num=2), teacher)
    common = ["--config_path", os.path.join(ROOT, "configs", "quick_start.yaml"),
              "--run_eval", "false", "--batch_size", "4", "--num_parallel_workers", "1",
              "--class_num", "2", "--data_path", data, "--kd_teacher", teacher,
              "--kd_distill_type", "feature", "--task_loss_weight", "0.25", "--epoch_size", "1",
              "--save_checkpoint_epochs", "1", "--log_interval", "1"]
    whole = root / "whole"
    assert train_in_process(*common, "--output_dir", whole) == 0
    return {"common": common, "teacher": teacher, "whole": whole}


@pytest.mark.slow
def test_train_with_a_teacher_killed_resumes_bit_exact_another_teacher_refused(
        tmp_path, capsys, feature_distilled):
    """train.py distils a ResNet-50 teacher's pooled features (a 512 -> 2048 projection) into
    a ResNet-18: killed with SIGKILL mid-epoch (saving every step) and resumed with
    ``--resume_ckpt auto``, it ends bit-identical to an uninterrupted run (student, projection,
    optimizer state; the records' loss parts); its checkpoints hold no teacher tensor and the
    teacher's digest; a resume whose teacher file changed is refused naming it (exit 2)."""
    common, teacher, whole = (feature_distilled[k] for k in ("common", "teacher", "whole"))
    killed = tmp_path / "killed"
    run = sigkill_train_when(
        [*common, "--output_dir", killed, "--save_checkpoint_steps", "1"],
        lambda: saved_steps(killed, STEPS_PER_EPOCH)[-1:] >= [2])
    assert run.returncode == -signal.SIGKILL, f"not killed: exit {run.returncode}\n" \
                                              f"{run.stderr[-3000:]}"
    done = saved_steps(killed, STEPS_PER_EPOCH)
    assert done[-1] % STEPS_PER_EPOCH, f"not killed mid-epoch: {done}"
    assert "task_loss" in run.stdout + run.stderr
    capsys.readouterr()
    assert train_in_process(*common, "--output_dir", killed, "--resume_ckpt", "auto") == 0
    assert f"{done[-1]} steps done" in capsys.readouterr().out

    records = {folder: [json.loads(line) for line in (folder / "metrics.jsonl").read_text()
                        .splitlines()] for folder in (killed, whole)}
    timing = ("time_s", "img_per_s")
    assert [r["epoch"] for r in records[whole]] == [1]
    assert all(r["task_loss"] > 0 and r["distill_loss"] > 0 for r in records[whole])
    for again, reference in zip(records[killed], records[whole], strict=True):
        assert {k: v for k, v in again.items() if k not in timing} == {
            k: v for k, v in reference.items() if k not in timing}
    final = f"resnet18-1_{STEPS_PER_EPOCH}.ckpt"
    reference, params = (read_checkpoint(str(folder / final)) for folder in (whole, killed))
    assert {"kd_proj.weight", "kd_proj.bias", "moments.kd_proj.weight"} <= set(reference)
    assert not [n for n in reference if n.startswith(("kd_teacher.", "kd_loss."))]
    assert set(params) == set(reference)
    for name, value in reference.items():
        if isinstance(value, str):  # the run's config (it says resume_ckpt auto), loss sums
            assert name == "run_config" or params[name] == value, name
        else:
            np.testing.assert_array_equal(params[name].asnumpy(), value.asnumpy(), name)
    stored = json.loads(reference["run_config"])
    assert stored["kd_teacher"] == teacher and len(stored["kd_teacher_sha256"]) == 64
    # the weights it trained with, resolved (timm: distill = 1 - task), in the run's records
    written = yaml.safe_load((whole / "config.yaml").read_text())
    assert (stored["task_loss_weight"], stored["distill_loss_weight"]) == (0.25, 0.75)
    assert (written["task_loss_weight"], written["distill_loss_weight"]) == (0.25, 0.75)
    assert json.loads(params["run_config"])["kd_teacher_sha256"] == stored["kd_teacher_sha256"]

    # another teacher in the file (the fixture's last use of it)
    ms.save_checkpoint(create_network("resnet50", class_num=2), teacher)
    refused = run_in_process("train.py", *common, "--output_dir", killed, "--resume_ckpt",
                             "auto")
    assert refused.returncode == 2 and "kd_teacher_sha256" in refused.stderr, refused.stderr


def safetensors_header(path):
    """A .safetensors file's tensors: {name: (dtype, shape)} (its JSON header)."""
    with open(path, "rb") as f:
        size = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(size))
    return {k: (v["dtype"], v["shape"]) for k, v in header.items() if k != "__metadata__"}


@pytest.mark.slow
def test_exports_of_a_distilled_run_are_a_plain_runs_in_size_and_names(tmp_path,
                                                                       feature_distilled):
    """The last checkpoint of the feature-distilled run (student, ``kd_proj.*`` projection
    and its optimizer state) and of the same run without a teacher, exported by export.py:
    MINDIR of the same size and parameter names, SAFETENSORS with the same
    ``model.safetensors`` size and tensors (names, dtypes, shapes) and the same
    ``config.json``: no trace of the teacher or the projection (ONNX is written from the same
    loaded network as MINDIR)."""
    from tests.test_drop_path import mindir_graph
    plain = tmp_path / "plain"
    common = feature_distilled["common"]
    distilling = ("--kd_teacher", "--kd_distill_type", "--task_loss_weight")
    without = [value for pair in zip(common[::2], common[1::2]) if pair[0] not in distilling
               for value in pair]  # common is flag, value pairs
    assert train_in_process(*without, "--output_dir", plain) == 0
    final = f"resnet18-1_{STEPS_PER_EPOCH}.ckpt"
    checkpoints = {"distilled": str(feature_distilled["whole"] / final),
                   "plain": str(plain / final)}
    assert "kd_proj.weight" in read_checkpoint(checkpoints["distilled"])
    assert "kd_proj.weight" not in read_checkpoint(checkpoints["plain"])
    files = {}
    for run, ckpt in checkpoints.items():
        for fmt, suffix in (("MINDIR", ".mindir"), ("SAFETENSORS", "")):
            name = str(tmp_path / f"{run}_{fmt}")
            succeeded(run_in_process(
                "export.py", "--config_path", os.path.join(ROOT, "configs", "quick_start.yaml"),
                "--class_num", "2", "--device_target", "CPU", "--checkpoint_path", ckpt,
                "--file_format", fmt, "--file_name", name))
            files[run, fmt] = name + suffix
    sizes = {run: os.path.getsize(files[run, "MINDIR"]) for run in checkpoints}
    print(f"\n[distill] MINDIR sizes {sizes}")
    assert sizes["distilled"] == sizes["plain"]
    names = {run: mindir_graph(files[run, "MINDIR"])[1] for run in checkpoints}
    assert names["distilled"] == names["plain"] and "fc.weight" in names["plain"]
    folders = {run: files[run, "SAFETENSORS"] for run in checkpoints}
    weights = {run: os.path.join(folder, "model.safetensors") for run, folder in folders.items()}
    assert os.path.getsize(weights["distilled"]) == os.path.getsize(weights["plain"])
    tensors = {run: safetensors_header(path) for run, path in weights.items()}
    assert tensors["distilled"] == tensors["plain"] and "fc.weight" in tensors["plain"]
    configs = {run: (tmp_path / f"{run}_SAFETENSORS" / "config.json").read_text()
               for run in checkpoints}
    assert configs["distilled"] == configs["plain"]
    for text in (*names["distilled"], *tensors["distilled"]):
        assert not text.startswith(("kd_", "moments.")), text
