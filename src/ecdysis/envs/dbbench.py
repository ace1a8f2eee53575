"""AgentBench DBBench on SQLite.

Each episode builds the task's table in a fresh database inside the sandbox; the agent runs SQL
(observations are truncated result rows) and then answers. Query tasks are graded by comparing
the answer with the label after normalisation; INSERT/UPDATE tasks by comparing the final table
with the table the gold statement(s) produce (computed in the host).
Splits: `train`/`val` partition dev.jsonl; `test` is standard.jsonl.
"""

from __future__ import annotations

import ast
import json
import sqlite3
import tempfile
from collections import Counter
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
)

URL = "https://raw.githubusercontent.com/THUDM/AgentBench/main/data/dbbench/{}.jsonl"
SQL_TOOL = ToolSpec("sql", "Execute one SQLite statement on the task's database and see the result rows.")
MAX_ROWS, MAX_CHARS = 20, 1500
MUTATING = ("INSERT", "UPDATE")


def quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def build_database(path: str, public: dict[str, Any]) -> sqlite3.Connection:
    conn = sqlite3.connect(path)
    cols = public["columns"]
    col_sql = ", ".join(f"{quote(c['name'])} {c.get('type') or 'TEXT'}" for c in cols)
    conn.execute(f"CREATE TABLE {quote(public['table_name'])} ({col_sql})")
    marks = ", ".join("?" for _ in cols)
    conn.executemany(f"INSERT INTO {quote(public['table_name'])} VALUES ({marks})", public["rows"])
    conn.commit()
    return conn


def table_rows(conn: sqlite3.Connection, table: str) -> list[list[str]]:
    rows = conn.execute(f"SELECT * FROM {quote(table)}").fetchall()
    return sorted([normalise(v) for v in row] for row in rows)


def format_rows(cursor: sqlite3.Cursor) -> str:
    if cursor.description is None:
        return f"OK ({cursor.rowcount} row(s) affected)"
    rows = cursor.fetchmany(MAX_ROWS + 1)
    more = len(rows) > MAX_ROWS
    text = repr([tuple(r) for r in rows[:MAX_ROWS]])
    if more:
        text += f"\n(only the first {MAX_ROWS} rows shown)"
    return text if len(text) <= MAX_CHARS else text[:MAX_CHARS] + " …(truncated)"


class SQLEpisode:
    tools = (SQL_TOOL,)

    def __init__(self, public: dict[str, Any]) -> None:
        self._dir = tempfile.TemporaryDirectory(prefix="dbbench-")
        self.table = public["table_name"]
        self.conn = build_database(str(Path(self._dir.name) / "task.sqlite"), public)

    def step(self, action: Action) -> str:
        if action.tool != "sql":
            return f"Unknown tool {action.tool!r}; available: sql."
        try:
            cursor = self.conn.execute(action.input)
            text = format_rows(cursor)
            self.conn.commit()
            return text
        except (sqlite3.Error, sqlite3.Warning) as exc:
            return f"Error: {exc}"

    def final_state(self) -> dict[str, Any]:
        try:
            return {"rows": table_rows(self.conn, self.table)}
        except sqlite3.Error as exc:
            return {"error": str(exc)}

    def close(self) -> None:
        self.conn.close()
        self._dir.cleanup()


def normalise(value: Any) -> str:
    """Canonical text for comparing cells/answers: numbers as floats, strings trimmed and lowercased."""
    if value is None:
        return "none"
    text = str(value).strip().strip("'\"").strip()
    try:
        number = float(text.replace(",", ""))
        return f"{round(number, 4):g}"
    except ValueError:
        return text.lower()


def parse_answer_list(answer: str) -> list[str]:
    text = answer.strip()
    for parse in (json.loads, ast.literal_eval):
        try:
            value = parse(text)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            continue
        if isinstance(value, (list, tuple)):
            flat: list[Any] = []
            for item in value:
                flat.extend(item if isinstance(item, (list, tuple)) else [item])
            return [normalise(v) for v in flat]
        return [normalise(value)]
    return [normalise(part) for part in text.split(",")] if "," in text else [normalise(text)]


@dataclass
class DBBench:
    data_dir: Path | None = None
    seed: int = 0
    val_fraction: float = 0.2
    tool_names: tuple[str, ...] = ("sql",)
    name: str = "dbbench"

    def _load(self, filename: str) -> list[Task]:
        path = data_file(self.data_dir, "dbbench", filename, URL.format(filename.split(".")[0]))
        tasks: list[Task] = []
        for lineno, obj in read_jsonl(path):
            description = require(obj, "description", str, path, lineno)
            label = require(obj, "label", list, path, lineno)
            table = require(obj, "table", dict, path, lineno)
            info = table.get("table_info") or {}
            if not isinstance(info.get("columns"), list) or not isinstance(info.get("rows"), list):
                raise TaskFileError(f"{path}:{lineno}: table.table_info needs 'columns' and 'rows' lists")
            kind = (obj.get("type") or ["other"])[0]
            public = {"table_name": table["table_name"], "columns": info["columns"], "rows": info["rows"]}
            prompt = f"{description}\n{obj.get('add_description', '')}".strip()
            task_id = stable_id("dbbench", description, table["table_name"])
            split = "test" if filename.startswith("standard") else split_of(task_id, self.seed, self.val_fraction)
            tasks.append(Task(id=task_id, split=split, prompt=prompt, gold=label, public=public,
                              meta={"type": kind, "source": obj.get("source", "")}))
        return tasks

    def tasks(self, split: str) -> list[Task]:
        """train/val partition dev.jsonl, `dev` is all of it, `test` is standard.jsonl."""
        if split == "test":
            return self._load("standard.jsonl")
        if split == "dev":
            return self._load("dev.jsonl")
        check_split(split)
        return [t for t in self._load("dev.jsonl") if t.split == split]

    def expected_rows(self, task: Task) -> list[list[str]]:
        """The table after applying the gold statement(s) to a fresh copy."""
        with tempfile.TemporaryDirectory() as tmp:
            conn = build_database(str(Path(tmp) / "gold.sqlite"), task.public)
            try:
                for statement in task.gold:
                    conn.execute(statement)
                return table_rows(conn, task.public["table_name"])
            finally:
                conn.close()

    def grade(self, task: Task, answer: str | None, final_state: dict[str, Any]) -> Score:
        kind = task.meta.get("type")
        if kind in MUTATING:
            try:
                expected = self.expected_rows(task)
            except sqlite3.Error as exc:
                return Score(0.0, False, f"gold statement does not run on SQLite: {exc}",
                             {"gold_error": str(exc)})
            got = final_state.get("rows")
            ok = got == expected
            detail = "final table matches" if ok else "final table differs from the expected table"
            return Score(float(ok), ok, detail, {"kind": kind, "rows_expected": len(expected),
                                                 "rows_got": None if got is None else len(got)})
        if answer is None:
            return Score(0.0, False, "no answer", {"kind": kind})
        got_items = parse_answer_list(answer)
        want = [normalise(v) for v in task.gold]
        ok = Counter(got_items) == Counter(want)
        return Score(float(ok), ok, f"answer {got_items} vs expected {want}", {"kind": kind})


def make_episode(public: dict[str, Any], options: dict[str, Any]) -> SQLEpisode:
    return SQLEpisode(public)
