"""Turn one spec into a checked candidate harness.

The levers the catalog applies itself (rules, repairs, skills, demos, examples, generation settings: see
`lever_catalog.py`) are applied deterministically. Code changes (`edit_code`) go to the implementer model,
which returns whole files as JSON; several samples are drawn and the first that passes every check wins
(failed checks are shown to the next sample).
An external coding-agent command may be used instead: it runs in a copy of the harness directory
with the spec in SPEC.json, confined by bubblewrap (that copy is all it can write; no network unless
configured; only the host variables it is given) and killed after its timeout. Without bubblewrap it is
refused unless `train.implementer_unconfined = true` (then a warning, and the round's record says so).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shlex
import signal
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console

from ..agent.trajectory import Trajectory
from ..envs.base import Environment, Task
from ..harness.manifest import HarnessFileError, HarnessVersion, load_harness
from ..harness.skills import Skill, retrieve
from ..models.base import ChatRequest, GenerationParams, Message
from ..models.cache import MeteredModel
from ..sandbox.confine import bwrap_path, confine_tool_argv
from ..sandbox.host import SandboxLimits
from .checks import CheckFailed, ReplayReport, check_replay, check_static
from .fdcr import BudgetSpent, check_budget, render, unlimited
from .lever_catalog import LEVERS, Draft, edits_only_h2
from .rerun import EpisodeRerun
from .spec import Change, HarnessSpec

SPEC_FILE = "SPEC.json"  # the spec, written into the external implementer's copy; never read back
OUTPUT_TAIL = 64_000  # bytes of the external implementer's output kept (the end, for its error message)
CONTENT_SCHEMA = {"type": "object", "properties": {"content": {"type": "string"}}, "required": ["content"]}
INTERFACES = {
    "action.py": ("It must define realize(reply, ctx) -> Action | list[Action] | Reject. reply is the text (a str) "
                  "with reply.tool_calls (native calls: id, name, arguments JSON text); ctx.tools lists the tools."),
    "regulate.py": "It must define regulate(state) -> Verdict(annotation='', stop=False, reason=''); "
                   "state has turn, max_turns, action, observation, history.",
}


@dataclass
class Candidate:
    version: HarnessVersion | None
    applied: list[str] = field(default_factory=list)
    attempts: list[dict[str, Any]] = field(default_factory=list)
    replay: ReplayReport | None = None
    error: str = ""
    stopped: str = ""  # the budget's stop reason when the budget stopped the implementer (then no version)


def _unpaid(request_key: str) -> bool:
    return False


def apply_structured(current: HarnessVersion, spec: HarnessSpec, trajectories: list[Trajectory],
                     tasks: dict[str, Task]) -> tuple[dict[str, str], list[str]]:
    """Apply every change the catalog applies itself (all but code) and the spec's skills. Returns (files,
    notes on what was applied or skipped)."""
    draft = Draft(current, dict(current.files), trajectories, tasks)
    notes = [lever.apply(draft, change) for change in spec.changes if (lever := LEVERS[change.kind]).apply]
    files = draft.files
    skills_file = draft.layer_file("skills", "skills.json")
    for skill in spec.skills:
        candidate = Skill(skill.id, skill.trigger or "*", skill.tip)
        if candidate.trigger != "*" and not any(retrieve([candidate], t.prompt, 1) for t in tasks.values()):
            notes.append(f"H5 skill {skill.id} dropped: its trigger {skill.trigger!r} matches no training task")
            continue
        items = json.loads(files.get(skills_file) or "[]")
        items.append({"id": skill.id or f"s{len(items) + 1}", "trigger": candidate.trigger, "tip": skill.tip})
        files[skills_file] = json.dumps(items, indent=1) + "\n"
        notes.append(f"H5 skill {skill.id} added")
    return files, notes


def reply_content(text: str) -> str:
    """The file content from an implementer reply `{"content": "..."}`; CheckFailed says what was wrong."""
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CheckFailed(f"the implementer's reply is not JSON ({exc.msg} at character {exc.pos})") from exc
    if not isinstance(obj, dict) or not isinstance(obj.get("content"), str):
        raise CheckFailed(f"the implementer's reply must be a JSON object with a string 'content', got "
                          f"{type(obj).__name__}{' without content' if isinstance(obj, dict) else ''}")
    return obj["content"]


class UnconfinedImplementer(ValueError):
    """The external implementer would run with no confinement and `train.implementer_unconfined` is not set."""


_WARNED_UNCONFINED: list[str] = []  # commands warned about in this process


@dataclass(frozen=True)
class ExternalCommand:
    """The external coding agent (`train.implementer_command`) and its confinement. Without bubblewrap it
    refuses to run unless `unconfined` (`train.implementer_unconfined = true`): then it warns once and the
    round's candidate record says so (`isolation`)."""

    command: str
    timeout_s: float = 900.0
    network: bool = False
    env_names: tuple[str, ...] = ()
    unconfined: bool = False

    @classmethod
    def from_config(cls, train: Any) -> ExternalCommand | None:
        """The configured command, refused (UnconfinedImplementer) here already if it could only run unconfined."""
        if not train.implementer_command:
            return None
        external = cls(train.implementer_command, train.implementer_timeout_s, train.implementer_network,
                       tuple(train.implementer_env), bool(getattr(train, "implementer_unconfined", False)))
        external.isolation()
        return external

    def isolation(self) -> str:
        """How it runs here: "bwrap", or "unconfined (...)" when allowed; raises UnconfinedImplementer if not."""
        if bwrap_path() is not None:
            return "bwrap"
        if not self.unconfined:
            raise UnconfinedImplementer(
                "train.implementer_command would run with no confinement: bubblewrap (bwrap) is missing or cannot "
                "create namespaces here. Install the Debian package `bubblewrap` (make setup does), or set "
                "train.implementer_unconfined = true to run it unconfined anyway")
        if self.command not in _WARNED_UNCONFINED:
            _WARNED_UNCONFINED.append(self.command)
            Console(stderr=True).print(
                "[bold yellow]warning: train.implementer_unconfined = true and bubblewrap is unavailable: the "
                "external implementer runs with no confinement (it can read and write what you can).[/]")
        return "unconfined (train.implementer_unconfined = true)"

    def launch(self, workdir: str) -> tuple[list[str], dict[str, str]]:
        """(argv, environment): bubblewrap-confined (the variables are set inside, the process starts with
        none); where bubblewrap is unavailable, the bare command with a minimal environment if allowed."""
        command = shlex.split(self.command)
        passed = {k: os.environ[k] for k in self.env_names if k in os.environ}
        if self.isolation() == "bwrap" and (confined := confine_tool_argv(command, workdir, passed, self.network)):
            return confined, {}
        return command, {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": workdir, **passed}


async def _tail(proc: asyncio.subprocess.Process) -> bytes:
    """Read the process's output to its end, keeping only the last OUTPUT_TAIL bytes; wait for it to exit."""
    assert proc.stdout is not None
    kept = bytearray()
    while chunk := await proc.stdout.read(65536):
        kept += chunk
        del kept[:-OUTPUT_TAIL]
    await proc.wait()
    return bytes(kept)


@dataclass
class Implementer:
    model: MeteredModel | None
    env: Environment
    train_tasks: list[Task]
    limits: SandboxLimits
    attempts: int = 4
    external: ExternalCommand | None = None
    rerun: EpisodeRerun | None = None  # exact replay of tool/multi-turn episodes (`rerun.runner_rerun`)
    spent: Callable[[], str | None] = unlimited  # the budget's stop reason (None while money is left)
    paid: Callable[[str], bool] = _unpaid  # whether the run already paid for a request (then it is free)

    async def _rewrite(self, files: dict[str, str], change: Change, examples: list[str], error: str,
                       sample: int) -> str:
        assert self.model is not None
        prompt = render("implementer", file=change.file, content=files[change.file],
                        change=f"{change.text} ({change.rationale})", interface=INTERFACES.get(change.file, ""),
                        examples="\n---\n".join(e[-400:] for e in examples[:4]),
                        error=f"\nYOUR PREVIOUS VERSION FAILED A CHECK: {error}\n" if error else "")
        params = GenerationParams(temperature=0.0 if sample == 0 else 0.8, max_tokens=900,
                                  json_schema=CONTENT_SCHEMA, sample_index=sample)
        request = ChatRequest(messages=[Message(role="user", content=prompt)], params=params)
        check_budget(self.spent, self.paid, self.model, request)  # no new sample once the budget is spent
        response = await self.model.chat(request)
        return reply_content(response.text)

    async def _external(self, current: HarnessVersion, spec: HarnessSpec) -> dict[str, str]:
        """Run the external command in a fresh copy of `current` and read its copy back as untrusted input:
        regular files inside the copy only (a link, device or FIFO it planted is a CheckFailed naming the
        file, never followed); its output is kept to its last OUTPUT_TAIL bytes."""
        assert self.external is not None
        with tempfile.TemporaryDirectory(prefix="ecdysis-impl-") as tmp:
            directory = current.write(Path(tmp) / "harness")
            (directory / SPEC_FILE).write_text(spec.model_dump_json(indent=2))
            argv, env = self.external.launch(str(directory))
            proc = await asyncio.create_subprocess_exec(
                *argv, cwd=directory, env=env, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT, start_new_session=True)
            try:
                output = await asyncio.wait_for(_tail(proc), timeout=self.external.timeout_s)
            except TimeoutError:
                raise CheckFailed(f"implementer command timed out after {self.external.timeout_s:g}s "
                                  "(train.implementer_timeout_s)") from None
            finally:  # nothing it started keeps writing into the copy while it is read back
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                await proc.wait()
            if proc.returncode != 0:
                tail = output.decode(errors="replace").strip()[-800:]
                raise CheckFailed(f"implementer command exited with {proc.returncode}: {tail}")
            try:
                return load_harness(directory, skip=frozenset({SPEC_FILE})).files
            except HarnessFileError as exc:
                rel = exc.path.removeprefix(os.path.realpath(directory) + "/")
                raise CheckFailed(f"the implementer's copy of the harness was refused: {rel} {exc.problem} "
                                  "(harness files must be regular files inside the harness folder)") from None

    async def build(self, current: HarnessVersion, spec: HarnessSpec, trajectories: list[Trajectory]) -> Candidate:
        tasks = {t.id: t for t in self.train_tasks}
        base_files, notes = apply_structured(current, spec, trajectories, tasks)
        code_changes = [c for c in spec.changes if not LEVERS[c.kind].apply]  # the implementer writes these
        examples = [r for t in trajectories if not t.passed for r in t.replies()[-1:]]
        candidate = Candidate(None, applied=notes)
        if self.external:  # refused before any sample when it could only run unconfined without consent
            candidate.applied.append(f"external implementer isolation: {self.external.isolation()}")
        error = ""
        tries = self.attempts if (code_changes or self.external) else 1
        for sample in range(tries):
            files = dict(base_files)
            try:
                if self.external:
                    files = await self._external(current, spec)
                for change in code_changes:
                    files[change.file] = await self._rewrite(files, change, examples, error, sample)
                version = check_static(current, files, self.train_tasks)
                if version.id == current.id:
                    raise CheckFailed("the candidate is identical to the current harness")
                if edits_only_h2(current, version.files):
                    candidate.replay = await check_replay(version, trajectories, self.env, tasks, self.limits,
                                                          self.rerun)
                candidate.version = version
                candidate.attempts.append({"sample": sample, "ok": True,
                                           "replay": candidate.replay.to_dict() if candidate.replay else None})
                return candidate
            except BudgetSpent as spent:
                candidate.stopped, candidate.error = str(spent), f"{spent} before sample {sample}"
                return candidate
            except (CheckFailed, ValueError, KeyError) as exc:
                error = str(exc)
                candidate.attempts.append({"sample": sample, "ok": False, "error": error})
        candidate.error = error
        return candidate
