"""Train the PyTorch reference ResNet with train.py's recipe: the twin of train.py for parity runs.

    python benchmarks/torch_reference_train.py --config_path configs/resnet18_cifar10.yaml \
        --data_path ../shared/data/cifar10/train --eval_data_path ../shared/data/cifar10/test \
        --run_eval true --epoch_size 5 --seed 1 --pre_trained init_seed1.ckpt --output_dir out/torch

Same command line and config files as train.py (``src.utils.config.parse_config``), and the same
recipe in PyTorch terms:

- network: ``tests/torch_resnet.py`` (torchvision's layout), from ``--pre_trained``: one of our
  ``.ckpt`` files (converted with ``tools/convert_torch_checkpoint.py``) or a torch ``.pth``;
- LR: one value per step, computed here from the recipe's keys (``lr_per_step``: linear scaling
  with the batch, linear warmup, then cosine / linear / step decay, NVIDIA's formulas), not
  imported from ``src.training.lr_schedule``, so a mistake there shows as a difference;
- optimizer: ``torch.optim.SGD`` (the recipe's momentum, or the momentum optimizer's declared
  default; no dampening) with weight decay on convolution and linear weights only, BatchNorm
  and biases none (NVIDIA's rule, ``src/training/optimizer.py``);
- loss: ``torch.nn.CrossEntropyLoss(label_smoothing=eps)`` (``src/training/loss.py``'s convention);
- BatchNorm: torch's momentum 0.1, eps 1e-5 (ours: MindSpore momentum 0.9, the same update);
- augmentation: torchvision's ``RandomResizedCrop`` (area ``train_crop_scale``, aspect 3/4-4/3,
  10 tries then a center crop; bilinear) + ``RandomHorizontalFlip`` + ``Normalize``; eval:
  ``Resize(eval_resize)`` + ``CenterCrop(image_size)`` on Pillow images. Written with Pillow
  and numpy (torchvision's wheel does not import beside the CPU torch build used here);
- data: one shuffled pass per epoch, the last partial batch dropped; every eval image counted.

Randomness is torch/numpy's own (seeded by ``seed``): data order and augmentation are not
MindSpore's, so a run of ours and of this twin with the same seed differ as two seeds do.
Outputs in ``--output_dir``: ``metrics.jsonl`` in train.py's format (one JSON line per epoch:
epoch, step, loss, lr, time_s, img_per_s, overflow_steps, top1/top5/eval_loss/best_top1 when
evaluating), ``config.yaml`` (the resolved config), ``train.log`` and ``NET-final.pth`` (the
final weights).
Float32 only, on CPU or one CUDA GPU (``--device_target GPU``). torch is a dev dependency.
"""
import json
import math
import os
import sys
import time

import numpy as np
import torch
from PIL import Image

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from src.data.image_check import check_image_folder, is_image_name  # noqa: E402
from src.training.optimizer import optimizer_hyperparameters  # noqa: E402
from src.utils.cli import run_entry_point  # noqa: E402
from src.utils.config import ConfigError, parse_config  # noqa: E402
from src.utils.errors import MissingFileError  # noqa: E402
from src.utils.logger import get_logger  # noqa: E402
from tests.torch_resnet import torch_resnet  # noqa: E402

# torchvision's ImageNet mean / std, in units of 0-255 pixel values (as src/data/pipeline.py).
MEAN = np.array([0.485, 0.456, 0.406], np.float32) * 255
STD = np.array([0.229, 0.224, 0.225], np.float32) * 255
CROP_RATIO = (3.0 / 4.0, 4.0 / 3.0)
CROP_ATTEMPTS = 10


# ---- data: torchvision's transforms on Pillow images ----

def random_resized_crop_box(rng, height, width, scale, ratio=CROP_RATIO):
    """The crop of torchvision's ``RandomResizedCrop.get_params``, drawn from ``rng``.

    Up to 10 tries of an area fraction uniform in ``scale`` and an aspect ratio log-uniform in
    ``ratio``; the first that fits is placed uniformly; else a center crop of the whole image
    clamped to ``ratio``. MindSpore's ``RandomCropDecodeResize`` draws the same distribution
    (its C++ ``RandomCropAndResizeOp::GetCropBox`` rounds the height from the rounded width,
    torchvision from the area: a difference of at most one pixel).

    Args:
        rng (numpy.random.Generator): Source of randomness.
        height (int): Image height, pixels.
        width (int): Image width, pixels.
        scale (tuple(float, float)): Area range, fraction of the image.
        ratio (tuple(float, float)): Aspect ratio (width / height) range.

    Returns:
        tuple(int, int, int, int): (top, left, crop height, crop width), pixels.
    """
    area = height * width
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(CROP_ATTEMPTS):
        target_area = area * rng.uniform(scale[0], scale[1])
        aspect = math.exp(rng.uniform(*log_ratio))
        w = int(round(math.sqrt(target_area * aspect)))
        h = int(round(math.sqrt(target_area / aspect)))
        if 0 < w <= width and 0 < h <= height:
            return int(rng.integers(0, height - h + 1)), int(rng.integers(0, width - w + 1)), h, w
    in_ratio = width / height
    if in_ratio < ratio[0]:
        w, h = width, int(round(width / ratio[0]))
    elif in_ratio > ratio[1]:
        h, w = height, int(round(height * ratio[1]))
    else:
        h, w = height, width
    return (height - h) // 2, (width - w) // 2, h, w


def normalize(image):
    """Pillow RGB image -> float32 CHW array, ImageNet mean/std normalized (ToTensor+Normalize)."""
    return ((np.asarray(image, np.float32) - MEAN) / STD).transpose(2, 0, 1)


def train_transform(image, rng, image_size, crop_scale):
    """torchvision train transforms: RandomResizedCrop (bilinear), RandomHorizontalFlip(0.5),
    ToTensor, Normalize. Returns float32 (3, image_size, image_size)."""
    top, left, h, w = random_resized_crop_box(rng, image.height, image.width, crop_scale)
    image = image.crop((left, top, left + w, top + h)).resize((image_size, image_size),
                                                              Image.BILINEAR)
    if rng.random() < 0.5:
        image = image.transpose(Image.FLIP_LEFT_RIGHT)
    return normalize(image)


def eval_transform(image, image_size, eval_resize):
    """torchvision eval transforms: Resize(eval_resize) of the shorter side (bilinear,
    antialiased), CenterCrop(image_size), ToTensor, Normalize. Returns float32 (3, S, S)."""
    w, h = image.size
    if w <= h:
        size = (eval_resize, int(eval_resize * h / w))
    else:
        size = (int(eval_resize * w / h), eval_resize)
    image = image.resize(size, Image.BILINEAR)
    top = int(round((image.height - image_size) / 2.0))
    left = int(round((image.width - image_size) / 2.0))
    return normalize(image.crop((left, top, left + image_size, top + image_size)))


def list_images(data_path, check_content):
    """(paths, int64 labels) of a class-folder root, labels the sorted folder indices (as
    ``ImageFolderDataset``); the folder is checked as train.py checks it."""
    classes = check_image_folder(data_path, check_content=check_content)
    paths, labels = [], []
    for label, name in enumerate(classes):
        folder = os.path.join(data_path, name)
        files = sorted(f for f in os.listdir(folder) if is_image_name(f))
        paths += [os.path.join(folder, f) for f in files]
        labels += [label] * len(files)
    return classes, paths, np.array(labels, np.int64)


class ImageFolder(torch.utils.data.Dataset):
    """Class-folder images through the train or eval transforms.

    The random numbers of image ``i`` in epoch ``e`` come from ``numpy.random.default_rng(
    (seed, e, i))``, so augmentation does not depend on the number of loader workers.

    Args:
        paths (list[str]): Image files.
        labels (numpy.ndarray): int64 labels, shape (len(paths),).
        is_training (bool): Random train transforms, or the eval transforms.
        cfg (Config): ``train_image_size``, ``eval_image_size``, ``eval_resize``,
            ``train_crop_scale``, ``seed``.

    Items: (float32 tensor (3, image_size, image_size), int64 label).
    """

    def __init__(self, paths, labels, is_training, cfg):
        self.paths, self.labels, self.is_training, self.cfg = paths, labels, is_training, cfg
        self.epoch = 0

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, index):
        with Image.open(self.paths[index]) as image:
            image = image.convert("RGB")
        if self.is_training:
            rng = np.random.default_rng((self.cfg.seed, self.epoch, index))
            x = train_transform(image, rng, self.cfg.train_image_size, self.cfg.train_crop_scale)
        else:
            x = eval_transform(image, self.cfg.eval_image_size, self.cfg.eval_resize)
        return torch.from_numpy(x), int(self.labels[index])


def loader(dataset, cfg, order=None, pin_memory=False):
    """Batches of ``dataset``: ``order`` (an index permutation) in full batches only, or every
    image in file order (eval); ``num_parallel_workers`` loader processes (capped at the CPUs)."""
    workers = max(0, min(cfg.num_parallel_workers, os.cpu_count() or 1))
    if order is None:
        batches = [list(range(i, min(i + cfg.batch_size, len(dataset))))
                   for i in range(0, len(dataset), cfg.batch_size)]
    else:
        full = len(order) // cfg.batch_size * cfg.batch_size
        batches = [order[i:i + cfg.batch_size].tolist() for i in range(0, full, cfg.batch_size)]
    return torch.utils.data.DataLoader(dataset, batch_sampler=batches, num_workers=workers,
                                       pin_memory=pin_memory)


# ---- LR ----

def lr_per_step(cfg, global_batch_size, steps_per_epoch):
    """The LR of every optimizer step, from the recipe's keys, written out here.

    NVIDIA DeepLearningExamples' ResNet-50 v1.5 policies (``image_classification/
    training.py``: ``lr_cosine_policy``, ``lr_linear_policy``, ``lr_step_policy``), evaluated
    per step instead of per epoch, with W warmup steps and T steps in all:

    - peak = ``base_lr`` * global batch / ``base_lr_batch_size`` (Goyal et al.'s linear scaling);
    - W = ``warmup_epochs`` * steps per epoch (at most T); step s < W: peak * (s + 1) / W;
    - ``cosine``, step s >= W, e = s - W, E = T - W: end + (peak - end) * (1 + cos(pi e / E)) / 2;
    - ``linear``: peak + (end - peak) * e / E (end = ``lr_end``, absolute);
    - ``step``: peak * ``lr_decay_factor`` ** (number of ``lr_decay_epochs`` d with
      s >= d * steps per epoch).

    Args:
        cfg (Config): ``lr_schedule``, ``base_lr``, ``base_lr_batch_size``, ``epoch_size``,
            ``warmup_epochs``, ``lr_end``, ``lr_decay_epochs``, ``lr_decay_factor``.
        global_batch_size (int): Images per optimizer step.
        steps_per_epoch (int): Optimizer steps in one epoch.

    Returns:
        tuple: (float32 numpy array of shape (epoch_size * steps_per_epoch,), peak LR).

    Raises:
        ConfigError: For an unknown ``lr_schedule``.
    """
    peak = cfg.base_lr * global_batch_size / cfg.base_lr_batch_size
    total = cfg.epoch_size * steps_per_epoch
    warmup = min(cfg.warmup_epochs * steps_per_epoch, total)
    end = cfg.lr_end
    values = []
    for s in range(total):
        e, span = s - warmup, total - warmup
        if s < warmup:
            value = peak * (s + 1) / warmup
        elif cfg.lr_schedule == "cosine":
            value = end + (peak - end) * 0.5 * (1.0 + math.cos(math.pi * e / span))
        elif cfg.lr_schedule == "linear":
            value = peak + (end - peak) * e / span
        elif cfg.lr_schedule == "step":
            drops = sum(s >= d * steps_per_epoch for d in cfg.lr_decay_epochs)
            value = peak * cfg.lr_decay_factor ** drops
        else:
            raise ConfigError(f"lr_schedule {cfg.lr_schedule}: the twin knows cosine, linear "
                              f"and step")
        values.append(value)
    return np.array(values, np.float32), peak


# ---- network, optimizer ----

def load_initial_weights(net, path):
    """Load ``path`` (our ``.ckpt``, converted by name, or a torch ``.pth`` state_dict) into
    ``net``, strictly: every tensor must match.

    Raises:
        MissingFileError: If ``path`` does not exist.
        RuntimeError: If names or shapes do not match (torch's message lists them).
    """
    if not os.path.isfile(path):
        raise MissingFileError(f"pre_trained {path!r} not found")
    if path.endswith(".ckpt"):
        # MindSpore is imported only for this conversion.
        from tools.convert_torch_checkpoint import load_ms_arrays, ms_arrays_to_torch_state

        state = ms_arrays_to_torch_state(load_ms_arrays(path), path)
    else:
        state = torch.load(path, map_location="cpu", weights_only=True)
    net.load_state_dict(state, strict=True)


def weight_decay_groups(net, weight_decay):
    """SGD parameter groups of NVIDIA's rule: decay on conv/linear weights (tensors of 2 or
    more dimensions), none on BatchNorm weight/bias and on biases (``src.training.optimizer``)."""
    decay = [p for _, p in net.named_parameters() if p.dim() > 1]
    rest = [p for _, p in net.named_parameters() if p.dim() <= 1]
    return [{"params": decay, "weight_decay": weight_decay}, {"params": rest, "weight_decay": 0.0}]


def device_of(cfg):
    """torch device of ``device_target``; the twin trains in float32 only.

    Raises:
        ConfigError: For Ascend, or mixed precision (amp_level other than O0 after ``auto``).
    """
    if cfg.device_target == "Ascend":
        raise ConfigError("device_target Ascend: the PyTorch twin runs on CPU or GPU")
    amp = cfg.amp_level if cfg.amp_level != "auto" else (
        "O0" if cfg.device_target == "CPU" else "O2")
    if amp != "O0":
        raise ConfigError(f"amp_level {cfg.amp_level} ({amp} on {cfg.device_target}): the twin "
                          f"trains in float32; run both frameworks with --amp_level O0")
    return torch.device("cuda", cfg.device_id) if cfg.device_target == "GPU" else torch.device(
        "cpu")


def evaluate(net, data, device, class_num, loss_fn):
    """Top-1 and top-5 accuracy (fractions) of ``net`` in eval mode over every batch of
    ``data``, and the mean over the images of ``loss_fn`` (a ``reduction="sum"`` loss), as
    train.py's ``eval_loss``."""
    net.eval()
    hits1 = hits5 = total = 0
    loss_sum = 0.0
    with torch.no_grad():
        for x, y in data:
            logits = net(x.to(device))
            loss_sum += float(loss_fn(logits.float(), y.to(device)))
            topk = logits.topk(min(5, class_num), dim=1).indices.cpu()
            hits1 += int((topk[:, 0] == y).sum())
            hits5 += int((topk == y[:, None]).any(dim=1).sum())
            total += len(y)
    net.train()
    return hits1 / total, hits5 / total, loss_sum / total


def main(argv=None):
    """Train as configured (train.py's command line); returns 0, or 3 on a non-finite loss."""
    # ---- config ----
    cfg = parse_config(argv, description=__doc__.split("\n")[0])
    if not cfg.data_path:
        raise ConfigError("data_path is empty: give --data_path, the training data folder")
    if cfg.run_eval and not cfg.eval_data_path:
        raise ConfigError("run_eval is true but eval_data_path is empty")
    if cfg.dataset != "imagefolder":
        raise ConfigError(f"dataset {cfg.dataset}: the twin reads class folders (imagefolder)")
    device = device_of(cfg)
    os.makedirs(cfg.output_dir, exist_ok=True)
    log = get_logger("torch_reference_train", os.path.join(cfg.output_dir, "train.log"))
    with open(os.path.join(cfg.output_dir, "config.yaml"), "w", encoding="utf-8") as f:
        f.write(cfg.to_yaml())
    if cfg.resume_ckpt:
        log.warning("resume_ckpt %s: the twin does not resume; it trains from the start",
                    cfg.resume_ckpt)
    torch.manual_seed(cfg.seed)

    # ---- data ----
    classes, paths, labels = list_images(cfg.data_path, cfg.check_images)
    if len(classes) != cfg.class_num:
        raise ConfigError(f"data_path {cfg.data_path} has {len(classes)} classes but class_num "
                          f"is {cfg.class_num}")
    train_set = ImageFolder(paths, labels, True, cfg)
    steps_per_epoch = len(train_set) // cfg.batch_size
    if steps_per_epoch == 0:
        raise ConfigError(f"data_path {cfg.data_path} gives 0 full batches of batch_size "
                          f"{cfg.batch_size}: lower batch_size")
    eval_data = None
    if cfg.run_eval:
        eval_classes, eval_paths, eval_labels = list_images(cfg.eval_data_path, cfg.check_images)
        if eval_classes != classes:
            raise ConfigError(f"eval_data_path {cfg.eval_data_path} has other class folders than "
                              f"data_path {cfg.data_path}: labels would not match")
        eval_data = loader(ImageFolder(eval_paths, eval_labels, False, cfg), cfg,
                           pin_memory=device.type == "cuda")

    # ---- network, LR, optimizer, loss ----
    net = torch_resnet(cfg.net_name, cfg.class_num)
    if cfg.pre_trained:
        load_initial_weights(net, cfg.pre_trained)
        log.info("initialized from %s", cfg.pre_trained)
    else:
        log.warning("no pre_trained: torch's own random initialization (not ours)")
    net.to(device).train()
    lr, peak_lr = lr_per_step(cfg, cfg.batch_size, steps_per_epoch)
    log.info("batch %d: peak LR %.6g; %d steps per epoch, %d in all; device %s, %d threads",
             cfg.batch_size, peak_lr, steps_per_epoch, len(lr), device, torch.get_num_threads())
    momentum = optimizer_hyperparameters("momentum", momentum=cfg.momentum)["momentum"]
    optimizer = torch.optim.SGD(weight_decay_groups(net, cfg.weight_decay), lr=float(lr[0]),
                                momentum=momentum)
    loss_fn = torch.nn.CrossEntropyLoss(label_smoothing=cfg.label_smoothing)

    # ---- train ----
    metrics_path = os.path.join(cfg.output_dir, "metrics.jsonl")
    if os.path.exists(metrics_path):
        os.remove(metrics_path)
    step, best_top1, start = 0, -1.0, time.time()
    for epoch in range(cfg.epoch_size):
        train_set.epoch = epoch
        order = np.random.default_rng((cfg.seed, epoch)).permutation(len(train_set))
        epoch_start = window_start = time.time()
        losses = []
        for x, y in loader(train_set, cfg, order, pin_memory=device.type == "cuda"):
            for group in optimizer.param_groups:
                group["lr"] = float(lr[step])
            loss = loss_fn(net(x.to(device)), y.to(device))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            step += 1
            losses.append(loss.item())
            if not math.isfinite(losses[-1]):
                log.error("stopped: non-finite loss %s at global step %d", losses[-1], step)
                return 3
            in_epoch = len(losses)
            if in_epoch % cfg.log_interval == 0 or in_epoch == steps_per_epoch:
                now = time.time()
                done = (in_epoch - 1) % cfg.log_interval + 1
                log.info("epoch %d/%d step %d/%d (global %d) loss %.4f lr %.6f %.1f img/s",
                         epoch + 1, cfg.epoch_size, in_epoch, steps_per_epoch, step, losses[-1],
                         lr[step - 1], done * cfg.batch_size / max(now - window_start, 1e-9))
                window_start = now
        seconds = time.time() - epoch_start
        record = {"epoch": epoch + 1, "step": step, "loss": float(np.mean(losses)),
                  "lr": float(lr[step - 1]), "time_s": round(seconds, 3),
                  "img_per_s": round(len(losses) * cfg.batch_size / max(seconds, 1e-9), 2),
                  "overflow_steps": 0}
        if eval_data is not None and ((epoch + 1) % cfg.eval_interval == 0
                                      or epoch + 1 == cfg.epoch_size):
            top1, top5, eval_loss = evaluate(
                net, eval_data, device, cfg.class_num,
                torch.nn.CrossEntropyLoss(label_smoothing=cfg.label_smoothing, reduction="sum"))
            best_top1 = max(best_top1, top1)
            record.update(top1=top1, top5=top5, eval_loss=eval_loss, best_top1=best_top1,
                          eval_images=len(eval_data.dataset))
        log.info("epoch %d done: %s", epoch + 1, json.dumps(record))
        with open(metrics_path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")

    final = os.path.join(cfg.output_dir, f"{cfg.net_name}-final.pth")
    torch.save(net.state_dict(), final + ".partial")
    os.replace(final + ".partial", final)
    log.info("done in %.0f s; outputs in %s", time.time() - start, cfg.output_dir)
    return 0


if __name__ == "__main__":
    run_entry_point(main)
