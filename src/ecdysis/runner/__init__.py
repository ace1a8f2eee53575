"""Runner: sandboxed, concurrent, cached, recorded evaluation of a harness on tasks."""

from .runner import EvalSummary, Runner, summarize
from .sandbox import SandboxLimits, run_in_sandbox

__all__ = ["EvalSummary", "Runner", "SandboxLimits", "run_in_sandbox", "summarize"]
