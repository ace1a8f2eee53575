"""What the run-starting commands (`eval`, `train`, `compare`) share: a workspace that announces its runs,
and the screen that ends `train` (result, what changed, the diff, the HTML report's path)."""

from __future__ import annotations

from functools import cached_property
from pathlib import Path
from typing import Any

from rich.console import Console

from ..store import RunStore
from ..workspace import Workspace
from .common import announce_runs, notice

DIFF_LINES = 20  # the diff shown at the end of train; `ecdysis diff` prints all of it
LINE_CHARS = 150


class AnnouncingWorkspace(Workspace):
    """A workspace whose store says "new run RUN" or "resuming RUN" (stderr) the first time a run starts."""

    @cached_property
    def store(self) -> RunStore:
        return announce_runs(super().store)


def change_text(change: dict[str, Any]) -> str:
    """One spec change as a few words: `enable_repair boxed_answer`, `add_rule "Check ..."`."""
    kind = change.get("kind", "?")
    detail = change.get("repair") or change.get("value") or change.get("file") or change.get("text") or ""
    detail = str(detail).replace("\n", " ")
    return f"{kind} {detail[:60] + ('...' if len(detail) > 60 else '')}".strip()


def what_changed(view: Any) -> list[str]:
    """One line per round of a `report.data.RunView`: the decision, its reason, the spec's changes."""
    lines = []
    for r in view.rounds:
        rec = r.record
        verdict = "accepted" if rec.accepted else ("stop" if rec.stop and not rec.candidate else "rejected")
        changes = [change_text(c) for c in ((r.spec.spec or {}).get("changes", []) if r.spec else [])]
        variant = f" [{rec.variant}]" if rec.variant else ""
        spec = ", ".join(changes)
        what = f"; spec: {spec}" if spec else ""
        if rec.library_candidate:  # the roles' spec did not run, rebuilt a rejected harness or was a no-op
            what = f"; tried the library's {rec.library_candidate}" + (f" (the roles wrote: {spec})" if spec else "")
        lines.append(f"round {rec.round}: {verdict}{variant} - {rec.stop or rec.reason or ''}{what}")
    return lines


def clipped_diff(text: str, limit: int = DIFF_LINES) -> tuple[list[str], int]:
    """The first `limit` lines of a diff (each cut to LINE_CHARS) and how many lines were left out."""
    lines = text.splitlines()
    shown = [line if len(line) <= LINE_CHARS else line[:LINE_CHARS] + " ..." for line in lines[:limit]]
    return shown, max(0, len(lines) - limit)


def finish_train(console: Console, store: RunStore, run_id: str, report: bool = True) -> Path | None:
    """After `train`: what changed per round, the seed -> final diff (clipped), and the HTML report written
    to RUN_DIR/report-RUN.html (returned; None when `report` is False)."""
    from rich.markup import escape

    from ..harness.manifest import diff_versions
    from ..report.data import load_run

    run_dir = store.run_dir
    view = load_run(store, run_id)
    before, after = view.summary.get("test_before") or {}, view.summary.get("test_after") or {}
    if before and after:
        console.print(f"[bold]Held-out test[/] {before['accuracy']:.3f} (seed) -> {after['accuracy']:.3f} (final) "
                      f"on {after['n_tasks']} tasks ({after['accuracy'] - before['accuracy']:+.3f})")
    console.print("[bold]What changed[/]")
    for line in what_changed(view) or ["no round ran"]:
        console.print(f"  {escape(line)}", highlight=False)
    seed, final = view.summary.get("seed_harness_id"), view.summary.get("final_harness_id")
    if seed and final and seed != final:
        lines, left = clipped_diff(diff_versions(store.load_version(seed), store.load_version(final)))
        console.print(f"[bold]Harness diff[/] {seed[:8]} -> {final[:8]}")
        for line in lines:
            style = "green" if line.startswith("+") else "red" if line.startswith("-") else "dim"
            console.print(f"[{style}]{escape(line)}[/]", highlight=False)
        if left:
            console.print(f"[dim]... {left} more lines: `ecdysis diff {run_id} --run-dir {run_dir}`[/]")
    else:
        console.print("[dim]the final harness is the seed (no edit was accepted)[/]")
    path = None
    if report:
        from ..report.html import write_report

        try:
            path = write_report(store, run_id, run_dir / f"report-{run_id}.html").resolve()
        except Exception as exc:  # noqa: BLE001 - the run is trained and stored; only its report is missing
            notice(f"[yellow]warning:[/] the HTML report was not written ({type(exc).__name__}: {exc}); "
                   f"try `ecdysis report {run_id} --run-dir {run_dir}`")
            return None
        console.print(f"[bold]Report[/] {path}", highlight=False)
    return path
