"""Bring-your-own single-turn tasks: a JSONL file plus a grader (see `graders.py`).

Each line: {"id": "...", "prompt": "...", "answer": <anything JSON>, "split": "train|val|test"?,
"choices": [...]?, "kind": "..."?, "public": {...}?}. `public` is data the task gives the agent besides its
prompt (e.g. the state an agent program's tools start from; never the answer). A finite answer set (`choices`
on a line, or `env.options.labels` for every task) is declared to the harness as `public["choices"]` (the
`answer_set` repair maps or rejects answers outside it); `kind` goes to `task.meta["type"]`.
The grader runs in the host; one that raises or returns a non-number scores that task 0 as a grader error
(`Score.grader_error`), which `eval` reports apart from wrong answers. A grader with a
third parameter, `grade(answer, gold, state)`, also gets the episode's final state (e.g. what an agent program's
tools changed, as it reported it: docs/agents.md).
Lines without a split are partitioned train/val/test by a seeded hash.
"""

from __future__ import annotations

import hashlib
import inspect
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .base import (
    SPLITS,
    NoToolEpisode,
    Score,
    Task,
    TaskFileError,
    check_split,
    read_jsonl,
    require,
    unique_id,
)
from .graders import Grader, grade_value, load_grader


@dataclass
class JsonlSuite:
    path: Path
    grader: str = "normalized"
    seed: int = 0
    search: list[Path] = field(default_factory=list)  # where user graders are imported from
    tolerance: float | None = None  # the numeric grader's relative tolerance
    fractions: tuple[float, float] = (0.6, 0.2)  # train, val; the rest is test
    tool_names: tuple[str, ...] = ()
    labels: tuple[str, ...] = ()  # the answer set of every task (a classification suite's labels)
    name: str = "jsonl"
    _grader_fn: Grader | None = field(default=None, repr=False)

    def _split(self, task_id: str) -> str:
        h = int(hashlib.sha256(f"{self.seed}:{task_id}".encode()).hexdigest()[:8], 16) % 10_000 / 10_000
        train, val = self.fractions
        return "train" if h < train else "val" if h < train + val else "test"

    def all_tasks(self) -> list[Task]:
        path = Path(self.path)
        if not path.exists():
            raise FileNotFoundError(f"task file {path} does not exist")
        tasks: list[Task] = []
        seen: dict[str, int] = {}
        for lineno, obj in read_jsonl(path):
            task_id = require(obj, "id", str, path, lineno)
            prompt = require(obj, "prompt", str, path, lineno)
            if "answer" not in obj:
                raise TaskFileError(f"{path}:{lineno}: missing field 'answer'")
            if obj["answer"] in (None, "", [], {}) or isinstance(obj["answer"], str) and not obj["answer"].strip():
                raise TaskFileError(f"{path}:{lineno}: field 'answer' is empty; every task needs the answer its grader "
                                    "compares the reply with")
            unique_id(seen, task_id, path, lineno)
            split = obj.get("split") or self._split(task_id)
            if split not in SPLITS:
                raise TaskFileError(f"{path}:{lineno}: split {split!r} is not one of {SPLITS}")
            choices = obj.get("choices") or list(self.labels)
            if not isinstance(choices, list):
                raise TaskFileError(f"{path}:{lineno}: field 'choices' should be a list")
            public = obj.get("public") or {}
            if not isinstance(public, dict):
                raise TaskFileError(f"{path}:{lineno}: field 'public' should be an object")
            if choices:
                public = {**public, "choices": [str(c) for c in choices]}
            tasks.append(Task(id=task_id, split=split, prompt=prompt, gold=obj["answer"], public=public,
                              meta={"type": str(obj["kind"])} if obj.get("kind") else {}))
        return tasks

    def tasks(self, split: str) -> list[Task]:
        check_split(split)
        return [t for t in self.all_tasks() if t.split == split]

    def grade(self, task: Task, answer: str | None, final_state: dict[str, Any]) -> Score:
        if self._grader_fn is None:
            self._grader_fn = load_grader(self.grader, self.search, self.tolerance)
        try:
            if takes_state(self._grader_fn):  # grade(answer, gold, state): e.g. what an agent program's tools did
                result = self._grader_fn(answer, task.gold, final_state)  # type: ignore[call-arg]
            else:
                result = self._grader_fn(answer, task.gold)
        except Exception as exc:  # noqa: BLE001 - one odd answer must not abort the batch
            return Score.grader_error(f"grader {self.grader} raised {type(exc).__name__}: {exc}")
        try:
            value = grade_value(result, self.grader)
        except TypeError as exc:
            return Score.grader_error(str(exc))
        return Score(value, value >= 1.0, f"grader {self.grader} gave {value:g}")


def takes_state(grader: Grader) -> bool:
    """True for a grader with a third required parameter (or one named `state`): it gets the episode's final
    state (an agent program's reported state, plus `conversation` and `termination`)."""
    try:
        params = inspect.signature(grader).parameters.values()
    except (TypeError, ValueError):
        return False
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len([p for p in positional if p.default is p.empty]) >= 3 or any(p.name == "state" for p in positional)


def from_options(data_dir: Path | None = None, seed: int = 0, path: str | None = None,
                 grader: str = JsonlSuite.grader, search: list[Path] | None = None,
                 tolerance: float | None = None, labels: list[str] | None = None, **unknown: Any) -> JsonlSuite:
    """Factory for `env.name = "jsonl"`: needs `env.options.path` (or `--tasks FILE`). The grader is
    loaded now, so a wrong reference fails before any episode runs."""
    if unknown:
        raise ValueError(f"the jsonl environment has no option(s) {sorted(unknown)}; "
                         "options: path, grader, tolerance, labels")
    if not path:
        raise ValueError("the jsonl environment needs a task file: --tasks FILE (or env.options.path)")
    if tolerance is not None and (isinstance(tolerance, bool) or not isinstance(tolerance, int | float)
                                  or tolerance < 0):
        raise ValueError(f"env.options.tolerance should be a number >= 0 (got {tolerance!r}), the numeric grader's "
                         "relative tolerance")
    if labels is not None and not isinstance(labels, list):
        raise ValueError(f"env.options.labels should be a list of the answers every task may have (got {labels!r})")
    suite = JsonlSuite(path=Path(path), grader=grader, seed=seed, search=list(search or []), tolerance=tolerance,
                       labels=tuple(str(x) for x in labels or ()))
    suite._grader_fn = load_grader(grader, suite.search, tolerance)
    return suite


def make_episode(public: dict[str, Any], options: dict[str, Any]) -> NoToolEpisode:
    return NoToolEpisode()
