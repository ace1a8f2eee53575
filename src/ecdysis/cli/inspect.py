"""Commands that read a run directory: `runs list`, `show`, `report`, `diff`. They never write to the store.

Each takes the run directory as `--run-dir`, or from a config (`-c`), else runs/default; a run id (or unique
prefix) is optional: the latest run by default (for `diff`, the latest training run; for `report`, the latest
training run if there is one). `show --task ID` prints one episode turn by turn (`episode.py`)."""

from __future__ import annotations

import webbrowser
from pathlib import Path
from typing import Annotated, Any

import typer

from . import views
from .common import ConfigOpt, JsonOpt, RunDirOpt, config_run_dir, console, fail, find_run, latest_run, open_store

RunArg = Annotated[str | None, typer.Argument(help="Run id or a unique prefix (default: the latest run).")]
TrainRunArg = Annotated[str | None, typer.Argument(help="Training run id or a unique prefix "
                                                        "(default: the latest training run).")]


ReportRunArg = Annotated[str | None, typer.Argument(help="Run id or a unique prefix (default: the latest training "
                                                         "run, else the latest run).")]


def _locate(config: Path | None, run_dir: Path | None, run: str | None, kind: str | None) -> tuple[Any, Path, str]:
    """The store, its folder and the full id of the run a reading command works on (`run`: an id or a unique
    prefix of one; default: the latest run of `kind`)."""
    where = config_run_dir(config, run_dir)
    store = open_store(where)
    return store, where, find_run(store, run) if run else latest_run(store, kind)


def runs_list(run_dir: RunDirOpt = None, config: ConfigOpt = None, as_json: JsonOpt = False) -> None:
    """Runs stored in a run directory."""
    store = open_store(config_run_dir(config, run_dir))
    if as_json:
        views.print_json([{k: v for k, v in run.items() if k != "config"} | {"evaluations": len(
            store.evaluations(run["id"]))} for run in store.runs()])
        return
    views.runs_table(console, store)


def show(
    run: RunArg = None,
    run_dir: RunDirOpt = None,
    config: ConfigOpt = None,
    as_json: JsonOpt = False,
    task: Annotated[str | None, typer.Option("--task", help="Show this task's episode turn by turn.")] = None,
    trial: Annotated[int | None, typer.Option(help="With --task: the trial (default: the lowest recorded).")] = None,
    eval_ref: Annotated[str | None, typer.Option("--eval", help="With --task: the evaluation (id or prefix, or a "
                                                                "label: train, val, test, eval); default the latest "
                                                                "that ran the task.")] = None,
) -> None:
    """One run: its summary and rounds (training runs), evaluations with their failures by kind, model calls by
    role. With --task: one episode turn by turn (messages, calls, results, rejections, repairs, the exception,
    the grade)."""
    store, run_dir, run = _locate(config, run_dir, run, None)
    record = store.run(run)
    if record is None:
        fail(f"no run {run!r} in {run_dir}; see `ecdysis runs list --run-dir {run_dir}`")
        return
    if task is not None or trial is not None or eval_ref is not None:
        from .episode import episode_json, find_episode, print_episode

        if task is None:
            fail("--trial and --eval choose an episode of --task ID; add --task")
        if record["kind"] == "serve":
            fail(f"{record['id']} is a serve run: its sessions are shown by `ecdysis show {record['id']}`")
        choice = find_episode(store, record["id"], task, trial, eval_ref)  # type: ignore[arg-type]
        if as_json:
            views.print_json(episode_json(choice))
        else:
            print_episode(console, choice, str(run_dir))
        return
    if record["kind"] == "serve":
        from ..serve.cli import show_run

        show_run(store, record, as_json)
        return
    if as_json:
        views.print_json({"run": views.decoded(record), "evaluations": views.run_evaluations(store, record["id"]),
                          "calls": store.call_totals(record["id"])})
        return
    if record["kind"] != "train":
        views.run_detail(console, store, record)
        return
    from ..report.data import load_run

    view = load_run(store, record["id"])
    views.training_overview(console, view)
    views.run_detail(console, store, record, [row.to_dict() for row in view.evaluations])


def report(
    run: ReportRunArg = None,
    output: Annotated[Path, typer.Option("--output", "-o", help="HTML file to write.")] = Path("report.html"),
    run_dir: RunDirOpt = None,
    config: ConfigOpt = None,
    open_browser: Annotated[bool, typer.Option("--open", help="Open the report in a browser.")] = False,
) -> None:
    """Write a self-contained HTML report of a run: a training run (plots, rounds, diffs, lineage, trajectories)
    or an evaluation (accuracy, failures by kind, every episode)."""
    from ..report.html import write_report

    run_dir = config_run_dir(config, run_dir)
    store = open_store(run_dir)
    run = run or latest_run(store, "train" if any(r["kind"] == "train" for r in store.runs()) else None)
    record = store.run(run)
    if record is not None and record["kind"] == "serve":
        from ..serve.cli import report_run

        report_run(store, record, output)
        return
    try:
        path = write_report(store, run, output)
    except (KeyError, ValueError) as exc:
        fail(f"{exc.args[0] if exc.args else exc}; see `ecdysis runs list --run-dir {run_dir}`")
        return
    console.print(f"report written to {path} ({path.stat().st_size // 1024} KB)")
    if open_browser and not webbrowser.open(path.resolve().as_uri()):
        console.print(f"[yellow]no browser found here; open {path.resolve()} on a machine with one[/]")


def diff(
    run: TrainRunArg = None,
    old: Annotated[str, typer.Argument(help="Harness version id or prefix, or 'seed'.")] = "seed",
    new: Annotated[str, typer.Argument(help="Harness version id or prefix, or 'final'.")] = "final",
    run_dir: RunDirOpt = None,
    config: ConfigOpt = None,
) -> None:
    """The harness diff between two versions of a run (default: the latest training run, seed -> final)."""
    from rich.syntax import Syntax

    from ..harness.manifest import diff_versions
    from ..report.data import load_run

    store, run_dir, run = _locate(config, run_dir, run, "train")
    kind = store.run(run)["kind"]  # type: ignore[index]
    if kind != "train":
        fail(f"{run} is {'an' if kind[0] in 'aeiou' else 'a'} {kind} run: it has no harness lineage to diff; "
             f"`ecdysis diff` takes a training run (see `ecdysis runs list --run-dir {run_dir}`)")
    try:
        view = load_run(store, run)
        names = {"seed": view.summary.get("seed_harness_id") or (view.lineage[0].id if view.lineage else ""),
                 "final": view.summary.get("final_harness_id") or (view.rounds[-1].record.harness_after
                                                                   if view.rounds else "")}
        a, b = (store.find_version(names.get(ref, ref) or ref) for ref in (old, new))
    except KeyError as exc:
        fail(f"{exc.args[0]}; see `ecdysis show {run} --run-dir {run_dir}` for the versions")
        return
    text = diff_versions(a, b)
    console.print(f"[bold]{a.id}[/] -> [bold]{b.id}[/]")
    if not text:
        console.print("[dim]the two versions are identical[/]")
        return
    console.print(Syntax(text, "diff", theme="ansi_dark", word_wrap=True))
