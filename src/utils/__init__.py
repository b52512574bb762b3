"""The core below every other package (config, CLI, errors, logging, device, checkpoint files);
imports nothing, so each module loads alone."""
