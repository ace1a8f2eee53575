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


def replaced_by_library(source: str, library_candidate: str | None) -> bool:
    """The library's fallback, not the round's spec (written by `source`), was built and validated."""
    return bool(library_candidate) and f"library: {library_candidate}" != source


def spec_origin(source: str, spec: str, library_candidate: str | None) -> str:
    """Who wrote what the round validated. `source` is the spec record's ("roles" or "library: why"), `spec` its
    changes in a few words, `library_candidate` the library's fallback that was built instead (if any)."""
    writer = "the roles'" if source == "roles" else "the library's"
    if replaced_by_library(source, library_candidate):
        # the spec built nothing that runs, rebuilt a harness this run already rejected, or changed nothing
        why = f"{writer} spec gave no new candidate that runs ({spec})" if spec else "the roles gave no usable spec"
        return f"; validated the library's {library_candidate}: {why}"
    if not spec:
        return ""
    if source == "roles":
        return f"; the roles' spec: {spec}"
    return f"; the library's spec: {spec} ({source.removeprefix('library: ')})"


def what_changed(view: Any) -> list[str]:
    """One line per round of a `report.data.RunView`: the decision, its reason, who wrote the spec that was
    validated and its changes."""
    from .views import round_verdict

    lines = []
    for r in view.rounds:
        rec = r.record
        changes = [change_text(c) for c in ((r.spec.spec or {}).get("changes", []) if r.spec else [])]
        source = r.spec.source if r.spec else "roles"
        replaced = replaced_by_library(source, rec.library_candidate)
        variant = f" [{rec.variant}]" if rec.variant and not replaced else ""
        what = spec_origin(source, ", ".join(changes), rec.library_candidate)
        lines.append(f"round {rec.round}: {round_verdict(rec)}{variant} - {rec.stop or rec.reason or ''}{what}")
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
    path = write_train_report(store, run_id) if report else None
    if path is not None:
        console.print(f"[bold]Report[/] {path}", highlight=False)
    return path


def write_train_report(store: RunStore, run_id: str) -> Path | None:
    """RUN_DIR/report-RUN.html (its absolute path), or None with a warning on stderr when it cannot be written."""
    from ..report.html import write_report

    try:
        return write_report(store, run_id, store.run_dir / f"report-{run_id}.html").resolve()
    except Exception as exc:  # noqa: BLE001 - the run is trained and stored; only its report is missing
        notice(f"[yellow]warning:[/] the HTML report was not written ({type(exc).__name__}: {exc}); "
               f"try `ecdysis report {run_id} --run-dir {store.run_dir}`")
        return None
