"""What the compare table shows, for the terminal and the HTML report alike: one column per arm and seed,
one row per measure, in three sections that never mix units — accuracies (0-1), training costs (seconds,
episodes, tokens) and ratios against the serial and fixed arms (`x` times, `%` relative change).

Only meaningful rows are kept: a measure no arm has (no transfer model, fixed scored 0 so no relative gain)
is left out, a measure that does not apply to an arm (the fixed harness has no training time) is `–`, an
arm is never compared with itself, and pass@k / pass^k appear only where they differ from test accuracy.
Ratios read the right way round: > 1 means more of the thing named (`agent episodes vs serial's` 1.40x:
40% more episodes than serial; `speed-up vs serial` 2.00x: trained in half serial's time). Training times are
charged seconds (trainer/charged.py; `training wall s`, the real time, is shown beside them), the time of runs
recorded before charged time existed their wall time.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..trainer.methods import METHODS
from .results import TRAINED, ArmResult

DASH = "–"
COSTLY = tuple(n for n, m in METHODS.items() if m.runs != "evaluate")  # arms spending agent episodes of their own


@dataclass(frozen=True)
class Measure:
    """One row: its label and its cell for an arm (None: not defined for that arm)."""

    label: str
    cell: Callable[[ArmResult], str | None]


@dataclass(frozen=True)
class Section:
    """A titled group of rows of one kind of unit; each row is (label, one cell per result)."""

    title: str
    rows: list[tuple[str, list[str]]]


def _num(value: float | None, spec: str, suffix: str = "") -> str | None:
    return None if value is None else format(value, spec) + suffix


def _trained(r: ArmResult, value: float | None, spec: str, suffix: str = "") -> str | None:
    return _num(value, spec, suffix) if r.arm in TRAINED else None


def _vs(arm: str, attr: str, spec: str, suffix: str) -> Callable[[ArmResult], str | None]:
    """A comparison with `arm`, blank for that arm itself."""
    return lambda r: None if r.arm == arm else _num(getattr(r, attr), spec, suffix)


def _differs(attr: str) -> Callable[[ArmResult], str | None]:
    return lambda r: None if abs(getattr(r, attr) - r.test_acc) < 1e-12 else f"{getattr(r, attr):.3f}"


ACCURACY = (
    Measure("train acc", lambda r: _num(r.train_acc, ".3f")),
    Measure("val acc", lambda r: _num(r.val_acc, ".3f")),
    Measure("test acc", lambda r: f"{r.test_acc:.3f}"),
    Measure("test pass@k (any trial passed)", _differs("pass_at_k")),
    Measure("test pass^k (every trial passed)", _differs("pass_hat_k")),
    Measure("gap (train - test)", lambda r: _num(r.gap, "+.3f")),
    Measure("test acc - fixed's (difference)", _vs("fixed", "test_delta_vs_fixed", "+.3f", "")),
    Measure("transfer acc (second model)", lambda r: _num(r.transfer_acc, ".3f")),
)
COST = (
    Measure("training charged s", lambda r: _trained(r, r.train_charged_s, ".0f")),  # the primary time
    Measure("training wall s", lambda r: _trained(r, r.train_wall_s, ".0f")),  # real time, beside it
    Measure("agent episodes run", lambda r: _num(r.agent_executions, "d") if r.arm in COSTLY else None),
    Measure("agent episodes served from the response cache",
            lambda r: _num(r.cached_executions, "d") if r.arm in COSTLY else None),
    Measure("agent tokens (fresh)", lambda r: _num(r.agent_tokens, "d") if r.arm in COSTLY else None),
    Measure("optimizer calls", lambda r: _trained(r, r.optimizer_calls, "d")),
    Measure("optimizer tokens", lambda r: _trained(r, r.optimizer_tokens, "d")),
    Measure("edits accepted / rejected",
            lambda r: f"{r.accepted_edits} / {r.rejected_edits}" if r.arm in TRAINED else None),
    Measure("s to the final harness", lambda r: _num(r.time_to_final_s, ".0f")),
    Measure("s to serial's final acc", lambda r: _num(r.time_to_serial_acc_s, ".0f")),
    Measure("prompt tokens from the prefix cache", lambda r: _num(r.prefix_cache_rate, ".0%")),
)
RATIOS = (
    Measure("speed-up vs serial (serial's training s / arm's)", _vs("serial", "speedup_vs_serial", ".2f", "x")),
    Measure("agent episodes vs serial's (arm's / serial's)", _vs("serial", "executions_vs_serial", ".2f", "x")),
    Measure("speed-up to serial's final acc", _vs("serial", "speedup_to_serial_acc", ".2f", "x")),
    Measure("  the same, after the seed eval", _vs("serial", "speedup_to_serial_acc_after_seed", ".2f", "x")),
    Measure("test acc vs fixed's (relative change)", _vs("fixed", "test_gain_vs_fixed", "+.1%", "")),
    Measure("test acc vs serial's (relative change)", _vs("serial", "test_gain_vs_serial", "+.1%", "")),
)
SECTIONS = (("accuracy (0-1)", ACCURACY), ("training cost", COST),
            ("ratios (x: times the other arm's; %: relative change)", RATIOS))


def column_label(r: ArmResult) -> str:
    """`ecdysis s0`, `best-of-k k=4 s1`: the arm (with best-of-k's k) and the seed."""
    return r.arm + (f" k={r.k}" if r.arm == "best-of-k" else "") + f" s{r.seed}"


def compare_sections(results: list[ArmResult]) -> list[Section]:
    """The table's sections with only the rows some arm has a value for; empty sections are left out."""
    out = []
    for title, measures in SECTIONS:
        rows = []
        for m in measures:
            cells = [m.cell(r) for r in results]
            if any(c is not None for c in cells):
                rows.append((m.label, [DASH if c is None else c for c in cells]))
        if rows:
            out.append(Section(title, rows))
    return out
