"""Designed suite: is a failing numeric answer right up to its format, or a wrong number? (issue 38, docs/claim.md)

    .venv/bin/python benchmarks/designed/format_or_arithmetic.py runs/designed-compare/seed0 runs/designed-compare/seed1

Reads the seeds' run directories (read only). Part 1, per task kind: every distinct (seed, task, trial) episode
of the seed harness (the seed evaluation's train and val, `fixed`'s test), split into passed, no answer, right
number in the wrong format (the built-in `plain_number` repair makes it pass) and wrong answer. Part 2: what
`plain_number` would change on every test evaluation of every arm (tasks gained and lost), post hoc.
"""

from __future__ import annotations

import json
import sqlite3
import sys
from collections import Counter, defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from grader import grade  # noqa: E402

from ecdysis.agent.trajectory import Trajectory  # noqa: E402
from ecdysis.harness.api import ActionContext, answer  # noqa: E402
from ecdysis.harness.repairs import plain_number  # noqa: E402

SUITE = HERE.parents[1] / "runs" / "designed.jsonl"
KINDS = HERE.parents[1] / "runs" / "designed.kinds.json"


def with_plain_number(final: str | None, task: dict) -> tuple[bool, bool]:
    """(the repair changes the answer, the changed or unchanged answer passes the grader)."""
    if final is None:
        return False, False
    fixed = plain_number(answer(final), ActionContext((), 0, "", choices=tuple(task.get("choices") or ())))
    return fixed is not None, grade(fixed.input if fixed else final, task["answer"])


def main(run_dirs: list[Path]) -> None:
    tasks = {t["id"]: t for t in map(json.loads, SUITE.read_text().splitlines())}
    kinds = json.loads(KINDS.read_text())
    seed_harness: dict[str, Counter] = defaultdict(Counter)
    seen: set[tuple[str, str, int]] = set()
    print("## What plain_number would change on each test evaluation (post hoc)\n")
    for run_dir in run_dirs:
        con = sqlite3.connect(f"file:{run_dir / 'ecdysis.sqlite'}?mode=ro", uri=True)  # read only; missing: error
        first = con.execute("SELECT harness_id FROM evaluations ORDER BY rowid LIMIT 1").fetchone()[0]
        for eval_id, run_id, harness, split in con.execute(
                "SELECT id, run_id, harness_id, split FROM evaluations ORDER BY rowid").fetchall():
            trajectories = [Trajectory.from_dict(json.loads(data)) for (data,) in con.execute(
                "SELECT data FROM trajectories WHERE eval_id=? ORDER BY task_id, trial", (eval_id,))]
            if harness == first:  # the seed harness: count its episodes by kind once
                for t in trajectories:
                    if (key := (run_dir.name, t.task_id, t.trial)) in seen or t.task_id not in kinds:
                        continue
                    seen.add(key)
                    changed, passes = with_plain_number(t.final_answer, tasks[t.task_id])
                    counts = seed_harness[kinds[t.task_id]]
                    counts["episodes"] += 1
                    counts["passed" if t.passed else "no answer" if t.final_answer is None
                           else "right number, wrong format" if changed and passes else "wrong answer"] += 1
            if split == "test":
                outcome = [(t.passed, passes if changed else t.passed) for t in trajectories
                           for changed, passes in [with_plain_number(t.final_answer, tasks[t.task_id])]]
                gained = sum(now and not was for was, now in outcome)
                lost = sum(was and not now for was, now in outcome)
                print(f"- {run_dir.name} {run_id} harness {harness[:8]}: test "
                      f"{sum(w for w, _ in outcome)}/{len(outcome)}, with plain_number +{gained} -{lost}")
        con.close()
    print("\n## The seed harness's episodes by kind\n")
    print("| kind | episodes | passed | no answer | right up to format (plain_number) | wrong answer |")
    print("|---|---:|---:|---:|---:|---:|")
    for kind, c in sorted(seed_harness.items()):
        print(f"| {kind} | {c['episodes']} | {c['passed']} | {c['no answer']} | {c['right number, wrong format']} "
              f"| {c['wrong answer']} |")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main([Path(p) for p in sys.argv[1:]])
