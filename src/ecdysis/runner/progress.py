"""Progress bar for an evaluation on stderr: tasks done, accuracy so far, tokens, ETA (rich)."""

from __future__ import annotations

from types import TracebackType

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from ..agent.trajectory import Trajectory


class EvalProgress:
    def __init__(self, label: str, total: int, done: int, enabled: bool = True) -> None:
        self.enabled = enabled
        self.passed = 0.0
        self.finished = 0
        self.tokens = 0
        self._progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("acc {task.fields[acc]}"),
            TextColumn("tok {task.fields[tokens]}"),
            TimeRemainingColumn(),
            disable=not enabled,
            transient=False,
            console=Console(stderr=True),  # status, not a result: stdout stays the command's output
        )
        self._task = self._progress.add_task(label, total=total, completed=done, acc="-", tokens=0)

    def advance(self, traj: Trajectory) -> None:
        self.finished += 1
        self.passed += traj.score
        self.tokens += traj.prompt_tokens + traj.completion_tokens
        self._progress.update(self._task, advance=1, acc=f"{self.passed / self.finished:.2f}",
                              tokens=self.tokens)

    def __enter__(self) -> EvalProgress:
        self._progress.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._progress.stop()
