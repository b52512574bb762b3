"""The networks: ResNet-18/34/50/101/152 in torchvision's layout (ResNet-50 v1.5), and BatchNorm
folding for export.

Entry point: ``create_network`` (a ResNet by name).
"""
from src.models.resnet import create_network

__all__ = ["create_network"]
