"""Checks a candidate harness must pass before any agent run.

Static: it parses and compiles, keeps the layer interface, edits only relative harness paths, and
copies no training task ids, task text or distinctive gold answers. Dynamic (for changes to H2
parsing only): a replay of stored trajectories' model replies through the new code, in the sandbox
and without model calls, must not lose a passing task.
"""

from __future__ import annotations

import ast
import asyncio
import json
import re
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any

from ..agent.events import ActionEvent
from ..agent.trajectory import Trajectory
from ..envs.base import Environment, Task, gold_text
from ..harness.manifest import HarnessError, HarnessVersion, version_from_files
from ..sandbox.host import SandboxLimits, replay_in_sandbox
from .rerun import EpisodeRerun, RerunOutcome

INTERFACE = {"action": ("realize", 2), "regulate": ("regulate", 1), "loop": ("run", 1)}
SHINGLE = 8
# library-written from the training split: demos bootstrapped from passing training trajectories, and labelled
# training examples (checked instead to hold nothing but training tasks with their own gold answers)
EXEMPT_FROM_LEAK_CHECK = ("demos.json", "examples.json")


class CheckFailed(ValueError):
    pass


@dataclass
class ReplayReport:
    lost: list[str] = field(default_factory=list)  # passing tasks that would fail
    gained: list[str] = field(default_factory=list)  # failing tasks that would pass
    unchanged: int = 0
    unknown: int = 0
    changed: list[str] = field(default_factory=list)  # failing tool/multi-turn episodes that act differently
    changed_passing: list[str] = field(default_factory=list)  # passing ones that act differently, outcome unknown
    exact: int = 0  # changed tool/multi-turn episodes re-run to their end with stored replies (graded exactly)
    rescued: dict[str, int] = field(default_factory=dict)  # task -> rejected replies that now realize
    raw: list[list[dict[str, Any]]] = field(default_factory=list, repr=False)

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "raw"}


def check_static(old: HarnessVersion, files: dict[str, str], train_tasks: list[Task]) -> HarnessVersion:
    """Syntax, manifest, interface, paths and leaks. Returns the candidate version or raises CheckFailed."""
    for rel in files:
        path = PurePosixPath(rel)
        if path.is_absolute() or ".." in path.parts or any(p.startswith(".") for p in path.parts):
            raise CheckFailed(f"{rel}: edits must stay inside the harness directory")
    try:
        version = version_from_files(files, origin="candidate")
    except HarnessError as exc:
        raise CheckFailed(str(exc)) from exc
    for layer, (function, arity) in INTERFACE.items():
        rel = getattr(version.manifest.files, layer)
        if rel is None or rel not in version.files:
            continue
        tree = ast.parse(version.files[rel])
        defs = {n.name: len(n.args.args) for n in tree.body if isinstance(n, ast.FunctionDef)}
        if defs.get(function) != arity:
            raise CheckFailed(f"{rel}: must define {function}() with {arity} parameter(s) (the harness interface)")
    check_leaks(old, version, train_tasks)
    return version


def _distinctive(gold: Any) -> list[str]:
    values = gold if isinstance(gold, list) else [gold]
    out = []
    for v in values:
        text = t if (t := gold_text(v)) is not None else str(v)
        if (text.replace(".", "").isdigit() and len(text) >= 3) or (not text.isdigit() and len(text) >= 5):
            out.append(text)
    return out


def check_examples(new: HarnessVersion, train_tasks: list[Task]) -> None:
    """Retrieved labelled examples may hold training tasks with their gold answers, by design, and nothing
    else: an example whose prompt is not a training task's, or whose answer is not that task's gold, is
    refused (so no val or test text, and no test gold, can enter a harness this way)."""
    text = new.layer_text("examples")
    if not text:
        return
    gold = {t.prompt: gold_text(t.gold) for t in train_tasks if t.split == "train"}
    try:
        items = json.loads(text).get("examples", [])
    except (json.JSONDecodeError, AttributeError) as exc:
        raise CheckFailed(f"examples file is not a JSON object with 'examples': {exc}") from exc
    for i, item in enumerate(items):
        prompt = str(item.get("prompt", ""))
        if prompt not in gold:
            raise CheckFailed(f"examples[{i}] is not a training task (only the train split may feed examples)")
        if str(item.get("answer")) != gold[prompt]:
            raise CheckFailed(f"examples[{i}]'s answer is not its training task's gold answer")


def check_leaks(old: HarnessVersion, new: HarnessVersion, train_tasks: list[Task]) -> None:
    check_examples(new, train_tasks)
    added = "\n".join(
        text for rel, text in new.files.items()
        if old.files.get(rel) != text and rel not in EXEMPT_FROM_LEAK_CHECK
    )
    if not added:
        return
    previous = "\n".join(old.files.values())
    words = re.findall(r"\w+", added.lower())
    added_shingles = {" ".join(words[i:i + SHINGLE]) for i in range(len(words) - SHINGLE + 1)}
    for task in train_tasks:
        if task.id in added:
            raise CheckFailed(f"the edit copies the training task id {task.id}")
        prompt_words = re.findall(r"\w+", task.prompt.lower())
        for i in range(len(prompt_words) - SHINGLE + 1):
            if " ".join(prompt_words[i:i + SHINGLE]) in added_shingles:
                raise CheckFailed(f"the edit copies text of training task {task.id}")
        for value in _distinctive(task.gold):
            if re.search(rf"(?<![\w.]){re.escape(value)}(?!\.?\d|\w)", added) and value not in previous:
                raise CheckFailed(f"the edit contains {value!r}, the gold answer of training task {task.id}")


def _replay_items(trajectories: list[Trajectory], tasks: dict[str, Task]) -> list[dict[str, Any]]:
    return [{"prompt": tasks[t.task_id].prompt, "replies": t.reply_records(), "tools": t.offered_tools(),
             "observations": t.observations_before_replies(),
             "conversational": tasks[t.task_id].user_scenario is not None,
             "choices": list(tasks[t.task_id].public.get("choices") or [])} for t in trajectories]


def _invalid(realized: dict[str, Any]) -> int:
    return sum(1 for a in realized.get("actions", []) if a.get("invalid"))


def _better(old: dict[str, Any], new: dict[str, Any]) -> bool:
    """A replayed reply improved: a rejection now realizes, or fewer of its calls fail validation."""
    if "reject" in old:
        return "actions" in new
    return "actions" in new and _invalid(new) < _invalid(old)


def text_only(traj: Trajectory, task: Task) -> bool:
    """An episode whose only action is its answer (no tools offered, no user): regraded from its replies. Not an
    agent program's episode: its answer is what the program printed, which only a re-run can tell."""
    return not traj.offered_tools() and task.user_scenario is None and not traj.of_kind("agent")


def _regrade(traj: Trajectory, realized: list[dict[str, Any]], env: Environment, task: Task,
             budget: int) -> bool | None:
    """The grade of a text-only episode under the candidate's H2, or None when the candidate rejects every
    stored reply with rejections to spare: the agent would be asked again, with a reply nobody has seen."""
    rejections = 0
    for r in realized:
        if "actions" in r:
            return env.grade(task, r["actions"][0]["input"], {}).passed
        rejections += 1
        if rejections > budget:
            return False
    return None


async def replay_report(candidate: HarnessVersion, trajectories: list[Trajectory], env: Environment,
                        tasks: dict[str, Task], limits: SandboxLimits,
                        baseline: list[list[dict[str, Any]]] | None = None,
                        rerun: EpisodeRerun | None = None) -> ReplayReport:
    """Re-realize every stored reply with the candidate's H2 (sandboxed, no model calls) and say which
    tasks it would gain or lose.

    An episode none of whose replies realizes differently is unchanged. A changed text-only episode (no
    tools, no user) is regraded from its answer (or changed, when every stored reply is now rejected with
    rejections to spare). A changed tool or conversation episode is re-run with its
    stored replies when `rerun` is given (exact when it ends without asking anything new; see `rerun.py`),
    else — or when it diverges — it is reported as changed (`changed` if it failed, `changed_passing` if it
    passed), never guessed. With `baseline` (the current harness's replay), `rescued` counts replies per
    task that were rejected and now realize an action. Whether an episode is text-only is read from the episode
    itself. Raises CheckFailed if the candidate's code fails."""
    result = await replay_in_sandbox(candidate.files, _replay_items(trajectories, tasks), limits)
    if "error" in result:
        raise CheckFailed(f"replay failed: {result['error'].strip().splitlines()[-1]}")
    report = ReplayReport()
    budget = candidate.manifest.budget.max_rejections
    to_rerun: list[Trajectory] = []
    for index, (traj, realized) in enumerate(zip(trajectories, result["results"], strict=True)):
        if baseline is not None:
            rescued = sum(1 for old, new in zip(baseline[index], realized, strict=False) if _better(old, new))
            if rescued:
                report.rescued[traj.task_id] = report.rescued.get(traj.task_id, 0) + rescued
        original = [(e.tool, e.input, e.arguments) for e in traj.of(ActionEvent)]
        new_actions = [(a["tool"], a["input"], a.get("arguments")) for r in realized for a in r.get("actions", [])]
        if new_actions == original and (not original or all("actions" in r for r in realized)):
            report.unchanged += 1
            continue
        task = tasks[traj.task_id]
        if text_only(traj, task):
            passed = _regrade(traj, realized, env, task, budget)
            if passed is None:
                report.unknown += 1
                (report.changed_passing if traj.passed else report.changed).append(traj.task_id)
            elif traj.passed and not passed:
                report.lost.append(traj.task_id)
            elif passed and not traj.passed:
                report.gained.append(traj.task_id)
            else:
                report.unchanged += 1
        else:
            to_rerun.append(traj)
    gate = asyncio.Semaphore(2)

    async def one(traj: Trajectory) -> tuple[Trajectory, RerunOutcome | None]:
        if rerun is None:
            return traj, None
        async with gate:
            return traj, await rerun(candidate, tasks[traj.task_id], traj)

    for traj, outcome in await asyncio.gather(*(one(t) for t in to_rerun)):
        if outcome is None or not outcome.exact:
            report.unknown += 1
            (report.changed_passing if traj.passed else report.changed).append(traj.task_id)
            continue
        report.exact += 1
        if traj.passed and not outcome.passed:
            report.lost.append(traj.task_id)
        elif outcome.passed and not traj.passed:
            report.gained.append(traj.task_id)
        else:
            report.unchanged += 1
    report.raw = result["results"]
    return report


async def check_replay(candidate: HarnessVersion, trajectories: list[Trajectory], env: Environment,
                       tasks: dict[str, Task], limits: SandboxLimits,
                       rerun: EpisodeRerun | None = None) -> ReplayReport:
    """Re-realize every stored reply with the candidate's H2; fail if a passing task would be lost, or would
    act differently with an outcome replay cannot know."""
    report = await replay_report(candidate, trajectories, env, tasks, limits, rerun=rerun)
    if report.lost:
        raise CheckFailed(f"replay: the change would lose {len(report.lost)} passing task(s) "
                          f"(e.g. {report.lost[0]}); gained {len(report.gained)}")
    if report.changed_passing:
        raise CheckFailed(f"replay: {len(report.changed_passing)} passing episode(s) would act differently "
                          f"(e.g. {report.changed_passing[0]}) with an outcome replay cannot know")
    return report
