"""`ecdysis doctor`: what this machine has of what the tool needs, and the fix for each miss."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from ..doctor import exit_code, run_checks
from . import views
from .common import JsonOpt, console

MARKS = {"ok": "[green]ok  [/]", "info": "[dim]--  [/]", "warn": "[yellow]warn[/]", "fail": "[bold red]FAIL[/]"}


def doctor(
    data_dir: Annotated[Path | None, typer.Option(help="Folder holding gsm8k/ and dbbench/.")] = None,
    probe: Annotated[bool, typer.Option(help="Run the long-prompt probe of the embedded backend.")] = True,
    probe_timeout: Annotated[float, typer.Option(help="Seconds the probe may take.")] = 600.0,
    probe_model: Annotated[str, typer.Option(help="Model the probe runs: a catalog name or a .gguf file.")] = (
        "smollm2-135m"),
    as_json: JsonOpt = False,
) -> None:
    """Check the llama.cpp build (CPU features, a >= 512-token prompt), the sandbox (bubblewrap, user and nested
    namespaces, pids cgroup), models and their sha256, the data dir and optional extras. Exit status 1 when
    something the tool cannot work without fails; warnings say what runs with less, and how to fix it."""
    checks = run_checks(data_dir=data_dir, probe=probe, probe_timeout_s=probe_timeout, probe_model=probe_model)
    code = exit_code(checks)
    if as_json:
        views.print_json({"ok": code == 0, "checks": [c.to_dict() for c in checks]})
        raise typer.Exit(code)
    for c in checks:
        console.print(f"{MARKS[c.status]} [bold]{escape(c.name)}[/]: {escape(c.detail)}", highlight=False)
        if c.fix and c.status in ("warn", "fail"):
            console.print(f"      fix: {escape(c.fix)}", highlight=False)
    failed = [c.name for c in checks if c.status == "fail"]
    warned = sum(c.status == "warn" for c in checks)
    if failed:
        console.print(f"[bold red]doctor: {len(failed)} check(s) failed[/] ({', '.join(failed)}); fix them before "
                      "running anything on the embedded backend", highlight=False)
    else:
        console.print("[green]doctor: ready[/]" + (f" ({warned} warning(s): see the fixes above)" if warned else ""))
    raise typer.Exit(code)
