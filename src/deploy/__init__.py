"""Deployment: model file formats (``src.deploy.formats``), export, int8 quantization, inference;
entry points ``load_network`` (a checkpoint into a network) and ``load_predictor`` (any model
file as batch -> logits)."""
from src.deploy.formats import load_predictor
from src.deploy.inference import load_network

__all__ = ["load_network", "load_predictor"]
