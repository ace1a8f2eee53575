"""Test helpers: harness versions built in code, and a chat function backed by a ScriptedModel."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

from ecdysis.config import Config, load_config
from ecdysis.harness.manifest import HarnessVersion, version_from_files
from ecdysis.models import ChatRequest, GenerationParams, Message, ScriptedModel
from ecdysis.workspace import Workspace, seed_harness_dir

ROLES = ("analyst", "critic", "engineer", "moderator", "implementer")
BOXED_SPEC = {"patterns_addressed": ["P1"], "changes": [{"layer": "H2", "kind": "enable_repair", "file": "",
              "text": "accept boxed answers", "repair": "boxed_answer", "value": 0,
              "rationale": "replies end in boxed"}],
              "skills": [], "implementation_notes": "", "expected_effect": "format failures disappear"}


def seed_files(env: str) -> dict[str, str]:
    root = seed_harness_dir(env)
    return {p.relative_to(root).as_posix(): p.read_text() for p in root.rglob("*") if p.is_file()
            and "__pycache__" not in p.parts}


def write_seed(directory: Path, env: str) -> Path:
    """The built-in seed harness of `env` written to `directory` (created), for configs that name a folder."""
    directory.mkdir(exist_ok=True)
    for rel, text in seed_files(env).items():
        (directory / rel).write_text(text)
    return directory


def seed_with(env: str, **changes: str) -> HarnessVersion:
    files = seed_files(env)
    files.update(changes)
    return version_from_files(files, origin=f"test-{env}")


def sync_chat(model: ScriptedModel) -> Callable[[list[dict[str, str]], dict[str, Any]], dict[str, Any]]:
    def chat(messages: list[dict[str, str]], params: dict[str, Any]) -> dict[str, Any]:
        request = ChatRequest(messages=[Message(**m) for m in messages], params=GenerationParams(**params))
        r = asyncio.run(model.chat(request))
        return {"text": r.text, "usage": r.usage.model_dump(), "latency_s": r.latency_s}

    return chat


def async_chat(responses: Sequence[str]) -> Callable[[list[dict[str, str]], dict[str, Any]], Awaitable[dict[str, Any]]]:
    model = ScriptedModel(list(responses))

    async def chat(messages: list[dict[str, str]], params: dict[str, Any]) -> dict[str, Any]:
        request = ChatRequest(messages=[Message(**m) for m in messages], params=GenerationParams(**params))
        r = await model.chat(request)
        return {"text": r.text, "usage": r.usage.model_dump(), "latency_s": r.latency_s}

    return chat


def add_answer(messages: list[Message]) -> str:
    a, b = map(int, re.findall(r"\d+", messages[-1].content)[:2])
    return f"Adding them.\nThe result is \\boxed{{{a + b}}}"


class Roles:
    """Scripted optimizer roles; counts calls and can simulate a crash after N calls."""

    def __init__(self, crash_after: int | None = None, spec: dict[str, Any] | None = None) -> None:
        self.calls: list[str] = []
        self.prompts: list[str] = []  # the last message of every call
        self.crash_after = crash_after
        self.spec = spec or BOXED_SPEC

    def __call__(self, messages: list[Message]) -> str:
        if self.crash_after is not None and len(self.calls) >= self.crash_after:
            raise KeyboardInterrupt("simulated kill")
        prompt = messages[-1].content
        role = prompt.split("You are the ")[1].split()[0].strip(".") if "You are the " in prompt else "SINGLE"
        self.calls.append(role)
        self.prompts.append(prompt)
        if role in ("MODERATOR", "SINGLE"):
            return json.dumps(self.spec)
        return f"{role}: enable the boxed_answer repair; it is general."


def jsonl_project(tmp_path: Path, rows: list[dict[str, Any]]) -> list[str]:
    """`rows` as a JSONL suite and the GSM8K seed as its harness, in `tmp_path`; the config settings for them."""
    (tmp_path / "tasks.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    harness = tmp_path / "seed"
    harness.mkdir(exist_ok=True)
    for rel, text in seed_files("gsm8k").items():
        (harness / rel).write_text(text.replace('env = "gsm8k"', 'env = "jsonl"'))
    return ['env.name="jsonl"', f'env.options.path="{tmp_path / "tasks.jsonl"}"', f'agent.harness="{harness}"',
            "run.progress=false"]


def scripted_workspace(cfg: Config, agent: ScriptedModel, roles: Callable[[list[Message]], str]) -> Workspace:
    """The workspace of `cfg` (its models `scripted:agent`): `agent` answers as the agent, `roles` as every
    optimizer role (a scripted model of its own per role)."""
    ws = Workspace.open(cfg)
    ws.backends["agent|scripted:agent"] = agent
    for role in ROLES:
        ws.backends[f"{role}|scripted:agent"] = ScriptedModel(roles, name="roles")
    return ws


def make_ws(tmp_path: Path, roles: Roles, agent: ScriptedModel, *overrides: str,
            rows: list[dict[str, Any]] | None = None) -> Workspace:
    """A workspace on a JSONL suite of additions (`rows`, default 6 train + 4 test), the scripted agent and roles."""
    rows = rows or [{"id": f"q{i}", "prompt": f"Add {i} and {i + 3}.", "answer": str(2 * i + 3),
                     "split": "train" if i < 6 else "test"} for i in range(10)]
    cfg = load_config(None, [*jsonl_project(tmp_path, rows), 'agent.model="scripted:agent"',
                             f'run.run_dir="{tmp_path / "run"}"', "train.rounds=3",
                             "train.train_limit=6", "train.test_limit=4", f'cache.path="{tmp_path / "c.sqlite"}"',
                             *overrides])
    return scripted_workspace(cfg, agent, roles)




def registered_summary(tmp_path: Path, results: Sequence[Any], registration: str, *args: str) -> tuple[str, Any]:
    """`ecdysis compare-summary --registered` on `results` (written to tmp_path/cmp) under the registration TOML
    text `registration`, with `--out tmp_path/pooled` and any further `args`: its output (exit 0 asserted) and
    the factorial.json it wrote."""
    from typer.testing import CliRunner

    from ecdysis.cli.main import app
    from ecdysis.compare.files import write_results

    write_results(list(results), tmp_path / "cmp")
    (tmp_path / "reg.toml").write_text(registration)
    out = CliRunner().invoke(app, ["compare-summary", str(tmp_path / "cmp"), "--registered", str(tmp_path / "reg.toml"),
                                   "--out", str(tmp_path / "pooled"), *args], terminal_width=300)
    assert out.exit_code == 0, out.output
    return out.output, json.loads((tmp_path / "pooled" / "factorial.json").read_text())
