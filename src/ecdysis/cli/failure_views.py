"""Terminal views of failures: the table under an evaluation summary, and the exit when the grader failed.

Contract: a grader error is never shown as a wrong answer. `eval`, `train` and `compare` print the failures by
kind, each with its first message (and a crash's traceback tail), and exit with `EXIT_GRADER_FAILED` (3) when
the grader failed on any episode they report.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, NoReturn

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ..runner.failures import EXIT_GRADER_FAILED, FailureCounts, FailureKind, GraderFailed
from .common import err_console


def failure_table(console: Console, failures: FailureCounts, title: str = "Failures (apart from wrong answers)",
                  show: str = "ecdysis show RUN") -> None:
    """Kind, count and first message of each kind; then the first harness crash's traceback tail (`show`: the
    command line that shows one episode of the run, without `--task`)."""
    if not failures:
        return
    table = Table(title=title)
    table.add_column("kind", no_wrap=True)
    table.add_column("episodes", justify="right")
    table.add_column("first (task: message)")
    for c in failures.kinds:
        where = f"{c.first.task_id}" + (f" trial {c.first.trial}" if c.first.trial else "")
        table.add_row(f"{c.kind}", str(c.count), escape(f"{where}: {c.first.message}" if where else c.first.message))
    console.print(table)
    crash = failures.first(FailureKind.HARNESS_CRASH)
    if crash is not None and crash.traceback:
        console.print(f"[bold]first harness crash[/] (task {escape(crash.task_id)}, trial {crash.trial}):")
        console.print("\n".join(f"  {line}" for line in crash.traceback.splitlines()), markup=False, highlight=False)
        console.print(f"[dim]the whole episode: `{escape(show)} --task {escape(crash.task_id)}`[/]", highlight=False)


def grader_failed_text(failures: FailureCounts, episodes: int) -> str:
    """The message `eval` ends with when the grader failed."""
    first = failures.first(FailureKind.GRADER_ERROR)
    where = f" (first, task {first.task_id}: {first.message})" if first else ""
    return (f"the grader failed on {failures.grader_errors} of {episodes} episode(s){where}. Those episodes "
            "scored 0 whatever they answered, so the accuracy above is not the harness's. Fix the grader, then run "
            "the same command again: the model's replies are reused where stored or cached.")


def exit_grader_failed(message: str) -> NoReturn:
    """Print `error: message` on stderr and exit with EXIT_GRADER_FAILED."""
    import typer

    err_console.print(f"[bold red]error:[/] {escape(message)}", highlight=False)
    raise typer.Exit(EXIT_GRADER_FAILED)


def exit_training_grader_failed(console: Console, exc: GraderFailed) -> NoReturn:
    """`train`/`compare` stopped because the grader failed: the failures, the reason, exit 3."""
    failure_table(console, exc.failures, f"Failures of the {exc.split} evaluation (apart from wrong answers)")
    exit_grader_failed(str(exc))


def show_test_failures(console: Console, result: Any, run_dir: Path) -> str | None:
    """After `train` (a `TrainResult`): the failures of the seed's and the final harness's test evaluations;
    returns what to exit 3 with (`exit_grader_failed`) when the grader failed on one of them."""
    failed = None
    for name, test in (("seed", result.test_before), ("final", result.test_after)):
        failures = FailureCounts.from_dict((test or {}).get("failures"))
        failure_table(console, failures, f"Failures of the {name} harness on test (apart from wrong answers)",
                      show=f"ecdysis show {result.run_id} --run-dir {run_dir} --eval test")
        if test and failures.grader_errors and failed is None:
            failed = f"test accuracy ({name}): {grader_failed_text(failures, int(test['episodes']))}"
    return failed
