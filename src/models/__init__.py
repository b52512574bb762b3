"""The networks: ResNet-18 .. 152 (torchvision's layout) as classifiers or backbones, frozen
stages, BatchNorm folding and test-time augmentation. Entry point: ``create_network`` (a
ResNet by name)."""
from src.models.bn_fold import fold_batchnorm
from src.models.resnet import create_network
from src.models.tta import with_tta

__all__ = ["create_network", "fold_batchnorm", "with_tta"]
