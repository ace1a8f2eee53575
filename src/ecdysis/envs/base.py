"""The environment protocol (a public API), tasks with stable ids, deterministic splits, data loading.

An environment lives in two places, both in one plugin module:

- host side: `factory(data_dir=..., seed=..., **options) -> Environment` loads tasks and grades.
  `grade` is the only code that sees the gold answer; a task's `user_scenario` (what a simulated
  user knows) also stays in the host.
- sandbox side: module-level `make_episode(public, options) -> Episode` builds one task's live
  state from its public view only (prompt, tables, initial data) and runs tool calls. An optional
  module-level `preload_sandbox()` imports what episodes need; the sandbox's zygote calls it once
  before forking episodes, so slow imports are not paid per episode.

What the sandbox sees of the plugin (`ecdysis.sandbox.view`): its importable code only — the plugin
module and the modules and packages of its folder that it imports — not the rest of its folder. Task files
beside the module (text and gold of every split) stay on the host. An environment whose episodes need a
file declares it in `sandbox_files` (paths absolute or relative to the module's folder: bound read-only at
the same path); files in `sandbox_hidden` (e.g. task files inside an installed package, which the runtime
binds whole) are masked with an empty file, declared or not. Prefer passing what an episode needs in the
task's `public` view (examples/helpdesk does: the initial database), so data files need not enter at all.

So neither harness code nor optimizer roles can read labels through the loop. An episode's
`tools` are `ToolSpec`s (name, description, JSON-schema `parameters`); the library validates
arguments against the schema before `step` runs. `grade` receives the final answer and the
episode's `final_state()`, to which the library adds `conversation` (the messages of the episode:
assistant text and tool calls, tool results, user turns) and `termination` (how it ended).
"""

from __future__ import annotations

import hashlib
import json
import os
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from ..harness.api import Action, ToolSpec

SPLITS = ("train", "val", "test")


class TaskFileError(ValueError):
    """A task file is malformed; the message names the file, the line and the problem."""


class DataNotFoundError(FileNotFoundError):
    pass


@dataclass(frozen=True)
class Task:
    id: str  # stable: derived from content, never from a list position
    split: str
    prompt: str
    gold: Any  # host-only
    public: dict[str, Any] = field(default_factory=dict)  # what the sandbox may see besides prompt
    meta: dict[str, Any] = field(default_factory=dict)
    user_scenario: str | None = None  # host-only: instructions for the simulated user (a conversation task)

    def public_view(self) -> dict[str, Any]:
        return {"id": self.id, "prompt": self.prompt, "public": self.public,
                "conversational": self.user_scenario is not None}


def gold_text(gold: Any) -> str | None:
    """A scalar gold answer as text, the one way the library writes it (an integral float without its '.0');
    None for a structured gold (a list, a state, an action list)."""
    if isinstance(gold, (str, int)):  # bool included
        return str(gold)
    if isinstance(gold, float):
        return str(int(gold)) if gold.is_integer() else str(gold)
    return None


GRADER_ERROR = "grader_error"  # a Score's `components` key: the grader failed, so its 0 is not the answer's


@dataclass(frozen=True)
class Score:
    value: float
    passed: bool
    detail: str = ""
    components: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def grader_error(cls, message: str) -> Score:
        """The score of an episode the grader failed on: 0, with the failure kept under `GRADER_ERROR`, so it
        is counted apart from wrong answers (`ecdysis.runner.failures`)."""
        return cls(0.0, False, message, {GRADER_ERROR: message})


class Episode(Protocol):
    """One task's live state inside the sandbox.

    `step` runs one validated tool call (`action.arguments` for schema tools, `action.input` for
    text tools) and returns the observation text; start it with "Error" when the call failed, so
    the failure is recorded as a tool error. Optional attribute: `greeting` (the agent's opening
    line in a conversation).
    """

    tools: tuple[ToolSpec, ...]

    def step(self, action: Action) -> str: ...

    def final_state(self) -> dict[str, Any]: ...

    def close(self) -> None: ...


class Environment(Protocol):
    """Host side. Optional attributes used by `ecdysis init`: `tools` (tuple of ToolSpec, for a seed
    harness), `instructions` (policy text for the seed contract), `tool_calling` ("native" | "text").
    Optional attributes used by the sandbox: `sandbox_files` (files episodes may read, bound read-only;
    nothing else of the plugin's folder but its code is there) and `sandbox_hidden` (paths masked)."""

    name: str
    tool_names: tuple[str, ...]  # tools its episodes can offer

    def tasks(self, split: str) -> list[Task]: ...

    def grade(self, task: Task, answer: str | None, final_state: dict[str, Any]) -> Score:
        """The episode's score. Raising, or returning anything but a `Score` whose value is a finite number, is
        a grader error (the episode scores 0, counted apart from wrong answers); `Score.grader_error(message)`
        reports one explicitly."""
        ...


class NoToolEpisode:
    """Single-turn episode: the only action is the final answer."""

    tools: tuple[ToolSpec, ...] = ()

    def step(self, action: Action) -> str:
        return f"Unknown tool {action.tool!r}: this task takes only a final answer."

    def final_state(self) -> dict[str, Any]:
        return {}

    def close(self) -> None:
        return None


def check_split(split: str, extra: tuple[str, ...] = ()) -> None:
    if split not in SPLITS + extra:
        raise ValueError(f"unknown split {split!r}; use one of {', '.join(SPLITS + extra)}")


def stable_id(prefix: str, *parts: str) -> str:
    h = hashlib.sha256("\x1f".join(parts).encode()).hexdigest()[:12]
    return f"{prefix}-{h}"


def split_of(task_id: str, seed: int, val_fraction: float) -> str:
    """Deterministic train/val assignment from the id and a seed."""
    h = int(hashlib.sha256(f"{seed}:{task_id}".encode()).hexdigest()[:8], 16)
    return "val" if (h % 10_000) / 10_000 < val_fraction else "train"


def seeded_order(tasks: list[Task], seed: int) -> list[Task]:
    """A fixed pseudo-random order so `--limit N` picks the same N tasks every time, stratified by a task's
    kind (`meta["type"]`) when the environment gives one: kinds take turns, so N tasks hold every kind about
    equally often."""
    def key(t: Task) -> str:
        return hashlib.sha256(f"{seed}:{t.id}".encode()).hexdigest()

    groups: dict[str, list[Task]] = {}
    for t in sorted(tasks, key=key):
        groups.setdefault(str(t.meta.get("type", "")), []).append(t)
    if len(groups) <= 1:
        return sorted(tasks, key=key)
    out: list[Task] = []
    for rank in range(max(len(g) for g in groups.values())):
        out.extend(g[rank] for g in groups.values() if rank < len(g))
    return out


TASK_LINE = '{"id": "q1", "prompt": "...", "answer": "..."}'


def read_jsonl(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield (line number, object) of a UTF-8 JSON-lines file (blank lines skipped). A line that is not UTF-8, not
    JSON or not an object, a file that cannot be read, and a file with no object at all raise TaskFileError
    naming the file (and the line)."""
    try:
        handle = path.open("rb")
    except OSError as exc:
        raise TaskFileError(f"task file {path} cannot be read ({exc.strerror}); pass a JSON-lines file") from None
    found = False
    with handle:
        for lineno, raw in enumerate(handle, 1):
            try:
                line = raw.decode("utf-8-sig" if lineno == 1 else "utf-8")
            except UnicodeDecodeError as exc:
                raise TaskFileError(f"{path}:{lineno}: not UTF-8 text (byte {exc.start + 1} of the line); a task file "
                                    f"is UTF-8 JSON lines, one task per line: {TASK_LINE}") from None
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise TaskFileError(f"{path}:{lineno}: not valid JSON ({exc.msg} at column {exc.colno})") from exc
            if not isinstance(obj, dict):
                raise TaskFileError(f"{path}:{lineno}: expected a JSON object, got {type(obj).__name__}")
            found = True
            yield lineno, obj
    if not found:
        raise TaskFileError(f"{path}: no tasks: the file is empty; write one JSON object per line: {TASK_LINE}")


KIND_NAMES = {str: "a string", int: "an integer", float: "a number", list: "a list", dict: "a JSON object"}


def require(obj: dict[str, Any], key: str, kind: type, path: Path, lineno: int) -> Any:
    """`obj[key]`, which must be present and of `kind`; a string must not be blank (TaskFileError otherwise)."""
    if key not in obj:
        raise TaskFileError(f"{path}:{lineno}: missing field {key!r}")
    value = obj[key]
    if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
        example = f'; write it as "{key}": {json.dumps(str(value))}' if kind is str and value is not None else ""
        raise TaskFileError(f"{path}:{lineno}: field {key!r} should be {KIND_NAMES.get(kind, kind.__name__)}, "
                            f"got {type(value).__name__} {json.dumps(value)[:40]}{example}")
    if isinstance(value, str) and not value.strip():
        raise TaskFileError(f"{path}:{lineno}: field {key!r} is empty; every task needs one")
    return value


def unique_id(seen: dict[str, int], task_id: str, path: Path, lineno: int, why: str = "") -> None:
    """Record `task_id` (first seen on a line of `path`); a second task with it raises TaskFileError."""
    if task_id in seen:
        raise TaskFileError(f"{path}:{lineno}: duplicate id {task_id!r} (also on line {seen[task_id]}){why}; "
                            "every task needs its own id")
    seen[task_id] = lineno


def data_file(data_dir: Path | None, env: str, filename: str, url: str | None) -> Path:
    """Locate `env/filename` in --data-dir or $ECDYSIS_DATA_DIR; else download it once into the cache."""
    if data_dir is not None and not Path(data_dir).is_dir():
        raise DataNotFoundError(f"data dir {data_dir} {'is a file' if Path(data_dir).exists() else 'does not exist'}; "
                                "pass the folder holding gsm8k/ and dbbench/ as --data-dir (env.data_dir), or leave "
                                "it out to use $ECDYSIS_DATA_DIR or the download cache")
    candidates: list[Path] = []
    for base in (data_dir, os.environ.get("ECDYSIS_DATA_DIR")):
        if base:
            candidates.append(Path(base) / env / filename)
    for path in candidates:
        if path.exists():
            return path
    cached = Path.home() / ".cache" / "ecdysis" / "data" / env / filename
    if cached.exists():
        return cached
    if url:
        try:
            cached.parent.mkdir(parents=True, exist_ok=True)
            tmp = cached.with_suffix(".part")
            with urllib.request.urlopen(url, timeout=15) as resp, tmp.open("wb") as f:
                f.write(resp.read())
            tmp.replace(cached)
            return cached
        except OSError as exc:
            download_error = f"; downloading {url} failed ({exc})"
    else:
        download_error = ""
    looked = ", ".join(str(p) for p in candidates) or "(no --data-dir or ECDYSIS_DATA_DIR given)"
    raise DataNotFoundError(
        f"{env}/{filename} not found in {looked}{download_error}. "
        "Pass --data-dir DIR (a folder holding gsm8k/ and dbbench/) or set ECDYSIS_DATA_DIR."
    )
