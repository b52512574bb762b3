"""Training: the train step (loss scaling, accumulation, clipping, EMA), the training ``Model``
built from plain arguments, loss, optimizer, LR schedules, precision, callbacks, evaluation
during training, the training loop, resume and the run's output folder.

Entry points: ``create_loss``, ``create_optimizer``, ``create_lr``, ``build_model``.
"""
from src.training.loss import create_loss
from src.training.lr_schedule import create_lr
from src.training.model import build_model
from src.training.optimizer import create_optimizer

__all__ = ["build_model", "create_loss", "create_lr", "create_optimizer"]
