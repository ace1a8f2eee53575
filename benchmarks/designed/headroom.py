"""Designed suite: how much of each seed's failures a harness could fix by reading the model's replies better
(issue 38, docs/claim.md "Where the designed suite's headroom was"). Reads the seeds' run directories, read only:

    .venv/bin/python benchmarks/designed/headroom.py runs/designed-compare/seed0 runs/designed-compare/seed1 ...

1. **Parse ceiling** per seed and split: the share of tasks on which the seed harness passed, or some built-in
   parse of its own last reply is right (a `\\boxed{}`, an `Answer:` line anywhere, "the answer is", the last
   number, the last line; each also through `plain_number` and, with declared labels, `answer_set`). An upper
   bound for reply-stage (H2) fixes; a prompt change (a rule, a demo) changes the replies and is not bounded by it.
2. **Per kind**, every distinct (seed, task, trial) episode of the seed harness: passed, no answer, right up to
   format (`plain_number` makes it pass), wrong answer.
3. What `plain_number` would change on every test evaluation of every arm, post hoc (tasks gained and lost).
"""

from __future__ import annotations

import json
import re
import sqlite3
import sys
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from grader import grade  # noqa: E402

from ecdysis.agent.events import ModelEvent  # noqa: E402
from ecdysis.agent.trajectory import Trajectory  # noqa: E402
from ecdysis.harness import repairs  # noqa: E402
from ecdysis.harness.api import ActionContext, answer  # noqa: E402

SUITE = HERE.parents[1] / "runs" / "designed.jsonl"
KINDS = HERE.parents[1] / "runs" / "designed.kinds.json"
ANSWER_LINE = re.compile(r"^\s*\**answer\**\s*:\s*(.+)$", re.IGNORECASE | re.MULTILINE)
PARSES = (repairs.boxed_answer, repairs.answer_phrase, repairs.last_number, repairs.last_line)


def with_plain_number(final: str | None, task: dict) -> tuple[bool, bool]:
    """(the repair changes the answer, the changed or unchanged answer passes the grader)."""
    if final is None:
        return False, False
    fixed = repairs.plain_number(answer(final), ActionContext((), 0, "", choices=tuple(task.get("choices") or ())))
    return fixed is not None, grade(fixed.input if fixed else final, task["answer"])


def readings(reply: str, task: dict) -> Iterator[str]:
    """Every answer a built-in parse finds in a reply, as read and through `plain_number` / `answer_set`."""
    choices = tuple(task.get("choices") or ())
    found = [a.input for parse in PARSES if (a := parse(reply, ())) is not None]
    found += [line.strip() for line in ANSWER_LINE.findall(reply)]
    for text in found:
        yield text
        for fixed in (repairs.plain_number(answer(text), ActionContext((), 0, "")),
                      repairs.answer_set(answer(text), choices) if choices else None):
            if fixed is not None and hasattr(fixed, "input"):  # a Reject (not an answer) reads nothing
                yield fixed.input


def last_reply(t: Trajectory) -> str:
    replies = [e.reply for e in t.of(ModelEvent)]
    reply = replies[-1] if replies else ""
    return reply if isinstance(reply, str) else reply.get("text", "")


def main(run_dirs: list[Path]) -> None:
    tasks = {t["id"]: t for t in map(json.loads, SUITE.read_text().splitlines())}
    kinds = json.loads(KINDS.read_text())
    by_kind: dict[str, Counter] = defaultdict(Counter)
    seen: set[tuple[str, str, int]] = set()
    ceiling: dict[tuple[str, str], dict[str, tuple[bool, bool]]] = defaultdict(dict)  # (seed, split) -> task
    post_hoc = []
    for run_dir in run_dirs:
        con = sqlite3.connect(f"file:{run_dir / 'ecdysis.sqlite'}?mode=ro", uri=True)  # read only; missing: error
        first = con.execute("SELECT harness_id FROM evaluations ORDER BY rowid LIMIT 1").fetchone()[0]
        for eval_id, run_id, harness, split in con.execute(
                "SELECT id, run_id, harness_id, split FROM evaluations ORDER BY rowid").fetchall():
            trajectories = [Trajectory.from_dict(json.loads(data)) for (data,) in con.execute(
                "SELECT data FROM trajectories WHERE eval_id=? ORDER BY task_id, trial", (eval_id,))]
            if harness == first:  # the seed harness: each task and episode once
                for t in trajectories:
                    task = tasks[t.task_id]
                    parsed = t.passed or any(grade(text, task["answer"]) for text in readings(last_reply(t), task))
                    ceiling[(run_dir.name, split)].setdefault(t.task_id, (t.passed, parsed))
                    if (key := (run_dir.name, t.task_id, t.trial)) in seen or t.task_id not in kinds:
                        continue
                    seen.add(key)
                    changed, passes = with_plain_number(t.final_answer, task)
                    counts = by_kind[kinds[t.task_id]]
                    counts["episodes"] += 1
                    counts["passed" if t.passed else "no answer" if t.final_answer is None
                           else "right up to format" if changed and passes else "wrong answer"] += 1
            if split == "test":
                outcome = [(t.passed, passes if changed else t.passed) for t in trajectories
                           for changed, passes in [with_plain_number(t.final_answer, tasks[t.task_id])]]
                post_hoc.append(f"- {run_dir.name} {run_id} harness {harness[:8]}: test "
                                f"{sum(w for w, _ in outcome)}/{len(outcome)}, with plain_number "
                                f"+{sum(n and not w for w, n in outcome)} -{sum(w and not n for w, n in outcome)}")
        con.close()
    print("## Parse ceiling: the seed harness's own replies, read by every built-in parse\n")
    print("| seed | split | tasks | seed harness passed | passed or some parse right (ceiling) |")
    print("|---|---|---:|---:|---:|")
    for (seed, split), per_task in sorted(ceiling.items()):
        n = len(per_task)
        print(f"| {seed} | {split} | {n} | {sum(p for p, _ in per_task.values()) / n:.3f} "
              f"| {sum(c for _, c in per_task.values()) / n:.3f} |")
    print("\n## The seed harness's episodes by kind\n")
    print("| kind | episodes | passed | no answer | right up to format (plain_number) | wrong answer |")
    print("|---|---:|---:|---:|---:|---:|")
    for kind, c in sorted(by_kind.items()):
        print(f"| {kind} | {c['episodes']} | {c['passed']} | {c['no answer']} | {c['right up to format']} "
              f"| {c['wrong answer']} |")
    print("\n## What plain_number would change on each test evaluation (post hoc)\n")
    print("\n".join(post_hoc))


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main([Path(p) for p in sys.argv[1:]])
