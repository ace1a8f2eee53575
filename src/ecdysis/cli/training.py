"""The training commands: `train` (one harness), `compare` (several arms on the same tasks) and
`compare-summary` (compares of different seeds pooled, with the factorial table)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from ..runner.failures import GraderFailed
from ..serve import cli as serve_cli
from ..trainer.methods import DEFAULT_METHOD, METHODS, help_text, trainer_methods
from . import failure_views, views
from .common import ConfigOpt, ExecutorOpt, RayAddressOpt, console, fail, role_flags
from .config_flags import USER_ERRORS, SetOpt, build_config
from .exits import run_async


def train(
    config: ConfigOpt = None,
    sets: SetOpt = None,
    arm: Annotated[str, typer.Option(help=help_text(trainer_methods()))] = DEFAULT_METHOD,
    env: Annotated[str | None, typer.Option(help="Environment: built-in name or package.module:factory.")] = None,
    harness: Annotated[Path | None, typer.Option(help="Seed harness directory.")] = None,
    user_model: Annotated[str | None, typer.Option(help="Simulated user's model (conversation tasks).")] = None,
    model: Annotated[str | None, typer.Option(help="Agent model reference.")] = None,
    roles_model: Annotated[str | None, typer.Option(help="One model for every optimizer role.")] = None,
    rounds: Annotated[int | None, typer.Option(help="Maximum rounds.")] = None,
    run_dir: Annotated[Path | None, typer.Option(help="Run directory.")] = None,
    data_dir: Annotated[Path | None, typer.Option(help="Folder holding gsm8k/ and dbbench/.")] = None,
    executor: ExecutorOpt = None,
    ray_address: RayAddressOpt = None,
    report: Annotated[bool, typer.Option(help="Write RUN_DIR/report-RUN.html at the end.")] = True,
    from_traces: Annotated[Path | None, typer.Option(help="Learn from the scored conversations of an "
                                                          "`ecdysis serve` store instead of an environment.")] = None,
    out: Annotated[Path | None, typer.Option(help="--from-traces: output folder (default STORE/from-traces/TIME).")
                   ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON on stdout (no live view; the "
                                                         "report is still written and its path included).")] = False,
) -> None:
    """Train a harness: collect failures, propose and validate edits, freeze and test (by default per failure
    with the library's levers; --arm ecdysis: aggregated patterns and the debate). Resumable. Ends with the
    result, what changed, the harness diff and the path of the HTML report."""
    if from_traces is not None:
        serve_cli.train_from_traces(from_traces, harness, out, as_json=as_json)
        return
    from ..trainer.api import train_async
    from .runs import AnnouncingWorkspace, finish_train, write_train_report

    roles = role_flags(roles_model)
    try:
        cfg = build_config(config, sets, **{
            "env.name": env, "agent.harness": harness, "agent.model": model, "train.rounds": rounds,
            "run.run_dir": run_dir, "env.data_dir": data_dir, "user.model": user_model, **roles,
            "run.executor": executor, "run.ray_address": ray_address, "run.progress": False if as_json else None,
        })
        ws = AnnouncingWorkspace.open(cfg)
        result = run_async(train_async(cfg, arm=arm, console=None if as_json else console, ws=ws))
    except GraderFailed as exc:
        failure_views.exit_training_grader_failed(console, exc)
    except USER_ERRORS as exc:
        fail(str(exc))
        return
    if as_json:
        grader_failed = None
        path = write_train_report(ws.store, result.run_id) if report else None
        views.print_json(result.to_dict() | {"run_dir": str(cfg.run.run_dir), "report": path and str(path)})
    else:
        views.train_summary(console, result)
        grader_failed = failure_views.show_test_failures(console, result, cfg.run.run_dir)
        finish_train(console, ws.store, result.run_id, report=report)  # the report's path is the last line
    ws.close()
    if grader_failed is not None:
        failure_views.exit_grader_failed(grader_failed)


def compare(
    config_arg: Annotated[Path | None, typer.Argument(metavar="[CONFIG]", help="TOML config (same as -c).")] = None,
    config: ConfigOpt = None,
    sets: SetOpt = None,
    arms: Annotated[str, typer.Option(help=f"Comma-separated: {','.join(METHODS)}")] = "fixed,serial,ecdysis",
    seeds: Annotated[int, typer.Option(help="Independent repeats (task selection seeds).")] = 1,
    transfer_model: Annotated[str | None, typer.Option(help="Evaluate every frozen harness with this model.")] = None,
    model: Annotated[str | None, typer.Option(help="Agent model reference (every arm).")] = None,
    roles_model: Annotated[str | None, typer.Option(help="One model for every optimizer role (and GEPA's "
                                                         "reflector).")] = None,
    user_model: Annotated[str | None, typer.Option(help="Simulated user's model (conversation tasks).")] = None,
    run_dir: Annotated[Path | None, typer.Option(help="Run directory (holds the database).")] = None,
    data_dir: Annotated[Path | None, typer.Option(help="Folder holding gsm8k/ and dbbench/.")] = None,
    executor: ExecutorOpt = None,
    ray_address: RayAddressOpt = None,
) -> None:
    """Run several arms on the same tasks, models and cache; print and save the comparison table."""
    from ..compare.run import compare as run_compare
    from ..compare.run import write_results
    from .runs import AnnouncingWorkspace

    if config and config_arg and config.resolve() != config_arg.resolve():
        fail(f"two configs given ({config_arg} and -c {config}); pass one")
    config = config or config_arg
    if config is None:
        fail("compare needs a config: ecdysis compare -c CONFIG (see benchmarks/*.toml)")
    try:
        cfg = build_config(config, sets, **{"run.run_dir": run_dir, "env.data_dir": data_dir,
                                            "run.executor": executor, "run.ray_address": ray_address,
                                            "agent.model": model, "user.model": user_model,
                                            **role_flags(roles_model)})
        start = time.perf_counter()
        results = run_async(run_compare(cfg, [a.strip() for a in arms.split(",") if a.strip()], seeds,
                                         transfer_model, open_workspace=AnnouncingWorkspace.open))
    except GraderFailed as exc:
        failure_views.exit_training_grader_failed(console, exc)
    except USER_ERRORS as exc:
        fail(str(exc))
        return
    json_path, csv_path = write_results(results, cfg.run.run_dir)
    views.compare_table(console, results)
    views.compare_summary(console, results)
    console.print(f"[dim]compare wall time {time.perf_counter() - start:.0f}s; written {json_path}, {csv_path}, "
                  f"compare_summary.csv/json and curves.csv[/]")
    arm_list = [a.strip() for a in arms.split(",") if a.strip()]
    for name in arm_list:
        if (of := METHODS[name].spend_of) is not None and of not in arm_list:
            console.print(f"[yellow]{name} ran without an {of} arm: k was not matched to a training budget "
                          f"(k = 1 sample per task); add the {of} arm for a fair comparison.[/]")
    if not cfg.cache.isolate_arms:
        console.print("[yellow]cache.isolate_arms = false: later arms reused earlier arms' identical training calls, "
                      "so their real wall times and agent executions are flattered (charged times are not).[/]")


def compare_summary(
    results: Annotated[list[Path], typer.Argument(help="Compare run directories (or their compare.json).")],
    out: Annotated[Path | None, typer.Option(help="Write the pooled compare.json/csv, summary, curves here.")] = None,
    target: Annotated[float | None, typer.Option(help="Pre-registered val accuracy: the factorial table.")] = None,
    budget_s: Annotated[float | None, typer.Option(help="Censoring time (charged s); default: the budget.")] = None,
    registered: Annotated[Path | None, typer.Option(help="TOML with the registered `target`, `budget_s`.")] = None,
    groups: Annotated[Path | None, typer.Option(help="Task id -> group (JSON object or task_id,group CSV): test "
                                                "accuracy per group and arm.")] = None,
    reference: Annotated[str | None, typer.Option(help="With --groups: the arm paired differences are taken "
                                                   "against (default: fixed, when it ran).")] = None,
    project: Annotated[bool, typer.Option(help="With a registration naming its seeds, on an interim pool: how "
                                               "often the registered rules would decide each contrast and factor "
                                               "if the missing seeds looked like the complete ones.")] = False,
    sensitivity: Annotated[str | None, typer.Option(help="With a target: the time-to-target contrasts again at these "
                                                     "val targets, e.g. 0.4,0.45,0.5 (post hoc, not the "
                                                     "decision).")] = None,
) -> None:
    """Pool compares of different seeds (one seed per machine or session) into one table, mean ± 95% CI; with a
    pre-registered target (`--target`, or `--registered FILE`), the factorial table (charged time to the target
    censored at the budget, AUC, paired test differences with bootstrap intervals), also written as factorial.json;
    what each training arm's charged time bought (its steps by outcome); with `--groups FILE`, test accuracy per
    task group (e.g. failure kind), also written as groups.json. `--out DIR` writes it all, and summary.md: every
    table as Markdown. `--project` adds, on an interim pool, what the registered seeds may decide (a guide);
    `--sensitivity T,...` the speed-ups at other val targets (post hoc)."""
    from ..compare.factorial import Registration, factorial_report
    from ..compare.files import pool_results, write_results
    from ..compare.groups import group_report, read_groups
    from ..compare.outcomes import outcome_table
    from ..compare.projection import project as projected
    from ..compare.sensitivity import at_targets, parse_targets, sensitivity_dict, sensitivity_table
    from ..compare.verdict import verdicts
    from ..report.markdown import to_markdown

    try:
        pooled = pool_results(results)
        registration = Registration.read(registered) if registered is not None else None
        plan = Registration.resolve(target, budget_s, registration)
        by_group = group_report(pooled, read_groups(groups), reference) if groups is not None else None
        targets = parse_targets(sensitivity) if sensitivity is not None else None
    except ValueError as exc:
        fail(str(exc))
        return
    summary = views.summary_shown(pooled)
    views.show(console, [*views.compare_tables(pooled, console.width), *summary])
    shown: list[Table | str] = []  # printed below; in summary.md after the compare table at full width
    report = factorial_report(pooled, plan) if plan is not None else None
    decided: dict[str, object] = {}
    if report is not None:
        if plan is not None and (changed := plan.departures(registration)):
            shown.append(f"Not the registered protocol ({registered}): {'; '.join(changed)} (command line).")
        shown.append(report.table())
        if (early := report.early_text()) is not None:
            shown.append(early)
        shown += [extra for extra in (report.factor_table(), report.time_table()) if extra is not None]
        decided_by_rules = verdicts(report)
        if decided_by_rules:
            shown.append(decided_by_rules.table())
        decided = decided_by_rules.to_dict()
        if project:
            if (guide := projected(pooled, report.registration)) is not None:
                shown.append(guide.table())
                decided["projection"] = guide.to_dict()
            else:
                shown.append("--project: nothing to project (no registered number of seeds, every registered seed "
                             "complete, or fewer than two complete seeds).")
        if targets is not None:
            rows = at_targets(pooled, targets, report.tau, report.registration.target)
            shown.append(sensitivity_table(rows, report.tau))
            decided["sensitivity"] = sensitivity_dict(rows)
    elif project:
        shown.append("--project needs a registration (--registered FILE naming its seeds): nothing projected.")
    if report is None and targets is not None:
        shown.append("--sensitivity needs a target (--target or --registered FILE): no sensitivity table.")
    if (bought := outcome_table(pooled)) is not None:
        shown.append(bought)
    if by_group is not None:
        shown.append(by_group.table())
    for item in shown:  # plain lines here are warnings: a departure, an arm that stopped early
        if isinstance(item, Table):
            console.print(item)
        else:
            console.print(item, style="yellow", markup=False, highlight=False)
    if out is not None:
        json_path, _ = write_results(pooled, out)
        if report is not None:
            report.write(out / "factorial.json", **decided)
        if by_group is not None:
            (out / "groups.json").write_text(json.dumps(by_group.to_dict(), indent=1))
        sources = ", ".join(_shown_path(path) for path in results)
        everything = [*views.compare_tables(pooled, 10**6), *summary, *shown]  # one compare table, unsplit
        (out / "summary.md").write_text(to_markdown(everything, f"compare-summary of {sources}"))
        console.print(f"[dim]written {json_path} and the rest beside it[/]")


def _shown_path(path: Path) -> str:
    """A path as written into a committed file: relative to the working directory when under it, else its name
    (no machine's absolute paths)."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return path.name
