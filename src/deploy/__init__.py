"""Deployment: the model file formats (``src.deploy.formats``), loading a checkpoint, MindIR or
ONNX model for evaluation and prediction, exporting a network, int8 (QDQ ONNX) quantization.

Entry points: ``load_network`` (a checkpoint into a network), ``load_predictor`` (any model
file as a batch -> logits callable).
"""
from src.deploy.formats import load_predictor
from src.deploy.inference import load_network

__all__ = ["load_network", "load_predictor"]
