"""The networks (torchvision's ResNet layout) and BatchNorm folding; entry point
``create_network`` (a ResNet by name)."""
from src.models.resnet import create_network

__all__ = ["create_network"]
