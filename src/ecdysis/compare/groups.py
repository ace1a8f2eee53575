"""Test accuracy by task group: what each arm's final harness fixed, per kind of task.

A group file maps task ids to a group name (a failure kind, a category, a difficulty): a JSON object
`{"task-id": "group", ...}`, or a CSV/TSV with two columns `task_id,group` (a header row is allowed). Tasks the
file does not name are counted under `(ungrouped)`. The table pools every (seed, test task) an arm scored; the
difference table is the paired difference against a reference arm (by default `fixed`, the seed harness: what
each arm changed per group), with the two-stage bootstrap of `compare.stats.paired_estimate`.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from pathlib import Path

from rich.table import Table

from .results import ArmResult
from .stats import Estimate, paired_estimate

UNGROUPED = "(ungrouped)"


def read_groups(path: Path) -> dict[str, str]:
    """The task id -> group map of a JSON object or a two-column CSV/TSV; ValueError naming the file and line."""
    try:
        text = path.read_text(encoding="utf-8-sig")
    except OSError as exc:
        raise ValueError(f"cannot read the group file {path}: {exc.strerror or exc}") from exc
    if path.suffix.lower() == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}: not JSON ({exc.msg} at line {exc.lineno}); expected "
                             '{"task-id": "group", ...}') from exc
        if not isinstance(data, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in data.items()):
            raise ValueError(f'{path}: expected a JSON object of task id -> group name, {{"task-id": "group"}}')
        return data
    out: dict[str, str] = {}
    dialect = "excel-tab" if path.suffix.lower() in (".tsv", ".tab") else "excel"
    for line, row in enumerate(csv.reader(text.splitlines(), dialect=dialect), 1):
        if not row or not "".join(row).strip():
            continue
        if len(row) != 2:
            raise ValueError(f"{path}, line {line}: expected two columns (task_id, group), got {len(row)}")
        task, group = (c.strip() for c in row)
        if line == 1 and task.lower() in ("task_id", "task", "id"):
            continue
        if out.get(task, group) != group:
            raise ValueError(f"{path}, line {line}: task {task!r} is already in group {out[task]!r}")
        out[task] = group
    if not out:
        raise ValueError(f"{path}: no task id -> group rows")
    return out


@dataclass(frozen=True)
class GroupCell:
    """One arm on one group: accuracy over its (seed, task) pairs, and the paired difference to the reference."""

    accuracy: float
    n: int
    difference: Estimate | None


def _by_seed(runs: list[ArmResult], groups: dict[str, str], group: str) -> dict[int, dict[str, float]]:
    return {r.seed: {t: s for t, s in r.test_per_task.items() if groups.get(t, UNGROUPED) == group} for r in runs}


@dataclass(frozen=True)
class GroupReport:
    """Every arm's cells over the groups (in order), and the reference arm the differences are against (None:
    accuracies only)."""

    groups: list[str]
    cells: dict[str, dict[str, GroupCell]]
    reference: str | None

    def table(self) -> Table:
        """Test accuracy per arm and group over the arm's own (seed, task) pairs (n); with the reference, the
        paired difference over the pairs both arms scored (its n named when fewer: seeds the reference lacks)."""
        title = "Test accuracy by task group, n = (seed, task) pairs" + (
            f"; paired difference vs {self.reference}, 95% CI" if self.reference else "")
        table = Table(title=title)
        table.add_column("arm")
        for g in self.groups:
            table.add_column(g, justify="right")
        for arm, row in self.cells.items():
            out = []
            for g in self.groups:
                cell = row.get(g)
                if cell is None:
                    out.append("–")
                    continue
                text = f"{cell.accuracy:.3f} (n={cell.n})"
                if (d := cell.difference) is not None:
                    text += f"\n{d.text(signed=True)}" + (f" (n={d.n})" if d.n != cell.n else "")
                out.append(text)
            table.add_row(arm, *out)
        return table

    def to_dict(self) -> dict[str, object]:
        """The table as data (written as groups.json beside the pooled results)."""
        def cell(c: GroupCell) -> dict[str, object]:
            d = c.difference
            return {"accuracy": c.accuracy, "n": c.n, "difference": None if d is None else
                    {"value": d.value, "low": d.low, "high": d.high, "n": d.n}}
        return {"reference": self.reference, "groups": self.groups,
                "arms": {arm: {g: cell(c) for g, c in row.items()} for arm, row in self.cells.items()}}


def group_report(results: list[ArmResult], groups: dict[str, str], reference: str | None = None,
                 reps: int = 2000) -> GroupReport:
    """The arms that scored test tasks, per group. `reference`: the arm differences are taken against (None:
    `fixed` when it ran, else none). ValueError when no test task is in the group file, or the named reference
    arm has no test scores."""
    arms: dict[str, list[ArmResult]] = {}
    for r in results:
        if r.test_per_task:
            arms.setdefault(r.arm, []).append(r)
    tasks = {t for runs in arms.values() for r in runs for t in r.test_per_task}
    if not tasks:
        raise ValueError("no arm recorded per-task test scores: nothing to group")
    if not tasks & set(groups):
        raise ValueError(f"none of the {len(tasks)} test tasks is in the group file (ids such as "
                         f"{sorted(tasks)[0]!r}; the file's such as {sorted(groups)[0]!r})")
    if reference is not None and reference not in arms:
        raise ValueError(f"--reference {reference!r} has no test scores here; arms: {', '.join(arms)}")
    ref_name = reference or ("fixed" if "fixed" in arms else None)
    seen = {groups.get(t, UNGROUPED) for t in tasks}
    names = sorted(seen - {UNGROUPED}) + ([UNGROUPED] if UNGROUPED in seen else [])
    ref = arms.get(ref_name) if ref_name else None
    cells: dict[str, dict[str, GroupCell]] = {}
    for arm, runs in arms.items():
        row = {}
        for g in names:
            scores = [s for by_task in _by_seed(runs, groups, g).values() for s in by_task.values()]
            if not scores:
                continue
            diff = None
            if ref is not None and arm != ref_name:
                diff = paired_estimate(_by_seed(runs, groups, g), _by_seed(ref, groups, g), reps=reps)
            row[g] = GroupCell(sum(scores) / len(scores), len(scores), diff)
        cells[arm] = row
    return GroupReport(names, cells, ref_name)
