"""The Ecdysis trainer: failure aggregation, FDCR, implementation with checks, acceptance."""

from .api import Arm, train, train_async
from .engine import Engine
from .records import CurvePoint
from .result import TrainResult

__all__ = ["Arm", "CurvePoint", "Engine", "TrainResult", "train", "train_async"]
