"""Typed trainer records: what a round decided, a serial edit, a spec, the acceptance rule.

They are stored as JSON rows (`RunStore.put_record`) and read back through `load`, so a resumed run,
`compare`, the terminal views and the report all read the same fields by name, checked, instead of
string keys into dicts. Fields added later have defaults, so records from older runs still load.
"""

from __future__ import annotations

from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from ..store.db import RunStore


class Record(BaseModel):
    model_config = ConfigDict(extra="ignore")


class DecisionEvidence(Record):
    """What decided an acceptance: which evidence, what was compared, on how many tasks, the effect, the test's
    p-value and why it stopped (shown by `show` and the report; the roles see only the decision's reason)."""

    # exact effects on stored replies; exact training gains with val decided on agent runs (no loss); agent runs
    kind: Literal["exact replay", "exact train + val runs", "sequential test", "rule"]
    rule: str
    split: str
    current: str = ""  # harness ids compared
    candidate: str = ""
    alpha: float | None = None  # the stated false-accept rate (sequential)
    tasks: int = 0  # tasks compared
    pool: int = 0  # tasks the split holds
    trials: int = 1
    wins: int = 0  # tasks the candidate scores higher on
    losses: int = 0
    ties: int = 0
    effect: float = 0.0  # mean paired difference (candidate - current) over the tasks compared
    p_value: float | None = None
    threshold: float | None = None  # alpha spent through the deciding look (accept when p <= it)
    looks: str = ""  # "2/4": the look that decided, of the planned looks
    stopped: str = ""  # why it stopped
    episodes: int = 0  # candidate episodes the decision used
    noise: float | None = None  # trials > 1: how often two trials of the current harness disagree on a task
    pass_hat_k: tuple[float, float] | None = None  # trials > 1: pass^k of the current harness, the candidate
    train_gained: int = 0  # exact replay: tasks gained / lost on the stored training replies
    train_lost: int = 0
    val_gained: int = 0  # ... and on the stored replies of the acceptance split
    val_lost: int = 0

    def summary(self) -> str:
        """One line: which evidence, what it showed, why it stopped."""
        if self.kind == "exact replay":
            val = f"; {self.split} +{self.val_gained} -{self.val_lost} of {self.pool}" if self.split != "train" else ""
            return (f"exact replay on stored replies: train +{self.train_gained} -{self.train_lost}{val} "
                    f"(no agent episode): {self.stopped}")
        if self.kind == "exact train + val runs":
            return (f"exact replay on stored training replies: train +{self.train_gained} -{self.train_lost}; "
                    f"{self.split} in agent runs: {self.tasks}/{self.pool} tasks, +{self.wins} -{self.losses} "
                    f"={self.ties}, {self.episodes} episodes: {self.stopped}")
        text = (f"{self.kind} ({self.rule}) on {self.split}: {self.tasks}/{self.pool} tasks x {self.trials}, "
                f"+{self.wins} -{self.losses} ={self.ties}, effect {self.effect:+.3f}")
        if self.p_value is not None:
            text += f", p={self.p_value:.3g}"
            if self.threshold is not None:
                text += f" (accept at <= {self.threshold:.3g}; alpha {self.alpha:g})"
        if self.looks:
            text += f", look {self.looks}"
        if self.noise is not None:
            text += f", noise {self.noise:.2f}"
        if self.pass_hat_k is not None:
            text += f", pass^{self.trials} {self.pass_hat_k[0]:.2f} -> {self.pass_hat_k[1]:.2f}"
        return f"{text}, {self.episodes} episodes: {self.stopped}"


class SerialEdit(Record):
    """One per-failure edit of the serial baseline (key `r{round}/f{i}`): its target is a failing task of
    the harness current when it was made."""

    task: str
    accepted: bool = False
    attempted: bool = True  # False: the task already passed with the current harness, nothing was spent
    reason: str = ""
    variant: str | None = None
    harness: str | None = None
    per_task: dict[str, list[float]] = Field(default_factory=dict)
    tried: str | None = None
    decided_on: str | None = None
    decision_taken: bool = True  # False: an evaluation was incomplete (budget, infrastructure): not compared
    early_stopped: bool = False
    variant_scores: dict[str, float | None] = Field(default_factory=dict)  # train score of each variant picked from
    evidence: DecisionEvidence | None = None  # what decided it (None: no decision, or an older run)


class RoundRecord(Record):
    """The outcome of one training round (key `r{round}` of kind `decision`)."""

    round: int
    harness_before: str
    harness_after: str
    train_score: float
    accepted: bool = False
    patterns: int = 0
    recurring: int = 0
    stop: str | None = None  # set when this round ends training
    reason: str | None = None
    candidate: str | None = None
    candidate_score: float | None = None
    variant: str | None = None
    decided_on: str | None = None
    library_candidate: str | None = None
    edits: list[SerialEdit] = Field(default_factory=list)
    decision_taken: bool = True  # False: an evaluation was incomplete (budget, infrastructure): not compared
    early_stopped: bool = False  # the candidate's validation stopped before its last task (decided early)
    variant_scores: dict[str, float | None] = Field(default_factory=dict)  # train score of each variant picked from
    evidence: DecisionEvidence | None = None  # what decided it (None: no decision, or an older run)

    def attempts(self) -> list[SerialEdit | RoundRecord]:
        """The edits this round paid for: the serial baseline's attempted edits, else the round's own
        candidate (if it reached validation)."""
        if self.edits:
            return [e for e in self.edits if e.attempted]
        return [self] if self.candidate is not None else []


STEP_OUTCOMES = ("accepted", "validated, rejected", "nothing new built", "cut short")


def step_outcome(decision: RoundRecord | SerialEdit) -> str:
    """What one step came to: `accepted`; `validated, rejected` (a candidate was validated and lost);
    `nothing new built` (the spec built no new harness: it changed nothing, failed its checks, or rebuilt one
    already rejected); `cut short` (an evaluation was incomplete: budget, infrastructure)."""
    if decision.accepted:
        return "accepted"
    if not decision.decision_taken:
        return "cut short"
    built = decision.candidate if isinstance(decision, RoundRecord) else decision.harness
    return "validated, rejected" if built else "nothing new built"


class CandidateRecord(Record):
    """What implementation built for a step (key = the step's key): the whole spec's candidate, the
    variants that built (name -> harness id) and where the spec came from."""

    harness: str | None = None
    applied: list[str] = Field(default_factory=list)
    attempts: list[dict[str, Any]] = Field(default_factory=list)
    error: str | None = None
    replay: dict[str, Any] | None = None
    variants: dict[str, str] = Field(default_factory=dict)
    source: str = "roles"
    stopped: str = ""  # the budget stopped the implementer before the whole spec's candidate was built


class SpecRecord(Record):
    """The round's spec as the roles wrote it (None when they gave nothing valid) and why."""

    spec: dict[str, Any] | None = None
    error: str | None = None
    source: str = "roles"  # or "library: ..." when the library wrote it without asking a role
    stopped: str = ""  # the budget's stop reason when the budget stopped the roles before a spec


class AcceptRule(Record):
    """Which split edits are decided on, by which rule, and why (recorded with the run)."""

    accept_on: Literal["val", "train"]
    tasks: int
    rule: str
    why: str
    alpha: float | None = None  # the sequential rule's false-accept rate
    detectable: float | None = None  # the smallest effect the split detects (80% power; see sizing.py)
    proposed: int | None = None  # the split size that detects `train.min_effect`
    warning: str | None = None  # the split cannot tell the effects worth detecting from noise


class CurvePoint(Record):
    """The training curve after one decision (key `curve/{step:04d}`; step 0 is the seed before any edit).

    `harness_id` is the current harness after the decision and `val_score`/`train_score` its scores where
    they were measured (None: not evaluated on that split). Costs are cumulative for the run:
    `agent_executions` counts episodes actually run (cache-served episodes are `cached_executions`),
    `optimizer_*` counts the optimizer roles' fresh calls and tokens, `charged_s` the charged training seconds
    (trainer/charged.py; the primary time, None for points stored before it existed) and `wall_s` the real
    training wall time beside it. `taken` is False for a step cut before
    its decision (counted neither accepted nor rejected)."""

    arm: str
    step: int
    harness_id: str
    val_score: float | None
    train_score: float | None
    wall_s: float
    agent_executions: int
    cached_executions: int
    optimizer_calls: int
    optimizer_tokens: int
    accepted: bool
    charged_s: float | None = None
    taken: bool = True  # False: the step was cut (budget, incomplete evaluation) before anything was compared


R = TypeVar("R", bound=Record)

KINDS: dict[type[Record], str] = {RoundRecord: "decision", SerialEdit: "serial-edit", SpecRecord: "spec",
                                  AcceptRule: "rule", CurvePoint: "curve",
                                  CandidateRecord: "candidate"}


def put(store: RunStore, run_id: str, key: str, record: Record) -> None:
    store.put_record(run_id, KINDS[type(record)], key, record.model_dump(mode="json"))


def load(store: RunStore, run_id: str, cls: type[R], key: str) -> R | None:
    data = store.get_record(run_id, KINDS[cls], key)
    return None if data is None else cls.model_validate(data)


def load_all(store: RunStore, run_id: str, cls: type[R]) -> list[tuple[str, R]]:
    return [(key, cls.model_validate(data)) for key, data in store.records(run_id, KINDS[cls])]
