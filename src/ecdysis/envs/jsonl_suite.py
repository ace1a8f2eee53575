"""Bring-your-own single-turn tasks: a JSONL file plus a grader function referenced from config.

Each line: {"id": "...", "prompt": "...", "answer": <anything JSON>, "split": "train|val|test"?}.
The grader is `module:function` with signature (answer: str | None, gold) -> float | bool, and
runs in the host. Lines without a split are partitioned train/val/test by a seeded hash.
"""

from __future__ import annotations

import hashlib
import importlib
from collections.abc import Callable
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
)

Grader = Callable[[str | None, Any], float | bool]


def load_grader(ref: str) -> Grader:
    module_name, sep, attr = ref.partition(":")
    if not sep:
        raise ValueError(f"grader {ref!r} should look like 'package.module:function'")
    try:
        fn = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"cannot load grader {ref!r}: {exc}") from exc
    if not callable(fn):
        raise ValueError(f"grader {ref!r} is not callable")
    return fn


def exact_match(answer: str | None, gold: Any) -> bool:
    return answer is not None and answer.strip().lower() == str(gold).strip().lower()


@dataclass
class JsonlSuite:
    path: Path
    grader: str = "ecdysis.envs.jsonl_suite:exact_match"
    seed: int = 0
    fractions: tuple[float, float] = (0.6, 0.2)  # train, val; the rest is test
    tool_names: tuple[str, ...] = ()
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
        seen: set[str] = set()
        for lineno, obj in read_jsonl(path):
            task_id = str(require(obj, "id", (str, int), path, lineno))  # type: ignore[arg-type]
            prompt = require(obj, "prompt", str, path, lineno)
            if "answer" not in obj:
                raise TaskFileError(f"{path}:{lineno}: missing field 'answer'")
            if task_id in seen:
                raise TaskFileError(f"{path}:{lineno}: duplicate id {task_id!r}")
            seen.add(task_id)
            split = obj.get("split") or self._split(task_id)
            if split not in SPLITS:
                raise TaskFileError(f"{path}:{lineno}: split {split!r} is not one of {SPLITS}")
            tasks.append(Task(id=task_id, split=split, prompt=prompt, gold=obj["answer"]))
        return tasks

    def tasks(self, split: str) -> list[Task]:
        check_split(split)
        return [t for t in self.all_tasks() if t.split == split]

    def grade(self, task: Task, answer: str | None, final_state: dict[str, Any]) -> Score:
        if self._grader_fn is None:
            self._grader_fn = load_grader(self.grader)
        value = float(self._grader_fn(answer, task.gold))
        return Score(value, value >= 1.0, f"grader {self.grader} gave {value:g}")


def from_options(data_dir: Path | None = None, seed: int = 0, path: str | None = None,
                 grader: str = JsonlSuite.grader, **_: Any) -> JsonlSuite:
    """Factory for `env.name = "jsonl"`: needs `env.options.path` (or `--tasks FILE`)."""
    if not path:
        raise ValueError("the jsonl environment needs a task file: --tasks FILE (or env.options.path)")
    return JsonlSuite(path=Path(path), grader=grader, seed=seed)


def make_episode(public: dict[str, Any], options: dict[str, Any]) -> NoToolEpisode:
    return NoToolEpisode()
