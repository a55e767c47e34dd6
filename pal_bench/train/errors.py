"""The trainer's errors: a bad configuration (``ConfigError``) and a run that stopped on a failure its message
describes in full (``TrainingError``, ``Diverged``). Imported by the config, the topologies and every backend,
so it imports nothing of the trainer."""

from __future__ import annotations


class ConfigError(ValueError):
    """A configuration value that cannot work; the message names the field."""


class TrainingError(RuntimeError):
    """The run stopped on a failure that its one-line message describes in full (no traceback needed): the
    command line prints it and exits with status 2. ``checkpoint``: whether the run's state is still sound, so
    that the driver writes a final checkpoint before raising."""

    checkpoint = False


class Diverged(TrainingError):
    """A loss, gradient or weight turned non-finite (NaN or inf): the message names the update, the learner and
    the loss term. No checkpoint is written from that state."""
