"""ResNet image classification on MindSpore: dataset, network, loss, LR schedules and config.

Every module of this package is importable without side effects: nothing here parses a
config, sets a MindSpore context or reads the environment at import time.
"""
