"""What every command shares: the consoles, the error exit, run announcements, common options.

Contract: results (tables, `--json`) go to stdout; errors, warnings and notices ("new run X", "resuming X")
go to stderr, so `--json` output stays parseable.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape

from ..store import DB_NAME, RunStore, StoreError

PIPED_WIDTH = 120  # a pipe or a file without COLUMNS: wide enough for every table; key columns are never cut


def output_width(stream: Any) -> int | None:
    """The width output is laid out for: COLUMNS when it is set (a terminal or not), the terminal's own width
    on a terminal (None: rich asks it), else PIPED_WIDTH."""
    columns = os.environ.get("COLUMNS", "")
    if columns.isdigit() and int(columns) > 0:
        return int(columns)
    return None if stream.isatty() else PIPED_WIDTH


# Piped, a line of text is never broken (grep finds it whole); tables are laid out to the width either way.
console = Console(width=output_width(sys.stdout), soft_wrap=not sys.stdout.isatty())
err_console = Console(stderr=True, width=output_width(sys.stderr), soft_wrap=not sys.stderr.isatty())

JsonOpt = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON instead of tables.")]
RunDirOpt = Annotated[Path | None, typer.Option(help="Run directory (default: the config's, else runs/default).")]
ConfigOpt = Annotated[Path | None, typer.Option("--config", "-c", help="TOML config file.")]
ExecutorOpt = Annotated[str | None, typer.Option(help="Where episodes run: local (worker processes) | ray.")]
RayAddressOpt = Annotated[str | None, typer.Option(help="Ray cluster: auto | ray://host:10001 "
                                                         "(default: start a local one).")]
DEFAULT_RUN_DIR = Path("runs/default")


def fail(message: str) -> None:
    """Print `error: message` on stderr (as plain text: brackets in it are not markup) and exit with status 2
    (a user error)."""
    err_console.print(f"[bold red]error:[/] {escape(message)}", highlight=False)
    raise typer.Exit(2)


def notice(message: str) -> None:
    """A status line on stderr (never mixed into --json output)."""
    err_console.print(message, highlight=False)


def announce_runs(store: RunStore) -> RunStore:
    """Make `store.start_run` say, once per run, "new run RUN" or "resuming RUN" (on stderr)."""
    start_run: Callable[..., str] = store.start_run
    said: set[str] = set()

    def announcing(kind: str, config: dict[str, Any], run_id: str | None = None) -> str:
        resumed = bool(run_id) and any(r["id"] == run_id for r in store.runs())
        rid = start_run(kind, config, run_id)
        if rid not in said:
            said.add(rid)
            notice(f"{'resuming' if resumed else 'new run'} {rid} (in {store.run_dir})")
        return rid

    store.start_run = announcing  # type: ignore[method-assign]
    return store


def config_run_dir(config: Path | None, run_dir: Path | None) -> Path:
    """`--run-dir` if given, else the config's `run.run_dir` (`-c`), else runs/default."""
    if run_dir is not None:
        return run_dir
    if config is not None:
        from ..config import ConfigError, load_config

        try:
            return load_config(config).run.run_dir
        except ConfigError as exc:
            fail(str(exc))
    return DEFAULT_RUN_DIR


def open_store(run_dir: Path) -> RunStore:
    """The run directory's store for reading; a clear error when it holds none."""
    if not (run_dir / DB_NAME).exists():
        fail(f"{run_dir} holds no run database ({DB_NAME}); pass the run directory with --run-dir "
             "or the config with -c")
    try:
        return RunStore(run_dir)
    except StoreError as exc:
        fail(str(exc))
        raise


def find_run(store: RunStore, prefix: str) -> str:
    """The full id of the run that `prefix` names (its id or a unique start of it); exit 2 naming the
    candidates when several runs match, or when none does."""
    rows = store.runs_matching(prefix)
    if not rows:
        fail(f"no run {prefix!r} in {store.run_dir}; see `ecdysis runs list --run-dir {store.run_dir}`")
    if len(rows) > 1:
        listed = "\n  ".join(f"{r['id']}  ({r['kind']}, {r['status']}, "
                             f"{time.strftime('%Y-%m-%d %H:%M', time.localtime(r['created']))})" for r in rows)
        fail(f"run id prefix {prefix!r} matches {len(rows)} runs in {store.run_dir}; give more of the id:\n  {listed}")
    return str(rows[0]["id"])


def latest_run(store: RunStore, kind: str | None = None) -> str:
    """The id of the most recently created run (of `kind`, if given); a clear error if there is none."""
    runs = [r for r in store.runs() if kind is None or r["kind"] == kind]
    if not runs:
        fail(f"no {kind + ' ' if kind else ''}run in {store.run_dir}")
    return max(runs, key=lambda r: r["created"])["id"]


ROLE_NAMES = ("analyst", "critic", "engineer", "moderator", "implementer")


def role_flags(roles_model: str | None) -> dict[str, str | None]:
    """`--roles-model M` as the five role overrides (all None when not given)."""
    return {f"roles.{r}": roles_model for r in ROLE_NAMES}


def with_models(config_text: str, model: str | None, roles_model: str | None) -> str:
    """The config template's text with `--model` as [agent] model and `--roles-model` as every [roles] entry."""
    from ..models.local_models import DEFAULT_LOCAL_MODEL

    if model is not None:
        default = f'model = "local:{DEFAULT_LOCAL_MODEL}"\n'
        config_text = config_text.replace(default, f"model = {json.dumps(model)}\n", 1)
    if roles_model is not None:
        for role in ROLE_NAMES:
            config_text = config_text.replace(f'\n{role} = ""\n', f"\n{role} = {json.dumps(roles_model)}\n", 1)
    return config_text
