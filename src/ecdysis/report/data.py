"""What a report shows, read from the run store: one typed view per training run, no model calls.

The HTML report, `ecdysis show` and `ecdysis diff` read these views; they never write to the store.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from ..agent.trajectory import Trajectory
from ..harness.manifest import diff_versions
from ..runner.failures import FailureCounts, count_failures
from ..store.db import RunStore
from ..trainer import records
from ..trainer.charged import charged_by_outcome
from ..trainer.holdout import HoldoutCheck
from ..trainer.records import AcceptRule, CurvePoint, RoundRecord, SpecRecord


@dataclass
class EvalRow:
    """One evaluation of the run, in the order it was started, as far as it got."""

    id: str
    label: str
    split: str
    harness_id: str
    n_tasks: int
    trials: int
    episodes: int
    accuracy: float
    tokens: int
    wall_s: float
    terminations: dict[str, int]
    passed: frozenset[str]  # tasks with a passing episode
    scores: dict[str, float] = field(default_factory=dict)  # task -> mean score over its trials
    failures: FailureCounts = field(default_factory=FailureCounts)  # by kind, each with its first message

    def to_dict(self) -> dict[str, Any]:
        """The row as `show --json` prints it."""
        return {"id": self.id, "label": self.label, "harness_id": self.harness_id, "split": self.split,
                "done": self.episodes, "planned": self.n_tasks * self.trials, "accuracy": self.accuracy,
                "terminations": self.terminations, "tokens": self.tokens, "per_task": self.scores,
                "failures": self.failures.to_dict()}


@dataclass
class PatternView:
    """A failure pattern of one round and how many of its tasks passed in the next collect."""

    data: dict[str, Any]
    fixed_next: int | None  # None: no later train evaluation to tell

    @property
    def support(self) -> int:
        return int(self.data.get("support", len(self.data.get("tasks", []))))

    @property
    def recurring(self) -> bool:
        return self.data.get("classification") == "recurring"


@dataclass
class RoundView:
    record: RoundRecord
    patterns: list[PatternView]
    transcript: list[dict[str, Any]]
    spec: SpecRecord | None
    candidate: dict[str, Any] | None
    diff: str  # unified diff, current harness -> candidate ("" when no candidate was built)
    collect_eval: str | None  # the evaluation the round's failures were collected from
    elapsed_s: float  # cumulative training wall time at the end of this round


@dataclass
class VersionNode:
    id: str
    parent: str | None
    note: str
    status: str  # seed | accepted | rejected | final (accepted and last)


@dataclass
class RunView:
    run_id: str
    kind: str
    status: str
    config: dict[str, Any]
    summary: dict[str, Any]
    rounds: list[RoundView] = field(default_factory=list)
    evaluations: list[EvalRow] = field(default_factory=list)
    calls: list[dict[str, Any]] = field(default_factory=list)
    lineage: list[VersionNode] = field(default_factory=list)
    trajectories: dict[str, Trajectory] = field(default_factory=dict)  # anchor -> episode shown from evidence
    accept_rule: AcceptRule | None = None
    holdout: HoldoutCheck | None = None  # the final-selection check (trainer/holdout.py)
    step_outcomes: dict[str, tuple[float, int]] = field(default_factory=dict)  # trainer.charged.charged_by_outcome

    @property
    def arm(self) -> str:
        return str(self.summary.get("arm") or self.config.get("arm") or self.kind)

    def models(self) -> dict[str, str]:
        """Model references by use (agent, roles, user), as configured; a role left empty uses the agent's."""
        agent = str(self.config.get("agent", {}).get("model", "?"))
        roles = self.config.get("roles", {})
        refs = sorted({str(roles.get(r) or agent) for r in ("analyst", "critic", "engineer", "moderator",
                                                             "implementer")})
        out = {"agent": agent, "roles": ", ".join(r if len(r) < 60 else r[:57] + "..." for r in refs)}
        if user := (self.config.get("user") or {}).get("model"):
            out["user"] = str(user)
        return out

    def split_sizes(self) -> dict[str, int]:
        """Tasks per split: the distinct tasks its evaluations scored (an early-stopped validation runs in
        batches, each an evaluation of a few tasks), at least the largest evaluation's planned size."""
        tasks: dict[str, set[str]] = {}
        sizes: dict[str, int] = {}
        for e in self.evaluations:
            tasks.setdefault(e.split, set()).update(e.scores)
            sizes[e.split] = max(sizes.get(e.split, 0), e.n_tasks, len(tasks[e.split]))
        return sizes

    def cost(self) -> dict[str, float]:
        prompt = sum(c.get("prompt_tokens") or 0 for c in self.calls)
        return {"usd": sum(c.get("cost_usd") or 0.0 for c in self.calls),
                "prefix_rate": sum(c.get("cached_tokens") or 0 for c in self.calls) / prompt if prompt else 0.0,
                "calls": sum(c.get("calls") or 0 for c in self.calls),
                "tokens": sum((c.get("prompt_tokens") or 0) + (c.get("completion_tokens") or 0) for c in self.calls)}


def fmt(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.3f}"
    return str(value)


def training_time_text(charged_s: float | None, wall_s: float) -> str:
    """A run's training time: charged seconds (the budget's `wall_s`: measured rates, the same on a busy
    machine) and the real wall time beside them; the real time alone for a run stored before charged time."""
    real = f"real {wall_s:.1f} s"
    return real if charged_s is None else f"{charged_s:.1f} charged s; {real}"


def steps_text(outcomes: dict[str, tuple[float, int]]) -> str:
    """What a run's charged time bought: its steps by outcome, e.g. "1 accepted (152 s); 60 nothing new built
    (3021 s)"; "–" for a run without recorded steps."""
    order = [*records.STEP_OUTCOMES, *(o for o in outcomes if o not in records.STEP_OUTCOMES)]
    return "; ".join(f"{outcomes[o][1]} {o} ({outcomes[o][0]:.0f} s)" for o in order if o in outcomes) or "–"


def summary_card(run: RunView) -> list[tuple[str, str]]:
    s, cost = run.summary, run.cost()
    test_before, test_after = s.get("test_before") or {}, s.get("test_after") or {}
    sizes = run.split_sizes()
    card = [
        ("environment", str(run.config.get("env", {}).get("name", "?"))),
        ("splits (tasks)", " / ".join(f"{k} {v}" for k, v in sizes.items()) or "–"),
        ("arm", run.arm),
        ("test accuracy seed → final", f"{fmt(test_before.get('accuracy'))} → {fmt(test_after.get('accuracy'))}"),
        ("train accuracy", f"{fmt(s.get('train_before'))} → {fmt(s.get('train_after'))}"),
    ]
    if s.get("val_before") is not None:
        card.append(("val accuracy", f"{fmt(s.get('val_before'))} → {fmt(s.get('val_after'))}"))
    card += [
        ("rounds", f"{len(run.rounds)} ({sum(r.record.accepted for r in run.rounds)} accepted)"),
        ("training time", training_time_text(s.get("charged_s"), s["wall_s"]) if "wall_s" in s
         else f"– (status: {run.status})"),
        ("steps by outcome (charged s)", steps_text(run.step_outcomes)),
        ("agent executions", str(s.get("agent_executions", "–"))),
        ("model calls / tokens", f"{cost['calls']} / {int(cost['tokens'])}"),
        ("prompt tokens from prefix cache", f"{cost['prefix_rate']:.0%}"),
        ("cost", f"${cost['usd']:.4f}"),
    ]
    return card


def trajectory_anchor(round_no: int, task_id: str) -> str:
    return f"traj-r{round_no}-{task_id}"


def _task_scores(trajs: list[Any]) -> dict[str, float]:
    by_task: dict[str, list[float]] = {}
    for t in trajs:
        by_task.setdefault(t.task_id, []).append(t.score)
    return {task: sum(v) / len(v) for task, v in sorted(by_task.items())}


def evaluation_rows(store: RunStore, run_id: str) -> list[EvalRow]:
    """Each evaluation of a run with its progress, accuracy, terminations and tokens (report, `show`)."""
    rows = []
    for ev in store.evaluations(run_id):
        summary = json.loads(ev["summary"]) if ev.get("summary") else {}
        trajs = store.trajectories(ev["id"])
        rows.append(EvalRow(
            id=ev["id"], label=ev["label"] or "", split=ev["split"], harness_id=ev["harness_id"],
            n_tasks=ev["n_tasks"], trials=ev["trials"], episodes=len(trajs),
            accuracy=sum(t.score for t in trajs) / len(trajs) if trajs else 0.0,
            tokens=sum(t.prompt_tokens + t.completion_tokens for t in trajs),
            wall_s=float(summary.get("wall_s") or 0.0),
            terminations=dict(Counter(t.termination for t in trajs)),
            passed=frozenset(t.task_id for t in trajs if t.passed), scores=_task_scores(trajs),
            failures=count_failures(trajs)))
    return rows


def _train_eval(evals: list[EvalRow], harness_id: str) -> EvalRow | None:
    return next((e for e in evals if e.harness_id == harness_id and e.split == "train" and e.label == "train"), None)


def _elapsed(timings: dict[str, float], rounds: int) -> list[float]:
    """Cumulative training wall time at the end of each round (from the recorded step timings)."""
    out, total = [], 0.0
    for r in range(1, rounds + 1):
        total += sum(v for k, v in timings.items() if k.startswith(f"r{r}/"))
        out.append(total)
    return out


def _lineage(store: RunStore, arm: str, rounds: list[RoundRecord], final_id: str | None) -> list[VersionNode]:
    """The seed and the versions this arm built (a compare store holds every arm's versions)."""
    accepted = {r.harness_after for r in rounds if r.accepted} | {e.harness for r in rounds for e in r.edits
                                                                  if e.accepted and e.harness}
    nodes = []
    for v in store.versions():
        if v["note"] != "seed" and not (v["note"] or "").startswith(f"{arm} "):
            continue
        if v["note"] == "seed" or not v["parent"]:
            status = "seed"
        elif v["id"] == final_id:
            status = "final"
        else:
            status = "accepted" if v["id"] in accepted else "rejected"
        nodes.append(VersionNode(v["id"], v["parent"], v["note"] or "", status))
    return nodes


def load_run(store: RunStore, run_id: str) -> RunView:
    """Everything the report shows about one run. KeyError when the store has no such run."""
    row = store.run(run_id)
    if row is None:
        raise KeyError(f"no run {run_id!r} in {store.path}")
    run_id = row["id"]
    view = RunView(run_id=run_id, kind=row["kind"], status=row["status"], config=json.loads(row["config"]),
                   summary=json.loads(row["summary"]) if row.get("summary") else {})
    view.evaluations = evaluation_rows(store, run_id)
    view.calls = store.call_totals(run_id)
    view.accept_rule = records.load(store, run_id, AcceptRule, "accept_on")
    view.step_outcomes = charged_by_outcome(store, run_id)
    checked = store.get_record(run_id, "holdout", "check")
    view.holdout = HoldoutCheck.model_validate(checked) if checked is not None else None
    round_records = [r for _, r in records.load_all(store, run_id, RoundRecord)]
    round_records.sort(key=lambda r: r.round)
    elapsed = _elapsed(dict(store.records(run_id, "timing")), len(round_records))
    final_id = view.summary.get("final_harness_id")
    for i, rec in enumerate(round_records):
        key = f"r{rec.round}"
        collect = _train_eval(view.evaluations, rec.harness_before)
        later = round_records[i + 1].harness_before if i + 1 < len(round_records) else (final_id or rec.harness_after)
        next_eval = _train_eval(view.evaluations, later) if later != rec.harness_before else None
        passing_next = next_eval.passed if next_eval is not None else None
        patterns = [PatternView(p, None if passing_next is None else len(set(p.get("tasks", [])) & passing_next))
                    for p in store.get_record(run_id, "patterns", key) or []]
        candidate_id = rec.candidate or (store.get_record(run_id, "candidate", key) or {}).get("harness")
        diff = ""
        if candidate_id:
            diff = diff_versions(store.load_version(rec.harness_before), store.load_version(candidate_id))
        view.rounds.append(RoundView(
            record=rec, patterns=patterns, transcript=store.get_record(run_id, "transcript", key) or [],
            spec=records.load(store, run_id, SpecRecord, key), candidate=store.get_record(run_id, "candidate", key),
            diff=diff, collect_eval=collect.id if collect else None,
            elapsed_s=elapsed[i] if i < len(elapsed) else 0.0))
        if collect is not None:
            episodes = {t.task_id: t for t in store.trajectories(collect.id)}
            for p in patterns:
                for ev in p.data.get("evidence", []):
                    if (task := ev.get("task_id")) in episodes:
                        view.trajectories[trajectory_anchor(rec.round, task)] = episodes[task]
    view.lineage = _lineage(store, view.arm, round_records, final_id)
    return view


def training_runs(store: RunStore) -> list[RunView]:
    """Every training run in the store (the arms of a compare run share one store)."""
    return [load_run(store, r["id"]) for r in store.runs() if r["kind"] == "train"]


def compare_arms(store: RunStore) -> list[dict[str, Any]]:
    """The recorded results of `ecdysis compare` in this store (one row per arm and seed), if any."""
    return [data for _, data in store.records("compare", "arm")]


@dataclass
class ArmCurve:
    """One arm's training curve in one seed of a compare: the current harness's score (val, else train)
    against cumulative training time (charged and real) and agent executions."""

    arm: str
    seed: int
    points: list[CurvePoint]

    def series(self, x: str) -> list[tuple[float, float]]:
        """(x, score) per point with a score; x is `charged_s`, `wall_s` or `agent_executions`."""
        out = []
        for p in self.points:
            score = p.val_score if p.val_score is not None else p.train_score
            if score is not None:
                out.append((float(getattr(p, x)), score))
        return out


def compare_curves(store: RunStore) -> list[ArmCurve]:
    """The curves `ecdysis compare` recorded in this store (key `ARM/seedN`), in recorded order."""
    curves = []
    for key, points in store.records("compare", "curve"):
        arm, _, seed = key.rpartition("/seed")
        parsed = sorted((CurvePoint.model_validate(p) for p in points), key=lambda p: p.step)
        if parsed:
            curves.append(ArmCurve(arm, int(seed) if seed.isdigit() else 0, parsed))
    return curves
