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
from .evidence import AnswerSetFact, LeverEffect, Pattern
from .lever_catalog import DEFAULT_EXAMPLES, LEVERS
from .rerun import EpisodeRerun
from .spec import Change, HarnessSpec

HARNESS_LAYERS = ("H2", "H3", "H4", "H5", "loop")
STEP_CHECK_RULE = "Before you give your final answer, check each step of your work once."


@dataclass
class Measurement:
    """One repair (or combination) replayed over the training evaluation."""

    repairs: list[str]
    gained: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)  # tool/multi-turn: failing episodes that act differently
    changed_passing: list[str] = field(default_factory=list)  # passing episodes that act differently, unknown outcome
    exact: int = 0  # changed tool/multi-turn episodes graded exactly by a re-run with stored replies
    rescued: dict[str, int] = field(default_factory=dict)  # task -> rejected replies now realized
    error: str = ""

    @property
    def lever(self) -> str:
        return "enable_repair " + "+".join(self.repairs)

    def effect(self, on: set[str] | None = None) -> LeverEffect:
        """Its effect on the tasks `on` (every task when None): the tasks it gains, the rejected replies it
        rescues and the failing episodes it changes among them; passing tasks it loses or changes anywhere."""
        def inside(ids: list[str]) -> int:
            return len(set(ids) if on is None else on & set(ids))

        return LeverEffect(lever=self.lever, repairs=list(self.repairs), gained=inside(self.gained),
                           lost=len(self.lost), changed_failing=inside(self.changed),
                           rescued_replies=sum(n for t, n in self.rescued.items() if on is None or t in on),
                           changed_passing=len(self.changed_passing), model_calls=0)

    @property
    def safe(self) -> bool:
        """Over the whole evaluation: no passing task lost or acting differently."""
        return self.effect().safe

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> Measurement:
        """A stored measurement (`measurement_records`) read back."""
        return cls(**{k: v for k, v in record.items() if k in cls.__dataclass_fields__})


def _with_repairs(current: HarnessVersion, names: list[str]) -> HarnessVersion:
    enabled = json.loads(current.files.get(REPAIRS_FILE) or "[]")
    return current.with_files({REPAIRS_FILE: json.dumps([*enabled, *[n for n in names if n not in enabled]])})


async def measure_repairs(current: HarnessVersion, trajectories: list[Trajectory], env: Environment,
                          tasks: dict[str, Task], limits: SandboxLimits,
                          rerun: EpisodeRerun | None = None) -> list[Measurement]:
    """Replay each repair not yet enabled, then the useful ones together. No model calls. With `rerun`
    (`rerun.runner_rerun(runner)`), changed tool and multi-turn episodes are re-run with their stored
    replies: exact grades where they end without asking anything new, `changed` where they diverge."""
    if not trajectories:
        return []
    try:
        baseline = (await replay_report(current, trajectories, env, tasks, limits)).raw
    except CheckFailed:
        baseline = None
    enabled = set(json.loads(current.files.get(REPAIRS_FILE) or "[]"))
    out: list[Measurement] = []

    async def measure(names: list[str]) -> Measurement:
        m = Measurement(names)
        try:
            report = await replay_report(_with_repairs(current, names), trajectories, env, tasks, limits,
                                         baseline, rerun)
        except CheckFailed as exc:
            m.error = str(exc)
            return m
        m.gained, m.lost, m.changed, m.rescued = report.gained, report.lost, report.changed, report.rescued
        m.changed_passing, m.exact = report.changed_passing, report.exact
        return m

    for name in CATALOG:
        if name not in enabled:
            out.append(await measure([name]))
    useful = [m.repairs[0] for m in out if (effect := m.effect()).acts and effect.safe]
    if len(useful) >= 2:
        out.append(await measure(useful))
    return out


def attach(patterns: list[Pattern], measurements: list[Measurement], trajectories: list[Trajectory],
           tasks: dict[str, Task]) -> list[Pattern]:
    """Put each pattern's measured levers (and the model-call levers) into its facts; rank and renumber."""
    for p in patterns:
        effects = [e for m in measurements if (e := m.effect(set(p.tasks))).acts]
        p.measured = sorted(effects, key=LeverEffect.order)[:4]
        labels = {str(c) for t in p.tasks if t in tasks for c in tasks[t].public.get("choices") or ()}
        answer_set = next((m for m in measurements if m.repairs == ["answer_set"]), None)
        if labels and answer_set is not None:  # declared answer set, constraint not enabled yet
            overall = answer_set.effect()
            p.answer_set = AnswerSetFact(labels=len(labels), lost=overall.lost + overall.changed_passing)
        p.needs_model_calls = model_call_levers(p, trajectories, tasks)
    return rank(patterns)


def rank(patterns: list[Pattern]) -> list[Pattern]:
    """Recurring patterns first: verified harness gains, then harness-layer causes, then model-level;
    within a class by number of tasks. Ids are renumbered P1, P2, ... in that order."""
    def key(p: Pattern) -> tuple[int, int, int]:
        v = p.candidate_lever()
        cls = 0 if v else 1 if p.layer in HARNESS_LAYERS else 2
        return (not p.recurring, cls, -(v.gained + v.changed_failing if v else len(p.tasks)))

    ordered = sorted(patterns, key=key)
    for index, p in enumerate(ordered, 1):
        p.id = f"P{index}"
        p.fixable_by = ("verified harness lever" if p.verified_lever() else
                        "measured harness lever (changes only failing episodes)" if p.candidate_lever()
                        else "harness layer" if p.layer in HARNESS_LAYERS
                        else "model-level (reasoning/knowledge)")
    return ordered


def model_call_levers(p: Pattern, trajectories: list[Trajectory], tasks: dict[str, Task]) -> list[str]:
    """Levers whose effect only agent runs can show (each costs one evaluation of the pattern's tasks).
    Phrased as descriptions, not as rule text, so small models do not copy them into a rule."""
    out: list[str] = []
    tool_kinds = set(p.tool_failures)
    labelled = any(tasks[t].gold for t in p.tasks if t in tasks)  # served conversations have no gold answers
    source = "training task" if labelled else "episode"  # a served conversation is no training task
    if tool_kinds:
        demo = demo_source(p, trajectories, tasks, with_calls=True)
        if demo:
            out.append(f"a demonstration of a native tool call, bootstrapped from passing {source} {demo}")
        if tool_kinds & {"json_call_in_text", "no_tool_call"}:
            out.append("a rule that tools are called through the function-calling API, never written as text")
    if p.rules:
        out.append("a second try after a rejection (more turns; the feedback already goes to the model)")
    if p.facts.truncated:
        out.append(LEVERS["set_max_tokens"].hint)
    if not tool_kinds and (p.layer == "model" or p.facts.answer_parsed >= max(1, p.support // 2)):
        if labelled:
            out.append(LEVERS["add_examples"].hint)
        if p.confusions:
            top = p.confusions[0]
            out.append(f"a rule that tells {top.expected!r} from {top.given!r} apart (the most confused pair)")
        demo = demo_source(p, trajectories, tasks)
        if demo:
            out.append(f"a demonstration the library bootstraps from passing {source} {demo} (same kind)")
        out.append(f"a general step-checking rule, e.g. \"{STEP_CHECK_RULE}\"")
        out.append(LEVERS["set_samples"].hint)
    out.append("a rule or tip about the cause, written to the agent")
    return out


def demo_source(p: Pattern, trajectories: list[Trajectory], tasks: dict[str, Task],
                with_calls: bool = False) -> str | None:
    """A passing training task of the same kind as the pattern's tasks (same meta type when tasks have one);
    `with_calls`: one whose episode made a tool call."""
    kinds = {tasks[t].meta.get("type") for t in p.tasks if t in tasks}
    passing = sorted((t for t in trajectories if t.passed and t.task_id in tasks and (
        not with_calls or t.tool_calls())),
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
    recurring = [p for p in patterns if p.recurring]
    if not recurring or any(p.verified_lever() for p in recurring):
        return None
    target = next((p for p in recurring if any("demonstration" in x for x in p.needs_model_calls)), None)
    if target is None:
        return None
    change = Change(layer="H5", kind="add_demo", text="a worked example from a passing training task",
                    rationale=f"{target.id}: proposed by the library; no measured lever is left for it")
    return HarnessSpec(patterns_addressed=[target.id], changes=[change], skills=[],
                       implementation_notes="library candidate", expected_effect="decided by acceptance")


def _repairs_spec(p: Pattern, m: LeverEffect, why: str) -> HarnessSpec:
    """A spec enabling exactly the repairs of a measured lever (one change; the combination as one id)."""
    change = Change(layer="H2", kind="enable_repair", repair="+".join(m.repairs), text="",
                    rationale=f"{p.id}: {why} ({m.lever}: +{m.gained} gained, {m.changed_failing} "
                              f"failing changed, {m.lost} lost)")
    return HarnessSpec(patterns_addressed=[p.id], changes=[change], skills=[],
                       implementation_notes="library candidate: the measured lever, exactly as measured",
                       expected_effect="decided by acceptance")


def enabled_repairs(spec: HarnessSpec) -> set[str]:
    """Every repair a spec's structured fields enable (a combination id counts as its parts)."""
    return {name for c in spec.changes if c.kind == "enable_repair" for name in c.repair.split("+") if name}


def candidate_variants(spec: HarnessSpec, patterns: list[Pattern]) -> list[tuple[str, HarnessSpec]]:
    """Alternative specs to validate next to the whole spec, as (name, spec): the engine picks among them on
    train (cache-served: none changes a prompt) and decides on val. They are the spec's H2 repairs alone when
    it bundles them with prompt edits, and, for every pattern it addresses (then every other recurring
    pattern) whose best measured lever (verified first, else one that changes only failing episodes) is not
    what the spec enables, that lever's repairs exactly as measured. The roles' free text never decides
    which repairs run."""
    out: list[tuple[str, HarnessSpec]] = []
    part = spec.deterministic_part()
    if part is not None:
        out.append(("repairs only", part))
    seen = [enabled_repairs(spec), *(enabled_repairs(v) for _, v in out)]
    by_id = {p.id: p for p in patterns}
    addressed = [by_id[i] for i in spec.patterns_addressed if i in by_id]
    others = [p for p in patterns if p.recurring and p not in addressed]
    for p in addressed + others:  # a recurring pattern the spec left out is the roles leaving its lever out
        best = p.candidate_lever()
        if best is None or set(best.repairs) in seen:
            continue
        seen.append(set(best.repairs))
        out.append((f"measured lever {best.lever}", _repairs_spec(p, best, "the measured lever")))
    return out


def library_fallback_specs(patterns: list[Pattern]) -> list[HarnessSpec]:
    """What the library tries, in order, when the roles give nothing that runs (each decided by acceptance):
    the measured repairs of recurring patterns (e.g. `json_in_text` for calls written as text: verified, or
    changing only failing episodes); for model-level patterns retrieved labelled demonstrations, then the
    answer-set constraint where tasks declare one (and its replay lost nothing); then the bootstrapped
    demonstration of `library_demo_spec`."""
    recurring = [p for p in patterns if p.recurring]
    out: list[HarnessSpec] = []
    tried: list[set[str]] = []
    for p in recurring:
        best = p.candidate_lever()
        if best is not None and set(best.repairs) not in tried:
            tried.append(set(best.repairs))
            out.append(_repairs_spec(p, best, "proposed by the library from its measurement"))
    model_level = [p for p in recurring if p.layer == "model" and not p.tool_failures]
    if model_level:
        target = model_level[0]
        out.append(HarnessSpec(
            patterns_addressed=[target.id], skills=[], expected_effect="decided by acceptance",
            implementation_notes="library candidate: retrieved labelled examples",
            changes=[Change(layer="H5", kind="add_examples", value=DEFAULT_EXAMPLES, text="",
                            rationale=f"{target.id}: model-level; show the most similar training tasks with "
                                      "their answers")]))
        constrained = next((p for p in model_level if p.answer_set is not None and p.answer_set.safe), None)
        if constrained is not None and {"answer_set"} not in tried:
            out.append(HarnessSpec(
                patterns_addressed=[constrained.id], skills=[], expected_effect="decided by acceptance",
                implementation_notes="library candidate: answer-set constraint",
                changes=[Change(layer="H2", kind="enable_repair", repair="answer_set", text="",
                                rationale=f"{constrained.id}: answers must be one of the declared labels")]))
    demo = library_demo_spec(patterns)
    if demo is not None:
        out.append(demo)
    return out
