"""`ecdysis init`: a working seed harness and a ready config (ecdysis.toml) in a project folder."""

from __future__ import annotations

import contextlib
import json
import shutil
from pathlib import Path
from typing import Annotated

import typer

from ..models import local_models
from . import views
from .common import console, err_console, fail, notice, with_models
from .config_flags import USER_ERRORS


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
