"""Runner: concurrent, cached, recorded evaluation of a harness on tasks (episodes run in `ecdysis.sandbox`).

`runner` (the one place that evaluates), `executors` (local worker pool, Ray), `progress`, `user_sim` (the
simulated user of conversation tasks, host side). Names are imported on first use, so importing a
submodule (an executor) does not pull in the store and the models.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .runner import EvalSummary, Runner, summarize

__all__ = ["EvalSummary", "Runner", "summarize"]
_HOME = {"EvalSummary": "runner", "Runner": "runner", "summarize": "runner"}


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from importlib import import_module

    return getattr(import_module(f".{_HOME[name]}", __name__), name)
