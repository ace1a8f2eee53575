"""Environments: tasks with stable ids, deterministic splits, sandbox episodes, host-side grading."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

from .base import DataNotFoundError, Environment, Episode, Score, Task, TaskFileError, seeded_order

ENVIRONMENTS = ("gsm8k", "dbbench", "jsonl")
_EPISODE_MODULES = {"gsm8k": "gsm8k", "dbbench": "dbbench", "jsonl": "jsonl_suite"}


class UnknownEnvironmentError(ValueError):
    pass


def _check(name: str) -> None:
    if name not in ENVIRONMENTS:
        raise UnknownEnvironmentError(f"unknown environment {name!r}; known: {', '.join(ENVIRONMENTS)}")


def get_environment(name: str, data_dir: Path | None = None, seed: int = 0, **options: Any) -> Environment:
    """Host-side environment (task loading and grading)."""
    _check(name)
    if name == "gsm8k":
        from .gsm8k import GSM8K

        return GSM8K(data_dir=data_dir, seed=seed)
    if name == "dbbench":
        from .dbbench import DBBench

        return DBBench(data_dir=data_dir, seed=seed)
    from .jsonl_suite import JsonlSuite

    if "path" not in options:
        raise ValueError("the jsonl environment needs a task file: --tasks FILE (or env_options.path)")
    return JsonlSuite(path=Path(options["path"]), grader=options.get("grader", JsonlSuite.grader), seed=seed)


def make_episode(name: str, public: dict[str, Any], options: dict[str, Any]) -> Episode:
    """Sandbox-side episode for one task's public view."""
    _check(name)
    module = importlib.import_module(f"{__name__}.{_EPISODE_MODULES[name]}")
    return module.make_episode(public, options)


__all__ = [
    "ENVIRONMENTS",
    "DataNotFoundError",
    "Environment",
    "Episode",
    "Score",
    "Task",
    "TaskFileError",
    "UnknownEnvironmentError",
    "get_environment",
    "make_episode",
    "seeded_order",
]
