"""Live terminal view of a training run: the round, the patterns found, the spec, the decision."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.console import Console
from rich.markup import escape
from rich.table import Table

if TYPE_CHECKING:
    from .failures import Pattern
    from .spec import HarnessSpec


class TrainView:
    def __init__(self, console: Console | None = None, enabled: bool = True) -> None:
        self.console = console or Console()
        self.enabled = enabled

    def round(self, r: int, harness_id: str, train_score: float, patterns: list[Pattern]) -> None:
        if not self.enabled:
            return
        self.console.rule(f"round {r}: harness {harness_id[:8]}, train score {train_score:.3f}")
        table = Table(title="failure patterns")
        for col in ("id", "class", "layer", "tasks", "failures", "pattern", "why"):
            table.add_column(col, overflow="fold")
        for p in patterns:
            table.add_row(p.id, p.classification, p.layer, str(len(p.tasks)), str(p.support), p.name, p.reason)
        self.console.print(table)

    def spec(self, spec: HarnessSpec, source: str = "roles") -> None:
        """The step's spec and who wrote it (`source`: "roles" or "library: why")."""
        if self.enabled:
            who = "the roles" if source == "roles" else f"the library ({source.removeprefix('library: ')})"
            self.console.print(f"[bold]spec[/] written by {escape(who)}", spec.model_dump_json(indent=1))

    def decision(self, accepted: bool, reason: str) -> None:
        if self.enabled:
            verdict = "[green]accepted[/]" if accepted else "[yellow]rejected[/]"
            self.console.print(f"decision: {verdict} ({reason})")

    def note(self, text: str) -> None:
        if self.enabled:
            self.console.print(text)
