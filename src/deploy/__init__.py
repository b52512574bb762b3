"""Deployment: export, int8 quantization, inference; entry points ``load_network`` (a
checkpoint into a network) and ``load_predictor`` (any model file as batch -> logits)."""
from src.deploy.inference import load_network, load_predictor

__all__ = ["load_network", "load_predictor"]
