"""GSM8K: grade-school math word problems, graded numerically.

Splits: `train`/`val` are a seeded partition of train.jsonl; `test` is test.jsonl. The episode
offers an optional `python` calculator tool; its code runs inside the sandbox worker.
"""

from __future__ import annotations

import contextlib
import io
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..harness.api import Action, ToolSpec
from .base import (
    Score,
    Task,
    TaskFileError,
    check_split,
    data_file,
    read_jsonl,
    require,
    split_of,
    stable_id,
    unique_id,
)

URL = "https://raw.githubusercontent.com/openai/grade-school-math/master/grade_school_math/data/{}.jsonl"
NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?|-?\.\d+")
CALCULATOR = ToolSpec("python", "Run a short Python snippet and see what it prints (e.g. print(3*7+2)).")
OUTPUT_LIMIT = 2000


def parse_number(text: str | None) -> float | None:
    """The last number in `text` ($, commas and trailing units ignored), or None."""
    if not text:
        return None
    found = NUMBER.findall(text.replace("$", ""))
    if not found:
        return None
    try:
        return float(found[-1].replace(",", ""))
    except ValueError:
        return None


def run_python(code: str) -> str:
    """Execute a calculator snippet and return what it printed (or the error)."""
    buffer = io.StringIO()
    try:
        with contextlib.redirect_stdout(buffer):
            exec(compile(code, "<calculator>", "exec"), {"__name__": "__calculator__"})
    except Exception as exc:  # the model's code failing is an observation, not a crash
        buffer.write(f"{type(exc).__name__}: {exc}")
    out = buffer.getvalue().strip() or "(nothing printed; use print())"
    return out[:OUTPUT_LIMIT]


class CalculatorEpisode:
    tools = (CALCULATOR,)

    def step(self, action: Action) -> str:
        if action.tool != "python":
            return f"Unknown tool {action.tool!r}; available: python."
        return run_python(action.input)

    def final_state(self) -> dict[str, Any]:
        return {}

    def close(self) -> None:
        return None


@dataclass
class GSM8K:
    data_dir: Path | None = None
    seed: int = 0
    val_fraction: float = 0.2
    tool_names: tuple[str, ...] = ("python",)
    name: str = "gsm8k"

    def _load(self, filename: str, split_for: str) -> list[Task]:
        path = data_file(self.data_dir, "gsm8k", filename, URL.format(filename.split(".")[0]))
        tasks: list[Task] = []
        seen: dict[str, int] = {}
        for lineno, obj in read_jsonl(path):
            question = require(obj, "question", str, path, lineno)
            solution = require(obj, "answer", str, path, lineno)
            if "####" not in solution:
                raise TaskFileError(f"{path}:{lineno}: field 'answer' has no '#### <number>' line")
            gold = parse_number(solution.split("####")[-1])
            if gold is None:
                raise TaskFileError(f"{path}:{lineno}: field 'answer' has no number after '####'")
            task_id = stable_id("gsm8k", question)
            unique_id(seen, task_id, path, lineno, " (the same question: ids come from the question's text)")
            split = split_of(task_id, self.seed, self.val_fraction) if split_for == "train" else "test"
            tasks.append(Task(id=task_id, split=split, prompt=question, gold=gold,
                              meta={"solution": solution}))
        return tasks

    def tasks(self, split: str) -> list[Task]:
        if split == "test":
            return self._load("test.jsonl", "test")
        check_split(split)
        return [t for t in self._load("train.jsonl", "train") if t.split == split]

    def grade(self, task: Task, answer: str | None, final_state: dict[str, Any]) -> Score:
        value = parse_number(answer)
        if value is None:
            return Score(0.0, False, "no numeric answer", {"answer_parsed": False})
        ok = task.gold is not None and abs(value - float(task.gold)) < 1e-6 * max(1.0, abs(task.gold))
        return Score(float(ok), ok, f"answer {value:g} vs expected {task.gold:g}",
                     {"answer_parsed": True, "answer_value": value})


def make_episode(public: dict[str, Any], options: dict[str, Any]) -> CalculatorEpisode:
    return CalculatorEpisode()
