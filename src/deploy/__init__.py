"""Deployment: loading a checkpoint, MindIR or ONNX model for evaluation and prediction (a
checkpoint in MindSpore or ONNX Runtime), image preprocessing for inference, exporting a
network (fixed or dynamic batch), int8 (QDQ ONNX) quantization.

Entry points: ``load_network`` (a checkpoint into a network), ``load_predictor`` (any model
file as a batch -> logits callable).
"""
from src.deploy.inference import load_network, load_predictor

__all__ = ["load_network", "load_predictor"]
