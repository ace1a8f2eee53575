"""From served traffic to a harness edit: `ecdysis train --from-traces STORE`.

The scored conversations a `serve` store holds are read like a collect: failures get the library's
facts (`failure_record`) and are grouped across conversations (`aggregate`); every built-in H2 repair
the served harness does not enable is measured by replaying the recorded upstream replies
(`measure_repairs`, sandboxed, no model calls, no environment). A repair that changes failing
conversations of a recurring pattern and no passing one is proposed and verified by replaying the
candidate (`check_replay`). Conversations cannot be re-graded from their replies, so "verified" means
"acts differently exactly where it failed, loses nothing that passed" — not a measured gain. Levers that
need agent runs (rules, demos, token limits) are listed as unvalidated proposals: validate them with
`ecdysis eval`/`train` on an environment.

Output (`OUT`, default `STORE/from-traces/<time>`): `harness/` (the candidate, if any), `SPEC.json`,
`traces_report.json`.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from ..agent.events import PromptEvent
from ..agent.trajectory import Trajectory
from ..envs.base import Score, Task
from ..harness.manifest import HarnessVersion, load_harness
from ..sandbox.host import SandboxLimits
from ..serve.record import scored_conversations
from ..store.db import DB_NAME, RunStore
from .checks import CheckFailed, check_replay, check_static
from .failures import aggregate, failure_record
from .implement import apply_structured
from .levers import Measurement, measure_repairs, model_call_levers
from .spec import Change, HarnessSpec

RECORDED = "recorded conversation (served traffic)"  # marks a conversation task for replay


class TracesProposal(BaseModel):
    """One proposed edit: verified by replay (H2) or unvalidated (needs agent runs)."""

    pattern: str
    layer: str
    lever: str
    validated: bool
    evidence: str


class TracesResult(BaseModel):
    """What `train --from-traces` found and wrote."""

    store: str
    harness_id: str
    conversations: int  # scored conversations served by that harness
    failing: int
    skipped: int = 0  # scored conversations served by another harness version
    patterns: list[dict[str, Any]] = Field(default_factory=list)
    measurements: list[dict[str, Any]] = Field(default_factory=list)
    proposals: list[TracesProposal] = Field(default_factory=list)
    spec: dict[str, Any] | None = None
    candidate_id: str | None = None
    replay: dict[str, Any] | None = None
    out_dir: str = ""
    notes: list[str] = Field(default_factory=list)
    no_candidate: str = ""  # why no candidate harness was written ("" when one was)


class _Traffic:
    """The environment of recorded conversations: none to run, nothing to grade (replay never regrades them)."""

    name = "serve-traffic"
    tool_names: tuple[str, ...] = ()

    def tasks(self, split: str) -> list[Task]:
        return []

    def grade(self, task: Task, answer: str | None, final_state: dict[str, Any]) -> Score:
        raise RuntimeError("recorded conversations cannot be regraded")


def _task(traj: Trajectory) -> Task:
    prompt = traj.of(PromptEvent)
    text = prompt[0].task if prompt else ""
    return Task(id=traj.task_id, split="train", prompt=text, gold="", user_scenario=RECORDED)


def _touches(m: Measurement, tasks: set[str]) -> list[str]:
    return sorted(tasks & (set(m.changed) | set(m.rescued) | set(m.gained)))


def _safe(m: Measurement) -> bool:
    return not m.error and m.safe


async def train_from_traces(store_dir: Path | str, harness_dir: Path | str | None = None,
                            out_dir: Path | str | None = None, limits: SandboxLimits | None = None) -> TracesResult:
    """Aggregate the store's scored conversations, measure H2 repairs by replay, propose and verify an edit.
    Raises ValueError when the store has no scored conversations to learn from."""
    store_dir = Path(store_dir)
    if not (store_dir / DB_NAME).exists():
        raise ValueError(f"{store_dir} holds no run store ({DB_NAME}); pass the --store directory of `ecdysis serve`")
    store = RunStore(store_dir)
    limits = limits or SandboxLimits(timeout_s=120.0)
    try:
        scored = scored_conversations(store)
        if not scored:
            raise ValueError(f"{store_dir}: no conversation has an outcome yet; attach one with "
                             "POST /v1/conversations/ID/outcome or the X-Ecdysis-Outcome header")
        if harness_dir is not None:
            current = load_harness(harness_dir)
        else:
            served = Counter(t.harness_id for t in scored).most_common(1)[0][0]
            current = store.load_version(served)
    finally:
        store.close()
    trajectories = [t for t in scored if t.harness_id == current.id] if harness_dir is None else scored
    result = TracesResult(store=str(store_dir), harness_id=current.id, conversations=len(trajectories),
                          failing=sum(not t.passed for t in trajectories), skipped=len(scored) - len(trajectories))
    tasks = {t.task_id: _task(t) for t in trajectories}
    outcomes = {t.task_id: (1, int(t.passed)) for t in trajectories}
    records = [failure_record(t, "") for t in trajectories if not t.passed]
    patterns = aggregate(records, outcomes)
    env = _Traffic()
    measurements = await measure_repairs(current, trajectories, env, tasks, limits)  # type: ignore[arg-type]
    result.measurements = [{"repairs": m.repairs, "changed_failing": m.changed, "rescued": m.rescued,
                            "lost": m.lost, "changed_passing": getattr(m, "changed_passing", []), "error": m.error}
                           for m in measurements]
    changes: list[Change] = []
    addressed: list[str] = []
    for p in patterns:
        result.patterns.append({"id": p.id, "name": p.name, "classification": p.classification, "layer": p.layer,
                                "conversations": p.tasks, "reason": p.reason, "facts": p.stored_facts()})
        if p.classification != "recurring":
            continue
        own = set(p.tasks)
        best = max((m for m in measurements if _safe(m) and len(m.repairs) == 1 and _touches(m, own)),
                   key=lambda m: len(_touches(m, own)), default=None)
        if best is not None:
            hit = _touches(best, own)
            evidence = (f"replay: acts differently in {len(hit)}/{len(own)} failing conversations of {p.id}, "
                        "changes no passing conversation")
            result.proposals.append(TracesProposal(pattern=p.id, layer="H2", lever=f"enable_repair {best.repairs[0]}",
                                             validated=False, evidence=evidence))
            if all(c.repair != best.repairs[0] for c in changes) and len(changes) < 3:
                changes.append(Change(layer="H2", kind="enable_repair", repair=best.repairs[0],
                                      rationale=f"{p.id}: {p.name}; {evidence}"))
                addressed.append(p.id)
            continue
        for lever in [*model_call_levers(p, trajectories, tasks), *p.levers][:4]:
            result.proposals.append(TracesProposal(pattern=p.id, layer=p.layer, lever=lever, validated=False,
                                             evidence="needs agent runs: validate on an environment "
                                                      "(`ecdysis train -c CONFIG --harness DIR`)"))
    out = Path(out_dir) if out_dir is not None else store_dir / "from-traces" / time.strftime("%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    result.out_dir = str(out)
    if changes:
        spec = HarnessSpec(patterns_addressed=addressed, changes=changes, skills=[],
                           implementation_notes="H2 repairs measured on served traffic (train --from-traces)",
                           expected_effect="calls the upstream model wrote in a form the harness missed are realized")
        result.spec = spec.model_dump()
        await _verify(current, spec, trajectories, env, tasks, limits, result, out)
    if result.candidate_id is None:
        result.no_candidate = no_candidate_reason(result, bool(changes))
    (out / "traces_report.json").write_text(result.model_dump_json(indent=1))
    return result


def no_candidate_reason(result: TracesResult, proposed: bool) -> str:
    """Why `train --from-traces` wrote no candidate harness, and what to do about it."""
    if proposed:
        return "the H2 repairs measured on the traces failed the candidate's checks (see the notes)"
    if not any(p["classification"] == "recurring" for p in result.patterns):
        return (f"no recurring failure pattern in {result.failing} failing of {result.conversations} "
                "conversations: nothing to propose")
    return (f"no built-in H2 repair acts on the failing conversations without changing a passing one; the "
            f"{len(result.proposals)} unvalidated proposal(s) above need agent runs: validate them on an "
            "environment (`ecdysis train -c CONFIG --harness DIR`)")


async def _verify(current: HarnessVersion, spec: HarnessSpec, trajectories: list[Trajectory], env: _Traffic,
                  tasks: dict[str, Task], limits: SandboxLimits, result: TracesResult, out: Path) -> None:
    """Apply the H2 spec, check it statically, replay every scored conversation through it; mark verified."""
    files, notes = apply_structured(current, spec, [], {})
    result.notes += notes
    try:
        candidate = check_static(current, files, [])
        report = await check_replay(candidate, trajectories, env, tasks, limits)  # type: ignore[arg-type]
    except CheckFailed as exc:
        result.notes.append(f"candidate rejected by its checks: {exc}")
        return
    result.candidate_id = candidate.id
    result.replay = report.to_dict()
    touched = set(report.changed) | set(report.rescued) | set(report.gained)
    for proposal in result.proposals:
        if proposal.layer == "H2" and proposal.lever.startswith("enable_repair") and touched:
            proposal.validated = True
            proposal.evidence += f"; verified by replay of {len(trajectories)} conversations (candidate {candidate.id})"
    candidate.write(out / "harness")
    (out / "SPEC.json").write_text(json.dumps(spec.model_dump(), indent=1))


def run_from_traces(store_dir: Path, harness_dir: Path | None, out_dir: Path | None) -> TracesResult:
    return asyncio.run(train_from_traces(store_dir, harness_dir, out_dir))
