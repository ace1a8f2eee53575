"""Report plots as inline SVG (matplotlib, Agg backend, imported lazily): the report needs no network."""

from __future__ import annotations

import io
from typing import TYPE_CHECKING, Any

from .data import ArmCurve, RunView

if TYPE_CHECKING:
    from matplotlib.figure import Figure

COLORS = ("#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2")


def _figure(width: float = 6.4, height: float = 3.2) -> Figure:
    from matplotlib.figure import Figure  # no pyplot: no global state, no GUI backend

    fig = Figure(figsize=(width, height), dpi=100, layout="constrained")
    return fig


def _svg(fig: Figure) -> str:
    buf = io.StringIO()
    fig.savefig(buf, format="svg", metadata={"Date": None})  # same run, same bytes
    text = buf.getvalue()
    return text[text.index("<svg"):]  # drop the XML prolog and doctype: the SVG is inlined into HTML


def accuracy_per_round(run: RunView) -> str:
    """Train accuracy of the harness each round started from, the candidate's score on the decision
    split, and test accuracy of the seed and the final harness."""
    fig = _figure()
    ax = fig.add_subplot()
    xs = [r.record.round for r in run.rounds]
    ax.plot(xs, [r.record.train_score for r in run.rounds], "o-", color=COLORS[0], label="train (collect)")
    cand = [(r.record.round, r.record.candidate_score) for r in run.rounds if r.record.candidate_score is not None]
    if cand:
        ax.plot(*zip(*cand, strict=True), "s", color=COLORS[3], label="candidate (decision split)")
    end = (max(xs) if xs else 0) + 1
    if (after := run.summary.get("train_after")) is not None:
        ax.plot([end], [after], "o", color=COLORS[0], fillstyle="none", label="train (final harness)")
    for key, color, name in (("test_before", COLORS[1], "test, seed"), ("test_after", COLORS[2], "test, final")):
        if run.summary.get(key):
            ax.axhline(run.summary[key]["accuracy"], color=color, linestyle="--", label=name)
    ax.set_xticks([*xs, end], [*map(str, xs), "final"])
    ax.set_xlabel("round")
    ax.set_ylabel("accuracy")
    ax.set_ylim(-0.05, 1.05)
    ax.legend(fontsize=8, loc="best")
    return _svg(fig)


def accuracy_vs_time(runs: list[RunView]) -> str:
    """Train accuracy of each arm's current harness against cumulative training wall time (the speed-up
    picture): each round's collect at the time the round started, the final harness at the end; a star
    marks the arm's final test accuracy."""
    fig = _figure()
    ax = fig.add_subplot()
    for i, run in enumerate(runs):
        color = COLORS[i % len(COLORS)]
        starts = [0.0, *(r.elapsed_s for r in run.rounds[:-1])][:len(run.rounds)]  # a run may have no rounds (gepa)
        points = [(t, r.record.train_score) for t, r in zip(starts, run.rounds, strict=True)
                  if r.record.train_score is not None]
        end = run.rounds[-1].elapsed_s if run.rounds else 0.0
        if (after := run.summary.get("train_after")) is not None:
            points.append((end, after))
        if points:
            ax.plot(*zip(*points, strict=True), "o-", color=color, label=f"{run.arm} train")
        if test := run.summary.get("test_after"):
            ax.plot([end], [test["accuracy"]], "*", markersize=12, color=color, label=f"{run.arm} test (final)")
    ax.set_xlabel("cumulative training wall time (s)")
    ax.set_ylabel("accuracy")
    ax.set_ylim(-0.05, 1.05)
    ax.legend(fontsize=8, loc="best")
    return _svg(fig)


def cost_per_step(run: RunView) -> str:
    """Agent executions and agent tokens per evaluation step; optimizer tokens per role."""
    fig = _figure(8.0, 3.2)
    left, right = fig.subplots(1, 2, width_ratios=[3, 2])
    labels = [f"{i + 1}:{e.label}" for i, e in enumerate(run.evaluations)]
    xs = list(range(len(labels)))
    left.bar(xs, [e.episodes for e in run.evaluations], color=COLORS[0], label="agent executions")
    left.set_xticks(xs, labels, rotation=60, fontsize=7, ha="right")
    left.set_ylabel("executions")
    twin = left.twinx()
    twin.plot(xs, [e.tokens for e in run.evaluations], "o-", color=COLORS[4], label="agent tokens")
    twin.set_ylabel("tokens")
    left.set_title("per evaluation step", fontsize=9)
    roles = [c for c in run.calls if c.get("calls")]
    names = [c["role"] for c in roles]
    prompt = [c.get("prompt_tokens") or 0 for c in roles]
    right.bar(names, prompt, color=COLORS[0], label="prompt")
    right.bar(names, [c.get("completion_tokens") or 0 for c in roles], bottom=prompt, color=COLORS[4],
              label="completion")
    right.tick_params(axis="x", labelrotation=60, labelsize=7)
    right.set_title("tokens by role (cache misses)", fontsize=9)
    right.legend(fontsize=7)
    return _svg(fig)


def patterns_per_round(run: RunView) -> str:
    """Failing tasks per round in recurring and isolated patterns, and how many of them passed in the
    next round's collect."""
    fig = _figure()
    ax = fig.add_subplot()
    xs = [r.record.round for r in run.rounds]
    recurring = [sum(p.support for p in r.patterns if p.recurring) for r in run.rounds]
    isolated = [sum(p.support for p in r.patterns if not p.recurring) for r in run.rounds]
    fixed = [sum(p.fixed_next or 0 for p in r.patterns) for r in run.rounds]
    width = 0.28
    ax.bar([x - width for x in xs], recurring, width, color=COLORS[1], label="in recurring patterns")
    ax.bar(xs, isolated, width, color=COLORS[5], label="in isolated patterns")
    ax.bar([x + width for x in xs], fixed, width, color=COLORS[2], label="passing next round")
    ax.set_xticks(xs, [str(x) for x in xs])
    ax.set_xlabel("round")
    ax.set_ylabel("failing tasks")
    ax.legend(fontsize=8)
    return _svg(fig)


def compare_curves_plot(curves: list[ArmCurve]) -> str:
    """Each compare arm's current-harness score (val, else train) after every decision, against cumulative
    training time (left: charged seconds, the compare's primary time; real wall time for curves stored before
    charged time existed) and agent executions (right); one colour per arm, one line per seed (steps: the
    harness holds its score until the next decision)."""
    fig = _figure(9.0, 3.4)
    axes = fig.subplots(1, 2, sharey=True)
    colors = {arm: COLORS[i % len(COLORS)] for i, arm in enumerate(dict.fromkeys(c.arm for c in curves))}
    styles = ("-", "--", ":", "-.")
    charged = all(p.charged_s is not None for c in curves for p in c.points)
    time_axis = ("charged_s", "cumulative charged training time (s)") if charged else \
        ("wall_s", "cumulative training wall time (s)")
    for ax, x, label in ((axes[0], *time_axis), (axes[1], "agent_executions", "cumulative agent executions")):
        seen: set[str] = set()
        for c in curves:
            points = c.series(x)
            if not points:
                continue
            ax.step(*zip(*points, strict=True), where="post", marker="o", markersize=3, color=colors[c.arm],
                    linestyle=styles[c.seed % len(styles)], label=None if c.arm in seen else c.arm)
            seen.add(c.arm)
        ax.set_xlabel(label)
        ax.set_ylim(-0.05, 1.05)
    axes[0].set_ylabel("score of the current harness")
    axes[0].legend(fontsize=8, loc="best")
    return _svg(fig)


def all_plots(run: RunView, arms: list[RunView], curves: list[ArmCurve] | None = None) -> dict[str, Any]:
    """Every plot of the report by id (title, SVG); the compare curves when the store holds a compare."""
    plots = {
        "accuracy": ("Accuracy per round", accuracy_per_round(run)),
        "speed": ("Accuracy against cumulative training time" + (" (all arms)" if len(arms) > 1 else ""),
                  accuracy_vs_time(arms or [run])),
        "cost": ("Executions and tokens per step", cost_per_step(run)),
        "patterns": ("Failure patterns per round", patterns_per_round(run)),
    }
    if curves:
        seeds = len({c.seed for c in curves})
        plots["curves"] = (f"Compare: score against training cost, every arm ({seeds} seed(s))",
                           compare_curves_plot(curves))
    return plots
