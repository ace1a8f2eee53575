"""Levers measured on the evidence before any role speaks.

Every built-in H2 repair the current harness does not enable yet is replayed over the stored
replies of the whole training evaluation (sandboxed, zero model calls): which failing tasks it
would gain, which passing tasks it would lose, how many rejected replies it turns into actions.
Repairs that gain something are also measured together. Levers whose effect needs a model call to
know (a rule, a demonstration, a token limit, a retry after a rejection) are named with the
cheapest way to test them. Patterns are then ranked by what the harness can fix: verified
zero-loss gains first, then harness-layer causes, then model-level errors.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from ..agent.trajectory import Trajectory
from ..envs.base import Environment, Task
from ..harness.manifest import HarnessVersion
from ..harness.repairs import CATALOG, REPAIRS_FILE
from ..sandbox.host import SandboxLimits
from .checks import CheckFailed, replay_report
from .failures import Pattern
from .spec import Change, HarnessSpec

HARNESS_LAYERS = ("H2", "H3", "H4", "H5", "loop")
STEP_CHECK_RULE = "Before you give your final answer, check each step of your work once."


@dataclass
class Measurement:
    """One repair (or combination) replayed over the training evaluation."""

    repairs: list[str]
    gained: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)  # multi-turn: failing episodes that would act differently
    rescued: dict[str, int] = field(default_factory=dict)  # task -> rejected replies now realized
    error: str = ""

    @property
    def lever(self) -> str:
        return "enable_repair " + "+".join(self.repairs)


def _with_repairs(current: HarnessVersion, names: list[str]) -> HarnessVersion:
    enabled = json.loads(current.files.get(REPAIRS_FILE) or "[]")
    return current.with_files({REPAIRS_FILE: json.dumps([*enabled, *[n for n in names if n not in enabled]])})


async def measure_repairs(current: HarnessVersion, trajectories: list[Trajectory], env: Environment,
                          tasks: dict[str, Task], limits: SandboxLimits, single_turn: bool) -> list[Measurement]:
    """Replay each repair not yet enabled, then the useful ones together. No model calls."""
    if not trajectories:
        return []
    try:
        baseline = (await replay_report(current, trajectories, env, tasks, limits, single_turn)).raw
    except CheckFailed:
        baseline = None
    enabled = set(json.loads(current.files.get(REPAIRS_FILE) or "[]"))
    out: list[Measurement] = []

    async def measure(names: list[str]) -> Measurement:
        m = Measurement(names)
        try:
            report = await replay_report(_with_repairs(current, names), trajectories, env, tasks, limits,
                                         single_turn, baseline)
        except CheckFailed as exc:
            m.error = str(exc)
            return m
        m.gained, m.lost, m.changed, m.rescued = report.gained, report.lost, report.changed, report.rescued
        return m

    for name in CATALOG:
        if name not in enabled:
            out.append(await measure([name]))
    useful = [m.repairs[0] for m in out if (m.gained or m.rescued) and not m.lost]
    if len(useful) >= 2:
        out.append(await measure(useful))
    return out


def attach(patterns: list[Pattern], measurements: list[Measurement], trajectories: list[Trajectory],
           tasks: dict[str, Task]) -> list[Pattern]:
    """Put each pattern's measured levers (and the model-call levers) into its facts; rank and renumber."""
    for p in patterns:
        own = set(p.tasks)
        measured = []
        for m in measurements:
            gained = sorted(own & set(m.gained))
            rescued = sum(n for t, n in m.rescued.items() if t in own)
            changed = sorted(own & set(m.changed))
            if gained or rescued:
                measured.append({"lever": m.lever, "gained": len(gained), "lost": len(m.lost),
                                 "rescued_replies": rescued, "changed_failing": len(changed), "model_calls": 0})
        measured.sort(key=lambda x: (-x["gained"], x["lost"], -x["rescued_replies"]))
        p.facts["measured_levers"] = measured[:4]
        p.facts["needs_model_calls"] = model_call_levers(p, trajectories, tasks)
    return rank(patterns)


def repairs_of(measured: dict[str, Any]) -> list[str]:
    """The repair names of a measured lever entry ("enable_repair a+b" -> ["a", "b"])."""
    return measured["lever"].removeprefix("enable_repair ").split("+")


def verified(p: Pattern) -> dict[str, Any] | None:
    """The pattern's best measured lever that gains tasks and loses none, if any."""
    return next((m for m in p.facts.get("measured_levers", []) if m["gained"] > 0 and m["lost"] == 0), None)


def rank(patterns: list[Pattern]) -> list[Pattern]:
    """Recurring patterns first: verified harness gains, then harness-layer causes, then model-level;
    within a class by number of tasks. Ids are renumbered P1, P2, ... in that order."""
    def key(p: Pattern) -> tuple[int, int, int]:
        v = verified(p)
        cls = 0 if v else 1 if p.layer in HARNESS_LAYERS else 2
        return (p.classification != "recurring", cls, -(v["gained"] if v else len(p.tasks)))

    ordered = sorted(patterns, key=key)
    for index, p in enumerate(ordered, 1):
        p.id = f"P{index}"
        v = verified(p)
        p.facts["fixable_by"] = ("verified harness lever" if v else "harness layer" if p.layer in HARNESS_LAYERS
                                 else "model-level (reasoning/knowledge)")
    return ordered


def model_call_levers(p: Pattern, trajectories: list[Trajectory], tasks: dict[str, Task]) -> list[str]:
    """Levers whose effect only agent runs can show (each costs one evaluation of the pattern's tasks).
    Phrased as descriptions, not as rule text, so small models do not copy them into a rule."""
    out: list[str] = []
    if p.facts.get("rules"):
        out.append("a second try after a rejection (more turns; the feedback already goes to the model)")
    if p.facts.get("truncated"):
        out.append("a higher token limit")
    if p.layer == "model" or p.facts.get("answer_parsed", 0) >= max(1, p.support // 2):
        demo = demo_source(p, trajectories, tasks)
        if demo:
            out.append(f"a demonstration the library bootstraps from passing training task {demo} (same kind)")
        out.append(f"a general step-checking rule, e.g. \"{STEP_CHECK_RULE}\"")
    out.append("a rule or tip about the cause, written to the agent")
    return out


def demo_source(p: Pattern, trajectories: list[Trajectory], tasks: dict[str, Task]) -> str | None:
    """A passing training task of the same kind as the pattern's tasks (same meta type when tasks have one)."""
    kinds = {tasks[t].meta.get("type") for t in p.tasks if t in tasks}
    passing = sorted((t for t in trajectories if t.passed and t.task_id in tasks),
                     key=lambda t: sum(map(len, t.replies())))
    for t in passing:
        if tasks[t.task_id].meta.get("type") in kinds:
            return t.task_id
    return passing[0].task_id if passing else None


def measurement_records(measurements: list[Measurement]) -> list[dict[str, Any]]:
    return [asdict(m) | {"lever": m.lever} for m in measurements]


def library_demo_spec(patterns: list[Pattern]) -> HarnessSpec | None:
    """The library's model-level candidate when no recurring pattern has a measured lever left: one
    demonstration bootstrapped from a passing training task (the pattern's `needs_model_calls` names it)."""
    recurring = [p for p in patterns if p.classification == "recurring"]
    if not recurring or any(verified(p) for p in recurring):
        return None
    target = next((p for p in recurring if any("demonstration" in x for x in p.facts.get("needs_model_calls", []))),
                  None)
    if target is None:
        return None
    change = Change(layer="H5", kind="add_demo", text="a worked example from a passing training task",
                    rationale=f"{target.id}: proposed by the library; no measured lever is left for it")
    return HarnessSpec(patterns_addressed=[target.id], changes=[change], skills=[],
                       implementation_notes="library candidate", expected_effect="decided by acceptance")


def candidate_variants(spec: HarnessSpec, patterns: list[Pattern]) -> list[tuple[str, HarnessSpec]]:
    """Alternative specs to validate next to the whole spec, as (name, spec): the engine picks among
    them on train (cache-served) and decides on val. Today: the spec's H2 repairs alone, when it
    bundles them with prompt edits."""
    part = spec.deterministic_part()
    return [("repairs only", part)] if part is not None else []


def library_fallback_specs(patterns: list[Pattern]) -> list[HarnessSpec]:
    """What the library tries, in order, when the roles give nothing that runs. Today: the
    bootstrapped demonstration of `library_demo_spec`, if any."""
    demo = library_demo_spec(patterns)
    return [demo] if demo is not None else []
