"""The network from the config: the ResNet as it trains (``training_network``), initialized
and made trainable as configured (``build_network``), and LP-FT's switch from the linear probe
to fine-tuning (``FineTuning``).
"""
import logging
from typing import Any

import mindspore.nn as nn
import numpy as np

from src.models.freeze import set_trainable
from src.models.resnet import create_network
from src.training.model import StepRecipe, build_train_step, with_train_step
from src.training.resume import restore_training_state
from src.training.train_step import WeightEma
from src.utils.checkpoint import load_into_network
from src.utils.config import Config


def network_kwargs(cfg: Config) -> dict[str, Any]:
    """``create_network``'s arguments of the configured architecture: ``net_name``,
    ``class_num``, ``zero_init_residual``, ``device_target``, ``stem_pool_pad_mode``."""
    return dict(net_name=cfg.net_name, class_num=cfg.class_num,
                zero_init_residual=cfg.zero_init_residual, device_target=cfg.device_target,
                stem_pool_pad_mode=cfg.stem_pool_pad_mode)


def training_network(cfg: Config, rank: int = 0) -> nn.Cell:
    """The configured ResNet as it trains on data-parallel rank ``rank``: with its stochastic
    depth (``drop_path_rate``, drawn from ``seed`` and the rank)."""
    return create_network(**network_kwargs(cfg), drop_path_rate=cfg.drop_path_rate,
                          drop_path_seed=cfg.seed, shard_id=rank)


def build_network(cfg: Config, device_num: int, log: logging.Logger, rank: int = 0) -> nn.Cell:
    """The configured ResNet (``training_network``), initialized from ``pre_trained`` (a classifier
    of another class count trains from scratch), trainable as configured (only ``fc`` during
    LP-FT's probe). Raises as ``create_network`` and ``load_into_network``."""
    net = training_network(cfg, rank)
    if cfg.pre_trained:
        dropped, _ = load_into_network(net, cfg.pre_trained, drop_mismatched_classifier=True)
        log.info("initialized from %s%s", cfg.pre_trained,
                 f"; classifier {dropped} dropped (class count differs), fc trained from "
                 f"scratch" if dropped else "")
    if cfg.linear_probe_epochs:
        log.info("linear_probe_epochs %d: only fc trains in the first %d epochs, every "
                 "BatchNorm frozen (LP-FT)", cfg.linear_probe_epochs, cfg.linear_probe_epochs)
        make_trainable(cfg, net=net, trainable_layers=0, freeze_bn=True, device_num=device_num,
                       log=log)
    else:
        make_trainable(cfg, net=net, trainable_layers=cfg.trainable_layers,
                       freeze_bn=cfg.freeze_bn, device_num=device_num, log=log)
    return net


def make_trainable(cfg: Config, *, net: nn.Cell, trainable_layers: int, freeze_bn: bool,
                   device_num: int, log: logging.Logger) -> None:
    """``set_trainable`` with the config's all-reduce fusion (LP-FT's probe gets the derived
    split, not ``all_reduce_fusion_config``)."""
    fusion = cfg.all_reduce_fusion_config if trainable_layers == cfg.trainable_layers else []
    set_trainable(net, trainable_layers=trainable_layers, freeze_bn=freeze_bn, log=log,
                  device_num=device_num, fusion_config=fusion, net_name=cfg.net_name)


class FineTuning:
    """LP-FT's switch at step ``probe_end`` (Kumar et al. 2022, arXiv:2202.10054): a new training
    cell over the ``trainable_layers`` stages, with a fresh optimizer whose step 0 is the run's
    ``probe_end``; the overflow count carries over. Called with the probe's ``Model``."""

    def __init__(self, cfg: Config, *, recipe: StepRecipe, lr: np.ndarray, probe_end: int,
                 ema: WeightEma | None, device_num: int, log: logging.Logger):
        self.cfg, self.recipe, self.lr, self.probe_end = cfg, recipe, lr, probe_end
        self.ema, self.device_num, self.log = ema, device_num, log

    def __call__(self, model, resume_path=""):
        """The fine-tuning ``Model``; ``resume_path`` (a checkpoint after the switch) restores
        its optimizer state."""
        cfg, old = self.cfg, model.train_network
        net = old.network.backbone_network  # the cast network inside WithLossCell
        make_trainable(cfg, net=net, trainable_layers=cfg.trainable_layers,
                       freeze_bn=cfg.freeze_bn, device_num=self.device_num, log=self.log)
        step = build_train_step(net, self.lr[self.probe_end:], self.recipe, self.ema)
        step.overflow_count.set_data(old.overflow_count.value())
        if resume_path:
            restore_training_state(step, resume_path)
        self.log.info("LP-FT: linear probe done after %d steps; fine-tuning with "
                      "trainable_layers %d from step %d", self.probe_end, cfg.trainable_layers,
                      self.probe_end)
        return with_train_step(net, step, self.recipe)
