"""Exact evidence: deciding a change whose effect on stored replies is exact (H2: repairs, the action code).

Such a change alters how replies are realized, never what the model is asked, so replaying the current harness's
stored replies with the candidate's H2 (sandboxed, no model call; tool and conversation episodes re-run with
their stored replies) gives its effect on those episodes exactly: the tasks it gains, the tasks it loses, and the
episodes replay cannot finish (changed, outcome unknown). The `sequential` rule decides such a candidate on all
of that evidence — its gains and losses on the training replies plus those on the acceptance split's replies —
instead of on a val gain it may be too small to show: accepted when it gains at least one task and loses none
anywhere, rejected on any loss. When the training replay is exact (gains, no loss) but the acceptance split's is
not (tool episodes whose changed calls lead where the stored episode never went), the training gain is still
measured: the candidate then runs on val, and is accepted when it loses no val task there (`decide_train_exact`),
stopping at the first loss. When the training replay cannot grade every changed episode, or fails, there is no
exact evidence and the candidate is decided by the test on agent runs like any other change.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..agent.trajectory import INFRA_ERROR, Trajectory
from ..envs.base import Environment, Task
from ..harness.manifest import HarnessVersion
from ..sandbox.host import SandboxLimits
from .accept import AcceptanceRule, Decision
from .checks import CheckFailed, replay_report
from .decision import Scores, mean_of, paired
from .records import DecisionEvidence
from .rerun import EpisodeRerun


@dataclass(frozen=True)
class SplitReplay:
    """The candidate's H2 over one split's stored episodes of the current harness (task ids, one per episode)."""

    split: str
    tasks: int
    episodes: int
    gained: list[str]
    lost: list[str]
    unknown: list[str]  # changed episodes whose outcome replay could not grade


async def replay_split(split: str, candidate: HarnessVersion, trajectories: list[Trajectory], env: Environment,
                       tasks: dict[str, Task], limits: SandboxLimits,
                       rerun: EpisodeRerun | None) -> SplitReplay | None:
    """The replay of one split; None when the candidate's code fails in replay."""
    try:
        report = await replay_report(candidate, trajectories, env, tasks, limits, rerun=rerun)
    except CheckFailed:
        return None
    return SplitReplay(split, len({t.task_id for t in trajectories}), len(trajectories), report.gained, report.lost,
                       [*report.changed, *report.changed_passing])


@dataclass(frozen=True)
class Replays:
    """What replaying needs: the environment (grading), sandbox limits and the
    re-run of tool and conversation episodes with their stored replies."""

    env: Environment
    limits: SandboxLimits
    rerun: EpisodeRerun | None


@dataclass(frozen=True)
class ReplayEvidence:
    """What the replays decided (None: not exact), and the training replay (None: it failed)."""

    decision: Decision | None
    train: SplitReplay | None

    def exact_train_gain(self) -> bool:
        """The training replay is exact and gains at least one task without losing any."""
        t = self.train
        return t is not None and not t.unknown and bool(t.gained) and not t.lost


async def decide_on_replays(rule: AcceptanceRule, candidate: HarnessVersion, replays: Replays,
                            train: tuple[list[Trajectory], list[Task]],
                            held: tuple[list[Trajectory] | None, list[Task]], current_score: float) -> ReplayEvidence:
    """The candidate replayed over the current harness's stored training episodes and, when edits are decided on
    val, its stored val episodes (`held`: (None, ...) otherwise), decided on that; no decision when a replay fails
    or is not exact (then `exact_train_gain` says whether val runs may settle it, or a test on agent runs)."""
    async def replay(split: str, episodes: list[Trajectory], tasks: list[Task]) -> SplitReplay | None:
        done = [t for t in episodes if t.termination != INFRA_ERROR]
        return await replay_split(split, candidate, done, replays.env, {t.id: t for t in tasks}, replays.limits,
                                  replays.rerun)

    on_train = await replay("train", *train)
    on_held = await replay("val", held[0], held[1]) if held[0] is not None else None
    if on_train is None or (held[0] is not None and on_held is None):
        return ReplayEvidence(None, on_train)
    return ReplayEvidence(decide_exact(rule.name, on_train, on_held, current_score, getattr(rule, "alpha", None)),
                          on_train)


def first_loss(current: Scores) -> Callable[[Scores], str | None]:
    """An early stop for val runs of a candidate with exact training gains: the first task it loses."""
    def stop(partial: Scores) -> str | None:
        lost = [t for t, d in paired(current, partial, list(partial)).items() if d < 0]
        return f"loses val task {lost[0]}" if lost else None
    return stop


def decide_train_exact(rule: str, train: SplitReplay, current: Scores, candidate: Scores, expected: list[str],
                       split: str, alpha: float | None = None) -> Decision:
    """A candidate whose training gains are exact, decided on its val runs: accepted when every val task ran
    and none is lost (per-task mean over trials), rejected on any loss or when val did not run out."""
    diffs = paired(current, candidate, expected)
    wins, losses = sum(d > 0 for d in diffs.values()), sum(d < 0 for d in diffs.values())
    where = f"train +{len(set(train.gained))} -0 of {train.tasks} exact; {split} +{wins} -{losses} of {len(expected)}"
    if losses:
        ok, why = False, f"rejected: loses {losses} {split} task(s) in agent runs"
    elif len(diffs) < len(expected):
        ok, why = False, f"rejected: {len(expected) - len(diffs)} {split} task(s) did not run"
    else:
        ok, why = True, "accepted: measured training gains, no loss on val in agent runs"
    effect = sum(diffs.values()) / len(diffs) if diffs else 0.0
    base = sum(mean_of(current[t]) for t in diffs) / len(diffs) if diffs else 0.0
    ev = DecisionEvidence(kind="exact train + val runs", rule=rule, split=split, alpha=alpha, tasks=len(diffs),
                          pool=len(expected), train_gained=len(set(train.gained)), wins=wins, losses=losses,
                          ties=len(diffs) - wins - losses, effect=effect, stopped=why,
                          episodes=sum(len(candidate.get(t, [])) for t in expected))
    return Decision(ok, rule, base, base + effect, f"{where}: {why}", tasks=len(diffs),
                    early=len(diffs) < len(expected), evidence=ev)


def decide_exact(rule: str, train: SplitReplay, held: SplitReplay | None, current_score: float,
                 alpha: float | None = None) -> Decision | None:
    """The decision on exact evidence (`held`: the acceptance split's replay, None when edits are decided on
    train), or None when some changed episode could not be graded (then a test on agent runs decides)."""
    if train.unknown or (held is not None and held.unknown):
        return None
    decided_on = held or train
    gained = len(set(train.gained)) + (len(set(held.gained)) if held else 0)
    lost_train, lost_held = sorted(set(train.lost)), sorted(set(held.lost)) if held else []
    where = f"train +{len(set(train.gained))} -{len(lost_train)} of {train.tasks}"
    if held is not None:
        where += f", {held.split} +{len(set(held.gained))} -{len(lost_held)} of {held.tasks}"
    if lost_train or lost_held:
        ok, why = False, f"rejected: loses {len(lost_train) + len(lost_held)} task(s) on the stored replies"
    elif not gained:
        ok, why = False, "rejected: gains nothing on the stored replies"
    else:
        ok, why = True, "accepted: measured gains, no loss anywhere"
    per_episode = (len(decided_on.gained) - len(decided_on.lost)) / max(decided_on.episodes, 1)
    ev = DecisionEvidence(kind="exact replay", rule=rule, split=decided_on.split, alpha=alpha,
                          tasks=decided_on.tasks, pool=decided_on.tasks, train_gained=len(set(train.gained)),
                          train_lost=len(lost_train), val_gained=len(set(held.gained)) if held else 0,
                          val_lost=len(lost_held), wins=len(set(decided_on.gained)),
                          losses=len(set(decided_on.lost)), effect=per_episode, stopped=why,
                          ties=max(0, decided_on.tasks - len(set(decided_on.gained)) - len(set(decided_on.lost))))
    return Decision(ok, rule, current_score, current_score + per_episode,
                    f"exact on stored replies ({where}; no agent episode): {why}", tasks=decided_on.tasks,
                    evidence=ev)
