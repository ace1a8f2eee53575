"""A training run's charged seconds: its model calls by the rate table, its sandboxed episodes and replays.

The primary training time of every arm (the budget's `wall_s`, the curves, the compare tables): it does not
depend on how busy the machine was, and re-running a compare from its response cache gives the same numbers
(docs/claim.md). A run pays for the calls of its training evaluations (a shared seed evaluation included) and
of its optimizer roles, each distinct request once (`RunStore.charged_calls`), plus `[sandbox] episode_s` per
episode its training evaluations hold and per replay of a stored episode it made (grounding, checks).
"""

from __future__ import annotations

from ..models.charge import rates
from ..store.db import RunStore
from . import records
from .budget import training_evaluations
from .records import CurvePoint, RoundRecord, SerialEdit, step_outcome

REPLAYS = ("charge", "replays")  # record (kind, key): the replays a run made, summed over its processes


def charged_seconds(store: RunStore, run_id: str, eval_ids: list[str], episodes: int, replays: int = 0) -> float:
    """Charged seconds of a run: the calls of `eval_ids` and its optimizer calls, plus the sandbox charge of
    `episodes` episodes and `replays` replays."""
    return store.charged_calls(run_id, eval_ids) + (episodes + replays) * rates().episode_s


def run_charged_seconds(store: RunStore, run_id: str) -> float:
    """Charged seconds of a run's non-test evaluations and optimizer calls (a run without spend records, e.g.
    the gepa arm's)."""
    ids = training_evaluations(store, run_id)
    return charged_seconds(store, run_id, ids, store.episode_count(ids), stored_replays(store, run_id))


def charged_parts(store: RunStore, run_id: str, eval_ids: list[str],
                  paid: dict[str, tuple[float, int]]) -> dict[str, float]:
    """Where a run's charged seconds went: its paid model calls by role (`paid`: `store.paid_calls_by_role` of
    these `eval_ids`; `agent` for the training evaluations' episodes, a shared seed evaluation included; each
    optimizer role) and `sandbox` (episodes and replays)."""
    parts = {role: s for role, (s, _) in paid.items()}
    parts["sandbox"] = (store.episode_count(eval_ids) + stored_replays(store, run_id)) * rates().episode_s
    return {role: round(s, 3) for role, s in parts.items()}


def stored_replays(store: RunStore, run_id: str) -> int:
    return int(store.get_record(run_id, *REPLAYS) or 0)


def charged_by_outcome(store: RunStore, run_id: str) -> dict[str, tuple[float, int]]:
    """Charged seconds and steps by what each step came to (`records.step_outcome`): a step costs everything
    the run paid between the previous decision's curve point and its own (a round's train evaluation too; a
    per-failure step after an accepted edit, that harness's train evaluation; an evaluation the run already
    paid for is free). Not steps: the seed evaluation (point 0), and what was paid after the last point (a step
    the budget cut before its decision, a round that found nothing left to do). A point without a decision
    record is `other`; one whose or whose predecessor's charged seconds were not recorded is left out."""
    keys = {int(step): key for key, step in store.records(run_id, "curve-of")}
    points = {p.step: p for _, p in records.load_all(store, run_id, CurvePoint)}
    out: dict[str, tuple[float, int]] = {}
    for step in sorted(points):
        before = points.get(step - 1)
        if step == 0 or before is None or before.charged_s is None or points[step].charged_s is None:
            continue
        key = keys.get(step, "")
        decision = (records.load(store, run_id, SerialEdit, key) if "/" in key
                    else records.load(store, run_id, RoundRecord, key)) if key else None
        outcome = step_outcome(decision) if decision is not None else "other"
        cost = points[step].charged_s - before.charged_s
        seconds, steps = out.get(outcome, (0.0, 0))
        out[outcome] = (round(seconds + cost, 3), steps + 1)
    return out
