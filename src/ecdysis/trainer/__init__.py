"""The Ecdysis trainer: failure aggregation, FDCR, implementation with checks, acceptance."""

from .api import train, train_async
from .trainer import Trainer, TrainResult

__all__ = ["TrainResult", "Trainer", "train", "train_async"]
