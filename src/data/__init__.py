"""Input pipelines on ``mindspore.dataset``: class folders and CIFAR-10 binaries, transforms and
training augmentation, batch mixing (mixup / CutMix), image checks, class names.

Entry points: ``create_dataset`` (a batched pipeline), ``create_transforms`` (per-image ops).
"""
from src.data.pipeline import create_dataset
from src.data.transforms import create_transforms

__all__ = ["create_dataset", "create_transforms"]
