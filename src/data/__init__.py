"""Input pipelines on ``mindspore.dataset``; entry points ``create_dataset`` (a batched
pipeline) and ``create_transforms`` (per-image ops)."""
from src.data.pipeline import create_dataset
from src.data.transforms import create_transforms

__all__ = ["create_dataset", "create_transforms"]
