"""Model layer: one async chat interface, backends, cache and accounting."""

from .base import (
    ChatModel,
    ChatRequest,
    ChatResponse,
    GenerationParams,
    Message,
    ModelConfigError,
    ModelError,
    Usage,
)
from .cache import CallStats, MeteredModel, ResponseCache, default_cache_path
from .registry import ModelSettings, build_model
from .scripted import ScriptedModel

__all__ = [
    "CallStats",
    "ChatModel",
    "ChatRequest",
    "ChatResponse",
    "GenerationParams",
    "Message",
    "MeteredModel",
    "ModelConfigError",
    "ModelError",
    "ModelSettings",
    "ResponseCache",
    "ScriptedModel",
    "Usage",
    "build_model",
    "default_cache_path",
]
