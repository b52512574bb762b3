"""The networks: ResNet-18 .. 152 (torchvision's layout) as classifiers or backbones, frozen
stages and BatchNorm folding. Entry point: ``create_network`` (a ResNet by name)."""
from src.models.resnet import create_network

__all__ = ["create_network"]
