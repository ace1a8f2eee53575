"""`ecdysis eval`: evaluate a harness on tasks (the same command again resumes an interrupted evaluation)."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Annotated

import typer

from ..run_identity import identity_json
from . import failure_views, views
from .common import ConfigOpt, ExecutorOpt, JsonOpt, RayAddressOpt, console, fail
from .config_flags import USER_ERRORS, SetOpt, build_config
from .exits import run_async


def eval_cmd(
    config: ConfigOpt = None,
    sets: SetOpt = None,
    env: Annotated[str | None, typer.Option(help="Environment: built-in name or package.module:factory.")] = None,
    harness: Annotated[Path | None, typer.Option(help="Harness directory (default: built-in seed).")] = None,
    user_model: Annotated[str | None, typer.Option(help="Simulated user's model (conversation tasks).")] = None,
    model: Annotated[str | None, typer.Option(help="Agent model reference.")] = None,
    split: Annotated[str | None, typer.Option(help="train | val | test (default val; test only when asked)")] = None,
    limit: Annotated[int | None, typer.Option(help="Number of tasks (seeded choice); all: --set eval.limit=all.")
                     ] = None,
    trials: Annotated[int | None, typer.Option(help="Trials per task.")] = None,
    run_dir: Annotated[Path | None, typer.Option(help="Run directory (holds the database).")] = None,
    data_dir: Annotated[Path | None, typer.Option(help="Folder holding gsm8k/ and dbbench/.")] = None,
    tasks_file: Annotated[Path | None, typer.Option("--tasks", help="JSONL tasks (env jsonl).")] = None,
    grader: Annotated[str | None, typer.Option(help="Grader (env jsonl): a built-in name, module:function "
                                                    "or file.py:function.")] = None,
    concurrency: Annotated[int | None, typer.Option(help="Episodes in parallel.")] = None,
    timeout: Annotated[float | None, typer.Option(help="Seconds per task.")] = None,
    as_json: JsonOpt = False,
    executor: ExecutorOpt = None,
    ray_address: RayAddressOpt = None,
    task_ids: Annotated[list[str] | None, typer.Option("--task", help="Only this task id (repeatable).")] = None,
) -> None:
    """Evaluate a harness on tasks. Re-running the same command resumes an interrupted evaluation."""
    from .runs import AnnouncingWorkspace

    try:
        cfg = build_config(config, sets, **{
            "env.name": env, "agent.harness": harness, "agent.model": model, "eval.split": split,
            "eval.limit": limit, "eval.trials": trials, "run.run_dir": run_dir, "env.data_dir": data_dir,
            "run.executor": executor, "run.ray_address": ray_address,
            "env.options.path": tasks_file, "env.options.grader": grader,
            "run.concurrency": concurrency, "sandbox.timeout_s": timeout, "user.model": user_model,
            "run.progress": False if as_json else None,
        })
        ws = AnnouncingWorkspace.open(cfg)
        version = ws.harness()
        tasks = ws.tasks(cfg.eval.split, cfg.eval.limit)
        if task_ids:
            by_id = {t.id: t for t in ws.tasks(cfg.eval.split, None)}
            missing = [i for i in task_ids if i not in by_id]
            if missing:
                fail(f"no task {missing[0]!r} in split {cfg.eval.split!r}")
            tasks = [by_id[i] for i in dict.fromkeys(task_ids)]
        if not tasks:
            fail(f"no tasks in split {cfg.eval.split!r} of environment {cfg.env.name!r}; choose another with "
                 "--split (train, val, test)")
        ws.model(cfg.agent.model)  # a bad model reference fails before anything is written
        key = hashlib.sha256(identity_json(cfg).encode() + version.id.encode()
                             + ",".join(task_ids or []).encode()).hexdigest()[:10]
        run_id = ws.store.start_run("eval", cfg.model_dump(mode="json"), run_id=f"eval-{key}")
        runner = ws.runner(run_id)
        summary = run_async(runner.evaluate(version, tasks, cfg.eval.trials, cfg.eval.split, "eval"))
        ws.store.finish_run(run_id, summary.to_dict())
    except USER_ERRORS as exc:
        fail(str(exc))
        return
    if as_json:
        views.print_json(summary.to_dict() | {"run_id": run_id, "run_dir": str(cfg.run.run_dir)})
    else:
        views.eval_summary(console, summary, run_id, cfg.run.run_dir)
    ws.close()
    if summary.failures.grader_errors:
        failure_views.exit_grader_failed(failure_views.grader_failed_text(summary.failures, summary.episodes))
