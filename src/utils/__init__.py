"""The core every other package builds on: config and CLI, errors, logging and progress, device
and distribution setup, checkpoint file I/O, throughput timing.

Nothing is imported here, so ``src.utils.errors`` or ``src.utils.config`` load alone.
"""
