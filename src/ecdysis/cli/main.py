"""The `ecdysis` command line (typer + rich): the app, its commands registered in the order `--help` lists them,
and the entry point. The commands live in their modules: `chat`, `project` (init), `evaluate`, `training`,
`inspect`, `doctor`, `cache`, and `serve/cli.py`."""

from __future__ import annotations

import os
import sys
from typing import Annotated

import typer

from ..serve import cli as serve_cli
from . import cache, chat, doctor, evaluate, inspect, project, training
from .exits import run_guarded

app = typer.Typer(help="Ecdysis: train the runtime harness of an LLM agent.", no_args_is_help=True,
                  pretty_exceptions_enable=False)
models_app = typer.Typer(help="Local GGUF models.", no_args_is_help=True)
runs_app = typer.Typer(help="Runs recorded in a run directory.", no_args_is_help=True)
app.add_typer(models_app, name="models")
cache_app = typer.Typer(help="The response cache, carried between machines.", no_args_is_help=True)
app.add_typer(runs_app, name="runs")
app.add_typer(cache_app, name="cache")
runs_app.command("list")(inspect.runs_list)
app.command("serve")(serve_cli.serve)
app.command()(inspect.show)
app.command()(inspect.report)
app.command()(inspect.diff)
app.command("doctor")(doctor.doctor)
app.command()(chat.chat)
models_app.command("list")(chat.models_list)
models_app.command("pull")(chat.models_pull)
app.command()(project.init)
app.command("eval")(evaluate.eval_cmd)
app.command()(training.train)
app.command()(training.compare)
app.command("compare-summary")(training.compare_summary)
cache_app.command("export")(cache.cache_export)
cache_app.command("import")(cache.cache_import)


@app.callback()
def root(debug: Annotated[bool, typer.Option("--debug", help="Show the traceback of an internal error "
                                                               "(anywhere on the command line).")] = False) -> None:
    """Ecdysis: train the runtime harness of an LLM agent."""


def main(argv: list[str] | None = None) -> None:
    """The `ecdysis` entry point; exit statuses as `cli/exits.py` says (2: a user error, with its message; 1: an
    internal error, one line, or its traceback when `--debug` is anywhere before `--` or ECDYSIS_DEBUG=1;
    3: a grader that failed on some episode (`eval`, `train`, `compare`); 130: Ctrl-C, the run marked
    interrupted)."""
    args = list(sys.argv[1:] if argv is None else argv)
    end = args.index("--") if "--" in args else len(args)
    debug = "--debug" in args[:end] or os.environ.get("ECDYSIS_DEBUG", "") not in ("", "0")
    args = [a for i, a in enumerate(args) if not (a == "--debug" and i < end)]
    run_guarded(lambda: app(args=args, prog_name="ecdysis"), debug)
