"""What every command shares: the console, the error exit, common options."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from ..store import DB_NAME, RunStore

# Not a terminal (a pipe, a file): no width limit, so ids and references are never cut.
console = Console(width=None if sys.stdout.isatty() else 400)

JsonOpt = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON instead of tables.")]
RunDirOpt = Annotated[Path, typer.Option(help="Run directory.")]
ExecutorOpt = Annotated[str | None, typer.Option(help="Where episodes run: local (worker processes) | ray.")]
RayAddressOpt = Annotated[str | None, typer.Option(help="Ray cluster: auto | ray://host:10001 "
                                                         "(default: start a local one).")]


def fail(message: str) -> None:
    console.print(f"[bold red]error:[/] {message}")
    raise typer.Exit(2)


def open_store(run_dir: Path) -> RunStore:
    """The run directory's store for reading; a clear error when it holds none."""
    if not (run_dir / DB_NAME).exists():
        fail(f"{run_dir} holds no run database ({DB_NAME}); pass the run directory with --run-dir")
    return RunStore(run_dir)
