"""Runner: sandboxed, concurrent, cached, recorded evaluation of a harness on tasks.

Names are imported on first use: the sandbox worker (`ecdysis.runner.worker`) imports this package on
every episode and needs none of the host side (store, models, progress bars).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .runner import EvalSummary, Runner, summarize
    from .sandbox import SandboxLimits, run_in_sandbox

__all__ = ["EvalSummary", "Runner", "SandboxLimits", "run_in_sandbox", "summarize"]
_HOME = {"EvalSummary": "runner", "Runner": "runner", "summarize": "runner", "SandboxLimits": "sandbox",
         "run_in_sandbox": "sandbox"}


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from importlib import import_module

    return getattr(import_module(f".{_HOME[name]}", __name__), name)
