"""ResNet image classification on MindSpore, grouped by concern.

- ``src.env``: process environment set before MindSpore loads (import it first, alone).
- ``src.utils``: the core below everything else: config, CLI, errors, logging, progress,
  device setup, checkpoint file I/O, throughput timing.
- ``src.data`` / ``src.models``: input pipelines and augmentation; the ResNet cells.
- ``src.training``: the train step, loss, optimizer, LR schedules, callbacks, resume.
- ``src.deploy``: loading exported models, inference, int8 quantization.

Imports go one way: entry points -> training / deploy -> data / models -> utils. Every module
is importable without side effects (``src.env`` sets one environment variable, by design):
nothing parses a config, sets a MindSpore context or reads the environment at import time.
"""
