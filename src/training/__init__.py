"""Training: train step, loss, optimizer, LR schedules, callbacks, resume; entry points
``create_loss``, ``create_optimizer``, ``create_lr``, ``build_model``."""
from src.training.loss import create_loss
from src.training.lr_schedule import create_lr
from src.training.model import build_model
from src.training.optimizer import create_optimizer

__all__ = ["build_model", "create_loss", "create_lr", "create_optimizer"]
